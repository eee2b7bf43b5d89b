//! One swap device: the cluster allocator of `mm/swapfile.c` (v6.14 design).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64 as StatU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use crate::cluster::{
    ClusterInner, ClusterSlot, ClusterState, ListId, Lists, SlotMap, MAX_SLOT_COUNT, NR_ORDERS,
    SLOT_BAD, SLOT_COUNT_MASK, SLOT_FREE, SLOT_HAS_CACHE,
};
use crate::entry::{DeviceId, SwapEntry};
use crate::error::SwapError;
use crate::stats::{ClusterLists, DeviceStats, Fragmentation};
use std::sync::Arc;

use crate::sync::{self, AtomicU64, Mutex, MutexGuard};

/// The default cluster size in slots (the kernel's `SWAPFILE_CLUSTER`: 2 MiB of 4 KiB pages).
pub const DEFAULT_CLUSTER_SLOTS: usize = 512;

/// The largest cluster size accepted.
pub const MAX_CLUSTER_SLOTS: usize = 1 << 15;

/// A "no hint" value for the per-CPU next offsets (the kernel's `SWAP_NEXT_INVALID`).
const NO_HINT: u64 = u64::MAX;

/// Discards free clusters for the backend (a file punches a hole, a block device issues
/// `BLKDISCARD`, pmem may zero or ignore). Called with no lock held, from
/// [`SwapDevice::run_discards`] or from an allocation that ran out of free clusters.
pub trait DiscardHook: Send + Sync {
    /// Slots `first .. first + nr` of `device` are free and may be discarded. They are not
    /// allocated again before this returns.
    fn discard(&self, device: DeviceId, first: u64, nr: u64);
}

/// How an allocation marks its slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SlotUsage {
    /// One reference (count 1): what a backend that stores the page at once wants.
    #[default]
    Referenced,
    /// Only the has-cache flag, count 0 (the kernel's `folio_alloc_swap`: the page is in the
    /// swap cache until [`SwapDevice::swapcache_clear`], references come from
    /// [`SwapDevice::dup`]).
    Cached,
}

impl SlotUsage {
    fn map_value(self) -> u16 {
        match self {
            SlotUsage::Referenced => 1,
            SlotUsage::Cached => SLOT_HAS_CACHE,
        }
    }
}

/// A slot's state as seen by [`SwapDevice::slot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotState {
    /// References (`dup` adds one, `put` drops one).
    pub count: u16,
    /// The has-cache flag.
    pub has_cache: bool,
}

impl SlotState {
    /// Whether the slot is free (no reference and no cache flag).
    pub fn is_free(self) -> bool {
        self.count == 0 && !self.has_cache
    }
}

/// The shape of a device.
#[derive(Clone)]
pub struct DeviceConfig {
    /// Slots on the device.
    pub nslots: u64,
    /// Slots per cluster: a power of two from 2 to 32768 (default 512).
    pub cluster_slots: usize,
    /// A rotational device (spinning disk): one current cluster shared by all CPUs, under a
    /// lock, so that its layout stays sequential (the kernel's `global_cluster`).
    pub rotational: bool,
    /// Discard hook; with one, emptied clusters go to the discard list first.
    pub discard: Option<Arc<dyn DiscardHook>>,
    /// Size of the per-CPU arrays (default: the number of online CPUs; rounded up to a power
    /// of two).
    pub nr_cpus: Option<usize>,
    /// Prefer partly used clusters over free ones (the kernel's order since 6.18 for devices
    /// without discard), taking a partly used cluster only once at least this many of its slots
    /// are free. `None` (the default): free clusters first, as before 6.18. See
    /// [`DeviceConfig::nonfull_first`].
    pub nonfull_first: Option<usize>,
    /// Order-aware cluster choice (default `true`); see [`DeviceConfig::order_aware`].
    pub(crate) order_aware: bool,
}

impl fmt::Debug for DeviceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceConfig")
            .field("nslots", &self.nslots)
            .field("cluster_slots", &self.cluster_slots)
            .field("rotational", &self.rotational)
            .field("discard", &self.discard.is_some())
            .field("nr_cpus", &self.nr_cpus)
            .field("nonfull_first", &self.nonfull_first)
            .field("order_aware", &self.order_aware)
            .finish()
    }
}

impl DeviceConfig {
    /// A non-rotational device of `nslots` slots, clusters of 512, no discard.
    pub fn new(nslots: u64) -> Self {
        Self {
            nslots,
            cluster_slots: DEFAULT_CLUSTER_SLOTS,
            rotational: false,
            discard: None,
            nr_cpus: None,
            nonfull_first: None,
            order_aware: true,
        }
    }

    /// Sets the cluster size.
    pub fn cluster_slots(mut self, slots: usize) -> Self {
        self.cluster_slots = slots;
        self
    }

    /// Marks the device rotational.
    pub fn rotational(mut self, yes: bool) -> Self {
        self.rotational = yes;
        self
    }

    /// Sets the discard hook.
    pub fn discard(mut self, hook: Arc<dyn DiscardHook>) -> Self {
        self.discard = Some(hook);
        self
    }

    /// Sets the size of the per-CPU arrays.
    pub fn nr_cpus(mut self, n: usize) -> Self {
        self.nr_cpus = Some(n);
        self
    }

    /// Refill partly used clusters before taking free ones, so that the slots in use stay
    /// packed into few clusters (what an index keyed by slot, such as zswap's, pays for in
    /// holes). The kernel has done this since 6.18 for devices without discard, moving a
    /// cluster to its nonfull list on the first slot freed; here a cluster goes there only once
    /// `min_free` of its slots are free (1 is the kernel's rule), and until then waits on the
    /// frag list, which allocation only walks when nothing else is left. With a `min_free` of a
    /// few dozen, each list visit yields that many slots, where the kernel's rule can cost a
    /// device-lock round trip per slot when frees trickle in one at a time.
    pub fn nonfull_first(mut self, min_free: usize) -> Self {
        self.nonfull_first = Some(min_free);
        self
    }

    /// Order-aware cluster choice (the default, `true`, as since v6.10). `false` gives the
    /// choice before it: every order shares one current cluster per CPU and one nonfull and one
    /// frag list, and a cluster serves any order. Only for comparison (the order-4 fallback
    /// figures in the README, `swap-alloc-baseline`'s `order_unaware`) and the model tests,
    /// which check both; large folios fall back far more often without it.
    pub fn order_aware(mut self, order_aware: bool) -> Self {
        self.order_aware = order_aware;
        self
    }
}

