//! The state every part of the daemon shares: the counters, the resident count and the
//! limit, the tiers, and the list of live address spaces. The supervisor makes it; the fault
//! path, reclaim and the supervisor's threads read it. Page tables (`mm.rs`) see only its
//! accounting side, through `mm::Ledger`.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::config::{AccessMode, PolicyConfig};
use crate::mm::Mm;
use crate::stats::{Histogram, Samples, Stats};
use crate::sys;
use crate::tiers::Tiers;
/// State shared by the handler threads, the connection threads and the monitor.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Counters.
    pub stats: Stats,
    /// Service time of faults restored from zswap.
    pub lat_zswap: Histogram,
    /// Service time of faults restored from the backing device.
    pub lat_backend: Histogram,
    /// Service time of zero-fill faults.
    pub lat_zero: Histogram,
    /// Where evicted pages go.
    pub tiers: Tiers,
    /// The policy settings (each address space has its own policy).
    pub policy: PolicyConfig,
    /// The resident limit and reclaim's watermarks (set by the controller under `auto`).
    pub limit: crate::limit::Limit,
    /// The time the tree's threads spend waiting on faults.
    pub stall: crate::limit::StallMeter,
    /// The limit's controller, under `--limit auto`.
    pub auto_limit: Option<crate::limit::AutoLimit>,
    resident: AtomicUsize,
    /// Every live address space.
    pub mms: Mutex<Vec<Arc<Mm>>>,
    next_id: AtomicU64,
    kick: Mutex<bool>,
    kick_cv: Condvar,
    /// Held while a forked child is looked for and bound (`bind.rs`): one at a time, so that
    /// no two address spaces are bound to one process.
    pub(crate) bind_lock: Mutex<()>,
    /// Notified when a forked child is bound (its greeting may be waiting for that).
    pub(crate) bind_cv: Condvar,
    stalled: AtomicBool,
    /// After stores failed for a whole batch (swap space full, a failing device): how many
    /// batches in a row, and when reclaim may try again (a pause that doubles up to a second,
    /// instead of a CPU's worth of failed writes).
    pub store_backoff: Mutex<(u32, Option<Instant>)>,
    /// The idle keepers (`[fault] idle_poll_us`), if any.
    pub idle_poll: Option<crate::idlepoll::IdlePoll>,
    /// An injected DROP is stopping a program now.
    pub injecting: AtomicBool,
    /// The thread it stops: its faults are not held at the limit (it stops only once served).
    /// Its number in its own pid namespace, as the faults name it (`inject.rs`).
    pub injecting_tid: AtomicI32,
    /// The process it stops (the daemon's number).
    pub injecting_pid: AtomicI32,
    /// The daemon's lifeline (`sys::Lifeline`): its read end handed to each agent with the
    /// answer to its greeting, so that the agent sees the daemon's end without looking the
    /// daemon up by a number, which means nothing in a pid namespace below the daemon's.
    /// (`run` makes it, and does not start without it.)
    pub lifeline: Option<sys::Lifeline>,
    /// Durations of the stops of injections, beyond the calls made in them (`inject.rs`).
    pub inject_stop_times: Samples,
    /// Durations of whole stops, from the seize to the detach (the program's thread stands
    /// still meanwhile).
    pub inject_hold_times: Samples,
    /// Durations of DROP batches carried out by agents, from the request to the answer.
    pub drop_agent_times: Samples,
    /// Durations of DROP batches carried out by injection, from the seize to the settlement.
    pub drop_inject_times: Samples,
    /// Why processes could not be managed without an agent (the image, the reason): the
    /// census does not say them again, and an image is not tried twice.
    pub agentless_refusals: Mutex<std::collections::HashMap<i32, (PathBuf, String)>>,
    /// Processes that exec'd an image without the agent (seen by the scanner), for the
    /// monitor, the only thread that makes ptrace calls, to manage without one.
    pub adopt_queue: Mutex<Vec<i32>>,
    /// Exit statuses the monitor's ptrace waits reaped (a tracee that exited mid-stop).
    pub reaped: Mutex<Vec<(i32, i32)>>,
    /// Shared anonymous inodes and their mappers (`shmem.rs`): their resident pages are in
    /// the resident count once each.
    pub shmem: crate::shmem::ShmemTable,
}

