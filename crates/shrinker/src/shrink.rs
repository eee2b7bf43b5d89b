//! The kernel's `do_shrink_slab` arithmetic, shared by the lockless registry
//! and the baseline.

use crate::control::{Count, Scan, ShrinkControl, ShrinkerConfig};
use crate::stats::NodeStats;
use crate::sync::Ordering;

/// Object counts above this are clamped, so that `2 * freeable` and the
/// deferred sums cannot overflow.
const MAX_OBJECTS: u64 = (i64::MAX / 4) as u64;

/// The result of one `do_shrink_slab`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShrinkOutcome {
    /// `count_objects` said `Count::Empty`.
    Empty,
    /// Objects freed (0 if nothing was freeable or the scan stopped at once).
    Freed(u64),
}

/// Where work not done is carried over (the kernel's `nr_deferred`).
pub(crate) trait DeferredWork {
    /// Takes (and zeroes) the deferred work, so that concurrent shrinks of the
    /// same shrinker do not both do it (`xchg_nr_deferred`).
    fn take(&self, shard: usize) -> i64;
    /// Adds work back; returns the new total (`add_nr_deferred`).
    fn add(&self, shard: usize, v: i64) -> i64;
}

/// One shrinker's share of a shrink walk, after the kernel's `do_shrink_slab`:
///
/// - `delta = (freeable >> priority) * 4 / seeks` (or `freeable / 2` when
///   `seeks == 0`): the new work this pass adds;
/// - `total_scan = min((nr_deferred >> priority) + delta, 2 * freeable)`;
/// - scan in batches of `batch` while `total_scan >= batch` or
///   `total_scan >= freeable` (a small cache is still emptied under pressure);
/// - carry over `clamp(nr_deferred + delta - scanned, 0, 2 * freeable)`.
///
/// A `scan_objects` that returns [`Scan::Stop`] or reports `nr_scanned == 0`
/// ends the loop (the second is a livelock guard the kernel lacks).
pub(crate) fn do_shrink_slab(
    config: &ShrinkerConfig,
    stats: &NodeStats,
    sc: &mut ShrinkControl,
    deferred: &impl DeferredWork,
    mut count: impl FnMut(&ShrinkControl) -> Count,
    mut scan: impl FnMut(&mut ShrinkControl) -> Scan,
) -> ShrinkOutcome {
    let priority = sc.priority.min(63);
    stats.count_calls.fetch_add(1, Ordering::Relaxed);
    let freeable = match count(sc) {
        Count::Empty => {
            stats.empty_counts.fetch_add(1, Ordering::Relaxed);
            return ShrinkOutcome::Empty;
        }
        Count::Objects(0) => return ShrinkOutcome::Freed(0),
        Count::Objects(n) => n.min(MAX_OBJECTS) as i64,
    };
    let nr = deferred.take(sc.shard).clamp(0, 2 * freeable);
    let delta = if config.seeks > 0 {
        (freeable >> priority).saturating_mul(4) / i64::from(config.seeks)
    } else {
        freeable / 2
    };
    let mut total_scan = (nr >> priority).saturating_add(delta).min(2 * freeable);
    let batch = config.effective_batch().min(MAX_OBJECTS) as i64;
    let mut scanned = 0i64;
    let mut freed = 0u64;
    while total_scan >= batch || total_scan >= freeable {
        let nr_to_scan = batch.min(total_scan);
        sc.nr_to_scan = nr_to_scan as u64;
        sc.nr_scanned = nr_to_scan as u64;
        stats.scan_calls.fetch_add(1, Ordering::Relaxed);
        match scan(sc) {
            Scan::Stop => break,
            Scan::Freed(f) => freed = freed.saturating_add(f),
        }
        let did = sc.nr_scanned.min(MAX_OBJECTS) as i64;
        if did == 0 {
            break;
        }
        total_scan -= did;
        scanned = scanned.saturating_add(did);
    }
    stats
        .objects_scanned
        .fetch_add(scanned as u64, Ordering::Relaxed);
    stats.objects_freed.fetch_add(freed, Ordering::Relaxed);
    let next = nr
        .saturating_add(delta)
        .saturating_sub(scanned)
        .clamp(0, 2 * freeable);
    if next > 0 {
        deferred.add(sc.shard, next);
    }
    ShrinkOutcome::Freed(freed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::cell::Cell;

    struct Deferred(Cell<i64>);
    impl DeferredWork for Deferred {
        fn take(&self, _: usize) -> i64 {
            self.0.replace(0)
        }
        fn add(&self, _: usize, v: i64) -> i64 {
            self.0.set(self.0.get() + v);
            self.0.get()
        }
    }

    fn run(
        config: &ShrinkerConfig,
        objects: u64,
        priority: u32,
        deferred: &Deferred,
    ) -> (Vec<u64>, ShrinkOutcome) {
        let stats = NodeStats::default();
        let mut sc = ShrinkControl::new(None, 0, priority);
        let mut calls = Vec::new();
        let out = do_shrink_slab(
            config,
            &stats,
            &mut sc,
            deferred,
            |_| Count::Objects(objects),
            |sc| {
                calls.push(sc.nr_to_scan);
                Scan::Freed(sc.nr_to_scan)
            },
        );
        (calls, out)
    }

    #[test]
    fn default_priority_defers_small_work() {
        // 10000 objects at priority 12: delta = (10000 >> 12) * 4 / 2 = 4,
        // below the batch of 128: nothing scanned, 4 deferred.
        let d = Deferred(Cell::new(0));
        let (calls, out) = run(&ShrinkerConfig::new("t"), 10_000, 12, &d);
        assert!(calls.is_empty());
        assert_eq!(out, ShrinkOutcome::Freed(0));
        assert_eq!(d.0.get(), 4);
    }

    #[test]
    fn batches_and_remainder_are_deferred() {
        // priority 0: delta = 1000 * 4 / 2 = 2000, capped at 2 * 1000 = 2000.
        // Batches of 128 while total >= 128 or >= 1000: 2000 -> 15 batches
        // (1920 scanned) leave 80 (< 128 and < 1000). Deferred: 0 + 2000 - 1920.
        let d = Deferred(Cell::new(0));
        let (calls, out) = run(&ShrinkerConfig::new("t"), 1000, 0, &d);
        assert_eq!(calls.len(), 15);
        assert!(calls.iter().all(|&c| c == 128));
        assert_eq!(out, ShrinkOutcome::Freed(1920));
        assert_eq!(d.0.get(), 80);
    }

    #[test]
    fn small_cache_is_emptied_under_pressure() {
        // 50 objects, priority 0: total_scan = min(100, 100) = 100 >= freeable:
        // scan min(128, 100) = 100 at once, then 0 left.
        let d = Deferred(Cell::new(0));
        let (calls, _) = run(&ShrinkerConfig::new("t"), 50, 0, &d);
        assert_eq!(calls, vec![100]);
        assert_eq!(d.0.get(), 0);
    }

    #[test]
    fn deferred_work_is_taken_and_capped() {
        // Deferred 1_000_000 on 1000 objects is capped at 2 * freeable.
        let d = Deferred(Cell::new(1_000_000));
        let (calls, _) = run(&ShrinkerConfig::new("t").batch(1000), 1000, 12, &d);
        // nr = 2000, total_scan = (2000 >> 12) + 0 = 0: nothing scanned, and
        // next = clamp(2000 + 0 - 0, 0, 2000).
        assert!(calls.is_empty());
        assert_eq!(d.0.get(), 2000);
    }

    #[test]
    fn seeks_zero_trims_half() {
        let d = Deferred(Cell::new(0));
        let (calls, _) = run(&ShrinkerConfig::new("t").seeks(0).batch(100), 1000, 12, &d);
        assert_eq!(calls.iter().sum::<u64>(), 500);
    }

    #[test]
    fn empty_and_stop() {
        let d = Deferred(Cell::new(7));
        let stats = NodeStats::default();
        let cfg = ShrinkerConfig::new("t");
        let mut sc = ShrinkControl::new(None, 0, 0);
        let out = do_shrink_slab(
            &cfg,
            &stats,
            &mut sc,
            &d,
            |_| Count::Empty,
            |_| Scan::Freed(1),
        );
        assert_eq!(out, ShrinkOutcome::Empty);
        assert_eq!(d.0.get(), 7, "an empty shrinker leaves deferred work alone");
        let out = do_shrink_slab(
            &cfg,
            &stats,
            &mut sc,
            &d,
            |_| Count::Objects(1000),
            |_| Scan::Stop,
        );
        assert_eq!(out, ShrinkOutcome::Freed(0));
        // nr = 7, delta = 2000 -> all deferred (capped at 2000).
        assert_eq!(d.0.get(), 2000);
        assert_eq!(stats.scan_calls.load(Ordering::Relaxed), 1);
    }
}
