//! Serving one fault, as a pipeline: classify it (the agent's region, a write-protect fault, a
//! missing page: wait, throttle or go on), restore the page (and its readahead run) from the
//! tiers or fill zeros (and fault-around), commit the new states to the page table, account.
use std::sync::atomic::Ordering;

use mglru::Arrival;

use crate::mm::{Mm, Page, ZERO_SLOT};
use crate::readahead::{self, Readahead};
use crate::shared::Shared;
use crate::stats::Stats;
use crate::sys::{self, Fill, PAGE_SIZE, PAGE_SIZE_U64};
use crate::tiers::{Tier, FOLIO_PAGES};

use super::*;

/// Adds the mapping around `addr`, a missing fault outside the ranges the table knows, to
/// them: the agent's `mmap` wrapper registers new mappings itself, before the scan sees them,
/// and what relies on the ranges (a fork child's wipe-on-fork and dont-fork pages, a hold's
/// restore, waking writers) must cover every page the table holds. A fault came through this
/// uffd, so the whole mapping is registered with it (registration is per mapping).
pub(super) fn learn_range(shared: &Shared, mm: &Mm, addr: u64) {
    let Some(pid) = mm.pid() else { return };
    let vma = {
        let mut maps = mm.maps.lock();
        if maps.as_ref().is_none_or(|(p, _)| *p != pid) {
            *maps = std::fs::File::open(format!("/proc/{pid}/maps"))
                .ok()
                .map(|f| (pid, f));
        }
        match maps.as_ref().map(|(_, f)| sys::vma_covering(f, addr)) {
            Some(Ok(v)) => v,
            // (Before Linux 6.11: the whole maps text.)
            Some(Err(e)) if e.raw_os_error() == Some(libc::ENOTTY) => {
                crate::maps::read_maps(pid).ok().and_then(|v| {
                    v.iter()
                        .find(|v| v.start <= addr && addr < v.end)
                        .map(|v| (v.start, v.end))
                })
            }
            _ => None,
        }
    };
    let Some((s, e)) = vma else { return };
    let mut st = mm.state.lock();
    // Never the agent's own region.
    for (ps, pe) in [(s, e.min(mm.region.0)), (s.max(mm.region.1), e)] {
        if ps >= pe {
            continue;
        }
        for (gs, ge) in st.uncovered(ps, pe) {
            st.add_range(gs, ge);
            Stats::add(&shared.stats.ranges_learned, 1);
        }
    }
}

/// Serves one fault. Returns false when it must be retried (`EAGAIN`).
pub(super) fn serve_fault(
    shared: &Shared,
    mm: &std::sync::Arc<Mm>,
    p: &mut Pending,
    w: &mut Work,
) -> bool {
    if mm.in_agent_region(p.address) {
        return serve_agent_region(shared, mm, p);
    }
    if let Some(t) = super::shmem::target(shared, mm, p.address) {
        return super::shmem::serve_shared(shared, mm, p, &t, w);
    }
    if p.flags & sys::UFFD_PAGEFAULT_FLAG_WP != 0 {
        return serve_write_protect(shared, mm, p, &mut w.ra[0]);
    }
    serve_missing(shared, mm, p, w)
}

/// A fault in the agent's region: the probe page (a forked child naming itself, `bind.rs`: it
/// waits in the fault until it is bound, or let go unbound), the agent thread naming itself
/// (the first scratch page, agent.c `agent_thread`), or any other page of the region: zeros.
fn serve_agent_region(shared: &Shared, mm: &Mm, p: &Pending) -> bool {
    let addr = p.address;
    if addr == mm.probe && !mm.agentless.load(Ordering::Acquire) {
        match crate::bind::probe_fault(shared, mm, p.ptid) {
            crate::bind::ProbeFault::NotYet => return false,
            crate::bind::ProbeFault::Served => return true,
            crate::bind::ProbeFault::Zero => {}
        }
    }
    if addr == mm.agent_name_page() && mm.agent_tid.swap(p.ptid, Ordering::Relaxed) != p.ptid {
        Stats::add(&shared.stats.agent_threads, 1);
    }
    match mm.uffd.zeropage(addr) {
        Ok(Fill::Again) => false,
        // (Present already, and UFFDIO_ZEROPAGE wakes nobody then.)
        Ok(Fill::Exists) => {
            let _ = mm.uffd.wake(addr, PAGE_SIZE_U64);
            true
        }
        _ => true,
    }
}

