//! Micro-benchmarks, each side by side with its baseline in the same run:
//! - `replay/<policy>`: the cost of one replayed request (hit bookkeeping, eviction, aging) for
//!   MGLRU and the baselines on a Zipf(0.9) hot set mixed 1:1 with a scan;
//! - `age/<bloom|no_bloom>`: one aging walk over 128 regions of 512 pages, 8 of them dense.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mglru::replay::{policy_by_name, replay, workload, POLICIES};
use mglru::{AccessBits, Config, Hint, Mglru, PageType};

fn replay_bench(c: &mut Criterion) {
    let trace = workload::zipf_with_scan(20_000, 0.9, 1, 1, 50_000, 1);
    let mut g = c.benchmark_group("replay");
    g.throughput(Throughput::Elements(trace.len() as u64));
    g.sample_size(10);
    for name in POLICIES {
        g.bench_with_input(BenchmarkId::from_parameter(name), &trace, |b, t| {
            b.iter(|| {
                let mut p = policy_by_name(name, &Config::default()).expect("known policy");
                replay(p.as_mut(), 2_000, t).expect("capacity is not zero")
            })
        });
    }
    g.finish();
}

fn age_bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("age");
    g.sample_size(20);
    for bloom in [true, false] {
        let name = if bloom { "bloom" } else { "no_bloom" };
        let mut lru = Mglru::new(Config {
            bloom_filter: bloom,
            ..Config::default()
        })
        .expect("valid config");
        let mut bits = AccessBits::new();
        for p in 0..128 * 512 {
            lru.add(p, Hint::fault(PageType::Anon)).expect("new page");
        }
        let mut round = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                round += 1;
                for r in 0..128u64 {
                    if r % 16 == 0 {
                        for p in 0..512 {
                            bits.set(r * 512 + p);
                        }
                    } else {
                        bits.set(r * 512 + (round * 37) % 512);
                    }
                }
                lru.age(&mut bits)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, replay_bench, age_bench);
criterion_main!(benches);
