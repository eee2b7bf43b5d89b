//! The kernel's own swap as the baseline: a cgroup v1 memory limit for the workload, and one
//! swap setup at a time (a swap file, zswap in front of it, or zram), always undone.
//!
//! Every change to global state is recorded in a state file before it is made, so a run that
//! was killed (SIGKILL, a crash, a reboot-less power cut of the driver) is undone by the next
//! run's [`recover_leftovers`]. [`KernelSwap`] and [`Cgroup`] undo their changes in `Drop`, so
//! an error, a panic or Ctrl-C (which the driver turns into an error) restores the machine.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::setup::Setup;

/// Records what this driver changed, for recovery after a crash.
pub const STATE_FILE: &str = "/var/tmp/uffd-compare.state";
/// The kernel setups' swap file (same disk as the daemon's files in /var/tmp).
pub const SWAP_FILE: &str = "/var/tmp/uffd-compare.swap";
/// The workload's memory cgroup (v1).
pub const CGROUP: &str = "/sys/fs/cgroup/memory/uffd-compare";
const ZSWAP: &str = "/sys/module/zswap/parameters";

/// zswap's module parameters this driver changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZswapParams {
    /// `enabled` (Y/N).
    pub enabled: String,
    /// `compressor`.
    pub compressor: String,
    /// `max_pool_percent`.
    pub max_pool_percent: String,
}

impl ZswapParams {
    /// Reads the current parameters.
    pub fn read() -> Result<Self> {
        let r = |n: &str| -> Result<String> {
            Ok(fs::read_to_string(format!("{ZSWAP}/{n}"))
                .with_context(|| format!("read zswap {n}"))?
                .trim()
                .to_string())
        };
        Ok(Self {
            enabled: r("enabled")?,
            compressor: r("compressor")?,
            max_pool_percent: r("max_pool_percent")?,
        })
    }

