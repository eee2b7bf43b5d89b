//! Which process an address space is: forked children bound to their pids, and the pid
//! namespaces of the tree.
//!
//! The kernel hands the daemon a forked child's userfaultfd (`UFFD_EVENT_FORK`) but not its
//! pid. A number from the child cannot be trusted to name it: the thread id of a userfaultfd
//! message is given in the faulting task's own pid namespace (`fs/userfaultfd.c`,
//! `userfault_msg`: `task_pid_vnr(current)`), so a child after `unshare -pf` says 1, after
//! `bwrap --unshare-pid` 2, numbers that name other processes (init, `kthreadd`, or anything)
//! in the daemon's namespace. So a child is bound only to a process that is shown to hold
//! its address space:
//!
//! ```text
//! probe fault (agent child, in atfork) or FORK event (agentless child)
//!   ─▶ 16 random bytes into the child's probe page with UFFDIO_COPY through its uffd
//!      (only that address space can hold them; an agent child's fault is left asleep:
//!      UFFDIO_COPY_MODE_DONTWAKE)
//!   ─▶ candidates: processes of the daemon's tree that no live address space names, whose
//!      own namespace numbers them as the fault's thread id (the last field of `NStgid`):
//!      the id itself if it is a tree process of the daemon's namespace, then the children
//!      of the forking process, then the whole tree
//!   ─▶ each: pidfd_open, the probe page present (pagemap) and holding the bytes
//!      (/proc/PID/mem), the pidfd still alive: the number named that process throughout
//!   ─▶ bound: the pidfd kept; the fork's wipe-on-fork and dont-fork fix-up read from its
//!      smaps while it still waits in the fault; then it is woken
//! ```
//!
//! The bytes are the proof, the thread id only narrows the search: a namespace cannot be
//! matched ahead of time (a child made by `clone(CLONE_NEWPID)` is the first process of a
//! namespace that did not exist at the fork), while only the child's own address space can
//! hold what the daemon wrote through the child's uffd. A child not found within
//! [`HOLD_PROBE_FAULT`] is woken unbound (faults served, nothing evicted, said) and can still
//! be bound when its agent greets (the peer's credentials name it; the bytes prove it). Nothing
//! is ever bound, read through `/proc` or signalled on a bare number from a client or a uffd
//! message: a pid the daemon acts on comes from the kernel's translation (a socket's peer
//! credentials, `/proc` of the daemon's own namespace) and is in the daemon's tree, and every
//! signal goes through a pidfd.
//!
//! Thread ids of a process in a pid namespace below the daemon's are compared in that
//! namespace (the agent thread's id and the faults' ids both come from uffd messages), and
//! translated to the daemon's numbers where the daemon reads `/proc` of a thread
//! ([`thread_of_fault`]).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::maps;
use crate::maps::{in_tree, me};
use crate::mm::{BindToken, Mm};
use crate::shared::Shared;
use crate::stats::Stats;
use crate::sys::{self, Fill, PidFd, PAGE_SIZE, PAGE_SIZE_U64};

/// How long a forked child's probe fault is held while the daemon looks for its process (the
/// child waits in its fork meanwhile): then it is let go unbound.
pub(crate) const HOLD_PROBE_FAULT: Duration = Duration::from_millis(500);

/// Least time between two searches of the tree for one child.
const SEARCH_EVERY: Duration = Duration::from_millis(20);

/// What became of a probe fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeFault {
    /// Bound to its process (or let go unbound, said): the fault is served.
    Served,
    /// Not found yet: the fault waits and is tried again.
    NotYet,
    /// Not a fault this module serves (an address space bound already whose probe page the
    /// daemon never wrote): the caller maps the zero page.
    Zero,
}

/// The pid namespace of `mm`'s process (`pid`): whether the thread ids of its uffd messages
/// are the daemon's numbers.
pub(crate) fn note_pid_namespace(mm: &Mm, pid: i32) {
    mm.foreign_pidns
        .store(maps::ns_tgids(pid).len() > 1, Ordering::Release);
}