impl crate::mm::Ledger for Shared {
    fn resident_add(&self, n: usize) {
        Shared::resident_add(self, n);
    }
    fn resident_sub(&self, n: usize) {
        Shared::resident_sub(self, n);
    }
    fn put_slot(&self, slot: u32) {
        Shared::put_slot(self, slot);
    }
    fn dup_slot(&self, slot: u32) {
        Shared::dup_slot(self, slot);
    }
    fn readahead_unused(&self) {
        Stats::add(&self.stats.readahead_unused_pages, 1);
    }
}

impl crate::shmem::Host for Shared {
    fn stats(&self) -> &Stats {
        &self.stats
    }
    fn policy(&self) -> &PolicyConfig {
        &self.policy
    }
    fn tiers(&self) -> &Tiers {
        &self.tiers
    }
}

impl Shared {
    /// Shared state for a limit of `limit_pages`, or one the controller `auto` sets.
    pub(crate) fn new(
        tiers: Tiers,
        policy: PolicyConfig,
        limit_pages: usize,
        auto: Option<crate::limit::AutoConfig>,
    ) -> Self {
        let auto_limit = auto.map(crate::limit::AutoLimit::new);
        let limit_pages = auto_limit
            .as_ref()
            .map_or(limit_pages, |a| a.initial_pages());
        Shared {
            stats: Stats::default(),
            lat_zswap: Histogram::default(),
            lat_backend: Histogram::default(),
            lat_zero: Histogram::default(),
            tiers,
            policy,
            limit: crate::limit::Limit::new(limit_pages),
            stall: crate::limit::StallMeter::default(),
            auto_limit,
            resident: AtomicUsize::new(0),
            mms: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            kick: Mutex::new(false),
            kick_cv: Condvar::new(),
            bind_lock: Mutex::new(()),
            bind_cv: Condvar::new(),
            stalled: AtomicBool::new(false),
            store_backoff: Mutex::new((0, None)),
            idle_poll: crate::idlepoll::IdlePoll::start(
                policy.fault_idle_poll,
                policy.fault_idle_poll_mode,
            ),
            injecting: AtomicBool::new(false),
            injecting_tid: AtomicI32::new(0),
            injecting_pid: AtomicI32::new(0),
            lifeline: None,
            inject_stop_times: Samples::default(),
            inject_hold_times: Samples::default(),
            drop_agent_times: Samples::default(),
            drop_inject_times: Samples::default(),
            agentless_refusals: Mutex::new(std::collections::HashMap::new()),
            adopt_queue: Mutex::new(Vec::new()),
            reaped: Mutex::new(Vec::new()),
            shmem: crate::shmem::ShmemTable::default(),
        }
    }

    /// Resident managed pages now.
    pub(crate) fn resident(&self) -> usize {
        self.resident.load(Ordering::Relaxed)
    }

    /// Adds resident pages.
    pub(crate) fn resident_add(&self, n: usize) {
        let now = self.resident.fetch_add(n, Ordering::Relaxed) + n;
        self.stats.set_resident(now as u64);
    }

    /// Removes resident pages.
    pub(crate) fn resident_sub(&self, n: usize) {
        let now = self.resident.fetch_sub(n, Ordering::Relaxed) - n;
        self.stats.set_resident(now as u64);
    }

    /// Drops a reference to a store slot.
    pub(crate) fn put_slot(&self, slot: u32) {
        if let Err(e) = self.tiers.put(slot) {
            tracing::error!("BUG: {e}");
            debug_assert!(false, "{e}");
        }
    }

    /// Adds a reference to a store slot.
    pub(crate) fn dup_slot(&self, slot: u32) {
        if let Err(e) = self.tiers.dup(slot) {
            tracing::error!("BUG: {e}");
            debug_assert!(false, "{e}");
        }
    }

