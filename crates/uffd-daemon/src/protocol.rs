//! The wire protocol between the daemon and the agent inside each client process.
//!
//! One message per `SOCK_SEQPACKET` packet, little-endian:
//!
//! ```text
//! header (16 bytes): magic u32 = "UFDA", version u16, kind u16, payload_len u32, seq u32
//! HELLO      agent  -> daemon  pid u32, ppid u32, flags u32, pad u32, features u64,
//!                              region_start u64, region_len u64, probe u64, scratch u64,
//!                              scratch_pages u32, pad u32            (+ the uffd by SCM_RIGHTS
//!                                                                     unless FORK_CHILD or
//!                                                                     AGENT_RESTART;
//!                                                                     scratch = probe + 4096)
//! HELLO_ACK  daemon -> agent   status i32, max_drop_pages u32        (+ by SCM_RIGHTS, to a
//!                                                                     greeting accepted: the
//!                                                                     child's uffd to a fork
//!                                                                     child or an AGENT_RESTART,
//!                                                                     then the daemon's lifeline,
//!                                                                     a pipe that hangs up when
//!                                                                     the daemon exits)
//! DROP       daemon -> agent   nruns u32, pad u32, nruns x (addr u64, npages u32, pad u32)
//! DROP_DONE  agent  -> daemon  npages u32, scratch_first u32, npages x status u8 (0 = moved,
//!                              else errno; the k-th page moved is at scratch page
//!                              scratch_first + k)
//! FREE       daemon -> agent   (no payload): free what the last DROP moved into the scratch;
//!                              answered by a DROP_DONE of no page with the FREE's number
//! ERROR      daemon -> agent   code i32, message bytes (UTF-8)
//! RELEASE    agent  -> daemon  start u64, len u64                    (program thread, own
//!                                                                     connection; so are the
//!                                                                     three below)
//! LEAVE      agent  -> daemon  (nothing)
//! LOCK       agent  -> daemon  start u64, len u64, flags u32, pad u32
//! HOLD       agent  -> daemon  pid u32 (0: the sender), reason u32 (HOLD_DUMP, HOLD_TRACE,
//!                              HOLD_SELF_MEM)
//! ```
//!
//! The agent side is C (`agent/agent.c`) and mirrors these constants. Everything the daemon
//! decodes comes from a client and is untrusted: [`decode`] checks every length and value and
//! answers a [`ProtocolError`] that names what was wrong; it never panics (fuzzed by
//! `fuzz/fuzz_targets/protocol_decode.rs`).

use thiserror::Error;

pub use crate::wire::{
    DROP_RUN_UNSHARE, HEADER_LEN, HELLO_AGENT_RESTART, HELLO_API_BY_DAEMON, HELLO_FORK_CHILD,
    HELLO_NEED_UFFD, HOLD_DUMP, HOLD_SELF_MEM, HOLD_TRACE, KIND_DROP, KIND_DROP_DONE, KIND_ERROR,
    KIND_FREE, KIND_HELLO, KIND_HELLO_ACK, KIND_HOLD, KIND_LEAVE, KIND_LOCK, KIND_RELEASE,
    KIND_SHMEM_REMOVE, KIND_STEP_OUT, LOCK_ON, MAGIC, MAX_DROP_PAGES, MAX_PACKET, MAX_RUNS,
    SHMEM_REMOVE_DONE, VERSION,
};

/// The agent's greeting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The sender's pid.
    pub pid: u32,
    /// Its parent's pid.
    pub ppid: u32,
    /// `HELLO_*` flags.
    pub flags: u32,
    /// uffd features the kernel granted.
    pub features: u64,
    /// The agent's own region (probe, scratch, its thread's stack): never managed.
    pub region_start: u64,
    /// Length of that region.
    pub region_len: u64,
    /// Probe page: a forked child touches it so that its fault names its pid.
    pub probe: u64,
    /// Scratch area that dropped pages are moved to before they are freed.
    pub scratch: u64,
    /// Pages in the scratch area: the most pages one DROP may name.
    pub scratch_pages: u32,
}

