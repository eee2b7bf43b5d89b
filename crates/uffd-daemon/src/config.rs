//! The configuration file (TOML) and how the command line overrides it.
//!
//! ```toml
//! limit = "256M"                 # the resident limit (--limit overrides); or "auto", or
//!                                # the table below (--limit auto[:CEILING])
//!
//! # [limit]                      # a limit set from the tree's memory stall (limit.rs)
//! # auto = true
//! # ceiling = "1G"               # a hard ceiling (default: the machine's RAM)
//! # floor = "16M"                # (--limit-floor)
//! # target_stall_pct = 1.0       # (--stall-target)
//! # interval_ms = 1000           # how often the stall is read and the limit set
//!
//! [tiers]
//! backend = "file"               # none | file | file:PATH | pmem:PATH | redis-cluster:...,
//!                                # or a chain NEAR,FAR: "file,redis-cluster:HOST:PORT,..."
//!                                # (--backend)
//! swap_size = "8G"               # swap space: slots (pages stored below memory, in all
//!                                # tiers), and the backend's size (--swap-size)
//! near_size = "2G"               # a chain's first tier (the file); default a quarter of
//!                                # swap_size (--near-size)
//! migrate_high_percent = 90      # a chain moves the first tier's oldest pages down when it is
//! migrate_low_percent = 70       # this full, down to this
//! migrate_age_ms = 60000         # and pages older than this whatever its fill (default: never)
//! migrate_batch_pages = 256      # pages a migration batch moves (one write to the far tier)
//! large_folios = true            # evict aligned 64 KiB runs as order-4 folios
//! discard = true                 # punch freed clusters out of a swap file
//! encrypt = true                 # seal every page on the backend with AES-256-GCM under a key
//!                                # held only in the daemon's locked memory (--encrypt on|off)
//! checksums = true               # without encryption: check each page read back from the
//!                                # backend against its CRC-32C, kept in memory
//!
//! [redis_cluster]                # with backend = "redis-cluster:HOST:PORT[,HOST:PORT...]"
//! password = "..."               # AUTH (requirepass or an ACL user's); none by default
//! username = "uffd"              # ACL user (default: the default user)
//! connect_timeout_ms = 1000      # a TCP connection to a node
//! response_timeout_ms = 2000     # a node's answer; above wait_timeout_ms
//! replicas = 1                   # a write is stored once WAIT counts this many replicas (0: no WAIT)
//! wait_timeout_ms = 1000         # WAIT's timeout
//! read_retry_ms = 15000          # a read retries this long (a failover) before it fails
//! write_retry_ms = 1000          # a write retries this long before its pages stay in memory
//!
//! [zswap]
//! enabled = true                 # (--zswap off)
//! compressor = "lz4"             # lz4 | zstd | zstd:LEVEL | deflate | deflate-iaa (--compressor)
//! max_pool = "1G"                # pool limit (--zswap SIZE); default 20% of RAM, as the kernel
//! accept_threshold_percent = 90
//! writeback_start_percent = 95   # the shrinker writes back above this share of max_pool
//! multi_page = false             # compress a 64 KiB folio as one object
//! crc = true                     # CRC32C per page, checked on load
//!
//! [policy]
//! name = "mglru"                 # mglru | clock
//! access = "faults"              # faults | faults+wp
//! page_cluster = 4               # readahead up to 2^page_cluster pages on sequential faults
//!
//! [fault]
//! spin_us = 50                   # after a fault, poll the uffd this long at most before
//!                                # sleeping (adaptive, 0: always sleep); at most 1000
//! idle_poll_us = 200             # after a fault, keep every CPU from halting this long
//!                                # (0: off); at most 10000
//! realtime = false               # opt-in: fault handlers run SCHED_FIFO (priority 1); lower
//!                                # fault latency, less CPU for CPU-bound programs
//! spread = true                  # a handler whose client was woken onto its CPU after a
//!                                # one-page restore moves to another (lower random-fault p50)
//! idle_poll = "kernel"           # kernel: a CPU latency request of 0 (/dev/cpu_dma_latency)
//!                                # while faults come, so idle CPUs poll in the kernel
//!                                # (machine-wide during storms; keepers if not root) |
//!                                # keepers: a SCHED_IDLE poller thread per CPU
//! ```
//!
//! Unknown keys are refused with their name, so a typo never silently means "default".

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;
use zswap::Compressor;

use crate::parse_size;
use crate::tiers::{BackendSpec, FailWrites, TierConfig, ZswapTier};

/// Which replacement policy picks victims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// The multi-generational LRU (crates/mglru).
    Mglru,
    /// CLOCK with second chance (mglru's baseline).
    Clock,
}

/// Where access information for resident pages comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    /// Only faults: a page is accessed when it is faulted in.
    Faults,
    /// Faults, plus write-protect faults: the aging write-protects resident pages and a write
    /// to one is seen as an access (then the protection is lifted).
    FaultsWp,
}

