//! Shared anonymous memory (`MAP_SHARED|MAP_ANONYMOUS`, a shared mapping of `/dev/zero`):
//! paged by page identity, not by address (issue #16; the design and the kernel behaviour it
//! relies on are in `docs/experiments/2026-11-27-shmem-paging.md`, probes in `probes/shmem/`).
//!
//! Such memory is one unnamed shmem inode that every process of a fork tree maps, each at its
//! own addresses. A page is `(inode, pgoff)`; the daemon keeps one [`ShmemInode`] per inode
//! (keyed by `(st_dev, st_ino)`) with its **mappers** (address space, range, first page
//! offset), the page states (an [`MmState`] keyed by `pgoff << 12`: the same table, policy and
//! accounting as a private address space), and a descriptor of the inode opened through
//! `/proc/PID/map_files` (root), through which reclaim reads and punches pages without
//! faulting anyone.
//!
//! ```text
//! eviction (reclaim thread, no agent):   lock: pick victims, mark Evicting, note the mappers
//!   ─▶ UFFDIO_WRITEPROTECT the victims in EVERY mapper (a write anywhere now waits)
//!   ─▶ no mapper changed meanwhile (generation; each mapper's handler idle or past its read)
//!   ─▶ pread through the inode's fd ─▶ store ─▶ fallocate(PUNCH_HOLE) (every mapper's pte goes;
//!      the WP markers stay) ─▶ lock: Evicted(slot) ─▶ UFFDIO_WAKE in every mapper
//! missing fault in any mapper ─▶ (inode, pgoff) ─▶ Evicted: read the slot, UFFDIO_COPY through
//!   that mapper's uffd (EEXIST: another mapper's handler was first: WAKE); unknown: zeros
//! write-protect fault ─▶ Evicting: left waiting (woken above); otherwise protection lifted
//! ```
//!
//! Invariants:
//! 1. A page leaves the page cache only after its contents are stored and while it is
//!    write-protected in every mapper (probe p3: protecting through one mapper lost millions of
//!    atomic adds). Reclaim marks pages `Evicting` under the inode's lock before protecting;
//!    the write-protect fault path decides and lifts protection under the same lock.
//! 2. An inode is evicted from only while **every** mapping of it in the process tree is a
//!    registered mapper ([`InodeState::verified`], the scanner's census): an unregistered
//!    mapper fills a hole with zeros and the stored copy is lost (probe p1, p4). New mappings
//!    come only through fork (`EVENT_FORK` registers the child and copies its parent's WP ptes)
//!    and `mremap` (`EVENT_REMAP`), both keeping the registration.
//! 3. No agent DROP: `UFFDIO_MOVE` refuses shmem (probe p1); the punch is the daemon's own.
//! 4. Resident shared pages count once per inode against the limit, not once per mapper
//!    (`RssShmem` counts them in every mapper).
//! 5. The inode's fd is closed, and its stored pages freed, when its last mapper leaves (an fd
//!    the daemon keeps holds the memory alive: probe p4).
//! 6. A process that may pin shared pages for I/O (an io_uring, an `O_DIRECT` descriptor,
//!    `/dev/infiniband`) keeps its inodes out of eviction: a punch takes a pinned page out of
//!    the page cache all the same, and a device write through the pin is lost (probe p5).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::PolicyConfig;
use crate::mm::{runs_of, Ledger, Mm, MmState, Page, ZERO_SLOT};
use crate::stats::Stats;
use crate::sys::{self, Fill, PAGE_SIZE, PAGE_SIZE_U64};

/// What the table of shared memory needs of the rest of the daemon: the page accounting of
/// every page table ([`Ledger`]), the counters, the policy a new inode's page table is made
/// with, and the tiers an evicted page is read back from. The daemon's `Shared` is the
/// implementation.
pub(crate) trait Host: Ledger {
    /// The counters.
    fn stats(&self) -> &Stats;
    /// The replacement policy's settings.
    fn policy(&self) -> &PolicyConfig;
    /// The store.
    fn tiers(&self) -> &crate::tiers::Tiers;
}

impl<H: Host + ?Sized> Host for Arc<H> {
    fn stats(&self) -> &Stats {
        (**self).stats()
    }
    fn policy(&self) -> &PolicyConfig {
        (**self).policy()
    }
    fn tiers(&self) -> &crate::tiers::Tiers {
        (**self).tiers()
    }
}

/// An inode by `(st_dev, st_ino)`.
pub(crate) type InodeKey = (u64, u64);

/// `st_dev` of a `major:minor` pair as `/proc/PID/maps` shows it (glibc's `makedev`).
pub(crate) fn makedev(major: u32, minor: u32) -> u64 {
    let (ma, mi) = (u64::from(major), u64::from(minor));
    ((ma & 0xffff_f000) << 32) | ((ma & 0xfff) << 8) | ((mi & 0xffff_ff00) << 12) | (mi & 0xff)
}

