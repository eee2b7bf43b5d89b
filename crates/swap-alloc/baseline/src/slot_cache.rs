//! Baseline (b): per-cluster locks with per-CPU caches of 64 slots (v4.11, 2017).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use parking_lot::{Mutex, MutexGuard};

use crate::SlotAllocator;

/// Slots per per-CPU cache (the kernel's `SWAP_SLOTS_CACHE_SIZE`).
pub const SLOT_CACHE_SIZE: usize = 64;

#[derive(Debug)]
struct Cluster {
    count: usize,
    map: Vec<u8>,
}

#[derive(Debug)]
struct DevState {
    free_clusters: VecDeque<usize>,
    /// Per CPU: the current cluster and the next slot in it (`percpu_cluster`).
    current: Vec<Option<(usize, usize)>>,
    /// Where the fallback linear scan starts.
    scan_cursor: usize,
}

#[derive(Debug, Default)]
struct SlotCache {
    alloc: Vec<u64>,
    ret: Vec<u64>,
}

/// The 2017 design: `get_swap_page` takes order-0 slots from a per-CPU cache; an empty cache
/// is refilled with up to 64 slots under one device-lock hold (`scan_swap_map_slots`, using
/// the CPU's current cluster, then free clusters, then a linear scan); freed slots collect in
/// a per-CPU return cache flushed under one device-lock hold when it holds 64. Slot maps and
/// counts are under per-cluster locks. Higher orders bypass the caches and allocate under the
/// device lock (what v4.13 did for THP swap).
#[derive(Debug)]
pub struct SlotCacheDevice {
    cs: usize,
    nslots: usize,
    clusters: Box<[CachePadded<Mutex<Cluster>>]>,
    dev: Mutex<DevState>,
    caches: Box<[CachePadded<Mutex<SlotCache>>]>,
    locks: AtomicU64,
}

impl SlotCacheDevice {
    /// `nslots` slots in clusters of `cluster_slots` (a power of two), per-CPU caches for
    /// `nr_cpus` CPUs.
    pub fn new(nslots: usize, cluster_slots: usize, nr_cpus: usize) -> Self {
        let cs = cluster_slots.max(1).next_power_of_two();
        let n = nslots.div_ceil(cs);
        let clusters = (0..n)
            .map(|i| {
                let mut map = vec![0u8; cs];
                let valid = nslots.saturating_sub(i * cs).min(cs);
                map[valid..].fill(1);
                CachePadded::new(Mutex::new(Cluster {
                    count: cs - valid,
                    map,
                }))
            })
            .collect();
        let free_clusters = (0..n).filter(|&i| (i + 1) * cs <= nslots).collect();
        let ncpu = nr_cpus.max(1);
        Self {
            cs,
            nslots,
            clusters,
            dev: Mutex::new(DevState {
                free_clusters,
                current: vec![None; ncpu],
                scan_cursor: 0,
            }),
            caches: (0..ncpu)
                .map(|_| CachePadded::new(Mutex::new(SlotCache::default())))
                .collect(),
            locks: AtomicU64::new(0),
        }
    }

    fn cpu(&self) -> usize {
        swap_alloc::current_cpu() % self.caches.len()
    }

