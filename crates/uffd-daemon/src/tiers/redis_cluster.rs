//! The far-memory tier: a Redis Cluster as the backing device (issue #22).
//!
//! The daemon offloads its cold pages to other machines' memory through a store that is
//! already run well elsewhere, rather than a server of its own: Redis Cluster shards keys over
//! masters, replicates each master to its replicas and fails over by itself. This backend is
//! one more [`Backend`]: the tiers above it (zswap's writeback, the sealing layer) hand it
//! offset-addressed writes and reads, exactly as they do a swap file, so with encryption at rest
//! (the default) the cluster only ever holds ciphertext and tags.
//!
//! * **Keys.** The device is cut into stripes of [`STRIPE_PAGES`] pages (1 MiB, the sealing
//!   layer's group of 255 pages and their page of tags). Device page `p` is the string key
//!   `uffd:{RUN:S}:I` with `S = p / 256`, `I = p % 256` and `RUN` a random 64-bit id drawn at
//!   start (two daemons, or two runs of one, never share a key). The braces are a hash tag:
//!   a stripe's keys share one hash slot, so one master; a run of slots (a folio, a readahead
//!   window, a page and its tag) is one node's. A whole page is a `SET`/`GET`; a part of one
//!   (the 16-byte tags) a `SETRANGE`/`GETRANGE` of the tag page's key.
//! * **Batching.** `write_all` (an eviction batch, a writeback batch) groups its commands by
//!   the master that owns their stripes and sends each master one pipeline, ending in `WAIT
//!   replicas timeout`; `read_all` (a readahead run and its tags) one pipeline of `GET`s per
//!   master. The pipelines are sent through the `redis` crate's cluster connection (which
//!   routes a pipeline by its first key and follows `MOVED`/`ASK`), grouped by a map of slots
//!   to masters read with `CLUSTER SLOTS`. The masters' pipelines of one call go out at once,
//!   each from a thread of its own beyond the first (scoped threads, each with a connection).
//! * **WAIT.** A write counts as stored only once the `WAIT` at the end of its node's pipeline
//!   says that `replicas` replicas acknowledged it. `WAIT` counts the writes of its own
//!   connection, and it is on the same connection and in the same pipeline as the writes, so
//!   the answer is about those writes. A shortfall fails the writes of that pipeline: the pages
//!   stay resident or in zswap (the tiers' existing failure path), and a master killed after
//!   an acknowledged write loses nothing, since its replica has it.
//! * **Failures.** Every request is bounded: connection and response timeouts on each socket,
//!   and a deadline on the retries (`write_retry`, short: an eviction that fails is simply
//!   retried later by reclaim's backoff; `read_retry`, longer: a fault waits out a failover, up
//!   to that bound, and then fails, which stops the client rather than hand it wrong bytes).
//!   A retry drops the connection and makes a new one, which reads the topology anew. A key
//!   that is missing, or shorter than asked, is an error at once (no retry makes it appear).
//!   Each kind of trouble is said once and counted (`cluster_*` counters).
//! * **Discards** (a freed cluster of slots) are unlinked asynchronously by a thread of the
//!   backend, in batches of `UNLINK`s, one pipeline per master. A write never loses to a late
//!   unlink: the keys it writes are first taken out of the queue, and if the unlinker is
//!   sending a batch with one of them, the write waits for that batch to finish.
//! * **At exit** ([`Backend::close`]) the queue is drained and every key of the run is
//!   unlinked: the stripes the run wrote are remembered (a few bytes per MiB of device).
//!   A daemon killed with SIGKILL leaves its keys behind: `uffd:{RUN:*` finds them.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConnection};
use redis::{ConnectionLike, Value};

use super::config::RedisClusterConfig;
use super::Backend;
use crate::sys::{PAGE_SIZE, PAGE_SIZE_U64};

/// Device pages per stripe (one hash tag): the sealing layer's group of 255 pages and a page
/// of tags, 1 MiB.
pub const STRIPE_PAGES: u64 = 256;

/// Keys queued for unlinking that one batch of the unlinker takes at most.
const UNLINK_BATCH_PAGES: usize = 8192;

/// The first wait before a retry; it doubles up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// The hash slot of a key (Redis Cluster's CRC16-XMODEM of the hash tag, mod 16384).
pub fn key_slot(key: &[u8]) -> u16 {
    let tag = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc & 16383
}