/// One mapping of an inode: an address space and the range where it maps the inode's pages
/// from `pgoff` on. (Generic over the address space only for the model test of the range
/// arithmetic below.)
#[derive(Debug, Clone)]
pub(crate) struct Mapper<M = Arc<Mm>> {
    /// The address space (its uffd serves the mapping's faults).
    pub mm: M,
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Page offset in the inode of `start`.
    pub pgoff: u64,
}

impl<M> Mapper<M> {
    fn pages(&self) -> u64 {
        (self.end - self.start) / PAGE_SIZE_U64
    }

    /// The page offset of `addr` (in the mapping).
    pub(crate) fn pgoff_of(&self, addr: u64) -> u64 {
        self.pgoff + (addr - self.start) / PAGE_SIZE_U64
    }

    /// The part of the pages `[p, p + n)` that this mapping maps, as `(address, pages)`.
    pub(crate) fn span(&self, p: u64, n: u64) -> Option<(u64, u64)> {
        let lo = p.max(self.pgoff);
        let hi = (p + n).min(self.pgoff + self.pages());
        (lo < hi).then(|| (self.start + (lo - self.pgoff) * PAGE_SIZE_U64, hi - lo))
    }
}

/// Takes `[start, end)` of the address space `is_it` picks out of `mappers`: returns the
/// pieces taken (each with its own page offset), and leaves in `mappers` everything else,
/// a mapper cut in its middle as the two pieces around the hole.
fn cut_mappers<M: Clone>(
    mappers: &mut Vec<Mapper<M>>,
    is_it: impl Fn(&M) -> bool,
    start: u64,
    end: u64,
) -> Vec<Mapper<M>> {
    let mut removed = Vec::new();
    let mut kept = Vec::with_capacity(mappers.len() + 1);
    for m in std::mem::take(mappers) {
        if !is_it(&m.mm) || m.end <= start || m.start >= end {
            kept.push(m);
            continue;
        }
        let (cs, ce) = (m.start.max(start), m.end.min(end));
        removed.push(Mapper {
            mm: m.mm.clone(),
            start: cs,
            end: ce,
            pgoff: m.pgoff_of(cs),
        });
        if m.start < cs {
            kept.push(Mapper {
                mm: m.mm.clone(),
                start: m.start,
                end: cs,
                pgoff: m.pgoff,
            });
        }
        if ce < m.end {
            kept.push(Mapper {
                pgoff: m.pgoff_of(ce),
                mm: m.mm,
                start: ce,
                end: m.end,
            });
        }
    }
    *mappers = kept;
    removed
}

/// A piece `cut_mappers` took from `[from, ..)`, moved by `mremap` to `to`: the same pages at
/// the new addresses.
fn moved<M>(m: Mapper<M>, from: u64, to: u64) -> Mapper<M> {
    Mapper {
        start: m.start - from + to,
        end: m.end - from + to,
        ..m
    }
}

/// What the daemon knows of one inode.
#[derive(Debug)]
pub(crate) struct InodeState {
    /// The inode, opened through a mapper's `/proc/PID/map_files` entry.
    pub fd: Arc<std::fs::File>,
    /// Its mappings in managed address spaces.
    pub mappers: Vec<Mapper>,
    /// Bumped at every change of `mappers`: reclaim gives a batch up if it changed while the
    /// batch was being protected.
    pub gen: u64,
    /// Page states by `pgoff << 12`, the policy, the resident count.
    pub pages: MmState,
    /// The last census found every mapping of the inode in the tree registered (a mapper
    /// here): it may be evicted from (invariant 2).
    pub verified: bool,
    /// A mapper's process may pin pages for I/O: not evicted from (invariant 6).
    pub pinned: bool,
    /// Next eviction batch id.
    pub next_batch: u32,
    /// A batch is between its pick and its settling.
    pub evicting: bool,
}

/// One shared anonymous inode.
#[derive(Debug)]
pub(crate) struct ShmemInode {
    /// `(st_dev, st_ino)`.
    pub key: InodeKey,
    /// Its state; taken after [`ShmemTable`]'s lock, never before.
    pub st: Mutex<InodeState>,
}

/// A mapping of an address space, as the fault path looks it up.
#[derive(Debug, Clone)]
struct MapRef {
    start: u64,
    end: u64,
    pgoff: u64,
    inode: Arc<ShmemInode>,
}

#[derive(Debug, Default)]
struct Table {
    inodes: HashMap<InodeKey, Arc<ShmemInode>>,
    /// Each address space's mappings (rebuilt from the inodes' mappers at each change).
    by_mm: HashMap<u64, Vec<MapRef>>,
}

/// Every shared anonymous inode the daemon manages.
#[derive(Debug, Default)]
pub(crate) struct ShmemTable {
    table: Mutex<Table>,
}

impl Table {
    fn rebuild(&mut self, mm_id: u64) {
        let mut refs = Vec::new();
        for inode in self.inodes.values() {
            let st = inode.st.lock();
            for m in st.mappers.iter().filter(|m| m.mm.id == mm_id) {
                refs.push(MapRef {
                    start: m.start,
                    end: m.end,
                    pgoff: m.pgoff,
                    inode: Arc::clone(inode),
                });
            }
        }
        if refs.is_empty() {
            self.by_mm.remove(&mm_id);
        } else {
            refs.sort_by_key(|r| r.start);
            self.by_mm.insert(mm_id, refs);
        }
    }

