//! Behaviour of the public API: allocation rules, orders, reference counts, bad calls,
//! discard, rotational layout, device-lock economy, several devices, threads.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use swap_alloc::{
    set_cpu_hint, DeviceConfig, DeviceId, DiscardHook, SlotUsage, SwapDevice, SwapEntry, SwapError,
    SwapInfo, MAX_SLOT_COUNT,
};
use swap_alloc_baseline::{order_unaware, GlobalLockDevice, SlotAllocator, SlotCacheDevice};

fn dev(nslots: u64, cs: usize) -> SwapDevice {
    SwapDevice::new(DeviceConfig::new(nslots).cluster_slots(cs).nr_cpus(2)).unwrap()
}

fn e(off: u64) -> SwapEntry {
    SwapEntry::new(DeviceId::default(), off).unwrap()
}

#[test]
fn fills_every_slot_once_then_reports_no_space() {
    set_cpu_hint(Some(0));
    let d = dev(4 * 8, 8);
    let mut seen = HashSet::new();
    for _ in 0..32 {
        assert!(seen.insert(d.alloc(0).unwrap()));
    }
    assert_eq!(d.alloc(0), Err(SwapError::NoSpace { order: 0 }));
    assert_eq!(d.stats().swpout_fallback[0], 1);
    assert_eq!(d.cluster_lists().full, 4);
    d.check_integrity().unwrap();
    for x in seen {
        assert_eq!(d.put(x), Ok(true));
    }
    assert_eq!(d.cluster_lists().free, 4);
    assert_eq!(d.in_use(), 0);
    d.check_integrity().unwrap();
}

#[test]
fn every_order_is_aligned_and_inside_a_cluster() {
    set_cpu_hint(Some(0));
    let d = dev(64 * 512, 512);
    assert_eq!(d.max_order(), 9);
    let mut held = Vec::new();
    for round in 0..3 {
        for order in 0..=9u32 {
            let x = d.alloc(order).unwrap();
            let nr = 1u64 << order;
            assert_eq!(x.offset() % nr, 0, "round {round} order {order}");
            assert_eq!(x.offset() / 512, (x.offset() + nr - 1) / 512);
            held.push((x, order));
        }
    }
    let s = d.stats();
    assert_eq!(s.swpout[9], 3);
    assert_eq!(s.swpout[4], 3);
    d.check_integrity().unwrap();
    for (x, order) in held {
        assert_eq!(d.put_range(x, order), Ok(1 << order));
    }
    assert_eq!(d.in_use(), 0);
    assert_eq!(d.cluster_lists().free, 64);
}

#[test]
fn clusters_serve_one_order() {
    set_cpu_hint(Some(0));
    let d = dev(4 * 16, 16);
    let small = d.alloc(0).unwrap();
    let big = d.alloc(2).unwrap();
    assert_ne!(
        small.offset() / 16,
        big.offset() / 16,
        "orders share a cluster"
    );
    // The order-0 cluster keeps serving order 0, the order-2 cluster order 2.
    let small2 = d.alloc(0).unwrap();
    let big2 = d.alloc(2).unwrap();
    assert_eq!(small2.offset() / 16, small.offset() / 16);
    assert_eq!(big2.offset() / 16, big.offset() / 16);
    assert_eq!(d.cluster_lists().frag[0], 1);
    assert_eq!(d.cluster_lists().frag[2], 1);
    // The order-unaware baseline puts both in the same cluster.
    let u = order_unaware(DeviceConfig::new(4 * 16).cluster_slots(16).nr_cpus(2)).unwrap();
    let a = u.alloc(0).unwrap();
    let b = u.alloc(2).unwrap();
    assert_eq!(a.offset() / 16, b.offset() / 16);
    u.check_integrity().unwrap();
}

#[test]
fn order0_steals_from_other_orders_when_out_of_clusters() {
    set_cpu_hint(Some(0));
    let d = dev(2 * 16, 16);
    let big = d.alloc(3).unwrap(); // cluster A serves order 3
    let mut small = Vec::new();
    for _ in 0..16 {
        small.push(d.alloc(0).unwrap()); // cluster B, full
    }
    // No free cluster, nothing on nonfull[0] or frag[0]: order 0 takes a slot of cluster A.
    let stolen = d.alloc(0).unwrap();
    assert_eq!(stolen.offset() / 16, big.offset() / 16);
    // But an order-1 allocation does not steal from an order-3 cluster: it falls back.
    assert_eq!(d.alloc(1), Err(SwapError::NoSpace { order: 1 }));
    assert_eq!(d.stats().swpout_fallback[1], 1);
    d.check_integrity().unwrap();
    let _ = small;
}

