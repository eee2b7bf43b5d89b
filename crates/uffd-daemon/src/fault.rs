//! The fault path: one handler thread per address space reads its uffd and serves every fault
//! and event in the kernel's order.
//!
//! ```text
//! missing fault ─▶ page table ─▶ Evicted/Dropping(slot) ─▶ read slot (zswap, else the
//!                  backend) and, on a sequential pattern, the evicted pages after it (up to
//!                  2^page_cluster, a whole 64 KiB folio at most; readahead.rs sizes the
//!                  window per stream, capped by a hit ratio) ─▶ UFFDIO_COPY (wakes)
//!                              └▶ unknown ───────────────▶ UFFDIO_ZEROPAGE (read fault)
//!                                                          UFFDIO_COPY of zeros (write fault)
//! write-protect fault ─▶ page mid-eviction? leave the writer asleep; reclaim wakes it when the
//!                        page is either dropped (it then faults as missing and gets the stored
//!                        copy) or kept (protection lifted): a racing write is never lost
//! REMOVE / UNMAP ─▶ forget the pages (they read as zeros or are gone); scratch: ignore
//! REMAP ─▶ move the states; FORK ─▶ a child address space sharing the stored pages
//! ```
//!
//! Why one reader per uffd: events and faults must be applied in the order the kernel queued
//! them (a fault after a REMOVE must see the removal). A single reader gets that for free; the
//! handler never waits on the client or on reclaim, only on its own uffd.
//!
//! The price of one reader is a wakeup per fault, across CPUs when the faulting thread runs on
//! another one. After a fault the handler therefore reads its uffd without sleeping for a
//! short, adaptive window ([`Spin`], the guest haltpoll governor's rule) before it sleeps in
//! `poll`: a fault that follows within the window is read without any wakeup.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use mglru::Arrival;

use crate::daemon::{self, Shared};
use crate::mm::{Mm, Page, ZERO_SLOT};
use crate::readahead::{self, Readahead};
use crate::stats::Stats;
use crate::sys::{self, Fill, RawUffdMsg, Uffd, UffdEvent, PAGE_SIZE, PAGE_SIZE_U64};
use crate::tiers::{Tier, FOLIO_PAGES};

/// Adaptive polling of the uffd after a fault, with the rule of the guest haltpoll cpuidle
/// governor (`drivers/cpuidle/governors/haltpoll.c`, `adjust_poll_limit`): the window is
/// unchanged when the next message came while polling; it grows (doubling, from a quarter of
/// the maximum) when the handler slept but the message came within reach of the maximum; it
/// halves, and drops to zero below a quarter of the maximum, when the handler slept longer.
/// So a client that stops faulting costs one window, and one that never faults costs nothing:
/// the handler polls only after a fault, and not while the resident pages are over the limit.
///
/// "Within reach" is twice the maximum, not the maximum: the time a sleeping handler measures
/// includes its own wakeup, which is what polling saves (about 40 us across CPUs on the
/// 2-vCPU VM this was measured on, about the window itself).
///
/// At most half the machine's online CPUs poll at once, over all the handlers of the process,
/// so that polling never takes every CPU from the clients and from reclaim (on one CPU, none:
/// the client could not run while the handler polled); a handler that finds the budget taken
/// sleeps at once.
#[derive(Debug)]
struct Spin {
    /// `[fault] spin_us`; zero turns polling off.
    max: Duration,
    /// The current window.
    limit: Duration,
}

impl Spin {
    fn new(max: Duration) -> Self {
        Spin {
            max,
            limit: Duration::ZERO,
        }
    }

