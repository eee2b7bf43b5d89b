//! Behaviour of the lockless registry: walks, groups, unregistration.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread;

use shrinker::{
    Count, GroupId, Scan, ShrinkControl, ShrinkRequest, Shrinker, ShrinkerConfig, ShrinkerError,
    ShrinkerRegistry,
};

/// A cache of `objects` that frees what it is asked to and records the
/// controls it saw.
#[derive(Default)]
struct Cache {
    objects: AtomicU64,
    seen: Mutex<Vec<(Option<GroupId>, usize)>>,
}

struct CacheRef(Arc<Cache>);

impl Shrinker for CacheRef {
    fn count_objects(&self, sc: &ShrinkControl) -> Count {
        self.0
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((sc.group, sc.shard));
        match self.0.objects.load(Ordering::SeqCst) {
            0 => Count::Empty,
            n => Count::Objects(n),
        }
    }
    fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
        let n = self.0.objects.load(Ordering::SeqCst).min(sc.nr_to_scan);
        self.0.objects.fetch_sub(n, Ordering::SeqCst);
        Scan::Freed(n)
    }
}

fn cache(n: u64) -> Arc<Cache> {
    let c = Arc::new(Cache::default());
    c.objects.store(n, Ordering::SeqCst);
    c
}

#[test]
fn root_walk_frees_and_counts() {
    let reg = ShrinkerRegistry::default();
    let a = cache(1000);
    let b = cache(0);
    let ha = reg
        .register(ShrinkerConfig::new("a"), CacheRef(a.clone()))
        .unwrap();
    let hb = reg
        .register(ShrinkerConfig::new("b"), CacheRef(b.clone()))
        .unwrap();
    assert_eq!((ha.id().index(), hb.id().index()), (0, 1));
    let freed = reg.shrink(&ShrinkRequest::new(0)).unwrap();
    // priority 0: delta = 2000, capped at 2000, 15 batches of 128 -> 1000 freed
    // (the cache empties after 8 batches; later scans free 0).
    assert_eq!(freed, 1000);
    assert_eq!(a.objects.load(Ordering::SeqCst), 0);
    let s = ha.stats();
    assert_eq!(s.name, "a");
    assert_eq!(
        (s.count_calls, s.scan_calls, s.objects_freed),
        (1, 15, 1000)
    );
    assert_eq!(s.objects_scanned, 1920);
    assert_eq!(s.nr_deferred, 80);
    assert_eq!(hb.stats().empty_counts, 1);
    assert_eq!(reg.stats().len(), 2);
    assert_eq!(reg.registry_stats().shrinks, 1);
    assert_eq!(reg.registry_stats().skipped, 0);
}

#[test]
fn deferred_work_accumulates_at_low_pressure() {
    let reg = ShrinkerRegistry::default();
    let a = cache(100_000);
    let h = reg
        .register(ShrinkerConfig::new("a"), CacheRef(a.clone()))
        .unwrap();
    // priority 12: delta = (100000 >> 12) * 4 / 2 = 48 < batch: deferred.
    reg.shrink(&ShrinkRequest::new(12)).unwrap();
    assert_eq!(reg.nr_deferred(h.id(), None, 0).unwrap(), 48);
    reg.shrink(&ShrinkRequest::new(12)).unwrap();
    assert_eq!(reg.nr_deferred(h.id(), None, 0).unwrap(), 96);
    reg.shrink(&ShrinkRequest::new(12)).unwrap();
    // Deferred work is scaled down by the priority too (96 >> 12 == 0), so at
    // this gentle priority it keeps growing (until capped at 2 * freeable).
    assert_eq!(reg.nr_deferred(h.id(), None, 0).unwrap(), 144);
    assert_eq!(a.objects.load(Ordering::SeqCst), 100_000);
}

