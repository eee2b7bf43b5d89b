//! Criterion: one root shrink walk over 100 shrinkers and one group walk,
//! lockless registry against the rwlock baseline, no concurrency (the cost of
//! the references and epoch pins against one try-lock per walk).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use shrinker::baseline::RwLockRegistry;
use shrinker::{
    Count, Scan, ShrinkControl, ShrinkRequest, Shrinker, ShrinkerConfig, ShrinkerRegistry,
};

struct Steady;

impl Shrinker for Steady {
    fn count_objects(&self, _: &ShrinkControl) -> Count {
        Count::Objects(100_000)
    }
    fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
        Scan::Freed(sc.nr_to_scan)
    }
}

fn walks(c: &mut Criterion) {
    let mut g = c.benchmark_group("root_walk");
    for n in [100usize, 1000] {
        let lockless = ShrinkerRegistry::default();
        let _h: Vec<_> = (0..n)
            .map(|_| lockless.register(ShrinkerConfig::new("s"), Steady).unwrap())
            .collect();
        let baseline = RwLockRegistry::default();
        let _b: Vec<_> = (0..n)
            .map(|_| baseline.register(ShrinkerConfig::new("s"), Steady).unwrap())
            .collect();
        let req = ShrinkRequest::new(10);
        g.bench_with_input(BenchmarkId::new("lockless", n), &n, |b, _| {
            b.iter(|| lockless.shrink(&req).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("rwlock", n), &n, |b, _| {
            b.iter(|| baseline.shrink(&req).unwrap())
        });
    }
    g.finish();

    let mut g = c.benchmark_group("group_walk");
    let lockless = ShrinkerRegistry::default();
    let baseline = RwLockRegistry::default();
    let lg = lockless.create_group(None).unwrap();
    let bg = baseline.create_group(None).unwrap();
    let mut keep = Vec::new();
    let mut keep_b = Vec::new();
    for i in 0..1000 {
        let h = lockless
            .register(ShrinkerConfig::new("s").memcg_aware(true), Steady)
            .unwrap();
        let hb = baseline
            .register(ShrinkerConfig::new("s").memcg_aware(true), Steady)
            .unwrap();
        if i % 100 == 0 {
            h.set_shrinker_bit(lg, 0).unwrap();
            baseline.set_shrinker_bit(bg, 0, hb.id().unwrap()).unwrap();
        }
        keep.push(h);
        keep_b.push(hb);
    }
    g.bench_function("lockless/10_of_1000", |b| {
        b.iter(|| lockless.shrink(&ShrinkRequest::new(10).group(lg)).unwrap())
    });
    g.bench_function("rwlock/10_of_1000", |b| {
        b.iter(|| baseline.shrink(&ShrinkRequest::new(10).group(bg)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, walks);
criterion_main!(benches);
