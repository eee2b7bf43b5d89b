//! The reclaim path: keep the resident managed memory of the process tree under the limit.
//!
//! ```text
//! over the watermark ─▶ pick victims (clock, second chance) ─▶ mark Evicting
//!   ─▶ UFFDIO_WRITEPROTECT the runs (a write now waits in a WP fault)
//!   ─▶ process_vm_readv the contents (pages known present: never faults)
//!   ─▶ store them (zero pages take no space) ─▶ mark Dropping(slot)
//!   ─▶ DROP to the agent: UFFDIO_MOVE into its scratch, MADV_DONTNEED the scratch
//!   ─▶ per page: dropped ─▶ Evicted(slot); refused (shared after fork, pinned) ─▶ Resident
//!   ─▶ lift write protection of kept pages / wake waiters of dropped ones (they refault and
//!      get the stored copy)
//! ```
//!
//! Any failure along the way leaves the page resident (or, once dropped, in the store): a page
//! is never freed in the client before its contents are safely stored.

use std::sync::Arc;

use crate::daemon::Shared;
use crate::mm::{runs_of, Mm, Page, ZERO_SLOT};
use crate::stats::Stats;
use crate::sys::{self, Fill, PAGE_SIZE, PAGE_SIZE_U64};

/// Pages per eviction batch (bounded by the agent's scratch area too).
pub const BATCH_PAGES: usize = 256;

/// Picks up to `max` victims of `mm` with the clock; marks them `Evicting { batch }`.
fn pick_victims(shared: &Shared, mm: &Mm, batch: u64, max: usize) -> Vec<u64> {
    let mut st = mm.state.lock();
    let mut victims = Vec::with_capacity(max);
    // One full lap at most: a referenced page gets a second chance once.
    let mut budget = st.clock.len();
    while victims.len() < max && budget > 0 {
        budget -= 1;
        let Some(addr) = st.clock.pop_front() else {
            break;
        };
        // (Entries for pages that are no longer resident are stale: skipped.)
        if let Some(Page::Resident { referenced }) = st.pages.get_mut(&addr) {
            if *referenced {
                *referenced = false;
                st.clock.push_back(addr);
            } else {
                st.pages.insert(addr, Page::Evicting { batch });
                victims.push(addr);
            }
        }
    }
    let _ = shared;
    victims.sort_unstable();
    victims
}

/// Gives pages of a failed batch back: still-`Evicting` pages become resident again and lose
/// their write protection (which wakes writers waiting on them).
fn abort_pages(shared: &Shared, mm: &Mm, batch: u64, addrs: &[u64]) {
    {
        let mut st = mm.state.lock();
        for &a in addrs {
            if st.pages.get(&a) == Some(&Page::Evicting { batch }) {
                st.pages.insert(a, Page::Resident { referenced: true });
                st.clock.push_back(a);
            }
        }
    }
    Stats::add(&shared.stats.evict_aborts, addrs.len() as u64);
    for (start, n) in runs_of(addrs) {
        unprotect(mm, start, n as u64 * PAGE_SIZE_U64);
    }
}

fn unprotect(mm: &Mm, start: u64, len: u64) {
    for _ in 0..100_000 {
        match mm.uffd.writeprotect(start, len, false) {
            Ok(Fill::Again) => std::thread::sleep(std::time::Duration::from_micros(50)),
            _ => return,
        }
    }
}

