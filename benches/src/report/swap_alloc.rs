//! Report section `swap-alloc`: the cluster allocator against its baselines, side by side in
//! one run.
//!
//! JSON keys (each keyed by design):
//! - `ops_per_sec`: alloc+free pairs per second, median of the repetitions, for orders 0 and 4
//!   at 1 and 2 threads (`order0_1t`, `order0_2t`, `order4_1t`, `order4_2t`); designs
//!   `cluster`, `nonfull_first` (the same allocator refilling partly used clusters first, with
//!   a threshold of 64 free slots), `global_lock`, `slot_cache`.
//! - `ops_per_cpu_sec`: the same pairs per second of CPU time the worker threads got, and
//!   `cpu_parallelism`, their CPU time over wall time (below the thread count when the
//!   machine is busy: then the wall-time figures say little about scaling).
//! - `device_lock_per_alloc`: device-lock acquisitions, on the allocation and the free path
//!   together, per order-0 allocation in the 2-thread run (machine independent; the global
//!   lock takes one to allocate and one to free); `device_lock_per_alloc_by_run` has every
//!   run, and `device_lock_per_alloc_mixed_workload` the random mixed-order workload.
//! - `order4_fallback_rate`: the share of order-4 allocations that fail in a random mixed
//!   order-0/order-4 workload at 50, 80 and 95 percent fill (median over seeds); designs
//!   `cluster`, `nonfull_first` and `order_unaware`.
//! - `ratios`: the goals computed from the figures above.

use std::sync::Arc;
use std::time::Duration;

use super::swap_alloc_workload::{fallback, throughput, Throughput};
use serde_json::{json, Map, Value};
use swap_alloc::{DeviceConfig, SwapDevice};
use swap_alloc_baseline::{order_unaware, GlobalLockDevice, SlotAllocator, SlotCacheDevice};

use super::{Options, Report};

const DESIGNS: [&str; 4] = ["cluster", "nonfull_first", "global_lock", "slot_cache"];
/// `nonfull_first`'s threshold here (the daemon uses 16: fewer holes, more list visits).
const NONFULL_MIN_FREE: usize = 64;
const CLUSTERS: u64 = 256;
const CS: usize = 512;