#[test]
fn group_walk_visits_only_set_bits_and_clears_empty() {
    let reg = ShrinkerRegistry::default();
    let g = reg.create_group(None).unwrap();
    let a = cache(0);
    let b = cache(500);
    let c = cache(500);
    let ha = reg
        .register(
            ShrinkerConfig::new("a").memcg_aware(true),
            CacheRef(a.clone()),
        )
        .unwrap();
    let hb = reg
        .register(
            ShrinkerConfig::new("b").memcg_aware(true),
            CacheRef(b.clone()),
        )
        .unwrap();
    let _hc = reg
        .register(ShrinkerConfig::new("c"), CacheRef(c.clone()))
        .unwrap();
    ha.set_shrinker_bit(g, 0).unwrap();
    hb.set_shrinker_bit(g, 0).unwrap();
    assert_eq!(
        _hc.set_shrinker_bit(g, 0),
        Err(ShrinkerError::NotMemcgAware(_hc.id()))
    );
    reg.shrink(&ShrinkRequest::new(0).group(g)).unwrap();
    // a was empty: counted twice (the re-check after clearing), bit cleared.
    assert_eq!(
        a.seen.lock().unwrap().as_slice(),
        &[(Some(g), 0), (Some(g), 0)]
    );
    assert!(!reg.shrinker_bit(g, 0, ha.id()).unwrap());
    assert!(reg.shrinker_bit(g, 0, hb.id()).unwrap());
    assert_eq!(b.objects.load(Ordering::SeqCst), 0);
    // c is not group-aware: never called by a group walk.
    assert!(c.seen.lock().unwrap().is_empty());
    // Next group walk: a is not called at all.
    reg.shrink(&ShrinkRequest::new(0).group(g)).unwrap();
    assert_eq!(a.seen.lock().unwrap().len(), 2);
    // A new object and set_shrinker_bit bring it back.
    a.objects.store(10, Ordering::SeqCst);
    ha.set_shrinker_bit(g, 0).unwrap();
    reg.shrink(&ShrinkRequest::new(0).group(g)).unwrap();
    assert_eq!(a.objects.load(Ordering::SeqCst), 0);
}

#[test]
fn arrays_grow_past_one_unit_without_losing_bits() {
    let reg = ShrinkerRegistry::default();
    let groups: Vec<_> = (0..3).map(|_| reg.create_group(None).unwrap()).collect();
    let mut handles = Vec::new();
    let mut caches = Vec::new();
    for i in 0..200 {
        let c = cache(10);
        let h = reg
            .register(
                ShrinkerConfig::new(format!("s{i}")).memcg_aware(true),
                CacheRef(c.clone()),
            )
            .unwrap();
        // Set a bit in group i % 3 right away; later registrations grow the
        // arrays (64 -> 128 -> 256 ids) and must carry it over.
        h.set_shrinker_bit(groups[i % 3], 0).unwrap();
        handles.push(h);
        caches.push(c);
    }
    for (i, h) in handles.iter().enumerate() {
        for (gi, g) in groups.iter().enumerate() {
            assert_eq!(
                reg.shrinker_bit(*g, 0, h.id()).unwrap(),
                gi == i % 3,
                "shrinker {i} group {gi}"
            );
        }
    }
    for g in &groups {
        reg.shrink(&ShrinkRequest::new(0).group(*g)).unwrap();
    }
    assert!(caches.iter().all(|c| c.objects.load(Ordering::SeqCst) == 0));
}

#[test]
fn offline_hands_deferred_work_to_parent() {
    let reg = ShrinkerRegistry::default();
    let parent = reg.create_group(None).unwrap();
    let child = reg.create_group(Some(parent)).unwrap();
    let a = cache(100_000);
    let h = reg
        .register(ShrinkerConfig::new("a").memcg_aware(true), CacheRef(a))
        .unwrap();
    h.set_shrinker_bit(child, 0).unwrap();
    reg.shrink(&ShrinkRequest::new(12).group(child)).unwrap();
    assert_eq!(reg.nr_deferred(h.id(), Some(child), 0).unwrap(), 48);
    assert_eq!(reg.nr_deferred(h.id(), Some(parent), 0).unwrap(), 0);
    assert_eq!(
        reg.offline_group(parent),
        Err(ShrinkerError::GroupHasChildren {
            group: parent,
            child
        })
    );
    reg.offline_group(child).unwrap();
    assert_eq!(reg.nr_deferred(h.id(), Some(parent), 0).unwrap(), 48);
    assert_eq!(
        reg.shrink(&ShrinkRequest::new(0).group(child)),
        Err(ShrinkerError::UnknownGroup(child))
    );
    assert_eq!(
        reg.offline_group(child),
        Err(ShrinkerError::UnknownGroup(child))
    );
    // A child of the root hands its work to the shrinker itself.
    reg.offline_group(parent).unwrap();
    assert_eq!(reg.nr_deferred(h.id(), None, 0).unwrap(), 48);
    // Ids are reused, starting clean.
    let again = reg.create_group(None).unwrap();
    assert_eq!(again.index(), 0);
    assert_eq!(reg.nr_deferred(h.id(), Some(again), 0).unwrap(), 0);
    assert!(!reg.shrinker_bit(again, 0, h.id()).unwrap());
}