    /// Takes `[start, end)` of `mm_id` out of every inode's mappers and returns the pieces
    /// taken; inodes left without one are dropped (their fd closed, their stored pages freed)
    /// if `release`, else by [`Table::release_unmapped`] later.
    fn cut(
        &mut self,
        shared: &impl Host,
        mm_id: u64,
        start: u64,
        end: u64,
        release: bool,
    ) -> Vec<(Arc<ShmemInode>, Mapper)> {
        let touched: Vec<Arc<ShmemInode>> = self
            .by_mm
            .get(&mm_id)
            .map(|v| {
                v.iter()
                    .filter(|r| r.start < end && r.end > start)
                    .map(|r| Arc::clone(&r.inode))
                    .collect()
            })
            .unwrap_or_default();
        let mut removed = Vec::new();
        let mut seen = HashSet::new();
        for inode in touched {
            if !seen.insert(inode.key) {
                continue;
            }
            let mut st = inode.st.lock();
            let taken = cut_mappers(&mut st.mappers, |mm| mm.id == mm_id, start, end);
            removed.extend(taken.into_iter().map(|m| (Arc::clone(&inode), m)));
            st.gen += 1;
        }
        if release {
            self.release_unmapped(shared);
        }
        self.rebuild(mm_id);
        removed
    }

    /// Drops the inodes that no mapping is left of: the memory is gone with its last mapping
    /// (nobody else can reach it, invariant 2), so its stored pages are freed and its fd closed.
    fn release_unmapped(&mut self, shared: &impl Host) {
        let empty: Vec<InodeKey> = self
            .inodes
            .values()
            .filter(|i| i.st.lock().mappers.is_empty())
            .map(|i| i.key)
            .collect();
        for key in empty {
            if let Some(inode) = self.inodes.remove(&key) {
                let mut st = inode.st.lock();
                st.pages.forget_range(shared, 0, u64::MAX);
                Stats::add(&shared.stats().shmem_inodes_released, 1);
                tracing::debug!("shared inode {key:?} released");
            }
        }
    }
}

/// Where a fault lands: the inode and the page offset.
pub(crate) struct Target {
    /// The inode.
    pub inode: Arc<ShmemInode>,
    /// The page offset of the faulting address.
    pub pgoff: u64,
}

impl ShmemTable {
    /// The inode and page offset that `addr` of `mm` maps, if it is a managed shared mapping.
    pub(crate) fn lookup(&self, mm: &Mm, addr: u64) -> Option<Target> {
        if !mm.has_shmem.load(Ordering::Acquire) {
            return None;
        }
        let t = self.table.lock();
        let refs = t.by_mm.get(&mm.id)?;
        let i = refs.partition_point(|r| r.end <= addr);
        let r = refs.get(i).filter(|r| r.start <= addr)?;
        Some(Target {
            inode: Arc::clone(&r.inode),
            pgoff: r.pgoff + (addr - r.start) / PAGE_SIZE_U64,
        })
    }

    /// Whether `[start, end)` of `mm` is a mapper already.
    pub(crate) fn is_mapper(&self, mm: &Mm, start: u64, end: u64) -> bool {
        let t = self.table.lock();
        t.by_mm
            .get(&mm.id)
            .is_some_and(|v| v.iter().any(|r| r.start <= start && end <= r.end))
    }

    /// Every inode (a copy of the list).
    pub(crate) fn inodes(&self) -> Vec<Arc<ShmemInode>> {
        self.table.lock().inodes.values().cloned().collect()
    }

    /// Adds `[start, end)` of `mm` (registered with its uffd) as a mapper of inode `key` from
    /// page `pgoff` on. A new inode is opened through `/proc/PID/map_files` of `pid` and its
    /// pages present are recorded resident.
    pub(crate) fn add_mapper(
        &self,
        shared: &impl Host,
        mm: &Arc<Mm>,
        pid: i32,
        (start, end): (u64, u64),
        pgoff: u64,
        key: InodeKey,
    ) -> std::io::Result<()> {
        let mut t = self.table.lock();
        t.cut(shared, mm.id, start, end, true);
        let created = !t.inodes.contains_key(&key);
        let inode = match t.inodes.get(&key) {
            Some(i) => Arc::clone(i),
            None => {
                let (fd, id) = sys::open_map_file(pid, start, end)?;
                if id != key {
                    return Err(std::io::Error::other(format!(
                        "map_files of pid {pid} at {start:#x} names inode {id:?}, maps said {key:?}"
                    )));
                }
                let inode = Arc::new(ShmemInode {
                    key,
                    st: Mutex::new(InodeState {
                        fd: Arc::new(fd),
                        mappers: Vec::new(),
                        gen: 0,
                        pages: MmState::new(shared.policy()),
                        verified: false,
                        pinned: false,
                        next_batch: 1,
                        evicting: false,
                    }),
                });
                t.inodes.insert(key, Arc::clone(&inode));
                Stats::add(&shared.stats().shmem_inodes, 1);
                inode
            }
        };
        {
            let mut st = inode.st.lock();
            st.mappers.push(Mapper {
                mm: Arc::clone(mm),
                start,
                end,
                pgoff,
            });
            st.gen += 1;
        }
        mm.has_shmem.store(true, Ordering::Release);
        t.rebuild(mm.id);
        drop(t);
        Stats::add(&shared.stats().shmem_mappers, 1);
        sync_present(shared, &inode);
        if created {
            // Verified now rather than at the scanner's next census, up to 100 ms away: a
            // program filling its new mapping meanwhile went past the limit by 22 MiB (the
            // faults go through while reclaim cannot evict).
            self.census(sys::getpid());
        }
        Ok(())
    }

