//! The reclaim path: keep the resident managed memory of the process tree under the limit.
//!
//! ```text
//! over the watermark ─▶ pick victims (the policy: mglru or clock) ─▶ mark Evicting
//!   ─▶ UFFDIO_WRITEPROTECT the runs (a write now waits in a WP fault)
//!   ─▶ read the contents through /proc/PID/mem (never faults: a page no longer mapped is
//!      forgotten)
//!   ─▶ store them in the tiers (zero pages take no space; aligned runs of 16 as one order-4
//!      folio) ─▶ mark Dropping(slot)
//!   ─▶ DROP to the agent: UFFDIO_MOVE into its scratch, MADV_DONTNEED the scratch
//!   ─▶ per page: dropped ─▶ Evicted(slot); refused (shared after fork, pinned) ─▶ Resident
//!   ─▶ lift write protection of kept pages / wake waiters of dropped ones (they refault and
//!      get the stored copy)
//! ```
//!
//! Any failure along the way leaves the page resident (or, once dropped, in the store): a page
//! is never freed in the client before its contents are safely stored.

use std::sync::Arc;

use crate::agent_conn::{AgentConn, DropWait, PendingDrop};
use crate::daemon::Shared;
use crate::mm::{runs_of, Mm, Page, ZERO_SLOT};
use crate::stats::Stats;
use crate::sys::{self, Fill, PAGE_SIZE, PAGE_SIZE_U64};
use crate::tiers::{FOLIO_ORDER, FOLIO_PAGES};

/// Pages per eviction batch (bounded by the agent's scratch area too).
pub const BATCH_PAGES: usize = 256;

/// Picks up to `max` victims of `mm` with its policy; marks them `Evicting { batch }`. With
/// the write-protect access source, re-arms protection where the aging cleared bits.
fn pick_victims(shared: &Shared, mm: &Mm, batch: u32, max: usize) -> Vec<u64> {
    let mut st = mm.state.lock();
    let (victims, cleared) = st.pick_victims(batch, max, &shared.stats);
    if shared.wp_access() && !cleared.is_empty() {
        // Under the state lock, like every protection change (see the WP fault path). Best
        // effort: an event pending (EAGAIN) only means fewer accesses are seen this round.
        let mut armed = 0u64;
        for (s, e) in cleared {
            for (ps, pe) in st.registered_parts(s, e) {
                if matches!(mm.uffd.writeprotect(ps, pe - ps, true), Ok(Fill::Filled)) {
                    armed += 1;
                }
            }
        }
        Stats::add(&shared.stats.wp_arm_ranges, armed);
    }
    victims
}

/// Cuts the victims (sorted) into store units: an aligned run of 16 pages none of which is
/// all zeros becomes one order-4 folio, any other nonzero page an order-0 unit. Returns
/// `(first victim index, order)` for each unit; zero pages are in no unit.
fn units_of(victims: &[u64], zero: &[bool], large: bool) -> Vec<(usize, u32)> {
    let mut units = Vec::new();
    let mut i = 0;
    while i < victims.len() {
        let a = victims[i];
        if large
            && a % (FOLIO_PAGES as u64 * PAGE_SIZE_U64) == 0
            && i + FOLIO_PAGES <= victims.len()
            && victims[i + FOLIO_PAGES - 1] == a + (FOLIO_PAGES as u64 - 1) * PAGE_SIZE_U64
            && !zero[i..i + FOLIO_PAGES].iter().any(|&z| z)
        {
            units.push((i, FOLIO_ORDER));
            i += FOLIO_PAGES;
            continue;
        }
        if !zero[i] {
            units.push((i, 0));
        }
        i += 1;
    }
    units
}