/// The backend's counters (in the stats as `cluster_*`).
#[derive(Debug, Default)]
pub struct ClusterStats {
    /// Pipelines of writes sent (one per master per batch and attempt).
    pub write_pipelines: AtomicU64,
    /// Pipelines of reads sent.
    pub read_pipelines: AtomicU64,
    /// Pipelines of unlinks sent.
    pub unlink_pipelines: AtomicU64,
    /// Attempts repeated after a failure (node down, failover, timeout, WAIT short).
    pub retries: AtomicU64,
    /// Cluster connections made (the first, and one after each failure).
    pub connects: AtomicU64,
    /// Pipelines whose `WAIT` counted fewer replicas than asked for.
    pub wait_shortfalls: AtomicU64,
    /// Writes (of a batch) that failed after their retries.
    pub write_failures: AtomicU64,
    /// Reads that failed after their retries, or found a key missing.
    pub read_failures: AtomicU64,
    /// Keys found missing (or short) on a read.
    pub missing_keys: AtomicU64,
    /// Keys queued for unlinking by discards.
    pub discarded_keys: AtomicU64,
    /// Queued unlinks taken back because their key was written again first.
    pub unlinks_cancelled: AtomicU64,
    /// Keys unlinked (existing ones, as `UNLINK` counts them), discards and the exit's.
    pub keys_unlinked: AtomicU64,
    /// Keys unlinked at exit (`close`).
    pub keys_unlinked_at_exit: AtomicU64,
    /// Microseconds spent in `write_all` / `read_all` (with retries).
    pub write_us: AtomicU64,
    /// See `write_us`.
    pub read_us: AtomicU64,
    /// Calls of `write_all` / `read_all` that reached the cluster.
    pub write_calls: AtomicU64,
    /// See `write_calls`.
    pub read_calls: AtomicU64,
}

/// The map of hash slots to masters (`CLUSTER SLOTS`), for grouping commands by node.
#[derive(Debug, Default)]
struct Topology {
    /// `(first slot, last slot, master "host:port")`, sorted.
    ranges: Vec<(u16, u16, Arc<str>)>,
    /// The fewest replicas any range has.
    min_replicas: usize,
}

impl Topology {
    fn node_of(&self, slot: u16) -> Option<&Arc<str>> {
        let i = self.ranges.partition_point(|r| r.1 < slot);
        self.ranges.get(i).filter(|r| r.0 <= slot).map(|r| &r.2)
    }

    fn parse(v: &Value) -> Option<Topology> {
        let Value::Array(entries) = v else {
            return None;
        };
        let int = |v: &Value| match v {
            Value::Int(i) => Some(*i),
            _ => None,
        };
        let mut t = Topology {
            ranges: Vec::new(),
            min_replicas: usize::MAX,
        };
        for e in entries {
            let Value::Array(e) = e else { return None };
            let (start, end) = (int(e.first()?)?, int(e.get(1)?)?);
            let Value::Array(master) = e.get(2)? else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let port = int(master.get(1)?)?;
            let addr = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            t.ranges.push((
                u16::try_from(start).ok()?,
                u16::try_from(end).ok()?,
                addr.into(),
            ));
            t.min_replicas = t.min_replicas.min(e.len() - 3);
        }
        t.ranges.sort_by_key(|r| r.0);
        if t.ranges.is_empty() {
            t.min_replicas = 0;
        }
        Some(t)
    }
}

/// The keys queued for unlinking and those being unlinked, as device page numbers.
#[derive(Debug, Default)]
struct UnlinkState {
    queued: BTreeSet<u64>,
    in_flight: HashSet<u64>,
    stop: bool,
}

/// What the backend and its unlinker thread share.
struct Shared {
    cfg: RedisClusterConfig,
    client: ClusterClient,
    run: String,
    /// Idle connections (each a connection to every node).
    idle: Mutex<Vec<ClusterConnection>>,
    topology: RwLock<Arc<Topology>>,
    unlinks: Mutex<UnlinkState>,
    /// Set while `unlinks` has anything queued or in flight (a write's fast path).
    unlinks_pending: AtomicBool,
    unlinks_cv: Condvar,
    /// Stripes the run has written to (unlinked whole at exit).
    stripes: Mutex<HashSet<u64>>,
    closed: AtomicBool,
    stats: ClusterStats,
    said_retry: AtomicBool,
    said_wait: AtomicBool,
    said_read: AtomicBool,
    said_unlink: AtomicBool,
}

