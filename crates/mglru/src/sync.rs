//! The one synchronisation shim of the crate: `loom` types under `cfg(mglru_loom)` (so that the
//! cfg does not flip dependencies, as `crossbeam_loom` does), `std` / `parking_lot` otherwise.
//!
//! Everything that is shared between threads goes through here, so a loom model of the crate's
//! types sees every atomic and every lock.

#[cfg(mglru_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(mglru_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

/// A reader-writer lock with the same API under loom and under `parking_lot`.
#[derive(Debug)]
pub(crate) struct RwLock<T> {
    #[cfg(mglru_loom)]
    inner: loom::sync::RwLock<T>,
    #[cfg(not(mglru_loom))]
    inner: parking_lot::RwLock<T>,
}

#[cfg(not(mglru_loom))]
pub(crate) type ReadGuard<'a, T> = parking_lot::RwLockReadGuard<'a, T>;
#[cfg(not(mglru_loom))]
pub(crate) type WriteGuard<'a, T> = parking_lot::RwLockWriteGuard<'a, T>;
#[cfg(mglru_loom)]
pub(crate) type ReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
#[cfg(mglru_loom)]
pub(crate) type WriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

impl<T> RwLock<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(mglru_loom)]
            inner: loom::sync::RwLock::new(value),
            #[cfg(not(mglru_loom))]
            inner: parking_lot::RwLock::new(value),
        }
    }

    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        #[cfg(mglru_loom)]
        {
            // A poisoned lock means another thread panicked inside the model: the model has
            // already failed, keep going with the data as it is.
            self.inner.read().unwrap_or_else(|e| e.into_inner())
        }
        #[cfg(not(mglru_loom))]
        {
            self.inner.read()
        }
    }

    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        #[cfg(mglru_loom)]
        {
            self.inner.write().unwrap_or_else(|e| e.into_inner())
        }
        #[cfg(not(mglru_loom))]
        {
            self.inner.write()
        }
    }
}