/// The daemon's number of the thread of `mm`'s process that a uffd message names `ptid`, if
/// the process has such a thread. For a process of the daemon's own pid namespace the number
/// is the same; below it, its threads are looked up by their own namespace's number (the last
/// field of `NSpid`), once per thread.
pub(crate) fn thread_of_fault(mm: &Mm, ptid: u32) -> Option<i32> {
    let pid = mm.pid()?;
    if !mm.foreign_pidns.load(Ordering::Acquire) {
        return Some(ptid as i32);
    }
    let mut known = mm.ns_tids.lock();
    if let Some(&(_, tid)) = known.iter().find(|&&(n, _)| n == ptid) {
        // (A thread that exited may have left its number to a new one: checked.)
        if maps::own_ns_tid(pid, tid) == Some(ptid as i32) {
            return Some(tid);
        }
        known.retain(|&(n, _)| n != ptid);
    }
    let tid = maps::thread_by_own_ns_tid(pid, ptid as i32)?;
    if known.len() >= 1024 {
        known.clear();
    }
    known.push((ptid, tid));
    Some(tid)
}

/// The process, by the daemon's number, whose thread `sender`'s own pid namespace numbers
/// `tid`: a number a program passed (the target of its `PTRACE_ATTACH`: `hold.rs`), looked for
/// among the processes of the daemon's live address spaces. For a sender of the daemon's own
/// namespace the number is the daemon's. Below it, only a process of the sender's very
/// namespace (the same `/proc/PID/ns/pid`) with a thread whose own number (the last field of
/// its `NSpid`) is `tid`; none in a namespace nested further down, whose namespace at the
/// sender's level `/proc` does not show. `None` when no process can be shown to be the one.
pub(crate) fn pid_named_by(shared: &Shared, sender: i32, tid: i32) -> Option<i32> {
    if tid <= 0 {
        return None;
    }
    let levels = maps::ns_tgids(sender).len();
    if levels <= 1 {
        return (levels == 1).then(|| maps::tgid_of(tid).unwrap_or(tid));
    }
    let ns = std::fs::read_link(format!("/proc/{sender}/ns/pid")).ok()?;
    let pids: Vec<i32> = shared
        .mms
        .lock()
        .iter()
        .filter(|m| !m.retired.load(Ordering::Acquire))
        .filter_map(|m| m.pid())
        .collect();
    pids.into_iter().find(|&p| {
        maps::ns_tgids(p).len() == levels
            && std::fs::read_link(format!("/proc/{p}/ns/pid")).is_ok_and(|n| n == ns)
            && maps::thread_by_own_ns_tid(p, tid).is_some()
    })
}

/// Reads the token of `mm` in `pid`'s probe page: `Some(pidfd)` if `pid` holds `mm`'s address
/// space. The pidfd is opened first and checked alive last, so the number named that process
/// throughout; the page is read only where `pagemap` says it is present (a read of memory
/// that is not would map the zero page into a process that may be no client of the daemon).
fn holds(pid: i32, probe: u64, token: &[u8; 16]) -> Option<PidFd> {
    let fd = PidFd::open(pid).ok()?;
    let present =
        maps::present_pages(pid, probe, probe + PAGE_SIZE_U64).is_ok_and(|p| p.contains(&probe));
    if !present {
        return None;
    }
    let mut got = [0u8; 16];
    sys::read_mem_at(pid, probe, &mut got).ok()?;
    (got == *token && !fd.exited()).then_some(fd)
}

/// The children of every thread of `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                c.split_ascii_whitespace()
                    .filter_map(|s| s.parse::<i32>().ok()),
            );
        }
    }
    out
}