#[test]
fn fragmentation_counts_stranded_slots() {
    set_cpu_hint(Some(0));
    let d = dev(2 * 16, 16);
    let xs: Vec<_> = (0..16).map(|_| d.alloc(0).unwrap()).collect();
    // Free every other slot: 8 free slots, none in an aligned pair.
    for x in xs.iter().step_by(2) {
        d.put(*x).unwrap();
    }
    let f1 = d.fragmentation(1).unwrap();
    assert_eq!(f1.free_slots, 8 + 16);
    assert_eq!(f1.stranded_slots, 8);
    let f0 = d.fragmentation(0).unwrap();
    assert_eq!(f0.stranded_slots, 0);
    // The free cluster serves order 1; after that, order 1 has nowhere to go.
    let mut held = Vec::new();
    while let Ok(x) = d.alloc(1) {
        held.push(x);
    }
    assert_eq!(held.len(), 8);
    assert_eq!(d.fragmentation(1).unwrap().stranded_slots, 8);
    assert!(d.fragmentation(12).is_err());
}

#[test]
fn refcounts_and_swap_cache_flag() {
    let d = dev(64, 16);
    let x = d.alloc_with(0, SlotUsage::Cached).unwrap();
    assert_eq!(d.slot(x).unwrap().count, 0);
    assert!(d.slot(x).unwrap().has_cache);
    assert_eq!(d.put(x), Err(SwapError::NoReference { entry: x }));
    assert_eq!(
        d.swapcache_prepare(x),
        Err(SwapError::CacheExists { entry: x })
    );
    assert_eq!(d.dup(x), Ok(1));
    assert_eq!(d.dup(x), Ok(2));
    assert_eq!(d.swapcache_clear(x), Ok(false));
    assert_eq!(d.swapcache_clear(x), Err(SwapError::NotCached { entry: x }));
    assert_eq!(d.put(x), Ok(false));
    assert_eq!(d.swapcache_prepare(x), Ok(()));
    assert_eq!(d.put(x), Ok(false)); // count 0, cache still holds it
    assert!(!d.slot(x).unwrap().is_free());
    assert_eq!(d.swapcache_clear(x), Ok(true));
    assert!(d.slot(x).unwrap().is_free());
    assert_eq!(d.dup(x), Err(SwapError::SlotFree { entry: x }));
    d.check_integrity().unwrap();

    let y = d.alloc(0).unwrap();
    for n in 2..=MAX_SLOT_COUNT {
        assert_eq!(d.dup(y), Ok(n));
    }
    assert_eq!(
        d.dup(y),
        Err(SwapError::CountOverflow {
            entry: y,
            max: MAX_SLOT_COUNT
        })
    );
    for _ in 1..MAX_SLOT_COUNT {
        assert_eq!(d.put(y), Ok(false));
    }
    assert_eq!(d.put(y), Ok(true));
    d.check_integrity().unwrap();
}

