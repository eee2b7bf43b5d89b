//! The registry and its lockless shrink walk.

use std::sync::Arc;

use crate::control::{
    Count, GroupId, Scan, ShrinkControl, ShrinkRequest, Shrinker, ShrinkerConfig, ShrinkerId,
    DEF_PRIORITY,
};
use crate::error::ShrinkerError;
use crate::group::{Group, GroupInfo};
use crate::shrink::{do_shrink_slab, DeferredWork, ShrinkOutcome};
use crate::stats::{NodeStats, RegistryStats, ShrinkerStats, StatCounter};
use crate::sync::{
    fence, lock, yield_now, AtomicI64, AtomicPtr, AtomicUsize, Completion, Epoch, Guard, Mutex,
    Ordering, Rcu, UnsafeCell, INITIAL_TABLE, UNIT_BITS,
};

/// The most shrinkers a registry hands ids to.
pub const MAX_SHRINKERS: usize = 1 << 20;
/// The most groups online at once.
pub const MAX_GROUPS: usize = 1 << 20;

/// A registered shrinker (the kernel's `struct shrinker`).
pub(crate) struct Node {
    pub(crate) id: ShrinkerId,
    pub(crate) config: ShrinkerConfig,
    /// 1 for the registration itself plus one per walker running its
    /// callbacks. Once it reaches 0 it is never raised again.
    refcount: AtomicUsize,
    /// Completed by whoever drops the last reference.
    done: Completion,
    /// `Some` from registration until unregister takes it out, which happens
    /// only after `refcount` reached 0.
    callback: UnsafeCell<Option<Box<dyn Shrinker>>>,
    /// Deferred work for root reclaim, one per shard (one if not shard-aware).
    pub(crate) nr_deferred: Box<[AtomicI64]>,
    pub(crate) stats: NodeStats,
}

impl core::fmt::Debug for Node {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.id)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

// SAFETY: `callback` is read (`with`) only by a thread that holds a reference
// (refcount > 0), and written (`with_mut`) only by unregister after the count
// reached 0, which no `try_get` can undo; every other field is atomic or
// immutable. `Box<dyn Shrinker>` is Send + Sync.
unsafe impl Sync for Node {}
// SAFETY: all fields are Send (`dyn Shrinker: Send`).
unsafe impl Send for Node {}

impl Node {
    /// The kernel's `shrinker_try_get`: a reference unless the count is 0.
    fn try_get(&self) -> bool {
        let mut c = self.refcount.load(Ordering::Relaxed);
        loop {
            if c == 0 {
                return false;
            }
            match self.refcount.compare_exchange_weak(
                c,
                c + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => c = now,
            }
        }
    }

    /// The kernel's `shrinker_put`, for walkers (unregister drops the
    /// registration's reference itself). The caller must keep the node alive
    /// across this call with a guard: the last put touches `done` after the
    /// count reaches 0.
    ///
    /// `this` is dereferenced afresh after the decrement, so that under loom an
    /// access to a node already reclaimed is caught.
    fn put(this: &Rcu<Node>) {
        if this.refcount.fetch_sub(1, Ordering::Release) == 1 {
            fence(Ordering::Acquire);
            this.done.complete();
        }
    }

    fn count(&self, sc: &ShrinkControl) -> Count {
        self.callback.with(|p| {
            // SAFETY: the caller holds a reference (see `Node`'s Sync impl).
            match unsafe { &*p } {
                Some(s) => s.count_objects(sc),
                None => Count::Empty,
            }
        })
    }

    fn scan(&self, sc: &mut ShrinkControl) -> Scan {
        self.callback.with(|p| {
            // SAFETY: the caller holds a reference (see `Node`'s Sync impl).
            match unsafe { &*p } {
                Some(s) => s.scan_objects(sc),
                None => Scan::Stop,
            }
        })
    }

    pub(crate) fn deferred_slot(&self, shard: usize) -> &AtomicI64 {
        let i = if self.config.shard_aware {
            shard.min(self.nr_deferred.len() - 1)
        } else {
            0
        };
        &self.nr_deferred[i]
    }
}

/// The id table: slot `i` holds shrinker `i` or null. Grown by copy.
#[derive(Debug)]
struct Table<T> {
    slots: Box<[AtomicPtr<Rcu<T>>]>,
}

impl<T> Table<T> {
    fn with_capacity(n: usize) -> Self {
        Self {
            slots: (0..n)
                .map(|_| AtomicPtr::new(core::ptr::null_mut()))
                .collect(),
        }
    }
}

/// Lowest-free id allocation (the kernel's idr).
#[derive(Debug, Default)]
struct Ids {
    used: Vec<bool>,
}

