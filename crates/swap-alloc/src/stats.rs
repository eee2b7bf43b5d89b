//! Counters and snapshots.

use crate::cluster::NR_ORDERS;

/// A device's counters, summed over CPUs (see [`SwapDevice::stats`](crate::SwapDevice::stats)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Slots on the device.
    pub nslots: u64,
    /// Slots in use.
    pub in_use: u64,
    /// Device-lock acquisitions (moving a cluster between lists, isolating one).
    pub device_lock: u64,
    /// Cluster-lock acquisitions.
    pub cluster_lock: u64,
    /// Acquisitions of the shared current-cluster lock of a rotational device.
    pub global_cluster_lock: u64,
    /// Successful allocations per order (the kernel's per-order `swpout`).
    pub swpout: [u64; NR_ORDERS],
    /// Failed allocations per order (the kernel's `swpout_fallback`).
    pub swpout_fallback: [u64; NR_ORDERS],
    /// Clusters passed through the discard hook.
    pub discarded_clusters: u64,
}

impl DeviceStats {
    /// Successful allocations of all orders.
    pub fn allocations(&self) -> u64 {
        self.swpout.iter().sum()
    }

    /// Adds another device's counters to these.
    pub fn add(&mut self, o: &DeviceStats) {
        self.nslots += o.nslots;
        self.in_use += o.in_use;
        self.device_lock += o.device_lock;
        self.cluster_lock += o.cluster_lock;
        self.global_cluster_lock += o.global_cluster_lock;
        self.discarded_clusters += o.discarded_clusters;
        for i in 0..NR_ORDERS {
            self.swpout[i] += o.swpout[i];
            self.swpout_fallback[i] += o.swpout_fallback[i];
        }
    }
}

/// How many clusters each list holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterLists {
    /// Empty clusters.
    pub free: usize,
    /// Clusters with every slot in use.
    pub full: usize,
    /// Empty clusters waiting for (or in) discard.
    pub discard: usize,
    /// Per order: clusters that had slots freed since they were last allocated from.
    pub nonfull: [usize; NR_ORDERS],
    /// Per order: partly used clusters that are current somewhere or failed an allocation.
    pub frag: [usize; NR_ORDERS],
}

/// Fragmentation of a device for one order (see
/// [`SwapDevice::fragmentation`](crate::SwapDevice::fragmentation)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragmentation {
    /// The order looked at.
    pub order: u32,
    /// Free slots on the device.
    pub free_slots: u64,
    /// Free slots in clusters that cannot serve an allocation of this order.
    pub stranded_slots: u64,
}