/// Per-CPU statistics; plain std atomics bumped with `Relaxed`. Lock acquisitions are
/// counted under the lock they count, in the cluster and in the lists; successful allocations
/// here, one uncontended `Relaxed` add on this CPU's line per allocation, so that the
/// per-cluster state, kept for every cluster of the device, stays within one cache line.
#[derive(Debug, Default)]
struct CpuStats {
    global_cluster_lock: StatU64,
    /// Successful allocations per order (per CPU, not per cluster: the cluster array is kept
    /// for every cluster of the device and stays small).
    swpout: [StatU64; NR_ORDERS],
    swpout_fallback: [StatU64; NR_ORDERS],
    discards: StatU64,
}

fn bump(c: &StatU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// What each CPU owns: its current cluster per order (as the next offset to try) and its
/// statistics.
#[derive(Debug)]
struct PerCpu {
    next: [AtomicU64; NR_ORDERS],
    stats: CpuStats,
}

/// Where the "next offset" hints live for this allocation: per CPU, or the device-wide
/// current cluster of a rotational device under its lock.
enum Hints<'a> {
    PerCpu(&'a [AtomicU64; NR_ORDERS]),
    Global(MutexGuard<'a, [u64; NR_ORDERS]>),
}

impl Hints<'_> {
    fn get(&self, class: usize) -> u64 {
        match self {
            Hints::PerCpu(h) => h[class].load(Ordering::Relaxed),
            Hints::Global(g) => g[class],
        }
    }
    fn set(&mut self, class: usize, v: u64) {
        match self {
            Hints::PerCpu(h) => h[class].store(v, Ordering::Relaxed),
            Hints::Global(g) => g[class] = v,
        }
    }
}

/// A swap device: `nslots` slots in clusters, with per-slot reference counts.
///
/// All methods take `&self` and may be called from any number of threads.
pub struct SwapDevice {
    id: DeviceId,
    nslots: u64,
    cluster_shift: u32,
    cluster_slots: usize,
    max_order: u32,
    rotational: bool,
    order_aware: bool,
    /// `DeviceConfig::nonfull_first`, 0 when off (then a cluster goes to its nonfull list on
    /// its first free slot, as in the kernel).
    nonfull_min_free: u32,
    discard: Option<Arc<dyn DiscardHook>>,
    /// Slots of the last cluster beyond `nslots` (marked `SLOT_BAD`).
    bad_slots: u64,
    // INVARIANT: a cluster's `state` changes only with its own lock and `lists` both held;
    // lock order is cluster lock, then device lock; the device-lock holder only `try_lock`s
    // cluster locks.
    clusters: Box<[ClusterSlot]>,
    /// The device lock (`si->lock`), guarding only the lists.
    lists: CachePadded<Mutex<Lists>>,
    /// Lengths of the frag lists, kept under the device lock, read without it as a loop bound
    /// (the kernel's `frag_cluster_nr`). On a cache line of its own: it is written on list
    /// moves, and sharing a line with the read-mostly fields above would make every move on
    /// one CPU a cache miss for every allocation on the others.
    frag_nr: CachePadded<[AtomicUsize; NR_ORDERS]>,
    percpu: Box<[CachePadded<PerCpu>]>,
    /// The shared current cluster of a rotational device (`global_cluster` and its lock).
    global: Mutex<[u64; NR_ORDERS]>,
    /// Cleared by [`SwapInfo`](crate::SwapInfo) while a device is being drained for swapoff.
    pub(crate) allocatable: AtomicBool,
}

impl fmt::Debug for SwapDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SwapDevice")
            .field("id", &self.id)
            .field("nslots", &self.nslots)
            .field("cluster_slots", &self.cluster_slots)
            .field("rotational", &self.rotational)
            .field("order_aware", &self.order_aware)
            .finish_non_exhaustive()
    }
}

impl SwapDevice {
    /// A device with id 0 (entries it hands out name device 0).
    pub fn new(config: DeviceConfig) -> Result<Self, SwapError> {
        Self::with_id(DeviceId::default(), config)
    }

    /// A device whose entries name `id`.
    pub fn with_id(id: DeviceId, config: DeviceConfig) -> Result<Self, SwapError> {
        let cs = config.cluster_slots;
        if !cs.is_power_of_two() || !(2..=MAX_CLUSTER_SLOTS).contains(&cs) {
            return Err(SwapError::InvalidConfig {
                reason: format!(
                    "cluster_slots is {cs}; it must be a power of two from 2 to {MAX_CLUSTER_SLOTS}"
                ),
            });
        }
        if let Some(n) = config.nonfull_first {
            if !(1..=cs).contains(&n) {
                return Err(SwapError::InvalidConfig {
                    reason: format!(
                        "nonfull_first is {n}; it must be from 1 to the cluster size {cs}"
                    ),
                });
            }
        }
        if config.nslots == 0 || config.nslots > SwapEntry::MAX_OFFSET {
            return Err(SwapError::InvalidConfig {
                reason: format!(
                    "nslots is {}; it must be from 1 to {}",
                    config.nslots,
                    SwapEntry::MAX_OFFSET
                ),
            });
        }
        let cluster_shift = cs.trailing_zeros();
        let nclusters_u64 = config.nslots.div_ceil(cs as u64);
        let nclusters = usize::try_from(nclusters_u64)
            .ok()
            .filter(|&n| n < u32::MAX as usize)
            .ok_or_else(|| SwapError::InvalidConfig {
                reason: format!("{nclusters_u64} clusters is too many for this machine"),
            })?;
        let max_order = cluster_shift.min(NR_ORDERS as u32 - 1);
        let bad_slots = nclusters_u64 * cs as u64 - config.nslots;

        let mut lists = Lists::new(nclusters);
        let mut clusters = Vec::with_capacity(nclusters);
        for idx in 0..nclusters {
            let mut map = SlotMap::new(cs);
            let mut count = 0u32;
            if idx == nclusters - 1 && bad_slots > 0 {
                let valid = cs - bad_slots as usize;
                map[valid..].fill(SLOT_BAD);
                count = bad_slots as u32;
            }
            let state = if count == 0 {
                lists.push_back(ListId::Free, idx);
                ClusterState::Free
            } else {
                // The kernel also puts partly used clusters on nonfull[0] at swapon.
                lists.push_back(ListId::Nonfull(0), idx);
                ClusterState::Nonfull
            };
            clusters.push(ClusterSlot(Mutex::new(ClusterInner {
                count,
                order: 0,
                state,
                map,
                lock_count: 0,
            })));
        }
        // A power of two, so that picking this CPU's slot is a mask, not a division.
        let ncpu = config
            .nr_cpus
            .unwrap_or_else(sync::nr_cpus)
            .clamp(1, 1 << 16)
            .next_power_of_two();
        let percpu = (0..ncpu)
            .map(|_| {
                CachePadded::new(PerCpu {
                    next: std::array::from_fn(|_| AtomicU64::new(NO_HINT)),
                    stats: CpuStats::default(),
                })
            })
            .collect();
        Ok(Self {
            id,
            nslots: config.nslots,
            cluster_shift,
            cluster_slots: cs,
            max_order,
            rotational: config.rotational,
            order_aware: config.order_aware,
            nonfull_min_free: config.nonfull_first.map_or(0, |n| n as u32),
            discard: config.discard,
            bad_slots,
            clusters: clusters.into_boxed_slice(),
            lists: CachePadded::new(Mutex::new(lists)),
            frag_nr: CachePadded::new(std::array::from_fn(|_| AtomicUsize::new(0))),
            percpu,
            global: Mutex::new([NO_HINT; NR_ORDERS]),
            allocatable: AtomicBool::new(true),
        })
    }

