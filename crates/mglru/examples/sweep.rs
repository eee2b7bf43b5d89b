//! Diagnostic sweep: replays the benchmark's workloads (the traces in a directory, the Zipf
//! hot set mixed 1:1 and 1:4 with a scan, the loop over 1.1x the capacity) at 1, 5, 10 and 25%
//! of their distinct pages with exact LRU, the active/inactive lists and MGLRU configurations,
//! and prints each configuration's excess over LRU and over active/inactive in points.
//!
//! ```text
//! cargo run --release -p mglru --example sweep -- [--traces DIR] [--zipf-len N] [--rounds R] \
//!     [--seed N] [--stats] VARIANT...
//! ```
//!
//! A variant is `default` or a comma-separated list of changes to `Config::default()`:
//! `v61` (`Config::v6_1()`), `lt`/`nolt` (`look_twice`), `old`/`so`/`young` (fault
//! placement), `yb`/`noyb` (`young_bound_aging`), `w<N>` (`refault_window`), `nobloom`, `nola`
//! (no look-around), `g3` (three generations). Changes apply left to right.
//!
//! `--stats` adds, for the scan mixes, the mean share of memory held by scan pages and the hot
//! pages' miss ratio (MGLRU, active/inactive, LRU), and for every replay the walks, the final
//! generation sizes and the counters of `Mglru::stats`. The workloads include a working-set
//! shift (Zipf over one hot set, then over a disjoint one) that the report does not run.

use std::path::PathBuf;

use mglru::replay::{distinct, parse_trace, replay_with, workload};
use mglru::{AccessBits, ActiveInactive, Config, FaultPlacement, Lru, Mglru, PageId, Policy};

const FRACTIONS: [f64; 4] = [0.01, 0.05, 0.10, 0.25];

fn config(spec: &str) -> Result<Config, String> {
    let mut c = Config::default();
    for part in spec.split(',').filter(|p| !p.is_empty() && *p != "default") {
        match part {
            "v61" => c = Config::v6_1(),
            "yb" => c.young_bound_aging = true,
            "noyb" => c.young_bound_aging = false,
            "lt" => c.look_twice = true,
            "nolt" => c.look_twice = false,
            "so" => c.fault_placement = FaultPlacement::SecondOldest,
            "young" => c.fault_placement = FaultPlacement::Youngest,
            "nobloom" => c.bloom_filter = false,
            "nola" => c.look_around = false,
            "g3" => c.max_nr_gens = 3,
            "old" => c.fault_placement = FaultPlacement::Oldest,
            e if e.starts_with('e') => {
                c.eviction_aging = e[1..].parse().map_err(|_| format!("bad {e}"))?
            }
            w if w.starts_with('w') => {
                c.refault_window = w[1..].parse().map_err(|_| format!("bad {w}"))?
            }
            other => return Err(format!("unknown change {other}")),
        }
    }
    Ok(c)
}

struct Run {
    trace: String,
    frac: f64,
    cap: usize,
    pages: std::rc::Rc<Vec<PageId>>,
}

