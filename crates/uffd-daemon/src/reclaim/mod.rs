//! The reclaim path: keep the resident managed memory of the process tree under the limit.
//!
//! ```text
//! over the watermark ─▶ pick victims (the policy: mglru or clock) ─▶ mark Evicting
//!   ─▶ UFFDIO_WRITEPROTECT the runs (a write now waits in a WP fault)
//!   ─▶ read the contents through /proc/PID/mem (never faults: a page no longer mapped is
//!      forgotten)
//!   ─▶ store them in the tiers (zero pages take no space; aligned runs of 16 as one order-4
//!      folio) ─▶ mark Dropping(slot)
//!   ─▶ DROP to the agent: UFFDIO_MOVE into its scratch (the kernel refuses a page pinned for
//!      I/O, or shared after fork)
//!   ─▶ read the moved pages back from the scratch (the agent frees it at its next DROP, or
//!      on FREE once reclaim is idle)
//!   ─▶ per page: moved ─▶ Evicted(slot); moved but holding other bytes than were stored
//!      (written through a pin after step 2) ─▶ stored anew, Evicted(new slot); refused ─▶
//!      Resident (shared: unshared by the next DROP; refused again: pinned, left out a while)
//!   ─▶ lift write protection of kept pages / wake waiters of moved ones (they refault and
//!      get the stored copy)
//! ```
//!
//! Any failure along the way leaves the page resident (or, once dropped, in the store): a page
//! is never freed in the client before its contents are safely stored.
//!
//! **Pinned pages.** A page pinned for I/O (`FOLL_PIN`: io_uring fixed buffers, RDMA, vfio,
//! an `O_DIRECT` read in flight) is written by the kernel or a device through the pin, not
//! through the page tables: write protection does not hold such writes back. `UFFDIO_MOVE`
//! refuses a page that is pinned when it moves (`folio_maybe_dma_pinned`), so such a page is
//! never taken from the program; but a pin held when reclaim read the page and gone by the
//! move (the read completed, the buffer unregistered) let writes land after the read. So
//! what moved is read back from the scratch and compared with what was stored, and faults on
//! moved pages wait for that (`fault/serve.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent_conn::{AgentConn, DropWait, PendingDrop};
use crate::shared::Shared;

pub(crate) mod injected;
mod shmem;

use crate::mm::{runs_of, Mm, MmState, Page, ZERO_SLOT};
use crate::stats::Stats;
use crate::sys::{self, Fill, PAGE_SIZE, PAGE_SIZE_U64};
use crate::tiers::{FOLIO_ORDER, FOLIO_PAGES};

