//! Paired single-thread walk timing, robust to a loaded machine: lockless and
//! baseline root walks alternate in short bursts, and each design's figure is
//! a low percentile of its burst times (preempted bursts land in the tail).
//!
//! `cargo run --release -p shrinker --example paired_walk [shrinkers] [bursts]`

use std::hint::black_box;
use std::time::Instant;

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

fn burst(f: &mut impl FnMut() -> u64, walks: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..walks {
        black_box(f());
    }
    t.elapsed().as_secs_f64() * 1e9 / walks as f64
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p) as usize]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let bursts: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let lockless = ShrinkerRegistry::default();
    let _h: Vec<_> = (0..n)
        .map(|_| lockless.register(ShrinkerConfig::new("s"), Steady).unwrap())
        .collect();
    let baseline = RwLockRegistry::default();
    let _b: Vec<_> = (0..n)
        .map(|_| baseline.register(ShrinkerConfig::new("s"), Steady).unwrap())
        .collect();
    let req = ShrinkRequest::new(10);
    let mut l = || lockless.shrink(&req).unwrap();
    let mut r = || baseline.shrink(&req).unwrap();
    let walks = (2000 / n).max(1);
    for _ in 0..50 {
        burst(&mut l, walks);
        burst(&mut r, walks);
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..bursts {
        a.push(burst(&mut l, walks));
        b.push(burst(&mut r, walks));
    }
    let (a10, b10) = (pct(&mut a, 0.1), pct(&mut b, 0.1));
    let (a50, b50) = (pct(&mut a, 0.5), pct(&mut b, 0.5));
    println!(
        "n{n}: ns/walk p10 lockless {a10:.0} rwlock {b10:.0} ratio(rw/lockless) {:.3} | p50 lockless {a50:.0} rwlock {b50:.0} ratio {:.3}",
        b10 / a10,
        b50 / a50
    );
}