/// A write to a write-protected page: one mid-eviction waits for the eviction; one the access
/// source protected is an access; otherwise the protection is lifted.
fn serve_write_protect(shared: &Shared, mm: &Mm, p: &Pending, ra: &mut Readahead) -> bool {
    let stats = &shared.stats;
    let addr = p.address;
    Stats::add(&stats.wp_faults, 1);
    // Decide and lift under the state lock: reclaim marks a page Evicting under it before
    // protecting it, so a stale write-protect fault can never unprotect a page that a new
    // eviction has just protected.
    let mut st = mm.state.lock();
    match st.pages.get(addr) {
        Some(Page::Evicting { .. }) | Some(Page::Dropping { .. }) => {
            // The eviction in flight wakes this writer when it is done (see module docs):
            // after the drop it refaults and gets the stored copy; if kept, it is
            // unprotected.
            return true;
        }
        Some(Page::Resident { readahead, .. }) => {
            // Protection armed by the access source: this write is an access (and a use
            // of a page read ahead).
            let page = Page::Resident {
                referenced: true,
                readahead: false,
            };
            st.pages.insert(addr, page);
            Stats::add(&stats.wp_access_faults, 1);
            if readahead {
                Stats::add(&stats.readahead_hit_pages, 1);
                ra.record(1, 0);
            }
        }
        // A page that was `Dropping` and moved here (mremap): while a DROP is in flight the
        // agent may move whatever is at the old address, and mremap can bring this page
        // back there; a write now could be moved away with it after its copy was stored.
        // The writer waits until no DROP is in flight (the monitor wakes it then). Not the
        // agent's thread: it write-faults only when it unshares pages, after every move of
        // its DROP (agent.c, do_drop), so nothing of that DROP moves any more; and it
        // cannot wait for a DROP it is carrying out itself.
        Some(Page::Inherited { .. })
            if drop_in_flight(mm) && p.ptid != mm.agent_tid.load(Ordering::Relaxed) =>
        {
            mm.wp_waiters.store(true, Ordering::Release);
            return true;
        }
        _ => {}
    }
    let r = mm.uffd.writeprotect(addr, PAGE_SIZE_U64, false);
    drop(st);
    !matches!(r, Ok(Fill::Again))
}

/// What a missing fault may do now.
enum Gate {
    /// Be served.
    Go,
    /// Wait, answered: a DROP's settlement wakes it.
    Wait,
    /// Wait for reclaim to make room (retried).
    Throttle,
}

