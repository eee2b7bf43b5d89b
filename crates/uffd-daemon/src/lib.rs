//! `uffd-daemon`: pages the anonymous memory of unmodified programs from userspace.
//!
//! `uffd-daemon run --limit 256M -- program args` starts the program with a small agent inside
//! it (an `LD_PRELOAD` library, `agent/agent.c`) and keeps the resident anonymous memory of its
//! whole process tree under the limit, like a cgroup with swap, by evicting cold pages to a
//! compressed pool (zswap) and from there to a swap file or a pmem device, and serving them
//! back on fault through userfaultfd.
//!
//! # Design (the kernel's reclaim path, split across two processes)
//!
//! ```text
//! program ──page fault──▶ userfaultfd ──▶ fault/ handler ──▶ zswap | backend | zero
//!    ▲                                         │  UFFDIO_COPY / UFFDIO_ZEROPAGE (wakes)
//!    └─────────────────────────────────────────┘  (+ readahead on sequential faults)
//! reclaim/ (over the limit): mglru picks victims ─▶ UFFDIO_WRITEPROTECT ─▶ /proc/PID/mem
//!    ─▶ tiers.rs: swap-alloc slot ─▶ zswap.store (or the backend) ─▶ agent: UFFDIO_MOVE into
//!    its scratch (refused while pinned for I/O) ─▶ read back and compared ─▶ Evicted
//! zswap near its limit ─▶ shrinker registry ─▶ zswap writeback to the backend (tiers.rs)
//! ```
//!
//! * **Tiers** (`tiers.rs`): every stored page is named by its slot on a `swap-alloc` device
//!   (order 4 for an aligned 64 KiB folio); `zswap` is keyed by slot; the backend (a swap file,
//!   or a pmem-backed device) holds slot `s` at `s * 4096`, so writeback needs no allocation.
//!   Encryption at rest (on by default, `tiers/seal.rs`): each page on the backend is sealed
//!   with AES-256-GCM under a key held only in the daemon's locked memory, its tag beside it,
//!   its nonce's counter in the daemon; a page altered on the device fails its read.
//!   Reference counts are swap-alloc's (fork shares a slot, count 2).
//! * **Policy** (`mm.rs`): each address space has an `mglru` (or clock) policy holding its
//!   resident pages, fed by faults and, optionally, write-protect faults
//!   (`config.rs`; the measured choice in docs/experiments/2026-11-27-fault-path-tuning.md).
//!
//! * The **agent** creates the uffd inside the client and hands it over (SCM_RIGHTS); only it
//!   can drop pages (no remote `MADV_DONTNEED` exists) and only it can `UFFDIO_MOVE`.
//!   Dropping by moving into a scratch area makes every `UFFD_EVENT_REMOVE` on program memory
//!   the program's own, so a program's `MADV_DONTNEED` is never confused with an eviction.
//! * **Without an agent** (`supervisor/agentless.rs`, `reclaim/injected.rs`, `inject.rs`): a static or set-ID program, which
//!   cannot load the agent, has the same work done by the daemon with system calls it runs
//!   in one ptrace-stopped thread of the program: `userfaultfd` at its exec, then, one stop a
//!   batch, `UFFDIO_MOVE` into a scratch of its own in the program, with the uffd lent to the
//!   program for the stop (`MADV_DONTNEED`, which took pages pinned for I/O, is no longer
//!   used on program memory); the agent path, which stops nothing, stays for every program
//!   that can load the agent.
//! * **Memory is found from outside** (`maps.rs`): `/proc/PID/maps` for private anonymous
//!   ranges, registered as they appear; `/proc/PID/pagemap` for pages already present.
//! * **One handler thread per address space** reads its uffd, so faults and events are applied
//!   in the kernel's order (`fault/`). It never waits on the client or on reclaim.
//! * **Fork** (`UFFD_EVENT_FORK`): the child gets a copy of the page table; stored pages are
//!   shared with a slot reference count of two. The child touches the agent's probe page; while
//!   it waits in that fault the daemon writes random bytes there through the child's uffd and
//!   binds the address space to the tree process whose probe page holds them (the fault's
//!   thread id, a number of the child's own pid namespace, only narrows the search: `bind.rs`).
//!   The child then greets the daemon and gets its uffd back.
//! * **Held for inspection** (`supervisor/hold.rs`): the kernel reads a process's memory for a core file or
//!   for a debugger (`/proc/PID/mem`, `PEEKDATA`) without a userfault, so before a core dump
//!   (the agent's handler of core-dumping signals asks) and while a tracer is attached (seen in
//!   `TracerPid`, or asked by a tracer's agent before it attaches) the daemon brings every
//!   evicted page back, gives the memory to the kernel and evicts nothing from the process.
//!
//! # Invariants
//!
//! 1. A page is dropped from the client only after its contents are stored, and only while it
//!    is write-protected; a write that races with the eviction waits in a write-protect fault
//!    and is replayed on the page that comes back (`reclaim/`). A page pinned for I/O is
//!    never dropped (`UFFDIO_MOVE` refuses it), and one written through a pin between its
//!    read and its move is stored anew with what it holds (read back after the move). Nothing
//!    is lost, outside the narrow cases `docs/ARCHITECTURE.md` lists among its invariants (a
//!    fork or `mremap` during the DROP, pins taken with `FOLL_GET`).
//! 2. The daemon serves only processes it started (peer credentials, process-tree check),
//!    binds, reads and signals only processes of its tree shown to be what it takes them for
//!    (never on a bare number from a client or a uffd message; signals go through pidfds), and
//!    its swap file is mode 0600 (or unnamed), holds only sealed pages (unless `--encrypt
//!    off`), and is removed at exit.
//! 3. A malformed agent message is refused with an error that names the problem
//!    (`protocol.rs`, fuzzed); if the daemon dies the agent stops its process at once
//!    (exit status 86) instead of letting it read evicted pages as zeros.
//!
//! # Example
//!
//! ```no_run
//! use uffd_daemon::config::{resolve, Overrides};
//! use uffd_daemon::{run, Config};
//! // 64 MiB resident; zswap (lz4, a 256 MiB pool) in front of an unnamed swap file.
//! let r = resolve(None, &Overrides {
//!     limit: Some(64 << 20),
//!     zswap: Some(Some(256 << 20)),
//!     ..Overrides::default()
//! }).unwrap();
//! let config = Config {
//!     limit_bytes: r.limit,
//!     auto_limit: r.auto,
//!     tiers: r.tiers,
//!     policy: r.policy,
//!     stats_json: None,
//! };
//! let status = run(&config, "python3", &["-c".into(), "x = bytearray(256 << 20)".into()]).unwrap();
//! assert_eq!(status, 0);
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(unreachable_pub, missing_docs)]
// Every `unsafe` block of the daemon is in `sys`, each with the reason it is sound.
#![deny(unsafe_code)]