/// A message of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Agent greeting.
    Hello(Hello),
    /// Daemon's answer to a greeting.
    HelloAck {
        /// 0, or an errno-like code.
        status: i32,
        /// Most pages the daemon will put in one DROP.
        max_drop_pages: u32,
    },
    /// Drop these runs of pages: `(address, pages)`; then unshare those of `unshare`
    /// ([`DROP_RUN_UNSHARE`](crate::wire::DROP_RUN_UNSHARE)).
    Drop {
        /// Page-aligned runs to move out.
        runs: Vec<(u64, u32)>,
        /// Page-aligned runs to make the process's own (on the wire after `runs`, flagged).
        unshare: Vec<(u64, u32)>,
    },
    /// Outcome per page of the last DROP, in order (the pages of `runs`, then those of
    /// `unshare`): 0 moved into the scratch (unshared), else errno.
    DropDone {
        /// One status per page.
        status: Vec<u8>,
        /// The scratch page the moved pages start at (the agent fills its scratch as a ring).
        scratch_first: u32,
    },
    /// The daemon has read back what the last DROP moved into the agent's scratch (a page
    /// written through a pin after the daemon first read it holds more than was stored): the
    /// agent frees the scratch now, then answers with a [`Message::DropDone`] of no page that
    /// carries the FREE's sequence number. Until then the moved pages stay there.
    Free,
    /// From a program thread of a managed process, on a connection of its own: the program
    /// registers `[start, start + len)` with a userfaultfd of its own; the daemon brings back
    /// every page it evicted there and steps aside (answered with `HelloAck`, status 0 or an
    /// errno).
    Release {
        /// Page-aligned start.
        start: u64,
        /// Length in bytes, page-aligned, not zero.
        len: u64,
    },
    /// From a program thread of a managed process, on a connection of its own: the program
    /// is about to install a seccomp filter on all its threads (`SECCOMP_FILTER_FLAG_TSYNC`),
    /// which would reach the agent's threads too. The daemon settles any DROP in flight, closes
    /// the agent's connection (its threads then end), brings back every page it evicted from
    /// the process and stops managing it (answered with `HelloAck`, status 0 or an errno).
    Leave,
    /// From a program thread of a managed process, on a connection of its own: the program
    /// makes a call the kernel allows only to a process of one thread (`unshare` or `setns`
    /// of a user namespace, ...), and the agent's threads end for it. The daemon settles any
    /// DROP in flight and closes the agent's connection, and keeps everything else: the
    /// registrations, the stored pages, the uffd (answered with `HelloAck`, status 0 or an
    /// errno). The agent's new threads greet again with
    /// [`HELLO_AGENT_RESTART`](crate::wire::HELLO_AGENT_RESTART).
    StepOut,
    /// From a program thread of a managed process, on a connection of its own, before its
    /// `mlock`, `mlock2` or `mlockall` (or after one that failed): no page of the range may be
    /// chosen for eviction from now on, so that none reaches a tier after the lock (the
    /// census, which leaves locked mappings alone, sees a lock only at its next scan). Answered
    /// with `HelloAck` once no eviction of the process is in flight.
    Lock {
        /// Page-aligned start.
        start: u64,
        /// Length in bytes, page-aligned, not zero.
        len: u64,
        /// `LOCK_*` flags.
        flags: u32,
    },
    /// From a program thread of a managed process, on a connection of its own, before its
    /// `madvise(MADV_REMOVE)` of a range and (flag [`SHMEM_REMOVE_DONE`]) after it returned:
    /// REMOVE events of shared anonymous memory in the range meanwhile are that call's (its
    /// pages become zeros), not an `MADV_DONTNEED`'s (its pages keep their contents). Answered
    /// with `HelloAck`; after the call, once the REMOVE events it raised are applied.
    ShmemRemove {
        /// Page-aligned start.
        start: u64,
        /// Length in bytes, page-aligned, not zero.
        len: u64,
        /// `SHMEM_REMOVE_*` flags.
        flags: u32,
    },
    /// From a program thread of a managed process, on a connection of its own: the process
    /// `pid` (0: the sender) is about to be inspected from outside, by a core dump
    /// ([`HOLD_DUMP`]: the sender got a core-dumping signal it leaves at its default action)
    /// or by a tracer ([`HOLD_TRACE`]: the sender is about to attach to it), or by itself
    /// ([`HOLD_SELF_MEM`]: the sender is about to open its own `/proc/PID/mem`). The kernel reads
    /// the memory of such a process without a userfault (a dump takes a missing page for a
    /// hole, `/proc/PID/mem` and `PEEKDATA` fail with `EIO`), so the daemon brings every page
    /// it evicted back, hands the memory to the kernel and evicts nothing more from it
    /// (`supervisor/hold.rs`). Answered with `HelloAck` once that is done.
    Hold {
        /// The process (or one of its threads); 0 for the sender's own.
        pid: u32,
        /// `HOLD_DUMP`, `HOLD_TRACE` or `HOLD_SELF_MEM`.
        reason: u32,
    },
    /// A fatal error for the agent.
    Error {
        /// Code.
        code: i32,
        /// What went wrong.
        message: String,
    },
}

