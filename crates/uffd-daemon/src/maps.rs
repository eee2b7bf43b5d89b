//! Finding a client's private anonymous memory from outside: `/proc/PID/maps` for the ranges,
//! `/proc/PID/pagemap` for the pages already present.
//!
//! glibc's malloc calls mmap and brk internally, so interposing `mmap` in the agent would miss
//! most of the heap (DESIGN.md); reading the maps sees every mapping, whoever made it.

use std::io::{self, Read, Seek, SeekFrom};

use crate::sys::{PidFd, PAGE_SIZE_U64};

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vma {
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// `rwxp` permissions.
    pub perms: String,
    /// Inode (0 for anonymous memory).
    pub inode: u64,
    /// Offset in the mapped file, in bytes (a shared anonymous mapping's page offset: a part
    /// of it moved by `mremap` keeps its pages' offsets).
    pub offset: u64,
    /// Device of the mapped inode (`major`, `minor`).
    pub dev: (u32, u32),
    /// Path or pseudo-path (`[heap]`, `[stack]`, `[anon:name]`), empty for plain anonymous.
    pub path: String,
}

impl Vma {
    /// Private, writable, anonymous memory that the daemon can register and page: the heap,
    /// anonymous mmaps (malloc arenas, thread stacks). Not the main stack (it grows down), not
    /// the kernel's special mappings, not files.
    pub fn is_managed(&self) -> bool {
        let p = self.perms.as_bytes();
        p.len() == 4
            && p[0] == b'r'
            && p[1] == b'w'
            && p[3] == b'p'
            && self.inode == 0
            && (self.path.is_empty() || self.path == "[heap]" || self.path.starts_with("[anon:"))
    }

    /// Shared anonymous memory the daemon can page (`shmem.rs`): a writable `MAP_SHARED`
    /// mapping of the unnamed shmem inode that `MAP_SHARED|MAP_ANONYMOUS` and a shared mapping
    /// of `/dev/zero` create (`shmem_zero_setup`: `/dev/zero (deleted)` on the kernel's
    /// internal shm mount). Not memfd (`/memfd:NAME (deleted)`), POSIX shm (`/dev/shm/NAME`),
    /// System V (`/SYSV... (deleted)`) or tmpfs files: any process can reach those through a
    /// file descriptor, and a read or write through one sees a hole where a page was evicted.
    pub fn is_shared_anon(&self) -> bool {
        is_shared_anon(&self.perms, self.dev, self.inode, &self.path)
    }
}

impl Vma {
    /// A shared mapping of a shared anonymous inode, whatever its permissions (a read-only or
    /// `PROT_NONE` one is never registered, and a read of a hole through it fills the hole):
    /// what the census must find registered before the inode may be evicted from.
    pub fn maps_shared_anon_inode(&self) -> bool {
        self.perms.as_bytes().get(3) == Some(&b's')
            && self.dev.0 == 0
            && self.inode != 0
            && self.path == SHARED_ANON_NAME
    }
}

/// [`Vma::is_shared_anon`] on the fields of a maps line or a `PROCMAP_QUERY` answer.
pub fn is_shared_anon(perms: &str, dev: (u32, u32), inode: u64, path: &str) -> bool {
    let p = perms.as_bytes();
    p.len() == 4
        && p[0] == b'r'
        && p[1] == b'w'
        && p[3] == b's'
        && dev.0 == 0
        && inode != 0
        && path == SHARED_ANON_NAME
}

/// What `/proc/PID/maps` names a shared anonymous mapping by.
pub const SHARED_ANON_NAME: &str = "/dev/zero (deleted)";

/// Parses `/proc/PID/maps` text; malformed lines are skipped.
pub fn parse_maps(text: &str) -> Vec<Vma> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Vma> {
    let mut it = line.split_ascii_whitespace();
    let range = it.next()?;
    let perms = it.next()?.to_string();
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let (major, minor) = it.next()?.split_once(':')?;
    let dev = (
        u32::from_str_radix(major, 16).ok()?,
        u32::from_str_radix(minor, 16).ok()?,
    );
    let inode = it.next()?.parse().ok()?;
    let path = it.collect::<Vec<_>>().join(" ");
    let (s, e) = range.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let end = u64::from_str_radix(e, 16).ok()?;
    (start < end).then_some(Vma {
        start,
        end,
        perms,
        inode,
        offset,
        dev,
        path,
    })
}