/// A Redis Cluster as the backing device: see the module's documentation.
pub struct RedisClusterBackend {
    shared: Arc<Shared>,
    unlinker: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for RedisClusterBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClusterBackend")
            .field("nodes", &self.shared.cfg.nodes)
            .field("run", &self.shared.run)
            .field("replicas", &self.shared.cfg.replicas)
            .finish_non_exhaustive()
    }
}

/// One command of a batch: the call (`write`/`read`) it serves, the device page it touches
/// and the command.
struct Op {
    call: usize,
    page: u64,
    cmd: redis::Cmd,
    /// For a read: where its bytes go in the call's buffer, and how many are expected.
    at: usize,
    len: usize,
}

/// How a node's answer to an op is checked (and, for a read, where its bytes go); shared by
/// the threads that send the masters' pipelines at once.
type Check<'a> = dyn Fn(&Op, Value) -> Result<(), Failure> + Sync + 'a;

/// Why an attempt at a node's pipeline failed.
enum Failure {
    /// The request failed (node down, failover, timeout, MOVED after retries): try again.
    Transient(io::Error),
    /// A key is missing or short: no retry makes it appear.
    Missing(io::Error),
}

fn redis_err(what: &str, e: &redis::RedisError) -> io::Error {
    let kind = if e.is_timeout() {
        io::ErrorKind::TimedOut
    } else if e.is_connection_refusal() || e.is_connection_dropped() || e.is_io_error() {
        io::ErrorKind::ConnectionAborted
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, format!("Redis Cluster {what}: {e}"))
}

