//! The crate's one synchronisation shim.
//!
//! Under `--cfg swap_alloc_loom` the locks and the atomics that carry the allocator's protocol
//! (cluster locks, the device lock, the per-CPU cluster hints) are loom's (the mutex is built
//! from a loom atomic and a loom cell, see below), so that the models in `tests/loom_*.rs`
//! explore their interleavings; otherwise they are `parking_lot` and `std`.
//! Statistics counters are plain `std` atomics in both builds: they are never read to make a
//! decision, so modelling them would only grow loom's state space.
//!
//! The CPU number is a hint (`sched_getcpu()`), never a correctness assumption: two threads may
//! see the same CPU and share a per-CPU hint, and the allocator stays correct because every
//! hint is re-checked under the cluster lock. Tests and loom models fix the hint per thread with
//! [`set_cpu_hint`].

#[cfg(not(swap_alloc_loom))]
mod imp {
    pub(crate) use std::sync::atomic::AtomicU64;

    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
    pub(crate) type RwLockReadGuard<'a, T> = parking_lot::RwLockReadGuard<'a, T>;
    pub(crate) type RwLockWriteGuard<'a, T> = parking_lot::RwLockWriteGuard<'a, T>;

    /// A mutex (`parking_lot`).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(parking_lot::Mutex::new(value))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock()
        }
    }

    /// A reader-writer lock (`parking_lot`).
    #[derive(Debug, Default)]
    pub(crate) struct RwLock<T>(parking_lot::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(parking_lot::RwLock::new(value))
        }
        pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read()
        }
        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write()
        }
    }

    std::thread_local! {
        static CPU_HINT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    }

    pub(crate) fn cpu_override() -> Option<usize> {
        CPU_HINT.with(|c| c.get())
    }

    pub(crate) fn set_cpu_override(cpu: Option<usize>) {
        CPU_HINT.with(|c| c.set(cpu));
    }

    #[cfg(not(miri))]
    pub(crate) fn getcpu() -> usize {
        // SAFETY: sched_getcpu takes no arguments and only reads the calling thread's CPU
        // (glibc serves it from rseq or the vDSO); it cannot touch our memory.
        let cpu = unsafe { libc::sched_getcpu() };
        usize::try_from(cpu).unwrap_or(0)
    }

    /// Miri does not emulate `sched_getcpu`; the hint is only a hint, so every thread says 0
    /// there (as two threads on one CPU would), which the allocator must survive anyway.
    #[cfg(miri)]
    pub(crate) fn getcpu() -> usize {
        0
    }

    pub(crate) fn online_cpus() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

#[cfg(swap_alloc_loom)]
mod imp {
    pub(crate) use loom::sync::atomic::AtomicU64;

    pub(crate) type RwLockReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
    pub(crate) type RwLockWriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

    use loom::sync::atomic::{AtomicBool, Ordering};
    use std::mem::ManuallyDrop;

    /// A mutex built from a loom atomic flag, a loom `UnsafeCell`, and a loom mutex and
    /// condition variable to sleep on.
    ///
    /// Not `loom::sync::Mutex`: loom treats a pending `try_lock` on a locked mutex as a
    /// blocked thread, so the kernel's protocol (the device-lock holder only try-locks
    /// clusters while a cluster holder waits for the device lock) reads as a deadlock there.
    /// Here `try_lock` is one compare-exchange on the flag; `lock` sleeps on the condition
    /// variable until the flag is clear (no spinning, which loom explores badly); the cell
    /// checks that accesses are serialised.
    pub(crate) struct Mutex<T> {
        locked: AtomicBool,
        sleep: loom::sync::Mutex<()>,
        wake: loom::sync::Condvar,
        data: loom::cell::UnsafeCell<T>,
    }

    // SAFETY: `data` is only reached through a guard, and a guard exists only while `locked`
    // is held by its thread (acquired with Acquire, released with Release), so accesses from
    // different threads are serialised and ordered, as in std's Mutex; that needs T: Send.
    unsafe impl<T: Send> Send for Mutex<T> {}
    // SAFETY: as above; sharing the mutex only ever hands out exclusive, serialised access.
    unsafe impl<T: Send> Sync for Mutex<T> {}

