//! The store itself: the sharded index of entries, the LRU, limits, counters, writeback.

use crate::batch::{compress_part, BatchPool, Job, PageRules, Part, PartError, Reply};
use crate::compress::{CodecError, Compressor, PageCodec, SCRATCH_SIZE};
use crate::index::{Entry, EntryRef, Index, PayloadRef};
use crate::lru::{Lru, CHUNK_ENTRIES};
use crate::pool::{Handle, Pool, PoolError, Relocate, MAX_OBJECT};
use crate::sync::{current_cpu, nr_cpus, AtomicU32, Condvar, Mutex, MutexGuard, PlainMutex};
use crate::PAGE_SIZE;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Largest folio stored whole: 512 pages (2 MiB, PMD order 9).
pub const MAX_FOLIO_PAGES: usize = 512;
/// Highest folio order (`log2(MAX_FOLIO_PAGES)`).
pub const MAX_ORDER: usize = 9;
/// Swap entries per index shard: 64 MiB of swap space, the kernel's `SWAP_ADDRESS_SPACE_PAGES`.
pub const ENTRIES_PER_SHARD: u64 = 1 << 14;

/// How a pool is built. `Config::default()` is lz4, a 256 MiB pool limit, accept
/// threshold 90%, CRC on, spans of up to 8 pages, one thread per store, 64 index shards,
/// folios of 4 pages or more compressed in units of up to 16 pages, compaction across classes.
#[derive(Debug, Clone)]
pub struct Config {
    /// The pool's compression algorithm.
    pub compressor: Compressor,
    /// Largest pool size in bytes (the kernel's `max_pool_percent`, as bytes).
    pub max_pool_bytes: u64,
    /// Once the pool is full, stores are rejected until it shrinks below this percentage of
    /// `max_pool_bytes` (`accept_threshold_percent`), 0..=100.
    pub accept_threshold_percent: u8,
    /// Keep a CRC32C of each page (one of each multi-page object, over all its pages) and check
    /// it on load and writeback.
    pub crc: bool,
    /// Largest span (zspage) in pages, 1..=16 (zsmalloc's chain size).
    pub max_span_pages: usize,
    /// Threads that compress the pages of one large folio (1: the calling thread only). Only for
    /// folios compressed page by page (not in multi-page units).
    pub batch_threads: usize,
    /// Folios of at least this many pages are compressed on `batch_threads` threads.
    pub batch_min_pages: usize,
    /// Number of index shards (a power of two); a key's shard is `(key >> 14) % index_shards`.
    pub index_shards: usize,
    /// Store pages filled with one repeated 64-bit word as that word, without pool memory.
    pub same_filled: bool,
    /// Folios of at least this many pages are compressed in multi-page units (one compressed
    /// object per unit, shared by its pages' entries) instead of page by page; 0 = never (the
    /// kernel zswap's page-by-page behaviour). Default 4: folios of order >= 2.
    pub multi_page_min_pages: usize,
    /// Pages per multi-page unit, a power of two 2..=512: a larger folio is cut into units of
    /// this many pages. Loading one page of a unit decompresses the whole unit, so this bounds
    /// the cost of a single-page load. Default 16 (64 KiB).
    pub multi_page_unit_pages: usize,
    /// [`Zswap::compact`] also moves what each size class keeps in partly filled spans up into
    /// free slots of larger classes (each moved object's entry is pointed at its new place);
    /// false: objects move only within their class, as zsmalloc's `zs_compact`. Default true.
    pub compact_across_classes: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            compressor: Compressor::Lz4,
            max_pool_bytes: 256 << 20,
            accept_threshold_percent: 90,
            crc: true,
            max_span_pages: 8,
            batch_threads: 1,
            batch_min_pages: 64,
            index_shards: 64,
            same_filled: true,
            multi_page_min_pages: 4,
            multi_page_unit_pages: 16,
            compact_across_classes: true,
        }
    }
}

impl Config {
    /// The defaults with `compressor`.
    pub fn new(compressor: Compressor) -> Config {
        Config {
            compressor,
            ..Config::default()
        }
    }
}

/// A rejected configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The compressor cannot be used here (for deflate-iaa: libqpl absent).
    #[error(transparent)]
    Compressor(#[from] CodecError),
    /// A numeric setting is out of range.
    #[error("invalid {field} = {value}: {allowed}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What is allowed.
        allowed: &'static str,
    },
}

/// Why a store was refused. Nothing of the folio is stored after any of these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The folio is not 1..=512 pages, a power of two, or its entries overflow.
    #[error("invalid folio of {len} bytes at entry {entry:#x}: {reason}")]
    InvalidFolio {
        /// First swap entry.
        entry: u64,
        /// Byte length given.
        len: usize,
        /// What is allowed.
        reason: &'static str,
    },
    /// The pool is at its limit (or has not yet shrunk below the accept threshold): write the
    /// folio to the backing device instead.
    #[error("pool limit: pool holds {pool_bytes} bytes, limit {max_pool_bytes}")]
    PoolLimit {
        /// Pool size when refused.
        pool_bytes: u64,
        /// The configured limit.
        max_pool_bytes: u64,
    },
    /// A page does not compress below a page: write the folio to the backing device instead.
    #[error("page {page} of the folio compresses poorly ({compressed_len} bytes)")]
    CompressPoor {
        /// Index of the page within the folio.
        page: usize,
        /// Its compressed length.
        compressed_len: usize,
    },
    /// The compressor failed.
    #[error(transparent)]
    Compress(#[from] CodecError),
    /// The pool refused an object.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The index has no room for another chunk of 64 entries (about 2^26 chunks are live).
    #[error("index full: no chunk left for swap entry {entry:#x}")]
    IndexFull {
        /// First swap entry of the folio.
        entry: u64,
    },
}

/// Why a load failed. The entries are left as they were after any of these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// `out` is not 1..=512 whole pages, or the entries overflow.
    #[error("invalid load of {len} bytes at entry {entry:#x}: whole pages, 1 to 512, expected")]
    InvalidLength {
        /// First swap entry.
        entry: u64,
        /// Byte length given.
        len: usize,
    },
    /// No page is stored at `entry`.
    #[error("swap entry {entry:#x} is not in the store")]
    NotFound {
        /// The missing entry.
        entry: u64,
    },
    /// The stored data of `entry` does not decompress to a page.
    #[error("stored data of swap entry {entry:#x} is corrupt: {source}")]
    Corrupt {
        /// The entry.
        entry: u64,
        /// What the decompressor said.
        source: CodecError,
    },
    /// The page decompressed but its CRC32C differs from the one taken at store time.
    #[error("swap entry {entry:#x}: crc32c {computed:#010x} != stored {stored:#010x}")]
    CrcMismatch {
        /// The entry.
        entry: u64,
        /// CRC at store time.
        stored: u32,
        /// CRC of the decompressed bytes.
        computed: u32,
    },
    /// The entry's pool handle is not valid.
    #[error("swap entry {entry:#x}: {source}")]
    Pool {
        /// The entry.
        entry: u64,
        /// The pool's error.
        source: PoolError,
    },
    /// No decompression context could be made.
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// The caller's backing device, written by [`Zswap::scan_objects`].
pub trait Writeback {
    /// Writes the decompressed `page` of swap entry `entry` to the backing device. On error the
    /// entry stays in the store. Must not call into the same [`Zswap`] for `entry`.
    fn write_page(&mut self, entry: u64, page: &[u8]) -> std::io::Result<()>;

    /// Writes several entries' pages, `(entry, page)` each, returning each one's outcome in
    /// order (an entry whose outcome is missing or an error stays in the store). A device that
    /// does better with writes together (a disk with several in flight, a network store: one
    /// round trip) overrides it; the default writes them one by one with
    /// [`Writeback::write_page`]. The entries are all under writeback meanwhile: a load of one
    /// waits for the call to return. Same rule as `write_page` for calls into the [`Zswap`].
    fn write_pages(&mut self, pages: &[(u64, &[u8])]) -> Vec<std::io::Result<()>> {
        pages
            .iter()
            .map(|&(entry, page)| self.write_page(entry, page))
            .collect()
    }
}

