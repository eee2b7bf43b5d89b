//! What a program can do to its own process that the daemon must survive without changing
//! what the program sees: signals, descriptors, privileges, fork flags, locked memory, its own
//! threads' lifetimes. Every case checks the program's data and that the daemon went on
//! managing it (the limit held, the agent connected).

use std::cell::Cell;
use std::process::Command;
use std::time::Duration;

mod common;
use common::*;

/// A program under Ctrl-C that ignores SIGINT (a REPL, gdb, psql): the terminal sends SIGINT
/// to the daemon too. The daemon's waits for its agents' answers must not end on it: a DROP
/// given up while the agent was still moving pages left them unprotected (a write could then
/// land in a page that moved away) and stopped eviction from that process for good.
#[test]
fn sigint_to_the_daemon_stops_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let sent = Cell::new(0);
    let run = run_poking(
        &["--limit", "16M"],
        "sigint",
        &[DAEMON, "workload", "--size", "96M"],
        &|daemon, program| {
            // (Once the daemon has started the program, it handles signals.)
            if program.is_some() {
                // SAFETY: kill(2) with integer arguments, to our own child.
                unsafe { libc::kill(daemon, libc::SIGINT) };
                sent.set(sent.get() + 1);
            }
        },
    );
    assert_eq!(run.status, 0, "the workload found bad pages");
    assert!(run.stdout.contains("0 bad pages"));
    assert!(
        sent.get() >= 20,
        "too few signals to matter ({})",
        sent.get()
    );
    assert_paged(&run, 16 << 20);
}

/// A process stopped (Ctrl-Z, a debugger) while its agent has a DROP to carry out: the DROP is
/// answered late, after the process resumes. Until then every page of the batch stays
/// protected (the agent may still move it); the late answer settles the batch; nothing is
/// lost and eviction goes on.
#[test]
fn a_stopped_process_answers_late_and_loses_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let cfg = std::env::temp_dir().join(format!("uffd-test-stop-{}.toml", std::process::id()));
    std::fs::write(&cfg, "[test]\ndrop_timeout_ms = 20\n").expect("config");
    let cfg_s = cfg.to_string_lossy().into_owned();
    // Every 180 ms: stopped for 150, running for 30.
    let (ticks, stops) = (Cell::new(0u32), Cell::new(0u32));
    let run = run_poking(
        &["--limit", "16M", "--config", &cfg_s],
        "stopped",
        &[DAEMON, "workload", "--size", "96M"],
        &|_, program| {
            let Some(program) = program else { return };
            ticks.set(ticks.get() + 1);
            let sig = match ticks.get() % 18 {
                3 => libc::SIGSTOP,
                0 => libc::SIGCONT,
                _ => return,
            };
            // SAFETY: kill(2) with integer arguments, to our own grandchild.
            unsafe { libc::kill(program, sig) };
            stops.set(stops.get() + u32::from(sig == libc::SIGSTOP));
        },
    );
    let _ = std::fs::remove_file(&cfg);
    assert_eq!(run.status, 0, "the workload found bad pages");
    assert!(run.stdout.contains("0 bad pages"));
    assert!(
        run.get("drop_timeouts") >= 1,
        "no DROP was late: the test did not stop the agent mid-DROP ({} stops)",
        stops.get()
    );
    assert_eq!(run.get("agents_lost"), 0, "a late answer lost the agent");
    assert!(
        run.get("evicted_pages") > 24576 / 2,
        "eviction did not go on"
    );
    // Loose: while a DROP is outstanding its pages stay counted, and faults go through when
    // reclaim can free nothing else.
    assert!(
        run.get("resident_pages_max") <= 2 * 4096,
        "the limit did not hold"
    );
}

/// Runs `program` under `uffd-daemon run ARGS`, calling `poke(daemon, program)` every 10 ms
/// while it runs (`program`: the daemon's first child, once started).
fn run_poking(args: &[&str], name: &str, program: &[&str], poke: &dyn Fn(i32, Option<i32>)) -> Run {
    let path = stats_path(name);
    let b = Bounded::spawn(daemon_command(args, &path, program), name);
    let daemon = b.pid();
    let children = format!("/proc/{daemon}/task/{daemon}/children");
    let done = b.wait_or_grace(
        Duration::from_secs(300),
        &|| {
            let child = std::fs::read_to_string(&children)
                .ok()
                .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()));
            poke(daemon, child);
            false
        },
        Duration::ZERO,
    );
    finish_run(name, done, &path)
}

fn lifecycle(limit: &str, name: &str, args: &[&str]) -> Run {
    let exe = c_client("lifecycle");
    let exe = exe.to_string_lossy().into_owned();
    let mut argv = vec![exe.as_str()];
    argv.extend_from_slice(args);
    run_under(limit, name, &argv)
}

