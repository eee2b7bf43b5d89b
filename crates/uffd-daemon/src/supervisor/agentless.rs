//! Processes managed without an agent: statically linked and set-ID programs, images exec'd
//! without the agent, and their fork children. The daemon does the agent's in-process work
//! itself, with system calls it runs in one stopped thread of the program (`inject.rs`).
//!
//! ```text
//! start (a static program: stopped at its exec, before its first instruction), or an exec
//! into such an image seen by the scanner:
//!   one stop: userfaultfd(O_CLOEXEC|O_NONBLOCK) ─▶ mmap the daemon's region: [probe page,
//!             read-only, MADV_WIPEONFORK][4 argument pages][256 scratch pages]
//!             ─▶ pidfd_getfd the uffd ─▶ close() it in the program ─▶ detach
//!   then, as for an agent's uffd: UFFDIO_API (by the daemon), register the probe and the
//!   scratch, scan_and_register
//! DROP (reclaim.rs): write-protect, read, store as with an agent; then one stop per batch:
//!   madvise(MADV_DONTNEED) of the scratch if the last batch left pages there (its REMOVE is
//!   recognised by address) ─▶ the uffd lent to the program for the stop (a socketpair made
//!   there, the uffd sent over it with SCM_RIGHTS, received there, the pair closed)
//!   ─▶ UFFDIO_MOVE per run of victims still Dropping, into the scratch (the kernel refuses a
//!   page pinned for I/O, as it refuses the agent) ─▶ close() ─▶ MADV_POPULATE_WRITE of pages
//!   to unshare. After the stop the daemon reads the moved pages back from the scratch, and
//!   the batch settles on what each call returned and what was read back. The scratch is freed
//!   by the next batch's stop, or by a stop of its own once reclaim is idle. The rseq pages of
//!   the threads stopped so far are never in a batch (the kernel writes them on the way to a
//!   stop).
//! fork: the kernel's FORK event gives the child's uffd; the daemon writes 16 random bytes into
//!   the child's probe page through it (wipe-on-fork: empty in the child, and only that address
//!   space can hold them) and finds the child among the tree's processes by reading them back.
//! ```
//!
//! An agent is cheaper (no stop of the program): the agent path is kept for every program that
//! can load it, and this is the fallback, counted (`agentless_processes`, `inject_stops`,
//! `inject_errors`, the DROP times side by side in the counters).

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::space;
use crate::agent_conn::AgentConn;
use crate::bind::write_token;
use crate::fault;
use crate::inject::{InjectError, Stop};
use crate::mm::Mm;
use crate::reclaim::injected::{count_stop, neg_errno, scratch_of, REGION_PAGES};
use crate::reclaim::BATCH_PAGES;
use crate::shared::Shared;
use crate::stats::Stats;
use crate::sys::{self, PidFd, Uffd, PAGE_SIZE_U64};
use crate::unmanaged::Kind;

/// How long a forked child of an agentless process may go unbound before the daemon stops
/// looking for it (it then runs with its faults served and nothing evicted).
const BIND_GIVE_UP: Duration = Duration::from_secs(30);

/// Whether process `pid` runs an image that cannot load the agent, so that the daemon should
/// manage it itself: a statically linked one always (set-ID or not); a set-ID one when the
/// loader ran it in secure mode (`AT_SECURE`: it ignores `LD_PRELOAD` then; root running a
/// set-user-ID-root program is not in secure mode, and the agent loads as usual).
///
/// Set-ID programs: the daemon runs as root, so stopping one and running calls in it gives
/// nobody a privilege they lacked; the kernel's own ptrace access check decides at the seize.
/// (A daemon that is not root never traces a set-ID program it starts: the kernel would run it
/// without its privileges; see `daemon.rs`, `check_program`.)
pub(crate) fn needs_agentless(pid: i32) -> bool {
    use std::io::Read;
    let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
        return false;
    };
    // (The ELF header and program headers are at the start: 64 KiB of a 10 MiB Go binary.)
    let mut head = Vec::new();
    let is_static = std::fs::File::open(&exe)
        .and_then(|f| f.take(64 << 10).read_to_end(&mut head))
        .is_ok_and(|_| crate::unmanaged::elf_is_static(&head));
    if is_static {
        return true;
    }
    crate::unmanaged::program_kind(&exe) == Some(Kind::Setuid) && at_secure(pid).unwrap_or(true)
}

