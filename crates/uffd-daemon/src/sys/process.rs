//! The daemon as a process: its ids, its limits, its signals, and the children it reaps. On
//! rustix, except the signal dispositions (rustix has no safe `signal`/`sigaction`) and the C
//! library's own `malloc_trim`.

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};

use rustix::process::{Pid, Signal, WaitOptions};

/// The daemon's process id (in its own pid namespace).
pub fn getpid() -> i32 {
    rustix::process::getpid().as_raw_pid()
}

/// The calling thread's id.
pub fn gettid() -> i32 {
    rustix::thread::gettid().as_raw_pid()
}

/// The daemon's real user id.
pub fn getuid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// The daemon's effective user id (0: root).
pub fn geteuid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A process id as rustix takes it: `EINVAL` for 0 and below (which `kill` would take for a
/// process group or for every process: never meant here).
fn pid_of(pid: i32) -> io::Result<Pid> {
    match pid {
        1.. => Pid::from_raw(pid).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL)),
        _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

/// A signal by its number: `EINVAL` for one that has no name (a real-time signal, 0).
fn signal_of(sig: i32) -> io::Result<Signal> {
    Signal::from_named_raw(sig).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `kill(pid, sig)` of one process (`pid` > 0) with a named signal.
pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
    Ok(rustix::process::kill_process(
        pid_of(pid)?,
        signal_of(sig)?,
    )?)
}

/// Whether process `pid` is gone: `kill(pid, 0)` fails with `ESRCH` (a process of another
/// user, which refuses with `EPERM`, is there).
pub fn process_gone(pid: i32) -> bool {
    let Ok(pid) = pid_of(pid) else {
        return false;
    };
    rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH)
}

/// A pidfd of `pid` (`pidfd_open`; close-on-exec, as the kernel makes every pidfd).
pub(super) fn pidfd_open(pid: i32) -> io::Result<std::os::fd::OwnedFd> {
    // (pidfd_open(2) refuses 0 and negative numbers with EINVAL, as `pid_of` does.)
    Ok(rustix::process::pidfd_open(
        pid_of(pid)?,
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// `pidfd_send_signal(pidfd, sig, NULL, 0)` with a named signal.
pub(super) fn pidfd_send_signal(pidfd: impl std::os::fd::AsFd, sig: i32) -> io::Result<()> {
    Ok(rustix::process::pidfd_send_signal(pidfd, signal_of(sig)?)?)
}

/// Raises the soft limit on open descriptors to the hard one (nothing when it is there, or
/// when the kernel refuses).
pub fn raise_fd_limit() {
    use rustix::process::{Resource, Rlimit};
    let lim = rustix::process::getrlimit(Resource::Nofile);
    // (`None` is RLIM_INFINITY.)
    if lim.current.unwrap_or(u64::MAX) < lim.maximum.unwrap_or(u64::MAX) {
        let _ = rustix::process::setrlimit(
            Resource::Nofile,
            Rlimit {
                current: lim.maximum,
                maximum: lim.maximum,
            },
        );
    }
}

/// Makes the daemon a child subreaper (`PR_SET_CHILD_SUBREAPER`, 1): the orphans of its tree
/// are reparented to it, not to init.
pub fn set_child_subreaper() -> io::Result<()> {
    // (rustix passes the pid's number as the flag: 1, as the kernel reads it as a boolean.)
    Ok(rustix::process::set_child_subreaper(Pid::from_raw(1))?)
}

/// The last signal [`catch_signals`] caught (0: none since the last call).
static CAUGHT: AtomicI32 = AtomicI32::new(0);

extern "C" fn record_signal(sig: libc::c_int) {
    CAUGHT.store(sig, Ordering::Relaxed);
}

/// Ignores `SIGPIPE` (a write to a closed socket or pipe is an `EPIPE` error instead).
pub fn ignore_sigpipe() {
    // SAFETY: SIG_IGN for a signal number of the platform; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Catches each of `sigs` with a handler that only records it (read with
/// [`take_caught_signal`]), except a signal that was ignored when the daemon started: that one
/// stays ignored (and so for the programs the daemon starts, which inherit the disposition;
/// a caught one is reset to the default across their exec). `signal(2)`'s BSD semantics:
/// system calls the signal interrupts restart.
pub fn catch_signals(sigs: &[i32]) {
    for &sig in sigs {
        // SAFETY: the handler is async-signal-safe (it only stores an atomic); `sig` is a
        // signal number, and a bad one is refused by the kernel (SIG_ERR), not undefined.
        unsafe {
            if libc::signal(sig, record_signal as *const () as libc::sighandler_t) == libc::SIG_IGN
            {
                libc::signal(sig, libc::SIG_IGN);
            }
        }
    }
}

/// The last signal caught by [`catch_signals`]'s handler since the last call (0: none).
pub fn take_caught_signal() -> i32 {
    CAUGHT.swap(0, Ordering::Relaxed)
}

/// A child of the daemon, or a tracee, that changed state (`waitpid(-1, WNOHANG | __WALL)`):
/// its pid and raw wait status (decoded by [`super::decode_wait_status`] and
/// [`shell_status`]). `None` when none has, or the daemon has no child left (`ECHILD`).
pub fn reap_any() -> Option<(i32, i32)> {
    let opts = WaitOptions::NOHANG | WaitOptions::from_bits_retain(libc::__WALL as u32);
    match rustix::process::wait(opts) {
        Ok(Some((pid, st))) => Some((pid.as_raw_pid(), st.as_raw())),
        Ok(None) | Err(_) => None,
    }
}

/// A wait status as a shell gives it: the exit code, 128 + N for signal N, 1 otherwise.
pub fn shell_status(st: i32) -> i32 {
    if libc::WIFEXITED(st) {
        libc::WEXITSTATUS(st)
    } else if libc::WIFSIGNALED(st) {
        128 + libc::WTERMSIG(st)
    } else {
        1
    }
}

/// Gives the C allocator's free memory back to the kernel (`malloc_trim(0)`; a C library call,
/// not a system call: rustix has none).
pub fn trim_allocator() {
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe { libc::malloc_trim(0) };
}