/// The agent holds nothing in the program's descriptor table: the program lists the same
/// descriptors as bare, a program that closes every descriptor (closefrom, as daemons and
/// shells do before exec) is still managed and evicted, and its fork child's own files are its
/// own.
#[test]
fn the_program_owns_its_descriptors() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("lifecycle");
    let bare_out = std::env::temp_dir().join(format!("uffd-fds-bare-{}", std::process::id()));
    let under_out = std::env::temp_dir().join(format!("uffd-fds-under-{}", std::process::id()));
    // The same output name in both runs, so that the listings can be compared; standard
    // output and error are the same files in both (named after the run's name).
    let exe_s = exe.to_string_lossy().into_owned();
    let bare_s = bare_out.to_string_lossy().into_owned();
    let st = run_bare("fds", &[&exe_s, "fds", &bare_s], Duration::from_secs(60));
    assert_eq!(st.status, 0);
    let bare = std::fs::read_to_string(&bare_out).expect("bare listing");
    std::fs::rename(&bare_out, &under_out).expect("rename");
    let run = lifecycle("8M", "fds", &["fds", &bare_out.to_string_lossy()]);
    assert_eq!(run.status, 0);
    let under = std::fs::read_to_string(&bare_out).expect("listing under the daemon");
    let _ = std::fs::remove_file(&bare_out);
    let _ = std::fs::remove_file(&under_out);
    assert_eq!(under, bare, "descriptors differ under the daemon");

    let run = lifecycle("8M", "closefrom", &["closefrom", "48"]);
    assert_eq!(
        run.status, 0,
        "wrong data or the child's files were not its own"
    );
    assert!(run.stdout.contains("parent: 48 MiB, 0 bad words"));
    assert!(run.stdout.contains("child: 24 MiB, 0 bad words"));
    assert_eq!(run.get("processes"), 2);
    assert_eq!(
        run.get("agent_threads"),
        2,
        "the child's agent did not start"
    );
    // Managed after closing everything: evicted, and the limit held (the child's
    // copy-on-write pages count in both processes: ARCHITECTURE.md, accounting).
    assert_paged(&run, 16 << 20);
}

/// Memory glibc's malloc maps for itself (a large chunk) or grows its heap into (brk) goes
/// through no `mmap` the agent sees, and a program fills it at once: the agent's allocation
/// wrappers register it before `malloc` returns. Registered by the scanner instead (it polls
/// every 2 ms), it was filled past the limit first, the more so with the CPUs busy: 4405-4797
/// pages for a 2048-page limit with `stress-ng --cpu 2` beside this program. A busy thread
/// here keeps one CPU taken.
#[test]
fn memory_malloc_maps_for_itself_is_managed_before_it_is_filled() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    let heap = lifecycle("8M", "heap", &["heap", "64"]);
    // (A large chunk: `page` mallocs its whole buffer at once.)
    let chunk = lifecycle("8M", "inner", &["inner", "64"]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = busy.join();
    assert_eq!(heap.status, 0, "wrong data");
    assert!(heap.stdout.contains("heap: 64 MiB, 0 bad words"));
    assert_paged(&heap, 8 << 20);
    assert_eq!(chunk.status, 0, "wrong data");
    assert_paged(&chunk, 8 << 20);
}

/// A process forks while its other threads fault on evicted pages: every child must read its
/// parent's memory as it was at the fork. A fault read in the same batch as the FORK event, and
/// served before the FORK was applied, filled the parent after the kernel had copied its page
/// tables (the kernel holds fills back only until the event is read): the child took that page
/// for resident, had a hole there, and read zeros (4 to 17 of every 10 to 30 children, 1-4
/// pages each). Memory is never written after the fill, so any wrong word is a loss.
#[test]
fn children_forked_while_threads_fault_read_their_parents_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("fork_race").to_string_lossy().into_owned();
    let run = run_under("12M", "fork-race", &[&exe, "32", "4", "12"]);
    assert_eq!(
        run.status, 0,
        "a child read wrong words: {}{}",
        run.stdout, run.stderr
    );
    assert!(
        run.stdout
            .contains("fork_race: 12 children, 0 bad children, 0 bad words (parent 0)"),
        "{}",
        run.stdout
    );
    assert!(
        run.get("fork_events") >= 12,
        "the children were not forked under the daemon"
    );
    assert!(run.get("swapins") > 0 && run.get("evicted_pages") > 0);
}

/// The longest mremap or munmap `remap_race` saw, in ms. The kernel holds either until the
/// daemon's handler has read its events; a DROP that kept the handler from reading while it
/// waited for those very events to be read (its pages given back under the event gate, each
/// run retried for 5 s) held them 12 s.
fn slowest_move_ms(stdout: &str) -> u64 {
    stdout
        .split("slowest mremap or munmap ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no slowest mremap or munmap in {stdout}"))
}

/// A region moved with `mremap(MREMAP_FIXED)` over one being evicted must read as it was
/// moved. The kernel refuses the agent's `UFFDIO_MOVE` while the mremap's events wait to be
/// read, and lets it through again once the handler has read them, before the handler has
/// applied them: a DROP chosen before the mremap then moved the page the mremap had just put
/// at a victim's address, and the daemon freed it (13-24 pages of zeros in each of 3 runs of
/// 40 rounds; 2 of 10 runs still, and 3 of 8 under CPU load, once the agent stopped retrying
/// at once). The settlement now tells the victim from such a page by its frame and puts the
/// latter back (`reclaim::put_back_moved`). Every word is checked after every round.
#[test]
fn a_region_moved_over_one_being_evicted_keeps_its_words() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("remap_race").to_string_lossy().into_owned();
    let run = run_under("12M", "remap-race", &[&exe, "16", "60"]);
    assert_eq!(
        run.status, 0,
        "the moved region lost words: {}{}",
        run.stdout, run.stderr
    );
    assert!(
        run.stdout.contains("remap_race: 60 rounds, 0 bad words"),
        "{} (pages put back {}, not {})",
        run.stdout,
        run.get("drop_moved_put_back"),
        run.get("drop_moved_lost")
    );
    assert!(run.get("remap_events") >= 60, "the mremaps were not seen");
    assert!(
        slowest_move_ms(&run.stdout) < 2000,
        "an mremap waited for the daemon: {}",
        run.stdout
    );
    assert!(run.get("evicted_pages") > 0 && run.get("swapins") > 0);
}