/// Looks for the process that holds `mm`'s address space (its token written) among the
/// processes of the tree no live address space names; with `ptid`, only among those whose own
/// pid namespace numbers them so. Binds it if found. Called with no other binding in progress
/// (`Shared::bind_lock` held), so that two address spaces are never bound to one process.
fn find_and_bind(shared: &Shared, mm: &Mm, token: &[u8; 16], ptid: Option<u32>) -> Option<i32> {
    let root = me();
    let bound: HashSet<i32> = shared
        .mms
        .lock()
        .iter()
        .filter(|m| !m.retired.load(Ordering::Acquire))
        .filter_map(|m| m.pid())
        .collect();
    let mut seen = HashSet::new();
    let mut try_one = |pid: i32, in_tree_known: bool| -> Option<PidFd> {
        if pid <= 0 || pid == root || bound.contains(&pid) || !seen.insert(pid) {
            return None;
        }
        // (Nothing of a process outside the tree is read beyond the parents that show it.)
        if !in_tree_known && !in_tree(pid, root) {
            return None;
        }
        if let Some(t) = ptid {
            if maps::ns_tgids(pid).last() != Some(&(t as i32)) {
                return None;
            }
        }
        holds(pid, mm.probe, token)
    };
    // The thread id itself, if it is a number of the daemon's namespace (a child there: the
    // usual case, one look); then the forking process's children; then the whole tree, parents
    // before their children. (Only the child's address space holds the token, and a process
    // sharing it, a vfork child of the child, comes after the child in both lists.)
    let parent = mm.forked_from.load(Ordering::Acquire);
    let mut found = ptid.and_then(|t| try_one(t as i32, false).map(|fd| (t as i32, fd)));
    if found.is_none() && parent > 0 && in_tree(parent, root) {
        found = children_of(parent)
            .into_iter()
            .find_map(|c| try_one(c, true).map(|fd| (c, fd)));
    }
    if found.is_none() {
        found = crate::unmanaged::descendants(root)
            .into_iter()
            .find_map(|c| try_one(c, true).map(|fd| (c, fd)));
    }
    let (pid, fd) = found?;
    bind(shared, mm, pid, fd);
    Some(pid)
}

/// Binds `mm` to process `pid` (a number of the daemon's namespace, shown to hold `mm`'s
/// address space; `fd` its pidfd): applies what the fork gave the child beyond a copy of its
/// parent's pages, then names it. The caller holds `Shared::bind_lock`.
fn bind(shared: &Shared, mm: &Mm, pid: i32, fd: PidFd) {
    *mm.pidfd.lock() = Some(fd);
    note_pid_namespace(mm, pid);
    forked_table_fixup(shared, mm, pid);
    *mm.bind_token.lock() = None;
    mm.pid.store(pid, Ordering::Release);
    Stats::add(&shared.stats.fork_children_bound, 1);
    if tracing::enabled!(tracing::Level::DEBUG) {
        let own = maps::ns_tgids(pid);
        tracing::debug!(
            "forked child bound to pid {pid} (numbers from the daemon's pid \
             namespace down: {own:?}; mm {})",
            mm.id
        );
    }
    // (The caller holds `bind_lock`; a greeting waiting for this child wakes.)
    shared.bind_cv.notify_all();
}

/// What a fork gives a child beyond a copy of its parent's pages, applied to the child's table
/// once its pid is known (an agent's child waits in its probe fault meanwhile, so its mappings
/// are as the fork left them): no pages where the parent had `MADV_WIPEONFORK` (the child reads
/// zeros there) and none where it had `MADV_DONTFORK` (the child has no mapping there).
fn forked_table_fixup(shared: &Shared, mm: &Mm, pid: i32) {
    let vmas = match maps::read_vm_flags(pid) {
        Ok(v) => v,
        Err(e) => {
            // Then nothing can be known of wipe-on-fork: the child's pages cannot be trusted.
            // (The child itself: shown to hold this address space, signalled through the
            // pidfd taken before that was shown.)
            tracing::error!(
                "cannot read the mappings of forked child {pid} ({e}); stopping it \
                 rather than risk serving its parent's data where it must read zeros"
            );
            mm.kill();
            return;
        }
    };
    apply_fork_flags(shared, mm, &vmas);
}

