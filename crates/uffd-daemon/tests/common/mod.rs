//! What the daemon's integration tests share: running the daemon in front of a program and
//! reading its counters.
#![allow(dead_code)] // each test binary uses part of it

pub mod cluster;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const DAEMON: &str = env!("CARGO_BIN_EXE_uffd-daemon");

/// One daemon at a time: the machine has two cores and the tests measure nothing.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn can_run() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
        .is_ok();
    if !root && !dev {
        eprintln!("SKIP: needs root or read/write access to /dev/userfaultfd");
    }
    root || dev
}

pub fn have(program: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        eprintln!("SKIP: {program} is not installed (.ci/run installs it)");
    }
    found
}

pub fn stats_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("uffd-test-{name}-{}.json", std::process::id()))
}

pub struct Run {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
    pub stats: serde_json::Value,
    /// The run did not end by its deadline and was killed (`status` is then 128 + SIGKILL).
    pub timed_out: bool,
    /// For a run killed at its deadline: where each of its threads waited then.
    pub hung_in: String,
}

impl Run {
    pub fn get(&self, key: &str) -> u64 {
        self.stats[key]
            .as_u64()
            .unwrap_or_else(|| panic!("stats lack {key}: {}", self.stats))
    }
}

/// How long `run_with` lets a run go before it kills it: only a guard against a hang.
pub const HANG_GUARD: Duration = Duration::from_secs(600);

pub fn run_under(limit: &str, name: &str, program: &[&str]) -> Run {
    run_with(&["--limit", limit], name, program)
}

/// Runs `program` under `uffd-daemon run ARGS`.
pub fn run_with(args: &[&str], name: &str, program: &[&str]) -> Run {
    run_with_deadline(args, name, program, HANG_GUARD)
}

/// Runs `program` under `uffd-daemon run ARGS`, killing the daemon and everything it started
/// if it has not ended after `timeout`.
pub fn run_with_deadline(args: &[&str], name: &str, program: &[&str], timeout: Duration) -> Run {
    let path = stats_path(name);
    let done = Bounded::spawn(daemon_command(args, &path, program), name).wait(timeout);
    finish_run(name, done, &path)
}

/// `uffd-daemon run ARGS --stats-json STATS -- PROGRAM`, with no stale `STATS` left.
pub fn daemon_command(args: &[&str], stats: &Path, program: &[&str]) -> Command {
    let _ = std::fs::remove_file(stats);
    let mut cmd = Command::new(DAEMON);
    cmd.arg("run")
        .args(args)
        .arg("--stats-json")
        .arg(stats)
        .arg("--")
        .args(program);
    cmd
}

/// The `Run` of a `daemon_command` that has ended: its output and its counters (`Null` if the
/// daemon wrote none).
pub fn finish_run(name: &str, done: Finished, stats: &Path) -> Run {
    let run = Run {
        status: done.status,
        stdout: done.stdout,
        stderr: done.stderr,
        stats: take_stats(stats),
        timed_out: done.timed_out,
        hung_in: done.hung_in,
    };
    eprintln!(
        "--- {name}: status {}{}\nstdout:\n{}\nstderr:\n{}\nstats: {}",
        run.status,
        if run.timed_out {
            " (killed at its deadline)"
        } else {
            ""
        },
        run.stdout,
        run.stderr,
        run.stats
    );
    run
}

/// The counters a daemon wrote with `--stats-json PATH` (`Null` if it wrote none); the file
/// is removed.
pub fn take_stats(path: &Path) -> serde_json::Value {
    // (Empty when the daemon did not get to write it: it creates the file at start, to refuse
    // a path it cannot write before the program runs.)
    let stats = std::fs::read_to_string(path)
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| serde_json::from_str(&s).expect("stats JSON"))
        .unwrap_or(serde_json::Value::Null);
    let _ = std::fs::remove_file(path);
    stats
}