/// The same, with the moved region registered with a userfaultfd of the program's own: a page
/// a DROP took from under the move could not be put back (the range is not the daemon's), and
/// the program's handler would see it missing. While the agent moves pages the daemon's handler
/// reads no event (`reclaim::drop_by_agent`), so a move either meets the mremap's pending
/// event (`EAGAIN`) or comes before it. Each round's target is a new region, evicted as it
/// fills; every word is checked and the program's own faults after the moves must be none.
#[test]
fn a_region_of_its_own_uffd_moved_over_one_being_evicted_keeps_its_pages() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("remap_race").to_string_lossy().into_owned();
    let run = run_under("12M", "remap-race-own", &[&exe, "16", "40", "own"]);
    assert!(
        run.stdout
            .contains("remap_race: 40 rounds, 0 bad words (0 zeros) on 0 pages, 0 faults"),
        "{}{} (drop_moved_not_ours {})",
        run.stdout,
        run.stderr,
        run.get("drop_moved_not_ours")
    );
    assert_eq!(run.status, 0);
    assert!(
        slowest_move_ms(&run.stdout) < 2000,
        "an mremap or munmap waited for the daemon: {}",
        run.stdout
    );
    assert!(run.get("evicted_pages") > 0 && run.get("drop_requests") > 0);
}

/// Pages a process shares with a forked child (or shared with one that has exited: the kernel/// Pages a process shares with a forked child (or shared with one that has exited: the kernel
/// marks a page the process's own again only at its next write) cannot be moved out:
/// `UFFDIO_MOVE` refuses them (EBUSY). Reclaim reads victims through `/proc/PID/mem`, which
/// (unlike `process_vm_readv`, whose read pin unshared such pages as a side effect) leaves them
/// shared, so the agent unshares them (`MADV_POPULATE_WRITE`) and the next DROP moves them.
/// Without that, a parent and its waiting child each kept the limit's worth of shared pages
/// resident for good. Every word of both copies is checked.
#[test]
fn pages_shared_after_fork_are_evicted() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    // The kernel's view of parent and child together, within 2 MiB of the limit.
    let run = lifecycle("16M", "fork-shared", &["fork-shared", "64", "18432"]);
    assert_eq!(
        run.status, 0,
        "wrong data in the parent or the waiting child"
    );
    assert!(run.stdout.contains("parent: 64 MiB, 0 bad words"));
    assert!(run.stdout.contains("waiting child: 64 MiB, 0 bad words"));
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("parent and child:"))
        .expect("the client's resident line");
    let kib: u64 = line
        .split_whitespace()
        .nth(3)
        .and_then(|w| w.parse().ok())
        .expect("KiB");
    assert!(
        kib <= 18432,
        "{line}: the shared pages were not evicted (unshared_pages {}, evict_aborts {})",
        run.get("unshared_pages"),
        run.get("evict_aborts")
    );
    assert!(run.get("unshared_pages") > 0, "no shared page was unshared");
    // Right after the forks the copy-on-write pages count in every process (ARCHITECTURE.md,
    // accounting): three processes.
    assert_paged(&run, 3 * (16 << 20));
}

/// A program started with descriptors 0-2 closed gets its own files there, as bare.
#[test]
fn a_program_started_with_0_1_2_closed_gets_them() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("lifecycle").to_string_lossy().into_owned();
    let out = std::env::temp_dir().join(format!("uffd-fds012-{}", std::process::id()));
    let out_s = out.to_string_lossy().into_owned();
    let script = format!("exec 0<&- 1>&- 2>&-; exec {exe} fds {out_s}");
    let bare = Command::new("sh")
        .args(["-c", &script])
        .status()
        .expect("sh");
    assert!(bare.success());
    let bare = std::fs::read_to_string(&out).expect("bare listing");
    let run = run_under("8M", "fds012", &["sh", "-c", &script]);
    assert_eq!(run.status, 0);
    let under = std::fs::read_to_string(&out).expect("listing under the daemon");
    let _ = std::fs::remove_file(&out);
    assert!(
        bare.starts_with("0 "),
        "bare: the output file is not fd 0: {bare}"
    );
    assert_eq!(under, bare, "descriptors differ under the daemon");
}

/// POSIX: the process ends when its last thread does, also when the main thread left first
/// with pthread_exit. The agent's threads must not keep it alive.
#[test]
fn pthread_exit_of_the_last_thread_ends_the_process() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("lifecycle").to_string_lossy().into_owned();
    let run = run_with_deadline(
        &["--limit", "8M"],
        "pthread-exit",
        &[&exe, "pthread-exit", "32"],
        Duration::from_secs(60),
    );
    assert!(
        !run.timed_out,
        "the process did not end after its last thread exited: {}",
        run.hung_in
    );
    assert_eq!(run.status, 0, "{}", run.stdout);
    assert!(
        run.stdout.contains("thread: 32 MiB, 0 bad words"),
        "{}",
        run.stdout
    );
}

/// A server drops its privileges and forks its workers; a worker execs. Every process stays
/// managed: the fork child greets from its agent thread (any uid of the tree may), and the
/// image exec'd without privileges gets its userfaultfd through the daemon.
#[test]
fn privileges_dropped_then_fork_and_exec() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: dropping privileges needs root");
        return;
    }
    let run = lifecycle("8M", "drop-fork", &["drop-fork", "24"]);
    assert_eq!(
        run.status, 0,
        "a process of the tree failed or saw wrong data"
    );
    assert!(run
        .stdout
        .contains("dropped child: inherited 24 MiB, 0 bad words"));
    assert!(run.stdout.contains("inner: 24 MiB, 0 bad words"));
    assert_eq!(
        run.get("processes"),
        3,
        "parent, forked child, exec'd image"
    );
    assert_eq!(run.get("agent_threads"), 3, "an agent did not start");
    // The child's copy-on-write pages count in both processes (ARCHITECTURE.md, accounting).
    assert_paged(&run, 16 << 20);
}