/// Forgets what the child's mappings `vmas` (start, end, flags, in address order) say the fork
/// did not give it: from the child's mappings, not from the registered ranges the table knows
/// (the agent's mmap wrapper registers memory before any scan sees it, and its pages are in
/// the table all the same). Every page outside a mapping of the child (dont-fork) or in a
/// wipe-on-fork one goes.
fn apply_fork_flags(shared: &Shared, mm: &Mm, vmas: &[(u64, u64, maps::VmFlags)]) {
    let mut st = mm.state.lock();
    let mut forgotten = 0;
    let mut at = 0u64;
    for &(vs, ve, f) in vmas {
        if vs > at {
            forgotten += st.forget_range(shared, at, vs);
            st.remove_range(at, vs);
        }
        if f.wipe_on_fork {
            forgotten += st.forget_range(shared, vs, ve);
        }
        at = at.max(ve);
    }
    forgotten += st.forget_range(shared, at, u64::MAX);
    st.remove_range(at, u64::MAX);
    if forgotten > 0 {
        Stats::add(&shared.stats.fork_pages_wiped, forgotten as u64);
    }
}

/// A forked child with an agent names itself: its atfork handler reads its probe page, and
/// the fault comes on the child's uffd with its thread id (`ptid`, of the child's own pid
/// namespace). The child is looked for (module docs) while it waits in the fault; found, it is
/// bound, its table fixed up, and woken. Not found within [`HOLD_PROBE_FAULT`], it is woken
/// unbound: its faults are served, nothing of it is evicted until its agent's greeting binds
/// it ([`bind_at_greeting`]), and it is said.
pub(crate) fn probe_fault(shared: &Shared, mm: &Mm, ptid: u32) -> ProbeFault {
    let wake = || {
        let _ = mm.uffd.wake(mm.probe, PAGE_SIZE_U64);
        ProbeFault::Served
    };
    let mut slot = mm.bind_token.lock();
    if mm.pid().is_some() {
        // Bound meanwhile (by its greeting), or long ago: a fault left asleep is woken.
        return if slot.is_some_and(|t| t.written) {
            drop(slot);
            wake()
        } else {
            ProbeFault::Zero
        };
    }
    if slot.is_none() {
        match BindToken::new() {
            Ok(t) => *slot = Some(t),
            Err(e) => {
                drop(slot);
                tracing::warn!(
                    "no random bytes to bind a forked child with ({e}); it runs with \
                     its faults served and nothing evicted"
                );
                return ProbeFault::Zero;
            }
        }
    }
    let Some(tok) = slot.as_mut() else {
        return ProbeFault::Zero;
    };
    if tok.released {
        return ProbeFault::Zero; // (a stale message: the page is present, this answers EEXIST)
    }
    if !tok.written {
        let mut page = vec![0u8; PAGE_SIZE];
        page[..16].copy_from_slice(&tok.bytes);
        match mm.uffd.copy_dontwake(mm.probe, &page) {
            Ok(Fill::Filled) => tok.written = true,
            Ok(Fill::Again) => return ProbeFault::NotYet,
            // Present already (not by us) or gone: nothing can show which process this is.
            Ok(Fill::Exists | Fill::Gone) | Err(_) => {
                *slot = None;
                return ProbeFault::Zero;
            }
        }
    }
    if tok.searched.is_some_and(|t| t.elapsed() < SEARCH_EVERY) {
        return ProbeFault::NotYet;
    }
    tok.searched = Some(Instant::now());
    let (token, since) = (tok.bytes, tok.since);
    drop(slot);
    let found = {
        let _g = shared.bind_lock.lock();
        if mm.pid().is_some() {
            return wake();
        }
        find_and_bind(shared, mm, &token, Some(ptid))
    };
    if found.is_some() {
        return wake();
    }
    if since.elapsed() < HOLD_PROBE_FAULT {
        return ProbeFault::NotYet;
    }
    if let Some(t) = mm.bind_token.lock().as_mut() {
        t.released = true;
    }
    Stats::add(&shared.stats.fork_children_unbound, 1);
    tracing::warn!(
        "a forked child (thread {ptid} in its own pid namespace) is not among the \
         processes of the daemon's tree; it goes on with its faults served and nothing evicted \
         until its agent's greeting shows which process it is (mm {})",
        mm.id
    );
    wake()
}

