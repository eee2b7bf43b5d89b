//! System calls run inside a program that has no agent: one thread is stopped with ptrace,
//! made to execute a `syscall` instruction with the daemon's arguments, and given back exactly
//! as it was (the technique of CRIU's compel, without a parasite: no memory of the program is
//! written, the `syscall` instruction is one of its vDSO's).
//!
//! ```text
//! PTRACE_SEIZE(tid) ─▶ PTRACE_INTERRUPT ─▶ wait for the stop (bounded) ─▶ save the registers
//!   ─▶ per call: rip = vDSO `syscall`, rax = nr, orig_rax = -1, args ─▶ PTRACE_SINGLESTEP
//!      ─▶ the step's SIGTRAP stop: rax = result
//!   ─▶ restore the saved registers unchanged ─▶ PTRACE_DETACH (a signal dequeued meanwhile is
//!      given back)
//! ```
//!
//! **Restarts.** A thread stopped inside a blocking system call (`read`, `nanosleep`, `futex`)
//! stops with `rax` = `-ERESTARTSYS` (or `-ERESTARTNOINTR`, `-ERESTARTNOHAND`,
//! `-ERESTART_RESTARTBLOCK`) and `orig_rax` = its number: the kernel restarts the call on the
//! way back to user mode, after the stop. The injected state sets `orig_rax` = -1, so that no
//! restart fix-up is applied to it; the saved state is restored unchanged before the detach,
//! which happens in the step's signal-delivery stop, before the kernel's restart decision: the
//! program's call restarts exactly as it would have after any stop (`tests/agentless.rs`).
//!
//! **What is never done.** No injection into a process with a seccomp filter on any thread (an
//! injected call could be refused, or kill it); none into a process already traced (a debugger,
//! strace): the seize fails and the process stays unmanaged. Every wait is bounded: a thread
//! that does not stop in [`STOP_TIMEOUT`] is left seized, and the monitor detaches it when its
//! stop comes (`daemon.rs`, the reaping loop).
//!
//! All ptrace calls are made by one thread, the monitor (the tracer of a tracee is a thread,
//! not a process); this module is called only from it.

use std::io;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::sys::{self, Regs, TraceeState};

/// How long a thread may take to stop (longer than a fault held at the limit, 2 s, so that a
/// thread stopped in such a fault is not mistaken for a stuck one).
pub const STOP_TIMEOUT: Duration = Duration::from_millis(2_500);

/// How long one injected call may take to come back (a `madvise` waits for the handler to read
/// its `REMOVE` event; the handler never waits for reclaim).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a system call could not be run in a process.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InjectError {
    /// A thread of the process has a seccomp filter (or strict mode).
    #[error("a thread has a seccomp filter (Seccomp: {0} in its status): an injected call could be refused or kill it")]
    Seccomp(u32),
    /// Another tracer holds it.
    #[error("it is traced by pid {0} (a debugger or strace)")]
    Traced(i32),
    /// The kernel refused the seize (YAMA, privileges).
    #[error("ptrace refused ({0})")]
    Refused(io::Error),
    /// The process (or the thread) is gone; the process's exit status if the wait reaped it.
    #[error("it exited")]
    Gone(Option<i32>),
    /// The thread did not stop in time.
    #[error("its thread {0} did not stop within {STOP_TIMEOUT:?}")]
    NoStop(i32),
    /// No `syscall` instruction was found in its vDSO.
    #[error("no syscall instruction found in its vDSO")]
    NoSyscall,
    /// Anything else a ptrace call answered.
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl InjectError {
    fn from_ptrace(e: io::Error) -> Self {
        if e.raw_os_error() == Some(libc::ESRCH) {
            InjectError::Gone(None)
        } else {
            InjectError::Io(e)
        }
    }
}

/// The offset of a `syscall` instruction (0f 05) in this kernel's 64-bit vDSO, found once in
/// the daemon's own (every process of a kernel maps the same image).
fn vdso_syscall_offset() -> Option<u64> {
    static OFFSET: OnceLock<Option<u64>> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        let me = sys::getpid();
        let (start, end) = vdso_of(me)?;
        let mut image = vec![0u8; (end - start) as usize];
        match sys::read_remote(me, &[(start, image.len())], &mut image) {
            Ok(n) if n == image.len() => {}
            _ => return None,
        }
        image
            .windows(2)
            .position(|w| w == [0x0f, 0x05])
            .map(|i| i as u64)
    })
}

