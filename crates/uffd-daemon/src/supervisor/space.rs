//! Address spaces as the supervisor handles them: registering their new memory with their
//! uffd, retiring them, finding the live one of a pid, and handing memory back to the kernel
//! (a process stepping aside, a hold).
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent_conn::AgentConn;
use crate::maps;
use crate::mm::{Mm, Page, ZERO_SLOT};
use crate::shared::Shared;
use crate::stats::Stats;
use crate::sys::{Fill, PAGE_SIZE, PAGE_SIZE_U64};

/// Retires every address space of `pid` (an exec replaced it).
pub(crate) fn retire_pid(shared: &Shared, pid: i32) {
    let old: Vec<Arc<Mm>> = shared
        .mms
        .lock()
        .iter()
        .filter(|m| m.pid() == Some(pid))
        .cloned()
        .collect();
    for m in old {
        retire(shared, &m);
    }
}

/// Releases everything an address space held: its handler, its stored pages, its counts.
pub(crate) fn retire(shared: &Shared, mm: &Arc<Mm>) {
    if mm.retired.swap(true, Ordering::AcqRel) {
        return;
    }
    mm.stop.signal();
    let handler = mm.handler.lock().take();
    if let Some(h) = handler {
        let _ = h.join();
    }
    *mm.agent.lock() = None;
    shared.shmem.retire(shared, mm);
    {
        let mut st = mm.state.lock();
        #[cfg(debug_assertions)]
        st.check_integrity();
        let pages = std::mem::take(&mut st.pages);
        for (a, p) in pages.iter() {
            st.release(shared, a, p);
        }
    }
    shared.mms.lock().retain(|m| !Arc::ptr_eq(m, mm));
    shared.stats.processes_live.fetch_sub(1, Ordering::Relaxed);
    tracing::debug!("retired mm {} (pid {:?})", mm.id, mm.pid());
}

/// Locked memory (mlock, mlockall) is the program's promise that its pages stay in RAM and
/// never reach swap: the daemon leaves it alone. A locked mapping not registered yet is never
/// registered; a registered one is unregistered and its pages forgotten once all of them are
/// resident (mlock faults them in; with `MLOCK_ONFAULT` an evicted page keeps its registration
/// until it comes back). The census counts it (`unmanaged_locked_bytes`) and says it. Checked when the process has locked memory at all
/// (`VmLck`, read from its status; the mappings' flags cost a read of smaps).
pub(crate) fn leave_locked_memory(shared: &Shared, mm: &Mm, pid: i32) {
    // A lock asked for more than a second before this scan has been seen by now (the agent
    // locks right after the answer), or it failed: its request has done its work.
    let seen = Instant::now().checked_sub(Duration::from_secs(1));
    mm.state
        .lock()
        .lock_requests
        .retain(|&(_, _, t)| seen.is_none_or(|seen| t > seen));
    if maps::locked_bytes(pid) == 0 {
        return;
    }
    let Ok(vmas) = maps::read_vm_flags(pid) else {
        return;
    };
    let mut st = mm.state.lock();
    for &(s, e, _) in vmas.iter().filter(|v| v.2.locked) {
        if mm.in_agent_region(s) || st.refused.contains(&(s, e)) {
            continue;
        }
        // (Registered by the scan or by the agent's mmap wrapper, whose ranges the table may
        // hold pages of before the scan adds them.)
        if !st.locked.contains(&(s, e)) {
            st.locked.push((s, e));
        }
        let all_resident = st
            .pages
            .range(s..e)
            .all(|(_, p)| matches!(p, Page::Resident { .. }));
        if !all_resident || mm.uffd.unregister(s, e - s).is_err() {
            continue;
        }
        st.forget_range(shared, s, e);
        st.remove_range(s, e);
        st.locked.retain(|&r| r != (s, e));
        st.refuse(s, e);
    }
}

