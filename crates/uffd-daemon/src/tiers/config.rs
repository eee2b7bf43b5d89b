//! What the tiers are made of: the backing device, the swap space, the compressed tier, as the
//! configuration and the command line give them.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use zswap::Compressor;

/// Where the backing device lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSpec {
    /// No backing device: zswap only (pages zswap refuses stay resident).
    None,
    /// A swap file: the named path (created 0600, must not exist, removed at exit), or an
    /// unnamed temporary file when `None`.
    File(Option<PathBuf>),
    /// A pmem-backed device: a DAX character device (`/dev/daxX.Y`), a file on a DAX mount
    /// (mapped with `MAP_SYNC`), or else an ordinary file mapped shared ("simulated pmem").
    /// A file is created 0600 (must not exist) and removed at exit.
    Pmem(PathBuf),
    /// A Redis Cluster (`redis_cluster.rs`): the nodes to reach it through (any one that
    /// answers will do) and the `[redis_cluster]` settings.
    RedisCluster(Box<RedisClusterConfig>),
    /// Two backends as a chain (`chain.rs`): pages go to the near one (a file or pmem,
    /// bounded), and move down to the far one (a Redis Cluster) as the near one fills or they
    /// age: `--backend file,redis-cluster:HOST:PORT,...`.
    Chain(Box<ChainSpec>),
}

/// A chain of two backends and when pages move from the first to the second (`[tiers]`
/// `near_size` and `migrate_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSpec {
    /// The near tier: `file`, `file:PATH` or `pmem:PATH`.
    pub near: BackendSpec,
    /// The far tier: any backend but `none` or another chain.
    pub far: BackendSpec,
    /// The near tier's size in bytes (0: a quarter of the swap space).
    pub near_bytes: u64,
    /// Migration starts when the near tier holds this share of its pages…
    pub migrate_high_percent: u8,
    /// …and goes on down to this share.
    pub migrate_low_percent: u8,
    /// Pages older than this move down whatever the near tier's fill (`None`: by fill only).
    pub migrate_age: Option<Duration>,
    /// Pages a migration batch moves at most.
    pub migrate_batch_pages: usize,
}

impl ChainSpec {
    /// `near` then `far`, with the default migration settings.
    pub fn new(near: BackendSpec, far: BackendSpec) -> Self {
        ChainSpec {
            near,
            far,
            near_bytes: 0,
            migrate_high_percent: 90,
            migrate_low_percent: 70,
            migrate_age: None,
            migrate_batch_pages: 256,
        }
    }

    /// Checks the settings against each other.
    pub fn validate(&self) -> Result<(), String> {
        if !matches!(self.near, BackendSpec::File(_) | BackendSpec::Pmem(_)) {
            return Err(format!(
                "the first tier of a chain must be file, file:PATH or pmem:PATH, not {:?}",
                self.near
            ));
        }
        if matches!(self.far, BackendSpec::None | BackendSpec::Chain(_)) {
            return Err(
                "the second tier of a chain must be a backend (file:PATH, pmem:PATH or \
                        redis-cluster:...), not none or another chain"
                    .into(),
            );
        }
        if self.near_bytes != 0 && self.near_bytes < 1 << 20 {
            return Err(format!(
                "tiers.near_size = {} bytes: at least 1M (a migration batch and room beside it)",
                self.near_bytes
            ));
        }
        if !(self.migrate_low_percent < self.migrate_high_percent
            && self.migrate_high_percent <= 100)
        {
            return Err(format!(
                "tiers.migrate_low_percent = {} must be below migrate_high_percent = {}, which \
                 is at most 100",
                self.migrate_low_percent, self.migrate_high_percent
            ));
        }
        if self.migrate_batch_pages == 0 || self.migrate_batch_pages > 8192 {
            return Err(format!(
                "tiers.migrate_batch_pages = {}: 1 to 8192",
                self.migrate_batch_pages
            ));
        }
        Ok(())
    }
}

