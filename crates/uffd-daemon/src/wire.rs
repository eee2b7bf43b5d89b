//! The constants the daemon and the agent (`agent/agent.c`) must agree on: the wire
//! protocol's framing, message kinds and flags, the userfaultfd features the agent asks for,
//! the status a client exits with when its daemon is gone. Written once, here: `build.rs`
//! compiles this file and writes it out as the C header `uffd_protocol.h` that the agent is
//! compiled with, so the two sides cannot drift apart. Plain constants only (no `use`): the
//! build script compiles this file on its own.

/// `"UFDA"` little-endian: the first word of every packet.
pub const MAGIC: u32 = u32::from_le_bytes(*b"UFDA");
/// Protocol version. (The daemon writes out the agent it was built with, so the two never
/// differ: FREE was added without a new version.)
pub const VERSION: u16 = 1;
/// Header size: magic, version, kind, payload length, sequence number.
pub const HEADER_LEN: usize = 16;
/// Largest packet either side sends or accepts.
pub const MAX_PACKET: usize = 64 * 1024;
/// Most runs in one DROP.
pub const MAX_RUNS: usize = 1024;
/// Most pages in one DROP (and statuses in one DROP_DONE).
pub const MAX_DROP_PAGES: usize = 4096;

/// Message kind: the agent's greeting.
pub const KIND_HELLO: u16 = 1;
/// Message kind: the daemon's answer to a greeting (and to RELEASE, LEAVE, LOCK, STEP_OUT,
/// HOLD).
pub const KIND_HELLO_ACK: u16 = 2;
/// Message kind: drop these pages.
pub const KIND_DROP: u16 = 3;
/// Message kind: the outcome of a DROP.
pub const KIND_DROP_DONE: u16 = 4;
/// Message kind: a fatal error.
pub const KIND_ERROR: u16 = 5;
/// Message kind: hand a range over to the program's own userfaultfd.
pub const KIND_RELEASE: u16 = 6;
/// Message kind: the process leaves management (a seccomp filter on every thread).
pub const KIND_LEAVE: u16 = 7;
/// Message kind: a range is about to be locked in memory.
pub const KIND_LOCK: u16 = 8;
/// Message kind: the agent's threads are about to end for a moment (a program call that needs
/// the process to have one thread: a new user namespace); they greet again with
/// [`HELLO_AGENT_RESTART`] after it.
pub const KIND_STEP_OUT: u16 = 9;
/// Message kind: bring every evicted page of a process back and evict none while it is
/// inspected (a core dump, a debugger).
pub const KIND_HOLD: u16 = 10;
/// Message kind: the daemon has read back what the last DROP moved into the scratch; the
/// agent frees it.
pub const KIND_FREE: u16 = 11;
/// Message kind: a program thread is about to call `madvise(MADV_REMOVE)` on a range, or
/// ([`SHMEM_REMOVE_DONE`]) has returned from it: the daemon tells its REMOVE events, which
/// `MADV_DONTNEED` raises alike, apart (shared memory: the stored copies of the range become
/// zeros for the first, stay valid for the second).
pub const KIND_SHMEM_REMOVE: u16 = 12;

/// HELLO flag: the sender is a forked child whose uffd the daemon already holds.
pub const HELLO_FORK_CHILD: u32 = 1;
/// HELLO flag: the process cannot make a userfaultfd itself (a user without access to
/// `/dev/userfaultfd`, after a privilege drop and exec). The daemon answers with a
/// `HELLO_ACK` carrying an open `/dev/userfaultfd`; the agent makes its uffd with it and greets
/// again with [`HELLO_API_BY_DAEMON`].
pub const HELLO_NEED_UFFD: u32 = 2;
/// HELLO flag: the attached uffd has not had `UFFDIO_API` (its process lacks the privilege
/// `EVENT_FORK` needs); the daemon enables the features and registers the agent's probe and
/// scratch pages.
pub const HELLO_API_BY_DAEMON: u32 = 4;
/// HELLO flag: the agent's threads of a process the daemon manages start again after they
/// stepped out ([`KIND_STEP_OUT`]); like a fork child, the daemon answers with the process's
/// uffd, which it kept.
pub const HELLO_AGENT_RESTART: u32 = 8;

