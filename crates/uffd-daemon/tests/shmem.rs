//! Shared anonymous memory (`MAP_SHARED|MAP_ANONYMOUS`, shared `/dev/zero`) is paged by page
//! identity (issue #16, `src/shmem.rs`): registered in every mapper, evicted under the limit,
//! served to whichever mapper faults, no write lost while pages come and go. Memory reachable
//! through a file descriptor (memfd) stays unmanaged and counted. Every case checks the data.

use std::time::Duration;

mod common;
use common::*;

fn shmem(limit: &str, name: &str, args: &[&str]) -> Run {
    let exe = c_client("shmem");
    let exe = exe.to_string_lossy().into_owned();
    let mut argv = vec![exe.as_str()];
    argv.extend_from_slice(args);
    run_under(limit, name, &argv)
}

/// The number after `key` in `text` (`key 123`).
fn number_after(text: &str, key: &str) -> u64 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("{key:?} not in {text:?}"));
    text[at + key.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .find(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in {text:?}"))
}

/// Step 1: both kinds of shared anonymous mapping are registered missing and write-protect
/// with the daemon's uffd (smaps `um uw`); before, the scan skipped them.
#[test]
fn shared_anon_is_registered() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = shmem("64M", "shmem-flags", &["flags", "16"]);
    assert_eq!(run.status, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("flags: 0 bad bytes"), "{}", run.stdout);
    for kind in ["anon-flags:", "zero-flags:"] {
        let line = run
            .stdout
            .lines()
            .find(|l| l.starts_with(kind))
            .unwrap_or_else(|| panic!("no {kind} in {}", run.stdout));
        let flags: Vec<&str> = line[kind.len()..].split_ascii_whitespace().collect();
        assert!(
            flags.contains(&"um") && flags.contains(&"uw"),
            "{line}: not registered missing and write-protect"
        );
    }
}

/// Step 4, issue #16's case: 602 MiB of `MAP_SHARED` anonymous memory under a 128 MiB limit.
/// Before, it stayed 602 MiB resident (counted unmanaged); now the program's `RssShmem` stays
/// near the limit, every word is checked after its pages came back, nothing is counted
/// unmanaged.
#[test]
fn shared_anon_under_limit() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = shmem("128M", "shmem-limit", &["fill", "602", "1"]);
    assert_eq!(run.status, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("0 bad words"), "{}", run.stdout);
    let peak_kb = number_after(&run.stdout, "peak RssShmem");
    // (A batch's worth over the limit at most: the watermarks, and the pages of a batch in
    // flight.)
    assert!(
        peak_kb <= (128 + 16) << 10,
        "{}: resident shared memory went to {peak_kb} kB under a 128 MiB limit",
        run.stdout
    );
    assert!(run.get("shmem_evicted_pages") > (602 - 128) << 8);
    assert!(run.get("shmem_swapins") > 0);
    assert!(run.get("resident_pages_max") <= (128 + 16) << 8);
    assert_eq!(run.get("unmanaged_shared_bytes"), 0, "counted unmanaged");
    assert_eq!(run.get("shmem_filled_behind_pages"), 0);
}

/// Step 3: the parent fills more than the limit (its pages are evicted through the inode,
/// whoever wrote them), the child faults them back through its own uffd and rewrites them, the
/// parent sees the child's words and the child the parent's last ones.
#[test]
fn shared_anon_fault_served_by_identity() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = shmem("32M", "shmem-identity", &["identity", "96"]);
    assert_eq!(run.status, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("identity child: 0 bad words"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("identity parent: 0 bad words, child status 0"),
        "{}",
        run.stdout
    );
    assert!(run.get("shmem_mappers") >= 2, "the child is no mapper");
    assert!(run.get("shmem_evicted_pages") > 64 << 8);
    assert!(run.get("shmem_swapins") > 0);
    assert_eq!(run.get("shmem_filled_behind_pages"), 0);
}

/// Step 2: the daemon's descriptor of an inode keeps its memory alive (probe p4), so it is
/// closed when the last mapper exits: `Shmem` in meminfo comes back down while the daemon runs.
#[test]
fn shared_anon_fd_released() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = shmem("256M", "shmem-release", &["release", "64"]);
    assert_eq!(run.status, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("release child: 0 bad words"),
        "{}",
        run.stdout
    );
    let before = number_after(&run.stdout, "Shmem before");
    let after = number_after(&run.stdout, "after");
    // (Other processes on the machine move `Shmem` too: a quarter of the region as slack.)
    assert!(
        after < before + (16 << 10),
        "{}: the inode's 64 MiB were kept after its last mapper exited",
        run.stdout
    );
    assert!(run.get("shmem_inodes") >= 1);
    assert_eq!(run.get("shmem_inodes_released"), run.get("shmem_inodes"));
}