    /// The device's id (the device part of its entries).
    pub fn id(&self) -> DeviceId {
        self.id
    }

    /// Slots on the device.
    pub fn nslots(&self) -> u64 {
        self.nslots
    }

    /// Slots per cluster.
    pub fn cluster_slots(&self) -> usize {
        self.cluster_slots
    }

    /// The number of clusters.
    pub fn nclusters(&self) -> usize {
        self.clusters.len()
    }

    /// The largest order [`alloc`](Self::alloc) accepts: log2 of the cluster size, at most 9.
    pub fn max_order(&self) -> u32 {
        self.max_order
    }

    /// Whether the device keeps one shared current cluster (rotational).
    pub fn is_rotational(&self) -> bool {
        self.rotational
    }

    // ---------------------------------------------------------------- helpers

    fn cpu(&self) -> &PerCpu {
        // INVARIANT: `percpu.len()` is a power of two.
        &self.percpu[sync::current_cpu() & (self.percpu.len() - 1)]
    }

    /// The list class of an order: the order itself, or 0 for the order-unaware baseline.
    fn class(&self, order: usize) -> usize {
        if self.order_aware {
            order
        } else {
            0
        }
    }

    fn check_order(&self, order: u32) -> Result<(), SwapError> {
        if order > self.max_order {
            return Err(SwapError::OrderTooLarge {
                order,
                max: self.max_order,
            });
        }
        Ok(())
    }

    /// The cluster index and slot-in-cluster of `entry`, after checking it names this device
    /// and a real slot.
    fn locate(&self, entry: SwapEntry) -> Result<(usize, usize), SwapError> {
        if entry.device() != self.id {
            return Err(SwapError::WrongDevice {
                entry,
                expected: "this device",
            });
        }
        if entry.offset() >= self.nslots {
            return Err(SwapError::OutOfRange {
                entry,
                nslots: self.nslots,
            });
        }
        let off = entry.offset();
        Ok((
            (off >> self.cluster_shift) as usize,
            (off as usize) & (self.cluster_slots - 1),
        ))
    }

