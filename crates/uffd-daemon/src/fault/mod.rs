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
//! a batch of faults on pages on the disk ─▶ read at once first (prefetch.rs), then served
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

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::mm::Mm;
use crate::readahead::Readahead;
use crate::shared::Shared;
use crate::stats::Stats;
use crate::sys::{self, RawUffdMsg, UffdEvent, PAGE_SIZE, PAGE_SIZE_U64};
use crate::tiers::FOLIO_PAGES;

mod events;
mod prefetch;
mod remove_scan;
mod serve;
mod shmem;
mod tuning;

use events::handle_event;
pub(crate) use events::start_mm;
use remove_scan::RemoveScan;
use serve::serve_fault;
use tuning::Spin;

/// Longest time a fault waits for reclaim when the limit is reached (a safety valve: reclaim
/// normally makes room within a batch).
pub(super) const THROTTLE_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a fill that fails with an unexpected error is retried.
pub(super) const FILL_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether a fault's thread id names a thread of the daemon itself. A daemon thread's fault
/// carries the daemon's number for it; a thread of a process in a pid namespace below the
/// daemon's is named by that namespace's number, which a daemon thread may have too: such a
/// number is the process's if the process has a thread so numbered.
pub(super) fn is_daemon_thread(mm: &Mm, tid: u32) -> bool {
    crate::sys::is_own_thread(tid)
        && !(mm.foreign_pidns.load(Ordering::Acquire)
            && crate::bind::thread_of_fault(mm, tid).is_some())
}

