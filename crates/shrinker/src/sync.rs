//! The one synchronisation shim of the crate.
//!
//! Normal builds use `std` atomics, `std` mutexes and crossbeam-epoch. Under
//! `--cfg shrinker_loom` every primitive comes from `loom`, and the epoch
//! collector is replaced by a small model of RCU semantics (below) that loom can
//! explore: a retired object is *marked dead* when its grace period ends instead
//! of being freed, and every access through [`Rcu`] checks the mark with a loom
//! `UnsafeCell` read. An access that races with (or follows) the end of the
//! grace period is then reported by loom as a causality violation or by the
//! assertion: that is how the loom models catch a use after free.

use core::marker::PhantomData;
use core::ops::Deref;

#[cfg(not(shrinker_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicI64, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(shrinker_loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

#[cfg(shrinker_loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicI64, AtomicPtr, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(shrinker_loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

/// Bits per group-bitmap unit (the kernel's `SHRINKER_UNIT_BITS`, one `long`).
/// Fixed small under loom so that a model can grow a group's arrays with a
/// handful of registrations.
#[cfg(not(shrinker_loom))]
pub(crate) const UNIT_BITS: usize = 64;
#[cfg(shrinker_loom)]
pub(crate) const UNIT_BITS: usize = 2;

/// First capacity of the shrinker id table (it grows by copy).
#[cfg(not(shrinker_loom))]
pub(crate) const INITIAL_TABLE: usize = 64;
#[cfg(shrinker_loom)]
pub(crate) const INITIAL_TABLE: usize = 1;

/// Locks a mutex; a poisoned lock (a panic while it was held) is taken over,
/// because every structure it protects is left consistent between statements.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits on a condition variable, taking over a poisoned lock as [`lock`] does.
pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard)
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Gives the processor away inside a wait loop.
pub(crate) fn yield_now() {
    #[cfg(not(shrinker_loom))]
    std::thread::yield_now();
    #[cfg(shrinker_loom)]
    loom::thread::yield_now();
}

/// An `UnsafeCell` with loom's closure API, so that loom can track accesses.
#[cfg(not(shrinker_loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(shrinker_loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(shrinker_loom)]
pub(crate) use loom::cell::UnsafeCell;

/// Use-after-free detector: a no-op in normal builds, a tracked cell under loom.
#[derive(Debug)]
pub(crate) struct Liveness {
    #[cfg(shrinker_loom)]
    alive: loom::cell::UnsafeCell<bool>,
}

impl Liveness {
    fn new() -> Self {
        Self {
            #[cfg(shrinker_loom)]
            alive: loom::cell::UnsafeCell::new(true),
        }
    }

    #[inline]
    fn check(&self) {
        #[cfg(shrinker_loom)]
        self.alive.with(|p| {
            // SAFETY: `p` points into this `Liveness`, whose memory is never
            // freed under loom; loom checks that this read is ordered with the
            // write in `kill`.
            let alive = unsafe { *p };
            assert!(
                alive,
                "use after free: object accessed after its grace period"
            );
        });
    }

    #[cfg(shrinker_loom)]
    fn kill(&self) {
        self.alive.with_mut(|p| {
            // SAFETY: loom checks that no access to this cell is concurrent with
            // this write; the memory itself is never freed under loom.
            unsafe { *p = false };
        });
    }
}

/// An object reachable by lock-free readers and reclaimed through the epoch
/// collector. Every access goes through `Deref`, which under loom checks that
/// the object's grace period has not ended.
#[derive(Debug)]
pub(crate) struct Rcu<T> {
    value: T,
    live: Liveness,
}

impl<T> Rcu<T> {
    /// Allocates `value` on the heap and returns the raw pointer that readers
    /// load; ownership passes to whoever publishes and later retires it.
    pub(crate) fn into_raw(value: T) -> *mut Rcu<T> {
        Box::into_raw(Box::new(Rcu {
            value,
            live: Liveness::new(),
        }))
    }

    /// Frees an object that no reader can reach any more, at once.
    ///
    /// # Safety
    /// `ptr` came from [`Rcu::into_raw`], has not been freed or retired, and no
    /// other thread can access it (for example, in the registry's `Drop`).
    pub(crate) unsafe fn free_now(ptr: *mut Rcu<T>) {
        // SAFETY: the caller guarantees exclusive ownership of a live box.
        drop(unsafe { Box::from_raw(ptr) });
    }
}

impl<T> Deref for Rcu<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        self.live.check();
        &self.value
    }
}

/// A per-registry epoch domain. In normal builds it is the global
/// crossbeam-epoch collector; under loom, a model (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Epoch {
    #[cfg(shrinker_loom)]
    model: Mutex<ModelState>,
}

#[cfg(shrinker_loom)]
#[derive(Debug, Default)]
struct ModelState {
    active: usize,
    retired: Vec<RetiredPtr>,
}

/// A retired pointer queued in the loom model.
#[cfg(shrinker_loom)]
#[derive(Debug)]
struct RetiredPtr(*const Liveness);

// SAFETY: the pointer is only dereferenced to mark the object dead, which is a
// loom-tracked cell write; the memory is leaked, never freed, under loom.
#[cfg(shrinker_loom)]
unsafe impl Send for RetiredPtr {}