/// Reads the maps of `pid`. A process whose main thread has exited (`pthread_exit`) shows no
/// maps through its pid: they are read through one of its live threads then.
pub fn read_maps(pid: i32) -> io::Result<Vec<Vma>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    if !text.is_empty() {
        return Ok(parse_maps(&text));
    }
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("maps")) {
            if !text.is_empty() {
                return Ok(parse_maps(&text));
            }
        }
    }
    Ok(Vec::new())
}

/// Addresses of the pages present in `[start, end)` of `pid`.
pub fn present_pages(pid: i32, start: u64, end: u64) -> io::Result<Vec<u64>> {
    let mut f = std::fs::File::open(format!("/proc/{pid}/pagemap"))?;
    let first = start / PAGE_SIZE_U64;
    let n = ((end - start) / PAGE_SIZE_U64) as usize;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8 * 4096];
    let mut done = 0usize;
    f.seek(SeekFrom::Start(first * 8))?;
    while done < n {
        let want = ((n - done) * 8).min(buf.len());
        let got = f.read(&mut buf[..want])?;
        if got == 0 {
            break;
        }
        for (i, e) in buf[..got].chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(e.try_into().unwrap_or([0; 8]));
            if v & (1 << 63) != 0 {
                out.push(start + (done + i) as u64 * PAGE_SIZE_U64);
            }
        }
        done += got / 8;
    }
    Ok(out)
}

/// Anonymous resident bytes of `pid` (`RssAnon` of `/proc/PID/status`).
pub fn rss_anon_bytes(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `RssAnon` (bytes) and `TracerPid` of `pid`, from one read of `/proc/PID/status`: the
/// scanner's poll. A process whose main thread has exited shows neither.
pub fn rss_and_tracer(pid: i32) -> Option<(u64, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut rss = None;
    let mut tracer = 0;
    for line in s.lines() {
        if let Some(v) = line.strip_prefix("TracerPid:") {
            tracer = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("RssAnon:") {
            rss = v.split_ascii_whitespace().next()?.parse::<u64>().ok();
        }
    }
    Some((rss? * 1024, tracer))
}

/// The tracers of the threads of `pid` (`TracerPid` of each `/proc/PID/task/TID/status`),
/// without 0s: a tracer may hold one thread and not the others.
pub fn thread_tracers(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let Ok(s) = std::fs::read_to_string(t.path().join("status")) else {
            continue;
        };
        let tracer = s
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .and_then(|v| v.trim().parse::<i32>().ok())
            .unwrap_or(0);
        if tracer != 0 && !out.contains(&tracer) {
            out.push(tracer);
        }
    }
    out
}

/// `MemAvailable` of `/proc/meminfo` and `MemTotal`, in bytes.
pub fn mem_available() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = |key: &str| -> Option<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(key))?
            .split_ascii_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some((kb("MemAvailable:")? * 1024, kb("MemTotal:")? * 1024))
}

/// `VmLck` of `pid` in bytes: memory locked with mlock/mlockall (0 if unreadable).
pub fn locked_bytes(pid: i32) -> u64 {
    status_kb(pid, "VmLck:").unwrap_or(0) * 1024
}

fn status_kb(pid: i32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// A mapping's `VmFlags` (two-letter codes of `/proc/PID/smaps`) that change what the daemon
/// may do with its pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VmFlags {
    /// `lo`: mlock'ed (VM_LOCKED): never to be evicted or written to swap.
    pub locked: bool,
    /// `wf`: MADV_WIPEONFORK: a fork child gets zeros here.
    pub wipe_on_fork: bool,
    /// `dd`: MADV_DONTFORK: a fork child has no mapping here.
    pub dont_fork: bool,
    /// `um`, `uw`, `ui`: registered with a userfaultfd (missing, write-protect, minor).
    pub uffd: bool,
}