/// Whether any mapping of `pid` is registered with a userfaultfd (`um`, `uw`, `ui` in its
/// smaps): then it is not a fresh image the daemon may give a uffd of its own (it is a forked
/// child whose uffd the daemon holds and has yet to bind, or the program has one).
pub(crate) fn has_uffd_ranges(pid: i32) -> bool {
    crate::maps::read_vm_flags(pid).map_or(true, |v| v.iter().any(|m| m.2.uffd))
}

/// The scanner's part: processes of the tree that no address space names and that run an
/// image the agent cannot load (a static program started by `posix_spawn` or `vfork` and
/// `exec`, whose child never had an address space the daemon knew): handed to the monitor to
/// be managed without an agent. Each process is judged once per executable (`judged`).
pub(crate) fn find_new_images(
    shared: &Shared,
    judged: &mut std::collections::HashMap<i32, std::path::PathBuf>,
) {
    let known: std::collections::HashSet<i32> =
        shared.mms.lock().iter().filter_map(|m| m.pid()).collect();
    let me = crate::sys::getpid();
    let tree = crate::unmanaged::descendants(me);
    judged.retain(|p, _| tree.contains(p));
    let mut found = false;
    for pid in tree {
        if known.contains(&pid) {
            continue;
        }
        let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
            continue;
        };
        if refused_image(shared, pid).is_some_and(|r| r == exe) {
            continue;
        }
        if judged.get(&pid) == Some(&exe) {
            continue;
        }
        judged.insert(pid, exe);
        if needs_agentless(pid) && !has_uffd_ranges(pid) {
            shared.adopt_queue.lock().push(pid);
            found = true;
        }
    }
    if found {
        shared.kick_reclaim(); // (wakes the monitor)
    }
}

/// `AT_SECURE` from `/proc/PID/auxv`.
fn at_secure(pid: i32) -> Option<bool> {
    const AT_SECURE: u64 = 23;
    let b = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    b.chunks_exact(16).find_map(|c| {
        let key = u64::from_le_bytes(c[..8].try_into().ok()?);
        let val = u64::from_le_bytes(c[8..].try_into().ok()?);
        (key == AT_SECURE).then_some(val != 0)
    })
}

/// In the stop: makes the process's uffd and its probe page, and takes the uffd.
fn make_uffd(stop: &mut Stop, pid: i32) -> Result<(OwnedFd, u64), InjectError> {
    let fd = stop.syscall(
        libc::SYS_userfaultfd,
        [(libc::O_CLOEXEC | libc::O_NONBLOCK) as u64, 0, 0, 0, 0, 0],
    )?;
    if let Some(e) = neg_errno(fd) {
        return Err(InjectError::Io(e));
    }
    let close = |stop: &mut Stop| stop.syscall(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]);
    let len = REGION_PAGES * PAGE_SIZE_U64;
    let probe = stop.syscall(
        libc::SYS_mmap,
        [
            0,
            len,
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
            u64::MAX,
            0,
        ],
    )?;
    if let Some(e) = neg_errno(probe) {
        close(stop)?;
        return Err(InjectError::Io(e));
    }
    let probe = probe as u64;
    let unmap = |stop: &mut Stop| stop.syscall(libc::SYS_munmap, [probe, len, 0, 0, 0, 0]);
    // The probe page read-only (the program has no business there) and empty in a fork child;
    // the arguments and the scratch read-write, like the memory moved into it.
    let mut r = stop.syscall(
        libc::SYS_mprotect,
        [probe, PAGE_SIZE_U64, libc::PROT_READ as u64, 0, 0, 0],
    )?;
    if neg_errno(r).is_none() {
        r = stop.syscall(
            libc::SYS_madvise,
            [probe, PAGE_SIZE_U64, libc::MADV_WIPEONFORK as u64, 0, 0, 0],
        )?;
    }
    let taken = match neg_errno(r) {
        Some(e) => Err(e),
        None => PidFd::open(pid).and_then(|p| p.get_fd(fd as i32)),
    };
    // Nothing of the daemon's stays in the program's descriptor table.
    close(stop)?;
    match taken {
        Ok(uffd) => Ok((uffd, probe)),
        Err(e) => {
            unmap(stop)?;
            Err(InjectError::Io(e))
        }
    }
}

/// Manages `pid` without an agent: makes its uffd in one stop, then registers its memory as
/// for any process. `at_exec`: the process is this thread's tracee, stopped at its exec
/// (`sys::trace_me_at_exec`); otherwise it is seized.
pub(crate) fn adopt(shared: &Arc<Shared>, pid: i32, at_exec: bool) -> Result<(), InjectError> {
    let mut stop = if at_exec {
        Stop::stopped(pid)?
    } else {
        Stop::seize(pid)?
    };
    // Everything up to the registration of its memory is done while the program is stopped:
    // a program stopped at its exec starts managed, and none can exec or exit meanwhile.
    let r = adopt_stopped(shared, pid, &mut stop);
    stop.release();
    count_stop(shared, &stop);
    r
}

