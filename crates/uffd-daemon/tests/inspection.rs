//! What the kernel reads of a managed program's memory without a userfault, which must hold
//! the program's data as bare: its core file (written with FOLL_DUMP, which takes a page that
//! is not mapped for a hole), and a debugger's reads and writes (/proc/PID/mem and ptrace's
//! PEEKDATA/POKEDATA, which get EIO where a registered page is not mapped). The daemon brings
//! evicted pages back before (`hold.rs`; the agent's handler of core-dumping signals, its
//! `ptrace` wrapper, the scanner's look at TracerPid). Every word of the program's buffer is
//! checked, in the core file, through gdb and through a tracer's reads, bare and managed.
//!
//! `kernel.core_pattern` is machine-wide: the tests that set it hold `SERIAL` and put the old
//! pattern back when they end (panicking or not).

use std::cell::{Cell, RefCell};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::*;

/// The buffer the client fills, in MiB, and the limit it runs under: most of it is evicted.
const BUFFER_MIB: u64 = 64;
const LIMIT: &str = "8M";
const PAGES: u64 = BUFFER_MIB << 8;
const DEADLINE: Duration = Duration::from_secs(300);

/// Word `i` of the client's buffer.
fn pattern(word: u64) -> u64 {
    (word + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Where the client's buffer is: its "buffer ADDR LEN PID" line.
#[derive(Debug, Clone, Copy)]
struct Buffer {
    addr: u64,
    len: u64,
    pid: i32,
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("a hex number")
}

fn buffer_of(stdout: &str) -> Buffer {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("buffer "))
        .unwrap_or_else(|| panic!("no buffer line in {stdout:?}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    Buffer {
        addr: hex(f[1]),
        len: hex(f[2]),
        pid: f[3].parse().expect("a pid"),
    }
}

/// The words of the buffer a core file gets wrong (its PT_LOAD segments; a part beyond a
/// segment's file size, a hole, reads as zeros), and the first of them.
fn core_bad_words(core: &[u8], b: Buffer) -> (u64, Option<(u64, u64)>) {
    let u16_at = |o: usize| u16::from_le_bytes(core[o..o + 2].try_into().expect("2 bytes"));
    let u32_at = |o: usize| u32::from_le_bytes(core[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(core[o..o + 8].try_into().expect("8 bytes"));
    assert_eq!(&core[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(u16_at(16), 4, "not a core file (ET_CORE)");
    let (phoff, phentsize, phnum) = (u64_at(32) as usize, u16_at(54) as usize, u16_at(56));
    // (vaddr, offset, filesz, memsz) of each PT_LOAD.
    let segs: Vec<(u64, u64, u64, u64)> = (0..phnum as usize)
        .map(|i| phoff + i * phentsize)
        .filter(|&o| u32_at(o) == 1)
        .map(|o| {
            (
                u64_at(o + 16),
                u64_at(o + 8),
                u64_at(o + 32),
                u64_at(o + 40),
            )
        })
        .collect();
    let (mut bad, mut first) = (0, None);
    for w in 0..b.len / 8 {
        let a = b.addr + w * 8;
        let got = segs
            .iter()
            .find(|&&(va, _, _, memsz)| a >= va && a < va + memsz)
            .map(|&(va, off, filesz, _)| {
                if a - va < filesz {
                    u64_at((off + a - va) as usize)
                } else {
                    0
                }
            });
        if got != Some(pattern(w)) {
            bad += 1;
            first = first.or(Some((a, got.unwrap_or(u64::MAX))));
        }
    }
    (bad, first)
}

/// The words of `bytes` (the buffer, from its start) that do not hold the pattern.
fn dump_bad_words(bytes: &[u8]) -> u64 {
    bytes
        .chunks_exact(8)
        .enumerate()
        .filter(|(w, c)| {
            u64::from_le_bytes((*c).try_into().expect("8 bytes")) != pattern(*w as u64)
        })
        .count() as u64
}

/// `kernel.core_pattern` set for as long as this lives, the old one put back when it is dropped.
struct CorePattern {
    old: String,
}

impl CorePattern {
    const PATH: &'static str = "/proc/sys/kernel/core_pattern";

    /// `None` (said) where the pattern cannot be written: not root, or a read-only /proc/sys.
    fn set(pattern: &str) -> Option<CorePattern> {
        let old = std::fs::read_to_string(Self::PATH).expect("reading core_pattern");
        match std::fs::write(Self::PATH, pattern) {
            Ok(()) => Some(CorePattern {
                old: old.trim_end_matches('\n').to_string(),
            }),
            Err(e) => {
                eprintln!("SKIP: cannot set {}: {e}", Self::PATH);
                None
            }
        }
    }
}

impl Drop for CorePattern {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(Self::PATH, &self.old) {
            eprintln!("could not put core_pattern {:?} back: {e}", self.old);
        }
    }
}

/// A fresh directory for this test's core files, removed with them at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("uffd-test-cores-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("creating the cores directory");
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The core file of `pid` in `dir` (`core.PID`), waited for up to a minute: a helper a pipe
/// pattern runs writes it after the process is gone.
fn core_of(dir: &Path, pid: i32) -> Vec<u8> {
    let path = dir.join(format!("core.{pid}"));
    let start = Instant::now();
    while !path.exists() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::read(&path).unwrap_or_else(|e| panic!("no core file {}: {e}", path.display()))
}

/// gdb on a core file: the two words at `addr` (`x/2gx`) and the functions of the backtrace
/// of the thread that got the signal.
fn gdb_on_core(exe: &Path, core: &Path, addr: u64) -> (Vec<u64>, Vec<String>) {
    let out = Command::new("gdb")
        .args(["-nx", "-batch", "-iex", "set debuginfod enabled off"])
        .arg("-ex")
        .arg(format!("x/2gx {addr:#x}"))
        .args(["-ex", "bt"])
        .arg(exe)
        .arg(core)
        .output()
        .expect("running gdb");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("--- gdb on {}:\n{text}", core.display());
    let words = text
        .lines()
        .find(|l| l.starts_with(&format!("{addr:#x}:")))
        .map(|l| l.split_whitespace().skip(1).map(hex).collect())
        .unwrap_or_default();
    // "#0  0x... in NAME (...)" or "#0  NAME (...)".
    let frames = text
        .lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.split_once(" in ").map_or(l, |(_, r)| r);
            let name = rest.split_whitespace().find(|w| !w.starts_with('#'))?;
            Some(name.to_string())
        })
        .collect();
    (words, frames)
}

/// The checks of a core file of the buffer, managed and bare alike; `what` names it.
fn assert_core_holds_the_buffer(core: &[u8], b: Buffer, what: &str) {
    let (bad, first) = core_bad_words(core, b);
    assert_eq!(
        bad,
        0,
        "{what}: {bad} of {} words of the buffer are wrong in the core file; the first at {:#x} \
         reads {:#x} (evicted pages dumped as holes?)",
        b.len / 8,
        first.map_or(0, |f| f.0),
        first.map_or(0, |f| f.1)
    );
}

/// The managed run's counters of a crash that dumped core: the buffer was evicted when the
/// signal came, and brought back for the dump.
fn assert_held_for_dump(run: &Run) {
    assert!(
        run.get("evicted_pages") >= PAGES / 2,
        "too little of the buffer was evicted for the test to mean anything"
    );
    assert_eq!(run.get("held_for_dump"), 1, "the process was not held");
    assert!(
        run.get("hold_pages_restored") >= PAGES / 2,
        "the buffer was not evicted at the crash, or not brought back"
    );
    assert_eq!(run.get("hold_pages_kept_evicted"), 0);
    assert_eq!(run.get("agent_faults"), 0);
}

/// Waits (a minute at most) until the daemon `pid` has ended a trace hold (`trace_releases`).
fn wait_for_release(pid: i32) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        let out = Command::new(DAEMON)
            .args(["stat", "--pid", &pid.to_string()])
            .output()
            .expect("uffd-daemon stat");
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        if v["stats"]["trace_releases"].as_u64().unwrap_or(0) >= 1 {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("the daemon did not end the trace hold within a minute");
}

/// abort() with RLIMIT_CORE unlimited and a file pattern: the core file holds every word of
/// the buffer, most of which was evicted, as bare, and gdb reads it and the same backtrace
/// from it (raise, abort, main: the agent's handler is not in it). Then with RLIMIT_CORE 0: no
/// core is written, so the agent brings nothing back, and the program dies as bare.
#[test]
fn a_core_file_holds_the_evicted_pages() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let dir = Dir::new("file");
    let Some(_pattern) = CorePattern::set(&format!("{}/core.%p", dir.0.display())) else {
        return;
    };
    let exe = c_client("inspect");
    let exe_s = exe.to_string_lossy().into_owned();
    let mib = BUFFER_MIB.to_string();

    let bare = run_bare("core-file", &[&exe_s, "abort", &mib], DEADLINE);
    assert_eq!(bare.status, 128 + libc::SIGABRT, "bare: {}", bare.stderr);
    let bb = buffer_of(&bare.stdout);
    let bare_core = core_of(&dir.0, bb.pid);
    assert_core_holds_the_buffer(&bare_core, bb, "bare");

    let run = run_with_deadline(
        &["--limit", LIMIT],
        "core-file",
        &[&exe_s, "abort", &mib],
        DEADLINE,
    );
    assert_eq!(run.status, bare.status, "not the death it has bare");
    let b = buffer_of(&run.stdout);
    let core = core_of(&dir.0, b.pid);
    assert_core_holds_the_buffer(&core, b, "managed");
    assert_held_for_dump(&run);

    if have("gdb") {
        let off = b.len / 4;
        let (bare_words, bare_frames) =
            gdb_on_core(&exe, &dir.0.join(format!("core.{}", bb.pid)), bb.addr + off);
        let (words, frames) =
            gdb_on_core(&exe, &dir.0.join(format!("core.{}", b.pid)), b.addr + off);
        let want = vec![pattern(off / 8), pattern(off / 8 + 1)];
        assert_eq!(bare_words, want, "bare: gdb reads the core file otherwise");
        assert_eq!(
            words, want,
            "gdb reads other words in the managed core file"
        );
        assert!(frames.iter().any(|f| f.contains("abort")), "{frames:?}");
        assert_eq!(
            frames, bare_frames,
            "the backtrace in the core file is not bare's"
        );
    }

    // No core to write: nothing brought back, the same death, no core file.
    let quiet = run_with_deadline(
        &["--limit", LIMIT],
        "core-quiet",
        &[&exe_s, "quiet", &mib],
        DEADLINE,
    );
    assert_eq!(quiet.status, 128 + libc::SIGABRT);
    assert!(quiet.get("evicted_pages") >= PAGES / 2);
    assert_eq!(
        quiet.get("held_for_dump"),
        0,
        "held for a core never written"
    );
    assert_eq!(quiet.get("hold_pages_restored"), 0);
    let qb = buffer_of(&quiet.stdout);
    assert!(
        !dir.0.join(format!("core.{}", qb.pid)).exists(),
        "a core file with RLIMIT_CORE 0"
    );
}

/// A NULL write in a second thread, RLIMIT_CORE 0 and a pattern that pipes the core to a
/// helper (which the kernel runs whatever the limit): the core holds every word of the buffer
/// as bare, and gdb finds the crash where it was (crash_in_thread, in the thread that made
/// it). Before it, the program reads back and changes the dispositions of every core-dumping
/// signal in every way libc offers (sigaction, signal, sysv_signal, bsd_signal, sigset,
/// siginterrupt, the raw system call, from a thread and a fork child), and recovers from a
/// SIGSEGV of its own: what it prints is bare's, byte for byte.
#[test]
fn a_core_piped_to_a_helper_holds_the_evicted_pages_and_the_crash_site() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let dir = Dir::new("pipe");
    let helper = dir.0.join("collect.sh");
    let d = dir.0.display();
    std::fs::write(
        &helper,
        format!("#!/bin/sh\ncat > {d}/core.$1.part && mv {d}/core.$1.part {d}/core.$1\n"),
    )
    .expect("writing the helper");
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    // (Run by sh: a noexec /tmp cannot stop it.)
    let Some(_pattern) = CorePattern::set(&format!("|/bin/sh {} %p", helper.display())) else {
        return;
    };
    let exe = c_client("inspect");
    let exe_s = exe.to_string_lossy().into_owned();
    let mib = BUFFER_MIB.to_string();

    let bare = run_bare("core-pipe", &[&exe_s, "segv-thread", &mib], DEADLINE);
    assert_eq!(bare.status, 128 + libc::SIGSEGV, "bare: {}", bare.stderr);
    let bb = buffer_of(&bare.stdout);
    assert_core_holds_the_buffer(&core_of(&dir.0, bb.pid), bb, "bare");

    let run = run_with_deadline(
        &["--limit", LIMIT],
        "core-pipe",
        &[&exe_s, "segv-thread", &mib],
        DEADLINE,
    );
    assert_eq!(run.status, bare.status, "not the death it has bare");
    let b = buffer_of(&run.stdout);
    assert_core_holds_the_buffer(&core_of(&dir.0, b.pid), b, "managed");
    let dispositions = |out: &str| -> String {
        out.lines()
            .filter(|l| !l.starts_with("buffer "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        dispositions(&run.stdout),
        dispositions(&bare.stdout),
        "the program reads other dispositions than bare"
    );
    assert_held_for_dump(&run);

    if have("gdb") {
        let (_, bare_frames) = gdb_on_core(&exe, &dir.0.join(format!("core.{}", bb.pid)), bb.addr);
        let (words, frames) = gdb_on_core(&exe, &dir.0.join(format!("core.{}", b.pid)), b.addr);
        assert_eq!(words, vec![pattern(0), pattern(1)]);
        assert_eq!(
            frames.first().map(String::as_str),
            Some("crash_in_thread"),
            "the core does not show the crash: {frames:?}"
        );
        assert_eq!(
            frames, bare_frames,
            "the backtrace in the core file is not bare's"
        );
    }
}

/// gdb run by the program itself (a process of the tree, so with the agent): `gdb -p` on its
/// parent, whose buffer is mostly evicted, dumps the buffer with `dump binary memory`, through
/// /proc/PID/mem. The agent's ptrace wrapper has the daemon bring the pages back before the
/// attach: every word is there, as bare. The program checks its buffer after gdb detached.
#[test]
fn gdb_in_the_tree_reads_evicted_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("gdb") {
        return;
    }
    let exe = c_client("inspect");
    let exe_s = exe.to_string_lossy().into_owned();
    let mib = BUFFER_MIB.to_string();
    let tmp = std::env::temp_dir();
    let out_bare = tmp.join(format!("uffd-test-gdb-bare-{}", std::process::id()));
    let out = tmp.join(format!("uffd-test-gdb-{}", std::process::id()));
    let (ob, o) = (out_bare.to_string_lossy(), out.to_string_lossy());

    let bare = run_bare("gdb-tree", &[&exe_s, "gdb-child", &mib, &ob], DEADLINE);
    let bare_dump = std::fs::read(&out_bare).unwrap_or_default();
    let _ = std::fs::remove_file(&out_bare);
    assert_eq!(bare.status, 0, "bare: gdb could not dump the buffer");
    assert_eq!(bare_dump.len() as u64, BUFFER_MIB << 20);
    assert_eq!(
        dump_bad_words(&bare_dump),
        0,
        "bare: gdb dumped other words"
    );

    let run = run_with_deadline(
        &["--limit", "16M"],
        "gdb-tree",
        &[&exe_s, "gdb-child", &mib, &o],
        DEADLINE,
    );
    let dump = std::fs::read(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    assert_eq!(
        dump.len() as u64,
        BUFFER_MIB << 20,
        "gdb dumped {} bytes of the buffer, not all of it (Cannot access memory?)",
        dump.len()
    );
    let bad = dump_bad_words(&dump);
    assert_eq!(bad, 0, "{bad} words of the buffer are wrong in gdb's dump");
    assert_eq!(run.status, 0, "gdb failed, or the program's own check did");
    assert!(run.stdout.contains("gdb exited 0; 0 bad words after it"));
    assert!(run.get("evicted_pages") >= PAGES / 2);
    assert!(
        run.get("held_for_trace") >= 1,
        "the traced process was not held"
    );
    assert!(
        run.get("hold_pages_restored") >= PAGES / 2,
        "the buffer was not evicted when gdb attached, or not brought back"
    );
    assert_eq!(run.get("agent_faults"), 0);
}

/// The same in a pid namespace below the daemon's (`unshare -pf --mount-proc`): the program is
/// pid 1 there,
/// and gdb's `PTRACE_ATTACH` names it so; the tracer's agent asks the daemon with that number,
/// which the daemon looks up in the tracer's namespace (in its own, 1 is another process): the
/// program is held before the attach, and every word is in gdb's dump.
#[test]
fn gdb_in_a_pid_namespace_reads_evicted_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("gdb") || !have("unshare") {
        return;
    }
    if !Command::new("unshare")
        .args(["-pf", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("SKIP: this machine refuses a new pid namespace bare (unshare -pf true)");
        return;
    }
    let exe = c_client("inspect");
    let exe_s = exe.to_string_lossy().into_owned();
    let mib = BUFFER_MIB.to_string();
    let out = std::env::temp_dir().join(format!("uffd-test-gdb-pidns-{}", std::process::id()));
    let o = out.to_string_lossy();
    let run = run_with_deadline(
        &["--limit", "16M"],
        "gdb-pidns",
        // (A /proc of its own: gdb reads /proc/1/mem, which in the daemon's is init's.)
        &[
            "unshare",
            "-pf",
            "--mount-proc",
            &exe_s,
            "gdb-child",
            &mib,
            &o,
        ],
        DEADLINE,
    );
    let dump = std::fs::read(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    assert!(
        run.stdout.starts_with("buffer ")
            && run.stdout.lines().next().is_some_and(|l| l.ends_with(" 1")),
        "the program is not pid 1 in its namespace: {}",
        run.stdout
    );
    assert_eq!(
        dump.len() as u64,
        BUFFER_MIB << 20,
        "gdb dumped {} bytes of the buffer, not all of it (Cannot access memory?): {}",
        dump.len(),
        run.stderr
    );
    let bad = dump_bad_words(&dump);
    assert_eq!(bad, 0, "{bad} words of the buffer are wrong in gdb's dump");
    assert_eq!(run.status, 0, "gdb failed, or the program's own check did");
    assert!(run.stdout.contains("gdb exited 0; 0 bad words after it"));
    assert!(run.get("evicted_pages") >= PAGES / 2);
    assert!(
        run.get("held_for_trace") >= 1,
        "the traced process was not held"
    );
    assert!(
        run.get("hold_pages_restored") >= PAGES / 2,
        "the buffer was not evicted when gdb attached, or not brought back"
    );
    assert_eq!(run.get("protocol_errors"), 0);
    assert_eq!(run.get("agent_faults"), 0);
}

/// A tracer from outside the daemon's tree (no agent: the daemon sees it in TracerPid):
/// PTRACE_ATTACH, then every word of the mostly evicted buffer read through /proc/PID/mem
/// (EIO retried for a while: the daemon sees such a tracer only a few milliseconds after its
/// attach) and a word of every page with PEEKDATA, a word written with POKEDATA into an
/// evicted page and into a page never touched, PTRACE_DETACH. The program then finds both
/// words and the rest of its buffer as they were, and fills as much again: paged again once
/// the tracer is gone.
#[test]
fn a_tracer_from_outside_the_tree_reads_and_writes_evicted_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let exe = c_client("inspect");
    let exe_s = exe.to_string_lossy().into_owned();
    let mib = BUFFER_MIB.to_string();
    let ready = std::env::temp_dir().join(format!("uffd-test-traced-{}", std::process::id()));
    let ready_s = ready.to_string_lossy().into_owned();
    let program = [exe_s.as_str(), "traced", &mib, &ready_s];

    // Runs `cmd` (the program, bare or under the daemon) and, once it is ready, the tracer;
    // then, under the daemon once the hold has ended (its counters, read with `stat`), lets the
    // program go on. Returns how it ended and the tracer's output.
    let traced = |cmd: Command, name: &str, daemon: bool| -> (Finished, String, bool) {
        let _ = std::fs::remove_file(&ready);
        let tracer_out = RefCell::new(String::new());
        let tracer_ok = Cell::new(false);
        let b = Bounded::spawn(cmd, name);
        let daemon_pid = b.pid();
        let done = b.wait_or_grace(
            DEADLINE,
            &|| {
                if !tracer_out.borrow().is_empty() {
                    return false;
                }
                let Ok(text) = std::fs::read_to_string(&ready) else {
                    return false;
                };
                let f: Vec<&str> = text.split_whitespace().collect();
                let out = Command::new(&exe)
                    .args(["tracer", f[2], f[0], f[1], f[3]])
                    .output()
                    .expect("running the tracer");
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                eprintln!("--- {name}: the tracer exited {:?}:\n{text}", out.status);
                tracer_ok.set(out.status.success());
                *tracer_out.borrow_mut() = text;
                if daemon {
                    wait_for_release(daemon_pid);
                }
                let pid: i32 = f[2].parse().expect("a pid");
                // SAFETY: kill(2) with integer arguments, to the program we started.
                unsafe { libc::kill(pid, libc::SIGUSR1) };
                false
            },
            Duration::ZERO,
        );
        let _ = std::fs::remove_file(&ready);
        (done, tracer_out.into_inner(), tracer_ok.get())
    };

    let mut bare_cmd = Command::new(&exe);
    bare_cmd.args(&program[1..]);
    let (bare, bare_tracer, bare_ok) = traced(bare_cmd, "traced-bare", false);
    assert!(bare_ok, "bare: the tracer failed:\n{bare_tracer}");
    assert_eq!(bare.status, 0, "bare: {}{}", bare.stdout, bare.stderr);

    let path = stats_path("traced");
    let (done, tracer, ok) = traced(
        daemon_command(&["--limit", LIMIT], &path, &program),
        "traced",
        true,
    );
    let run = finish_run("traced", done, &path);
    assert!(
        ok && tracer.contains("0 bad words read, 0 bad PEEKDATA, 0 bad POKEDATA"),
        "the tracer could not read or write the evicted memory:\n{tracer}"
    );
    assert_eq!(run.status, 0, "the program found its memory changed");
    assert!(run.stdout.contains("0 bad words after the tracer"));
    assert_eq!(
        run.get("held_for_trace"),
        1,
        "the traced process was not held"
    );
    assert!(
        run.get("hold_pages_restored") >= PAGES / 2,
        "the buffer was not evicted when the tracer came, or not brought back"
    );
    assert_eq!(
        run.get("trace_releases"),
        1,
        "the hold did not end with the trace"
    );
    // The second buffer, filled after the hold ended, was paged (the first, back in memory, was
    // managed again too; it was over the limit at that moment).
    assert!(
        run.get("evicted_pages") >= PAGES * 3 / 2,
        "nothing was evicted after the tracer left"
    );
    assert_eq!(run.get("agent_faults"), 0);
}

/// A process reading and writing its own memory through `/proc/self/mem`: every word of a
/// mostly evicted buffer read back, a write to a page never touched lands, and after the close
/// the process is paged again (the hold ends). Without the agent's hold the read failed with
/// `EIO` at the first evicted page.
#[test]
fn own_memory_file_reads_every_evicted_page() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let client = c_client("selfmem");
    let run = run_under("8M", "selfmem", &[client.to_str().unwrap()]);
    assert_eq!(run.status, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("read 33554432 of 33554432 bytes, 0 bad words; write to an untouched page: 8, reads back 42"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("after close: 0 bad"));
    assert_eq!(run.get("held_for_self_mem"), 1);
    assert_eq!(run.get("self_mem_releases"), 1);
    assert!(
        run.get("hold_pages_restored") > 1000,
        "little was evicted before the open"
    );
}