/// Runs `program` without the daemon, as `run_with_deadline` runs it under it.
pub fn run_bare(name: &str, program: &[&str], timeout: Duration) -> Finished {
    let mut cmd = Command::new(program[0]);
    cmd.args(&program[1..]);
    let done = Bounded::spawn(cmd, name).wait(timeout);
    eprintln!(
        "--- {name} (bare): status {}{}, peak RSS {} KiB\nstdout:\n{}\nstderr:\n{}",
        done.status,
        if done.timed_out {
            " (killed at its deadline)"
        } else {
            ""
        },
        done.peak_rss >> 10,
        done.stdout,
        done.stderr
    );
    done
}

/// A process that `Bounded` ran to its end or killed at its deadline.
pub struct Finished {
    /// The exit status, or 128 + N for signal N (as the daemon reports its program's).
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
    /// Bytes: the largest high-water mark of resident memory (VmHWM) of a process of its
    /// group, sampled every 10 ms (not their sum). Not `wait4`'s `ru_maxrss`: a program that
    /// std starts through vfork inherits at exec the test process's own high-water mark.
    pub peak_rss: u64,
    pub timed_out: bool,
    /// For a run killed at its deadline: where each of its threads waited then.
    pub hung_in: String,
}

/// A process started in a process group of its own, its output going to files (a descendant
/// that keeps a pipe open cannot make the reader hang), its group's peak resident memory
/// sampled while it runs, and killed with its whole group at a deadline.
pub struct Bounded {
    pid: i32,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Bounded {
    #[allow(
        clippy::zombie_processes,
        reason = "reaped by `wait` with waitpid, beside its sampling; never through `Child`"
    )]
    pub fn spawn(mut cmd: Command, name: &str) -> Bounded {
        let dir = std::env::temp_dir();
        let tag = format!("{name}-{}", std::process::id());
        let stdout = dir.join(format!("uffd-test-{tag}.out"));
        let stderr = dir.join(format!("uffd-test-{tag}.err"));
        let file = |p: &PathBuf| std::fs::File::create(p).expect("creating an output file");
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(file(&stdout))
            .stderr(file(&stderr))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        Bounded {
            pid: child.id() as i32,
            stdout,
            stderr,
        }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn wait(self, timeout: Duration) -> Finished {
        self.wait_or_grace(timeout, &|| false, Duration::ZERO)
    }

    /// `wait`, with a shorter deadline once `over()` holds (the program's work is over, as its
    /// own report says): `grace` after that, for a program that does not exit.
    pub fn wait_or_grace(
        self,
        timeout: Duration,
        over: &dyn Fn() -> bool,
        grace: Duration,
    ) -> Finished {
        let mut deadline = Instant::now() + timeout;
        let mut seen_over = false;
        let mut st: libc::c_int = 0;
        let mut peak_rss = 0;
        let mut timed_out = false;
        let mut hung_in = String::new();
        loop {
            peak_rss = peak_rss.max(group_peak_rss(self.pid));
            // SAFETY: waitpid of our own child with a valid status pointer.
            let r = unsafe { libc::waitpid(self.pid, &mut st, libc::WNOHANG) };
            if r == self.pid {
                break;
            }
            assert!(
                r == 0,
                "waitpid({}): {}",
                self.pid,
                std::io::Error::last_os_error()
            );
            if !seen_over && over() {
                seen_over = true;
                deadline = deadline.min(Instant::now() + grace);
            }
            if Instant::now() >= deadline {
                timed_out = true;
                hung_in = wait_channels(self.pid);
                // SAFETY: kill(2) of the process group we created; then a blocking waitpid.
                unsafe {
                    libc::kill(-self.pid, libc::SIGKILL);
                    libc::waitpid(self.pid, &mut st, 0);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Whatever the group left behind (a daemon's program, their descendants) goes too.
        // SAFETY: kill(2) of the process group we created.
        unsafe { libc::kill(-self.pid, libc::SIGKILL) };
        let status = if libc::WIFEXITED(st) {
            libc::WEXITSTATUS(st)
        } else {
            128 + libc::WTERMSIG(st)
        };
        let read = |p: &PathBuf| {
            let text = String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
            let _ = std::fs::remove_file(p);
            text
        };
        Finished {
            status,
            stdout: read(&self.stdout),
            stderr: read(&self.stderr),
            peak_rss,
            timed_out,
            hung_in,
        }
    }
}

/// The processes of process group `pgid`: (pid, command name) each, from /proc.
fn group_members(pgid: i32) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let comm = &stat[stat.find('(').map_or(0, |i| i + 1)..close];
        if stat[close + 1..].split_whitespace().nth(2) == Some(&pgid.to_string()) {
            found.push((pid, comm.to_string()));
        }
    }
    found
}

/// The largest high-water mark of resident memory (VmHWM, bytes) among the processes of
/// process group `pgid`.
fn group_peak_rss(pgid: i32) -> u64 {
    group_members(pgid)
        .iter()
        .filter_map(|(pid, _)| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib << 10)
        })
        .max()
        .unwrap_or(0)
}

