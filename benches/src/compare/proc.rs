//! Processes: spawning a workload in its own process group, waiting for it with a deadline
//! (collecting its resource usage with `wait4`), killing its whole tree, the `__wrap` helper
//! that measures the workload's own process tree, and Ctrl-C handling.
//!
//! Ctrl-C and SIGTERM only set a flag: the driver polls it, kills its workload, and returns
//! through the guards that restore the machine's swap, zswap, zram and cgroup state. Workloads
//! run in their own process group, so the terminal's SIGINT does not reach them directly.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set the interrupted flag instead of killing the driver.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `on_signal` is an `extern "C" fn(c_int)` that only stores to an atomic, which
        // is async-signal-safe; replacing the disposition of these signals affects only this
        // process.
        unsafe {
            libc::signal(
                sig,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
}

/// True once Ctrl-C (or SIGTERM/SIGHUP) arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// CPU time and faults of a process (and its waited-for descendants).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Usage {
    /// User CPU seconds.
    pub user_s: f64,
    /// System CPU seconds.
    pub sys_s: f64,
    /// Major faults (`ru_majflt`).
    pub majflt: u64,
    /// Minor faults (`ru_minflt`).
    pub minflt: u64,
    /// Largest resident set of any one process, KiB.
    pub maxrss_kib: u64,
}

impl Usage {
    fn from_rusage(r: &libc::rusage) -> Self {
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Usage {
            user_s: secs(r.ru_utime),
            sys_s: secs(r.ru_stime),
            majflt: r.ru_majflt as u64,
            minflt: r.ru_minflt as u64,
            maxrss_kib: r.ru_maxrss as u64,
        }
    }
}

/// How a waited-for process ended.
#[derive(Debug, Clone)]
pub enum Ended {
    /// It exited (or was killed by a signal) on its own.
    Exited {
        /// Exit code, or `128 + signal`.
        code: i32,
        /// `wait4`'s usage: the process and all its descendants it waited for.
        usage: Usage,
    },
    /// The deadline passed; the tree was killed.
    TimedOut,
    /// Ctrl-C; the tree was killed.
    Interrupted,
}

fn decode_status(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        -1
    }
}

/// A spawned process (group leader of its own group).
#[derive(Debug)]
pub struct Spawned {
    /// Its pid (and process group id).
    pub pid: i32,
    /// When it was spawned.
    pub started: Instant,
    /// Exit code and usage once reaped (by `wait` or by `kill`).
    reaped: Option<(i32, Usage)>,
}

/// Spawns `argv` in a new process group, stdin from /dev/null, stdout and stderr to files.
pub fn spawn(argv: &[String], stdout: &Path, stderr: &Path) -> Result<Spawned> {
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(File::create(stdout).with_context(|| format!("create {}", stdout.display()))?)
        .stderr(File::create(stderr).with_context(|| format!("create {}", stderr.display()))?)
        .process_group(0)
        .spawn()
        .with_context(|| format!("spawn {}", argv[0]))?;
    // The `Child` is dropped without waiting: this module reaps it with `wait4`.
    Ok(Spawned {
        pid: child.id() as i32,
        started: Instant::now(),
        reaped: None,
    })
}

fn wait4(pid: i32, flags: libc::c_int) -> Option<(i32, Usage)> {
    let mut status = 0;
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `status` and `ru` are valid, writable, and live across the call.
    let r = unsafe { libc::wait4(pid, &mut status, flags, &mut ru) };
    (r == pid).then(|| (decode_status(status), Usage::from_rusage(&ru)))
}

/// All descendants of `pid` (from /proc), children before grandchildren.
fn descendants(pid: i32) -> Vec<i32> {
    let mut parent: HashMap<i32, Vec<i32>> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            // The command name may contain spaces and parentheses: fields start after the last ')'.
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            if let Some(pp) = rest
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse::<i32>().ok())
            {
                parent.entry(pp).or_default().push(p);
            }
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for &c in parent.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            out.push(c);
            todo.push(c);
        }
    }
    out
}

fn signal_tree(pid: i32, sig: libc::c_int) {
    let tree = descendants(pid);
    // SAFETY: kill(2) with a negative pid signals the process group this module created;
    // the other pids are the group leader's descendants found just above.
    unsafe {
        libc::kill(-pid, sig);
        libc::kill(pid, sig);
        for p in tree {
            libc::kill(p, sig);
        }
    }
}