/// A program that changes its credentials in its own thread where glibc does not do it in every
/// thread (capset, prctl's KEEPCAPS, SECUREBITS, CAPBSET_DROP, CAP_AMBIENT, NO_NEW_PRIVS,
/// through libc and through `syscall()`), between the set*id calls glibc makes in every thread,
/// as util-linux setpriv does. The agent's threads missed those changes, and glibc aborted the
/// program at its setresgid (exit 134), which failed in them only (issue #16). After every step
/// each thread of the process (the agent's included) must have the program thread's ids,
/// groups, capability sets and no_new_privs, in the parent, its fork child and the image the
/// child execs; a capset the kernel refused is made in no other thread; the output is the bare
/// run's; the memory pages.
#[test]
fn per_thread_credential_changes_reach_the_agents_threads() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: changing credentials needs root");
        return;
    }
    let exe = c_client("credentials").to_string_lossy().into_owned();
    let bare = run_bare(
        "credentials",
        &[&exe, "drop", "24"],
        Duration::from_secs(60),
    );
    assert_eq!(
        bare.status, 0,
        "bare: the case itself is wrong: {}",
        bare.stderr
    );
    let run = run_under("8M", "credentials", &[&exe, "drop", "24"]);
    assert_eq!(
        run.status, 0,
        "a thread's credentials differed, a change failed or glibc aborted: {}",
        run.stderr
    );
    assert_eq!(
        run.stdout, bare.stdout,
        "the output differs from the bare run's"
    );
    assert!(run.stdout.contains("dropped: 24 MiB, 0 bad words"));
    assert!(run.stdout.contains("exec'd image: 24 MiB, 0 bad words"));
    assert!(
        !run.stderr.contains("did not follow"),
        "a change was not followed: {}",
        run.stderr
    );
    assert_eq!(
        run.get("processes"),
        3,
        "parent, forked child, exec'd image"
    );
    assert_eq!(run.get("agent_threads"), 3, "an agent did not start");
    // The child's copy-on-write pages count in both processes (ARCHITECTURE.md, accounting).
    assert_paged(&run, 16 << 20);
}

/// What the agent's threads must not follow, and what they cannot: the credential changes of a
/// vfork child (it shares the agent's state, not its threads) reach no thread of its parent;
/// and when two program threads have diverged (the agent's threads follow the latest change), a
/// change that fails in the agent's threads is said once on stderr and the program goes on as
/// bare.
#[test]
fn credential_changes_not_to_follow_or_not_followed() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: changing credentials needs root");
        return;
    }
    let exe = c_client("credentials").to_string_lossy().into_owned();
    for mode in ["vfork", "diverged"] {
        let name = format!("credentials-{mode}");
        let bare = run_bare(&name, &[&exe, mode, "0"], Duration::from_secs(60));
        assert_eq!(
            bare.status, 0,
            "bare: the case itself is wrong: {}",
            bare.stderr
        );
        let run = run_under("8M", &name, &[&exe, mode, "0"]);
        assert_eq!(run.status, 0, "{mode}: {}", run.stderr);
        assert_eq!(run.stdout, bare.stdout, "{mode}: the output differs");
        let said = run.stderr.matches("did not follow").count();
        if mode == "vfork" {
            assert!(run.stdout.contains("other threads differing: 0"));
            assert_eq!(said, 0, "{}", run.stderr);
        } else {
            assert!(run.stdout.contains("second thread: keepcaps set"));
            assert_eq!(said, 1, "not said once: {}", run.stderr);
            assert!(
                run.stderr
                    .contains("prctl(PR_SET_KEEPCAPS) (Operation not permitted)"),
                "{}",
                run.stderr
            );
        }
    }
}

/// MADV_WIPEONFORK: a fork child reads zeros there, whatever its parent stored (libraries keep
/// keys and RNG state there); MADV_DONTFORK: the child has no mapping there. The parent's
/// pages, evicted or not, are the child's only elsewhere.
#[test]
fn wipe_on_fork_and_dont_fork_hold_in_the_child() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = lifecycle("8M", "wipe-on-fork", &["wipe-on-fork", "16"]);
    assert!(
        run.stdout.contains(
            "child: 0 non-zero words where wipe-on-fork, dont-fork unmapped, 0 bad words"
        ),
        "the child saw its parent's wipe-on-fork data or dont-fork mapping"
    );
    assert!(run.stdout.contains("parent: 0 bad words"));
    assert_eq!(run.status, 0);
    assert!(run.get("fork_pages_wiped") > 0);
    assert_paged(&run, 16 << 20);
}

/// Runs `lifecycle ARGS` under the daemon with a named, unencrypted swap file (so that a
/// copy of locked memory would be found in it), up to its READY line; then counts the copies
/// of `marker` in every byte written to the swap file so far, lets the program finish and
/// returns (its output, the copies, its exit status, the daemon's counters).
fn run_locked(name: &str, args: &[&str], marker: &[u8]) -> (String, usize, i32, serde_json::Value) {
    use std::io::{BufRead, Write};
    let exe = c_client("lifecycle");
    let swap = std::env::temp_dir().join(format!("uffd-{name}-swap-{}", std::process::id()));
    let _ = std::fs::remove_file(&swap);
    let path = stats_path(name);
    let backend = format!("file:{}", swap.display());
    let mut child = Command::new(DAEMON)
        .args(["run", "--limit", "8M", "--zswap", "off", "--encrypt", "off"])
        .args(["--swap-size", "256M", "--backend"])
        .arg(&backend)
        .arg("--stats-json")
        .arg(&path)
        .arg("--")
        .arg(&exe)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("uffd-daemon");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut text = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).expect("read") == 0 {
            break;
        }
        text.push_str(&line);
        if line.starts_with("READY") {
            break;
        }
    }
    // Every byte written to the swap file so far, while the program still runs.
    let written = std::fs::read(&swap).expect("the swap file");
    let copies = written
        .windows(marker.len())
        .filter(|w| w == &marker)
        .count();
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"\n")
        .expect("write");
    let status = child.wait().expect("wait");
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("stats")).expect("json");
    let _ = std::fs::remove_file(&path);
    eprintln!("{text}\nstats {stats}");
    assert!(!swap.exists(), "the named swap file was left behind");
    (text, copies, status.code().unwrap_or(-1), stats)
}