fn copy_err(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

impl RedisClusterBackend {
    /// Connects to the cluster (any of `cfg.nodes` that answers), reads its map of slots, and
    /// draws the run's id. Fails if no node answers or the cluster serves no slot.
    pub fn connect(cfg: &RedisClusterConfig) -> io::Result<Self> {
        let urls: Vec<String> = cfg.nodes.iter().map(|n| format!("redis://{n}")).collect();
        let mut b = ClusterClientBuilder::new(urls)
            .connection_timeout(cfg.connect_timeout)
            .response_timeout(cfg.response_timeout)
            // The crate's own retries are few and short: the backend's loop retries with a
            // fresh connection, under its own deadline.
            .retries(1)
            .min_retry_wait(5)
            .max_retry_wait(50);
        if let Some(u) = &cfg.username {
            b = b.username(u);
        }
        if let Some(p) = &cfg.password {
            b = b.password(p);
        }
        let client = b
            .build()
            .map_err(|e| redis_err("client configuration", &e))?;
        let mut id = [0u8; 8];
        crate::sys::random_bytes(&mut id)?;
        let shared = Arc::new(Shared {
            cfg: cfg.clone(),
            client,
            run: format!("{:016x}", u64::from_le_bytes(id)),
            idle: Mutex::new(Vec::new()),
            topology: RwLock::new(Arc::new(Topology::default())),
            unlinks: Mutex::new(UnlinkState::default()),
            unlinks_pending: AtomicBool::new(false),
            unlinks_cv: Condvar::new(),
            stripes: Mutex::new(HashSet::new()),
            closed: AtomicBool::new(false),
            stats: ClusterStats::default(),
            said_retry: AtomicBool::new(false),
            said_wait: AtomicBool::new(false),
            said_read: AtomicBool::new(false),
            said_unlink: AtomicBool::new(false),
        });
        let conn = shared.connection().map_err(|e| {
            let text = e.to_string();
            let hint = if text.contains("NOAUTH") || text.contains("Authentication") {
                "; the cluster wants a password: [redis_cluster] password (and username for an \
                 ACL user)"
            } else {
                ""
            };
            io::Error::new(
                e.kind(),
                format!(
                    "connecting to the Redis Cluster at {}: {e}{hint}",
                    cfg.nodes.join(",")
                ),
            )
        })?;
        shared.idle.lock().push(conn);
        let topo = shared.topology.read().clone();
        if topo.ranges.is_empty() {
            return Err(io::Error::other(format!(
                "the Redis Cluster at {} serves no hash slot (CLUSTER SLOTS is empty): is it \
                 created (redis-cli --cluster create)?",
                cfg.nodes.join(",")
            )));
        }
        if topo.min_replicas < cfg.replicas as usize {
            tracing::info!(
                "CLUSTER SLOTS lists {} replica(s) for a master and writes WAIT for \
                 {} ([redis_cluster] replicas): if it has no more, evictions to its slots fail \
                 and their pages stay in memory",
                topo.min_replicas,
                cfg.replicas
            );
        }
        let s = Arc::clone(&shared);
        let unlinker = std::thread::Builder::new()
            .name("uffd-unlink".into())
            .spawn(move || s.unlink_loop())?;
        Ok(RedisClusterBackend {
            shared,
            unlinker: Mutex::new(Some(unlinker)),
        })
    }

    /// The run's id (its keys are `uffd:{ID:*`).
    pub fn run_id(&self) -> &str {
        &self.shared.run
    }

    /// The counters.
    pub fn stats(&self) -> &ClusterStats {
        &self.shared.stats
    }
}

impl Shared {
    fn key(&self, page: u64) -> String {
        format!(
            "uffd:{{{}:{}}}:{}",
            self.run,
            page / STRIPE_PAGES,
            page % STRIPE_PAGES
        )
    }

    fn stripe_slot(&self, stripe: u64) -> u16 {
        key_slot(self.key(stripe * STRIPE_PAGES).as_bytes())
    }

    /// A fresh cluster connection, and the map of slots it sees.
    fn connection(&self) -> io::Result<ClusterConnection> {
        self.stats.connects.fetch_add(1, Ordering::Relaxed);
        let mut c = self
            .client
            .get_connection()
            .map_err(|e| redis_err("connection", &e))?;
        let v: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut c)
            .map_err(|e| redis_err("CLUSTER SLOTS", &e))?;
        let t = Topology::parse(&v).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("Redis Cluster: CLUSTER SLOTS answered {v:?}"),
            )
        })?;
        *self.topology.write() = Arc::new(t);
        Ok(c)
    }

    fn take_connection(&self) -> io::Result<ClusterConnection> {
        if self.closed.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the Redis Cluster backend is closed",
            ));
        }
        let idle = self.idle.lock().pop();
        match idle {
            Some(c) => Ok(c),
            None => self.connection(),
        }
    }

    /// Sends one node's pipeline of `ops` (plus `WAIT` when `wait`) and checks each answer
    /// with `check`. The connection goes back to the pool only after a success.
    fn node_pipeline(&self, ops: &[&Op], wait: bool, check: &Check<'_>) -> Result<(), Failure> {
        let mut pipe = redis::pipe();
        for op in ops {
            pipe.add_command(op.cmd.clone());
        }
        let n = ops.len() + usize::from(wait);
        if wait {
            pipe.cmd("WAIT")
                .arg(self.cfg.replicas)
                .arg(self.cfg.wait_timeout.as_millis() as u64);
        }
        let mut conn = self.take_connection().map_err(Failure::Transient)?;
        let packed = pipe.get_packed_pipeline();
        let values = conn
            .req_packed_commands(&packed, 0, n)
            .map_err(|e| Failure::Transient(redis_err("request", &e)))?;
        if values.len() != n {
            return Err(Failure::Transient(io::Error::other(format!(
                "Redis Cluster: {} answers to a pipeline of {n}",
                values.len()
            ))));
        }
        let mut values = values.into_iter();
        let mut result = Ok(());
        for op in ops {
            let v = values.next().unwrap_or(Value::Nil);
            if let Err(f) = check(op, v) {
                if result.is_ok() {
                    result = Err(f);
                }
            }
        }
        if wait {
            match values.next() {
                Some(Value::Int(k)) if k >= i64::from(self.cfg.replicas) => {}
                v => {
                    self.stats.wait_shortfalls.fetch_add(1, Ordering::Relaxed);
                    let got = match v {
                        Some(Value::Int(k)) => k.to_string(),
                        other => format!("{other:?}"),
                    };
                    let e = io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "Redis Cluster: WAIT {} {} counted {got} replica(s): the writes are \
                             not replicated as asked ([redis_cluster] replicas)",
                            self.cfg.replicas,
                            self.cfg.wait_timeout.as_millis()
                        ),
                    );
                    if !self.said_wait.swap(true, Ordering::Relaxed) {
                        tracing::info!(
                            "{e}; such writes fail and their pages stay in memory \
                             (said once, counted in cluster_wait_shortfalls)"
                        );
                    }
                    result = result.and(Err(Failure::Transient(e)));
                }
            }
        }
        // A connection that answered goes back, even after a failed check: it is in sync.
        self.idle.lock().push(conn);
        result
    }

    /// Runs `ops` as one pipeline per master, the masters' pipelines at once (a thread for each
    /// beyond the first), until each has succeeded, failed for good, or the deadline passed;
    /// `outcomes[call]` gets each call's outcome (the first error of its ops).
    fn run_ops(
        &self,
        ops: Vec<Op>,
        wait: bool,
        retry_for: Duration,
        pipelines: &AtomicU64,
        outcomes: &mut [Option<io::Error>],
        check: &Check<'_>,
    ) {
        let deadline = Instant::now() + retry_for;
        let mut backoff = FIRST_BACKOFF;
        let mut todo: Vec<Op> = ops;
        loop {
            let groups: Vec<Vec<&Op>> = {
                let topo = self.topology.read().clone();
                let mut by_node: HashMap<Option<Arc<str>>, Vec<&Op>> = HashMap::new();
                for op in &todo {
                    let node = topo
                        .node_of(self.stripe_slot(op.page / STRIPE_PAGES))
                        .cloned();
                    by_node.entry(node).or_default().push(op);
                }
                by_node.into_values().collect()
            };
            let mut again: Vec<usize> = Vec::new(); // calls to try again
            let mut last = None;
            pipelines.fetch_add(groups.len() as u64, Ordering::Relaxed);
            let answers: Vec<Result<(), Failure>> = match &groups[..] {
                [] => Vec::new(),
                [one] => vec![self.node_pipeline(one, wait, check)],
                [first, rest @ ..] => std::thread::scope(|scope| {
                    let others: Vec<_> = rest
                        .iter()
                        .map(|ops| scope.spawn(move || self.node_pipeline(ops, wait, check)))
                        .collect();
                    let mut v = vec![self.node_pipeline(first, wait, check)];
                    v.extend(others.into_iter().map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Failure::Transient(io::Error::other(
                                "a Redis Cluster pipeline's thread panicked",
                            )))
                        })
                    }));
                    v
                }),
            };
            for (ops, answer) in groups.iter().zip(answers) {
                let ops = &ops[..];
                match answer {
                    Ok(()) => {}
                    Err(Failure::Missing(e)) => {
                        for op in ops {
                            outcomes[op.call].get_or_insert_with(|| copy_err(&e));
                        }
                    }
                    Err(Failure::Transient(e)) => {
                        again.extend(ops.iter().map(|op| op.call));
                        last = Some(e);
                    }
                }
            }
            let Some(e) = last else { return };
            // Retry the calls that failed (all of their ops: a node's answer is all or none),
            // unless one of them already failed for good.
            again.sort_unstable();
            again.dedup();
            todo.retain(|op| again.binary_search(&op.call).is_ok() && outcomes[op.call].is_none());
            if todo.is_empty() {
                return;
            }
            // A fresh connection next time (it reads the map of slots anew).
            self.idle.lock().clear();
            let now = Instant::now();
            if now + backoff > deadline || self.closed.load(Ordering::Acquire) {
                for op in &todo {
                    outcomes[op.call].get_or_insert_with(|| copy_err(&e));
                }
                return;
            }
            self.stats.retries.fetch_add(1, Ordering::Relaxed);
            if !self.said_retry.swap(true, Ordering::Relaxed) {
                tracing::info!(
                    "{e}; retrying with a fresh connection, reads for up to {} ms and \
                     writes for up to {} ms ([redis_cluster] read_retry_ms, write_retry_ms; said \
                     once, counted in cluster_retries)",
                    self.cfg.read_retry.as_millis(),
                    self.cfg.write_retry.as_millis()
                );
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Takes the pages about to be written out of the unlink queue, and waits for a batch being
    /// unlinked that holds one of them.
    fn claim_for_write(&self, pages: &[u64]) {
        if !self.unlinks_pending.load(Ordering::Acquire) {
            return;
        }
        let mut st = self.unlinks.lock();
        let mut cancelled = 0;
        for p in pages {
            if st.queued.remove(p) {
                cancelled += 1;
            }
        }
        if cancelled > 0 {
            self.stats
                .unlinks_cancelled
                .fetch_add(cancelled, Ordering::Relaxed);
        }
        while pages.iter().any(|p| st.in_flight.contains(p)) {
            self.unlinks_cv.wait(&mut st);
        }
        if st.queued.is_empty() && st.in_flight.is_empty() {
            self.unlinks_pending.store(false, Ordering::Release);
        }
    }

    /// The unlinker thread: takes batches off the queue and unlinks them, until told to stop
    /// (after draining the queue).
    fn unlink_loop(&self) {
        loop {
            let batch: Vec<u64> = {
                let mut st = self.unlinks.lock();
                while st.queued.is_empty() && !st.stop {
                    self.unlinks_cv.wait(&mut st);
                }
                if st.queued.is_empty() {
                    return;
                }
                let mut batch = Vec::new();
                while batch.len() < UNLINK_BATCH_PAGES {
                    let Some(p) = st.queued.pop_first() else {
                        break;
                    };
                    st.in_flight.insert(p);
                    batch.push(p);
                }
                batch
            };
            self.unlink_pages(&batch);
            let mut st = self.unlinks.lock();
            st.in_flight.clear();
            if st.queued.is_empty() {
                self.unlinks_pending.store(false, Ordering::Release);
            }
            drop(st);
            self.unlinks_cv.notify_all();
        }
    }

    /// Unlinks the keys of `pages` (sorted): one `UNLINK` per stripe, one pipeline per master.
    /// Best effort: keys a failure leaves are unlinked at exit.
    fn unlink_pages(&self, pages: &[u64]) {
        let mut ops = Vec::new();
        let mut i = 0;
        while i < pages.len() {
            let stripe = pages[i] / STRIPE_PAGES;
            let mut cmd = redis::cmd("UNLINK");
            let mut j = i;
            while j < pages.len() && pages[j] / STRIPE_PAGES == stripe {
                cmd.arg(self.key(pages[j]));
                j += 1;
            }
            ops.push(Op {
                call: 0,
                page: pages[i],
                cmd,
                at: 0,
                len: 0,
            });
            i = j;
        }
        let mut outcome = [None];
        let stats = &self.stats;
        self.run_ops(
            ops,
            false,
            self.cfg.write_retry,
            &stats.unlink_pipelines,
            &mut outcome,
            &|_, v| {
                if let Value::Int(n) = v {
                    stats.keys_unlinked.fetch_add(n as u64, Ordering::Relaxed);
                }
                Ok(())
            },
        );
        if let [Some(e)] = outcome {
            if !self.said_unlink.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "unlinking discarded pages' keys failed: {e}; they are unlinked \
                     at exit (said once)"
                );
            }
        }
    }
}

