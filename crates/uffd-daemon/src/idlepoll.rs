//! Idle polling in user space while faults keep coming (`[fault] idle_poll_us`).
//!
//! Every fault served by a daemon costs two wakeups: the faulting thread wakes the handler, and
//! the handler's fill wakes the faulting thread. A wakeup is cheap on a CPU that is running or
//! polling, and dear on one that has halted: in a VM, waking a halted vCPU is an exit to the
//! host and a trip through its scheduler (about 40 us each way on the 2-vCPU VM this was
//! measured on). The kernel's answer is the guest haltpoll governor, which polls for up to
//! `guest_halt_poll_ns` (200 us by default) before halting; a VM configured with 0 halts at
//! once, and the faulting thread's CPU, idle while it waits for the fill, halts during every
//! fault. The handler's own polling (`[fault] spin_us`) keeps the handler's CPU awake, not the
//! client's.
//!
//! This module keeps idle CPUs from halting while faults keep coming, in one of two ways
//! (`[fault] idle_poll`):
//!
//! - `kernel` (the default where `/dev/cpu_dma_latency` can be opened, that is as root): for
//!   the length of a fault storm the daemon holds a PM QoS CPU latency request of 0, so idle
//!   CPUs run the kernel's polling idle state instead of halting, and drops it (writes the
//!   no-constraint value) `idle_poll_us` after the last fault. A CPU polling in the kernel's
//!   idle loop advertises it (`TIF_POLLING_NRFLAG`): waking a thread there needs no
//!   interrupt at all, where a CPU running a user-space poller needs a reschedule IPI, itself
//!   an exit to the host in a VM. One thread of the daemon changes the request, twice per
//!   storm. The request is machine-wide (every idle CPU polls during a storm, not only those
//!   of the program), and the kernel drops it when the daemon exits or dies. The polling is
//!   the idle task's CPU time, not the daemon's: `idle_poll_held_ns` counts the wall time
//!   the request was held.
//! - `keepers`: one *keeper* thread per CPU, pinned to it and scheduled `SCHED_IDLE`, so that
//!   it runs only when nothing else on that CPU wants to, polls while a fault was served
//!   within the last `idle_poll_us`, and sleeps otherwise. A CPU whose keeper polls does not
//!   halt, and the scheduler counts a CPU that runs only `SCHED_IDLE` work as idle when it
//!   places a woken thread, so the faulting thread is still woken where it was; the keeper
//!   yields to it at once (after the IPI). Nothing outside the daemon changes; the keepers'
//!   CPU time is `idle_poll_ns`.
//!
//! In both, the first fault after a quiet spell wakes the daemon's thread(s) (one futex wake;
//! `idle_poll_wakeups`); later faults only move a timestamp. The cost is CPU time that would
//! otherwise be idle, only during fault storms and at most `idle_poll_us` after the last
//! fault. Measured on the 2-vCPU VM of the comparison (`docs/ARCHITECTURE.md`): the kernel
//! way brings the p50 of a fault restored from zswap under 15 us, the keepers to about 20.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::stats::Stats;
use crate::sys;

/// Default of `[fault] idle_poll_us` (the kernel's default `guest_halt_poll_ns`).
pub(crate) const DEFAULT_IDLE_POLL_US: u64 = 200;

/// How idle CPUs are kept from halting during a fault storm (`[fault] idle_poll`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A machine-wide PM QoS request of 0 us while faults come (idle CPUs poll in the
    /// kernel); the keepers where the request cannot be made.
    Kernel,
    /// A `SCHED_IDLE` polling thread per CPU.
    Keepers,
}

impl Mode {
    /// The name used in the configuration and the log.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::Keepers => "keepers",
        }
    }
}
/// Largest `[fault] idle_poll_us` accepted.
pub(crate) const MAX_IDLE_POLL_US: u64 = 10_000;

#[derive(Debug)]
struct Inner {
    window: Duration,
    start: Instant,
    /// When the last fault was served, in nanoseconds since `start`.
    last_fault: AtomicU64,
    /// Whether the keepers poll (or are about to); cleared by a keeper whose window closed.
    awake: AtomicBool,
    /// Bumped to wake the keepers.
    generation: Mutex<u64>,
    wake: Condvar,
    stop: AtomicBool,
    /// CPU time the keepers polled, in nanoseconds, summed.
    polled_ns: AtomicU64,
    /// Wall time the kernel-mode request was held, in nanoseconds.
    held_ns: AtomicU64,
    /// Whether the kernel-mode request is at 0 now.
    held: AtomicBool,
    /// Times the keepers were woken for a fault storm.
    wakeups: AtomicU64,
}

impl Inner {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn within_window(&self) -> bool {
        self.window_left().is_some()
    }

    /// How long the current window has to run, if it is open.
    fn window_left(&self) -> Option<Duration> {
        let last = self.last_fault.load(Ordering::Relaxed);
        let since = self.now_ns().saturating_sub(last);
        let window = self.window.as_nanos() as u64;
        (since < window).then(|| Duration::from_nanos(window - since))
    }

