//! Memory of the process tree that the daemon does not manage: found, counted by kind, and
//! said once, so that a limit that does not hold says why.
//!
//! | kind | what | why the daemon cannot page it |
//! |---|---|---|
//! | `static` | a process whose program is statically linked, that the daemon could not manage without an agent (`agentless.rs`: a seccomp filter, another tracer) or that an unmanaged process exec'd | the dynamic loader never loads the agent |
//! | `setuid` | the same, for a set-user-ID or set-group-ID program (any, when the daemon is not root) | the loader ignores `LD_PRELOAD` for it |
//! | `no_agent` | any other process of the tree without an agent | its environment dropped `LD_PRELOAD`, or its agent could not start (it said why) |
//! | `shared` | shared memory of managed processes that is not paged: `shared_fd` (memfd, System V and POSIX shared memory, tmpfs files, and shared anonymous mappings not registered) and `shared_pinned` (shared anonymous memory of an inode a process mapping it may pin for I/O) | a descriptor reaches the first (a read or write through it would see a hole where a page was evicted); a punch would lose a device's write through a pin on the second (`shmem.rs`). `MAP_SHARED|MAP_ANONYMOUS` and shared `/dev/zero` memory is paged (`shmem.rs`) |
//! | `locked` | `mlock`ed memory of managed processes (`VmLck`) | the program asked that it never leave RAM |
//! | `traced` | anonymous memory of a managed process while a tracer is attached (`hold.rs`) | a debugger reads and writes memory without a userfault: the daemon gives it back to the kernel while traced |
//! | `dumping` | anonymous memory of a managed process writing its core file (`hold.rs`) | the core dump reads memory without a userfault |
//!
//! The scanner walks the tree every 100 ms ([`Census::take`]); the counters are the peak of the
//! current amount of each kind (`unmanaged_<kind>_bytes`) and of their sum
//! (`unmanaged_bytes`), so a user sees how far the limit could not reach. With
//! `unmanaged = "error"` the daemon refuses such a program at start where it can tell
//! (a set-ID program when it is not root), and stops the tree when it finds one later (but
//! not for `traced` or `dumping` memory: a debugger or a crash is not a reason to kill the
//! tree).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::Ordering;

use crate::stats::Stats;

/// Why memory is not managed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A statically linked program.
    Static,
    /// A set-user-ID or set-group-ID program.
    Setuid,
    /// A process of the tree without an agent for another reason.
    NoAgent,
    /// Shared memory of managed processes.
    Shared,
    /// Locked memory of managed processes.
    Locked,
    /// Anonymous memory of a managed process held while traced.
    Traced,
    /// Anonymous memory of a managed process held for its core dump.
    Dumping,
}

impl Kind {
    /// The name used in counters and messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Static => "static",
            Kind::Setuid => "setuid",
            Kind::NoAgent => "no_agent",
            Kind::Shared => "shared",
            Kind::Locked => "locked",
            Kind::Traced => "traced",
            Kind::Dumping => "dumping",
        }
    }

    fn why(self) -> &'static str {
        match self {
            Kind::Static => "its program is statically linked (the agent cannot load) and the daemon did not manage it without one",
            Kind::Setuid => "its program is set-user-ID or set-group-ID, so the loader ignores LD_PRELOAD",
            Kind::NoAgent => "it runs without the agent (LD_PRELOAD dropped from its environment, a seccomp filter in force at its fork, or the agent could not start)",
            Kind::Shared => "shared memory reachable through a file descriptor (memfd, POSIX or System V shm, tmpfs) is not paged (counted in unmanaged_shared_fd_bytes)",
            Kind::Locked => "locked memory (mlock) stays in RAM",
            Kind::Traced => "a tracer is attached: its evicted pages were brought back so that the tracer can read them, and it is not paged while traced",
            Kind::Dumping => "it is writing a core file: its evicted pages were brought back for it",
        }
    }
}

/// What to do about unmanaged memory (`unmanaged` in the config, `--unmanaged`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Count it and say it once per process (the default).
    #[default]
    Warn,
    /// Refuse to start a program known to be unmanageable, and stop the tree when such memory
    /// is found later.
    Error,
}

impl Policy {
    /// Parses `warn` or `error`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "warn" => Ok(Policy::Warn),
            "error" => Ok(Policy::Error),
            other => Err(format!("{other:?}: warn or error")),
        }
    }
}