    /// Writes them back: the pool settings first, `enabled` last.
    fn write(&self) -> Result<()> {
        write_sys(&format!("{ZSWAP}/compressor"), &self.compressor)?;
        write_sys(&format!("{ZSWAP}/max_pool_percent"), &self.max_pool_percent)?;
        write_sys(&format!("{ZSWAP}/enabled"), &self.enabled)
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct ZramState {
    dev: u32,
    hot_added: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    swap_file: Option<String>,
    zram: Option<ZramState>,
    zswap_prior: Option<ZswapParams>,
}

impl State {
    fn persist(&self) -> Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(STATE_FILE)
            .with_context(|| format!("write {STATE_FILE}"))?;
        f.write_all(serde_json::to_string(self)?.as_bytes())?;
        f.sync_all()?;
        Ok(())
    }
}

fn write_sys(path: &str, value: &str) -> Result<()> {
    fs::write(path, value).with_context(|| format!("write {value:?} to {path}"))
}

fn run(cmd: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("run {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The active swap areas (paths from /proc/swaps).
pub fn active_swaps() -> Vec<String> {
    fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

fn swapoff_if_active(path: &str) -> Result<()> {
    if active_swaps().iter().any(|s| s == path) {
        run("swapoff", &[path])?;
    }
    Ok(())
}

fn zram_teardown(z: &ZramState) -> Result<()> {
    let dev = format!("/dev/zram{}", z.dev);
    swapoff_if_active(&dev)?;
    let sys = format!("/sys/block/zram{}", z.dev);
    if Path::new(&sys).exists() {
        write_sys(&format!("{sys}/reset"), "1")?;
        if z.hot_added {
            write_sys("/sys/class/zram-control/hot_remove", &z.dev.to_string())?;
        }
    }
    Ok(())
}

/// Undoes the changes of a previous run that did not finish (from the state file, plus our
/// swap file and cgroup if present). Returns what was undone.
pub fn recover_leftovers() -> Result<Vec<String>> {
    let mut done = Vec::new();
    if Path::new(CGROUP).exists() {
        remove_cgroup(Path::new(CGROUP))?;
        done.push(format!("removed cgroup {CGROUP}"));
    }
    if let Ok(text) = fs::read_to_string(STATE_FILE) {
        let st: State = serde_json::from_str(&text).unwrap_or_default();
        if let Some(f) = &st.swap_file {
            swapoff_if_active(f)?;
            done.push(format!("swapoff {f}"));
        }
        if let Some(z) = &st.zram {
            zram_teardown(z)?;
            done.push(format!("reset zram{}", z.dev));
        }
        if let Some(p) = &st.zswap_prior {
            p.write()?;
            done.push(format!(
                "zswap restored to enabled={} compressor={}",
                p.enabled, p.compressor
            ));
        }
        fs::remove_file(STATE_FILE)?;
    }
    if active_swaps().iter().any(|s| s == SWAP_FILE) {
        run("swapoff", &[SWAP_FILE])?;
        done.push(format!("swapoff {SWAP_FILE}"));
    }
    if Path::new(SWAP_FILE).exists() {
        fs::remove_file(SWAP_FILE)?;
        done.push(format!("removed {SWAP_FILE}"));
    }
    Ok(done)
}

/// One kernel swap setup, active while this value lives.
#[derive(Debug)]
pub struct KernelSwap {
    setup: Setup,
    state: State,
    /// The swap device or file in use.
    pub device: String,
    /// zram's compressor, when zram.
    pub zram_comp: Option<String>,
}

impl KernelSwap {
    /// Activates `setup` with a swap area of `swap_bytes`; for kzswap the pool is limited to
    /// `zswap_pool_percent` of RAM. Refuses if any swap is already active.
    pub fn activate(setup: Setup, swap_bytes: u64, zswap_pool_percent: u32) -> Result<Self> {
        let active = active_swaps();
        if !active.is_empty() {
            bail!(
                "swap already active ({}): refusing to add another; swapoff it first",
                active.join(", ")
            );
        }
        let mut ks = KernelSwap {
            setup,
            state: State::default(),
            device: String::new(),
            zram_comp: None,
        };
        // zswap: on for kzswap, off for the others, restored on drop.
        let prior = ZswapParams::read()?;
        ks.state.zswap_prior = Some(prior.clone());
        ks.state.persist()?;
        let want = if setup == Setup::KernelZswap {
            ZswapParams {
                enabled: "Y".into(),
                compressor: "lzo".into(),
                max_pool_percent: zswap_pool_percent.to_string(),
            }
        } else {
            ZswapParams {
                enabled: "N".into(),
                ..prior.clone()
            }
        };
        if want != prior {
            // Disable first so the compressor change applies to a fresh pool.
            write_sys(&format!("{ZSWAP}/enabled"), "N")?;
            want.write()?;
        }
        match setup {
            Setup::KernelSwap | Setup::KernelZswap => {
                ks.state.swap_file = Some(SWAP_FILE.into());
                ks.state.persist()?;
                let _ = fs::remove_file(SWAP_FILE);
                let f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(SWAP_FILE)
                    .with_context(|| format!("create {SWAP_FILE}"))?;
                // SAFETY: `f` is an open, writable file for the duration of the call.
                let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, swap_bytes as libc::off_t) };
                if r != 0 {
                    bail!("fallocate {SWAP_FILE}: {}", std::io::Error::last_os_error());
                }
                drop(f);
                run("mkswap", &["-q", SWAP_FILE])?;
                run("swapon", &[SWAP_FILE])?;
                ks.device = SWAP_FILE.into();
            }
            Setup::KernelZram => {
                if !Path::new("/sys/class/zram-control").exists() {
                    run("modprobe", &["zram"])?;
                }
                let free0 = Path::new("/sys/block/zram0/disksize").exists()
                    && fs::read_to_string("/sys/block/zram0/disksize")?.trim() == "0"
                    && !active_swaps().iter().any(|s| s == "/dev/zram0");
                let z = if free0 {
                    ZramState {
                        dev: 0,
                        hot_added: false,
                    }
                } else {
                    let n = fs::read_to_string("/sys/class/zram-control/hot_add")
                        .context("zram hot_add")?;
                    ZramState {
                        dev: n.trim().parse().context("zram hot_add answer")?,
                        hot_added: true,
                    }
                };
                ks.state.zram = Some(z.clone());
                ks.state.persist()?;
                let sys = format!("/sys/block/zram{}", z.dev);
                let algs = fs::read_to_string(format!("{sys}/comp_algorithm"))?;
                let comp = if algs
                    .split_whitespace()
                    .any(|a| a.trim_matches(['[', ']']) == "lzo-rle")
                {
                    "lzo-rle"
                } else {
                    "lzo"
                };
                write_sys(&format!("{sys}/comp_algorithm"), comp)?;
                write_sys(&format!("{sys}/disksize"), &swap_bytes.to_string())?;
                let dev = format!("/dev/zram{}", z.dev);
                run("mkswap", &["-q", &dev])?;
                run("swapon", &[&dev])?;
                ks.device = dev;
                ks.zram_comp = Some(comp.into());
            }
            _ => bail!("{} is not a kernel setup", setup.name()),
        }
        Ok(ks)
    }

    /// The setup this is.
    pub fn setup(&self) -> Setup {
        self.setup
    }

    /// The path of zram's `mm_stat` (orig_data_size, compr_data_size, mem_used_total, ...),
    /// when zram.
    pub fn zram_mm_stat_path(&self) -> Option<PathBuf> {
        let z = self.state.zram.as_ref()?;
        Some(PathBuf::from(format!("/sys/block/zram{}/mm_stat", z.dev)))
    }

    fn teardown(&mut self) -> Result<()> {
        let mut first_err = None;
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                eprintln!("compare: restoring kernel state: {e:#}");
                first_err.get_or_insert(e);
            }
        };
        if let Some(f) = self.state.swap_file.clone() {
            note(swapoff_if_active(&f));
            note(
                fs::remove_file(&f)
                    .or_else(|e| {
                        if e.kind() == std::io::ErrorKind::NotFound {
                            Ok(())
                        } else {
                            Err(e)
                        }
                    })
                    .map_err(Into::into),
            );
        }
        if let Some(z) = self.state.zram.clone() {
            note(zram_teardown(&z));
        }
        if let Some(p) = self.state.zswap_prior.clone() {
            note(p.write());
        }
        match first_err {
            None => {
                let _ = fs::remove_file(STATE_FILE);
                self.state = State::default();
                Ok(())
            }
            Some(e) => Err(e),
        }
    }