    impl<T> std::fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Mutex { .. }")
        }
    }

    /// The guard of [`Mutex`].
    pub(crate) struct MutexGuard<'a, T> {
        lock: &'a Mutex<T>,
        // INVARIANT: dropped (ending loom's tracked access) just before `lock` is released.
        ptr: ManuallyDrop<loom::cell::MutPtr<T>>,
    }

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self {
                locked: AtomicBool::new(false),
                sleep: loom::sync::Mutex::new(()),
                wake: loom::sync::Condvar::new(),
                data: loom::cell::UnsafeCell::new(value),
            }
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            loop {
                if let Some(g) = self.try_lock() {
                    return g;
                }
                let mut slept = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
                while self.locked.load(Ordering::Acquire) {
                    slept = self.wake.wait(slept).unwrap_or_else(|e| e.into_inner());
                }
            }
        }

        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.locked
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .ok()?;
            Some(MutexGuard {
                lock: self,
                ptr: ManuallyDrop::new(self.data.get_mut()),
            })
        }

        fn unlock(&self) {
            self.locked.store(false, Ordering::Release);
            let _sleepers = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
    }

    impl<T> std::ops::Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            // SAFETY: this guard holds the lock, so no other guard (and no other pointer into
            // the cell) exists until it is dropped; the reference borrows the guard.
            unsafe { &*loom::cell::MutPtr::deref(&self.ptr) }
        }
    }

    impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: as for Deref, and `&mut self` makes this the only reference.
            unsafe { loom::cell::MutPtr::deref(&self.ptr) }
        }
    }

    impl<T> Drop for MutexGuard<'_, T> {
        fn drop(&mut self) {
            // SAFETY: `ptr` is not used again: the guard is being dropped.
            unsafe { ManuallyDrop::drop(&mut self.ptr) };
            self.lock.unlock();
        }
    }

    /// A reader-writer lock (loom's).
    #[derive(Debug)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::RwLock::new(value))
        }
        pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(|e| e.into_inner())
        }
        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(|e| e.into_inner())
        }
    }

    loom::thread_local! {
        static CPU_HINT: std::cell::Cell<Option<usize>> = std::cell::Cell::new(None);
    }

    pub(crate) fn cpu_override() -> Option<usize> {
        CPU_HINT.with(|c| c.get())
    }

    pub(crate) fn set_cpu_override(cpu: Option<usize>) {
        CPU_HINT.with(|c| c.set(cpu));
    }

    /// Under loom every thread runs on "CPU 0" unless the model says otherwise.
    pub(crate) fn getcpu() -> usize {
        0
    }

    /// Loom models use two CPUs.
    pub(crate) fn online_cpus() -> usize {
        2
    }
}

pub(crate) use imp::*;

/// The number of CPUs per-CPU structures are sized for (at least 1).
pub(crate) fn nr_cpus() -> usize {
    online_cpus().max(1)
}

/// The CPU the calling thread runs on, as a hint: the thread's fixed hint if it set one with
/// [`set_cpu_hint`], else `sched_getcpu()`. Callers reduce it modulo their per-CPU array size.
/// Public so that a structure kept beside the allocator (the baselines of
/// `swap-alloc-baseline`) picks its per-CPU slot as the allocator does.
#[inline]
pub fn current_cpu() -> usize {
    cpu_override().unwrap_or_else(getcpu)
}

/// Fixes the CPU hint of the calling thread (`Some(cpu)`), or returns it to `sched_getcpu()`
/// (`None`). The allocator is correct whatever the hint; this only decides which per-CPU
/// cluster and counters the thread uses. Tests and loom models use it to pin threads to
/// "CPUs"; a daemon whose worker threads are pinned may use it to skip the system call.
pub fn set_cpu_hint(cpu: Option<usize>) {
    set_cpu_override(cpu);
}