/// Why a packet was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Shorter than a header.
    #[error("packet of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Short(usize),
    /// Longer than allowed.
    #[error("packet of {0} bytes exceeds the maximum of {MAX_PACKET}")]
    TooLong(usize),
    /// Wrong magic.
    #[error("bad magic {0:#010x} (expected {MAGIC:#010x})")]
    Magic(u32),
    /// Unsupported version.
    #[error("unsupported protocol version {0} (this daemon speaks {VERSION})")]
    Version(u16),
    /// Unknown kind.
    #[error("unknown message kind {0}")]
    Kind(u16),
    /// Header length disagrees with the packet.
    #[error("header says {header} payload bytes but the packet carries {actual}")]
    Length {
        /// Claimed.
        header: usize,
        /// Present.
        actual: usize,
    },
    /// Payload too short or too long for its kind.
    #[error("{kind} payload of {len} bytes is malformed: {why}")]
    Payload {
        /// Message kind.
        kind: &'static str,
        /// Payload length.
        len: usize,
        /// What is wrong.
        why: String,
    },
}

fn put_header(out: &mut Vec<u8>, kind: u16, payload_len: usize, seq: u32) {
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
}

/// Encodes a message. Panics only on programmer error (a DROP beyond the limits).
pub fn encode(msg: &Message, seq: u32) -> Vec<u8> {
    let mut p = Vec::new();
    let kind = match msg {
        Message::Hello(h) => {
            for v in [h.pid, h.ppid, h.flags, 0] {
                p.extend_from_slice(&v.to_le_bytes());
            }
            for v in [h.features, h.region_start, h.region_len, h.probe, h.scratch] {
                p.extend_from_slice(&v.to_le_bytes());
            }
            p.extend_from_slice(&h.scratch_pages.to_le_bytes());
            p.extend_from_slice(&0u32.to_le_bytes());
            KIND_HELLO
        }
        Message::HelloAck {
            status,
            max_drop_pages,
        } => {
            p.extend_from_slice(&status.to_le_bytes());
            p.extend_from_slice(&max_drop_pages.to_le_bytes());
            KIND_HELLO_ACK
        }
        Message::Drop { runs, unshare } => {
            let n = runs.len() + unshare.len();
            assert!(n <= MAX_RUNS, "DROP with {n} runs");
            p.extend_from_slice(&(n as u32).to_le_bytes());
            p.extend_from_slice(&0u32.to_le_bytes());
            for (&(addr, n), flags) in runs
                .iter()
                .map(|r| (r, 0u32))
                .chain(unshare.iter().map(|r| (r, DROP_RUN_UNSHARE)))
            {
                p.extend_from_slice(&addr.to_le_bytes());
                p.extend_from_slice(&n.to_le_bytes());
                p.extend_from_slice(&flags.to_le_bytes());
            }
            KIND_DROP
        }
        Message::DropDone {
            status,
            scratch_first,
        } => {
            assert!(status.len() <= MAX_DROP_PAGES);
            p.extend_from_slice(&(status.len() as u32).to_le_bytes());
            p.extend_from_slice(&scratch_first.to_le_bytes());
            p.extend_from_slice(status);
            KIND_DROP_DONE
        }
        Message::Release { start, len } => {
            p.extend_from_slice(&start.to_le_bytes());
            p.extend_from_slice(&len.to_le_bytes());
            KIND_RELEASE
        }
        Message::Leave => KIND_LEAVE,
        Message::StepOut => KIND_STEP_OUT,
        Message::Free => KIND_FREE,
        Message::Lock { start, len, flags } => {
            p.extend_from_slice(&start.to_le_bytes());
            p.extend_from_slice(&len.to_le_bytes());
            p.extend_from_slice(&flags.to_le_bytes());
            p.extend_from_slice(&0u32.to_le_bytes());
            KIND_LOCK
        }
        Message::ShmemRemove { start, len, flags } => {
            p.extend_from_slice(&start.to_le_bytes());
            p.extend_from_slice(&len.to_le_bytes());
            p.extend_from_slice(&flags.to_le_bytes());
            p.extend_from_slice(&0u32.to_le_bytes());
            KIND_SHMEM_REMOVE
        }
        Message::Hold { pid, reason } => {
            p.extend_from_slice(&pid.to_le_bytes());
            p.extend_from_slice(&reason.to_le_bytes());
            KIND_HOLD
        }
        Message::Error { code, message } => {
            p.extend_from_slice(&code.to_le_bytes());
            let bytes = message.as_bytes();
            let room = MAX_PACKET - HEADER_LEN - 4;
            p.extend_from_slice(&bytes[..bytes.len().min(room)]);
            KIND_ERROR
        }
    };
    let mut out = Vec::with_capacity(HEADER_LEN + p.len());
    put_header(&mut out, kind, p.len(), seq);
    out.extend_from_slice(&p);
    out
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn payload_err(kind: &'static str, len: usize, why: impl Into<String>) -> ProtocolError {
    ProtocolError::Payload {
        kind,
        len,
        why: why.into(),
    }
}

/// Decodes one packet: `(message, seq)`.
pub fn decode(pkt: &[u8]) -> Result<(Message, u32), ProtocolError> {
    if pkt.len() < HEADER_LEN {
        return Err(ProtocolError::Short(pkt.len()));
    }
    if pkt.len() > MAX_PACKET {
        return Err(ProtocolError::TooLong(pkt.len()));
    }
    let magic = u32_at(pkt, 0);
    if magic != MAGIC {
        return Err(ProtocolError::Magic(magic));
    }
    let version = u16::from_le_bytes([pkt[4], pkt[5]]);
    if version != VERSION {
        return Err(ProtocolError::Version(version));
    }
    let kind = u16::from_le_bytes([pkt[6], pkt[7]]);
    let plen = u32_at(pkt, 8) as usize;
    let seq = u32_at(pkt, 12);
    let p = &pkt[HEADER_LEN..];
    if plen != p.len() {
        return Err(ProtocolError::Length {
            header: plen,
            actual: p.len(),
        });
    }
    let msg = match kind {
        KIND_HELLO => decode_hello(p)?,
        KIND_HELLO_ACK => decode_hello_ack(p)?,
        KIND_DROP => decode_drop(p)?,
        KIND_DROP_DONE => decode_drop_done(p)?,
        KIND_ERROR => decode_error(p)?,
        KIND_RELEASE => decode_release(p)?,
        KIND_LEAVE => empty(p, "LEAVE", Message::Leave)?,
        KIND_STEP_OUT => empty(p, "STEP_OUT", Message::StepOut)?,
        KIND_FREE => empty(p, "FREE", Message::Free)?,
        KIND_LOCK => decode_lock(p)?,
        KIND_SHMEM_REMOVE => decode_shmem_remove(p)?,
        KIND_HOLD => decode_hold(p)?,
        other => return Err(ProtocolError::Kind(other)),
    };
    Ok((msg, seq))
}

/// A message without a payload.
fn empty(p: &[u8], name: &'static str, m: Message) -> Result<Message, ProtocolError> {
    if !p.is_empty() {
        return Err(payload_err(name, p.len(), "expected no payload"));
    }
    Ok(m)
}

/// A HELLO: the agent region, probe and scratch checked to lie as the agent lays them out.
fn decode_hello(p: &[u8]) -> Result<Message, ProtocolError> {
    if p.len() != 64 {
        return Err(payload_err("HELLO", p.len(), "expected 64 bytes"));
    }
    let h = Hello {
        pid: u32_at(p, 0),
        ppid: u32_at(p, 4),
        flags: u32_at(p, 8),
        features: u64_at(p, 16),
        region_start: u64_at(p, 24),
        region_len: u64_at(p, 32),
        probe: u64_at(p, 40),
        scratch: u64_at(p, 48),
        scratch_pages: u32_at(p, 56),
    };
    if h.flags & !(HELLO_FORK_CHILD | HELLO_NEED_UFFD | HELLO_API_BY_DAEMON | HELLO_AGENT_RESTART)
        != 0
    {
        return Err(payload_err(
            "HELLO",
            p.len(),
            format!("unknown flags {:#x}", h.flags),
        ));
    }
    let page = crate::sys::PAGE_SIZE_U64;
    let region_end = h.region_start.checked_add(h.region_len);
    let scratch_end = (h.scratch_pages as u64)
        .checked_mul(page)
        .and_then(|l| h.scratch.checked_add(l));
    let ok = h.region_start % page == 0
        && h.region_len % page == 0
        && h.probe % page == 0
        && h.scratch == h.probe.wrapping_add(page)
        && h.scratch_pages >= 1
        && h.scratch_pages as usize <= MAX_DROP_PAGES
        && matches!((region_end, scratch_end), (Some(re), Some(se))
            if h.probe >= h.region_start && h.probe + page <= re
                && h.scratch >= h.region_start && se <= re);
    if !ok {
        return Err(payload_err(
            "HELLO",
            p.len(),
            "agent region, probe and scratch must be page aligned, with the probe and \
             1..=4096 scratch pages right after it inside the region",
        ));
    }
    Ok(Message::Hello(h))
}

/// A HELLO_ACK.
fn decode_hello_ack(p: &[u8]) -> Result<Message, ProtocolError> {
    if p.len() != 8 {
        return Err(payload_err("HELLO_ACK", p.len(), "expected 8 bytes"));
    }
    Ok(Message::HelloAck {
        status: u32_at(p, 0) as i32,
        max_drop_pages: u32_at(p, 4),
    })
}

/// A DROP: its runs to move, then those to unshare, within the page bounds.
fn decode_drop(p: &[u8]) -> Result<Message, ProtocolError> {
    if p.len() < 8 {
        return Err(payload_err("DROP", p.len(), "shorter than its count"));
    }
    let n = u32_at(p, 0) as usize;
    if n > MAX_RUNS {
        return Err(payload_err(
            "DROP",
            p.len(),
            format!("{n} runs exceed the maximum of {MAX_RUNS}"),
        ));
    }
    if p.len() != 8 + 16 * n {
        return Err(payload_err(
            "DROP",
            p.len(),
            format!("{n} runs need {} bytes", 8 + 16 * n),
        ));
    }
    let mut runs = Vec::with_capacity(n);
    let mut unshare = Vec::new();
    let mut total = 0usize;
    for i in 0..n {
        let addr = u64_at(p, 8 + 16 * i);
        let pages = u32_at(p, 16 + 16 * i);
        let flags = u32_at(p, 20 + 16 * i);
        if addr % crate::sys::PAGE_SIZE_U64 != 0 || pages == 0 {
            return Err(payload_err(
                "DROP",
                p.len(),
                format!("run {i} is not page aligned or empty"),
            ));
        }
        if flags & !DROP_RUN_UNSHARE != 0 || (flags == 0 && !unshare.is_empty()) {
            return Err(payload_err(
                "DROP",
                p.len(),
                format!(
                    "run {i} has flags {flags:#x} (only DROP_RUN_UNSHARE, on runs after \
                     every run to move)"
                ),
            ));
        }
        total += pages as usize;
        if total > MAX_DROP_PAGES {
            return Err(payload_err(
                "DROP",
                p.len(),
                format!("more than {MAX_DROP_PAGES} pages"),
            ));
        }
        if flags == DROP_RUN_UNSHARE {
            unshare.push((addr, pages));
        } else {
            runs.push((addr, pages));
        }
    }
    Ok(Message::Drop { runs, unshare })
}

/// A DROP_DONE: one status byte a page.
fn decode_drop_done(p: &[u8]) -> Result<Message, ProtocolError> {
    if p.len() < 8 {
        return Err(payload_err("DROP_DONE", p.len(), "shorter than its count"));
    }
    let n = u32_at(p, 0) as usize;
    if n > MAX_DROP_PAGES || p.len() != 8 + n {
        return Err(payload_err(
            "DROP_DONE",
            p.len(),
            format!("count {n} does not match the payload"),
        ));
    }
    Ok(Message::DropDone {
        status: p[8..].to_vec(),
        scratch_first: u32_at(p, 4),
    })
}

/// An ERROR: a code and a message.
fn decode_error(p: &[u8]) -> Result<Message, ProtocolError> {
    if p.len() < 4 {
        return Err(payload_err("ERROR", p.len(), "shorter than its code"));
    }
    Ok(Message::Error {
        code: u32_at(p, 0) as i32,
        message: String::from_utf8_lossy(&p[4..]).into_owned(),
    })
}

/// A RELEASE of a page-aligned range.
fn decode_release(p: &[u8]) -> Result<Message, ProtocolError> {
    if p.len() != 16 {
        return Err(payload_err("RELEASE", p.len(), "expected 16 bytes"));
    }
    let (start, len) = (u64_at(p, 0), u64_at(p, 8));
    let page = crate::sys::PAGE_SIZE_U64;
    if start % page != 0 || len % page != 0 || len == 0 || start.checked_add(len).is_none() {
        return Err(payload_err(
            "RELEASE",
            p.len(),
            format!("range {start:#x}+{len:#x} is not page aligned, empty or wraps"),
        ));
    }
    Ok(Message::Release { start, len })
}

/// A SHMEM_REMOVE of a page-aligned range (or its end).
fn decode_shmem_remove(p: &[u8]) -> Result<Message, ProtocolError> {
    if p.len() != 24 {
        return Err(payload_err("SHMEM_REMOVE", p.len(), "expected 24 bytes"));
    }
    let (start, len, flags) = (u64_at(p, 0), u64_at(p, 8), u32_at(p, 16));
    let page = crate::sys::PAGE_SIZE_U64;
    if start % page != 0 || len % page != 0 || len == 0 || start.checked_add(len).is_none() {
        return Err(payload_err(
            "SHMEM_REMOVE",
            p.len(),
            format!("range {start:#x}+{len:#x} is not page aligned, empty or wraps"),
        ));
    }
    if flags & !SHMEM_REMOVE_DONE != 0 {
        return Err(payload_err(
            "SHMEM_REMOVE",
            p.len(),
            format!("unknown flags {flags:#x}"),
        ));
    }
    Ok(Message::ShmemRemove { start, len, flags })
}

/// A LOCK of a page-aligned range (or its undoing).
fn decode_lock(p: &[u8]) -> Result<Message, ProtocolError> {
    if p.len() != 24 {
        return Err(payload_err("LOCK", p.len(), "expected 24 bytes"));
    }
    let (start, len, flags) = (u64_at(p, 0), u64_at(p, 8), u32_at(p, 16));
    let page = crate::sys::PAGE_SIZE_U64;
    if start % page != 0 || len % page != 0 || len == 0 || start.checked_add(len).is_none() {
        return Err(payload_err(
            "LOCK",
            p.len(),
            format!("range {start:#x}+{len:#x} is not page aligned, empty or wraps"),
        ));
    }
    if flags & !LOCK_ON != 0 {
        return Err(payload_err(
            "LOCK",
            p.len(),
            format!("unknown flags {flags:#x}"),
        ));
    }
    Ok(Message::Lock { start, len, flags })
}

/// A HOLD: a pid and a known reason.
fn decode_hold(p: &[u8]) -> Result<Message, ProtocolError> {
    if p.len() != 8 {
        return Err(payload_err("HOLD", p.len(), "expected 8 bytes"));
    }
    let (pid, reason) = (u32_at(p, 0), u32_at(p, 4));
    if reason != HOLD_DUMP && reason != HOLD_TRACE && reason != HOLD_SELF_MEM {
        return Err(payload_err(
            "HOLD",
            p.len(),
            format!(
                "unknown reason {reason} (HOLD_DUMP {HOLD_DUMP}, HOLD_TRACE {HOLD_TRACE} \
                 or HOLD_SELF_MEM {HOLD_SELF_MEM})"
            ),
        ));
    }
    if pid > i32::MAX as u32 {
        return Err(payload_err(
            "HOLD",
            p.len(),
            format!("pid {pid} is not a pid"),
        ));
    }
    Ok(Message::Hold { pid, reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn page_addr() -> impl Strategy<Value = u64> {
        (0u64..(1 << 35)).prop_map(|p| p * 4096)
    }

    fn message() -> impl Strategy<Value = Message> {
        prop_oneof![
            (
                any::<u32>(),
                any::<u32>(),
                0u32..2,
                any::<u64>(),
                page_addr(),
                1u32..64
            )
                .prop_map(|(pid, ppid, flags, features, start, scratch_pages)| {
                    Message::Hello(Hello {
                        pid,
                        ppid,
                        flags,
                        features,
                        region_start: start,
                        region_len: (scratch_pages as u64 + 8) * 4096,
                        probe: start,
                        scratch: start + 4096,
                        scratch_pages,
                    })
                }),
            (any::<i32>(), any::<u32>()).prop_map(|(status, max_drop_pages)| Message::HelloAck {
                status,
                max_drop_pages
            }),
            (
                proptest::collection::vec((page_addr(), 1u32..4), 0..64),
                proptest::collection::vec((page_addr(), 1u32..4), 0..16)
            )
                .prop_map(|(runs, unshare)| Message::Drop { runs, unshare }),
            (proptest::collection::vec(any::<u8>(), 0..512), any::<u32>()).prop_map(
                |(status, scratch_first)| Message::DropDone {
                    status,
                    scratch_first
                }
            ),
            (any::<i32>(), "[a-z ]{0,40}")
                .prop_map(|(code, message)| Message::Error { code, message }),
            (page_addr(), 1u64..1024).prop_map(|(start, pages)| Message::Release {
                start,
                len: pages * 4096
            }),
            Just(Message::Leave),
            Just(Message::StepOut),
            Just(Message::Free),
            (page_addr(), 1u64..1024, 0u32..2).prop_map(|(start, pages, flags)| Message::Lock {
                start,
                len: pages * 4096,
                flags
            }),
            (page_addr(), 1u64..1024, 0u32..2).prop_map(|(start, pages, flags)| {
                Message::ShmemRemove {
                    start,
                    len: pages * 4096,
                    flags,
                }
            }),
            (
                0u32..1 << 22,
                prop_oneof![Just(HOLD_DUMP), Just(HOLD_TRACE), Just(HOLD_SELF_MEM)]
            )
                .prop_map(|(pid, reason)| Message::Hold { pid, reason }),
        ]
    }

    proptest! {
        #[test]
        fn roundtrip(msg in message(), seq in any::<u32>()) {
            let bytes = encode(&msg, seq);
            prop_assert!(bytes.len() <= MAX_PACKET);
            prop_assert_eq!(decode(&bytes), Ok((msg, seq)));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn truncation_and_corruption_are_errors(msg in message(), cut in 1usize..16, flip in 0usize..16) {
            let bytes = encode(&msg, 7);
            // Any truncation is refused (the header length no longer matches).
            let cut = cut.min(bytes.len());
            prop_assert!(decode(&bytes[..bytes.len() - cut]).is_err());
            // Corrupting the header's magic, version or length is refused.
            let mut bad = bytes.clone();
            let at = [0usize, 4, 8, 9][flip % 4];
            bad[at] ^= 0x5a;
            prop_assert!(decode(&bad).is_err());
        }
    }

    #[test]
    fn errors_name_the_problem() {
        let mut pkt = encode(
            &Message::Drop {
                runs: vec![(4096, 1)],
                unshare: vec![],
            },
            1,
        );
        pkt[HEADER_LEN + 8] = 1; // misalign the run's address
        let err = decode(&pkt).unwrap_err();
        assert!(
            err.to_string().contains("run 0 is not page aligned"),
            "{err}"
        );
        assert_eq!(decode(&[0; 3]), Err(ProtocolError::Short(3)));
        let big = vec![0u8; MAX_PACKET + 1];
        assert_eq!(decode(&big), Err(ProtocolError::TooLong(MAX_PACKET + 1)));
    }

    #[test]
    fn hold_reasons_are_checked() {
        let pkt = encode(&Message::Hold { pid: 0, reason: 7 }, 0);
        let err = decode(&pkt).unwrap_err();
        assert!(err.to_string().contains("unknown reason 7"), "{err}");
        let pkt = encode(
            &Message::Hold {
                pid: u32::MAX,
                reason: HOLD_DUMP,
            },
            0,
        );
        assert!(decode(&pkt).is_err());
    }

    #[test]
    fn hello_region_is_validated() {
        let h = Hello {
            pid: 1,
            ppid: 0,
            flags: 0,
            features: 0,
            region_start: 4096,
            region_len: 4096,
            probe: 4096,
            scratch: 8192, // outside the region
            scratch_pages: 1,
        };
        assert!(decode(&encode(&Message::Hello(h.clone()), 0)).is_err());
        // The scratch area must start right after the probe page: its first page is where
        // the agent thread names itself (Mm::agent_name_page).
        let h = Hello {
            region_len: 4 * 4096,
            scratch: 3 * 4096,
            ..h
        };
        let err = decode(&encode(&Message::Hello(h.clone()), 0)).unwrap_err();
        assert!(err.to_string().contains("right after it"), "{err}");
        let h = Hello {
            scratch: 2 * 4096,
            ..h
        };
        assert!(decode(&encode(&Message::Hello(h), 0)).is_ok());
    }
}
