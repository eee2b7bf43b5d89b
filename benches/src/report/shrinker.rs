//! Report section `shrinker`: the lockless registry (refcount + epoch) against
//! the baseline (the list under a read-write lock, walked with try-lock), side
//! by side in one run.
//!
//! JSON keys:
//! - `shrinks_per_sec.{lockless,rwlock}.<scenario>`: completed shrink walks per
//!   second (all shrinking threads together, walks skipped on a busy lock not
//!   counted), median of the repetitions. Scenario names:
//!   `t{1,2}_n{100,4000}_g{1,1000}_{churn,quiet}`: shrinking threads,
//!   registered shrinkers, groups, and whether another thread registers and
//!   unregisters a shrinker in a loop (the seed's stress-ng ramfs case). With 1
//!   group every walk is a root walk over all shrinkers; with 1000 groups every
//!   shrinker is group-aware with its bit set in group `id % 1000`, and the
//!   walks go round the groups. Two more scenarios outside the goals,
//!   `t1_n100_g1_quiet_work{1,4}`: the same quiet root walk with scans that
//!   do 1 or 4 units of arithmetic per object asked for (128 objects per
//!   call), to show the per-shrinker cost of the lockless walk against
//!   callbacks that are not free.
//! - `skipped_share.{lockless,rwlock}.<scenario>`: the share of walks given up
//!   because of a lock (machine independent; the lockless registry has none).
//! - `ratio.<scenario>`: lockless / rwlock shrink rate (`null` when the
//!   baseline completed no walk at all: every try-lock failed).
//!   `ratio_paired_median.<scenario>`: the median of the per-repetition
//!   ratios (each repetition runs both designs back to back, in alternating
//!   order), less sensitive to load changes between repetitions.
//! - `churn_per_sec.{lockless,rwlock}.<scenario>`: register+unregister pairs
//!   per second done by the churn thread meanwhile.
//! - `unregister_wait_us.{lockless,rwlock}.{p50,p90,max}`: how long
//!   `unregister` blocks while two threads walk 100 shrinkers whose scans each
//!   spin for about 20 us; `unregister_in_flight_mean`: scans of the
//!   unregistered shrinker the lockless unregister had to wait for.
//! - `goals`: the goals computed from the figures above (`ratio`
//!   over the scenarios, not the `_work` ones).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use shrinker::baseline::{RwLockHandle, RwLockRegistry};
use shrinker::{
    Count, GroupId, Scan, ShrinkControl, ShrinkRequest, Shrinker, ShrinkerConfig, ShrinkerHandle,
    ShrinkerRegistry,
};

use super::{Options, Report};

/// A cache with a steady object count; scans spin for `spin` per call and
/// do `work` units of arithmetic per object asked for (a stand-in for
/// unlinking and freeing it; 0 in the scenarios).
struct BenchCache {
    objects: u64,
    spin: Duration,
    work: u32,
}

impl Shrinker for BenchCache {
    fn count_objects(&self, _: &ShrinkControl) -> Count {
        Count::Objects(self.objects)
    }
    fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
        if self.work > 0 {
            let mut x = 0u64;
            for i in 0..sc.nr_to_scan * u64::from(self.work) {
                x = std::hint::black_box(x.wrapping_add(i));
            }
            std::hint::black_box(x);
        }
        if !self.spin.is_zero() {
            let t = Instant::now();
            while t.elapsed() < self.spin {
                std::hint::spin_loop();
            }
        }
        Scan::Freed(sc.nr_to_scan)
    }
}

/// What the harness needs from either registry.
trait Registry: Clone + Send + Sync + 'static {
    type Handle: Send + 'static;
    fn make() -> Self;
    fn register(&self, memcg: bool, cache: BenchCache) -> anyhow::Result<Self::Handle>;
    fn set_bit(&self, h: &Self::Handle, g: GroupId) -> anyhow::Result<()>;
    fn unregister(&self, h: Self::Handle) -> usize;
    fn create_group(&self) -> anyhow::Result<GroupId>;
    /// `Some(freed)` or `None` when the walk was skipped on a busy lock.
    fn shrink(&self, req: &ShrinkRequest) -> anyhow::Result<Option<u64>>;
}

