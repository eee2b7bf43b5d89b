//! `compare`: one workload driver that runs the same programs under uffd-daemon's tier setups
//! and under the kernel's own swap, side by side in one run, and checks their data every time.
//!
//! ```text
//! cargo run --release -p bench --bin compare -- [--quick] [--json] [--limit 256M]
//!     [--workloads random,sequential,zipf,stress-ng,redis,threads] [--setups zswap,zswap+file,
//!     file,file-plain,pmem,default,default-plain,kswap,kzswap,kzswap-default,zram,bare]
//!     [--repeats N] [--out docs/plots] [--doc docs/kernel-comparison.md]
//!     [--daemon PATH | --no-build] [--threads-limit SIZE] [--threads-rounds N]
//! ```
//!
//! Repeats alternate the setups: round 1 runs every setup once, then round 2, and so on, so
//! that a noisy stretch of the shared machine falls on all setups alike; the tables give the
//! median of the rounds and, in the spread table, their min and max.
//!
//! * Daemon setups run `uffd-daemon run --limit L <tier flags> -- PROGRAM`; the tier flags of
//!   each setup are written in one place, [`setup::daemon_args`]. Before the runs each daemon
//!   setup is tried once on `/bin/true`: a setup whose flags the binary rejects is reported as
//!   unavailable (with the daemon's error) and the others run.
//! * Kernel setups put the workload into a cgroup v1 memory group with the same limit and turn
//!   on one swap area at a time (a swap file on the disk of /var/tmp; the same with zswap/lzo in
//!   front; zram). [`kernel::KernelSwap`] and [`kernel::Cgroup`] restore the machine on drop,
//!   Ctrl-C turns into an orderly stop, and a state file lets the next run undo a crashed one.
//! * Each workload runs under `compare __wrap`, which measures the workload's own process tree
//!   (`getrusage(RUSAGE_CHILDREN)`); for the daemon, `wait4` on the daemon minus that is the
//!   daemon's own CPU time, the work the kernel does in the workload's system time.
//!
//! Workloads: `random`, `sequential` and `zipf` ([`usemem`], every touch verifies the page),
//! `stress-ng` (`--vm 2 --vm-method rand-set --verify`), `redis` (redis-server filled with
//! checkable values by [`redis`], `redis-benchmark -t get`, every key read back and compared),
//! `threads` ([`threads`]: 32 threads' atomic adds and stripe stores on one malloc'd buffer,
//! the sum checked; run at a limit of a third of its bare peak, measured first).

pub mod hist;
pub mod kernel;
mod output;
pub mod proc;
pub mod redis;
pub mod run;
pub mod setup;
pub mod svg;
pub mod threads;
pub mod usemem;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use run::{Ctx, RunResult};
use setup::Setup;

/// Parses a size: a number with an optional K/M/G/T suffix (binary units; `B`/`iB` allowed).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad size {s:?}: allowed forms: 4096, 64K, 256M, 1.5G"))?;
    if !(n.is_finite() && n >= 0.0) {
        return Err(format!("bad size {s:?}"));
    }
    Ok((n * mult as f64) as u64)
}

/// A workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    /// usemem, uniform random pages.
    Random,
    /// usemem, uniform random pages, two threads each in half of the pages.
    Random2,
    /// usemem, uniform random pages, four threads each in a quarter of the pages.
    Random4,
    /// usemem, pages in order, wrapping.
    Sequential,
    /// usemem, Zipf(0.99) over page ranks, ranks scattered over the pages.
    Zipf,
    /// stress-ng's vm stressor with --verify.
    StressNg,
    /// redis-server, filled, benchmarked and read back.
    Redis,
    /// 32 threads: atomic adds at random words and stores to their stripes, sum checked.
    Threads,
}

/// Every workload, in run order.
pub const WORKLOADS: [Workload; 8] = [
    Workload::Random,
    Workload::Random2,
    Workload::Random4,
    Workload::Sequential,
    Workload::Zipf,
    Workload::StressNg,
    Workload::Redis,
    Workload::Threads,
];