/// How the daemon talks to a Redis Cluster (`--backend redis-cluster:...` and the
/// configuration's `[redis_cluster]` section).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisClusterConfig {
    /// `HOST:PORT` of the nodes to start from (`[::1]:PORT` for IPv6).
    pub nodes: Vec<String>,
    /// ACL user (`AUTH user password`); `None` for the default user.
    pub username: Option<String>,
    /// `requirepass`/ACL password.
    pub password: Option<String>,
    /// Timeout of a TCP connection to a node.
    pub connect_timeout: Duration,
    /// Timeout of a node's answer (each socket read); above `wait_timeout`.
    pub response_timeout: Duration,
    /// Replicas a write must reach before it counts as stored (`WAIT`); 0: no `WAIT`.
    pub replicas: u32,
    /// How long `WAIT` waits for them.
    pub wait_timeout: Duration,
    /// How long a read keeps retrying (a failover in progress) before it fails: a fault
    /// waits at most about this long for the cluster.
    pub read_retry: Duration,
    /// How long a write keeps retrying before it fails (the pages then stay in memory and
    /// reclaim tries again later).
    pub write_retry: Duration,
}

impl Default for RedisClusterConfig {
    fn default() -> Self {
        RedisClusterConfig {
            nodes: Vec::new(),
            username: None,
            password: None,
            connect_timeout: Duration::from_millis(1000),
            response_timeout: Duration::from_millis(2000),
            replicas: 1,
            wait_timeout: Duration::from_millis(1000),
            read_retry: Duration::from_millis(15_000),
            write_retry: Duration::from_millis(1000),
        }
    }
}

impl fmt::Debug for RedisClusterConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClusterConfig")
            .field("nodes", &self.nodes)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "(set)"))
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("replicas", &self.replicas)
            .field("wait_timeout", &self.wait_timeout)
            .field("read_retry", &self.read_retry)
            .field("write_retry", &self.write_retry)
            .finish()
    }
}

impl RedisClusterConfig {
    /// Parses the node list of `redis-cluster:HOST:PORT[,HOST:PORT...]`.
    pub fn parse_nodes(list: &str) -> Result<Vec<String>, String> {
        let mut nodes = Vec::new();
        for n in list.split(',') {
            let n = n.trim();
            let (host, port) = n.rsplit_once(':').ok_or_else(|| {
                format!("redis-cluster node {n:?}: expected HOST:PORT (e.g. 127.0.0.1:7000)")
            })?;
            let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
            if host.is_empty() || (bare.is_none() && host.contains(':')) || bare == Some("") {
                return Err(format!(
                    "redis-cluster node {n:?}: expected HOST:PORT, an IPv6 host in brackets \
                     ([::1]:7000)"
                ));
            }
            match port.parse::<u16>() {
                Ok(p) if p > 0 => {}
                _ => {
                    return Err(format!(
                        "redis-cluster node {n:?}: port {port:?} is not 1 to 65535"
                    ))
                }
            }
            nodes.push(n.to_string());
        }
        Ok(nodes)
    }

    /// Checks the settings against each other.
    pub fn validate(&self) -> Result<(), String> {
        if self.nodes.is_empty() {
            return Err("redis-cluster: no node given".into());
        }
        for (name, d) in [
            ("connect_timeout_ms", self.connect_timeout),
            ("response_timeout_ms", self.response_timeout),
            ("wait_timeout_ms", self.wait_timeout),
        ] {
            if d.is_zero() {
                return Err(format!("redis_cluster.{name} = 0: at least 1"));
            }
        }
        if self.replicas > 0 && self.wait_timeout >= self.response_timeout {
            return Err(format!(
                "redis_cluster.wait_timeout_ms = {} must be below response_timeout_ms = {} (a \
                 WAIT that waits its whole timeout must still be answered in time)",
                self.wait_timeout.as_millis(),
                self.response_timeout.as_millis()
            ));
        }
        Ok(())
    }
}

