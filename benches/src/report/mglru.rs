//! Report section `mglru`: miss ratios of the multi-generational LRU against the
//! active/inactive lists, LRU and CLOCK (all in `crates/mglru`) and against libCacheSim's ARC,
//! LIRS and S3-FIFO (PyPI `libcachesim`, run in a `python3` subprocess), side by side in one
//! run, plus the cost of aging with and without the bloom filter.
//!
//! Workloads: the traces in `../shared/data/traces` (skipped with a note if absent); a Zipf(0.9)
//! hot set of 20,000 pages interleaved 1:1 and 1:4 with a one-pass scan; loops over 1.1, 1.5
//! and 2 times the capacity; hot sets that move (`moved_zA_Nk`: Zipf(A) over N thousand pages,
//! then over a disjoint set of the same size, then back; A in 0.9, 1.0, 1.1; N 5 and 20); a
//! working set with periodic full scans (`wss_scan_Nk`: Zipf(0.9) over 10,000 pages, a pass
//! over N thousand other pages after every 40,000 of its requests). Capacities: 1, 5, 10 and
//! 25% of a trace's distinct pages (the loops: of 20,000 pages, looping over 1.1, 1.5 or 2
//! times that; the moved and periodic-scan traces: 20, 40, 60 and 80% of one set, which
//! `capacity_fraction` gives instead of a share of distinct pages).
//!
//! JSON keys:
//! - `miss_ratio[trace][capacity][policy]`: misses / requests (every request counted). The
//!   capacity key is the number of pages; `capacity_fraction[trace][capacity]` gives the share
//!   of distinct pages. Policies: `mglru` (the default `Config`: v6.1 with faulted pages in the
//!   oldest generation and the look-twice rule for their first accessed bit), `mglru-v6.1`
//!   (`Config::v6_1()`: faulted pages youngest, their fault's bit counted as a reuse),
//!   `mglru-noidle` (the default without `idle_youngest_demotion`, the default before
//!   2026-11-27's fourth round), `mglru-noloop` (without `idle_youngest_demotion` and
//!   `loop_eviction`, the default before the loop mode of 2026-11-27's third round),
//!   `mglru-nofeedback` (without those and `demotion_feedback`, the default before
//!   2026-11-27), `mglru-noclock` (without `idle_youngest_demotion`, `loop_eviction` and
//!   `eviction_aging`, the default before issue #20),
//!   `active-inactive`,
//!   `lru`, `clock`, and `ARC`, `LIRS`, `S3-FIFO` when libCacheSim is installed.
//! - `libcachesim`: the version used, or the reason it could not run.
//! - `goals[policy]`: for `mglru`, `mglru-noidle`, `mglru-noloop`, `mglru-nofeedback`,
//!   `mglru-noclock` and
//!   `mglru-v6.1`: the worst excess over LRU in points
//!   (`max_excess_over_lru_points`, goal <= 0.5) and where; whether it beats active-inactive on
//!   every scan-mixed trace and capacity (`beats_active_inactive_on_scans`); and
//!   `gap_to_best_points[trace][capacity]`, its miss ratio minus the best of ARC, LIRS and
//!   S3-FIFO, in points.
//! - `aging`: per walk, `pages_scanned`, `regions_scanned`, `regions_skipped`, `ns_per_page`
//!   (median over walks of walk time / pages scanned), `ns_per_walk` and `ns_per_age` (the
//!   whole `age()`, including the drain of the oldest generation into the next), with
//!   (`bloom`) and without (`no_bloom`) the filter, on 128 regions of 512 resident pages of
//!   which 8 are densely accessed and the rest have one touched page each; `pages_ratio` and
//!   `time_ratio` (no_bloom / bloom). The access source there is a page-table-like array read
//!   entry by entry, so the walk's cost follows the pages scanned as in the kernel.
//! - `walk_pages_per_request[trace][variant]`: pages scanned by aging walks per request and
//!   walks in the replays at 10% capacity, with (`bloom`) and without (`no_bloom`) the filter
//!   in the default configuration and for `Config::v6_1()` (`v6.1`, with the filter), with the
//!   miss ratios (machine independent); also `noclock`, the default without the eviction
//!   clock. At 40% of the set for the moved and periodic-scan traces.
//! - `ns_per_request["trace @ capacity"]`: nanoseconds per replayed request (the whole replay)
//!   of `mglru` and `mglru-noclock`, median, min and max of 5 runs alternated between the two
//!   (3 with `--quick`). A timing: noisy on a shared machine.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use mglru::replay::{distinct, parse_trace, replay, replay_with, workload};
use mglru::{
    AccessBits, ActiveInactive, Clock, Config, Hint, Lru, Mglru, PageId, PageType, Policy,
};
use serde_json::{json, Map, Value};

