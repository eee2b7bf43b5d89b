//! Holding a process's memory in RAM while the kernel reads it for someone else: a core dump
//! or a debugger.
//!
//! The kernel reads a process's memory without a userfault in two places (6.18):
//!
//! * a core dump (`dump_user_range` → `get_dump_page`) walks the pages with `FOLL_DUMP`, which
//!   takes an empty page table entry in anonymous memory for a hole (`no_page_table`): an
//!   evicted page, which is simply not mapped, is written as zeros (and `handle_userfault`
//!   serves nothing to a task with `PF_DUMPCORE` anyway);
//! * `/proc/PID/mem` and ptrace's `PEEKDATA`/`POKEDATA` (`__access_remote_vm` →
//!   `get_user_pages_remote` without `locked`, so without `FAULT_FLAG_ALLOW_RETRY`), which
//!   `handle_userfault` answers with `VM_FAULT_SIGBUS` instead of waiting for the daemon: `EIO`
//!   for an evicted page, and for one never touched in a registered range. (`process_vm_readv`
//!   pins with `locked` and waits for the daemon: it works.)
//!
//! So the daemon *holds* such a process: no eviction of it in flight or starting (its agent
//! slot), every page it evicted brought back (`UFFDIO_COPY` from the store), its memory
//! unregistered (a page never touched is then the kernel's to fill, for a debugger's read or
//! write as for the program's) and its pages forgotten. Its memory is outside the limit while
//! held, counted by the census (`unmanaged_traced_bytes`, `unmanaged_dumping_bytes`).
//!
//! * **Before a core dump** the agent's handler of the core-dumping signals the program leaves
//!   at their default action asks ([`HOLD_DUMP`]) when a core would be written, then restores
//!   the default action and raises the signal again (agent.c). The hold lasts until the
//!   process is gone.
//! * **While traced**: a tracer that has the agent asks before `PTRACE_ATTACH` or
//!   `PTRACE_SEIZE` ([`HOLD_TRACE`]; the attach waits for the answer, so nothing is read
//!   before the pages are back); a tracer from outside the tree is seen in the `TracerPid` the
//!   scanner reads with `RssAnon` every 2 ms ([`note_tracer`]), and a process traced from its
//!   start (`gdb PROGRAM`) at its greeting ([`at_greeting`]). A tracer from outside therefore
//!   reads `EIO` for evicted pages during the few milliseconds between its attach and the
//!   hold. The hold ends when no thread of the process is traced any more (and no sooner than
//!   a second after a tracer's agent asked, in case its attach failed): the ranges let go are
//!   registered again at the next scan and paged as before (`trace_releases`).
//!
//! * **While it has its own memory file open**: the agent's `open`/`openat` wrappers ask
//!   ([`HOLD_SELF_MEM`]) before a path naming the process's own `/proc/PID/mem` opens; the
//!   hold ends when no descriptor of the process names a memory file ([`note_self_mem`]).
//!
//! A hold brings back what fits in `MemAvailable` less a sixteenth of RAM, registered range by
//! registered range; a range that does not fit stays registered with its pages stored, said
//! and counted (`hold_pages_kept_evicted`): a core file holds zeros there and a debugger reads
//! `EIO`, as before. (The kernel's own swap brings a dumped page in one at a time; the daemon
//! cannot, the dump never faults.) A range with a page of a DROP still outstanding (its agent
//! stopped mid-DROP by the very tracer) is kept until the DROP settles, since the agent may
//! still move any page of it: then the next try lets it go.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::space::{self, Unregister};
use crate::maps;
use crate::mm::{is_held, HoldState};
use crate::mm::{Mm, Page};
use crate::shared::Shared;
use crate::stats::Stats;
use crate::sys::PAGE_SIZE_U64;
use crate::unmanaged::Kind;
pub(crate) use crate::wire::{HOLD_DUMP, HOLD_SELF_MEM, HOLD_TRACE};

/// How long a request waits for an eviction of the process in flight (a batch holds the agent
/// slot until its DROP is answered or times out).
const REQUEST_WAIT: Duration = Duration::from_secs(10);