/// The workloads run when `--workloads` is not given (`threads` is asked for by name: it needs
/// a bare calibration run and is read against `bare`).
pub const DEFAULT_WORKLOADS: [Workload; 5] = [
    Workload::Random,
    Workload::Sequential,
    Workload::Zipf,
    Workload::StressNg,
    Workload::Redis,
];

impl Workload {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Random => "random",
            Workload::Random2 => "random-2t",
            Workload::Random4 => "random-4t",
            Workload::Sequential => "sequential",
            Workload::Zipf => "zipf",
            Workload::StressNg => "stress-ng",
            Workload::Redis => "redis",
            Workload::Threads => "threads",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Result<Self, String> {
        WORKLOADS
            .iter()
            .copied()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown workload {s:?}; allowed: {}",
                    WORKLOADS.map(|w| w.name()).join(", ")
                )
            })
    }

    /// How many threads touch pages (usemem's `--touchers`).
    pub fn touchers(self) -> usize {
        match self {
            Workload::Random2 => 2,
            Workload::Random4 => 4,
            _ => 1,
        }
    }

    /// The unit of its throughput figure.
    pub fn unit(self) -> &'static str {
        match self {
            Workload::Random
            | Workload::Random2
            | Workload::Random4
            | Workload::Sequential
            | Workload::Zipf => "touches/s",
            Workload::StressNg => "bogo ops/s",
            Workload::Redis => "GET/s",
            Workload::Threads => "adds/s",
        }
    }

    /// True for the usemem workloads (one touch loop, a JSON line).
    pub fn is_usemem(self) -> bool {
        matches!(
            self,
            Workload::Random
                | Workload::Random2
                | Workload::Random4
                | Workload::Sequential
                | Workload::Zipf
        )
    }

    /// What its p50/p99 columns mean.
    pub fn latency_meaning(self) -> Option<&'static str> {
        match self {
            Workload::Random
            | Workload::Random2
            | Workload::Random4
            | Workload::Sequential
            | Workload::Zipf => Some("first access of touches that faulted (> 2 us)"),
            Workload::StressNg | Workload::Threads => None,
            Workload::Redis => Some("GET latency seen by redis-benchmark"),
        }
    }
}

/// Sizes and durations of one invocation.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The memory limit (daemon `--limit`, cgroup `memory.limit_in_bytes`).
    pub limit: u64,
    /// `--quick`.
    pub quick: bool,
    /// usemem's working set.
    pub usemem_bytes: u64,
    /// usemem's touch phase.
    pub usemem_seconds: f64,
    /// usemem verifies every page once more at the end.
    pub final_check: bool,
    /// stress-ng `--vm-bytes` (per worker).
    pub stress_bytes: u64,
    /// stress-ng `--timeout`.
    pub stress_seconds: u64,
    /// redis keys filled.
    pub redis_keys: u64,
    /// redis value size.
    pub redis_value_bytes: usize,
    /// redis-benchmark GET requests.
    pub redis_gets: u64,
    /// Longest one run may take before it is killed and reported as TIMEOUT.
    pub run_timeout: Duration,
    /// Size of the kernel's swap file / zram disk.
    pub swap_bytes: u64,
    /// kzswap `max_pool_percent` (the pool about as large as the limit).
    pub zswap_pool_percent: u32,
    /// `threads`: its buffer (4x the limit), threads and atomic adds per thread.
    pub threads_bytes: u64,
    /// `threads`: number of threads.
    pub threads_n: usize,
    /// `threads`: atomic adds per thread.
    pub threads_rounds: u64,
    /// `threads`: its bare peak RSS (measured by a calibration run), when measured.
    pub threads_peak: Option<u64>,
    /// `threads`: the limit it runs under (a third of its bare peak, or `--threads-limit`).
    pub threads_limit: Option<u64>,
    /// Which daemon ran: its path and the source it was built from.
    pub daemon_build: String,
}