#[test]
fn shards_reach_shard_aware_shrinkers_only() {
    let reg = ShrinkerRegistry::new(2).unwrap();
    let a = cache(100_000);
    let b = cache(100_000);
    let ha = reg
        .register(
            ShrinkerConfig::new("a").shard_aware(true),
            CacheRef(a.clone()),
        )
        .unwrap();
    let hb = reg
        .register(ShrinkerConfig::new("b"), CacheRef(b.clone()))
        .unwrap();
    reg.shrink(&ShrinkRequest::new(12).shard(1)).unwrap();
    assert_eq!(a.seen.lock().unwrap().as_slice(), &[(None, 1)]);
    assert_eq!(b.seen.lock().unwrap().as_slice(), &[(None, 0)]);
    assert_eq!(reg.nr_deferred(ha.id(), None, 1).unwrap(), 48);
    assert_eq!(reg.nr_deferred(ha.id(), None, 0).unwrap(), 0);
    assert_eq!(
        reg.nr_deferred(hb.id(), None, 1).unwrap(),
        48,
        "not shard-aware: one counter"
    );
    assert_eq!(
        reg.shrink(&ShrinkRequest::new(0).shard(2)),
        Err(ShrinkerError::ShardOutOfRange {
            shard: 2,
            nr_shards: 2
        })
    );
    assert_eq!(
        reg.shrink(&ShrinkRequest::new(13)),
        Err(ShrinkerError::PriorityOutOfRange {
            priority: 13,
            max: 12
        })
    );
    assert_eq!(
        ShrinkerRegistry::new(0).err(),
        Some(ShrinkerError::NoShards)
    );
}

#[test]
fn ids_are_reused_lowest_first_and_cleared() {
    let reg = ShrinkerRegistry::default();
    let g = reg.create_group(None).unwrap();
    let h0 = reg
        .register(
            ShrinkerConfig::new("0").memcg_aware(true),
            CacheRef(cache(1)),
        )
        .unwrap();
    let h1 = reg
        .register(
            ShrinkerConfig::new("1").memcg_aware(true),
            CacheRef(cache(1)),
        )
        .unwrap();
    h0.set_shrinker_bit(g, 0).unwrap();
    let id0 = h0.id();
    drop(h0);
    assert_eq!(reg.len(), 1);
    assert_eq!(
        reg.set_shrinker_bit(g, 0, id0),
        Err(ShrinkerError::UnknownShrinker(id0))
    );
    let h2 = reg
        .register(
            ShrinkerConfig::new("2").memcg_aware(true),
            CacheRef(cache(1)),
        )
        .unwrap();
    assert_eq!(h2.id(), id0);
    assert!(
        !reg.shrinker_bit(g, 0, h2.id()).unwrap(),
        "bits of the old owner are cleared"
    );
    drop(h1);
}

/// A shrinker whose scan blocks until released, to hold a reference.
struct Blocking {
    entered: mpsc::SyncSender<()>,
    release: Arc<Barrier>,
    unregistered: Arc<AtomicBool>,
    late_calls: Arc<AtomicUsize>,
}

impl Shrinker for Blocking {
    fn count_objects(&self, _: &ShrinkControl) -> Count {
        if self.unregistered.load(Ordering::SeqCst) {
            self.late_calls.fetch_add(1, Ordering::SeqCst);
        }
        Count::Objects(1000)
    }
    fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
        let _ = self.entered.try_send(());
        self.release.wait();
        if self.unregistered.load(Ordering::SeqCst) {
            self.late_calls.fetch_add(1, Ordering::SeqCst);
        }
        sc.nr_scanned = 1 << 20; // one batch only: ends the loop
        Scan::Freed(1)
    }
}