/// The mappings of `pid` with their flags, from `/proc/PID/smaps` (which costs a walk of the
/// page tables: read at a fork, or when the process has locked memory, not on every scan).
pub fn read_vm_flags(pid: i32) -> io::Result<Vec<(u64, u64, VmFlags)>> {
    Ok(parse_smaps_flags(&std::fs::read_to_string(format!(
        "/proc/{pid}/smaps"
    ))?))
}

/// Parses the mapping lines and `VmFlags` lines of smaps text.
pub fn parse_smaps_flags(text: &str) -> Vec<(u64, u64, VmFlags)> {
    let mut out: Vec<(u64, u64, VmFlags)> = Vec::new();
    for line in text.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(last) = out.last_mut() {
                for f in flags.split_ascii_whitespace() {
                    match f {
                        "lo" => last.2.locked = true,
                        "wf" => last.2.wipe_on_fork = true,
                        "dd" => last.2.dont_fork = true,
                        "um" | "uw" | "ui" => last.2.uffd = true,
                        _ => {}
                    }
                }
            }
        } else if let Some(v) = parse_line(line) {
            out.push((v.start, v.end, VmFlags::default()));
        }
    }
    out
}

/// Resident bytes of the shared mappings of `pid` that are not registered shared anonymous
/// memory (`Rss` of each `MAP_SHARED` mapping in `/proc/PID/smaps` but those that
/// [`Vma::is_shared_anon`] and carry `um`): memfd, POSIX and System V shared memory, tmpfs
/// files. A walk of the page tables: read only when `RssShmem` is not 0.
pub fn shared_fd_rss(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    Some(parse_shared_fd_rss(&text))
}

/// [`shared_fd_rss`] on smaps text.
pub fn parse_shared_fd_rss(text: &str) -> u64 {
    let mut total = 0;
    let mut cur: Option<(Vma, u64)> = None;
    for line in text.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some((v, rss)) = cur.take() {
                let registered = flags.split_ascii_whitespace().any(|f| f == "um");
                if v.perms.as_bytes().get(3) == Some(&b's') && !(v.is_shared_anon() && registered) {
                    total += rss;
                }
            }
        } else if let Some(kb) = line.strip_prefix("Rss:") {
            if let Some(c) = cur.as_mut() {
                c.1 = kb
                    .split_ascii_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
                    * 1024;
            }
        } else if let Some(v) = parse_line(line) {
            cur = Some((v, 0));
        }
    }
    total
}

/// Whether a descriptor of process `pid` names a memory file of `/proc` (`/proc/N/mem`,
/// `/proc/N/task/T/mem`): a process that opened its own keeps it held (`hold.rs`).
pub fn has_mem_file_open(pid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    dir.flatten().any(|e| {
        std::fs::read_link(e.path()).is_ok_and(|t| {
            let t = t.to_string_lossy();
            t.starts_with("/proc/") && t.ends_with("/mem")
        })
    })
}

/// The parent pid of `pid`.
pub fn parent_of(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    rest.split(' ').nth(1)?.parse().ok()
}

/// The thread-group id of a thread.
pub fn tgid_of(tid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("Tgid:"))?;
    line.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// The numbers of one task in each pid namespace from the daemon's down to its own, from a
/// `/proc/PID/status` line (`key` is `NStgid:` or `NSpid:`): `fs/proc/array.c` prints them
/// from the level of the proc mount's namespace (the daemon's: `run` checks that its `/proc` is
/// of its own namespace) to the task's, so the first is the number the daemon uses and the
/// last the one the task itself sees (`getpid()`, `gettid()`, and a userfaultfd's thread id,
/// which the kernel gives with `task_pid_vnr` in the faulting task's namespace). One field for
/// a task of the daemon's own namespace.
pub fn parse_ns_ids(status: &str, key: &str) -> Vec<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| {
            v.split_ascii_whitespace()
                .map_while(|f| f.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `pid`'s thread-group ids, the daemon's namespace's first ([`parse_ns_ids`]); empty if it
/// is gone.
pub fn ns_tgids(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| parse_ns_ids(&s, "NStgid:"))
        .unwrap_or_default()
}

/// The id of thread `tid` of `pid` (daemon's numbers) in its own pid namespace: what its
/// userfaultfd messages name it by.
pub fn own_ns_tid(pid: i32, tid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    parse_ns_ids(&s, "NSpid:").last().copied()
}

/// The thread of `pid` that its own pid namespace numbers `ns_tid` (the thread id of a
/// userfaultfd message), by the daemon's number; `None` if no thread of `pid` is numbered so.
/// Only threads of `pid` are looked at (`/proc/PID/task`), so the answer never names another
/// process.
pub fn thread_by_own_ns_tid(pid: i32, ns_tid: i32) -> Option<i32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|t| t.parse().ok()))
        .find(|&tid| own_ns_tid(pid, tid) == Some(ns_tid))
}