    /// Sleeps until a fault storm starts (true) or the daemon stops (false).
    fn wait_for_storm(&self, seen: &mut u64) -> bool {
        let mut g = self.generation.lock();
        while *g == *seen && !self.stop.load(Ordering::Acquire) {
            self.wake.wait(&mut g);
        }
        *seen = *g;
        !self.stop.load(Ordering::Acquire)
    }

    /// Called when the window seems closed: clears `awake`, unless a fault came meanwhile.
    /// True if the storm is over (a fault from now on sees `awake` false and wakes us).
    fn storm_over(&self) -> bool {
        self.awake.store(false, Ordering::Release);
        if !self.within_window() {
            return true;
        }
        self.awake.store(true, Ordering::Release);
        false
    }
}

/// The keepers of one daemon. Stops and joins them on drop.
#[derive(Debug)]
pub(crate) struct IdlePoll {
    inner: Arc<Inner>,
    threads: Vec<std::thread::JoinHandle<()>>,
    mode: Mode,
}

impl IdlePoll {
    /// Starts keeping idle CPUs polling up to `window` after a fault, the `mode` way (kernel
    /// mode falls back to the keepers, saying so, when `/dev/cpu_dma_latency` cannot be
    /// opened). None when `window` is zero or there is a single CPU (a wakeup there never
    /// crosses CPUs, and a keeper could only delay the handler).
    pub(crate) fn start(window: Duration, mode: Mode) -> Option<IdlePoll> {
        if window.is_zero() {
            return None;
        }
        let cpus = sys::allowed_cpus();
        if cpus.len() < 2 {
            return None;
        }
        let inner = Arc::new(Inner {
            window,
            start: Instant::now(),
            last_fault: AtomicU64::new(0),
            awake: AtomicBool::new(false),
            generation: Mutex::new(0),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            polled_ns: AtomicU64::new(0),
            held_ns: AtomicU64::new(0),
            held: AtomicBool::new(false),
            wakeups: AtomicU64::new(0),
        });
        let mut threads = Vec::new();
        if mode == Mode::Kernel {
            let req = sys::CpuLatencyRequest::new(sys::CpuLatencyRequest::NO_CONSTRAINT_US);
            let spawned = req.and_then(|req| {
                let inner = Arc::clone(&inner);
                std::thread::Builder::new()
                    .name("uffd-idle-qos".into())
                    .stack_size(64 << 10)
                    .spawn(move || qos_holder(&inner, req))
            });
            match spawned {
                Ok(h) => {
                    threads.push(h);
                    return Some(IdlePoll {
                        inner,
                        threads,
                        mode,
                    });
                }
                Err(e) => tracing::warn!(
                    "[fault] idle_poll = \"kernel\": cannot hold \
                     /dev/cpu_dma_latency ({e}); using the keepers"
                ),
            }
        }
        for cpu in cpus {
            let inner = Arc::clone(&inner);
            let spawned = std::thread::Builder::new()
                .name(format!("uffd-idle-{cpu}"))
                .stack_size(64 << 10)
                .spawn(move || keeper(&inner, cpu));
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => {
                    tracing::warn!("cannot start the idle keeper of CPU {cpu}: {e}");
                }
            }
        }
        Some(IdlePoll {
            inner,
            threads,
            mode: Mode::Keepers,
        })
    }

    /// The way in force (after any fallback).
    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// A fault was just served: keep the CPUs awake for another window.
    pub(crate) fn fault(&self) {
        let inner = &*self.inner;
        inner.last_fault.store(inner.now_ns(), Ordering::Relaxed);
        if !inner.awake.load(Ordering::Relaxed) && !inner.awake.swap(true, Ordering::AcqRel) {
            *inner.generation.lock() += 1;
            inner.wake.notify_all();
            inner.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Adds the counters to `stats` (`idle_poll_ns`, `idle_poll_held_ns`,
    /// `idle_poll_wakeups`), as totals.
    pub(crate) fn report(&self, stats: &Stats) {
        stats.idle_poll_held_ns.store(
            self.inner.held_ns.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        stats.idle_poll_ns.store(
            self.inner.polled_ns.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        stats.idle_poll_wakeups.store(
            self.inner.wakeups.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }
}

impl Drop for IdlePoll {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        {
            let _g = self.inner.generation.lock();
            self.inner.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn keeper(inner: &Inner, cpu: usize) {
    // Pinned, and below every normal thread: best effort (without them the keeper would take
    // CPU time from the program; so on failure it does not poll at all).
    if !sys::pin_to_cpu(cpu) || !sys::set_sched_idle() {
        return;
    }
    let mut seen = 0u64;
    while inner.wait_for_storm(&mut seen) {
        let cpu0 = sys::thread_cpu_ns();
        loop {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
            if inner.stop.load(Ordering::Relaxed) {
                break;
            }
            if !inner.within_window() && inner.storm_over() {
                break;
            }
        }
        // CPU time, not wall time: the keeper yields its CPU to every other thread.
        inner
            .polled_ns
            .fetch_add(sys::thread_cpu_ns() - cpu0, Ordering::Relaxed);
    }
}

/// Kernel mode: holds the request at 0 from the first fault of a storm until `window` after
/// its last.
fn qos_holder(inner: &Inner, mut req: sys::CpuLatencyRequest) {
    let mut seen = 0u64;
    let mut warned = false;
    while inner.wait_for_storm(&mut seen) {
        if let Err(e) = req.set(0) {
            if !warned {
                tracing::warn!("cannot set /dev/cpu_dma_latency to 0: {e}");
                warned = true;
            }
            inner.awake.store(false, Ordering::Release);
            continue;
        }
        inner.held.store(true, Ordering::Relaxed);
        let t0 = Instant::now();
        while !inner.stop.load(Ordering::Relaxed) {
            match inner.window_left() {
                Some(left) => std::thread::sleep(left),
                None if inner.storm_over() => break,
                None => {}
            }
        }
        // Back to no constraint. Should this fail, the request stays at 0 until the next
        // storm's write or the daemon's exit closes the file: polling, never wrong.
        let _ = req.set(sys::CpuLatencyRequest::NO_CONSTRAINT_US);
        inner.held.store(false, Ordering::Relaxed);
        inner
            .held_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits up to 10 s for `cond` (keepers run `SCHED_IDLE`: on a busy machine they get a
    /// CPU only now and then).
    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn keepers_poll_after_a_fault_then_sleep() {
        let Some(p) = IdlePoll::start(Duration::from_millis(2), Mode::Keepers) else {
            return; // one CPU: no keepers
        };
        let i = &*p.inner;
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            i.polled_ns.load(Ordering::Relaxed),
            0,
            "polled before any fault"
        );
        assert!(!i.awake.load(Ordering::Relaxed));
        p.fault();
        assert!(i.awake.load(Ordering::Relaxed));
        // A keeper polls for the window, then goes back to sleep, counting what it polled.
        wait_for("a keeper polled", || {
            i.polled_ns.load(Ordering::Relaxed) > 0
        });
        wait_for("the keepers sleep", || !i.awake.load(Ordering::Relaxed));
        assert_eq!(i.wakeups.load(Ordering::Relaxed), 1);
        // A fault after the window wakes them again; faults within it do not (but a keeper
        // that is only now leaving its last window may clear `awake` once more, a benign
        // race that costs one extra wake).
        for _ in 0..100 {
            p.fault();
        }
        let w = i.wakeups.load(Ordering::Relaxed);
        assert!((2..=3).contains(&w), "{w} wakeups for one storm");
        let polled = i.polled_ns.load(Ordering::Relaxed);
        wait_for("the keepers polled again", || {
            i.polled_ns.load(Ordering::Relaxed) > polled
        });
        let stats = Stats::default();
        p.report(&stats);
        assert_eq!(stats.idle_poll_wakeups.load(Ordering::Relaxed), w);
        assert!(stats.idle_poll_ns.load(Ordering::Relaxed) > polled);
        drop(p); // stops and joins the keepers
    }

    /// Kernel mode (as root, as in CI): the request goes to 0 on the first fault of a storm
    /// and back `window` after the last. (A long window: the test thread's own delays on a
    /// busy machine must not end a storm.)
    #[test]
    fn kernel_mode_holds_the_request_during_a_storm() {
        let window = Duration::from_millis(50);
        let Some(p) = IdlePoll::start(window, Mode::Kernel) else {
            return; // one CPU
        };
        if sys::geteuid() != 0 {
            return; // not root: the fallback to the keepers is what the other test covers
        }
        assert_eq!(p.mode(), Mode::Kernel, "root can open /dev/cpu_dma_latency");
        let i = &*p.inner;
        std::thread::sleep(Duration::from_millis(10));
        assert!(!i.held.load(Ordering::Relaxed), "held before any fault");
        p.fault();
        wait_for("the request is held", || i.held.load(Ordering::Relaxed));
        // Faults well within the window keep it held.
        let t0 = Instant::now();
        let mut last = t0;
        while t0.elapsed() < Duration::from_millis(150) {
            std::thread::sleep(Duration::from_millis(2));
            assert!(i.held.load(Ordering::Relaxed), "dropped within a storm");
            last = Instant::now();
            p.fault();
        }
        wait_for("the request is dropped", || !i.held.load(Ordering::Relaxed));
        let after = last.elapsed();
        assert!(after >= window, "dropped {after:?} after the last fault");
        let held = i.held_ns.load(Ordering::Relaxed);
        assert!(
            held >= 200_000_000,
            "held {held} ns for a 150 ms storm and a 50 ms window"
        );
        assert_eq!(i.wakeups.load(Ordering::Relaxed), 1);
        let stats = Stats::default();
        p.report(&stats);
        assert_eq!(stats.idle_poll_held_ns.load(Ordering::Relaxed), held);
        assert_eq!(stats.idle_poll_ns.load(Ordering::Relaxed), 0);
        drop(p);
    }
}