/// Pages per eviction batch (bounded by the agent's scratch area too).
pub(crate) const BATCH_PAGES: usize = 256;

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
pub(crate) fn units_of(victims: &[u64], zero: &[bool], large: bool) -> Vec<(usize, u32)> {
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

/// An ioctl the kernel refuses with `EAGAIN` while an event waits to be read is tried again
/// after this pause, with the event gate not held (the handler must read the event) ...
const AGAIN_PAUSE: Duration = Duration::from_micros(50);
/// ... this many times at most (5 s).
const AGAIN_TRIES: usize = 100_000;

fn unprotect(mm: &Mm, start: u64, len: u64) {
    for _ in 0..AGAIN_TRIES {
        match mm.uffd.writeprotect(start, len, false) {
            Ok(Fill::Again) => std::thread::sleep(AGAIN_PAUSE),
            _ => return,
        }
    }
}

/// Counts the pages no tier took, by cause, says each cause once with what to change, and
/// backs reclaim off while no tier takes anything, or the swap space is full: such a batch
/// pauses eviction (1 ms, doubling up to 1 s); a batch without either ends the pause.
pub(crate) fn note_store_outcome(
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
            tracing::warn!(
                "{e}: such pages stay resident, and while they do the limit may not \
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

/// DROPs that were not answered in time: settles those answered since, so that writers
/// waiting on their pages go on; writers held on pages moved while their DROP was in flight
/// go on once none is (the caller is the reclaim thread: no batch of its runs now).
pub(crate) fn settle_outstanding(shared: &Shared) {
    for m in shared.mms.lock().clone() {
        let (_, outstanding) = poll_pending_drop(shared, &m);
        // Writers held on pages moved while their DROP was in flight go on once none is
        // (the monitor is the reclaim thread: no batch of its runs now).
        if !outstanding && m.wp_waiters.swap(false, Ordering::AcqRel) {
            let ranges = m.state.lock().ranges.clone();
            for (s, e) in ranges {
                let _ = m.uffd.wake(s, e - s);
            }
        }
    }
}

/// Where reclaim takes a batch from.
enum Victim {
    /// An address space's private memory.
    Mm(Arc<Mm>),
    /// A shared anonymous inode.
    Shared(Arc<crate::shmem::ShmemInode>),
}

/// Reclaims down to the low watermark, biggest address space first, for at most 50 ms;
/// says whether reclaim is stalled (faults at the limit then go through).
pub(crate) fn to_low_watermark(shared: &Shared) {
    let deadline = Instant::now() + Duration::from_millis(50);
    while shared.resident() > shared.limit.low() && Instant::now() < deadline {
        // The biggest holders of resident pages: address spaces (their private memory) and
        // shared anonymous inodes (counted once each, whoever maps them: `shmem.rs`).
        let mut cands: Vec<(usize, Victim)> = shared
            .mms
            .lock()
            .clone()
            .into_iter()
            .map(|m| {
                let resident = m.state.lock().resident;
                (resident, Victim::Mm(m))
            })
            .chain(
                shared
                    .shmem
                    .inodes()
                    .into_iter()
                    .map(|i| (crate::shmem::resident(&i), Victim::Shared(i))),
            )
            .collect();
        cands.sort_by_key(|c| std::cmp::Reverse(c.0));
        let mut progress = 0;
        let pinned_before = shared.stats.pinned_refusals.load(Ordering::Relaxed);
        for (_, c) in cands.iter().take(3) {
            let want = shared.resident().saturating_sub(shared.limit.low());
            if want == 0 {
                break;
            }
            progress += match c {
                Victim::Mm(m) => evict_batch(shared, m, want),
                Victim::Shared(i) => shmem::evict_batch(shared, i, want.min(BATCH_PAGES)),
            };
            // zswap near its limit: its shrinker writes the coldest entries back to
            // the backing device before stores start being refused.
            shared.tiers.balance();
        }
        // Faults held at the limit can go now: wake their handlers at once rather than
        // at their next poll timeout.
        if progress > 0 {
            for m in shared.mms.lock().iter() {
                if m.throttled.swap(false, Ordering::AcqRel) {
                    m.retry.signal();
                }
            }
        }
        // Stalled only if nothing is on its way either: a DROP sent and not yet
        // answered (an agent thread descheduled on a loaded machine) frees its pages
        // when the answer comes, and letting faults through meanwhile took the
        // resident pages to twice the limit under load.
        let answer_due = progress == 0
            && shared.mms.lock().iter().any(|m| {
                m.agent
                    .try_lock()
                    .is_some_and(|a| a.as_ref().is_some_and(|a| a.pending.is_some()))
            });
        // Nor while pages a DROP refused as shared wait to be unshared: the next DROP
        // unshares them, and the one after moves them.
        let unshare_due = progress == 0
            && shared
                .mms
                .lock()
                .iter()
                .any(|m| m.state.try_lock().is_some_and(|st| !st.unshare.is_empty()));
        // Nor when a DROP found pinned pages: they are left out of the next picks,
        // which take other pages. (Faults let through while a pinned buffer was being
        // found took the resident pages to 2.7 times the limit under load.)
        let pinned_found = shared.stats.pinned_refusals.load(Ordering::Relaxed) > pinned_before;
        shared.set_reclaim_stalled(
            progress == 0
                && !answer_due
                && !unshare_due
                && !pinned_found
                && shared.resident() >= shared.limit.pages(),
        );
        if progress == 0 && !unshare_due && !pinned_found {
            break;
        }
    }
}

/// Evicts one batch from `mm`. Returns the pages evicted.
///
/// The steps, each a function below: pick the victims, (1) write-protect them, (2) read them,
/// (3) store them, (4) keep those still ours, (5) have them moved out and settle.
pub(crate) fn evict_batch(shared: &Shared, mm: &Arc<Mm>, max: usize) -> usize {
    let Some(pid) = mm.pid() else { return 0 };
    // Only once the agent's thread runs (it named itself): a forked child greets the daemon
    // from its forking thread and starts the agent thread after, and that thread could meet a
    // page of a batch on its way (a write waits for the batch's DROP, which would wait for the
    // agent thread that the writer has yet to start).
    if mm.agent_tid.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        return 0;
    }
    let mut agent_guard = mm.agent.lock();
    let (max, injected) = match may_start(shared, mm, pid, &mut agent_guard, max) {
        Start::Go { max, injected } => (max, injected),
        Start::Not => return 0,
        Start::SettlePending => {
            drop(agent_guard);
            return poll_pending_drop(shared, mm).0;
        }
    };
    let batch = mm
        .next_batch
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut victims = pick(shared, mm, batch, max, injected);
    let events_before = mm.events_applied.load(std::sync::atomic::Ordering::Acquire);
    let send_drop = |guard: &mut AgentSlot<'_>,
                     pages: Vec<u64>,
                     slots: Vec<u32>,
                     data: Vec<u8>,
                     frames: Vec<u64>| {
        if injected {
            drop_injected(shared, mm, guard, pid, pages, slots, data)
        } else {
            drop_by_agent(shared, mm, guard, pages, slots, data, frames, events_before)
        }
    };
    // A DROP of no page: it only unshares the pages waiting for it (they are not victims).
    let unshare_only = |guard: &mut AgentSlot<'_>| {
        send_drop(guard, Vec::new(), Vec::new(), Vec::new(), Vec::new())
    };
    if victims.is_empty() {
        return unshare_only(&mut agent_guard);
    }
    let runs = runs_of(&victims);
    let stats = &shared.stats;
    let mut t = std::time::Instant::now();
    let mut lap = |c: &std::sync::atomic::AtomicU64| {
        Stats::add(c, t.elapsed().as_nanos() as u64);
        t = std::time::Instant::now();
    };
    if !protect(shared, mm, &runs) {
        abort_pages(shared, mm, batch, &victims);
        return 0;
    }
    lap(&stats.reclaim_wp_ns);
    let Some(data) = read_victims(shared, mm, pid, batch, &mut victims, &runs) else {
        return 0;
    };
    if victims.is_empty() {
        return 0;
    }
    let frames = if injected {
        Vec::new()
    } else {
        match victim_frames(mm, pid, &victims, events_before) {
            Some(f) => f,
            None => {
                abort_pages(shared, mm, batch, &victims);
                return 0;
            }
        }
    };
    lap(&stats.reclaim_read_ns);
    let (slots, refused) = store(shared, mm, batch, &victims, &data);
    lap(&stats.reclaim_store_ns);
    let (to_drop, drop_slots, drop_data) =
        still_ours(shared, mm, batch, &victims, &slots, &refused, data);
    if to_drop.is_empty() {
        return unshare_only(&mut agent_guard);
    }
    let drop_frames = frames_to_drop(&to_drop, &victims, &frames);
    // 5. Have the agent move them out. Until it answers, any of them may move at any moment,
    //    so they stay `Dropping` and protected: a writer waits (the kernel's page under
    //    writeback), and so does a fault on one moved already. An answer that does not come in
    //    time leaves the batch outstanding.
    Stats::add(&shared.stats.drop_requests, 1);
    let evicted = send_drop(
        &mut agent_guard,
        to_drop,
        drop_slots,
        drop_data,
        drop_frames,
    );
    lap(&stats.reclaim_drop_ns);
    evicted
}

/// What [`may_start`] found.
enum Start {
    /// A batch of at most `max` pages may start; `injected`: DROPs are injected system calls.
    Go { max: usize, injected: bool },
    /// Not now.
    Not,
    /// The outstanding DROP is settled first (one DROP at a time).
    SettlePending,
}

/// Whether a batch may start in `mm` now: it has an agent (or is managed without one) and is
/// not held, the store is not backing off, and no DROP is outstanding.
fn may_start(
    shared: &Shared,
    mm: &Arc<Mm>,
    pid: i32,
    agent_guard: &mut AgentSlot<'_>,
    max: usize,
) -> Start {
    let Some(agent) = agent_guard.as_mut() else {
        return Start::Not;
    };
    // Held for a core dump or a debugger (`supervisor/hold.rs`): nothing is evicted. (Checked
    // under the agent slot, which a hold takes after marking the process.)
    if crate::mm::is_held(mm) {
        return Start::Not;
    }
    if shared
        .store_backoff
        .lock()
        .1
        .is_some_and(|t| std::time::Instant::now() < t)
    {
        return Start::Not;
    }
    if agent.pending.is_some() {
        return Start::SettlePending;
    }
    let max = max.min(agent.max_drop_pages).min(BATCH_PAGES);
    // Without an agent the program is stopped for the drop only (`injected.rs`, `BatchStop`),
    // and the rseq pages of the threads it has been stopped in are never in a batch: the
    // kernel writes a thread's rseq area on its way to a stop, and a thread whose rseq page
    // was write-protected in the batch would wait for the very drop that waits for its stop.
    // The first batch learns them in a stop of its own.
    let injected = agent.is_injected();
    if injected {
        if mm.state.lock().policy.is_empty() {
            return Start::Not; // nothing to pick: no stop for nothing
        }
        if mm.rseq_pages.lock().is_empty() {
            match injected::BatchStop::take(shared, pid) {
                Ok(s) => {
                    s.learn_rseq(mm);
                }
                Err(e) => {
                    lose_injection(shared, agent_guard, pid, &e);
                    return Start::Not;
                }
            }
        }
    }
    Start::Go { max, injected }
}

/// The frames of `to_drop` (a subset of the sorted `victims`, whose frames are `frames`; none
/// when `frames` is empty: a DROP injected without an agent).
fn frames_to_drop(to_drop: &[u64], victims: &[u64], frames: &[u64]) -> Vec<u64> {
    if frames.is_empty() {
        return Vec::new();
    }
    to_drop
        .iter()
        .map(|a| victims.binary_search(a).map_or(0, |i| frames[i]))
        .collect()
}

/// The agent slot of an address space, held through a batch.
type AgentSlot<'a> = parking_lot::MutexGuard<'a, Option<AgentConn>>;

/// Picks up to `max` victims for `batch` (marked `Evicting`); without an agent, never the
/// rseq pages of the threads stopped so far.
fn pick(shared: &Shared, mm: &Mm, batch: u32, max: usize, injected: bool) -> Vec<u64> {
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
    victims
}

/// 1. Write-protect: from here on a write waits for us. False if the protection could not be
///    set (the batch is then given up).
fn protect(shared: &Shared, mm: &Mm, runs: &[(u64, u32)]) -> bool {
    for &(start, n) in runs {
        let len = n as u64 * PAGE_SIZE_U64;
        let mut tries = 0;
        loop {
            match mm.uffd.writeprotect(start, len, true) {
                Ok(Fill::Filled) | Ok(Fill::Exists) => break,
                Ok(Fill::Again) if tries < 20_000 => {
                    tries += 1;
                    Stats::add(&shared.stats.reclaim_wp_again, 1);
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                _ => return false,
            }
        }
    }
    true
}

/// 2. Read the contents, without faulting anything in: a page the program removed or
///    unmapped since it was chosen (its event not applied yet), or one the kernel discarded
///    after MADV_FREE, is not mapped, so there is nothing to store, and a later access finds
///    it missing and gets zeros, as it would from the kernel. Such pages are forgotten (and
///    left out of `victims`). Returns the victims' bytes; `None` if the memory could not be
///    read (the batch is given up).
fn read_victims(
    shared: &Shared,
    mm: &Mm,
    pid: i32,
    batch: u32,
    victims: &mut Vec<u64>,
    runs: &[(u64, u32)],
) -> Option<Vec<u8>> {
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
    let Ok(missing) = read else {
        abort_pages(shared, mm, batch, victims);
        return None;
    };
    if missing.is_empty() {
        return Some(data);
    }
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
    Stats::add(&shared.stats.reclaim_unmapped_pages, missing.len() as u64);
    let keep: Vec<usize> = (0..victims.len())
        .filter(|&i| missing.binary_search(&victims[i]).is_err())
        .collect();
    let mut kept_data = Vec::with_capacity(keep.len() * PAGE_SIZE);
    for &i in &keep {
        kept_data.extend_from_slice(&data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
    }
    *victims = keep.iter().map(|&i| victims[i]).collect();
    Some(kept_data)
}

/// 2b. The frame of each victim, for the settlement of its DROP: a page the agent moved from
///    an address that an event (mremap, munmap, madvise) changed meanwhile may be the one the
///    event put there rather than the victim (the kernel lets moves through again once the
///    handler has read the event, before it has applied it), and only the frame tells them
///    apart (`put_back_moved`). Read under `Mm::event_gate`, so that no event is being read or
///    applied meanwhile, and believed only if no event came since the protection: none was
///    applied (`events_applied`) and none is waiting to be read (a write-protection, which
///    the kernel refuses with `EAGAIN` while one waits). `None`: the batch is given up.
///    Frames unknown (no `/proc/PID/pagemap`) are 0.
fn victim_frames(mm: &Mm, pid: i32, victims: &[u64], events_before: u64) -> Option<Vec<u64>> {
    let runs: Vec<(u64, usize)> = runs_of(victims)
        .into_iter()
        .map(|(s, n)| (s, n as usize))
        .collect();
    let _gate = mm.gate_read();
    let frames = frames_of(mm, pid, &runs).unwrap_or_else(|| vec![0; victims.len()]);
    if !matches!(
        mm.uffd.writeprotect(victims[0], PAGE_SIZE_U64, true),
        Ok(Fill::Filled) | Ok(Fill::Exists)
    ) || mm.events_applied.load(std::sync::atomic::Ordering::Acquire) != events_before
    {
        return None;
    }
    Some(frames)
}

/// The frames of `runs` (address, pages) of `mm`'s process, through its cached
/// `/proc/PID/pagemap`; `None` if it cannot be read.
fn frames_of(mm: &Mm, pid: i32, runs: &[(u64, usize)]) -> Option<Vec<u64>> {
    let mut pm = mm.pagemap.lock();
    if pm.as_ref().is_none_or(|(p, _)| *p != pid) {
        *pm = std::fs::File::open(format!("/proc/{pid}/pagemap"))
            .ok()
            .map(|f| (pid, f));
    }
    sys::read_frames(&pm.as_ref()?.1, runs).ok()
}

/// 3. Store: zero pages need no slot; aligned runs of 16 go as one folio. A unit no tier
///    takes (full, refused, I/O error) stays resident: its pages are given back. Returns the
///    victims' slots and the pages given back (sorted).
fn store(
    shared: &Shared,
    mm: &Mm,
    batch: u32,
    victims: &[u64],
    data: &[u8],
) -> (Vec<u32>, Vec<u64>) {
    let (slots, refused) = store_pages(shared, victims, data);
    if !refused.is_empty() {
        abort_pages(shared, mm, batch, &refused);
    }
    (slots, refused)
}

/// Stores the pages `victims` (sorted keys: addresses, or offsets in a shared inode) whose bytes
/// are `data`, page `i` at `i * 4096`: zero pages take no slot; aligned runs of 16 go as one
/// order-4 unit (one backend write, one read back). Returns each page's slot (`ZERO_SLOT` for a
/// zero page) and the pages no tier took (sorted), counted and said (`note_store_outcome`).
pub(crate) fn store_pages(shared: &Shared, victims: &[u64], data: &[u8]) -> (Vec<u32>, Vec<u64>) {
    let mut slots = vec![ZERO_SLOT; victims.len()];
    let zero: Vec<bool> = data
        .chunks_exact(PAGE_SIZE)
        .map(|p| p.iter().all(|&b| b == 0))
        .collect();
    let units = units_of(victims, &zero, shared.tiers.large_folios());
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
    (slots, refused)
}

/// 4. Still ours? (A REMOVE, UNMAP or REMAP may have taken pages meanwhile.) Those that are
///    become `Dropping`; the others' slots are let go and their protection lifted. Returns
///    the pages to drop, their slots, and what was read from them, for the read-back.
fn still_ours(
    shared: &Shared,
    mm: &Mm,
    batch: u32,
    victims: &[u64],
    slots: &[u32],
    refused: &[u64],
    data: Vec<u8>,
) -> (Vec<u64>, Vec<u32>, Vec<u8>) {
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
    // The batch's buffer as it is when every victim is still ours (the usual case), else the
    // pages' bytes gathered.
    let drop_data = if to_drop.len() == victims.len() {
        data
    } else {
        let mut d = Vec::with_capacity(to_drop.len() * PAGE_SIZE);
        for (i, a) in victims.iter().enumerate() {
            if to_drop.binary_search(a).is_ok() {
                d.extend_from_slice(&data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
            }
        }
        d
    };
    if !gone.is_empty() {
        Stats::add(&shared.stats.evict_aborts, gone.len() as u64);
        for (start, n) in runs_of(&gone) {
            unprotect(mm, start, n as u64 * PAGE_SIZE_U64);
        }
    }
    (to_drop, drop_slots, drop_data)
}

/// Step 5 without an agent: the daemon moves the pages itself, in a stop of the program
/// (`injected.rs`), reads them back and unshares the pages waiting for it, and knows the
/// outcome of every call when the stop ends: the batch settles now. Returns the pages evicted
/// (or, with nothing to move, the pages unshared).
fn drop_injected(
    shared: &Shared,
    mm: &Mm,
    agent_guard: &mut Option<AgentConn>,
    pid: i32,
    to_drop: Vec<u64>,
    drop_slots: Vec<u32>,
    drop_data: Vec<u8>,
) -> usize {
    let unshare = {
        let room = (BATCH_PAGES - to_drop.len().min(BATCH_PAGES)).min(UNSHARE_PAGES);
        mm.state.lock().take_unshare(room, &to_drop)
    };
    if to_drop.is_empty() && unshare.is_empty() {
        return 0;
    }
    Stats::add(&shared.stats.inject_drops, 1);
    let t_drop = std::time::Instant::now();
    let mut p = PendingDrop {
        seq: 0,
        runs: runs_of(&to_drop),
        pages: to_drop,
        slots: drop_slots,
        unshare,
        data: drop_data,
        frames: Vec::new(),
        scratch_first: None,
        sent: t_drop,
        said_late: false,
    };
    let stop = match injected::BatchStop::take(shared, pid) {
        Ok(s) => s,
        Err(e) => {
            // Nothing was moved: the batch goes back.
            let kept = vec![1u8; p.pages.len() + p.unshare.len()];
            settle_drop(shared, mm, &p, Some(&kept), &[]);
            lose_injection(shared, agent_guard, pid, &e);
            return 0;
        }
    };
    // A thread stopped for the first time: if its rseq page is in the batch, it leaves the
    // batch (unprotected) before the thread is stepped.
    if let Some(rp) = stop.learn_rseq(mm) {
        if let Ok(i) = p.pages.binary_search(&rp) {
            let one = PendingDrop {
                seq: 0,
                pages: vec![rp],
                slots: vec![p.slots[i]],
                runs: vec![(rp, 1)],
                unshare: Vec::new(),
                data: Vec::new(),
                frames: Vec::new(),
                scratch_first: None,
                sent: t_drop,
                said_late: false,
            };
            settle_drop(shared, mm, &one, Some(&[1]), &[]);
            p.pages.remove(i);
            p.slots.remove(i);
            p.data.drain(i * PAGE_SIZE..(i + 1) * PAGE_SIZE);
            p.runs = runs_of(&p.pages);
        }
        if let Ok(i) = p.unshare.binary_search(&rp) {
            p.unshare.remove(i); // (it waits for the next DROP)
            mm.state.lock().unshare.insert(rp);
        }
    }
    // Events the program raised before its stop (an unmap, and a new mapping at the same
    // addresses) are applied by now: only pages still `Dropping` are moved, so that a move
    // never reaches memory that is no longer the batch's.
    injected::wait_handled(mm);
    let live: Vec<bool> = {
        let st = mm.state.lock();
        p.pages
            .iter()
            .zip(&p.slots)
            .map(|(&a, &slot)| st.pages.get(a) == Some(Page::Dropping { slot }))
            .collect()
    };
    let live_pages: Vec<u64> = p
        .pages
        .iter()
        .zip(&live)
        .filter_map(|(&a, &l)| l.then_some(a))
        .collect();
    let done = injected::drop_pages(shared, mm, pid, stop, &live_pages, &p.unshare);
    // The moved pages are in the scratch (page `k` of `live_pages` at scratch page `k`): read
    // back now that the program runs again. (Pages no longer `Dropping` were settled by their
    // events: settle_drop skips them.)
    let mut status = Vec::with_capacity(p.pages.len() + p.unshare.len());
    let mut moved = Vec::new();
    let mut next = 0;
    for (i, &l) in live.iter().enumerate() {
        if l {
            status.push(done.status[next]);
            if done.status[next] == 0 {
                moved.push((next, i));
            }
            next += 1;
        } else {
            status.push(1);
        }
    }
    status.extend_from_slice(&done.status[live_pages.len()..]);
    let changed = read_back(mm, pid, &moved, &p.data);
    let only_unshare = p.pages.is_empty();
    let unshared = p.unshare.len();
    let evicted = settle_drop(shared, mm, &p, Some(&status), &changed);
    if let Some(e) = done.err {
        lose_injection(shared, agent_guard, pid, &e);
    }
    if only_unshare {
        unshared
    } else {
        evicted
    }
}

/// How long the moved pages of an address space's last DROP stay in its scratch before the
/// monitor frees it (reclaim idle meanwhile). While reclaim runs, each DROP frees what the last
/// one left; freeing at once whenever the resident pages dipped under the high watermark cost a
/// process without an agent a stop of its own between most rounds of reclaim (856 stops for
/// 783 DROPs paging 256 MiB through 64 MiB).
pub(crate) const SCRATCH_IDLE: std::time::Duration = std::time::Duration::from_millis(200);

/// Once reclaim is idle (the monitor found the resident pages under the high watermark):
/// frees the scratch of every address space whose last DROP left its moved pages there at
/// least [`SCRATCH_IDLE`] ago (the next DROP would free it first, but none may come for a long
/// time). With an agent: a FREE, answered (with the handler free to read the scratch's
/// REMOVE meanwhile); without one: a stop of its own.
pub(crate) fn free_idle_scratch(shared: &Shared) {
    use std::sync::atomic::Ordering;
    let mms: Vec<Arc<Mm>> = shared.mms.lock().clone();
    for mm in mms {
        let due = mm
            .scratch_filled
            .lock()
            .is_some_and(|t| t.elapsed() >= SCRATCH_IDLE);
        if !due || mm.retired.load(Ordering::Acquire) {
            continue;
        }
        let Some(pid) = mm.pid() else { continue };
        let Some(mut g) = mm.agent.try_lock() else {
            continue;
        };
        let Some(agent) = g.as_mut() else {
            continue;
        };
        if agent.pending.is_some() {
            continue;
        }
        if agent.is_injected() {
            // (A stop that failed is tried again after another idle spell.)
            if let Err(e) = injected::free_scratch(shared, &mm, pid) {
                *mm.scratch_filled.lock() = Some(std::time::Instant::now());
                lose_injection(shared, &mut g, pid, &e);
            }
        } else {
            match agent.free_scratch(shared.policy.drop_timeout) {
                Ok(()) => *mm.scratch_filled.lock() = None,
                Err(DropWait::NotYet) => agent.scratch_used = usize::MAX,
                Err(DropWait::Gone(e) | DropWait::Protocol(e)) => {
                    agent.scratch_used = usize::MAX;
                    lose_agent(shared, &mm, &mut g, &e);
                }
            }
        }
    }
}

/// Most pages one DROP asks the agent to unshare.
const UNSHARE_PAGES: usize = 256;

/// Step 5 with an agent: sends the DROP of `to_drop` (their slots `drop_slots`; possibly none)
/// together with the pages waiting to be unshared, waits for the answer up to the timeout and
/// settles the batch, or leaves it outstanding. Returns the pages evicted, or, for a DROP that
/// only unshares, the pages unshared (reclaim made progress: they can be evicted now).
///
/// While the agent moves pages the fault handler reads nothing from this address space's uffd
/// (it takes the event gate to read, and the DROP holds it): the kernel makes `UFFDIO_MOVE`
/// fail with `EAGAIN` only until an event is *read*, and a move after that takes whatever the
/// event put at the old address: a page of another mapping that an `mremap` moved there,
/// possibly one another userfaultfd manages, whose owner never learns it left. With the handler
/// held, every event that comes after the check below stays unread until the moves end, so the
/// agent's moves either meet it (`EAGAIN`) or come before it. A DROP that unshares is not
/// held: the unsharing may write-fault a page the daemon protects, and only the handler serves
/// that fault. So the pages waiting to be unshared (refused by an earlier DROP) go in a DROP of
/// their own that moves nothing, sent just before the batch's moves (`unshare_first`): a move
/// is never made without the gate. (Unsharing in a DROP of its own right *after* the batch
/// that refused the pages unshared them at once, and a forked program's resident pages peaked
/// 40-60% above the limit; before the next batch is when the combined DROP did it.)
/// `events_before`: the events applied when the victims were picked.
#[allow(clippy::too_many_arguments)]
fn drop_by_agent(
    shared: &Shared,
    mm: &Mm,
    agent_guard: &mut Option<AgentConn>,
    to_drop: Vec<u64>,
    drop_slots: Vec<u32>,
    drop_data: Vec<u8>,
    drop_frames: Vec<u64>,
    events_before: u64,
) -> usize {
    if !to_drop.is_empty() && !unshare_first(shared, mm, agent_guard, events_before) {
        // The agent is gone, or its answer to the unsharing is outstanding: nothing moves now.
        let pending = PendingDrop {
            seq: 0,
            runs: runs_of(&to_drop),
            pages: to_drop,
            slots: drop_slots,
            unshare: Vec::new(),
            data: drop_data,
            frames: drop_frames,
            scratch_first: None,
            sent: std::time::Instant::now(),
            said_late: false,
        };
        settle_drop(shared, mm, &pending, None, &[]);
        return 0;
    }
    let Some(agent) = agent_guard.as_mut() else {
        return 0;
    };
    let unshare = if to_drop.is_empty() {
        mm.state.lock().take_unshare(UNSHARE_PAGES, &[])
    } else {
        Vec::new()
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
        data: drop_data,
        frames: drop_frames,
        scratch_first: None,
        sent: t_drop,
        said_late: false,
    };
    // From here until the settlement a fault on one of these pages that an event has changed
    // waits (`fault::serve`, `gate`): the agent may move what the event put there.
    *mm.drop_runs.lock() = pending.runs.clone();
    let only_unshare = pending.pages.is_empty();
    // Room in the scratch first, freed while the handler is free to read the REMOVE.
    if !only_unshare
        && agent.scratch_used.saturating_add(pending.pages.len()) > agent.max_drop_pages
    {
        match agent.free_scratch(shared.policy.drop_timeout) {
            Ok(()) => *mm.scratch_filled.lock() = None,
            Err(e) => {
                agent.scratch_used = usize::MAX;
                settle_drop(shared, mm, &pending, None, &[]);
                if let DropWait::Gone(e) | DropWait::Protocol(e) = e {
                    lose_agent(shared, mm, agent_guard, &e);
                }
                return 0;
            }
        }
    }
    // Held from the check to the answer (or the timeout); never while settling, which takes it
    // again (a reader waiting behind the handler's write would wait for itself).
    let hold = !only_unshare && pending.unshare.is_empty();
    let gate = if hold {
        let (gate, kept) = gate_in_place(shared, mm, pending, events_before);
        let Some(gate) = gate else { return 0 };
        pending = kept;
        Some(gate)
    } else {
        None
    };
    let waited = match agent.send_drop(&pending.runs, &unshare_runs) {
        Ok(seq) => {
            pending.seq = seq;
            let statuses = pending.pages.len() + pending.unshare.len();
            agent.wait_drop(pending.seq, statuses, shared.policy.drop_timeout)
        }
        Err(e) => {
            // Nothing was sent: nothing moves. Give the pages back.
            drop(gate);
            lose_agent(shared, mm, agent_guard, &e);
            settle_drop(shared, mm, &pending, None, &[]);
            return 0;
        }
    };
    drop(gate);
    if waited.is_ok() {
        shared
            .drop_agent_times
            .record(t_drop.elapsed().as_nanos() as u64);
    }
    let unshared = pending.unshare.len();
    let evicted = finish_drop(shared, mm, agent_guard, pending, waited);
    if only_unshare {
        return unshared;
    }
    evicted
}

/// Takes the event gate for a DROP that moves `pending`'s pages. If events were applied since
/// the pick (`events_before`), only the pages whose frame is still the one recorded at the
/// read stay in the DROP; the others are given back with the gate let go (unprotecting them
/// waits for the handler to read any event still queued: the kernel refuses write-protection
/// changes until then, and the handler reads nothing while the gate is held), and the split is
/// made again if another event came meanwhile. Returns the gate (`None` if no page is left)
/// and the pages that stay.
fn gate_in_place<'m>(
    shared: &Shared,
    mm: &'m Mm,
    mut pending: PendingDrop,
    events_before: u64,
) -> (Option<parking_lot::RwLockReadGuard<'m, ()>>, PendingDrop) {
    let mut gate = mm.gate_read();
    let mut events_seen = events_before;
    loop {
        let now = mm.events_applied.load(std::sync::atomic::Ordering::Acquire);
        if now == events_seen {
            return (Some(gate), pending);
        }
        events_seen = now;
        let (kept, moved_on) = split_in_place(mm, pending);
        pending = kept;
        if moved_on.pages.is_empty() {
            return (Some(gate), pending);
        }
        drop(gate);
        Stats::add(&shared.stats.evict_aborts, moved_on.pages.len() as u64);
        let again = vec![libc::EAGAIN as u8; moved_on.pages.len()];
        settle_drop(shared, mm, &moved_on, Some(&again), &[]);
        if pending.pages.is_empty() {
            mm.drop_runs.lock().clear();
            return (None, pending);
        }
        *mm.drop_runs.lock() = pending.runs.clone();
        gate = mm.gate_read();
    }
}

/// Before a DROP that moves pages: the pages waiting to be unshared, if any, in a DROP of their
/// own (not held: see [`drop_by_agent`]). False if the agent is gone or that DROP's answer is
/// still outstanding (no other DROP may be sent then).
fn unshare_first(
    shared: &Shared,
    mm: &Mm,
    agent_guard: &mut Option<AgentConn>,
    events_before: u64,
) -> bool {
    if mm.state.lock().unshare.is_empty() {
        return agent_guard.is_some();
    }
    let (p, s, d, f) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    drop_by_agent(shared, mm, agent_guard, p, s, d, f, events_before);
    agent_guard.as_ref().is_some_and(|a| a.pending.is_none())
}

/// Splits a DROP's pages into those still at their addresses (the frame there now is the one
/// recorded when the batch was read) and the others, under the event gate: no event is read
/// meanwhile, and one pending makes the moves fail (`EAGAIN`). Without frames (pagemap not
/// readable) no page counts as in place.
fn split_in_place(mm: &Mm, p: PendingDrop) -> (PendingDrop, PendingDrop) {
    let runs: Vec<(u64, usize)> = p.runs.iter().map(|&(a, n)| (a, n as usize)).collect();
    let now = mm
        .pid()
        .and_then(|pid| frames_of(mm, pid, &runs))
        .filter(|f| f.len() == p.pages.len() && p.frames.len() == p.pages.len());
    let keep: Vec<bool> = match &now {
        Some(now) => now
            .iter()
            .zip(&p.frames)
            .map(|(&n, &f)| n != 0 && n == f)
            .collect(),
        None => vec![false; p.pages.len()],
    };
    let part = |want: bool| {
        let idx: Vec<usize> = (0..p.pages.len()).filter(|&i| keep[i] == want).collect();
        let pages: Vec<u64> = idx.iter().map(|&i| p.pages[i]).collect();
        PendingDrop {
            seq: 0,
            runs: runs_of(&pages),
            slots: idx.iter().map(|&i| p.slots[i]).collect(),
            data: idx
                .iter()
                .flat_map(|&i| p.data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].iter().copied())
                .collect(),
            frames: idx.iter().map(|&i| p.frames[i]).collect(),
            pages,
            unshare: if want { p.unshare.clone() } else { Vec::new() },
            scratch_first: None,
            sent: p.sent,
            said_late: false,
        }
    };
    (part(true), part(false))
}

/// Looks for the answer to `mm`'s outstanding DROP without waiting, and settles the batch if
/// it came (or if the agent is gone). Returns the pages evicted, and whether a DROP is still
/// outstanding (no other DROP may be sent to that agent meanwhile).
pub(crate) fn poll_pending_drop(shared: &Shared, mm: &Mm) -> (usize, bool) {
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
    waited: Result<(Vec<u8>, usize), DropWait>,
) -> usize {
    let scratch_pages = agent_guard.as_ref().map_or(0, |a| a.max_drop_pages);
    let waited = match waited {
        Ok((_, first)) if first + pending.pages.len() > scratch_pages => {
            Err(DropWait::Protocol(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "agent placed a DROP of {} pages at scratch page {first}, past its {} \
                     scratch pages",
                    pending.pages.len(),
                    scratch_pages
                ),
            )))
        }
        w => w,
    };
    let mut pending = pending;
    match waited {
        Ok((status, first)) => {
            pending.scratch_first = Some(first);
            if let Some(a) = agent_guard.as_mut() {
                // As the agent counts (agent.c, do_drop); a DROP refused for want of room
                // leaves the count unknown: the next DROP frees first.
                a.scratch_used = if status.contains(&(libc::ENOSPC as u8)) {
                    usize::MAX
                } else {
                    first + pending.pages.len()
                };
            }
            // The pages it moved are in its scratch until FREE (page `i` of the DROP at scratch
            // page `first + i`): read them back first.
            let moved: Vec<(usize, usize)> = status[..pending.pages.len()]
                .iter()
                .enumerate()
                .filter_map(|(i, &s)| (s == 0).then_some((first + i, i)))
                .collect();
            let changed = match mm.pid() {
                Some(pid) => read_back(mm, pid, &moved, &pending.data),
                None => Vec::new(),
            };
            // The agent frees the scratch at the first DROP that does not fit in what is left
            // of it (a REMOVE event, whose round trip through the handler holds back every
            // move and write-protection meanwhile: one in two DROPs, not each), or on FREE
            // once reclaim is idle (`free_idle_scratch`).
            if !pending.pages.is_empty() {
                *mm.scratch_filled.lock() = Some(std::time::Instant::now());
            }
            settle_drop(shared, mm, &pending, Some(&status), &changed)
        }
        Err(DropWait::NotYet) => {
            if pending.sent.elapsed() >= shared.policy.drop_timeout
                && !std::mem::replace(&mut pending.said_late, true)
            {
                Stats::add(&shared.stats.drop_timeouts, 1);
                tracing::debug!(
                    "the agent of pid {:?} has not answered a DROP for {:?} \
                     (stopped, or starved of CPU?); its {} pages stay protected until it does",
                    mm.pid(),
                    shared.policy.drop_timeout,
                    pending.pages.len()
                );
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
            settle_drop(shared, mm, &pending, None, &[])
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
    tracing::info!(
        "lost the agent of pid {:?} ({e}); its pages are still served, but no \
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
    shared.note_inject_error(pid, e);
    match e {
        InjectError::Gone(_) | InjectError::NoStop(_) => {}
        _ => {
            *agent_guard = None;
            Stats::add(&shared.stats.agents_lost, 1);
            tracing::info!(
                "pid {pid} can no longer be stopped to drop pages ({e}); its pages \
                 are still served, but no longer evicted"
            );
        }
    }
}

/// The pages a DROP moved that held other bytes when they moved than reclaim had read from
/// them (and stored): written through a pin in between. Each as (its index in the DROP, what it
/// held), by index.
pub(crate) type Changed = Vec<(usize, Vec<u8>)>;

thread_local! {
    /// The read-back buffer of the thread that settles DROPs (the monitor): a batch's worth,
    /// kept between batches.
    static READ_BACK: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Reads back, through `/proc/PID/mem`, the pages a DROP moved into `mm`'s scratch, and
/// returns those that hold other bytes than `stored` (what reclaim read, page `i` of the DROP
/// at `i * 4096`). `moved`: (scratch page, index in the DROP) of each page moved, by scratch
/// page. A page the move found missing (it allows holes) is not there to compare; nor is
/// anything if the process is gone.
pub(crate) fn read_back(mm: &Mm, pid: i32, moved: &[(usize, usize)], stored: &[u8]) -> Changed {
    let mut changed = Vec::new();
    if moved.is_empty() || stored.is_empty() {
        return changed;
    }
    let mut mem = mm.mem.lock();
    if mem.as_ref().is_none_or(|(p, _)| *p != pid) {
        *mem = std::fs::File::open(format!("/proc/{pid}/mem"))
            .ok()
            .map(|f| (pid, f));
    }
    let Some((_, f)) = mem.as_ref() else {
        return changed;
    };
    READ_BACK.with_borrow_mut(|buf| {
        let mut i = 0;
        while i < moved.len() {
            // A run of consecutive scratch pages: one read.
            let mut j = i + 1;
            while j < moved.len() && moved[j].0 == moved[j - 1].0 + 1 {
                j += 1;
            }
            let len = (j - i) * PAGE_SIZE;
            if buf.len() < len {
                buf.resize(len, 0);
            }
            let at = mm.scratch + moved[i].0 as u64 * PAGE_SIZE_U64;
            if let Ok(missing) = sys::read_mem(f, &[(at, len)], &mut buf[..len]) {
                for (k, &(slot, idx)) in moved[i..j].iter().enumerate() {
                    let a = mm.scratch + slot as u64 * PAGE_SIZE_U64;
                    let held = &buf[k * PAGE_SIZE..(k + 1) * PAGE_SIZE];
                    let read = stored.get(idx * PAGE_SIZE..(idx + 1) * PAGE_SIZE);
                    if missing.binary_search(&a).is_err() && read.is_some_and(|r| r != held) {
                        changed.push((idx, held.to_vec()));
                    }
                }
            }
            i = j;
        }
    });
    changed.sort_unstable_by_key(|c| c.0);
    changed
}

/// Stores one page on its own (a page that changed after reclaim first stored it); `None`
/// if no tier takes it.
fn store_page(shared: &Shared, page: &[u8]) -> Option<u32> {
    if page.iter().all(|&b| b == 0) {
        return Some(ZERO_SLOT);
    }
    match shared.tiers.store_units(&[(0, page)]).pop() {
        Some(Ok(slots)) => slots.first().copied(),
        _ => None,
    }
}

/// Accounts for a DROP's outcome: with the agent's per-page answer, moved pages become
/// `Evicted` and refused ones resident again; without one (the agent is gone and nothing moves
/// any more, but which pages moved is unknown), every page keeps its stored copy as
/// `Inherited` (a missing fault is served from it, a write-protect fault lifts the
/// protection). A moved page that `changed` names (it held other bytes than were stored:
/// written through a pin after reclaim read it) is stored anew with those bytes, its first copy
/// released (a missing fault there waits for this, and then gets them). Then protection is
/// lifted from pages kept in place and waiting writers and faults are woken. Returns the pages
/// evicted.
fn settle_drop(
    shared: &Shared,
    mm: &Mm,
    p: &PendingDrop,
    status: Option<&[u8]>,
    changed: &[(usize, Vec<u8>)],
) -> usize {
    let stats = &shared.stats;
    let mut t = Tally::default();
    // Moved pages that held other bytes than reclaim read from them (and stored): written
    // through a pin in between. Stored anew before the state lock is taken (a store may write
    // to the backend); the new slot, or `None` if no tier takes the page. Not put back in
    // place with `UFFDIO_COPY` from here: a `REMOVE` of the page that the handler has read but
    // not applied yet zaps the range only after its event is read, so a copy could land after
    // the zap, and the program would find these bytes where it expects zeros. The handler,
    // which applies events in the kernel's order, serves the page at its next access.
    let mut fresh: Vec<(usize, Option<u32>, bool)> = Vec::new();
    let mut moved_after = Vec::new();
    if let Some(s) = status {
        for (i, held) in changed {
            if s.get(*i) == Some(&0) {
                fresh.push((*i, store_page(shared, held), false));
            }
        }
    }
    let mut deferred = Vec::new();
    {
        // A page changed through a pin that no tier takes goes back in place with a fill
        // (`settle_moved`): under the event gate, taken before the state lock as the handler
        // takes them (`Mm::event_gate`).
        let _gate = (!changed.is_empty()).then(|| mm.gate_read());
        let mut st = mm.state.lock();
        for (i, &a) in p.pages.iter().enumerate() {
            let slot = p.slots[i];
            if st.pages.get(a) != Some(Page::Dropping { slot }) {
                // Refaulted or removed meanwhile: already accounted for. If it was moved, it
                // may have been moved from under the event that changed it (below).
                if status.is_some_and(|s| s[i] == 0) {
                    moved_after.push(i);
                }
                continue;
            }
            match status.map(|s| s[i]) {
                Some(0) => {
                    let args = (i, a, slot, true);
                    if settle_moved(shared, mm, &mut st, &mut t, args, &mut fresh, changed) {
                        deferred.push(i);
                    }
                }
                // An injected DROP whose call failed part way (`injected.rs`): moved or not,
                // unknown; its copy is kept.
                Some(injected::DROP_UNKNOWN) | None => {
                    st.pages.insert(a, Page::Inherited { slot });
                    t.kept.push(a);
                }
                Some(e) => settle_refused(shared, &mut st, &mut t, a, slot, e),
            }
        }
    }
    if !deferred.is_empty() {
        let changed_since = settle_deferred(shared, mm, p, &mut t, deferred, &mut fresh, changed);
        moved_after.extend(changed_since);
    }
    if !moved_after.is_empty() {
        put_back_moved(shared, mm, p, &moved_after);
    }
    mm.drop_runs.lock().clear();
    // (Pages stored anew that had been refaulted or removed meanwhile: their new copies go.)
    for &(_, slot, used) in &fresh {
        if let (Some(slot), false) = (slot, used) {
            if slot != ZERO_SLOT {
                shared.put_slot(slot);
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
    Stats::add(&stats.evicted_pages, t.evicted as u64);
    Stats::add(&stats.zero_pages_evicted, t.zero);
    Stats::add(
        &stats.bytes_written,
        (t.evicted as u64 - t.zero) * PAGE_SIZE_U64,
    );
    Stats::add(&stats.evict_changed_pages, t.changed);
    Stats::add(&stats.pinned_refusals, t.pinned);
    if !t.kept.is_empty() {
        Stats::add(&stats.evict_aborts, t.kept.len() as u64);
        for (start, n) in runs_of(&t.kept) {
            unprotect(mm, start, n as u64 * PAGE_SIZE_U64);
        }
    }
    // Writers (and faults) that waited on moved pages retry now and fault them back from the
    // store.
    for &(start, n) in &p.runs {
        let _ = mm.uffd.wake(start, n as u64 * PAGE_SIZE_U64);
    }
    t.evicted
}

/// Pages of DROP `p` (indices) that the agent moved although an event had changed their
/// address meanwhile (a REMOVE, UNMAP or REMAP applied before the settlement). The kernel
/// refuses a move while an event waits to be read, but lets it through again once the handler
/// has read it and before the handler has applied it, and a move then takes whatever is at
/// the address: the victim (a REMOVE zaps only after its event is read), or a page the event
/// put there (mremap of another mapping over it; another uffd's mapping). The frame tells:
/// the victim's was recorded at the batch's read (`victim_frames`). A victim is let go, as
/// the event meant; anything else goes back where it was taken from, with `UFFDIO_COPY`, if
/// the table holds a resident
/// page of ours there (an mremap brought it), while faults there wait for this settlement
/// (`Mm::drop_runs`). Counted: `drop_moved_put_back`; `drop_moved_not_ours` for a page taken
/// from anywhere else (another uffd's range: its handler serves the next fault there);
/// `drop_moved_lost` for one that could not go back (said).
fn put_back_moved(shared: &Shared, mm: &Mm, p: &PendingDrop, idx: &[usize]) {
    let (Some(first), Some(pid)) = (p.scratch_first, mm.pid()) else {
        return;
    };
    if p.frames.len() != p.pages.len() {
        return;
    }
    let at = |i: usize| mm.scratch + (first + i) as u64 * PAGE_SIZE_U64;
    let runs: Vec<(u64, usize)> = idx.iter().map(|&i| (at(i), 1)).collect();
    let Some(now) = frames_of(mm, pid, &runs) else {
        return;
    };
    for (k, &i) in idx.iter().enumerate() {
        let (was, is) = (p.frames[i], now[k]);
        if was == 0 || is == 0 || was == is {
            continue; // the victim itself (or unknown): let go
        }
        let a = p.pages[i];
        let mut page = vec![0u8; PAGE_SIZE];
        let read = {
            let mem = mm.mem.lock();
            mem.as_ref()
                .map(|(_, f)| sys::read_mem(f, &[(at(i), PAGE_SIZE)], &mut page))
        };
        if !matches!(read, Some(Ok(ref missing)) if missing.is_empty()) {
            note_moved_lost(shared, mm, a, "its copy in the scratch could not be read");
            continue;
        }
        // An event queued meanwhile makes the copy fail (`EAGAIN`) until the handler reads
        // it, which it does not while the gate is held: the gate is let go and the page's
        // state looked at again once the handler had its turn (5 s at most).
        let mut last = None;
        for _ in 0..AGAIN_TRIES {
            let _gate = mm.gate_read();
            let st = mm.state.lock();
            // Only where the table expects a resident page of ours: anywhere else the daemon
            // does not see what happened to the address since (another uffd's range, whose
            // REMOVE comes to that uffd; or ours, emptied by a REMOVE after the move), and a
            // fill could bring back bytes where the program now expects zeros. Such a page is
            // left to whoever serves that range's next fault (`drop_moved_not_ours`).
            if !(matches!(st.pages.get(a), Some(Page::Resident { .. })) && st.in_ranges(a)) {
                Stats::add(&shared.stats.drop_moved_not_ours, 1);
                last = None;
                break;
            }
            match mm.uffd.copy(a, &page) {
                Ok(Fill::Filled) => {
                    Stats::add(&shared.stats.drop_moved_put_back, 1);
                    last = None;
                    break;
                }
                Ok(Fill::Again) => last = Some(Ok(Fill::Again)),
                other => {
                    last = Some(other);
                    break;
                }
            }
            drop(st);
            drop(_gate);
            std::thread::sleep(AGAIN_PAUSE);
        }
        if let Some(other) = last {
            note_moved_lost(shared, mm, a, &format!("putting it back gave {other:?}"));
        }
    }
}

fn note_moved_lost(shared: &Shared, mm: &Mm, a: u64, why: &str) {
    Stats::add(&shared.stats.drop_moved_lost, 1);
    tracing::error!(
        "pid {:?}: the agent moved the page at {a:#x} from under an event (mremap, munmap, \
         madvise) and it cannot go back: {why}",
        mm.pid()
    );
}

/// What a DROP's settlement did.
#[derive(Default)]
struct Tally {
    /// Pages kept in place (their protection is lifted).
    kept: Vec<u64>,
    evicted: usize,
    zero: u64,
    /// Moved pages that held other bytes than were stored.
    changed: u64,
    /// Pages found pinned.
    pinned: u64,
}

/// Page `i` of a DROP (at `a`, stored in `slot`) moved out: evicted, with the bytes it held
/// when it moved (`fresh`, stored anew) if they were not those stored. Returns true, having
/// changed nothing, if such a page that no tier took could not go back in place because an
/// event waits to be read (`EAGAIN`) and `may_defer`: [`settle_deferred`] tries it again with
/// the event gate let go.
fn settle_moved(
    shared: &Shared,
    mm: &Mm,
    st: &mut MmState,
    t: &mut Tally,
    (i, a, slot, may_defer): (usize, u64, u32, bool),
    fresh: &mut [(usize, Option<u32>, bool)],
    changed: &[(usize, Vec<u8>)],
) -> bool {
    st.unshared.remove(&a);
    st.pinned.remove(&a);
    let mut slot = slot;
    if let Ok(k) = fresh.binary_search_by_key(&i, |f| f.0) {
        if fresh[k].1.is_none() {
            // No tier takes it (the device full, an I/O error): back in place now, with the
            // narrow window above, rather than lose the bytes.
            let held = changed
                .binary_search_by_key(&i, |c| c.0)
                .ok()
                .map(|k| changed[k].1.as_slice());
            match held.map(|h| mm.uffd.copy(a, h)) {
                Some(Ok(Fill::Filled)) => {
                    t.changed += 1;
                    fresh[k].2 = true;
                    st.back_to_resident(a);
                    if slot != ZERO_SLOT {
                        shared.put_slot(slot);
                    }
                    t.kept.push(a);
                    return false;
                }
                Some(Ok(Fill::Again)) if may_defer => return true,
                other => tracing::warn!(
                    "page {a:#x} of pid {:?} changed through a pin while it was \
                     evicted, and neither a tier nor the page table takes its new contents \
                     ({other:?}): it keeps the older ones",
                    mm.pid()
                ),
            }
        }
        t.changed += 1;
        fresh[k].2 = true;
        if let Some(new) = fresh[k].1 {
            if slot != ZERO_SLOT {
                shared.put_slot(slot);
            }
            slot = new;
        }
    }
    st.pages.insert(a, Page::Evicted { slot });
    st.resident -= 1;
    shared.resident_sub(1);
    t.evicted += 1;
    if slot == ZERO_SLOT {
        t.zero += 1;
    }
    false
}

/// The moved pages of DROP `p` that [`settle_moved`] could not put back in place while an
/// event waited to be read: tried again every 50 us with the event gate let go in between, so
/// that the handler reads the event, for 5 s at most; then they keep their older contents
/// (said). Returns those an event changed meanwhile (for [`put_back_moved`]).
fn settle_deferred(
    shared: &Shared,
    mm: &Mm,
    p: &PendingDrop,
    t: &mut Tally,
    mut left: Vec<usize>,
    fresh: &mut [(usize, Option<u32>, bool)],
    changed: &[(usize, Vec<u8>)],
) -> Vec<usize> {
    let mut changed_since = Vec::new();
    for n in 1..=AGAIN_TRIES {
        std::thread::sleep(AGAIN_PAUSE);
        let _gate = mm.gate_read();
        let mut st = mm.state.lock();
        left.retain(|&i| {
            let (a, slot) = (p.pages[i], p.slots[i]);
            if st.pages.get(a) != Some(Page::Dropping { slot }) {
                changed_since.push(i);
                return false;
            }
            let args = (i, a, slot, n < AGAIN_TRIES);
            settle_moved(shared, mm, &mut st, t, args, fresh, changed)
        });
        if left.is_empty() {
            break;
        }
    }
    changed_since
}

/// A page the DROP could not move (`e`): back in place. Shared (with a forked child, or since
/// one): the next DROP unshares it. Refused again after that, it is pinned (for I/O): it
/// stays, as the kernel's reclaim leaves a pinned page, and is left out of the victims for a
/// while.
fn settle_refused(shared: &Shared, st: &mut MmState, t: &mut Tally, a: u64, slot: u32, e: u8) {
    st.back_to_resident(a);
    if slot != ZERO_SLOT {
        shared.put_slot(slot);
    }
    if i32::from(e) == libc::EBUSY {
        if st.unshared.contains(&a) {
            st.note_pinned(a);
            t.pinned += 1;
        } else {
            st.unshare.insert(a);
        }
    }
    t.kept.push(a);
}