/// Policy settings.
#[derive(Debug, Clone, Copy)]
pub struct PolicyConfig {
    /// The policy.
    pub kind: PolicyKind,
    /// The access source.
    pub access: AccessMode,
    /// log2 of the most pages read ahead on a sequential fault (0: none).
    pub page_cluster: u32,
    /// Shadow entries (refault detection) kept per address space: a refault further back
    /// than the resident set cannot be acted on, so the limit in pages is enough.
    pub max_shadows: usize,
    /// Longest time a fault handler polls its uffd without sleeping after a fault (the
    /// adaptive window grows up to it; zero: never spin). `[fault] spin_us`.
    pub fault_spin: std::time::Duration,
    /// How long after a fault idle CPUs are kept polling instead of halting
    /// (`[fault] idle_poll_us`; zero: never). See `idlepoll`.
    pub fault_idle_poll: std::time::Duration,
    /// How (`[fault] idle_poll`).
    pub fault_idle_poll_mode: crate::idlepoll::Mode,
    /// Whether fault handlers run `SCHED_FIFO` at priority 1 (`[fault] realtime`; opt-in, and
    /// only where the daemon may, that is as root).
    pub fault_realtime: bool,
    /// Whether a fault handler that finds its client woken onto its own CPU moves itself to
    /// another (`[fault] spread`).
    pub fault_spread: bool,
    /// How long reclaim waits for an agent's answer to a DROP before it leaves the batch
    /// outstanding and turns to other work (`[test] drop_timeout_ms`: tests shorten it).
    pub drop_timeout: std::time::Duration,
    /// What to do about memory of the tree the daemon cannot manage (`unmanaged`,
    /// `--unmanaged`): say it, or refuse the program.
    pub unmanaged: crate::unmanaged::Policy,
}

/// Default of `[fault] spin_us`.
pub const DEFAULT_SPIN_US: u64 = 50;

/// Largest `[fault] spin_us` accepted.
pub const MAX_SPIN_US: u64 = 1000;

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            kind: PolicyKind::Mglru,
            access: AccessMode::Faults,
            page_cluster: 4,
            max_shadows: 1 << 16,
            fault_spin: std::time::Duration::from_micros(DEFAULT_SPIN_US),
            fault_idle_poll: std::time::Duration::from_micros(
                crate::idlepoll::DEFAULT_IDLE_POLL_US,
            ),
            fault_idle_poll_mode: crate::idlepoll::Mode::Kernel,
            fault_realtime: false,
            fault_spread: true,
            drop_timeout: std::time::Duration::from_millis(crate::agent_conn::DROP_TIMEOUT_MS),
            unmanaged: crate::unmanaged::Policy::Warn,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    limit: Option<FileLimit>,
    unmanaged: Option<String>,
    #[serde(default)]
    tiers: FileTiers,
    #[serde(default)]
    zswap: FileZswap,
    redis_cluster: Option<FileRedisCluster>,
    #[serde(default)]
    policy: FilePolicy,
    #[serde(default)]
    fault: FileFault,
    #[serde(default)]
    test: FileTest,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTiers {
    backend: Option<String>,
    swap_size: Option<String>,
    near_size: Option<String>,
    migrate_high_percent: Option<u8>,
    migrate_low_percent: Option<u8>,
    migrate_age_ms: Option<u64>,
    migrate_batch_pages: Option<usize>,
    large_folios: Option<bool>,
    discard: Option<bool>,
    encrypt: Option<bool>,
    checksums: Option<bool>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRedisCluster {
    username: Option<String>,
    password: Option<String>,
    connect_timeout_ms: Option<u64>,
    response_timeout_ms: Option<u64>,
    replicas: Option<u32>,
    wait_timeout_ms: Option<u64>,
    read_retry_ms: Option<u64>,
    write_retry_ms: Option<u64>,
}

impl std::fmt::Debug for FileRedisCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileRedisCluster")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "(set)"))
            .finish_non_exhaustive()
    }
}

