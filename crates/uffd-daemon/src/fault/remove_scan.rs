//! Telling `MADV_REMOVE` from `MADV_DONTNEED` in a REMOVE event nobody announced, by the
//! blocked caller's `/proc/PID/task/TID/syscall` (finding 9 of
//! docs/experiments/2026-11-27-shmem-paging.md, probe `probes/shmem/p6_remove_scan.c`).
//!
//! On shared memory the two raise the same `UFFD_EVENT_REMOVE`, but only `MADV_REMOVE` punches
//! the pages: an evicted page must then read as zeros, where after `MADV_DONTNEED` it keeps its
//! stored copy. The agent's `madvise` wrapper announces `MADV_REMOVE`; a raw system call, a
//! program without the agent (static, agentless) does not. The kernel keeps the caller in
//! `userfaultfd_event_wait_completion` (`TASK_KILLABLE`, set before the uffd is woken) until
//! the handler *reads* the event, and its syscall file shows the call meanwhile:
//!
//! ```text
//! uffd readable, the address space has evicted shared pages
//!   ─▶ scan: every thread of the process (and, of a thread in vfork/clone/clone3, the children
//!      that share the address space: kcmp(KCMP_VM)): "28 addr len advice ..." (madvise),
//!      "440 pidfd iovec vlen advice ..." (process_madvise on itself; its iovecs read through
//!      /proc/PID/mem, which never waits for a userfault)
//!   ─▶ read the messages ─▶ each REMOVE of shared memory: a caller found blocked whose range
//!      covers it, MADV_REMOVE first; each caller tells one event
//!   ─▶ none: a scan after the read (the caller may still be inside that madvise), which is
//!      believed only for MADV_REMOVE; else unresolved: taken as MADV_DONTNEED and counted
//! ```
//!
//! Why the scan comes before the read: reading the event lets the caller go, and its syscall
//! file says `running` or its next call. An event queued between the scan and the read (a
//! thread calling madvise while the handler is awake for another message) is not seen: 1.7-4.4 %
//! of the events of four threads calling madvise as fast as they can in the probe. The scan
//! after the read catches some (believed for `MADV_REMOVE` only); what is left stays
//! unresolved (`shmem_remove_unannounced`; docs/experiments/2026-11-28-shmem-remove.md).
//!
//! Why `MADV_REMOVE` wins a tie: two callers on one range, one of each kind, leave zeros
//! whichever event comes first, and a caller in `MADV_REMOVE` may make its range read as zeros
//! at any moment of its call.
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use crate::mm::Mm;
use crate::stats::Stats;

/// `MADV_REMOVE`.
const MADV_REMOVE: u64 = 9;
/// The most iovecs of a `process_madvise` looked at (the kernel's `UIO_MAXIOV`).
const MAX_IOVECS: u64 = 1024;

/// One line of `/proc/PID/task/TID/syscall`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SyscallLine {
    /// On a CPU or about to be: nothing can be said (`running`).
    Running,
    /// Stopped in user mode, or in the kernel outside a system call (a page fault): `-1 sp pc`.
    NoCall,
    /// Stopped inside system call `nr` with these arguments.
    Call {
        /// The number (x86-64).
        nr: i64,
        /// The six arguments.
        args: [u64; 6],
    },
}

/// Parses a syscall file's line (`nr a0 .. a5 sp pc`, hexadecimal arguments); `None` for
/// anything else.
pub(super) fn parse_syscall_line(line: &str) -> Option<SyscallLine> {
    let line = line.trim_end();
    if line == "running" {
        return Some(SyscallLine::Running);
    }
    let mut f = line.split_ascii_whitespace();
    let nr: i64 = f.next()?.parse().ok()?;
    if nr < 0 {
        return Some(SyscallLine::NoCall);
    }
    let mut args = [0u64; 6];
    for a in &mut args {
        *a = u64::from_str_radix(f.next()?.strip_prefix("0x")?, 16).ok()?;
    }
    Some(SyscallLine::Call { nr, args })
}

/// A thread found blocked in an madvise call.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Caller {
    advice: u64,
    /// `[start, end)` of each range of the call.
    ranges: Vec<(u64, u64)>,
    /// Already told an event of this batch.
    used: bool,
}

/// What a REMOVE event was, as far as the scan can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Advice {
    /// `MADV_REMOVE`: the range reads as zeros.
    Remove,
    /// Another advice, which keeps the page cache (`MADV_DONTNEED`, `MADV_DONTNEED_LOCKED`):
    /// stored copies stay valid.
    Keep,
}