    fn lock_cluster(&self, idx: usize) -> MutexGuard<'_, ClusterInner> {
        let mut ci = self.clusters[idx].lock();
        ci.lock_count += 1;
        ci
    }

    fn lock_lists(&self) -> MutexGuard<'_, Lists> {
        let mut lists = self.lists.lock();
        lists.lock_count += 1;
        lists
    }

    fn sync_frag_nr(&self, lists: &Lists, class: usize) {
        let n = lists.len(ListId::Frag(class));
        // Written only under the device lock, so the load sees the last store; skipping an
        // unchanged value keeps the line clean in the other CPUs' caches.
        if self.frag_nr[class].load(Ordering::Relaxed) != n {
            self.frag_nr[class].store(n, Ordering::Relaxed);
        }
    }

    /// Moves a locked cluster to the list of `state` (the kernel's `move_cluster`).
    #[cold]
    #[inline(never)]
    fn move_cluster(&self, idx: usize, ci: &mut ClusterInner, state: ClusterState) {
        let class = self.class(usize::from(ci.order));
        let mut lists = self.lock_lists();
        let old = lists.list_of(idx);
        lists.move_to(ListId::for_state(state, class), idx);
        ci.state = state;
        if let Some(old) = old {
            if old >= ListId::Frag(0).index() {
                self.sync_frag_nr(&lists, old - ListId::Frag(0).index());
            }
        }
        if state == ClusterState::Frag {
            self.sync_frag_nr(&lists, class);
        }
    }

    /// An emptied cluster goes to the discard list (with a hook) or the free list.
    fn free_cluster(&self, idx: usize, ci: &mut ClusterInner) {
        debug_assert_eq!(ci.count, 0);
        let to = if self.discard.is_some() {
            ClusterState::Discard
        } else {
            ClusterState::Free
        };
        self.move_cluster(idx, ci, to);
    }

    /// After an allocation attempt: put the cluster on the list its new count calls for (the
    /// kernel's `relocate_cluster`). Differs in one point: without `nonfull_first`, a cluster
    /// on `nonfull` that just served an allocation stays there (the kernel moves it to `frag`),
    /// which saves a device lock round trip whenever a free lands in a CPU's current cluster.
    fn relocate(&self, idx: usize, ci: &mut ClusterInner, found: bool) {
        if ci.state == ClusterState::Discard {
            return;
        }
        let count = ci.count as usize;
        if count == 0 {
            if ci.state != ClusterState::Free {
                self.free_cluster(idx, ci);
            }
        } else if count < self.cluster_slots {
            // With `nonfull_first`, a cluster that serves allocations leaves the nonfull list
            // once fewer than half the threshold of its slots are free (and `slots_freed`
            // puts it back at the full threshold): the gap keeps a cluster whose frees and
            // allocations alternate from moving between lists on every operation.
            let free = self.cluster_slots - count;
            let keep = ci.state == ClusterState::Frag
                || (found
                    && ci.state == ClusterState::Nonfull
                    && free >= self.nonfull_min_free as usize / 2);
            if !keep {
                self.move_cluster(idx, ci, ClusterState::Frag);
            }
        } else if ci.state != ClusterState::Full {
            self.move_cluster(idx, ci, ClusterState::Full);
        }
    }

    /// Whether an allocation of `order` may use this cluster (the kernel's
    /// `cluster_is_usable`): not full or being discarded, and empty or of the same order.
    fn usable(&self, ci: &ClusterInner, order: u32) -> bool {
        match ci.state {
            ClusterState::Full | ClusterState::Discard => false,
            _ => !self.order_aware || order == 0 || ci.count == 0 || u32::from(ci.order) == order,
        }
    }

    /// Takes the first cluster of `list` that is not locked by someone else, locked, and moves
    /// it to the tail of its frag list, where [`relocate`](Self::relocate) would leave it if
    /// the allocation fails or leaves it partly used (the kernel's `isolate_lock_cluster`,
    /// which takes it off every list and puts it back afterwards: one device-lock round trip
    /// fewer per cluster here). The cluster lock is held until the allocation is done, so no
    /// one sees the intermediate list.
    ///
    /// The device-lock holder may only try-lock clusters. Where the kernel gives up when every
    /// cluster on the list is contended, this waits for the first contended one with the
    /// device lock released, then re-checks that it is still on the list: a list whose
    /// clusters are all busy for a moment is not reported as empty.
    ///
    /// With `unowned: Some(class)` (`nonfull_first`'s first pass) it skips the clusters that a
    /// CPU has as its current cluster of `class`, and waits for none: a partly used cluster
    /// stays on its nonfull list while it serves its CPU (see `relocate`), and taking it from
    /// under that CPU would put two CPUs on one cluster lock; with nothing to take, the caller
    /// goes on to the free list.
    fn isolate(
        &self,
        list: ListId,
        order: u32,
        unowned: Option<usize>,
    ) -> Option<(usize, MutexGuard<'_, ClusterInner>)> {
        let owned = |idx: usize| {
            unowned.is_some_and(|class| {
                self.percpu.iter().any(|pc| {
                    let h = pc.next[class].load(Ordering::Relaxed);
                    h != NO_HINT && (h >> self.cluster_shift) as usize == idx
                })
            })
        };
        for _ in 0..4 {
            let contended = {
                let mut lists = self.lock_lists();
                let mut cur = lists.first(list);
                let mut contended = None;
                while let Some(idx) = cur {
                    if !owned(idx) {
                        if let Some(mut ci) = self.clusters[idx].try_lock() {
                            ci.lock_count += 1;
                            self.take_for_alloc(&mut lists, idx, &mut ci, order);
                            return Some((idx, ci));
                        }
                        contended.get_or_insert(idx);
                    }
                    cur = lists.next(idx);
                }
                if unowned.is_some() {
                    return None;
                }
                contended?
            };
            // Lock order: cluster, then device.
            let mut ci = self.lock_cluster(contended);
            let mut lists = self.lock_lists();
            if lists.list_of(contended) == Some(list.index()) {
                self.take_for_alloc(&mut lists, contended, &mut ci, order);
                drop(lists);
                return Some((contended, ci));
            }
        }
        None
    }

    /// The list move of [`isolate`](Self::isolate), with both locks held.
    fn take_for_alloc(&self, lists: &mut Lists, idx: usize, ci: &mut ClusterInner, order: u32) {
        let order_after = if ci.count == 0 { order as u8 } else { ci.order };
        let class = self.class(usize::from(order_after));
        let old = lists.list_of(idx);
        lists.move_to(ListId::Frag(class), idx);
        if ci.count == 0 {
            ci.order = order_after;
        }
        ci.state = ClusterState::Frag;
        if let Some(old) = old {
            if old >= ListId::Frag(0).index() {
                self.sync_frag_nr(lists, old - ListId::Frag(0).index());
            }
        }
        self.sync_frag_nr(lists, class);
    }

    /// Scans a locked cluster from slot `start` for a free, naturally aligned run of
    /// `2^order` slots, allocates the first one found, relocates the cluster, and returns the
    /// offset found and the next offset to try (the kernel's `alloc_swap_scan_cluster`).
    fn scan_cluster(
        &self,
        idx: usize,
        ci: &mut ClusterInner,
        start: usize,
        order: u32,
        usage: u16,
    ) -> (Option<u64>, u64) {
        let nr = 1usize << order;
        let cs = self.cluster_slots;
        let base = (idx as u64) << self.cluster_shift;
        let mut found = None;
        let mut next = NO_HINT;
        if order == 0 && (ci.count as usize) < cs {
            // Order 0: the first free slot from `start`.
            if let Some(pos) = ci.map[start.min(cs)..].iter().position(|&v| v == SLOT_FREE) {
                let off = start + pos;
                ci.map[off] = usage;
                if ci.count == 0 {
                    ci.order = 0;
                }
                ci.count += 1;
                found = Some(base + off as u64);
                if (ci.count as usize) < cs && off + 1 < cs {
                    next = base + off as u64 + 1;
                }
            }
        } else if order > 0 && ci.count as usize + nr <= cs {
            let first = (start + nr - 1) & !(nr - 1);
            if let Some(off) = take_run(&mut ci.map, first, order, usage) {
                if ci.count == 0 {
                    ci.order = order as u8;
                }
                ci.count += nr as u32;
                found = Some(base + off as u64);
                let after = off + nr;
                if (ci.count as usize) < cs && after + nr <= cs {
                    next = base + after as u64;
                }
            }
        }
        if ci.count == 0 {
            // Scanned (and so allocated) but still unused.
            ci.map.release();
        }
        self.relocate(idx, ci, found.is_some());
        (found, next)
    }

    /// Isolates a cluster from `list`, scans it from its start, records the next hint.
    /// `None` if the list had no cluster to take; `Some(found)` otherwise.
    fn try_list(
        &self,
        list: ListId,
        order: u32,
        usage: u16,
        class: usize,
        hints: &mut Hints<'_>,
        unowned: bool,
    ) -> Option<Option<u64>> {
        let (idx, mut ci) = self.isolate(list, order, unowned.then_some(class))?;
        let (found, next) = self.scan_cluster(idx, &mut ci, 0, order, usage);
        drop(ci);
        hints.set(class, next);
        Some(found)
    }

    /// [`alloc_slots_uncounted`](Self::alloc_slots_uncounted), counting a success in this
    /// CPU's `swpout`.
    fn alloc_slots(&self, order: u32, usage: u16, pc: &PerCpu) -> Option<u64> {
        let found = self.alloc_slots_uncounted(order, usage, pc);
        if found.is_some() {
            bump(&pc.stats.swpout[order as usize], 1);
        }
        found
    }

    /// The allocator proper (the kernel's `cluster_alloc_swap_entry`).
    #[inline(always)]
    fn alloc_slots_uncounted(&self, order: u32, usage: u16, pc: &PerCpu) -> Option<u64> {
        let st = &pc.stats;
        let class = self.class(order as usize);
        let mut hints = if self.rotational {
            bump(&st.global_cluster_lock, 1);
            Hints::Global(self.global.lock())
        } else {
            Hints::PerCpu(&pc.next)
        };

        // Fast path: this CPU's current cluster for this order.
        let hint = hints.get(class);
        if hint != NO_HINT {
            let idx = (hint >> self.cluster_shift) as usize;
            if idx < self.clusters.len() {
                let mut ci = self.lock_cluster(idx);
                if self.usable(&ci, order) {
                    let start = if ci.count == 0 {
                        0
                    } else {
                        (hint as usize) & (self.cluster_slots - 1)
                    };
                    let (found, next) = self.scan_cluster(idx, &mut ci, start, order, usage);
                    drop(ci);
                    hints.set(class, next);
                    if found.is_some() {
                        return found;
                    }
                }
            }
        }

        self.alloc_slow(order, usage, class, &mut hints, st)
    }

    /// When the current cluster cannot serve: the list walk. Out of line, so that the fast
    /// path stays small.
    #[cold]
    #[inline(never)]
    fn alloc_slow(
        &self,
        order: u32,
        usage: u16,
        class: usize,
        hints: &mut Hints<'_>,
        st: &CpuStats,
    ) -> Option<u64> {
        let nclusters = self.clusters.len();
        loop {
            if self.nonfull_min_free > 0 && (1usize << order) < self.cluster_slots {
                // Partly used clusters first (see `DeviceConfig::nonfull_first`); for order 0,
                // those of every order, since any slot will do (else the holes that single
                // frees leave in clusters of large folios would stay holes while order 0
                // takes free clusters).
                let lists = if order == 0 && self.order_aware {
                    0..NR_ORDERS
                } else {
                    class..class + 1
                };
                for list_class in lists {
                    let list = ListId::Nonfull(list_class);
                    for _ in 0..nclusters {
                        match self.try_list(list, order, usage, class, hints, true) {
                            Some(Some(found)) => return Some(found),
                            Some(None) => {}
                            None => break,
                        }
                    }
                }
            }
            // A free cluster: never fails for a cluster-sized or smaller order.
            if let Some(found) = self.try_list(ListId::Free, order, usage, class, hints, false) {
                if found.is_some() {
                    return found;
                }
            }
            if (1usize << order) < self.cluster_slots {
                // Clusters of this order that had slots freed.
                let mut frags = 0usize;
                for _ in 0..nclusters {
                    match self.try_list(ListId::Nonfull(class), order, usage, class, hints, false) {
                        Some(Some(found)) => return Some(found),
                        Some(None) => frags += 1,
                        None => break,
                    }
                }
                // Then rotate through the frag list once.
                let existing = self.frag_nr[class].load(Ordering::Relaxed);
                while frags < existing {
                    match self.try_list(ListId::Frag(class), order, usage, class, hints, false) {
                        Some(Some(found)) => return Some(found),
                        Some(None) => frags += 1,
                        None => break,
                    }
                }
            }
            // Clusters waiting for discard: discard them now and retry.
            if self.discard.is_some() && self.discard_clusters(st) > 0 {
                continue;
            }
            break;
        }
        if order > 0 || !self.order_aware {
            return None;
        }
        // Order 0 steals from the clusters of higher orders: any slot will do.
        for o in 1..NR_ORDERS {
            for list in [ListId::Frag(o), ListId::Nonfull(o)] {
                for _ in 0..nclusters {
                    match self.try_list(list, 0, usage, class, hints, false) {
                        Some(Some(found)) => return Some(found),
                        Some(None) => {}
                        None => break,
                    }
                }
            }
        }
        None
    }

    /// Runs the discard hook on every cluster on the discard list and returns them to the free
    /// list (the kernel's `swap_do_scheduled_discard`).
    fn discard_clusters(&self, st: &CpuStats) -> usize {
        let Some(hook) = self.discard.as_ref() else {
            return 0;
        };
        let mut n = 0;
        loop {
            let idx = {
                let mut lists = self.lock_lists();
                match lists.pop_front(ListId::Discard) {
                    Some(idx) => {
                        // Stays in Discard state off-list: not usable, not isolatable.
                        lists.discarding += 1;
                        idx
                    }
                    None => break,
                }
            };
            let first = (idx as u64) << self.cluster_shift;
            hook.discard(self.id, first, self.cluster_slots as u64);
            let mut ci = self.lock_cluster(idx);
            {
                let mut lists = self.lock_lists();
                lists.discarding -= 1;
                lists.push_back(ListId::Free, idx);
                ci.state = ClusterState::Free;
            }
            drop(ci);
            bump(&st.discards, 1);
            n += 1;
        }
        n
    }

    /// After `nr` slots of a locked cluster became free (the kernel's `swap_entries_free`).
    fn slots_freed(&self, idx: usize, ci: &mut ClusterInner, nr: u32) {
        if nr == 0 {
            return;
        }
        ci.count -= nr;
        if ci.count == 0 {
            ci.map.release();
            self.free_cluster(idx, ci);
        } else if ci.state == ClusterState::Nonfull {
            // Already there.
        } else if self.cluster_slots - ci.count as usize >= self.nonfull_min_free as usize {
            // The kernel's partial_free_cluster.
            self.move_cluster(idx, ci, ClusterState::Nonfull);
        } else if ci.state == ClusterState::Full {
            // Too few free slots to be worth a list visit yet: on the frag list, which the
            // allocator walks only when nothing else is left.
            self.move_cluster(idx, ci, ClusterState::Frag);
        }
    }

    // ---------------------------------------------------------------- public API

    /// Allocates `2^order` contiguous, naturally aligned slots, each with one reference.
    /// Returns the first; the others follow it. [`SwapError::NoSpace`] when no such run is
    /// free (counted as a fallback of that order).
    pub fn alloc(&self, order: u32) -> Result<SwapEntry, SwapError> {
        self.alloc_with(order, SlotUsage::Referenced)
    }

    /// [`alloc`](Self::alloc) with the slots marked as `usage` says.
    pub fn alloc_with(&self, order: u32, usage: SlotUsage) -> Result<SwapEntry, SwapError> {
        self.check_order(order)?;
        let pc = self.cpu();
        match self.alloc_slots(order, usage.map_value(), pc) {
            Some(off) => Ok(SwapEntry::from_parts(self.id, off)),
            None => {
                bump(&pc.stats.swpout_fallback[order as usize], 1);
                Err(SwapError::NoSpace { order })
            }
        }
    }

    /// Allocation without counting a fallback (for [`SwapInfo`](crate::SwapInfo), which
    /// counts one fallback per request, not per device tried).
    pub(crate) fn try_alloc(&self, order: u32, usage: SlotUsage) -> Option<SwapEntry> {
        let pc = self.cpu();
        let off = self.alloc_slots(order, usage.map_value(), pc)?;
        Some(SwapEntry::from_parts(self.id, off))
    }

    /// Allocates up to `n` runs of `2^order` slots into `out` (the kernel's
    /// `get_swap_pages`); returns how many it got, fewer than `n` when the device fills up.
    pub fn alloc_batch(
        &self,
        order: u32,
        n: usize,
        usage: SlotUsage,
        out: &mut Vec<SwapEntry>,
    ) -> Result<usize, SwapError> {
        self.check_order(order)?;
        let pc = self.cpu();
        for got in 0..n {
            match self.alloc_slots(order, usage.map_value(), pc) {
                Some(off) => out.push(SwapEntry::from_parts(self.id, off)),
                None => {
                    bump(&pc.stats.swpout_fallback[order as usize], 1);
                    return Ok(got);
                }
            }
        }
        Ok(n)
    }

    /// Adds a reference to an allocated slot (the kernel's `swap_duplicate`, for a page that
    /// becomes shared, e.g. after fork). Returns the new count.
    pub fn dup(&self, entry: SwapEntry) -> Result<u16, SwapError> {
        let (idx, s) = self.locate(entry)?;
        let mut ci = self.lock_cluster(idx);
        let v = ci.map[s];
        if v == SLOT_FREE {
            return Err(SwapError::SlotFree { entry });
        }
        let count = v & SLOT_COUNT_MASK;
        if count >= MAX_SLOT_COUNT {
            return Err(SwapError::CountOverflow {
                entry,
                max: MAX_SLOT_COUNT,
            });
        }
        ci.map[s] = v + 1;
        Ok(count + 1)
    }

    fn put_locked(
        &self,
        idx: usize,
        ci: &mut ClusterInner,
        s: usize,
        entry: SwapEntry,
    ) -> Result<bool, SwapError> {
        let v = ci.map[s];
        if v == SLOT_FREE {
            return Err(SwapError::SlotFree { entry });
        }
        if v & SLOT_COUNT_MASK == 0 {
            return Err(SwapError::NoReference { entry });
        }
        ci.map[s] = v - 1;
        if v - 1 == SLOT_FREE {
            self.slots_freed(idx, ci, 1);
            return Ok(true);
        }
        Ok(false)
    }

    /// Drops a reference (the kernel's `swap_free`). Returns whether the slot became free
    /// (no reference and no has-cache flag left).
    pub fn put(&self, entry: SwapEntry) -> Result<bool, SwapError> {
        let (idx, s) = self.locate(entry)?;
        let mut ci = self.lock_cluster(idx);
        self.put_locked(idx, &mut ci, s, entry)
    }

    /// Drops one reference from each of the `2^order` slots from `entry` (the kernel's
    /// `swap_free_nr`), under one cluster lock. The range must lie in one cluster (an
    /// allocation of `order` always does). Checks every slot before changing any: on error
    /// nothing changed. Returns how many slots became free.
    pub fn put_range(&self, entry: SwapEntry, order: u32) -> Result<usize, SwapError> {
        self.check_order(order)?;
        let nr = 1usize << order;
        let (idx, s) = self.locate(entry)?;
        if s + nr > self.cluster_slots {
            return Err(SwapError::CrossesCluster {
                entry,
                order,
                cluster_slots: self.cluster_slots,
            });
        }
        let last = entry.plus(nr as u64 - 1);
        if last.offset() >= self.nslots {
            return Err(SwapError::OutOfRange {
                entry: last,
                nslots: self.nslots,
            });
        }
        let mut ci = self.lock_cluster(idx);
        let run = &mut ci.map[s..s + nr];
        let freed = match put_run(run, order) {
            Ok(freed) => freed,
            Err(i) => {
                let e = entry.plus(i as u64);
                return Err(if run[i] == SLOT_FREE {
                    SwapError::SlotFree { entry: e }
                } else {
                    SwapError::NoReference { entry: e }
                });
            }
        };
        self.slots_freed(idx, &mut ci, freed);
        Ok(freed as usize)
    }

    /// Drops one reference from each entry, in order, taking each cluster lock once per run
    /// of entries in the same cluster (the kernel's `swapcache_free_entries`). On a bad entry
    /// returns [`SwapError::InBatch`] with its index: the entries before it were processed,
    /// it and those after were not. Returns how many slots became free.
    pub fn put_batch(&self, entries: &[SwapEntry]) -> Result<usize, SwapError> {
        let mut held: Option<(usize, MutexGuard<'_, ClusterInner>)> = None;
        let mut freed = 0;
        for (index, &entry) in entries.iter().enumerate() {
            let fail = |e: SwapError| SwapError::InBatch {
                index,
                source: Box::new(e),
            };
            let (idx, s) = self.locate(entry).map_err(fail)?;
            let ci = match held {
                Some((h, ref mut g)) if h == idx => g,
                _ => {
                    held = None;
                    &mut held.insert((idx, self.lock_cluster(idx))).1
                }
            };
            if self.put_locked(idx, ci, s, entry).map_err(fail)? {
                freed += 1;
            }
        }
        Ok(freed)
    }

    /// Sets the has-cache flag of an allocated slot (the kernel's `swapcache_prepare`):
    /// [`SwapError::CacheExists`] if it is set already, which is how two threads racing to
    /// read the same slot in learn that one of them lost.
    pub fn swapcache_prepare(&self, entry: SwapEntry) -> Result<(), SwapError> {
        let (idx, s) = self.locate(entry)?;
        let mut ci = self.lock_cluster(idx);
        let v = ci.map[s];
        if v == SLOT_FREE {
            return Err(SwapError::SlotFree { entry });
        }
        if v & SLOT_HAS_CACHE != 0 {
            return Err(SwapError::CacheExists { entry });
        }
        ci.map[s] = v | SLOT_HAS_CACHE;
        Ok(())
    }

    /// Clears the has-cache flag (the kernel's `swapcache_clear` / `put_swap_folio`).
    /// Returns whether the slot became free.
    pub fn swapcache_clear(&self, entry: SwapEntry) -> Result<bool, SwapError> {
        let (idx, s) = self.locate(entry)?;
        let mut ci = self.lock_cluster(idx);
        let v = ci.map[s];
        if v == SLOT_FREE {
            return Err(SwapError::SlotFree { entry });
        }
        if v & SLOT_HAS_CACHE == 0 {
            return Err(SwapError::NotCached { entry });
        }
        ci.map[s] = v & !SLOT_HAS_CACHE;
        if ci.map[s] == SLOT_FREE {
            self.slots_freed(idx, &mut ci, 1);
            return Ok(true);
        }
        Ok(false)
    }

    /// The reference count and has-cache flag of a slot.
    pub fn slot(&self, entry: SwapEntry) -> Result<SlotState, SwapError> {
        let (idx, s) = self.locate(entry)?;
        let v = self.clusters[idx].lock().map[s];
        Ok(SlotState {
            count: v & SLOT_COUNT_MASK,
            has_cache: v & SLOT_HAS_CACHE != 0,
        })
    }

    /// Runs the discard hook on the clusters waiting for it and frees them; returns how many.
    /// A backend calls this from a background thread (the kernel's discard work); allocation
    /// also calls it when it finds no free cluster.
    pub fn run_discards(&self) -> usize {
        self.discard_clusters(&self.cpu().stats)
    }

    /// Heap bytes of the device's metadata: the cluster array, the lists, the per-CPU state
    /// and the slot maps of the clusters in use. Takes each cluster lock in turn (not
    /// counted in the lock statistics).
    pub fn metadata_bytes(&self) -> usize {
        let maps: usize = self
            .clusters
            .iter()
            .map(|c| c.lock().map.heap_bytes())
            .sum();
        maps + std::mem::size_of_val(&*self.clusters)
            + std::mem::size_of_val(&*self.percpu)
            + self.lists.lock().heap_bytes()
    }

    /// Slots in use, exact: sums the cluster counts under their locks. (Not counted in the
    /// lock statistics.)
    pub fn in_use(&self) -> u64 {
        let total: u64 = self
            .clusters
            .iter()
            .map(|c| u64::from(c.lock().count))
            .sum();
        total - self.bad_slots
    }

    /// Counters. Locks each cluster and the device lock in turn to read the counts kept
    /// under them (those acquisitions are not counted); `in_use` is exact.
    pub fn stats(&self) -> DeviceStats {
        let mut s = DeviceStats {
            nslots: self.nslots,
            ..DeviceStats::default()
        };
        let mut used = 0u64;
        for c in self.clusters.iter() {
            let ci = c.lock();
            used += u64::from(ci.count);
            s.cluster_lock += ci.lock_count;
        }
        s.in_use = used - self.bad_slots;
        s.device_lock = self.lists.lock().lock_count;
        for pc in self.percpu.iter() {
            let c = &pc.stats;
            let r = |a: &StatU64| a.load(Ordering::Relaxed);
            s.global_cluster_lock += r(&c.global_cluster_lock);
            s.discarded_clusters += r(&c.discards);
            for o in 0..NR_ORDERS {
                s.swpout[o] += r(&c.swpout[o]);
                s.swpout_fallback[o] += r(&c.swpout_fallback[o]);
            }
        }
        s
    }

    /// How many clusters each list holds (takes the device lock, not counted).
    pub fn cluster_lists(&self) -> ClusterLists {
        let lists = self.lists.lock();
        ClusterLists {
            free: lists.len(ListId::Free),
            full: lists.len(ListId::Full),
            discard: lists.len(ListId::Discard) + lists.discarding,
            nonfull: std::array::from_fn(|o| lists.len(ListId::Nonfull(o))),
            frag: std::array::from_fn(|o| lists.len(ListId::Frag(o))),
        }
    }

    /// Fragmentation for `order`: free slots on the device, and how many of them sit in
    /// clusters that cannot serve an allocation of `order` (no free aligned run of `2^order`,
    /// or, order-aware, the cluster serves another order). Locks each cluster in turn.
    pub fn fragmentation(&self, order: u32) -> Result<Fragmentation, SwapError> {
        self.check_order(order)?;
        let nr = 1usize << order;
        let mut f = Fragmentation {
            order,
            free_slots: 0,
            stranded_slots: 0,
        };
        for c in self.clusters.iter() {
            let ci = c.lock();
            let free = ci.map.iter().filter(|&&v| v == SLOT_FREE).count() as u64;
            f.free_slots += free;
            if free == 0 {
                continue;
            }
            let usable = match ci.state {
                ClusterState::Full => false,
                // Discard clusters become free clusters.
                ClusterState::Discard => true,
                _ => {
                    !self.order_aware || order == 0 || ci.count == 0 || u32::from(ci.order) == order
                }
            };
            let has_run = ci
                .map
                .chunks_exact(nr)
                .any(|run| run.iter().all(|&v| v == SLOT_FREE));
            if !(usable && has_run) {
                f.stranded_slots += free;
            }
        }
        Ok(f)
    }

    /// Checks every invariant: slot counts match the maps, each cluster's state matches the
    /// list it is on and its count, the lists are well linked, the frag counts and the in-use
    /// counters agree. Locks all clusters, then the device lock, so it sees one consistent
    /// state even while other threads run. For tests; cost is linear in the device size.
    pub fn check_integrity(&self) -> Result<(), SwapError> {
        let corrupt = |detail: String| SwapError::Corrupt { detail };
        let guards: Vec<_> = self.clusters.iter().map(|c| c.lock()).collect();
        let lists = self.lists.lock();
        let seen = lists.verify().map_err(corrupt)?;
        let cs = self.cluster_slots as u32;
        let mut discard_off_list = 0;
        let mut total = 0u64;
        for (idx, ci) in guards.iter().enumerate() {
            let used = ci.map.iter().filter(|&&v| v != SLOT_FREE).count() as u32;
            if used != ci.count {
                return Err(corrupt(format!(
                    "cluster {idx}: count {} but {used} slots in use",
                    ci.count
                )));
            }
            total += u64::from(used);
            if (ci.count == 0) != (ci.map.heap_bytes() == 0) {
                return Err(corrupt(format!(
                    "cluster {idx}: count {} with {} bytes of slot map (a map is held exactly \
                     while slots are in use)",
                    ci.count,
                    ci.map.heap_bytes()
                )));
            }
            let class = self.class(usize::from(ci.order));
            let want = ListId::for_state(ci.state, class).index();
            let ok_count = match ci.state {
                ClusterState::Free | ClusterState::Discard => ci.count == 0,
                ClusterState::Full => ci.count == cs,
                ClusterState::Nonfull | ClusterState::Frag => ci.count > 0 && ci.count < cs,
            };
            if !ok_count {
                return Err(corrupt(format!(
                    "cluster {idx}: state {:?} with count {}",
                    ci.state, ci.count
                )));
            }
            match seen[idx] {
                Some(l) if l == want => {}
                None if ci.state == ClusterState::Discard => discard_off_list += 1,
                other => {
                    return Err(corrupt(format!(
                        "cluster {idx}: state {:?} order {} but on list {other:?} (want {want})",
                        ci.state, ci.order
                    )))
                }
            }
            let base = (idx as u64) << self.cluster_shift;
            for (s, &v) in ci.map.iter().enumerate() {
                let off = base + s as u64;
                let bad = v == SLOT_BAD;
                if bad != (off >= self.nslots) {
                    return Err(corrupt(format!("slot {off:#x}: bad-slot marking {v:#x}")));
                }
                if !bad && v & !(SLOT_COUNT_MASK | SLOT_HAS_CACHE) != 0 {
                    return Err(corrupt(format!("slot {off:#x}: invalid map value {v:#x}")));
                }
            }
        }
        if discard_off_list != lists.discarding {
            return Err(corrupt(format!(
                "{discard_off_list} discard clusters off-list but {} being discarded",
                lists.discarding
            )));
        }
        for o in 0..NR_ORDERS {
            let n = self.frag_nr[o].load(Ordering::Relaxed);
            if n != lists.len(ListId::Frag(o)) {
                return Err(corrupt(format!(
                    "frag count {n} for order {o} but {} on the list",
                    lists.len(ListId::Frag(o))
                )));
            }
        }
        if total < self.bad_slots {
            return Err(corrupt(format!(
                "{total} slots in use, fewer than the {} tail slots",
                self.bad_slots
            )));
        }
        Ok(())
    }
}