/// mlock: the pages stay in RAM and never reach swap. The daemon leaves locked memory alone
/// (says so, counts it) and no copy of it is written to the swap file.
#[test]
fn locked_memory_never_reaches_swap() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let (text, copies, status, stats) =
        run_locked("mlock", &["mlock", "48"], b"SECRET-MARKER-0123456789");
    assert!(
        text.contains("mlock: secret 0 bad, 0 pages not resident"),
        "{text}"
    );
    assert_eq!(status, 0);
    assert_eq!(
        copies, 0,
        "{copies} copies of locked memory in the swap file"
    );
    assert!(
        stats["evicted_pages"].as_u64().unwrap_or(0) > 0,
        "nothing was paged"
    );
    assert!(
        stats["unmanaged_locked_bytes"].as_u64().unwrap_or(0) >= 4 << 20,
        "the locked memory was not counted"
    );
}

/// mlock while reclaim is choosing victims: memory written right after its `mlock` returned
/// never reaches swap. The census sees a lock only at its next scan (100 ms), and a page
/// chosen in between was stored; now the agent tells the daemon before it locks, and the
/// daemon answers once none of the range can be chosen.
#[test]
fn memory_written_after_mlock_never_reaches_swap_even_mid_reclaim() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let (text, copies, status, stats) = run_locked(
        "mlock-race",
        &["mlock-race", "32"],
        b"LOCKED-BEFORE-WRITTEN-MARKER",
    );
    assert!(text.contains("mlock-race: 0 bad secrets"), "{text}");
    assert_eq!(status, 0);
    assert_eq!(
        copies, 0,
        "{copies} copies of memory written after mlock in the swap file"
    );
    assert!(stats["evicted_pages"].as_u64().unwrap_or(0) > 0);
}

/// Memory the daemon cannot manage is counted by kind and said once per process: shared
/// memory a descriptor reaches (a memfd) of a managed process. Shared anonymous memory is not
/// such memory any more (it is paged, tests/shmem.rs), nor is a statically linked program: it
/// is managed without the agent.
#[test]
fn unmanaged_memory_is_counted_and_said() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("shmem").to_string_lossy().into_owned();
    let run = run_under("8M", "shared", &[&exe, "memfd", "32"]);
    assert_eq!(run.status, 0);
    assert!(run.stdout.contains("memfd: 32 MiB, 0 bad words"));
    assert!(
        run.get("unmanaged_shared_bytes") >= 30 << 20,
        "shared memory not counted"
    );
    assert!(run.stderr.contains("unmanaged (shared)"), "not said");
    let run = lifecycle("8M", "shared-anon", &["shared", "32"]);
    assert_eq!(run.status, 0);
    assert!(run.stdout.contains("shared: 32 MiB, 0 bad words"));
    assert_eq!(run.get("unmanaged_shared_bytes"), 0, "paged memory counted");

    // A statically linked program is managed without the agent (tests/agentless.rs), at
    // start and when a managed shell execs it: nothing of it is counted unmanaged, and
    // `--unmanaged error` has nothing to refuse. (The static processes the daemon must leave
    // alone, under a seccomp filter or another tracer, are counted there.)
    let stat = c_client_static("lifecycle").to_string_lossy().into_owned();
    let run = run_under("8M", "static", &[&stat, "inner", "32"]);
    assert_eq!(run.status, 0);
    assert_eq!(run.get("agentless_processes"), 1);
    assert_eq!(run.get("unmanaged_static_bytes"), 0, "counted unmanaged");
    let script = format!("sleep 0.2; exec {stat} inner 32");
    let run = run_under("8M", "exec-static", &["sh", "-c", &script]);
    assert_eq!(run.status, 0);
    assert_eq!(
        run.get("agentless_processes"),
        1,
        "the exec'd image is not managed"
    );
    assert_eq!(run.get("processes_live"), 0);
    let run = run_with(
        &["--limit", "8M", "--unmanaged", "error"],
        "static-error",
        &[&stat, "inner", "8"],
    );
    assert_eq!(run.status, 0, "a static program is no longer refused");
    assert_eq!(run.get("agentless_processes"), 1);
}

/// A program with a strict seccomp allow-list forks: the child obeys the filter, so the agent
/// does nothing there (a new thread of its would be aborted by glibc when rseq is refused: the
/// child died with SIGSEGV). The child runs with its faults served and is counted unmanaged.
#[test]
fn a_seccomp_allow_list_is_obeyed() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("seccomp").to_string_lossy().into_owned();
    let run = run_under("16M", "seccomp", &[&exe, "64"]);
    assert!(
        run.stdout.contains("parent: 0 bad words, child exited 0"),
        "{}",
        run.stdout
    );
    assert_eq!(run.status, 0);
    assert!(run.get("evicted_pages") > 0 && run.get("swapins") > 0);
    assert!(
        run.get("unmanaged_no_agent_bytes") > 0,
        "the child was not counted"
    );
}

