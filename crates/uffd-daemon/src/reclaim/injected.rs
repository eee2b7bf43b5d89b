use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::inject::{InjectError, Stop};
use crate::mm::Mm;
use crate::reclaim::BATCH_PAGES;
use crate::shared::Shared;
use crate::stats::Stats;
use crate::sys::{self, PidFd, PAGE_SIZE_U64};

/// Pages of arguments in the daemon's region of a process without an agent: the system calls'
/// structures (`msghdr`, `uffdio_move`), written there with `process_vm_writev`. Never
/// registered with the uffd.
pub(crate) const ARGS_PAGES: u64 = 4;

/// The daemon's region in a process without an agent, in pages: the probe page, the argument
/// pages, the scratch that DROPs move victims into.
pub(crate) const REGION_PAGES: u64 = 1 + ARGS_PAGES + BATCH_PAGES as u64;

/// The argument pages of the region that starts with probe page `probe`.
pub(crate) fn args_of(probe: u64) -> u64 {
    probe + PAGE_SIZE_U64
}

/// The scratch of the region that starts with probe page `probe`.
pub(crate) fn scratch_of(probe: u64) -> u64 {
    probe + (1 + ARGS_PAGES) * PAGE_SIZE_U64
}

pub(crate) fn neg_errno(r: i64) -> Option<std::io::Error> {
    (-4095..0)
        .contains(&r)
        .then(|| std::io::Error::from_raw_os_error(-r as i32))
}

/// A page status of an injected DROP that is neither "moved" nor "kept": the call that moved
/// it did not come back (the stop ended in it), so the page may be in the scratch or in
/// place. Its stored copy is kept and served (`Inherited`).
pub(crate) const DROP_UNKNOWN: u8 = 0xff;

/// Status of a page whose move was not attempted (or refused as a whole).
pub(crate) const DROP_KEPT: u8 = 1;

pub(crate) fn count_stop(shared: &Shared, stop: &Stop) {
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

/// A program stopped for the drop of one reclaim batch (`reclaim/mod.rs`). The stopped thread's
/// faults are not held at the limit meanwhile. Dropping it lets the program go.
#[derive(Debug)]
pub(crate) struct BatchStop<'a> {
    shared: &'a Shared,
    stop: Stop,
}

