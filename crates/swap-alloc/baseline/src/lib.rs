//! # swap-alloc-baseline: what `swap-alloc` is measured against
//!
//! **Test and benchmark support, not for embedding** (`publish = false`): `swap-alloc`'s own
//! tests and criterion benches take it as a dev-dependency, and the report command
//! (`benches/src/report/swap_alloc.rs`) as a dependency, so that none of it compiles into the
//! allocator. The designs the kernel replaced, written with the same slot-map conventions so
//! that a benchmark compares them with [`SwapDevice`] in one run:
//!
//! - [`GlobalLockDevice`]: one device-wide lock around a linear scan of the slot map, the
//!   design before v4.11 (2017).
//! - [`SlotCacheDevice`]: the v4.11 design (Tim Chen's swap slot cache and Huang Ying's
//!   per-cluster locks): order-0 slots come from and go back to per-CPU caches of 64 slots;
//!   refilling and flushing a cache takes the device lock once per batch.
//! - [`order_unaware`]: the cluster allocator with order ignored when choosing clusters (one
//!   current cluster and one set of lists for all orders), the comparison for order-4
//!   fallback.
//!
//! None of these keeps reference counts beyond one; they serve `alloc` and `free` only.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(unreachable_pub)]
#![deny(missing_docs)]

mod global_lock;
mod slot_cache;

pub use global_lock::GlobalLockDevice;
pub use slot_cache::{SlotCacheDevice, SLOT_CACHE_SIZE};

use swap_alloc::{DeviceConfig, SwapDevice, SwapEntry, SwapError};

/// The cluster allocator with order-aware cluster choice switched off: every order shares one
/// current cluster per CPU and one nonfull and one frag list, and a cluster serves any order.
/// (`DeviceConfig::order_aware(false)`, named here for the benchmarks' tables.)
pub fn order_unaware(config: DeviceConfig) -> Result<SwapDevice, SwapError> {
    SwapDevice::new(config.order_aware(false))
}

/// What the benchmarks drive: allocate and free runs of `2^order` slots on one device.
pub trait SlotAllocator: Send + Sync {
    /// A short name for reports.
    fn design(&self) -> &'static str;
    /// Allocates `2^order` aligned slots; `None` when there is no room.
    fn alloc_slots(&self, order: u32) -> Option<u64>;
    /// Frees an allocation made by [`alloc_slots`](Self::alloc_slots) with the same order.
    fn free_slots(&self, offset: u64, order: u32);
    /// Device-lock acquisitions so far.
    fn device_lock_acquisitions(&self) -> u64;
}

impl SlotAllocator for SwapDevice {
    fn design(&self) -> &'static str {
        "cluster"
    }
    fn alloc_slots(&self, order: u32) -> Option<u64> {
        self.alloc(order).ok().map(SwapEntry::offset)
    }
    fn free_slots(&self, offset: u64, order: u32) {
        if let Some(e) = SwapEntry::new(self.id(), offset) {
            // A benchmark frees only what it allocated; an error here is a benchmark bug,
            // which the slot map refuses without damage.
            let r = if order == 0 {
                self.put(e).map(usize::from)
            } else {
                self.put_range(e, order)
            };
            debug_assert!(r.is_ok(), "{r:?}");
        }
    }
    fn device_lock_acquisitions(&self) -> u64 {
        self.stats().device_lock
    }
}
