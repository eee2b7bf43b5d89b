//! Readahead in front of access patterns that check their data (`tests/clients/readahead.c`):
//! random pages and random 8 KiB records read almost nothing ahead that goes unused, and a
//! sequential reader still reads ahead. The figures are counts, not timings: pages read ahead,
//! seen used, and left unused (evicted, removed, or unused at exit), against the pages brought
//! back (`bytes_read`).
//!
//! These need `/dev/userfaultfd` or root. CI has both; the tests skip with a printed reason
//! only where neither exists.

mod common;
use common::*;

/// 64 MiB under a 16 MiB limit: three quarters of the pages are out at any time.
const LIMIT: &str = "16M";
const MIB: &str = "64";

struct Counts {
    swapped_in: u64,
    read_ahead: u64,
    hits: u64,
    unused: u64,
}

fn run_pattern(mode: &str, touches: &str) -> Counts {
    let client = c_client("readahead");
    let client = client.to_str().expect("utf-8 path");
    let run = run_under(
        LIMIT,
        &format!("readahead-{mode}"),
        &[client, mode, MIB, touches],
    );
    assert_eq!(run.status, 0, "the {mode} client found bad pages");
    assert!(
        run.stdout.contains(", 0 bad pages"),
        "no clean summary: {}",
        run.stdout
    );
    assert_paged(&run, 16 << 20);
    assert_eq!(run.get("agent_faults"), 0);
    let c = Counts {
        swapped_in: run.get("bytes_read") / 4096,
        read_ahead: run.get("readahead_pages"),
        hits: run.get("readahead_hit_pages"),
        unused: run.get("readahead_unused_pages"),
    };
    assert!(c.swapped_in > 10_000, "{mode}: little paging happened");
    assert!(
        c.hits + c.unused <= c.read_ahead,
        "{mode}: more pages judged than read ahead"
    );
    eprintln!(
        "{mode}: {} pages swapped in, {} read ahead, {} hits, {} unused ({:.2}% of swapped in)",
        c.swapped_in,
        c.read_ahead,
        c.hits,
        c.unused,
        100.0 * c.unused as f64 / c.swapped_in as f64
    );
    c
}

/// Random pages never continue a stream; random 8 KiB records fault on two adjacent pages,
/// which a window keyed on position alone answered by reading the page after the second one
/// (24% of the pages swapped in went unused that way). Both stay under 5%, the goal of issue
/// #19 (measured: about 0.01% and 0.3%).
#[test]
fn random_access_leaves_few_pages_read_ahead_unused() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    for mode in ["random", "pairs"] {
        let c = run_pattern(mode, "30000");
        assert!(
            c.unused * 20 <= c.swapped_in,
            "{mode}: {} of {} pages swapped in were read ahead and never used",
            c.unused,
            c.swapped_in
        );
    }
}

/// A sequential reader (faulting on its own array of counters every 1024 pages, and with a
/// final check in random order) keeps reading ahead: most pages it brings back come by
/// readahead, and it uses them.
#[test]
fn sequential_access_still_reads_ahead() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let c = run_pattern("sequential", "40000");
    // About 40k of the pages are swapped in by the sequential touches, 12k by the random
    // final check (no readahead); measured 37k read ahead of 56k.
    assert!(
        c.read_ahead * 2 >= c.swapped_in,
        "only {} of {} pages swapped in came by readahead",
        c.read_ahead,
        c.swapped_in
    );
    assert!(
        c.hits * 10 >= c.read_ahead * 9,
        "only {} of {} pages read ahead were seen used",
        c.hits,
        c.read_ahead
    );
    assert!(c.unused * 20 <= c.swapped_in);
}