impl<'a> BatchStop<'a> {
    /// Stops `pid`.
    pub(crate) fn take(shared: &'a Shared, pid: i32) -> Result<Self, InjectError> {
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
    pub(crate) fn learn_rseq(&self, mm: &Mm) -> Option<u64> {
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

/// The outcome of an injected DROP: a status per page moved, then per page unshared (0 done,
/// [`DROP_UNKNOWN`], or an errno / kept); the error that ended the stop early, if any. The
/// moved pages are in the scratch (page `i` of the DROP at `scratch + i * 4096`), to be read
/// back by the daemon; the next stop frees it.
#[derive(Debug)]
pub(crate) struct InjectedDrop {
    /// Per page of the DROP, then per page to unshare.
    pub status: Vec<u8>,
    /// What ended the stop early.
    pub err: Option<InjectError>,
}

/// Carries out a DROP in an agentless process, in one stop: frees the scratch if the last DROP
/// left pages there, moves `pages` (sorted) into it, then unshares `unshare` (sorted).
pub(crate) fn drop_pages(
    shared: &Shared,
    mm: &Mm,
    pid: i32,
    mut stop: BatchStop<'_>,
    pages: &[u64],
    unshare: &[u64],
) -> InjectedDrop {
    let t = Instant::now();
    let mut out = InjectedDrop {
        status: vec![DROP_KEPT; pages.len() + unshare.len()],
        err: None,
    };
    let (moves, unshares) = out.status.split_at_mut(pages.len());
    let r = move_out(shared, mm, pid, &mut stop.stop, pages, moves)
        .and_then(|()| unshare_in(pid, &mut stop.stop, unshare, unshares));
    if let Err(e) = r {
        out.err = Some(e);
    }
    // The time a DROP costs, comparable to an agent's (its request to its answer): stopping
    // the program, the calls, letting it go (the write-protection, reading and storing done
    // before are the agent path's too, outside its DROP).
    let to_stop_ns = stop.stop.fixed_ns;
    drop(stop);
    shared
        .drop_inject_times
        .record(to_stop_ns + t.elapsed().as_nanos() as u64);
    let errors = out
        .status
        .iter()
        .filter(|&&s| s != 0 && s != DROP_KEPT && s != libc::EBUSY as u8)
        .count();
    if errors > 0 {
        Stats::add(&shared.stats.inject_errors, 1);
        tracing::debug!("pid {pid}: an injected DROP failed for {errors} pages");
    }
    out
}

pub(crate) fn io_err(e: std::io::Error) -> InjectError {
    InjectError::Io(e)
}

/// Lends the process its uffd for the stop: a socketpair made in the program, the daemon's
/// end taken with `pidfd_getfd`, the uffd sent over it (`SCM_RIGHTS`) and received in the
/// program (`MSG_CMSG_CLOEXEC`); the pair is closed again at once. Returns the uffd's number
/// in the program. (UFFDIO_MOVE works only inside the address space it moves in.)
pub(crate) fn lend_uffd(mm: &Mm, pid: i32, stop: &mut Stop) -> Result<i32, InjectError> {
    use std::mem::offset_of;
    let args = args_of(mm.probe);
    let r = stop.syscall(
        libc::SYS_socketpair,
        [
            libc::AF_UNIX as u64,
            (libc::SOCK_DGRAM | libc::SOCK_CLOEXEC) as u64,
            0,
            args,
            0,
            0,
        ],
    )?;
    if let Some(e) = neg_errno(r) {
        return Err(io_err(e));
    }
    let mut fds = [0u8; 8];
    sys::read_remote(pid, &[(args, 8)], &mut fds).map_err(io_err)?;
    let a = i32::from_le_bytes([fds[0], fds[1], fds[2], fds[3]]);
    let b = i32::from_le_bytes([fds[4], fds[5], fds[6], fds[7]]);
    let close =
        |stop: &mut Stop, fd: i32| stop.syscall(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]);
    let sent = PidFd::open(pid).and_then(|p| p.get_fd(b)).and_then(|ours| {
        use std::os::fd::AsFd;
        sys::send_with_fd(&ours, &[0], Some(mm.uffd.as_fd()))
    });
    // In the argument page: the msghdr at 64, its iovec at 128, the byte at 160, the control
    // buffer at 192 (one descriptor: CMSG_SPACE(4) = 24 bytes).
    const MSG: u64 = 64;
    const IOV: u64 = 128;
    const BYTE: u64 = 160;
    const CTL: u64 = 192;
    const CTL_LEN: u64 = 24;
    let mut page = vec![0u8; 256];
    let mut put =
        |at: u64, v: u64| page[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
    put(MSG + offset_of!(libc::msghdr, msg_iov) as u64, args + IOV);
    put(MSG + offset_of!(libc::msghdr, msg_iovlen) as u64, 1);
    put(
        MSG + offset_of!(libc::msghdr, msg_control) as u64,
        args + CTL,
    );
    put(
        MSG + offset_of!(libc::msghdr, msg_controllen) as u64,
        CTL_LEN,
    );
    put(IOV + offset_of!(libc::iovec, iov_base) as u64, args + BYTE);
    put(IOV + offset_of!(libc::iovec, iov_len) as u64, 1);
    let received = match sent {
        Err(e) => Err(io_err(e)),
        Ok(()) => match sys::write_remote(pid, args, &page) {
            Err(e) => Err(io_err(e)),
            Ok(()) => stop.syscall(
                libc::SYS_recvmsg,
                [
                    a as u64,
                    args + MSG,
                    (libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) as u64,
                    0,
                    0,
                    0,
                ],
            ),
        },
    };
    // The pair goes at once: only the uffd stays for the moves.
    let closed = close(stop, a).and_then(|_| close(stop, b));
    let r = received?;
    closed?;
    if let Some(e) = neg_errno(r) {
        return Err(io_err(e));
    }
    let mut ctl = [0u8; CTL_LEN as usize];
    sys::read_remote(pid, &[(args + CTL, ctl.len())], &mut ctl).map_err(io_err)?;
    let word = |at: usize| i32::from_le_bytes([ctl[at], ctl[at + 1], ctl[at + 2], ctl[at + 3]]);
    // struct cmsghdr: cmsg_len (8 bytes), cmsg_level, cmsg_type, then the descriptor.
    if word(8) != libc::SOL_SOCKET || word(12) != libc::SCM_RIGHTS {
        return Err(io_err(std::io::Error::other(
            "the program received no descriptor from the daemon",
        )));
    }
    Ok(word(16))
}

/// In the stop: frees the scratch if pages of the last DROP may be there, lends the uffd,
/// moves each run of `pages` into the scratch (page `i` of the DROP to `scratch + i * 4096`,
/// as the agent does) and gives the uffd back. `status`: per page, 0 moved, else why not.
pub(crate) fn move_out(
    shared: &Shared,
    mm: &Mm,
    pid: i32,
    stop: &mut Stop,
    pages: &[u64],
    status: &mut [u8],
) -> Result<(), InjectError> {
    empty_scratch(mm, stop)?;
    if pages.is_empty() {
        return Ok(());
    }
    let fd = match lend_uffd(mm, pid, stop) {
        Ok(fd) => fd,
        // A call that failed (the program out of descriptors, say): this batch stays
        // resident, the next may do.
        Err(InjectError::Io(e)) => {
            Stats::add(&shared.stats.inject_errors, 1);
            tracing::debug!("pid {pid}: cannot lend the uffd for a DROP: {e}");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    *mm.scratch_filled.lock() = Some(Instant::now());
    let r = move_runs(mm, pid, stop, fd, pages, status);
    let closed = stop.syscall(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]);
    r?;
    closed?;
    Ok(())
}

/// In a stop: frees the scratch (`MADV_DONTNEED`; its `REMOVE` is recognised by address) if
/// the last DROP may have left pages there.
pub(crate) fn empty_scratch(mm: &Mm, stop: &mut Stop) -> Result<(), InjectError> {
    if mm.scratch_filled.lock().is_none() {
        return Ok(());
    }
    let r = stop.syscall(
        libc::SYS_madvise,
        [
            mm.scratch,
            BATCH_PAGES as u64 * PAGE_SIZE_U64,
            libc::MADV_DONTNEED as u64,
            0,
            0,
            0,
        ],
    )?;
    match neg_errno(r) {
        None => {
            *mm.scratch_filled.lock() = None;
            Ok(())
        }
        Some(e) => Err(io_err(e)),
    }
}

/// Frees the scratch of `mm` in a stop of its own (reclaim is idle: no DROP will do it soon).
pub(crate) fn free_scratch(shared: &Shared, mm: &Mm, pid: i32) -> Result<(), InjectError> {
    let mut stop = BatchStop::take(shared, pid)?;
    empty_scratch(mm, &mut stop.stop)
}

/// The `UFFDIO_MOVE` calls of [`move_out`], one per run, retried past a pending event and
/// resumed after a page that failed.
pub(crate) fn move_runs(
    mm: &Mm,
    pid: i32,
    stop: &mut Stop,
    fd: i32,
    pages: &[u64],
    status: &mut [u8],
) -> Result<(), InjectError> {
    // struct uffdio_move { dst, src, len, mode, move }: one per run, in the argument pages
    // after the first.
    let base = args_of(mm.probe) + PAGE_SIZE_U64;
    let arg = |dst: u64, src: u64, n: u64| {
        let mut b = [0u8; 40];
        for (k, v) in [
            dst,
            src,
            n * PAGE_SIZE_U64,
            sys::UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES,
            0,
        ]
        .into_iter()
        .enumerate()
        {
            b[k * 8..k * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    };
    let runs = crate::mm::runs_of(pages);
    let mut all = Vec::with_capacity(runs.len() * 40);
    let mut k = 0u64;
    for &(s, n) in &runs {
        all.extend_from_slice(&arg(mm.scratch + k * PAGE_SIZE_U64, s, n as u64));
        k += n as u64;
    }
    debug_assert!(all.len() as u64 <= (ARGS_PAGES - 1) * PAGE_SIZE_U64);
    sys::write_remote(pid, base, &all).map_err(io_err)?;
    let mut k = 0usize; // the run's first page, as an index of the DROP
    for (r, &(s, n)) in runs.iter().enumerate() {
        let n = n as usize;
        let at = base + r as u64 * 40;
        let mut done = 0usize;
        let mut fresh = true; // the argument in the program describes pages done..n
        let mut tries = 0;
        while done < n {
            if !fresh {
                let a = arg(
                    mm.scratch + (k + done) as u64 * PAGE_SIZE_U64,
                    s + done as u64 * PAGE_SIZE_U64,
                    (n - done) as u64,
                );
                sys::write_remote(pid, at, &a).map_err(io_err)?;
            }
            let rc = match stop.syscall(libc::SYS_ioctl, [fd as u64, sys::UFFDIO_MOVE, at, 0, 0, 0])
            {
                Ok(rc) => rc,
                Err(e) => {
                    // It may have moved some of them: unknown.
                    status[k + done..k + n].fill(DROP_UNKNOWN);
                    return Err(e);
                }
            };
            fresh = false;
            if rc == 0 {
                status[k + done..k + n].fill(0);
                break;
            }
            let mut b = [0u8; 8];
            if let Err(e) = sys::read_remote(pid, &[(at + 32, 8)], &mut b) {
                // How far it went is unknown: so is whether the rest moved.
                status[k + done..k + n].fill(DROP_UNKNOWN);
                return Err(io_err(e));
            }
            let bytes = i64::from_le_bytes(b);
            let went = if bytes > 0 {
                (bytes as u64 / PAGE_SIZE_U64) as usize
            } else {
                0
            };
            status[k + done..k + done + went].fill(0);
            done += went;
            if done >= n {
                break;
            }
            let e = (-rc) as i32;
            if e == libc::EAGAIN && went > 0 {
                continue;
            }
            if e == libc::EAGAIN && tries < 200 {
                // An event is pending (the handler reads it soon), or the page is busy.
                tries += 1;
                std::thread::sleep(Duration::from_micros(50));
                continue;
            }
            // This page failed (EBUSY: shared after fork, or pinned): say why, go on.
            status[k + done] = e.clamp(1, 254) as u8;
            done += 1;
        }
        k += n;
    }
    Ok(())
}

/// In the stop: makes each page of `unshare` that is still present the process's own
/// (`MADV_POPULATE_WRITE`), as the agent does (`DROP_RUN_UNSHARE`). `status`: per page.
pub(crate) fn unshare_in(
    pid: i32,
    stop: &mut Stop,
    unshare: &[u64],
    status: &mut [u8],
) -> Result<(), InjectError> {
    const MADV_POPULATE_WRITE: u64 = 23;
    let mut k = 0usize;
    for (s, n) in crate::mm::runs_of(unshare) {
        let n = n as usize;
        let end = s + n as u64 * PAGE_SIZE_U64;
        // Pages the program removed since are left alone: populating them would put pages
        // into memory it freed.
        let present = crate::maps::present_pages(pid, s, end).unwrap_or_default();
        let mut i = 0;
        while i < n {
            let a = s + i as u64 * PAGE_SIZE_U64;
            if present.binary_search(&a).is_err() {
                status[k + i] = libc::ENOENT as u8;
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < n
                && present
                    .binary_search(&(s + j as u64 * PAGE_SIZE_U64))
                    .is_ok()
            {
                j += 1;
            }
            let r = stop.syscall(
                libc::SYS_madvise,
                [
                    a,
                    (j - i) as u64 * PAGE_SIZE_U64,
                    MADV_POPULATE_WRITE,
                    0,
                    0,
                    0,
                ],
            )?;
            let e = neg_errno(r).and_then(|e| e.raw_os_error()).unwrap_or(0);
            status[k + i..k + j].fill(e.clamp(0, 254) as u8);
            i = j;
        }
        k += n;
    }
    Ok(())
}

/// Waits until the handler of `mm` has applied every message it had read (its counter is even
/// or has moved on): a `REMOVE` completes the `madvise` that raised it when it is read, before
/// the handler applies it.
pub(crate) fn wait_handled(mm: &Mm) {
    let c = mm.handling.load(Ordering::Acquire);
    if c % 2 == 0 {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while mm.handling.load(Ordering::Acquire) == c && Instant::now() < deadline {
        std::thread::yield_now();
    }
}
