//! Per-shrinker statistics (the kernel's shrinker debugfs `count` / `scan`).

use crate::registry::Node;
use crate::sync::Ordering;

/// Statistics counters are plain `std` atomics even under loom: they are
/// never used for synchronisation, and keeping them out of the model keeps
/// the models small.
pub(crate) type StatCounter = std::sync::atomic::AtomicU64;

#[derive(Debug, Default)]
pub(crate) struct NodeStats {
    pub(crate) count_calls: StatCounter,
    pub(crate) scan_calls: StatCounter,
    pub(crate) objects_scanned: StatCounter,
    pub(crate) objects_freed: StatCounter,
    pub(crate) empty_counts: StatCounter,
}

/// A snapshot of one shrinker's statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShrinkerStats {
    /// The shrinker's id.
    pub id: crate::ShrinkerId,
    /// Its name.
    pub name: String,
    /// `count_objects` calls.
    pub count_calls: u64,
    /// `scan_objects` calls.
    pub scan_calls: u64,
    /// Objects scanned (sum of `nr_scanned`).
    pub objects_scanned: u64,
    /// Objects freed (sum of `Scan::Freed`).
    pub objects_freed: u64,
    /// `count_objects` calls that answered `Count::Empty`.
    pub empty_counts: u64,
    /// Root deferred work, summed over shards.
    pub nr_deferred: i64,
}

impl ShrinkerStats {
    pub(crate) fn of(n: &Node) -> Self {
        Self::from_parts(
            n.id,
            &n.config.name,
            &n.stats,
            n.nr_deferred
                .iter()
                .map(|d| d.load(Ordering::Relaxed))
                .sum(),
        )
    }

    pub(crate) fn from_parts(
        id: crate::ShrinkerId,
        name: &str,
        s: &NodeStats,
        nr_deferred: i64,
    ) -> Self {
        Self {
            id,
            name: name.to_owned(),
            count_calls: s.count_calls.load(Ordering::Relaxed),
            scan_calls: s.scan_calls.load(Ordering::Relaxed),
            objects_scanned: s.objects_scanned.load(Ordering::Relaxed),
            objects_freed: s.objects_freed.load(Ordering::Relaxed),
            empty_counts: s.empty_counts.load(Ordering::Relaxed),
            nr_deferred,
        }
    }
}

/// Registry-wide counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistryStats {
    /// Shrink walks started.
    pub shrinks: u64,
    /// Shrink walks given up because a lock was taken (always 0 for the
    /// lockless registry; counted by the baseline).
    pub skipped: u64,
}
