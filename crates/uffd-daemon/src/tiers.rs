//! The storage tiers below resident memory, after the kernel's swap-out path:
//!
//! ```text
//! evicted folio ─▶ swap-alloc slot(s) (order 0, or order 4 for a 64 KiB folio)
//!               ─▶ zswap.store(slot, folio)          (compressed, in the daemon; zswpout)
//!                    └─ refused (pool limit, poor compression) ─▶ backend.write(slot) (pswpout)
//! zswap over its limit ─▶ shrinker registry ─▶ zswap writeback shrinker
//!                    ─▶ coldest entries, decompressed ─▶ backend.write(slot) (zswpwb)
//! fault ─▶ zswap.load_shared(slot) (zswpin) | backend.read(slot) (pswpin)
//! ```
//!
//! Every stored page is named by its swap-alloc slot, as in the kernel: zswap is keyed by the
//! slot, and the backend holds the slot's page at `slot * 4096`. A slot is allocated before
//! the page is stored anywhere, so writeback needs no allocation: it writes the page where its
//! slot says. Reference counts are swap-alloc's (`dup` on fork, `put` when a page table entry
//! lets go). Freeing a slot invalidates its zswap entry *before* the slot can be handed out
//! again: the slot is pinned with the has-cache flag while its last reference is dropped and
//! the entry invalidated (`put_slot`), so a new store under the same slot can never be removed
//! by a late invalidation.
//!
//! With encryption at rest (`encrypt`, on by default) the backend is wrapped in a
//! `SealedBackend` (`seal.rs`): every page is sealed with AES-256-GCM on its way to the device
//! and authenticated on its way back, under a key that exists only in the daemon's locked
//! memory; a page altered on the device fails its read like a CRC mismatch. The wrapper
//! stores slot `s` (its page, then its 16-byte tag) at `s * 4112` of the device beneath it;
//! above it, everything still addresses slot `s` at `s * 4096`.
//!
//! The backend may be a chain (`chain.rs`, `--backend file,redis-cluster:...`): a bounded swap
//! file whose oldest pages a migrator moves to a Redis Cluster, each tier sealed on its own, a
//! location index (`location.rs`) naming the one place that holds each slot's page. Freeing a
//! slot frees its place there too (`forget_seal`).
//!
//! A backend that fails (EIO, ENOSPC) loses nothing: a direct store that fails leaves the pages
//! resident (the caller aborts their eviction), a writeback that fails leaves the entry in
//! zswap; both are counted and the first of each is logged.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use shrinker::{ShrinkerConfig, ShrinkerHandle};
use swap_alloc::{DeviceConfig, SwapDevice, SwapEntry};
use zswap::{LoadError, StoreError, Zswap};

use crate::sys::{PAGE_SIZE, PAGE_SIZE_U64};

mod backend;
mod chain;
mod checksum;
mod config;
mod location;
mod readers;
mod redis_cluster;
mod seal;
mod shrinkers;
mod stats;
mod writeback;

use backend::{ArcBackend, Discarder, Failing};
pub use backend::{Backend, FileBackend, PmemBackend};
pub use chain::TierChain;
use chain::{ChainTier, MigrateConfig};
use checksum::ChecksummedBackend;
pub use config::{BackendSpec, ChainSpec, FailWrites, RedisClusterConfig, TierConfig, ZswapTier};
pub use redis_cluster::{key_slot, ClusterStats, RedisClusterBackend, STRIPE_PAGES};
pub use seal::SealedBackend;
use shrinkers::{CompactShrinker, ZswapShrinker};
pub use stats::TierStats;

/// Slot value meaning "the page was all zeros; nothing is stored".
pub const ZERO_SLOT: u32 = u32::MAX;

/// Pages of a large folio (order 4, 64 KiB).
pub const FOLIO_PAGES: usize = 16;
/// The order of a large folio.
pub const FOLIO_ORDER: u32 = 4;

/// Free slots a partly used cluster needs before allocation refills it ahead of free clusters
/// (a 32nd of a 512-slot cluster: each refill visit yields at least 16 slots).
const NONFULL_MIN_FREE: usize = 16;

/// Why a store failed; the pages are not stored anywhere and keep no slot.
#[derive(Debug, thiserror::Error)]
pub enum StoreFail {
    /// No free slot on the device.
    #[error("the swap space is full")]
    NoSpace,
    /// zswap refused the folio and there is no backend.
    #[error("zswap refused the pages and there is no backing device: {0}")]
    Refused(StoreError),
    /// The backend failed.
    #[error("writing to the backing device failed: {0}")]
    Io(io::Error),
}

/// Why no tier took a page, for counting and for saying it once with what to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The swap space has no free slot.
    Full,
    /// The pool is at its limit and there is no backing device.
    Pool,
    /// The page does not compress below a page and there is no backing device.
    Incompressible,
    /// The backing device failed the write.
    Io,
}

impl Refusal {
    /// Every cause, in the order they are reported.
    pub const ALL: [Refusal; 4] = [
        Refusal::Full,
        Refusal::Pool,
        Refusal::Incompressible,
        Refusal::Io,
    ];

    /// What a user can change so that such pages can leave memory.
    pub fn remedy(self) -> &'static str {
        match self {
            Refusal::Full => "give more swap space (--swap-size)",
            Refusal::Pool => {
                "raise the pool limit (--zswap SIZE) or add a backing device (--backend)"
            }
            Refusal::Incompressible => {
                "add a backing device (--backend): pages that do not compress can only go there"
            }
            Refusal::Io => "check the backing device",
        }
    }
}

impl StoreFail {
    /// The cause, as counted.
    pub fn refusal(&self) -> Refusal {
        match self {
            StoreFail::NoSpace => Refusal::Full,
            StoreFail::Refused(StoreError::CompressPoor { .. }) => Refusal::Incompressible,
            StoreFail::Refused(_) => Refusal::Pool,
            StoreFail::Io(_) => Refusal::Io,
        }
    }
}

/// Where a page was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The compressed pool.
    Zswap,
    /// The backing device.
    Backend,
}

/// The tiers: the slot device, zswap, the backend, and the shrinker registry that drives
/// zswap's writeback.
pub struct Tiers {
    dev: SwapDevice,
    zswap: Option<Arc<Zswap>>,
    backend: Option<Arc<dyn Backend>>,
    /// The backend's sealing layer (the same object as `backend`) when encryption is on.
    sealer: Option<Arc<SealedBackend<ArcBackend>>>,
    /// The backend's checksumming layer (the same object as `backend`) when encryption is off
    /// and checksums on.
    checksums: Option<Arc<ChecksummedBackend<ArcBackend>>>,
    /// The chain (the same object as `backend`) when the backend is two tiers.
    chain: Option<Arc<TierChain>>,
    registry: shrinker::ShrinkerRegistry,
    _shrinkers: Vec<ShrinkerHandle>,
    /// Counters.
    pub stats: Arc<TierStats>,
    cfg: TierConfig,
    write_error_logged: AtomicBool,
    writeback_error_logged: Arc<AtomicBool>,
    /// Parallel reads of a disk-backed device (a swap file).
    readers: Option<readers::Readers>,
}

impl fmt::Debug for Tiers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tiers")
            .field("nslots", &self.dev.nslots())
            .field("zswap", &self.zswap.is_some())
            .field("backend", &self.backend)
            .finish()
    }
}

/// The backend as the tiers use it, and the layers in it whose counters they report.
struct Layers {
    backend: Option<Arc<dyn Backend>>,
    sealer: Option<Arc<SealedBackend<ArcBackend>>>,
    checksums: Option<Arc<ChecksummedBackend<ArcBackend>>>,
    chain: Option<Arc<TierChain>>,
}

/// One device, as its spec says (`None` for `none`; a chain is built by `build_chain`).
fn open_device(
    cfg: &TierConfig,
    spec: &BackendSpec,
    device_bytes: u64,
) -> anyhow::Result<Option<Arc<dyn Backend>>> {
    use anyhow::Context;
    Ok(match spec {
        BackendSpec::None => None,
        BackendSpec::File(path) if cfg.fail_writeback_after.is_some() => {
            let after = cfg.fail_writeback_after.unwrap_or(0);
            let b = FileBackend::with_device(path.as_deref(), &cfg.tmp_dir, |f| {
                backend::LosingSwapFile::boxed(f, after)
            })
            .context("creating the swap file")?;
            Some(Arc::new(b))
        }
        BackendSpec::File(path) => {
            let b = FileBackend::create(path.as_deref(), &cfg.tmp_dir)
                .or_else(|e| {
                    if path.is_none() {
                        FileBackend::create(None, &std::env::temp_dir())
                    } else {
                        Err(e)
                    }
                })
                .context("creating the swap file")?;
            Some(Arc::new(b))
        }
        BackendSpec::Pmem(path) => Some(Arc::new(
            PmemBackend::open(path, device_bytes).context("setting up the pmem device")?,
        )),
        BackendSpec::RedisCluster(c) => {
            c.validate().map_err(anyhow::Error::msg)?;
            Some(Arc::new(
                RedisClusterBackend::connect(c).context("setting up the Redis Cluster tier")?,
            ))
        }
        BackendSpec::Chain(_) => anyhow::bail!("a chain cannot be a tier of a chain"),
    })
}

/// The device's bytes for `nslots` pages, sealed or not.
fn device_bytes(cfg: &TierConfig, nslots: u64) -> u64 {
    if cfg.encrypt {
        seal::device_bytes(nslots)
    } else {
        nslots * PAGE_SIZE_U64
    }
}

