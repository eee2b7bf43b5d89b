//! Medians over repeats, the table, the JSON document, the plots and the doc section.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::hist::median;
use super::run::RunResult;
use super::setup::Setup;
use super::svg::{self, Group, Panel};
use super::{Plan, Workload};

/// One (workload, setup) cell: medians over its repeats.
#[derive(Debug, Clone)]
pub struct Row {
    pub workload: Workload,
    pub setup: Setup,
    /// `ok`, `unavailable`, or the worst status with the count, e.g. `FAILED 1/3`.
    pub status: String,
    /// Data check over all repeats.
    pub check: String,
    /// Why it failed or is unavailable.
    pub reason: Option<String>,
    /// Median of each metric over the repeats that produced it.
    pub metrics: BTreeMap<String, f64>,
    /// Smallest value of each metric over the same repeats.
    pub mins: BTreeMap<String, f64>,
    /// Largest value of each metric over the same repeats.
    pub maxs: BTreeMap<String, f64>,
    /// Repeats that ran.
    pub runs: usize,
}

/// A one-line summary printed as each run finishes.
pub fn one_line(r: &RunResult, w: Workload) -> String {
    let g = |k: &str| r.metrics.get(k).map_or("-".to_string(), |v| num(*v));
    let mut s = format!(
        "{} check {}: {} {}",
        r.status,
        r.check,
        g("throughput"),
        w.unit()
    );
    let _ = write!(
        s,
        ", elapsed {} s, cpu {} s",
        g("elapsed_s"),
        g("cpu_total_s")
    );
    if r.metrics.contains_key("fault_p50_us") {
        let _ = write!(
            s,
            ", p50 {} us p99 {} us",
            g("fault_p50_us"),
            g("fault_p99_us")
        );
    }
    if let Some(why) = &r.reason {
        let _ = write!(s, "\n    reason: {why}");
    }
    s
}

