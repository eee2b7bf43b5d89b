//! **Baseline**: the design before the lockless series, kept for comparison.
//!
//! The shrinker list and the group arrays sit under one read-write lock (the
//! kernel's `shrinker_rwsem`). Registration and unregistration take the write
//! side. The shrink walk *tries* the read side (`down_read_trylock`) and gives
//! up, freeing nothing, when it fails; it holds the read side across every
//! callback, so an unregistration waits for every walk in flight, over every
//! shrinker. Same [`Shrinker`] trait, same `do_shrink_slab` arithmetic, same
//! group bitmaps, so that benchmarks compare only the synchronisation.
//!
//! Not for production use: it is here to be measured against.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::control::{
    GroupId, ShrinkControl, ShrinkRequest, Shrinker, ShrinkerConfig, ShrinkerId, DEF_PRIORITY,
};
use crate::error::ShrinkerError;
use crate::shrink::{do_shrink_slab, DeferredWork, ShrinkOutcome};
use crate::stats::{NodeStats, RegistryStats, ShrinkerStats};

struct Node {
    id: ShrinkerId,
    config: ShrinkerConfig,
    callback: Box<dyn Shrinker>,
    nr_deferred: Box<[AtomicI64]>,
    stats: NodeStats,
}

impl Node {
    fn deferred_slot(&self, shard: usize) -> &AtomicI64 {
        let i = if self.config.shard_aware {
            shard.min(self.nr_deferred.len() - 1)
        } else {
            0
        };
        &self.nr_deferred[i]
    }
}

struct Group {
    parent: Option<GroupId>,
    /// `map[shard * words + w]`.
    map: Vec<AtomicU64>,
    /// `nr_deferred[shard * cap + id]`.
    nr_deferred: Vec<AtomicI64>,
    cap: usize,
}

impl Group {
    fn new(parent: Option<GroupId>, nr_shards: usize, cap: usize) -> Self {
        Self {
            parent,
            map: (0..nr_shards * cap / 64)
                .map(|_| AtomicU64::new(0))
                .collect(),
            nr_deferred: (0..nr_shards * cap).map(|_| AtomicI64::new(0)).collect(),
            cap,
        }
    }

    fn word(&self, shard: usize, id: usize) -> Option<&AtomicU64> {
        (id < self.cap).then(|| &self.map[shard * self.cap / 64 + id / 64])
    }

    fn deferred(&self, shard: usize, id: usize) -> Option<&AtomicI64> {
        (id < self.cap).then(|| &self.nr_deferred[shard * self.cap + id])
    }

    fn expanded(&self, nr_shards: usize, cap: usize) -> Self {
        let new = Group::new(self.parent, nr_shards, cap);
        for shard in 0..nr_shards {
            for id in 0..self.cap {
                if let (Some(o), Some(n)) = (self.deferred(shard, id), new.deferred(shard, id)) {
                    n.store(o.load(Ordering::Relaxed), Ordering::Relaxed);
                }
            }
            for w in 0..self.cap / 64 {
                new.map[shard * cap / 64 + w].store(
                    self.map[shard * self.cap / 64 + w].load(Ordering::Relaxed),
                    Ordering::Relaxed,
                );
            }
        }
        new
    }
}

#[derive(Default)]
struct State {
    shrinkers: Vec<Option<Arc<Node>>>,
    groups: Vec<Option<Group>>,
    /// Capacity (in shrinker ids, a multiple of 64) of every group's arrays.
    cap: usize,
}

struct Inner {
    nr_shards: usize,
    state: RwLock<State>,
    shrinks: AtomicU64,
    skipped: AtomicU64,
}

/// The baseline registry: a list under a read-write lock, walked with try-lock.
#[derive(Clone)]
pub struct RwLockRegistry {
    inner: Arc<Inner>,
}

impl core::fmt::Debug for RwLockRegistry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RwLockRegistry")
            .field("nr_shards", &self.inner.nr_shards)
            .finish_non_exhaustive()
    }
}

/// A baseline registration; dropping it unregisters.
pub struct RwLockHandle {
    inner: Arc<Inner>,
    id: Option<ShrinkerId>,
}

impl core::fmt::Debug for RwLockHandle {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RwLockHandle")
            .field("id", &self.id)
            .finish()
    }
}

impl Default for RwLockRegistry {
    fn default() -> Self {
        Self::with_shards(1)
    }
}

impl RwLockRegistry {
    /// A registry with `nr_shards` shards.
    pub fn new(nr_shards: usize) -> Result<Self, ShrinkerError> {
        if nr_shards == 0 {
            return Err(ShrinkerError::NoShards);
        }
        Ok(Self::with_shards(nr_shards))
    }

