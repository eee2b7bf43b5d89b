//! A fault on shared anonymous memory, served by page identity (`shmem.rs`): whichever mapper
//! faults, the page is `(inode, pgoff)` and its state is the inode's.
//!
//! ```text
//! write-protect ─▶ Evicting: left waiting (the batch wakes every mapper) │ else: lifted
//! missing ─▶ Evicting: left waiting │ Resident (another mapper's handler restored it, or the
//!            program removed it): zeros, which never overwrite a present page (EEXIST ─▶ WAKE)
//!          ─▶ at the limit: throttled as a private fault is
//!          ─▶ Evicted(slot): read, UFFDIO_COPY through this mapper's uffd (charges its memcg),
//!             protection left in the other mappers lifted │ never seen: zeros
//! ```
//!
//! Everything happens under the inode's lock, as reclaim's marking of victims does, so that a
//! stale message never unprotects a page under eviction and two mappers' handlers never both
//! restore a page.
use std::sync::atomic::Ordering;

use mglru::Arrival;

use super::Work;
use crate::mm::{Mm, Page, ZERO_SLOT};
use crate::shared::Shared;
use crate::shmem::{InodeState, Target};
use crate::stats::Stats;
use crate::sys::{self, Fill, PAGE_SIZE, PAGE_SIZE_U64};

use super::{is_daemon_thread, Pending, FILL_RETRY_MAX, THROTTLE_MAX};

/// The shared mapping of `mm` around `addr`, if the fault is in one: a mapping registered (by
/// the agent's `mmap` wrapper, or before the scan recorded it) that the table does not know
/// yet is added as a mapper first. `None` for any other memory.
pub(super) fn target(shared: &Shared, mm: &std::sync::Arc<Mm>, addr: u64) -> Option<Target> {
    if let Some(t) = shared.shmem.lookup(mm, addr) {
        return Some(t);
    }
    // A fault in a range the private table knows is private memory.
    if mm.state.lock().in_ranges(addr) {
        return None;
    }
    let pid = mm.pid()?;
    let info = {
        let mut maps = mm.maps.lock();
        if maps.as_ref().is_none_or(|(p, _)| *p != pid) {
            *maps = std::fs::File::open(format!("/proc/{pid}/maps"))
                .ok()
                .map(|f| (pid, f));
        }
        sys::vma_info(&maps.as_ref()?.1, addr).ok()??
    };
    let perms = if info.rw { "rw-s" } else { "r--s" };
    if !info.shared || !crate::maps::is_shared_anon(perms, info.dev, info.inode, &info.name) {
        return None;
    }
    let key = (crate::shmem::makedev(info.dev.0, info.dev.1), info.inode);
    match shared.shmem.add_mapper(
        shared,
        mm,
        pid,
        (info.start, info.end),
        info.offset / PAGE_SIZE_U64,
        key,
    ) {
        Ok(()) => shared.shmem.lookup(mm, addr),
        Err(e) => {
            tracing::warn!("pid {pid}: shared mapping at {addr:#x}: {e}");
            None
        }
    }
}