/// Whether a missing fault on a page now `prior` may be served.
fn gate(shared: &Shared, mm: &Mm, p: &Pending, prior: Option<Page>, agent: bool) -> Gate {
    // A page of a DROP in flight, moved out already: what it held when it moved need not be
    // what reclaim stored, since the kernel may have written it through a pin after reclaim
    // read it (an O_DIRECT read in flight, an io_uring buffer unregistered since), and only
    // the DROP's settlement, which reads the moved page back, knows. The fault waits for it,
    // as a write to such a page does (`settle_drop` wakes the batch's runs): the page is then
    // evicted (served from its slot, stored anew if it changed) or back in place (refused).
    if matches!(prior, Some(Page::Dropping { .. })) && !agent && !is_daemon_thread(mm, p.ptid) {
        Stats::add(&shared.stats.dropping_faults_held, 1);
        return Gate::Wait;
    }
    // A page of the DROP in flight that an event changed since (mremap put another page
    // there, or the program refilled it after a REMOVE): the agent may have moved that page
    // out, and the settlement puts it back (`reclaim::put_back_moved`). Until then the fault
    // waits rather than fill the address.
    if !agent && in_drop_runs(mm, p.address) && !is_daemon_thread(mm, p.ptid) {
        Stats::add(&shared.stats.dropping_faults_held, 1);
        return Gate::Wait;
    }
    // Throttle like the kernel's direct reclaim: at the limit, a fault that would add a
    // resident page waits (its thread is blocked in the kernel anyway) while reclaim makes
    // room; the handler keeps reading events meanwhile. Faults of the daemon's own threads
    // (reclaim reading a page the program just removed) are never held, since reclaim waits
    // for them, nor those of the agent's thread, since reclaim may be waiting for its answer
    // to a DROP (it touches no managed memory, so this is a second line of defence); and
    // when reclaim cannot make progress (every resident page is pinned or
    // shared after fork) faults go through rather than hang the program.
    if !prior.is_some_and(|p| p.is_resident())
        && shared.resident() >= shared.limit.pages()
        && !shared.reclaim_stalled()
        && p.read_at.elapsed() < THROTTLE_MAX
        && !agent
        && !is_daemon_thread(mm, p.ptid)
        && !(shared.injecting_tid.load(Ordering::Acquire) == p.ptid as i32
            && mm.pid() == Some(shared.injecting_pid.load(Ordering::Acquire)))
    {
        return Gate::Throttle;
    }
    Gate::Go
}

/// A missing fault: gate, readahead feedback, fill, commit, account.
fn serve_missing(shared: &Shared, mm: &Mm, p: &mut Pending, w: &mut Work) -> bool {
    let addr = p.address;
    let agent = p.ptid == mm.agent_tid.load(Ordering::Relaxed);
    if agent {
        Stats::add(&shared.stats.agent_faults, 1);
    }
    let mut st = mm.state.lock();
    if !st.in_ranges(addr) {
        drop(st);
        learn_range(shared, mm, addr);
        st = mm.state.lock();
    }
    let prior = st.pages.get(addr);
    match gate(shared, mm, p, prior, agent) {
        Gate::Go => {}
        Gate::Wait => return true,
        Gate::Throttle => {
            drop(st);
            throttle(shared, mm, p);
            return false;
        }
    }
    let restore = matches!(
        prior,
        Some(Page::Evicted { slot } | Page::Dropping { slot } | Page::Inherited { slot })
            if slot != ZERO_SLOT
    );
    if restore {
        p.stall(shared);
    }
    let max = 1usize << shared.policy.page_cluster;
    readahead_feedback(shared, &mut st, &mut w.ra[0], addr, prior, max, restore);
    let filled = match fill(shared, mm, &st, p, prior, w, max) {
        Ok(f) => f,
        Err(answer) => return answer,
    };
    commit(shared, &mut st, addr, prior, &filled);
    drop(st);
    account(shared, mm, p, &filled, w);
    shared.maybe_kick_reclaim();
    true
}

/// What this fault shows of pages read ahead (`readahead.rs`): it went past the pages of a
/// run of the stream it continues (a sequential reader read them on its way here: hits),
/// or, starting a stream, dropped one that left its last run behind (those still unused:
/// misses); and a message for a page already filled is a use of it (its thread touched it
/// while it was being read ahead). Hits clear the pages' readahead marks; both feed the
/// hit ratio that caps the window.
fn readahead_feedback(
    shared: &Shared,
    st: &mut crate::mm::MmState,
    ra: &mut Readahead,
    addr: u64,
    prior: Option<Page>,
    max: usize,
    restore: bool,
) {
    let o = ra.observe(addr, max, restore);
    let mut hits = readahead::pages(&o.passed)
        .filter(|&a| st.readahead_used(a))
        .count() as u64;
    let misses = readahead::pages(&o.left)
        .filter(|&a| {
            matches!(
                st.pages.get(a),
                Some(Page::Resident {
                    readahead: true,
                    ..
                })
            )
        })
        .count() as u64;
    if let Some(Page::Resident {
        readahead: true, ..
    }) = prior
    {
        hits += u64::from(st.readahead_used(addr));
    }
    if hits > 0 {
        Stats::add(&shared.stats.readahead_hit_pages, hits);
    }
    ra.record(hits, misses);
}

