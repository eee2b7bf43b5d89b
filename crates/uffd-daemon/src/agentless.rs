//! Processes managed without an agent: statically linked and set-ID programs, images exec'd
//! without the agent, and their fork children. The daemon does the agent's in-process work
//! itself, with system calls it runs in one stopped thread of the program (`inject.rs`).
//!
//! ```text
//! start (a static program: stopped at its exec, before its first instruction), or an exec
//! into such an image seen by the scanner:
//!   one stop: userfaultfd(O_CLOEXEC|O_NONBLOCK) ─▶ mmap a probe page ─▶ MADV_WIPEONFORK it
//!             ─▶ pidfd_getfd the uffd ─▶ close() it in the program ─▶ detach
//!   then, as for an agent's uffd: UFFDIO_API (by the daemon), register the probe, scan_and_register
//! DROP (reclaim.rs): write-protect, read, store as with an agent; then one stop per batch:
//!   madvise(MADV_DONTNEED) per run of victims still Dropping. Each raises a REMOVE event that
//!   the madvise waits on: the handler reads it meanwhile and recognises it as the daemon's own
//!   (mm.rs, OwnDrop); the batch settles after the stop, on what each call returned. The rseq
//!   pages of the threads stopped so far are never in a batch (the kernel writes them on the
//!   way to a stop).
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
use std::time::{Duration, Instant};

use crate::agent_conn::AgentConn;
use crate::daemon::{self, Shared};
use crate::inject::{InjectError, Stop};
use crate::mm::{BindToken, Mm};
use crate::reclaim::BATCH_PAGES;
use crate::stats::Stats;
use crate::sys::{self, Fill, PidFd, Uffd, PAGE_SIZE, PAGE_SIZE_U64};
use crate::unmanaged::Kind;

/// A page status of an injected DROP that is neither "dropped" nor "kept": the call failed
/// part way, and a `REMOVE` was seen for the page (by the daemon's call, or the program's at
/// the same moment). Its stored copy is kept and served (`Inherited`).
pub const DROP_UNKNOWN: u8 = 0xff;

