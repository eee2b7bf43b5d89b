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
    /// `accept_threshold_percent` (absent in kernels without it, and in old state files).
    #[serde(default)]
    pub accept_threshold_percent: Option<String>,
    /// `shrinker_enabled` (absent in kernels without it, and in old state files).
    #[serde(default)]
    pub shrinker_enabled: Option<String>,
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
        let optional = |n: &str| {
            fs::read_to_string(format!("{ZSWAP}/{n}"))
                .ok()
                .map(|s| s.trim().to_string())
        };
        Ok(Self {
            enabled: r("enabled")?,
            compressor: r("compressor")?,
            max_pool_percent: r("max_pool_percent")?,
            accept_threshold_percent: optional("accept_threshold_percent"),
            shrinker_enabled: optional("shrinker_enabled"),
        })
    }

    /// The kernel's own defaults, `enabled` on: `max_pool_percent` 20 and
    /// `accept_threshold_percent` 90 (mm/zswap.c), the compressor and the shrinker setting this
    /// kernel was built with (`CONFIG_ZSWAP_COMPRESSOR_DEFAULT`,
    /// `CONFIG_ZSWAP_SHRINKER_DEFAULT_ON`, from /proc/config.gz; without it, the compressor
    /// and the shrinker setting stay as the machine has them). Knobs this kernel lacks stay
    /// absent.
    pub fn kernel_defaults(machine: &ZswapParams) -> Self {
        let config = Command::new("zcat")
            .arg("/proc/config.gz")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let (compressor, shrinker) = kernel_config_zswap_defaults(&config);
        ZswapParams {
            enabled: "Y".into(),
            compressor: compressor.unwrap_or_else(|| machine.compressor.clone()),
            max_pool_percent: "20".into(),
            accept_threshold_percent: machine
                .accept_threshold_percent
                .as_ref()
                .map(|_| "90".into()),
            shrinker_enabled: machine.shrinker_enabled.as_ref().map(|m| {
                shrinker.map_or_else(|| m.clone(), |on| if on { "Y" } else { "N" }.into())
            }),
        }
    }

    /// Writes them back: the pool settings first, `enabled` last.
    fn write(&self) -> Result<()> {
        write_sys(&format!("{ZSWAP}/compressor"), &self.compressor)?;
        write_sys(&format!("{ZSWAP}/max_pool_percent"), &self.max_pool_percent)?;
        if let Some(v) = &self.accept_threshold_percent {
            write_sys(&format!("{ZSWAP}/accept_threshold_percent"), v)?;
        }
        if let Some(v) = &self.shrinker_enabled {
            write_sys(&format!("{ZSWAP}/shrinker_enabled"), v)?;
        }
        write_sys(&format!("{ZSWAP}/enabled"), &self.enabled)
    }
}

/// From a kernel config: zswap's default compressor and whether its shrinker is on by default
/// (`None` where the config does not say).
fn kernel_config_zswap_defaults(config: &str) -> (Option<String>, Option<bool>) {
    let mut compressor = None;
    let mut shrinker = None;
    for l in config.lines() {
        if let Some(v) = l.strip_prefix("CONFIG_ZSWAP_COMPRESSOR_DEFAULT=") {
            compressor = Some(v.trim().trim_matches('"').to_string());
        } else if l.starts_with("CONFIG_ZSWAP_SHRINKER_DEFAULT_ON=y") {
            shrinker = Some(true);
        } else if l.starts_with("# CONFIG_ZSWAP_SHRINKER_DEFAULT_ON is not set") {
            shrinker = Some(false);
        }
    }
    (compressor, shrinker)
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
    /// zswap's parameters while active, when zswap is on.
    pub zswap: Option<ZswapParams>,
}

