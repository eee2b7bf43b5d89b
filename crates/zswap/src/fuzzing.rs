//! The fuzz target's logic, as a normal function so that stable-toolchain tests (a proptest in
//! `tests/corruption.rs`) exercise it too; `fuzz/fuzz_targets/zswap_load.rs` only calls it.

use crate::{Compressor, Config, LoadError, Zswap, PAGE_SIZE};

fn page_from(seed: &[u8], i: usize) -> Vec<u8> {
    // Pages that compress (runs and repeats drawn from the seed), with some same-filled ones.
    let mut page = vec![0u8; PAGE_SIZE];
    let b = |j: usize| {
        seed.get((i * 7 + j) % seed.len().max(1))
            .copied()
            .unwrap_or(0)
    };
    match b(0) % 4 {
        0 => page.fill(b(1)),
        _ => {
            let mut pos = 0;
            let mut j = 0;
            while pos < PAGE_SIZE {
                let run = 1 + b(j) as usize % 64;
                let val = b(j + 1) ^ (i as u8);
                let end = (pos + run).min(PAGE_SIZE);
                page[pos..end].fill(val);
                if b(j + 2) % 3 == 0 {
                    for (k, x) in page[pos..end].iter_mut().enumerate() {
                        *x = x.wrapping_add(k as u8);
                    }
                }
                pos = end;
                j += 3;
            }
        }
    }
    page
}

/// Stores a few pages, damages the pool as `data` says (flipped bytes in stored objects, forged
/// handles: locations of other objects, of free slots, wrong lengths, garbage), then loads every
/// page. Checks the promise of the load path: no panic, ever; and with
/// CRC on, a load that succeeds returns exactly the bytes stored. Returns how many loads failed.
///
/// Input layout: byte 0 picks the compressor and CRC, byte 1 the number of pages (low 3 bits)
/// and whether the first four go in as one folio (bit 4), then
/// (entry, offset, mask) triples of corruption, the rest seeds the page contents.
pub fn load_corrupted(data: &[u8]) -> usize {
    if data.len() < 4 {
        return 0;
    }
    let compressor = match data[0] % 3 {
        0 => Compressor::Lz4,
        // Under miri zstd (a C library) cannot run; lz4 stands in.
        1 if cfg!(miri) => Compressor::Lz4,
        1 => Compressor::Zstd { level: 1 },
        _ => Compressor::Deflate { level: 1 },
    };
    let crc = data[0] & 0x80 != 0;
    let mut config = Config::new(compressor);
    config.crc = crc;
    config.index_shards = 1;
    let Ok(zswap) = Zswap::new(config) else {
        return 0;
    };
    let nr = 1 + (data[1] as usize % 8);
    let (ops, seed) = data[2..].split_at((data.len() - 2).min(3 * 8));
    let pages: Vec<Vec<u8>> = (0..nr).map(|i| page_from(seed, i)).collect();
    // Bit 4 of byte 1: the first four pages go in as one folio (one multi-page object with the
    // default settings), so that corruption also hits shared objects.
    let as_folio = if data[1] & 0x10 != 0 && nr >= 4 {
        let f: Vec<u8> = pages[..4].concat();
        usize::from(zswap.store(0, &f).is_ok()) * 4
    } else {
        0
    };
    for (i, p) in pages.iter().enumerate().skip(as_folio) {
        // Poorly compressing pages are refused; fine, they are not loaded below.
        let _ = zswap.store(i as u64, p);
    }
    for op in ops.chunks_exact(3) {
        let entry = u64::from(op[0]) % nr as u64;
        if op[2] == 0 {
            // Forge the handle (the object's location): another entry's, the neighbouring
            // object slot (free, or another object: what a stale location names), the same
            // slot with another length, or garbage.
            let own = zswap.debug_handle(entry);
            let raw = match op[1] % 4 {
                0 => zswap
                    .debug_handle((entry + 1) % nr as u64)
                    .map_or(0, |h| h.raw()),
                1 => own.map_or(1, |h| h.raw() ^ (1 << 12)),
                2 => own.map_or(2, |h| h.with_len(h.len() ^ usize::from(op[1] >> 2)).raw()),
                _ => u64::from(op[1]).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            };
            zswap.debug_set_handle(entry, raw);
        } else {
            zswap.debug_corrupt(entry, op[1] as usize * 13, op[2]);
        }
    }
    let mut failed = 0;
    let mut out = vec![0u8; PAGE_SIZE];
    for (i, p) in pages.iter().enumerate() {
        match zswap.load(i as u64, &mut out) {
            Ok(()) => {
                if crc {
                    assert_eq!(
                        &out, p,
                        "a load that succeeds with CRC on returns the stored bytes"
                    );
                }
            }
            Err(LoadError::NotFound { .. }) => {}
            Err(_) => {
                failed += 1;
                // A failed load leaves the entry in place.
                assert!(zswap.contains(i as u64), "failed load removed entry {i}");
            }
        }
    }
    failed
}