/// The agent of forked child `pid` (the peer of its greeting: a number of the daemon's
/// namespace, in its tree) greets, and no address space is bound to it: the one whose token
/// its probe page holds is bound now. (Its agent empties the probe page only after the
/// greeting; the child's program waits in its fork meanwhile, so its mappings are as the fork
/// left them.)
pub(crate) fn bind_at_greeting(shared: &Shared, pid: i32) -> bool {
    let unbound: Vec<_> = shared
        .mms
        .lock()
        .iter()
        .filter(|m| {
            m.pid().is_none()
                && !m.retired.load(Ordering::Acquire)
                && !m.agentless.load(Ordering::Acquire)
        })
        .cloned()
        .collect();
    let _g = shared.bind_lock.lock();
    if shared
        .mms
        .lock()
        .iter()
        .any(|m| m.pid() == Some(pid) && !m.retired.load(Ordering::Acquire))
    {
        return true;
    }
    for m in unbound {
        let Some(tok) = *m.bind_token.lock() else {
            continue;
        };
        if !tok.written || m.pid().is_some() {
            continue;
        }
        if let Some(fd) = holds(pid, m.probe, &tok.bytes) {
            bind(shared, &m, pid, fd);
            // A probe fault still held is woken by the handler's next try.
            let _ = m.uffd.wake(m.probe, PAGE_SIZE_U64);
            Stats::add(&shared.stats.fork_children_bound_at_greeting, 1);
            return true;
        }
    }
    false
}

/// The scanner's part for forked children of agentless processes (`agentless.rs`): each
/// unbound child's token is looked for among the tree's processes no address space names
/// (a child of an agentless process never faults on its probe page, which the daemon mapped).
/// Returns the children bound.
pub(crate) fn bind_agentless_children(
    shared: &Shared,
    unbound: &[(std::sync::Arc<Mm>, [u8; 16])],
) -> Vec<(std::sync::Arc<Mm>, i32)> {
    let mut done = Vec::new();
    if unbound.is_empty() {
        return done;
    }
    let _g = shared.bind_lock.lock();
    for (m, bytes) in unbound {
        if m.pid().is_some() || m.retired.load(Ordering::Acquire) {
            continue;
        }
        if let Some(pid) = find_and_bind(shared, m, bytes, None) {
            done.push((std::sync::Arc::clone(m), pid));
        }
    }
    done
}

/// Called by the handler of an agentless process's FORK event: the child is to be bound by a
/// token in its probe page.
pub(crate) fn forked(mm: &Mm) {
    let Ok(token) = BindToken::new() else {
        return; // then it stays unbound: faults served, nothing evicted
    };
    mm.agentless.store(true, Ordering::Release);
    *mm.bind_token.lock() = Some(token);
    write_token(mm);
}

/// Writes the child's token into its probe page through its uffd, if not done yet.
pub(crate) fn write_token(mm: &Mm) {
    let mut t = mm.bind_token.lock();
    let Some(tok) = t.as_mut().filter(|t| !t.written) else {
        return;
    };
    let mut page = vec![0u8; PAGE_SIZE];
    page[..16].copy_from_slice(&tok.bytes);
    match mm.uffd.copy(mm.probe, &page) {
        Ok(Fill::Filled) => tok.written = true,
        Ok(Fill::Again) => {} // the fork's event is still being completed: later
        _ => *t = None,       // present already, or gone: this child cannot be bound
    }
}