/// A program that, its memory paged out, puts every thread under a seccomp filter that kills
/// the process for any call not on its list (`SECCOMP_FILTER_FLAG_TSYNC`, as sandboxes do): the
/// filter reached the agent's threads too, and the watchdog's next poll killed the process
/// (SIGSYS). Now the process leaves management first: every page comes back, the filter then
/// reaches only the program's threads, and the process runs on unmanaged, counted and said.
#[test]
fn a_tsync_seccomp_filter_takes_the_process_out_whole() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("seccomp").to_string_lossy().into_owned();
    let bare = run_bare(
        "seccomp-tsync",
        &[&exe, "64", "tsync"],
        std::time::Duration::from_secs(60),
    );
    assert_eq!(bare.status, 0, "bare: {}", bare.stderr);
    let run = run_under("16M", "seccomp-tsync", &[&exe, "64", "tsync"]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("parent: 0 bad words, child exited 0"),
        "{}",
        run.stdout
    );
    assert!(run.get("evicted_pages") > 0, "nothing was paged out first");
    assert_eq!(run.get("tsync_left_processes"), 1);
    assert!(run.get("tsync_left_bytes") >= 64 << 20);
    assert!(
        run.get("own_uffd_pages_restored") > 0,
        "no page brought back"
    );
    assert!(
        run.stderr.contains("(TSYNC)"),
        "the process left unmanaged without a word: {}",
        run.stderr
    );
    assert_eq!(run.get("agents_lost"), 0);
}

/// A program with a userfaultfd of its own registers memory the daemon manages (and has
/// evicted): its registration used to fail with EBUSY. The daemon brings back what it evicted
/// there and steps aside; the program's own handler then serves its faults.
#[test]
fn a_programs_own_userfaultfd_gets_its_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("ownuffd").to_string_lossy().into_owned();
    let run = run_under("16M", "ownuffd", &[&exe, "24"]);
    assert!(
        run.stdout
            .contains("own uffd: 0 bad words, 2048 of 2048 words served by its own handler"),
        "{}",
        run.stdout
    );
    assert_eq!(run.status, 0);
    assert_eq!(run.get("own_uffd_bytes"), 24 << 20);
    assert!(
        run.get("own_uffd_pages_restored") > 0,
        "nothing of the range had been evicted: the test did not test the hand-over"
    );
}

/// A program that makes a new user namespace (`unshare(CLONE_NEWUSER)`, then maps itself to
/// root there as `unshare -r` does), and children that enter user, mount and time namespaces
/// with setns(2) and unshare CLONE_THREAD | CLONE_SIGHAND | CLONE_VM: calls the kernel allows
/// only to a process of one thread, which failed with EINVAL (EUSERS for time) under the
/// daemon while the agent's two threads were there. Each must do what it does bare, and the
/// process must stay managed after the call: every word checked, the pages evicted before the
/// call brought back, 96 MiB written and checked after it with the process's own anonymous RSS
/// held at the limit (bare it reaches 96 MiB). Tests/clients/userns.c.
#[test]
fn a_new_user_namespace_keeps_the_process_managed() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("userns").to_string_lossy().into_owned();
    let bare = run_bare("userns", &[&exe, "96"], Duration::from_secs(60));
    if bare.status != 0 && bare.stdout.contains("holder:") && bare.stdout.contains("failed") {
        eprintln!(
            "SKIP: this machine refuses new user namespaces bare: {}",
            bare.stdout
        );
        return;
    }
    assert_eq!(bare.status, 0, "bare: {}{}", bare.stdout, bare.stderr);
    let run = run_under("32M", "userns", &[&exe, "96"]);
    assert_eq!(run.status, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.stdout, bare.stdout, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("after the call: pattern A 0 bad words, pattern B 0 bad words")
            && run
                .stdout
                .contains("a child forked in the new namespace: status 0"),
        "{}",
        run.stdout
    );
    // The holder's unshare, three setns, the no-op unshare, the refused one and the process's
    // own: each stepped out and came back (the child with a thread of its own did not step out:
    // its call fails as bare).
    assert_eq!(run.get("agent_step_outs"), 7, "{}", run.stderr);
    assert_eq!(run.get("agent_restarts"), 7, "{}", run.stderr);
    assert_eq!(run.get("agent_restart_left_processes"), 0);
    assert_eq!(run.get("protocol_errors"), 0, "{}", run.stderr);
    assert_agents(&run);
    // Managed after the call: pages went out while it wrote and read 96 MiB under 32 MiB.
    let peak_kib: u64 = run
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("userns: RssAnon peak after the call: "))
        .and_then(|l| l.trim_end_matches(" kB").parse().ok())
        .expect("the client's RssAnon peak after the call");
    assert!(
        peak_kib <= (32 + 8) << 10,
        "RssAnon reached {peak_kib} kB after the call under a 32 MiB limit: not managed"
    );
    assert!(
        run.get("evicted_pages") > 2 * (96 << 20) / 4096,
        "evicted {} pages",
        run.get("evicted_pages")
    );
}

