//! Replays every cell of the replay report (`cargo run --release -p bench --bin report --
//! mglru`: the same traces, seeds, lengths and capacities) with exact LRU and any number of
//! MGLRU configurations, and prints each configuration's miss ratio per cell, its excess
//! over LRU and, given the report's JSON, its distance to the best of libCacheSim's ARC,
//! LIRS and S3-FIFO; then per configuration the cells more than 0.5 points worse than LRU,
//! the worst, and the largest distances on the scan mixes, moved hot sets, loops and lirs_cs.
//! The tuning tool of `docs/experiments/2026-11-27-mglru-*.md`: machine independent and a few
//! times faster than the report (no libCacheSim, no timing sections).
//!
//! ```text
//! cargo run --release -p mglru --example cells -- [--traces DIR] [--report JSON] \
//!     [--only PREFIX]... [--cells] VARIANT...
//! ```
//!
//! A variant is `default`, `v61`, `noclock` or a comma-separated list of `knob=value` changes
//! to `Config::default()` (`eviction_aging=0`, `refault_window=2`, ...; see `config`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;

use mglru::replay::{distinct, parse_trace, replay, workload};
use mglru::{Config, Lru, Mglru, PageId};

const FRACTIONS: [f64; 4] = [0.01, 0.05, 0.10, 0.25];
const SET_FRACTIONS: [f64; 4] = [0.2, 0.4, 0.6, 0.8];

fn config(spec: &str) -> Result<Config, String> {
    let mut c = Config::default();
    for part in spec.split(',').filter(|p| !p.is_empty() && *p != "default") {
        if part == "v61" {
            c = Config::v6_1();
            continue;
        }
        if part == "noclock" {
            c.eviction_aging = 0;
            continue;
        }
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("bad change {part}"))?;
        let n: u64 = v.parse().map_err(|_| format!("bad value in {part}"))?;
        match k {
            "eviction_aging" => c.eviction_aging = n as u32,
            "demotion_feedback" => c.demotion_feedback = n != 0,
            "loop_eviction" => c.loop_eviction = n as u32,
            "idle_youngest_demotion" => c.idle_youngest_demotion = n != 0,
            "loop_window" => c.loop_window = n as u32,
            "loop_order" => c.loop_order = n as u32,
            "refault_activation" => c.refault_activation = n != 0,
            "refault_window" => c.refault_window = n,
            "look_twice" => c.look_twice = n != 0,
            "young_bound_aging" => c.young_bound_aging = n != 0,
            "bloom_filter" => c.bloom_filter = n != 0,
            "look_around" => c.look_around = n != 0,
            "max_nr_gens" => c.max_nr_gens = n as usize,
            "placement" => {
                c.fault_placement = match n {
                    0 => mglru::FaultPlacement::Oldest,
                    1 => mglru::FaultPlacement::SecondOldest,
                    _ => mglru::FaultPlacement::Youngest,
                }
            }
            _ => return Err(format!("unknown knob {k}")),
        }
    }
    Ok(c)
}

struct Cell {
    trace: String,
    cap: usize,
    frac: f64,
    pages: Rc<Vec<PageId>>,
}

fn cells(dir: &PathBuf) -> Result<Vec<Cell>, String> {
    let mut out = Vec::new();
    let by_fraction = |out: &mut Vec<Cell>, name: &str, t: Vec<PageId>| {
        let d = distinct(&t);
        let t = Rc::new(t);
        for f in FRACTIONS {
            out.push(Cell {
                trace: name.into(),
                cap: ((d as f64 * f) as usize).max(1),
                frac: f,
                pages: t.clone(),
            });
        }
    };
    let by_set = |out: &mut Vec<Cell>, name: &str, set: usize, t: Vec<PageId>| {
        let t = Rc::new(t);
        for f in SET_FRACTIONS {
            out.push(Cell {
                trace: name.into(),
                cap: ((set as f64 * f) as usize).max(1),
                frac: f,
                pages: t.clone(),
            });
        }
    };
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut files: Vec<_> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "txt"))
            .collect();
        files.sort();
        for p in files {
            let name = p
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&p).map_err(|e| e.to_string())?;
            by_fraction(
                &mut out,
                &name,
                parse_trace(&text).map_err(|e| e.to_string())?,
            );
        }
    }
    let len = 1_000_000;
    by_fraction(
        &mut out,
        "zipf_scan_1to1",
        workload::zipf_with_scan(20_000, 0.9, 1, 1, len, 1),
    );
    by_fraction(
        &mut out,
        "zipf_scan_1to4",
        workload::zipf_with_scan(20_000, 0.9, 1, 4, len, 2),
    );
    for (name, num, den) in [
        ("loop_1.1x", 11, 10),
        ("loop_1.5x", 3, 2),
        ("loop_2x", 2, 1),
    ] {
        for f in FRACTIONS {
            let cap = (20_000.0 * f) as usize;
            let pages = if num == 11 {
                cap + cap / 10
            } else {
                cap * num / den
            };
            out.push(Cell {
                trace: name.into(),
                cap,
                frac: f,
                pages: Rc::new(workload::looping(pages, 10)),
            });
        }
    }
    for set in [5_000, 20_000] {
        for (alpha, seed) in [(0.9, 11), (1.0, 12), (1.1, 13)] {
            let t = workload::moving_hot_set(set, alpha, 5 * set, 3, seed + set as u64);
            by_set(
                &mut out,
                &format!("moved_z{alpha:.1}_{}k", set / 1000),
                set,
                t,
            );
        }
    }
    for (scan, seed) in [(10_000, 21), (30_000, 22)] {
        let t = workload::zipf_with_periodic_scan(10_000, 0.9, scan, 40_000, 800_000, seed);
        by_set(&mut out, &format!("wss_scan_{}k", scan / 1000), 10_000, t);
    }
    Ok(out)
}