/// A thread's `stat` and `syscall` files, kept open between scans.
#[derive(Debug)]
struct ThreadFiles {
    /// The scan that last saw the thread.
    round: u64,
    stat: File,
    /// Opened the first time the thread is found asleep uninterruptibly.
    syscall: Option<File>,
}

/// The thread ids of a process and the `nlink` of its `/proc/PID/task` when they were listed
/// (two more than its thread count).
#[derive(Debug)]
struct TaskList {
    pid: i32,
    dir: File,
    nlink: u64,
    tids: Vec<i32>,
}

/// Lists the thread ids of `pid`.
fn list_tasks(pid: i32) -> Option<Vec<i32>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    Some(
        dir.flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
            .collect(),
    )
}

/// The state letter of a `/proc/PID/task/TID/stat` line (after the command's last `)`).
fn stat_state(line: &[u8]) -> Option<u8> {
    let at = line.iter().rposition(|&b| b == b')')?;
    line.get(at + 2).copied()
}

/// The handler's scan of the callers of its address space (one per handler thread: it keeps
/// the threads' files open between scans, one `pread` a thread, two for one asleep
/// uninterruptibly).
#[derive(Debug, Default)]
pub(super) struct RemoveScan {
    /// Whether the last read of messages was preceded by a scan.
    pub(super) active: bool,
    /// The process the cached files are of.
    pid: i32,
    /// The files of each thread by its id.
    files: HashMap<i32, ThreadFiles>,
    /// Scans made (to drop the files of threads gone).
    round: u64,
    /// The thread ids of the address space's process.
    tasks: Option<TaskList>,
    callers: Vec<Caller>,
}

impl RemoveScan {
    /// Scans the threads of `mm`'s process (and of its children sharing its address space)
    /// for madvise calls in progress: called right before a read of the uffd that may return a
    /// REMOVE of evicted shared pages.
    pub(super) fn scan(&mut self, mm: &Mm, stats: &Stats) {
        let (t0, cpu0) = (Instant::now(), crate::sys::thread_cpu_ns());
        self.active = true;
        self.callers.clear();
        let Some(pid) = mm.pid() else {
            Stats::add(&stats.shmem_remove_scan_unreadable, 1);
            return;
        };
        if pid != self.pid {
            self.files.clear();
            self.tasks = None;
            self.pid = pid;
        }
        self.round += 1;
        let threads = self.scan_process(pid, true, stats);
        let round = self.round;
        self.files.retain(|_, f| f.round == round);
        Stats::add(&stats.shmem_remove_scans, 1);
        Stats::add(&stats.shmem_remove_scan_threads, threads);
        Stats::add(&stats.shmem_remove_scan_ns, t0.elapsed().as_nanos() as u64);
        Stats::add(
            &stats.shmem_remove_scan_cpu_ns,
            crate::sys::thread_cpu_ns().saturating_sub(cpu0),
        );
    }

    /// Reads the syscall file of every thread of `pid`; with `children` (the address space's
    /// own process), also of the children of a thread blocked in `vfork`, `clone` or `clone3`
    /// that share its address space. Returns the threads read.
    ///
    /// The own process's thread ids are listed again only when its thread count changed (the
    /// `nlink` of `/proc/PID/task`, one `fstat`) or a thread's files could not be read (one is
    /// gone, and another may have come with the same count): then at once, and the new ids
    /// are read in the same scan.
    fn scan_process(&mut self, pid: i32, children: bool, stats: &Stats) -> u64 {
        let tids = if children {
            self.task_list(pid, false)
        } else {
            list_tasks(pid)
        };
        let Some(tids) = tids else {
            Stats::add(&stats.shmem_remove_scan_unreadable, 1);
            return 0;
        };
        let mut n = 0;
        let mut failed = false;
        for &tid in &tids {
            n += 1;
            failed |= !self.read_one(pid, tid, children, stats, &mut n);
        }
        if children && failed {
            if let Some(again) = self.task_list(pid, true) {
                for tid in again.into_iter().filter(|t| !tids.contains(t)) {
                    n += 1;
                    self.read_one(pid, tid, children, stats, &mut n);
                }
            }
        }
        n
    }