/// Whether the program at `path` cannot carry the agent: statically linked (an ELF file without
/// a program interpreter) or set-ID. `None` when it can, or when this cannot be told.
pub fn program_kind(path: &Path) -> Option<Kind> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).ok()?;
    if meta.permissions().mode() & 0o6000 != 0 {
        return Some(Kind::Setuid);
    }
    let bytes = std::fs::read(path).ok()?;
    elf_is_static(&bytes).then_some(Kind::Static)
}

/// An ELF executable (`ET_EXEC` or `ET_DYN`) with no `PT_INTERP` program header: nothing
/// loads `LD_PRELOAD` libraries into it. Scripts and other formats are not static.
pub fn elf_is_static(b: &[u8]) -> bool {
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return false; // only 64-bit little-endian ELF is judged
    }
    let u16_at = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]));
    let u64_at = |o: usize| {
        b.get(o..o + 8)
            .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
    };
    let (Some(e_type), Some(phoff), Some(phentsize), Some(phnum)) =
        (u16_at(16), u64_at(32), u16_at(54), u16_at(56))
    else {
        return false;
    };
    if e_type != 2 && e_type != 3 {
        return false;
    }
    const PT_INTERP: u32 = 3;
    for i in 0..phnum as usize {
        let off = phoff as usize + i * phentsize as usize;
        match b.get(off..off + 4) {
            Some(t) if u32::from_le_bytes(t.try_into().expect("4 bytes")) == PT_INTERP => {
                return false
            }
            Some(_) => {}
            None => return false,
        }
    }
    true
}

/// How long a process of the tree may go without an agent before it counts as `no_agent`.
const NO_AGENT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The scanner's census of unmanaged memory, kept between walks.
#[derive(Debug, Default)]
pub struct Census {
    /// Processes without an agent, and when they were first seen so: one that may yet get an
    /// agent is counted after [`NO_AGENT_GRACE`], so that one between its fork or exec and
    /// its agent's greeting (which a loaded machine can make slow) is not.
    seen_unmanaged: HashMap<i32, std::time::Instant>,
    /// What was said, per process and kind.
    said: HashSet<(i32, Kind)>,
    /// Whether `Policy::Error` has stopped the tree.
    pub stopped: bool,
    /// Why the daemon could not manage a process without an agent, by pid (said with it).
    pub reasons: HashMap<i32, String>,
    /// Resident bytes of shared anonymous inodes left out of eviction for a pin
    /// (`ShmemTable::census`), counted in `shared` once (not per mapper).
    pub shared_pinned: u64,
}

/// One process's figures from `/proc/PID/status`, in bytes.
#[derive(Debug, Default, Clone, Copy)]
struct Status {
    rss_anon: u64,
    rss_shmem: u64,
    locked: u64,
}

fn status(pid: i32) -> Option<Status> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut s = Status::default();
    for line in text.lines() {
        let kb = |l: &str| -> u64 {
            l.split_ascii_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
                * 1024
        };
        if line.starts_with("RssAnon:") {
            s.rss_anon = kb(line);
        } else if line.starts_with("RssShmem:") {
            s.rss_shmem = kb(line);
        } else if line.starts_with("VmLck:") {
            s.locked = kb(line);
        }
    }
    Some(s)
}

/// Every descendant of `root` (through each thread's `children`).
pub(crate) fn descendants(root: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let path = t.path().join("children");
            if let Ok(c) = std::fs::read_to_string(path) {
                for pid in c.split_ascii_whitespace().filter_map(|s| s.parse().ok()) {
                    out.push(pid);
                    stack.push(pid);
                }
            }
        }
    }
    out
}