impl FileRedisCluster {
    /// Applies the section to `c`, checking each value's range.
    fn apply(&self, c: &mut crate::tiers::RedisClusterConfig) -> anyhow::Result<()> {
        use std::time::Duration;
        let ms = |v: Option<u64>, name: &str, lo: u64, hi: u64, d: Duration| match v {
            None => Ok(d),
            Some(x) if (lo..=hi).contains(&x) => Ok(Duration::from_millis(x)),
            Some(x) => Err(anyhow::anyhow!("redis_cluster.{name} = {x}: {lo} to {hi}")),
        };
        if let Some(u) = &self.username {
            if u.is_empty() {
                bail!("redis_cluster.username is empty: leave it out for the default user");
            }
            c.username = Some(u.clone());
        }
        if let Some(p) = &self.password {
            c.password = Some(p.clone());
        }
        c.connect_timeout = ms(
            self.connect_timeout_ms,
            "connect_timeout_ms",
            1,
            60_000,
            c.connect_timeout,
        )?;
        c.response_timeout = ms(
            self.response_timeout_ms,
            "response_timeout_ms",
            1,
            60_000,
            c.response_timeout,
        )?;
        c.wait_timeout = ms(
            self.wait_timeout_ms,
            "wait_timeout_ms",
            1,
            60_000,
            c.wait_timeout,
        )?;
        c.read_retry = ms(
            self.read_retry_ms,
            "read_retry_ms",
            0,
            600_000,
            c.read_retry,
        )?;
        c.write_retry = ms(
            self.write_retry_ms,
            "write_retry_ms",
            0,
            600_000,
            c.write_retry,
        )?;
        if let Some(r) = self.replicas {
            if r > 16 {
                bail!("redis_cluster.replicas = {r}: 0 to 16");
            }
            c.replicas = r;
        }
        c.validate().map_err(anyhow::Error::msg)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileZswap {
    enabled: Option<bool>,
    compressor: Option<String>,
    max_pool: Option<String>,
    accept_threshold_percent: Option<u8>,
    writeback_start_percent: Option<u8>,
    multi_page: Option<bool>,
    crc: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePolicy {
    name: Option<String>,
    access: Option<String>,
    page_cluster: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFault {
    spin_us: Option<u64>,
    idle_poll_us: Option<u64>,
    idle_poll: Option<String>,
    realtime: Option<bool>,
    spread: Option<bool>,
    cpu_latency_us: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTest {
    fail_writes_after: Option<String>,
    fail_errno: Option<String>,
    fail_writeback_after: Option<String>,
    drop_timeout_ms: Option<u64>,
}

/// `limit`: a size, `"auto"`, or a `[limit]` table.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FileLimit {
    Size(String),
    Table(FileLimitTable),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLimitTable {
    auto: Option<bool>,
    ceiling: Option<String>,
    floor: Option<String>,
    target_stall_pct: Option<f64>,
    interval_ms: Option<u64>,
}

/// What the command line says (each `None` leaves the file's value or the default).
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--limit SIZE` (under `auto`, the ceiling).
    pub limit: Option<u64>,
    /// `--limit auto[:CEILING]`.
    pub auto_limit: Option<bool>,
    /// `--limit-floor`.
    pub limit_floor: Option<u64>,
    /// `--stall-target` (percent).
    pub stall_target: Option<f64>,
    /// `--backend`.
    pub backend: Option<BackendSpec>,
    /// `--swap-size`.
    pub swap_size: Option<u64>,
    /// `--near-size`: a chain's first tier.
    pub near_size: Option<u64>,
    /// `--zswap SIZE|off`: `Some(None)` is off.
    pub zswap: Option<Option<u64>>,
    /// `--compressor`.
    pub compressor: Option<Compressor>,
    /// `--policy`.
    pub policy: Option<PolicyKind>,
    /// `--access`.
    pub access: Option<AccessMode>,
    /// `--unmanaged`.
    pub unmanaged: Option<crate::unmanaged::Policy>,
    /// `--encrypt on|off`.
    pub encrypt: Option<bool>,
}

/// Parses `lz4`, `zstd`, `zstd:LEVEL`, `deflate`, `deflate-iaa`.
pub fn parse_compressor(s: &str) -> Result<Compressor, String> {
    match s {
        "lz4" => Ok(Compressor::Lz4),
        "zstd" => Ok(Compressor::Zstd { level: 1 }),
        "deflate" => Ok(Compressor::Deflate { level: 1 }),
        "deflate-iaa" => Ok(Compressor::DeflateIaa),
        _ => match s.strip_prefix("zstd:").map(str::parse::<i32>) {
            Some(Ok(level)) if (-7..=22).contains(&level) => Ok(Compressor::Zstd { level }),
            _ => Err(format!(
                "unknown compressor {s:?}: expected lz4, zstd, zstd:LEVEL (-7..=22), deflate or deflate-iaa"
            )),
        },
    }
}

/// Parses `on` or `off` (`--encrypt`).
pub fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(format!("{s:?}: expected on or off")),
    }
}

/// Parses `mglru` or `clock`.
pub fn parse_policy(s: &str) -> Result<PolicyKind, String> {
    match s {
        "mglru" => Ok(PolicyKind::Mglru),
        "clock" => Ok(PolicyKind::Clock),
        _ => Err(format!("unknown policy {s:?}: expected mglru or clock")),
    }
}

/// Parses `faults` or `faults+wp`.
pub fn parse_access(s: &str) -> Result<AccessMode, String> {
    match s {
        "faults" => Ok(AccessMode::Faults),
        "faults+wp" | "wp" => Ok(AccessMode::FaultsWp),
        _ => Err(format!(
            "unknown access source {s:?}: expected faults or faults+wp"
        )),
    }
}

/// The tiers, the policy and the limit from an optional file and the command line.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The limit in bytes (under `auto`, its ceiling, where it starts).
    pub limit: u64,
    /// `--limit auto`: the controller's settings.
    pub auto: Option<crate::limit::AutoConfig>,
    /// The tiers.
    pub tiers: TierConfig,
    /// The policy.
    pub policy: PolicyConfig,
}

/// What the tiers cannot hold, said at start: each line names the setting and what follows
/// from it. Settings that cannot work at all are refused by [`resolve`]; these can, for some
/// programs, and the daemon counts the pages refused while it runs
/// (`store_refused_*_pages`).
pub fn capacity_warnings(limit: u64, tiers: &TierConfig) -> Vec<String> {
    let mib = |b: u64| b >> 20;
    let mut w = Vec::new();
    let ram = crate::sys::physical_memory();
    if ram > 0 && limit >= ram {
        w.push(format!(
            "the limit ({} MiB) is not below this machine's memory ({} MiB): the daemon evicts \
             only what the limit asks, so it may never evict",
            mib(limit),
            mib(ram)
        ));
    }
    match (&tiers.zswap, &tiers.backend) {
        (Some(z), BackendSpec::None) => w.push(format!(
            "no backing device (--backend none): pages leave memory only into the zswap pool of \
             at most {} MiB, and pages that do not compress below a page stay resident; the \
             limit holds only while the program's memory beyond {} MiB compresses into the pool",
            mib(z.max_pool_bytes),
            mib(limit)
        )),
        (Some(z), _) if ram > 0 && z.max_pool_bytes > ram / 2 => w.push(format!(
            "the zswap pool may grow to {} MiB, more than half of this machine's memory ({} MiB)",
            mib(z.max_pool_bytes),
            mib(ram)
        )),
        _ => {}
    }
    if tiers.swap_bytes < limit {
        w.push(format!(
            "the swap space ({} MiB, --swap-size) is smaller than the limit ({} MiB): a program \
             whose anonymous memory passes {} MiB cannot be held under the limit",
            mib(tiers.swap_bytes),
            mib(limit),
            mib(limit + tiers.swap_bytes)
        ));
    }
    w
}

fn size_field(v: &Option<String>, field: &str) -> anyhow::Result<Option<u64>> {
    v.as_deref()
        .map(|s| parse_size(s).map_err(|e| anyhow::anyhow!("{field}: {e}")))
        .transpose()
}

/// Reads `path` (if any) and applies `o` over it.
pub fn resolve(path: Option<&Path>, o: &Overrides) -> anyhow::Result<Resolved> {
    let f = read_file(path)?;
    let (limit, auto) = resolve_limit(&f, o)?;
    let backend = resolve_backend(&f, o)?;
    let swap_bytes = resolve_swap_bytes(&f, o)?;
    let zswap = resolve_zswap(&f, o)?;
    if zswap.is_none() && backend == BackendSpec::None {
        bail!("no tier to evict to: zswap is off and the backend is none");
    }
    let fail_writes = resolve_fail_writes(&f)?;
    let policy = resolve_policy(&f, o, limit)?;
    Ok(Resolved {
        limit,
        auto,
        tiers: TierConfig {
            zswap,
            backend,
            swap_bytes,
            large_folios: f.tiers.large_folios.unwrap_or(true),
            discard: f.tiers.discard.unwrap_or(true),
            encrypt: o.encrypt.or(f.tiers.encrypt).unwrap_or(true),
            checksums: f.tiers.checksums.unwrap_or(true),
            fail_writes,
            fail_writeback_after: size_field(
                &f.test.fail_writeback_after,
                "test.fail_writeback_after",
            )?,
            tmp_dir: PathBuf::from("/var/tmp"),
        },
        policy,
    })
}

/// The configuration file, parsed (empty without one).
fn read_file(path: Option<&Path>) -> anyhow::Result<FileConfig> {
    let f: FileConfig = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading the configuration {}", p.display()))?;
            toml::from_str(&text)
                .with_context(|| format!("in the configuration {}", p.display()))?
        }
        None => FileConfig::default(),
    };
    Ok(f)
}

/// The limit in bytes (under `auto`, its ceiling) and the controller's settings under `auto`:
/// the command line over the file's `limit` (a size, `"auto"`, or a table).
fn resolve_limit(
    f: &FileConfig,
    o: &Overrides,
) -> anyhow::Result<(u64, Option<crate::limit::AutoConfig>)> {
    let (file_size, table) = match &f.limit {
        Some(FileLimit::Size(s)) if s == "auto" => (
            None,
            FileLimitTable {
                auto: Some(true),
                ..Default::default()
            },
        ),
        Some(FileLimit::Size(s)) => (
            Some(parse_size(s).map_err(|e| anyhow::anyhow!("limit: {e}"))?),
            FileLimitTable::default(),
        ),
        Some(FileLimit::Table(t)) => (
            size_field(&t.ceiling, "limit.ceiling")?,
            FileLimitTable {
                auto: t.auto,
                ceiling: None,
                floor: t.floor.clone(),
                target_stall_pct: t.target_stall_pct,
                interval_ms: t.interval_ms,
            },
        ),
        None => (None, FileLimitTable::default()),
    };
    let auto = o.auto_limit.or(table.auto).unwrap_or(false);
    let fixed = o.limit.or(file_size);
    let (limit, auto) = if auto {
        let ram = crate::sys::physical_memory();
        let ceiling = fixed
            .unwrap_or(ram)
            .min(if ram > 0 { ram } else { u64::MAX });
        let floor = match o.limit_floor {
            Some(f) => f,
            None => size_field(&table.floor, "limit.floor")?.unwrap_or(16 << 20),
        };
        if floor < 16 * 4096 {
            bail!("limit floor {floor} bytes is too small: at least 64K");
        }
        if floor > ceiling {
            bail!(
                "limit floor ({} MiB) is above its ceiling ({} MiB)",
                floor >> 20,
                ceiling >> 20
            );
        }
        let target = o.stall_target.or(table.target_stall_pct).unwrap_or(1.0);
        if !(target > 0.0 && target <= 100.0) {
            bail!("stall target {target}% is out of range: give a share of wall time in (0, 100]");
        }
        let interval = table.interval_ms.unwrap_or(1000);
        if !(100..=60_000).contains(&interval) {
            bail!("limit.interval_ms {interval} is out of range: 100..=60000");
        }
        let mut a =
            crate::limit::AutoConfig::new((floor / 4096) as usize, (ceiling / 4096) as usize);
        a.target_pct = target;
        a.interval = std::time::Duration::from_millis(interval);
        (ceiling, Some(a))
    } else {
        if table.floor.is_some() || table.target_stall_pct.is_some() || table.interval_ms.is_some()
        {
            bail!(
                "limit.floor, limit.target_stall_pct and limit.interval_ms need limit.auto = true"
            );
        }
        if o.limit_floor.is_some() || o.stall_target.is_some() {
            bail!("--limit-floor and --stall-target need --limit auto");
        }
        match fixed {
            Some(l) => (l, None),
            None => bail!("no limit: give --limit or `limit` in the configuration file"),
        }
    };
    Ok((limit, auto))
}

/// The backing device, with the `[redis_cluster]` section applied to a cluster.
fn resolve_backend(f: &FileConfig, o: &Overrides) -> anyhow::Result<BackendSpec> {
    let backend = match (&o.backend, &f.tiers.backend) {
        (Some(b), _) => b.clone(),
        (None, Some(s)) => {
            BackendSpec::parse(s).map_err(|e| anyhow::anyhow!("tiers.backend: {e}"))?
        }
        (None, None) => BackendSpec::File(None),
    };
    let backend = match backend {
        BackendSpec::Chain(mut c) => {
            c.far = with_cluster_section(c.far, f)?;
            let t = &f.tiers;
            if let Some(n) = o.near_size.or(size_field(&t.near_size, "tiers.near_size")?) {
                c.near_bytes = n;
            }
            c.migrate_high_percent = t.migrate_high_percent.unwrap_or(c.migrate_high_percent);
            c.migrate_low_percent = t.migrate_low_percent.unwrap_or(c.migrate_low_percent);
            c.migrate_batch_pages = t.migrate_batch_pages.unwrap_or(c.migrate_batch_pages);
            match t.migrate_age_ms {
                Some(0) => bail!("tiers.migrate_age_ms = 0: at least 1 (leave it out for never)"),
                Some(ms) => c.migrate_age = Some(Duration::from_millis(ms)),
                None => {}
            }
            c.validate().map_err(anyhow::Error::msg)?;
            BackendSpec::Chain(c)
        }
        b => {
            let t = &f.tiers;
            if o.near_size.is_some()
                || t.near_size.is_some()
                || t.migrate_high_percent.is_some()
                || t.migrate_low_percent.is_some()
                || t.migrate_age_ms.is_some()
                || t.migrate_batch_pages.is_some()
            {
                bail!(
                    "near_size and migrate_* are a chain's settings: the backend is not a chain \
                     (--backend file,redis-cluster:HOST:PORT,...)"
                );
            }
            with_cluster_section(b, f)?
        }
    };
    Ok(backend)
}

/// A Redis Cluster backend with the `[redis_cluster]` section applied.
fn with_cluster_section(b: BackendSpec, f: &FileConfig) -> anyhow::Result<BackendSpec> {
    Ok(match (b, &f.redis_cluster) {
        (BackendSpec::RedisCluster(mut c), section) => {
            match section {
                Some(s) => s.apply(&mut c),
                None => c.validate().map_err(anyhow::Error::msg),
            }
            .context("the redis-cluster backend")?;
            BackendSpec::RedisCluster(c)
        }
        (b, _) => b,
    })
}

/// The swap space in bytes: at least an eviction batch, at most what 32-bit slots address.
fn resolve_swap_bytes(f: &FileConfig, o: &Overrides) -> anyhow::Result<u64> {
    let swap_bytes = o
        .swap_size
        .or(size_field(&f.tiers.swap_size, "tiers.swap_size")?)
        .unwrap_or(8 << 30);
    // Slots are numbered in 32 bits (one number is the zero page's): at most 16 TiB of swap.
    const MAX_SWAP: u64 = (u32::MAX as u64 - 1) * 4096;
    if swap_bytes < 4 << 20 {
        bail!(
            "swap size {swap_bytes} bytes cannot hold an eviction batch: at least 4M (the \
             default is 8G)"
        );
    }
    if swap_bytes > MAX_SWAP {
        bail!("swap size {swap_bytes} bytes is above the 16T that 32-bit slot numbers address");
    }
    Ok(swap_bytes)
}

/// The zswap tier, unless it is off.
fn resolve_zswap(f: &FileConfig, o: &Overrides) -> anyhow::Result<Option<ZswapTier>> {
    let zswap_on = match o.zswap {
        Some(None) => false,
        Some(Some(_)) => true,
        None => f.zswap.enabled.unwrap_or(true),
    };
    let zswap = if zswap_on {
        let mut z = ZswapTier::default();
        if let Some(c) = &f.zswap.compressor {
            z.compressor =
                parse_compressor(c).map_err(|e| anyhow::anyhow!("zswap.compressor: {e}"))?;
        }
        if let Some(c) = o.compressor {
            z.compressor = c;
        }
        z.max_pool_bytes = match (o.zswap, size_field(&f.zswap.max_pool, "zswap.max_pool")?) {
            (Some(Some(n)), _) | (_, Some(n)) => n,
            _ => crate::sys::physical_memory() / 5,
        };
        if z.max_pool_bytes < 1 << 20 {
            bail!(
                "zswap pool limit {} is too small: at least 1M",
                z.max_pool_bytes
            );
        }
        if let Some(p) = f.zswap.accept_threshold_percent {
            if p > 100 {
                bail!("zswap.accept_threshold_percent = {p}: 0 to 100");
            }
            z.accept_threshold_percent = p;
        }
        if let Some(p) = f.zswap.writeback_start_percent {
            if !(1..=100).contains(&p) {
                bail!("zswap.writeback_start_percent = {p}: 1 to 100");
            }
            z.writeback_start_percent = p;
        }
        z.multi_page = f.zswap.multi_page.unwrap_or(z.multi_page);
        z.crc = f.zswap.crc.unwrap_or(z.crc);
        Some(z)
    } else {
        None
    };
    Ok(zswap)
}

/// The test-only failure injection of `[test]`.
fn resolve_fail_writes(f: &FileConfig) -> anyhow::Result<Option<FailWrites>> {
    let fail_writes = match size_field(&f.test.fail_writes_after, "test.fail_writes_after")? {
        None => None,
        Some(after_bytes) => Some(FailWrites {
            after_bytes,
            errno: match f.test.fail_errno.as_deref().unwrap_or("EIO") {
                "EIO" => libc::EIO,
                "ENOSPC" => libc::ENOSPC,
                other => bail!("test.fail_errno = {other:?}: EIO or ENOSPC"),
            },
        }),
    };
    Ok(fail_writes)
}

/// The policy and the fault path's settings; the shadow entries sized from the limit.
fn resolve_policy(f: &FileConfig, o: &Overrides, limit: u64) -> anyhow::Result<PolicyConfig> {
    let mut policy = PolicyConfig::default();
    if let Some(s) = &f.policy.name {
        policy.kind = parse_policy(s).map_err(|e| anyhow::anyhow!("policy.name: {e}"))?;
    }
    if let Some(s) = &f.policy.access {
        policy.access = parse_access(s).map_err(|e| anyhow::anyhow!("policy.access: {e}"))?;
    }
    if let Some(p) = f.policy.page_cluster {
        if p > 4 {
            bail!("policy.page_cluster = {p}: 0 to 4 (at most 16 pages)");
        }
        policy.page_cluster = p;
    }
    if let Some(us) = f.fault.spin_us {
        if us > MAX_SPIN_US {
            bail!("fault.spin_us = {us}: 0 to {MAX_SPIN_US}");
        }
        policy.fault_spin = std::time::Duration::from_micros(us);
    }
    if let Some(us) = f.fault.idle_poll_us {
        let max = crate::idlepoll::MAX_IDLE_POLL_US;
        if us > max {
            bail!("fault.idle_poll_us = {us}: 0 to {max}");
        }
        policy.fault_idle_poll = std::time::Duration::from_micros(us);
    }
    if let Some(rt) = f.fault.realtime {
        policy.fault_realtime = rt;
    }
    if let Some(s) = f.fault.spread {
        policy.fault_spread = s;
    }
    if let Some(m) = &f.fault.idle_poll {
        policy.fault_idle_poll_mode = match m.as_str() {
            "kernel" => crate::idlepoll::Mode::Kernel,
            "keepers" => crate::idlepoll::Mode::Keepers,
            _ => bail!("fault.idle_poll = {m:?}: \"kernel\" or \"keepers\""),
        };
    }
    if f.fault.cpu_latency_us.is_some() {
        // Held for the whole run by every handler, it did what `idle_poll = "kernel"` (the
        // default as root) now does for the length of each fault storm only.
        bail!(
            "fault.cpu_latency_us is gone: `idle_poll = \"kernel\"` (the default as root) \
             holds /dev/cpu_dma_latency at 0 during fault storms; remove the key"
        );
    }
    if let Some(ms) = f.test.drop_timeout_ms {
        if !(1..=600_000).contains(&ms) {
            bail!("test.drop_timeout_ms = {ms}: 1 to 600000");
        }
        policy.drop_timeout = std::time::Duration::from_millis(ms);
    }
    if let Some(u) = &f.unmanaged {
        policy.unmanaged =
            crate::unmanaged::Policy::parse(u).map_err(|e| anyhow::anyhow!("unmanaged = {e}"))?;
    }
    if let Some(u) = o.unmanaged {
        policy.unmanaged = u;
    }
    if let Some(k) = o.policy {
        policy.kind = k;
    }
    policy.max_shadows = ((limit / 4096) as usize).clamp(1024, 1 << 20);
    if let Some(a) = o.access {
        policy.access = a;
    }
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> tempfile_path::TempPath {
        tempfile_path::TempPath::with(text)
    }

    mod tempfile_path {
        pub(super) struct TempPath(pub std::path::PathBuf);
        impl TempPath {
            pub(super) fn with(text: &str) -> Self {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "uffd-daemon-config-{}-{}.toml",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::write(&p, text).unwrap();
                TempPath(p)
            }
        }
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn file_and_overrides() {
        let p = write(
            "limit = \"64M\"\n[tiers]\nbackend = \"pmem:/tmp/x\"\nswap_size = \"1G\"\n\
             [zswap]\ncompressor = \"zstd:3\"\nmax_pool = \"32M\"\n[policy]\nname = \"clock\"\npage_cluster = 2\n\
             [fault]\nspin_us = 0\nidle_poll_us = 50\nidle_poll = \"keepers\"\nrealtime = true\nspread = false\n",
        );
        let r = resolve(Some(&p.0), &Overrides::default()).unwrap();
        assert_eq!(r.limit, 64 << 20);
        assert!(r.tiers.encrypt, "encryption at rest is on by default");
        assert_eq!(r.tiers.backend, BackendSpec::Pmem("/tmp/x".into()));
        assert_eq!(r.tiers.swap_bytes, 1 << 30);
        let z = r.tiers.zswap.as_ref().unwrap();
        assert_eq!(z.compressor, Compressor::Zstd { level: 3 });
        assert_eq!(z.max_pool_bytes, 32 << 20);
        assert_eq!(r.policy.kind, PolicyKind::Clock);
        assert_eq!(r.policy.page_cluster, 2);
        assert_eq!(r.policy.fault_spin, std::time::Duration::ZERO);
        assert_eq!(
            r.policy.fault_idle_poll,
            std::time::Duration::from_micros(50)
        );
        assert_eq!(
            r.policy.fault_idle_poll_mode,
            crate::idlepoll::Mode::Keepers
        );
        assert!(r.policy.fault_realtime);
        assert!(!PolicyConfig::default().fault_realtime, "opt-in");
        assert!(!r.policy.fault_spread);
        assert!(PolicyConfig::default().fault_spread, "on by default");
        let o = Overrides {
            limit: Some(1 << 30),
            zswap: Some(None),
            backend: Some(BackendSpec::File(None)),
            ..Overrides::default()
        };
        let r = resolve(Some(&p.0), &o).unwrap();
        assert_eq!(r.limit, 1 << 30);
        assert!(r.tiers.zswap.is_none());
        assert_eq!(r.tiers.backend, BackendSpec::File(None));
    }

    /// `[tiers] encrypt`, and `--encrypt` over it.
    #[test]
    fn encryption_at_rest_setting() {
        let off = write("limit = \"64M\"\n[tiers]\nencrypt = false\n");
        let r = resolve(Some(&off.0), &Overrides::default()).unwrap();
        assert!(!r.tiers.encrypt);
        let on = Overrides {
            encrypt: Some(true),
            ..Overrides::default()
        };
        assert!(resolve(Some(&off.0), &on).unwrap().tiers.encrypt);
        let p = write("limit = \"64M\"\n[tiers]\nencrypt = true\n");
        let o = Overrides {
            encrypt: Some(false),
            ..Overrides::default()
        };
        assert!(!resolve(Some(&p.0), &o).unwrap().tiers.encrypt);
        assert_eq!(parse_on_off("on"), Ok(true));
        assert_eq!(parse_on_off("off"), Ok(false));
        assert!(parse_on_off("aes").unwrap_err().contains("on or off"));
    }

    #[test]
    fn errors_name_what_is_wrong() {
        // A file alone: the words its error must name.
        for (text, names) in [
            (
                "limit = \"64M\"\n[zswap]\ncompresor = \"lz4\"\n",
                &["compresor"][..],
            ),
            ("limit = \"64Q\"\n", &["limit", "unit"]),
            (
                "limit = \"64M\"\n[fault]\nspin_us = 5000\n",
                &["fault.spin_us", "1000"],
            ),
            (
                "limit = \"64M\"\n[fault]\nidle_poll = \"spin\"\n",
                &["fault.idle_poll", "spin", "kernel", "keepers"],
            ),
            (
                "limit = \"64M\"\n[fault]\nidle_poll_us = 20000\n",
                &["fault.idle_poll_us", "10000"],
            ),
            (
                "limit = \"64M\"\n[fault]\ncpu_latency_us = 0\n",
                &["fault.cpu_latency_us", "idle_poll", "remove"],
            ),
            (
                "limit = \"64M\"\n[tiers]\nencrypted = true\n",
                &["encrypted", "encrypt"],
            ),
            (
                "limit = \"64M\"\n[tiers]\nencrypt = \"aes\"\n",
                &["encrypt", "bool"],
            ),
        ] {
            let p = write(text);
            let e = format!(
                "{:#}",
                resolve(Some(&p.0), &Overrides::default()).unwrap_err()
            );
            assert!(names.iter().all(|n| e.contains(n)), "{text:?}: {e}");
        }
        let p = write("[tiers]\nbackend = \"tape:/dev/st0\"\n");
        let o = Overrides {
            limit: Some(1 << 30),
            ..Overrides::default()
        };
        let e = format!("{:#}", resolve(Some(&p.0), &o).unwrap_err());
        assert!(e.contains("tape"), "{e}");
        let o = Overrides {
            limit: Some(1 << 30),
            zswap: Some(None),
            backend: Some(BackendSpec::None),
            ..Overrides::default()
        };
        let e = format!("{:#}", resolve(None, &o).unwrap_err());
        assert!(e.contains("no tier"), "{e}");
        assert!(resolve(None, &Overrides::default()).is_err(), "no limit");
        assert!(parse_compressor("zstd:99").is_err());
        assert_eq!(
            parse_compressor("zstd:-3").unwrap(),
            Compressor::Zstd { level: -3 }
        );
    }

    /// `--backend redis-cluster:...` and the `[redis_cluster]` section: values land, the
    /// password is never printed, and each mistake is named.
    #[test]
    fn redis_cluster_backend_and_section() {
        use crate::tiers::RedisClusterConfig;
        use std::time::Duration;
        let spec =
            BackendSpec::parse("redis-cluster:127.0.0.1:7000,[::1]:7001,node-a:7002").unwrap();
        let BackendSpec::RedisCluster(c) = &spec else {
            panic!("{spec:?}")
        };
        assert_eq!(c.nodes, ["127.0.0.1:7000", "[::1]:7001", "node-a:7002"]);
        assert_eq!(c.replicas, 1, "WAIT for one replica by default");
        for (bad, names) in [
            ("redis-cluster:", &["\"\"", "HOST:PORT"][..]),
            ("redis-cluster:host", &["host", "HOST:PORT"]),
            ("redis-cluster:host:0", &["port", "1 to 65535"]),
            ("redis-cluster:h:7000,h:x", &["h:x", "port"]),
            ("redis-cluster:::1:7000", &["IPv6", "brackets"]),
        ] {
            let e = BackendSpec::parse(bad).unwrap_err();
            assert!(names.iter().all(|n| e.contains(n)), "{bad}: {e}");
        }
        let p = write(
            "limit = \"64M\"\n[tiers]\nbackend = \"redis-cluster:127.0.0.1:7000\"\n\
             [redis_cluster]\npassword = \"hunter2\"\nusername = \"uffd\"\nreplicas = 2\n\
             connect_timeout_ms = 300\nresponse_timeout_ms = 900\nwait_timeout_ms = 400\n\
             read_retry_ms = 5000\nwrite_retry_ms = 0\n",
        );
        let r = resolve(Some(&p.0), &Overrides::default()).unwrap();
        let BackendSpec::RedisCluster(c) = &r.tiers.backend else {
            panic!("{:?}", r.tiers.backend)
        };
        assert_eq!(
            **c,
            RedisClusterConfig {
                nodes: vec!["127.0.0.1:7000".into()],
                username: Some("uffd".into()),
                password: Some("hunter2".into()),
                connect_timeout: Duration::from_millis(300),
                response_timeout: Duration::from_millis(900),
                replicas: 2,
                wait_timeout: Duration::from_millis(400),
                read_retry: Duration::from_millis(5000),
                write_retry: Duration::ZERO,
            }
        );
        assert!(
            !format!("{r:?}").contains("hunter2"),
            "the password is printed"
        );
        // The command line's nodes take the file's settings.
        let o = Overrides {
            backend: Some(BackendSpec::parse("redis-cluster:10.0.0.1:6379").unwrap()),
            ..Overrides::default()
        };
        let r = resolve(Some(&p.0), &o).unwrap();
        let BackendSpec::RedisCluster(c) = &r.tiers.backend else {
            panic!()
        };
        assert_eq!((c.nodes[0].as_str(), c.replicas), ("10.0.0.1:6379", 2));
        for (section, names) in [
            (
                "replicas = 99\n",
                &["redis_cluster.replicas", "0 to 16"][..],
            ),
            ("wait_timeout_ms = 0\n", &["wait_timeout_ms", "1 to"]),
            (
                "wait_timeout_ms = 3000\n",
                &["wait_timeout_ms", "below response_timeout_ms"],
            ),
            ("pasword = \"x\"\n", &["pasword", "password"]),
        ] {
            let p = write(&format!(
                "limit = \"64M\"\n[tiers]\nbackend = \"redis-cluster:h:1\"\n[redis_cluster]\n{section}"
            ));
            let e = format!(
                "{:#}",
                resolve(Some(&p.0), &Overrides::default()).unwrap_err()
            );
            assert!(names.iter().all(|n| e.contains(n)), "{section:?}: {e}");
        }
    }

    /// `--backend NEAR,FAR` is a chain; `[tiers] near_size` and `migrate_*` (and
    /// `--near-size`) set it, the `[redis_cluster]` section reaches its far tier; a chain's
    /// settings without a chain, and chains that cannot work, are refused by name.
    #[test]
    fn chain_backend_and_settings() {
        let c = BackendSpec::parse("file,redis-cluster:127.0.0.1:7000,127.0.0.1:7001").unwrap();
        let BackendSpec::Chain(c) = c else {
            panic!("{c:?}")
        };
        assert_eq!(c.near, BackendSpec::File(None));
        let BackendSpec::RedisCluster(far) = &c.far else {
            panic!("{:?}", c.far)
        };
        assert_eq!(far.nodes, ["127.0.0.1:7000", "127.0.0.1:7001"]);
        assert!(matches!(
            BackendSpec::parse("redis-cluster:h:1,h:2"),
            Ok(BackendSpec::RedisCluster(_))
        ));
        assert!(matches!(
            BackendSpec::parse("pmem:/x,file:/y"),
            Ok(BackendSpec::Chain(_))
        ));
        for (bad, names) in [
            ("none,file:/y", &["first tier", "file"][..]),
            ("file,none", &["second tier", "none"]),
            ("redis-cluster:h:1,file", &["redis-cluster node \"file\""]),
            ("file,file,file", &["second tier", "another chain"]),
        ] {
            let e = BackendSpec::parse(bad).unwrap_err();
            assert!(names.iter().all(|n| e.contains(n)), "{bad}: {e}");
        }
        let p = write(
            "limit = \"64M\"\n[tiers]\nbackend = \"file,redis-cluster:127.0.0.1:7000\"\n\
             near_size = \"32M\"\nmigrate_high_percent = 80\nmigrate_low_percent = 50\n\
             migrate_age_ms = 1500\nmigrate_batch_pages = 64\n[redis_cluster]\nreplicas = 0\n",
        );
        let r = resolve(Some(&p.0), &Overrides::default()).unwrap();
        let BackendSpec::Chain(c) = &r.tiers.backend else {
            panic!("{:?}", r.tiers.backend)
        };
        assert_eq!(c.near_bytes, 32 << 20);
        assert_eq!((c.migrate_high_percent, c.migrate_low_percent), (80, 50));
        assert_eq!(c.migrate_age, Some(Duration::from_millis(1500)));
        assert_eq!(c.migrate_batch_pages, 64);
        let BackendSpec::RedisCluster(far) = &c.far else {
            panic!()
        };
        assert_eq!(
            far.replicas, 0,
            "the [redis_cluster] section reaches the far tier"
        );
        let o = Overrides {
            near_size: Some(8 << 20),
            ..Overrides::default()
        };
        let r = resolve(Some(&p.0), &o).unwrap();
        let BackendSpec::Chain(c) = &r.tiers.backend else {
            panic!()
        };
        assert_eq!(c.near_bytes, 8 << 20, "--near-size over the file");
        for (text, names) in [
            (
                "backend = \"file\"\nnear_size = \"8M\"\n",
                &["near_size", "not a chain"][..],
            ),
            (
                "backend = \"file,file:/x\"\nmigrate_low_percent = 95\n",
                &[
                    "migrate_low_percent = 95",
                    "below migrate_high_percent = 90",
                ],
            ),
            (
                "backend = \"file,file:/x\"\nnear_size = \"4K\"\n",
                &["near_size", "at least 1M"],
            ),
            (
                "backend = \"file,file:/x\"\nmigrate_age_ms = 0\n",
                &["migrate_age_ms = 0"],
            ),
        ] {
            let p = write(&format!("limit = \"64M\"\n[tiers]\n{text}"));
            let e = format!(
                "{:#}",
                resolve(Some(&p.0), &Overrides::default()).unwrap_err()
            );
            assert!(names.iter().all(|n| e.contains(n)), "{text:?}: {e}");
        }
    }
}