#[test]
fn unregister_waits_for_the_scan_in_flight() {
    // The unregistering thread must have started before the scan is released for the
    // unregistration to see it in flight; nothing observable marks that start, so the scenario
    // is repeated (with a pause before the release) until it has been seen at least once. The
    // safety checks hold in every round. (A single round failed once in CI on a loaded 2-CPU
    // machine: the unregisterer ran only after the release, and `in_flight` was 0.)
    let mut seen_in_flight = false;
    for _round in 0..50 {
        let reg = ShrinkerRegistry::default();
        let (tx, rx) = mpsc::sync_channel(1);
        let release = Arc::new(Barrier::new(2));
        let unregistered = Arc::new(AtomicBool::new(false));
        let late = Arc::new(AtomicUsize::new(0));
        let h = reg
            .register(
                ShrinkerConfig::new("blocking").batch(1000),
                Blocking {
                    entered: tx,
                    release: release.clone(),
                    unregistered: unregistered.clone(),
                    late_calls: late.clone(),
                },
            )
            .unwrap();
        let r = reg.clone();
        let shrinker = thread::spawn(move || r.shrink(&ShrinkRequest::new(0)).unwrap());
        rx.recv().unwrap(); // the scan is running and holds a reference
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let un = unregistered.clone();
        let unregisterer = thread::spawn(move || {
            let report = h.unregister();
            d.store(true, Ordering::SeqCst);
            un.store(true, Ordering::SeqCst);
            report
        });
        // While the scan is blocked, unregister cannot have returned.
        for _ in 0..1000 {
            thread::yield_now();
        }
        thread::sleep(std::time::Duration::from_millis(5));
        assert!(
            !done.load(Ordering::SeqCst),
            "unregister returned while a scan was running"
        );
        release.wait();
        let report = unregisterer.join().unwrap();
        assert!(report.in_flight <= 1, "{report:?}");
        assert_eq!(shrinker.join().unwrap(), 1);
        assert_eq!(late.load(Ordering::SeqCst), 0);
        assert!(reg.is_empty());
        if report.in_flight == 1 {
            seen_in_flight = true;
            break;
        }
    }
    assert!(
        seen_in_flight,
        "in 50 rounds, unregister never started while the scan was in flight"
    );
}

/// Callbacks report any call after their unregister returned.
struct Watched {
    unregistered: Arc<AtomicBool>,
    late: Arc<AtomicUsize>,
}

impl Shrinker for Watched {
    fn count_objects(&self, _: &ShrinkControl) -> Count {
        if self.unregistered.load(Ordering::SeqCst) {
            self.late.fetch_add(1, Ordering::SeqCst);
        }
        Count::Objects(256)
    }
    fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
        if self.unregistered.load(Ordering::SeqCst) {
            self.late.fetch_add(1, Ordering::SeqCst);
        }
        Scan::Freed(sc.nr_to_scan)
    }
}