/// The layers that make a device's pages trustworthy: sealed (encryption at rest: everything
/// below this layer, and the device, sees only sealed pages) or, without encryption,
/// checksummed.
#[allow(clippy::type_complexity)]
fn protect(
    cfg: &TierConfig,
    b: Arc<dyn Backend>,
) -> anyhow::Result<(
    Arc<dyn Backend>,
    Option<Arc<SealedBackend<ArcBackend>>>,
    Option<Arc<ChecksummedBackend<ArcBackend>>>,
)> {
    use anyhow::Context;
    if cfg.encrypt {
        let s = Arc::new(
            SealedBackend::new(ArcBackend(b))
                .context("setting up encryption at rest (--encrypt off to go without)")?,
        );
        return Ok((Arc::clone(&s) as Arc<dyn Backend>, Some(s), None));
    }
    if cfg.checksums {
        let c = Arc::new(ChecksummedBackend::new(ArcBackend(b)));
        return Ok((Arc::clone(&c) as Arc<dyn Backend>, None, Some(c)));
    }
    Ok((b, None, None))
}

/// The name of a tier in the counters (`tier_<name>_*`).
fn tier_name(spec: &BackendSpec) -> &'static str {
    match spec {
        BackendSpec::None => "none",
        BackendSpec::File(_) => "file",
        BackendSpec::Pmem(_) => "pmem",
        BackendSpec::RedisCluster(_) => "redis_cluster",
        BackendSpec::Chain(_) => "chain",
    }
}

/// A chain of two devices, each sealed or checksummed on its own; `nslots` bounds the pages
/// the far tier can be asked to hold.
fn build_chain(cfg: &TierConfig, c: &ChainSpec, nslots: u64) -> anyhow::Result<Arc<TierChain>> {
    use anyhow::Context;
    c.validate().map_err(anyhow::Error::msg)?;
    let near_bytes = if c.near_bytes == 0 {
        (nslots * PAGE_SIZE_U64 / 4).max(1 << 20)
    } else {
        c.near_bytes
    };
    let near_pages = (near_bytes / PAGE_SIZE_U64).min(u64::from(u32::MAX - 1));
    // Every slot's page, and the copies of migrations and direct writes in flight.
    let far_pages = (nslots + nslots / 4 + 4096).min(u64::from(u32::MAX - 1));
    let tier = |spec: &BackendSpec, pages: u64, name: String| -> anyhow::Result<ChainTier> {
        let dev = open_device(cfg, spec, device_bytes(cfg, pages))?
            .ok_or_else(|| anyhow::anyhow!("a tier of a chain cannot be none"))?;
        let (b, sealer, checksums) = protect(cfg, dev)?;
        let discard_freed = matches!(spec, BackendSpec::RedisCluster(_));
        Ok(ChainTier::new(name, b, sealer, checksums, discard_freed))
    };
    let near_name = tier_name(&c.near);
    let mut far_name = tier_name(&c.far).to_string();
    if far_name == near_name {
        far_name.push_str("_far");
    }
    let near =
        tier(&c.near, near_pages, near_name.to_string()).context("the chain's first tier")?;
    let far = tier(&c.far, far_pages, far_name).context("the chain's second tier")?;
    let mcfg = MigrateConfig {
        near_pages: near_pages as u32,
        high_percent: c.migrate_high_percent,
        low_percent: c.migrate_low_percent,
        age: c.migrate_age,
        batch_pages: c.migrate_batch_pages,
    };
    Ok(Arc::new(
        TierChain::new(near, far, mcfg, far_pages as u32).context("starting the chain")?,
    ))
}

/// The backing device below zswap, sealed (encryption at rest) or, without encryption,
/// checksummed, and wrapped in failure injection if asked; a chain seals each of its tiers.
fn build_backend(cfg: &TierConfig, nslots: u64) -> anyhow::Result<Layers> {
    let (backend, sealer, checksums, chain) = match &cfg.backend {
        BackendSpec::Chain(c) => {
            let chain = build_chain(cfg, c, nslots)?;
            let b: Arc<dyn Backend> = Arc::clone(&chain) as Arc<dyn Backend>;
            (Some(b), None, None, Some(chain))
        }
        spec => match open_device(cfg, spec, device_bytes(cfg, nslots))? {
            None => (None, None, None, None),
            Some(dev) => {
                let (b, s, c) = protect(cfg, dev)?;
                (Some(b), s, c, None)
            }
        },
    };
    // Failure injection outermost: its byte count is of pages, sealed or not.
    let backend: Option<Arc<dyn Backend>> = match (backend, cfg.fail_writes) {
        (Some(b), Some(fail)) => {
            let inner: Box<dyn Backend> = Box::new(ArcBackend(b));
            Some(Arc::new(Failing {
                inner,
                fail,
                written: AtomicU64::new(0),
            }))
        }
        (b, _) => b,
    };
    Ok(Layers {
        backend,
        sealer,
        checksums,
        chain,
    })
}

/// The swap slot device: discards passed to the backend if asked; partly used clusters
/// refilled first.
fn build_device(
    cfg: &TierConfig,
    nslots: u64,
    backend: Option<&Arc<dyn Backend>>,
) -> anyhow::Result<SwapDevice> {
    use anyhow::Context;
    let mut dcfg = DeviceConfig::new(nslots);
    if let (Some(b), true) = (backend, cfg.discard) {
        dcfg = dcfg.discard(Arc::new(Discarder(Arc::clone(b))));
    }
    // Refill partly used clusters first (the kernel's order since 6.18 for devices without
    // discard; here with discard too, since what is discarded is a swap file's emptied
    // cluster, and packing the slots in use into fewer clusters empties more of them): the
    // slots in use stay packed, and so does zswap's index, which is keyed by slot and
    // otherwise fills with holes as random faults thin the clusters out (under redis in
    // the default setup, 25 stored pages per 64-entry index chunk with free clusters
    // first; zswap's metadata peak 3.10 MB then, 1.63 MB with this).
    dcfg = dcfg.nonfull_first(NONFULL_MIN_FREE);
    let dev = SwapDevice::new(dcfg).context("creating the swap slot device")?;
    Ok(dev)
}

/// The compressed pool, if configured.
fn build_zswap(cfg: &TierConfig) -> anyhow::Result<Option<Arc<Zswap>>> {
    use anyhow::Context;
    let zswap = match &cfg.zswap {
        None => None,
        Some(z) => {
            let mut zc = zswap::Config::new(z.compressor);
            zc.max_pool_bytes = z.max_pool_bytes;
            zc.accept_threshold_percent = z.accept_threshold_percent;
            zc.crc = z.crc;
            if !z.multi_page {
                zc.multi_page_min_pages = 0;
            }
            Some(Arc::new(Zswap::new(zc).context("creating the zswap pool")?))
        }
    };
    Ok(zswap)
}

/// The shrinker registry with zswap's compaction and writeback shrinkers.
#[allow(clippy::type_complexity)]
fn register_shrinkers(
    zswap: &Option<Arc<Zswap>>,
    backend: &Option<Arc<dyn Backend>>,
    stats: &Arc<TierStats>,
    logged: &Arc<AtomicBool>,
) -> anyhow::Result<(shrinker::ShrinkerRegistry, Vec<shrinker::ShrinkerHandle>)> {
    use anyhow::Context;
    let registry = shrinker::ShrinkerRegistry::new(1).context("creating the shrinker registry")?;
    let mut shrinkers = Vec::new();
    if let Some(z) = zswap {
        shrinkers.push(
            registry
                .register(
                    ShrinkerConfig::new("zswap-compact").seeks(shrinker::DEFAULT_SEEKS),
                    CompactShrinker {
                        zswap: Arc::clone(z),
                        stats: Arc::clone(stats),
                    },
                )
                .context("registering the compaction shrinker")?,
        );
    }
    let zswap_shrinker = match (zswap, backend) {
        (Some(z), Some(b)) => Some(
            registry
                .register(
                    ShrinkerConfig::new("zswap-writeback").seeks(shrinker::DEFAULT_SEEKS),
                    ZswapShrinker {
                        zswap: Arc::clone(z),
                        backend: Arc::clone(b),
                        stats: Arc::clone(stats),
                        logged: Arc::clone(logged),
                    },
                )
                .context("registering the zswap shrinker")?,
        ),
        _ => None,
    };
    shrinkers.extend(zswap_shrinker);
    Ok((registry, shrinkers))
}

impl Tiers {
    /// Sets up the tiers.
    pub fn new(cfg: TierConfig) -> anyhow::Result<Self> {
        use anyhow::Context;
        let nslots = (cfg.swap_bytes / PAGE_SIZE_U64).clamp(1024, u64::from(ZERO_SLOT - 1));
        let Layers {
            backend,
            sealer,
            checksums,
            chain,
        } = build_backend(&cfg, nslots)?;
        let dev = build_device(&cfg, nslots, backend.as_ref())?;
        let zswap = build_zswap(&cfg)?;
        let stats = Arc::new(TierStats::default());
        let logged = Arc::new(AtomicBool::new(false));
        let (registry, shrinkers) = register_shrinkers(&zswap, &backend, &stats, &logged)?;
        // A swap file, alone or as a chain's first tier: faults waiting on it read at once.
        let on_a_file = match &cfg.backend {
            BackendSpec::File(_) => true,
            BackendSpec::Chain(c) => matches!(c.near, BackendSpec::File(_)),
            _ => false,
        };
        let readers = match &backend {
            Some(b) if on_a_file => Some(
                readers::Readers::new(Arc::clone(b), readers::READERS)
                    .context("starting the swap file's reader threads")?,
            ),
            _ => None,
        };
        Ok(Tiers {
            readers,
            dev,
            zswap,
            backend,
            sealer,
            checksums,
            chain,
            registry,
            _shrinkers: shrinkers,
            stats,
            cfg,
            write_error_logged: AtomicBool::new(false),
            writeback_error_logged: logged,
        })
    }