/// While a `Guard` lives, no object retired after the guard was taken is
/// reclaimed. Never hold one across a call into user code.
#[derive(Debug)]
pub(crate) struct Guard<'e> {
    #[cfg(not(shrinker_loom))]
    inner: crossbeam_epoch::Guard,
    #[cfg(shrinker_loom)]
    epoch: &'e Epoch,
    _epoch: PhantomData<&'e Epoch>,
}

impl Epoch {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Enters a read-side critical section.
    pub(crate) fn pin(&self) -> Guard<'_> {
        #[cfg(shrinker_loom)]
        {
            lock(&self.model).active += 1;
            Guard {
                epoch: self,
                _epoch: PhantomData,
            }
        }
        #[cfg(not(shrinker_loom))]
        {
            Guard {
                inner: crossbeam_epoch::pin(),
                _epoch: PhantomData,
            }
        }
    }
}

impl Guard<'_> {
    /// Loads `ptr` and borrows the object for as long as this guard lives.
    ///
    /// # Safety
    /// Every non-null value ever stored in `ptr` came from [`Rcu::into_raw`] and
    /// is retired (never freed directly) only after being unlinked from `ptr`.
    #[inline]
    pub(crate) unsafe fn load<'g, T>(&'g self, ptr: &AtomicPtr<Rcu<T>>) -> Option<&'g Rcu<T>> {
        let p = ptr.load(Ordering::Acquire);
        // SAFETY: per the contract, a non-null pointer loaded under this guard
        // is not reclaimed before the guard ends, and Acquire pairs with the
        // Release store that published the initialised object.
        unsafe { p.as_ref() }
    }

    /// Schedules `ptr` to be freed after every guard that might see it ends.
    ///
    /// # Safety
    /// `ptr` came from [`Rcu::into_raw`], is unreachable for new readers (unlinked
    /// before this call), and is retired exactly once.
    pub(crate) unsafe fn retire<T: Send + 'static>(&self, ptr: *mut Rcu<T>) {
        #[cfg(not(shrinker_loom))]
        {
            // The closure keeps the pointer itself, not its address: rebuilding a
            // pointer from an integer would lose its provenance (miri's strict
            // provenance check), and `defer_unchecked` asks for no `Send` anyway.
            // SAFETY: the object is unreachable for new readers and retired once;
            // crossbeam runs the closure after every current guard has ended, so
            // the box is freed exactly once and after its last reader. `T: Send`
            // makes dropping it on another thread sound.
            unsafe {
                self.inner.defer_unchecked(move || drop(Box::from_raw(ptr)));
            }
        }
        #[cfg(shrinker_loom)]
        {
            // SAFETY: `ptr` is a live `Rcu<T>` (the caller's contract); under loom
            // it is never freed, only marked dead once its grace period ends.
            let live = unsafe { &raw const (*ptr).live };
            lock(&self.epoch.model).retired.push(RetiredPtr(live));
        }
    }

    /// Leaves the read-side critical section while `f` runs and enters it
    /// again afterwards (also when `f` unwinds): crossbeam's
    /// `Guard::repin_after`. Objects loaded under this guard before the call
    /// may be reclaimed while `f` runs, so they must not be used afterwards
    /// unless something else (a reference count) kept them alive. One pin per
    /// walk then serves every shrinker: no thread-local lookup and no new
    /// `Guard` per callback. If the thread holds another guard, it stays
    /// pinned throughout, as with dropping and re-taking a nested guard.
    #[inline]
    pub(crate) fn repin_after<R>(&mut self, f: impl FnOnce() -> R) -> R {
        #[cfg(not(shrinker_loom))]
        {
            self.inner.repin_after(f)
        }
        #[cfg(shrinker_loom)]
        {
            /// Re-enters the model's read side when dropped (also on unwind).
            struct Repin<'a>(&'a Epoch);
            impl Drop for Repin<'_> {
                fn drop(&mut self) {
                    lock(&self.0.model).active += 1;
                }
            }
            self.epoch.unpin();
            let _repin = Repin(self.epoch);
            f()
        }
    }

    /// Asks the collector to make progress on retired objects.
    pub(crate) fn flush(&self) {
        #[cfg(not(shrinker_loom))]
        self.inner.flush();
    }
}

#[cfg(shrinker_loom)]
impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.epoch.unpin();
    }
}

#[cfg(shrinker_loom)]
impl Epoch {
    /// Leaves the model's read side; the last reader out ends the grace
    /// period of everything retired so far.
    fn unpin(&self) {
        let dead = {
            let mut m = lock(&self.model);
            m.active -= 1;
            if m.active == 0 {
                core::mem::take(&mut m.retired)
            } else {
                Vec::new()
            }
        };
        for r in dead {
            // SAFETY: retired objects are leaked under loom, so the pointer is
            // valid; marking it dead is the model of freeing it.
            unsafe { (*r.0).kill() };
        }
    }
}

/// A one-shot event (the kernel's `struct completion`).
#[derive(Debug)]
pub(crate) struct Completion {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Completion {
    pub(crate) fn new() -> Self {
        Self {
            done: Mutex::new(false),
            cv: Condvar::new(),
        }
    }

    pub(crate) fn complete(&self) {
        let mut done = lock(&self.done);
        *done = true;
        self.cv.notify_all();
    }

    pub(crate) fn wait(&self) {
        let mut done = lock(&self.done);
        while !*done {
            done = wait(&self.cv, done);
        }
    }
}