/// What a fault filled: the pages restored from the fault address on (more than one with
/// readahead) with their old states, or the never-written pages filled with zeros
/// (fault-around), and the tier the restore read.
struct Filled {
    run: Vec<(u64, Page)>,
    zero_run: usize,
    tier: Option<Tier>,
}

/// Fills the faulting page (and its readahead or fault-around run). `Err` is the fault's
/// answer when nothing is to be committed: false to retry it, true when it is done (stale,
/// gone, or its process stopped).
fn fill(
    shared: &Shared,
    mm: &Mm,
    st: &crate::mm::MmState,
    p: &Pending,
    prior: Option<Page>,
    w: &mut Work,
    max: usize,
) -> Result<Filled, bool> {
    let Work {
        page, zeros, ra, ..
    } = w;
    let addr = p.address;
    let write = p.flags & sys::UFFD_PAGEFAULT_FLAG_WRITE != 0;
    let mut filled = Filled {
        run: Vec::new(),
        zero_run: 1,
        tier: None,
    };
    let cx = FillCx {
        shared,
        mm,
        st,
        p,
        max,
    };
    let (fill, n) = match prior {
        Some(Page::Evicted { slot })
        | Some(Page::Dropping { slot })
        | Some(Page::Inherited { slot })
            if slot != ZERO_SLOT =>
        {
            fill_restore(&cx, prior, slot, page, &mut ra[0], &mut filled)?
        }
        None => fill_zeros(&cx, zeros, &mut ra[1], &mut filled),
        // Evicted as zeros, or tracked as present but missing: the kernel dropped it behind
        // our back (for example a MADV_FREE page it reclaimed after the REMOVE we already
        // applied). Its contents are zeros by the kernel's own rules.
        Some(_) => zero_page(mm, addr, write, zeros),
    };
    // A readahead run that stopped part way still filled the faulting page.
    let fill = if filled.run.len() > 1 && n >= 1 {
        filled.run.truncate(n);
        Ok(Fill::Filled)
    } else {
        fill
    };
    match fill {
        Ok(Fill::Filled) => Ok(filled),
        Ok(Fill::Again) => Err(false),
        Ok(Fill::Gone) => {
            // The mapping went away (the UNMAP event cleans up); let the thread retry, so that
            // it sees the new layout instead of waiting for a fill that cannot come.
            let _ = mm.uffd.wake(addr, PAGE_SIZE_U64);
            Err(true)
        }
        // The page is present: this message is stale (two threads faulted on the page, or a
        // waiter was woken and faulted again). Change nothing: in particular a `Dropping` page
        // is about to be moved out, and its stored copy must stay.
        Ok(Fill::Exists) => {
            // Woken all the same: a page can arrive at the address by another way than our
            // fill (mremap moves one there), and then nobody else wakes a waiter.
            let _ = mm.uffd.wake(addr, PAGE_SIZE_U64);
            Err(true)
        }
        Err(e) => {
            // Transient (ENOMEM under pressure): retry. A fill that keeps failing would leave
            // the thread blocked for ever: stop the process with a message instead.
            if p.read_at.elapsed() < FILL_RETRY_MAX {
                return Err(false);
            }
            tracing::error!(
                "filling page {addr:#x} of pid {:?} failed for {:?}: {e}; stopping the process",
                mm.pid(),
                FILL_RETRY_MAX
            );
            mm.kill();
            Err(true)
        }
    }
}

/// What a fill reads: the daemon, the address space and its table (locked by the caller), the
/// fault, and the most pages a run may fill.
struct FillCx<'a> {
    shared: &'a Shared,
    mm: &'a Mm,
    st: &'a crate::mm::MmState,
    p: &'a Pending,
    max: usize,
}