/// The `[vdso]` mapping of `pid`.
fn vdso_of(pid: i32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    crate::maps::parse_maps(&text)
        .into_iter()
        .find(|v| v.path == "[vdso]")
        .map(|v| (v.start, v.end))
}

/// Whether `pid` has an address space at all (an exiting process's maps read empty).
fn has_maps(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|t| !t.is_empty())
}

/// Whether `pid` is exiting or gone: no status, a zombie or dead state, or an address space
/// already torn down (its maps read empty).
fn exiting(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    matches!(state, None | Some('Z' | 'X' | 'x')) || !has_maps(pid)
}

/// The address of a `syscall` instruction in `pid`'s vDSO, checked by reading it there. A
/// process that exits meanwhile (its vDSO unmapped or unreadable under the daemon's feet) is
/// `Gone`, not a process that cannot be stopped.
fn syscall_insn_of(pid: i32) -> Result<u64, InjectError> {
    let off = vdso_syscall_offset().ok_or(InjectError::NoSyscall)?;
    let not_found = || {
        if exiting(pid) {
            InjectError::Gone(None)
        } else {
            InjectError::NoSyscall
        }
    };
    let Some((start, end)) = vdso_of(pid) else {
        return Err(not_found());
    };
    let at = start + off;
    if at + 2 > end {
        return Err(InjectError::NoSyscall);
    }
    let mut b = [0u8; 2];
    match sys::read_remote(pid, &[(at, 2)], &mut b) {
        Ok(2) if b == [0x0f, 0x05] => Ok(at),
        _ => Err(not_found()),
    }
}

/// A field of `/proc/PID/task/TID/status` as a number.
fn status_field(pid: i32, tid: i32, key: &str) -> Option<i64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
}

/// The threads of `pid`, the leader first.
fn threads_of(pid: i32) -> Vec<i32> {
    let mut tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect();
    tids.sort_unstable_by_key(|&t| (t != pid, t));
    tids
}

/// The fields of thread `tid`'s `/proc/PID/task/TID/stat` after its command name: the state
/// (field 3 of the file) is the first, so field `n` of the file is at `n - 3`.
fn task_stat(pid: i32, tid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Whether thread `tid` of `pid` sleeps uninterruptibly (state `D`): a thread in a fault the
/// kernel took for a system call (a `read(2)` into an evicted page, the page pinning of an
/// `O_DIRECT` read or of io_uring's buffer registration) waits so, and stops only once the
/// fault is served, which may be after the very DROP the stop is for.
fn uninterruptible(pid: i32, tid: i32) -> bool {
    task_stat(pid, tid).is_some_and(|f| f.first().is_some_and(|s| s == "D"))
}

/// Whether thread `tid` of `pid` is exiting (`PF_EXITING` in its flags, field 9), a zombie, or
/// gone. `PTRACE_SEIZE` refuses an exiting thread with `EPERM`, as it refuses one it may not
/// trace: a process caught in its exit is gone, not a process that can no longer be stopped.
fn thread_exiting(pid: i32, tid: i32) -> bool {
    const PF_EXITING: u64 = 0x4;
    let Some(f) = task_stat(pid, tid) else {
        return true;
    };
    matches!(f.first().map(String::as_str), Some("Z" | "X" | "x"))
        || f.get(6)
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|flags| flags & PF_EXITING != 0)
}

/// How long a thread being stopped may sit in one userfault from the kernel before the stop
/// is given up (its faults are served at once meanwhile: one still waiting waits for the DROP).
const HELD_IN_FAULT: Duration = Duration::from_millis(20);

/// Whether thread `tid` of `pid` waits in a userfault (its wait channel).
fn in_userfault(pid: i32, tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/wchan"))
        .is_ok_and(|w| w.trim() == "handle_userfault")
}

/// The faults thread `tid` of `pid` has completed, minor and major (`/proc/.../stat` fields 10
/// and 12; the kernel counts faults taken for `get_user_pages` there too): a thread in a
/// kernel-mode fault whose count moves is going through a run of faults that are served, not
/// held in one.
fn faults_done(pid: i32, tid: i32) -> Option<u64> {
    // minflt is field 10, majflt field 12.
    let f = task_stat(pid, tid)?;
    let min: u64 = f.get(7)?.parse().ok()?;
    let maj: u64 = f.get(9)?.parse().ok()?;
    Some(min + maj)
}