// ------------------------------------------------------------ run helpers
//
// The per-run loops of the allocation and free paths, with the run length a compile-time
// constant per order: a run of 16 slots is then two 16-byte loads and an OR to test, two
// stores to fill, and a few vector operations to drop one reference from each slot, where a
// loop over a run of unknown length spends most of its instructions on loop control and on
// the scalar head and tail around its vector body. Same slot-by-slot semantics either way.

/// The first free, naturally aligned run of `N` slots in `map` at or after `first` (a
/// multiple of `N`): fills it with `usage` and returns its offset.
#[inline(always)]
fn take_run_n<const N: usize>(map: &mut [u16], first: usize, usage: u16) -> Option<usize> {
    let from = first.min(map.len());
    for (i, run) in map[from..].chunks_exact_mut(N).enumerate() {
        // Branch-free test of the whole run (it vectorises).
        if run.iter().fold(0, |acc, &s| acc | s) == SLOT_FREE {
            run.fill(usage);
            return Some(from + i * N);
        }
    }
    None
}

/// [`take_run_n`] for a run of `2^order` slots, `order` from 1 to 9.
fn take_run(map: &mut [u16], first: usize, order: u32, usage: u16) -> Option<usize> {
    match order {
        1 => take_run_n::<2>(map, first, usage),
        2 => take_run_n::<4>(map, first, usage),
        3 => take_run_n::<8>(map, first, usage),
        4 => take_run_n::<16>(map, first, usage),
        5 => take_run_n::<32>(map, first, usage),
        6 => take_run_n::<64>(map, first, usage),
        7 => take_run_n::<128>(map, first, usage),
        8 => take_run_n::<256>(map, first, usage),
        _ => take_run_n::<512>(map, first, usage),
    }
}