/// Step 5: two processes, each with more threads than the machine has CPUs, do atomic adds all
/// over a shared region twice the limit while reclaim evicts it; the words' sum is the number
/// of adds in every run. A build that write-protects through one mapper only lost 205 and 262
/// adds in two runs of this (probe p3's case C).
#[test]
fn shared_anon_hammer_loses_no_add() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = (cpus + 2).max(4).to_string();
    for round in 0..3 {
        let run = run_with_deadline(
            &["--limit", "32M"],
            &format!("shmem-hammer-{round}"),
            &[
                &c_client("shmem").to_string_lossy(),
                "hammer",
                "64",
                &threads,
                "4",
            ],
            Duration::from_secs(300),
        );
        assert_eq!(run.status, 0, "round {round}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stdout.contains(" lost 0, 0 bad words"),
            "round {round}: {}",
            run.stdout
        );
        assert!(run.get("shmem_mappers") >= 2);
        assert!(run.get("shmem_evicted_pages") > 0, "nothing evicted");
        assert_eq!(run.get("shmem_filled_behind_pages"), 0);
    }
}

/// Step 8: a memfd is reachable through its descriptor, so it is not paged: counted as
/// `shared_fd` and said, while shared anonymous memory is not counted at all.
#[test]
fn memfd_is_counted_unmanaged_and_shared_anon_is_not() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = shmem("8M", "shmem-memfd", &["memfd", "32"]);
    assert_eq!(run.status, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("memfd: 32 MiB, 0 bad words"));
    assert!(run.get("unmanaged_shared_fd_bytes") >= 30 << 20);
    assert!(run.get("unmanaged_shared_bytes") >= 30 << 20);
    assert!(run.stderr.contains("unmanaged (shared)"), "not said");
    assert_eq!(run.get("shmem_inodes"), 0, "a memfd was managed");

    let run = shmem("8M", "shmem-anon-counted", &["fill", "32", "1"]);
    assert_eq!(run.status, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.get("unmanaged_shared_bytes"), 0);
    assert_eq!(run.get("unmanaged_shared_fd_bytes"), 0);
    assert!(run.get("shmem_evicted_pages") > 0);
}

/// Step 6: `MADV_REMOVE` of shared memory whose pages were evicted: they read as zeros (the
/// agent announces the call; the stored copies are dropped). Taken as `MADV_DONTNEED`, the
/// stored copies came back instead.
#[test]
fn shared_madv_remove_reads_zeros() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = shmem("16M", "shmem-remove", &["remove", "64"]);
    assert_eq!(run.status, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("remove: 64 MiB, 0 bad words"),
        "{}",
        run.stdout
    );
    assert!(run.get("shmem_evicted_pages") > 0);
    assert!(run.get("shmem_removed_pages") > 0);
}

/// Step 6: `MADV_DONTNEED` of shared memory whose pages were evicted keeps their contents (the
/// page cache keeps them; the stored copies stay valid), unlike private memory, where a REMOVE
/// event forgets the pages.
#[test]
fn shared_madv_dontneed_keeps_data() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = shmem("16M", "shmem-dontneed", &["dontneed", "64"]);
    assert_eq!(run.status, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("dontneed: 64 MiB, 0 bad words"),
        "{}",
        run.stdout
    );
    assert!(run.get("shmem_evicted_pages") > 0);
    // (The agent announces MADV_REMOVE only: this call was told by the scan of its caller.)
    assert!(run.get("shmem_remove_scanned") > 0);
    assert_eq!(run.get("shmem_remove_unannounced"), 0);
    assert_eq!(run.get("shmem_removed_pages"), 0);
}

/// `RssShmem` printed by a `raw-*` mode before its madvise, in kB.
fn rss_before_madvise(run: &Run) -> u64 {
    number_after(&run.stdout, "RssShmem before madvise")
}

/// Issue #16's broken promise: a raw `syscall(SYS_madvise, MADV_REMOVE)` (nothing the agent's
/// wrapper sees) of evicted shared memory. The kernel punches the range: it must read zeros.
/// Before, the REMOVE event was taken as `MADV_DONTNEED` and the stored copies came back: the
/// program read its old words (every word of the quarter wrong). Now the handler reads the
/// blocked caller's `/proc/PID/task/TID/syscall` before the event (`fault/remove_scan.rs`).
#[test]
fn raw_madv_remove_of_evicted_shared_memory_reads_zeros() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = shmem("16M", "shmem-raw-remove", &["raw-remove", "64"]);
    assert!(
        run.stdout.contains("raw-remove: 64 MiB, 0 bad words"),
        "{}{}",
        run.stdout,
        run.stderr
    );
    assert_eq!(run.status, 0, "{}{}", run.stdout, run.stderr);
    // The quarter removed was evicted when the call came (64 MiB filled under 16M).
    assert!(rss_before_madvise(&run) < 32 << 10, "{}", run.stdout);
    assert!(run.get("shmem_evicted_pages") > 0);
    assert!(run.get("shmem_remove_scanned") > 0, "not told by the scan");
    assert!(run.get("shmem_removed_pages") > 0);
    assert_eq!(run.get("shmem_remove_unannounced"), 0);
}