/// Evicts one batch from `mm`. Returns the pages evicted.
pub fn evict_batch(shared: &Shared, mm: &Arc<Mm>, max: usize) -> usize {
    let Some(pid) = mm.pid() else { return 0 };
    let mut agent_guard = mm.agent.lock();
    let Some(agent) = agent_guard.as_mut() else {
        return 0;
    };
    let max = max.min(agent.max_drop_pages).min(BATCH_PAGES);
    let batch = mm
        .next_batch
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let victims = pick_victims(shared, mm, batch, max);
    if victims.is_empty() {
        return 0;
    }
    let runs = runs_of(&victims);

    let stats = &shared.stats;
    let mut t = std::time::Instant::now();
    let mut lap = |c: &std::sync::atomic::AtomicU64| {
        Stats::add(c, t.elapsed().as_nanos() as u64);
        t = std::time::Instant::now();
    };
    // 1. Write-protect: from here on a write waits for us.
    for &(start, n) in &runs {
        let len = n as u64 * PAGE_SIZE_U64;
        let mut tries = 0;
        loop {
            match mm.uffd.writeprotect(start, len, true) {
                Ok(Fill::Filled) | Ok(Fill::Exists) => break,
                Ok(Fill::Again) if tries < 20_000 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                _ => {
                    abort_pages(shared, mm, batch, &victims);
                    return 0;
                }
            }
        }
    }

    lap(&stats.reclaim_wp_ns);
    // 2. Read the contents. The pages are present (or were removed by the program, in which
    //    case the handler serves the read as zeros and the state check below drops them).
    let mut data = vec![0u8; victims.len() * PAGE_SIZE];
    let byte_runs: Vec<(u64, usize)> = runs
        .iter()
        .map(|&(s, n)| (s, n as usize * PAGE_SIZE))
        .collect();
    match sys::read_remote(pid, &byte_runs, &mut data) {
        Ok(n) if n == data.len() => {}
        _ => {
            abort_pages(shared, mm, batch, &victims);
            return 0;
        }
    }

    lap(&stats.reclaim_read_ns);
    // 3. Store: zero pages need no slot.
    let mut slots = vec![ZERO_SLOT; victims.len()];
    let nonzero: Vec<usize> = (0..victims.len())
        .filter(|&i| {
            data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]
                .iter()
                .any(|&b| b != 0)
        })
        .collect();
    if !nonzero.is_empty() {
        let mut buf = Vec::with_capacity(nonzero.len() * PAGE_SIZE);
        for &i in &nonzero {
            buf.extend_from_slice(&data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
        }
        match shared.store.store(&buf) {
            Ok(s) => {
                for (k, &i) in nonzero.iter().enumerate() {
                    slots[i] = s[k];
                }
            }
            Err(e) => {
                Stats::add(&shared.stats.backend_errors, 1);
                shared.log_backend_error(&e);
                abort_pages(shared, mm, batch, &victims);
                return 0;
            }
        }
    }

    lap(&stats.reclaim_store_ns);
    // 4. Still ours? (A REMOVE, UNMAP or REMAP may have taken pages meanwhile.)
    let mut to_drop = Vec::with_capacity(victims.len());
    let mut drop_slots = Vec::with_capacity(victims.len());
    let mut gone = Vec::new();
    {
        let mut st = mm.state.lock();
        for (i, &a) in victims.iter().enumerate() {
            if st.pages.get(&a) == Some(&Page::Evicting { batch }) {
                st.pages.insert(a, Page::Dropping { slot: slots[i] });
                to_drop.push(a);
                drop_slots.push(slots[i]);
            } else {
                if slots[i] != ZERO_SLOT {
                    shared.put_slot(slots[i]);
                }
                gone.push(a);
            }
        }
    }
    if !gone.is_empty() {
        Stats::add(&shared.stats.evict_aborts, gone.len() as u64);
        for (start, n) in runs_of(&gone) {
            unprotect(mm, start, n as u64 * PAGE_SIZE_U64);
        }
    }
    if to_drop.is_empty() {
        return 0;
    }

    // 5. Have the agent drop them.
    let drop_runs = runs_of(&to_drop);
    Stats::add(&shared.stats.drop_requests, 1);
    let status = match agent.drop_pages(&drop_runs) {
        Ok(s) => s,
        Err(e) => {
            let timed_out = matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            );
            let exited = mm.pidfd.lock().as_ref().is_some_and(|p| p.exited());
            if timed_out {
                Stats::add(&shared.stats.drop_timeouts, 1);
            } else {
                *agent_guard = None;
                let gone = matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::UnexpectedEof
                );
                // A peer that went away is a process exiting or exec'ing: not worth a message.
                if !exited && !gone {
                    eprintln!("uffd-daemon: the agent of pid {pid} failed a DROP ({e}); no more evictions from it");
                }
            }
            // We do not know which pages moved: keep every stored copy (a missing fault is
            // served from it, a write-protect fault lifts the protection) and unprotect now.
            let mut st = mm.state.lock();
            for (i, &a) in to_drop.iter().enumerate() {
                let slot = drop_slots[i];
                if st.pages.get(&a) == Some(&Page::Dropping { slot }) {
                    st.pages.insert(a, Page::Inherited { slot });
                }
            }
            for &(start, n) in &drop_runs {
                let _ = mm.uffd.writeprotect(start, n as u64 * PAGE_SIZE_U64, false);
            }
            return 0;
        }
    };
    drop(agent_guard);

    lap(&stats.reclaim_drop_ns);
    // 6. Account for the outcome.
    let mut kept = Vec::new();
    let mut evicted = 0usize;
    let mut zero = 0u64;
    {
        let mut st = mm.state.lock();
        for (i, &a) in to_drop.iter().enumerate() {
            let slot = drop_slots[i];
            if st.pages.get(&a) != Some(&Page::Dropping { slot }) {
                continue; // refaulted or removed meanwhile: already accounted for
            }
            if status[i] == 0 {
                st.pages.insert(a, Page::Evicted { slot });
                st.resident -= 1;
                shared.resident_sub(1);
                evicted += 1;
                if slot == ZERO_SLOT {
                    zero += 1;
                }
            } else {
                st.pages.insert(a, Page::Resident { referenced: true });
                st.clock.push_back(a);
                if slot != ZERO_SLOT {
                    shared.put_slot(slot);
                }
                kept.push(a);
            }
        }
    }
    Stats::add(&stats.evicted_pages, evicted as u64);
    Stats::add(&stats.zero_pages_evicted, zero);
    Stats::add(
        &stats.bytes_written,
        (evicted as u64 - zero) * PAGE_SIZE_U64,
    );
    if !kept.is_empty() {
        Stats::add(&stats.evict_aborts, kept.len() as u64);
        for (start, n) in runs_of(&kept) {
            unprotect(mm, start, n as u64 * PAGE_SIZE_U64);
        }
    }
    // Writers that waited on dropped pages retry now and fault them back from the store.
    for &(start, n) in &drop_runs {
        let _ = mm.uffd.wake(start, n as u64 * PAGE_SIZE_U64);
    }
    evicted
}