/// Serves a fault on shared anonymous memory. Returns false when it must be retried.
///
/// Under the inode's lock, in stages: a write-protect fault lifts protection; a page known
/// present or under eviction is answered at once; a page to add waits at the limit; then the
/// run is planned (readahead of evicted pages, fault-around of never-written ones), read,
/// filled, and committed to the inode's table.
pub(super) fn serve_shared(
    shared: &Shared,
    mm: &Mm,
    p: &mut Pending,
    t: &Target,
    w: &mut Work,
) -> bool {
    let addr = p.address & !(PAGE_SIZE_U64 - 1);
    let key = t.pgoff << 12;
    Stats::add(&shared.stats.shmem_faults, 1);
    let mut st = t.inode.st.lock();
    let prior = st.pages.pages.get(key);
    if p.flags & sys::UFFD_PAGEFAULT_FLAG_WP != 0 {
        return lift_protection(shared, mm, addr, prior);
    }
    if let Some(done) = answer_known(shared, mm, &mut st, key, addr, prior, &w.zeros) {
        return done;
    }
    // A page to add: at the limit, wait for reclaim like a private fault (`gate`).
    if must_wait_at_limit(shared, mm, p) {
        drop(st);
        super::serve::throttle(shared, mm, p);
        return false;
    }
    let at = At { key, addr, prior };
    if at.restore() {
        p.stall(shared);
    }
    let run = plan_run(shared, mm, &st, &at, w);
    let Some(n) = read_run(shared, mm, t, &run, &mut w.page) else {
        return true; // unreadable: the process is stopped
    };
    let filled = match fill_run(shared, mm, p, t, &at, &w.page[..n * PAGE_SIZE]) {
        Ok(filled) => filled,
        Err(done) => return done,
    };
    commit_run(shared, mm, &mut st, t, &run[..filled], &at, w);
    drop(st);
    shared.maybe_kick_reclaim();
    true
}

/// Where a fault is: the page's key in the inode, its address in the faulting mapper, and its
/// state in the inode's table when the fault was taken up.
#[derive(Clone, Copy)]
struct At {
    key: u64,
    addr: u64,
    prior: Option<Page>,
}

impl At {
    /// Whether the fault restores a stored page (else it fills zeros).
    fn restore(&self) -> bool {
        matches!(self.prior, Some(Page::Evicted { slot }) if slot != ZERO_SLOT)
    }
}

/// A write-protect fault: left waiting on a page under eviction (the batch wakes every mapper),
/// else the protection is lifted.
fn lift_protection(shared: &Shared, mm: &Mm, addr: u64, prior: Option<Page>) -> bool {
    Stats::add(&shared.stats.shmem_wp_faults, 1);
    if matches!(prior, Some(Page::Evicting { .. })) {
        return true; // the batch wakes it
    }
    match mm.uffd.writeprotect(addr, PAGE_SIZE_U64, false) {
        Ok(Fill::Again) => false,
        Ok(Fill::Filled | Fill::Exists) => true,
        // Not lifted (the range is gone, or the ioctl failed): the writer is woken all the
        // same and faults again on what is there now; a message read and left unanswered is a
        // thread waiting for ever.
        _ => {
            let _ = mm.uffd.wake(addr, PAGE_SIZE_U64);
            true
        }
    }
}

/// A missing fault on a page the table knows is there or on its way out: answered at once
/// (`Some(done)`), or `None` for a page to add.
fn answer_known(
    shared: &Shared,
    mm: &Mm,
    st: &mut InodeState,
    key: u64,
    addr: u64,
    prior: Option<Page>,
    zeros: &[u8],
) -> Option<bool> {
    match prior {
        // Present until the punch, a hole after it: the batch wakes this thread once the page
        // is `Evicted`, and it faults again.
        Some(Page::Evicting { .. }) => Some(true),
        Some(Page::Resident { readahead, .. }) => {
            // Another mapper's handler restored it first (or the program removed it: zeros are
            // then what it reads).
            st.pages.pages.insert(
                key,
                Page::Resident {
                    referenced: true,
                    readahead,
                },
            );
            Some(match mm.uffd.copy(addr, &zeros[..PAGE_SIZE]) {
                Ok(Fill::Again) => false,
                Ok(Fill::Filled) => {
                    Stats::add(&shared.stats.shmem_zero_fills, 1);
                    true
                }
                // Present (EEXIST), gone, or failed: woken all the same, to fault again on what
                // is there now.
                _ => {
                    let _ = mm.uffd.wake(addr, PAGE_SIZE_U64);
                    true
                }
            })
        }
        _ => None,
    }
}

