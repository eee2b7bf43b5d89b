//! `--limit auto` (`src/limit.rs`): the controller takes what a program does not use and
//! leaves what it does, reading the tree's memory stall. The programs (`tests/clients/
//! workingset.c`) check every page they touch and every page at the end. The figures asserted
//! are the controller's own readings (limit, resident pages, stall), not timings; the
//! interval is 100 ms so that a run of seconds holds many of them.
//!
//! These need `/dev/userfaultfd` or root. CI has both; the tests skip with a printed reason
//! only where neither exists.

mod common;
use common::*;

/// The controller's history: (seconds, limit pages, resident pages, stall %).
fn history(run: &Run) -> Vec<(f64, u64, u64, f64)> {
    run.stats["limit_history"]
        .as_array()
        .expect("limit_history")
        .iter()
        .map(|s| {
            (
                s[0].as_f64().unwrap(),
                s[1].as_u64().unwrap(),
                s[2].as_u64().unwrap(),
                s[3].as_f64().unwrap(),
            )
        })
        .collect()
}

fn auto_run(name: &str, program: &[&str]) -> Run {
    let cfg = std::env::temp_dir().join(format!("uffd-autolimit-{}.toml", std::process::id()));
    std::fs::write(&cfg, "[limit]\nauto = true\ninterval_ms = 100\n").unwrap();
    let run = run_with(&["--config", cfg.to_str().unwrap()], name, program);
    let _ = std::fs::remove_file(&cfg);
    assert_eq!(run.status, 0, "the program found bad pages: {}", run.stdout);
    assert!(run.stdout.contains(", 0 bad pages"), "{}", run.stdout);
    assert!(run.stats["limit_auto"].as_bool() == Some(true));
    run
}

/// 256 MiB written once, then 32 MiB of it used: the controller takes the limit below what
/// was filled and some of the rest leaves, and what the program uses stays. How much leaves in
/// a run of seconds varies with the machine: 30-54% of it after 12 s on a machine at load 5-8,
/// 30-37% after 20 s at load 9-12 (2026-11-27): the access source sees no use of resident
/// pages (`faults`), so probes also take hot pages, stall, and pause; 12% left in a run at
/// load 12. The assertion is the direction (the limit goes below what was filled, every page
/// is right, the hot set stays), not the amount, which is measured, not asserted.
#[test]
fn auto_limit_gives_up_cold_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let client = c_client("workingset");
    let run = auto_run(
        "autolimit-shrink",
        &[client.to_str().unwrap(), "shrink", "256", "32", "20"],
    );
    let h = history(&run);
    assert!(h.len() > 50, "few readings: {}", h.len());
    let all = 256 << 8;
    let end: Vec<_> = h
        .iter()
        .filter(|s| s.0 > h.last().unwrap().0 - 2.0)
        .collect();
    let resident = end.iter().map(|s| s.2).max().unwrap();
    eprintln!(
        "shrink: resident at the end {resident} pages of {all}; limit changes {}; stall {:.3} s",
        run.get("limit_changes"),
        run.stats["memory_stall_some_s"]
    );
    let lowest = h.iter().map(|s| s.1).min().unwrap();
    assert!(
        lowest < all,
        "the limit never went below what was filled: {lowest}"
    );
    // Not below the hot set for long: at most a probe's worth under it.
    assert!(
        resident >= (32 << 8) * 9 / 10,
        "the hot set was squeezed: {resident}"
    );
    assert!(run.get("evicted_pages") > all / 2);
}

/// 64 MiB swept over and over: all of it is the working set, and it keeps its memory (the
/// median of the readings after the first seconds is at least 95% resident).
#[test]
fn auto_limit_leaves_a_hot_program_alone() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let client = c_client("workingset");
    let run = auto_run(
        "autolimit-hot",
        &[client.to_str().unwrap(), "hot", "64", "8"],
    );
    let h = history(&run);
    let mut later: Vec<u64> = h.iter().filter(|s| s.0 > 2.0).map(|s| s.2).collect();
    later.sort_unstable();
    let median = later[later.len() / 2];
    let stall: f64 = h.iter().filter(|s| s.0 > 2.0).map(|s| s.3).sum::<f64>() / later.len() as f64;
    eprintln!("hot: median resident {median} pages of 16384, mean stall {stall:.2}%");
    assert!(
        median >= 16384 * 95 / 100,
        "squeezed: median {median} pages resident"
    );
}

/// What `--limit auto` refuses, by name.
#[test]
fn auto_limit_settings_are_checked() {
    for (args, says) in [
        (
            &["--limit", "auto", "--stall-target", "0"][..],
            "stall-target",
        ),
        (
            &["--limit", "64M", "--stall-target", "1"][..],
            "need --limit auto",
        ),
        (&["--limit", "automatic"][..], "auto:CEILING"),
    ] {
        let out = std::process::Command::new(DAEMON)
            .arg("run")
            .args(args)
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = std::process::Command::new(DAEMON)
        .args([
            "run",
            "--limit",
            "auto:512M",
            "--limit-floor",
            "1G",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("limit floor (1024 MiB) is above its ceiling (512 MiB)"),
        "{err}"
    );
}