/// How long after a tracer's agent asked a hold stays, traced or not: its attach comes after
/// the answer (or failed).
const ASK_GRACE: Duration = Duration::from_secs(1);

/// How often the scanner tries again to complete a hold (a range kept for want of memory or
/// behind a DROP in flight) or to end one (every thread's status read).
const RETRY: Duration = Duration::from_millis(100);

/// The census's kind for the memory of a held process.
pub(crate) fn census_kind(mm: &Mm) -> Option<Kind> {
    let held = mm.held.load(Ordering::Relaxed);
    if held & HOLD_DUMP != 0 {
        Some(Kind::Dumping)
    } else if held & (HOLD_TRACE | HOLD_SELF_MEM) != 0 {
        // (A process reading its own memory file is inspecting itself: counted as traced.)
        Some(Kind::Traced)
    } else {
        None
    }
}

fn own_pid() -> i32 {
    crate::sys::getpid()
}

/// A `HOLD` from `sender`'s agent, for the process `pid` names (0: the sender). A process asks
/// a dump hold only for itself; a trace hold for any process of the tree (it is about to
/// attach to it: the kernel checks that it may). `pid` is a number of the sender's own pid
/// namespace, looked up there (`bind::pid_named_by`): in a namespace below the daemon's it
/// names another process in the daemon's.
pub(crate) fn request(shared: &Shared, sender: i32, pid: u32, reason: u32) -> io::Result<()> {
    let target = match pid {
        0 => Some(sender),
        p => crate::bind::pid_named_by(shared, sender, i32::try_from(p).unwrap_or(-1)),
    };
    if reason != HOLD_TRACE && target != Some(sender) {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    // Not managed (or not one the number can be shown to name: a tracer from outside is seen
    // in `TracerPid` anyway): nothing of it is evicted or registered.
    let Some(mm) = target.and_then(|t| space::live_mm(shared, t)) else {
        return Ok(());
    };
    // (Before the mark: the scanner ends neither hold within `ASK_GRACE` of the ask. A tracer
    // attaches after the answer, and a process opens its memory file after it: until then
    // the scanner would see it untraced, or with no such file open, and end the hold under
    // the restore.)
    if reason == HOLD_TRACE || reason == HOLD_SELF_MEM {
        mm.hold.lock().asked = Some(Instant::now());
    }
    hold(shared, &mm, reason, REQUEST_WAIT)
}

/// Registers the new memory of `mm` (`space::scan_and_register`); false if the address space
/// is gone. A held process's new registrations (new mappings, and those the agent's mmap
/// wrapper registered) are the kernel's again at once.
pub(crate) fn scan_and_register(shared: &Shared, mm: &Mm) -> bool {
    if !space::scan_and_register(shared, mm) {
        return false;
    }
    if is_held(mm) {
        let _ = bring_back(shared, mm, Duration::ZERO);
    }
    true
}

/// Holds `mm` for `reason`: marks it (no batch starts from then on), then lets its memory go,
/// waiting up to `wait` for a batch in flight.
pub(crate) fn hold(shared: &Shared, mm: &Mm, reason: u32, wait: Duration) -> io::Result<()> {
    mark(shared, mm, reason);
    // The scan registers what it finds unregistered (new mappings, and those the agent's mmap
    // wrapper registered, which the daemon may not have in its table yet: registering them
    // again tells them from a program's own userfaultfd's) and lets go of what it registered.
    if !space::scan_and_register(shared, mm) {
        return Ok(()); // it exec'd an image without the agent: this address space is gone
    }
    bring_back(shared, mm, wait)?;
    if reason == HOLD_DUMP {
        tracing::info!(
            "pid {} dumps core: {} KiB of its evicted memory brought back for the \
             core file",
            mm.pid().unwrap_or(0),
            (mm.hold.lock().restored * PAGE_SIZE_U64) >> 10
        );
    }
    Ok(())
}

/// Marks `mm` held for `reason`, counted and said the first time.
fn mark(shared: &Shared, mm: &Mm, reason: u32) {
    let before = mm.held.fetch_or(reason, Ordering::AcqRel);
    if before & reason != 0 {
        return;
    }
    let pid = mm.pid().unwrap_or(0);
    if reason == HOLD_DUMP {
        Stats::add(&shared.stats.held_for_dump, 1);
    } else if reason == HOLD_SELF_MEM {
        Stats::add(&shared.stats.held_for_self_mem, 1);
        tracing::warn!(
            "pid {pid} opens its own memory file: its evicted pages are brought back \
             and it is not paged while it keeps one open (counted in unmanaged_traced_bytes)"
        );
    } else {
        Stats::add(&shared.stats.held_for_trace, 1);
        tracing::warn!(
            "pid {pid} is traced: its evicted pages are brought back and it is not \
             paged while traced (its memory is counted in unmanaged_traced_bytes)"
        );
    }
}

/// Lets go of every registered range of a held `mm` that it can: brings back its evicted
/// pages, unregisters it, forgets its pages, refuses it until the hold ends. Waits up to
/// `wait` for an eviction in flight (`EAGAIN` after). Returns the pages brought back.
pub(crate) fn bring_back(shared: &Shared, mm: &Mm, wait: Duration) -> io::Result<u64> {
    let mut h = mm.hold.lock();
    if !is_held(mm) {
        return Ok(0);
    }
    // No batch in flight, none starting: a batch holds the agent slot to its end, and one that
    // starts sees the mark.
    let Some(_agent) = mm.agent.try_lock_for(wait) else {
        return Err(io::Error::from_raw_os_error(libc::EAGAIN));
    };
    let ranges = mm.state.lock().ranges.clone();
    let (avail, total) = maps::mem_available().unwrap_or((u64::MAX, 0));
    let mut budget = avail.saturating_sub(total / 16) / PAGE_SIZE_U64;
    let (mut restored, mut kept, mut behind_drop) = (0u64, 0u64, 0usize);
    for (s, e) in ranges {
        let (stored, dropping) = {
            let st = mm.state.lock();
            let mut stored = 0u64;
            let mut dropping = false;
            for (_, p) in st.pages.range(s..e) {
                dropping |= matches!(p, Page::Dropping { .. });
                stored += u64::from(p.slot().is_some());
            }
            (stored, dropping)
        };
        if dropping {
            // A DROP is outstanding (its agent stopped mid-DROP): any of these pages may still
            // move out, and a page that moves out of memory the daemon let go is lost.
            behind_drop += 1;
            continue;
        }
        if stored > budget {
            kept += stored;
            continue;
        }
        budget -= stored;
        let (_, r) = space::restore_and_step_aside(shared, mm, s, e, Unregister::Parts)?;
        restored += r;
        mm.state.lock().hold_let_go.push((s, e));
    }
    // Shared anonymous memory it maps: written back into the inodes, none evicted while held.
    restored += shared
        .shmem
        .write_back(shared, mm, 0, crate::wire::USER_END, false)?;
    h.done = kept == 0 && behind_drop == 0;
    h.restored += restored;
    Stats::add(&shared.stats.hold_pages_restored, restored);
    if kept > 0 {
        Stats::add(&shared.stats.hold_pages_kept_evicted, kept);
        if !h.said_kept {
            h.said_kept = true;
            tracing::warn!(
                "pid {}: {} KiB of its evicted memory stay evicted, more than the \
                 machine has available (MemAvailable less a sixteenth of RAM): a core file holds \
                 zeros there and a debugger cannot read it (hold_pages_kept_evicted)",
                mm.pid().unwrap_or(0),
                (kept * PAGE_SIZE_U64) >> 10
            );
        }
    }
    Ok(restored)
}

/// A process greets traced (a tracer that started it, or followed its parent's fork): held
/// from the start, before the caller's scan registers anything.
pub(crate) fn at_greeting(shared: &Shared, mm: &Mm, pid: i32) {
    if let Some((_, tracer)) = maps::rss_and_tracer(pid) {
        if tracer != 0 && tracer != own_pid() {
            mark(shared, mm, HOLD_TRACE);
        }
    }
}

/// The scanner read `tracer` in the `TracerPid` of `pid` (its main thread): a tracer that came
/// holds the process (on a thread of its own: bringing pages back takes a while), one that
/// left ends the hold once no thread is traced.
pub(crate) fn note_tracer(shared: &Arc<Shared>, mm: &Arc<Mm>, pid: i32, tracer: i32) {
    let traced = tracer != 0 && tracer != own_pid();
    let held = mm.held.load(Ordering::Acquire);
    if !traced && held & HOLD_TRACE == 0 {
        return;
    }
    if mm.holding.load(Ordering::Acquire) {
        return; // a hold is under way
    }
    let Some(mut h) = mm.hold.try_lock() else {
        return;
    };
    let due = h.tried.is_none_or(|t| t.elapsed() >= RETRY);
    if traced {
        if held & HOLD_TRACE != 0 && (h.done || !due) {
            return;
        }
        h.tried = Some(Instant::now());
        drop(h);
        if mm.holding.swap(true, Ordering::AcqRel) {
            return;
        }
        let (s, m) = (Arc::clone(shared), Arc::clone(mm));
        let spawned = std::thread::Builder::new()
            .name("uffd-hold".into())
            .spawn(move || {
                if let Err(e) = hold(&s, &m, HOLD_TRACE, REQUEST_WAIT) {
                    tracing::debug!("pid {pid}: holding it for its tracer: {e}");
                }
                m.holding.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            mm.holding.store(false, Ordering::Release);
        }
        return;
    }
    // Not traced (its main thread): the hold ends when no thread is, unless a dump holds it.
    if held & HOLD_DUMP != 0 || !due || h.asked.is_some_and(|t| t.elapsed() < ASK_GRACE) {
        return;
    }
    h.tried = Some(Instant::now());
    let me = own_pid();
    if maps::thread_tracers(pid).iter().any(|&t| t != me) {
        return;
    }
    Stats::add(&shared.stats.trace_releases, 1);
    if end_hold(mm, &mut h, HOLD_TRACE) {
        tracing::debug!("pid {pid} is no longer traced: its memory is paged again");
    }
}

/// Ends the `reason` of a hold; if no other holds the process, its memory is paged again (the
/// ranges let go are registered at the scanner's next tick). True if the hold is over.
fn end_hold(mm: &Mm, h: &mut HoldState, reason: u32) -> bool {
    let before = mm.held.fetch_and(!reason, Ordering::AcqRel);
    if before & !reason != 0 {
        return false;
    }
    {
        let mut st = mm.state.lock();
        for (s, e) in std::mem::take(&mut st.hold_let_go) {
            st.unrefuse(s, e);
        }
    }
    h.done = false;
    h.asked = None;
    h.restored = 0;
    mm.last_scan_tick.store(0, Ordering::Relaxed);
    true
}

/// The scanner's check of a process held for its own memory file (`HOLD_SELF_MEM`): the hold
/// ends when no descriptor of the process names a memory file, checked every [`RETRY`].
pub(crate) fn note_self_mem(shared: &Shared, mm: &Mm, pid: i32) {
    if mm.held.load(Ordering::Acquire) & HOLD_SELF_MEM == 0 || mm.holding.load(Ordering::Acquire) {
        return;
    }
    let Some(mut h) = mm.hold.try_lock() else {
        return;
    };
    if h.tried.is_some_and(|t| t.elapsed() < RETRY)
        || h.asked.is_some_and(|t| t.elapsed() < ASK_GRACE)
    {
        return;
    }
    h.tried = Some(Instant::now());
    if maps::has_mem_file_open(pid) {
        return;
    }
    Stats::add(&shared.stats.self_mem_releases, 1);
    if end_hold(mm, &mut h, HOLD_SELF_MEM) {
        tracing::debug!("pid {pid} closed its memory file: its memory is paged again");
    }
}