    /// The thread ids of `pid` (the address space's process), from the cached list unless
    /// its count changed or `relist`.
    fn task_list(&mut self, pid: i32, relist: bool) -> Option<Vec<i32>> {
        use std::os::unix::fs::MetadataExt;
        let dir_ok = self.tasks.as_ref().is_some_and(|t| t.pid == pid);
        if !dir_ok {
            let dir = File::open(format!("/proc/{pid}/task")).ok()?;
            self.tasks = Some(TaskList {
                pid,
                dir,
                nlink: 0,
                tids: Vec::new(),
            });
        }
        let t = self.tasks.as_mut()?;
        let nlink = t.dir.metadata().ok()?.nlink();
        if relist || nlink != t.nlink || !dir_ok {
            let tids = list_tasks(pid)?;
            t.tids = tids;
            t.nlink = nlink;
        }
        Some(t.tids.clone())
    }

    /// Reads thread `tid` of `pid` and notes a caller found; false if it could not be read.
    fn read_one(&mut self, pid: i32, tid: i32, children: bool, stats: &Stats, n: &mut u64) -> bool {
        match self.read_thread(pid, tid) {
            Some(SyscallLine::Call { nr, args }) => match nr {
                libc::SYS_madvise => self.callers.push(Caller {
                    advice: args[2],
                    ranges: vec![(args[0], args[0].saturating_add(args[1]))],
                    used: false,
                }),
                libc::SYS_process_madvise => {
                    if let Some(ranges) = iovecs(pid, args[1], args[2]) {
                        self.callers.push(Caller {
                            advice: args[3],
                            ranges,
                            used: false,
                        });
                    } else {
                        Stats::add(&stats.shmem_remove_scan_unreadable, 1);
                    }
                }
                libc::SYS_vfork | libc::SYS_clone | libc::SYS_clone3 if children => {
                    for c in children_of(pid, tid) {
                        if crate::sys::same_address_space(pid, c).unwrap_or(false) {
                            *n += self.scan_process(c, false, stats);
                        }
                    }
                }
                _ => {}
            },
            Some(_) => {}
            None => {
                Stats::add(&stats.shmem_remove_scan_unreadable, 1);
                return false;
            }
        }
        true
    }

    /// The syscall line of thread `tid` of `pid` if it sleeps uninterruptibly (`D` in its
    /// `stat`: a REMOVE's caller waits `TASK_KILLABLE`), else [`SyscallLine::Running`]
    /// (running, or asleep elsewhere). Through files kept open, opened again once if a read
    /// fails (a thread gone whose number came back).
    ///
    /// Why `stat` first: reading the syscall file of a thread that is asleep but still on its
    /// run queue (a faulting thread preempted on its way into `schedule()` by the handler it
    /// woke) waits in the kernel's `wait_task_inactive` for a whole tick; the agentless client
    /// of the tests, one thread faulting, spent 33 us a scan on average so. `stat` never waits.
    fn read_thread(&mut self, pid: i32, tid: i32) -> Option<SyscallLine> {
        let mut buf = [0u8; 512];
        let round = self.round;
        for _ in 0..2 {
            let entry = match self.files.entry(tid) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let stat = File::open(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
                    v.insert(ThreadFiles {
                        round,
                        stat,
                        syscall: None,
                    })
                }
            };
            entry.round = round;
            let Ok(len) = entry.stat.read_at(&mut buf, 0) else {
                self.files.remove(&tid);
                continue;
            };
            if stat_state(&buf[..len]) != Some(b'D') {
                return Some(SyscallLine::Running);
            }
            if entry.syscall.is_none() {
                entry.syscall = File::open(format!("/proc/{pid}/task/{tid}/syscall")).ok();
            }
            match entry.syscall.as_ref().map(|f| f.read_at(&mut buf, 0)) {
                Some(Ok(len)) => {
                    return std::str::from_utf8(&buf[..len])
                        .ok()
                        .and_then(parse_syscall_line);
                }
                _ => {
                    self.files.remove(&tid);
                }
            }
        }
        None
    }

    /// What the REMOVE of `[start, end)` was, from the scan before the read: a caller not used
    /// yet whose range covers it, `MADV_REMOVE` first. `None`: no scan ran, or none covers it.
    pub(super) fn tell(&mut self, start: u64, end: u64) -> Option<Advice> {
        if !self.active {
            return None;
        }
        let covers = |c: &Caller| !c.used && c.ranges.iter().any(|&(s, e)| s <= start && end <= e);
        let i = self
            .callers
            .iter()
            .position(|c| covers(c) && c.advice == MADV_REMOVE)
            .or_else(|| self.callers.iter().position(covers))?;
        let c = &mut self.callers[i];
        c.used = true;
        Some(if c.advice == MADV_REMOVE {
            Advice::Remove
        } else {
            Advice::Keep
        })
    }

    /// After the read, for an event the first scan did not tell: whether a thread is still in
    /// an `MADV_REMOVE` covering `[start, end)` (believed only for that advice: another one
    /// may be the caller's next call on the same range).
    pub(super) fn tell_late(mm: &Mm, start: u64, end: u64, stats: &Stats) -> bool {
        let mut late = RemoveScan::default();
        late.scan(mm, stats);
        late.callers.iter().any(|c| {
            c.advice == MADV_REMOVE && c.ranges.iter().any(|&(s, e)| s <= start && end <= e)
        })
    }
}