/// Entries [`Zswap::scan_objects`] decompresses and hands to [`Writeback::write_pages`] at once,
/// at most.
pub const WRITEBACK_BATCH: usize = 32;

impl<F: FnMut(u64, &[u8]) -> std::io::Result<()>> Writeback for F {
    fn write_page(&mut self, entry: u64, page: &[u8]) -> std::io::Result<()> {
        self(entry, page)
    }
}

/// What one `scan_objects` call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanResult {
    /// LRU entries looked at.
    pub scanned: usize,
    /// Entries written back and freed.
    pub written_back: usize,
    /// Entries whose write (or decompression) failed; they stay stored.
    pub failed: usize,
}

/// The counters, named after the kernel's (debugfs `zswap/` and vmstat `zswpout`/`zswpin`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Pages currently stored (same-filled included).
    pub stored_pages: u64,
    /// Bytes of pool memory (spans) held.
    pub pool_total_size: u64,
    /// Sum of the compressed objects' lengths.
    pub compressed_bytes: u64,
    /// Stored pages that are one repeated word and use no pool memory.
    pub same_filled_pages: u64,
    /// Pages refused because they compressed to a page or more.
    pub reject_compress_poor: u64,
    /// Folios refused because the compressor failed.
    pub reject_compress_fail: u64,
    /// Folios refused because of the pool limit.
    pub reject_pool_limit: u64,
    /// Times the pool reached its limit.
    pub pool_limit_hit: u64,
    /// Entries whose writeback failed (writer error or corrupt data); they stayed stored.
    pub reject_reclaim_fail: u64,
    /// Pages written back to the backing device.
    pub written_back_pages: u64,
    /// Loads that failed on corrupt data (decompression error or CRC mismatch).
    pub decompress_fail: u64,
    /// Pages stored (all orders).
    pub zswpout: u64,
    /// Folios stored, by order 0..=9 (the mTHP `zswpout` counters).
    pub zswpout_by_order: [u64; MAX_ORDER + 1],
    /// Pages loaded.
    pub zswpin: u64,
    /// Pages released by compaction.
    pub pages_compacted: u64,
    /// Heap bytes of the store's per-entry metadata, computed from capacities (not measured
    /// with an allocator, so the same on every machine): the index, the LRU, the multi-page
    /// objects' headers and the pool's span bookkeeping. Not included: the spans' memory
    /// (`pool_total_size`), the per-worker buffers, and what [`Zswap::compact`] allocates while
    /// it runs (its map of the objects it may move).
    pub metadata_bytes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    stored_pages: AtomicU64,
    same_filled_pages: AtomicU64,
    reject_compress_poor: AtomicU64,
    reject_compress_fail: AtomicU64,
    reject_pool_limit: AtomicU64,
    pool_limit_hit: AtomicU64,
    reject_reclaim_fail: AtomicU64,
    written_back_pages: AtomicU64,
    decompress_fail: AtomicU64,
    zswpout: AtomicU64,
    zswpout_by_order: [AtomicU64; MAX_ORDER + 1],
    zswpin: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn drop_count(c: &AtomicU64, n: u64) {
    c.fetch_sub(n, Ordering::Relaxed);
}

#[derive(Debug, Clone)]
pub(crate) enum Payload {
    /// A page that is this word repeated.
    Same(u64),
    /// A compressed page in the pool.
    Compressed(Handle),
    /// Page `slot` of a multi-page object shared with other entries.
    Shared { obj: Arc<Shared>, slot: u16 },
}

/// One compressed object holding several pages (a multi-page unit of a large folio), stored in
/// the pool as chunks of at most [`MAX_OBJECT`] bytes. Each entry pointing at it holds one
/// reference; the chunks are freed when the last one goes.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The chunks' pool handles. Read under the shard lock of an entry pointing at the object,
    /// rewritten only by [`Zswap::compact`], which holds every shard lock: the locks order the
    /// accesses, the atomics only make the shared object `Sync`.
    pub(crate) chunks: Box<[AtomicU64]>,
    /// Pages it decompresses to.
    pub(crate) pages: u16,
    /// The low 16 bits of the swap entry of the unit's first page.
    pub(crate) first: u16,
    /// Every page of the unit is in the object (none was same-filled): page `key` is at slot
    /// `key - first` (the slot is derived, not kept in the index). Otherwise the index keeps
    /// each page's slot.
    pub(crate) whole_unit: bool,
    /// CRC32C of the pages it decompresses to, all of them in order (0 with `Config::crc`
    /// off): a load decompresses the whole object anyway, so one CRC per object is checked
    /// instead of one per page (whose entries keep none).
    pub(crate) crc: u32,
    /// Entries (or prepared, not yet inserted pages) pointing at it.
    pub(crate) refs: AtomicU32,
}

// The header counted in the README (with the `Arc`'s two counts: 48 bytes).
#[cfg(not(zswap_loom))]
const _: () = assert!(std::mem::size_of::<Shared>() == 32);

impl Shared {
    /// The slot of the page at swap entry `key` (whose entry points at this object), given the
    /// slot the index keeps (0 for an object of a whole unit, whose slots are derived).
    pub(crate) fn slot_of(&self, key: u64, kept: u16) -> u16 {
        if self.whole_unit {
            // The unit spans at most 512 entries from its first: the difference fits 16 bits.
            (key as u16).wrapping_sub(self.first)
        } else {
            kept
        }
    }

    /// The handles of the object's pool chunks, in order.
    pub(crate) fn handles(&self) -> impl Iterator<Item = Handle> + '_ {
        self.chunks
            .iter()
            .map(|c| Handle::from_raw(c.load(Ordering::Relaxed)))
    }
}

/// Heap bytes of one multi-page object with `chunks` pool chunks: the `Arc` allocation (two
/// counts and the `Shared`) and its chunk list.
fn shared_heap_bytes(chunks: usize) -> u64 {
    (2 * std::mem::size_of::<usize>()
        + std::mem::size_of::<Shared>()
        + chunks * std::mem::size_of::<AtomicU64>()) as u64
}

/// The owner of a pool object in [`Zswap::compact`]'s map: the entry at `key`, through its
/// multi-page object's chunk `chunk` unless that is [`NOT_SHARED`].
#[derive(Debug, Clone, Copy)]
struct Owner {
    key: u64,
    chunk: u32,
}

const NOT_SHARED: u32 = u32::MAX;

/// Objects moved per compaction step, under every shard lock: a step holds them for about a
/// millisecond (the moves, and sorting the class's partly filled spans).
const COMPACT_STEP_MOVES: usize = 1024;

/// [`Relocate`] for one compaction step: every shard locked, the owners gathered before the
/// step (maybe stale: each is checked against the entry before an object moves).
struct Relocator<'z, 'g> {
    zswap: &'z Zswap,
    /// All shards, by shard number.
    guards: &'g mut [ShardGuard<'z>],
    /// Slot handle (raw) -> owner.
    owners: &'g mut HashMap<u64, Owner>,
}

impl Relocator<'_, '_> {
    /// The handle the owner's entry holds now, if it is still the owner's kind of entry.
    fn current(&self, o: Owner) -> Option<Handle> {
        let e = self.guards[self.zswap.shard_of(o.key)].get(o.key)?;
        match e.payload() {
            PayloadRef::Compressed(h) if o.chunk == NOT_SHARED => Some(h),
            PayloadRef::Shared(obj, _) if o.chunk != NOT_SHARED => obj
                .chunks
                .get(o.chunk as usize)
                .map(|c| Handle::from_raw(c.load(Ordering::Relaxed))),
            _ => None,
        }
    }
}

impl Relocate for Relocator<'_, '_> {
    fn movable(&mut self, slot: Handle) -> Option<usize> {
        // An object is owned by exactly one entry (or multi-page object) at a time: if the
        // entry the map names still holds this slot, it is the owner now, whatever happened
        // since the map was made. Anything else (an object allocated since, or prepared for a
        // store not yet in the index) stays where it is.
        let o = *self.owners.get(&slot.raw())?;
        let h = self.current(o)?;
        (h.slot() == slot).then(|| h.len())
    }

