//! The scanner: every 100 ms, the census of the tree's memory the daemon cannot manage, new
//! mappings registered, tracers and memory-file readers held, agentless processes adopted and
//! their fork children bound.
use std::sync::atomic::AtomicBool;

use crate::unmanaged::Census;
use space::retire;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::maps;
use crate::mm::Mm;
use crate::shared::Shared;
use crate::sys::{self, PAGE_SIZE_U64};

use super::{agentless, hold, space};

/// The census of unmanaged memory (`unmanaged.rs`), and with `unmanaged = "error"` the end of
/// a tree that has some.
pub(crate) fn census_round(shared: &Shared, census: &mut Census) {
    if census.stopped {
        return;
    }
    let managed: std::collections::HashSet<i32> = shared
        .mms
        .lock()
        .iter()
        .filter(|m| !m.agent.try_lock().is_some_and(|a| a.is_none()))
        .filter_map(|m| m.pid())
        .collect();
    let me = sys::getpid();
    census.reasons = shared
        .agentless_refusals
        .lock()
        .iter()
        .map(|(&p, (_, why))| (p, why.clone()))
        .collect();
    let held: std::collections::HashMap<i32, crate::unmanaged::Kind> = shared
        .mms
        .lock()
        .iter()
        .filter_map(|m| Some((m.pid()?, hold::census_kind(m)?)))
        .collect();
    let found = census.take(me, &managed, &held, &shared.stats, shared.policy.unmanaged);
    if let Some((pid, kind)) = found {
        census.stopped = true;
        tracing::error!(
            "unmanaged = \"error\": pid {pid} has {} memory the daemon cannot \
             manage; stopping the process tree",
            kind.name()
        );
        let mut tree = Vec::new();
        let mut stack = vec![me];
        while let Some(p) = stack.pop() {
            for c in std::fs::read_to_string(format!("/proc/{p}/task/{p}/children"))
                .unwrap_or_default()
                .split_ascii_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                tree.push(c);
                stack.push(c);
            }
        }
        for p in tree {
            // (Through a pidfd, checked in the tree once it is open: a number reused since
            // the walk names no process outside it.)
            maps::kill_in_tree(p);
        }
    }
}