    /// Wakes the monitor when resident memory passed the high watermark.
    pub(crate) fn maybe_kick_reclaim(&self) {
        if self.resident() > self.limit.high() {
            let mut k = self.kick.lock();
            if !*k {
                *k = true;
                self.kick_cv.notify_one();
            }
        }
    }

    /// Whether the last reclaim pass above the limit freed nothing.
    pub(crate) fn reclaim_stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// Records whether the last reclaim pass above the limit freed nothing.
    pub(crate) fn set_reclaim_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::Relaxed);
    }

    /// The monitor's sleep: until kicked, or `timeout`.
    pub(crate) fn wait_for_kick(&self, timeout: std::time::Duration) {
        let mut k = self.kick.lock();
        if !*k {
            self.kick_cv.wait_for(&mut k, timeout);
        }
        *k = false;
    }

    /// Wakes the monitor to reclaim now.
    pub(crate) fn kick_reclaim(&self) {
        let mut k = self.kick.lock();
        if !*k {
            *k = true;
            self.kick_cv.notify_one();
        }
    }

    /// Whether the access source arms write protection on resident pages.
    pub(crate) fn wp_access(&self) -> bool {
        self.policy.access == AccessMode::FaultsWp
    }

    /// The counters as JSON: the daemon's, the tiers', and the metadata estimate.
    pub(crate) fn stats_json(&self) -> serde_json::Value {
        if let Some(p) = &self.idle_poll {
            p.report(&self.stats);
        }
        let mut v = self.stats.to_json();
        self.tiers.to_json(&mut v);
        // How idle CPUs were kept polling during fault storms ("kernel", "keepers", "off").
        v["idle_poll"] = self
            .idle_poll
            .as_ref()
            .map_or("off", |p| p.mode().name())
            .into();
        v["limit_pages"] = (self.limit.pages() as u64).into();
        // The tree's memory stall (limit.rs): wall time with a fault outstanding, and the sum
        // of all the waits, in seconds.
        v["memory_stall_some_s"] = (self.stall.some_ns() as f64 / 1e9).into();
        v["memory_stall_total_s"] = (self.stall.total_ns() as f64 / 1e9).into();
        if let Some(a) = &self.auto_limit {
            a.to_json(&mut v);
        }
        self.inject_stop_times.report("inject_stop", &mut v);
        self.inject_hold_times.report("inject_hold", &mut v);
        self.drop_agent_times.report("drop_agent", &mut v);
        self.drop_inject_times.report("drop_inject", &mut v);
        for (name, h) in [
            ("zswap", &self.lat_zswap),
            ("backend", &self.lat_backend),
            ("zero", &self.lat_zero),
        ] {
            if let (Some(p50), Some(p99)) = (h.quantile_us(0.5), h.quantile_us(0.99)) {
                v[format!("fault_{name}_p50_us")] = p50.into();
                v[format!("fault_{name}_p99_us")] = p99.into();
            }
        }
        v
    }

    /// Records what an injection's failure says: an exit status it reaped, a count.
    pub(crate) fn note_inject_error(&self, pid: i32, e: &crate::inject::InjectError) {
        Stats::add(&self.stats.inject_errors, 1);
        tracing::debug!("pid {pid}: injection failed: {e}");
        if let crate::inject::InjectError::Gone(Some(st)) = e {
            self.reaped.lock().push((pid, *st));
        }
    }

    pub(crate) fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The descriptors the answer to a completed greeting carries: the one it hands the
    /// process, if any (its uffd), then the daemon's lifeline, which the agent's threads poll
    /// (`agent.c`, watchdog_thread).
    pub(crate) fn greeting_fds<'a>(&'a self, fd: Option<BorrowedFd<'a>>) -> Vec<BorrowedFd<'a>> {
        fd.into_iter()
            .chain(self.lifeline.as_ref().map(AsFd::as_fd))
            .collect()
    }
}
