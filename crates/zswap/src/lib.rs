//! `zswap`: a compressed page store after Linux zswap and zsmalloc, with the 2024 large-folio
//! store.
//!
//! # The problem
//!
//! Below resident memory, the cheapest place for a cold page is compressed, in memory: a fault
//! on it costs a decompression (microseconds) instead of a device read. Linux does this with
//! zswap, a cache in front of swap that compresses pages on their way out and keeps them in a
//! zsmalloc pool; when the pool is full it writes its coldest entries back to the swap device.
//! This crate is the same tier for a userspace pager (`crates/uffd-daemon`): the daemon stores an
//! evicted page under its swap entry and loads it back on the fault.
//!
//! # The design it follows
//!
//! - **Entries keyed by swap entry, one per page**, in an index split into shards by 64 MiB of
//!   swap space (`mm/zswap.c` keeps one tree per `SWAP_ADDRESS_SPACE_PAGES`). Each shard is a
//!   two-level radix keyed by the entry number, as the kernel's xarray: chunks of 64 entries
//!   kept as arrays (8-byte payload words, bit planes for kind and flags, CRCs and multi-page
//!   slots in side arrays allocated with their first nonzero value), allocated on first use and
//!   freed when empty, under a vector of chunk pointers (a `BTreeMap` for entries beyond about
//!   2^28 · shards / 64). The LRU is in store order (nothing moves an entry up), so it is a FIFO
//!   of index positions (chunk id, offset) with lazy removal, not a linked list. Each shard is
//!   behind its own mutex: the index is *not* lock-free, so it has no lock-free claims; the loom
//!   models in `tests/loom_store.rs` check the writeback / load / store protocol instead.
//!   Metadata: 14.5 bytes per entry slot for index and LRU marks, 4 per queued LRU position,
//!   and the pool's span records ([`Stats::metadata_bytes`]; about 21-22 bytes per page stored
//!   page by page, 23-25 for 64 KiB folios in 16-page units, whose pages keep no CRC or slot of
//!   their own).
//! - **Large folios stored whole** (the 2024 series "mm: zswap swap-out of large folios"): a
//!   folio of 1 to 512 pages is compressed with reused contexts and then inserted under the
//!   shard locks at once. All or nothing: if any page is refused, every object already
//!   allocated for the folio is freed and the caller gets the reason ([`StoreError`]) and writes
//!   the folio to its backing device instead.
//! - **Multi-page compression** (after the 2024 zram/zsmalloc mTHP work, "mTHP-friendly
//!   compression"): folios of at least [`Config::multi_page_min_pages`] pages (default 4: order
//!   2 and up) are compressed in units of up to [`Config::multi_page_unit_pages`] pages
//!   (default 16, 64 KiB) as *one* object each, which compresses better and faster than page by
//!   page. Entries stay per page, keyed by swap entry: each points at the unit's object
//!   (stored in the pool as chunks of under a page) with its slot, and holds one reference; the
//!   object is freed with its last reference. Loading, invalidating or writing back one page
//!   drops one reference; loading one page decompresses the whole unit (a worker keeps the last
//!   unit it decompressed, so the unit's other pages loaded next cost a copy). The trade-off: a
//!   single page loaded at random costs a unit's decompression (7-10x a page's, measured), and
//!   the memory of a unit stays until all its pages are gone. Same-filled pages inside a unit
//!   stay words; a unit that saves less than a page is redone page by page (so a refusal names
//!   its page). Smaller folios, and every folio with `multi_page_min_pages = 0`, are compressed
//!   page by page as the kernel's zswap does, optionally on several persistent threads
//!   ([`Config::batch_threads`]).
//! - **One compressor per pool**: lz4 (lz4_flex's block API), zstd (configurable level, frames
//!   without checksum, content size or dictionary id, one context per worker), raw deflate in
//!   software (miniz_oxide) and raw deflate through Intel QPL (`deflate-iaa`, the `qpl-dyn` crate:
//!   libqpl loaded at run time, IAA hardware when present, QPL's software path otherwise).
//! - **A zsmalloc-like pool** ([`Pool`]): size classes every 16 bytes from 32 to 4096, objects
//!   packed into spans of several pages. A [`Handle`] is the object's location (class, span,
//!   object, length), kept by the entry: no handle table (zsmalloc's costs 8 bytes per object).
//!   Compaction packs each class as zsmalloc does, then moves what a class still keeps in a
//!   partly filled span up into free slots of larger classes, which removes most of the
//!   one-partial-span-per-class tail; [`Zswap::compact`] rewrites the entries of the objects it
//!   moves (through [`Relocate`]).
//! - **Same-filled pages** (one repeated 64-bit word) are stored as that word, with no pool memory;
//!   pages that do not compress below a page are rejected and counted (`reject_compress_poor`).
//! - **Limits with hysteresis**: past `max_pool_bytes` every store is refused until the pool has
//!   shrunk to `accept_threshold_percent` of it (the kernel's `zswap_check_limits`).
//! - **Writeback**: compressed entries sit on an LRU; [`Zswap::scan_objects`] (a shrinker's
//!   `scan_objects`, with [`Zswap::count_objects`] its `count_objects`) hands the coldest ones,
//!   decompressed, to the caller's [`Writeback`], up to [`WRITEBACK_BATCH`] at a time (the
//!   kernel writes back one page at a time; a batch is one round trip to a network store); on
//!   success they are freed, on failure they stay.
//! - **Integrity**: with [`Config::crc`] each page's CRC32C (a multi-page object's, over all its
//!   pages) is kept and checked on load and writeback. A mismatch, a decompression error or a bad handle is an error, never wrong bytes.
//!   A handle is checked on use (its class and span exist, its slot is used, its length fits),
//!   so a forged or stale one fails or reads another object's slot, which the CRC rejects.
//!   (With CRC off, corrupt data that still decompresses to a page cannot be told from good data,
//!   nor a location forged to name another object; errors and handles naming no object are still
//!   reported and nothing panics.)
//!
//! How it differs from the kernel: there is no swap cache, so a load is always exclusive (it frees
//! the entry, as zswap does for exclusive loads); an entry under writeback is marked in the index
//! and any operation on it waits for the writer to finish (the kernel relies on the swap-cache
//! folio lock); limits are bytes, not a percentage of RAM; same-filled entries are not put on the
//! LRU since writing them back would free no pool memory.
//!
//! # Invariants
//!
//! 1. A successful [`Zswap::load`] returns exactly the bytes stored (checked by CRC32C when on).
//! 2. A store is all or nothing; a failed load or a failed writeback leaves the entries stored.
//! 3. An entry marked as under writeback is removed or replaced only by that writeback.
//! 4. Lock order: shard locks (in index order) → LRU lock → pool class lock. Compaction holds
//!    every shard lock (in index order), then a class lock and then larger ones, for one step
//!    of at most 1024 moves at a time, and rewrites the entries of the objects it moves.
//!    `scan_objects` peeks at the LRU's tail under the LRU lock alone, drops it, and takes the
//!    entry only after re-checking under its shard lock and then the LRU lock that it is still
//!    stored, on the LRU and the tail.
//! 5. A multi-page object's reference count equals the number of entries pointing at it; its
//!    pool chunks are freed exactly when it drops to zero.
//! 6. An entry is flagged as on the LRU exactly while its index position is marked live in the
//!    LRU (whose queued copy of that position is the last one); an index chunk lives exactly
//!    while it holds an entry (and holds its LRU chunk id that long; the id is reused once no
//!    copy of its positions is queued).
//! 7. Every pool object is named by exactly one handle held in the index (an entry's word, or a
//!    multi-page object's chunk list), except while a store prepares it.
//!
//! # Example
//!
//! ```
//! use zswap::{Compressor, Config, Zswap, PAGE_SIZE};
//!
//! # #[cfg(not(miri))]
//! let zswap = Zswap::new(Config::new(Compressor::Zstd { level: 1 }))?;
//! # #[cfg(miri)] // zstd is a C library, which miri cannot call
//! # let zswap = Zswap::new(Config::new(Compressor::Lz4))?;
//! let folio: Vec<u8> = (0..16 * PAGE_SIZE).map(|i| (i / 100) as u8).collect(); // 64 KiB
//! zswap.store(4096, &folio)?;                       // entries 4096..4112
//! let mut page = vec![0u8; PAGE_SIZE];
//! zswap.load(4100, &mut page)?;                     // exclusive: entry 4100 is freed
//! assert_eq!(page, folio[4 * PAGE_SIZE..5 * PAGE_SIZE]);
//! // The shrinker path: write the coldest entries back to a device.
//! let mut device = std::collections::HashMap::new();
//! let done = zswap.scan_objects(4, &mut |entry: u64, page: &[u8]| {
//!     device.insert(entry, page.to_vec());
//!     Ok(())
//! });
//! assert_eq!(done.written_back, 4);
//! assert_eq!(zswap.stats().stored_pages, 11);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(unreachable_pub)]
#![deny(missing_docs)]

mod batch;
mod compress;
#[doc(hidden)]
pub mod fuzzing;
mod index;
mod lru;
mod pool;
mod store;
mod sync;

/// Size of a page, the unit of every entry.
pub const PAGE_SIZE: usize = 4096;

pub use compress::{CodecError, Compressor, PageCodec};
pub use pool::{CompactStep, Handle, Pool, PoolError, Relocate};
pub use qpl_dyn::ExecutionPath as QplPath;
pub use store::{
    Config, ConfigError, LoadError, ScanResult, Stats, StoreError, Writeback, Zswap,
    ENTRIES_PER_SHARD, MAX_FOLIO_PAGES, MAX_ORDER, WRITEBACK_BATCH,
};

/// Compiles and runs the README's example as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