#[test]
fn bad_calls_name_the_slot_and_change_nothing() {
    set_cpu_hint(Some(0));
    let d = dev(40, 16); // last cluster has 8 slots past the end
    let x = d.alloc(2).unwrap();
    let before: Vec<_> = (0..40).map(|o| d.slot(e(o)).unwrap()).collect();
    let lists = d.cluster_lists();

    let err = d.put(e(40)).unwrap_err();
    assert_eq!(
        err,
        SwapError::OutOfRange {
            entry: e(40),
            nslots: 40
        }
    );
    assert!(err.to_string().contains("swap 0:0x28"), "{err}");
    assert!(matches!(d.put(e(45)), Err(SwapError::OutOfRange { .. })));
    let free = e(x.offset() + 4);
    assert_eq!(d.put(free), Err(SwapError::SlotFree { entry: free }));
    assert!(d.put(free).unwrap_err().to_string().contains("free"));
    let other = SwapEntry::new(DeviceId::new(3).unwrap(), 0).unwrap();
    assert!(matches!(d.put(other), Err(SwapError::WrongDevice { .. })));
    assert_eq!(
        d.alloc(5),
        Err(SwapError::OrderTooLarge { order: 5, max: 4 })
    );
    // put_range over a range with one free slot: refused, nothing dropped.
    assert_eq!(d.put_range(x, 3), Err(SwapError::SlotFree { entry: free }));
    assert!(matches!(
        d.put_range(e(12), 3),
        Err(SwapError::CrossesCluster { .. })
    ));
    // A batch stops at the bad entry.
    let r = d.put_batch(&[free]);
    assert_eq!(
        r,
        Err(SwapError::InBatch {
            index: 0,
            source: Box::new(SwapError::SlotFree { entry: free })
        })
    );

    let after: Vec<_> = (0..40).map(|o| d.slot(e(o)).unwrap()).collect();
    assert_eq!(before, after);
    assert_eq!(lists, d.cluster_lists());
    d.check_integrity().unwrap();
    // The tail beyond nslots is never handed out.
    let mut all = Vec::new();
    while let Ok(y) = d.alloc(0) {
        assert!(y.offset() < 40);
        all.push(y);
    }
    assert_eq!(all.len(), 40 - 4);
    d.check_integrity().unwrap();
}

#[test]
fn put_batch_processes_entries_before_the_bad_one() {
    let d = dev(64, 16);
    let mut xs = Vec::new();
    d.alloc_batch(0, 5, SlotUsage::Referenced, &mut xs).unwrap();
    assert_eq!(xs.len(), 5);
    let mut batch = xs.clone();
    batch.insert(3, xs[0]); // a double free in the middle
    let r = d.put_batch(&batch);
    assert!(
        matches!(r, Err(SwapError::InBatch { index: 3, .. })),
        "{r:?}"
    );
    assert!(d.slot(xs[0]).unwrap().is_free());
    assert!(d.slot(xs[2]).unwrap().is_free());
    assert!(!d.slot(xs[3]).unwrap().is_free());
    assert_eq!(d.put_batch(&xs[3..]), Ok(2));
    assert_eq!(d.in_use(), 0);
    d.check_integrity().unwrap();
}

#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<(u64, u64)>>);

impl DiscardHook for Recorder {
    fn discard(&self, _device: DeviceId, first: u64, nr: u64) {
        self.0.lock().unwrap().push((first, nr));
    }
}

#[test]
fn emptied_clusters_are_discarded_before_reuse() {
    set_cpu_hint(Some(0));
    let hook = Arc::new(Recorder::default());
    let d = SwapDevice::new(
        DeviceConfig::new(32)
            .cluster_slots(16)
            .nr_cpus(1)
            .discard(hook.clone()),
    )
    .unwrap();
    let a = d.alloc(4).unwrap();
    let b = d.alloc(4).unwrap();
    d.put_range(a, 4).unwrap();
    assert_eq!(d.cluster_lists().discard, 1);
    assert!(hook.0.lock().unwrap().is_empty(), "discard is deferred");
    d.check_integrity().unwrap();
    // No free cluster left: the allocation discards synchronously, then uses it.
    let c = d.alloc(4).unwrap();
    assert_eq!(c, a);
    assert_eq!(*hook.0.lock().unwrap(), vec![(a.offset(), 16)]);
    // The background path.
    d.put_range(b, 4).unwrap();
    assert_eq!(d.run_discards(), 1);
    assert_eq!(d.cluster_lists().free, 1);
    assert_eq!(d.stats().discarded_clusters, 2);
    d.check_integrity().unwrap();
}

#[test]
fn rotational_devices_share_one_current_cluster() {
    let rot = SwapDevice::new(
        DeviceConfig::new(4 * 16)
            .cluster_slots(16)
            .nr_cpus(2)
            .rotational(true),
    )
    .unwrap();
    let ssd = dev(4 * 16, 16);
    let mut r = Vec::new();
    let mut s = Vec::new();
    for i in 0..8 {
        set_cpu_hint(Some(i % 2));
        r.push(rot.alloc(0).unwrap().offset());
        s.push(ssd.alloc(0).unwrap().offset());
    }
    set_cpu_hint(None);
    assert_eq!(
        r,
        (0..8).collect::<Vec<_>>(),
        "rotational layout is sequential"
    );
    let clusters: HashSet<_> = s.iter().map(|o| o / 16).collect();
    assert_eq!(clusters.len(), 2, "each CPU has its own current cluster");
    assert_eq!(rot.stats().global_cluster_lock, 8);
    rot.check_integrity().unwrap();
}