fn adopt_stopped(shared: &Arc<Shared>, pid: i32, stop: &mut Stop) -> Result<(), InjectError> {
    let (fd, probe) = make_uffd(stop, pid)?;
    let uffd = Uffd::from_owned(fd);
    // (An address space that is gone answers ENOMEM or ESRCH here.)
    let gone = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::ENOMEM | libc::ESRCH) => InjectError::Gone(None),
        _ => InjectError::Io(e),
    };
    let features = uffd.api(sys::REQUIRED_FEATURES).map_err(gone)?;
    if features & sys::REQUIRED_FEATURES != sys::REQUIRED_FEATURES {
        return Err(InjectError::Io(std::io::Error::other(format!(
            "uffd features {features:#x} lack required {:#x}",
            sys::REQUIRED_FEATURES
        ))));
    }
    uffd.register(probe, PAGE_SIZE_U64, false).map_err(gone)?;
    // (The scratch is a move's destination: it must be registered with this uffd.)
    uffd.register(scratch_of(probe), BATCH_PAGES as u64 * PAGE_SIZE_U64, false)
        .map_err(gone)?;
    // An exec replaced the address space: the old one (same pid) is gone.
    space::retire_pid(shared, pid);
    let mm = Arc::new(Mm::new(
        shared.new_id(),
        uffd,
        pid,
        (probe, probe + REGION_PAGES * PAGE_SIZE_U64),
        probe,
        scratch_of(probe),
        &shared.policy,
    )?);
    make_agentless(shared, &mm);
    if let Ok(p) = PidFd::open(pid) {
        *mm.pidfd.lock() = Some(p);
    }
    crate::bind::note_pid_namespace(&mm, pid);
    fault::start_mm(shared, &mm)?;
    let _ = space::scan_and_register(shared, &mm);
    tracing::debug!("managing pid {pid} without an agent (mm {})", mm.id);
    Ok(())
}

/// Gives `mm` the injected DROP channel.
fn make_agentless(shared: &Shared, mm: &Mm) {
    mm.agentless.store(true, Ordering::Release);
    // No agent thread will name itself; reclaim waits for none (and no thread has this id).
    mm.agent_tid.store(u32::MAX, Ordering::Relaxed);
    *mm.agent.lock() = Some(AgentConn::injected(BATCH_PAGES));
    Stats::add(&shared.stats.agentless_processes, 1);
}

/// The image a process was refused for, if it was.
pub(crate) fn refused_image(shared: &Shared, pid: i32) -> Option<std::path::PathBuf> {
    shared
        .agentless_refusals
        .lock()
        .get(&pid)
        .map(|(exe, _)| exe.clone())
}

/// Says once per process (and image) that it stays unmanaged, and why.
pub(crate) fn refused(shared: &Shared, pid: i32, e: &InjectError) {
    Stats::add(&shared.stats.agentless_refused, 1);
    // (The census counts it, and does not say it again.)
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    shared
        .agentless_refusals
        .lock()
        .insert(pid, (exe, e.to_string()));
    tracing::warn!(
        "pid {pid}: the daemon cannot manage it without an agent: {e}; its memory \
         is unmanaged and outside the limit"
    );
}

/// The scanner's part: binds forked children of agentless processes to their pids. Each
/// unbound child's token is looked for in the probe page of the tree's processes that no
/// address space names yet (`bind.rs`; only where the page is present, so that no read
/// faults).
pub(crate) fn bind_children(shared: &Arc<Shared>) {
    let mms: Vec<Arc<Mm>> = shared.mms.lock().clone();
    let mut unbound = Vec::new();
    for m in &mms {
        if m.pid().is_some()
            || m.retired.load(Ordering::Relaxed)
            || !m.agentless.load(Ordering::Acquire)
        {
            continue;
        }
        write_token(m);
        let tok = *m.bind_token.lock();
        match tok {
            Some(t) if t.since.elapsed() > BIND_GIVE_UP => *m.bind_token.lock() = None,
            Some(t) if t.written => unbound.push((Arc::clone(m), t.bytes)),
            _ => {}
        }
    }
    for (m, pid) in crate::bind::bind_agentless_children(shared, &unbound) {
        make_agentless(shared, &m);
        Stats::add(&shared.stats.agentless_children_bound, 1);
        tracing::debug!(
            "forked child {pid} of an agentless process bound (mm {})",
            m.id
        );
    }
}