/// Whether a process may be injected into at all: no seccomp filter on any thread, no tracer.
pub fn check_injectable(pid: i32) -> Result<(), InjectError> {
    let tids = threads_of(pid);
    if tids.is_empty() {
        return Err(InjectError::Gone(None));
    }
    for &t in &tids {
        match status_field(pid, t, "Seccomp:") {
            Some(0) | None => {}
            Some(m) => return Err(InjectError::Seccomp(m as u32)),
        }
        match status_field(pid, t, "TracerPid:") {
            Some(0) | None => {}
            Some(p) if p as i32 == sys::getpid() => {}
            Some(p) => return Err(InjectError::Traced(p as i32)),
        }
    }
    Ok(())
}

/// One thread of a program, stopped for the daemon's calls. Dropping it gives the thread back
/// ([`Stop::release`]).
#[derive(Debug)]
pub struct Stop {
    pid: i32,
    tid: i32,
    saved: Regs,
    syscall_at: u64,
    /// Signals the thread dequeued during the stop (not the steps' SIGTRAPs): the first is
    /// delivered by the detach, the others queued again.
    signals: Vec<i32>,
    released: bool,
    /// When the stop began, and the time spent in the injected calls themselves.
    pub began: Instant,
    /// Nanoseconds spent from each step to its trap.
    pub call_ns: u64,
    /// Nanoseconds from the seize to the stop (registers saved), and of the release.
    pub fixed_ns: u64,
    /// Calls made.
    pub calls: u32,
}

impl Stop {
    /// Stops one thread of `pid` (`PTRACE_SEIZE` + `PTRACE_INTERRUPT`) after checking that the
    /// process may be injected into.
    pub fn seize(pid: i32) -> Result<Stop, InjectError> {
        Self::seize_noting(pid, &std::sync::atomic::AtomicI32::new(0))
    }