/// Groups results by cell and takes medians.
pub fn aggregate(results: &[RunResult], workloads: &[Workload], setups: &[Setup]) -> Vec<Row> {
    let mut rows = Vec::new();
    for &w in workloads {
        for &s in setups {
            let rs: Vec<&RunResult> = results
                .iter()
                .filter(|r| r.workload == w.name() && r.setup == s.name())
                .collect();
            if rs.is_empty() {
                continue;
            }
            let ok: Vec<&&RunResult> = rs.iter().filter(|r| r.status == "ok").collect();
            let status = if rs.iter().all(|r| r.status == "unavailable") {
                "unavailable".to_string()
            } else if ok.len() == rs.len() {
                "ok".to_string()
            } else {
                let worst = rs
                    .iter()
                    .find(|r| r.status != "ok")
                    .map_or("?", |r| r.status.as_str());
                format!("{worst} {}/{}", rs.len() - ok.len(), rs.len())
            };
            let check = rs
                .iter()
                .find(|r| r.check != "ok")
                .map_or("ok".to_string(), |r| r.check.clone());
            let reason = rs.iter().find_map(|r| r.reason.clone());
            // Medians over the successful repeats; a failed cell still shows what it measured.
            let src: Vec<&RunResult> = if ok.is_empty() {
                rs.clone()
            } else {
                ok.iter().map(|r| **r).collect()
            };
            let mut keys: Vec<&String> = src.iter().flat_map(|r| r.metrics.keys()).collect();
            keys.sort();
            keys.dedup();
            let (mut metrics, mut mins, mut maxs) =
                (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
            for k in keys {
                let v: Vec<f64> = src
                    .iter()
                    .filter_map(|r| r.metrics.get(k).copied())
                    .collect();
                if let Some(m) = median(&v) {
                    metrics.insert(k.clone(), m);
                    mins.insert(k.clone(), v.iter().copied().fold(f64::INFINITY, f64::min));
                    maxs.insert(
                        k.clone(),
                        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    );
                }
            }
            rows.push(Row {
                workload: w,
                setup: s,
                status,
                check,
                reason,
                metrics,
                mins,
                maxs,
                runs: rs.len(),
            });
        }
    }
    rows
}

/// A number in a table cell.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v.abs() >= 1000.0 || (v.fract() == 0.0 && v.abs() < 1e15) {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

const COLUMNS: [&str; 15] = [
    "workload",
    "setup",
    "status",
    "throughput",
    "elapsed s",
    "user s",
    "sys s",
    "daemon cpu s",
    "cpu sum s",
    "majflt",
    "swapins",
    "dev write MiB",
    "p50 us",
    "p99 us",
    "check",
];

fn cells(r: &Row) -> Vec<String> {
    let g = |k: &str| r.metrics.get(k).map_or("-".to_string(), |v| num(*v));
    let mut thr = g("throughput");
    if thr != "-" {
        thr = format!("{thr} {}", r.workload.unit());
    }
    let mut check = r.check.clone();
    if r.workload == Workload::StressNg && r.status != "unavailable" {
        let oom = r.metrics.get("oom_restarts").copied().unwrap_or(0.0);
        let _ = write!(check, ", {} OOM-killed", num(oom).trim_end_matches(".00"));
        if let Some(k) = r.metrics.get("oom_kill_cgroup") {
            let _ = write!(
                check,
                " (memcg oom_kill {})",
                num(*k).trim_end_matches(".00")
            );
        }
    }
    if check.len() > 90 {
        check.truncate(90);
        check.push('…');
    }
    vec![
        r.workload.name().into(),
        r.setup.name().into(),
        r.status.clone(),
        thr,
        g("elapsed_s"),
        g("user_s"),
        g("sys_s"),
        g("daemon_cpu_s"),
        g("cpu_total_s"),
        g("majflt"),
        g("swapins"),
        g("dev_write_mib"),
        g("fault_p50_us"),
        g("fault_p99_us"),
        check,
    ]
}

/// The table as Markdown (readable as plain text too).
pub fn table(rows: &[Row], workloads: &[Workload]) -> String {
    let body: Vec<Vec<String>> = rows.iter().map(cells).collect();
    let mut width: Vec<usize> = COLUMNS.iter().map(|c| c.chars().count()).collect();
    for r in &body {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let line = |cols: &[String]| -> String {
        let mut s = String::from("|");
        for (i, c) in cols.iter().enumerate() {
            let pad = width[i] - c.chars().count();
            if i >= 3 && i < COLUMNS.len() - 1 {
                let _ = write!(s, " {}{c} |", " ".repeat(pad));
            } else {
                let _ = write!(s, " {c}{} |", " ".repeat(pad));
            }
        }
        s
    };
    let mut out = String::new();
    out.push_str(&line(&COLUMNS.map(String::from)));
    out.push('\n');
    let sep: Vec<String> = width
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if i >= 3 && i < COLUMNS.len() - 1 {
                format!("{}:", "-".repeat(w - 1))
            } else {
                "-".repeat(*w)
            }
        })
        .collect();
    out.push_str(&line(&sep));
    out.push('\n');
    for r in &body {
        out.push_str(&line(r));
        out.push('\n');
    }
    let mut notes = Vec::new();
    for w in workloads {
        if let Some(m) = w.latency_meaning() {
            notes.push(format!("{}: p50/p99 = {m}", w.name()));
        }
    }
    for r in rows.iter().filter(|r| r.status != "ok") {
        if let Some(why) = &r.reason {
            notes.push(format!(
                "{} / {}: {} — {why}",
                r.workload.name(),
                r.setup.name(),
                r.status
            ));
        }
    }
    for n in notes {
        let _ = writeln!(out, "\n- {n}");
    }
    out
}

/// `median [min, max]` of a metric, or `-`.
fn spread(r: &Row, k: &str) -> String {
    match (r.metrics.get(k), r.mins.get(k), r.maxs.get(k)) {
        (Some(m), Some(lo), Some(hi)) if r.runs > 1 => {
            format!("{} [{}, {}]", num(*m), num(*lo), num(*hi))
        }
        (Some(m), _, _) => num(*m),
        _ => "-".into(),
    }
}