    /// The shrinker registry (the daemon's other caches register here too).
    pub fn registry(&self) -> &shrinker::ShrinkerRegistry {
        &self.registry
    }

    /// A line for the log: what the tiers are.
    pub fn describe(&self) -> String {
        let z = match (&self.zswap, &self.cfg.zswap) {
            (Some(_), Some(c)) => format!(
                "zswap {} (pool limit {} MiB)",
                c.compressor.name(),
                c.max_pool_bytes >> 20
            ),
            _ => "no zswap".into(),
        };
        let b = match &self.backend {
            Some(b) => b.describe(),
            None => "no backing device".into(),
        };
        format!(
            "{z}, {b}, {} MiB of swap slots",
            (self.dev.nslots() * PAGE_SIZE_U64) >> 20
        )
    }

    /// Whether large folios are evicted whole.
    pub fn large_folios(&self) -> bool {
        self.cfg.large_folios
    }

    fn entry(&self, slot: u32) -> SwapEntry {
        SwapEntry::new(self.dev.id(), u64::from(slot)).expect("slots fit in an entry")
    }

    /// `n` order-0 slots, or none (all or nothing).
    fn alloc_per_page(&self, n: usize) -> Option<Vec<u32>> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            match self.dev.alloc(0) {
                Ok(e) => v.push(e.offset() as u32),
                Err(_) => {
                    self.put_fresh(&v);
                    return None;
                }
            }
        }
        Some(v)
    }

    /// Whether zswap stores a folio as one multi-page object (`[zswap] multi_page`).
    fn multi_page(&self) -> bool {
        self.cfg.zswap.as_ref().is_some_and(|z| z.multi_page)
    }

    /// Stores evicted units: each is `(order, data)` with `data` of `2^order` pages. Returns,
    /// for each unit, the slot of each of its pages, or why it could not be stored (then it
    /// holds no slot and is stored nowhere). Units are independent: one failing does not fail
    /// the others. Three stages, as the kernel's swap-out: slots, zswap, the backend.
    pub fn store_units(&self, units: &[(u32, &[u8])]) -> Vec<Result<Vec<u32>, StoreFail>> {
        let slots = self.alloc_units(units);
        let mut out: Vec<Option<Result<Vec<u32>, StoreFail>>> =
            (0..units.len()).map(|_| None).collect();
        let to_backend = self.store_in_zswap(units, &slots, &mut out);
        self.write_to_backend(units, &slots, &to_backend, &mut out);
        out.into_iter()
            .map(|r| r.unwrap_or(Err(StoreFail::NoSpace)))
            .collect()
    }

    /// Stage 1: slots, contiguous for a folio, or one per page if its order cannot be served;
    /// `None` for a unit no slot is free for.
    fn alloc_units(&self, units: &[(u32, &[u8])]) -> Vec<Option<Vec<u32>>> {
        // With zswap in front storing page by page (`multi_page` off), a folio takes a slot per
        // page: the slots are then only zswap's keys (it stores and writes back each page on
        // its own), and order-0 slots fill the holes that random faults leave in partly used
        // clusters, where order-4 ones need fresh clusters and leave zswap's slot-keyed index
        // sparse (35 stored pages per 64-entry chunk under redis with zswap alone; zswap's
        // metadata peak 2.39 MB then, 1.65 MB with a slot per page).
        let per_page_slots = self.zswap.is_some() && !self.multi_page();
        units
            .iter()
            .map(|&(order, data)| {
                let n = data.len() / PAGE_SIZE;
                if order > 0 && per_page_slots {
                    return self.alloc_per_page(n);
                }
                match self.dev.alloc(order) {
                    Ok(e) => Some((0..n as u32).map(|i| e.offset() as u32 + i).collect()),
                    Err(_) if order > 0 => {
                        self.stats.swpout_fallback.fetch_add(1, Ordering::Relaxed);
                        self.alloc_per_page(n)
                    }
                    Err(_) => None,
                }
            })
            .collect()
    }

    /// Stage 2: each unit with slots into zswap; settles in `out` what zswap took and what no
    /// tier can take, and returns what goes on to the backend, as `(slot, unit, page)`.
    fn store_in_zswap(
        &self,
        units: &[(u32, &[u8])],
        slots: &[Option<Vec<u32>>],
        out: &mut [Option<Result<Vec<u32>, StoreFail>>],
    ) -> Vec<(u32, usize, usize)> {
        let mut to_backend = Vec::new();
        for (u, (&(order, data), s)) in units.iter().zip(slots).enumerate() {
            let Some(s) = s else {
                self.stats.store_refused.fetch_add(1, Ordering::Relaxed);
                out[u] = Some(Err(StoreFail::NoSpace));
                continue;
            };
            if let Some(z) = &self.zswap {
                match Self::zswap_store(z, s, data) {
                    Ok(()) => {
                        self.stats
                            .zswpout
                            .fetch_add(s.len() as u64, Ordering::Relaxed);
                        self.stats.swpout_by_order[order as usize].fetch_add(1, Ordering::Relaxed);
                        out[u] = Some(Ok(s.clone()));
                        continue;
                    }
                    Err(e) => {
                        self.stats.zswap_rejected.fetch_add(1, Ordering::Relaxed);
                        if self.backend.is_none() {
                            self.stats.store_refused.fetch_add(1, Ordering::Relaxed);
                            self.put_fresh(s);
                            out[u] = Some(Err(StoreFail::Refused(e)));
                            continue;
                        }
                    }
                }
            } else if self.backend.is_none() {
                self.put_fresh(s);
                out[u] = Some(Err(StoreFail::NoSpace));
                continue;
            }
            for (i, &slot) in s.iter().enumerate() {
                to_backend.push((slot, u, i));
            }
        }
        to_backend
    }

    /// One unit into zswap: as one folio under contiguous slots, else page by page (fallback
    /// slots), all or nothing.
    fn zswap_store(z: &Zswap, s: &[u32], data: &[u8]) -> Result<(), StoreError> {
        if s.windows(2).all(|w| w[1] == w[0] + 1) {
            return z.store(u64::from(s[0]), data);
        }
        for (i, page) in data.chunks_exact(PAGE_SIZE).enumerate() {
            if let Err(e) = z.store(u64::from(s[i]), page) {
                for &done in &s[..i] {
                    z.invalidate(u64::from(done), 1);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Stage 3: the pages zswap did not take, to the backend, one write per run of
    /// consecutive slots; a unit any of whose writes failed gives its slots back and stays
    /// resident.
    fn write_to_backend(
        &self,
        units: &[(u32, &[u8])],
        slots: &[Option<Vec<u32>>],
        to_backend: &[(u32, usize, usize)],
        out: &mut [Option<Result<Vec<u32>, StoreFail>>],
    ) {
        let Some(b) = &self.backend else { return };
        let mut to_backend = to_backend.to_vec();
        to_backend.sort_unstable_by_key(|&(slot, _, _)| slot);
        // The runs of consecutive slots, each one write, all in one batch to the device.
        let mut runs: Vec<(usize, usize, Vec<u8>)> = Vec::new(); // [i, j) of to_backend, bytes
        let mut i = 0;
        while i < to_backend.len() {
            let mut j = i + 1;
            while j < to_backend.len() && to_backend[j].0 == to_backend[j - 1].0 + 1 {
                j += 1;
            }
            let mut buf = Vec::with_capacity((j - i) * PAGE_SIZE);
            for &(_, u, p) in &to_backend[i..j] {
                buf.extend_from_slice(&units[u].1[p * PAGE_SIZE..(p + 1) * PAGE_SIZE]);
            }
            runs.push((i, j, buf));
            i = j;
        }
        let writes: Vec<(u64, &[u8])> = runs
            .iter()
            .map(|(i, _, buf)| (u64::from(to_backend[*i].0) * PAGE_SIZE_U64, &buf[..]))
            .collect();
        let mut failed_units: Vec<(usize, io::Error)> = Vec::new();
        for ((i, j, _), r) in runs.iter().zip(b.write_all(&writes)) {
            if let Err(e) = r {
                for &(_, u, _) in &to_backend[*i..*j] {
                    if !failed_units.iter().any(|(f, _)| *f == u) {
                        let copy = match e.raw_os_error() {
                            Some(code) => io::Error::from_raw_os_error(code),
                            None => io::Error::new(e.kind(), e.to_string()),
                        };
                        failed_units.push((u, copy));
                    }
                }
            }
        }
        for (u, e) in failed_units {
            if out[u].is_none() {
                self.stats
                    .backend_write_errors
                    .fetch_add(1, Ordering::Relaxed);
                if !self.write_error_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "writing to the backing device failed: {e}; the pages stay resident"
                    );
                }
                if let Some(s) = &slots[u] {
                    self.put_fresh(s);
                }
                out[u] = Some(Err(StoreFail::Io(e)));
            }
        }
        for &(_, u, _) in &to_backend {
            if out[u].is_none() {
                let s = slots[u].clone().unwrap_or_default();
                self.stats
                    .pswpout
                    .fetch_add(s.len() as u64, Ordering::Relaxed);
                self.stats.swpout_by_order[units[u].0 as usize].fetch_add(1, Ordering::Relaxed);
                out[u] = Some(Ok(s));
            }
        }
    }

    fn put_fresh(&self, slots: &[u32]) {
        for &s in slots {
            // (Part of a unit may have reached the device before another part failed.)
            self.forget_seal(s);
            if let Err(e) = self.dev.put(self.entry(s)) {
                tracing::error!("BUG: freeing fresh slot {s}: {e}");
            }
        }
    }

    /// Reads the page of `slot` into `out` (one page), leaving it stored.
    pub fn read(&self, slot: u32, out: &mut [u8]) -> io::Result<Tier> {
        self.read_run(slot, 1, out).map(|(_, t)| t)
    }

    /// Whether the page of `slot` is on a disk-backed device only (not in zswap), where
    /// reading several at once pays ([`Tiers::read_many`]).
    pub fn on_disk(&self, slot: u32) -> bool {
        self.readers.is_some()
            && self.chain.as_ref().is_none_or(|c| c.is_near(slot))
            && !self
                .zswap
                .as_ref()
                .is_some_and(|z| z.contains(u64::from(slot)))
    }

    /// Reads the pages of `slots`, each on the disk-backed device ([`Tiers::on_disk`]), all
    /// at once: the pages read, in no particular order (a failed read is left out; reading
    /// that slot again reports it). Not counted as swap-ins until used
    /// ([`Tiers::count_backend_read`]).
    pub fn read_many(&self, slots: &[u32]) -> Vec<(u32, Vec<u8>)> {
        let Some(r) = &self.readers else {
            return Vec::new();
        };
        self.stats
            .batch_reads
            .fetch_add(slots.len() as u64, Ordering::Relaxed);
        r.read(slots)
            .into_iter()
            .filter_map(|(s, r)| r.ok().map(|p| (s, p)))
            .collect()
    }

    /// A page [`Tiers::read_many`] read was used by a fault: a swap-in from the backend.
    pub fn count_backend_read(&self) {
        self.stats.batch_reads_used.fetch_add(1, Ordering::Relaxed);
        self.stats.pswpin.fetch_add(1, Ordering::Relaxed);
        self.stats.backend_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads the pages of the consecutive slots `slot..slot + n` into `out` (`n` pages), as
    /// far as it can: pages in zswap one by one, and each stretch of slots the backend holds
    /// with one read (an order-4 folio written as one unit comes back with one `pread`, not
    /// sixteen). Returns how many pages from the start were read and the tier of the first; a
    /// failure after the first page ends the run there, a failure of the first is the error.
    pub fn read_run(&self, slot: u32, n: usize, out: &mut [u8]) -> io::Result<(usize, Tier)> {
        debug_assert!(n >= 1 && out.len() >= n * PAGE_SIZE);
        let mut done = 0;
        let mut first = None;
        while done < n {
            let r = self.read_stretch(slot, done, n, out);
            match r {
                Ok((k, tier, whole)) => {
                    first.get_or_insert(tier);
                    done += k;
                    if !whole {
                        break;
                    }
                }
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok((done, first.unwrap_or(Tier::Backend)))
    }

    /// One step of `read_run` from page `at`: one page from zswap, or the stretch of pages
    /// from `at` on that zswap does not hold, from the backend. Returns the pages read, and
    /// whether the step read all it tried (a run ends after a step that did not).
    fn read_stretch(
        &self,
        slot: u32,
        at: usize,
        n: usize,
        out: &mut [u8],
    ) -> io::Result<(usize, Tier, bool)> {
        let s = slot + at as u32;
        if let Some(z) = &self.zswap {
            match z.load_shared(u64::from(s), &mut out[at * PAGE_SIZE..(at + 1) * PAGE_SIZE]) {
                Ok(()) => {
                    self.stats.zswpin.fetch_add(1, Ordering::Relaxed);
                    return Ok((1, Tier::Zswap, true));
                }
                Err(LoadError::NotFound { .. }) => {}
                Err(e) => {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()));
                }
            }
        }
        let Some(b) = &self.backend else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("slot {s} is in no tier"),
            ));
        };
        // (A page zswap holds now but writes back meanwhile is read from zswap, or found
        // missing there and read here on the next step: writeback writes the backend first.)
        let mut end = at + 1;
        while end < n
            && !self
                .zswap
                .as_ref()
                .is_some_and(|z| z.contains(u64::from(slot + end as u32)))
        {
            end += 1;
        }
        let mut r = b.read(
            u64::from(s) * PAGE_SIZE_U64,
            &mut out[at * PAGE_SIZE..end * PAGE_SIZE],
        );
        let whole = r.is_ok();
        if r.is_err() && end > at + 1 {
            // A failure somewhere in the stretch must not cost the page asked for: that one
            // alone, as a read of one page would have done.
            self.stats
                .backend_read_errors
                .fetch_add(1, Ordering::Relaxed);
            end = at + 1;
            r = b.read(
                u64::from(s) * PAGE_SIZE_U64,
                &mut out[at * PAGE_SIZE..end * PAGE_SIZE],
            );
        }
        match r {
            Ok(()) => {
                self.stats
                    .pswpin
                    .fetch_add((end - at) as u64, Ordering::Relaxed);
                self.stats.backend_reads.fetch_add(1, Ordering::Relaxed);
                Ok((end - at, Tier::Backend, whole))
            }
            Err(e) => {
                self.stats
                    .backend_read_errors
                    .fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Adds a reference to a slot (`swap_duplicate`: a page shared after fork).
    pub fn dup(&self, slot: u32) -> Result<(), swap_alloc::SwapError> {
        self.dev.dup(self.entry(slot)).map(|_| ())
    }

    /// Drops a reference (`swap_free`). With the last one the slot's zswap entry is
    /// invalidated while the has-cache flag pins the slot, and only then is the slot freed.
    pub fn put(&self, slot: u32) -> Result<(), swap_alloc::SwapError> {
        let e = self.entry(slot);
        // Pin: nobody else frees (and nobody re-allocates) the slot until we clear the flag.
        // Another sharer dropping its reference at the same time holds the flag briefly.
        loop {
            match self.dev.swapcache_prepare(e) {
                Ok(()) => break,
                Err(swap_alloc::SwapError::CacheExists { .. }) => std::thread::yield_now(),
                Err(err) => return Err(err),
            }
        }
        let r = self.dev.put(e);
        if r.is_ok() {
            if let Ok(st) = self.dev.slot(e) {
                if st.count == 0 {
                    if let Some(z) = &self.zswap {
                        z.invalidate(u64::from(slot), 1);
                    }
                    // Still pinned: the slot cannot be sealed anew before its seal is gone.
                    self.forget_seal(slot);
                }
            }
        }
        self.dev.swapcache_clear(e)?;
        r.map(|_| ())
    }

    /// The reference count of a slot (0 when free).
    pub fn count(&self, slot: u32) -> u16 {
        self.dev
            .slot(self.entry(slot))
            .map(|s| s.count)
            .unwrap_or(0)
    }

    /// Records the pool's size (and its ratio when largest); returns the size.
    fn note_pool(&self, z: &Zswap) -> u64 {
        let st = z.stats();
        let pool = st.pool_total_size;
        if pool > self.stats.pool_max_bytes.fetch_max(pool, Ordering::Relaxed) {
            let stored = (st.stored_pages - st.same_filled_pages) as f64 * PAGE_SIZE as f64;
            self.stats
                .ratio_at_max_bits
                .store((stored / pool as f64).to_bits(), Ordering::Relaxed);
        }
        pool
    }

    /// Bytes of zswap pool memory now.
    pub fn pool_bytes(&self) -> u64 {
        self.zswap.as_ref().map_or(0, |z| z.stats().pool_total_size)
    }

    /// Heap bytes of the tiers' metadata: the slots' (the slot device's, and with encryption
    /// the side table of the sealed slots' nonce counters, 8 bytes a sealed slot), and
    /// zswap's (index, LRU and pool bookkeeping, not the compressed bytes).
    pub fn metadata_bytes(&self) -> (usize, usize) {
        (
            self.dev.metadata_bytes() + self.seal_metadata_bytes(),
            self.zswap
                .as_ref()
                .map_or(0, |z| z.stats().metadata_bytes as usize),
        )
    }

    /// The slot is free: its seal or checksum goes.
    fn forget_seal(&self, slot: u32) {
        if let Some(s) = &self.sealer {
            s.forget(u64::from(slot));
        }
        if let Some(c) = &self.checksums {
            c.forget(u64::from(slot));
        }
        if let Some(c) = &self.chain {
            c.free(slot);
        }
    }

    /// Heap bytes of the side table of seals, or of checksums without encryption.
    pub fn seal_metadata_bytes(&self) -> usize {
        self.sealer.as_ref().map_or(0, |s| s.metadata_bytes())
            + self.checksums.as_ref().map_or(0, |c| c.metadata_bytes())
            + self.chain.as_ref().map_or(0, |c| c.metadata_bytes())
    }

    /// Whether pages written to the backend are sealed (encryption on, and a backend).
    pub fn encrypted(&self) -> bool {
        self.sealer.is_some() || self.chain.as_ref().is_some_and(|c| c.encrypted())
    }

    /// Whether pages written to the backend are checksummed (no encryption, checksums on).
    fn checksummed(&self) -> bool {
        self.checksums.is_some() || self.chain.as_ref().is_some_and(|c| c.checksummed())
    }

    /// The chain, when the backend is two tiers.
    pub fn chain(&self) -> Option<&TierChain> {
        self.chain.as_deref()
    }

    /// Waits until every page stored on the backend so far is on its device (a file's
    /// writeback is asynchronous), or known failed and held in memory; reads then see what the
    /// device holds (tests that alter it).
    pub fn flush(&self) {
        if let Some(b) = &self.backend {
            b.flush();
        }
    }

    /// Pages read back from the backend that failed authentication.
    pub fn backend_auth_failures(&self) -> u64 {
        self.sealer.as_ref().map_or(0, |s| s.auth_failures())
            + self.chain.as_ref().map_or(0, |c| c.auth_failures())
    }

    /// Pages read back from the backend whose checksum did not match (no encryption).
    pub fn backend_checksum_failures(&self) -> u64 {
        self.checksums.as_ref().map_or(0, |c| c.failures())
            + self.chain.as_ref().map_or(0, |c| c.checksum_failures())
    }

    /// Slots in use.
    pub fn slots_in_use(&self) -> u64 {
        self.dev.in_use()
    }

    /// Runs zswap's writeback through the shrinker registry while the pool is above its
    /// writeback mark, down to the accept threshold. Returns the pages written back.
    pub fn balance(&self) -> u64 {
        let (Some(z), Some(zc)) = (&self.zswap, &self.cfg.zswap) else {
            return 0;
        };
        let pool = self.note_pool(z);
        let start = zc.max_pool_bytes / 100 * u64::from(zc.writeback_start_percent);
        if pool < start {
            return 0;
        }
        let target = zc.max_pool_bytes / 100 * u64::from(zc.accept_threshold_percent.min(90));
        let before = self.stats.zswpwb.load(Ordering::Relaxed);
        // Priority from how far over the target we are: the further, the harder (0 is the
        // most aggressive, the kernel's DEF_PRIORITY 12 the gentlest).
        for _ in 0..64 {
            let pool = z.stats().pool_total_size;
            if pool <= target {
                break;
            }
            self.stats.shrink_calls.fetch_add(1, Ordering::Relaxed);
            // The kernel's arithmetic scans about 2 * count >> priority objects (seeks 2):
            // pick the priority that asks for about what must go to reach the target.
            let n = z.count_objects().max(1) as u64;
            let need = ((pool - target) as f64 / pool.max(1) as f64 * n as f64).max(1.0);
            let ratio = (2.0 * n as f64 / need).max(1.0);
            let priority = (ratio.log2().floor() as u32).min(shrinker::DEF_PRIORITY);
            let req = shrinker::ShrinkRequest::new(priority);
            match self.registry.shrink(&req) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        self.stats.zswpwb.load(Ordering::Relaxed) - before
    }

    /// Counters for the stats JSON: the tier counters plus zswap's pool figures.
    pub fn to_json(&self, v: &mut serde_json::Value) {
        let s = &self.stats;
        let ld = |c: &AtomicU64| c.load(Ordering::Relaxed);
        v["pswpout"] = ld(&s.pswpout).into();
        v["pswpin"] = ld(&s.pswpin).into();
        v["backend_reads"] = ld(&s.backend_reads).into();
        v["zswpout"] = ld(&s.zswpout).into();
        v["zswpin"] = ld(&s.zswpin).into();
        v["zswpwb"] = ld(&s.zswpwb).into();
        for (o, c) in s.swpout_by_order.iter().enumerate() {
            let n = ld(c);
            if n > 0 {
                v[format!("swpout_order{o}")] = n.into();
            }
        }
        v["swpout_fallback"] = ld(&s.swpout_fallback).into();
        v["zswap_rejected"] = ld(&s.zswap_rejected).into();
        v["backend_write_errors"] = ld(&s.backend_write_errors).into();
        v["backend_read_errors"] = ld(&s.backend_read_errors).into();
        v["backend_batch_reads"] = ld(&s.batch_reads).into();
        v["backend_batch_reads_used"] = ld(&s.batch_reads_used).into();
        v["writeback_errors"] = ld(&s.writeback_errors).into();
        // Encryption at rest: whether the backend's pages are sealed, with what, pages that
        // failed authentication when read back, and the bytes of the side table of nonce
        // counters (counted in the slots' metadata).
        v["backend_encrypted"] = self.encrypted().into();
        v["backend_cipher"] = if self.encrypted() {
            seal::CIPHER
        } else {
            "none"
        }
        .into();
        v["backend_auth_failures"] = self.backend_auth_failures().into();
        v["backend_checksums"] = if self.checksummed() {
            checksum::CHECKSUM
        } else {
            "none"
        }
        .into();
        v["backend_checksum_failures"] = self.backend_checksum_failures().into();
        v["backend_seal_metadata_bytes"] = self.seal_metadata_bytes().into();
        if let Some(b) = &self.backend {
            b.counters(v);
        }
        self.tier_counters(v);
        v["store_refused"] = ld(&s.store_refused).into();
        v["shrink_calls"] = ld(&s.shrink_calls).into();
        v["zswap_pool_max_bytes"] = ld(&s.pool_max_bytes).into();
        v["zswap_compacted_pages"] = ld(&s.compacted_pages).into();
        v["zswap_ratio_at_max"] = f64::from_bits(ld(&s.ratio_at_max_bits)).into();
        v["swap_slots_in_use"] = self.dev.in_use().into();
        v["swap_slots"] = self.dev.nslots().into();
        if let Some(z) = &self.zswap {
            let zs = z.stats();
            v["zswap_stored_pages"] = zs.stored_pages.into();
            v["zswap_pool_bytes"] = zs.pool_total_size.into();
            v["zswap_compressed_bytes"] = zs.compressed_bytes.into();
            // Index, LRU and pool bookkeeping (zswap's `Stats::metadata_bytes`, from capacities).
            v["zswap_metadata_bytes"] = zs.metadata_bytes.into();
            v["zswap_same_filled_pages"] = zs.same_filled_pages.into();
            v["zswap_reject_compress_poor"] = zs.reject_compress_poor.into();
            v["zswap_reject_pool_limit"] = zs.reject_pool_limit.into();
            let ratio = if zs.pool_total_size > 0 {
                (zs.stored_pages - zs.same_filled_pages) as f64 * PAGE_SIZE as f64
                    / zs.pool_total_size as f64
            } else {
                0.0
            };
            v["zswap_compression_ratio"] = ratio.into();
        }
    }

    /// Counters per tier, vmstat style, and `tier_chain` naming the tiers in order: for each,
    /// `tier_<name>_pgin` (pages read by faults), `_pgout` (pages stored into it from above),
    /// `_migrated` (pages moved down out of it: zswap's writeback, a chain's migration; for a
    /// chain's far tier, moved into it), `_pages` and `_bytes` (held now; a lone backend
    /// reports no `_pages`), `_failures` (writes and reads that failed). A chain's tiers are
    /// reported by the chain (`chain.rs`).
    fn tier_counters(&self, v: &mut serde_json::Value) {
        let s = &self.stats;
        let ld = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut names: Vec<&str> = Vec::new();
        if let Some(z) = &self.zswap {
            let zs = z.stats();
            names.push("zswap");
            v["tier_zswap_pgin"] = ld(&s.zswpin).into();
            v["tier_zswap_pgout"] = ld(&s.zswpout).into();
            v["tier_zswap_migrated"] = ld(&s.zswpwb).into();
            v["tier_zswap_pages"] = zs.stored_pages.into();
            v["tier_zswap_bytes"] = zs.pool_total_size.into();
            v["tier_zswap_failures"] = ld(&s.writeback_errors).into();
        }
        match (&self.chain, &self.backend) {
            (Some(c), _) => names.extend(c.names()),
            (None, Some(_)) => {
                let name = tier_name(&self.cfg.backend);
                names.push(name);
                v[format!("tier_{name}_pgin")] = ld(&s.pswpin).into();
                v[format!("tier_{name}_pgout")] = ld(&s.pswpout).into();
                v[format!("tier_{name}_migrated")] = 0.into();
                v[format!("tier_{name}_failures")] =
                    (ld(&s.backend_write_errors) + ld(&s.backend_read_errors)).into();
            }
            (None, None) => {}
        }
        v["tier_chain"] = names.join(",").replace('_', "-").into();
    }

    /// The run is over: the backend drops what it holds for it (a Redis Cluster's keys).
    /// Reads and writes fail after this.
    pub fn close(&self) {
        if let Some(b) = &self.backend {
            b.close();
        }
    }

    /// Full consistency check of the slot device (tests).
    pub fn check_integrity(&self) -> Result<(), String> {
        self.dev.check_integrity().map_err(|e| e.to_string())?;
        if let Some(z) = &self.zswap {
            z.check_integrity()?;
        }
        Ok(())
    }

    /// Whether `log` of a writeback failure was already printed (tests).
    pub fn writeback_error_logged(&self) -> bool {
        self.writeback_error_logged.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::path::PathBuf;

    fn page(tag: u64) -> Vec<u8> {
        let mut p = vec![0u8; PAGE_SIZE];
        crate::demo::fill_page(&mut p, tag, 7);
        p
    }

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("uffd-tiers-{name}-{}", std::process::id()))
    }

    fn cfg(zswap: Option<u64>, backend: BackendSpec) -> TierConfig {
        TierConfig {
            zswap: zswap.map(|max| ZswapTier {
                max_pool_bytes: max,
                ..ZswapTier::default()
            }),
            backend,
            swap_bytes: 64 << 20,
            large_folios: true,
            discard: true,
            encrypt: true,
            checksums: true,
            fail_writes: None,
            fail_writeback_after: None,
            tmp_dir: std::env::temp_dir(),
        }
    }

    fn setups() -> Vec<(&'static str, TierConfig)> {
        let _ = std::fs::remove_file(tmp("pmem"));
        vec![
            ("zswap", cfg(Some(64 << 20), BackendSpec::None)),
            ("zswap+file", cfg(Some(64 << 20), BackendSpec::File(None))),
            ("file", cfg(None, BackendSpec::File(None))),
            ("pmem", cfg(Some(1 << 20), BackendSpec::Pmem(tmp("pmem")))),
            ("file, unencrypted", {
                let mut c = cfg(None, BackendSpec::File(None));
                c.encrypt = false;
                c
            }),
        ]
    }

    /// Stores a folio and single pages in every setup, shares one (fork), frees, reuses slots,
    /// and checks every byte read back.
    #[test]
    fn store_read_share_free_in_every_setup() {
        for (name, c) in setups() {
            let t = Tiers::new(c).unwrap();
            let folio: Vec<u8> = (0..16).flat_map(page).collect();
            let singles: Vec<Vec<u8>> = (100..104).map(page).collect();
            let mut units: Vec<(u32, &[u8])> = vec![(4, &folio[..])];
            units.extend(singles.iter().map(|p| (0u32, &p[..])));
            let got = t.store_units(&units);
            let slots: Vec<Vec<u32>> = got.into_iter().map(|r| r.unwrap()).collect();
            assert_eq!(slots[0].len(), 16);
            if t.zswap.is_none() {
                assert_eq!(slots[0][0] % 16, 0, "{name}: an order-4 folio is aligned");
            } else {
                // zswap keys pages one by one: a slot per page, no fallback counted.
                assert_eq!(t.stats.swpout_fallback.load(Ordering::Relaxed), 0);
                assert_eq!(t.stats.swpout_by_order[4].load(Ordering::Relaxed), 1);
            }
            let mut out = vec![0u8; PAGE_SIZE];
            for (i, &s) in slots[0].iter().enumerate() {
                t.read(s, &mut out).unwrap();
                assert_eq!(out, page(i as u64), "{name}: folio page {i}");
            }
            // The folio as a run: whole; from the backend in one read when its slots follow
            // each other there.
            let reads = t.stats.backend_reads.load(Ordering::Relaxed);
            let mut run = vec![0u8; 16 * PAGE_SIZE];
            if slots[0].windows(2).all(|w| w[1] == w[0] + 1) {
                let (n, tier) = t.read_run(slots[0][0], 16, &mut run).unwrap();
                assert_eq!(n, 16, "{name}");
                assert_eq!(run, folio, "{name}: the folio read as a run");
                if tier == Tier::Backend {
                    assert_eq!(
                        t.stats.backend_reads.load(Ordering::Relaxed),
                        reads + 1,
                        "{name}: one backend read for the folio"
                    );
                }
            }
            // A shared page: two references, readable until the last goes.
            let s = slots[1][0];
            t.dup(s).unwrap();
            assert_eq!(t.count(s), 2);
            t.put(s).unwrap();
            t.read(s, &mut out).unwrap();
            assert_eq!(
                out,
                page(100),
                "{name}: a page still referenced stays readable"
            );
            t.put(s).unwrap();
            assert_eq!(t.count(s), 0);
            assert!(t.put(s).is_err(), "{name}: freeing a free slot is an error");
            // The freed slot is reused for new data, which must not be lost to the old entry.
            let fresh = page(999);
            let again = t.store_units(&[(0, &fresh[..])]).pop().unwrap().unwrap();
            t.read(again[0], &mut out).unwrap();
            assert_eq!(out, fresh, "{name}");
            t.check_integrity().unwrap();
            let mut v = serde_json::json!({});
            t.to_json(&mut v);
            let out_pages = v["zswpout"].as_u64().unwrap() + v["pswpout"].as_u64().unwrap()
                - v["zswpwb"].as_u64().unwrap();
            assert_eq!(out_pages, 21, "{name}: {v}");
            assert_eq!(v["swpout_order4"].as_u64(), Some(1), "{name}: {v}");
            let sealed = t.backend.is_some() && t.cfg.encrypt;
            assert_eq!(
                v["backend_encrypted"].as_bool(),
                Some(sealed),
                "{name}: {v}"
            );
            assert_eq!(v["backend_auth_failures"].as_u64(), Some(0), "{name}: {v}");
        }
    }

    /// A run whose backend read fails part way (here: past the end of the swap file, which
    /// ends after the last page written) still gives the page asked for, read alone, and
    /// counts the failure.
    #[test]
    fn a_failed_run_read_keeps_its_first_page() {
        let t = Tiers::new(cfg(None, BackendSpec::File(None))).unwrap();
        let p = page(5);
        let slot = t.store_units(&[(0, &p[..])]).pop().unwrap().unwrap()[0];
        let mut buf = vec![1u8; 2 * PAGE_SIZE];
        let (n, tier) = t.read_run(slot, 2, &mut buf).unwrap();
        assert_eq!((n, tier), (1, Tier::Backend));
        assert_eq!(&buf[..PAGE_SIZE], &p[..]);
        assert_eq!(t.stats.backend_read_errors.load(Ordering::Relaxed), 1);
        assert!(t.read_run(slot + 1, 1, &mut buf).is_err());
        t.put(slot).unwrap();
    }

    /// zswap over its limit writes back through the shrinker; the pages are then read from
    /// the backend.
    #[test]
    fn writeback_through_the_shrinker() {
        let mut c = cfg(Some(1 << 20), BackendSpec::File(None));
        c.large_folios = false;
        let t = Tiers::new(c).unwrap();
        let pages: Vec<Vec<u8>> = (0..1200).map(page).collect();
        let mut slots = Vec::new();
        for p in &pages {
            slots.push(t.store_units(&[(0, &p[..])]).pop().unwrap().unwrap()[0]);
            t.balance();
        }
        let wb = t.stats.zswpwb.load(Ordering::Relaxed);
        assert!(wb > 0, "nothing was written back");
        assert!(t.stats.shrink_calls.load(Ordering::Relaxed) > 0);
        let mut out = vec![0u8; PAGE_SIZE];
        let mut from_backend = 0;
        for (i, &s) in slots.iter().enumerate() {
            if t.read(s, &mut out).unwrap() == Tier::Backend {
                from_backend += 1;
            }
            assert_eq!(out, pages[i], "page {i}");
        }
        assert!(from_backend > 0);
        // The same pages read as runs of consecutive slots (up to 16), mixing pages still in
        // zswap and pages written back: every byte as stored, fewer backend reads than pages.
        let (reads, pages_in) = (
            t.stats.backend_reads.load(Ordering::Relaxed),
            t.stats.pswpin.load(Ordering::Relaxed),
        );
        let mut i = 0;
        let mut buf = vec![0u8; 16 * PAGE_SIZE];
        while i < slots.len() {
            let mut n = 1;
            while n < 16 && i + n < slots.len() && slots[i + n] == slots[i] + n as u32 {
                n += 1;
            }
            let (got, _) = t.read_run(slots[i], n, &mut buf).unwrap();
            assert_eq!(got, n, "run at page {i}");
            for k in 0..n {
                assert_eq!(
                    &buf[k * PAGE_SIZE..(k + 1) * PAGE_SIZE],
                    &pages[i + k][..],
                    "page {} read in a run",
                    i + k
                );
            }
            i += n;
        }
        let reads = t.stats.backend_reads.load(Ordering::Relaxed) - reads;
        let pages_in = t.stats.pswpin.load(Ordering::Relaxed) - pages_in;
        assert_eq!(
            pages_in, from_backend,
            "the same pages came from the backend"
        );
        assert!(
            reads < pages_in,
            "{reads} backend reads for {pages_in} pages"
        );
        for &s in &slots {
            t.put(s).unwrap();
        }
        assert_eq!(t.slots_in_use(), 0);
        t.check_integrity().unwrap();
    }

    /// A failing backend: direct stores fail and hold no slot; failed writebacks leave the
    /// entries in zswap, readable.
    #[test]
    fn failing_backend_loses_nothing() {
        let mut c = cfg(None, BackendSpec::File(None));
        c.fail_writes = Some(FailWrites {
            after_bytes: 2 * PAGE_SIZE_U64,
            errno: libc::ENOSPC,
        });
        let t = Tiers::new(c).unwrap();
        let pages: Vec<Vec<u8>> = (0..4).map(page).collect();
        let r: Vec<_> = pages
            .iter()
            .map(|p| t.store_units(&[(0, &p[..])]).pop().unwrap())
            .collect();
        assert!(r[0].is_ok() && r[1].is_ok());
        assert!(
            matches!(r[2], Err(StoreFail::Io(ref e)) if e.raw_os_error() == Some(libc::ENOSPC))
        );
        assert_eq!(t.slots_in_use(), 2, "a failed store holds no slot");
        assert_eq!(t.stats.backend_write_errors.load(Ordering::Relaxed), 2);

        let mut c = cfg(Some(1 << 20), BackendSpec::File(None));
        c.fail_writes = Some(FailWrites {
            after_bytes: 0,
            errno: libc::EIO,
        });
        let t = Tiers::new(c).unwrap();
        let pages: Vec<Vec<u8>> = (0..1200).map(page).collect();
        let mut stored = Vec::new();
        for (i, p) in pages.iter().enumerate() {
            if let Ok(s) = t.store_units(&[(0, &p[..])]).pop().unwrap() {
                stored.push((i, s[0]));
            }
            t.balance();
        }
        assert!(t.stats.writeback_errors.load(Ordering::Relaxed) > 0);
        assert!(t.writeback_error_logged());
        assert_eq!(t.stats.zswpwb.load(Ordering::Relaxed), 0);
        let mut out = vec![0u8; PAGE_SIZE];
        for &(i, s) in &stored {
            assert_eq!(t.read(s, &mut out).unwrap(), Tier::Zswap);
            assert_eq!(out, pages[i]);
        }
    }

    #[test]
    fn backend_specs() {
        assert_eq!(BackendSpec::parse("none"), Ok(BackendSpec::None));
        assert_eq!(BackendSpec::parse("file"), Ok(BackendSpec::File(None)));
        assert_eq!(
            BackendSpec::parse("pmem:/dev/dax0.0"),
            Ok(BackendSpec::Pmem("/dev/dax0.0".into()))
        );
        assert!(BackendSpec::parse("pmem:").is_err());
        assert!(BackendSpec::parse("nvme:/x").unwrap_err().contains("nvme"));
    }

    #[test]
    fn pmem_refuses_an_existing_file_and_is_removed() {
        let p = tmp("pmem-existing");
        std::fs::write(&p, b"precious").unwrap();
        let e = PmemBackend::open(&p, 1 << 20).unwrap_err();
        assert!(e.to_string().contains(&p.display().to_string()), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"precious");
        std::fs::remove_file(&p).unwrap();
        let b = PmemBackend::open(&p, 1 << 20).unwrap();
        assert!(b.write((1 << 20) - 4096, &page(1)).is_ok());
        assert!(b.write(1 << 20, &page(1)).is_err(), "beyond the device");
        drop(b);
        assert!(!p.exists());
    }

    /// A test page (compressible as the others) that says `SECRET-PAGE-` every 256 bytes:
    /// the pattern to look for on the device.
    fn secret_page(tag: u64) -> Vec<u8> {
        let mut p = page(tag);
        for chunk in p.chunks_exact_mut(256) {
            chunk[..12].copy_from_slice(b"SECRET-PAGE-");
        }
        p
    }

    fn holds_plaintext(device: &[u8]) -> bool {
        device.windows(12).any(|w| w == b"SECRET-PAGE-")
    }

    fn named(c: TierConfig) -> (TierConfig, PathBuf) {
        let path = match &c.backend {
            BackendSpec::File(Some(p)) | BackendSpec::Pmem(p) => p.clone(),
            _ => unreachable!("a named backend"),
        };
        let _ = std::fs::remove_file(&path);
        (c, path)
    }

    /// Pages stored through the tiers (direct stores of a folio and single pages, and zswap's
    /// writeback) leave no plaintext on the swap file or the pmem file with encryption on,
    /// and read back whole; with it off the same search finds the pattern (the search works),
    /// and freed space keeps only ciphertext.
    #[test]
    fn the_device_holds_only_ciphertext() {
        for encrypt in [true, false] {
            for (name, zswap, backend) in [
                ("file", None, BackendSpec::File(Some(tmp("ct-file")))),
                ("pmem", None, BackendSpec::Pmem(tmp("ct-pmem"))),
                (
                    "zswap+file (writeback)",
                    Some(1 << 20),
                    BackendSpec::File(Some(tmp("ct-wb"))),
                ),
            ] {
                let mut c = cfg(zswap, backend);
                c.encrypt = encrypt;
                c.large_folios = zswap.is_none();
                let (c, path) = named(c);
                let t = Tiers::new(c).unwrap();
                let mut stored: Vec<(u32, Vec<u8>)> = Vec::new();
                if zswap.is_none() {
                    let folio: Vec<u8> = (0..16).flat_map(secret_page).collect();
                    let slots = t.store_units(&[(4, &folio[..])]).pop().unwrap().unwrap();
                    for (i, &s) in slots.iter().enumerate() {
                        stored.push((s, secret_page(i as u64)));
                    }
                }
                let singles = if zswap.is_some() { 1200 } else { 64 };
                for i in 100..100 + singles {
                    let p = secret_page(i);
                    let s = t.store_units(&[(0, &p[..])]).pop().unwrap().unwrap()[0];
                    stored.push((s, p));
                    t.balance();
                }
                assert!(t.stats.pswpout.load(Ordering::Relaxed) > 0, "{name}");
                if zswap.is_some() {
                    assert!(t.stats.zswpwb.load(Ordering::Relaxed) > 0, "{name}");
                }
                let device = std::fs::read(&path).unwrap();
                assert_eq!(
                    holds_plaintext(&device),
                    !encrypt,
                    "{name}, encrypt {encrypt}: plaintext on the device"
                );
                let mut out = vec![0u8; PAGE_SIZE];
                for (s, p) in &stored {
                    t.read(*s, &mut out).unwrap();
                    assert_eq!(&out, p, "{name}, encrypt {encrypt}: slot {s}");
                }
                for (s, _) in &stored {
                    t.put(*s).unwrap();
                }
                if encrypt {
                    assert!(!holds_plaintext(&std::fs::read(&path).unwrap()), "{name}");
                    assert!(t.read(stored[0].0, &mut out).is_err(), "freed: forgotten");
                    assert_eq!(t.seal_metadata_bytes(), seal::EMPTY_TABLE_BYTES, "{name}");
                }
                t.check_integrity().unwrap();
                drop(t);
                assert!(!path.exists(), "{name}: the named file is removed");
            }
        }
    }

    /// Flips one bit of a stored page in the file: its read fails with an error and hands
    /// out no bytes; a run over it stops before it; the counters say so.
    #[test]
    fn a_page_altered_on_the_device_fails_its_read() {
        for (name, backend) in [
            ("file", BackendSpec::File(Some(tmp("alt-file")))),
            ("pmem", BackendSpec::Pmem(tmp("alt-pmem"))),
        ] {
            let (c, path) = named(cfg(None, backend));
            let t = Tiers::new(c).unwrap();
            let folio: Vec<u8> = (0..16).flat_map(secret_page).collect();
            let f = t.store_units(&[(4, &folio[..])]).pop().unwrap().unwrap();
            let p = secret_page(99);
            let s = t.store_units(&[(0, &p[..])]).pop().unwrap().unwrap()[0];
            t.flush();
            let dev = std::fs::OpenOptions::new()
                .write(true)
                .read(true)
                .open(&path)
                .unwrap();
            let flip = |slot: u32, at: u64| {
                let off = seal::data_offset(u64::from(slot)) + at;
                let mut b = [0u8];
                dev.read_exact_at(&mut b, off).unwrap();
                dev.write_all_at(&[b[0] ^ 0x01], off).unwrap();
            };
            flip(s, 1234);
            let mut out = vec![0xa5u8; PAGE_SIZE];
            let e = t.read(s, &mut out).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{name}: {e}");
            assert!(e.to_string().contains("authentication"), "{name}: {e}");
            assert!(
                out.iter().all(|&x| x == 0),
                "{name}: bytes of a failed read"
            );
            assert_eq!(t.backend_auth_failures(), 1, "{name}");
            // Page 5 of the folio: a run from its first page stops before it (the stretch read
            // fails, the first page is read alone), and page 5 alone fails.
            flip(f[5], 0);
            let mut run = vec![0u8; 16 * PAGE_SIZE];
            let (n, tier) = t.read_run(f[0], 16, &mut run).unwrap();
            assert_eq!((n, tier), (1, Tier::Backend), "{name}");
            assert_eq!(run[..PAGE_SIZE], folio[..PAGE_SIZE], "{name}");
            assert!(t.read(f[5], &mut out).is_err(), "{name}");
            t.read(f[4], &mut out).unwrap();
            assert_eq!(out, secret_page(4), "{name}");
            let mut v = serde_json::json!({});
            t.to_json(&mut v);
            assert_eq!(v["backend_auth_failures"].as_u64(), Some(3), "{name}: {v}");
            assert_eq!(v["backend_cipher"].as_str(), Some("aes-256-gcm"), "{name}");
            assert!(
                v["backend_read_errors"].as_u64().unwrap() >= 3,
                "{name}: {v}"
            );
        }
    }

    /// Without encryption, a page the device lost (it reads back as zeros) or altered fails
    /// its read by its checksum; its neighbours read back; a freed slot's checksum goes.
    #[test]
    fn without_encryption_a_page_lost_on_the_device_fails_its_read() {
        let mut c = cfg(None, BackendSpec::File(Some(tmp("crc"))));
        c.encrypt = false;
        let (c, path) = named(c);
        let t = Tiers::new(c).unwrap();
        let (a, b) = (secret_page(1), secret_page(2));
        let sa = t.store_units(&[(0, &a[..])]).pop().unwrap().unwrap()[0];
        let sb = t.store_units(&[(0, &b[..])]).pop().unwrap().unwrap()[0];
        t.flush();
        let dev = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        dev.write_all_at(&[0u8; PAGE_SIZE], u64::from(sb) * PAGE_SIZE_U64)
            .unwrap();
        let mut out = vec![0xa5u8; PAGE_SIZE];
        let e = t.read(sb, &mut out).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains("checksum"), "{e}");
        assert!(out.iter().all(|&x| x == 0), "bytes of a failed read");
        t.read(sa, &mut out).unwrap();
        assert_eq!(out, a);
        let mut v = serde_json::json!({});
        t.to_json(&mut v);
        assert_eq!(v["backend_checksum_failures"].as_u64(), Some(1), "{v}");
        assert_eq!(v["backend_checksums"].as_str(), Some("crc32c"), "{v}");
        assert_eq!(v["backend_encrypted"].as_bool(), Some(false), "{v}");
        assert!(t.seal_metadata_bytes() > seal::EMPTY_TABLE_BYTES);
        t.put(sa).unwrap();
        t.put(sb).unwrap();
        assert_eq!(
            t.seal_metadata_bytes(),
            seal::EMPTY_TABLE_BYTES,
            "checksums given back"
        );
    }

    /// A page's ciphertext copied to another slot's offset is refused there.
    #[test]
    fn a_page_copied_to_another_slot_fails() {
        let (c, path) = named(cfg(None, BackendSpec::File(Some(tmp("copy")))));
        let t = Tiers::new(c).unwrap();
        let (a, b) = (secret_page(1), secret_page(2));
        let sa = t.store_units(&[(0, &a[..])]).pop().unwrap().unwrap()[0];
        let sb = t.store_units(&[(0, &b[..])]).pop().unwrap().unwrap()[0];
        t.flush();
        let dev = std::fs::OpenOptions::new()
            .write(true)
            .read(true)
            .open(&path)
            .unwrap();
        // The sealed page and its tag.
        let (sa, sb64) = (u64::from(sa), u64::from(sb));
        let mut ct = vec![0u8; PAGE_SIZE];
        let mut tag = [0u8; 16];
        dev.read_exact_at(&mut ct, seal::data_offset(sa)).unwrap();
        dev.read_exact_at(&mut tag, seal::tag_offset(sa)).unwrap();
        dev.write_all_at(&ct, seal::data_offset(sb64)).unwrap();
        dev.write_all_at(&tag, seal::tag_offset(sb64)).unwrap();
        let sa = sa as u32;
        let mut out = vec![0u8; PAGE_SIZE];
        assert!(t.read(sb, &mut out).is_err());
        t.read(sa, &mut out).unwrap();
        assert_eq!(out, a);
        assert_eq!(t.backend_auth_failures(), 1);
    }

    /// A slot freed and stored again (the same page each time) takes a new nonce every time,
    /// and its ciphertext changes; the side table of nonces costs 8-10 bytes a sealed page
    /// and is given back when the pages go.
    #[test]
    fn rewrites_of_a_slot_never_reuse_a_nonce() {
        // A small device (2048 slots), so that slots come round again.
        let mut c = cfg(None, BackendSpec::File(Some(tmp("nonce"))));
        c.swap_bytes = 8 << 20;
        let (c, path) = named(c);
        let t = Tiers::new(c).unwrap();
        let sealer = t.sealer.clone().unwrap();
        let p = secret_page(5);
        let dev = std::fs::File::open(&path).unwrap();
        let mut nonces = std::collections::HashSet::new();
        let mut last = std::collections::HashMap::new();
        let mut rewrites = 0;
        for _ in 0..3 * 2048 {
            let s = t.store_units(&[(0, &p[..])]).pop().unwrap().unwrap()[0];
            let counter = sealer.seal_of(u64::from(s)).unwrap();
            assert!(nonces.insert(counter), "nonce {counter} reused");
            let mut ct = vec![0u8; PAGE_SIZE];
            dev.read_exact_at(&mut ct, seal::data_offset(u64::from(s)))
                .unwrap();
            if let Some(before) = last.insert(s, ct.clone()) {
                rewrites += 1;
                assert_ne!(
                    ct, before,
                    "the same page in slot {s} gave the same ciphertext"
                );
            }
            t.put(s).unwrap();
            assert_eq!(
                sealer.seal_of(u64::from(s)),
                None,
                "a freed slot's seal is forgotten"
            );
        }
        assert!(rewrites >= 2048, "{rewrites} rewrites of a slot");
        let pages: Vec<Vec<u8>> = (0..1536).map(secret_page).collect();
        let slots: Vec<u32> = pages
            .iter()
            .map(|p| t.store_units(&[(0, &p[..])]).pop().unwrap().unwrap()[0])
            .collect();
        let per_page =
            (t.seal_metadata_bytes() - seal::EMPTY_TABLE_BYTES) as f64 / slots.len() as f64;
        assert!(
            (8.0..10.0).contains(&per_page),
            "{per_page} bytes a sealed page"
        );
        let (with_seals, _) = t.metadata_bytes();
        assert_eq!(with_seals, t.dev.metadata_bytes() + t.seal_metadata_bytes());
        for s in slots {
            t.put(s).unwrap();
        }
        assert_eq!(t.seal_metadata_bytes(), seal::EMPTY_TABLE_BYTES);
    }

    /// A chain of a small swap file over a (simulated) pmem file, sealed and unsealed: pages
    /// fill the file, the migrator moves the oldest down while reader threads read random
    /// stored pages (each must come back right, whichever tier it is in, moved or not during
    /// the read), the rest move down on demand, and every page reads back; freeing every slot
    /// empties both tiers; the per-tier counters say where pages went.
    #[test]
    fn a_chain_moves_pages_down_and_reads_them_from_either_tier() {
        use std::sync::Mutex as StdMutex;
        for encrypt in [true, false] {
            let far = tmp(&format!("chain-far-{encrypt}"));
            let _ = std::fs::remove_file(&far);
            let mut spec = ChainSpec::new(BackendSpec::File(None), BackendSpec::Pmem(far.clone()));
            spec.near_bytes = 1 << 20;
            spec.migrate_batch_pages = 32;
            let mut c = cfg(None, BackendSpec::Chain(Box::new(spec)));
            c.encrypt = encrypt;
            c.large_folios = false;
            let t = Arc::new(Tiers::new(c).unwrap());
            let stored: Arc<StdMutex<Vec<(u32, u64)>>> = Arc::default();
            let stop = Arc::new(AtomicBool::new(false));
            let readers: Vec<_> = (0..2)
                .map(|r| {
                    let (t, stored, stop) =
                        (Arc::clone(&t), Arc::clone(&stored), Arc::clone(&stop));
                    std::thread::spawn(move || {
                        let mut out = vec![0u8; PAGE_SIZE];
                        let mut x = 0x9E37_79B9u64 + r;
                        let mut reads = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let pick = {
                                let s = stored.lock().unwrap();
                                (!s.is_empty()).then(|| s[x as usize % s.len()])
                            };
                            let Some((slot, tag)) = pick else { continue };
                            t.read(slot, &mut out)
                                .unwrap_or_else(|e| panic!("slot {slot}: {e}"));
                            assert_eq!(out, page(tag), "slot {slot} read wrong bytes");
                            reads += 1;
                        }
                        reads
                    })
                })
                .collect();
            for tag in 0..3000u64 {
                let p = page(tag);
                let s = t.store_units(&[(0, &p[..])]).pop().unwrap().unwrap()[0];
                stored.lock().unwrap().push((s, tag));
            }
            let chain = t.chain().unwrap();
            chain.migrate_all().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            stop.store(true, Ordering::Relaxed);
            let reads: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
            assert!(reads > 0);
            chain.check_integrity().unwrap();
            let mut v = serde_json::json!({});
            t.to_json(&mut v);
            assert_eq!(v["tier_chain"].as_str(), Some("file,pmem"), "{v}");
            let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
            // Stored faster than the migrator moves them (nothing throttles these stores), so
            // many went to the far tier directly: but the file took at least its fill.
            assert_eq!(n("tier_file_pgout") + n("tier_pmem_pgout"), 3000, "{v}");
            assert_eq!(n("tier_pmem_pgout"), n("chain_spilled_full"), "{v}");
            assert!(n("tier_file_pgout") >= 256, "{v}");
            assert_eq!(n("tier_file_migrated"), n("tier_file_pgout"), "{v}");
            assert_eq!(n("chain_migrate_abandoned"), 0, "nothing was freed: {v}");
            assert_eq!(n("tier_file_migrated"), n("tier_pmem_migrated"));
            assert_eq!(n("tier_file_pages"), 0, "all moved down: {v}");
            assert_eq!(n("tier_pmem_pages"), 3000);
            assert_eq!(n("tier_file_failures") + n("tier_pmem_failures"), 0);
            assert_eq!(v["backend_encrypted"].as_bool(), Some(encrypt));
            let mut out = vec![0u8; PAGE_SIZE];
            let all = stored.lock().unwrap().clone();
            for &(slot, tag) in &all {
                t.read(slot, &mut out).unwrap();
                assert_eq!(out, page(tag), "slot {slot}");
            }
            // New pages land near again; a stretch across both tiers reads whole.
            let p = page(77_777);
            let s = t.store_units(&[(0, &p[..])]).pop().unwrap().unwrap()[0];
            assert!(chain.is_near(s));
            t.read(s, &mut out).unwrap();
            assert_eq!(out, p);
            t.put(s).unwrap();
            for &(slot, _) in &all {
                t.put(slot).unwrap();
            }
            let mut v = serde_json::json!({});
            t.to_json(&mut v);
            assert_eq!(v["tier_file_pages"].as_u64(), Some(0), "{v}");
            assert_eq!(v["tier_pmem_pages"].as_u64(), Some(0), "{v}");
            assert_eq!(
                v["chain_far_places_in_use"].as_u64(),
                Some(0),
                "far places released"
            );
            assert!(t.read(all[0].0, &mut out).is_err(), "a freed slot reads");
            chain.check_integrity().unwrap();
            t.check_integrity().unwrap();
            t.close();
            drop(t);
            assert!(!far.exists(), "the pmem file is removed");
        }
    }
}