    /// [`Stop::seize`], storing in `stopping` the thread it waits for (so that its faults are
    /// served at once: a thread in a kernel-mode fault stops only once it is served), by its
    /// number in its own pid namespace, as its faults name it.
    pub fn seize_noting(
        pid: i32,
        stopping: &std::sync::atomic::AtomicI32,
    ) -> Result<Stop, InjectError> {
        check_injectable(pid)?;
        let syscall_at = syscall_insn_of(pid)?;
        let began = Instant::now();
        let mut last = InjectError::Gone(None);
        let me = sys::getpid();
        // The leader first, but a thread waiting uninterruptibly (in a kernel-mode fault, which
        // may wait for this very DROP) last: any thread will do.
        let mut tids = threads_of(pid);
        tids.sort_by_cached_key(|&t| uninterruptible(pid, t));
        for tid in tids {
            let mut ours = false;
            match sys::ptrace_seize(tid, 0) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                // Seized by an earlier stop that did not come in time: its interrupt is still
                // pending, and its stop will do.
                Err(e)
                    if e.raw_os_error() == Some(libc::EPERM)
                        && status_field(pid, tid, "TracerPid:") == Some(me as i64) =>
                {
                    ours = true
                }
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    // An exiting thread (a leader that called pthread_exit) refuses with EPERM
                    // too: try the next one, and say what the last refusal was.
                    last = match status_field(pid, tid, "TracerPid:") {
                        Some(p) if p != 0 => InjectError::Traced(p as i32),
                        _ if thread_exiting(pid, tid) => InjectError::Gone(None),
                        _ => InjectError::Refused(e),
                    };
                    continue;
                }
                Err(e) => return Err(InjectError::Refused(e)),
            }
            let own = crate::maps::own_ns_tid(pid, tid).unwrap_or(tid);
            stopping.store(own, std::sync::atomic::Ordering::Release);
            if let Err(e) =
                sys::ptrace_interrupt(tid).or_else(|e| if ours { Ok(()) } else { Err(e) })
            {
                let _ = sys::ptrace_detach(tid, 0);
                last = InjectError::from_ptrace(e);
                continue;
            }
            let mut stop = Stop {
                pid,
                tid,
                saved: sys::empty_regs(),
                syscall_at,
                signals: Vec::new(),
                released: false,
                began,
                call_ns: 0,
                fixed_ns: 0,
                calls: 0,
            };
            stop.wait_first_stop()?;
            // Checked again now that the thread cannot change: a filter installed since the
            // first check (by this thread, or by another with TSYNC) forbids the calls.
            if let Some(m) = status_field(pid, tid, "Seccomp:").filter(|&m| m != 0) {
                stop.release();
                return Err(InjectError::Seccomp(m as u32));
            }
            stop.saved = sys::ptrace_getregs(tid).map_err(InjectError::from_ptrace)?;
            stop.fixed_ns = began.elapsed().as_nanos() as u64;
            return Ok(stop);
        }
        Err(last)
    }

    /// A thread already in a ptrace stop of this thread's (`PTRACE_TRACEME` at exec: the
    /// `SIGTRAP` after the exec).
    pub fn stopped(pid: i32) -> Result<Stop, InjectError> {
        let mut stop = Stop {
            pid,
            tid: pid,
            saved: sys::empty_regs(),
            syscall_at: 0,
            signals: Vec::new(),
            released: false,
            began: Instant::now(),
            call_ns: 0,
            fixed_ns: 0,
            calls: 0,
        };
        // Waits for the exec's SIGTRAP (nothing else can come first: the thread was stopped
        // at its exec, before any instruction of the new image).
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match sys::wait_tracee(pid).map_err(InjectError::from_ptrace)? {
                Some(TraceeState::Stopped {
                    sig: libc::SIGTRAP, ..
                }) => break,
                // A signal that came before the exec's trap (queued then: the spawn returned
                // only once the exec was done): given back at the detach; stepping on meets the
                // trap before any instruction of the program runs.
                Some(TraceeState::Stopped { sig, .. }) => {
                    stop.signals.push(sig);
                    sys::ptrace_singlestep(pid, 0).map_err(InjectError::from_ptrace)?;
                }
                Some(TraceeState::Exited(st)) => {
                    stop.released = true;
                    return Err(InjectError::Gone(Some(st)));
                }
                None if Instant::now() > deadline => {
                    stop.released = true; // (left seized: the monitor detaches it later)
                    return Err(InjectError::NoStop(pid));
                }
                None => std::thread::sleep(Duration::from_micros(100)),
            }
        }
        stop.syscall_at = match syscall_insn_of(pid) {
            Ok(a) => a,
            Err(e) => {
                stop.release();
                return Err(e);
            }
        };
        stop.saved = sys::ptrace_getregs(pid).map_err(InjectError::from_ptrace)?;
        Ok(stop)
    }

    /// The stopped thread.
    pub fn tid(&self) -> i32 {
        self.tid
    }

    /// The page of the stopped thread's rseq area, if it registered one: the kernel writes
    /// it on the thread's way back to user mode (after each injected call too), so it must not
    /// be write-protected while the thread is stepped.
    pub fn rseq_page(&self) -> Option<u64> {
        sys::ptrace_rseq_area(self.tid)
            .ok()
            .filter(|&a| a != 0)
            .map(|a| a & !(crate::sys::PAGE_SIZE_U64 - 1))
    }

    fn wait_first_stop(&mut self) -> Result<(), InjectError> {
        let began = Instant::now();
        let deadline = began + STOP_TIMEOUT;
        let mut nap = Duration::from_micros(20);
        // Since when the thread has waited in one userfault from the kernel, and its fault
        // count then.
        let mut held: Option<(Instant, Option<u64>)> = None;
        loop {
            match sys::wait_tracee(self.tid).map_err(InjectError::from_ptrace) {
                Ok(Some(TraceeState::Stopped { event, .. })) if event == sys::PTRACE_EVENT_STOP => {
                    return Ok(())
                }
                // A signal dequeued before the interrupt's stop: given back at the detach.
                // The interrupt's stop is still to come, but any stop will do.
                Ok(Some(TraceeState::Stopped { sig, .. })) => {
                    self.signals.push(sig);
                    return Ok(());
                }
                Ok(Some(TraceeState::Exited(st))) => {
                    self.released = true;
                    return Err(InjectError::Gone((self.tid == self.pid).then_some(st)));
                }
                // A thread held in a userfault from the kernel (its faults are served at once
                // while it is the one being stopped, so this one waits for the daemon: a
                // write to a page of the very batch the stop is for, from `read(2)` or the page
                // pinning of an O_DIRECT read or an io_uring registration) stops only after
                // the DROP, which waits for the stop: given up once it has sat in one fault for
                // `HELD_IN_FAULT`, rather than at the deadline (the batch stays resident, and
                // the fault goes on). A thread going through a run of kernel-mode faults, each
                // served at once (a `write(2)` from evicted memory, a buffer being pinned), is
                // in a userfault at most looks too, but its fault count moves: it stops once
                // its call is done. (Giving those up made reclaim look stalled and let every
                // fault through the limit: 1 650 pages over it at a program's start.)
                Ok(None)
                    if began.elapsed() > Duration::from_millis(1)
                        && Instant::now() <= deadline
                        && uninterruptible(self.pid, self.tid)
                        && in_userfault(self.pid, self.tid) =>
                {
                    let now = faults_done(self.pid, self.tid);
                    match held {
                        Some((since, seen)) if seen == now => {
                            if since.elapsed() > HELD_IN_FAULT {
                                let _ = sys::ptrace_detach(self.tid, 0);
                                self.released = true;
                                return Err(InjectError::NoStop(self.tid));
                            }
                        }
                        _ => held = Some((Instant::now(), now)),
                    }
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_millis(1));
                }
                Ok(None) if Instant::now() > deadline => {
                    if std::env::var_os("UFFD_DAEMON_DEBUG_INJECT").is_some() {
                        let f = |n: &str| {
                            std::fs::read_to_string(format!(
                                "/proc/{}/task/{}/{n}",
                                self.pid, self.tid
                            ))
                            .unwrap_or_default()
                        };
                        tracing::warn!(
                            "no stop: stat {} wchan {} syscall {} stack {}",
                            f("stat"),
                            f("wchan"),
                            f("syscall"),
                            f("stack")
                        );
                    }
                    // Left seized with the interrupt pending: it stops when it can, and the
                    // monitor's reaping loop detaches it then.
                    let _ = sys::ptrace_detach(self.tid, 0);
                    self.released = true;
                    return Err(InjectError::NoStop(self.tid));
                }
                Ok(None) => {
                    held = None;
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_millis(1));
                }
                Err(e) => {
                    self.released = true;
                    return Err(e);
                }
            }
        }
    }

    /// Runs system call `nr` with `args` in the stopped thread; returns what it returned
    /// (a negative errno on failure, as the kernel gives it).
    pub fn syscall(&mut self, nr: i64, args: [u64; 6]) -> Result<i64, InjectError> {
        let mut regs = self.saved;
        regs.rip = self.syscall_at;
        regs.rax = nr as u64;
        // No restart fix-up for the injected state: the saved state's is the program's.
        regs.orig_rax = u64::MAX;
        regs.rdi = args[0];
        regs.rsi = args[1];
        regs.rdx = args[2];
        regs.r10 = args[3];
        regs.r8 = args[4];
        regs.r9 = args[5];
        // Below the red zone, should anything but the syscall instruction run.
        regs.rsp = (self.saved.rsp - 512) & !15;
        let t = Instant::now();
        sys::ptrace_setregs(self.tid, &regs).map_err(InjectError::from_ptrace)?;
        sys::ptrace_singlestep(self.tid, 0).map_err(InjectError::from_ptrace)?;
        let deadline = Instant::now() + CALL_TIMEOUT;
        let mut result = None;
        let mut nap = Duration::from_micros(5);
        loop {
            let st = match sys::wait_tracee(self.tid).map_err(InjectError::from_ptrace)? {
                Some(st) => st,
                None if Instant::now() > deadline => return Err(InjectError::NoStop(self.tid)),
                None => {
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_micros(500));
                    continue;
                }
            };
            let (sig, event) = match st {
                TraceeState::Stopped { sig, event } => (sig, event),
                TraceeState::Exited(s) => {
                    self.released = true;
                    return Err(InjectError::Gone((self.tid == self.pid).then_some(s)));
                }
            };
            let now = sys::ptrace_getregs(self.tid).map_err(InjectError::from_ptrace)?;
            let ran = now.rip == self.syscall_at + 2;
            if ran && result.is_none() {
                result = Some(now.rax as i64);
            }
            match (sig, event) {
                // The step's trap: done (a stop with the call not run yet is stepped again).
                (libc::SIGTRAP, 0) if result.is_some() => break,
                (libc::SIGTRAP, 0) => {}
                // A group-stop or the interrupt's stop: step on (after the call, this consumes
                // the step's SIGTRAP still queued before any instruction runs).
                (_, e) if e != 0 => {}
                // A signal for the program: given back at the detach.
                (s, _) => self.signals.push(s),
            }
            sys::ptrace_singlestep(self.tid, 0).map_err(InjectError::from_ptrace)?;
        }
        self.call_ns += t.elapsed().as_nanos() as u64;
        self.calls += 1;
        Ok(result.unwrap_or(-(libc::EIO as i64)))
    }

    /// Restores the thread's registers exactly and detaches; a signal it dequeued during the
    /// stop is delivered, as it would have been.
    pub fn release(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        let t = Instant::now();
        if self.syscall_at != 0 || self.calls > 0 {
            let _ = sys::ptrace_setregs(self.tid, &self.saved);
        }
        let first = self.signals.first().copied().unwrap_or(0);
        if sys::ptrace_detach(self.tid, first).is_ok() {
            for &s in self.signals.iter().skip(1) {
                let _ = sys::tgkill(self.pid, self.tid, s);
            }
        }
        self.fixed_ns += t.elapsed().as_nanos() as u64;
    }
}

