//! Loom models of concurrent allocation, free, dup, discard and swapoff on tiny devices (two
//! or three clusters of two slots). Each fails if a slot is handed out twice or leaked, if a
//! list holds a cluster in the wrong state (`check_integrity`), or if a cluster is allocated
//! from while its discard hook runs.
//!
//! Run: `LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg swap_alloc_loom" cargo test --release
//! -p swap-alloc --test 'loom_*'`
#![cfg(swap_alloc_loom)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use loom::thread;
use swap_alloc::{
    set_cpu_hint, DeviceConfig, DeviceId, DiscardHook, SwapDevice, SwapEntry, SwapError, SwapInfo,
};

/// Runs a model and prints how many interleavings loom explored.
fn model<F: Fn() + Sync + Send + 'static>(name: &str, f: F) {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    RUNS.store(0, Ordering::Relaxed);
    let mut builder = loom::model::Builder::new();
    // Spinning lock acquisitions and the checks after the threads join take more branches
    // than loom's default of 1000 per execution.
    builder.max_branches = 20_000;
    builder.check(move || {
        RUNS.fetch_add(1, Ordering::Relaxed);
        f();
    });
    eprintln!("{name}: {} interleavings", RUNS.load(Ordering::Relaxed));
}

fn device(nslots: u64) -> Arc<SwapDevice> {
    Arc::new(SwapDevice::new(DeviceConfig::new(nslots).cluster_slots(2).nr_cpus(2)).unwrap())
}

fn assert_all_distinct(entries: &[SwapEntry]) {
    for (i, a) in entries.iter().enumerate() {
        for b in &entries[i + 1..] {
            assert_ne!(a, b, "slot handed out twice");
        }
    }
}

/// Two threads on different CPUs allocate while a third frees a slot of a full cluster (which
/// moves that cluster to nonfull under the device lock): every slot is handed out once, and the
/// lists stay consistent.
#[test]
fn alloc_alloc_free_three_threads() {
    model("alloc_alloc_free_three_threads", || {
        alloc_alloc_free(device(6))
    });
}

/// The same with `nonfull_first`: the freed slot's cluster is on the nonfull list, which both
/// allocators try before the free clusters.
#[test]
fn alloc_alloc_free_three_threads_nonfull_first() {
    model("alloc_alloc_free_three_threads_nonfull_first", || {
        alloc_alloc_free(Arc::new(
            SwapDevice::new(
                DeviceConfig::new(6)
                    .cluster_slots(2)
                    .nr_cpus(2)
                    .nonfull_first(1),
            )
            .unwrap(),
        ))
    });
}

fn alloc_alloc_free(dev: Arc<SwapDevice>) {
    {
        // Fill cluster 0 from CPU 0: it is full and on the full list.
        set_cpu_hint(Some(0));
        let a = dev.alloc(0).unwrap();
        let b = dev.alloc(0).unwrap();
        let handles: Vec<_> = (0..2)
            .map(|cpu| {
                let dev = dev.clone();
                thread::spawn(move || {
                    set_cpu_hint(Some(cpu));
                    dev.alloc(0).unwrap()
                })
            })
            .collect();
        let d2 = dev.clone();
        let freer = thread::spawn(move || {
            set_cpu_hint(Some(1));
            assert_eq!(d2.put(b), Ok(true));
            // A consistent snapshot while the allocations run.
            d2.check_integrity().unwrap();
        });
        let mut live: Vec<SwapEntry> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        freer.join().unwrap();
        live.push(a);
        assert_all_distinct(&live);
        dev.check_integrity().unwrap();
        assert_eq!(dev.in_use(), 3);
        for e in live {
            assert_eq!(dev.put(e), Ok(true));
        }
        dev.check_integrity().unwrap();
        assert_eq!(dev.in_use(), 0);
        assert_eq!(dev.cluster_lists().free, 3);
    }
}

/// Two threads sharing one CPU hint (so one per-CPU current cluster) allocate order 1 and
/// order 0 on a device with a single free cluster left: the hint race is re-checked under the
/// cluster lock, nothing is allocated twice, and exactly the slots handed out are in use.
#[test]
fn shared_hint_mixed_orders() {
    model("shared_hint_mixed_orders", || {
        let dev = device(4);
        let h1 = {
            let dev = dev.clone();
            thread::spawn(move || {
                set_cpu_hint(Some(0));
                dev.alloc(1)
            })
        };
        let h0 = {
            let dev = dev.clone();
            thread::spawn(move || {
                set_cpu_hint(Some(0));
                dev.alloc(0)
            })
        };
        let big = h1.join().unwrap().unwrap();
        let small = h0.join().unwrap().unwrap();
        assert_eq!(big.offset() % 2, 0);
        // Order-aware: the order-1 run and the order-0 slot never share a cluster here,
        // since a free cluster was always available to each.
        assert_ne!(big.offset() / 2, small.offset() / 2);
        dev.check_integrity().unwrap();
        assert_eq!(dev.in_use(), 3);
        assert_eq!(dev.put_range(big, 1), Ok(2));
        assert_eq!(dev.put(small), Ok(true));
        dev.check_integrity().unwrap();
    });
}