    /// `[start, end)` of `mm` is unmapped.
    pub(crate) fn unmap(&self, shared: &impl Host, mm: &Mm, start: u64, end: u64) {
        if !mm.has_shmem.load(Ordering::Acquire) {
            return;
        }
        self.table.lock().cut(shared, mm.id, start, end, true);
    }

    /// The shared mappings of `mm` that overlap `[start, end)`, as the table has them now.
    fn refs_overlapping(&self, mm: &Mm, start: u64, end: u64) -> Vec<MapRef> {
        let t = self.table.lock();
        t.by_mm
            .get(&mm.id)
            .map(|v| {
                v.iter()
                    .filter(|r| r.start < end && r.end > start)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `madvise(MADV_REMOVE)` of `[start, end)` in `mm` (a REMOVE event the agent announced):
    /// the pages of the inodes mapped there are holes now (the kernel punches them after the
    /// event is read), so their states and stored copies are dropped: the next fault reads
    /// zeros. A batch evicting one of them finds it gone and lets its slot go. Returns the
    /// pages dropped.
    pub(crate) fn remove(&self, shared: &impl Host, mm: &Mm, start: u64, end: u64) -> usize {
        if !mm.has_shmem.load(Ordering::Acquire) {
            return 0;
        }
        let refs = self.refs_overlapping(mm, start, end);
        let mut n = 0;
        for r in refs {
            let (s, e) = (r.start.max(start), r.end.min(end));
            let lo = r.pgoff + (s - r.start) / PAGE_SIZE_U64;
            let hi = lo + (e - s) / PAGE_SIZE_U64;
            n += r
                .inode
                .st
                .lock()
                .pages
                .forget_range(shared, lo << 12, hi << 12);
        }
        n
    }

    /// Whether an inode `mm` maps has pages evicted or being evicted: a REMOVE event of `mm`
    /// must then be told apart (`MADV_REMOVE` or `MADV_DONTNEED`), and its handler scans the
    /// callers before it reads (`fault/remove_scan.rs`). Asked by the handler after it marked
    /// itself reading (`Mm::handling`): a batch picked after the answer waits for the handler
    /// to apply what it reads (see [`ShmemTable::stored`]).
    pub(crate) fn has_evicted(&self, mm: &Mm) -> bool {
        if !mm.has_shmem.load(Ordering::Acquire) {
            return false;
        }
        let inodes: Vec<Arc<ShmemInode>> = {
            let t = self.table.lock();
            let Some(refs) = t.by_mm.get(&mm.id) else {
                return false;
            };
            refs.iter().map(|r| Arc::clone(&r.inode)).collect()
        };
        inodes.iter().any(|i| {
            let st = i.st.lock();
            st.evicting || st.pages.pages.len() > st.pages.resident
        })
    }

    /// Whether `[start, end)` of `mm` maps pages evicted or being evicted, whose stored copies
    /// a REMOVE there must keep or drop. With `give_up`, for a REMOVE nobody could tell apart
    /// (taken as `MADV_DONTNEED`: the copies stay), a batch evicting such pages is also given
    /// up (its inode's generation moves, which the batch checks after it saw the handler
    /// settle): that batch was picked after the handler decided no scan was needed, and its
    /// read could otherwise store a page an `MADV_REMOVE` is about to punch.
    pub(crate) fn stored(&self, mm: &Mm, start: u64, end: u64, give_up: bool) -> bool {
        if !mm.has_shmem.load(Ordering::Acquire) {
            return false;
        }
        let refs = self.refs_overlapping(mm, start, end);
        let mut held = false;
        for r in refs {
            let (s, e) = (r.start.max(start), r.end.min(end));
            let lo = r.pgoff + (s - r.start) / PAGE_SIZE_U64;
            let hi = lo + (e - s).div_ceil(PAGE_SIZE_U64);
            let mut st = r.inode.st.lock();
            let stored = st
                .pages
                .pages
                .range(lo << 12..hi << 12)
                .any(|(_, p)| !matches!(p, Page::Resident { .. }));
            if stored && st.evicting && give_up {
                st.gen += 1;
            }
            held |= stored;
        }
        held
    }

    /// `[start, end)` of `mm` goes to a userfaultfd of the program's own (its `UFFDIO_REGISTER`
    /// met the daemon's registration): every page the daemon evicted of the inodes mapped there
    /// is written back into the inode (`pwrite`: the program's handler must never see a hole
    /// where a page has data); the caller unregisters the range, then [`ShmemTable::unmap`]s
    /// it. Its inodes are evicted from no more: the census finds their mapping there no mapper.
    /// Returns the pages written back.
    pub(crate) fn step_aside(
        &self,
        shared: &impl Host,
        mm: &Mm,
        start: u64,
        end: u64,
    ) -> std::io::Result<u64> {
        self.write_back(shared, mm, start, end, true)
    }

    /// Every page the daemon evicted of the inodes `[start, end)` of `mm` maps, written back
    /// into the inode (`pwrite`, once no batch of the inode is in flight); with `unverify`,
    /// the inodes are evicted from no more until the census verifies them again. A hold
    /// (`supervisor/hold.rs`: a core dump or a debugger reads memory without a userfault)
    /// writes back everything its process maps: no batch of an inode starts while a mapper
    /// is held.
    pub(crate) fn write_back(
        &self,
        shared: &impl Host,
        mm: &Mm,
        start: u64,
        end: u64,
        unverify: bool,
    ) -> std::io::Result<u64> {
        if !mm.has_shmem.load(Ordering::Acquire) {
            return Ok(0);
        }
        let inodes: Vec<Arc<ShmemInode>> = {
            let t = self.table.lock();
            let mut v: Vec<Arc<ShmemInode>> = Vec::new();
            for r in t.by_mm.get(&mm.id).into_iter().flatten() {
                if r.start < end && r.end > start && !v.iter().any(|i| Arc::ptr_eq(i, &r.inode)) {
                    v.push(Arc::clone(&r.inode));
                }
            }
            v
        };
        let mut restored = 0;
        let mut buf = vec![0u8; PAGE_SIZE];
        for inode in inodes {
            // Once no batch is in flight (the reclaim thread ends each within its stores),
            // and none can start: the inode is not verified from now on.
            let mut st = loop {
                let mut st = inode.st.lock();
                if !st.evicting {
                    if unverify {
                        st.verified = false;
                        st.gen += 1;
                    }
                    break st;
                }
                drop(st);
                std::thread::sleep(Duration::from_millis(1));
            };
            let mut back = Vec::new();
            let evicted: Vec<(u64, Page)> = st
                .pages
                .pages
                .iter()
                .filter(|(_, p)| matches!(p, Page::Evicted { .. }))
                .collect();
            for (k, p) in evicted {
                if let Some(slot) = p.slot().filter(|&s| s != ZERO_SLOT) {
                    shared.tiers().read_run(slot, 1, &mut buf)?;
                } else {
                    buf.fill(0);
                }
                sys::shmem_write(&st.fd, k, &buf)?;
                st.pages.pages.remove(k);
                st.pages.release(shared, k, p);
                st.pages
                    .make_resident(shared, k, mglru::Arrival::Cold, false);
                restored += 1;
                back.push(k);
            }
            // The eviction's write-protect markers lifted in every mapper: a debugger's write
            // through /proc/PID/mem to a protected page fails (probe p3).
            let runs = runs_of(&back);
            for m in st.mappers.iter() {
                protect_in(m, &runs, false);
            }
        }
        Ok(restored)
    }

    /// `mm` is gone (exit, exec): it maps nothing any more.
    pub(crate) fn retire(&self, shared: &impl Host, mm: &Mm) {
        self.unmap(shared, mm, 0, u64::MAX);
    }

    /// `mremap` moved `[from, from + len)` of `mm` to `to`: its mappers there move (their pages
    /// keep their offsets).
    pub(crate) fn remap(&self, shared: &impl Host, mm: &Mm, from: u64, to: u64, len: u64) {
        if !mm.has_shmem.load(Ordering::Acquire) {
            return;
        }
        if len == 0 {
            // `mremap(old_size = 0)` duplicated a mapping: the new one keeps the registration
            // but is no mapper yet. Until the scan adds it, no inode of this address space is
            // evicted from (the census verifies them again).
            let t = self.table.lock();
            for r in t.by_mm.get(&mm.id).into_iter().flatten() {
                let mut st = r.inode.st.lock();
                st.verified = false;
                st.gen += 1;
            }
            return;
        }
        let mut t = self.table.lock();
        // (Whatever the destination held is gone first.)
        t.cut(shared, mm.id, to, to + len, true);
        // The moved pieces leave without releasing their inodes: they come back at once.
        let moved_pieces = t.cut(shared, mm.id, from, from + len, false);
        for (inode, m) in moved_pieces {
            let mut st = inode.st.lock();
            st.mappers.push(moved(m, from, to));
            st.gen += 1;
        }
        t.rebuild(mm.id);
        t.release_unmapped(shared);
    }

    /// A forked child: it maps what its parent mapped, at the same addresses (`EVENT_FORK`
    /// registered it there), but for `MADV_DONTFORK` mappings (`dont_fork`, from the parent's
    /// smaps).
    pub(crate) fn fork(&self, shared: &impl Host, parent: &Mm, child: &Arc<Mm>) {
        if !parent.has_shmem.load(Ordering::Acquire) {
            return;
        }
        let dont_fork: Vec<(u64, u64)> = parent
            .pid()
            .and_then(|p| crate::maps::read_vm_flags(p).ok())
            .map(|v| {
                v.into_iter()
                    .filter(|f| f.2.dont_fork)
                    .map(|f| (f.0, f.1))
                    .collect()
            })
            .unwrap_or_default();
        let mut t = self.table.lock();
        let refs = t.by_mm.get(&parent.id).cloned().unwrap_or_default();
        let mut n = 0;
        for r in refs {
            if dont_fork.iter().any(|&(s, e)| s < r.end && e > r.start) {
                continue;
            }
            let mut st = r.inode.st.lock();
            st.mappers.push(Mapper {
                mm: Arc::clone(child),
                start: r.start,
                end: r.end,
                pgoff: r.pgoff,
            });
            st.gen += 1;
            n += 1;
        }
        if n > 0 {
            child.has_shmem.store(true, Ordering::Release);
            t.rebuild(child.id);
            Stats::add(&shared.stats().shmem_mappers, n);
        }
    }
}

/// Records the pages of `inode` present in the page cache that the table does not know as
/// resident (filled before a mapping was registered). A page the table holds as evicted but
/// present was filled behind the daemon's back (by a mapping no uffd of the daemon covers):
/// its stored copy is stale; counted and said.
pub(crate) fn sync_present(shared: &impl Host, inode: &ShmemInode) {
    let mut st = inode.st.lock();
    let size = st.fd.metadata().map(|m| m.len()).unwrap_or(0);
    let Ok(extents) = sys::data_extents(&st.fd, size) else {
        return;
    };
    for (s, e) in extents {
        let mut k = s & !(PAGE_SIZE_U64 - 1);
        while k < e {
            match st.pages.pages.get(k) {
                None => st
                    .pages
                    .make_resident(shared, k, mglru::Arrival::Cold, false),
                Some(p @ Page::Evicted { .. }) => {
                    note_filled_behind(shared, inode.key, k);
                    st.pages.pages.remove(k);
                    st.pages.release(shared, k, p);
                    st.pages
                        .make_resident(shared, k, mglru::Arrival::Cold, false);
                }
                Some(_) => {}
            }
            k += PAGE_SIZE_U64;
        }
    }
}

/// A page held as evicted was found present: something filled its hole without a fault the
/// daemon saw. Never expected (invariant 2); counted, said once.
pub(crate) fn note_filled_behind(shared: &impl Host, key: InodeKey, offset: u64) {
    if shared
        .stats()
        .shmem_filled_behind_pages
        .fetch_add(1, Ordering::Relaxed)
        == 0
    {
        tracing::error!(
            "shared inode {key:?}: page at offset {offset:#x} was evicted and is present \
             again without a fault the daemon served (a mapping no uffd of the daemon covers?)"
        );
    }
}

/// [`handler_settled`], waiting as long as it takes (up to 5 s: a handler stopped for good).
pub(crate) fn wait_handler_settled(mm: &Mm) {
    for _ in 0..100 {
        if handler_settled(mm) {
            return;
        }
    }
}

/// Waits until the handler of `mm` is not between a read of its uffd and the end of applying
/// what it read (`Mm::handling` even, or past the read in progress): every event it read by
/// now is applied. False if that took more than 50 ms.
pub(crate) fn handler_settled(mm: &Mm) -> bool {
    let v = mm.handling.load(Ordering::Acquire);
    if v % 2 == 0 || mm.retired.load(Ordering::Acquire) {
        return true;
    }
    let deadline = Instant::now() + Duration::from_millis(50);
    while Instant::now() < deadline {
        if mm.handling.load(Ordering::Acquire) != v {
            return true;
        }
        std::thread::sleep(Duration::from_micros(20));
    }
    false
}

/// Write-protects (or un-protects) the pages `runs` (`(offset, pages)`) of an inode in one
/// mapper. False if an event is pending on its uffd (`EAGAIN` for a while) or the ioctl failed.
pub(crate) fn protect_in(m: &Mapper, runs: &[(u64, u32)], wp: bool) -> bool {
    for &(k, n) in runs {
        let Some((a, np)) = m.span(k >> 12, u64::from(n)) else {
            continue;
        };
        let mut tries = 0;
        loop {
            match m.mm.uffd.writeprotect(a, np * PAGE_SIZE_U64, wp) {
                Ok(Fill::Filled | Fill::Exists) => break,
                // Not registered there (any more): protecting, no mapper may be unknown, so
                // the batch is given up (the mapping went away and its UNMAP is on its way, or
                // it went to another userfaultfd); lifting, nothing is left to lift.
                Ok(Fill::Gone) if !wp => break,
                // (An event pending: its handler reads it within microseconds. Protecting, a
                // batch gives up after 10 ms; lifting, it keeps trying for 5 s, since writers
                // may be waiting on the protection.)
                Ok(Fill::Again) if tries < if wp { 200 } else { 100_000 } => {
                    tries += 1;
                    std::thread::sleep(Duration::from_micros(50));
                }
                _ => return false,
            }
        }
    }
    true
}

/// Resident pages of the inode (for reclaim's choice of whom to evict from).
pub(crate) fn resident(inode: &ShmemInode) -> usize {
    inode.st.lock().pages.resident
}

/// Whether a descriptor of `pid` may pin memory for I/O: an io_uring, a file opened with
/// `O_DIRECT`, an RDMA or VFIO device.
pub(crate) fn may_pin(pid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    for e in dir.flatten() {
        let Ok(t) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = t.to_string_lossy();
        if t == "anon_inode:[io_uring]"
            || t.starts_with("/dev/infiniband")
            || t.starts_with("/dev/vfio")
        {
            return true;
        }
        if t.starts_with('/') {
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 8).ok())
                .unwrap_or(0);
            if flags & libc::O_DIRECT as u64 != 0 {
                return true;
            }
        }
    }
    false
}

impl ShmemTable {
    /// The census of shared mappings (the scanner, every 100 ms): an inode is `verified` when
    /// every mapping of it in the tree under `root` is a mapper (invariant 2), `pinned` when a
    /// process mapping it may pin pages (invariant 6). Returns the resident bytes of inodes left
    /// out of eviction for a pin.
    pub(crate) fn census(&self, root: i32) -> u64 {
        let inodes = self.inodes();
        if inodes.is_empty() {
            return 0;
        }
        // Every shared anonymous mapping in the tree, by inode: (pid, start, end).
        let mut seen: HashMap<InodeKey, Vec<(i32, u64, u64)>> = HashMap::new();
        let mut pinned: HashSet<InodeKey> = HashSet::new();
        for pid in crate::unmanaged::descendants(root) {
            let Ok(vmas) = crate::maps::read_maps(pid) else {
                continue;
            };
            let mut keys = Vec::new();
            for v in vmas.iter().filter(|v| v.maps_shared_anon_inode()) {
                let key = (makedev(v.dev.0, v.dev.1), v.inode);
                seen.entry(key).or_default().push((pid, v.start, v.end));
                keys.push(key);
            }
            if !keys.is_empty() && may_pin(pid) {
                pinned.extend(keys);
            }
        }
        let mut pinned_bytes = 0;
        for inode in inodes {
            let mut st = inode.st.lock();
            let all = seen.get(&inode.key).map(Vec::as_slice).unwrap_or(&[]);
            let covered = |&(pid, s, e): &(i32, u64, u64)| {
                st.mappers
                    .iter()
                    .any(|m| m.start <= s && e <= m.end && m.mm.pid().is_none_or(|p| p == pid))
            };
            let verified = all.iter().all(covered);
            if st.verified && !verified {
                tracing::debug!("shared inode {:?}: a mapping is no mapper", inode.key);
            }
            st.verified = verified;
            let pin = pinned.contains(&inode.key);
            if pin && !st.pinned {
                tracing::warn!(
                    "shared inode {:?}: a process mapping it may pin pages for I/O (io_uring, \
                     O_DIRECT, RDMA): not paged while it does (counted in \
                     unmanaged_shared_pinned_bytes)",
                    inode.key
                );
            }
            st.pinned = pin;
            if pin {
                pinned_bytes += st.pages.resident as u64 * PAGE_SIZE_U64;
            }
        }
        pinned_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const PG: u64 = PAGE_SIZE_U64;
    /// Address spaces, inodes and the pages of the window the operations draw from.
    const MMS: u64 = 3;
    const INODES: usize = 3;
    const WINDOW: u64 = 48;

    #[derive(Debug, Clone)]
    enum Op {
        /// mmap of `pages` of `inode` from `pgoff` at `start` (what was there is unmapped).
        Map {
            mm: u64,
            inode: usize,
            start: u64,
            pages: u64,
            pgoff: u64,
        },
        Unmap {
            mm: u64,
            start: u64,
            pages: u64,
        },
        /// mremap of `pages` from `from` to `to` (ranges disjoint; what was at `to` goes).
        Remap {
            mm: u64,
            from: u64,
            to: u64,
            pages: u64,
        },
        /// `child` (its old mappings gone, as at exec) becomes a fork of `parent`.
        Fork {
            parent: u64,
            child: u64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        let page = 0..WINDOW;
        prop_oneof![
            (0..MMS, 0..INODES, page.clone(), 1..12u64, 0..64u64).prop_map(
                |(mm, inode, start, pages, pgoff)| Op::Map {
                    mm,
                    inode,
                    start,
                    pages,
                    pgoff
                }
            ),
            (0..MMS, page.clone(), 1..16u64).prop_map(|(mm, start, pages)| Op::Unmap {
                mm,
                start,
                pages
            }),
            (0..MMS, page.clone(), page, 1..12u64)
                .prop_filter("disjoint", |(_, f, t, n)| f + n <= *t || t + n <= *f)
                .prop_map(|(mm, from, to, pages)| Op::Remap {
                    mm,
                    from,
                    to,
                    pages
                }),
            (0..MMS, 0..MMS)
                .prop_filter("two", |(p, c)| p != c)
                .prop_map(|(parent, child)| Op::Fork { parent, child }),
        ]
    }

    /// The table's range arithmetic, on plain address-space numbers: one mapper list per inode.
    fn apply(inodes: &mut [Vec<Mapper<u64>>], op: &Op) {
        let cut_all = |inodes: &mut [Vec<Mapper<u64>>], mm: u64, s: u64, e: u64| {
            inodes
                .iter_mut()
                .map(|ms| cut_mappers(ms, |&m| m == mm, s, e))
                .collect::<Vec<_>>()
        };
        match *op {
            Op::Map {
                mm,
                inode,
                start,
                pages,
                pgoff,
            } => {
                cut_all(inodes, mm, start * PG, (start + pages) * PG);
                inodes[inode].push(Mapper {
                    mm,
                    start: start * PG,
                    end: (start + pages) * PG,
                    pgoff,
                });
            }
            Op::Unmap { mm, start, pages } => {
                cut_all(inodes, mm, start * PG, (start + pages) * PG);
            }
            Op::Remap {
                mm,
                from,
                to,
                pages,
            } => {
                cut_all(inodes, mm, to * PG, (to + pages) * PG);
                let taken = cut_all(inodes, mm, from * PG, (from + pages) * PG);
                for (i, pieces) in taken.into_iter().enumerate() {
                    for m in pieces {
                        inodes[i].push(moved(m, from * PG, to * PG));
                    }
                }
            }
            Op::Fork { parent, child } => {
                cut_all(inodes, child, 0, u64::MAX);
                for ms in inodes.iter_mut() {
                    let copies: Vec<_> = ms
                        .iter()
                        .filter(|m| m.mm == parent)
                        .map(|m| Mapper {
                            mm: child,
                            ..m.clone()
                        })
                        .collect();
                    ms.extend(copies);
                }
            }
        }
    }

    /// The model: each address space's pages, each the (inode, page offset) it maps.
    type Model = BTreeMap<(u64, u64), (usize, u64)>;

    fn model_apply(model: &mut Model, op: &Op) {
        let clear = |model: &mut Model, mm: u64, s: u64, n: u64| {
            for p in s..s + n {
                model.remove(&(mm, p));
            }
        };
        match *op {
            Op::Map {
                mm,
                inode,
                start,
                pages,
                pgoff,
            } => {
                for i in 0..pages {
                    model.insert((mm, start + i), (inode, pgoff + i));
                }
            }
            Op::Unmap { mm, start, pages } => clear(model, mm, start, pages),
            Op::Remap {
                mm,
                from,
                to,
                pages,
            } => {
                clear(model, mm, to, pages);
                let taken: Vec<_> = (0..pages)
                    .filter_map(|i| model.remove(&(mm, from + i)).map(|v| (i, v)))
                    .collect();
                for (i, v) in taken {
                    model.insert((mm, to + i), v);
                }
            }
            Op::Fork { parent, child } => {
                model.retain(|&(m, _), _| m != child);
                let copies: Vec<_> = model
                    .iter()
                    .filter(|((m, _), _)| *m == parent)
                    .map(|(&(_, p), &v)| ((child, p), v))
                    .collect();
                model.extend(copies);
            }
        }
    }

    proptest! {
        /// Mappings made, unmapped, moved and forked in any order: every page of every
        /// address space maps what the model says, through exactly one mapper, and no mapper
        /// is empty.
        #[test]
        fn mapper_ranges_follow_a_page_model(ops in proptest::collection::vec(op(), 1..40)) {
            let mut inodes: Vec<Vec<Mapper<u64>>> = vec![Vec::new(); INODES];
            let mut model = Model::new();
            for op in &ops {
                apply(&mut inodes, op);
                model_apply(&mut model, op);
                for (i, ms) in inodes.iter().enumerate() {
                    for m in ms {
                        prop_assert!(m.start < m.end, "empty mapper {m:?} of inode {i}");
                    }
                }
                for mm in 0..MMS {
                    for p in 0..2 * WINDOW + 16 {
                        let a = p * PG;
                        let hits: Vec<(usize, u64)> = inodes
                            .iter()
                            .enumerate()
                            .flat_map(|(i, ms)| {
                                ms.iter()
                                    .filter(|m| m.mm == mm && m.start <= a && a < m.end)
                                    .map(move |m| (i, m.pgoff_of(a)))
                            })
                            .collect();
                        prop_assert!(hits.len() <= 1, "page {p} of {mm} in {hits:?} after {op:?}");
                        prop_assert_eq!(
                            hits.first().copied(),
                            model.get(&(mm, p)).copied(),
                            "page {} of mm {} after {:?}", p, mm, op
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn makedev_matches_the_kernel_encoding() {
        assert_eq!(makedev(0, 1), 1);
        assert_eq!(makedev(8, 1), 0x801);
        assert_eq!(makedev(0, 0x1a), 0x1a);
        assert_eq!(makedev(259, 0x100), 0x11_0300);
    }
}