/// The spread table: per cell, the median with the min and max over the rounds of the figures
/// the comparisons turn on, the machine-independent counts, and the slowdown against `bare`
/// where the run had it.
pub fn spread_table(rows: &[Row]) -> String {
    const COLS: [&str; 13] = [
        "workload",
        "setup",
        "runs",
        "limit MiB",
        "throughput",
        "elapsed s",
        "x bare",
        "cpu sum s",
        "cpu us / swapin",
        "swapins",
        "faults",
        "pages to swap device",
        "other CPU busy s",
    ];
    let mut out = format!("| {} |\n|{}\n", COLS.join(" | "), "---|".repeat(COLS.len()));
    for r in rows.iter().filter(|r| r.status != "unavailable") {
        let bare = rows
            .iter()
            .find(|b| b.workload == r.workload && b.setup == Setup::Bare && b.status == "ok")
            .and_then(|b| b.metrics.get("elapsed_s").copied());
        let x_bare = match (bare, r.metrics.get("elapsed_s")) {
            (Some(b), Some(_)) if b > 0.0 => {
                let f = |m: &BTreeMap<String, f64>| m.get("elapsed_s").map_or(0.0, |v| v / b);
                if r.runs > 1 {
                    format!(
                        "{} [{}, {}]",
                        num(f(&r.metrics)),
                        num(f(&r.mins)),
                        num(f(&r.maxs))
                    )
                } else {
                    num(f(&r.metrics))
                }
            }
            _ => "-".into(),
        };
        // Faults the setup served: the daemon's count; the kernel's major faults otherwise.
        let faults = if r.setup.is_daemon() {
            spread(r, "d_faults")
        } else {
            spread(r, "majflt")
        };
        let mut status = r.status.clone();
        if status == "ok" {
            status.clear();
        } else {
            status = format!(" ({status})");
        }
        let cells = [
            r.workload.name().to_string(),
            format!("{}{status}", r.setup.name()),
            r.runs.to_string(),
            r.metrics
                .get("limit_mib")
                .filter(|_| r.setup != Setup::Bare)
                .map_or("-".into(), |v| num(*v)),
            spread(r, "throughput"),
            spread(r, "elapsed_s"),
            x_bare,
            spread(r, "cpu_total_s"),
            spread(r, "cpu_us_per_swapin"),
            spread(r, "swapins"),
            faults,
            spread(r, "dev_write_pages"),
            spread(r, "other_busy_s"),
        ];
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out
}

/// A table of `rows` with the columns workload, setup, runs, then one per `(heading, metric)`
/// in `cols`: the metric's median with its [min, max] over the rounds.
fn spread_columns<'a>(cols: &[(&str, &str)], rows: impl IntoIterator<Item = &'a Row>) -> String {
    let heads: Vec<&str> = ["workload", "setup", "runs"]
        .into_iter()
        .chain(cols.iter().map(|c| c.0))
        .collect();
    let mut out = format!(
        "| {} |\n|{}\n",
        heads.join(" | "),
        "---|".repeat(heads.len())
    );
    for r in rows {
        let cells: Vec<String> = [
            r.workload.name().to_string(),
            r.setup.name().to_string(),
            r.runs.to_string(),
        ]
        .into_iter()
        .chain(cols.iter().map(|c| spread(r, c.1)))
        .collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out
}

/// The daemon's readahead, machine-independent counts: pages brought back, how many came by
/// readahead, how many of those it then saw used (hits) and how many left unused (evicted,
/// removed or still unused at exit), the unused pages as a share of the pages brought back,
/// and the faults served.
pub fn readahead_table(rows: &[Row]) -> String {
    spread_columns(
        &[
            ("pages swapped in", "d_swapin_pages"),
            ("by readahead", "d_readahead_pages"),
            ("readahead hits", "d_readahead_hit_pages"),
            ("readahead unused", "d_readahead_unused_pages"),
            ("unused % of swapped in", "d_readahead_unused_pct"),
            ("faults", "d_faults"),
        ],
        rows.iter()
            .filter(|r| r.status != "unavailable" && r.setup.is_daemon()),
    )
}

/// The swap file's I/O, for setups with one: what was evicted to it, what the disk wrote
/// (its whole /proc/diskstats line: other writers count too), and the file's page cache at its
/// peak, also as a share of what was evicted to it. Empty when no row has a swap file.
pub fn file_tier_table(rows: &[Row]) -> String {
    let with: Vec<&Row> = rows
        .iter()
        .filter(|r| r.status != "unavailable" && r.metrics.contains_key("swapfile_cache_peak_mib"))
        .collect();
    if with.is_empty() {
        return String::new();
    }
    spread_columns(
        &[
            ("evicted to the swap device MiB", "dev_write_mib"),
            ("disk writes MiB", "disk_write_mib"),
            ("swap file page cache peak MiB", "swapfile_cache_peak_mib"),
            ("peak % of evicted", "swapfile_cache_peak_pct"),
        ],
        with,
    )
}

/// A second table: where the pages went and what memory the tiers took.
pub fn extra_table(rows: &[Row]) -> String {
    const COLS: [&str; 11] = [
        "workload",
        "setup",
        "fill",
        "zswpout",
        "zswpwb",
        "pswpout",
        "pool / zram peak MiB",
        "ratio",
        "daemon RSS peak MiB",
        "memcg peak MiB (kmem)",
        "OOM kills",
    ];
    let mut out = format!("| {} |\n|{}\n", COLS.join(" | "), "---|".repeat(COLS.len()));
    for r in rows.iter().filter(|r| r.status != "unavailable") {
        let g = |k: &str| r.metrics.get(k).copied();
        let f = |v: Option<f64>| v.map_or("-".to_string(), num);
        let fill = match r.workload {
            Workload::Random
            | Workload::Random2
            | Workload::Random4
            | Workload::Sequential
            | Workload::Zipf => g("fill_mib_s").map(|v| format!("{} MiB/s", num(v))),
            Workload::Redis => g("set_rps").map(|v| format!("{} SET/s", num(v))),
            Workload::Threads => g("init_s").map(|v| format!("{} s zeroing", num(v))),
            Workload::StressNg => None,
        };
        let d = r.setup.is_daemon();
        let pick = |dk: &str, kk: &str| if d { g(dk) } else { g(kk) };
        let pool = if d {
            g("d_zswap_pool_max_mib").or(g("d_zswap_pool_mib"))
        } else {
            g("zram_mem_used_peak_mib")
        };
        let ratio = if d {
            g("d_zswap_ratio_at_max")
        } else {
            g("zram_ratio_at_peak")
        }
        .filter(|v| *v > 0.0);
        let rss = g("d_daemon_rss_max_mib").or(g("d_daemon_rss_anon_max_mib"));
        let memcg = g("cg_max_usage_mib")
            .map(|u| format!("{} ({})", num(u), f(g("cg_kmem_max_usage_mib"))));
        let oom = match (g("oom_restarts"), g("oom_kill_cgroup")) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let cells = [
            r.workload.name().to_string(),
            r.setup.name().to_string(),
            fill.unwrap_or_else(|| "-".into()),
            f(pick("d_zswpout", "k_zswpout")),
            f(pick("d_zswpwb", "k_zswpwb")),
            f(pick("d_pswpout", "k_pswpout")),
            f(pool),
            f(ratio),
            f(rss),
            memcg.unwrap_or_else(|| "-".into()),
            f(oom),
        ];
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out
}

/// The invocation, as a command to paste.
pub fn command_line(args: &[String]) -> String {
    let mut s = match std::env::var("CARGO_TARGET_DIR") {
        Ok(dir) if !dir.contains(char::is_whitespace) => format!("CARGO_TARGET_DIR={dir} "),
        _ => String::new(),
    };
    s.push_str("cargo run --release -p bench --bin compare --");
    for a in args {
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"$&|;<>*?".contains(c)) {
            let _ = write!(s, " '{}'", a.replace('\'', "'\\''"));
        } else {
            let _ = write!(s, " {a}");
        }
    }
    s
}

fn plan_json(p: &Plan) -> Value {
    json!({
        "limit_bytes": p.limit, "quick": p.quick,
        "usemem_bytes": p.usemem_bytes, "usemem_seconds": p.usemem_seconds, "final_check": p.final_check,
        "stress_vm_bytes_per_worker": p.stress_bytes, "stress_seconds": p.stress_seconds,
        "redis_keys": p.redis_keys, "redis_value_bytes": p.redis_value_bytes, "redis_gets": p.redis_gets,
        "kernel_swap_bytes": p.swap_bytes, "kzswap_max_pool_percent": p.zswap_pool_percent,
        "threads_bytes": p.threads_bytes, "threads": p.threads_n, "threads_rounds": p.threads_rounds,
        "threads_bare_peak_bytes": p.threads_peak, "threads_limit_bytes": p.threads_limit,
        "run_timeout_s": p.run_timeout.as_secs(),
    })
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The whole run as one JSON document.
pub fn json(
    command: &str,
    plan: &Plan,
    rows: &[Row],
    results: &[RunResult],
    unavailable: &[(Setup, String)],
) -> Value {
    json!({
        "command": command,
        "kernel": kernel_release(),
        "daemon": plan.daemon_build,
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "plan": plan_json(plan),
        "unavailable": unavailable.iter().map(|(s, why)| json!({"setup": s.name(), "reason": why})).collect::<Vec<_>>(),
        "medians": rows.iter().map(|r| json!({
            "workload": r.workload.name(), "setup": r.setup.name(), "status": r.status,
            "check": r.check, "reason": r.reason, "runs": r.runs,
            "unit": r.workload.unit(), "metrics": r.metrics, "min": r.mins, "max": r.maxs,
        })).collect::<Vec<_>>(),
        "runs": results,
    })
}

const DAEMON_COLOR: &str = "#4e79a7";
const KERNEL_COLOR: &str = "#f28e2b";

/// The SVG of one workload: throughput, latency (where measured), CPU seconds.
pub fn plot(w: Workload, rows: &[Row], plan: &Plan) -> String {
    let rs: Vec<&Row> = rows.iter().filter(|r| r.workload == w).collect();
    let get = |r: &Row, k: &str| {
        if r.status == "unavailable" {
            None
        } else {
            r.metrics.get(k).copied()
        }
    };
    let color = |s: Setup| {
        Some(
            if s.is_daemon() {
                DAEMON_COLOR
            } else {
                KERNEL_COLOR
            }
            .to_string(),
        )
    };
    let mut panels = vec![Panel {
        title: format!(
            "throughput ({}; blue: uffd-daemon, orange: kernel)",
            w.unit()
        ),
        unit: w.unit().into(),
        series: vec![w.unit().into()],
        groups: rs
            .iter()
            .map(|r| Group {
                label: r.setup.name().into(),
                values: vec![get(r, "throughput")],
                color: color(r.setup),
            })
            .collect(),
        log: false,
    }];
    if let Some(meaning) = w.latency_meaning() {
        panels.push(Panel {
            title: format!("latency, {meaning} (log scale)"),
            unit: "us".into(),
            series: vec!["p50".into(), "p99".into()],
            groups: rs
                .iter()
                .map(|r| Group {
                    label: r.setup.name().into(),
                    values: vec![get(r, "fault_p50_us"), get(r, "fault_p99_us")],
                    color: None,
                })
                .collect(),
            log: true,
        });
    }
    panels.push(Panel {
        title: "CPU seconds: workload (user+sys) and daemon".into(),
        unit: "s".into(),
        series: vec!["workload".into(), "daemon".into()],
        groups: rs
            .iter()
            .map(|r| Group {
                label: r.setup.name().into(),
                values: vec![
                    get(r, "user_s").zip(get(r, "sys_s")).map(|(u, s)| u + s),
                    if r.setup.is_daemon() {
                        get(r, "daemon_cpu_s")
                    } else {
                        None
                    },
                ],
                color: None,
            })
            .collect(),
        log: false,
    });
    let caption = format!(
        "limit {} MiB{}; n/a = unavailable or not measured; docs/kernel-comparison.md has the table",
        plan.limit >> 20,
        if plan.quick { ", --quick" } else { "" }
    );
    svg::render(
        &format!("{}: uffd-daemon vs kernel swap", w.name()),
        &panels,
        &caption,
    )
}

const BEGIN: &str = "<!-- BEGIN GENERATED by `compare --doc`: do not edit by hand -->";
const END: &str = "<!-- END GENERATED -->";

/// Writes the generated section (between markers) of the doc, keeping the rest of the file.
pub fn write_doc(
    doc: &Path,
    out: &Path,
    command: &str,
    plan: &Plan,
    rows: &[Row],
    workloads: &[Workload],
    unavailable: &[(Setup, String)],
) -> Result<()> {
    let mut g = String::new();
    let _ = writeln!(g, "{BEGIN}\n");
    let _ = writeln!(
        g,
        "Command (run from the workspace root, as root):\n\n```\n{command}\n```\n"
    );
    let _ = writeln!(
        g,
        "Kernel {}, {} CPUs, {} GiB RAM. Limit {} MiB. usemem: {} MiB working set, {} s of touches{}; \
         stress-ng: --vm 2 --vm-bytes {}m, {} s; redis: {} keys x {} B (about {} MiB), {} GETs. \
         Kernel swap area {} MiB; kzswap max_pool_percent {}.\n",
        kernel_release(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        super::ram_bytes() >> 30,
        plan.limit >> 20,
        plan.usemem_bytes >> 20,
        plan.usemem_seconds,
        if plan.final_check { ", then every page verified once more" } else { "" },
        plan.stress_bytes >> 20,
        plan.stress_seconds,
        plan.redis_keys,
        plan.redis_value_bytes,
        (plan.redis_keys * 2700) >> 20,
        plan.redis_gets,
        plan.swap_bytes >> 20,
        plan.zswap_pool_percent,
    );
    if !plan.daemon_build.is_empty() {
        let _ = writeln!(g, "Daemon: {}.\n", plan.daemon_build);
    }
    g.push_str(&table(rows, workloads));
    g.push('\n');
    let _ = writeln!(
        g,
        "Medians with [min, max] over the rounds (setups alternate within each round), CPU per \
         page swapped in (cpu sum / swapins), the faults served (daemon: its `faults`; kernel: \
         major faults), pages written to the swap device, the slowdown against `bare` where it \
         ran, and the CPU the rest of the machine was busy with meanwhile (the noise):\n"
    );
    g.push_str(&spread_table(rows));
    g.push('\n');
    let _ = writeln!(
        g,
        "Where the pages went (pages; daemon: its counters, kernel: /proc/vmstat deltas), the \
         compressed pool's peak and the compression ratio then (daemon: zswap_pool_max_bytes, \
         zswap_ratio_at_max; kernel zram: mem_used_total, orig/compr sampled every 100 ms), the \
         daemon's own RSS peak, the memory cgroup's peak usage (kernel memory in brackets) and \
         OOM kills (stress-ng's count of workers it restarted, or the group's oom_kill):\n"
    );
    g.push_str(&extra_table(rows));
    g.push('\n');
    let files = file_tier_table(rows);
    if !files.is_empty() {
        let _ = writeln!(
            g,
            "The swap file's I/O (medians [min, max]): MiB evicted to the swap device (daemon: \
             `pswpout` x 4 KiB, else `bytes_written`; kernel: `pswpout` x 4 KiB), MiB the disk \
             holding it wrote (/proc/diskstats, the whole disk), and the file's page cache at \
             its peak (`mincore`, every 100 ms; the kernel's swap I/O bypasses the page cache), \
             also as a share of what was evicted:\n"
        );
        g.push_str(&files);
        g.push('\n');
    }
    if rows.iter().any(|r| r.setup.is_daemon()) {
        let _ = writeln!(
            g,
            "The daemon's readahead (pages; medians [min, max]): pages brought back, those read \
             ahead of a fault, those it then saw used (a later fault of the same stream past \
             them, or a write to them) and those that left with no use seen (evicted, removed, \
             or unused at exit: an upper bound on the waste), the last as a share of the pages \
             brought back:\n"
        );
        g.push_str(&readahead_table(rows));
        g.push('\n');
    }
    let setups: Vec<Setup> = {
        let mut v: Vec<Setup> = rows.iter().map(|r| r.setup).collect();
        v.dedup();
        v.sort();
        v.dedup();
        v
    };
    let _ = writeln!(g, "Setups:\n");
    for s in setups {
        let _ = writeln!(g, "- `{}`: {}", s.name(), s.describe());
    }
    if !unavailable.is_empty() {
        let _ = writeln!(g, "\nUnavailable:\n");
        for (s, why) in unavailable {
            let _ = writeln!(g, "- `{}`: {why}", s.name());
        }
    }
    let rel = doc
        .parent()
        .and_then(|d| out.strip_prefix(d).ok())
        .map_or_else(|| out.display().to_string(), |p| p.display().to_string());
    let _ = writeln!(g, "\nPlots:\n");
    for w in workloads {
        let _ = writeln!(
            g,
            "- [{0}]({1}/{0}.svg)\n\n  ![{0}]({1}/{0}.svg)\n",
            w.name(),
            rel
        );
    }
    let _ = writeln!(g, "Further figures per run (daemon counters, zswap/zram sizes, memcg OOM kills, fill rates) are in the `--json` output.\n");
    g.push_str(END);

    let old = std::fs::read_to_string(doc).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if e > b => format!("{}{g}{}", &old[..b], &old[e + END.len()..]),
        _ if old.is_empty() => format!("# uffd-daemon against the kernel's own swap\n\n{g}\n"),
        _ => format!("{old}\n{g}\n"),
    };
    std::fs::write(doc, new).with_context(|| format!("write {}", doc.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(setup: &str, status: &str, thr: f64) -> RunResult {
        RunResult {
            workload: "random".into(),
            setup: setup.into(),
            repeat: 0,
            status: status.into(),
            check: if status == "ok" {
                "ok".into()
            } else {
                "MISMATCH: x".into()
            },
            reason: None,
            metrics: [("throughput".to_string(), thr)].into_iter().collect(),
            daemon_stats: None,
            workload_report: None,
        }
    }

    #[test]
    fn medians_over_ok_repeats_and_worst_status() {
        let rs = vec![
            result("kswap", "ok", 10.0),
            result("kswap", "ok", 30.0),
            result("kswap", "ok", 20.0),
            result("file", "ok", 5.0),
            result("file", "FAILED", 1.0),
        ];
        let rows = aggregate(
            &rs,
            &[Workload::Random],
            &[Setup::DaemonFile, Setup::KernelSwap],
        );
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].setup, Setup::DaemonFile);
        assert_eq!(rows[0].status, "FAILED 1/2");
        assert_eq!(rows[0].metrics["throughput"], 5.0);
        assert!(rows[0].check.starts_with("MISMATCH"));
        assert_eq!(rows[1].metrics["throughput"], 20.0);
        let t = table(&rows, &[Workload::Random]);
        assert!(t.contains("| 20 touches/s"), "{t}");
        let svg = plot(Workload::Random, &rows, &Plan::new(256 << 20, true));
        assert!(svg.contains("kswap"));
    }

    /// The swap file's table: only rows that measured a swap file, medians with their spread
    /// over the rounds; nothing at all when no row did.
    #[test]
    fn file_tier_table_only_for_setups_with_a_swap_file() {
        let with_file = |thr: f64, peak: f64| {
            let mut r = result("file", "ok", thr);
            r.metrics.extend([
                ("dev_write_mib".to_string(), 2000.0),
                ("disk_write_mib".to_string(), 2100.0),
                ("swapfile_cache_peak_mib".to_string(), peak),
                ("swapfile_cache_peak_pct".to_string(), peak / 20.0),
            ]);
            r
        };
        let rs = vec![
            with_file(1.0, 8.0),
            with_file(2.0, 6.0),
            result("zram", "ok", 3.0),
        ];
        let rows = aggregate(
            &rs,
            &[Workload::Random],
            &[Setup::DaemonFile, Setup::KernelZram],
        );
        let t = file_tier_table(&rows);
        assert!(
            t.starts_with("| workload | setup | runs | evicted to the swap device MiB |"),
            "{t}"
        );
        assert!(t.contains("| random | file | 2 | 2000 [2000, 2000] | 2100 [2100, 2100] | 7 [6, 8] | 0.35 [0.30, 0.40] |"), "{t}");
        assert!(!t.contains("zram"), "{t}");
        let none = aggregate(&rs[2..], &[Workload::Random], &[Setup::KernelZram]);
        assert_eq!(file_tier_table(&none), "");
    }

    #[test]
    fn command_lines_quote() {
        let a = [
            "--setups".to_string(),
            "kswap,zram".to_string(),
            "a b".to_string(),
        ];
        // Prefixed with CARGO_TARGET_DIR=... when that is set.
        assert!(command_line(&a)
            .ends_with("cargo run --release -p bench --bin compare -- --setups kswap,zram 'a b'"));
    }
}