impl Spawned {
    /// Waits until the process exits, `deadline` passes, or Ctrl-C. On deadline or Ctrl-C the
    /// whole tree is terminated (SIGTERM, then SIGKILL) and reaped.
    pub fn wait(&mut self, deadline: Instant) -> Ended {
        loop {
            if let Some((code, usage)) = self.reaped.or_else(|| wait4(self.pid, libc::WNOHANG)) {
                self.reaped = Some((code, usage));
                return Ended::Exited { code, usage };
            }
            let timed_out = Instant::now() >= deadline;
            if timed_out || interrupted() {
                self.kill();
                return if timed_out {
                    Ended::TimedOut
                } else {
                    Ended::Interrupted
                };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Terminates the tree and reaps the leader (a no-op once it was reaped).
    pub fn kill(&mut self) {
        if self.reaped.is_some() {
            return;
        }
        signal_tree(self.pid, libc::SIGTERM);
        let soft = Instant::now() + Duration::from_secs(3);
        while Instant::now() < soft && self.reaped.is_none() {
            self.reaped = wait4(self.pid, libc::WNOHANG);
            std::thread::sleep(Duration::from_millis(20));
        }
        // Whatever is left (the leader's group, or all of the tree if the leader still runs)
        // gets SIGKILL. Once the leader is reaped only its group is signalled: its pid may be
        // reused, its group id is not while members remain.
        if self.reaped.is_none() {
            signal_tree(self.pid, libc::SIGKILL);
            self.reaped = wait4(self.pid, 0);
        } else {
            // SAFETY: kill(2) of the process group this module created.
            unsafe { libc::kill(-self.pid, libc::SIGKILL) };
        }
        if self.reaped.is_none() {
            // wait4 failed (not our child any more): record a killed leader.
            self.reaped = Some((128 + libc::SIGKILL, Usage::default()));
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills what is left of a process group a previous run spawned (its driver was killed
/// outright): every process whose process group is `pgid`, provided one of them is a process
/// this driver starts (the daemon, `__wrap`, a workload). Returns how many were killed.
pub fn kill_leftover_group(pgid: i32) -> usize {
    let mut members = Vec::new();
    let mut ours = false;
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            // Fields after the name: state, ppid, pgrp.
            if rest
                .split_whitespace()
                .nth(2)
                .and_then(|s| s.parse::<i32>().ok())
                != Some(pgid)
            {
                continue;
            }
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            ours |= [
                "uffd-daemon",
                "__wrap",
                "__usemem",
                "stress-ng",
                "redis-server",
            ]
            .iter()
            .any(|n| cmd.contains(n));
            members.push(p);
        }
    }
    if !ours {
        return 0;
    }
    for &p in &members {
        // SAFETY: kill(2) of a member of the process group a previous run of this driver
        // created, identified by its recorded id and its command line.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    members.len()
}

/// What `__wrap` writes: the workload's own process tree, measured from inside the setup.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WrapReport {
    /// Wall time from spawning the program to its exit.
    pub wall_s: f64,
    /// Exit code of the program, or `128 + signal`.
    pub code: i32,
    /// `getrusage(RUSAGE_CHILDREN)` after waiting for the program.
    pub usage: Usage,
}

/// `__wrap OUT [--cgroup DIR] -- PROGRAM ARGS...`: joins the cgroup (if given), runs the
/// program, and writes its tree's CPU time and faults to OUT as JSON. Exits like the program.
pub fn wrap_main(args: &[String]) -> ExitCode {
    match wrap(args) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("compare __wrap: {e:#}");
            ExitCode::from(125)
        }
    }
}

fn wrap(args: &[String]) -> Result<i32> {
    let sep = args
        .iter()
        .position(|a| a == "--")
        .context("usage: __wrap OUT [--cgroup DIR] -- PROGRAM ARGS...")?;
    let (opts, prog) = (&args[..sep], &args[sep + 1..]);
    let out = opts.first().context("__wrap needs OUT")?;
    if let Some(i) = opts.iter().position(|a| a == "--cgroup") {
        let dir = opts.get(i + 1).context("--cgroup needs a directory")?;
        let procs = Path::new(dir).join("cgroup.procs");
        std::fs::write(&procs, format!("{}\n", std::process::id()))
            .with_context(|| format!("join {}", procs.display()))?;
    }
    let program = prog.first().context("__wrap needs a program")?;
    let t = Instant::now();
    let status = Command::new(program)
        .args(&prog[1..])
        .status()
        .with_context(|| format!("run {program}"))?;
    let wall_s = t.elapsed().as_secs_f64();
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is valid and writable for the call.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    let report = WrapReport {
        wall_s,
        code,
        usage: Usage::from_rusage(&ru),
    };
    std::fs::write(out, serde_json::to_string(&report)?).with_context(|| format!("write {out}"))?;
    Ok(code)
}