    fn with_shards(nr_shards: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                nr_shards,
                state: RwLock::new(State {
                    cap: 64,
                    ..State::default()
                }),
                shrinks: AtomicU64::new(0),
                skipped: AtomicU64::new(0),
            }),
        }
    }

    /// Registers a shrinker (write lock).
    pub fn register<S: Shrinker>(
        &self,
        config: ShrinkerConfig,
        shrinker: S,
    ) -> Result<RwLockHandle, ShrinkerError> {
        let mut st = self.inner.state.write();
        let id = match st.shrinkers.iter().position(Option::is_none) {
            Some(i) => i,
            None if st.shrinkers.len() >= crate::MAX_SHRINKERS => {
                return Err(ShrinkerError::TooMany {
                    what: "shrinkers",
                    max: crate::MAX_SHRINKERS,
                })
            }
            None => {
                st.shrinkers.push(None);
                st.shrinkers.len() - 1
            }
        };
        if config.memcg_aware && id >= st.cap {
            let cap = (st.cap * 2).max((id / 64 + 1) * 64);
            let nr_shards = self.inner.nr_shards;
            for g in st.groups.iter_mut().flatten() {
                *g = g.expanded(nr_shards, cap);
            }
            st.cap = cap;
        }
        let n = if config.shard_aware {
            self.inner.nr_shards
        } else {
            1
        };
        let node = Node {
            id: ShrinkerId(id as u32),
            config,
            callback: Box::new(shrinker),
            nr_deferred: (0..n).map(|_| AtomicI64::new(0)).collect(),
            stats: NodeStats::default(),
        };
        st.shrinkers[id] = Some(Arc::new(node));
        Ok(RwLockHandle {
            inner: Arc::clone(&self.inner),
            id: Some(ShrinkerId(id as u32)),
        })
    }

    /// One shrink walk; returns 0 without calling anything when the read side
    /// cannot be taken at once (counted in [`RegistryStats::skipped`]).
    pub fn shrink(&self, req: &ShrinkRequest) -> Result<u64, ShrinkerError> {
        Ok(self.try_shrink(req)?.unwrap_or(0))
    }

    /// Like [`shrink`](Self::shrink), but says whether the walk was skipped
    /// (`Ok(None)`) because the lock was busy.
    pub fn try_shrink(&self, req: &ShrinkRequest) -> Result<Option<u64>, ShrinkerError> {
        let inner = &*self.inner;
        if req.shard >= inner.nr_shards {
            return Err(ShrinkerError::ShardOutOfRange {
                shard: req.shard,
                nr_shards: inner.nr_shards,
            });
        }
        if req.priority > DEF_PRIORITY {
            return Err(ShrinkerError::PriorityOutOfRange {
                priority: req.priority,
                max: DEF_PRIORITY,
            });
        }
        inner.shrinks.fetch_add(1, Ordering::Relaxed);
        let Some(st) = inner.state.try_read() else {
            inner.skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        let mut freed = 0u64;
        match req.group {
            None => {
                for n in st.shrinkers.iter().flatten() {
                    let shard = if n.config.shard_aware { req.shard } else { 0 };
                    let mut sc = ShrinkControl::new(None, shard, req.priority);
                    if let ShrinkOutcome::Freed(f) = call(n, &mut sc, &RootDeferred(n)) {
                        freed = freed.saturating_add(f);
                    }
                }
            }
            Some(g) => {
                let group = st
                    .groups
                    .get(g.0 as usize)
                    .and_then(Option::as_ref)
                    .ok_or(ShrinkerError::UnknownGroup(g))?;
                for id in 0..group.cap {
                    let Some(word) = group.word(req.shard, id) else {
                        break;
                    };
                    let bit = 1u64 << (id % 64);
                    if word.load(Ordering::Acquire) & bit == 0 {
                        continue;
                    }
                    let Some(Some(n)) = st.shrinkers.get(id) else {
                        word.fetch_and(!bit, Ordering::SeqCst);
                        continue;
                    };
                    let shard = if n.config.shard_aware { req.shard } else { 0 };
                    let deferred = GroupDeferred(group.deferred(shard, id));
                    let mut sc = ShrinkControl::new(Some(g), shard, req.priority);
                    let mut out = call(n, &mut sc, &deferred);
                    if out == ShrinkOutcome::Empty {
                        word.fetch_and(!bit, Ordering::SeqCst);
                        std::sync::atomic::fence(Ordering::SeqCst);
                        out = call(n, &mut sc, &deferred);
                        if out != ShrinkOutcome::Empty {
                            word.fetch_or(bit, Ordering::SeqCst);
                        }
                    }
                    if let ShrinkOutcome::Freed(f) = out {
                        freed = freed.saturating_add(f);
                    }
                }
            }
        }
        Ok(Some(freed))
    }

    /// Creates a group (write lock).
    pub fn create_group(&self, parent: Option<GroupId>) -> Result<GroupId, ShrinkerError> {
        let mut st = self.inner.state.write();
        if let Some(p) = parent {
            if st
                .groups
                .get(p.0 as usize)
                .and_then(Option::as_ref)
                .is_none()
            {
                return Err(ShrinkerError::UnknownGroup(p));
            }
        }
        let g = Group::new(parent, self.inner.nr_shards, st.cap);
        let id = match st.groups.iter().position(Option::is_none) {
            Some(i) => {
                st.groups[i] = Some(g);
                i
            }
            None => {
                st.groups.push(Some(g));
                st.groups.len() - 1
            }
        };
        Ok(GroupId(id as u32))
    }

    /// Takes a group offline, reparenting its deferred work (write lock).
    pub fn offline_group(&self, group: GroupId) -> Result<(), ShrinkerError> {
        let mut st = self.inner.state.write();
        let gi = group.0 as usize;
        if st.groups.get(gi).and_then(Option::as_ref).is_none() {
            return Err(ShrinkerError::UnknownGroup(group));
        }
        if let Some(c) = st
            .groups
            .iter()
            .position(|g| g.as_ref().is_some_and(|g| g.parent == Some(group)))
        {
            return Err(ShrinkerError::GroupHasChildren {
                group,
                child: GroupId(c as u32),
            });
        }
        let Some(g) = st.groups[gi].take() else {
            return Err(ShrinkerError::UnknownGroup(group));
        };
        for shard in 0..self.inner.nr_shards {
            for id in 0..g.cap {
                let v = g
                    .deferred(shard, id)
                    .map_or(0, |d| d.load(Ordering::Relaxed));
                if v <= 0 {
                    continue;
                }
                match g
                    .parent
                    .and_then(|p| st.groups.get(p.0 as usize).and_then(Option::as_ref))
                {
                    Some(p) => {
                        if let Some(d) = p.deferred(shard, id) {
                            d.fetch_add(v, Ordering::Relaxed);
                        }
                    }
                    None => {
                        if let Some(Some(n)) = st.shrinkers.get(id) {
                            n.deferred_slot(shard).fetch_add(v, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Sets shrinker `id`'s bit in `group` / `shard` (blocking read side).
    pub fn set_shrinker_bit(
        &self,
        group: GroupId,
        shard: usize,
        id: ShrinkerId,
    ) -> Result<(), ShrinkerError> {
        if shard >= self.inner.nr_shards {
            return Err(ShrinkerError::ShardOutOfRange {
                shard,
                nr_shards: self.inner.nr_shards,
            });
        }
        let st = self.inner.state.read();
        let i = id.0 as usize;
        let Some(Some(n)) = st.shrinkers.get(i) else {
            return Err(ShrinkerError::UnknownShrinker(id));
        };
        if !n.config.memcg_aware {
            return Err(ShrinkerError::NotMemcgAware(id));
        }
        let g = st
            .groups
            .get(group.0 as usize)
            .and_then(Option::as_ref)
            .ok_or(ShrinkerError::UnknownGroup(group))?;
        let word = g.word(shard, i).ok_or(ShrinkerError::UnknownShrinker(id))?;
        std::sync::atomic::fence(Ordering::SeqCst);
        word.fetch_or(1 << (i % 64), Ordering::SeqCst);
        Ok(())
    }

    /// Wait for every shrink in flight: take and drop the write side.
    pub fn synchronize(&self) {
        drop(self.inner.state.write());
    }

    /// Statistics of every registered shrinker.
    pub fn stats(&self) -> Vec<ShrinkerStats> {
        let st = self.inner.state.read();
        st.shrinkers
            .iter()
            .flatten()
            .map(|n| {
                let d = n
                    .nr_deferred
                    .iter()
                    .map(|d| d.load(Ordering::Relaxed))
                    .sum();
                ShrinkerStats::from_parts(n.id, &n.config.name, &n.stats, d)
            })
            .collect()
    }

    /// Registry-wide counters, including the walks skipped on a busy lock.
    pub fn registry_stats(&self) -> RegistryStats {
        RegistryStats {
            shrinks: self.inner.shrinks.load(Ordering::Relaxed),
            skipped: self.inner.skipped.load(Ordering::Relaxed),
        }
    }
}

impl RwLockHandle {
    /// The shrinker's id, if still registered.
    pub fn id(&self) -> Option<ShrinkerId> {
        self.id
    }

    /// Unregisters: takes the write side, so waits for every shrink walk in
    /// flight (all shrinkers' callbacks), then drops the callback.
    pub fn unregister(mut self) {
        self.remove();
    }

    fn remove(&mut self) {
        let Some(id) = self.id.take() else { return };
        let node = {
            let mut st = self.inner.state.write();
            let i = id.0 as usize;
            let node = st.shrinkers.get_mut(i).and_then(Option::take);
            for g in st.groups.iter().flatten() {
                for shard in 0..self.inner.nr_shards {
                    if let Some(w) = g.word(shard, i) {
                        w.fetch_and(!(1u64 << (i % 64)), Ordering::Relaxed);
                    }
                    if let Some(d) = g.deferred(shard, i) {
                        d.store(0, Ordering::Relaxed);
                    }
                }
            }
            node
        };
        drop(node);
    }
}

impl Drop for RwLockHandle {
    fn drop(&mut self) {
        self.remove();
    }
}

fn call(n: &Node, sc: &mut ShrinkControl, deferred: &impl DeferredWork) -> ShrinkOutcome {
    do_shrink_slab(
        &n.config,
        &n.stats,
        sc,
        deferred,
        |sc| n.callback.count_objects(sc),
        |sc| n.callback.scan_objects(sc),
    )
}

struct RootDeferred<'n>(&'n Node);

impl DeferredWork for RootDeferred<'_> {
    fn take(&self, shard: usize) -> i64 {
        self.0.deferred_slot(shard).swap(0, Ordering::Relaxed)
    }
    fn add(&self, shard: usize, v: i64) -> i64 {
        self.0
            .deferred_slot(shard)
            .fetch_add(v, Ordering::Relaxed)
            .saturating_add(v)
    }
}

struct GroupDeferred<'g>(Option<&'g AtomicI64>);

impl DeferredWork for GroupDeferred<'_> {
    fn take(&self, _: usize) -> i64 {
        self.0.map_or(0, |d| d.swap(0, Ordering::Relaxed))
    }
    fn add(&self, _: usize, v: i64) -> i64 {
        self.0
            .map_or(0, |d| d.fetch_add(v, Ordering::Relaxed).saturating_add(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{Count, Scan};
    use std::sync::atomic::AtomicU64;

    struct Cache(Arc<AtomicU64>);

    impl Shrinker for Cache {
        fn count_objects(&self, _: &ShrinkControl) -> Count {
            match self.0.load(Ordering::SeqCst) {
                0 => Count::Empty,
                n => Count::Objects(n),
            }
        }
        fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
            let n = self.0.load(Ordering::SeqCst).min(sc.nr_to_scan);
            self.0.fetch_sub(n, Ordering::SeqCst);
            Scan::Freed(n)
        }
    }

    #[test]
    fn walk_is_skipped_while_the_write_side_is_held() {
        let reg = RwLockRegistry::default();
        let objs = Arc::new(AtomicU64::new(1000));
        let h = reg
            .register(ShrinkerConfig::new("a"), Cache(objs.clone()))
            .unwrap();
        let writer = reg.inner.state.write();
        assert_eq!(reg.try_shrink(&ShrinkRequest::new(0)), Ok(None));
        drop(writer);
        assert_eq!(reg.try_shrink(&ShrinkRequest::new(0)), Ok(Some(1000)));
        let st = reg.registry_stats();
        assert_eq!((st.shrinks, st.skipped), (2, 1));
        assert_eq!(reg.stats()[0].objects_freed, 1000);
        h.unregister();
        assert!(reg.stats().is_empty());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "registers 200 shrinkers, growing the arrays each time: minutes under miri; the baseline has no unsafe code"
    )]
    fn group_walk_and_offline_match_the_lockless_registry() {
        let reg = RwLockRegistry::default();
        let parent = reg.create_group(None).unwrap();
        let child = reg.create_group(Some(parent)).unwrap();
        let objs = Arc::new(AtomicU64::new(100_000));
        let h = reg
            .register(
                ShrinkerConfig::new("a").memcg_aware(true),
                Cache(objs.clone()),
            )
            .unwrap();
        let id = h.id().unwrap();
        reg.set_shrinker_bit(child, 0, id).unwrap();
        // priority 12: 48 deferred, as in the lockless registry's tests.
        assert_eq!(reg.shrink(&ShrinkRequest::new(12).group(child)), Ok(0));
        assert!(matches!(
            reg.offline_group(parent),
            Err(ShrinkerError::GroupHasChildren { .. })
        ));
        reg.offline_group(child).unwrap();
        reg.offline_group(parent).unwrap();
        assert_eq!(reg.stats()[0].nr_deferred, 48);
        // 200 memcg-aware shrinkers grow the arrays past 64 ids.
        let g = reg.create_group(None).unwrap();
        let more: Vec<_> = (0..200)
            .map(|_| {
                reg.register(
                    ShrinkerConfig::new("m").memcg_aware(true),
                    Cache(Arc::new(AtomicU64::new(5))),
                )
                .unwrap()
            })
            .collect();
        for m in &more {
            reg.set_shrinker_bit(g, 0, m.id().unwrap()).unwrap();
        }
        assert_eq!(reg.shrink(&ShrinkRequest::new(0).group(g)), Ok(1000));
    }
}