impl BackendSpec {
    /// Parses `none`, `file`, `file:PATH`, `pmem:PATH`, `redis-cluster:HOST:PORT[,HOST:PORT...]`,
    /// or a chain of two of them, near first: `NEAR,FAR` (`file,redis-cluster:HOST:PORT,...`).
    pub fn parse(s: &str) -> Result<Self, String> {
        if let Some((near, far)) = s
            .split_once(',')
            .filter(|_| !s.starts_with("redis-cluster:"))
        {
            let c = ChainSpec::new(Self::parse(near)?, Self::parse(far)?);
            c.validate()?;
            return Ok(BackendSpec::Chain(Box::new(c)));
        }
        match s.split_once(':') {
            Some(("redis-cluster", nodes)) => {
                Ok(BackendSpec::RedisCluster(Box::new(RedisClusterConfig {
                    nodes: RedisClusterConfig::parse_nodes(nodes)?,
                    ..RedisClusterConfig::default()
                })))
            }
            None if s == "none" => Ok(BackendSpec::None),
            None if s == "file" => Ok(BackendSpec::File(None)),
            Some(("file", p)) if !p.is_empty() => Ok(BackendSpec::File(Some(PathBuf::from(p)))),
            Some(("pmem", p)) if !p.is_empty() => Ok(BackendSpec::Pmem(PathBuf::from(p))),
            _ => Err(format!(
                "unknown backend {s:?}: expected none, file, file:PATH, pmem:PATH, \
                 redis-cluster:HOST:PORT[,HOST:PORT...], or a chain NEAR,FAR of a file (or \
                 pmem) then another backend (file,redis-cluster:HOST:PORT,...)"
            )),
        }
    }
}

/// An injected failure, for tests of the failure paths (`[backend] fail_writes_after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailWrites {
    /// Writes succeed for this many bytes, then every write fails.
    pub after_bytes: u64,
    /// The errno they fail with (`EIO` or `ENOSPC`).
    pub errno: i32,
}

/// The tiers' configuration.
#[derive(Debug, Clone)]
pub struct TierConfig {
    /// The compressed tier; `None` to write evicted pages straight to the backend.
    pub zswap: Option<ZswapTier>,
    /// The backing device.
    pub backend: BackendSpec,
    /// Size of the swap space (slots on the device, and the backend's size), bytes.
    pub swap_bytes: u64,
    /// Evict aligned runs of 16 pages as one order-4 folio.
    pub large_folios: bool,
    /// Punch freed clusters out of a swap file (the discard hook).
    pub discard: bool,
    /// Seal every page written to the backend with AES-256-GCM under a key held only in the
    /// daemon's locked memory (`SealedBackend`). No effect without a backend.
    pub encrypt: bool,
    /// Without encryption: check every page read back from the backend against the CRC-32C
    /// it was written with (`ChecksummedBackend`). No effect without a backend, or with
    /// encryption (its tags authenticate every page).
    pub checksums: bool,
    /// Failure injection (tests).
    pub fail_writes: Option<FailWrites>,
    /// Failure injection (tests): once this many bytes of the swap file are on the disk, every
    /// later wait for its writeback reports `EIO`, and the range reads back as `0xEE` bytes
    /// (what a write the disk lost reads as).
    pub fail_writeback_after: Option<u64>,
    /// Directory for an unnamed swap file.
    pub tmp_dir: PathBuf,
}

/// The compressed tier's settings.
#[derive(Debug, Clone)]
pub struct ZswapTier {
    /// The compressor.
    pub compressor: Compressor,
    /// The pool's limit in bytes.
    pub max_pool_bytes: u64,
    /// Accept threshold, percent of the limit.
    pub accept_threshold_percent: u8,
    /// Compress large folios as one multi-page object (better ratio, costlier single loads).
    pub multi_page: bool,
    /// CRC32C of every page, checked on load.
    pub crc: bool,
    /// Writeback to the backend starts when the pool passes this percentage of its limit.
    pub writeback_start_percent: u8,
}

impl Default for ZswapTier {
    fn default() -> Self {
        ZswapTier {
            compressor: Compressor::Lz4,
            max_pool_bytes: 256 << 20,
            accept_threshold_percent: 90,
            multi_page: false,
            crc: true,
            writeback_start_percent: 95,
        }
    }
}