impl Drop for Stop {
    fn drop(&mut self) {
        self.release();
    }
}

/// Runs `nr(args)` in `pid` in a stop of its own (tests and measurements).
pub fn one_call(pid: i32, nr: i64, args: [u64; 6]) -> Result<i64, InjectError> {
    let mut s = Stop::seize(pid)?;
    let r = s.syscall(nr, args);
    s.release();
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A process caught in its exit refuses the seize with `EPERM`, as one that may not be
    /// traced does; the stop must call it gone (it cost a process its evictions, counted as an
    /// agent lost, in a CI run where the program exited under a DROP). The window in which the
    /// stop's first checks pass and the seize meets the exit is too short to hit on purpose: a
    /// zombie is already gone at those checks. What is checked is the kernel's answer and that
    /// `thread_exiting` reads it from the thread.
    #[test]
    fn a_process_in_its_exit_is_gone_not_refused() {
        if sys::geteuid() != 0 {
            eprintln!("SKIP: needs root");
            return;
        }
        let mut child = Command::new("true").spawn().expect("true");
        let pid = child.id() as i32;
        // Not reaped: a zombie, PF_EXITING set, its mm gone.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !thread_exiting(pid, pid) {
            assert!(Instant::now() < deadline, "the child never exited");
            std::thread::sleep(Duration::from_millis(5));
        }
        let seize = sys::ptrace_seize(pid, 0);
        assert_eq!(
            seize.as_ref().err().and_then(|e| e.raw_os_error()),
            Some(libc::EPERM),
            "the kernel's answer to seizing a zombie changed: {seize:?}"
        );
        match Stop::seize(pid) {
            Err(InjectError::Gone(_)) => {}
            other => panic!("a zombie was not taken for gone: {other:?}"),
        }
        let mut live = Command::new("sleep").arg("5").spawn().expect("sleep");
        assert!(!thread_exiting(live.id() as i32, live.id() as i32));
        live.kill().ok();
        live.wait().ok();
        child.wait().expect("wait");
    }

    /// A child blocked in `nanosleep` (the shell's `sleep`, which restarts it through
    /// `restart_syscall`) runs injected calls and sleeps on exactly as it would have.
    #[test]
    fn a_call_injected_into_a_sleeping_process_leaves_its_sleep_alone() {
        if sys::geteuid() != 0 {
            eprintln!("SKIP: needs root (ptrace of a child is allowed anyway, but YAMA may not)");
            return;
        }
        let t0 = Instant::now();
        let mut child = Command::new("sleep")
            .arg("0.5")
            .stdout(Stdio::null())
            .spawn()
            .expect("sleep");
        let pid = child.id() as i32;
        std::thread::sleep(Duration::from_millis(100));
        for _ in 0..20 {
            let r = one_call(pid, libc::SYS_getpid, [0; 6]).expect("injection");
            assert_eq!(r, pid as i64, "getpid in the child");
        }
        let st = child.wait().expect("wait");
        assert!(st.success(), "sleep ended with {st}");
        assert!(
            t0.elapsed() >= Duration::from_millis(500),
            "the sleep was cut short"
        );
    }
}
