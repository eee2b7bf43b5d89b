//! Workload drivers of the report's `swap-alloc` section (moved here from `swap-alloc`'s
//! `baseline::workload`: only the report uses them).
//!
//! - [`throughput`]: each thread keeps a FIFO window of live allocations and replaces the
//!   oldest with a new one (slots freed in the order they were taken, as LRU eviction and
//!   refault roughly do), for a fixed time; reports alloc+free pairs, wall and CPU time, and
//!   the device-lock acquisitions.
//! - [`fallback`]: one thread, a random mix of order-0 and order-4 allocations (one order-4
//!   request per 16 order-0 requests, so each order asks for half the slots) and random frees
//!   holding the device at a target fill; an order-4 allocation that fails is a fallback and,
//!   as in the kernel, is replaced by 16 order-0 allocations.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use swap_alloc::set_cpu_hint;
use swap_alloc_baseline::SlotAllocator;

/// What [`throughput`] measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct Throughput {
    /// Alloc+free pairs done (all threads).
    pub ops: u64,
    /// Allocations that failed (the device was too small for the window; should be 0).
    pub failures: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// CPU time the worker threads got during the run, summed.
    pub cpu: Duration,
    /// Device-lock acquisitions during the run.
    pub device_locks: u64,
}

impl Throughput {
    /// Alloc+free pairs per second of wall time.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Device-lock acquisitions (allocation and free paths) per allocation.
    pub fn device_lock_per_alloc(&self) -> f64 {
        self.device_locks as f64 / (self.ops.max(1)) as f64
    }

    /// Alloc+free pairs per second of CPU time the workers got: less sensitive than
    /// [`ops_per_sec`](Self::ops_per_sec) to other load on the machine, but blind to time
    /// spent waiting for a lock holder that was descheduled.
    pub fn ops_per_cpu_sec(&self) -> f64 {
        self.ops as f64 / self.cpu.as_secs_f64().max(1e-9)
    }

    /// CPU time over wall time: how many threads really ran at once (at most the thread
    /// count; on a loaded machine, less).
    pub fn parallelism(&self) -> f64 {
        self.cpu.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// CPU time of the calling thread.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_THREAD_CPUTIME_ID is a clock every Linux kernel supports; on failure `ts` stays 0.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Runs `threads` threads for `duration`, each keeping `window` live allocations of
/// `2^order` slots and replacing the oldest with a new one (a free, then an allocation) as
/// fast as it can. Thread `t` uses CPU hint `t`.
pub fn throughput(
    dev: Arc<dyn SlotAllocator>,
    threads: usize,
    order: u32,
    window: usize,
    duration: Duration,
) -> Throughput {
    let barrier = Arc::new(std::sync::Barrier::new(threads + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let dev = Arc::clone(&dev);
            let barrier = Arc::clone(&barrier);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                set_cpu_hint(Some(t));
                let mut ring = std::collections::VecDeque::with_capacity(window);
                let mut failures = 0u64;
                let mut ops = 0u64;
                for _ in 0..window {
                    if let Some(off) = dev.alloc_slots(order) {
                        ring.push_back(off);
                    }
                }
                barrier.wait();
                let cpu0 = thread_cpu_time();
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        if ring.len() >= window {
                            if let Some(old) = ring.pop_front() {
                                dev.free_slots(old, order);
                            }
                        }
                        match dev.alloc_slots(order) {
                            Some(off) => ring.push_back(off),
                            None => failures += 1,
                        }
                    }
                    ops += 64;
                }
                let cpu = thread_cpu_time().saturating_sub(cpu0);
                barrier.wait();
                for off in ring {
                    dev.free_slots(off, order);
                }
                (ops, failures, cpu)
            })
        })
        .collect();
    barrier.wait();
    let locks0 = dev.device_lock_acquisitions();
    let start = Instant::now();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    barrier.wait();
    let elapsed = start.elapsed();
    let device_locks = dev.device_lock_acquisitions() - locks0;
    let mut out = Throughput {
        elapsed,
        device_locks,
        ..Throughput::default()
    };
    for h in handles {
        if let Ok((ops, failures, cpu)) = h.join() {
            out.ops += ops;
            out.failures += failures;
            out.cpu += cpu;
        }
    }
    out
}

/// What [`fallback`] measured (after the warm-up).
#[derive(Clone, Copy, Debug, Default)]
pub struct Fallback {
    /// Order-4 allocations tried.
    pub order4_attempts: u64,
    /// Order-4 allocations that failed.
    pub order4_fallbacks: u64,
    /// Allocations of any order that succeeded.
    pub allocations: u64,
    /// Device-lock acquisitions.
    pub device_locks: u64,
}

impl Fallback {
    /// Failed order-4 allocations over those tried.
    pub fn rate(&self) -> f64 {
        self.order4_fallbacks as f64 / self.order4_attempts.max(1) as f64
    }
}

/// Drives a device of `nslots` slots at `fill` (0..1) with random order-0 and order-4
/// allocations (order 4 with probability 1/17: half the slots each) and random frees, `warmup` steps then `steps` measured steps, from
/// the xorshift seed `seed`. Frees everything at the end.
pub fn fallback(
    dev: &dyn SlotAllocator,
    nslots: u64,
    fill: f64,
    warmup: u64,
    steps: u64,
    seed: u64,
) -> Fallback {
    set_cpu_hint(Some(0));
    let mut x = seed | 1;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let target = (nslots as f64 * fill) as u64;
    let mut live: Vec<(u64, u32)> = Vec::new();
    let mut used = 0u64;
    let mut out = Fallback::default();
    let mut locks0 = 0;
    for step in 0..warmup + steps {
        let measuring = step >= warmup;
        if step == warmup {
            locks0 = dev.device_lock_acquisitions();
        }
        if used + 16 <= target {
            let order = if rand() % 17 == 0 { 4 } else { 0 };
            if order == 4 && measuring {
                out.order4_attempts += 1;
            }
            match dev.alloc_slots(order) {
                Some(off) => {
                    live.push((off, order));
                    used += 1 << order;
                    out.allocations += u64::from(measuring);
                }
                None if order == 4 => {
                    out.order4_fallbacks += u64::from(measuring);
                    for _ in 0..16 {
                        if let Some(off) = dev.alloc_slots(0) {
                            live.push((off, 0));
                            used += 1;
                            out.allocations += u64::from(measuring);
                        }
                    }
                }
                None => {}
            }
        } else if !live.is_empty() {
            let i = (rand() % live.len() as u64) as usize;
            let (off, order) = live.swap_remove(i);
            dev.free_slots(off, order);
            used -= 1 << order;
        }
    }
    out.device_locks = dev.device_lock_acquisitions() - locks0;
    for (off, order) in live {
        dev.free_slots(off, order);
    }
    set_cpu_hint(None);
    out
}