/// A fault that could not be served yet (`EAGAIN`: an event is pending).
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
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
pub(crate) fn handler_thread(shared: Arc<Shared>, mm: Arc<Mm>) {
    // `[fault] realtime` (opt-in): a handler above every normal thread. A client woken by a
    // fill then runs on another CPU rather than queued behind the handler on the handler's
    // own, and no normal thread delays the handler between a fault and its fill; but during a
    // fault storm the handler and its polling hold a CPU that normal threads cannot take
    // (measured both ways in docs/experiments/2026-11-27-fault-path-tuning.md).
    if shared.policy.fault_realtime {
        match sys::set_sched_fifo(1) {
            Ok(()) => Stats::add(&shared.stats.realtime_handlers, 1),
            Err(e) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    tracing::warn!(
                        "[fault] realtime: cannot make the fault handler \
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
    let mut h = Handler::new(shared);
    loop {
        let Some((n, gate)) = h.read(shared, mm, deferred) else {
            return;
        };
        let faulted = h.apply(shared, mm, n, gate, deferred);
        h.handling.set(mm, false);
        prefetch::forget();
        // Retry what an event blocked, now that the event has been read.
        if !deferred.is_empty() {
            let again = std::mem::take(deferred);
            prefetch::read_ahead_of_faults(shared, mm, again.iter().map(|p| p.address));
            for p in again {
                h.serve(shared, mm, p, deferred);
            }
            prefetch::forget();
        }
        if faulted {
            if let Some(p) = &shared.idle_poll {
                p.fault();
            }
            if !h.spin.max.is_zero() {
                h.after_fault = Some(Instant::now());
            }
        }
    }
}

/// [`Mm::event_gate`] held by the handler.
type Gate<'m> = parking_lot::RwLockWriteGuard<'m, ()>;

/// Takes the event gate for the handler, counting the time reclaim kept it.
fn take_gate<'m>(mm: &'m Mm, stats: &crate::stats::Stats) -> Gate<'m> {
    if let Some(g) = mm.event_gate.try_write() {
        return g;
    }
    let t = Instant::now();
    let g = mm.event_gate.write();
    Stats::add(&stats.handler_gate_wait_ns, t.elapsed().as_nanos() as u64);
    g
}

/// Lets the handler's gate go, to a waiting reader first: otherwise the handler, reading again
/// at once, can take it back before a woken reader runs. (Measured: no change in throughput
/// either way; docs/experiments/2026-12-07-gate-stall-and-profile.md.)
fn release(gate: Option<Gate<'_>>) {
    if let Some(g) = gate {
        Gate::unlock_fair(g);
    }
}

/// Whether `event` takes or moves the page at `page`: a REMOVE or UNMAP of a range holding it,
/// a REMAP from or to one.
fn event_covers(event: &UffdEvent, page: u64) -> bool {
    match *event {
        UffdEvent::Remove { start, end } | UffdEvent::Unmap { start, end } => {
            start <= page && page < end
        }
        UffdEvent::Remap { from, to, len } => {
            (from <= page && page < from.saturating_add(len))
                || (to <= page && page < to.saturating_add(len))
        }
        _ => false,
    }
}

/// What serving a fault works with, kept by the handler thread from one fault to the next.
pub(super) struct Work {
    /// A folio's worth of room for the pages a restore reads.
    page: Vec<u8>,
    /// A folio's worth of zeros (fault-around, zero fills).
    zeros: Vec<u8>,
    /// Faults served (every 256th samples where its thread ran).
    served: u64,
    /// Readahead of evicted pages, and fault-around of never-written ones (which judges no
    /// outcomes: its window follows position alone).
    ra: [Readahead; 2],
}

/// A handler thread's working state between reads.
struct Handler {
    msgs: [RawUffdMsg; 64],
    work: Work,
    spin: Spin,
    /// When the handling of the last batch ended, if it held a fault.
    after_fault: Option<Instant>,
    handling: Handling,
    /// The callers of madvise found before the last read (`remove_scan.rs`).
    scan: RemoveScan,
}

impl Handler {
    fn new(shared: &Shared) -> Self {
        Handler {
            msgs: std::array::from_fn(|_| RawUffdMsg::default()),
            work: Work {
                page: vec![0u8; FOLIO_PAGES * PAGE_SIZE],
                zeros: vec![0u8; FOLIO_PAGES * PAGE_SIZE],
                served: 0,
                ra: [Readahead::default(), Readahead::default()],
            },
            spin: Spin::new(shared.policy.fault_spin),
            after_fault: None,
            handling: Handling(false),
            scan: RemoveScan::default(),
        }
    }

    /// Reads the next messages: polling without sleeping right after a fault, else sleeping
    /// in `poll` (1 ms at most while faults wait to be retried). `None`: stop.
    ///
    /// Returned with the batch: [`Mm::event_gate`], held if the batch holds an event (until
    /// [`Handler::apply`] has applied its events).
    fn read<'m>(
        &mut self,
        shared: &Shared,
        mm: &'m Mm,
        deferred: &[Pending],
    ) -> Option<(usize, Option<Gate<'m>>)> {
        let mut n = 0;
        let mut gate = None;
        // Poll without sleeping after a fault, unless faults wait for reclaim or for an event,
        // or the resident pages are over the limit: reclaim (and the scanner registering
        // memory the program filled) then need the CPU more than the next fault does.
        if let Some(since) = self
            .after_fault
            .filter(|_| deferred.is_empty() && shared.resident() < shared.limit.pages())
        {
            self.handling.set(mm, true);
            gate = Some(take_gate(mm, &shared.stats));
            // Asked after `handling` is set: a batch picked later waits for this one.
            let scan = &mut self.scan;
            scan.active = false;
            let mut before_read = || scan.scan(mm, &shared.stats);
            let before_read: Option<&mut dyn FnMut()> =
                shared.shmem.has_evicted(mm).then_some(&mut before_read);
            n = match self
                .spin
                .poll(mm, &mut self.msgs, since, &shared.stats, before_read)
            {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!("reading the uffd of mm {} failed: {e}", mm.id);
                    return None;
                }
            };
        }
        if n == 0 {
            // Never held while sleeping in poll: other threads' fills wait on it.
            release(gate.take());
            self.handling.set(mm, false);
            let timeout = if deferred.is_empty() { -1 } else { 1 };
            let ready = match sys::poll_read(
                &[mm.uffd.as_fd(), mm.stop.as_fd(), mm.retry.as_fd()],
                timeout,
            ) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("poll on the uffd of mm {} failed: {e}", mm.id);
                    return None;
                }
            };
            if ready[1] {
                return None;
            }
            if ready[2] {
                mm.retry.drain();
            }
            if ready[0] {
                self.handling.set(mm, true);
                gate.get_or_insert_with(|| take_gate(mm, &shared.stats));
                // A REMOVE's caller is seen only until the REMOVE is read (`remove_scan.rs`).
                self.scan.active = false;
                if shared.shmem.has_evicted(mm) {
                    self.scan.scan(mm, &shared.stats);
                }
                n = match mm.uffd.read_msgs(&mut self.msgs) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
                    Err(e) => {
                        tracing::warn!("reading the uffd of mm {} failed: {e}", mm.id);
                        return None;
                    }
                };
            }
            if let Some(since) = self.after_fault.filter(|_| n > 0) {
                self.spin.adjust(since.elapsed());
            }
        }
        self.after_fault = None;
        // Held on only for a batch with an event in it.
        let events = self.msgs[..n]
            .iter()
            .any(|m| !matches!(m.decode(), UffdEvent::PageFault { .. }));
        if !events {
            release(gate.take());
        }
        Some((n, gate))
    }

    /// Applies the `n` messages read: the events first, in order, then the faults, in order.
    /// Returns whether any was a fault.
    ///
    /// Why events first: the kernel keeps a fill from racing with a non-cooperative event only
    /// until that event is *read* (`mmap_changing`, which makes `UFFDIO_COPY` and
    /// `UFFDIO_MOVE` fail with `EAGAIN`, drops when the reader takes the message). A fault read
    /// in the same batch before a FORK, served before the FORK was applied, filled the parent
    /// after the fork had copied its page tables: the child inherited the page as resident
    /// while its own page table had a hole, and read zeros there (`tests/clients/fork_race.c`,
    /// docs/experiments/2026-11-27-fork-race.md). Served after the FORK is applied, the child
    /// holds that page as evicted, sharing its slot.
    /// For the same reason a fault read before a REMOVE, UNMAP or REMAP of its page is not
    /// served at all: filled after the event let the `madvise`, `munmap` or `mremap` go on, it
    /// could put old bytes back where the program must read zeros, or a page into a new mapping
    /// at those addresses. Its thread is woken instead and faults again if it must.
    fn apply(
        &mut self,
        shared: &Arc<Shared>,
        mm: &Arc<Mm>,
        n: usize,
        gate: Option<Gate<'_>>,
        deferred: &mut Vec<Pending>,
    ) -> bool {
        let now = Instant::now();
        let msgs: Vec<UffdEvent> = self.msgs[..n].iter().map(|m| m.decode()).collect();
        // Each fault, unless an event after it in the batch covers its page.
        let mut faults = Vec::with_capacity(n);
        for (i, m) in msgs.iter().enumerate() {
            let UffdEvent::PageFault {
                address,
                flags,
                ptid,
            } = *m
            else {
                continue;
            };
            let page = address & !(PAGE_SIZE_U64 - 1);
            if msgs[i + 1..].iter().any(|e| event_covers(e, page)) {
                let _ = mm.uffd.wake(page, PAGE_SIZE_U64);
                Stats::add(&shared.stats.faults_woken_for_event, 1);
                continue;
            }
            faults.push(Pending {
                address,
                flags,
                ptid,
                read_at: now,
                stalled: false,
            });
        }
        for (i, event) in msgs.into_iter().enumerate() {
            if matches!(event, UffdEvent::PageFault { .. }) {
                continue;
            }
            let fork_uffd = self.msgs[i].take_fork_uffd();
            // A fault waiting to be retried in a range that is gone or emptied is not filled
            // any more (as above).
            deferred.retain(|p| {
                let stale = event_covers(&event, p.address & !(PAGE_SIZE_U64 - 1));
                if stale {
                    let _ = mm
                        .uffd
                        .wake(p.address & !(PAGE_SIZE_U64 - 1), PAGE_SIZE_U64);
                    p.done(shared);
                }
                !stale
            });
            // (The scratch freed by a FREE changes no address of the program: it does not make
            // a batch's victims stale.)
            let scratch =
                matches!(event, UffdEvent::Remove { start, .. } if mm.in_agent_region(start));
            handle_event(shared, mm, event, fork_uffd, &mut self.scan);
            if !scratch {
                mm.events_applied.fetch_add(1, Ordering::Release);
            }
        }
        // Fills from other threads may go on (see `Mm::event_gate`).
        release(gate);
        prefetch::forget();
        let faulted = !faults.is_empty();
        // The faults whose pages wait on the disk: read together at once.
        prefetch::read_ahead_of_faults(shared, mm, faults.iter().map(|p| p.address));
        for p in faults {
            self.serve(shared, mm, p, deferred);
        }
        faulted
    }

    /// Serves fault `p`; one that must wait (`EAGAIN`, throttled) joins `deferred`.
    fn serve(
        &mut self,
        shared: &Shared,
        mm: &Arc<Mm>,
        mut p: Pending,
        deferred: &mut Vec<Pending>,
    ) {
        let done = serve_fault(shared, mm, &mut p, &mut self.work);
        if done {
            p.done(shared);
        } else {
            deferred.push(p);
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