/// Whether a fault that adds a page waits for reclaim: at the limit, unless reclaim is stalled,
/// the fault has waited its most already, or it is the agent's or the daemon's own.
fn must_wait_at_limit(shared: &Shared, mm: &Mm, p: &Pending) -> bool {
    shared.resident() >= shared.limit.pages()
        && !shared.reclaim_stalled()
        && p.read_at.elapsed() < THROTTLE_MAX
        && p.ptid != mm.agent_tid.load(Ordering::Relaxed)
        && !is_daemon_thread(mm, p.ptid)
}

/// The run to fill: the page, and on a restore the evicted pages after it in this mapping
/// (readahead: a stretch of the inode is usually read in order), as room allows; never
/// written: zeros, with fault-around over the pages after it the table does not know either,
/// on a sequential pattern (as for private memory: `fill_zeros`). Each as (key, its state).
fn plan_run(
    shared: &Shared,
    mm: &Mm,
    st: &InodeState,
    at: &At,
    w: &mut Work,
) -> Vec<(u64, Option<Page>)> {
    let At { key, addr, prior } = *at;
    let restore = at.restore();
    let mut run = vec![(key, prior)];
    let cap = (1usize << shared.policy.page_cluster)
        .min(w.page.len() / PAGE_SIZE)
        .min(
            shared
                .limit
                .pages()
                .saturating_sub(shared.resident())
                .max(1),
        );
    let max = if restore {
        w.ra[0].window(addr, cap)
    } else if prior.is_none() {
        w.ra[1].window(addr, cap)
    } else {
        1
    };
    let end = st
        .mappers
        .iter()
        .find(|m| m.mm.id == mm.id && m.start <= addr && addr < m.end)
        .map_or(addr + PAGE_SIZE_U64, |m| m.end);
    while run.len() < max && addr + (run.len() as u64) * PAGE_SIZE_U64 < end {
        let k = key + run.len() as u64 * PAGE_SIZE_U64;
        match st.pages.pages.get(k) {
            q @ Some(Page::Evicted { .. }) if restore => run.push((k, q)),
            None if !restore => run.push((k, None)),
            _ => break,
        }
    }
    run
}

/// Reads the run's stored pages into `page` (zeros for the others), stretches of consecutive
/// slots together (one backend read, as for private memory: a page at a time, the restores of
/// the 602 MiB fill went to the disk page by page). Returns how many pages of the run to fill:
/// a read that comes up short ends the run there; `None` if its first page cannot be read
/// (the process is stopped rather than handed other bytes).
fn read_run(
    shared: &Shared,
    mm: &Mm,
    t: &Target,
    run: &[(u64, Option<Page>)],
    page: &mut [u8],
) -> Option<usize> {
    let slot_of = |q: Option<Page>| match q {
        Some(Page::Evicted { slot }) if slot != ZERO_SLOT => Some(slot),
        _ => None,
    };
    let mut n = run.len();
    let mut i = 0;
    while i < n {
        let Some(s0) = slot_of(run[i].1) else {
            page[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].fill(0);
            i += 1;
            continue;
        };
        let mut len = 1;
        while i + len < n && slot_of(run[i + len].1) == Some(s0 + len as u32) {
            len += 1;
        }
        match shared
            .tiers
            .read_run(s0, len, &mut page[i * PAGE_SIZE..(i + len) * PAGE_SIZE])
        {
            Ok((got, _)) if got >= 1 => {
                if got < len {
                    n = i + got; // the run ends after what was read
                }
                i += got;
            }
            Ok(_) | Err(_) if i > 0 => {
                n = i; // the run ends before it: its own fault reports it
                break;
            }
            r => {
                let e = r
                    .err()
                    .map_or_else(|| "nothing read".to_string(), |e| e.to_string());
                tracing::error!(
                    "cannot read back shared page {:#x} of inode {:?} from slot {s0}: {e}; \
                     stopping the process",
                    run[i].0,
                    t.inode.key
                );
                mm.kill();
                return None;
            }
        }
    }
    Some(n)
}