impl Registry for ShrinkerRegistry {
    type Handle = ShrinkerHandle;
    fn make() -> Self {
        ShrinkerRegistry::default()
    }
    fn register(&self, memcg: bool, cache: BenchCache) -> anyhow::Result<ShrinkerHandle> {
        Ok(ShrinkerRegistry::register(
            self,
            ShrinkerConfig::new("bench").memcg_aware(memcg),
            cache,
        )?)
    }
    fn set_bit(&self, h: &ShrinkerHandle, g: GroupId) -> anyhow::Result<()> {
        Ok(h.set_shrinker_bit(g, 0)?)
    }
    fn unregister(&self, h: ShrinkerHandle) -> usize {
        h.unregister().in_flight
    }
    fn create_group(&self) -> anyhow::Result<GroupId> {
        Ok(ShrinkerRegistry::create_group(self, None)?)
    }
    fn shrink(&self, req: &ShrinkRequest) -> anyhow::Result<Option<u64>> {
        Ok(Some(ShrinkerRegistry::shrink(self, req)?))
    }
}

impl Registry for RwLockRegistry {
    type Handle = RwLockHandle;
    fn make() -> Self {
        RwLockRegistry::default()
    }
    fn register(&self, memcg: bool, cache: BenchCache) -> anyhow::Result<RwLockHandle> {
        Ok(RwLockRegistry::register(
            self,
            ShrinkerConfig::new("bench").memcg_aware(memcg),
            cache,
        )?)
    }
    fn set_bit(&self, h: &RwLockHandle, g: GroupId) -> anyhow::Result<()> {
        let id = h
            .id()
            .ok_or_else(|| anyhow::anyhow!("handle already unregistered"))?;
        Ok(self.set_shrinker_bit(g, 0, id)?)
    }
    fn unregister(&self, h: RwLockHandle) -> usize {
        h.unregister();
        0
    }
    fn create_group(&self) -> anyhow::Result<GroupId> {
        Ok(RwLockRegistry::create_group(self, None)?)
    }
    fn shrink(&self, req: &ShrinkRequest) -> anyhow::Result<Option<u64>> {
        Ok(self.try_shrink(req)?)
    }
}

#[derive(Debug, Clone, Copy)]
struct Scenario {
    threads: usize,
    shrinkers: usize,
    groups: usize,
    churn: bool,
    /// Arithmetic units per scanned object in `scan_objects` (0: trivial).
    work: u32,
}

impl Scenario {
    fn key(&self) -> String {
        let mut k = format!(
            "t{}_n{}_g{}_{}",
            self.threads,
            self.shrinkers,
            self.groups,
            if self.churn { "churn" } else { "quiet" }
        );
        if self.work > 0 {
            k.push_str(&format!("_work{}", self.work));
        }
        k
    }
}

/// Priority 10 on 100k objects: one scan batch per shrinker per walk.
const PRIORITY: u32 = 10;
const OBJECTS: u64 = 100_000;

struct Sample {
    walks_per_sec: f64,
    skipped_share: f64,
    churn_per_sec: f64,
}

fn measure<R: Registry>(s: Scenario, run: Duration) -> anyhow::Result<Sample> {
    let reg = R::make();
    let memcg = s.groups > 1;
    let groups: Vec<GroupId> = if memcg {
        (0..s.groups)
            .map(|_| reg.create_group())
            .collect::<anyhow::Result<_>>()?
    } else {
        Vec::new()
    };
    let mut handles = Vec::with_capacity(s.shrinkers);
    for i in 0..s.shrinkers {
        let h = reg.register(
            memcg,
            BenchCache {
                objects: OBJECTS,
                spin: Duration::ZERO,
                work: s.work,
            },
        )?;
        if memcg {
            reg.set_bit(&h, groups[i % groups.len()])?;
        }
        handles.push(h);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(s.threads + 1 + usize::from(s.churn)));
    let groups = Arc::new(groups);
    let mut workers = Vec::new();
    for t in 0..s.threads {
        let (reg, stop, start, groups) = (reg.clone(), stop.clone(), start.clone(), groups.clone());
        workers.push(thread::spawn(move || -> anyhow::Result<(u64, u64)> {
            start.wait();
            let (mut done, mut skipped, mut n) = (0u64, 0u64, t);
            while !stop.load(Ordering::Relaxed) {
                let req = if groups.is_empty() {
                    ShrinkRequest::new(PRIORITY)
                } else {
                    n = (n + 1) % groups.len();
                    ShrinkRequest::new(PRIORITY).group(groups[n])
                };
                match reg.shrink(&req)? {
                    Some(_) => done += 1,
                    None => skipped += 1,
                }
            }
            Ok((done, skipped))
        }));
    }
    let churner = s.churn.then(|| {
        let (reg, stop, start, groups) = (reg.clone(), stop.clone(), start.clone(), groups.clone());
        thread::spawn(move || -> anyhow::Result<u64> {
            start.wait();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let h = reg.register(
                    !groups.is_empty(),
                    BenchCache {
                        objects: OBJECTS,
                        spin: Duration::ZERO,
                        work: s.work,
                    },
                )?;
                if !groups.is_empty() {
                    reg.set_bit(&h, groups[n as usize % groups.len()])?;
                }
                reg.unregister(h);
                n += 1;
            }
            Ok(n)
        })
    });
    start.wait();
    let t0 = Instant::now();
    thread::sleep(run);
    stop.store(true, Ordering::Relaxed);
    let mut done = 0;
    let mut skipped = 0;
    for w in workers {
        let (d, sk) = w
            .join()
            .map_err(|_| anyhow::anyhow!("shrinking thread panicked"))??;
        done += d;
        skipped += sk;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let mut churned = 0;
    if let Some(c) = churner {
        churned = c
            .join()
            .map_err(|_| anyhow::anyhow!("churn thread panicked"))??;
    }
    for h in handles {
        reg.unregister(h);
    }
    let total = (done + skipped).max(1);
    Ok(Sample {
        walks_per_sec: done as f64 / elapsed,
        skipped_share: skipped as f64 / total as f64,
        churn_per_sec: churned as f64 / elapsed,
    })
}

