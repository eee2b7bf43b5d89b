//! Per-group shrinker bitmaps and deferred work (the kernel's `shrinker_info`
//! and `shrinker_info_unit`).
//!
//! A group's arrays are split into units of `UNIT_BITS` shrinkers. Growing the
//! arrays (when a new shrinker id is handed out) publishes a new [`GroupInfo`]
//! that *shares* the old units and adds new ones, so a concurrent
//! `set_shrinker_bit` or deferred-work update on an old unit is never lost to a
//! copy. Only the pointer array is retired; units live as long as the group.

use crate::control::GroupId;
use crate::sync::{AtomicI64, AtomicPtr, AtomicU64, Rcu, UNIT_BITS};

/// `UNIT_BITS` shrinkers' bits and deferred work in one group and shard.
#[derive(Debug)]
pub(crate) struct Unit {
    /// Bit `b` set: shrinker `unit_index * UNIT_BITS + b` may have objects.
    pub(crate) map: AtomicU64,
    /// Work deferred per shrinker (the kernel's `nr_deferred`).
    pub(crate) nr_deferred: [AtomicI64; UNIT_BITS],
}

impl Unit {
    fn new() -> Self {
        Self {
            map: AtomicU64::new(0),
            nr_deferred: core::array::from_fn(|_| AtomicI64::new(0)),
        }
    }
}

/// The unit pointers of one group, shard-major: `units[shard * nr_units + u]`.
#[derive(Debug)]
pub(crate) struct GroupInfo {
    pub(crate) nr_units: usize,
    units: Box<[*mut Rcu<Unit>]>,
}

// SAFETY: the raw pointers are to `Rcu<Unit>`, which is made of atomics (Send +
// Sync); they are only dereferenced under an epoch guard while the group that
// owns them is reachable or has not finished its grace period.
unsafe impl Send for GroupInfo {}
// SAFETY: as above; `GroupInfo` itself is immutable after publication.
unsafe impl Sync for GroupInfo {}

impl GroupInfo {
    /// Fresh arrays for a new group.
    pub(crate) fn new(nr_shards: usize, nr_units: usize) -> Self {
        let units = (0..nr_shards * nr_units)
            .map(|_| Rcu::into_raw(Unit::new()))
            .collect();
        Self { nr_units, units }
    }

    /// Arrays with `nr_units` units per shard that reuse `old`'s units.
    pub(crate) fn expand(old: &GroupInfo, nr_shards: usize, nr_units: usize) -> Self {
        debug_assert!(nr_units >= old.nr_units);
        let mut units = Vec::with_capacity(nr_shards * nr_units);
        for shard in 0..nr_shards {
            for u in 0..nr_units {
                if u < old.nr_units {
                    units.push(old.units[shard * old.nr_units + u]);
                } else {
                    units.push(Rcu::into_raw(Unit::new()));
                }
            }
        }
        Self {
            nr_units,
            units: units.into_boxed_slice(),
        }
    }

    /// The raw unit pointers (for retiring them with the group).
    pub(crate) fn unit_ptrs(&self) -> &[*mut Rcu<Unit>] {
        &self.units
    }

    /// The unit holding shrinker `id`'s bit for `shard`, if the arrays reach it.
    ///
    /// The returned reference must not outlive the guard under which `self`
    /// was loaded: units are retired with their group.
    pub(crate) fn unit(&self, shard: usize, id: usize) -> Option<&Rcu<Unit>> {
        let u = id / UNIT_BITS;
        if u >= self.nr_units {
            return None;
        }
        let p = *self.units.get(shard * self.nr_units + u)?;
        // SAFETY: INVARIANT of `GroupInfo`: every pointer is a live unit while
        // this info is reachable under the caller's guard (units are retired
        // only after the group is unlinked, in the same or a later grace period
        // than this info).
        Some(unsafe { &*p })
    }
}

/// An online group.
#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) parent: Option<GroupId>,
    /// Never null while the group is reachable.
    pub(crate) info: AtomicPtr<Rcu<GroupInfo>>,
}
