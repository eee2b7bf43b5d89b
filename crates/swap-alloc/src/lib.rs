//! # swap-alloc: the Linux cluster-based swap slot allocator, in userspace
//!
//! A swap device is an array of page-sized slots. Whoever pages memory out needs slots fast,
//! from many threads at once, in runs of `2^order` for large folios (mTHP), and needs a
//! reference count per slot, because a page shared by several address spaces (after
//! `fork`) is stored once. This crate is that allocator, after `mm/swapfile.c`.
//!
//! ## The kernel design it follows
//!
//! - **Clusters** (v4.11, Huang Ying; 2017): the device is split into clusters of 512 slots
//!   (configurable), each with its own lock, use count and, since v6.10, the *order* it
//!   serves. Slot maps are changed only under the cluster lock.
//! - **Lists under the device lock** (v6.14, Kairui Song's "rework of the swap allocator",
//!   2025): clusters live on `free`, `nonfull[order]`, `frag[order]`, `full` and `discard`
//!   lists. The device lock protects only these lists and is taken only to move a cluster
//!   from one to another, never for an allocation or a free that stays inside a cluster.
//! - **A current cluster per CPU and per order**: each CPU remembers the next offset to try
//!   for each order. The common allocation locks that one cluster and nothing else.
//!   Rotational devices share one current cluster under a lock so that writes stay
//!   sequential.
//! - **Order-aware cluster choice**: a cluster serves one order while it is in use, so that
//!   order-0 slots do not break up the aligned runs large folios need. When the current
//!   cluster is exhausted the allocator tries, in order: a free cluster; `nonfull[order]`; one
//!   rotation of `frag[order]`; the discard list (discarding synchronously); and, for order 0
//!   only, the frag and nonfull clusters of the other orders. A failed order > 0 allocation is
//!   a *fallback* (`swpout_fallback`): the caller splits the folio.
//! - **Reference counts** per slot (`swap_duplicate` / `swap_free` here [`SwapDevice::dup`]
//!   and [`SwapDevice::put`]) with a has-cache flag (`swapcache_prepare` / `swapcache_clear`).
//!   A slot is free only when its count is zero and the flag is clear.
//! - **Several devices** by priority ([`SwapInfo`]): round-robin among equal priorities,
//!   spill to lower ones; swapoff refuses while slots are in use.
//!
//! ## Where it differs from the kernel, and why
//!
//! - No swap-cache reclaim: the kernel may free slots held only by its own swap cache while
//!   allocating; here the cache belongs to the caller, so a slot with the has-cache flag stays
//!   allocated until the caller clears it.
//! - Counts above [`MAX_SLOT_COUNT`] are refused ([`SwapError::CountOverflow`]) instead of
//!   continued on extra pages.
//! - The per-CPU hints are atomics read without a per-CPU lock (userspace cannot disable
//!   preemption); two threads on one CPU may race for the same hint, and both re-check it
//!   under the cluster lock, so the race costs a rescan, never a double allocation.
//! - Isolating a cluster for allocation moves it straight to its frag list (where the kernel's
//!   `relocate_cluster` would put it afterwards) instead of off-list and back, and a nonfull
//!   cluster that served an allocation stays on nonfull: each saves a device-lock round trip.
//!   The cluster lock is held throughout, so no one sees the intermediate state.
//! - When every cluster on a list is locked by someone else, the kernel's isolation reports
//!   the list empty (and the allocation may fail spuriously); here it waits for the first
//!   busy one with the device lock released and re-checks it is still on the list. A loom
//!   model found the spurious failure (a concurrent [`SwapDevice::check_integrity`] holding
//!   every cluster lock made an order-0 allocation fail on a half-empty device).
//!
//! ## Invariants
//!
//! 1. A slot is handed out only when its map word is zero, under its cluster lock; so no slot
//!    is ever allocated twice, and every allocated run is naturally aligned and inside one
//!    cluster.
//! 2. A cluster's count equals the number of non-free slots in its map.
//! 3. A cluster's state matches the list it is on and its count (free and discard: empty;
//!    full: every slot used; nonfull and frag: partly used), except a discard cluster being
//!    discarded, which is on no list. States change only with both locks held; the lock order
//!    is cluster lock, then device lock (the device-lock holder only try-locks clusters).
//! 4. Errors change nothing: a bad entry, a double free or an order above the maximum is
//!    refused with an error naming it.
//!
//! [`SwapDevice::check_integrity`] checks 2 and 3 and the counters; the proptest model in
//! `tests/model.rs` checks 1 and 4 against a vector of counts, and the loom models in
//! `tests/loom_*.rs` check 1 to 3 under every interleaving of two or three threads.
//!
//! ## Example
//!
//! ```
//! use swap_alloc::{DeviceConfig, SwapDevice, SwapError};
//!
//! let dev = SwapDevice::new(DeviceConfig::new(4096))?; // 8 clusters of 512 slots
//! let folio = dev.alloc(4)?; // 16 contiguous slots, aligned to 16
//! assert_eq!(folio.offset() % 16, 0);
//! let page = dev.alloc(0)?;
//! assert_eq!(dev.dup(page)?, 2); // shared after fork
//! assert!(!dev.put(page)?); // one reference left
//! assert!(dev.put(page)?); // now free
//! assert!(matches!(dev.put(page), Err(SwapError::SlotFree { .. }))); // double free refused
//! assert_eq!(dev.put_range(folio, 4)?, 16);
//! dev.check_integrity()?;
//! # Ok::<(), SwapError>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(unreachable_pub)]
#![deny(missing_docs)]

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod cluster;
mod device;
mod entry;
mod error;
mod info;
mod stats;
mod sync;

pub use cluster::{MAX_SLOT_COUNT, NR_ORDERS};
pub use device::{
    DeviceConfig, DiscardHook, SlotState, SlotUsage, SwapDevice, DEFAULT_CLUSTER_SLOTS,
    MAX_CLUSTER_SLOTS,
};
pub use entry::{DeviceId, SwapEntry};
pub use error::SwapError;
pub use info::SwapInfo;
pub use stats::{ClusterLists, DeviceStats, Fragmentation};
pub use sync::{current_cpu, set_cpu_hint};