/// Registers the managed memory of `mm` that is not registered yet, and records the pages
/// already present in it.
pub(crate) fn scan_and_register(shared: &Shared, mm: &Mm) -> bool {
    let Some(pid) = mm.pid() else { return true };
    let Ok(vmas) = maps::read_maps(pid) else {
        return true;
    };
    // The agent's probe page is gone: the process exec'd an image without the agent (a static
    // or set-ID program, or one whose environment dropped LD_PRELOAD). This address space is
    // no more; the census counts the new one as unmanaged.
    if !vmas.is_empty() && !vmas.iter().any(|v| v.start <= mm.probe && mm.probe < v.end) {
        return false;
    }
    Stats::add(&shared.stats.maps_scans, 1);
    leave_locked_memory(shared, mm, pid);
    for v in vmas.iter().filter(|v| v.is_managed()) {
        // Never the agent's own region.
        let parts: Vec<(u64, u64)> = [
            (v.start, v.end.min(mm.region.0)),
            (v.start.max(mm.region.1), v.end),
        ]
        .into_iter()
        .filter(|(s, e)| s < e)
        .collect();
        for (s, e) in parts {
            let gaps = mm.state.lock().uncovered(s, e);
            for (gs, ge) in gaps {
                match mm.uffd.register(gs, ge - gs, true) {
                    Ok(()) => {
                        Stats::add(&shared.stats.ranges_registered, 1);
                        let present = maps::present_pages(pid, gs, ge).unwrap_or_default();
                        let mut st = mm.state.lock();
                        st.add_range(gs, ge);
                        for a in present {
                            if !st.pages.contains(a) {
                                st.make_resident(shared, a, mglru::Arrival::Cold, false);
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!("pid {pid}: cannot register {gs:#x}-{ge:#x}: {e}");
                        mm.state.lock().refused.push((gs, ge));
                    }
                }
            }
        }
    }
    register_shared(shared, mm, pid, &vmas);
    shared.maybe_kick_reclaim();
    true
}

/// Registers the shared anonymous mappings of `mm` (missing and write-protect, like private
/// memory) and adds them to their inodes' mappers (`shmem.rs`); the pages present in them are
/// recorded resident. A mapping that cannot be registered is left alone: its inode is never
/// verified, so never evicted from (the census counts it unmanaged).
fn register_shared(shared: &Shared, mm: &Mm, pid: i32, vmas: &[maps::Vma]) {
    if !vmas.iter().any(|v| v.is_shared_anon()) {
        return;
    }
    // (The live list's own reference: a mapper holds the address space until it leaves.)
    let Some(mm) = shared.mms.lock().iter().find(|m| m.id == mm.id).cloned() else {
        return;
    };
    let mm = &mm;
    for v in vmas.iter().filter(|v| v.is_shared_anon()) {
        if shared.shmem.is_mapper(mm, v.start, v.end) || mm.in_agent_region(v.start) {
            continue;
        }
        if let Err(e) = mm.uffd.register(v.start, v.end - v.start, true) {
            tracing::debug!(
                "pid {pid}: cannot register shared {:#x}-{:#x}: {e}",
                v.start,
                v.end
            );
            continue;
        }
        Stats::add(&shared.stats.ranges_registered, 1);
        let key = (crate::shmem::makedev(v.dev.0, v.dev.1), v.inode);
        if let Err(e) = shared.shmem.add_mapper(
            shared,
            mm,
            pid,
            (v.start, v.end),
            v.offset / PAGE_SIZE_U64,
            key,
        ) {
            // Registered, served (as zeros, no page of it ever evicted): a fault adds it later.
            tracing::warn!("pid {pid}: shared mapping {:#x}-{:#x}: {e}", v.start, v.end);
        }
    }
}

/// The live (not retired) address space of `pid`, if the daemon manages one.
pub(crate) fn live_mm(shared: &Shared, pid: i32) -> Option<Arc<Mm>> {
    shared
        .mms
        .lock()
        .iter()
        .find(|m| m.pid() == Some(pid) && !m.retired.load(Ordering::Acquire))
        .cloned()
}

/// The agent slot of `mm` once no DROP is outstanding on it (the monitor settles one when its
/// answer comes), held so that no new one starts. `EAGAIN` after 10 s.
pub(crate) fn agent_without_drop(
    mm: &Mm,
) -> std::io::Result<parking_lot::MutexGuard<'_, Option<AgentConn>>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let g = mm.agent.lock();
        if g.as_ref().is_none_or(|a| a.pending.is_none()) {
            return Ok(g);
        }
        drop(g);
        if Instant::now() > deadline {
            return Err(std::io::Error::from_raw_os_error(libc::EAGAIN));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How [`restore_and_step_aside`] unregisters.
pub(crate) enum Unregister {
    /// The whole range at once (a program's own registration: one anonymous range).
    Whole,
    /// Each part the daemon registered (a range that may hold mappings no userfaultfd takes,
    /// which the kernel refuses to unregister).
    Parts,
}

/// Brings back every page of `[start, end)` the daemon evicted (the program's memory reads as
/// before), unregisters it, forgets its pages and refuses to register it again (a hold takes
/// the refusal back when it ends, `hold.rs`). Returns the bytes of it the daemon had
/// registered and the pages it brought back.
pub(crate) fn restore_and_step_aside(
    shared: &Shared,
    mm: &Mm,
    start: u64,
    end: u64,
    how: Unregister,
) -> std::io::Result<(u64, u64)> {
    // Runs of consecutive pages in consecutive slots come back with one read of what the
    // backend holds of them and one UFFDIO_COPY: a page at a time, a hold of pages the swap
    // file holds took 80 us a page, one disk read each.
    const RUN: usize = 64;
    let mut buf = vec![0u8; RUN * PAGE_SIZE];
    let mut restored = 0u64;
    loop {
        // (Before the state lock, as the handler takes them: see `Mm::event_gate`.)
        let gate = mm.gate_read();
        let mut st = mm.state.lock();
        let stored: Vec<(u64, u32)> = st
            .pages
            .range(start..end)
            .filter_map(|(a, p)| p.slot().map(|s| (a, s)))
            .collect();
        let mut again = false;
        let mut i = 0;
        while i < stored.len() {
            let (a0, s0) = stored[i];
            let mut n = 1;
            while s0 != ZERO_SLOT
                && n < RUN
                && stored.get(i + n) == Some(&(a0 + n as u64 * PAGE_SIZE_U64, s0 + n as u32))
            {
                n += 1;
            }
            let got = if s0 == ZERO_SLOT {
                buf[..PAGE_SIZE].fill(0);
                1
            } else {
                shared.tiers.read_run(s0, n, &mut buf[..n * PAGE_SIZE])?.0
            };
            let (_, filled) = mm.uffd.copy_run(a0, &buf[..got * PAGE_SIZE]);
            for k in 0..filled {
                let a = a0 + k as u64 * PAGE_SIZE_U64;
                if let Some(p) = st.pages.remove(a) {
                    st.release(shared, a, p);
                }
            }
            restored += filled as u64;
            i += filled;
            if filled == got {
                continue;
            }
            // The run stopped at this page (present already, the end of a mapping, an event
            // pending): it alone.
            let a = stored[i].0;
            match mm
                .uffd
                .copy(a, &buf[filled * PAGE_SIZE..(filled + 1) * PAGE_SIZE])
            {
                Ok(f @ (Fill::Filled | Fill::Exists)) => {
                    restored += u64::from(f == Fill::Filled);
                    if let Some(p) = st.pages.remove(a) {
                        st.release(shared, a, p);
                    }
                }
                // An event is queued: the handler must read it, and it may need the state lock.
                Ok(Fill::Again) => {
                    again = true;
                    break;
                }
                Ok(Fill::Gone) => {}
                Err(e) => return Err(e),
            }
            i += 1;
        }
        if again {
            drop(st);
            drop(gate);
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let parts = st.registered_parts(start, end);
        let managed: u64 = parts.iter().map(|(s, e)| e - s).sum();
        match how {
            Unregister::Whole => mm.uffd.unregister(start, end - start)?,
            Unregister::Parts => {
                for (s, e) in parts {
                    mm.uffd.unregister(s, e - s)?;
                }
            }
        }
        st.forget_range(shared, start, end);
        st.remove_range(start, end);
        st.refuse(start, end);
        return Ok((managed, restored));
    }
}