    fn lock_dev(&self) -> MutexGuard<'_, DevState> {
        self.locks.fetch_add(1, Ordering::Relaxed);
        self.dev.lock()
    }

    /// Tries an aligned run of `nr` in cluster `c` from slot `from`; returns the offset.
    fn take_in_cluster(&self, c: usize, from: usize, nr: usize) -> Option<usize> {
        let mut cl = self.clusters[c].lock();
        if cl.count + nr > self.cs {
            return None;
        }
        let mut off = (from + nr - 1) & !(nr - 1);
        while off + nr <= self.cs {
            if cl.map[off..off + nr].iter().all(|&v| v == 0) {
                cl.map[off..off + nr].fill(1);
                cl.count += nr;
                return Some(c * self.cs + off);
            }
            off += nr;
        }
        None
    }

    /// One allocation under the device lock (`scan_swap_map_slots` for one slot).
    fn scan_one(&self, dev: &mut DevState, cpu: usize, nr: usize) -> Option<u64> {
        // The CPU's current cluster.
        if let Some((c, next)) = dev.current[cpu] {
            if let Some(off) = self.take_in_cluster(c, next, nr) {
                let after = off % self.cs + nr;
                dev.current[cpu] = (after < self.cs).then_some((c, after));
                return Some(off as u64);
            }
            dev.current[cpu] = None;
        }
        // A new free cluster.
        while let Some(c) = dev.free_clusters.pop_front() {
            if let Some(off) = self.take_in_cluster(c, 0, nr) {
                dev.current[cpu] = Some((c, nr));
                return Some(off as u64);
            }
        }
        // A linear scan of all clusters.
        let n = self.clusters.len();
        for k in 0..n {
            let c = (dev.scan_cursor + k) % n;
            if let Some(off) = self.take_in_cluster(c, 0, nr) {
                dev.scan_cursor = c;
                return Some(off as u64);
            }
        }
        None
    }

    /// Frees one run with the device lock held (as `swapcache_free_entries` did).
    fn free_locked(&self, dev: &mut DevState, offset: u64, nr: usize) {
        let off = offset as usize;
        if off >= self.nslots {
            return;
        }
        let c = off / self.cs;
        let s = off % self.cs;
        let mut cl = self.clusters[c].lock();
        if let Some(run) = cl.map.get_mut(s..s + nr) {
            debug_assert!(run.iter().all(|&v| v == 1));
            run.fill(0);
            cl.count -= nr;
            if cl.count == 0
                && !dev
                    .current
                    .iter()
                    .any(|cur| matches!(cur, Some((cc, _)) if *cc == c))
            {
                dev.free_clusters.push_back(c);
            }
        }
    }
}

impl SlotAllocator for SlotCacheDevice {
    fn design(&self) -> &'static str {
        "slot_cache"
    }

    fn alloc_slots(&self, order: u32) -> Option<u64> {
        let nr = 1usize << order;
        if nr > self.cs {
            return None;
        }
        let cpu = self.cpu();
        if order > 0 {
            let mut dev = self.lock_dev();
            return self.scan_one(&mut dev, cpu, nr);
        }
        let mut cache = self.caches[cpu].lock();
        if let Some(off) = cache.alloc.pop() {
            return Some(off);
        }
        // Refill: one device-lock hold for up to 64 slots.
        {
            let mut dev = self.lock_dev();
            while cache.alloc.len() < SLOT_CACHE_SIZE {
                match self.scan_one(&mut dev, cpu, 1) {
                    Some(off) => cache.alloc.push(off),
                    None => break,
                }
            }
        }
        cache.alloc.reverse();
        if let Some(off) = cache.alloc.pop() {
            return Some(off);
        }
        // Nothing left on the device: flush our own return cache and retry once.
        let ret = std::mem::take(&mut cache.ret);
        if ret.is_empty() {
            return None;
        }
        let mut dev = self.lock_dev();
        for off in ret {
            self.free_locked(&mut dev, off, 1);
        }
        self.scan_one(&mut dev, cpu, 1)
    }

    fn free_slots(&self, offset: u64, order: u32) {
        let nr = 1usize << order;
        if order > 0 {
            let mut dev = self.lock_dev();
            self.free_locked(&mut dev, offset, nr);
            return;
        }
        let mut cache = self.caches[self.cpu()].lock();
        cache.ret.push(offset);
        if cache.ret.len() >= SLOT_CACHE_SIZE {
            let ret = std::mem::take(&mut cache.ret);
            let mut dev = self.lock_dev();
            for off in ret {
                self.free_locked(&mut dev, off, 1);
            }
        }
    }

    fn device_lock_acquisitions(&self) -> u64 {
        self.locks.load(Ordering::Relaxed)
    }
}