    /// Reads `mm`'s uffd without sleeping until a message comes or the window since `since`
    /// closes; returns how many messages were read (0: none came, or the budget of polling
    /// handlers was taken).
    fn poll(
        &self,
        mm: &Mm,
        msgs: &mut [RawUffdMsg],
        since: Instant,
        stats: &Stats,
    ) -> std::io::Result<usize> {
        if self.limit.is_zero() {
            return Ok(0);
        }
        let Some(_slot) = SpinSlot::take() else {
            return Ok(0);
        };
        let n = loop {
            match mm.uffd.read_msgs(msgs) {
                Ok(0) => {}
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if since.elapsed() >= self.limit {
                break 0;
            }
            // A few pause instructions between reads (a read of an empty uffd is about half a
            // microsecond): they leave the core to a hyperthread sibling.
            for _ in 0..16 {
                std::hint::spin_loop();
            }
        };
        Stats::add(&stats.spin_ns, since.elapsed().as_nanos() as u64);
        if n > 0 {
            Stats::add(&stats.spin_hits, 1);
        }
        Ok(n)
    }

    /// After a sleep: the next message came `idle` after the end of the last fault.
    fn adjust(&mut self, idle: Duration) {
        let grow_start = self.max / 4;
        if idle > self.limit && idle <= 2 * self.max {
            self.limit = (self.limit * 2).max(grow_start).min(self.max);
        } else if idle > 2 * self.max {
            self.limit /= 2;
            if self.limit < grow_start {
                self.limit = Duration::ZERO;
            }
        }
    }
}

/// Handlers polling now (a budget, not a lock: a stale count only lets one handler more or
/// less poll for a moment).
static SPINNING: AtomicUsize = AtomicUsize::new(0);

/// One handler's share of the polling budget, given back on drop.
#[derive(Debug)]
struct SpinSlot;

impl SpinSlot {
    fn take() -> Option<SpinSlot> {
        static MAX: OnceLock<usize> = OnceLock::new();
        let max = *MAX.get_or_init(|| sys::nr_cpus() / 2);
        if SPINNING.fetch_add(1, Ordering::Relaxed) < max {
            Some(SpinSlot)
        } else {
            SPINNING.fetch_sub(1, Ordering::Relaxed);
            None
        }
    }
}

impl Drop for SpinSlot {
    fn drop(&mut self) {
        SPINNING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Longest time a fault waits for reclaim when the limit is reached (a safety valve: reclaim
/// normally makes room within a batch).
const THROTTLE_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a fill that fails with an unexpected error is retried.
const FILL_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether a fault's thread id names a thread of the daemon itself. A daemon thread's fault
/// carries the daemon's number for it; a thread of a process in a pid namespace below the
/// daemon's is named by that namespace's number, which a daemon thread may have too: such a
/// number is the process's if the process has a thread so numbered.
fn is_daemon_thread(mm: &Mm, tid: u32) -> bool {
    std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
        && !(mm.foreign_pidns.load(Ordering::Acquire)
            && crate::bind::thread_of_fault(mm, tid).is_some())
}

/// A fault that could not be served yet (`EAGAIN`: an event is pending).
#[derive(Debug, Clone, Copy)]
struct Pending {
    address: u64,
    flags: u64,
    ptid: u32,
    read_at: Instant,
    /// Counted in the tree's stall (`limit.rs`): a restore, or held at the limit.
    stalled: bool,
}

impl Pending {
    /// This fault waits on the limit: its thread's wait is stall from when it was read.
    fn stall(&mut self, shared: &Shared) {
        if !self.stalled {
            self.stalled = true;
            shared.stall.begin_at(self.read_at);
        }
    }

    /// Answered or given up: its stall, if any, ends.
    fn done(&self, shared: &Shared) {
        if self.stalled {
            shared.stall.end(self.read_at);
        }
    }
}

/// Runs the handler of `mm` until it is told to stop.
pub fn handler_thread(shared: Arc<Shared>, mm: Arc<Mm>) {
    // `[fault] realtime` (opt-in): a handler above every normal thread. A client woken by a
    // fill then runs on another CPU rather than queued behind the handler on the handler's
    // own, and no normal thread delays the handler between a fault and its fill; but during a
    // fault storm the handler and its polling hold a CPU that normal threads cannot take
    // (measured both ways in docs/ARCHITECTURE.md, the fault path).
    if shared.policy.fault_realtime {
        match sys::set_sched_fifo(1) {
            Ok(()) => Stats::add(&shared.stats.realtime_handlers, 1),
            Err(e) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    eprintln!(
                        "uffd-daemon: [fault] realtime: cannot make the fault handler \
                         SCHED_FIFO ({e}); it runs at the normal policy"
                    );
                });
            }
        }
    }
    serve(&shared, &mm);
    // Wakeups of this thread over its life (it sleeps only in poll): the cost side of the
    // one-reader design, reported per fault by the benchmark.
    Stats::add(
        &shared.stats.handler_wakeups,
        sys::thread_voluntary_switches(),
    );
}

fn serve(shared: &Arc<Shared>, mm: &Arc<Mm>) {
    let mut deferred = Deferred(Vec::new(), shared);
    serve_loop(shared, mm, &mut deferred.0);
}

/// Faults waiting to be served again; those left when the handler ends end their stall (their
/// address space is gone).
struct Deferred<'a>(Vec<Pending>, &'a Shared);

impl Drop for Deferred<'_> {
    fn drop(&mut self) {
        for p in &self.0 {
            p.done(self.1);
        }
    }
}

