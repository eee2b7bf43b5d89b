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
//! This module does in user space what haltpoll would: one *keeper* thread per CPU, pinned to
//! it and scheduled `SCHED_IDLE`, so that it runs only when nothing else on that CPU wants to,
//! polls while a fault was served within the last `idle_poll_us`, and sleeps otherwise. A CPU
//! whose keeper polls does not halt, and the scheduler counts a CPU that runs only
//! `SCHED_IDLE` work as idle when it places a woken thread, so the faulting thread is still
//! woken where it was; the keeper yields to it at once. The first fault after a quiet spell
//! wakes the keepers (one futex wake); later faults only move a timestamp.
//!
//! The cost is CPU time that would otherwise be idle, only during fault storms and at most
//! `idle_poll_us` after the last fault; `idle_poll_ns` counts it (summed over the keepers).
//! Unlike `[fault] cpu_latency_us` it changes nothing outside the daemon.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::stats::Stats;
use crate::sys;

/// Default of `[fault] idle_poll_us` (the kernel's default `guest_halt_poll_ns`).
pub const DEFAULT_IDLE_POLL_US: u64 = 200;
/// Largest `[fault] idle_poll_us` accepted.
pub const MAX_IDLE_POLL_US: u64 = 10_000;

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
    /// Times the keepers were woken for a fault storm.
    wakeups: AtomicU64,
}

impl Inner {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn within_window(&self) -> bool {
        let last = self.last_fault.load(Ordering::Relaxed);
        self.now_ns().saturating_sub(last) < self.window.as_nanos() as u64
    }
}

/// The keepers of one daemon. Stops and joins them on drop.
#[derive(Debug)]
pub struct IdlePoll {
    inner: Arc<Inner>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl IdlePoll {
    /// Starts one keeper on each CPU this thread may run on, polling up to `window` after a
    /// fault. None when `window` is zero or there is a single CPU (a keeper could only delay
    /// the handler there).
    pub fn start(window: Duration) -> Option<IdlePoll> {
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
            wakeups: AtomicU64::new(0),
        });
        let mut threads = Vec::new();
        for cpu in cpus {
            let inner = Arc::clone(&inner);
            let spawned = std::thread::Builder::new()
                .name(format!("uffd-idle-{cpu}"))
                .stack_size(64 << 10)
                .spawn(move || keeper(&inner, cpu));
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => {
                    eprintln!("uffd-daemon: cannot start the idle keeper of CPU {cpu}: {e}");
                }
            }
        }
        Some(IdlePoll { inner, threads })
    }

    /// A fault was just served: keep the CPUs awake for another window.
    pub fn fault(&self) {
        let inner = &*self.inner;
        inner.last_fault.store(inner.now_ns(), Ordering::Relaxed);
        if !inner.awake.load(Ordering::Relaxed) && !inner.awake.swap(true, Ordering::AcqRel) {
            *inner.generation.lock() += 1;
            inner.wake.notify_all();
            inner.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Adds the keepers' counters to `stats` (`idle_poll_ns`, `idle_poll_wakeups`), as totals.
    pub fn report(&self, stats: &Stats) {
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
    loop {
        {
            let mut g = inner.generation.lock();
            while *g == seen && !inner.stop.load(Ordering::Acquire) {
                inner.wake.wait(&mut g);
            }
            seen = *g;
        }
        if inner.stop.load(Ordering::Acquire) {
            return;
        }
        let cpu0 = sys::thread_cpu_ns();
        loop {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
            if inner.stop.load(Ordering::Relaxed) {
                break;
            }
            if !inner.within_window() {
                // Going to sleep; a fault served meanwhile sees `awake` false and wakes us.
                inner.awake.store(false, Ordering::Release);
                if !inner.within_window() {
                    break;
                }
                inner.awake.store(true, Ordering::Release);
            }
        }
        // CPU time, not wall time: the keeper yields its CPU to every other thread.
        inner
            .polled_ns
            .fetch_add(sys::thread_cpu_ns() - cpu0, Ordering::Relaxed);
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
        let Some(p) = IdlePoll::start(Duration::from_millis(2)) else {
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
}