/// `dup` racing with the last `put` (a page shared at fork while the other owner frees it):
/// the slot is freed exactly once, and a `dup` that comes too late is refused, not
/// resurrecting a free slot.
#[test]
fn dup_races_with_last_put() {
    model("dup_races_with_last_put", || {
        let dev = device(2);
        let e = dev.alloc(0).unwrap();
        let freed = Arc::new(AtomicUsize::new(0));
        let t = {
            let dev = dev.clone();
            let freed = freed.clone();
            thread::spawn(move || {
                set_cpu_hint(Some(1));
                match dev.dup(e) {
                    Ok(2) => {
                        if dev.put(e).unwrap() {
                            freed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(n) => panic!("dup returned count {n}"),
                    Err(err) => assert_eq!(err, SwapError::SlotFree { entry: e }),
                }
            })
        };
        if dev.put(e).unwrap() {
            freed.fetch_add(1, Ordering::Relaxed);
        }
        t.join().unwrap();
        assert_eq!(freed.load(Ordering::Relaxed), 1, "freed once");
        assert!(dev.slot(e).unwrap().is_free());
        assert_eq!(dev.in_use(), 0);
        dev.check_integrity().unwrap();
    });
}

/// A discard hook that checks every slot it is asked to discard is free and stays free while
/// it runs (an allocation from a cluster under discard would fail this).
#[derive(Default)]
struct CheckingDiscard {
    dev: OnceLock<Weak<SwapDevice>>,
    calls: AtomicUsize,
}

impl DiscardHook for CheckingDiscard {
    fn discard(&self, device: DeviceId, first: u64, nr: u64) {
        let dev = self.dev.get().and_then(Weak::upgrade).expect("device set");
        for _ in 0..2 {
            for off in first..first + nr {
                let e = SwapEntry::new(device, off).unwrap();
                assert!(
                    dev.slot(e).unwrap().is_free(),
                    "{e} allocated during discard"
                );
            }
            loom::thread::yield_now();
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

/// The discard worker races with an allocation that finds no free cluster and discards
/// synchronously: the cluster is discarded once, never allocated from while the hook runs,
/// and ends up allocated or free, consistently with the lists.
#[test]
fn discard_races_with_alloc() {
    model("discard_races_with_alloc", || {
        let hook = Arc::new(CheckingDiscard::default());
        let dev = Arc::new(
            SwapDevice::new(
                DeviceConfig::new(4)
                    .cluster_slots(2)
                    .nr_cpus(2)
                    .discard(hook.clone()),
            )
            .unwrap(),
        );
        hook.dev.set(Arc::downgrade(&dev)).ok();
        set_cpu_hint(Some(0));
        let c0 = dev.alloc(1).unwrap();
        let c1 = dev.alloc(1).unwrap();
        assert_eq!(dev.put_range(c0, 1), Ok(2)); // cluster of c0 waits for discard
        let worker = {
            let dev = dev.clone();
            thread::spawn(move || dev.run_discards())
        };
        let got = dev.alloc(1);
        let discarded_by_worker = worker.join().unwrap();
        assert_eq!(
            hook.calls.load(Ordering::Relaxed),
            1,
            "discarded exactly once"
        );
        match got {
            Ok(e) => {
                assert_eq!(e, c0, "only c0's cluster can be free");
                assert_eq!(dev.in_use(), 4);
            }
            // The worker had the cluster off-list, mid-discard: the kernel fails here too.
            Err(err) => {
                assert_eq!(err, SwapError::NoSpace { order: 1 });
                assert_eq!(discarded_by_worker, 1);
                assert_eq!(dev.in_use(), 2);
            }
        }
        dev.check_integrity().unwrap();
        assert_eq!(dev.put_range(c1, 1), Ok(2));
    });
}

/// swapoff racing with the last free on the device: it either refuses (busy) or succeeds
/// after the free, never removes a device with a slot in use.
#[test]
fn swapoff_races_with_last_put() {
    model("swapoff_races_with_last_put", || {
        let info = Arc::new(SwapInfo::new());
        let id = info
            .swapon(DeviceConfig::new(2).cluster_slots(2).nr_cpus(2), 0)
            .unwrap();
        let e = info.alloc(0).unwrap();
        let t = {
            let info = info.clone();
            thread::spawn(move || info.put(e))
        };
        let off = info.swapoff(id);
        let put = t.join().unwrap();
        match off {
            Ok(dev) => {
                assert_eq!(put, Ok(true), "swapoff succeeded only after the last put");
                assert_eq!(dev.in_use(), 0);
                dev.check_integrity().unwrap();
            }
            Err(err) => {
                assert_eq!(
                    err,
                    SwapError::DeviceBusy {
                        device: id,
                        in_use: 1
                    }
                );
                assert_eq!(put, Ok(true));
                assert!(info.swapoff(id).is_ok());
            }
        }
    });
}