/// The scanner: registers new memory, periodically and at once when a process's anonymous
/// RSS grew beyond what the daemon tracks (memory populated before it was registered).
/// It runs apart from reclaim so that a slow eviction never delays registration.
pub(crate) fn scanner(shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let mut tick: u64 = 0;
    let mut census = Census::default();
    let mut judged = std::collections::HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        tick += 1;
        let mut rss_total = 0u64;
        // (A copy: the list's lock must not be held below. A `for` over `lock().clone()`
        // would hold it for the whole loop, and a fork event's handler needs it to add the
        // child while the parent's agent, in a DROP that reclaim waits for, waits for that
        // very handler to read its REMOVE event.)
        let mms: Vec<Arc<Mm>> = shared.mms.lock().clone();
        for m in mms {
            let Some(pid) = m.pid() else { continue };
            // Never wait behind a DROP in flight: a held lock means an agent is there.
            let no_agent = m.agent.try_lock().is_some_and(|a| a.is_none());
            if no_agent || m.retired.load(Ordering::Relaxed) {
                continue;
            }
            let (rss, tracer) = maps::rss_and_tracer(pid).unwrap_or((0, 0));
            rss_total += rss;
            // A tracer came or went (`hold.rs`): from the same read, every 2 ms.
            hold::note_tracer(&shared, &m, pid, tracer);
            hold::note_self_mem(&shared, &m, pid);
            let tracked = |m: &Mm| m.state.lock().resident as u64 * PAGE_SIZE_U64;
            let untracked = m.untracked_rss.load(Ordering::Relaxed);
            let last = m.last_scan_tick.load(Ordering::Relaxed);
            // Anonymous memory the daemon never manages (the stack, copy-on-write pages of
            // libraries' data: often more than the margin) would otherwise trigger a scan on
            // every tick: stress-ng's processes had their maps read 1000 times a second.
            if tick.saturating_sub(last) >= 50 || rss > tracked(&m) + untracked + (256 << 10) {
                m.last_scan_tick.store(tick, Ordering::Relaxed);
                if !hold::scan_and_register(&shared, &m) {
                    retire(&shared, &m);
                    // The new image may be one the agent cannot load into: the monitor looks.
                    shared.adopt_queue.lock().push(pid);
                    shared.kick_reclaim(); // (wakes the monitor)
                    continue;
                }
                let after = maps::rss_anon_bytes(pid).unwrap_or(0);
                m.untracked_rss
                    .store(after.saturating_sub(tracked(&m)), Ordering::Relaxed);
            }
        }
        shared
            .stats
            .rss_anon_max_bytes
            .fetch_max(rss_total, Ordering::Relaxed);
        // The daemon's own memory: all of it, and what is beyond the zswap pool (metadata:
        // page tables, policy, zswap's index, slot maps; and buffers). Every 20 ms.
        if tick % 250 == 0 {
            // Give back what the allocator holds free (metadata that shrank after a peak).
            sys::trim_allocator();
        }
        if tick % 50 == 0 {
            // Shared anonymous inodes: every mapping registered (or none evicted), pins.
            let pinned = shared.shmem.census(sys::getpid());
            shared
                .stats
                .unmanaged_shared_pinned_bytes
                .fetch_max(pinned, Ordering::Relaxed);
            census.shared_pinned = pinned;
            census_round(&shared, &mut census);
        }
        if tick % 5 == 0 {
            // Every 10 ms: the children of processes without an agent, and programs the
            // agent cannot load into started by a spawn (they fill memory from their first
            // instruction).
            agentless::bind_children(&shared);
            agentless::find_new_images(&shared, &mut judged);
        }
        if tick % 50 == 0 {
            // Every 100 ms: the metadata structures' own count of their bytes.
            let (slots, zswap) = shared.tiers.metadata_bytes();
            let (mut table, mut policy, mut managed) = (0, 0, 0);
            for m in shared.mms.lock().iter() {
                let st = m.state.lock();
                table += st.pages.heap_bytes();
                policy += st.policy.metadata_bytes();
                managed += st.pages.len();
            }
            let bytes = (slots + zswap + table + policy) as u64;
            let s = &shared.stats;
            if bytes > s.daemon_metadata_max_bytes.load(Ordering::Relaxed) {
                let parts = [
                    (&s.daemon_metadata_max_bytes, bytes),
                    (&s.daemon_metadata_managed_pages, managed as u64),
                    (&s.daemon_metadata_pagetable_bytes, table as u64),
                    (&s.daemon_metadata_policy_bytes, policy as u64),
                    (&s.daemon_metadata_slots_bytes, slots as u64),
                    (&s.daemon_metadata_zswap_bytes, zswap as u64),
                ];
                for (c, v) in parts {
                    c.store(v, Ordering::Relaxed);
                }
            }
        }
        if tick % 10 == 0 {
            let me = sys::getpid();
            if let Some(own) = maps::rss_anon_bytes(me) {
                let pool = shared.tiers.pool_bytes();
                let s = &shared.stats;
                s.daemon_rss_anon_max_bytes
                    .fetch_max(own, Ordering::Relaxed);
                s.daemon_overhead_max_bytes
                    .fetch_max(own.saturating_sub(pool), Ordering::Relaxed);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The program was started stopped at its exec: manage it without the agent if it cannot load
/// the agent, and let it go.
pub(crate) fn start_agentless(shared: &Arc<Shared>, root: i32) {
    if agentless::needs_agentless(root) {
        match agentless::adopt(shared, root, true) {
            Ok(()) => {
                tracing::debug!("pid {root} is managed without the agent");
            }
            Err(e) => {
                shared.note_inject_error(root, &e);
                agentless::refused(shared, root, &e);
                // Still stopped at its exec if the stop came: let it go.
                let _ = sys::ptrace_detach(root, 0);
            }
        }
    } else {
        // A set-ID program run by root without secure mode: the agent loads as usual.
        let mut stop = crate::inject::Stop::stopped(root);
        if let Ok(s) = stop.as_mut() {
            s.release();
        }
    }
}

/// A process of the tree exec'd an image (its old address space is retired): if the agent
/// cannot load into the new one, the daemon manages it without (`agentless.rs`).
pub(crate) fn adopt_exec(shared: &Arc<Shared>, pid: i32) {
    // (A new image that loaded the agent may have greeted already; one that will, a dynamic
    // one outside secure mode, is told by its image below.)
    if shared.mms.lock().iter().any(|m| m.pid() == Some(pid)) {
        return;
    }
    if !agentless::needs_agentless(pid) || agentless::has_uffd_ranges(pid) {
        return;
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    if exe.is_some() && agentless::refused_image(shared, pid) == exe {
        return; // (this image was refused already, and said)
    }
    match agentless::adopt(shared, pid, false) {
        Ok(()) => {}
        Err(e) => {
            shared.note_inject_error(pid, &e);
            if !matches!(e, crate::inject::InjectError::Gone(_)) {
                agentless::refused(shared, pid, &e);
            }
        }
    }
}

/// Notes the rseq page of thread `tid`, in a ptrace stop, in its process's address space.
pub(crate) fn learn_rseq_of(shared: &Shared, tid: i32) {
    let Some(pid) = maps::tgid_of(tid) else {
        return;
    };
    let Some(mm) = shared
        .mms
        .lock()
        .iter()
        .find(|m| m.pid() == Some(pid))
        .cloned()
    else {
        return;
    };
    let page = sys::ptrace_rseq_area(tid)
        .ok()
        .filter(|&a| a != 0)
        .map_or(u64::MAX, |a| a & !(PAGE_SIZE_U64 - 1));
    let mut known = mm.rseq_pages.lock();
    if !known.iter().any(|&(t, _)| t == tid) {
        known.push((tid, page));
    }
}