use super::{Options, Report};

const TRACE_DIR: &str = "../shared/data/traces";
const FRACTIONS: [f64; 4] = [0.01, 0.05, 0.10, 0.25];
/// Capacities of the moved-hot-set and periodic-scan traces, as shares of the hot set.
const SET_FRACTIONS: [f64; 4] = [0.2, 0.4, 0.6, 0.8];
const RUST_POLICIES: [&str; 9] = [
    "mglru",
    "mglru-noidle",
    "mglru-noloop",
    "mglru-nofeedback",
    "mglru-noclock",
    "mglru-v6.1",
    "active-inactive",
    "lru",
    "clock",
];
const PY_POLICIES: [&str; 3] = ["ARC", "LIRS", "S3-FIFO"];
const SCAN_TRACES: [&str; 2] = ["zipf_scan_1to1", "zipf_scan_1to4"];

struct Workload {
    name: String,
    /// (capacity, fraction, trace) per capacity: the loop has its own trace per capacity.
    runs: Vec<(usize, f64, std::rc::Rc<Vec<PageId>>)>,
}

fn make(name: &str) -> anyhow::Result<Box<dyn Policy>> {
    Ok(match name {
        "mglru" => Box::new(Mglru::new(Config::default())?),
        "mglru-noidle" => Box::new(Mglru::new(Config {
            idle_youngest_demotion: false,
            ..Config::default()
        })?),
        "mglru-noloop" => Box::new(Mglru::new(Config {
            idle_youngest_demotion: false,
            loop_eviction: 0,
            ..Config::default()
        })?),
        "mglru-nofeedback" => Box::new(Mglru::new(Config {
            idle_youngest_demotion: false,
            loop_eviction: 0,
            demotion_feedback: false,
            ..Config::default()
        })?),
        "mglru-noclock" => Box::new(Mglru::new(no_clock())?),
        "mglru-v6.1" => Box::new(Mglru::new(Config::v6_1())?),
        "active-inactive" => Box::new(ActiveInactive::default()),
        "lru" => Box::new(Lru::new()),
        "clock" => Box::new(Clock::new()),
        other => anyhow::bail!("unknown policy {other}"),
    })
}

/// The default before the eviction clock (issue #20's starting point).
fn no_clock() -> Config {
    Config {
        eviction_aging: 0,
        loop_eviction: 0,
        idle_youngest_demotion: false,
        ..Config::default()
    }
}

/// Nanoseconds per replayed request of the default and of [`no_clock`] on `trace`: `runs`
/// replays of each, alternated so load on the machine hits both; (median, min, max) each.
fn replay_cost(cap: usize, trace: &[PageId], runs: usize) -> anyhow::Result<[(f64, f64, f64); 2]> {
    let mut ns = [Vec::new(), Vec::new()];
    for _ in 0..runs {
        for (k, cfg) in [Config::default(), no_clock()].into_iter().enumerate() {
            let mut lru = Mglru::new(cfg)?;
            let t = Instant::now();
            replay(&mut lru, cap, trace)?;
            ns[k].push(t.elapsed().as_nanos() as f64 / trace.len().max(1) as f64);
        }
    }
    Ok(ns.map(|v| {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (median(v), min, max)
    }))
}

fn trace_dir() -> Option<PathBuf> {
    // The report runs from the workspace root; the traces sit next to it.
    let candidates = [
        PathBuf::from(TRACE_DIR),
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(TRACE_DIR),
    ];
    candidates.into_iter().find(|p| p.is_dir())
}