/// The device pages `[offset, offset + len)` touches, as `(page, offset in it, length)`.
fn pieces(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize)> {
    let end = offset + len as u64;
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let page = at / PAGE_SIZE_U64;
        let within = (at % PAGE_SIZE_U64) as usize;
        let n = (PAGE_SIZE - within).min((end - at) as usize);
        at += n as u64;
        Some((page, within, n))
    })
}

impl Backend for RedisClusterBackend {
    fn describe(&self) -> String {
        format!(
            "redis-cluster {} (run {}, keys uffd:{{{}:*, writes WAIT for {} replica(s))",
            self.shared.cfg.nodes.join(","),
            self.shared.run,
            self.shared.run,
            self.shared.cfg.replicas
        )
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_all(&[(offset, data)]).pop().unwrap_or(Ok(()))
    }

    /// One pipeline per master: `SET` for each whole page, `SETRANGE` for each part of one,
    /// then `WAIT`.
    fn write_all(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        let s = &self.shared;
        let started = Instant::now();
        let mut ops = Vec::new();
        let mut pages = Vec::new();
        for (call, &(offset, data)) in writes.iter().enumerate() {
            let mut done = 0;
            for (page, within, n) in pieces(offset, data.len()) {
                let bytes = &data[done..done + n];
                done += n;
                let cmd = if n == PAGE_SIZE {
                    let mut c = redis::cmd("SET");
                    c.arg(s.key(page)).arg(bytes);
                    c
                } else {
                    let mut c = redis::cmd("SETRANGE");
                    c.arg(s.key(page)).arg(within).arg(bytes);
                    c
                };
                ops.push(Op {
                    call,
                    page,
                    cmd,
                    at: 0,
                    len: n,
                });
                pages.push(page);
            }
        }
        s.claim_for_write(&pages);
        {
            let mut stripes = s.stripes.lock();
            for p in &pages {
                stripes.insert(p / STRIPE_PAGES);
            }
        }
        let mut outcomes: Vec<Option<io::Error>> = (0..writes.len()).map(|_| None).collect();
        s.run_ops(
            ops,
            s.cfg.replicas > 0,
            s.cfg.write_retry,
            &s.stats.write_pipelines,
            &mut outcomes,
            &|op, v| match v {
                Value::Okay | Value::Int(_) => Ok(()),
                Value::SimpleString(ref t) if t == "OK" => Ok(()),
                other => Err(Failure::Transient(io::Error::other(format!(
                    "Redis Cluster: writing {} answered {other:?}",
                    s.key(op.page)
                )))),
            },
        );
        s.stats.write_calls.fetch_add(1, Ordering::Relaxed);
        s.stats
            .write_us
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        outcomes
            .into_iter()
            .map(|o| match o {
                None => Ok(()),
                Some(e) => {
                    s.stats.write_failures.fetch_add(1, Ordering::Relaxed);
                    Err(e)
                }
            })
            .collect()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.read_all(&mut [(offset, out)])
    }