/// Where the threads of process group `pgid` wait, from /proc: "pid/tid comm: wchan" each.
fn wait_channels(pgid: i32) -> String {
    let mut found = Vec::new();
    for (pid, comm) in group_members(pgid) {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"));
        for task in tasks.into_iter().flatten().flatten() {
            let tid = task.file_name().to_string_lossy().into_owned();
            let wchan = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/wchan"))
                .unwrap_or_default();
            found.push(format!("{pid}/{tid} {comm}: {wchan}"));
        }
    }
    found.join(", ")
}

pub fn assert_paged(run: &Run, limit_bytes: u64) {
    let limit_pages = limit_bytes / 4096;
    assert_paged_within(run, limit_bytes, limit_pages / 6 + 64);
}

/// The daemon's own count of its metadata: the parts add up, and the whole stays a small
/// fraction of the managed memory (a loose guard: 3% of it plus 4 MiB of fixed parts; measured
/// 0.6-1.5% on the comparison workloads, ARCHITECTURE.md, metadata).
pub fn assert_metadata(run: &Run) {
    let total = run.get("daemon_metadata_max_bytes");
    let managed = run.get("daemon_metadata_managed_pages");
    assert!(total > 0 && managed > 0, "no metadata sample");
    let parts: u64 = ["pagetable", "policy", "slots", "zswap"]
        .iter()
        .map(|p| run.get(&format!("daemon_metadata_{p}_bytes")))
        .sum();
    assert_eq!(parts, total, "the metadata parts do not add up");
    let bound = managed * 4096 * 3 / 100 + (4 << 20);
    assert!(
        total <= bound,
        "metadata {total} bytes for {managed} managed pages (bound {bound})"
    );
}

/// Every agent thread named itself, none of them touched memory the daemon manages (such a
/// fault can wait for the reclaim that waits for the agent), and every DROP was answered.
pub fn assert_agents(run: &Run) {
    assert!(
        run.get("agent_threads") >= 1,
        "no agent thread named itself"
    );
    assert_eq!(
        run.get("agent_faults"),
        0,
        "an agent thread faulted on managed memory"
    );
    assert_eq!(
        run.get("drop_timeouts"),
        0,
        "an agent did not answer a DROP"
    );
    assert_eq!(
        run.get("agents_lost"),
        0,
        "an agent's connection failed while its process lived on"
    );
}

/// The checker, `tests/clients/checker.c` (built by [`c_client`]): kernel-mode faults, fork,
/// mremap, munmap and MADV_DONTNEED over evicted pages, every page compared after every step;
/// `checker all` exits 0 only when all matched, `checker hold` prints `READY <pid>` and verifies
/// its memory in a loop.
pub fn checker() -> String {
    c_client("checker").to_string_lossy().into_owned()
}