    /// Deactivates now, reporting errors (Drop does the same but can only print them).
    pub fn deactivate(mut self) -> Result<()> {
        self.teardown()
    }
}

impl Drop for KernelSwap {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// Counters of the workload's memory cgroup after a run.
#[derive(Debug, Clone, Default)]
pub struct CgroupCounters {
    /// OOM kills in the group (`memory.oom_control`'s `oom_kill`).
    pub oom_kill: u64,
    /// Times the limit was hit (`memory.failcnt`).
    pub failcnt: u64,
    /// Largest usage (`memory.max_usage_in_bytes`).
    pub max_usage: u64,
    /// Largest kernel-memory usage (`memory.kmem.max_usage_in_bytes`; zswap's pool is charged
    /// here when the kernel charges it to the group).
    pub kmem_max_usage: u64,
}

/// The workload's memory cgroup (v1), removed on drop (its processes are killed first).
#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
}

fn remove_cgroup(path: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let procs = fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
        for p in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kill(2) of a process that is in this driver's own cgroup.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(e).with_context(|| format!("rmdir {}", path.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

impl Cgroup {
    /// Creates the group with a memory limit of `limit` bytes.
    pub fn create(limit: u64) -> Result<Self> {
        let path = PathBuf::from(CGROUP);
        if path.exists() {
            remove_cgroup(&path)?;
        }
        fs::create_dir(&path).with_context(|| format!("mkdir {}", path.display()))?;
        let cg = Cgroup { path };
        write_sys(&cg.file("memory.limit_in_bytes"), &limit.to_string())?;
        Ok(cg)
    }

    /// The group's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn file(&self, name: &str) -> String {
        self.path.join(name).display().to_string()
    }

    /// Reads the counters.
    pub fn counters(&self) -> CgroupCounters {
        let num = |n: &str| {
            fs::read_to_string(self.file(n))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        };
        let oom = fs::read_to_string(self.file("memory.oom_control")).unwrap_or_default();
        let oom_kill = oom
            .lines()
            .find_map(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0);
        CgroupCounters {
            oom_kill,
            failcnt: num("memory.failcnt"),
            max_usage: num("memory.max_usage_in_bytes"),
            kmem_max_usage: num("memory.kmem.max_usage_in_bytes"),
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = remove_cgroup(&self.path) {
            eprintln!("compare: removing cgroup: {e:#}");
        }
    }
}

/// Peaks of a zram device while a workload runs, sampled every 100 ms by a thread.
#[derive(Debug)]
pub struct ZramSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<ZramPeak>,
}

/// What [`ZramSampler`] saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct ZramPeak {
    /// Largest `orig_data_size` (bytes stored, uncompressed).
    pub orig: u64,
    /// `compr_data_size` at that moment.
    pub compr_at_peak: u64,
    /// Largest `mem_used_total` (memory zram took, allocator overhead included).
    pub mem_used: u64,
}

impl ZramSampler {
    /// Starts sampling `mm_stat`.
    pub fn start(mm_stat: PathBuf) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = ZramPeak::default();
            loop {
                let v: Vec<u64> = fs::read_to_string(&mm_stat)
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                if v.len() >= 3 {
                    if v[0] > peak.orig {
                        peak.orig = v[0];
                        peak.compr_at_peak = v[1];
                    }
                    peak.mem_used = peak.mem_used.max(v[2]);
                }
                if flag.load(std::sync::atomic::Ordering::Relaxed) {
                    return peak;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        ZramSampler { stop, thread }
    }

    /// Stops and returns the peaks.
    pub fn finish(self) -> ZramPeak {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Selected /proc/vmstat counters.
pub fn vmstat() -> std::collections::BTreeMap<String, u64> {
    const KEYS: [&str; 6] = [
        "pswpin",
        "pswpout",
        "zswpin",
        "zswpout",
        "zswpwb",
        "pgmajfault",
    ];
    fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            KEYS.contains(&k)
                .then(|| Some((k.to_string(), v.trim().parse().ok()?)))?
        })
        .collect()
}
