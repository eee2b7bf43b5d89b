//! The tiers' counters, named like `/proc/vmstat`.

use std::sync::atomic::AtomicU64;

/// The per-tier counters, named like /proc/vmstat.
#[derive(Debug, Default)]
pub struct TierStats {
    /// Pages written to the backend, by eviction and by zswap writeback (`pswpout`: the
    /// kernel counts a writeback as a swap-out too).
    pub pswpout: AtomicU64,
    /// Pages read from the backend by faults (`pswpin`).
    pub pswpin: AtomicU64,
    /// Reads from the backend by faults (a stretch of consecutive slots is one read).
    pub backend_reads: AtomicU64,
    /// Pages written back from zswap to the backend (`zswpwb`).
    pub zswpwb: AtomicU64,
    /// Pages stored by eviction in zswap (`zswpout`).
    pub zswpout: AtomicU64,
    /// Pages read from zswap by faults (`zswpin`).
    pub zswpin: AtomicU64,
    /// Folios stored, by order 0..=9 (`swpout` per mTHP size).
    pub swpout_by_order: [AtomicU64; 10],
    /// Order-4 slot allocations that failed and fell back to single slots
    /// (`swpout_fallback`).
    pub swpout_fallback: AtomicU64,
    /// Folios that zswap refused and went to the backend.
    pub zswap_rejected: AtomicU64,
    /// Backend writes that failed (pages stayed resident or in zswap).
    pub backend_write_errors: AtomicU64,
    /// Pages read by batches of faults all waiting on the disk, in parallel
    /// (`Tiers::read_many`); some may go unused (the fault was throttled or the page changed).
    pub batch_reads: AtomicU64,
    /// Of those, the pages a fault used.
    pub batch_reads_used: AtomicU64,
    /// Backend reads that failed.
    pub backend_read_errors: AtomicU64,
    /// Writeback attempts that failed (entries stayed in zswap).
    pub writeback_errors: AtomicU64,
    /// Evictions refused because no tier could take the pages (no space, no backend).
    pub store_refused: AtomicU64,
    /// Shrink passes the daemon ran.
    pub shrink_calls: AtomicU64,
    /// The largest zswap pool seen after an eviction batch, bytes.
    pub pool_max_bytes: AtomicU64,
    /// Pool pages released by the compaction shrinker.
    pub compacted_pages: AtomicU64,
    /// The compression ratio (stored bytes / pool bytes) when the pool was largest, as f64
    /// bits.
    pub ratio_at_max_bits: AtomicU64,
}