/// A page with a stored copy: restored, with a readahead run of the evicted pages after it
/// (only of pages known missing, and only with room under the limit). Returns the copy's
/// outcome and the pages filled; `Err(true)` if the copy cannot be read (the process is
/// stopped rather than handed wrong bytes).
fn fill_restore(
    cx: &FillCx<'_>,
    prior: Option<Page>,
    slot: u32,
    page: &mut [u8],
    ra: &mut Readahead,
    filled: &mut Filled,
) -> Result<(std::io::Result<Fill>, usize), bool> {
    let FillCx {
        shared,
        mm,
        st,
        p,
        max,
    } = *cx;
    let addr = p.address;
    // Readahead only of pages known missing, and only with room under the limit.
    let mut window = if matches!(prior, Some(Page::Evicted { .. })) {
        ra.window(addr, max)
    } else {
        1
    };
    if shared.resident() + window > shared.limit.pages() {
        window = 1;
    }
    filled.run.push((addr, Page::Evicted { slot }));
    for i in 1..window as u64 {
        let a = addr + i * PAGE_SIZE_U64;
        match st.pages.get(a) {
            Some(q @ Page::Evicted { .. }) => filled.run.push((a, q)),
            _ => break,
        }
    }
    // (Under the state lock. Dropping it for the read and the copy of an `Evicted`
    // page is possible, since only this thread changes an evicted page, but measured
    // no better: reclaim then takes the lock between each fault's copy and its
    // bookkeeping, and the handler waits for a choice of victims.)
    Ok(match restore_run(shared, mm, addr, &mut filled.run, page) {
        Ok((r, t)) => {
            filled.tier = Some(t);
            r
        }
        Err(e) => {
            // The stored copy cannot be read: never hand the program wrong bytes.
            tracing::error!(
                "cannot read back page {addr:#x} of pid {:?} from slot {slot}: {e}; \
                 stopping the process",
                mm.pid()
            );
            mm.kill();
            return Err(true);
        }
    })
}

/// Never-written memory: zeros, with fault-around on a sequential pattern. Returns the fill's
/// outcome and the pages filled.
fn fill_zeros(
    cx: &FillCx<'_>,
    zeros: &[u8],
    ra: &mut Readahead,
    filled: &mut Filled,
) -> (std::io::Result<Fill>, usize) {
    let FillCx {
        shared,
        mm,
        st,
        p,
        max,
    } = *cx;
    let addr = p.address;
    let write = p.flags & sys::UFFD_PAGEFAULT_FLAG_WRITE != 0;
    // Fault-around of never-written memory on a sequential pattern (the kernel's
    // anonymous mTHP does the same with a 64 KiB folio on the first touch): the
    // window grows like readahead's, and a run stops at the first page the table
    // knows. UFFDIO_COPY never overwrites a present page, and a run that leaves the
    // VMA fails as a whole and falls back to the faulting page.
    let mut window = ra.window(addr, max);
    if shared.resident() + window > shared.limit.pages() {
        window = 1;
    }
    let mut n = 1;
    while n < window && !st.pages.contains(addr + n as u64 * PAGE_SIZE_U64) {
        n += 1;
    }
    if n > 1 {
        match mm.uffd.copy_run_or_first(addr, &zeros[..n * PAGE_SIZE]) {
            (r, 0) => (r, 1),
            // k pages were filled (maybe not all n: a run stops at a present page or
            // when an event is queued): they are resident whatever the status says.
            (_, k) => {
                filled.zero_run = k;
                (Ok(Fill::Filled), k)
            }
        }
    } else {
        zero_page(mm, addr, write, zeros)
    }
}

/// One page of zeros: mapped read-only from the zero page for a read, copied for a write.
fn zero_page(mm: &Mm, addr: u64, write: bool, zeros: &[u8]) -> (std::io::Result<Fill>, usize) {
    if write {
        (mm.uffd.copy(addr, &zeros[..PAGE_SIZE]), 1)
    } else {
        (mm.uffd.zeropage(addr), 1)
    }
}