impl Ids {
    fn alloc(&mut self, max: usize) -> Option<usize> {
        if let Some(i) = self.used.iter().position(|u| !u) {
            self.used[i] = true;
            return Some(i);
        }
        if self.used.len() >= max {
            return None;
        }
        self.used.push(true);
        Some(self.used.len() - 1)
    }

    fn free(&mut self, i: usize) {
        if let Some(u) = self.used.get_mut(i) {
            *u = false;
        }
        while self.used.last() == Some(&false) {
            self.used.pop();
        }
    }

    fn is_used(&self, i: usize) -> bool {
        self.used.get(i).copied().unwrap_or(false)
    }
}

/// What only writers (register, unregister, group changes) touch, under one mutex.
#[derive(Debug)]
struct Writer {
    shrinker_ids: Ids,
    group_ids: Ids,
    /// Parent of each online group, by group index.
    group_parent: Vec<Option<GroupId>>,
    /// Units per shard in every group's info.
    nr_units: usize,
}

pub(crate) struct Inner {
    epoch: Epoch,
    nr_shards: usize,
    /// INVARIANT: never null; retired only after being replaced.
    shrinkers: AtomicPtr<Rcu<Table<Node>>>,
    /// INVARIANT: never null; retired only after being replaced.
    groups: AtomicPtr<Rcu<Table<Group>>>,
    writer: Mutex<Writer>,
    /// In-flight shrinks per phase, for `synchronize` (an SRCU-like pair).
    inflight: [AtomicUsize; 2],
    phase: AtomicUsize,
    sync_lock: Mutex<()>,
    shrinks: StatCounter,
}

impl core::fmt::Debug for Inner {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Inner")
            .field("nr_shards", &self.nr_shards)
            .finish_non_exhaustive()
    }
}

/// A registry of reclaim callbacks whose shrink walk takes no lock.
///
/// Cloning gives another handle to the same registry.
#[derive(Debug, Clone)]
pub struct ShrinkerRegistry {
    inner: Arc<Inner>,
}

/// The registration of one shrinker. Dropping it unregisters the shrinker (see
/// [`ShrinkerHandle::unregister`]).
#[derive(Debug)]
pub struct ShrinkerHandle {
    inner: Arc<Inner>,
    /// INVARIANT: a node registered in `inner` and not yet unregistered, or
    /// null after `unregister`.
    node: *const Rcu<Node>,
}

// SAFETY: the handle only reads the node (atomics, immutable fields) and
// unregisters it once; `Node` is Send + Sync.
unsafe impl Send for ShrinkerHandle {}
// SAFETY: `&ShrinkerHandle` only allows reads of atomics and immutable fields.
unsafe impl Sync for ShrinkerHandle {}

/// What an unregistration had to wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unregistered {
    /// Walkers running this shrinker's callbacks when unregistration started
    /// (each holds a reference; unregister waited for them and only them,
    /// at most one callback per walker).
    pub in_flight: usize,
}

/// A reference held while the node's callbacks run with no guard. Dropping it
/// (also on unwind out of a callback) re-pins and puts.
struct Hold<'r> {
    inner: &'r Inner,
    node: *const Rcu<Node>,
}

impl Hold<'_> {
    fn node(&self) -> &Node {
        // SAFETY: we hold a reference, so the node's refcount is > 0,
        // unregister has not passed its wait, and the node is not retired.
        unsafe { &*self.node }
    }

    /// Drops the reference under `guard` (already pinned by the walk).
    fn release(self, guard: &Guard<'_>) {
        let _ = guard;
        // SAFETY: as in `node`; `guard` keeps the node alive past the put, until
        // the walk unpins, even if unregister retires it right after.
        unsafe { Node::put(&*self.node) };
        core::mem::forget(self);
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        let guard = self.inner.epoch.pin();
        // SAFETY: as in `release`.
        unsafe { Node::put(&*self.node) };
        drop(guard);
    }
}

/// Marks one shrink as in flight for `synchronize`.
struct InFlight<'r> {
    inner: &'r Inner,
    phase: usize,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.inner.inflight[self.phase].fetch_sub(1, Ordering::Release);
    }
}

impl Default for ShrinkerRegistry {
    fn default() -> Self {
        Self::with_shards(1)
    }
}

impl ShrinkerRegistry {
    /// A registry with `nr_shards` shards (the kernel's NUMA nodes).
    pub fn new(nr_shards: usize) -> Result<Self, ShrinkerError> {
        if nr_shards == 0 {
            return Err(ShrinkerError::NoShards);
        }
        Ok(Self::with_shards(nr_shards))
    }