struct Waits {
    us: Vec<f64>,
    in_flight: Vec<usize>,
}

/// Two threads walk 100 shrinkers whose scans spin ~20 us; the main thread
/// registers one more (same cost), lets it be walked, and times `unregister`.
fn unregister_waits<R: Registry>(rounds: usize) -> anyhow::Result<Waits> {
    let reg = R::make();
    let spin = Duration::from_micros(20);
    let mut handles = Vec::new();
    for _ in 0..100 {
        handles.push(reg.register(
            false,
            BenchCache {
                objects: OBJECTS,
                spin,
                work: 0,
            },
        )?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let walks = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..2 {
        let (reg, stop, walks) = (reg.clone(), stop.clone(), walks.clone());
        workers.push(thread::spawn(move || -> anyhow::Result<()> {
            while !stop.load(Ordering::Relaxed) {
                if reg.shrink(&ShrinkRequest::new(PRIORITY))?.is_some() {
                    walks.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(())
        }));
    }
    let mut us = Vec::with_capacity(rounds);
    let mut in_flight = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let h = reg.register(
            false,
            BenchCache {
                objects: OBJECTS,
                spin,
                work: 0,
            },
        )?;
        thread::sleep(Duration::from_millis(2));
        let t = Instant::now();
        in_flight.push(reg.unregister(h));
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("shrinking thread panicked"))??;
    }
    for h in handles {
        reg.unregister(h);
    }
    Ok(Waits { us, in_flight })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Runs this section.
pub fn run(opts: &Options) -> anyhow::Result<Report> {
    let (reps, run_ms, rounds) = if opts.quick {
        (5, 150u64, 40)
    } else {
        (5, 1000, 200)
    };
    let run = Duration::from_millis(run_ms);
    let mut scenarios = Vec::new();
    for churn in [true, false] {
        for groups in [1, 1000] {
            for shrinkers in [100, 4000] {
                for threads in [1, 2] {
                    scenarios.push(Scenario {
                        threads,
                        shrinkers,
                        groups,
                        churn,
                        work: 0,
                    });
                }
            }
        }
    }
    // Outside the goals: the same quiet root walk with scans that do
    // some work per object, to show how the fixed per-shrinker cost of the
    // lockless walk (a reference count taken and dropped, one epoch pin)
    // weighs against callbacks that are not free.
    for work in [1, 4] {
        scenarios.push(Scenario {
            threads: 1,
            shrinkers: 100,
            groups: 1,
            churn: false,
            work,
        });
    }
    let mut rate = (Map::new(), Map::new());
    let mut skipped = (Map::new(), Map::new());
    let mut churn = (Map::new(), Map::new());
    let mut ratio = Map::new();
    let mut ratio_paired = Map::new();
    let mut table = String::from(
        "scenario                      lockless walks/s   rwlock walks/s   ratio  rwlock skipped\n",
    );
    let (mut min_churn_ratio, mut min_quiet_ratio) = (f64::INFINITY, f64::INFINITY);
    let mut lockless_skipped_total = 0.0;
    for s in &scenarios {
        let (mut a, mut b, mut sa, mut sb) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut ca, mut cb) = (Vec::new(), Vec::new());
        let mut paired = Vec::new();
        for rep in 0..reps {
            // Interleaved so that both designs see the same machine noise,
            // and in alternating order so that neither always goes first.
            let (x, y) = if rep % 2 == 0 {
                let x = measure::<ShrinkerRegistry>(*s, run)?;
                (x, measure::<RwLockRegistry>(*s, run)?)
            } else {
                let y = measure::<RwLockRegistry>(*s, run)?;
                (measure::<ShrinkerRegistry>(*s, run)?, y)
            };
            paired.push(if y.walks_per_sec > 0.0 {
                x.walks_per_sec / y.walks_per_sec
            } else {
                f64::INFINITY
            });
            a.push(x.walks_per_sec);
            sa.push(x.skipped_share);
            b.push(y.walks_per_sec);
            sb.push(y.skipped_share);
            ca.push(x.churn_per_sec);
            cb.push(y.churn_per_sec);
        }
        let (ra, rb) = (median(a), median(b));
        let (ska, skb) = (median(sa), median(sb));
        let r = if rb > 0.0 { ra / rb } else { f64::INFINITY };
        let key = s.key();
        if s.work > 0 {
            // Not one of the scenarios: no goal is computed on it.
        } else if s.churn {
            min_churn_ratio = min_churn_ratio.min(r);
        } else {
            min_quiet_ratio = min_quiet_ratio.min(r);
        }
        lockless_skipped_total += ska;
        rate.0.insert(key.clone(), json!(ra.round()));
        rate.1.insert(key.clone(), json!(rb.round()));
        skipped.0.insert(key.clone(), json!(ska));
        skipped.1.insert(key.clone(), json!(skb));
        if s.churn {
            churn.0.insert(key.clone(), json!(median(ca).round()));
            churn.1.insert(key.clone(), json!(median(cb).round()));
        }
        ratio.insert(key.clone(), json!((r * 100.0).round() / 100.0));
        let rp = median(paired);
        ratio_paired.insert(
            key.clone(),
            if rp.is_finite() {
                json!((rp * 100.0).round() / 100.0)
            } else {
                Value::Null
            },
        );
        table.push_str(&format!(
            "{key:<29} {ra:>16.0} {rb:>16.0} {r:>7.2} {:>14.1}%\n",
            skb * 100.0
        ));
    }
    let wl = unregister_waits::<ShrinkerRegistry>(rounds)?;
    let wr = unregister_waits::<RwLockRegistry>(rounds)?;
    let waits = |w: &Waits| {
        json!({
            "p50": percentile(&w.us, 0.5).round(),
            "p90": percentile(&w.us, 0.9).round(),
            "max": percentile(&w.us, 1.0).round(),
        })
    };
    let in_flight_mean =
        wl.in_flight.iter().sum::<usize>() as f64 / wl.in_flight.len().max(1) as f64;
    let in_flight_max = wl.in_flight.iter().copied().max().unwrap_or(0);
    table.push_str(&format!(
        "\nunregister wait (2 threads walking 100 shrinkers, ~20 us per scan): lockless p50 {:.0} us p90 {:.0} us; rwlock p50 {:.0} us p90 {:.0} us\n",
        percentile(&wl.us, 0.5),
        percentile(&wl.us, 0.9),
        percentile(&wr.us, 0.5),
        percentile(&wr.us, 0.9),
    ));
    table.push_str(&format!(
        "lockless unregister waited for {in_flight_mean:.2} scans in flight on average (max {in_flight_max})\n"
    ));
    table.push_str(&format!(
        "goals: min ratio under churn {min_churn_ratio:.2} (>= 3), min ratio quiet {min_quiet_ratio:.2} (>= 0.9), lockless walks skipped {lockless_skipped_total}\n"
    ));
    let json = json!({
        "shrinks_per_sec": { "lockless": Value::Object(rate.0), "rwlock": Value::Object(rate.1) },
        "skipped_share": { "lockless": Value::Object(skipped.0), "rwlock": Value::Object(skipped.1) },
        "ratio": Value::Object(ratio),
        "ratio_paired_median": Value::Object(ratio_paired),
        "churn_per_sec": { "lockless": Value::Object(churn.0), "rwlock": Value::Object(churn.1) },
        "unregister_wait_us": { "lockless": waits(&wl), "rwlock": waits(&wr) },
        "unregister_in_flight_mean": in_flight_mean,
        "unregister_in_flight_max": in_flight_max,
        "goals": {
            "min_ratio_churn": min_churn_ratio,
            "min_ratio_quiet": min_quiet_ratio,
            "lockless_walks_skipped": lockless_skipped_total,
        },
        "config": { "priority": PRIORITY, "objects": OBJECTS, "reps": reps, "run_ms": run_ms, "unregister_rounds": rounds },
    });
    Ok(Report { json, table })
}