/// Fills `bytes` at `addr` through this mapper's uffd (a run the kernel refuses whole, into a
/// VMA the mapper does not know of, such as a PROT_NONE guard page split off after mmap: the
/// faulting page alone). Returns the pages filled, or `Err(done)` to return from the fault.
fn fill_run(
    shared: &Shared,
    mm: &Mm,
    p: &Pending,
    t: &Target,
    at: &At,
    bytes: &[u8],
) -> Result<usize, bool> {
    let At { key, addr, prior } = *at;
    match mm.uffd.copy_run_or_first(addr, bytes) {
        (_, f) if f > 0 => Ok(f),
        (Ok(Fill::Exists), _) => {
            // Present although the table held it evicted: filled behind the daemon's back.
            if matches!(prior, Some(Page::Evicted { .. })) {
                crate::shmem::note_filled_behind(shared, t.inode.key, key);
            }
            let _ = mm.uffd.wake(addr, PAGE_SIZE_U64);
            Ok(1)
        }
        (Ok(Fill::Again), _) => Err(false),
        (Ok(Fill::Gone), _) => {
            // The mapping went away (its UNMAP cleans up): the thread is woken to fault again
            // on what is there now, not left waiting for a fill that cannot come.
            let _ = mm.uffd.wake(addr, PAGE_SIZE_U64);
            Err(true)
        }
        (Ok(Fill::Filled), _) => Ok(1),
        (Err(e), _) => {
            if p.read_at.elapsed() < FILL_RETRY_MAX {
                return Err(false);
            }
            // As for private memory: a fill that keeps failing stops the process with a
            // message rather than leave a thread blocked for ever.
            tracing::error!(
                "filling shared page {addr:#x} of pid {:?} failed for {FILL_RETRY_MAX:?}: {e}; \
                 stopping the process",
                mm.pid()
            );
            mm.kill();
            Err(true)
        }
    }
}

/// The filled pages become resident in the inode's table; the streams learn the run; the other
/// mappers' write-protect markers of a restored run are lifted; the fault is counted.
fn commit_run(
    shared: &Shared,
    mm: &Mm,
    st: &mut InodeState,
    t: &Target,
    filled: &[(u64, Option<Page>)],
    at: &At,
    w: &mut Work,
) {
    let (addr, restore) = (at.addr, at.restore());
    let stats = &shared.stats;
    for (i, &(k, _)) in filled.iter().enumerate() {
        if let Some(old) = st.pages.pages.remove(k) {
            st.pages.release(shared, k, old);
        }
        // (Pages read ahead arrive young, not cold: a sequential reader comes to them next,
        // and as cold arrivals reclaim took them first, before any use: 288,429 of 307,321
        // read ahead went unused in the 602 MiB fill under 128M.)
        st.pages.make_resident(shared, k, Arrival::Fault, i == 0);
    }
    let n = filled.len();
    // This run is its stream's last (the next fault's window grows from it).
    w.ra[usize::from(!restore)].restored(addr, n);
    if restore {
        Stats::add(&stats.shmem_swapins, 1);
        Stats::add(&stats.swapins, 1);
        Stats::add(&stats.readahead_pages, n as u64 - 1);
        // The other mappers keep a write-protect marker from the eviction: lift it now (under
        // the lock, so no new batch protects meanwhile) rather than make each one's first
        // write a round trip, and a debugger's write through /proc/PID/mem fail.
        for m in st.mappers.iter() {
            if let Some((a, np)) = m.span(t.pgoff, n as u64) {
                if !(m.mm.id == mm.id && a == addr) {
                    let _ = m.mm.uffd.writeprotect(a, np * PAGE_SIZE_U64, false);
                }
            }
        }
    } else {
        Stats::add(&stats.shmem_zero_fills, 1);
        Stats::add(&stats.zero_fills, 1);
        Stats::add(&stats.fault_around_pages, n as u64 - 1);
    }
    Stats::add(&stats.faults, 1);
}