/// DROP run flag: do not move this run's pages; make them the process's own again
/// (`MADV_POPULATE_WRITE`, which breaks copy-on-write sharing as a write would, without
/// writing). Pages shared with a forked child, or left shared after it exited, refuse
/// `UFFDIO_MOVE` (`EBUSY`) until then. The agent unshares after all the moves of the DROP.
pub const DROP_RUN_UNSHARE: u32 = 1;

/// LOCK flag: the range is about to be locked (clear: a lock asked for did not happen).
pub const LOCK_ON: u32 = 1;
/// SHMEM_REMOVE flag: the `madvise` call has returned (the announcement ends).
pub const SHMEM_REMOVE_DONE: u32 = 1;

/// HOLD reason: the sender is about to dump core (a core-dumping signal it left at its
/// default action); the hold lasts until it exits.
pub const HOLD_DUMP: u32 = 1;
/// HOLD reason: the sender is about to trace the process it names (`PTRACE_ATTACH`,
/// `PTRACE_SEIZE`); the hold lasts while the process is traced.
pub const HOLD_TRACE: u32 = 2;
/// HOLD reason: the sender is about to open its own memory file (`/proc/self/mem`); the hold
/// lasts while a descriptor of the process names a memory file.
pub const HOLD_SELF_MEM: u32 = 4;

/// Feature bits (`UFFD_FEATURE_*`).
pub const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
/// See [`UFFD_FEATURE_PAGEFAULT_FLAG_WP`].
pub const UFFD_FEATURE_EVENT_FORK: u64 = 1 << 1;
/// See [`UFFD_FEATURE_PAGEFAULT_FLAG_WP`].
pub const UFFD_FEATURE_EVENT_REMAP: u64 = 1 << 2;
/// See [`UFFD_FEATURE_PAGEFAULT_FLAG_WP`].
pub const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
/// See [`UFFD_FEATURE_PAGEFAULT_FLAG_WP`].
pub const UFFD_FEATURE_EVENT_UNMAP: u64 = 1 << 6;
/// See [`UFFD_FEATURE_PAGEFAULT_FLAG_WP`].
pub const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
/// See [`UFFD_FEATURE_PAGEFAULT_FLAG_WP`].
pub const UFFD_FEATURE_MOVE: u64 = 1 << 16;
/// Missing faults on shared memory (shmem): registering a `MAP_SHARED` anonymous mapping
/// (Linux 4.11).
pub const UFFD_FEATURE_MISSING_SHMEM: u64 = 1 << 5;
/// Write-protection of shared memory (shmem, hugetlbfs; Linux 5.19).
pub const UFFD_FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;

/// The features the agent asks for and the daemon relies on.
pub const REQUIRED_FEATURES: u64 = UFFD_FEATURE_PAGEFAULT_FLAG_WP
    | UFFD_FEATURE_EVENT_FORK
    | UFFD_FEATURE_EVENT_REMAP
    | UFFD_FEATURE_EVENT_REMOVE
    | UFFD_FEATURE_EVENT_UNMAP
    | UFFD_FEATURE_THREAD_ID
    | UFFD_FEATURE_MOVE
    | UFFD_FEATURE_MISSING_SHMEM
    | UFFD_FEATURE_WP_HUGETLBFS_SHMEM;

/// Exit status of a client whose daemon died: its evicted pages can never come back.
pub const EXIT_DAEMON_LOST: i32 = 86;

/// The end of the user address space with 5-level page tables: beyond any user address.
pub const USER_END: u64 = 1 << 57;