impl Plan {
    fn new(limit: u64, quick: bool) -> Self {
        let ram = ram_bytes();
        let redis_ws = if quick { 3 * limit / 2 } else { 2 * limit };
        // About 2.7 KiB of redis memory per 2 KiB value (jemalloc's 2560-byte class, key,
        // object header and dict entry).
        let redis_keys = redis_ws / 2700;
        Plan {
            limit,
            quick,
            usemem_bytes: if quick { 2 * limit } else { 4 * limit },
            usemem_seconds: if quick { 2.0 } else { 5.0 },
            final_check: true,
            stress_bytes: 2 * limit,
            stress_seconds: if quick { 5 } else { 30 },
            redis_keys,
            redis_value_bytes: 2048,
            redis_gets: if quick {
                redis_keys / 4
            } else {
                redis_keys / 2
            },
            run_timeout: Duration::from_secs(if quick { 180 } else { 300 }),
            swap_bytes: (8 * limit).max(2 << 30),
            zswap_pool_percent: ((limit as f64 * 100.0 / ram as f64).round() as u32).max(1),
            threads_bytes: 4 * limit,
            threads_n: 32,
            threads_rounds: 16384,
            threads_peak: None,
            threads_limit: None,
            daemon_build: String::new(),
        }
    }

    /// The memory limit `w` runs under: `threads` at its own (a third of its peak), the others
    /// at `--limit`.
    pub fn limit_for(&self, w: Workload) -> u64 {
        match (w, self.threads_limit) {
            (Workload::Threads, Some(l)) => l,
            _ => self.limit,
        }
    }
}

fn ram_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(24 << 30, |kb| kb * 1024)
}

#[derive(Debug)]
struct Options {
    quick: bool,
    json: bool,
    limit: u64,
    workloads: Vec<Workload>,
    setups: Vec<Setup>,
    repeats: usize,
    out: PathBuf,
    doc: Option<PathBuf>,
    daemon: Option<PathBuf>,
    no_build: bool,
    seconds: Option<f64>,
    stress_seconds: Option<u64>,
    threads_limit: Option<u64>,
    threads_rounds: Option<u64>,
}

const USAGE: &str = "usage: compare [--quick] [--json] [--limit 256M] \
[--workloads random,sequential,zipf,stress-ng,redis,threads] \
[--setups zswap,zswap+file,file,file-plain,pmem,default,default-plain,kswap,kzswap,kzswap-default,zram,bare] \
[--repeats N] [--out docs/plots] [--doc docs/kernel-comparison.md] [--daemon PATH | --no-build] \
[--seconds S] [--stress-seconds S] [--threads-limit SIZE] [--threads-rounds N]";

fn parse_options(args: &[String]) -> Result<Options> {
    let mut o = Options {
        quick: false,
        json: false,
        limit: 256 << 20,
        workloads: DEFAULT_WORKLOADS.to_vec(),
        setups: setup::DEFAULT.to_vec(),
        repeats: 1,
        out: PathBuf::from("docs/plots"),
        doc: None,
        daemon: None,
        no_build: false,
        seconds: None,
        stress_seconds: None,
        threads_limit: None,
        threads_rounds: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .with_context(|| format!("{a} needs a value; {USAGE}"))
        };
        match a.as_str() {
            "--quick" => o.quick = true,
            "--json" => o.json = true,
            "--no-build" => o.no_build = true,
            "--limit" => o.limit = parse_size(val()?).map_err(anyhow::Error::msg)?,
            "--workloads" => {
                o.workloads = val()?
                    .split(',')
                    .map(Workload::parse)
                    .collect::<Result<_, _>>()
                    .map_err(anyhow::Error::msg)?
            }
            "--setups" => {
                o.setups = val()?
                    .split(',')
                    .map(Setup::parse)
                    .collect::<Result<_, _>>()
                    .map_err(anyhow::Error::msg)?
            }
            "--repeats" => o.repeats = val()?.parse().context("--repeats")?,
            "--out" => o.out = PathBuf::from(val()?),
            "--doc" => o.doc = Some(PathBuf::from(val()?)),
            "--daemon" => o.daemon = Some(PathBuf::from(val()?)),
            "--seconds" => o.seconds = Some(val()?.parse().context("--seconds")?),
            "--stress-seconds" => {
                o.stress_seconds = Some(val()?.parse().context("--stress-seconds")?)
            }
            "--threads-limit" => {
                o.threads_limit = Some(parse_size(val()?).map_err(anyhow::Error::msg)?)
            }
            "--threads-rounds" => {
                o.threads_rounds = Some(val()?.parse().context("--threads-rounds")?)
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}; {USAGE}"),
        }
    }
    if o.limit < 16 << 20 {
        bail!("--limit {} is below 16M", o.limit);
    }
    if o.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    Ok(o)
}