impl KernelSwap {
    /// Activates `setup` with a swap area of `swap_bytes`; for kzswap the pool is limited to
    /// `zswap_pool_percent` of RAM, for kzswap-default zswap is at the kernel's defaults.
    /// Refuses if any swap is already active.
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
            zswap: None,
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
                ..prior.clone()
            }
        } else if setup == Setup::KernelZswapDefault {
            ZswapParams::kernel_defaults(&prior)
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
        ks.zswap = (want.enabled == "Y").then(|| want.clone());
        match setup {
            Setup::KernelSwap | Setup::KernelZswap | Setup::KernelZswapDefault => {
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

    /// The swap file, when the swap area is one (not zram).
    pub fn swap_file_path(&self) -> Option<PathBuf> {
        self.state.swap_file.as_ref().map(PathBuf::from)
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

/// Sectors written to the block device that holds `path` (its whole disk's line of
/// /proc/diskstats, by the device number of the file system), or `None` if not found (a file
/// system on no block device, such as tmpfs).
pub fn disk_sectors_written(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    diskstats_written(&fs::read_to_string("/proc/diskstats").ok()?, major, minor)
}

/// The sectors-written field of the /proc/diskstats line of device `major:minor`.
fn diskstats_written(diskstats: &str, major: u32, minor: u32) -> Option<u64> {
    diskstats.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 9 && f[0].parse() == Ok(major) && f[1].parse() == Ok(minor))
            .then(|| f[9].parse().ok())
            .flatten()
    })
}

/// Bytes of `path` in the page cache now (`mincore` over a read-only mapping of it), or `None`
/// if it cannot be opened or mapped (not there yet, or empty).
pub fn page_cache_bytes(path: &Path) -> Option<u64> {
    let f = fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len() as usize;
    if len == 0 {
        return None;
    }
    // SAFETY: a fresh shared read-only mapping of an open file, unmapped below; never read.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return None;
    }
    let pages = len.div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: `vec` has one byte per page of the mapping made above.
    let r = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    // SAFETY: the mapping made above, of `len` bytes.
    unsafe { libc::munmap(addr, len) };
    (r == 0).then(|| vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * 4096)
}

/// The largest page cache a swap file held while a workload ran, sampled every 100 ms (a
/// file tier that keeps what it evicted in the page cache keeps it in RAM, outside the limit).
#[derive(Debug)]
pub struct FileCacheSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Option<u64>>,
}

impl FileCacheSampler {
    /// Starts sampling `path` (which may appear later).
    pub fn start(path: PathBuf) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = None;
            loop {
                if let Some(b) = page_cache_bytes(&path) {
                    peak = Some(peak.unwrap_or(0).max(b));
                }
                if flag.load(std::sync::atomic::Ordering::Relaxed) {
                    return peak;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        FileCacheSampler { stop, thread }
    }

    /// Stops and returns the peak, in bytes; `None` if the file was never there (a setup
    /// whose file has no name).
    pub fn finish(self) -> Option<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// CPU seconds the whole machine has spent busy since boot (all CPUs: user, nice, system,
/// irq, softirq and steal of /proc/stat's `cpu` line), or `None` if unreadable.
pub fn machine_busy_s() -> Option<f64> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    if v.len() < 8 {
        return None;
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) as f64 / hz)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diskstats_line_of_a_device() {
        let d = " 254       0 vda 47958756 1568760 1072694650 12163870 40489263 235209 \
                 1192651976 4264989 0 3185484 16526569\n 254       1 vda1 1 2 3 4 5 6 77 8 9 10 11\n";
        assert_eq!(diskstats_written(d, 254, 0), Some(1192651976));
        assert_eq!(diskstats_written(d, 254, 1), Some(77));
        assert_eq!(diskstats_written(d, 8, 0), None);
    }

    #[test]
    fn page_cache_of_a_file_written_and_dropped() {
        // (On a disk-backed file system: tmpfs keeps its pages whatever is advised.)
        let dir = Path::new("/var/tmp").join(format!("pc-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        assert_eq!(page_cache_bytes(&p), None, "no file yet");
        fs::write(&p, vec![7u8; 64 << 10]).unwrap();
        assert_eq!(
            page_cache_bytes(&p),
            Some(64 << 10),
            "just written: all cached"
        );
        let f = fs::File::open(&p).unwrap();
        f.sync_all().unwrap();
        // SAFETY: plain syscall on an open descriptor.
        let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0);
        assert!(
            page_cache_bytes(&p).unwrap() < 64 << 10,
            "dropped from the cache"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn zswap_defaults_from_the_kernel_config() {
        let cfg = "CONFIG_ZSWAP=y\n# CONFIG_ZSWAP_SHRINKER_DEFAULT_ON is not set\n\
                   CONFIG_ZSWAP_COMPRESSOR_DEFAULT=\"lzo\"\n";
        assert_eq!(
            kernel_config_zswap_defaults(cfg),
            (Some("lzo".to_string()), Some(false))
        );
        assert_eq!(
            kernel_config_zswap_defaults("CONFIG_ZSWAP_SHRINKER_DEFAULT_ON=y\n"),
            (None, Some(true))
        );
        // An old state file (without the newer knobs) still parses.
        let p: ZswapParams =
            serde_json::from_str(r#"{"enabled":"N","compressor":"lzo","max_pool_percent":"20"}"#)
                .unwrap();
        assert_eq!(p.shrinker_enabled, None);
    }
}