fn make(design: &str, nslots: u64, cpus: usize) -> anyhow::Result<Arc<dyn SlotAllocator>> {
    Ok(match design {
        "cluster" => Arc::new(SwapDevice::new(
            DeviceConfig::new(nslots).cluster_slots(CS).nr_cpus(cpus),
        )?),
        "nonfull_first" => Arc::new(SwapDevice::new(
            DeviceConfig::new(nslots)
                .cluster_slots(CS)
                .nr_cpus(cpus)
                .nonfull_first(NONFULL_MIN_FREE),
        )?),
        "global_lock" => Arc::new(GlobalLockDevice::new(nslots as usize)),
        "slot_cache" => Arc::new(SlotCacheDevice::new(nslots as usize, CS, cpus)),
        other => anyhow::bail!("unknown design {other}"),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// Runs this section.
pub fn run(opts: &Options) -> anyhow::Result<Report> {
    let (reps, run_ms, fb_warm, fb_steps, seeds) = if opts.quick {
        (3, 250u64, 100_000u64, 200_000u64, 3u64)
    } else {
        (7, 1000, 400_000, 1_000_000, 5)
    };
    let nslots = CLUSTERS * CS as u64;

    // Throughput and device-lock rate: designs interleaved within each repetition.
    let runs = [(0u32, 1usize), (0, 2), (4, 1), (4, 2)];
    let mut ops: Map<String, Value> = Map::new();
    let mut locks_by_run: Map<String, Value> = Map::new();
    let mut parallelism: Map<String, Value> = Map::new();
    let mut per_cpu: Map<String, Value> = Map::new();
    let mut failures = 0;
    for d in DESIGNS {
        ops.insert(d.into(), json!({}));
        locks_by_run.insert(d.into(), json!({}));
        parallelism.insert(d.into(), json!({}));
        per_cpu.insert(d.into(), json!({}));
    }
    for (order, threads) in runs {
        let key = format!("order{order}_{threads}t");
        let window = if order == 0 { 1024 } else { 256 };
        let mut samples: Vec<Vec<Throughput>> = vec![Vec::new(); DESIGNS.len()];
        for _ in 0..reps {
            for (i, d) in DESIGNS.iter().enumerate() {
                let dev = make(d, nslots, 2)?;
                let t = throughput(dev, threads, order, window, Duration::from_millis(run_ms));
                failures += t.failures;
                samples[i].push(t);
            }
        }
        for (i, d) in DESIGNS.iter().enumerate() {
            let s = &samples[i];
            let rate = median(s.iter().map(Throughput::ops_per_sec).collect());
            let locks = median(s.iter().map(Throughput::device_lock_per_alloc).collect());
            ops[*d][&key] = json!(rate.round());
            per_cpu[*d][&key] =
                json!(median(s.iter().map(Throughput::ops_per_cpu_sec).collect()).round());
            parallelism[*d][&key] = json!(median(s.iter().map(Throughput::parallelism).collect()));
            locks_by_run[*d][&key] = json!(locks);
        }
    }
    anyhow::ensure!(
        failures == 0,
        "{failures} allocations failed in the throughput runs"
    );
    let mut lock_per_alloc = Map::new();
    for d in DESIGNS {
        lock_per_alloc.insert(d.into(), locks_by_run[d]["order0_2t"].clone());
    }

    // Order-4 fallback under a mixed workload.
    let fb_slots = 128 * CS as u64;
    let fills = [50u32, 80, 95];
    let mut fb: Map<String, Value> = Map::new();
    let mut fb_locks: Map<String, Value> = Map::new();
    for design in ["cluster", "nonfull_first", "order_unaware"] {
        let mut per_fill = Map::new();
        let mut per_fill_locks = Map::new();
        for fill in fills {
            let mut rates = Vec::new();
            let mut locks = Vec::new();
            for seed in 0..seeds {
                let cfg = DeviceConfig::new(fb_slots).cluster_slots(CS).nr_cpus(1);
                let dev = match design {
                    "cluster" => SwapDevice::new(cfg)?,
                    "nonfull_first" => SwapDevice::new(cfg.nonfull_first(NONFULL_MIN_FREE))?,
                    _ => order_unaware(cfg)?,
                };
                let f = fallback(
                    &dev,
                    fb_slots,
                    f64::from(fill) / 100.0,
                    fb_warm,
                    fb_steps,
                    0x2545_f491_4f6c_dd1d ^ (seed * 0x9e37_79b9),
                );
                dev.check_integrity()?;
                rates.push(f.rate());
                locks.push(f.device_locks as f64 / f.allocations.max(1) as f64);
            }
            per_fill.insert(fill.to_string(), json!(median(rates)));
            per_fill_locks.insert(fill.to_string(), json!(median(locks)));
        }
        fb.insert(design.into(), Value::Object(per_fill));
        fb_locks.insert(design.into(), Value::Object(per_fill_locks));
    }

    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let speedup_2t = f(&ops["cluster"]["order0_2t"]) / f(&ops["global_lock"]["order0_2t"]);
    let speedup_2t_o4 = f(&ops["cluster"]["order4_2t"]) / f(&ops["global_lock"]["order4_2t"]);
    let fb_ratio_80 = f(&fb["cluster"]["80"]) / f(&fb["order_unaware"]["80"]);
    let json = json!({
        "device_lock_per_alloc": lock_per_alloc,
        "device_lock_per_alloc_by_run": locks_by_run,
        "ops_per_sec": ops,
        "ops_per_cpu_sec": per_cpu,
        "cpu_parallelism": parallelism,
        "order4_fallback_rate": fb,
        "device_lock_per_alloc_mixed_workload": fb_locks,
        "ratios": {
            "cluster_vs_global_lock_2t_order0": speedup_2t,
            "cluster_vs_global_lock_2t_order4": speedup_2t_o4,
            "order4_fallback_cluster_over_order_unaware_at_80": fb_ratio_80,
        },
        "params": {
            "quick": opts.quick,
            "repetitions": reps,
            "nslots": nslots,
            "cluster_slots": CS,
            "window": {"order0": 1024, "order4": 256},
            "run_ms": run_ms,
            "fallback_nslots": fb_slots,
            "fallback_steps": fb_steps,
            "fallback_warmup": fb_warm,
            "fallback_seeds": seeds,
        },
    });

    let mut table = String::new();
    table.push_str(&format!(
        "alloc+free pairs/s (median of {reps}), device {nslots} slots, FIFO window per thread\n"
    ));
    table.push_str(&format!(
        "{:<14} {:>12} {:>12} {:>12} {:>12}   {:>14} {:>8}\n",
        "design", "order0 1t", "order0 2t", "order4 1t", "order4 2t", "devlock/alloc", "par 2t"
    ));
    for d in DESIGNS {
        table.push_str(&format!(
            "{:<14} {:>12.0} {:>12.0} {:>12.0} {:>12.0}   {:>14.4} {:>8.2}\n",
            d,
            f(&ops[d]["order0_1t"]),
            f(&ops[d]["order0_2t"]),
            f(&ops[d]["order4_1t"]),
            f(&ops[d]["order4_2t"]),
            f(&lock_per_alloc[d]),
            f(&parallelism[d]["order0_2t"]),
        ));
    }
    table.push_str("\nthe same per CPU-second the workers got\n");
    for d in DESIGNS {
        table.push_str(&format!(
            "{:<14} {:>12.0} {:>12.0} {:>12.0} {:>12.0}\n",
            d,
            f(&per_cpu[d]["order0_1t"]),
            f(&per_cpu[d]["order0_2t"]),
            f(&per_cpu[d]["order4_1t"]),
            f(&per_cpu[d]["order4_2t"]),
        ));
    }
    table.push_str(&format!(
        "\norder-4 fallback rate, mixed order-0/order-4 workload ({fb_slots} slots, median of {seeds} seeds)\n"
    ));
    table.push_str(&format!(
        "{:<14} {:>8} {:>8} {:>8}\n",
        "design", "50%", "80%", "95%"
    ));
    for d in ["cluster", "nonfull_first", "order_unaware"] {
        table.push_str(&format!(
            "{:<14} {:>8.4} {:>8.4} {:>8.4}\n",
            d,
            f(&fb[d]["50"]),
            f(&fb[d]["80"]),
            f(&fb[d]["95"])
        ));
    }
    table.push_str(&format!(
        "\ncluster / global_lock at 2 threads: order 0 {speedup_2t:.2}x, order 4 {speedup_2t_o4:.2}x\n\
         order-4 fallback at 80% fill, cluster / order_unaware: {fb_ratio_80:.3}\n"
    ));
    Ok(Report { json, table })
}