impl Census {
    /// Walks the tree under `root` (the daemon): `managed` are the pids with an agent, `held`
    /// those of them held for a tracer or a core dump (`hold.rs`). Updates the counters, says
    /// what is new, and returns the first kind found if `policy` is `Error` (the caller stops
    /// the tree).
    pub fn take(
        &mut self,
        root: i32,
        managed: &HashSet<i32>,
        held: &HashMap<i32, Kind>,
        stats: &Stats,
        policy: Policy,
    ) -> Option<(i32, Kind)> {
        let mut now: HashMap<Kind, u64> = HashMap::new();
        let mut unmanaged = HashMap::new();
        let mut found = None;
        for pid in descendants(root) {
            let Some(st) = status(pid) else { continue };
            if managed.contains(&pid) {
                // (Managed shared anonymous memory is in the resident count: only the rest.)
                // (A process whose smaps cannot be read any more is exiting.)
                let shared_fd = if st.rss_shmem > 0 {
                    crate::maps::shared_fd_rss(pid).unwrap_or(0)
                } else {
                    0
                };
                for (kind, bytes) in [(Kind::Shared, shared_fd), (Kind::Locked, st.locked)] {
                    if bytes > 0 {
                        *now.entry(kind).or_default() += bytes;
                        found = found.or(Some((pid, kind)));
                        self.say(pid, kind, bytes);
                    }
                }
                // (Said when the hold began; never a reason to stop the tree.)
                if let Some(&kind) = held.get(&pid) {
                    *now.entry(kind).or_default() += st.rss_anon;
                }
                continue;
            }
            if st.rss_anon + st.rss_shmem == 0 {
                continue; // a zombie, or a kernel-side process of no memory
            }
            let first = self
                .seen_unmanaged
                .get(&pid)
                .copied()
                .unwrap_or_else(std::time::Instant::now);
            unmanaged.insert(pid, first);
            let kind = std::fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .and_then(|exe| program_kind(&exe))
                .unwrap_or(Kind::NoAgent);
            // (A static or set-ID image is managed without the agent a few milliseconds after
            // its exec, unless the daemon said why it could not: the same grace.)
            if first.elapsed() < NO_AGENT_GRACE && !self.reasons.contains_key(&pid) {
                continue;
            }
            *now.entry(kind).or_default() += st.rss_anon + st.rss_shmem;
            found = found.or(Some((pid, kind)));
            // (A process the daemon could not manage without an agent was said with the
            // reason when it tried.)
            if !self.reasons.contains_key(&pid) {
                self.say(pid, kind, st.rss_anon + st.rss_shmem);
            }
        }
        self.seen_unmanaged = unmanaged;
        let shared_fd = now.get(&Kind::Shared).copied().unwrap_or(0);
        stats
            .unmanaged_shared_fd_bytes
            .fetch_max(shared_fd, Ordering::Relaxed);
        if self.shared_pinned > 0 {
            *now.entry(Kind::Shared).or_default() += self.shared_pinned;
        }
        let mut total = 0;
        for kind in [
            Kind::Static,
            Kind::Setuid,
            Kind::NoAgent,
            Kind::Shared,
            Kind::Locked,
            Kind::Traced,
            Kind::Dumping,
        ] {
            let v = now.get(&kind).copied().unwrap_or(0);
            total += v;
            counter(stats, kind).fetch_max(v, Ordering::Relaxed);
        }
        stats.unmanaged_bytes.fetch_max(total, Ordering::Relaxed);
        match policy {
            Policy::Error => found,
            Policy::Warn => None,
        }
    }

    fn say(&mut self, pid: i32, kind: Kind, bytes: u64) {
        if self.said.insert((pid, kind)) {
            tracing::warn!(
                "pid {pid}: {} KiB unmanaged ({}): {}; outside the limit",
                bytes >> 10,
                kind.name(),
                kind.why()
            );
        }
    }
}

fn counter(stats: &Stats, kind: Kind) -> &std::sync::atomic::AtomicU64 {
    match kind {
        Kind::Static => &stats.unmanaged_static_bytes,
        Kind::Setuid => &stats.unmanaged_setuid_bytes,
        Kind::NoAgent => &stats.unmanaged_no_agent_bytes,
        Kind::Shared => &stats.unmanaged_shared_bytes,
        Kind::Locked => &stats.unmanaged_locked_bytes,
        Kind::Traced => &stats.unmanaged_traced_bytes,
        Kind::Dumping => &stats.unmanaged_dumping_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_and_dynamic_elf_are_told_apart() {
        // This test binary is dynamically linked (it has an interpreter).
        let me = std::env::current_exe().unwrap();
        assert_eq!(program_kind(&me), None);
        assert!(!elf_is_static(&std::fs::read(&me).unwrap()));
        // Not ELF at all: a script.
        assert!(!elf_is_static(b"#!/bin/sh\necho hi\n"));
        assert!(!elf_is_static(&[0u8; 10]));
        // A minimal static ELF header: ET_EXEC, one PT_LOAD program header.
        let mut b = vec![0u8; 64 + 56];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[16] = 2; // ET_EXEC
        b[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        b[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        b[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        b[64..68].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        assert!(elf_is_static(&b));
        b[64..68].copy_from_slice(&3u32.to_le_bytes()); // PT_INTERP
        assert!(!elf_is_static(&b));
        // Truncated program headers are not judged static.
        b.truncate(70);
        assert!(!elf_is_static(&b));
    }

    #[test]
    fn policies_parse() {
        assert_eq!(Policy::parse("warn"), Ok(Policy::Warn));
        assert_eq!(Policy::parse("error"), Ok(Policy::Error));
        assert!(Policy::parse("ignore")
            .unwrap_err()
            .contains("warn or error"));
    }
}
