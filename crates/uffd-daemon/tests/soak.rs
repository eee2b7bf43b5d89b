//! A soak: a bystander that keeps a model of its memory (16 threads writing and checking
//! stamped pages at four times the limit, MADV_DONTNEED, mremap, forks that check what they
//! inherited) runs for a bounded time under the daemon, while a hostile process of the same
//! tree attacks the daemon's agent socket the whole time (`tests/clients/soak.c` says how).
//! Nothing the hostile process sends may change a byte of the bystander, stop it from being
//! paged, or hang anything; every attack must be refused.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

mod common;
use common::*;

/// The limit, and the bystander's memory: four times as much.
const LIMIT: &str = "64M";
const LIMIT_BYTES: u64 = 64 << 20;
const MIB: &str = "256";
const THREADS: &str = "16";
/// How long the threads run (then every page is checked, which takes a few more seconds).
const SECONDS: &str = "40";
/// Only a guard against a hang: a run takes about 45 s on two busy CPUs.
const DEADLINE: Duration = Duration::from_secs(120);

/// The `key=value` counts of the line of the client's output that starts with `prefix`.
fn counts(run: &Run, prefix: &str) -> BTreeMap<String, i64> {
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| {
            panic!(
                "no `{prefix}` line in the client's output: it ended with status {} before \
                 its report (its output and the daemon's are above)",
                run.status
            )
        });
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

fn soak(name: &str, extra: &[&str]) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("soak").to_string_lossy().into_owned();
    let mut args = vec!["--limit", LIMIT];
    args.extend_from_slice(extra);
    let started = Instant::now();
    let run = run_with_deadline(&args, name, &[&exe, MIB, THREADS, SECONDS], DEADLINE);
    let took = started.elapsed();
    assert!(
        !run.timed_out,
        "{name}: the run hung and was killed after {DEADLINE:?}; its threads waited in: {}",
        run.hung_in
    );
    let soak = counts(&run, "soak:");
    let hostile = counts(&run, "hostile:");
    let get = |m: &BTreeMap<String, i64>, k: &str| {
        *m.get(k)
            .unwrap_or_else(|| panic!("{name}: no {k}= in the client's output"))
    };
    eprintln!(
        "{name}: {} pages, {} page checks by the threads, {} by {} children, {} mismatches; \
         {} writes, {} MADV_DONTNEEDs, {} mremaps; {} attacks ({} refused); \
         protocol_errors {}, evicted_pages {}, swapins {}, resident_pages_max {}; {:.1} s",
        get(&soak, "pages"),
        get(&soak, "checks"),
        get(&soak, "child_pages_checked"),
        get(&soak, "children"),
        get(&soak, "mismatches"),
        get(&soak, "writes"),
        get(&soak, "dontneeds"),
        get(&soak, "mremaps"),
        get(&hostile, "attacks"),
        get(&hostile, "refused"),
        run.get("protocol_errors"),
        run.get("evicted_pages"),
        run.get("swapins"),
        run.get("resident_pages_max"),
        took.as_secs_f64()
    );

    // The bystander's data: every check, by name.
    let bad: Vec<String> = ["read", "dontneed", "mremap", "final", "inherited", "own"]
        .iter()
        .map(|c| (c, get(&soak, &format!("bad_{c}"))))
        .filter(|&(_, n)| n > 0)
        .map(|(c, n)| format!("{n} pages wrong at the {c} check"))
        .collect();
    let first: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("MISMATCH"))
        .take(5)
        .collect();
    assert!(
        bad.is_empty() && get(&soak, "mismatches") == 0,
        "{name}: the bystander read wrong data: {}; the first:\n{}",
        bad.join(", "),
        first.join("\n")
    );
    assert_eq!(
        get(&soak, "children_failed"),
        0,
        "{name}: a fork child crashed or could not report"
    );
    assert_eq!(
        get(&hostile, "accepted"),
        0,
        "{name}: the daemon accepted a hostile greeting (its stderr says which)"
    );
    assert_eq!(
        get(&soak, "hostile_status"),
        0,
        "{name}: the hostile process failed"
    );
    assert_eq!(run.status, 0, "{name}: the bystander exited with an error");

    // The attacks happened, every kind of them, and the daemon refused each with an ERROR.
    for kind in [
        "garbage",
        "truncated",
        "length",
        "oversized",
        "other_pid",
        "pipe",
        "devnull",
        "no_fd",
        "many_fds",
        "forged",
        "need_uffd",
        "lent_device",
        "silent_batches",
    ] {
        assert!(get(&hostile, kind) > 0, "{name}: no {kind} attack was made");
    }
    assert_eq!(
        get(&hostile, "refused"),
        get(&hostile, "attacks"),
        "{name}: not every attack was refused with an ERROR: {} closed without one, {} left \
         unanswered for 20 s",
        get(&hostile, "closed"),
        get(&hostile, "unanswered")
    );
    assert!(
        run.get("protocol_errors") > 0,
        "{name}: the daemon counted no protocol error"
    );

    // The bystander was really paged, and did what it was meant to.
    assert!(
        get(&soak, "checks") > get(&soak, "pages") * 2 && get(&soak, "children") >= 2,
        "{name}: too little work to mean anything"
    );
    assert!(run.get("swapins") > 0, "{name}: nothing was read back");
    assert!(
        run.get("remap_events") > 0 && run.get("remove_events") > 0 && run.get("fork_events") > 0,
        "{name}: the daemon saw no mremap, MADV_DONTNEED or fork"
    );
    // A fork counts the parent's resident pages again in the child until they are evicted
    // (ARCHITECTURE.md, accounting): twice the limit, at most.
    assert_paged(&run, 2 * LIMIT_BYTES);
}

#[test]
fn soak_with_zswap_under_attack() {
    soak("soak-zswap", &[]);
}

#[test]
fn soak_without_zswap_under_attack() {
    soak("soak-no-zswap", &["--zswap", "off"]);
}