/// Entry point of the `compare` binary (also `__wrap` and `__usemem`).
pub fn main_with(args: &[String]) -> ExitCode {
    match args.first().map(String::as_str) {
        Some("__wrap") => return proc::wrap_main(&args[1..]),
        Some("__usemem") => return usemem::main_with(&args[1..]),
        _ => {}
    }
    match run_main(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("compare: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The daemon binary: `--daemon`, or built now with cargo into this binary's target directory.
fn find_daemon(o: &Options, self_exe: &Path) -> Result<PathBuf> {
    if let Some(d) = &o.daemon {
        return Ok(d.clone());
    }
    let profile_dir = self_exe.parent().context("binary directory")?;
    let target_dir = profile_dir.parent().context("target directory")?;
    let daemon = profile_dir.join("uffd-daemon");
    if !o.no_build {
        eprintln!(
            "compare: building uffd-daemon (cargo build --release -p uffd-daemon, target {})",
            target_dir.display()
        );
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release", "-p", "uffd-daemon", "--target-dir"])
            .arg(target_dir)
            .current_dir(workspace_root())
            .status()
            .context("run cargo")?;
        if !status.success() {
            if daemon.exists() {
                eprintln!(
                    "compare: WARNING: building uffd-daemon failed; using the existing {}",
                    daemon.display()
                );
            } else {
                bail!(
                    "building uffd-daemon failed and there is no {}",
                    daemon.display()
                );
            }
        }
    }
    if !daemon.exists() {
        bail!(
            "no daemon binary at {} (build it or pass --daemon PATH)",
            daemon.display()
        );
    }
    Ok(daemon)
}

/// Names the daemon binary and, when built here, the commit of its source (and whether
/// crates/uffd-daemon had uncommitted changes).
fn daemon_build(daemon: &Path, given: bool) -> String {
    if given {
        return format!("{} (given with --daemon)", daemon.display());
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(workspace_root())
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "?".into());
    let dirty = git(&["status", "--porcelain", "--", "crates"]).is_some_and(|s| !s.is_empty());
    format!(
        "{} built from commit {head}{}",
        daemon.display(),
        if dirty {
            " plus uncommitted changes under crates/"
        } else {
            ""
        }
    )
}

fn kernel_prerequisites(s: Setup) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (swapon, cgroup, zswap parameters)".into());
    }
    if !Path::new("/sys/fs/cgroup/memory").exists() {
        return Err("no cgroup v1 memory controller at /sys/fs/cgroup/memory".into());
    }
    match s {
        Setup::KernelZswap | Setup::KernelZswapDefault
            if !Path::new("/sys/module/zswap/parameters/enabled").exists() =>
        {
            Err("no zswap in this kernel".into())
        }
        Setup::KernelZram
            if !Path::new("/sys/class/zram-control").exists()
                && !Command::new("modprobe")
                    .arg("zram")
                    .status()
                    .is_ok_and(|s| s.success()) =>
        {
            Err("no zram (modprobe zram failed)".into())
        }
        _ => Ok(()),
    }
}

/// Takes the machine's comparison lock (`/var/tmp/uffd-compare.lock`, flock), waiting while
/// another driver holds it; held until the returned file is dropped.
fn machine_lock() -> Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let path = Path::new("/var/tmp/uffd-compare.lock");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut holder = String::new();
        let _ = f.read_to_string(&mut holder);
        eprintln!(
            "compare: another comparison is running (pid {}); waiting for it to end",
            holder.trim()
        );
        // SAFETY: as above.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("locking {}", path.display()));
        }
    }
    f.set_len(0)?;
    f.rewind()?;
    write!(f, "{}", std::process::id())?;
    Ok(f)
}

/// Scratch directory of the runs (on the disk of /var/tmp, like the swap files).
const WORKDIR: &str = "/var/tmp/uffd-compare-run";