/// Reads the stored copies of `run` (from `addr` on) and copies them in. Stretches of
/// consecutive slots are read together (`Tiers::read_run`: one backend read for a folio
/// written as one); zero pages are filled here. The first page's failure is the error; a later
/// one ends the run before it. Returns the copy's outcome and the tier the first read came
/// from.
#[allow(clippy::type_complexity)]
fn restore_run(
    shared: &Shared,
    mm: &Mm,
    addr: u64,
    run: &mut Vec<(u64, Page)>,
    page: &mut [u8],
) -> std::io::Result<((std::io::Result<Fill>, usize), Tier)> {
    let mut n = 0;
    let mut t = None;
    while n < run.len() {
        let Page::Evicted { slot: s } = run[n].1 else {
            break;
        };
        if s == ZERO_SLOT {
            page[n * PAGE_SIZE..(n + 1) * PAGE_SIZE].fill(0);
            n += 1;
            continue;
        }
        let mut m = n + 1;
        while m < run.len()
            && run[m].1
                == (Page::Evicted {
                    slot: s.wrapping_add((m - n) as u32),
                })
        {
            m += 1;
        }
        // The faulting page, read with the others of its batch (`prefetch.rs`).
        if n == 0 {
            if let Some(p) = super::prefetch::take(addr, s) {
                page[..PAGE_SIZE].copy_from_slice(&p);
                shared.tiers.count_backend_read();
                t = Some(Tier::Backend);
                n = 1;
                continue;
            }
        }
        match shared.tiers.read_run(s, m - n, &mut page[n * PAGE_SIZE..]) {
            Ok((k, tier)) => {
                t.get_or_insert(tier);
                n += k;
                if n < m {
                    break;
                }
            }
            Err(e) if n == 0 => return Err(e),
            Err(_) => break,
        }
    }
    let t = t.unwrap_or(Tier::Backend);
    run.truncate(n);
    let r = mm.uffd.copy_run_or_first(addr, &page[..n * PAGE_SIZE]);
    if r.1 <= 1 {
        run.truncate(1);
    }
    Ok((r, t))
}

/// The page table after a fill: the faulting page resident (referenced), the rest of a
/// readahead run resident and marked read ahead, a fault-around run resident and cold.
fn commit(
    shared: &Shared,
    st: &mut crate::mm::MmState,
    addr: u64,
    prior: Option<Page>,
    f: &Filled,
) {
    if let Some(old) = prior {
        // (Unchanged: the state lock was held since `prior` was read.)
        if let Some(now) = st.pages.remove(addr) {
            debug_assert!(
                now == old || now.is_resident(),
                "{addr:#x}: {old:?} became {now:?}"
            );
            st.release(shared, addr, now);
        }
    }
    st.make_resident(shared, addr, Arrival::Fault, true);
    for &(a, old) in f.run.iter().skip(1) {
        if let Some(now) = st.pages.remove(a) {
            debug_assert_eq!(now, old, "{a:#x} changed while it was restored");
            st.release(shared, a, now);
        }
        st.add_readahead(shared, a);
    }
    for i in 1..f.zero_run as u64 {
        st.make_resident(shared, addr + i * PAGE_SIZE_U64, Arrival::Cold, false);
    }
}