#[test]
fn no_callback_after_unregister_under_churn() {
    let reg = ShrinkerRegistry::default();
    let groups: Vec<_> = (0..4).map(|_| reg.create_group(None).unwrap()).collect();
    let late = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let _keep: Vec<_> = (0..8)
        .map(|i| {
            let h = reg
                .register(
                    ShrinkerConfig::new("keep").memcg_aware(true),
                    Watched {
                        unregistered: Arc::new(AtomicBool::new(false)),
                        late: late.clone(),
                    },
                )
                .unwrap();
            h.set_shrinker_bit(groups[i % 4], 0).unwrap();
            h
        })
        .collect();
    let started = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..2)
        .map(|t| {
            let reg = reg.clone();
            let stop = stop.clone();
            let groups = groups.clone();
            let started = started.clone();
            thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let req = if n % 2 == 0 {
                        ShrinkRequest::new(0)
                    } else {
                        ShrinkRequest::new(0).group(groups[(n as usize + t) % 4])
                    };
                    reg.shrink(&req).unwrap();
                    if n == 0 {
                        started.fetch_add(1, Ordering::SeqCst);
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    // The churn must overlap the walks: wait until both walkers are running (on a loaded
    // machine the loop below can otherwise finish before they are scheduled).
    while started.load(Ordering::SeqCst) < 2 {
        thread::yield_now();
    }
    for i in 0..300 {
        let flag = Arc::new(AtomicBool::new(false));
        let h = reg
            .register(
                ShrinkerConfig::new("churn").memcg_aware(i % 2 == 0),
                Watched {
                    unregistered: flag.clone(),
                    late: late.clone(),
                },
            )
            .unwrap();
        if i % 2 == 0 {
            h.set_shrinker_bit(groups[i % 4], 0).unwrap();
        }
        thread::yield_now();
        h.unregister();
        flag.store(true, Ordering::SeqCst);
        if i % 50 == 0 {
            reg.synchronize();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let walks: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(walks > 0);
    assert_eq!(
        late.load(Ordering::SeqCst),
        0,
        "a callback ran after its unregister returned"
    );
    assert_eq!(reg.len(), 8);
}

struct Panicking;

impl Shrinker for Panicking {
    fn count_objects(&self, _: &ShrinkControl) -> Count {
        Count::Objects(1000)
    }
    fn scan_objects(&self, _: &mut ShrinkControl) -> Scan {
        panic!("scan failed");
    }
}

#[test]
fn a_panicking_callback_releases_its_reference() {
    let reg = ShrinkerRegistry::default();
    let h = reg.register(ShrinkerConfig::new("p"), Panicking).unwrap();
    let r = reg.clone();
    let res = thread::spawn(move || r.shrink(&ShrinkRequest::new(0))).join();
    assert!(res.is_err());
    // Would hang if the walk had leaked its reference.
    let report = h.unregister();
    assert_eq!(report.in_flight, 0);
}

#[test]
fn synchronize_with_nothing_in_flight_returns() {
    let reg = ShrinkerRegistry::default();
    reg.synchronize();
    let _h = reg
        .register(ShrinkerConfig::new("a"), CacheRef(cache(5)))
        .unwrap();
    reg.shrink(&ShrinkRequest::new(0)).unwrap();
    reg.synchronize();
    reg.synchronize();
}

/// A callback that unregisters *another* shrinker (allowed, as in the kernel:
/// the walk holds a reference only on the shrinker whose callback runs).
struct Unregisters(Mutex<Option<shrinker::ShrinkerHandle>>);

impl Shrinker for Unregisters {
    fn count_objects(&self, _: &ShrinkControl) -> Count {
        if let Some(h) = self.0.lock().unwrap_or_else(|e| e.into_inner()).take() {
            h.unregister();
        }
        Count::Objects(0)
    }
    fn scan_objects(&self, _: &mut ShrinkControl) -> Scan {
        Scan::Stop
    }
}

#[test]
fn a_callback_may_unregister_another_shrinker() {
    let reg = ShrinkerRegistry::default();
    let victim_objs = cache(1000);
    let slot = Arc::new(Unregisters(Mutex::new(None)));
    struct Shared(Arc<Unregisters>);
    impl Shrinker for Shared {
        fn count_objects(&self, sc: &ShrinkControl) -> Count {
            self.0.count_objects(sc)
        }
        fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
            self.0.scan_objects(sc)
        }
    }
    let _killer = reg
        .register(ShrinkerConfig::new("killer"), Shared(slot.clone()))
        .unwrap();
    let victim = reg
        .register(ShrinkerConfig::new("victim"), CacheRef(victim_objs.clone()))
        .unwrap();
    *slot.0.lock().unwrap() = Some(victim);
    // The killer (id 0) runs first and unregisters the victim (id 1), which
    // the walk then never calls.
    assert_eq!(reg.shrink(&ShrinkRequest::new(0)).unwrap(), 0);
    assert_eq!(reg.len(), 1);
    assert!(victim_objs.seen.lock().unwrap().is_empty());
    assert_eq!(victim_objs.objects.load(Ordering::SeqCst), 1000);
}
