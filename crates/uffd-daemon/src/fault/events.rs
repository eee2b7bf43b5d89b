//! The non-fault messages of a uffd, applied in the kernel's order: REMOVE, UNMAP, REMAP and
//! FORK (a child address space that shares every stored page, started at once: its threads
//! may be faulting already).
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::remove_scan::{Advice, RemoveScan};
use crate::mm::{Mm, MmState};
use crate::shared::Shared;
use crate::stats::Stats;
use crate::sys::{Uffd, UffdEvent, PAGE_SIZE_U64};

/// Applies one event; `fork_uffd`: a FORK's child uffd, taken from its message.
pub(super) fn handle_event(
    shared: &Arc<Shared>,
    mm: &Arc<Mm>,
    event: UffdEvent,
    fork_uffd: Option<Uffd>,
    scan: &mut RemoveScan,
) {
    let stats = &shared.stats;
    match event {
        UffdEvent::Remove { start, end } => {
            if mm.in_agent_region(start) {
                // The agent (or, without one, the daemon) freeing its scratch after a drop.
                return;
            }
            Stats::add(&stats.remove_events, 1);
            mm.state.lock().forget_range(shared, start, end);
            if mm.has_shmem.load(Ordering::Acquire) {
                remove_shared(shared, mm, start, end, scan);
            }
        }
        UffdEvent::Unmap { start, end } => {
            Stats::add(&stats.unmap_events, 1);
            let mut st = mm.state.lock();
            st.forget_range(shared, start, end);
            st.remove_range(start, end);
            st.unmapped(start, end);
            drop(st);
            shared.shmem.unmap(shared, mm, start, end);
        }
        UffdEvent::Remap { from, to, len } => {
            Stats::add(&stats.remap_events, 1);
            let mut st = mm.state.lock();
            // Pages moved mid-eviction keep their write protection at the new address; lift it
            // (under the lock, see the WP fault path) where no DROP can reach them.
            for (start, n) in crate::mm::runs_of(&st.remap(shared, from, to, len)) {
                let _ = mm.uffd.writeprotect(start, n as u64 * PAGE_SIZE_U64, false);
            }
            drop(st);
            shared.shmem.remap(shared, mm, from, to, len);
        }
        UffdEvent::Fork { ufd } => {
            Stats::add(&stats.fork_events, 1);
            match fork_uffd {
                Some(child_uffd) => adopt_forked_child(shared, mm, child_uffd),
                None => tracing::error!("mm {}: a fork's uffd {ufd} was taken twice", mm.id),
            }
        }
        UffdEvent::PageFault { .. } => unreachable!("faults are served by serve_fault"),
        UffdEvent::Unknown(kind) => {
            tracing::warn!("ignoring unknown uffd message {kind:#x} on mm {}", mm.id);
        }
    }
}

/// A REMOVE of `[start, end)` of `mm`, which maps shared memory. `MADV_DONTNEED` and
/// `MADV_REMOVE` raise the same event (probe p1/p2): the first keeps the page cache, so stored
/// copies stay valid; the second punches, so they become zeros. It matters only where pages
/// are evicted (or being evicted): a resident page reads as the kernel left it either way.
/// Told apart by the agent's announcement (`shmem_removes`), else by the scan of the callers
/// made before the read (`remove_scan.rs`), else by a scan after it (believed for
/// `MADV_REMOVE` only); still unresolved, it is taken as `MADV_DONTNEED` and counted.
fn remove_shared(shared: &Shared, mm: &Mm, start: u64, end: u64, scan: &mut RemoveScan) {
    let stats = &shared.stats;
    // First, whatever the memory: the caller found for this event tells no other one.
    let told = scan.tell(start, end);
    let announced = mm
        .shmem_removes
        .lock()
        .iter()
        .any(|&(s, e)| s <= start && end <= e);
    let advice = if announced {
        Advice::Remove
    } else if !shared.shmem.stored(mm, start, end, false) {
        return;
    } else if let Some(a) = told {
        Stats::add(&stats.shmem_remove_scanned, 1);
        a
    } else if scan.active && RemoveScan::tell_late(mm, start, end, stats) {
        Stats::add(&stats.shmem_remove_scanned, 1);
        Advice::Remove
    } else {
        if shared.shmem.stored(mm, start, end, true) {
            Stats::add(&stats.shmem_remove_unannounced, 1);
        }
        Advice::Keep
    };
    if advice == Advice::Remove {
        let n = shared.shmem.remove(shared, mm, start, end);
        Stats::add(&stats.shmem_removed_pages, n as u64);
    }
}

/// Starts the handler thread of `mm` and adds it to the live list.
pub(crate) fn start_mm(shared: &Arc<Shared>, mm: &Arc<Mm>) -> std::io::Result<()> {
    let (s, m) = (Arc::clone(shared), Arc::clone(mm));
    let h = std::thread::Builder::new()
        .name(format!("uffd-fault-{}", mm.id))
        .spawn(move || super::handler_thread(s, m))?;
    *mm.handler.lock() = Some(h);
    shared.mms.lock().push(Arc::clone(mm));
    Stats::add(&shared.stats.processes, 1);
    Stats::add(&shared.stats.processes_live, 1);
    Ok(())
}

/// Called by the handler of a fork event: the child shares every stored page.
pub(super) fn adopt_forked_child(shared: &Arc<Shared>, parent: &Arc<Mm>, uffd: Uffd) {
    if let Err(e) = uffd.set_nonblocking() {
        tracing::info!("child uffd: {e}");
    }
    let state: MmState = {
        let mut st = parent.state.lock();
        // Pages the parent unshared before are shared again now: a refusal is not a pin.
        st.unshared.clear();
        st.fork_copy(shared, &shared.policy)
    };
    let mm = match Mm::new(
        shared.new_id(),
        uffd,
        0,
        parent.region,
        parent.probe,
        parent.scratch,
        &shared.policy,
    ) {
        Ok(m) => Arc::new(m),
        Err(e) => {
            tracing::warn!("cannot track a forked child: {e}");
            return;
        }
    };
    *mm.state.lock() = state;
    // The child maps the parent's shared memory at the same addresses, registered.
    shared.shmem.fork(shared, parent, &mm);
    // The child has a copy of whatever the parent's last DROP left in the scratch.
    *mm.scratch_filled.lock() = Some(Instant::now());
    mm.forked_from
        .store(parent.pid().unwrap_or(0), Ordering::Release);
    if parent.agentless.load(Ordering::Acquire) {
        // No agent in the child to name it: the daemon binds it by a token (`bind.rs`, `forked`).
        crate::bind::forked(&mm);
    }
    tracing::debug!("fork of pid {:?}: child mm {}", parent.pid(), mm.id);
    if let Err(e) = start_mm(shared, &mm) {
        tracing::warn!("cannot start the handler of a forked child: {e}");
    }
}