fn workloads(quick: bool, notes: &mut Vec<String>) -> anyhow::Result<Vec<Workload>> {
    let mut out = Vec::new();
    match trace_dir() {
        Some(dir) => {
            let mut files: Vec<_> = std::fs::read_dir(&dir)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "txt"))
                .collect();
            files.sort();
            for path in files {
                let name = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let trace = parse_trace(&std::fs::read_to_string(&path)?)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                out.push(by_fraction(name, trace));
            }
        }
        None => notes.push(format!(
            "trace directory {TRACE_DIR} not found: traces skipped"
        )),
    }
    let len = if quick { 100_000 } else { 1_000_000 };
    out.push(by_fraction(
        "zipf_scan_1to1".into(),
        workload::zipf_with_scan(20_000, 0.9, 1, 1, len, 1),
    ));
    out.push(by_fraction(
        "zipf_scan_1to4".into(),
        workload::zipf_with_scan(20_000, 0.9, 1, 4, len, 2),
    ));
    let rounds = if quick { 3 } else { 10 };
    let runs = FRACTIONS
        .iter()
        .map(|&f| {
            let cap = (20_000.0 * f) as usize;
            let pages = cap + cap / 10;
            (cap, f, std::rc::Rc::new(workload::looping(pages, rounds)))
        })
        .collect();
    out.push(Workload {
        name: "loop_1.1x".into(),
        runs,
    });
    // Loops over 1.5 and 2 times memory.
    for (name, num, den) in [("loop_1.5x", 3, 2), ("loop_2x", 2, 1)] {
        let runs = FRACTIONS
            .iter()
            .map(|&f| {
                let cap = (20_000.0 * f) as usize;
                let pages = cap * num / den;
                (cap, f, std::rc::Rc::new(workload::looping(pages, rounds)))
            })
            .collect();
        out.push(Workload {
            name: name.into(),
            runs,
        });
    }
    // Hot sets that move: Zipf over set A, then a disjoint set B of the same size, then A
    // again, 5 requests per page of a set in each phase; capacities 20-80% of one set.
    let sets: &[usize] = if quick { &[5_000] } else { &[5_000, 20_000] };
    for &set in sets {
        for (alpha, seed) in [(0.9, 11), (1.0, 12), (1.1, 13)] {
            let trace = workload::moving_hot_set(set, alpha, 5 * set, 3, seed + set as u64);
            out.push(by_set_fraction(
                format!("moved_z{alpha:.1}_{}k", set / 1000),
                set,
                trace,
            ));
        }
    }
    // A working set with periodic full scans: Zipf(0.9) over 10,000 pages and, after every
    // 40,000 of its requests, one pass over the same 10,000 or 30,000 other pages; capacities
    // 20-80% of the working set.
    let len = if quick { 200_000 } else { 800_000 };
    for (scan, seed) in [(10_000, 21), (30_000, 22)] {
        let trace = workload::zipf_with_periodic_scan(10_000, 0.9, scan, 40_000, len, seed);
        out.push(by_set_fraction(
            format!("wss_scan_{}k", scan / 1000),
            10_000,
            trace,
        ));
    }
    Ok(out)
}

/// Capacities of 20, 40, 60 and 80% of `set` pages (a hot set or working set).
fn by_set_fraction(name: String, set: usize, trace: Vec<PageId>) -> Workload {
    let trace = std::rc::Rc::new(trace);
    let runs = SET_FRACTIONS
        .iter()
        .map(|&f| (((set as f64 * f) as usize).max(1), f, trace.clone()))
        .collect();
    Workload { name, runs }
}

fn by_fraction(name: String, trace: Vec<PageId>) -> Workload {
    let d = distinct(&trace);
    let trace = std::rc::Rc::new(trace);
    let runs = FRACTIONS
        .iter()
        .map(|&f| (((d as f64 * f) as usize).max(1), f, trace.clone()))
        .collect();
    Workload { name, runs }
}

const PY_SCRIPT: &str = r#"
import json, sys
try:
    import libcachesim as lcs
except Exception as e:
    print(json.dumps({"error": "libcachesim is not installed: %s (pip install libcachesim)" % e}))
    sys.exit(0)