    fn moved(&mut self, from: Handle, to: Handle) {
        let Some(o) = self.owners.remove(&from.slot().raw()) else {
            return;
        };
        let map = &mut self.guards[self.zswap.shard_of(o.key)];
        if o.chunk == NOT_SHARED {
            if let Some(mut e) = map.get_mut(o.key) {
                e.set_handle(to.raw());
            }
        } else if let Some(PayloadRef::Shared(obj, _)) = map.get(o.key).map(EntryRef::payload) {
            if let Some(c) = obj.chunks.get(o.chunk as usize) {
                c.store(to.raw(), Ordering::Relaxed);
            }
        }
        self.owners.insert(to.slot().raw(), o);
    }
}

#[derive(Debug)]
struct Shard {
    map: Mutex<Index>,
    /// Signalled when an entry's writeback ends.
    done: Condvar,
}

type ShardGuard<'a> = MutexGuard<'a, Index>;

/// A compressed page store. See the crate documentation.
#[derive(Debug)]
pub struct Zswap {
    config: Config,
    pool: Pool,
    shards: Box<[Shard]>,
    /// Lock order: a shard lock (or two, in index order), then this, then a pool class lock.
    lru: Mutex<Lru>,
    /// Heap bytes of the live multi-page objects' headers (`Arc<Shared>` and chunk lists).
    shared_meta: AtomicU64,
    pool_reached_full: AtomicBool,
    counters: Counters,
    /// Reused compression contexts, per CPU slot.
    contexts: Box<[PlainMutex<Vec<Worker>>]>,
    /// `batch_threads - 1` persistent threads for large folios.
    batch: BatchPool,
}

/// One worker's reusable state: a compression context and its buffers, so that a store or a
/// load allocates nothing.
#[derive(Debug)]
struct Worker {
    codec: PageCodec,
    /// Compressor output.
    out: Vec<u8>,
    /// A compressed object copied out of the pool.
    obj: Vec<u8>,
    /// The non-same-filled pages of a multi-page unit, gathered for compression.
    gather: Vec<u8>,
    /// The decompressed pages of `cached` (valid only while `cached` is set).
    unit: Vec<u8>,
    /// The multi-page object last decompressed into `unit` (kept across loads and scans).
    cached: Option<Arc<Shared>>,
}

impl Worker {
    fn new(compressor: Compressor) -> Result<Worker, CodecError> {
        Ok(Worker {
            codec: PageCodec::new(compressor)?,
            out: vec![0u8; SCRATCH_SIZE],
            obj: Vec::with_capacity(PAGE_SIZE),
            gather: Vec::new(),
            unit: Vec::new(),
            cached: None,
        })
    }
}

/// A page prepared for insertion.
#[derive(Debug, Clone)]
struct Prepared {
    payload: Payload,
    crc: u32,
}

pub(crate) fn same_filled_word(page: &[u8]) -> Option<u64> {
    let mut words = page.chunks_exact(8).map(|c| {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        u64::from_ne_bytes(w)
    });
    let first = words.next()?;
    words.all(|w| w == first).then_some(first)
}

fn fill_word(out: &mut [u8], word: u64) {
    let bytes = word.to_ne_bytes();
    for c in out.chunks_exact_mut(8) {
        c.copy_from_slice(&bytes);
    }
}

impl Zswap {
    /// Builds a store. Fails if the compressor cannot be used (deflate-iaa without libqpl) or a
    /// setting is out of range.
    pub fn new(config: Config) -> Result<Zswap, ConfigError> {
        let invalid = |field, value: u64, allowed| {
            Err(ConfigError::Invalid {
                field,
                value,
                allowed,
            })
        };
        if config.accept_threshold_percent > 100 {
            return invalid(
                "accept_threshold_percent",
                config.accept_threshold_percent.into(),
                "0..=100",
            );
        }
        if !(1..=16).contains(&config.max_span_pages) {
            return invalid("max_span_pages", config.max_span_pages as u64, "1..=16");
        }
        if config.batch_threads == 0 || config.batch_threads > 64 {
            return invalid("batch_threads", config.batch_threads as u64, "1..=64");
        }
        if !config.index_shards.is_power_of_two() || config.index_shards > 1 << 16 {
            return invalid(
                "index_shards",
                config.index_shards as u64,
                "a power of two up to 65536",
            );
        }
        if !config.multi_page_unit_pages.is_power_of_two()
            || !(2..=MAX_FOLIO_PAGES).contains(&config.multi_page_unit_pages)
        {
            return invalid(
                "multi_page_unit_pages",
                config.multi_page_unit_pages as u64,
                "a power of two 2..=512",
            );
        }
        // Build one context now so a missing compressor fails here, not on the first store.
        let first = Worker::new(config.compressor)?;
        let slots = nr_cpus().max(1);
        let contexts: Box<[PlainMutex<Vec<Worker>>]> =
            (0..slots).map(|_| PlainMutex::new(Vec::new())).collect();
        contexts[0].lock().push(first);
        let shards = (0..config.index_shards)
            .map(|_| Shard {
                map: Mutex::new(Index::new(config.index_shards)),
                done: Condvar::new(),
            })
            .collect();
        let rules = PageRules {
            crc: config.crc,
            same_filled: config.same_filled,
        };
        // No threads under loom: its models run the store on loom threads only.
        let extra = if cfg!(zswap_loom) {
            0
        } else {
            config.batch_threads - 1
        };
        let batch = BatchPool::start(extra, config.compressor, rules);
        Ok(Zswap {
            batch,
            pool: Pool::new(config.max_span_pages),
            config,
            shards,
            lru: Mutex::new(Lru::new()),
            shared_meta: AtomicU64::new(0),
            pool_reached_full: AtomicBool::new(false),
            counters: Counters::default(),
            contexts,
        })
    }

