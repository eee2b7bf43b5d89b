//! Eviction from shared anonymous memory: a batch of an inode's pages, write-protected in
//! every mapper, read from the inode, stored, then punched out of it (the table of inodes and
//! mappers, and why these steps: `crate::shmem`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::mm::{runs_of, Page, ZERO_SLOT};
use crate::shared::Shared;
use crate::shmem::{handler_settled, may_pin, protect_in, Mapper, ShmemInode};
use crate::stats::Stats;
use crate::sys::{self, PAGE_SIZE, PAGE_SIZE_U64};

/// Every mapper in `a` and those of `b` not in `a` (the same address space and range).
fn union(a: &[Mapper], b: &[Mapper]) -> Vec<Mapper> {
    let mut out = a.to_vec();
    for m in b {
        if !out
            .iter()
            .any(|x| x.mm.id == m.mm.id && x.start == m.start && x.end == m.end)
        {
            out.push(m.clone());
        }
    }
    out
}

/// Gives a batch up: its pages still `Evicting` are resident again and their protection is
/// lifted in every mapper (waking writers). Runs on the reclaim thread, the only one that
/// evicts: no other batch can protect these pages between the two steps.
fn abort(shared: &Shared, inode: &ShmemInode, batch: u32, victims: &[u64], snapshot: &[Mapper]) {
    let mappers = {
        let mut st = inode.st.lock();
        for &k in victims {
            if st.pages.pages.get(k) == Some(Page::Evicting { batch }) {
                st.pages.back_to_resident(k);
            }
        }
        union(&st.mappers, snapshot)
    };
    let runs = runs_of(victims);
    for m in &mappers {
        if !protect_in(m, &runs, false) {
            // Writers held on the protection wake and retry: a write-protect fault then
            // finds the page resident and lifts it.
            for &(k, n) in &runs {
                if let Some((a, np)) = m.span(k >> 12, u64::from(n)) {
                    let _ = m.mm.uffd.wake(a, np * PAGE_SIZE_U64);
                }
            }
        }
    }
    Stats::add(&shared.stats.shmem_evict_aborts, 1);
}

/// Evicts up to `max` pages of `inode` (the six steps of the module's docs). Returns the pages
/// evicted. Reclaim thread only.
pub(super) fn evict_batch(shared: &Shared, inode: &ShmemInode, max: usize) -> usize {
    let n = evict_batch_inner(shared, inode, max);
    inode.st.lock().evicting = false;
    n
}

fn evict_batch_inner(shared: &Shared, inode: &ShmemInode, max: usize) -> usize {
    let Some(b) = pick_batch(shared, inode, max) else {
        return 0;
    };
    if !protect_batch(inode, &b) {
        abort(shared, inode, b.batch, &b.victims, &b.snapshot);
        return 0;
    }
    // 4. Read through the inode (no fault anywhere; a hole reads as zeros).
    let mut data = vec![0u8; b.victims.len() * PAGE_SIZE];
    let mut at = 0;
    for &(k, n) in &b.runs {
        let len = n as usize * PAGE_SIZE;
        if let Err(e) = sys::shmem_read(&b.fd, k, &mut data[at..at + len]) {
            tracing::warn!("shared inode {:?}: read at {k:#x}: {e}", inode.key);
            abort(shared, inode, b.batch, &b.victims, &b.snapshot);
            return 0;
        }
        at += len;
    }
    // 5. Store (`reclaim::store_pages`); a page no tier takes stays.
    let (slots, refused) = super::store_pages(shared, &b.victims, &data);
    if !refused.is_empty() {
        abort(shared, inode, b.batch, &refused, &b.snapshot);
    }
    let stored: Vec<(u64, u32)> = b
        .victims
        .iter()
        .zip(&slots)
        .filter(|(k, _)| refused.binary_search(k).is_err())
        .map(|(&k, &s)| (k, s))
        .collect();
    if stored.is_empty() {
        return 0;
    }
    punch(inode, &b, &stored);
    settle_batch(shared, inode, &b, &stored)
}

/// A batch of an inode's pages on its way out, as its steps see it.
struct SharedBatch {
    batch: u32,
    /// The pages' offsets in the inode, sorted.
    victims: Vec<u64>,
    runs: Vec<(u64, u32)>,
    /// The mappers when the victims were picked.
    snapshot: Vec<Mapper>,
    /// The inode's mapper generation then.
    gen: u64,
    fd: Arc<std::fs::File>,
}