fn run_main(args: &[String]) -> Result<ExitCode> {
    let o = parse_options(args)?;
    proc::install_signal_handlers();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    // One comparison at a time on a machine: the kernel setups change machine-wide settings
    // (swap, zswap's parameters, cgroups), and the leftovers of a previous run are found in
    // one scratch directory. A second driver waits for the first rather than undo its setup
    // and kill its workload as a leftover.
    let _lock = machine_lock()?;
    // A previous run killed outright may have left its workload (and daemon) running.
    if let Some(pgid) = std::fs::read_to_string(Path::new(WORKDIR).join(run::PGID_FILE))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
    {
        let n = proc::kill_leftover_group(pgid);
        if n > 0 {
            eprintln!(
                "compare: leftover from a previous run: killed {n} process(es) of group {pgid}"
            );
        }
    }
    if root {
        for what in kernel::recover_leftovers().context("undoing a previous run's leftovers")? {
            eprintln!("compare: leftover from a previous run: {what}");
        }
    }
    let self_exe = std::env::current_exe().context("current_exe")?;
    let mut plan = Plan::new(o.limit, o.quick);
    if let Some(s) = o.seconds {
        plan.usemem_seconds = s;
    }
    if let Some(s) = o.stress_seconds {
        plan.stress_seconds = s;
    }
    if let Some(r) = o.threads_rounds {
        plan.threads_rounds = r;
    }
    plan.threads_limit = o.threads_limit;
    let needs_daemon = o.setups.iter().any(|s| s.is_daemon());
    let daemon = if needs_daemon {
        find_daemon(&o, &self_exe)
    } else {
        Ok(PathBuf::new())
    };
    if let Ok(d) = &daemon {
        plan.daemon_build = daemon_build(d, o.daemon.is_some());
    }
    let workdir = PathBuf::from(WORKDIR);
    if workdir.exists() {
        std::fs::remove_dir_all(&workdir)
            .with_context(|| format!("clean {}", workdir.display()))?;
    }
    std::fs::create_dir_all(&workdir)?;
    let pmem_dir = PathBuf::from(if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    });
    let mut ctx = Ctx {
        self_exe,
        daemon: daemon.as_ref().cloned().unwrap_or_default(),
        workdir,
        pmem_dir,
        plan: plan.clone(),
    };

    // threads runs at a third of its peak: measure the peak bare first (not a result).
    if o.workloads.contains(&Workload::Threads) && o.threads_limit.is_none() {
        eprint!("compare: threads: measuring its bare peak ... ");
        let r = run::run_one(&ctx, Setup::Bare, Workload::Threads, 0, None)?;
        eprintln!("{}", output::one_line(&r, Workload::Threads));
        let peak_mib = r
            .metrics
            .get("maxrss_mib")
            .copied()
            .filter(|_| r.status == "ok")
            .with_context(|| {
                format!(
                    "the bare calibration run of threads failed: {}",
                    r.reason.as_deref().unwrap_or("no peak RSS")
                )
            })?;
        let peak = (peak_mib * (1 << 20) as f64) as u64;
        // A third of the peak, rounded up to a MiB.
        let limit = (peak / 3).div_ceil(1 << 20) << 20;
        eprintln!(
            "compare: threads: bare peak {peak_mib:.1} MiB; it runs at a limit of {} MiB",
            limit >> 20
        );
        plan.threads_peak = Some(peak);
        plan.threads_limit = Some(limit);
        ctx.plan = plan.clone();
    }

    // Which setups can run here.
    let mut unavailable: Vec<(Setup, String)> = Vec::new();
    for &s in &o.setups {
        let verdict = if s.is_daemon() {
            match &daemon {
                Err(e) => Err(format!("{e:#}")),
                Ok(_) => run::probe_daemon_setup(&ctx, s),
            }
        } else if s.is_kernel() {
            kernel_prerequisites(s)
        } else {
            Ok(())
        };
        match verdict {
            Ok(()) => eprintln!("compare: setup {:<14} available", s.name()),
            Err(why) => {
                eprintln!("compare: setup {:<14} UNAVAILABLE: {why}", s.name());
                unavailable.push((s, why));
            }
        }
    }

    let mut results: Vec<RunResult> = Vec::new();
    let total = o.repeats * o.setups.len() * o.workloads.len();
    let mut n = 0;
    'all: for rep in 0..o.repeats {
        for &s in &o.setups {
            if let Some((_, why)) = unavailable.iter().find(|(u, _)| *u == s) {
                if rep == 0 {
                    results.extend(
                        o.workloads
                            .iter()
                            .map(|&w| RunResult::unavailable(w, s, why)),
                    );
                }
                n += o.workloads.len();
                continue;
            }
            let kswap = if !s.is_kernel() {
                None
            } else {
                match kernel::KernelSwap::activate(s, plan.swap_bytes, plan.zswap_pool_percent) {
                    Ok(k) => Some(k),
                    Err(e) => {
                        let why = format!("activating failed: {e:#}");
                        eprintln!("compare: setup {} UNAVAILABLE: {why}", s.name());
                        results.extend(
                            o.workloads
                                .iter()
                                .map(|&w| RunResult::unavailable(w, s, &why)),
                        );
                        unavailable.push((s, why));
                        n += o.workloads.len();
                        continue;
                    }
                }
            };
            for &w in &o.workloads {
                if proc::interrupted() {
                    break 'all;
                }
                n += 1;
                eprint!(
                    "compare: [{n}/{total}] {:<10} under {:<14} ... ",
                    w.name(),
                    s.name()
                );
                let r = run::run_one(&ctx, s, w, rep, kswap.as_ref())?;
                eprintln!("{}", output::one_line(&r, w));
                results.push(r);
            }
            if let Some(k) = kswap {
                k.deactivate()
                    .with_context(|| format!("restoring the machine after {}", s.name()))?;
            }
        }
    }
    let interrupted = proc::interrupted();
    // Scratch files go; the directory stays only when it holds outputs of failed runs.
    if let Ok(rd) = std::fs::read_dir(&ctx.workdir) {
        for e in rd.flatten() {
            if !e.file_name().to_string_lossy().starts_with("failed-") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(&ctx.workdir);

    let rows = output::aggregate(&results, &o.workloads, &o.setups);
    let table = format!(
        "{}\nMedians with [min, max] over the rounds; x bare = elapsed / bare's median \
         elapsed:\n\n{}\nThe daemon's readahead (pages):\n\n{}",
        output::table(&rows, &o.workloads),
        output::spread_table(&rows),
        output::readahead_table(&rows)
    );
    let command = output::command_line(args);
    if o.json {
        eprintln!("{table}");
        let doc = output::json(&command, &plan, &rows, &results, &unavailable);
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("{table}");
    }
    std::fs::create_dir_all(&o.out).with_context(|| format!("create {}", o.out.display()))?;
    for &w in &o.workloads {
        let path = o.out.join(format!("{}.svg", w.name()));
        std::fs::write(&path, output::plot(w, &rows, &plan))
            .with_context(|| format!("write {}", path.display()))?;
        eprintln!("compare: wrote {}", path.display());
    }
    if let Some(doc) = &o.doc {
        output::write_doc(
            doc,
            &o.out,
            &command,
            &plan,
            &rows,
            &o.workloads,
            &unavailable,
        )?;
        eprintln!("compare: wrote {}", doc.display());
    }
    if interrupted {
        eprintln!("compare: interrupted; machine state restored");
        return Ok(ExitCode::from(130));
    }
    let bad = results
        .iter()
        .filter(|r| r.status == "FAILED" || r.status == "TIMEOUT")
        .count();
    if bad > 0 {
        eprintln!("compare: {bad} run(s) FAILED or timed out (see the table's status and reason)");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn options_parse() {
        let a: Vec<String> = [
            "--quick",
            "--limit",
            "128M",
            "--setups",
            "kswap,zswap",
            "--workloads",
            "redis",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let o = parse_options(&a).unwrap();
        assert!(o.quick);
        assert_eq!(o.limit, 128 << 20);
        assert_eq!(o.setups, vec![Setup::KernelSwap, Setup::DaemonZswap]);
        assert_eq!(o.workloads, vec![Workload::Redis]);
        assert!(parse_options(&["--setups".to_string(), "bogus".to_string()]).is_err());
    }
}