/// The ranges of a `process_madvise` call's iovecs (`vlen` at `addr` of process `pid`).
fn iovecs(pid: i32, addr: u64, vlen: u64) -> Option<Vec<(u64, u64)>> {
    if vlen == 0 || vlen > MAX_IOVECS {
        return None;
    }
    let mut buf = vec![0u8; vlen as usize * 16];
    crate::sys::read_mem_at(pid, addr, &mut buf).ok()?;
    Some(
        buf.chunks_exact(16)
            .map(|v| {
                let base = u64::from_ne_bytes(v[..8].try_into().unwrap_or_default());
                let len = u64::from_ne_bytes(v[8..].try_into().unwrap_or_default());
                (base, base.saturating_add(len))
            })
            .collect(),
    )
}

/// The children of thread `tid` of `pid`.
fn children_of(pid: i32, tid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/children"))
        .map(|s| {
            s.split_ascii_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MADV_DONTNEED: u64 = 4;

    #[test]
    fn stat_state_after_the_last_parenthesis() {
        assert_eq!(stat_state(b"123 (a) b) D 1 2 3"), Some(b'D'));
        assert_eq!(stat_state(b"123 (sleep) S 1"), Some(b'S'));
        assert_eq!(stat_state(b"123 (x"), None);
    }

    #[test]
    fn syscall_lines_as_the_kernel_writes_them() {
        // From probe p6 on 6.18.44: a thread in madvise(addr, 4096, MADV_REMOVE).
        assert_eq!(
            parse_syscall_line(
                "28 0x7fa5269d2000 0x1000 0x9 0x0 0x0 0x0 0x7fff5a2fc4d8 0x7fa526a1d6f9\n"
            ),
            Some(SyscallLine::Call {
                nr: 28,
                args: [0x7fa5269d2000, 0x1000, 9, 0, 0, 0]
            })
        );
        assert_eq!(
            parse_syscall_line("-1 0x7ffd0 0x401000\n"),
            Some(SyscallLine::NoCall)
        );
        assert_eq!(parse_syscall_line("running\n"), Some(SyscallLine::Running));
        assert_eq!(parse_syscall_line("28 0x1 0x2\n"), None, "cut short");
        assert_eq!(parse_syscall_line(""), None);
        assert_eq!(parse_syscall_line("x 0x1"), None);
    }

    fn caller(advice: u64, s: u64, e: u64) -> Caller {
        Caller {
            advice,
            ranges: vec![(s, e)],
            used: false,
        }
    }

    #[test]
    fn each_caller_tells_one_event_and_remove_wins_a_tie() {
        let mut scan = RemoveScan {
            active: true,
            callers: vec![
                caller(MADV_DONTNEED, 0x1000, 0x3000),
                caller(MADV_REMOVE, 0x1000, 0x3000),
                caller(MADV_DONTNEED, 0x8000, 0x9000),
            ],
            ..RemoveScan::default()
        };
        assert_eq!(scan.tell(0x1000, 0x3000), Some(Advice::Remove));
        assert_eq!(scan.tell(0x1000, 0x2000), Some(Advice::Keep));
        // Both callers of that range told their event: a third is not told.
        assert_eq!(scan.tell(0x1000, 0x2000), None);
        // Not covered: a range reaching past the call's.
        assert_eq!(scan.tell(0x8000, 0xa000), None);
        assert_eq!(scan.tell(0x8000, 0x9000), Some(Advice::Keep));
        // No scan before the read: nothing is told.
        let mut idle = RemoveScan {
            callers: vec![caller(MADV_REMOVE, 0, u64::MAX)],
            ..RemoveScan::default()
        };
        assert_eq!(idle.tell(0x1000, 0x2000), None);
    }
}
