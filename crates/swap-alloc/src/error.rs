//! Errors. Every variant names the offending value and what is allowed.

use crate::entry::{DeviceId, SwapEntry};

/// What went wrong in a call to the allocator. A call that returns an error has changed
/// nothing (batch calls say which entries were processed before the failing one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SwapError {
    /// The order asked for is above what the device's clusters can hold.
    #[error("allocation order {order} is above the maximum order {max} of this device")]
    OrderTooLarge {
        /// The order asked for.
        order: u32,
        /// The largest order the device serves (log2 of its cluster size, at most 9).
        max: u32,
    },
    /// No free, naturally aligned run of `2^order` slots was found (the kernel's
    /// swpout_fallback: the caller splits the folio and retries at order 0).
    #[error("no free run of 2^{order} slots on the swap device(s)")]
    NoSpace {
        /// The order asked for.
        order: u32,
    },
    /// The entry is beyond the end of its device.
    #[error("{entry} is beyond the device's {nslots} slots")]
    OutOfRange {
        /// The entry given.
        entry: SwapEntry,
        /// The device's slot count.
        nslots: u64,
    },
    /// The entry names a device other than the one asked, or one that is not swapped on.
    #[error("{entry} names device {}, which is not {expected}", entry.device())]
    WrongDevice {
        /// The entry given.
        entry: SwapEntry,
        /// What was expected ("device 0", "a swapped-on device").
        expected: &'static str,
    },
    /// The slot is free: it was never allocated or was already freed.
    #[error("{entry} is free (double free, or never allocated)")]
    SlotFree {
        /// The entry given.
        entry: SwapEntry,
    },
    /// The slot is held only by the swap cache: it has no reference to drop.
    #[error("{entry} has no reference left (only its swap-cache flag is set)")]
    NoReference {
        /// The entry given.
        entry: SwapEntry,
    },
    /// The slot's reference count is at its maximum.
    #[error("{entry} already has the maximum reference count {max}")]
    CountOverflow {
        /// The entry given.
        entry: SwapEntry,
        /// The largest count a slot holds.
        max: u16,
    },
    /// The slot's has-cache flag is already set (swapcache_prepare's -EEXIST).
    #[error("{entry} is already in the swap cache")]
    CacheExists {
        /// The entry given.
        entry: SwapEntry,
    },
    /// The slot's has-cache flag is not set, so it cannot be cleared.
    #[error("{entry} is not in the swap cache")]
    NotCached {
        /// The entry given.
        entry: SwapEntry,
    },
    /// A range of `2^order` slots that does not lie within one cluster.
    #[error(
        "the 2^{order} slots from {entry} cross a cluster boundary (clusters of {cluster_slots})"
    )]
    CrossesCluster {
        /// The first entry of the range.
        entry: SwapEntry,
        /// The order of the range.
        order: u32,
        /// The device's cluster size in slots.
        cluster_slots: usize,
    },
    /// An entry of a batch failed; the entries before `index` were processed, the rest not.
    #[error("entry {index} of the batch: {source}")]
    InBatch {
        /// The position of the failing entry in the batch.
        index: usize,
        /// What was wrong with it.
        source: Box<SwapError>,
    },
    /// The device configuration is not usable.
    #[error("invalid device configuration: {reason}")]
    InvalidConfig {
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// No device with this id is swapped on.
    #[error("no swap device {device} is swapped on")]
    NoDevice {
        /// The id given.
        device: DeviceId,
    },
    /// All [`DeviceId::MAX_DEVICES`] device ids are in use.
    #[error("all {max} swap device ids are in use")]
    TooManyDevices {
        /// The number of ids.
        max: usize,
    },
    /// swapoff refused: slots on the device are still in use.
    #[error("device {device} still has {in_use} slots in use")]
    DeviceBusy {
        /// The device.
        device: DeviceId,
        /// Slots still allocated.
        in_use: u64,
    },
    /// [`check_integrity`](crate::SwapDevice::check_integrity) found an inconsistency.
    #[error("integrity check failed: {detail}")]
    Corrupt {
        /// What is inconsistent.
        detail: String,
    },
}