    /// One pipeline per master: `GET` for each whole page, `GETRANGE` for each part of one.
    fn read_all(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        let s = &self.shared;
        let started = Instant::now();
        let mut ops = Vec::new();
        for (call, (offset, buf)) in reads.iter().enumerate() {
            let mut done = 0;
            for (page, within, n) in pieces(*offset, buf.len()) {
                let cmd = if n == PAGE_SIZE {
                    let mut c = redis::cmd("GET");
                    c.arg(s.key(page));
                    c
                } else {
                    let mut c = redis::cmd("GETRANGE");
                    c.arg(s.key(page)).arg(within).arg(within + n - 1);
                    c
                };
                ops.push(Op {
                    call,
                    page,
                    cmd,
                    at: done,
                    len: n,
                });
                done += n;
            }
        }
        let mut outcomes: Vec<Option<io::Error>> = (0..reads.len()).map(|_| None).collect();
        let reads = Mutex::new(reads);
        s.run_ops(
            ops,
            false,
            s.cfg.read_retry,
            &s.stats.read_pipelines,
            &mut outcomes,
            &|op, v| {
                let bytes = match v {
                    Value::BulkString(b) if b.len() == op.len => b,
                    other => {
                        s.stats.missing_keys.fetch_add(1, Ordering::Relaxed);
                        let got = match other {
                            Value::Nil => "no such key".to_string(),
                            Value::BulkString(b) => format!("{} bytes of {}", b.len(), op.len),
                            v => format!("{v:?}"),
                        };
                        return Err(Failure::Missing(io::Error::new(
                            io::ErrorKind::NotFound,
                            format!(
                                "Redis Cluster: {} ({got}): the page is lost",
                                s.key(op.page)
                            ),
                        )));
                    }
                };
                reads.lock()[op.call].1[op.at..op.at + op.len].copy_from_slice(&bytes);
                Ok(())
            },
        );
        s.stats.read_calls.fetch_add(1, Ordering::Relaxed);
        s.stats
            .read_us
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        match outcomes.into_iter().flatten().next() {
            None => Ok(()),
            Some(e) => {
                s.stats.read_failures.fetch_add(1, Ordering::Relaxed);
                if !s.said_read.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "reading from the Redis Cluster failed: {e} (said once, \
                         counted in cluster_read_failures)"
                    );
                }
                Err(e)
            }
        }
    }

    /// Queues the keys of the whole pages `[offset, offset + len)` covers for the unlinker.
    fn discard(&self, offset: u64, len: u64) {
        let first = offset.div_ceil(PAGE_SIZE_U64);
        let end = (offset + len) / PAGE_SIZE_U64;
        if end <= first {
            return;
        }
        let s = &self.shared;
        let mut st = s.unlinks.lock();
        if st.stop {
            return;
        }
        st.queued.extend(first..end);
        s.unlinks_pending.store(true, Ordering::Release);
        drop(st);
        s.stats
            .discarded_keys
            .fetch_add(end - first, Ordering::Relaxed);
        s.unlinks_cv.notify_all();
    }

    /// Drains the unlink queue, then unlinks every key of the run; the backend refuses
    /// everything after.
    fn close(&self) {
        let s = &self.shared;
        {
            let mut st = s.unlinks.lock();
            st.stop = true;
        }
        s.unlinks_cv.notify_all();
        if let Some(h) = self.unlinker.lock().take() {
            let _ = h.join();
        }
        if s.closed.load(Ordering::Acquire) {
            return;
        }
        let stripes: Vec<u64> = {
            let mut v: Vec<u64> = s.stripes.lock().drain().collect();
            v.sort_unstable();
            v
        };
        let before = s.stats.keys_unlinked.load(Ordering::Relaxed);
        let pages: Vec<u64> = stripes
            .iter()
            .flat_map(|&st| st * STRIPE_PAGES..(st + 1) * STRIPE_PAGES)
            .collect();
        s.unlink_pages(&pages);
        s.closed.store(true, Ordering::Release);
        s.idle.lock().clear();
        let n = s.stats.keys_unlinked.load(Ordering::Relaxed) - before;
        s.stats.keys_unlinked_at_exit.store(n, Ordering::Relaxed);
    }

    fn counters(&self, v: &mut serde_json::Value) {
        let st = &self.shared.stats;
        let ld = |c: &AtomicU64| c.load(Ordering::Relaxed);
        v["cluster_write_pipelines"] = ld(&st.write_pipelines).into();
        v["cluster_read_pipelines"] = ld(&st.read_pipelines).into();
        v["cluster_unlink_pipelines"] = ld(&st.unlink_pipelines).into();
        v["cluster_retries"] = ld(&st.retries).into();
        v["cluster_connects"] = ld(&st.connects).into();
        v["cluster_wait_shortfalls"] = ld(&st.wait_shortfalls).into();
        v["cluster_write_failures"] = ld(&st.write_failures).into();
        v["cluster_read_failures"] = ld(&st.read_failures).into();
        v["cluster_missing_keys"] = ld(&st.missing_keys).into();
        v["cluster_discarded_keys"] = ld(&st.discarded_keys).into();
        v["cluster_unlinks_cancelled"] = ld(&st.unlinks_cancelled).into();
        v["cluster_keys_unlinked"] = ld(&st.keys_unlinked).into();
        v["cluster_keys_unlinked_at_exit"] = ld(&st.keys_unlinked_at_exit).into();
        v["cluster_write_calls"] = ld(&st.write_calls).into();
        v["cluster_read_calls"] = ld(&st.read_calls).into();
        v["cluster_write_us"] = ld(&st.write_us).into();
        v["cluster_read_us"] = ld(&st.read_us).into();
        v["cluster_replicas"] = self.shared.cfg.replicas.into();
        v["cluster_run_id"] = self.shared.run.clone().into();
    }
}

