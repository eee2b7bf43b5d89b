//! The shrinkers the tiers register: zswap's writeback to the backend (its coldest entries,
//! when the pool is over its limit), and the pool's compaction.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use shrinker::{Count, Scan, ShrinkControl, Shrinker};
use zswap::Zswap;

use super::{Backend, TierStats};
use crate::sys::PAGE_SIZE_U64;

/// zswap's writeback shrinker: `count_objects` is what zswap could write back, `scan_objects`
/// writes that many of its coldest entries to the backend.
pub(super) struct ZswapShrinker {
    pub(super) zswap: Arc<Zswap>,
    pub(super) backend: Arc<dyn Backend>,
    pub(super) stats: Arc<TierStats>,
    pub(super) logged: Arc<AtomicBool>,
}

impl Shrinker for ZswapShrinker {
    fn count_objects(&self, _sc: &ShrinkControl) -> Count {
        match self.zswap.count_objects() {
            0 => Count::Empty,
            n => Count::Objects(n as u64),
        }
    }
    fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
        let mut w = BatchWriter {
            backend: &*self.backend,
            first_error: None,
        };
        let r = self.zswap.scan_objects(sc.nr_to_scan as usize, &mut w);
        let first_error = w.first_error;
        sc.nr_scanned = r.scanned as u64;
        self.stats
            .zswpwb
            .fetch_add(r.written_back as u64, Ordering::Relaxed);
        self.stats
            .pswpout
            .fetch_add(r.written_back as u64, Ordering::Relaxed);
        if r.failed > 0 {
            self.stats
                .writeback_errors
                .fetch_add(r.failed as u64, Ordering::Relaxed);
            if !self.logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "zswap writeback to the backing device failed ({}); the pages stay in zswap",
                    first_error.as_deref().unwrap_or("decompression failed")
                );
            }
        }
        if r.written_back == 0 {
            Scan::Stop
        } else {
            Scan::Freed(r.written_back as u64)
        }
    }
}

/// zswap's writeback into the backend: a batch of entries as one `write_all` (one batch of
/// disk writes in flight; one pipeline per master of a Redis Cluster, with one `WAIT`).
struct BatchWriter<'a> {
    backend: &'a dyn Backend,
    first_error: Option<String>,
}

impl zswap::Writeback for BatchWriter<'_> {
    fn write_page(&mut self, entry: u64, page: &[u8]) -> std::io::Result<()> {
        self.write_pages(&[(entry, page)]).pop().unwrap_or(Ok(()))
    }
    fn write_pages(&mut self, pages: &[(u64, &[u8])]) -> Vec<std::io::Result<()>> {
        let writes: Vec<(u64, &[u8])> = pages
            .iter()
            .map(|&(entry, page)| (entry * PAGE_SIZE_U64, page))
            .collect();
        let out = self.backend.write_all(&writes);
        if self.first_error.is_none() {
            self.first_error = out
                .iter()
                .find_map(|r| r.as_ref().err())
                .map(|e| e.to_string());
        }
        out
    }
}

/// zsmalloc's compaction shrinker (`zs_shrinker_count` / `zs_shrinker_scan`): the objects are
/// the pool pages that compaction could give back.
pub(super) struct CompactShrinker {
    pub(super) zswap: Arc<Zswap>,
    pub(super) stats: Arc<TierStats>,
}

impl Shrinker for CompactShrinker {
    fn count_objects(&self, _sc: &ShrinkControl) -> Count {
        let st = self.zswap.stats();
        let slack = st.pool_total_size.saturating_sub(st.compressed_bytes) / PAGE_SIZE_U64;
        // Partly filled spans are normal; only whole pages of slack beyond one span per
        // class are worth a pass.
        match slack.saturating_sub(64) {
            0 => Count::Objects(0),
            n => Count::Objects(n),
        }
    }
    fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
        let freed = self.zswap.compact() / PAGE_SIZE_U64;
        self.stats
            .compacted_pages
            .fetch_add(freed, Ordering::Relaxed);
        sc.nr_scanned = sc.nr_to_scan;
        if freed == 0 {
            Scan::Stop
        } else {
            Scan::Freed(freed)
        }
    }
}