#[test]
#[cfg_attr(
    miri,
    ignore = "a statistic over 20,000 allocations: minutes under miri, and the allocation paths it takes are those of the smaller tests"
)]
fn order0_allocations_rarely_take_the_device_lock() {
    set_cpu_hint(Some(0));
    let d = dev(64 * 512, 512);
    let mut live = std::collections::VecDeque::new();
    for _ in 0..20_000 {
        live.push_back(d.alloc(0).unwrap());
        if live.len() > 4096 {
            d.put(live.pop_front().unwrap()).unwrap();
        }
    }
    let s = d.stats();
    assert_eq!(s.allocations(), 20_000);
    assert!(
        s.device_lock * 100 <= s.allocations(),
        "{} device-lock acquisitions for {} allocations",
        s.device_lock,
        s.allocations()
    );
    d.check_integrity().unwrap();
}

#[test]
fn swap_info_priorities_round_robin_spill_and_swapoff() {
    set_cpu_hint(Some(0));
    let info = SwapInfo::new();
    let cfg = || DeviceConfig::new(32).cluster_slots(16).nr_cpus(1);
    let hi1 = info.swapon(cfg(), 10).unwrap();
    let hi2 = info.swapon(cfg(), 10).unwrap();
    let lo = info.swapon(cfg(), 1).unwrap();
    assert_eq!(info.devices().len(), 3);
    assert_eq!(info.devices()[2], (lo, 1));
    let mut per_dev = [0usize; 3];
    let mut held = Vec::new();
    for _ in 0..64 {
        let x = info.alloc(0).unwrap();
        per_dev[x.device().index()] += 1;
        held.push(x);
    }
    // Round-robin between the two high-priority devices, none from the low one yet.
    assert_eq!(per_dev, [32, 32, 0]);
    // Both full: spill to the lower priority.
    let x = info.alloc(0).unwrap();
    assert_eq!(x.device(), lo);
    held.push(x);
    // swapoff refuses while slots are in use.
    assert_eq!(
        info.swapoff(lo).unwrap_err(),
        SwapError::DeviceBusy {
            device: lo,
            in_use: 1
        }
    );
    info.set_allocatable(lo, false).unwrap();
    assert_eq!(info.put(x), Ok(true));
    held.pop();
    assert_eq!(info.alloc(0), Err(SwapError::NoSpace { order: 0 }));
    assert_eq!(info.stats().swpout_fallback[0], 1);
    let removed = info.swapoff(lo).unwrap();
    assert_eq!(removed.id(), lo);
    assert_eq!(
        info.put(x),
        Err(SwapError::WrongDevice {
            entry: x,
            expected: "a swapped-on device"
        })
    );
    assert!(matches!(info.swapoff(lo), Err(SwapError::NoDevice { .. })));
    // Entries on several devices in one batch.
    assert_eq!(info.put_batch(&held), Ok(64));
    assert_eq!(info.stats().in_use, 0);
    info.check_integrity().unwrap();
    let again = info.swapon(cfg(), 5).unwrap();
    assert_eq!(again, lo, "the lowest free id is reused");
    assert_eq!(info.swapoff(hi1).map(|d| d.id()), Ok(hi1));
    let _ = hi2;
}