/// Drops one reference from each slot of `run` if every slot has one; returns how many
/// became free, or the index of the first slot without a reference (nothing changed).
#[inline(always)]
fn put_run_n<const N: usize>(run: &mut [u16; N]) -> Result<u32, usize> {
    // Branch-free over the run (it vectorises); find the culprit only on error. A count is
    // at most `SLOT_COUNT_MASK` (0x3fff), so `count - 1` wraps to set bit 15 exactly when
    // the count is 0.
    let any_unreferenced = run
        .iter()
        .fold(0u16, |acc, &v| acc | (v & SLOT_COUNT_MASK).wrapping_sub(1))
        & 0x8000
        != 0;
    if any_unreferenced {
        return Err(run
            .iter()
            .position(|&v| v & SLOT_COUNT_MASK == 0)
            .unwrap_or(0));
    }
    // Slots left with count 1 and no has-cache flag become free; N <= 512 fits in a u16.
    let freed = run.iter().fold(0u16, |acc, &v| acc + u16::from(v == 1));
    for v in run.iter_mut() {
        *v -= 1;
    }
    Ok(u32::from(freed))
}

/// [`put_run_n`] for a run of `2^order` slots (`run.len()` is `2^order`, `order` at most 9).
fn put_run(run: &mut [u16], order: u32) -> Result<u32, usize> {
    fn arr<const N: usize>(run: &mut [u16]) -> &mut [u16; N] {
        // INVARIANT: callers pass a run of exactly `2^order` slots.
        run.try_into().expect("run length matches its order")
    }
    match order {
        0 => put_run_n::<1>(arr(run)),
        1 => put_run_n::<2>(arr(run)),
        2 => put_run_n::<4>(arr(run)),
        3 => put_run_n::<8>(arr(run)),
        4 => put_run_n::<16>(arr(run)),
        5 => put_run_n::<32>(arr(run)),
        6 => put_run_n::<64>(arr(run)),
        7 => put_run_n::<128>(arr(run)),
        8 => put_run_n::<256>(arr(run)),
        _ => put_run_n::<512>(arr(run)),
    }
}