/// Counts a served fault: what it moved, from which tier, how long it took, and (1 in 256)
/// where its thread ran.
fn account(shared: &Shared, mm: &Mm, p: &Pending, f: &Filled, w: &mut Work) {
    let Work { served, ra, .. } = w;
    let stats = &shared.stats;
    let addr = p.address;
    let ns = p.read_at.elapsed().as_nanos() as u64;
    Stats::add(&stats.faults, 1);
    if !f.run.is_empty() {
        Stats::add(&stats.swapins, 1);
        Stats::add(&stats.bytes_read, PAGE_SIZE_U64 * f.run.len() as u64);
        Stats::add(&stats.readahead_pages, f.run.len() as u64 - 1);
        if f.run.len() == FOLIO_PAGES && addr % (FOLIO_PAGES as u64 * PAGE_SIZE_U64) == 0 {
            Stats::add(&stats.swpin_folios, 1);
        }
        ra[0].restored(addr, f.run.len());
        match f.tier {
            Some(Tier::Zswap) => {
                Stats::add(&stats.fault_zswap, 1);
                Stats::add(&stats.fault_zswap_ns, ns);
                shared.lat_zswap.record(ns);
            }
            _ => {
                Stats::add(&stats.fault_backend, 1);
                Stats::add(&stats.fault_backend_ns, ns);
                shared.lat_backend.record(ns);
            }
        }
    } else {
        Stats::add(&stats.zero_fills, 1);
        Stats::add(&stats.fault_around_pages, f.zero_run as u64 - 1);
        ra[1].restored(addr, f.zero_run);
        shared.lat_zero.record(ns);
    }
    Stats::add(&stats.fault_service_ns, ns);
    *served += 1;
    // Sample where the faulting thread ran, against where we run: a read of /proc (tens of
    // microseconds), so 1 fault in 256.
    if *served % 256 == 0 {
        note_cpu(shared, mm, p, f.run.len() == 1);
    }
}

/// Where the faulting thread last ran, against where the handler runs: counted, and with
/// `[fault] spread`, the handler steps aside from the client's CPU.
fn note_cpu(shared: &Shared, mm: &Mm, p: &Pending, one_page: bool) {
    let stats = &shared.stats;
    let (Some(pid), Some(tid)) = (mm.pid(), crate::bind::thread_of_fault(mm, p.ptid)) else {
        return;
    };
    let Some(cpu) = sys::thread_last_cpu(pid, tid as u32) else {
        return;
    };
    Stats::add(&stats.faults_cpu_known, 1);
    let here = sys::current_cpu();
    if cpu == here {
        Stats::add(&stats.faults_local_cpu, 1);
        // `[fault] spread`: the fill woke the client onto this CPU, where each of its faults
        // now waits for the handler to finish the previous one (placement is sticky: a woken
        // thread goes back to the CPU it last ran on). Step aside to another CPU, so that the
        // next wakeup finds the client's CPU idle. Only after a restore of one page (random
        // access): a sequential stream's restores are runs, so it rarely gets here (0 to 4
        // moves in a run, measured), and it suits a handler and a client that take turns on
        // one CPU while reclaim has the other.
        if shared.policy.fault_spread && one_page && sys::move_off_cpu(here) {
            Stats::add(&stats.handler_moves, 1);
        }
    }
}

/// Whether `addr` is in a run of the agent's DROP in flight (`Mm::drop_runs`).
fn in_drop_runs(mm: &Mm, addr: u64) -> bool {
    let page = addr & !(PAGE_SIZE_U64 - 1);
    mm.drop_runs
        .lock()
        .iter()
        .any(|&(s, n)| s <= page && page < s + n as u64 * PAGE_SIZE_U64)
}

/// Whether reclaim may have a DROP to this address space's agent in flight: it holds the agent
/// lock for a batch (a try, never a wait: the handler must not wait for reclaim), or a DROP is
/// outstanding.
pub(super) fn drop_in_flight(mm: &Mm) -> bool {
    match mm.agent.try_lock() {
        None => true,
        Some(g) => g.as_ref().is_some_and(|a| a.pending.is_some()),
    }
}

/// A fault that adds a page at the limit waits for reclaim: counted, its wait begun, reclaim
/// kicked; the handler retries it when reclaim has made room (`Mm::retry`). The caller has let
/// go of its table's lock.
pub(super) fn throttle(shared: &Shared, mm: &Mm, p: &mut Pending) {
    mm.throttled.store(true, Ordering::Release);
    Stats::add(&shared.stats.throttled_faults, 1);
    p.stall(shared);
    shared.kick_reclaim();
}