/// Builds `tests/clients/NAME.c` with the system C compiler (once per test binary run) and
/// returns the executable's path.
pub fn c_client(name: &str) -> PathBuf {
    c_client_with(name, "")
}

/// [`c_client`] linked statically (`gcc -static`): a program the agent cannot load into.
pub fn c_client_static(name: &str) -> PathBuf {
    c_client_with(name, "-static")
}

fn c_client_with(name: &str, flag: &str) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(format!("{name}.c"));
    let out = std::env::temp_dir().join(format!(
        "uffd-test-client-{name}{flag}-{}",
        std::process::id()
    ));
    if !out.exists() {
        let st = Command::new("cc")
            .args(["-O2", "-g", "-pthread", "-Wall", "-Werror"])
            .args((!flag.is_empty()).then_some(flag))
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .status()
            .expect("running cc");
        assert!(st.success(), "building {}", src.display());
    }
    out
}

/// `assert_paged` with an explicit slack above the limit, in pages.
pub fn assert_paged_within(run: &Run, limit_bytes: u64, slack_pages: u64) {
    for key in [
        "faults",
        "zero_fills",
        "evicted_pages",
        "bytes_written",
        "bytes_read",
        "resident_pages_max",
    ] {
        assert!(
            run.stats.get(key).is_some(),
            "--stats-json lacks the key {key}"
        );
    }
    assert!(run.get("evicted_pages") > 0, "nothing was evicted");
    assert_metadata(run);
    assert_agents(run);
    assert!(
        run.get("bytes_written") > 0 && run.get("bytes_read") > 0,
        "nothing went through the swap file"
    );
    assert!(run.get("faults") > 0);
    // The limit holds. Slack: memory that glibc's malloc maps internally (not through the
    // agent's mmap wrapper) and fills at once is resident before the scanner registers it
    // (it polls RssAnon every 2 ms), and it counts from then on; a large table can land a few
    // MiB above the limit for a moment before reclaim catches up (ARCHITECTURE.md).
    let limit_pages = limit_bytes / 4096;
    assert!(
        run.get("resident_pages_max") <= limit_pages + slack_pages,
        "resident pages peaked at {} for a limit of {limit_pages}",
        run.get("resident_pages_max")
    );
}

/// The Python interpreter itself, not a version manager's shell shim (the shim's forks of a
/// shell would count their copy-on-write pages twice; see ARCHITECTURE.md, accounting).
pub fn real_python() -> String {
    let real = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    String::from_utf8_lossy(&real.stdout).trim().to_string()
}

/// What one redis-server session gave: the server's end, the client's report and the
/// daemon's counters (`Null` for a bare server).
pub struct RedisSession {
    pub server: Finished,
    pub client_ok: bool,
    pub report: String,
    pub stats: serde_json::Value,
}

/// redis-server, bare (`daemon_args` `None`) or under `uffd-daemon run ARGS`, filled with
/// `keys` keys of 2 KiB whose values derive from their names; every key is read back over RESP
/// and compared, then the client shuts the server down. Asserts nothing.
pub fn redis_session(daemon_args: Option<&[&str]>, name: &str, keys: usize) -> RedisSession {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
        .to_string();
    let path = stats_path(name);
    let server = [
        "redis-server",
        "--port",
        &port,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "yes",
    ];
    let cmd = match daemon_args {
        Some(args) => daemon_command(args, &path, &server),
        None => {
            let mut cmd = Command::new(server[0]);
            cmd.args(&server[1..]);
            cmd
        }
    };
    let server = Bounded::spawn(cmd, name);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/redis_fill_check.py"
    );
    let client = Command::new(real_python())
        .args([script, &port, &keys.to_string(), "2048"])
        .output()
        .expect("running the redis client");
    let report = String::from_utf8_lossy(&client.stdout).into_owned();
    eprintln!("{report}{}", String::from_utf8_lossy(&client.stderr));
    // The client has shut the server down (or failed): the deadline only guards a hang.
    let server = server.wait(Duration::from_secs(60));
    let stats = take_stats(&path);
    eprintln!(
        "--- {name}: server status {}{}, peak RSS {} KiB\nstderr:\n{}\nstats: {stats}",
        server.status,
        if server.timed_out {
            " (killed at its deadline)"
        } else {
            ""
        },
        server.peak_rss >> 10,
        server.stderr
    );
    RedisSession {
        server,
        client_ok: client.status.success(),
        report,
        stats,
    }
}