/// Gives pages of a failed batch back: still-`Evicting` pages become resident again and lose
/// their write protection (which wakes writers waiting on them).
fn abort_pages(shared: &Shared, mm: &Mm, batch: u32, addrs: &[u64]) {
    {
        let mut st = mm.state.lock();
        for &a in addrs {
            if st.pages.get(a) == Some(Page::Evicting { batch }) {
                st.back_to_resident(a);
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

/// Counts the pages no tier took, by cause, says each cause once with what to change, and
/// backs reclaim off while no tier takes anything, or the swap space is full: such a batch
/// pauses eviction (1 ms, doubling up to 1 s); a batch without either ends the pause.
fn note_store_outcome(
    shared: &Shared,
    all_failed: bool,
    failures: &[(crate::tiers::StoreFail, usize)],
) {
    use crate::tiers::Refusal;
    let stats = &shared.stats;
    for cause in Refusal::ALL {
        let pages: usize = failures
            .iter()
            .filter(|(e, _)| e.refusal() == cause)
            .map(|&(_, n)| n)
            .sum();
        if pages == 0 {
            continue;
        }
        let counter = match cause {
            Refusal::Full => &stats.store_refused_full_pages,
            Refusal::Pool => &stats.store_refused_pool_pages,
            Refusal::Incompressible => &stats.store_refused_incompressible_pages,
            Refusal::Io => &stats.store_refused_io_pages,
        };
        if counter.fetch_add(pages as u64, std::sync::atomic::Ordering::Relaxed) == 0 {
            let e = failures
                .iter()
                .find(|(e, _)| e.refusal() == cause)
                .map(|(e, _)| e.to_string())
                .unwrap_or_default();
            eprintln!(
                "uffd-daemon: {e}: such pages stay resident, and while they do the limit may not \
                 hold; {} (counted in {})",
                cause.remedy(),
                refusal_counter_name(cause)
            );
        }
    }
    // A full swap space pauses reclaim even when a few freed slots took part of the batch:
    // the rest would be read and refused again at once (the kernel stops reclaiming anonymous
    // memory while no swap slot is free). Other refusals pause it only when nothing was taken.
    let full = failures.iter().any(|(e, _)| e.refusal() == Refusal::Full);
    let mut b = shared.store_backoff.lock();
    if !all_failed && !full {
        *b = (0, None);
        return;
    }
    b.0 += 1;
    let pause = std::time::Duration::from_millis(1 << b.0.min(10));
    b.1 = Some(std::time::Instant::now() + pause);
    if b.0 == 1 {
        Stats::add(&stats.store_stalls, 1);
    }
}

/// The counter of the pages refused for `cause`, as `stat` names it.
fn refusal_counter_name(cause: crate::tiers::Refusal) -> &'static str {
    use crate::tiers::Refusal;
    match cause {
        Refusal::Full => "store_refused_full_pages",
        Refusal::Pool => "store_refused_pool_pages",
        Refusal::Incompressible => "store_refused_incompressible_pages",
        Refusal::Io => "store_refused_io_pages",
    }
}

/// Evicts one batch from `mm`. Returns the pages evicted.
pub fn evict_batch(shared: &Shared, mm: &Arc<Mm>, max: usize) -> usize {
    let Some(pid) = mm.pid() else { return 0 };
    // Only once the agent's thread runs (it named itself): a forked child greets the daemon
    // from its forking thread and starts the agent thread after, and that thread could meet a
    // page of a batch on its way (a write waits for the batch's DROP, which would wait for the
    // agent thread that the writer has yet to start).
    if mm.agent_tid.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        return 0;
    }
    let mut agent_guard = mm.agent.lock();
    let Some(agent) = agent_guard.as_mut() else {
        return 0;
    };
    // Held for a core dump or a debugger (`hold.rs`): nothing is evicted. (Checked under the
    // agent slot, which a hold takes after marking the process.)
    if crate::hold::is_held(mm) {
        return 0;
    }
    if shared
        .store_backoff
        .lock()
        .1
        .is_some_and(|t| std::time::Instant::now() < t)
    {
        return 0;
    }
    // One DROP at a time: an outstanding one is settled first.
    if agent.pending.is_some() {
        drop(agent_guard);
        return poll_pending_drop(shared, mm).0;
    }
    let max = max.min(agent.max_drop_pages).min(BATCH_PAGES);
    let batch = mm
        .next_batch
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Without an agent the program is stopped for the drop only (agentless.rs, BatchStop),
    // and the rseq pages of the threads it has been stopped in are never in a batch: the
    // kernel writes a thread's rseq area on its way to a stop, and a thread whose rseq page
    // was write-protected in the batch would wait for the very drop that waits for its stop.
    // The first batch learns them in a stop of its own.
    let injected = agent.is_injected();
    if injected {
        if mm.state.lock().policy.is_empty() {
            return 0; // nothing to pick: no stop for nothing
        }
        if mm.rseq_pages.lock().is_empty() {
            match crate::agentless::BatchStop::take(shared, pid) {
                Ok(s) => {
                    s.learn_rseq(mm);
                }
                Err(e) => {
                    lose_injection(shared, &mut agent_guard, pid, &e);
                    return 0;
                }
            }
        }
    }
    let t_pick = std::time::Instant::now();
    let mut victims = pick_victims(shared, mm, batch, max);
    if injected {
        let rseq: Vec<u64> = mm.rseq_pages.lock().iter().map(|&(_, p)| p).collect();
        let out: Vec<u64> = victims
            .iter()
            .copied()
            .filter(|a| rseq.contains(a))
            .collect();
        if !out.is_empty() {
            victims.retain(|a| !out.contains(a));
            abort_pages(shared, mm, batch, &out);
        }
    }
    let pick_ns = t_pick.elapsed().as_nanos() as u64;
    Stats::add(&shared.stats.reclaim_pick_ns, pick_ns);
    shared
        .stats
        .reclaim_pick_max_ns
        .fetch_max(pick_ns, std::sync::atomic::Ordering::Relaxed);
    if victims.is_empty() {
        // (Pages waiting to be unshared are not victims: a DROP of nothing else unshares them.)
        return if injected {
            0
        } else {
            drop_by_agent(shared, mm, &mut agent_guard, Vec::new(), Vec::new())
        };
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
    // 2. Read the contents, without faulting anything in: a page the program removed or
    //    unmapped since it was chosen (its event not applied yet), or one the kernel discarded
    //    after MADV_FREE, is not mapped, so there is nothing to store, and a later access finds
    //    it missing and gets zeros, as it would from the kernel. Such pages are forgotten.
    let mut data = vec![0u8; victims.len() * PAGE_SIZE];
    let byte_runs: Vec<(u64, usize)> = runs
        .iter()
        .map(|&(s, n)| (s, n as usize * PAGE_SIZE))
        .collect();
    let read = {
        let mut mem = mm.mem.lock();
        if mem.as_ref().is_none_or(|(p, _)| *p != pid) {
            *mem = std::fs::File::open(format!("/proc/{pid}/mem"))
                .ok()
                .map(|f| (pid, f));
        }
        match mem.as_ref() {
            Some((_, f)) => sys::read_mem(f, &byte_runs, &mut data),
            None => Err(std::io::Error::from_raw_os_error(libc::ESRCH)),
        }
    };
    let missing = match read {
        Ok(missing) => missing,
        Err(_) => {
            abort_pages(shared, mm, batch, &victims);
            return 0;
        }
    };
    if !missing.is_empty() {
        {
            let mut st = mm.state.lock();
            for &a in &missing {
                if st.pages.get(a) == Some(Page::Evicting { batch }) {
                    st.forget_range(shared, a, a + PAGE_SIZE_U64);
                }
            }
        }
        // (Protection was asked for on a page that is not there: lift it, so that a marker
        // never makes the next access wait.)
        for (start, n) in runs_of(&missing) {
            unprotect(mm, start, n as u64 * PAGE_SIZE_U64);
        }
        Stats::add(&stats.reclaim_unmapped_pages, missing.len() as u64);
        let keep: Vec<usize> = (0..victims.len())
            .filter(|&i| missing.binary_search(&victims[i]).is_err())
            .collect();
        let mut kept_data = Vec::with_capacity(keep.len() * PAGE_SIZE);
        for &i in &keep {
            kept_data.extend_from_slice(&data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
        }
        victims = keep.iter().map(|&i| victims[i]).collect();
        data = kept_data;
        if victims.is_empty() {
            return 0;
        }
    }

    lap(&stats.reclaim_read_ns);
    // 3. Store: zero pages need no slot; aligned runs of 16 go as one folio. A unit no tier
    //    takes (full, refused, I/O error) stays resident: its pages are given back.
    let mut slots = vec![ZERO_SLOT; victims.len()];
    let zero: Vec<bool> = data
        .chunks_exact(PAGE_SIZE)
        .map(|p| p.iter().all(|&b| b == 0))
        .collect();
    let units = units_of(&victims, &zero, shared.tiers.large_folios());
    let mut refused = Vec::new();
    if !units.is_empty() {
        let spans: Vec<(u32, &[u8])> = units
            .iter()
            .map(|&(i, order)| {
                let n = 1usize << order;
                (order, &data[i * PAGE_SIZE..(i + n) * PAGE_SIZE])
            })
            .collect();
        let mut failures = Vec::new();
        for (&(i, order), r) in units.iter().zip(shared.tiers.store_units(&spans)) {
            let n = 1usize << order;
            match r {
                Ok(s) => slots[i..i + n].copy_from_slice(&s),
                Err(e) => {
                    Stats::add(&shared.stats.backend_errors, 1);
                    refused.extend_from_slice(&victims[i..i + n]);
                    failures.push((e, n));
                }
            }
        }
        note_store_outcome(shared, refused.len() == victims.len(), &failures);
    }
    if !refused.is_empty() {
        abort_pages(shared, mm, batch, &refused);
    }

    lap(&stats.reclaim_store_ns);
    // 4. Still ours? (A REMOVE, UNMAP or REMAP may have taken pages meanwhile.)
    let mut to_drop = Vec::with_capacity(victims.len());
    let mut drop_slots = Vec::with_capacity(victims.len());
    let mut gone = Vec::new();
    {
        let mut st = mm.state.lock();
        for (i, &a) in victims.iter().enumerate() {
            if refused.binary_search(&a).is_ok() {
                continue; // given back above
            }
            if st.pages.get(a) == Some(Page::Evicting { batch }) {
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
        return if injected {
            0
        } else {
            drop_by_agent(shared, mm, &mut agent_guard, Vec::new(), Vec::new())
        };
    }

    // 5. Have the agent drop them. Until it answers, any of them may move at any moment, so
    //    they stay `Dropping` and protected: a writer waits (the kernel's page under
    //    writeback). An answer that does not come in time leaves the batch outstanding.
    Stats::add(&shared.stats.drop_requests, 1);
    let drop_runs = runs_of(&to_drop);
    let t_drop = std::time::Instant::now();
    if injected {
        // No agent: the daemon drops the pages itself, in a stop of the program, and knows the
        // outcome of every call when the stop ends: the batch settles now.
        Stats::add(&shared.stats.inject_drops, 1);
        let mut p = PendingDrop {
            seq: 0,
            pages: to_drop,
            slots: drop_slots,
            runs: drop_runs,
            unshare: Vec::new(),
            sent: t_drop,
            said_late: false,
        };
        let stop = match crate::agentless::BatchStop::take(shared, pid) {
            Ok(s) => s,
            Err(e) => {
                // Nothing was dropped: the batch goes back.
                let kept = vec![1u8; p.pages.len()];
                settle_drop(shared, mm, &p, Some(&kept));
                lose_injection(shared, &mut agent_guard, pid, &e);
                return 0;
            }
        };
        // A thread stopped for the first time: if its rseq page is in the batch, it leaves
        // the batch (unprotected) before the thread is stepped.
        if let Some(rp) = stop.learn_rseq(mm) {
            if let Ok(i) = p.pages.binary_search(&rp) {
                let one = PendingDrop {
                    seq: 0,
                    pages: vec![rp],
                    slots: vec![p.slots[i]],
                    runs: vec![(rp, 1)],
                    unshare: Vec::new(),
                    sent: t_drop,
                    said_late: false,
                };
                settle_drop(shared, mm, &one, Some(&[1]));
                p.pages.remove(i);
                p.slots.remove(i);
                p.runs = runs_of(&p.pages);
            }
        }
        // Events the program raised before its stop (an unmap, and a new mapping at the same
        // addresses) are applied by now: only pages still `Dropping` are dropped, so that a
        // `DONTNEED` never reaches memory that is no longer the batch's.
        crate::agentless::wait_handled(mm);
        let live: Vec<bool> = {
            let st = mm.state.lock();
            p.pages
                .iter()
                .zip(&p.slots)
                .map(|(&a, &slot)| st.pages.get(a) == Some(Page::Dropping { slot }))
                .collect()
        };
        let to_drop: Vec<u64> = p
            .pages
            .iter()
            .zip(&live)
            .filter_map(|(&a, &l)| l.then_some(a))
            .collect();
        let drop_runs = runs_of(&to_drop);
        let (live_status, err) =
            crate::agentless::drop_pages(shared, mm, pid, stop, &to_drop, &drop_runs);
        // (Pages no longer `Dropping` were settled by their events: settle_drop skips them.)
        let mut next = live_status.into_iter();
        let status: Vec<u8> = live
            .iter()
            .map(|&l| if l { next.next().unwrap_or(1) } else { 1 })
            .collect();
        let evicted = settle_drop(shared, mm, &p, Some(&status));
        lap(&stats.reclaim_drop_ns);
        if let Some(e) = err {
            lose_injection(shared, &mut agent_guard, pid, &e);
        }
        return evicted;
    }
    let evicted = drop_by_agent(shared, mm, &mut agent_guard, to_drop, drop_slots);
    lap(&stats.reclaim_drop_ns);
    evicted
}

/// Most pages one DROP asks the agent to unshare.
const UNSHARE_PAGES: usize = 256;

/// Step 5 with an agent: sends the DROP of `to_drop` (their slots `drop_slots`; possibly none)
/// together with the pages waiting to be unshared, waits for the answer up to the timeout and
/// settles the batch, or leaves it outstanding. Returns the pages evicted, or, for a DROP that
/// only unshares, the pages unshared (reclaim made progress: they can be evicted now).
fn drop_by_agent(
    shared: &Shared,
    mm: &Mm,
    agent_guard: &mut Option<AgentConn>,
    to_drop: Vec<u64>,
    drop_slots: Vec<u32>,
) -> usize {
    let Some(agent) = agent_guard.as_mut() else {
        return 0;
    };
    let unshare = {
        let room = (crate::protocol::MAX_RUNS - runs_of(&to_drop).len()).min(UNSHARE_PAGES);
        mm.state.lock().take_unshare(room, &to_drop)
    };
    if to_drop.is_empty() && unshare.is_empty() {
        return 0;
    }
    let t_drop = std::time::Instant::now();
    let drop_runs = runs_of(&to_drop);
    let unshare_runs = runs_of(&unshare);
    let mut pending = PendingDrop {
        seq: 0,
        pages: to_drop,
        slots: drop_slots,
        runs: drop_runs,
        unshare,
        sent: t_drop,
        said_late: false,
    };
    match agent.send_drop(&pending.runs, &unshare_runs) {
        Ok(seq) => pending.seq = seq,
        Err(e) => {
            // Nothing was sent: nothing moves. Give the pages back.
            lose_agent(shared, mm, agent_guard, &e);
            settle_drop(shared, mm, &pending, None);
            return 0;
        }
    }
    let statuses = pending.pages.len() + pending.unshare.len();
    let waited = agent.wait_drop(pending.seq, statuses, shared.policy.drop_timeout);
    if waited.is_ok() {
        shared
            .drop_agent_times
            .record(t_drop.elapsed().as_nanos() as u64);
    }
    let only_unshare = pending.pages.is_empty();
    let unshared = pending.unshare.len();
    let evicted = finish_drop(shared, mm, agent_guard, pending, waited);
    if only_unshare {
        unshared
    } else {
        evicted
    }
}

/// Looks for the answer to `mm`'s outstanding DROP without waiting, and settles the batch if
/// it came (or if the agent is gone). Returns the pages evicted, and whether a DROP is still
/// outstanding (no other DROP may be sent to that agent meanwhile).
pub fn poll_pending_drop(shared: &Shared, mm: &Mm) -> (usize, bool) {
    let Some(mut agent_guard) = mm.agent.try_lock() else {
        return (0, true);
    };
    let Some(pending) = agent_guard.as_mut().and_then(|a| a.pending.take()) else {
        return (0, false);
    };
    let Some(agent) = agent_guard.as_mut() else {
        return (0, false);
    };
    let statuses = pending.pages.len() + pending.unshare.len();
    let waited = agent.wait_drop(pending.seq, statuses, std::time::Duration::ZERO);
    let evicted = finish_drop(shared, mm, &mut agent_guard, pending, waited);
    let outstanding = agent_guard.as_ref().is_some_and(|a| a.pending.is_some());
    (evicted, outstanding)
}

/// Acts on the outcome of waiting for a DROP: settles the batch with the agent's answer,
/// leaves it outstanding if there is none yet, or settles it without one when the agent's end
/// is gone (nothing moves any more then).
fn finish_drop(
    shared: &Shared,
    mm: &Mm,
    agent_guard: &mut Option<AgentConn>,
    pending: PendingDrop,
    waited: Result<Vec<u8>, DropWait>,
) -> usize {
    match waited {
        Ok(status) => settle_drop(shared, mm, &pending, Some(&status)),
        Err(DropWait::NotYet) => {
            let mut pending = pending;
            if pending.sent.elapsed() >= shared.policy.drop_timeout
                && !std::mem::replace(&mut pending.said_late, true)
            {
                Stats::add(&shared.stats.drop_timeouts, 1);
                if shared.verbose {
                    eprintln!(
                        "uffd-daemon: the agent of pid {:?} has not answered a DROP for {:?} \
                         (stopped, or starved of CPU?); its {} pages stay protected until it does",
                        mm.pid(),
                        shared.policy.drop_timeout,
                        pending.pages.len()
                    );
                }
            }
            if let Some(a) = agent_guard.as_mut() {
                a.pending = Some(pending);
            }
            0
        }
        Err(DropWait::Gone(e)) | Err(DropWait::Protocol(e)) => {
            // For a protocol error the connection is closed first: a well-behaved agent
            // answers only once it has moved what it was going to move.
            lose_agent(shared, mm, agent_guard, &e);
            settle_drop(shared, mm, &pending, None)
        }
    }
}

/// Forgets `mm`'s agent after its connection failed: no more evictions from that process.
/// A connection the agent's end closed is a process exiting or exec'ing (the new image greets
/// anew); anything else is counted and said.
fn lose_agent(shared: &Shared, mm: &Mm, agent_guard: &mut Option<AgentConn>, e: &std::io::Error) {
    *agent_guard = None;
    let exited = mm.pidfd.lock().as_ref().is_some_and(|p| p.exited());
    let closed = matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::UnexpectedEof
    );
    if exited || closed {
        return;
    }
    Stats::add(&shared.stats.agents_lost, 1);
    eprintln!(
        "uffd-daemon: lost the agent of pid {:?} ({e}); its pages are still served, but no \
         longer evicted",
        mm.pid()
    );
}

/// After an injected DROP failed: a process that is gone or stopped in time only missed this
/// batch; one that can no longer be injected into (a seccomp filter since, another tracer) is
/// no longer evicted from, and that is said.
fn lose_injection(
    shared: &Shared,
    agent_guard: &mut Option<AgentConn>,
    pid: i32,
    e: &crate::inject::InjectError,
) {
    use crate::inject::InjectError;
    crate::daemon::note_inject_error(shared, pid, e);
    match e {
        InjectError::Gone(_) | InjectError::NoStop(_) => {}
        _ => {
            *agent_guard = None;
            Stats::add(&shared.stats.agents_lost, 1);
            eprintln!(
                "uffd-daemon: pid {pid} can no longer be stopped to drop pages ({e}); its pages \
                 are still served, but no longer evicted"
            );
        }
    }
}

/// Accounts for a DROP's outcome: with the agent's per-page answer, moved pages become
/// `Evicted` and refused ones resident again; without one (the agent is gone and nothing moves
/// any more, but which pages moved is unknown), every page keeps its stored copy as
/// `Inherited` (a missing fault is served from it, a write-protect fault lifts the
/// protection). Then protection is lifted from pages kept in place and waiting writers are
/// woken. Returns the pages evicted.
fn settle_drop(shared: &Shared, mm: &Mm, p: &PendingDrop, status: Option<&[u8]>) -> usize {
    let stats = &shared.stats;
    let mut kept = Vec::new();
    let mut evicted = 0usize;
    let mut zero = 0u64;
    {
        let mut st = mm.state.lock();
        for (i, &a) in p.pages.iter().enumerate() {
            let slot = p.slots[i];
            if st.pages.get(a) != Some(Page::Dropping { slot }) {
                continue; // refaulted or removed meanwhile: already accounted for
            }
            match status.map(|s| s[i]) {
                Some(0) => {
                    st.unshared.remove(&a);
                    st.pages.insert(a, Page::Evicted { slot });
                    st.resident -= 1;
                    shared.resident_sub(1);
                    evicted += 1;
                    if slot == ZERO_SLOT {
                        zero += 1;
                    }
                }
                // An injected DROP that failed part way over a page a REMOVE was seen for
                // (agentless.rs): removed, by the daemon or the program; its copy is kept.
                Some(crate::agentless::DROP_UNKNOWN) => {
                    st.pages.insert(a, Page::Inherited { slot });
                    kept.push(a);
                }
                Some(e) => {
                    st.back_to_resident(a);
                    if slot != ZERO_SLOT {
                        shared.put_slot(slot);
                    }
                    // Shared (with a forked child, or since one): the next DROP unshares it.
                    // Refused again after that, it is pinned (for I/O): it stays, as the
                    // kernel's reclaim leaves a pinned page.
                    if i32::from(e) == libc::EBUSY && !st.unshared.contains(&a) {
                        st.unshare.insert(a);
                    }
                    kept.push(a);
                }
                None => {
                    st.pages.insert(a, Page::Inherited { slot });
                    kept.push(a);
                }
            }
        }
    }
    if let Some(s) = status {
        let done: Vec<u64> = p
            .unshare
            .iter()
            .zip(&s[p.pages.len()..])
            .filter_map(|(&a, &e)| (e == 0).then_some(a))
            .collect();
        Stats::add(&stats.unshared_pages, done.len() as u64);
        let mut st = mm.state.lock();
        st.unshared.extend(done);
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
    for &(start, n) in &p.runs {
        let _ = mm.uffd.wake(start, n as u64 * PAGE_SIZE_U64);
    }
    evicted
}