/// Whether `pid` descends from `root` (the daemon is a child subreaper, so orphans of the tree
/// are re-parented to it and stay in it). `pid` and `root` are numbers of the daemon's pid
/// namespace; the parents come from its `/proc` (`PPid` is given in the reader's namespace,
/// also for the first process of a namespace below, whose parent is outside it).
pub fn in_tree(pid: i32, root: i32) -> bool {
    let mut p = pid;
    for _ in 0..128 {
        if p == root {
            return true;
        }
        match parent_of(p) {
            Some(pp) if pp > 0 => p = pp,
            _ => return false,
        }
    }
    false
}

pub(crate) fn me() -> i32 {
    crate::sys::getpid()
}

/// Sends SIGKILL to `pid` if it is a process of the daemon's tree, through a pidfd opened
/// before the check: a number that was reused by a process outside the tree is never
/// signalled.
pub fn kill_in_tree(pid: i32) {
    if pid <= 0 {
        return;
    }
    let Ok(fd) = PidFd::open(pid) else { return };
    if in_tree(pid, me()) && !fd.exited() {
        let _ = fd.send_signal(libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_ids_run_from_the_readers_namespace_to_the_tasks_own() {
        let status = "Name:\tpython3\nTgid:\t4242\nNgid:\t0\nPid:\t4243\nPPid:\t4200\n\
                      NStgid:\t4242\t7\t1\nNSpid:\t4243\t8\t2\nNSpgid:\t4242\t7\t1\n";
        assert_eq!(parse_ns_ids(status, "NStgid:"), vec![4242, 7, 1]);
        assert_eq!(parse_ns_ids(status, "NSpid:"), vec![4243, 8, 2]);
        assert_eq!(parse_ns_ids("Tgid:\t5\n", "NStgid:"), Vec::<i32>::new());
        // This process: the last number is its own namespace's.
        let (me, tid) = (crate::sys::getpid(), crate::sys::gettid());
        assert_eq!(ns_tgids(me).last(), Some(&me));
        assert_eq!(own_ns_tid(me, tid), Some(tid));
        assert!(thread_by_own_ns_tid(me, tid).is_some());
        assert_eq!(thread_by_own_ns_tid(me, -5), None);
    }

    /// Only `MAP_SHARED|MAP_ANONYMOUS` and shared `/dev/zero` are shared anonymous memory: not
    /// memfd, POSIX or System V shared memory, private mappings, or read-only ones.
    #[test]
    fn shared_anonymous_mappings_are_told_from_fd_reachable_ones() {
        let text = "7f0000000000-7f0000100000 rw-s 00000000 00:01 2071 /dev/zero (deleted)\n\
                    7f0000100000-7f0000200000 rw-s 00010000 00:01 2072 /dev/zero (deleted)\n\
                    7f0000200000-7f0000300000 rw-s 00000000 00:01 2073 /memfd:heap (deleted)\n\
                    7f0000300000-7f0000400000 rw-s 00000000 00:1a 17 /dev/shm/seg\n\
                    7f0000400000-7f0000500000 rw-s 00000000 00:01 5 /SYSV00000000 (deleted)\n\
                    7f0000500000-7f0000600000 r--s 00000000 00:01 2074 /dev/zero (deleted)\n\
                    7f0000600000-7f0000700000 rw-p 00000000 00:00 0 \n";
        let v = parse_maps(text);
        let shared: Vec<bool> = v.iter().map(Vma::is_shared_anon).collect();
        assert_eq!(shared, [true, true, false, false, false, false, false]);
        // (The read-only mapping of an inode is one the census must find registered.)
        let of_inode: Vec<bool> = v.iter().map(Vma::maps_shared_anon_inode).collect();
        assert_eq!(of_inode, [true, true, false, false, false, true, false]);
        assert_eq!((v[1].dev, v[1].inode, v[1].offset), ((0, 1), 2072, 0x10000));
        assert_eq!(v[3].dev, (0, 0x1a));
        assert!(v[6].is_managed() && !v[0].is_managed());
    }

    /// Registered shared anonymous memory is managed; a memfd and an unregistered shared
    /// anonymous mapping are not.
    #[test]
    fn shared_fd_rss_leaves_out_registered_shared_anonymous_memory() {
        let text = "7f0000000000-7f0000100000 rw-s 00000000 00:01 2071 /dev/zero (deleted)\n\
                    Rss:                1024 kB\n\
                    VmFlags: rd wr sh mr mw me ms um uw \n\
                    7f0000100000-7f0000200000 rw-s 00000000 00:01 2073 /memfd:heap (deleted)\n\
                    Rss:                 512 kB\n\
                    VmFlags: rd wr sh mr mw me ms \n\
                    7f0000200000-7f0000300000 rw-s 00000000 00:01 2074 /dev/zero (deleted)\n\
                    Rss:                  64 kB\n\
                    VmFlags: rd wr sh mr mw me ms \n\
                    7f0000300000-7f0000400000 rw-p 00000000 00:00 0 \n\
                    Rss:                 128 kB\n\
                    VmFlags: rd wr mr mw me ac um uw \n";
        assert_eq!(parse_shared_fd_rss(text), (512 + 64) << 10);
    }

    #[test]
    fn smaps_flags() {
        let text = "7f00000000-7f00002000 rw-p 00000000 00:00 0 \n\
                    Size:                  8 kB\n\
                    VmFlags: rd wr mr mw me ac wf \n\
                    7f00002000-7f00004000 rw-p 00000000 00:00 0 \n\
                    Rss:                   8 kB\n\
                    VmFlags: rd wr mr mw me lo ac dd \n";
        let v = parse_smaps_flags(text);
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].0, v[0].1), (0x7f00000000, 0x7f00002000));
        assert!(v[0].2.wipe_on_fork && !v[0].2.locked && !v[0].2.dont_fork);
        assert!(v[1].2.locked && v[1].2.dont_fork && !v[1].2.wipe_on_fork);
    }

    #[test]
    fn parses_and_classifies() {
        let text = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f1c2a000000-7f1c2a021000 rw-p 00000000 00:00 0 
7f1c2c000000-7f1c2c001000 ---p 00000000 00:00 0 
7f1c2d000000-7f1c2d010000 rw-p 0001c000 fe:01 1234                       /usr/lib/libc.so.6
7ffd1a000000-7ffd1a021000 rw-p 00000000 00:00 0                          [stack]
7ffd1b000000-7ffd1b002000 r--p 00000000 00:00 0                          [vvar]
7f1c2e000000-7f1c2e001000 rw-p 00000000 00:00 0                          [anon:arena]
garbage line
";
        let v = parse_maps(text);
        assert_eq!(v.len(), 7);
        let managed: Vec<bool> = v.iter().map(Vma::is_managed).collect();
        assert_eq!(managed, vec![true, true, false, false, false, false, true]);
        assert_eq!(v[0].start, 0x55d0c0a00000);
        assert_eq!(v[0].path, "[heap]");
    }

    #[test]
    fn reads_own_status() {
        let me = std::process::id() as i32;
        let (rss, tracer) = rss_and_tracer(me).expect("own status");
        assert!(rss > 0);
        assert_eq!(thread_tracers(me).contains(&tracer), tracer != 0);
        let (avail, total) = mem_available().expect("meminfo");
        assert!(avail > 0 && avail <= total);
    }

    #[test]
    fn finds_own_present_pages() {
        let mut v = vec![0u8; 64 * 4096];
        let base = (v.as_ptr() as u64).div_ceil(4096) * 4096;
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        let present = present_pages(std::process::id() as i32, base, base + 16 * 4096).unwrap();
        assert_eq!(present.len(), 16, "every touched page is present");
        std::hint::black_box(&v);
    }
}