/// A user namespace and a pid namespace for the children in one call (`unshare -Urp`): the
/// kernel then lets the process start no thread at all (its pid namespace would not be its
/// leader's), so the agent cannot come back. The process leaves management, every evicted
/// page brought back first, and says so; its data is intact.
#[test]
fn a_process_whose_agent_cannot_come_back_leaves_with_its_pages() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("userns").to_string_lossy().into_owned();
    let bare = run_bare(
        "userns-newpid",
        &[&exe, "64", "newpid"],
        Duration::from_secs(60),
    );
    if bare.status != 0 {
        eprintln!(
            "SKIP: this machine refuses unshare(CLONE_NEWUSER | CLONE_NEWPID) bare: {}",
            bare.stdout
        );
        return;
    }
    let run = run_under("16M", "userns-newpid", &[&exe, "64", "newpid"]);
    assert_eq!(run.status, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.stdout, bare.stdout);
    assert!(run.get("evicted_pages") > 0, "nothing was paged out first");
    assert_eq!(run.get("agent_step_outs"), 1);
    assert_eq!(run.get("agent_restarts"), 0);
    assert_eq!(run.get("agent_restart_left_processes"), 1);
    assert!(
        run.get("own_uffd_pages_restored") > 0,
        "no page brought back"
    );
    assert!(
        run.stderr.contains(
            "cannot start again after unshare (its children are to be in a new pid namespace"
        ),
        "the process left unmanaged without a word: {}",
        run.stderr
    );
    assert_eq!(run.get("agents_lost"), 0);
}

/// A buffer registered as io_uring fixed buffers is pinned (FOLL_LONGTERM) and filled by
/// `IORING_OP_READ_FIXED` through the pin, never through the page tables, while 64 MiB of
/// other memory are paged through a 16 MiB limit. `UFFDIO_MOVE` refuses pinned pages, so the
/// agent never drops them and every word is right; the test guards that, that the limit held
/// for the rest, and that reclaim does not keep choosing the pinned pages (it did: 183 154
/// refusals in a 40-round run, about 90 a page).
#[test]
fn io_uring_fixed_buffers_keep_every_write() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = pinned_run(&c_client("pinned"), "pinned-fixed", "fixed", 40);
    assert_paged(&run, PINNED_LIMIT_BYTES);
    assert_pinned_churn_bounded(&run);
}

/// The same buffer registered for each round's reads and unregistered before its check: a
/// page read by reclaim while pinned, written through the pin after that read, and moved out
/// once the program had unregistered it (the pin gone, `UFFDIO_MOVE` no longer refuses) was
/// stored with the contents from before the writes: the program read an earlier pass's data
/// there (two runs of three lost some, 8 704 to 255 488 wrong words in 30 rounds).
#[test]
fn io_uring_buffers_unpinned_mid_eviction_keep_every_write() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = pinned_run(&c_client("pinned"), "pinned-cycle", "cycle", 120);
    assert_paged(&run, PINNED_LIMIT_BYTES);
}

/// O_DIRECT reads in flight pin their pages only while the device writes them. A page read
/// by reclaim while its read was in flight, and moved out after the read completed (the pin
/// gone), took the contents from before the read into the store: the program then read the
/// previous round's data there. Every word is checked after every round. (A race with the
/// device: it lost data in about half of the 100-round runs.)
#[test]
fn o_direct_reads_in_flight_keep_every_write() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = pinned_run(&c_client("pinned"), "pinned-direct", "direct", 300);
    assert_paged(&run, PINNED_LIMIT_BYTES);
}

/// Whether this machine lets a process make a pid namespace at all (bare).
fn pid_namespaces_work() -> bool {
    let ok = Command::new("unshare")
        .args(["-pf", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP: this machine refuses a new pid namespace bare (unshare -pf true)");
    }
    ok
}

/// What `lifecycle wipe-on-fork 16` must show under the daemon when it runs in a pid namespace
/// below the daemon's: every word of the child's inherited and its parent's memory right, zeros
/// where wipe-on-fork, nothing where dont-fork, paged within the limit, both fork children
/// (unshare's, the namespace's first process, and the program's) bound to their processes.
fn assert_wipe_on_fork_in_a_pid_namespace(run: &Run) {
    assert!(
        !run.timed_out,
        "the daemon did not end (it waited for a process outside its tree?); its threads \
         waited in: {}",
        run.hung_in
    );
    assert_eq!(run.status, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains(
            "child: 0 non-zero words where wipe-on-fork, dont-fork unmapped, 0 bad words"
        ),
        "the child saw its parent's wipe-on-fork data, a dont-fork mapping or bad words: {}",
        run.stdout
    );
    assert!(run.stdout.contains("parent: 0 bad words"), "{}", run.stdout);
    assert!(run.get("fork_pages_wiped") > 0);
    assert_eq!(run.get("fork_children_bound"), 2, "{}", run.stderr);
    assert_eq!(run.get("fork_children_unbound"), 0);
    assert_eq!(
        run.get("protocol_errors"),
        0,
        "a greeting was refused: {}",
        run.stderr
    );
    assert_paged(run, 16 << 20);
}

/// A program in a pid namespace below the daemon's (`unshare -pf`, with and without a `/proc`
/// of its own): the C client maps memory wipe-on-fork, dont-fork and plain, fills all three,
/// forks, and checks every word in both processes. Before the fix the namespace's first
/// process (pid 1 there) was bound to the daemon's pid 1 and stopped by its watchdog (no
/// daemon with the daemon's number there: exit 86), and the daemon waited for pid 1.
#[test]
fn a_program_in_a_pid_namespace_is_managed() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !pid_namespaces_work() {
        return;
    }
    let exe = c_client("lifecycle").to_string_lossy().into_owned();
    for (name, proc_flag) in [("pidns", None), ("pidns-mount-proc", Some("--mount-proc"))] {
        let mut argv = vec!["unshare", "-pf"];
        argv.extend(proc_flag);
        argv.extend([exe.as_str(), "wipe-on-fork", "16"]);
        let run = run_with_deadline(&["--limit", "8M"], name, &argv, Duration::from_secs(120));
        assert_wipe_on_fork_in_a_pid_namespace(&run);
    }
}