/// The other side of the scan: a raw `MADV_DONTNEED` of evicted shared memory keeps every
/// word (a scan that took it for `MADV_REMOVE` would drop the stored copies: zeros).
#[test]
fn raw_madv_dontneed_of_evicted_shared_memory_keeps_data() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = shmem("16M", "shmem-raw-dontneed", &["raw-dontneed", "64"]);
    assert!(
        run.stdout
            .contains("raw-dontneed: 64 MiB, 0 bad words, 0 zero words"),
        "{}{}",
        run.stdout,
        run.stderr
    );
    assert_eq!(run.status, 0, "{}{}", run.stdout, run.stderr);
    assert!(rss_before_madvise(&run) < 32 << 10, "{}", run.stdout);
    assert!(run.get("shmem_evicted_pages") > 0);
    assert!(run.get("shmem_remove_scanned") > 0, "not told by the scan");
    assert_eq!(run.get("shmem_removed_pages"), 0);
}

/// Step 7: an io_uring fixed buffer in shared anonymous memory (a long-term pin), filled by
/// `READ_FIXED` round after round while other memory pages: a punch would take a pinned page
/// out of the page cache and the device's later writes would land in a page nobody sees (probe
/// p5). The process has an io_uring, so its inode is left out of eviction (counted in
/// `unmanaged_shared_pinned_bytes`); every word is right. Likewise `O_DIRECT` reads in flight.
#[test]
fn shared_anon_io_uring_fixed_buffer() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("pinned").to_string_lossy().into_owned();
    for (mode, rounds) in [("fixed-shared", "40"), ("direct-shared", "100")] {
        let argv = [exe.as_str(), mode, "8", "64", rounds];
        let run = run_with(&["--limit", "24M"], &format!("shmem-{mode}"), &argv);
        let want = format!("{mode}: {rounds} rounds, 8 MiB buffer, 0 bad words, 0 failed reads");
        assert!(
            run.stdout.contains(&want) && run.stdout.contains("other: 64 MiB, 0 bad words"),
            "writes through a pin were lost: {}{}",
            run.stdout,
            run.stderr
        );
        assert_eq!(run.status, 0);
        assert!(run.get("unmanaged_shared_pinned_bytes") > 0, "not counted");
        assert!(run.get("evicted_pages") > 0, "nothing paged");
    }
}

/// Step 2's bookkeeping: a shared mapping moved by `mremap` while its pages are evicted keeps
/// its pages (their offsets move with it), a part unmapped leaves the inode's other pages
/// alone, and a child forked after both reads the same words.
#[test]
fn shared_anon_mremap_and_unmap_keep_data() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = shmem("16M", "shmem-remap", &["remap", "64"]);
    assert_eq!(run.status, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("remap: 64 MiB, 0 bad words, child status 0"),
        "{}",
        run.stdout
    );
    assert!(run.get("remap_events") > 0);
    assert!(run.get("shmem_evicted_pages") > 0);
    assert_eq!(run.get("shmem_filled_behind_pages"), 0);
}

/// Holds: a process reading its own memory file (`/proc/self/mem`) is held, and the kernel
/// reads memory for it without a userfault: the shared pages evicted before are written back
/// into the inode first, and none is evicted while it is held. Before, 50 of the 64 reads of
/// 1 MiB failed (`EIO`).
#[test]
fn shared_anon_read_through_proc_self_mem() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = shmem("16M", "shmem-selfmem", &["selfmem", "64"]);
    assert_eq!(run.status, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("selfmem: 64 MiB, 0 bad words, 0 failed reads"),
        "{}",
        run.stdout
    );
    assert!(run.get("shmem_evicted_pages") > 0);
}

/// A mapping the daemon learned whole and the program split after (stress-ng's stats region:
/// `MAP_SHARED`, its last page made a `PROT_NONE` guard), written page by page in order: a
/// fault-around run of the last pages crossed into the guard, the kernel refused the copy
/// across the two VMAs, and the faulting thread was left waiting for ever (the message read,
/// never answered: `stress-ng --vm ... --verify` hung in its deinit). The private twin, the
/// same layout in `MAP_PRIVATE` memory, beside it.
#[test]
fn a_mapping_split_by_a_guard_page_is_served_to_its_end() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("shmem").to_string_lossy().into_owned();
    for mode in ["guard", "guard-private"] {
        let run = run_with_deadline(
            &["--limit", "16M"],
            &format!("shmem-{mode}"),
            &[&exe, mode, "48", "2"],
            Duration::from_secs(120),
        );
        assert!(!run.timed_out, "{mode}: hung: {}", run.hung_in);
        assert_eq!(run.status, 0, "{mode}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stdout.contains("48 MiB, 0 bad words"),
            "{mode}: {}",
            run.stdout
        );
        assert!(run.get("evicted_pages") > 0, "{mode}: nothing was evicted");
        if mode == "guard" {
            assert!(
                run.get("shmem_evicted_pages") > 0,
                "the shared mapping was not paged"
            );
            assert!(run.get("shmem_swapins") > 0);
        }
    }
}