    fn with_shards(nr_shards: usize) -> Self {
        let inner = Inner {
            epoch: Epoch::new(),
            nr_shards,
            shrinkers: AtomicPtr::new(Rcu::into_raw(Table::with_capacity(INITIAL_TABLE))),
            groups: AtomicPtr::new(Rcu::into_raw(Table::with_capacity(INITIAL_TABLE))),
            writer: Mutex::new(Writer {
                shrinker_ids: Ids::default(),
                group_ids: Ids::default(),
                group_parent: Vec::new(),
                nr_units: 1,
            }),
            inflight: [AtomicUsize::new(0), AtomicUsize::new(0)],
            phase: AtomicUsize::new(0),
            sync_lock: Mutex::new(()),
            shrinks: StatCounter::new(0),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The number of shards.
    pub fn nr_shards(&self) -> usize {
        self.inner.nr_shards
    }

    /// Registers `shrinker`. It may be called by a shrink that starts after
    /// this returns (and by one already walking, if the walk has not passed its
    /// id yet).
    pub fn register<S: Shrinker>(
        &self,
        config: ShrinkerConfig,
        shrinker: S,
    ) -> Result<ShrinkerHandle, ShrinkerError> {
        let inner = &*self.inner;
        let mut w = lock(&inner.writer);
        let id = w
            .shrinker_ids
            .alloc(MAX_SHRINKERS)
            .ok_or(ShrinkerError::TooMany {
                what: "shrinkers",
                max: MAX_SHRINKERS,
            })?;
        let nr_deferred = if config.shard_aware {
            inner.nr_shards
        } else {
            1
        };
        let memcg_aware = config.memcg_aware;
        let node = Rcu::into_raw(Node {
            id: ShrinkerId(id as u32),
            refcount: AtomicUsize::new(1),
            done: Completion::new(),
            callback: UnsafeCell::new(Some(Box::new(shrinker))),
            nr_deferred: (0..nr_deferred).map(|_| AtomicI64::new(0)).collect(),
            stats: NodeStats::default(),
            config,
        });
        let guard = inner.epoch.pin();
        if memcg_aware {
            inner.expand_groups(&mut w, &guard, id);
        }
        let table = inner.grow_table(&inner.shrinkers, &guard, id);
        table.slots[id].store(node, Ordering::Release);
        drop(guard);
        drop(w);
        Ok(ShrinkerHandle {
            inner: Arc::clone(&self.inner),
            node,
        })
    }

    /// Runs one shrink walk and returns the objects freed.
    ///
    /// Root walk (`group: None`): every registered shrinker, in id order. Group
    /// walk: the group-aware shrinkers whose bit is set in the group's bitmap
    /// for `shard`. No lock is taken: each shrinker is pinned by a reference
    /// while its callbacks run with no epoch guard held.
    pub fn shrink(&self, req: &ShrinkRequest) -> Result<u64, ShrinkerError> {
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
        let _in_flight = inner.enter();
        inner.shrinks.fetch_add(1, Ordering::Relaxed);
        match req.group {
            None => Ok(inner.shrink_root(req)),
            Some(g) => inner.shrink_group(req, g),
        }
    }

    /// Waits until every shrink that started before this call has returned
    /// (the kernel's `synchronize_shrinkers`). Shrinks that start meanwhile are
    /// not waited for.
    pub fn synchronize(&self) {
        let inner = &*self.inner;
        let _one = lock(&inner.sync_lock);
        let old = inner.phase.fetch_add(1, Ordering::SeqCst) & 1;
        fence(Ordering::SeqCst);
        while inner.inflight[old].load(Ordering::Acquire) != 0 {
            yield_now();
        }
    }

    /// Creates a group under `parent` (`None`: a child of the root).
    pub fn create_group(&self, parent: Option<GroupId>) -> Result<GroupId, ShrinkerError> {
        let inner = &*self.inner;
        let mut w = lock(&inner.writer);
        if let Some(p) = parent {
            if !w.group_ids.is_used(p.0 as usize) {
                return Err(ShrinkerError::UnknownGroup(p));
            }
        }
        let id = w
            .group_ids
            .alloc(MAX_GROUPS)
            .ok_or(ShrinkerError::TooMany {
                what: "groups",
                max: MAX_GROUPS,
            })?;
        if w.group_parent.len() <= id {
            w.group_parent.resize(id + 1, None);
        }
        w.group_parent[id] = parent;
        let info = Rcu::into_raw(GroupInfo::new(inner.nr_shards, w.nr_units));
        let group = Rcu::into_raw(Group {
            parent,
            info: AtomicPtr::new(info),
        });
        let guard = inner.epoch.pin();
        let table = inner.grow_table(&inner.groups, &guard, id);
        table.slots[id].store(group, Ordering::Release);
        Ok(GroupId(id as u32))
    }

    /// Takes a group offline (the kernel's memcg offline): its deferred work
    /// goes to its parent (or, for a child of the root, to each shrinker's own
    /// deferred work), and its arrays are freed after a grace period. Its id
    /// may be handed out again.
    pub fn offline_group(&self, group: GroupId) -> Result<(), ShrinkerError> {
        let inner = &*self.inner;
        let mut w = lock(&inner.writer);
        let gi = group.0 as usize;
        if !w.group_ids.is_used(gi) {
            return Err(ShrinkerError::UnknownGroup(group));
        }
        if let Some(child) = (0..w.group_parent.len())
            .find(|&c| w.group_ids.is_used(c) && w.group_parent[c] == Some(group))
        {
            return Err(ShrinkerError::GroupHasChildren {
                group,
                child: GroupId(child as u32),
            });
        }
        let guard = inner.epoch.pin();
        let gtable = inner.group_table(&guard);
        let gptr = gtable.slots[gi].load(Ordering::Relaxed);
        // SAFETY: the writer lock is held and the group is online, so the slot
        // holds a live group (writers are the only ones who unlink or retire).
        let g = unsafe { &*gptr };
        // SAFETY: group infos are never null while the group is reachable.
        let Some(info) = (unsafe { guard.load(&g.info) }) else {
            return Err(ShrinkerError::UnknownGroup(group));
        };
        let parent_info = g.parent.and_then(|p| inner.group_info(&guard, p));
        let stable = inner.shrinker_table(&guard);
        for shard in 0..inner.nr_shards {
            for u in 0..info.nr_units {
                for b in 0..UNIT_BITS {
                    let id = u * UNIT_BITS + b;
                    let Some(unit) = info.unit(shard, id) else {
                        continue;
                    };
                    let v = unit.nr_deferred[b].swap(0, Ordering::Relaxed);
                    if v <= 0 {
                        continue;
                    }
                    match parent_info {
                        Some(pi) => {
                            if let Some(pu) = pi.unit(shard, id) {
                                pu.nr_deferred[b].fetch_add(v, Ordering::Relaxed);
                            }
                        }
                        None => {
                            let load = |s| {
                                // SAFETY: slots hold live nodes under the guard.
                                unsafe { guard.load(s) }
                            };
                            if let Some(node) = stable.slots.get(id).and_then(load) {
                                node.deferred_slot(shard).fetch_add(v, Ordering::Relaxed);
                            }
                        }
                    }
                }
            }
        }
        gtable.slots[gi].store(core::ptr::null_mut(), Ordering::Release);
        let info_ptr = g.info.load(Ordering::Relaxed);
        for &u in info.unit_ptrs() {
            // SAFETY: the group is unlinked, so its units are unreachable for
            // new readers; each unit belongs to exactly this group's current
            // info (older infos shared them but are retired without them).
            unsafe { guard.retire(u) };
        }
        // SAFETY: unlinked above; retired once, here.
        unsafe { guard.retire(info_ptr) };
        // SAFETY: unlinked above; retired once, here.
        unsafe { guard.retire(gptr) };
        w.group_ids.free(gi);
        if let Some(p) = w.group_parent.get_mut(gi) {
            *p = None;
        }
        guard.flush();
        Ok(())
    }

    /// Marks shrinker `id` as possibly having objects in `group` / `shard` (the
    /// kernel's `set_shrinker_bit`), so that group walks call it.
    pub fn set_shrinker_bit(
        &self,
        group: GroupId,
        shard: usize,
        id: ShrinkerId,
    ) -> Result<(), ShrinkerError> {
        let inner = &*self.inner;
        if shard >= inner.nr_shards {
            return Err(ShrinkerError::ShardOutOfRange {
                shard,
                nr_shards: inner.nr_shards,
            });
        }
        let guard = inner.epoch.pin();
        let i = id.0 as usize;
        let table = inner.shrinker_table(&guard);
        // SAFETY: slots hold live nodes under the guard.
        let Some(node) = table.slots.get(i).and_then(|s| unsafe { guard.load(s) }) else {
            return Err(ShrinkerError::UnknownShrinker(id));
        };
        if !node.config.memcg_aware {
            return Err(ShrinkerError::NotMemcgAware(id));
        }
        let info = inner
            .group_info(&guard, group)
            .ok_or(ShrinkerError::UnknownGroup(group))?;
        let Some(unit) = info.unit(shard, i) else {
            // Cannot happen: arrays grow before a group-aware id is published.
            return Err(ShrinkerError::UnknownShrinker(id));
        };
        let bit = 1u64 << (i % UNIT_BITS);
        // Pairs with the fence in `shrink_group` between clearing a bit and
        // counting again: either the walk sees the new objects or we see the
        // bit cleared and set it.
        fence(Ordering::SeqCst);
        if unit.map.load(Ordering::Relaxed) & bit == 0 {
            unit.map.fetch_or(bit, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Whether shrinker `id`'s bit is set in `group` / `shard`.
    pub fn shrinker_bit(
        &self,
        group: GroupId,
        shard: usize,
        id: ShrinkerId,
    ) -> Result<bool, ShrinkerError> {
        let inner = &*self.inner;
        let guard = inner.epoch.pin();
        let info = inner
            .group_info(&guard, group)
            .ok_or(ShrinkerError::UnknownGroup(group))?;
        let i = id.0 as usize;
        Ok(info
            .unit(shard, i)
            .is_some_and(|u| u.map.load(Ordering::Acquire) & (1 << (i % UNIT_BITS)) != 0))
    }

    /// The work deferred for shrinker `id` in `group` (`None`: its own, root)
    /// and `shard`.
    pub fn nr_deferred(
        &self,
        id: ShrinkerId,
        group: Option<GroupId>,
        shard: usize,
    ) -> Result<i64, ShrinkerError> {
        let inner = &*self.inner;
        if shard >= inner.nr_shards {
            return Err(ShrinkerError::ShardOutOfRange {
                shard,
                nr_shards: inner.nr_shards,
            });
        }
        let guard = inner.epoch.pin();
        let i = id.0 as usize;
        let table = inner.shrinker_table(&guard);
        // SAFETY: slots hold live nodes under the guard.
        let node = table
            .slots
            .get(i)
            .and_then(|s| unsafe { guard.load(s) })
            .ok_or(ShrinkerError::UnknownShrinker(id))?;
        let shard = if node.config.shard_aware { shard } else { 0 };
        match group {
            None => Ok(node.deferred_slot(shard).load(Ordering::Relaxed)),
            Some(g) => {
                let info = inner
                    .group_info(&guard, g)
                    .ok_or(ShrinkerError::UnknownGroup(g))?;
                Ok(info
                    .unit(shard, i)
                    .map_or(0, |u| u.nr_deferred[i % UNIT_BITS].load(Ordering::Relaxed)))
            }
        }
    }

    /// Statistics of every registered shrinker, by id.
    pub fn stats(&self) -> Vec<ShrinkerStats> {
        let inner = &*self.inner;
        let guard = inner.epoch.pin();
        let table = inner.shrinker_table(&guard);
        table
            .slots
            .iter()
            // SAFETY: slots hold live nodes under the guard.
            .filter_map(|s| unsafe { guard.load(s) })
            .map(|n| ShrinkerStats::of(n))
            .collect()
    }

    /// Registry-wide counters.
    pub fn registry_stats(&self) -> RegistryStats {
        RegistryStats {
            shrinks: self.inner.shrinks.load(Ordering::Relaxed),
            skipped: 0,
        }
    }

    /// The number of registered shrinkers.
    pub fn len(&self) -> usize {
        lock(&self.inner.writer)
            .shrinker_ids
            .used
            .iter()
            .filter(|u| **u)
            .count()
    }

    /// Whether no shrinker is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ShrinkerHandle {
    /// This shrinker's id (its bit in group bitmaps).
    pub fn id(&self) -> ShrinkerId {
        self.node().id
    }

    fn node(&self) -> &Node {
        // SAFETY: INVARIANT of `node`: non-null and registered until
        // `unregister` consumes the handle, and only unregister retires it.
        unsafe { &*self.node }
    }

    /// Marks this shrinker as possibly having objects in `group` / `shard`.
    pub fn set_shrinker_bit(&self, group: GroupId, shard: usize) -> Result<(), ShrinkerError> {
        ShrinkerRegistry {
            inner: Arc::clone(&self.inner),
        }
        .set_shrinker_bit(group, shard, self.id())
    }

    /// This shrinker's statistics.
    pub fn stats(&self) -> ShrinkerStats {
        ShrinkerStats::of(self.node())
    }

    /// Unregisters the shrinker (the kernel's `shrinker_free`). Waits until no
    /// callback of this shrinker is running (only this shrinker's: other
    /// shrinkers' callbacks are not waited for); after it returns no callback
    /// runs again, the callback object has been dropped, and the rest of the
    /// shrinker's memory is freed after an epoch grace period.
    pub fn unregister(mut self) -> Unregistered {
        let node = core::mem::replace(&mut self.node, core::ptr::null());
        self.inner.unregister(node)
    }
}

impl Drop for ShrinkerHandle {
    fn drop(&mut self) {
        if !self.node.is_null() {
            let node = core::mem::replace(&mut self.node, core::ptr::null());
            self.inner.unregister(node);
        }
    }
}

impl Inner {
    fn shrinker_table<'g>(&self, guard: &'g Guard<'_>) -> &'g Table<Node> {
        // SAFETY: INVARIANT of `shrinkers`: never null, replaced tables are
        // retired, so the loaded table lives as long as the guard.
        unsafe { guard.load(&self.shrinkers) }.expect("INVARIANT: the shrinker table is never null")
    }

    fn group_table<'g>(&self, guard: &'g Guard<'_>) -> &'g Table<Group> {
        // SAFETY: as for `shrinker_table`.
        unsafe { guard.load(&self.groups) }.expect("INVARIANT: the group table is never null")
    }

    fn group_info<'g>(&self, guard: &'g Guard<'_>, group: GroupId) -> Option<&'g GroupInfo> {
        let table = self.group_table(guard);
        // SAFETY: slots hold live groups (and groups live infos) under the guard.
        let g = unsafe { guard.load(table.slots.get(group.0 as usize)?) }?;
        // SAFETY: as above.
        unsafe { guard.load(&g.info) }.map(|i| &**i)
    }

    /// Makes `slot` addressable in the table behind `ptr`, growing it by copy.
    /// Writer lock held.
    fn grow_table<'g, T: Send + 'static>(
        &self,
        ptr: &AtomicPtr<Rcu<Table<T>>>,
        guard: &'g Guard<'_>,
        slot: usize,
    ) -> &'g Table<T> {
        // SAFETY: tables are never null and only retired after replacement.
        let old = unsafe { guard.load(ptr) }.expect("INVARIANT: tables are never null");
        if slot < old.slots.len() {
            return old;
        }
        let cap = (old.slots.len() * 2).max(slot + 1);
        let new = Table::with_capacity(cap);
        for (n, o) in new.slots.iter().zip(old.slots.iter()) {
            // Writers are serialised by the writer lock: no slot changes now.
            n.store(o.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        let new = Rcu::into_raw(new);
        let old_ptr = ptr.swap(new, Ordering::AcqRel);
        // SAFETY: `old_ptr` was just unlinked (replaced), and is retired once.
        unsafe { guard.retire(old_ptr) };
        // SAFETY: just published; lives until replaced and a grace period passes.
        unsafe { &*new }
    }

    /// The kernel's `expand_shrinker_info`: grow every group's arrays so that
    /// shrinker `id` has a bit. Writer lock held.
    fn expand_groups(&self, w: &mut Writer, guard: &Guard<'_>, id: usize) {
        let needed = id / UNIT_BITS + 1;
        if needed <= w.nr_units {
            return;
        }
        let new_units = needed.max(w.nr_units * 2);
        let table = self.group_table(guard);
        for (gi, slot) in table.slots.iter().enumerate() {
            if !w.group_ids.is_used(gi) {
                continue;
            }
            // SAFETY: slots hold live groups under the guard.
            let Some(g) = (unsafe { guard.load(slot) }) else {
                continue;
            };
            // SAFETY: infos are live under the guard.
            let Some(old) = (unsafe { guard.load(&g.info) }) else {
                continue;
            };
            let new = Rcu::into_raw(GroupInfo::expand(old, self.nr_shards, new_units));
            let old_ptr = g.info.swap(new, Ordering::AcqRel);
            // SAFETY: replaced above, retired once; its units are shared with
            // the new info and are not freed with it (GroupInfo has no Drop).
            unsafe { guard.retire(old_ptr) };
        }
        w.nr_units = new_units;
    }

    fn enter(&self) -> InFlight<'_> {
        loop {
            let phase = self.phase.load(Ordering::Relaxed) & 1;
            self.inflight[phase].fetch_add(1, Ordering::Relaxed);
            // Dekker with the fence in `synchronize`: either it sees our count
            // or we see its new phase and retry in the new phase.
            fence(Ordering::SeqCst);
            if self.phase.load(Ordering::Relaxed) & 1 == phase {
                return InFlight { inner: self, phase };
            }
            self.inflight[phase].fetch_sub(1, Ordering::Release);
        }
    }

    /// Finds the next shrinker at or after `from` and takes a reference on it.
    fn next_root(&self, guard: &Guard<'_>, from: usize) -> Option<(usize, *const Rcu<Node>)> {
        let table = self.shrinker_table(guard);
        for (i, slot) in table.slots.iter().enumerate().skip(from) {
            // SAFETY: slots hold live nodes under the guard.
            if let Some(node) = unsafe { guard.load(slot) } {
                if node.try_get() {
                    return Some((i, node as *const Rcu<Node>));
                }
            }
        }
        None
    }

    fn shrink_root(&self, req: &ShrinkRequest) -> u64 {
        let mut freed = 0u64;
        // One pin for the whole walk: it is left while each shrinker's
        // callbacks run (never a guard across user code) and re-entered to
        // put the reference and find the next shrinker.
        let mut guard = self.epoch.pin();
        let mut from = 0;
        while let Some((i, node)) = self.next_root(&guard, from) {
            let hold = Hold { inner: self, node };
            let out = guard.repin_after(|| {
                let n = hold.node();
                let shard = if n.config.shard_aware { req.shard } else { 0 };
                let mut sc = ShrinkControl::new(None, shard, req.priority);
                do_shrink_slab(
                    &n.config,
                    &n.stats,
                    &mut sc,
                    &RootDeferred(n),
                    |sc| n.count(sc),
                    |sc| n.scan(sc),
                )
            });
            if let ShrinkOutcome::Freed(f) = out {
                freed = freed.saturating_add(f);
            }
            hold.release(&guard);
            from = i + 1;
        }
        freed
    }

    /// Finds the next set bit at or after `pos` in `group`'s bitmap for `shard`
    /// whose shrinker is live, and takes a reference on it. Returns `None` at
    /// the end of the arrays or if the group went offline.
    fn next_in_group(
        &self,
        guard: &Guard<'_>,
        group: GroupId,
        shard: usize,
        mut pos: usize,
    ) -> Option<(usize, *const Rcu<Node>)> {
        let info = self.group_info(guard, group)?;
        // The id table is loaded afresh for every set bit: a bit read here may
        // have been set by a shrinker published in a table newer than one
        // loaded before the bitmap word.
        let lookup = |id: usize| {
            // SAFETY: slots hold live nodes under the guard.
            self.shrinker_table(guard)
                .slots
                .get(id)
                .and_then(|s| unsafe { guard.load(s) })
        };
        loop {
            let unit = info.unit(shard, pos)?;
            let base = pos - pos % UNIT_BITS;
            let mut map = unit.map.load(Ordering::Acquire) & (!0u64 << (pos % UNIT_BITS));
            while map != 0 {
                let id = base + map.trailing_zeros() as usize;
                map &= map - 1;
                let bit = 1u64 << (id % UNIT_BITS);
                match lookup(id) {
                    None => {
                        // A stale bit (set through a raw id racing with
                        // unregister). Clear it; if a shrinker took the id
                        // meanwhile, set it again (Dekker with the fence in
                        // `set_shrinker_bit`: it sees the clear or we see it).
                        unit.map.fetch_and(!bit, Ordering::SeqCst);
                        fence(Ordering::SeqCst);
                        if lookup(id).is_some() {
                            unit.map.fetch_or(bit, Ordering::SeqCst);
                        }
                    }
                    Some(node) => {
                        if node.try_get() {
                            return Some((id, node as *const Rcu<Node>));
                        }
                        // Being unregistered: unregister clears its bits.
                    }
                }
            }
            pos = base + UNIT_BITS;
        }
    }

    fn shrink_group(&self, req: &ShrinkRequest, group: GroupId) -> Result<u64, ShrinkerError> {
        let mut freed = 0u64;
        // One pin for the walk, left while callbacks run (see `shrink_root`).
        let mut guard = self.epoch.pin();
        if self.group_info(&guard, group).is_none() {
            return Err(ShrinkerError::UnknownGroup(group));
        }
        let mut pos = 0;
        while let Some((id, node)) = self.next_in_group(&guard, group, req.shard, pos) {
            let hold = Hold { inner: self, node };
            let out = guard.repin_after(|| {
                let n = hold.node();
                let shard = if n.config.shard_aware { req.shard } else { 0 };
                let deferred = GroupDeferred {
                    inner: self,
                    group,
                    shard,
                    id,
                };
                let mut sc = ShrinkControl::new(Some(group), shard, req.priority);
                let mut out = do_shrink_slab(
                    &n.config,
                    &n.stats,
                    &mut sc,
                    &deferred,
                    |sc| n.count(sc),
                    |sc| n.scan(sc),
                );
                if out == ShrinkOutcome::Empty {
                    self.update_bit(group, req.shard, id, false);
                    // Pairs with the fence in `set_shrinker_bit`: an object added
                    // before the bit was set again is seen by this second count.
                    fence(Ordering::SeqCst);
                    let mut sc = ShrinkControl::new(Some(group), shard, req.priority);
                    out = do_shrink_slab(
                        &n.config,
                        &n.stats,
                        &mut sc,
                        &deferred,
                        |sc| n.count(sc),
                        |sc| n.scan(sc),
                    );
                    if out != ShrinkOutcome::Empty {
                        self.update_bit(group, req.shard, id, true);
                    }
                }
                out
            });
            if let ShrinkOutcome::Freed(f) = out {
                freed = freed.saturating_add(f);
            }
            hold.release(&guard);
            pos = id + 1;
        }
        Ok(freed)
    }

    fn update_bit(&self, group: GroupId, shard: usize, id: usize, set: bool) {
        let guard = self.epoch.pin();
        if let Some(unit) = self
            .group_info(&guard, group)
            .and_then(|i| i.unit(shard, id))
        {
            let bit = 1u64 << (id % UNIT_BITS);
            if set {
                unit.map.fetch_or(bit, Ordering::SeqCst);
            } else {
                unit.map.fetch_and(!bit, Ordering::SeqCst);
            }
        }
    }

    fn unregister(&self, ptr: *const Rcu<Node>) -> Unregistered {
        // SAFETY: the handle owned this registration; only this function
        // retires the node, so it is live here.
        let node = unsafe { &*ptr };
        let in_flight = node.refcount.load(Ordering::Relaxed).saturating_sub(1);
        // Drop the registration's reference, then wait for the walkers' ones.
        // When ours is the last, nobody completes `done` and nothing is to be
        // waited for: no lock and no futex wake on the common path. The
        // Acquire fence orders the walkers' callbacks (their Release
        // decrements come before ours in the count's modification order)
        // before the callback object is dropped below.
        if node.refcount.fetch_sub(1, Ordering::Release) == 1 {
            fence(Ordering::Acquire);
        } else {
            node.done.wait();
        }
        // refcount is 0 for good: no callback runs now or later.
        let callback = node.callback.with_mut(|p| {
            // SAFETY: see `Node`'s Sync impl: the count is 0, so no thread
            // reads the cell any more.
            unsafe { (*p).take() }
        });
        {
            let mut w = lock(&self.writer);
            let guard = self.epoch.pin();
            let id = node.id.0 as usize;
            let table = self.shrinker_table(&guard);
            table.slots[id].store(core::ptr::null_mut(), Ordering::Release);
            if node.config.memcg_aware {
                let gtable = self.group_table(&guard);
                for slot in gtable.slots.iter() {
                    // SAFETY: slots hold live groups under the guard.
                    let Some(g) = (unsafe { guard.load(slot) }) else {
                        continue;
                    };
                    // SAFETY: infos are live under the guard.
                    let Some(info) = (unsafe { guard.load(&g.info) }) else {
                        continue;
                    };
                    for shard in 0..self.nr_shards {
                        if let Some(unit) = info.unit(shard, id) {
                            unit.map
                                .fetch_and(!(1u64 << (id % UNIT_BITS)), Ordering::SeqCst);
                            unit.nr_deferred[id % UNIT_BITS].store(0, Ordering::Relaxed);
                        }
                    }
                }
            }
            w.shrinker_ids.free(id);
            // SAFETY: unlinked above; retired once, here. Walkers that loaded it
            // before the unlink hold guards that delay the free.
            unsafe { guard.retire(ptr.cast_mut()) };
        }
        drop(callback);
        Unregistered { in_flight }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // No handle and no registry clone is left: nothing can be reading.
        let stable = self.shrinkers.load(Ordering::Relaxed);
        let gtable = self.groups.load(Ordering::Relaxed);
        // SAFETY: exclusive access (we are in Drop of the last owner); the
        // tables are never null.
        unsafe {
            for slot in (&*gtable).slots.iter() {
                let g = slot.load(Ordering::Relaxed);
                if g.is_null() {
                    continue;
                }
                let info = (&*g).info.load(Ordering::Relaxed);
                for &u in (&*info).unit_ptrs() {
                    Rcu::free_now(u);
                }
                Rcu::free_now(info);
                Rcu::free_now(g);
            }
            for slot in (&*stable).slots.iter() {
                let n = slot.load(Ordering::Relaxed);
                if !n.is_null() {
                    Rcu::free_now(n);
                }
            }
            Rcu::free_now(gtable);
            Rcu::free_now(stable);
        }
    }
}

/// Root reclaim defers work on the shrinker itself.
struct RootDeferred<'n>(&'n Node);

impl DeferredWork for RootDeferred<'_> {
    fn take(&self, shard: usize) -> i64 {
        self.0.deferred_slot(shard).swap(0, Ordering::Relaxed)
    }
    fn add(&self, shard: usize, v: i64) -> i64 {
        let slot = self.0.deferred_slot(shard);
        slot.fetch_add(v, Ordering::Relaxed).saturating_add(v)
    }
}

/// Group reclaim defers work in the group's unit, looked up afresh under a
/// guard each time (the group may go offline while the callback runs).
struct GroupDeferred<'r> {
    inner: &'r Inner,
    group: GroupId,
    shard: usize,
    id: usize,
}

impl DeferredWork for GroupDeferred<'_> {
    fn take(&self, _shard: usize) -> i64 {
        let guard = self.inner.epoch.pin();
        self.inner
            .group_info(&guard, self.group)
            .and_then(|i| i.unit(self.shard, self.id))
            .map_or(0, |u| {
                u.nr_deferred[self.id % UNIT_BITS].swap(0, Ordering::Relaxed)
            })
    }
    fn add(&self, _shard: usize, v: i64) -> i64 {
        let guard = self.inner.epoch.pin();
        self.inner
            .group_info(&guard, self.group)
            .and_then(|i| i.unit(self.shard, self.id))
            .map_or(0, |u| {
                u.nr_deferred[self.id % UNIT_BITS]
                    .fetch_add(v, Ordering::Relaxed)
                    .saturating_add(v)
            })
    }
}