#[test]
fn threads_never_share_a_slot() {
    let d =
        Arc::new(SwapDevice::new(DeviceConfig::new(8 * 64).cluster_slots(64).nr_cpus(4)).unwrap());
    let owned = Arc::new(Mutex::new(HashSet::new()));
    let fallbacks = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let d = d.clone();
            let owned = owned.clone();
            let fallbacks = fallbacks.clone();
            std::thread::spawn(move || {
                set_cpu_hint(Some(t % 2));
                let mut mine: Vec<(SwapEntry, u32)> = Vec::new();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                // Under miri (data races) a few hundred steps: each is ~1000x slower there.
                for _ in 0..if cfg!(miri) { 300 } else { 20_000 } {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if mine.len() < 24 && x % 3 != 0 {
                        let order = [0, 0, 1, 4][(x >> 8) as usize % 4];
                        match d.alloc(order) {
                            Ok(e) => {
                                let mut o = owned.lock().unwrap();
                                for i in 0..1u64 << order {
                                    assert!(o.insert(e.plus(i)), "{} handed out twice", e.plus(i));
                                }
                                drop(o);
                                if x % 5 == 0 {
                                    d.dup(e).unwrap();
                                    d.put(e).unwrap();
                                }
                                mine.push((e, order));
                            }
                            Err(SwapError::NoSpace { .. }) => {
                                fallbacks.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(err) => panic!("{err}"),
                        }
                    } else if !mine.is_empty() {
                        let (e, order) = mine.swap_remove((x >> 16) as usize % mine.len());
                        {
                            let mut o = owned.lock().unwrap();
                            for i in 0..1u64 << order {
                                o.remove(&e.plus(i));
                            }
                        }
                        assert_eq!(d.put_range(e, order), Ok(1 << order));
                    }
                }
                for (e, order) in mine {
                    owned.lock().unwrap().retain(|x| {
                        x.offset() < e.offset() || x.offset() >= e.offset() + (1 << order)
                    });
                    d.put_range(e, order).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    d.check_integrity().unwrap();
    assert_eq!(d.in_use(), 0);
    assert_eq!(d.stats().in_use, 0);
    assert_eq!(d.cluster_lists().free, 8);
}

#[test]
fn baselines_hand_out_each_slot_once() {
    set_cpu_hint(Some(0));
    let designs: Vec<Box<dyn SlotAllocator>> = vec![
        Box::new(GlobalLockDevice::new(256)),
        Box::new(SlotCacheDevice::new(256, 64, 2)),
        Box::new(dev(256, 64)),
    ];
    for d in designs {
        let mut seen = HashSet::new();
        while let Some(off) = d.alloc_slots(0) {
            assert!(off < 256);
            assert!(seen.insert(off), "{}: {off} twice", d.design());
        }
        assert_eq!(seen.len(), 256, "{}", d.design());
        for &off in &seen {
            d.free_slots(off, 0);
        }
        // Everything comes back, order 4 included.
        let mut n = 0;
        while let Some(off) = d.alloc_slots(4) {
            assert_eq!(off % 16, 0, "{}", d.design());
            n += 1;
        }
        assert!(
            n >= 12,
            "{}: only {n} order-4 runs after freeing all",
            d.design()
        );
        assert!(d.device_lock_acquisitions() > 0);
    }
}

#[test]
fn bad_configs_are_refused() {
    for (n, cs) in [(0u64, 512usize), (100, 3), (100, 1), (100, 1 << 16)] {
        let r = SwapDevice::new(DeviceConfig::new(n).cluster_slots(cs));
        assert!(
            matches!(r, Err(SwapError::InvalidConfig { .. })),
            "{n} {cs}"
        );
    }
    let info = SwapInfo::new();
    for _ in 0..DeviceId::MAX_DEVICES {
        info.swapon(DeviceConfig::new(2).cluster_slots(2), 0)
            .unwrap();
    }
    assert_eq!(
        info.swapon(DeviceConfig::new(2).cluster_slots(2), 0),
        Err(SwapError::TooManyDevices { max: 64 })
    );
}

#[test]
fn shared_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<SwapDevice>();
    check::<SwapInfo>();
    check::<SwapEntry>();
    check::<GlobalLockDevice>();
    check::<SlotCacheDevice>();
}

/// Fills 16 clusters, frees a scattered third of the slots, then allocates as many again:
/// returns how many clusters hold slots afterwards, and the device-lock acquisitions per
/// allocation of the refill.
fn refill(cfg: DeviceConfig) -> (usize, f64) {
    set_cpu_hint(Some(0));
    let d = SwapDevice::new(cfg).unwrap();
    let held: Vec<SwapEntry> = (0..16 * 64).map(|_| d.alloc(0).unwrap()).collect();
    let mut kept = Vec::new();
    let mut freed = 0;
    for (i, x) in held.into_iter().enumerate() {
        if (i * 7919) % 3 == 0 {
            assert_eq!(d.put(x), Ok(true));
            freed += 1;
        } else {
            kept.push(x);
        }
    }
    let locks = d.stats().device_lock;
    for _ in 0..freed {
        kept.push(d.alloc(0).unwrap());
    }
    let per_alloc = (d.stats().device_lock - locks) as f64 / freed as f64;
    d.check_integrity().unwrap();
    let clusters: HashSet<u64> = kept.iter().map(|x| x.offset() / 64).collect();
    set_cpu_hint(None);
    (clusters.len(), per_alloc)
}

#[test]
fn nonfull_first_refills_holes_before_free_clusters() {
    let base = || DeviceConfig::new(64 * 64).cluster_slots(64).nr_cpus(2);
    // Free clusters first (the default, the kernel before 6.18): the refill takes new clusters.
    let (spread, _) = refill(base());
    assert!(spread > 16, "free-first refill stayed in {spread} clusters");
    // Nonfull first: every hole is refilled, and the slots stay in the 16 clusters.
    let (packed, per_alloc) = refill(base().nonfull_first(8));
    assert_eq!(packed, 16);
    // Each visit of a partly used cluster yields its ~21 free slots, not one.
    assert!(
        per_alloc < 0.2,
        "{per_alloc} device-lock acquisitions per allocation"
    );
    // The kernel's rule (a cluster is nonfull from its first free slot) packs as well.
    assert_eq!(refill(base().nonfull_first(1)).0, 16);
    // Out-of-range thresholds are refused, naming the field.
    for bad in [0, 65] {
        match SwapDevice::new(base().nonfull_first(bad)) {
            Err(SwapError::InvalidConfig { reason }) => assert!(reason.contains("nonfull_first")),
            other => panic!("nonfull_first({bad}) gave {other:?}"),
        }
    }
}

#[test]
fn nonfull_first_order0_refills_holes_in_large_folio_clusters() {
    set_cpu_hint(Some(0));
    let d = SwapDevice::new(
        DeviceConfig::new(8 * 64)
            .cluster_slots(64)
            .nr_cpus(2)
            .nonfull_first(8),
    )
    .unwrap();
    // Two clusters of order-4 runs, then single slots freed from them (a large folio's pages
    // faulted back one by one).
    let runs: Vec<SwapEntry> = (0..8).map(|_| d.alloc(4).unwrap()).collect();
    let mut freed = Vec::new();
    for r in &runs {
        for i in [1u64, 5, 9] {
            let x = e(r.offset() + i);
            assert_eq!(d.put(x), Ok(true));
            freed.push(x.offset());
        }
    }
    // Order 0 takes those holes before any free cluster.
    let mut got: Vec<u64> = (0..freed.len())
        .map(|_| d.alloc(0).unwrap().offset())
        .collect();
    got.sort_unstable();
    freed.sort_unstable();
    assert_eq!(got, freed);
    d.check_integrity().unwrap();
    set_cpu_hint(None);
}

/// The device's metadata: a fixed part of at most one cache line per cluster (plus the
/// lists), and a slot map for each cluster in use only, given back when the cluster empties.
/// (The daemon's default 8 GiB device has 4096 clusters, of which a workload of 256 MiB
/// stored uses about 130.)
#[test]
#[cfg_attr(
    miri,
    ignore = "a device of 4,096 clusters checked whole: minutes under miri, and its allocation paths are those of the smaller tests"
)]
fn metadata_is_a_line_per_cluster_and_the_maps_in_use() {
    set_cpu_hint(Some(0));
    let d = dev(4096 * 512, 512);
    let fixed = d.metadata_bytes();
    assert!(
        fixed <= 4096 * (64 + 16) + 4096,
        "{fixed} bytes for 4096 empty clusters"
    );
    let mut held: Vec<_> = (0..1500).map(|_| d.alloc(0).unwrap()).collect();
    held.extend((0..2).map(|_| d.alloc(4).unwrap()));
    // Four clusters in use (order 4 takes a cluster of its own), a u16 per slot each.
    assert_eq!(d.metadata_bytes(), fixed + 4 * 512 * 2);
    let counts = |d: &SwapDevice| (d.stats().swpout[0], d.stats().swpout[4]);
    assert_eq!(counts(&d), (1500, 2));
    for (i, x) in held.into_iter().enumerate() {
        let order = if i < 1500 { 0 } else { 4 };
        assert_eq!(d.put_range(x, order), Ok(1 << order));
    }
    // The counts outlive the maps.
    assert_eq!(counts(&d), (1500, 2));
    assert_eq!(
        d.metadata_bytes(),
        fixed,
        "maps given back with their clusters"
    );
    d.check_integrity().unwrap();
}