/// Status of a page whose drop was not attempted (or refused as a whole).
const DROP_KEPT: u8 = 1;

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
pub fn needs_agentless(pid: i32) -> bool {
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
pub fn has_uffd_ranges(pid: i32) -> bool {
    crate::maps::read_vm_flags(pid).map_or(true, |v| v.iter().any(|m| m.2.uffd))
}

/// The scanner's part: processes of the tree that no address space names and that run an
/// image the agent cannot load (a static program started by `posix_spawn` or `vfork` and
/// `exec`, whose child never had an address space the daemon knew): handed to the monitor to
/// be managed without an agent. Each process is judged once per executable (`judged`).
pub fn find_new_images(
    shared: &Shared,
    judged: &mut std::collections::HashMap<i32, std::path::PathBuf>,
) {
    let known: std::collections::HashSet<i32> =
        shared.mms.lock().iter().filter_map(|m| m.pid()).collect();
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
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

fn neg_errno(r: i64) -> Option<std::io::Error> {
    (-4095..0)
        .contains(&r)
        .then(|| std::io::Error::from_raw_os_error(-r as i32))
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
    let probe = stop.syscall(
        libc::SYS_mmap,
        [
            0,
            PAGE_SIZE_U64,
            libc::PROT_READ as u64,
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
    let unmap =
        |stop: &mut Stop| stop.syscall(libc::SYS_munmap, [probe, PAGE_SIZE_U64, 0, 0, 0, 0]);
    let wiped = stop.syscall(
        libc::SYS_madvise,
        [probe, PAGE_SIZE_U64, libc::MADV_WIPEONFORK as u64, 0, 0, 0],
    )?;
    let taken = match neg_errno(wiped) {
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

fn count_stop(shared: &Shared, stop: &Stop) {
    let s = &shared.stats;
    Stats::add(&s.inject_stops, 1);
    Stats::add(&s.inject_syscalls, stop.calls as u64);
    let held = stop.began.elapsed().as_nanos() as u64;
    Stats::add(&s.inject_stop_ns, held);
    // The fixed cost of a stop: from the seize to the stop, and the release; and how long the
    // stopped thread stood still.
    shared.inject_stop_times.record(stop.fixed_ns);
    shared.inject_hold_times.record(held);
}

/// A program stopped for the drop of one reclaim batch (`reclaim.rs`). The stopped thread's
/// faults are not held at the limit meanwhile. Dropping it lets the program go.
#[derive(Debug)]
pub struct BatchStop<'a> {
    shared: &'a Shared,
    stop: Stop,
}

impl<'a> BatchStop<'a> {
    /// Stops `pid`.
    pub fn take(shared: &'a Shared, pid: i32) -> Result<Self, InjectError> {
        shared.injecting.store(true, Ordering::Release);
        shared.injecting_pid.store(pid, Ordering::Release);
        match Stop::seize_noting(pid, &shared.injecting_tid) {
            Ok(stop) => Ok(BatchStop { shared, stop }),
            Err(e) => {
                shared.injecting.store(false, Ordering::Release);
                shared.injecting_tid.store(0, Ordering::Release);
                Err(e)
            }
        }
    }

    /// Notes the stopped thread's rseq page in `mm` (the batches leave those pages out);
    /// returns it if it was not known.
    pub fn learn_rseq(&self, mm: &Mm) -> Option<u64> {
        let tid = self.stop.tid();
        let mut known = mm.rseq_pages.lock();
        if known.iter().any(|&(t, _)| t == tid) {
            return None;
        }
        let page = self.stop.rseq_page();
        known.push((tid, page.unwrap_or(u64::MAX)));
        page
    }
}

impl Drop for BatchStop<'_> {
    fn drop(&mut self) {
        self.stop.release();
        count_stop(self.shared, &self.stop);
        self.shared.injecting.store(false, Ordering::Release);
        self.shared.injecting_tid.store(0, Ordering::Release);
    }
}

/// Manages `pid` without an agent: makes its uffd in one stop, then registers its memory as
/// for any process. `at_exec`: the process is this thread's tracee, stopped at its exec
/// (`sys::trace_me_at_exec`); otherwise it is seized.
pub fn adopt(shared: &Arc<Shared>, pid: i32, at_exec: bool) -> Result<(), InjectError> {
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
    // An exec replaced the address space: the old one (same pid) is gone.
    let old: Vec<Arc<Mm>> = shared
        .mms
        .lock()
        .iter()
        .filter(|m| m.pid() == Some(pid))
        .cloned()
        .collect();
    for m in old {
        daemon::retire(shared, &m);
    }
    let mm = Arc::new(Mm::new(
        shared.new_id(),
        uffd,
        pid,
        (probe, probe + PAGE_SIZE_U64),
        probe,
        &shared.policy,
    )?);
    make_agentless(shared, &mm);
    if let Ok(p) = PidFd::open(pid) {
        *mm.pidfd.lock() = Some(p);
    }
    crate::bind::note_pid_namespace(&mm, pid);
    daemon::start_mm(shared, &mm)?;
    let _ = daemon::scan_and_register(shared, &mm);
    if shared.verbose {
        eprintln!(
            "uffd-daemon: managing pid {pid} without an agent (mm {})",
            mm.id
        );
    }
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
pub fn refused_image(shared: &Shared, pid: i32) -> Option<std::path::PathBuf> {
    shared
        .agentless_refusals
        .lock()
        .get(&pid)
        .map(|(exe, _)| exe.clone())
}

/// Says once per process (and image) that it stays unmanaged, and why.
pub fn refused(shared: &Shared, pid: i32, e: &InjectError) {
    Stats::add(&shared.stats.agentless_refused, 1);
    // (The census counts it, and does not say it again.)
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    shared
        .agentless_refusals
        .lock()
        .insert(pid, (exe, e.to_string()));
    eprintln!(
        "uffd-daemon: pid {pid}: the daemon cannot manage it without an agent: {e}; its memory \
         is unmanaged and outside the limit"
    );
}

/// Carries out a DROP of `pages` (sorted; `runs` are their runs) in an agentless process:
/// one stop, `madvise(MADV_DONTNEED)` per run. Returns a status per page (0 dropped,
/// [`DROP_UNKNOWN`], or kept) and the error that ended the stop early, if any.
pub fn drop_pages(
    shared: &Shared,
    mm: &Mm,
    pid: i32,
    mut stop: BatchStop<'_>,
    pages: &[u64],
    runs: &[(u64, u32)],
) -> (Vec<u8>, Option<InjectError>) {
    let t = Instant::now();
    let mut status = vec![DROP_KEPT; pages.len()];
    {
        let mut own = mm.own_drop.lock();
        own.runs = runs
            .iter()
            .map(|&(s, n)| (s, s + n as u64 * PAGE_SIZE_U64))
            .collect();
        own.covered.clear();
    }
    let mut results: Vec<Option<i64>> = vec![None; runs.len()];
    let mut err = None;
    for (i, &(s, n)) in runs.iter().enumerate() {
        let len = n as u64 * PAGE_SIZE_U64;
        match stop.stop.syscall(
            libc::SYS_madvise,
            [s, len, libc::MADV_DONTNEED as u64, 0, 0, 0],
        ) {
            Ok(r) => results[i] = Some(r),
            Err(e) => {
                results[i] = Some(i64::MIN); // may have run: unknown
                err = Some(e);
                break;
            }
        }
    }
    // The time a DROP costs, comparable to an agent's (its request to its answer): stopping
    // the program, the calls, letting it go (the write-protection, reading and storing done
    // during the stop are the agent path's too, outside its DROP).
    let to_stop_ns = stop.stop.fixed_ns;
    drop(stop);
    // The REMOVE events were read before the calls returned; wait until the handler has
    // applied them (claimed them as ours) before looking at what was covered.
    wait_handled(mm);
    let own = std::mem::take(&mut *mm.own_drop.lock());
    let mut k = 0;
    for (i, &(s, n)) in runs.iter().enumerate() {
        let n = n as usize;
        match results[i] {
            Some(0) => status[k..k + n].fill(0),
            Some(r) => {
                // Failed (or unknown): pages a REMOVE was seen for were removed by someone;
                // their copies are kept. The others were not touched.
                for j in 0..n {
                    let a = s + j as u64 * PAGE_SIZE_U64;
                    if r == i64::MIN || own.is_covered(a, a + PAGE_SIZE_U64) {
                        status[k + j] = DROP_UNKNOWN;
                    }
                }
                if let Some(e) = neg_errno(r) {
                    Stats::add(&shared.stats.inject_errors, 1);
                    if shared.verbose {
                        eprintln!(
                            "uffd-daemon: pid {pid}: injected madvise of {s:#x}+{} failed: {e}",
                            n * PAGE_SIZE
                        );
                    }
                }
            }
            None => {}
        }
        k += n;
    }
    shared
        .drop_inject_times
        .record(to_stop_ns + t.elapsed().as_nanos() as u64);
    (status, err)
}

/// Waits until the handler of `mm` has applied every message it had read (its counter is even
/// or has moved on): a `REMOVE` completes the `madvise` that raised it when it is read, before
/// the handler applies it.
pub fn wait_handled(mm: &Mm) {
    let c = mm.handling.load(Ordering::Acquire);
    if c % 2 == 0 {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while mm.handling.load(Ordering::Acquire) == c && Instant::now() < deadline {
        std::thread::yield_now();
    }
}

/// Called by the handler of an agentless process's FORK event: the child is to be bound by a
/// token in its probe page.
pub fn forked(mm: &Mm) {
    let Ok(token) = BindToken::new() else {
        return; // then it stays unbound: faults served, nothing evicted
    };
    mm.agentless.store(true, Ordering::Release);
    *mm.bind_token.lock() = Some(token);
    write_token(mm);
}

/// Writes the child's token into its probe page through its uffd, if not done yet.
fn write_token(mm: &Mm) {
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

/// The scanner's part: binds forked children of agentless processes to their pids. Each
/// unbound child's token is looked for in the probe page of the tree's processes that no
/// address space names yet (`bind.rs`; only where the page is present, so that no read
/// faults).
pub fn bind_children(shared: &Arc<Shared>) {
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
        if shared.verbose {
            eprintln!(
                "uffd-daemon: forked child {pid} of an agentless process bound (mm {})",
                m.id
            );
        }
    }
}
