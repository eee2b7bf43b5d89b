//! A registry of reclaim callbacks walked without locks.
//!
//! # Problem
//!
//! A memory manager has caches it can shrink (a compressed pool, metadata
//! caches) and one reclaim path that must find them when memory is short.
//! Callbacks come and go at any time (a cache is created, a group of clients
//! goes away) while reclaim runs on several threads. If the list of callbacks
//! is guarded by a lock, registration stalls reclaim, and reclaim that only
//! *tries* the lock (so as never to block) silently skips shrinking.
//!
//! # The kernel design followed
//!
//! Linux `mm/shrinker.c` after Qi Zheng's 2023 series "use refcount+RCU method
//! to implement lockless slab shrink":
//!
//! - each shrinker has a reference count, 1 while registered; the shrink walk
//!   reads the list under RCU, takes a reference (`shrinker_try_get`, an
//!   increment unless zero), leaves the RCU read side while the callbacks run,
//!   re-enters it and drops the reference (`shrinker_put`);
//! - unregistering drops the initial reference and waits for the count to
//!   reach zero (a `completion`), so it waits for the scans of *that* shrinker
//!   in flight and nothing else; the memory is freed after a grace period;
//! - `do_shrink_slab` turns an object count, the priority and `seeks` into
//!   work done in batches, carrying the rest over as `nr_deferred`;
//! - memcg-aware shrinkers: every group has, per shard, a bitmap of the
//!   shrinkers that may have objects there (`set_shrinker_bit`), in units of
//!   one word so that growing the arrays never copies a bit or a counter that
//!   a concurrent walker may be updating (`expand_shrinker_info`); a group
//!   going offline hands its `nr_deferred` to its parent.
//!
//! # How this differs
//!
//! - RCU is epoch-based reclamation (crossbeam-epoch). The id table replaces
//!   both the kernel's `shrinker_list` and its idr: the root walk goes over
//!   the table in id order, the group walk over the set bits.
//! - Unregistration drops the callback object itself as soon as the count
//!   reaches zero, before returning, so "never runs again" is also "is
//!   dropped"; only the bookkeeping waits for the grace period.
//! - Unregistration clears the shrinker's bits and deferred work in every
//!   group before its id can be reused (the kernel leaves stale values).
//! - `synchronize` waits for the shrinks in flight with an SRCU-like pair of
//!   counters (the kernel used `shrinker_rwsem`, then SRCU, before dropping
//!   `synchronize_shrinkers` altogether).
//! - The old design (before the series) is kept as `baseline::RwLockRegistry`
//!   for comparison, behind the non-default `baseline` feature (benchmarks
//!   and tests only).
//!
//! # Invariants
//!
//! 1. No epoch guard is held across a callback: the walk pins, takes a
//!    reference, unpins, calls, re-pins, then puts (the last put completes
//!    the unregistering thread's wait, so it must happen while the node is
//!    kept alive by a guard). One guard serves the whole walk, left and
//!    re-entered around each shrinker's callbacks (`repin_after`).
//! 2. Once a shrinker's count is 0 it never rises again; its callbacks run
//!    only while the caller holds a reference; so after
//!    [`ShrinkerHandle::unregister`] returns, they never run again.
//! 3. Writers (register, unregister, groups) serialise on one mutex that the
//!    shrink walk never takes; tables and arrays grow by publishing a copy and
//!    retiring the old one through the epoch collector.
//!
//! Loom models in `tests/loom_*.rs` check 1-2 (a callback after unregister or
//! a use after free fails the model) and the growth of a group's arrays
//! concurrent with registration, unregistration and shrinking.
//!
//! # Example
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use shrinker::{Count, Scan, ShrinkControl, ShrinkRequest, Shrinker, ShrinkerConfig, ShrinkerRegistry};
//!
//! struct Cache(Arc<AtomicU64>);
//! impl Shrinker for Cache {
//!     fn count_objects(&self, _: &ShrinkControl) -> Count {
//!         match self.0.load(Ordering::Relaxed) {
//!             0 => Count::Empty,
//!             n => Count::Objects(n),
//!         }
//!     }
//!     fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
//!         let n = sc.nr_to_scan.min(self.0.load(Ordering::Relaxed));
//!         self.0.fetch_sub(n, Ordering::Relaxed);
//!         Scan::Freed(n)
//!     }
//! }
//!
//! let objects = Arc::new(AtomicU64::new(10_000));
//! let registry = ShrinkerRegistry::default();
//! let handle = registry.register(ShrinkerConfig::new("cache"), Cache(objects.clone()))?;
//! let freed = registry.shrink(&ShrinkRequest::new(0))?; // priority 0: most aggressive
//! assert!(freed > 0);
//! assert_eq!(objects.load(Ordering::Relaxed), 10_000 - freed);
//! handle.unregister(); // waits for a scan in flight; never called again
//! # Ok::<(), shrinker::ShrinkerError>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(unreachable_pub)]
#![deny(missing_docs)]

#[cfg(any(test, feature = "baseline"))]
pub mod baseline;
mod control;

/// The README's example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
mod error;
mod group;
mod registry;
mod shrink;
mod stats;
mod sync;

pub use crate::control::{
    Count, GroupId, Scan, ShrinkControl, ShrinkRequest, Shrinker, ShrinkerConfig, ShrinkerId,
    DEFAULT_SEEKS, DEF_PRIORITY, SHRINK_BATCH,
};
pub use crate::error::ShrinkerError;
pub use crate::registry::{
    ShrinkerHandle, ShrinkerRegistry, Unregistered, MAX_GROUPS, MAX_SHRINKERS,
};
pub use crate::stats::{RegistryStats, ShrinkerStats};