    /// The configuration the store was built with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    fn shard_of(&self, key: u64) -> usize {
        ((key / ENTRIES_PER_SHARD) as usize) & (self.shards.len() - 1)
    }

    /// Locks the shards covering `start..start + nr` (at most two: nr <= 512 < 16384) in index
    /// order.
    fn lock_range(&self, start: u64, nr: usize) -> Vec<(usize, ShardGuard<'_>)> {
        let a = self.shard_of(start);
        let b = self.shard_of(start + nr as u64 - 1);
        let mut idx = [a.min(b), a.max(b)];
        let n = if idx[0] == idx[1] { 1 } else { 2 };
        idx[..n].sort_unstable();
        idx[..n]
            .iter()
            .map(|&i| (i, self.shards[i].map.lock()))
            .collect()
    }

    fn guard_for<'g, 'a>(
        &self,
        guards: &'g mut [(usize, ShardGuard<'a>)],
        key: u64,
    ) -> &'g mut Index {
        let s = self.shard_of(key);
        let pos = guards.iter().position(|(i, _)| *i == s).unwrap_or(0);
        &mut guards[pos].1
    }

    /// Drops `guards`, waits until the writeback of the entry at `key` is over (an entry under
    /// writeback is removed or replaced only by its writeback, so no id is needed to tell it
    /// from a later one).
    fn wait_writeback(&self, guards: Vec<(usize, ShardGuard<'_>)>, key: u64) {
        drop(guards);
        let shard = &self.shards[self.shard_of(key)];
        let mut map = shard.map.lock();
        while map.get(key).is_some_and(EntryRef::writeback) {
            map = shard.done.wait(map);
        }
    }

    /// First entry in `start..start+nr` under writeback.
    fn find_writeback(
        &self,
        guards: &mut [(usize, ShardGuard<'_>)],
        start: u64,
        nr: usize,
    ) -> Option<u64> {
        (start..start + nr as u64).find(|&k| {
            let map = self.guard_for(guards, k);
            map.get(k).is_some_and(EntryRef::writeback)
        })
    }

    fn take_worker(&self) -> Result<(usize, Worker), CodecError> {
        let slot = current_cpu() % self.contexts.len();
        if let Some(c) = self.contexts[slot].lock().pop() {
            return Ok((slot, c));
        }
        for (i, other) in self.contexts.iter().enumerate() {
            if let Some(c) = other.lock().pop() {
                return Ok((i, c));
            }
        }
        Ok((slot, Worker::new(self.config.compressor)?))
    }

    fn put_worker(&self, slot: usize, codec: Worker) {
        // The worker keeps its last decompressed multi-page object (`cached`), so that loading
        // the pages of a unit one at a time decompresses it once. Holding the `Arc` keeps the
        // address from naming another object; the object's contents never change, and its pool
        // chunks are freed by its reference count whatever the cache holds.
        let mut v = self.contexts[slot].lock();
        // Keep a few per slot: enough for the batch threads, bounded memory.
        if v.len() < self.config.batch_threads + 1 {
            v.push(codec);
        }
    }

    /// The kernel's `zswap_check_limits`: true when a store must be refused.
    fn over_limit(&self) -> bool {
        let cur = self.pool.total_bytes();
        let max = self.config.max_pool_bytes;
        if cur >= max {
            bump(&self.counters.pool_limit_hit, 1);
            self.pool_reached_full.store(true, Ordering::Relaxed);
        } else if self.pool_reached_full.load(Ordering::Relaxed) {
            let accept = max / 100 * u64::from(self.config.accept_threshold_percent)
                + max % 100 * u64::from(self.config.accept_threshold_percent) / 100;
            if cur <= accept {
                self.pool_reached_full.store(false, Ordering::Relaxed);
            }
        }
        self.pool_reached_full.load(Ordering::Relaxed)
    }

    /// Compresses and allocates one page. Err(Some(len)) = compresses poorly.
    fn prepare_page(
        &self,
        codec: &mut PageCodec,
        scratch: &mut [u8],
        page: &[u8],
    ) -> Result<Prepared, PrepareError> {
        let crc = if self.config.crc {
            crc32c::crc32c(page)
        } else {
            0
        };
        if self.config.same_filled {
            if let Some(w) = same_filled_word(page) {
                return Ok(Prepared {
                    payload: Payload::Same(w),
                    crc,
                });
            }
        }
        let n = codec.compress(page, scratch).map_err(PrepareError::Codec)?;
        if n > MAX_OBJECT {
            return Err(PrepareError::Poor(n));
        }
        let h = self.pool.alloc(&scratch[..n]).map_err(PrepareError::Pool)?;
        Ok(Prepared {
            payload: Payload::Compressed(h),
            crc,
        })
    }

    fn prepare_range(
        &self,
        pages: &[u8],
        first_page: usize,
        out: &mut Vec<Prepared>,
    ) -> Result<(), (usize, PrepareError)> {
        let (slot, mut w) = self
            .take_worker()
            .map_err(|e| (first_page, PrepareError::Codec(e)))?;
        let mut result = Ok(());
        for (i, page) in pages.chunks_exact(PAGE_SIZE).enumerate() {
            match self.prepare_page(&mut w.codec, &mut w.out, page) {
                Ok(p) => out.push(p),
                Err(e) => {
                    result = Err((first_page + i, e));
                    break;
                }
            }
        }
        self.put_worker(slot, w);
        result
    }

    fn release_prepared(&self, prepared: &[Prepared]) {
        for p in prepared {
            self.release_payload(&p.payload);
        }
    }

    /// Frees the pool memory `payload` holds: its object, or its reference to a shared object
    /// (the object's chunks go with the last reference).
    fn release_payload(&self, payload: &Payload) {
        match payload {
            Payload::Compressed(h) => {
                let _ = self.pool.free(*h);
            }
            Payload::Shared { obj, .. } => {
                if obj.refs.fetch_sub(1, Ordering::AcqRel) == 1 {
                    self.shared_meta
                        .fetch_sub(shared_heap_bytes(obj.chunks.len()), Ordering::Relaxed);
                    for h in obj.handles() {
                        let _ = self.pool.free(h);
                    }
                }
            }
            Payload::Same(_) => {}
        }
    }

    /// Compresses the folio in multi-page units of up to `multi_page_unit_pages` pages on the
    /// calling thread, appending one `Prepared` per page.
    fn prepare_units(
        &self,
        entry: u64,
        folio: &[u8],
        prepared: &mut Vec<Prepared>,
    ) -> Result<(), (usize, PrepareError)> {
        let nr = folio.len() / PAGE_SIZE;
        let unit_pages = self.config.multi_page_unit_pages.min(nr);
        let (slot, mut w) = self
            .take_worker()
            .map_err(|e| (0, PrepareError::Codec(e)))?;
        let mut result = Ok(());
        for (u, unit) in folio.chunks(unit_pages * PAGE_SIZE).enumerate() {
            result = self.prepare_unit(&mut w, entry, unit, u * unit_pages, prepared);
            if result.is_err() {
                break;
            }
        }
        self.put_worker(slot, w);
        result
    }

    /// One multi-page unit starting at page `first` of the folio. Same-filled pages are kept
    /// as their word; the others are compressed together as one object. If that object does not
    /// save at least a page's worth over its input, the pages are compressed one by one instead
    /// (so that a refusal names the page that does not compress, as the per-page path does).
    fn prepare_unit(
        &self,
        w: &mut Worker,
        entry: u64,
        unit: &[u8],
        first: usize,
        prepared: &mut Vec<Prepared>,
    ) -> Result<(), (usize, PrepareError)> {
        let base = prepared.len();
        let mut dense: Vec<usize> = Vec::with_capacity(unit.len() / PAGE_SIZE);
        // The CRC of the pages compressed together (their entries keep none), or of each page
        // once it is known to be stored alone.
        let mut unit_crc = 0;
        for (i, page) in unit.chunks_exact(PAGE_SIZE).enumerate() {
            let word = if self.config.same_filled {
                same_filled_word(page)
            } else {
                None
            };
            let mut crc = 0;
            if self.config.crc {
                match word {
                    Some(_) => crc = crc32c::crc32c(page),
                    None => unit_crc = crc32c::crc32c_append(unit_crc, page),
                }
            }
            if word.is_none() {
                dense.push(i);
            }
            // A placeholder for a page still to compress holds no pool memory.
            prepared.push(Prepared {
                payload: Payload::Same(word.unwrap_or(0)),
                crc,
            });
        }
        let page_of = |i: usize| &unit[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
        let Worker {
            codec, out, gather, ..
        } = w;
        let k = dense.len();
        let mut per_page = k == 1;
        if k >= 2 {
            let src: &[u8] = if k * PAGE_SIZE == unit.len() {
                unit
            } else {
                gather.clear();
                for &i in &dense {
                    gather.extend_from_slice(page_of(i));
                }
                gather
            };
            let need = src.len() * 2 + 1024;
            if out.len() < need {
                out.resize(need, 0);
            }
            let n = codec
                .compress(src, out)
                .map_err(|e| (first + dense[0], PrepareError::Codec(e)))?;
            if n > src.len() - PAGE_SIZE {
                per_page = true;
            } else {
                let mut chunks = Vec::with_capacity(n.div_ceil(MAX_OBJECT));
                for c in out[..n].chunks(MAX_OBJECT) {
                    match self.pool.alloc(c) {
                        Ok(h) => chunks.push(h),
                        Err(e) => {
                            for h in chunks {
                                let _ = self.pool.free(h);
                            }
                            return Err((first + dense[0], PrepareError::Pool(e)));
                        }
                    }
                }
                self.shared_meta
                    .fetch_add(shared_heap_bytes(chunks.len()), Ordering::Relaxed);
                let obj = Arc::new(Shared {
                    chunks: chunks.iter().map(|h| AtomicU64::new(h.raw())).collect(),
                    pages: k as u16,
                    first: (entry + first as u64) as u16,
                    whole_unit: k * PAGE_SIZE == unit.len(),
                    crc: unit_crc,
                    refs: AtomicU32::new(k as u32),
                });
                for (slot, &i) in dense.iter().enumerate() {
                    prepared[base + i].payload = Payload::Shared {
                        obj: Arc::clone(&obj),
                        slot: slot as u16,
                    };
                }
            }
        }
        if per_page {
            for &i in &dense {
                if self.config.crc {
                    prepared[base + i].crc = crc32c::crc32c(page_of(i));
                }
                let n = codec
                    .compress(page_of(i), out)
                    .map_err(|e| (first + i, PrepareError::Codec(e)))?;
                if n > MAX_OBJECT {
                    return Err((first + i, PrepareError::Poor(n)));
                }
                let h = self
                    .pool
                    .alloc(&out[..n])
                    .map_err(|e| (first + i, PrepareError::Pool(e)))?;
                prepared[base + i].payload = Payload::Compressed(h);
            }
        }
        Ok(())
    }

    /// Stores a folio of `folio.len() / 4096` pages (1..=512, a power of two) under the swap
    /// entries `entry..entry + n`, all or nothing. An entry already present is replaced.
    pub fn store(&self, entry: u64, folio: &[u8]) -> Result<(), StoreError> {
        let len = folio.len();
        let invalid = |reason| Err(StoreError::InvalidFolio { entry, len, reason });
        if len == 0 || len % PAGE_SIZE != 0 {
            return invalid("the length must be a whole number of 4 KiB pages");
        }
        let nr = len / PAGE_SIZE;
        if nr > MAX_FOLIO_PAGES || !nr.is_power_of_two() {
            return invalid("a folio has 1 to 512 pages, a power of two");
        }
        if entry.checked_add(nr as u64).is_none() {
            return invalid("the entries overflow u64");
        }
        if self.over_limit() {
            bump(&self.counters.reject_pool_limit, 1);
            return Err(StoreError::PoolLimit {
                pool_bytes: self.pool.total_bytes(),
                max_pool_bytes: self.config.max_pool_bytes,
            });
        }
        let prepared = self.prepare_folio(entry, folio)?;
        if let Err(prepared) = self.insert(entry, prepared) {
            self.release_prepared(&prepared);
            return Err(StoreError::IndexFull { entry });
        }
        let order = nr.trailing_zeros() as usize;
        bump(&self.counters.zswpout, nr as u64);
        bump(&self.counters.zswpout_by_order[order], 1);
        Ok(())
    }

    fn prepare_folio(&self, entry: u64, folio: &[u8]) -> Result<Vec<Prepared>, StoreError> {
        let nr = folio.len() / PAGE_SIZE;
        let threads = self.config.batch_threads.min(nr);
        let mut prepared = Vec::with_capacity(nr);
        let min = self.config.multi_page_min_pages;
        let result = if min > 0 && nr >= min.max(2) {
            self.prepare_units(entry, folio, &mut prepared)
        } else if threads > 1 && nr >= self.config.batch_min_pages && self.batch.len() > 0 {
            self.prepare_batched(folio, threads, &mut prepared)
        } else {
            self.prepare_range(folio, 0, &mut prepared)
        };
        match result {
            Ok(()) => Ok(prepared),
            Err((page, e)) => {
                self.release_prepared(&prepared);
                Err(match e {
                    PrepareError::Poor(compressed_len) => {
                        bump(&self.counters.reject_compress_poor, 1);
                        StoreError::CompressPoor {
                            page,
                            compressed_len,
                        }
                    }
                    PrepareError::Codec(c) => {
                        bump(&self.counters.reject_compress_fail, 1);
                        StoreError::Compress(c)
                    }
                    PrepareError::Pool(p) => StoreError::Pool(p),
                })
            }
        }
    }

    /// Splits the folio into `threads` parts: the first is done here, the others by the batch
    /// threads; then allocates their objects in page order.
    fn prepare_batched(
        &self,
        folio: &[u8],
        threads: usize,
        prepared: &mut Vec<Prepared>,
    ) -> Result<(), (usize, PrepareError)> {
        let nr = folio.len() / PAGE_SIZE;
        let per = nr.div_ceil(threads);
        let chunks: Vec<&[u8]> = folio.chunks(per * PAGE_SIZE).collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut local = Vec::new();
        let mut sent = 0;
        for (i, chunk) in chunks.iter().enumerate().skip(1) {
            let job = Job {
                first_page: i * per,
                pages: chunk.to_vec(),
                reply: tx.clone(),
            };
            match self.batch.submit(i - 1, job) {
                Ok(()) => sent += 1,
                Err(job) => local.push(job),
            }
        }
        drop(tx);
        let mut first = Vec::with_capacity(per);
        let r0 = self.prepare_range(chunks[0], 0, &mut first);
        let mut replies: Vec<Reply> = rx.iter().take(sent).collect();
        // Parts whose thread was gone, or died: do them here.
        if replies.len() < sent || !local.is_empty() {
            let done: Vec<usize> = replies.iter().map(|r| r.first_page).collect();
            for (i, chunk) in chunks.iter().enumerate().skip(1) {
                if !done.contains(&(i * per)) && !local.iter().any(|j| j.first_page == i * per) {
                    local.push(Job {
                        first_page: i * per,
                        pages: chunk.to_vec(),
                        reply: std::sync::mpsc::channel().0,
                    });
                }
            }
            if !local.is_empty() {
                match self.take_worker() {
                    Ok((slot, mut w)) => {
                        for job in &local {
                            replies.push(compress_part(
                                &mut w.codec,
                                &mut w.out,
                                self.rules(),
                                job,
                            ));
                        }
                        self.put_worker(slot, w);
                    }
                    Err(e) => {
                        prepared.extend(first);
                        return Err((local[0].first_page, PrepareError::Codec(e)));
                    }
                }
            }
        }
        replies.sort_by_key(|r| r.first_page);
        prepared.extend(first);
        let mut err = r0.err();
        for reply in replies {
            for part in &reply.parts {
                let p = match *part {
                    Part::Same { word, crc } => Prepared {
                        payload: Payload::Same(word),
                        crc,
                    },
                    Part::Compressed { off, len, crc } => {
                        match self.pool.alloc(&reply.bytes[off..off + len]) {
                            Ok(h) => Prepared {
                                payload: Payload::Compressed(h),
                                crc,
                            },
                            Err(e) => {
                                err = err.or(Some((reply.first_page, PrepareError::Pool(e))));
                                break;
                            }
                        }
                    }
                };
                prepared.push(p);
            }
            if let (None, Some((page, e))) = (&err, reply.error) {
                err = Some((
                    page,
                    match e {
                        PartError::Poor(n) => PrepareError::Poor(n),
                        PartError::Codec(c) => PrepareError::Codec(c),
                    },
                ));
            }
        }
        err.map_or(Ok(()), Err)
    }

    fn rules(&self) -> PageRules {
        PageRules {
            crc: self.config.crc,
            same_filled: self.config.same_filled,
        }
    }

    /// Inserts the prepared pages at `entry..`, all or nothing: their index chunks are made
    /// first, and if the index has no chunk id left (`MAX_CHUNKS` chunks of 64 entries, far
    /// beyond any memory to hold them) nothing is inserted and the pages are handed back.
    fn insert(&self, entry: u64, prepared: Vec<Prepared>) -> Result<(), Vec<Prepared>> {
        let nr = prepared.len();
        let end = entry + nr as u64;
        let mut guards = loop {
            let mut guards = self.lock_range(entry, nr);
            match self.find_writeback(&mut guards, entry, nr) {
                Some(k) => self.wait_writeback(guards, k),
                None => break guards,
            }
        };
        let mut lru = self.lru.lock();
        let chunk_starts = || {
            std::iter::successors(Some(entry), |&k| {
                Some((k | (CHUNK_ENTRIES as u64 - 1)) + 1).filter(|&n| n < end)
            })
        };
        for k in chunk_starts() {
            if !self.guard_for(&mut guards, k).ensure_chunk(k, &mut lru) {
                for k in chunk_starts() {
                    self.guard_for(&mut guards, k).free_if_empty(k, &mut lru);
                }
                return Err(prepared);
            }
        }
        let mut same = 0u64;
        for (i, p) in prepared.into_iter().enumerate() {
            let key = entry + i as u64;
            if let Payload::Same(_) = p.payload {
                same += 1;
            }
            let map = self.guard_for(&mut guards, key);
            if let Some(old) = map.insert(key, Entry::new(p.payload, p.crc), &mut lru) {
                self.release_entry(old);
            }
        }
        bump(&self.counters.stored_pages, nr as u64);
        bump(&self.counters.same_filled_pages, same);
        Ok(())
    }

    /// Frees what `e` holds and drops it from the counters (the entry is already out of the
    /// index and off the LRU).
    fn release_entry(&self, e: Entry) {
        if e.is_same() {
            drop_count(&self.counters.same_filled_pages, 1);
        }
        self.release_payload(&e.into_payload());
        drop_count(&self.counters.stored_pages, 1);
    }

    /// Decompresses entry `e` of swap entry `key` into `out` (one page) and checks its CRC.
    /// A page of a multi-page object decompresses the whole object into `w.unit`, which is
    /// kept (as `w.cached`) for the object's other pages within the same load or scan.
    fn decode(
        &self,
        w: &mut Worker,
        key: u64,
        e: EntryRef<'_>,
        out: &mut [u8],
    ) -> Result<(), LoadError> {
        let Worker {
            codec,
            obj: scratch,
            unit,
            cached,
            ..
        } = w;
        match e.payload() {
            PayloadRef::Same(word) => fill_word(out, word),
            PayloadRef::Compressed(h) => {
                self.pool
                    .read(h, scratch)
                    .map_err(|source| LoadError::Pool { entry: key, source })?;
                if let Err(source) = codec.decompress(scratch, out) {
                    bump(&self.counters.decompress_fail, 1);
                    return Err(LoadError::Corrupt { entry: key, source });
                }
            }
            PayloadRef::Shared(obj, slot) => {
                if !cached.as_ref().is_some_and(|c| Arc::ptr_eq(c, &obj)) {
                    *cached = None;
                    scratch.clear();
                    for h in obj.handles() {
                        self.pool
                            .read_append(h, scratch)
                            .map_err(|source| LoadError::Pool { entry: key, source })?;
                    }
                    unit.resize(usize::from(obj.pages) * PAGE_SIZE, 0);
                    if let Err(source) = codec.decompress(scratch, unit) {
                        bump(&self.counters.decompress_fail, 1);
                        return Err(LoadError::Corrupt { entry: key, source });
                    }
                    if self.config.crc {
                        let computed = crc32c::crc32c(unit);
                        if computed != obj.crc {
                            bump(&self.counters.decompress_fail, 1);
                            return Err(LoadError::CrcMismatch {
                                entry: key,
                                stored: obj.crc,
                                computed,
                            });
                        }
                    }
                    // Checked: the pages copied out of the cache need no CRC of their own.
                    *cached = Some(Arc::clone(&obj));
                }
                let start = usize::from(slot) * PAGE_SIZE;
                match unit.get(start..start + PAGE_SIZE) {
                    Some(page) => {
                        out.copy_from_slice(page);
                        return Ok(());
                    }
                    None => {
                        bump(&self.counters.decompress_fail, 1);
                        return Err(LoadError::Corrupt {
                            entry: key,
                            source: CodecError::WrongLength {
                                name: self.config.compressor.name(),
                                got: unit.len(),
                                expected: start + PAGE_SIZE,
                            },
                        });
                    }
                }
            }
        }
        if self.config.crc {
            let computed = crc32c::crc32c(out);
            if computed != e.crc() {
                bump(&self.counters.decompress_fail, 1);
                return Err(LoadError::CrcMismatch {
                    entry: key,
                    stored: e.crc(),
                    computed,
                });
            }
        }
        Ok(())
    }

    /// Loads and frees the pages at `entry..entry + out.len() / 4096` (an exclusive load, the
    /// kernel's behaviour with a swap cache it does not keep). All or nothing: on any error the
    /// entries stay as they were and `out` holds unspecified bytes.
    pub fn load(&self, entry: u64, out: &mut [u8]) -> Result<(), LoadError> {
        self.load_with(entry, out, true)
    }

    /// Reads the pages at `entry..entry + out.len() / 4096` and leaves them stored (a
    /// non-exclusive load: the swap entry is still referenced elsewhere, for example by a page
    /// shared with a forked child, or the caller frees it with [`Zswap::invalidate`] only once
    /// it has put the page where it belongs). Counted in `zswpin`. All or nothing like
    /// [`Zswap::load`].
    pub fn load_shared(&self, entry: u64, out: &mut [u8]) -> Result<(), LoadError> {
        self.load_with(entry, out, false)
    }

    fn load_with(&self, entry: u64, out: &mut [u8], exclusive: bool) -> Result<(), LoadError> {
        let len = out.len();
        if len == 0 || len % PAGE_SIZE != 0 || len / PAGE_SIZE > MAX_FOLIO_PAGES {
            return Err(LoadError::InvalidLength { entry, len });
        }
        let nr = len / PAGE_SIZE;
        if entry.checked_add(nr as u64).is_none() {
            return Err(LoadError::InvalidLength { entry, len });
        }
        let (slot, mut w) = self.take_worker()?;
        let result = self.load_locked(entry, out, &mut w, exclusive);
        self.put_worker(slot, w);
        result
    }

    /// Decodes the pages under their shard locks (after any writeback of them has ended);
    /// with `exclusive`, frees them before the locks are dropped.
    fn load_locked(
        &self,
        entry: u64,
        out: &mut [u8],
        w: &mut Worker,
        exclusive: bool,
    ) -> Result<(), LoadError> {
        let nr = out.len() / PAGE_SIZE;
        let mut guards = loop {
            let mut guards = self.lock_range(entry, nr);
            match self.find_writeback(&mut guards, entry, nr) {
                Some(k) => self.wait_writeback(guards, k),
                None => break guards,
            }
        };
        for (i, page) in out.chunks_exact_mut(PAGE_SIZE).enumerate() {
            let key = entry + i as u64;
            let map = self.guard_for(&mut guards, key);
            let e = map.get(key).ok_or(LoadError::NotFound { entry: key })?;
            self.decode(w, key, e, page)?;
        }
        if exclusive {
            let mut lru = self.lru.lock();
            for i in 0..nr as u64 {
                let map = self.guard_for(&mut guards, entry + i);
                if let Some(e) = map.remove(entry + i, &mut lru) {
                    self.release_entry(e);
                }
            }
        }
        bump(&self.counters.zswpin, nr as u64);
        Ok(())
    }

    /// Drops the pages at `entry..entry + nr` (the swap entries were freed); returns how many
    /// were stored. Waits for a writeback in progress on any of them.
    pub fn invalidate(&self, entry: u64, nr: usize) -> usize {
        let mut removed = 0;
        let mut start = entry;
        let end = entry.saturating_add(nr as u64);
        while start < end {
            // At most one shard-sized stretch at a time.
            let step = (end - start).min(MAX_FOLIO_PAGES as u64) as usize;
            let mut guards = loop {
                let mut guards = self.lock_range(start, step);
                match self.find_writeback(&mut guards, start, step) {
                    Some(k) => self.wait_writeback(guards, k),
                    None => break guards,
                }
            };
            let mut lru = self.lru.lock();
            for key in start..start + step as u64 {
                let map = self.guard_for(&mut guards, key);
                if let Some(e) = map.remove(key, &mut lru) {
                    self.release_entry(e);
                    removed += 1;
                }
            }
            start += step as u64;
        }
        removed
    }

    /// Whether a page is stored at `entry`.
    pub fn contains(&self, entry: u64) -> bool {
        self.shards[self.shard_of(entry)].map.lock().contains(entry)
    }

    /// Shrinker `count_objects`: entries that writeback could free now (on the LRU).
    pub fn count_objects(&self) -> usize {
        self.lru.lock().len()
    }

    /// Shrinker `scan_objects`: writes back up to `nr_to_scan` of the coldest entries through
    /// `writer`, decompressed, in batches of up to [`WRITEBACK_BATCH`] (one
    /// [`Writeback::write_pages`] call each), and frees those written. An entry whose write fails
    /// stays stored and goes back to the head of the LRU when the scan ends.
    pub fn scan_objects(&self, nr_to_scan: usize, writer: &mut dyn Writeback) -> ScanResult {
        let mut result = ScanResult::default();
        let cap = nr_to_scan.clamp(1, WRITEBACK_BATCH);
        let mut pages = vec![0u8; cap * PAGE_SIZE];
        let mut worker = None;
        // Entries whose write failed: back on the LRU only after the scan, so one scan never
        // retries them.
        let mut failed = Vec::new();
        let mut batch: Vec<u64> = Vec::with_capacity(cap);
        let mut left = nr_to_scan;
        let mut stop = false;
        while left > 0 && !stop {
            batch.clear();
            while batch.len() < cap && left > 0 {
                left -= 1;
                // Peek at the coldest entry, then verify under its shard lock and the LRU lock
                // (lock order) that it is still stored there, on the LRU, and still the
                // coldest. (Entries already in the batch are off the LRU.)
                let Some((key, pos)) = self.lru.lock().tail() else {
                    stop = true;
                    break;
                };
                result.scanned += 1;
                let shard = &self.shards[self.shard_of(key)];
                let mut map = shard.map.lock();
                let stored_there = map.pos(key) == Some(pos)
                    && map.get(key).is_some_and(|e| e.on_lru() && !e.writeback());
                if !stored_there {
                    // Loaded, invalidated or taken by another scan since the peek.
                    continue;
                }
                {
                    let mut lru = self.lru.lock();
                    if lru.tail().map(|(_, p)| p) != Some(pos) {
                        // Not the coldest any more (taken and stored again meanwhile).
                        continue;
                    }
                    map.lru_unlink(key, &mut lru);
                }
                let Some(mut e) = map.get_mut(key) else {
                    continue;
                };
                e.set_writeback(true);
                if worker.is_none() {
                    match self.take_worker() {
                        Ok(w) => worker = Some(w),
                        Err(_) => {
                            self.end_writeback(map, &shard.done, key, false);
                            failed.push(key);
                            result.failed += 1;
                            stop = true;
                            break;
                        }
                    }
                }
                let Some((_, w)) = worker.as_mut() else {
                    stop = true;
                    break;
                };
                let at = batch.len() * PAGE_SIZE;
                let decoded = match map.get(key) {
                    Some(e) => self.decode(w, key, e, &mut pages[at..at + PAGE_SIZE]),
                    None => Err(LoadError::NotFound { entry: key }),
                };
                if decoded.is_err() {
                    self.end_writeback(map, &shard.done, key, false);
                    failed.push(key);
                    result.failed += 1;
                    continue;
                }
                drop(map);
                batch.push(key);
            }
            if batch.is_empty() {
                continue;
            }
            // If the writer panics, the guards end the writebacks as failed so that nobody waits
            // forever on an entry; the panic then goes on to the caller.
            let guards: Vec<UnwindGuard<'_>> = batch
                .iter()
                .map(|&key| UnwindGuard { zswap: self, key })
                .collect();
            let writes: Vec<(u64, &[u8])> = batch
                .iter()
                .enumerate()
                .map(|(i, &key)| (key, &pages[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]))
                .collect();
            let outcomes = writer.write_pages(&writes);
            for g in guards {
                std::mem::forget(g);
            }
            for (i, &key) in batch.iter().enumerate() {
                let ok = outcomes.get(i).is_some_and(|r| r.is_ok());
                let shard = &self.shards[self.shard_of(key)];
                self.end_writeback(shard.map.lock(), &shard.done, key, ok);
                if ok {
                    result.written_back += 1;
                } else {
                    failed.push(key);
                    result.failed += 1;
                }
            }
        }
        for key in failed {
            // Back at the head unless loaded, replaced (a new entry is already on the LRU) or
            // under another writeback meanwhile.
            let mut map = self.shards[self.shard_of(key)].map.lock();
            if map.get(key).is_some_and(|e| !e.writeback()) {
                map.lru_relink(key, &mut self.lru.lock());
            }
        }
        if let Some((slot, w)) = worker {
            self.put_worker(slot, w);
        }
        result
    }

    fn end_writeback(&self, mut map: ShardGuard<'_>, done: &Condvar, key: u64, written: bool) {
        if written {
            let mut lru = self.lru.lock();
            if let Some(e) = map.remove(key, &mut lru) {
                debug_assert!(e.writeback(), "an entry under writeback is never replaced");
                drop(lru);
                self.release_entry(e);
                bump(&self.counters.written_back_pages, 1);
            }
        } else {
            bump(&self.counters.reject_reclaim_fail, 1);
            if let Some(mut e) = map.get_mut(key) {
                e.set_writeback(false);
            }
        }
        drop(map);
        done.notify_all();
    }

    /// Compacts the pool (zsmalloc's `zs_compact`, and with
    /// [`Config::compact_across_classes`] moves up into larger classes); returns the bytes
    /// released.
    ///
    /// A pool handle is the object's location, so each move must rewrite the entry (or the
    /// multi-page object) that holds it. First, one shard lock at a time, the owners of the
    /// objects in partly filled spans (the only ones compaction moves) are gathered into a map.
    /// Then the pool is compacted one size class at a time, in steps of at most
    /// `COMPACT_STEP_MOVES` (1024) moves, each under every shard lock (in index order, then the
    /// class locks: the lock order of every other path, shard then class, so no deadlock) so
    /// that no entry changes while its object moves; between steps the locks are dropped, so
    /// loads and stores wait for one step at most. The map may go stale between steps: before an object moves, its entry
    /// is checked to still hold it (an object has one owner at a time, so that entry is its
    /// owner); objects without a checked owner (new ones, or those of a store not yet in the
    /// index) stay, and so do their spans.
    pub fn compact(&self) -> u64 {
        let across = self.config.compact_across_classes;
        let partial = self.pool.partial_spans();
        let mut owners: HashMap<u64, Owner> = HashMap::new();
        for shard in self.shards.iter() {
            let map = shard.map.lock();
            for (key, e) in map.iter() {
                match e.payload() {
                    PayloadRef::Compressed(h) if partial.contains(h) => {
                        owners.insert(
                            h.slot().raw(),
                            Owner {
                                key,
                                chunk: NOT_SHARED,
                            },
                        );
                    }
                    PayloadRef::Shared(obj, _) => {
                        for (i, h) in obj.handles().enumerate() {
                            if partial.contains(h) {
                                owners.insert(
                                    h.slot().raw(),
                                    Owner {
                                        key,
                                        chunk: i as u32,
                                    },
                                );
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut released = 0;
        for ci in 0..self.pool.nr_classes() {
            if !partial.any_in(ci) {
                continue;
            }
            loop {
                let mut guards: Vec<ShardGuard<'_>> =
                    self.shards.iter().map(|s| s.map.lock()).collect();
                let mut relocator = Relocator {
                    zswap: self,
                    guards: &mut guards,
                    owners: &mut owners,
                };
                let step = self
                    .pool
                    .compact_class(ci, across, &mut relocator, COMPACT_STEP_MOVES);
                released += step.released;
                if step.done {
                    break;
                }
            }
        }
        released
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut by_order = [0u64; MAX_ORDER + 1];
        for (o, a) in by_order.iter_mut().zip(c.zswpout_by_order.iter()) {
            *o = get(a);
        }
        let (compressed_bytes, pool_metadata) = self.pool.usage();
        Stats {
            stored_pages: get(&c.stored_pages),
            pool_total_size: self.pool.total_bytes(),
            compressed_bytes,
            same_filled_pages: get(&c.same_filled_pages),
            reject_compress_poor: get(&c.reject_compress_poor),
            reject_compress_fail: get(&c.reject_compress_fail),
            reject_pool_limit: get(&c.reject_pool_limit),
            pool_limit_hit: get(&c.pool_limit_hit),
            reject_reclaim_fail: get(&c.reject_reclaim_fail),
            written_back_pages: get(&c.written_back_pages),
            decompress_fail: get(&c.decompress_fail),
            zswpout: get(&c.zswpout),
            zswpout_by_order: by_order,
            zswpin: get(&c.zswpin),
            pages_compacted: self.pool.compacted_pages(),
            metadata_bytes: self.index_metadata_bytes() + pool_metadata,
        }
    }

    /// [`Stats::metadata_bytes`] but for the pool's part: index chunks and top levels, LRU
    /// links, multi-page object headers.
    fn index_metadata_bytes(&self) -> u64 {
        let mut bytes = std::mem::size_of_val::<[Shard]>(&self.shards);
        for shard in self.shards.iter() {
            bytes += shard.map.lock().heap_bytes();
        }
        bytes += self.lru.lock().heap_bytes();
        bytes += self.shared_meta.load(Ordering::Relaxed) as usize;
        bytes as u64
    }

    /// Full consistency check of index, LRU and pool (for tests; takes every lock in turn).
    #[doc(hidden)]
    pub fn check_integrity(&self) -> Result<(), String> {
        let mut stored = 0u64;
        let mut on_lru = 0usize;
        let mut same = 0u64;
        let mut single = 0u64;
        // Multi-page objects by address: (object, entries pointing at it, slots seen).
        let mut shared: HashMap<*const Shared, (Arc<Shared>, u32, Vec<bool>)> = HashMap::new();
        let mut linked = std::collections::HashSet::new();
        let mut index_chunks = 0;
        // Every pool object the index holds, each once.
        let mut handles = Vec::new();
        for shard in self.shards.iter() {
            let map = shard.map.lock();
            let lru = self.lru.lock();
            let entries = map.entries_checked(&lru)?;
            drop(lru);
            index_chunks += map.chunk_count();
            for (k, e, pos) in entries {
                stored += 1;
                if e.writeback() {
                    return Err(format!("entry {k:#x} left under writeback"));
                }
                match e.payload() {
                    PayloadRef::Compressed(h) => {
                        self.pool
                            .object_len(h)
                            .map_err(|err| format!("entry {k:#x}: {err}"))?;
                        handles.push(h);
                        single += 1;
                    }
                    PayloadRef::Shared(obj, slot) => {
                        if e.crc() != 0 {
                            return Err(format!("entry {k:#x}: a multi-page page keeps a CRC"));
                        }
                        let (_, refs, seen) =
                            shared.entry(Arc::as_ptr(&obj)).or_insert_with(|| {
                                (Arc::clone(&obj), 0, vec![false; usize::from(obj.pages)])
                            });
                        *refs += 1;
                        match seen.get_mut(usize::from(slot)) {
                            Some(s) if !*s => *s = true,
                            _ => return Err(format!("entry {k:#x}: slot {slot} bad or shared")),
                        }
                    }
                    PayloadRef::Same(_) => same += 1,
                }
                if e.is_same() == e.on_lru() {
                    return Err(format!(
                        "entry {k:#x}: same-filled {} but on the LRU {}",
                        e.is_same(),
                        e.on_lru()
                    ));
                }
                if e.on_lru() {
                    on_lru += 1;
                    linked.insert(pos);
                }
            }
        }
        {
            let lru = self.lru.lock();
            let walk = lru.check()?;
            if walk.len() != linked.len() || walk.iter().any(|p| !linked.contains(p)) {
                return Err(format!(
                    "{} entries flagged on the LRU, the list links {} other positions",
                    linked.len(),
                    walk.iter().filter(|p| !linked.contains(p)).count()
                ));
            }
            if lru.live_chunks() != index_chunks {
                return Err(format!(
                    "index holds {index_chunks} chunks, LRU {} chunk ids",
                    lru.live_chunks()
                ));
            }
        }
        let mut chunks = 0u64;
        for (obj, refs, _) in shared.values() {
            if obj.refs.load(Ordering::Acquire) != *refs {
                return Err(format!(
                    "multi-page object counts {} references, {refs} entries point at it",
                    obj.refs.load(Ordering::Acquire)
                ));
            }
            for h in obj.handles() {
                self.pool
                    .object_len(h)
                    .map_err(|err| format!("multi-page object chunk: {err}"))?;
                handles.push(h);
            }
            chunks += obj.chunks.len() as u64;
        }
        if on_lru != self.lru.lock().len() {
            return Err(format!(
                "{on_lru} entries on the LRU, list holds {}",
                self.lru.lock().len()
            ));
        }
        let s = self.stats();
        if s.stored_pages != stored || s.same_filled_pages != same {
            return Err(format!(
                "counters {} / {} != index {stored} / {same}",
                s.stored_pages, s.same_filled_pages
            ));
        }
        if self.pool.objects() != single + chunks {
            return Err(format!(
                "pool holds {} objects for {single} single-page entries and {chunks} chunks of \
                 multi-page objects",
                self.pool.objects(),
            ));
        }
        self.pool.check_integrity(Some(&handles))
    }

    /// The pool handle (the location) of `entry`'s compressed data (None if absent or
    /// same-filled); for a multi-page object, that of its first chunk. For the fuzz target and
    /// corruption tests.
    #[doc(hidden)]
    pub fn debug_handle(&self, entry: u64) -> Option<Handle> {
        match self.shards[self.shard_of(entry)]
            .map
            .lock()
            .get(entry)?
            .payload()
        {
            PayloadRef::Compressed(h) => Some(h),
            PayloadRef::Shared(obj, _) => obj.handles().next(),
            PayloadRef::Same(_) => None,
        }
    }

    /// Whether `entry` is a page of a multi-page object. For tests.
    #[doc(hidden)]
    pub fn debug_is_multi_page(&self, entry: u64) -> bool {
        self.shards[self.shard_of(entry)]
            .map
            .lock()
            .get(entry)
            .is_some_and(EntryRef::is_shared)
    }

    /// Corrupts a stored byte of `entry` (see [`Pool::corrupt`]); for a multi-page object, a
    /// byte of chunk `offset / 4095` (modulo the chunks). For fuzzing and tests only.
    #[doc(hidden)]
    pub fn debug_corrupt(&self, entry: u64, offset: usize, mask: u8) -> bool {
        let h = match self.shards[self.shard_of(entry)]
            .map
            .lock()
            .get(entry)
            .map(EntryRef::payload)
        {
            Some(PayloadRef::Compressed(h)) => h,
            Some(PayloadRef::Shared(obj, _)) => {
                match obj
                    .handles()
                    .nth((offset / MAX_OBJECT) % obj.chunks.len().max(1))
                {
                    Some(h) => h,
                    None => return false,
                }
            }
            _ => return false,
        };
        self.pool.corrupt(h, offset, mask).is_ok()
    }

    /// Points `entry` at an arbitrary pool handle (a forged or stale location). For fuzzing
    /// and tests only. The object it named before is leaked from the index's point of view, and
    /// a load that succeeds frees whatever object the forged handle names, so only use this on
    /// a store that is about to be dropped.
    #[doc(hidden)]
    pub fn debug_set_handle(&self, entry: u64, raw: u64) -> bool {
        let mut map = self.shards[self.shard_of(entry)].map.lock();
        match map.get_mut(entry) {
            Some(mut e) => {
                e.set_handle(raw);
                true
            }
            None => false,
        }
    }
}

/// Ends a writeback as failed when the caller's writer unwinds.
struct UnwindGuard<'a> {
    zswap: &'a Zswap,
    key: u64,
}

impl Drop for UnwindGuard<'_> {
    fn drop(&mut self) {
        let shard = &self.zswap.shards[self.zswap.shard_of(self.key)];
        let mut map = shard.map.lock();
        let was_under_writeback = map.get_mut(self.key).is_some_and(|mut e| {
            let w = e.get().writeback();
            e.set_writeback(false);
            w
        });
        if was_under_writeback {
            map.lru_relink(self.key, &mut self.zswap.lru.lock());
        }
        drop(map);
        shard.done.notify_all();
    }
}

#[derive(Debug)]
enum PrepareError {
    Poor(usize),
    Codec(CodecError),
    Pool(PoolError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_shareable_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Zswap>();
    }

    #[test]
    fn same_filled_detection() {
        let mut page = vec![0u8; PAGE_SIZE];
        assert_eq!(same_filled_word(&page), Some(0));
        fill_word(&mut page, 0x0102_0304_0506_0708);
        assert_eq!(same_filled_word(&page), Some(0x0102_0304_0506_0708));
        page[PAGE_SIZE - 1] ^= 1;
        assert_eq!(same_filled_word(&page), None);
    }

    #[test]
    fn accept_threshold_arithmetic_does_not_overflow() {
        let mut c = Config::new(Compressor::Lz4);
        c.max_pool_bytes = u64::MAX;
        c.accept_threshold_percent = 100;
        let z = Zswap::new(c).expect("store");
        assert!(!z.over_limit());
    }
}