jobs = json.load(sys.stdin)
out = {"version": getattr(lcs, "__version__", "unknown"), "results": {}}
makers = {
    "ARC": lambda n: lcs.ARC(cache_size=n, hashpower=20),
    "LIRS": lambda n: lcs.LIRS(cache_size=n, hashpower=20),
    "S3-FIFO": lambda n: lcs.S3FIFO(cache_size=n, hashpower=20),
}
for job in jobs:
    res = out["results"].setdefault(job["name"], {})
    for run in job["runs"]:
        cap = run["capacity"]
        cell = res.setdefault(str(cap), {})
        for pol, make in makers.items():
            reader = lcs.TraceReader(run["path"], trace_type=lcs.TraceType.PLAIN_TXT_TRACE)
            cache = make(cap)
            miss_ratio, _ = cache.process_trace(reader)
            cell[pol] = miss_ratio
print(json.dumps(out))
"#;

/// libCacheSim's miss ratios: trace, capacity, policy.
type PyResults = BTreeMap<String, BTreeMap<String, Map<String, Value>>>;

/// Runs libCacheSim on every workload; `Err` carries the reason it could not.
fn libcachesim(wls: &[Workload], tmp: &Path) -> Result<(String, PyResults), String> {
    let mut jobs = Vec::new();
    for (wi, w) in wls.iter().enumerate() {
        let mut runs = Vec::new();
        let mut written: Vec<(*const Vec<PageId>, PathBuf)> = Vec::new();
        for (ri, (cap, _, trace)) in w.runs.iter().enumerate() {
            let key = std::rc::Rc::as_ptr(trace);
            let path = match written.iter().find(|(k, _)| *k == key) {
                Some((_, p)) => p.clone(),
                None => {
                    let p = tmp.join(format!("w{wi}_{ri}.txt"));
                    let mut f = std::io::BufWriter::new(
                        std::fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?,
                    );
                    for id in trace.iter() {
                        writeln!(f, "{id}").map_err(|e| e.to_string())?;
                    }
                    f.flush().map_err(|e| e.to_string())?;
                    written.push((key, p.clone()));
                    p
                }
            };
            runs.push(json!({"capacity": cap, "path": path.to_string_lossy()}));
        }
        jobs.push(json!({"name": w.name, "runs": runs}));
    }
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(PY_SCRIPT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    {
        let mut stdin = child.stdin.take().ok_or("no stdin for python3")?;
        stdin
            .write_all(Value::Array(jobs).to_string().as_bytes())
            .map_err(|e| format!("writing to python3: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "python3 failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("python3 output is not JSON: {e}"))?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return Err(e.to_string());
    }
    let version = v["version"].as_str().unwrap_or("unknown").to_string();
    let results: PyResults =
        serde_json::from_value(v["results"].clone()).map_err(|e| e.to_string())?;
    Ok((version, results))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// Accessed bits laid out like a page table: one entry per page id, and a range walk reads
/// every entry in the range, young or not, as the kernel's walk reads every PTE of a PMD.
/// ([`AccessBits`], used by the replays, only visits set bits, so its cost follows the young
/// pages rather than the pages scanned.)
#[derive(Debug)]
struct PteTable {
    young: Vec<bool>,
}

impl mglru::AccessSource for PteTable {
    fn test_and_clear_young(
        &mut self,
        range: std::ops::Range<PageId>,
        young: &mut dyn FnMut(PageId),
    ) {
        let end = (range.end as usize).min(self.young.len());
        let start = (range.start as usize).min(end);
        for (i, y) in self.young[start..end].iter_mut().enumerate() {
            if std::mem::take(y) {
                young((start + i) as PageId);
            }
        }
    }

    fn test_and_clear_page(&mut self, page: PageId) -> bool {
        self.young
            .get_mut(page as usize)
            .is_some_and(std::mem::take)
    }
}

/// The aging walk alone: 128 regions of 512 pages, 8 of them dense, over a [`PteTable`]; the
/// two configurations (`[bloom, no_bloom]`) walk in turn, so load on the machine hits both.
fn aging_cost(walks: usize) -> anyhow::Result<[Value; 2]> {
    let regions = 128u64;
    let dense = 8u64;
    let touch = |bits: &mut PteTable, round: u64| {
        for r in 0..regions {
            if r % (regions / dense) == 0 {
                for p in 0..512 {
                    bits.young[(r * 512 + p) as usize] = true;
                }
            } else {
                bits.young[(r * 512 + (round * 37) % 512) as usize] = true;
            }
        }
    };
    let mut sides = Vec::new();
    for bloom in [true, false] {
        let mut lru = Mglru::new(Config {
            bloom_filter: bloom,
            ..Config::default()
        })?;
        let mut bits = PteTable {
            young: vec![false; (regions * 512) as usize],
        };
        for p in 0..regions * 512 {
            lru.add(p, Hint::fault(PageType::Anon))?;
        }
        // The first walk has no filter yet: not measured.
        touch(&mut bits, 0);
        lru.age(&mut bits);
        sides.push((lru, bits, [vec![], vec![], vec![], vec![], vec![], vec![]]));
    }
    for round in 1..=walks as u64 {
        for (lru, bits, m) in sides.iter_mut() {
            touch(bits, round);
            let t = Instant::now();
            let w = lru.age(bits);
            m[0].push(t.elapsed().as_nanos() as f64);
            let ns = w.nanos as f64;
            m[1].push(ns);
            m[2].push(ns / w.pages_scanned.max(1) as f64);
            m[3].push(w.pages_scanned as f64);
            m[4].push(w.regions_scanned as f64);
            m[5].push(w.regions_skipped as f64);
        }
    }
    let mut out = sides.into_iter().map(|(_, _, m)| {
        let [age, walk, page, pages, scanned, skipped] = m;
        json!({
            "pages_scanned": median(pages),
            "regions_scanned": median(scanned),
            "regions_skipped": median(skipped),
            "ns_per_page": median(page),
            "ns_per_walk": median(walk),
            "ns_per_age": median(age),
        })
    });
    let bloom = out.next().unwrap_or_default();
    let no_bloom = out.next().unwrap_or_default();
    Ok([bloom, no_bloom])
}

fn pct(x: f64) -> String {
    format!("{:.2}", x * 100.0)
}

/// Runs this section.
pub fn run(opts: &Options) -> anyhow::Result<Report> {
    let mut notes = Vec::new();
    let wls = workloads(opts.quick, &mut notes)?;

    // Our policies.
    let mut miss: BTreeMap<String, BTreeMap<usize, Map<String, Value>>> = BTreeMap::new();
    let mut fraction: Map<String, Value> = Map::new();
    for w in &wls {
        let mut fr = Map::new();
        for (cap, f, trace) in &w.runs {
            fr.insert(cap.to_string(), json!(f));
            let cell = miss
                .entry(w.name.clone())
                .or_default()
                .entry(*cap)
                .or_default();
            for name in RUST_POLICIES {
                let mut p = make(name)?;
                let r = replay(p.as_mut(), *cap, trace)?;
                cell.insert(name.to_string(), json!(r.miss_ratio()));
            }
        }
        fraction.insert(w.name.clone(), Value::Object(fr));
    }

    // libCacheSim.
    let tmp = std::env::temp_dir().join(format!("mglru-report-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let lcs = libcachesim(&wls, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    let lcs_info = match &lcs {
        Ok((version, results)) => {
            for (name, caps) in results {
                for (cap, cell) in caps {
                    let Ok(cap) = cap.parse::<usize>() else {
                        continue;
                    };
                    if let Some(mine) = miss.get_mut(name).and_then(|m| m.get_mut(&cap)) {
                        for (k, v) in cell {
                            mine.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            json!({"version": version})
        }
        Err(e) => {
            notes.push(format!("libCacheSim not run: {e}"));
            json!({"error": e})
        }
    };

    // Goals.
    let get = |cell: &Map<String, Value>, k: &str| cell.get(k).and_then(Value::as_f64);
    let mut goals = Map::new();
    for pol in [
        "mglru",
        "mglru-noidle",
        "mglru-noloop",
        "mglru-nofeedback",
        "mglru-noclock",
        "mglru-v6.1",
    ] {
        let mut worst = (f64::NEG_INFINITY, String::new());
        let mut beats_ai = true;
        let mut beats_ai_detail = Map::new();
        let mut gaps = Map::new();
        for (name, caps) in &miss {
            let mut g = Map::new();
            for (cap, cell) in caps {
                let (Some(m), Some(l)) = (get(cell, pol), get(cell, "lru")) else {
                    continue;
                };
                let excess = (m - l) * 100.0;
                if excess > worst.0 {
                    worst = (excess, format!("{name} @ {cap}"));
                }
                if SCAN_TRACES.contains(&name.as_str()) {
                    let ai = get(cell, "active-inactive").unwrap_or(f64::NAN);
                    let ok = m < ai;
                    beats_ai &= ok;
                    beats_ai_detail.insert(format!("{name} @ {cap}"), json!((m - ai) * 100.0));
                }
                let best = PY_POLICIES
                    .iter()
                    .filter_map(|k| get(cell, k))
                    .fold(f64::INFINITY, f64::min);
                if best.is_finite() {
                    g.insert(cap.to_string(), json!((m - best) * 100.0));
                }
            }
            gaps.insert(name.clone(), Value::Object(g));
        }
        goals.insert(
            pol.to_string(),
            json!({
                "max_excess_over_lru_points": worst.0,
                "max_excess_over_lru_at": worst.1,
                "never_worse_than_lru_by_more_than_half_a_point": worst.0 <= 0.5,
                "beats_active_inactive_on_scans": beats_ai,
                "minus_active_inactive_points_on_scans": beats_ai_detail,
                "gap_to_best_points": gaps,
            }),
        );
    }

    // Aging cost.
    let walks = if opts.quick { 9 } else { 31 };
    let [bloom, no_bloom] = aging_cost(walks)?;
    let ratio =
        |k: &str| no_bloom[k].as_f64().unwrap_or(f64::NAN) / bloom[k].as_f64().unwrap_or(f64::NAN);
    let aging = json!({
        "bloom": bloom,
        "no_bloom": no_bloom,
        "pages_ratio": ratio("pages_scanned"),
        "time_ratio": ratio("ns_per_walk"),
    });

    // Cost per replayed request, the eviction clock against the default without it.
    let mut request_cost = Map::new();
    let runs = if opts.quick { 3 } else { 5 };
    for (name, frac) in [
        ("moved_z1.0_20k", 0.4),
        ("moved_z1.0_5k", 0.4),
        ("zipf_scan_1to1", 0.10),
        ("cloudphysics", 0.10),
    ] {
        let Some(w) = wls.iter().find(|w| w.name == name) else {
            continue;
        };
        let Some((cap, _, trace)) = w.runs.iter().find(|r| (r.1 - frac).abs() < 1e-9) else {
            continue;
        };
        let [clock, before] = replay_cost(*cap, trace, runs)?;
        let j = |c: (f64, f64, f64)| json!({"median": c.0, "min": c.1, "max": c.2});
        request_cost.insert(
            format!("{name} @ {cap}"),
            json!({"mglru": j(clock), "mglru-noclock": j(before), "runs": runs}),
        );
    }

    // Walk cost inside replays, at 10% capacity.
    let mut walk_cost = Map::new();
    for w in &wls {
        // 10% of the distinct pages, or 40% of the set for the moved and periodic-scan traces.
        let Some((cap, _, trace)) = w
            .runs
            .iter()
            .find(|r| (r.1 - 0.10).abs() < 1e-9 || (r.1 - 0.4).abs() < 1e-9)
        else {
            continue;
        };
        let mut m = Map::new();
        for (label, cfg) in [
            ("bloom", Config::default()),
            ("noclock", no_clock()),
            (
                "no_bloom",
                Config {
                    bloom_filter: false,
                    ..Config::default()
                },
            ),
            ("v6.1", Config::v6_1()),
        ] {
            let mut lru = Mglru::new(cfg)?;
            let mut bits = AccessBits::new();
            let r = replay_with(&mut lru, *cap, trace, &mut bits)?;
            let s = lru.stats();
            m.insert(
                label.to_string(),
                json!({
                    "walk_pages_per_request": s.walk_totals.pages_scanned as f64 / r.requests.max(1) as f64,
                    "walks": s.walks,
                    "regions_skipped": s.walk_totals.regions_skipped,
                    "miss_ratio": r.miss_ratio(),
                }),
            );
        }
        walk_cost.insert(w.name.clone(), Value::Object(m));
    }

    // JSON and table.
    let miss_json: Map<String, Value> = miss
        .iter()
        .map(|(name, caps)| {
            let c: Map<String, Value> = caps
                .iter()
                .map(|(cap, cell)| (cap.to_string(), Value::Object(cell.clone())))
                .collect();
            (name.clone(), Value::Object(c))
        })
        .collect();
    let json = json!({
        "miss_ratio": miss_json,
        "capacity_fraction": fraction,
        "libcachesim": lcs_info,
        "goals": goals,
        "aging": aging,
        "walk_pages_per_request": walk_cost,
        "ns_per_request": request_cost,
        "notes": notes,
    });

    let mut table = String::new();
    let cols: Vec<&str> = RUST_POLICIES
        .iter()
        .chain(PY_POLICIES.iter())
        .copied()
        .collect();
    table += &format!(
        "miss ratio (%), every request counted\n{:<16} {:>6} {:>5}",
        "trace", "cap", "frac"
    );
    for c in &cols {
        table += &format!(" {c:>8}");
    }
    table += "\n";
    for (name, caps) in &miss {
        for (cap, cell) in caps {
            let f = fraction[name][cap.to_string()].as_f64().unwrap_or(f64::NAN);
            table += &format!("{name:<16} {cap:>6} {:>4}%", (f * 100.0).round());
            for c in &cols {
                table += &match get(cell, c) {
                    Some(v) => format!(" {:>8}", pct(v)),
                    None => format!(" {:>8}", "-"),
                };
            }
            table += "\n";
        }
    }
    for pol in [
        "mglru",
        "mglru-noidle",
        "mglru-noloop",
        "mglru-nofeedback",
        "mglru-noclock",
        "mglru-v6.1",
    ] {
        let g = &goals[pol];
        table += &format!(
            "{pol}: worst excess over LRU {:.2} points at {} (goal <= 0.5); beats active-inactive on all scan mixes: {}\n",
            g["max_excess_over_lru_points"].as_f64().unwrap_or(f64::NAN),
            g["max_excess_over_lru_at"].as_str().unwrap_or(""),
            g["beats_active_inactive_on_scans"],
        );
    }
    table += &format!(
        "aging walk (128 regions x 512 pages, 8 dense): bloom {} pages {:.1} ns/page {:.0} us/walk; no bloom {} pages {:.1} ns/page {:.0} us/walk\n",
        aging["bloom"]["pages_scanned"],
        aging["bloom"]["ns_per_page"].as_f64().unwrap_or(f64::NAN),
        aging["bloom"]["ns_per_walk"].as_f64().unwrap_or(f64::NAN) / 1e3,
        aging["no_bloom"]["pages_scanned"],
        aging["no_bloom"]["ns_per_page"].as_f64().unwrap_or(f64::NAN),
        aging["no_bloom"]["ns_per_walk"].as_f64().unwrap_or(f64::NAN) / 1e3,
    );
    for (k, v) in &request_cost {
        table += &format!(
            "ns per request, {k}: mglru {:.0} [{:.0}, {:.0}], mglru-noclock {:.0} [{:.0}, {:.0}] (median [min, max] of {} alternated runs)\n",
            v["mglru"]["median"].as_f64().unwrap_or(f64::NAN),
            v["mglru"]["min"].as_f64().unwrap_or(f64::NAN),
            v["mglru"]["max"].as_f64().unwrap_or(f64::NAN),
            v["mglru-noclock"]["median"].as_f64().unwrap_or(f64::NAN),
            v["mglru-noclock"]["min"].as_f64().unwrap_or(f64::NAN),
            v["mglru-noclock"]["max"].as_f64().unwrap_or(f64::NAN),
            v["runs"],
        );
    }
    for n in json["notes"].as_array().into_iter().flatten() {
        table += &format!("note: {}\n", n.as_str().unwrap_or(""));
    }
    Ok(Report { json, table })
}