/// The daemon itself in a pid namespace of its own, where the numbers are small and known:
/// its shell is pid 1 there, and twenty canaries (processes outside the daemon's tree) come
/// next. The program runs in a namespace below, whose processes name themselves 1, 2, ... in
/// their probe faults and greetings: numbers of the shell and of canaries in the daemon's
/// namespace. The daemon must bind, read and signal only its own tree: it ends when the
/// program does, every canary is left as it was (sleeping, untraced), no forked child is bound
/// to the shell or a canary, and the program's memory is right to the word. Before the fix the
/// namespace's first process was bound to the shell (pid 1), and the daemon waited for the
/// shell, which waited for the daemon.
#[test]
fn numbers_from_a_pid_namespace_below_never_name_a_process_outside_the_tree() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !pid_namespaces_work() {
        return;
    }
    let exe = c_client("lifecycle").to_string_lossy().into_owned();
    let stats = stats_path("pidns-canaries");
    let _ = std::fs::remove_file(&stats);
    // A run directory of its own: a daemon outside (another test run on this machine) of a
    // version older than the run directories' locks takes this daemon's number in its own
    // namespace, 20-odd, for a dead daemon's, and removes its directory and its agent socket
    // (rundir.rs).
    let run_dir = std::env::temp_dir().join(format!("uffd-test-pidns-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&run_dir);
    let script = format!(
        r#"
canaries=""
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    sleep 600 &
    canaries="$canaries $!"
done
echo "canaries:$canaries"
UFFD_DAEMON_RUN_DIR="{run_dir}" "{DAEMON}" run -v --limit 8M --stats-json "{stats}" -- unshare -pf "{exe}" wipe-on-fork 16
st=$?
for c in $canaries; do
    grep -q '^State:	S' /proc/$c/status && grep -q '^TracerPid:	0$' /proc/$c/status ||
        echo "canary $c was touched: $(grep -E '^(State|TracerPid):' /proc/$c/status | tr '\n' ' ')"
done
echo "daemon status $st"
kill $canaries
exit $st
"#,
        stats = stats.display(),
        run_dir = run_dir.display()
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-pf", "--mount-proc", "sh", "-c", &script]);
    let done = Bounded::spawn(cmd, "pidns-canaries").wait(Duration::from_secs(120));
    let run = finish_run("pidns-canaries", done, &stats);
    let _ = std::fs::remove_dir_all(&run_dir);
    assert_wipe_on_fork_in_a_pid_namespace(&run);
    assert!(run.stdout.contains("daemon status 0"), "{}", run.stdout);
    assert!(!run.stdout.contains("was touched"), "{}", run.stdout);
    let canaries: Vec<i32> = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("canaries:"))
        .expect("the canaries' pids")
        .split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect();
    assert_eq!(canaries.len(), 20);
    // "forked child bound to pid P (numbers from the daemon's pid namespace down: [P, .., N]"
    let bound: Vec<(i32, i32)> = run
        .stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split_once("forked child bound to pid ")?.1;
            let (pid, rest) = rest.split_once(' ')?;
            let own = rest.split_once('[')?.1.split_once(']')?.0;
            let innermost = own.rsplit(", ").next()?.parse().ok()?;
            Some((pid.parse().ok()?, innermost))
        })
        .collect();
    assert_eq!(bound.len(), 2, "{}", run.stderr);
    for &(pid, innermost) in &bound {
        assert!(
            pid != 1 && !canaries.contains(&pid),
            "a forked child was bound to pid {pid}, outside the daemon's tree (its own number \
             {innermost}; canaries {canaries:?})"
        );
    }
    // The case is the one it is meant to be: the namespace's first process says 1, which is
    // the shell's number in the daemon's namespace.
    assert!(bound.iter().any(|&(_, n)| n == 1), "{bound:?}");
}

/// Signals ignored where the program is started (`nohup` ignores SIGHUP; a non-interactive
/// shell's background job ignores SIGINT and SIGQUIT) are ignored in the program bare: exec
/// keeps an ignored disposition. The daemon caught them itself, and exec resets a caught signal
/// to its default, so under the daemon the program could be killed by a signal it ignores
/// bare (a core-dump test read SIGQUIT as SIG_DFL under the daemon, SIG_IGN bare).
#[test]
fn signals_ignored_at_start_stay_ignored_in_the_program() {
    use std::os::unix::process::CommandExt;
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let ignoring = |cmd: &mut Command| {
        // SAFETY: signal() is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT] {
                    libc::signal(sig, libc::SIG_IGN);
                }
                Ok(())
            });
        }
    };
    let sig_ign = |out: &[u8]| -> String {
        String::from_utf8_lossy(out)
            .lines()
            .find(|l| l.starts_with("SigIgn:"))
            .unwrap_or("no SigIgn line")
            .to_string()
    };
    let program = ["grep", "^SigIgn:", "/proc/self/status"];
    let mut bare = Command::new(program[0]);
    bare.args(&program[1..]);
    ignoring(&mut bare);
    let bare = bare.output().expect("grep");
    let stats = stats_path("sig-ign");
    let mut under = daemon_command(&["--limit", "64M"], &stats, &program);
    ignoring(&mut under);
    let under = under.output().expect("uffd-daemon");
    assert!(
        under.status.success(),
        "{}",
        String::from_utf8_lossy(&under.stderr)
    );
    // SIGHUP, SIGINT and SIGQUIT are bits 0, 1 and 2 of the mask.
    assert!(
        u64::from_str_radix(
            sig_ign(&bare.stdout).trim_start_matches("SigIgn:").trim(),
            16
        )
        .is_ok_and(|m| m & 0b111 == 0b111),
        "bare: {}",
        sig_ign(&bare.stdout)
    );
    assert_eq!(
        sig_ign(&under.stdout),
        sig_ign(&bare.stdout),
        "the program ignores other signals under the daemon than bare"
    );
}
