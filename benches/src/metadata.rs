//! Heap bytes of each metadata structure of the daemon at the shape of the comparison
//! workloads: 1 GiB managed (262,144 pages) under a 256 MiB limit (65,536 resident pages,
//! 196,608 stored), counted by the `metadata` binary's counting allocator. The goal (#7) is
//! all of it together at most 1% of the managed memory: 41 bytes per managed page.

use mglru::{Hint, PageType, Policy};
use serde::Serialize;
use swap_alloc::{DeviceConfig, SwapDevice};
use zswap::{Compressor, Zswap};

/// Managed pages.
pub const MANAGED: usize = 262_144;
/// Resident pages (the limit).
pub const RESIDENT: usize = 65_536;
/// Stored pages.
pub const STORED: usize = MANAGED - RESIDENT;

/// One structure's bytes.
#[derive(Debug, Serialize)]
pub struct Row {
    /// What was measured.
    pub structure: String,
    /// Heap bytes after building it.
    pub bytes: isize,
    /// Bytes per managed page.
    pub per_managed_page: f64,
}

fn row(structure: &str, bytes: isize) -> Row {
    Row {
        structure: structure.to_string(),
        bytes,
        per_managed_page: bytes as f64 / MANAGED as f64,
    }
}

/// Builds each structure and reports its heap bytes; `live` reads the allocator's counter.
pub fn measure(live: &dyn Fn() -> isize) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let base = 0x7f00_0000_0000u64 >> 12;

    // The page table: every managed page has an entry.
    {
        let before = live();
        let mut table = uffd_daemon::pagetable::PageTable::new();
        for i in 0..MANAGED as u64 {
            let page = if i < RESIDENT as u64 {
                uffd_daemon::pagetable::Page::Resident {
                    referenced: false,
                    readahead: false,
                }
            } else {
                uffd_daemon::pagetable::Page::Evicted { slot: i as u32 }
            };
            table.insert((base + i) << 12, page);
        }
        rows.push(row("page table", live() - before));
        drop(table);
    }

    // The page table the radix table replaced, for comparison (not in the total).
    {
        let before = live();
        let mut table = std::collections::BTreeMap::new();
        for i in 0..MANAGED as u64 {
            table.insert(
                (base + i) << 12,
                uffd_daemon::pagetable::Page::Evicted { slot: i as u32 },
            );
        }
        rows.push(row(
            "baseline: BTreeMap<u64, Page> page table",
            live() - before,
        ));
        drop(table);
    }

    // The policy, as the daemon configures it, after a random 4 KiB workload: every page
    // faulted in, then 1M uniform touches (a miss faults the page in, evicting in batches of
    // 32 at the limit; a hit sets its accessed bit, and the fault's own bit is set too). The
    // victims' shadow entries go to the page table's words, as in the daemon (here a
    // preallocated array, not counted: the page table row counts those words).
    {
        let mut tokens = vec![u32::MAX; MANAGED];
        let before = live();
        let mut policy = mglru::Mglru::new(mglru::Config {
            max_shadows: RESIDENT,
            ..mglru::Config::default()
        })?;
        let mut bits = mglru::AccessBits::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut touch = |policy: &mut mglru::Mglru, bits: &mut mglru::AccessBits, p: u64| {
            if !policy.contains(p) {
                if policy.len() >= RESIDENT {
                    for v in Policy::evict(policy, 32, bits) {
                        bits.clear(v);
                        tokens[(v - base) as usize] = policy.take_shadow(v).unwrap_or(u32::MAX);
                    }
                }
                let hint = Hint::fault(PageType::Anon);
                match std::mem::replace(&mut tokens[(p - base) as usize], u32::MAX) {
                    u32::MAX => policy.add(p, hint),
                    t => policy.add_refault(p, hint, t),
                }
                .expect("not resident");
            }
            bits.set(p);
        };
        for i in 0..MANAGED as u64 {
            touch(&mut policy, &mut bits, base + i);
        }
        for _ in 0..1_000_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            touch(&mut policy, &mut bits, base + x % MANAGED as u64);
        }
        drop(bits);
        let bytes = live() - before;
        drop(tokens);
        rows.push(row(
            &format!(
                "mglru ({} resident, {} shadows inside; own estimate {} B)",
                policy.len(),
                policy.nr_shadows(),
                policy.metadata_bytes()
            ),
            bytes,
        ));
        drop(policy);
    }

    // Slots: the daemon's default 8 GiB of swap space, the stored pages in order-4 folios.
    {
        let before = live();
        let dev = SwapDevice::new(DeviceConfig::new(8 << 18))?;
        let empty = live() - before;
        let mut held = Vec::with_capacity(STORED / 16);
        let reserved = live() - before;
        for _ in 0..STORED / 16 {
            held.push(dev.alloc(4)?);
        }
        // Everything but the vector of entries this measurement keeps.
        rows.push(row(
            "swap-alloc, 8 GiB device holding the stored pages",
            live() - before - (reserved - empty),
        ));
        drop(held);
        drop(dev);
    }

    // zswap's index, LRU and handle table: everything but the pool's spans.
    {
        let before = live();
        let z = Zswap::new(zswap::Config {
            max_pool_bytes: 4 << 30,
            ..zswap::Config::new(Compressor::Lz4)
        })?;
        let mut folio = vec![0u8; 16 * 4096];
        let mut x = 0x9e37_79b9u32;
        for f in 0..(STORED / 16) as u64 {
            for (i, b) in folio.iter_mut().enumerate() {
                // Half-compressible: a counter in half of each 64-byte line, noise in the rest.
                if i % 64 < 32 {
                    *b = (i / 64) as u8;
                } else {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    *b = x as u8;
                }
            }
            // Page by page, as random evictions are stored.
            for (i, page) in folio.chunks_exact(4096).enumerate() {
                z.store(f * 16 + i as u64, page)?;
            }
        }
        let stats = z.stats();
        rows.push(row(
            &format!(
                "zswap, beyond the pool's spans (own estimate {} B)",
                stats.metadata_bytes
            ),
            live() - before - stats.pool_total_size as isize,
        ));
        drop(z);
    }
    let total: isize = rows
        .iter()
        .filter(|r| !r.structure.starts_with("baseline"))
        .map(|r| r.bytes)
        .sum();
    rows.push(row("total (without the baseline)", total));
    Ok(rows)
}

/// A plain-text table of the rows.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{} managed pages, {} resident, {} stored; goal: 1% = {:.1} bytes per managed page\n",
        MANAGED,
        RESIDENT,
        STORED,
        4096.0 / 100.0
    );
    s += &format!("{:<64} {:>12} {:>10}\n", "structure", "bytes", "B/page");
    for r in rows {
        s += &format!(
            "{:<64} {:>12} {:>10.1}\n",
            r.structure, r.bytes, r.per_managed_page
        );
    }
    s
}