mod agent_conn;
mod bind;
pub mod config;
pub mod demo;
mod fault;
mod idlepoll;
pub mod inject;
pub mod limit;
pub mod log;
pub mod maps;
mod mm;
pub mod pagetable;
pub mod protocol;
mod readahead;
mod reclaim;
mod rundir;
mod shared;
mod shmem;
pub mod stats;
mod supervisor;
#[allow(unsafe_code)]
pub mod sys;
pub mod tiers;
pub mod unmanaged;
pub mod wire;

pub use rundir::{base as run_base, default_base as default_run_base, pid_of_name as run_dir_pid};
pub use stats::Stats;
pub use supervisor::{run, Config, EXIT_DAEMON_LOST};

/// Parses a size such as `256M`, `1G`, `4096`, `64k` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_lowercase();
            let mul = match unit.as_str() {
                "k" | "kb" | "kib" => 1u64 << 10,
                "m" | "mb" | "mib" => 1 << 20,
                "g" | "gb" | "gib" => 1 << 30,
                "t" | "tb" | "tib" => 1 << 40,
                "b" => 1,
                _ => {
                    return Err(format!(
                        "unknown size unit {unit:?} in {s:?} (use K, M, G or T)"
                    ))
                }
            };
            (&s[..i], mul)
        }
        None => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size such as 256M"))?;
    n.checked_mul(mul)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

/// Fuzzing entry point for the agent message decoder.
pub fn fuzz_protocol_decode(data: &[u8]) {
    if let Ok((msg, seq)) = protocol::decode(data) {
        // Whatever decodes re-encodes to a packet that decodes to the same message.
        assert_eq!(
            protocol::decode(&protocol::encode(&msg, seq)),
            Ok((msg, seq))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12Q").unwrap_err().contains("unknown size unit"));
        assert!(parse_size("lots").is_err());
    }
}