/// 1. Picks up to `max` victims under the lock, with the mappers as they are now; `None` when
///    the inode cannot be evicted from now (unverified, pinned, held, unmapped) or has nothing
///    to pick.
fn pick_batch(shared: &Shared, inode: &ShmemInode, max: usize) -> Option<SharedBatch> {
    let mut st = inode.st.lock();
    if !st.verified
        || st.pinned
        || st.mappers.is_empty()
        || st
            .mappers
            .iter()
            .any(|m| crate::mm::is_held(&m.mm) || m.mm.retired.load(Ordering::Acquire))
    {
        return None;
    }
    let batch = st.next_batch;
    st.next_batch = st.next_batch.wrapping_add(1);
    let (victims, _) = st.pages.pick_victims(batch, max, &shared.stats);
    if victims.is_empty() {
        return None;
    }
    st.evicting = true;
    Some(SharedBatch {
        batch,
        runs: runs_of(&victims),
        victims,
        snapshot: st.mappers.clone(),
        gen: st.gen,
        fd: Arc::clone(&st.fd),
    })
}

/// 2-3. Protects the batch in every mapper (a write in any of them waits from here on), and
///    checks that no mapper came or moved meanwhile and none may pin. False: the batch is
///    given up.
fn protect_batch(inode: &ShmemInode, b: &SharedBatch) -> bool {
    // Every handler has applied what it read (a fork or mremap after the protection copied or
    // moved the protected ptes), and the mappers are those protected.
    let ok = b.snapshot.iter().all(|m| protect_in(m, &b.runs, true))
        && b.snapshot.iter().all(|m| handler_settled(&m.mm))
        && {
            let st = inode.st.lock();
            st.gen == b.gen && st.verified && !st.pinned
        };
    // No mapper's process can hold a pin now (invariant 6): a pin taken from here on waits in
    // the write-protect fault (a FOLL_WRITE GUP, probe p3), and one taken before needed an
    // io_uring, an O_DIRECT descriptor or an RDMA device, which it still has. Checked per
    // batch, after the protection: the census alone, every 100 ms, let a fixed buffer
    // registered between two of its rounds be punched (the p5 loss, in the test
    // `shared_anon_io_uring_fixed_buffer`).
    if ok && b.snapshot.iter().any(|m| m.mm.pid().is_none_or(may_pin)) {
        inode.st.lock().pinned = true;
        return false;
    }
    ok
}

/// 6. Punches the stored pages: they leave the page cache and every mapper's page table. A run
///    punched in part leaves its pages still present resident (their slots let go when the
///    batch settles); a hole is evicted (its stored copy serves the next fault).
fn punch(inode: &ShmemInode, b: &SharedBatch, stored: &[(u64, u32)]) {
    let keys: Vec<u64> = stored.iter().map(|&(k, _)| k).collect();
    for (k, n) in runs_of(&keys) {
        let len = u64::from(n) * PAGE_SIZE_U64;
        if let Err(e) = sys::punch_hole(&b.fd, k, len) {
            tracing::warn!("shared inode {:?}: punch at {k:#x}: {e}", inode.key);
            let present = sys::data_extents(&b.fd, k + len).unwrap_or_else(|_| vec![(k, k + len)]);
            let mut st = inode.st.lock();
            for i in 0..u64::from(n) {
                let a = k + i * PAGE_SIZE_U64;
                if st.pages.pages.get(a) == Some(Page::Evicting { batch: b.batch })
                    && present.iter().any(|&(s, e)| s <= a && a < e)
                {
                    st.pages.back_to_resident(a);
                }
            }
        }
    }
}

/// 7. The punched pages are `Evicted`, and every mapper is woken: a held writer refaults
///    (missing) and is served from the slot with its write still to do. Returns the pages
///    evicted.
fn settle_batch(
    shared: &Shared,
    inode: &ShmemInode,
    b: &SharedBatch,
    stored: &[(u64, u32)],
) -> usize {
    let (mut evicted, mut zero) = (0, 0);
    let mappers = {
        let mut st = inode.st.lock();
        for &(k, slot) in stored {
            if st.pages.pages.get(k) == Some(Page::Evicting { batch: b.batch }) {
                st.pages.pages.insert(k, Page::Evicted { slot });
                st.pages.resident -= 1;
                shared.resident_sub(1);
                evicted += 1;
                zero += usize::from(slot == ZERO_SLOT);
            } else if slot != ZERO_SLOT {
                shared.put_slot(slot);
            }
        }
        union(&st.mappers, &b.snapshot)
    };
    for m in &mappers {
        for &(k, n) in &b.runs {
            if let Some((a, np)) = m.span(k >> 12, u64::from(n)) {
                let _ = m.mm.uffd.wake(a, np * PAGE_SIZE_U64);
            }
        }
    }
    let stats = &shared.stats;
    Stats::add(&stats.shmem_evicted_pages, evicted as u64);
    Stats::add(&stats.evicted_pages, evicted as u64);
    Stats::add(&stats.zero_pages_evicted, zero as u64);
    evicted
}