fn serve_loop(shared: &Arc<Shared>, mm: &Arc<Mm>, deferred: &mut Vec<Pending>) {
    let mut msgs = [RawUffdMsg::default(); 64];
    let mut page = vec![0u8; FOLIO_PAGES * PAGE_SIZE];
    let zeros = vec![0u8; FOLIO_PAGES * PAGE_SIZE];
    let mut served: u64 = 0;
    // Readahead of evicted pages, and fault-around of never-written ones (which judges no
    // outcomes: its window follows position alone).
    let mut ra = [Readahead::default(), Readahead::default()];
    let mut spin = Spin::new(shared.policy.fault_spin);
    // When the handling of the last batch ended, if it held a fault.
    let mut after_fault: Option<Instant> = None;
    let mut handling = Handling(false);
    loop {
        let mut n = 0;
        // Poll without sleeping after a fault, unless faults wait for reclaim or for an event,
        // or the resident pages are over the limit: reclaim (and the scanner registering
        // memory the program filled) then need the CPU more than the next fault does.
        if let Some(since) =
            after_fault.filter(|_| deferred.is_empty() && shared.resident() < shared.limit.pages())
        {
            handling.set(mm, true);
            n = match spin.poll(mm, &mut msgs, since, &shared.stats) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("uffd-daemon: reading the uffd of mm {} failed: {e}", mm.id);
                    return;
                }
            };
        }
        if n == 0 {
            handling.set(mm, false);
            let timeout = if deferred.is_empty() { -1 } else { 1 };
            let ready =
                match sys::poll_read(&[mm.uffd.raw(), mm.stop.raw(), mm.retry.raw()], timeout) {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!("uffd-daemon: poll on the uffd of mm {} failed: {e}", mm.id);
                        return;
                    }
                };
            if ready[1] {
                return;
            }
            if ready[2] {
                mm.retry.drain();
            }
            if ready[0] {
                handling.set(mm, true);
                n = match mm.uffd.read_msgs(&mut msgs) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
                    Err(e) => {
                        eprintln!("uffd-daemon: reading the uffd of mm {} failed: {e}", mm.id);
                        return;
                    }
                };
            }
            if let Some(since) = after_fault.filter(|_| n > 0) {
                spin.adjust(since.elapsed());
            }
        }
        after_fault = None;
        let now = Instant::now();
        let mut faulted = false;
        for m in &msgs[..n] {
            match m.decode() {
                UffdEvent::PageFault {
                    address,
                    flags,
                    ptid,
                } => {
                    faulted = true;
                    let mut p = Pending {
                        address,
                        flags,
                        ptid,
                        read_at: now,
                        stalled: false,
                    };
                    if serve_fault(shared, mm, &mut p, &mut page, &zeros, &mut served, &mut ra) {
                        p.done(shared);
                    } else {
                        deferred.push(p);
                    }
                }
                event => {
                    // A fault waiting to be retried in a range that is gone or emptied is not
                    // filled any more: filled later, it could put a page into a new mapping at
                    // the same addresses that the program never touched. Its thread is woken
                    // instead and retries its access, faulting again if it must.
                    if let UffdEvent::Unmap { start, end } | UffdEvent::Remove { start, end } =
                        event
                    {
                        deferred.retain(|p| {
                            let stale = p.address >= start && p.address < end;
                            if stale {
                                let _ = mm
                                    .uffd
                                    .wake(p.address & !(PAGE_SIZE_U64 - 1), PAGE_SIZE_U64);
                                p.done(shared);
                            }
                            !stale
                        });
                    }
                    handle_event(shared, mm, event)
                }
            }
        }
        handling.set(mm, false);
        // Retry what an event blocked, now that the event has been read.
        if !deferred.is_empty() {
            let again = std::mem::take(deferred);
            for mut p in again {
                if serve_fault(shared, mm, &mut p, &mut page, &zeros, &mut served, &mut ra) {
                    p.done(shared);
                } else {
                    deferred.push(p);
                }
            }
        }
        if faulted {
            if let Some(p) = &shared.idle_poll {
                p.fault();
            }
            if !spin.max.is_zero() {
                after_fault = Some(Instant::now());
            }
        }
    }
}

/// The handler's side of [`Mm::handling`]: odd from before a read of messages until they are
/// applied.
struct Handling(bool);

