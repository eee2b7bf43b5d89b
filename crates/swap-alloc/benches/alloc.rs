//! Criterion: one alloc+free pair (FIFO window of live allocations) on the cluster allocator
//! and on the two baselines, orders 0 and 4, side by side; and the same at 2 threads with
//! `iter_custom`. The report command (`report swap-alloc`) has the full comparison.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use swap_alloc::{set_cpu_hint, DeviceConfig, SwapDevice};
use swap_alloc_baseline::{GlobalLockDevice, SlotAllocator, SlotCacheDevice};

const NSLOTS: u64 = 256 * 512;

fn designs() -> Vec<(&'static str, Arc<dyn SlotAllocator>)> {
    vec![
        (
            "cluster",
            Arc::new(SwapDevice::new(DeviceConfig::new(NSLOTS).nr_cpus(2)).expect("config")),
        ),
        (
            "global_lock",
            Arc::new(GlobalLockDevice::new(NSLOTS as usize)),
        ),
        (
            "slot_cache",
            Arc::new(SlotCacheDevice::new(NSLOTS as usize, 512, 2)),
        ),
    ]
}

/// Runs `iters` alloc+free pairs on one thread with a window of live allocations.
fn pairs(dev: &dyn SlotAllocator, order: u32, ring: &mut VecDeque<u64>, iters: u64) {
    for _ in 0..iters {
        if let Some(old) = ring.pop_front() {
            dev.free_slots(old, order);
        }
        if let Some(off) = dev.alloc_slots(order) {
            ring.push_back(off);
        }
    }
}

fn fill(dev: &dyn SlotAllocator, order: u32) -> VecDeque<u64> {
    let window = if order == 0 { 1024 } else { 256 };
    (0..window).filter_map(|_| dev.alloc_slots(order)).collect()
}

fn one_thread(c: &mut Criterion) {
    set_cpu_hint(Some(0));
    let mut g = c.benchmark_group("alloc_free_pair_1t");
    g.measurement_time(Duration::from_secs(2));
    for order in [0u32, 4] {
        for (name, dev) in designs() {
            let mut ring = fill(&*dev, order);
            g.bench_with_input(BenchmarkId::new(name, order), &order, |b, &order| {
                b.iter(|| pairs(&*dev, order, &mut ring, 1));
            });
        }
    }
    g.finish();
}

fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("alloc_free_pair_2t");
    g.measurement_time(Duration::from_secs(2));
    for order in [0u32, 4] {
        for (name, dev) in designs() {
            g.bench_with_input(BenchmarkId::new(name, order), &order, |b, &order| {
                b.iter_custom(|iters| {
                    let per_thread = iters.div_ceil(2);
                    let barrier = Arc::new(std::sync::Barrier::new(2));
                    let handles: Vec<_> = (0..2)
                        .map(|t| {
                            let dev = Arc::clone(&dev);
                            let barrier = Arc::clone(&barrier);
                            std::thread::spawn(move || {
                                set_cpu_hint(Some(t));
                                let mut ring = fill(&*dev, order);
                                barrier.wait();
                                let start = Instant::now();
                                pairs(&*dev, order, &mut ring, per_thread);
                                let took = start.elapsed();
                                for off in ring {
                                    dev.free_slots(off, order);
                                }
                                took
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or_default())
                        .max()
                        .unwrap_or_default()
                });
            });
        }
    }
    g.finish();
}

criterion_group!(benches, one_thread, two_threads);
criterion_main!(benches);