/// Replays a scan mix and reports the mean share of memory held by scan pages (ids >= 2^32)
/// and the hot pages' miss ratio.
fn scan_occupancy(p: &mut dyn Policy, cap: usize, trace: &[PageId]) -> String {
    let mut bits = AccessBits::new();
    let (mut scan_res, mut sum, mut samples) = (0i64, 0i64, 0i64);
    let (mut hot, mut hot_miss) = (0u64, 0u64);
    for (k, &page) in trace.iter().enumerate() {
        let is_scan = page >= 1 << 32;
        hot += u64::from(!is_scan);
        bits.set(page);
        if p.contains(page) {
            p.access(page, mglru::AccessKind::Mapped);
        } else {
            hot_miss += u64::from(!is_scan);
            if p.len() >= cap {
                for v in p.evict(p.len() + 1 - cap, &mut bits) {
                    bits.clear(v);
                    scan_res -= i64::from(v >= 1 << 32);
                }
            }
            // The scan mixes' ids are below 2^33; report any refusal rather than skip it.
            if let Err(e) = p.add(page, mglru::Hint::fault(mglru::PageType::Anon)) {
                return format!("stopped at request {k}: {e}");
            }
            scan_res += i64::from(is_scan);
        }
        if k % 97 == 0 && k > trace.len() / 5 {
            sum += scan_res;
            samples += 1;
        }
    }
    format!(
        "scan share {:.1}% hot miss {:.2}%",
        100.0 * sum as f64 / samples.max(1) as f64 / cap as f64,
        100.0 * hot_miss as f64 / hot.max(1) as f64
    )
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut dir = PathBuf::from("../shared/data/traces");
    let mut zipf_len = 300_000usize;
    let mut rounds = 5usize;
    let mut stats = false;
    let mut seed = 0u64;
    let mut variants = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--traces" => dir = args.next().ok_or("--traces DIR")?.into(),
            "--zipf-len" => {
                zipf_len = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--zipf-len N")?
            }
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--rounds R")?
            }
            "--stats" => stats = true,
            "--seed" => seed = args.next().and_then(|v| v.parse().ok()).ok_or("--seed N")?,
            v => variants.push(v.to_string()),
        }
    }
    if variants.is_empty() {
        variants.push("default".into());
    }
    let mut runs = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "txt"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut add = |name: String, t: Vec<PageId>| {
        let d = distinct(&t);
        let t = std::rc::Rc::new(t);
        for f in FRACTIONS {
            runs.push(Run {
                trace: name.clone(),
                frac: f,
                cap: ((d as f64 * f) as usize).max(1),
                pages: t.clone(),
            });
        }
    };
    for p in files {
        let text = std::fs::read_to_string(&p).map_err(|e| e.to_string())?;
        let t = parse_trace(&text).map_err(|e| e.to_string())?;
        add(p.file_stem().unwrap().to_string_lossy().into_owned(), t);
    }
    add(
        "zipf_scan_1to1".into(),
        workload::zipf_with_scan(20_000, 0.9, 1, 1, zipf_len, 1 + seed),
    );
    add(
        "zipf_scan_1to4".into(),
        workload::zipf_with_scan(20_000, 0.9, 1, 4, zipf_len, 2 + seed),
    );
    // A working-set shift: Zipf(0.9) over one hot set, then over a disjoint one.
    {
        let z = workload::Zipf::new(20_000, 0.9);
        let mut rng = workload::SplitMix::new(3);
        let half = zipf_len / 2;
        let t: Vec<PageId> = (0..zipf_len)
            .map(|k| z.sample(&mut rng) + if k < half { 0 } else { 1 << 20 })
            .collect();
        add("shift".into(), t);
    }
    // The report's moved hot sets, periodic scans and longer loops.
    for set in [5_000usize, 20_000] {
        for (alpha, s) in [(0.9, 11), (1.0, 12), (1.1, 13)] {
            let t = std::rc::Rc::new(workload::moving_hot_set(
                set,
                alpha,
                5 * set,
                3,
                s + set as u64,
            ));
            for f in [0.2, 0.4, 0.6, 0.8] {
                runs.push(Run {
                    trace: format!("moved_z{alpha:.1}_{}k", set / 1000),
                    frac: f,
                    cap: (set as f64 * f) as usize,
                    pages: t.clone(),
                });
            }
        }
    }
    for (scan, s) in [(10_000usize, 21), (30_000, 22)] {
        let t = std::rc::Rc::new(workload::zipf_with_periodic_scan(
            10_000, 0.9, scan, 40_000, 800_000, s,
        ));
        for f in [0.2, 0.4, 0.6, 0.8] {
            runs.push(Run {
                trace: format!("wss_scan_{}k", scan / 1000),
                frac: f,
                cap: (10_000.0 * f) as usize,
                pages: t.clone(),
            });
        }
    }
    for (name, num, den) in [("loop_1.5x", 3, 2), ("loop_2x", 2, 1)] {
        for f in FRACTIONS {
            let cap = (20_000.0 * f) as usize;
            runs.push(Run {
                trace: name.into(),
                frac: f,
                cap,
                pages: std::rc::Rc::new(workload::looping(cap * num / den, rounds)),
            });
        }
    }
    for f in FRACTIONS {
        let cap = (20_000.0 * f) as usize;
        runs.push(Run {
            trace: "loop_1.1x".into(),
            frac: f,
            cap,
            pages: std::rc::Rc::new(workload::looping(cap + cap / 10, rounds)),
        });
    }
    let cfgs: Vec<(String, Config)> = variants
        .iter()
        .map(|v| config(v).map(|c| (v.clone(), c)))
        .collect::<Result<_, _>>()?;
    print!("{:<15} {:>6} {:>7} {:>7}", "trace", "cap", "lru", "a-i");
    for (v, _) in &cfgs {
        print!(" {:>16}", v);
    }
    println!();
    let mut worst = vec![(f64::NEG_INFINITY, String::new()); cfgs.len()];
    let mut scan_ok = vec![true; cfgs.len()];
    for r in &runs {
        let ratio = |p: &mut dyn Policy| {
            let mut bits = AccessBits::new();
            replay_with(p, r.cap, &r.pages, &mut bits)
                .map(|x| x.miss_ratio() * 100.0)
                .unwrap_or(f64::NAN)
        };
        let lru = ratio(&mut Lru::new());
        let ai = ratio(&mut ActiveInactive::default());
        print!(
            "{:<15} {:>4}% {:>7.2} {:>7.2}",
            r.trace,
            (r.frac * 100.0) as u32,
            lru,
            ai
        );
        let mut extra = Vec::new();
        for (k, (_, c)) in cfgs.iter().enumerate() {
            let mut m = Mglru::new(c.clone()).map_err(|e| e.to_string())?;
            let x = ratio(&mut m);
            let flag = if x - lru > 0.5 { '!' } else { ' ' };
            let scan = r.trace.starts_with("zipf");
            let sflag = if scan && x >= ai { '#' } else { ' ' };
            if x - lru > worst[k].0 {
                worst[k] = (x - lru, format!("{} {}%", r.trace, (r.frac * 100.0) as u32));
            }
            if scan && x >= ai {
                scan_ok[k] = false;
            }
            print!(" {:>6.2} {:>+6.2}{}{}", x, x - lru, flag, sflag);
            if stats && scan {
                let mut m = Mglru::new(c.clone()).map_err(|e| e.to_string())?;
                extra.push(format!("mglru {}", scan_occupancy(&mut m, r.cap, &r.pages)));
                extra.push(format!(
                    "a-i   {}",
                    scan_occupancy(&mut ActiveInactive::default(), r.cap, &r.pages)
                ));
                extra.push(format!(
                    "lru   {}",
                    scan_occupancy(&mut Lru::new(), r.cap, &r.pages)
                ));
            }
            if stats {
                let s = m.stats();
                extra.push(format!(
                    "[walks {} gens {:?} young {} activated {} la {} refaults {} tiers {:?}]",
                    s.walks,
                    s.generations
                        .iter()
                        .map(|g| (g.seq, g.pages[0]))
                        .collect::<Vec<_>>(),
                    s.walk_totals.young,
                    s.activated,
                    s.look_around_promoted,
                    s.refaults,
                    s.tiers[0]
                        .iter()
                        .map(|t| (t.evicted, t.refaulted, t.protected))
                        .collect::<Vec<_>>()
                ));
            }
        }
        println!();
        for e in extra {
            println!("    {e}");
        }
    }
    for (k, (v, _)) in cfgs.iter().enumerate() {
        println!(
            "{v}: worst excess over LRU {:+.2} at {}; beats active-inactive on every scan mix: {}",
            worst[k].0, worst[k].1, scan_ok[k]
        );
    }
    Ok(())
}