impl Handling {
    fn set(&mut self, mm: &Mm, busy: bool) {
        if self.0 != busy {
            self.0 = busy;
            mm.handling.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Adds the mapping around `addr`, a missing fault outside the ranges the table knows, to
/// them: the agent's `mmap` wrapper registers new mappings itself, before the scan sees them,
/// and what relies on the ranges (a fork child's wipe-on-fork and dont-fork pages, a hold's
/// restore, waking writers) must cover every page the table holds. A fault came through this
/// uffd, so the whole mapping is registered with it (registration is per mapping).
fn learn_range(shared: &Shared, mm: &Mm, addr: u64) {
    let Some(pid) = mm.pid() else { return };
    let vma = {
        let mut maps = mm.maps.lock();
        if maps.as_ref().is_none_or(|(p, _)| *p != pid) {
            *maps = std::fs::File::open(format!("/proc/{pid}/maps"))
                .ok()
                .map(|f| (pid, f));
        }
        match maps.as_ref().map(|(_, f)| sys::vma_covering(f, addr)) {
            Some(Ok(v)) => v,
            // (Before Linux 6.11: the whole maps text.)
            Some(Err(e)) if e.raw_os_error() == Some(libc::ENOTTY) => {
                crate::maps::read_maps(pid).ok().and_then(|v| {
                    v.iter()
                        .find(|v| v.start <= addr && addr < v.end)
                        .map(|v| (v.start, v.end))
                })
            }
            _ => None,
        }
    };
    let Some((s, e)) = vma else { return };
    let mut st = mm.state.lock();
    // Never the agent's own region.
    for (ps, pe) in [(s, e.min(mm.region.0)), (s.max(mm.region.1), e)] {
        if ps >= pe {
            continue;
        }
        for (gs, ge) in st.uncovered(ps, pe) {
            st.add_range(gs, ge);
            Stats::add(&shared.stats.ranges_learned, 1);
        }
    }
}

/// Serves one fault. Returns false when it must be retried (`EAGAIN`).
fn serve_fault(
    shared: &Shared,
    mm: &Mm,
    p: &mut Pending,
    page: &mut [u8],
    zeros: &[u8],
    served: &mut u64,
    ra: &mut [Readahead; 2],
) -> bool {
    let [ra, zra] = ra;
    let stats = &shared.stats;
    let addr = p.address;
    if mm.in_agent_region(addr) {
        // The probe page: a forked child naming itself (`bind.rs`); it waits in the fault
        // until it is bound (or let go unbound).
        if addr == mm.probe && !mm.agentless.load(Ordering::Acquire) {
            match crate::bind::probe_fault(shared, mm, p.ptid) {
                crate::bind::ProbeFault::NotYet => return false,
                crate::bind::ProbeFault::Served => return true,
                crate::bind::ProbeFault::Zero => {}
            }
        }
        // The first scratch page: the agent thread naming itself (agent.c, agent_thread).
        if addr == mm.agent_name_page()
            && mm
                .agent_tid
                .swap(p.ptid, std::sync::atomic::Ordering::Relaxed)
                != p.ptid
        {
            Stats::add(&stats.agent_threads, 1);
        }
        return match mm.uffd.zeropage(addr) {
            Ok(Fill::Again) => false,
            // (Present already, and UFFDIO_ZEROPAGE wakes nobody then.)
            Ok(Fill::Exists) => {
                let _ = mm.uffd.wake(addr, PAGE_SIZE_U64);
                true
            }
            _ => true,
        };
    }
    if p.flags & sys::UFFD_PAGEFAULT_FLAG_WP != 0 {
        Stats::add(&stats.wp_faults, 1);
        // Decide and lift under the state lock: reclaim marks a page Evicting under it before
        // protecting it, so a stale write-protect fault can never unprotect a page that a new
        // eviction has just protected.
        let mut st = mm.state.lock();
        match st.pages.get(addr) {
            Some(Page::Evicting { .. }) | Some(Page::Dropping { .. }) => {
                // The eviction in flight wakes this writer when it is done (see module docs):
                // after the drop it refaults and gets the stored copy; if kept, it is
                // unprotected.
                return true;
            }
            Some(Page::Resident { readahead, .. }) => {
                // Protection armed by the access source: this write is an access (and a use
                // of a page read ahead).
                let page = Page::Resident {
                    referenced: true,
                    readahead: false,
                };
                st.pages.insert(addr, page);
                Stats::add(&stats.wp_access_faults, 1);
                if readahead {
                    Stats::add(&stats.readahead_hit_pages, 1);
                    ra.record(1, 0);
                }
            }
            // A page that was `Dropping` and moved here (mremap): while a DROP is in flight the
            // agent may move whatever is at the old address, and mremap can bring this page
            // back there; a write now could be moved away with it after its copy was stored.
            // The writer waits until no DROP is in flight (the monitor wakes it then). Not the
            // agent's thread: it write-faults only when it unshares pages, after every move of
            // its DROP (agent.c, do_drop), so nothing of that DROP moves any more; and it
            // cannot wait for a DROP it is carrying out itself.
            Some(Page::Inherited { .. })
                if drop_in_flight(mm)
                    && p.ptid != mm.agent_tid.load(std::sync::atomic::Ordering::Relaxed) =>
            {
                mm.wp_waiters
                    .store(true, std::sync::atomic::Ordering::Release);
                return true;
            }
            _ => {}
        }
        let r = mm.uffd.writeprotect(addr, PAGE_SIZE_U64, false);
        drop(st);
        return !matches!(r, Ok(Fill::Again));
    }

    let agent = p.ptid == mm.agent_tid.load(std::sync::atomic::Ordering::Relaxed);
    if agent {
        Stats::add(&stats.agent_faults, 1);
    }
    let mut st = mm.state.lock();
    if !st.in_ranges(addr) {
        drop(st);
        learn_range(shared, mm, addr);
        st = mm.state.lock();
    }
    let prior = st.pages.get(addr);
    // A page of a DROP in flight, moved out already: what it held when it moved need not be
    // what reclaim stored, since the kernel may have written it through a pin after reclaim
    // read it (an O_DIRECT read in flight, an io_uring buffer unregistered since), and only
    // the DROP's settlement, which reads the moved page back, knows. The fault waits for it,
    // as a write to such a page does (`settle_drop` wakes the batch's runs): the page is then
    // evicted (served from its slot, stored anew if it changed) or back in place (refused).
    if matches!(prior, Some(Page::Dropping { .. })) && !agent && !is_daemon_thread(mm, p.ptid) {
        Stats::add(&stats.dropping_faults_held, 1);
        return true;
    }
    // Throttle like the kernel's direct reclaim: at the limit, a fault that would add a
    // resident page waits (its thread is blocked in the kernel anyway) while reclaim makes
    // room; the handler keeps reading events meanwhile. Faults of the daemon's own threads
    // (reclaim reading a page the program just removed) are never held, since reclaim waits
    // for them, nor those of the agent's thread, since reclaim may be waiting for its answer
    // to a DROP (it touches no managed memory, so this is a second line of defence); and
    // when reclaim cannot make progress (every resident page is pinned or
    // shared after fork) faults go through rather than hang the program.
    if !prior.is_some_and(|p| p.is_resident())
        && shared.resident() >= shared.limit.pages()
        && !shared.reclaim_stalled()
        && p.read_at.elapsed() < THROTTLE_MAX
        && !agent
        && !is_daemon_thread(mm, p.ptid)
        && !(shared.injecting_tid.load(Ordering::Acquire) == p.ptid as i32
            && mm.pid() == Some(shared.injecting_pid.load(Ordering::Acquire)))
    {
        drop(st);
        mm.throttled
            .store(true, std::sync::atomic::Ordering::Release);
        Stats::add(&stats.throttled_faults, 1);
        p.stall(shared);
        shared.kick_reclaim();
        return false;
    }
    // What this fault shows of pages read ahead (`readahead.rs`): it went past the pages of a
    // run of the stream it continues (a sequential reader read them on its way here: hits),
    // or, starting a stream, dropped one that left its last run behind (those still unused:
    // misses); and a message for a page already filled is a use of it (its thread touched it
    // while it was being read ahead). Hits clear the pages' readahead marks; both feed the
    // hit ratio that caps the window.
    let max = 1usize << shared.policy.page_cluster;
    let restore = matches!(
        prior,
        Some(Page::Evicted { slot } | Page::Dropping { slot } | Page::Inherited { slot })
            if slot != ZERO_SLOT
    );
    if restore {
        p.stall(shared);
    }
    let o = ra.observe(addr, max, restore);
    let mut hits = readahead::pages(&o.passed)
        .filter(|&a| st.readahead_used(a))
        .count() as u64;
    let misses = readahead::pages(&o.left)
        .filter(|&a| {
            matches!(
                st.pages.get(a),
                Some(Page::Resident {
                    readahead: true,
                    ..
                })
            )
        })
        .count() as u64;
    if let Some(Page::Resident {
        readahead: true, ..
    }) = prior
    {
        hits += u64::from(st.readahead_used(addr));
    }
    if hits > 0 {
        Stats::add(&stats.readahead_hit_pages, hits);
    }
    ra.record(hits, misses);
    let write = p.flags & sys::UFFD_PAGEFAULT_FLAG_WRITE != 0;
    // Pages filled from the fault address on (more than one with readahead) and their old
    // states.
    let mut run: Vec<(u64, Page)> = Vec::new();
    // Never-written pages filled with zeros from the fault address on (fault-around).
    let mut zero_run = 1usize;
    let mut tier = None;
    let (fill, filled) = match prior {
        Some(Page::Evicted { slot })
        | Some(Page::Dropping { slot })
        | Some(Page::Inherited { slot })
            if slot != ZERO_SLOT =>
        {
            // Readahead only of pages known missing, and only with room under the limit.
            let mut window = if matches!(prior, Some(Page::Evicted { .. })) {
                ra.window(addr, max)
            } else {
                1
            };
            if shared.resident() + window > shared.limit.pages() {
                window = 1;
            }
            run.push((addr, Page::Evicted { slot }));
            for i in 1..window as u64 {
                let a = addr + i * PAGE_SIZE_U64;
                match st.pages.get(a) {
                    Some(q @ Page::Evicted { .. }) => run.push((a, q)),
                    _ => break,
                }
            }
            // (Under the state lock. Dropping it for the read and the copy of an `Evicted`
            // page is possible, since only this thread changes an evicted page, but measured
            // no better: reclaim then takes the lock between each fault's copy and its
            // bookkeeping, and the handler waits for a choice of victims.)
            let io = |run: &mut Vec<(u64, Page)>, page: &mut [u8]| {
                // Stretches of consecutive slots are read together (`Tiers::read_run`: one
                // backend read for a folio written as one); zero pages are filled here. The
                // first page's failure is the error; a later one ends the run before it.
                let mut n = 0;
                let mut t = None;
                while n < run.len() {
                    let Page::Evicted { slot: s } = run[n].1 else {
                        break;
                    };
                    if s == ZERO_SLOT {
                        page[n * PAGE_SIZE..(n + 1) * PAGE_SIZE].fill(0);
                        n += 1;
                        continue;
                    }
                    let mut m = n + 1;
                    while m < run.len()
                        && run[m].1
                            == (Page::Evicted {
                                slot: s.wrapping_add((m - n) as u32),
                            })
                    {
                        m += 1;
                    }
                    match shared.tiers.read_run(s, m - n, &mut page[n * PAGE_SIZE..]) {
                        Ok((k, tier)) => {
                            t.get_or_insert(tier);
                            n += k;
                            if n < m {
                                break;
                            }
                        }
                        Err(e) if n == 0 => return Err(e),
                        Err(_) => break,
                    }
                }
                let t = t.unwrap_or(Tier::Backend);
                run.truncate(n);
                let r = match mm.uffd.copy_run(addr, &page[..n * PAGE_SIZE]) {
                    // A run can cross into another VMA (ENOENT: one UFFDIO_COPY stays within
                    // one VMA) or meet a present page: fall back to the faulting page alone.
                    (_, 0) if n > 1 => {
                        run.truncate(1);
                        mm.uffd.copy_run(addr, &page[..PAGE_SIZE])
                    }
                    r => r,
                };
                Ok::<_, std::io::Error>((r, t))
            };
            let done = io(&mut run, page);
            match done {
                Ok((r, t)) => {
                    tier = Some(t);
                    r
                }
                Err(e) => {
                    // The stored copy cannot be read: never hand the program wrong bytes.
                    eprintln!(
                        "uffd-daemon: cannot read back page {addr:#x} of pid {:?} from slot {slot}: {e}; \
                         stopping the process",
                        mm.pid()
                    );
                    mm.kill();
                    return true;
                }
            }
        }
        None => {
            // Fault-around of never-written memory on a sequential pattern (the kernel's
            // anonymous mTHP does the same with a 64 KiB folio on the first touch): the
            // window grows like readahead's, and a run stops at the first page the table
            // knows. UFFDIO_COPY never overwrites a present page, and a run that leaves the
            // VMA fails as a whole and falls back to the faulting page.
            let mut window = zra.window(addr, max);
            if shared.resident() + window > shared.limit.pages() {
                window = 1;
            }
            let mut n = 1;
            while n < window && !st.pages.contains(addr + n as u64 * PAGE_SIZE_U64) {
                n += 1;
            }
            if n > 1 {
                let r = mm.uffd.copy_run(addr, &zeros[..n * PAGE_SIZE]);
                match r {
                    (_, 0) => {
                        let r = mm.uffd.copy_run(addr, &zeros[..PAGE_SIZE]);
                        (r.0, r.1.max(1))
                    }
                    // k pages were filled (maybe not all n: a run stops at a present page or
                    // when an event is queued): they are resident whatever the status says.
                    (_, k) => {
                        zero_run = k;
                        (Ok(Fill::Filled), k)
                    }
                }
            } else if write {
                (mm.uffd.copy(addr, &zeros[..PAGE_SIZE]), 1)
            } else {
                (mm.uffd.zeropage(addr), 1)
            }
        }
        Some(Page::Evicted { .. }) | Some(Page::Dropping { .. }) | Some(Page::Inherited { .. }) => {
            if write {
                (mm.uffd.copy(addr, &zeros[..PAGE_SIZE]), 1)
            } else {
                (mm.uffd.zeropage(addr), 1)
            }
        }
        Some(Page::Resident { .. }) | Some(Page::Evicting { .. }) => {
            // Tracked as present but missing: the kernel dropped it behind our back (for
            // example a MADV_FREE page it reclaimed after the REMOVE we already applied).
            // Its contents are zeros by the kernel's own rules.
            if write {
                (mm.uffd.copy(addr, &zeros[..PAGE_SIZE]), 1)
            } else {
                (mm.uffd.zeropage(addr), 1)
            }
        }
    };
    // A readahead run that stopped part way still filled the faulting page.
    let fill = if run.len() > 1 && filled >= 1 {
        run.truncate(filled);
        Ok(Fill::Filled)
    } else {
        fill
    };
    match fill {
        Ok(Fill::Again) => return false,
        Ok(Fill::Gone) => {
            // The mapping went away (the UNMAP event cleans up); let the thread retry, so that
            // it sees the new layout instead of waiting for a fill that cannot come.
            let _ = mm.uffd.wake(addr, PAGE_SIZE_U64);
            return true;
        }
        // The page is present: this message is stale (two threads faulted on the page, or a
        // waiter was woken and faulted again). Change nothing: in particular a `Dropping` page
        // is about to be moved out, and its stored copy must stay.
        Ok(Fill::Exists) => {
            // Woken all the same: a page can arrive at the address by another way than our
            // fill (mremap moves one there), and then nobody else wakes a waiter.
            let _ = mm.uffd.wake(addr, PAGE_SIZE_U64);
            return true;
        }
        Ok(Fill::Filled) => {}
        Err(e) => {
            // Transient (ENOMEM under pressure): retry. A fill that keeps failing would leave
            // the thread blocked for ever: stop the process with a message instead.
            if p.read_at.elapsed() < FILL_RETRY_MAX {
                return false;
            }
            eprintln!(
                "uffd-daemon: filling page {addr:#x} of pid {:?} failed for {:?}: {e}; stopping the process",
                mm.pid(),
                FILL_RETRY_MAX
            );
            mm.kill();
            return true;
        }
    }
    if let Some(old) = prior {
        // (Unchanged: see the unlocked read above.)
        if let Some(now) = st.pages.remove(addr) {
            debug_assert!(
                now == old || now.is_resident(),
                "{addr:#x}: {old:?} became {now:?}"
            );
            st.release(shared, addr, now);
        }
    }
    st.make_resident(shared, addr, Arrival::Fault, true);
    for &(a, old) in run.iter().skip(1) {
        if let Some(now) = st.pages.remove(a) {
            debug_assert_eq!(now, old, "{a:#x} changed while it was restored");
            st.release(shared, a, now);
        }
        st.add_readahead(shared, a);
    }
    for i in 1..zero_run as u64 {
        st.make_resident(shared, addr + i * PAGE_SIZE_U64, Arrival::Cold, false);
    }
    drop(st);

    let ns = p.read_at.elapsed().as_nanos() as u64;
    Stats::add(&stats.faults, 1);
    if !run.is_empty() {
        Stats::add(&stats.swapins, 1);
        Stats::add(&stats.bytes_read, PAGE_SIZE_U64 * run.len() as u64);
        Stats::add(&stats.readahead_pages, run.len() as u64 - 1);
        if run.len() == FOLIO_PAGES && addr % (FOLIO_PAGES as u64 * PAGE_SIZE_U64) == 0 {
            Stats::add(&stats.swpin_folios, 1);
        }
        ra.restored(addr, run.len());
        match tier {
            Some(Tier::Zswap) => {
                Stats::add(&stats.fault_zswap, 1);
                Stats::add(&stats.fault_zswap_ns, ns);
                shared.lat_zswap.record(ns);
            }
            _ => {
                Stats::add(&stats.fault_backend, 1);
                Stats::add(&stats.fault_backend_ns, ns);
                shared.lat_backend.record(ns);
            }
        }
    } else {
        Stats::add(&stats.zero_fills, 1);
        Stats::add(&stats.fault_around_pages, zero_run as u64 - 1);
        zra.restored(addr, zero_run);
        shared.lat_zero.record(ns);
    }
    Stats::add(&stats.fault_service_ns, ns);
    *served += 1;
    // Sample where the faulting thread ran, against where we run: a read of /proc (tens of
    // microseconds), so 1 fault in 256.
    if *served % 256 == 0 {
        if let (Some(pid), Some(tid)) = (mm.pid(), crate::bind::thread_of_fault(mm, p.ptid)) {
            if let Some(cpu) = sys::thread_last_cpu(pid, tid as u32) {
                Stats::add(&stats.faults_cpu_known, 1);
                let here = sys::current_cpu();
                if cpu == here {
                    Stats::add(&stats.faults_local_cpu, 1);
                    // `[fault] spread`: the fill woke the client onto this CPU, where each
                    // of its faults now waits for the handler to finish the previous one
                    // (placement is sticky: a woken thread goes back to the CPU it last ran
                    // on). Step aside to another CPU, so that the next wakeup finds the
                    // client's CPU idle. Only after a restore of one page (random access):
                    // a sequential stream's restores are runs, so it rarely gets here (0 to
                    // 4 moves in a run, measured), and it suits a handler and a client that
                    // take turns on one CPU while reclaim has the other.
                    if shared.policy.fault_spread && run.len() == 1 && sys::move_off_cpu(here) {
                        Stats::add(&stats.handler_moves, 1);
                    }
                }
            }
        }
    }
    shared.maybe_kick_reclaim();
    true
}

/// Whether reclaim may have a DROP to this address space's agent in flight: it holds the agent
/// lock for a batch (a try, never a wait: the handler must not wait for reclaim), or a DROP is
/// outstanding.
fn drop_in_flight(mm: &Mm) -> bool {
    match mm.agent.try_lock() {
        None => true,
        Some(g) => g.as_ref().is_some_and(|a| a.pending.is_some()),
    }
}

fn handle_event(shared: &Arc<Shared>, mm: &Arc<Mm>, event: UffdEvent) {
    let stats = &shared.stats;
    match event {
        UffdEvent::Remove { start, end } => {
            if mm.in_agent_region(start) {
                // The agent (or, without one, the daemon) freeing its scratch after a drop.
                return;
            }
            Stats::add(&stats.remove_events, 1);
            mm.state.lock().forget_range(shared, start, end);
        }
        UffdEvent::Unmap { start, end } => {
            Stats::add(&stats.unmap_events, 1);
            let mut st = mm.state.lock();
            st.forget_range(shared, start, end);
            st.remove_range(start, end);
            st.unmapped(start, end);
        }
        UffdEvent::Remap { from, to, len } => {
            Stats::add(&stats.remap_events, 1);
            let mut st = mm.state.lock();
            // Pages moved mid-eviction keep their write protection at the new address; lift it
            // (under the lock, see the WP fault path) where no DROP can reach them.
            for (start, n) in crate::mm::runs_of(&st.remap(shared, from, to, len)) {
                let _ = mm.uffd.writeprotect(start, n as u64 * PAGE_SIZE_U64, false);
            }
        }
        UffdEvent::Fork { ufd } => {
            Stats::add(&stats.fork_events, 1);
            // SAFETY: the kernel installed `ufd` in our table for this event; nothing else owns it.
            let child_uffd = unsafe { Uffd::from_raw(ufd) };
            daemon::adopt_forked_child(shared, mm, child_uffd);
        }
        UffdEvent::PageFault { .. } => unreachable!("faults are served by serve_fault"),
        UffdEvent::Unknown(kind) => {
            eprintln!(
                "uffd-daemon: ignoring unknown uffd message {kind:#x} on mm {}",
                mm.id
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn spin_window_follows_the_haltpoll_rule() {
        let mut s = Spin::new(50 * US);
        assert_eq!(s.limit, Duration::ZERO, "no polling before the first fault");
        // A sleep that a longer window would have covered grows it: from a quarter of the
        // maximum, doubling, never past the maximum.
        s.adjust(30 * US);
        assert_eq!(s.limit, 12_500 * Duration::from_nanos(1));
        s.adjust(30 * US);
        assert_eq!(s.limit, 25 * US);
        s.adjust(90 * US);
        assert_eq!(s.limit, 50 * US);
        s.adjust(90 * US);
        assert_eq!(s.limit, 50 * US);
        // A message within the window changes nothing.
        s.adjust(10 * US);
        assert_eq!(s.limit, 50 * US);
        // Long sleeps (the client stopped faulting) halve it, then turn polling off.
        s.adjust(1000 * US);
        assert_eq!(s.limit, 25 * US);
        s.adjust(1000 * US);
        assert_eq!(s.limit, 12_500 * Duration::from_nanos(1));
        s.adjust(1000 * US);
        assert_eq!(s.limit, Duration::ZERO);
        // Off stays off.
        let mut off = Spin::new(Duration::ZERO);
        off.adjust(Duration::ZERO);
        off.adjust(1000 * US);
        assert_eq!(off.limit, Duration::ZERO);
    }

    #[test]
    fn at_most_half_the_cpus_poll() {
        let max = sys::nr_cpus() / 2;
        let slots: Vec<_> = std::iter::from_fn(SpinSlot::take).take(max + 1).collect();
        assert_eq!(slots.len(), max);
        drop(slots);
        assert_eq!(SpinSlot::take().is_some(), max > 0, "slots are given back");
    }
}
