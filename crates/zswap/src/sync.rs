//! The one place this crate takes its synchronisation types from: `loom`'s under
//! `cfg(zswap_loom)` (so loom models explore the index, LRU and pool locking), `parking_lot` and
//! `std` otherwise. Also `current_cpu()` / `nr_cpus()`, fixed under loom.
//!
//! Statistics counters are always `std` atomics: they order nothing, they only count. The
//! reference count of a multi-page object ([`AtomicU32`]) is loom's under loom.

#[cfg(not(zswap_loom))]
mod imp {
    /// The reference count of a multi-page object (modelled under loom: its last reference
    /// frees the object's pool chunks, and the references of one object can sit in two shards).
    pub(crate) use std::sync::atomic::AtomicU32;

    /// A mutex whose `lock` returns the guard directly (no poisoning).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);
    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(parking_lot::Mutex::new(value))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
    }

    /// A condition variable that takes and gives back the guard.
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(parking_lot::Condvar::new())
        }
        pub(crate) fn wait<'a, T>(&self, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(&mut guard);
            guard
        }
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// The CPU this thread runs on: a hint for spreading work, never relied on for correctness.
    #[cfg(not(miri))]
    pub(crate) fn current_cpu() -> usize {
        // SAFETY: sched_getcpu has no preconditions; it returns -1 on error.
        let cpu = unsafe { libc::sched_getcpu() };
        usize::try_from(cpu).unwrap_or(0)
    }

    /// Miri does not emulate `sched_getcpu`; the CPU is only a hint, so every thread says 0
    /// there, as threads sharing one CPU would.
    #[cfg(miri)]
    pub(crate) fn current_cpu() -> usize {
        0
    }

    /// Number of CPUs available to this process.
    pub(crate) fn nr_cpus() -> usize {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    }
}

#[cfg(zswap_loom)]
mod imp {
    pub(crate) use loom::sync::atomic::AtomicU32;

    /// A mutex whose `lock` returns the guard directly (loom's, unwrapping the poison result:
    /// a panic inside a model already fails the model).
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);
    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            match self.0.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            }
        }
    }

    /// loom's condition variable with the same shape as the std one above.
    #[derive(Debug)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }
        pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            match self.0.wait(guard) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            }
        }
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// Fixed under loom.
    pub(crate) fn current_cpu() -> usize {
        0
    }

    /// Fixed under loom.
    pub(crate) fn nr_cpus() -> usize {
        2
    }
}

pub(crate) use imp::*;

/// A plain lock for caches that order nothing (compression contexts): the same type under loom,
/// because what it guards never interacts with the modelled protocol.
pub(crate) type PlainMutex<T> = parking_lot::Mutex<T>;