/// redis-server under `uffd-daemon run ARGS`, filled with `keys` keys of 2 KiB whose values
/// derive from their names; every key is read back over RESP and compared. Asserts the data
/// and returns the daemon's counters.
pub fn redis_under(args: &[&str], name: &str, keys: usize) -> Run {
    let s = redis_session(Some(args), name, keys);
    assert!(s.client_ok, "the redis data did not verify");
    assert!(
        s.report
            .contains(&format!("{keys} keys of 2048 bytes, dbsize {keys}, 0 bad")),
        "redis: {}",
        s.report
    );
    assert!(
        s.server.status == 0 && !s.server.timed_out,
        "redis-server exited with {}",
        s.server.status
    );
    Run {
        status: 0,
        stdout: s.report,
        stderr: s.server.stderr,
        stats: s.stats,
        timed_out: false,
        hung_in: String::new(),
    }
}

/// The pinned-memory runs (`tests/clients/pinned.c`): an 8 MiB buffer the kernel writes
/// through a pin, 64 MiB of other memory paged through a 16 MiB limit.
pub const PINNED_LIMIT: &str = "16M";
pub const PINNED_LIMIT_BYTES: u64 = 16 << 20;
pub const PINNED_BUF_PAGES: u64 = (8 << 20) / 4096;

/// Runs `pinned MODE 8 64 ROUNDS` (`exe`: the dynamic or the static build) bare and under the
/// daemon: the data is checked word by word in both, and both print the same lines. Returns
/// the run under the daemon.
pub fn pinned_run(exe: &Path, name: &str, mode: &str, rounds: u32) -> Run {
    let exe = exe.to_string_lossy().into_owned();
    let rounds = rounds.to_string();
    let argv = [exe.as_str(), mode, "8", "64", &rounds];
    let bare = run_bare(&format!("{name}-bare"), &argv, Duration::from_secs(300));
    assert_eq!(bare.status, 0, "the program fails bare: {}", bare.stderr);
    let run = run_with(&["--limit", PINNED_LIMIT], name, &argv);
    let want = format!("{mode}: {rounds} rounds, 8 MiB buffer, 0 bad words, 0 failed reads");
    assert!(
        run.stdout.contains(&want) && run.stdout.contains("other: 64 MiB, 0 bad words"),
        "writes that arrived through a pin were lost (or other memory was wrong): {}{}",
        run.stdout,
        run.stderr
    );
    assert_eq!(run.stdout, bare.stdout, "the output differs from bare");
    assert_eq!(run.status, 0);
    run
}

/// Reclaim did not keep choosing the pinned pages, storing them and having them refused
/// (`evict_aborts`: every refusal is one). Before pinned pages were set aside, an 8 MiB fixed
/// buffer was refused 183 154 times in a 40-round run, about 90 times a page.
pub fn assert_pinned_churn_bounded(run: &Run) {
    let aborts = run.get("evict_aborts");
    assert!(
        aborts <= 8 * PINNED_BUF_PAGES,
        "{aborts} evictions given up for a {PINNED_BUF_PAGES}-page pinned buffer: reclaim \
         keeps choosing pinned pages (evicted_pages {})",
        run.get("evicted_pages")
    );
}