fn main() -> Result<(), String> {
    let mut dir = PathBuf::from("../shared/data/traces");
    let mut report: Option<PathBuf> = None;
    let mut only: Vec<String> = Vec::new();
    let mut show_cells = false;
    let mut heldout = false;
    let mut variants = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--traces" => dir = PathBuf::from(args.next().ok_or("--traces DIR")?),
            "--report" => report = Some(PathBuf::from(args.next().ok_or("--report JSON")?)),
            "--only" => only.push(args.next().ok_or("--only PREFIX")?),
            "--cells" => show_cells = true,
            "--heldout" => heldout = true,
            v => variants.push(v.to_string()),
        }
    }
    if variants.is_empty() {
        variants.push("default".into());
    }
    // libCacheSim's results (and LRU's) from a report's JSON, if given.
    let json: Option<serde_json::Value> = match &report {
        Some(p) => Some(
            serde_json::from_str(&std::fs::read_to_string(p).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let all = if heldout {
        heldout_cells()
    } else {
        cells(&dir)?
    };
    let all: Vec<Cell> = all
        .into_iter()
        .filter(|c| only.is_empty() || only.iter().any(|o| c.trace.starts_with(o.as_str())))
        .collect();
    let cfgs: Vec<Config> = variants
        .iter()
        .map(|v| config(v))
        .collect::<Result<_, _>>()?;
    // (lru, best of ARC/LIRS/S3-FIFO) per cell.
    let mut base = Vec::new();
    for c in &all {
        let from_json = |k: &str| {
            json.as_ref()
                .and_then(|j| j["miss_ratio"][&c.trace][c.cap.to_string()][k].as_f64())
        };
        let lru = match from_json("lru") {
            Some(v) => v,
            None => replay(&mut Lru::new(), c.cap, &c.pages)
                .map_err(|e| e.to_string())?
                .miss_ratio(),
        };
        let best = ["ARC", "LIRS", "S3-FIFO"]
            .iter()
            .filter_map(|k| from_json(k))
            .fold(f64::INFINITY, f64::min);
        base.push((lru, best));
    }
    let mut summary = Vec::new();
    for (v, cfg) in variants.iter().zip(&cfgs) {
        let mut over = Vec::new();
        let mut worst = (f64::NEG_INFINITY, String::new());
        let mut gaps: BTreeMap<String, f64> = BTreeMap::new();
        let mut sum = 0.0;
        for (c, &(lru, best)) in all.iter().zip(&base) {
            let mut p = Mglru::new(cfg.clone()).map_err(|e| e.to_string())?;
            let m = replay(&mut p, c.cap, &c.pages)
                .map_err(|e| e.to_string())?
                .miss_ratio();
            let ex = (m - lru) * 100.0;
            sum += m * 100.0;
            let gap = (m - best) * 100.0;
            if ex > 0.5 {
                over.push(format!("{}@{} {ex:+.2}", c.trace, c.cap));
            }
            if ex > worst.0 {
                worst = (ex, format!("{}@{}", c.trace, c.cap));
            }
            let fam = family(&c.trace);
            if gap.is_finite() {
                let e = gaps.entry(fam.to_string()).or_insert(f64::NEG_INFINITY);
                *e = e.max(gap);
            }
            if show_cells {
                println!(
                    "{v:<40} {:<16} {:>7} {:>4.0}% mglru {:>6.2} lru {:>6.2} ex {ex:+6.2} gap {gap:+6.2}",
                    c.trace,
                    c.cap,
                    c.frac * 100.0,
                    m * 100.0,
                    lru * 100.0
                );
            }
        }
        if only.len() == 1 {
            summary.push(format!("{v}: sum {sum:.2}"));
            continue;
        }
        let g: Vec<String> = gaps.iter().map(|(k, v)| format!("{k} {v:+.1}")).collect();
        summary.push(format!(
            "{v}: over {} worst {:+.2} at {}; sum {sum:.1}; max gap {}\n    {}",
            over.len(),
            worst.0,
            worst.1,
            g.join(", "),
            over.join(", ")
        ));
    }
    for s in summary {
        println!("{s}");
    }
    Ok(())
}

/// Traces the rules were not tuned on (`--heldout`, 2026-11-27's fourth round): moved hot
/// sets of other sizes, skews, phase lengths, seeds and capacities; loops over 1.25x and 3x
/// memory; periodic scans and Zipf/scan mixes of other proportions; stable Zipf sets, alone
/// and after a pass writing them in order (`h_irm_*`, `h_wzipf_*`, added in the fifth round).
/// Libcachesim's results
/// are not in any report for these, so only LRU is the bar.
fn heldout_cells() -> Vec<Cell> {
    let mut out = Vec::new();
    for (set, phase_mult, phases) in [(2_000, 3, 4), (10_000, 10, 3), (40_000, 2, 5)] {
        for (alpha, seed) in [(0.8, 101), (1.0, 102), (1.2, 103)] {
            let t = Rc::new(workload::moving_hot_set(
                set,
                alpha,
                phase_mult * set,
                phases,
                seed + set as u64,
            ));
            for f in [0.3, 0.5, 0.7, 0.9] {
                out.push(Cell {
                    trace: format!("h_moved_z{alpha:.1}_{}k_x{phase_mult}", set / 1000),
                    cap: (set as f64 * f) as usize,
                    frac: f,
                    pages: t.clone(),
                });
            }
        }
    }
    // Stable hot sets (2026-11-27's fifth round): Zipf over one set for 20 set-lengths (the
    // independent reference model), alone (`h_irm`) and after one pass writing every page in
    // order (`h_wzipf`, the shape of the daemon comparison driver's Zipf run).
    for (set, seed) in [(5_000, 111), (20_000, 112)] {
        for alpha in [0.8, 1.0, 1.2] {
            let zipf =
                workload::moving_hot_set(set, alpha, 20 * set, 1, seed + (alpha * 10.0) as u64);
            let written: Vec<PageId> = (0..set as PageId).chain(zipf.iter().copied()).collect();
            for (name, t) in [("irm", Rc::new(zipf)), ("wzipf", Rc::new(written))] {
                for f in [0.3, 0.6, 0.9] {
                    out.push(Cell {
                        trace: format!("h_{name}_z{alpha:.1}_{}k", set / 1000),
                        cap: (set as f64 * f) as usize,
                        frac: f,
                        pages: t.clone(),
                    });
                }
            }
        }
    }
    for (num, den) in [(5, 4), (3, 1)] {
        for cap in [500, 3000] {
            out.push(Cell {
                trace: format!("h_loop_{num}/{den}x"),
                cap,
                frac: 0.0,
                pages: Rc::new(workload::looping(cap * num / den, 8)),
            });
        }
    }
    for (scan, period, seed) in [(5_000, 20_000, 31), (20_000, 60_000, 32)] {
        let t = Rc::new(workload::zipf_with_periodic_scan(
            8_000, 1.0, scan, period, 600_000, seed,
        ));
        for f in [0.3, 0.6, 0.9] {
            out.push(Cell {
                trace: format!("h_wss_scan_{}k", scan / 1000),
                cap: (8_000.0 * f) as usize,
                frac: f,
                pages: t.clone(),
            });
        }
    }
    for (hot, scan, seed) in [(1, 2, 41), (2, 1, 42)] {
        let t = Rc::new(workload::zipf_with_scan(
            10_000, 1.0, hot, scan, 500_000, seed,
        ));
        let d = distinct(&t);
        for f in [0.02, 0.1] {
            out.push(Cell {
                trace: format!("h_zipf_scan_{hot}to{scan}"),
                cap: (d as f64 * f) as usize,
                frac: f,
                pages: t.clone(),
            });
        }
    }
    out
}

/// The trace families the goals name.
fn family(trace: &str) -> &str {
    if trace.starts_with("zipf_scan") {
        "scan"
    } else if trace.starts_with("moved") {
        "moved"
    } else if trace.starts_with("loop_1.1") {
        "loop1.1"
    } else if trace.starts_with("loop") {
        "loop>1.1"
    } else if trace == "lirs_cs" {
        "lirs_cs"
    } else {
        "other"
    }
}
