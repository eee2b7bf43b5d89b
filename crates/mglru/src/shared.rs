//! [`SharedMglru`]: the LRU behind a reader-writer lock, for embedders with several threads
//! (the daemon's fault handlers count accesses while its reclaim thread evicts).
//!
//! Accesses through the descriptor path take only the read lock and update the page's flags
//! word with compare-and-swap, so any number of them run at once; adding, removing, aging and
//! eviction take the write lock (the kernel's `lru_lock`).

use crate::sync::RwLock;
use crate::{AccessSource, Config, Error, Hint, Mglru, PageId, Refault, Stats, WalkStats};

/// A [`Mglru`] shared between threads.
#[derive(Debug)]
pub struct SharedMglru {
    inner: RwLock<Mglru>,
}

impl SharedMglru {
    /// A new, empty shared LRU.
    pub fn new(cfg: Config) -> Result<Self, Error> {
        Ok(Self {
            inner: RwLock::new(Mglru::new(cfg)?),
        })
    }

    /// Counts a descriptor-path access (read lock only). False if not resident.
    pub fn mark_accessed(&self, page: PageId) -> bool {
        self.inner.read().mark_accessed(page)
    }

    /// See [`Mglru::add`].
    pub fn add(&self, page: PageId, hint: Hint) -> Result<Option<Refault>, Error> {
        self.inner.write().add(page, hint)
    }

    /// See [`Mglru::remove`].
    pub fn remove(&self, page: PageId) -> bool {
        self.inner.write().remove(page)
    }

    /// See [`Mglru::evict`]. The source is called with the write lock held.
    pub fn evict(&self, n: usize, source: &mut dyn AccessSource) -> Vec<PageId> {
        self.inner.write().evict(n, source)
    }

    /// See [`Mglru::age`].
    pub fn age(&self, source: &mut dyn AccessSource) -> WalkStats {
        self.inner.write().age(source)
    }

    /// See [`Mglru::refault`].
    pub fn refault(&self, page: PageId) -> Option<Refault> {
        self.inner.read().refault(page)
    }

    /// See [`Mglru::tier`].
    pub fn tier(&self, page: PageId) -> Option<usize> {
        self.inner.read().tier(page)
    }

    /// Resident pages.
    pub fn len(&self) -> usize {
        self.inner.read().len()
    }

    /// Whether no page is resident.
    pub fn is_empty(&self) -> bool {
        self.inner.read().is_empty()
    }

    /// See [`Mglru::stats`].
    pub fn stats(&self) -> Stats {
        self.inner.read().stats()
    }

    /// Runs `f` with shared access (for queries not wrapped here).
    pub fn with<R>(&self, f: impl FnOnce(&Mglru) -> R) -> R {
        f(&self.inner.read())
    }
}