#[cfg(test)]
mod run_tests {
    use super::*;

    /// The run helpers against slot-by-slot loops, for every order and a spread of maps.
    #[test]
    fn run_helpers_match_slot_loops() {
        let values = [
            SLOT_FREE,
            1,
            2,
            SLOT_HAS_CACHE,
            SLOT_HAS_CACHE | 1,
            MAX_SLOT_COUNT,
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for order in 0..NR_ORDERS as u32 {
            let nr = 1usize << order;
            // Under miri a few maps per order: each is ~1000x slower there.
            for _ in 0..if cfg!(miri) { 4 } else { 200 } {
                // Mostly uniform runs (the common case) with a few odd slots.
                let base = values[(rand() % values.len() as u64) as usize];
                let mut map = vec![base; 1024];
                for _ in 0..(rand() % 3) {
                    let i = (rand() % 1024) as usize;
                    map[i] = values[(rand() % values.len() as u64) as usize];
                }
                let first = ((rand() % 1024) as usize) & !(nr - 1);

                if order > 0 {
                    let mut want_map = map.clone();
                    let want = (first..1024)
                        .step_by(nr)
                        .find(|&o| want_map[o..o + nr].iter().all(|&v| v == SLOT_FREE));
                    if let Some(o) = want {
                        want_map[o..o + nr].fill(7);
                    }
                    let mut got_map = map.clone();
                    assert_eq!(take_run(&mut got_map, first, order, 7), want);
                    assert_eq!(got_map, want_map);
                }

                let run = &map[first..first + nr];
                let want = match run.iter().position(|&v| v & SLOT_COUNT_MASK == 0) {
                    Some(i) => Err(i),
                    None => Ok(run.iter().filter(|&&v| v == 1).count() as u32),
                };
                let mut got_map = map.clone();
                assert_eq!(put_run(&mut got_map[first..first + nr], order), want);
                let mut want_map = map.clone();
                if want.is_ok() {
                    for v in &mut want_map[first..first + nr] {
                        *v -= 1;
                    }
                }
                assert_eq!(got_map, want_map);
            }
        }
    }
}