impl Drop for RedisClusterBackend {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slots Redis documents (`CLUSTER KEYSLOT`), hash tags included.
    #[test]
    fn key_slots_match_redis() {
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
    }

    #[test]
    fn pieces_cut_at_pages() {
        let v: Vec<_> = pieces(4096 * 3 + 4000, 200).collect();
        assert_eq!(v, vec![(3, 4000, 96), (4, 0, 104)]);
        let v: Vec<_> = pieces(4096 * 2, 2 * 4096).collect();
        assert_eq!(v, vec![(2, 0, 4096), (3, 0, 4096)]);
    }

    #[test]
    fn topology_finds_the_master_of_a_slot() {
        let r = |a: i64, b: i64, port: i64, replicas: usize| {
            let mut e = vec![
                Value::Int(a),
                Value::Int(b),
                Value::Array(vec![
                    Value::BulkString(b"127.0.0.1".to_vec()),
                    Value::Int(port),
                ]),
            ];
            for i in 0..replicas {
                e.push(Value::Array(vec![
                    Value::BulkString(b"127.0.0.1".to_vec()),
                    Value::Int(port + 100 + i as i64),
                ]));
            }
            Value::Array(e)
        };
        let t = Topology::parse(&Value::Array(vec![
            r(10923, 16383, 7002, 1),
            r(0, 5460, 7000, 1),
            r(5461, 10922, 7001, 0),
        ]))
        .unwrap();
        assert_eq!(t.node_of(0).map(|s| &**s), Some("127.0.0.1:7000"));
        assert_eq!(t.node_of(5461).map(|s| &**s), Some("127.0.0.1:7001"));
        assert_eq!(t.node_of(16383).map(|s| &**s), Some("127.0.0.1:7002"));
        assert_eq!(t.min_replicas, 0);
        assert!(Topology::parse(&Value::Int(3)).is_none());
    }
}
