//! The daemon's end of one agent's connection.
//!
//! A DROP is asynchronous in the agent's favour: the daemon sends it and waits up to
//! [`DROP_TIMEOUT_MS`] for the answer; if none comes (the process is stopped, or starved of
//! CPU), the batch stays *outstanding* ([`PendingDrop`]): its pages stay `Dropping` and
//! write-protected, since the agent may still move any of them, and reclaim looks for the late
//! answer at each of its rounds ([`AgentConn::poll_drop`]). Only the answer, or the agent's end
//! of the connection closing, says that no page of the batch moves any more. A signal
//! interrupting the wait is not an answer either: the wait goes on.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::protocol::{self, Message, MAX_PACKET};
use crate::sys;

/// How long the daemon waits for an agent to carry out one DROP before it leaves the batch
/// outstanding and turns to other work.
pub(crate) const DROP_TIMEOUT_MS: u64 = 10_000;

/// A DROP sent and not answered yet: the pages it names (sorted), their slots, its runs, and
/// the pages it unshares.
#[derive(Debug)]
pub(crate) struct PendingDrop {
    /// The DROP's sequence number.
    pub seq: u32,
    /// The pages, in the order of the answer's statuses.
    pub pages: Vec<u64>,
    /// Each page's slot.
    pub slots: Vec<u32>,
    /// The runs the DROP named.
    pub runs: Vec<(u64, u32)>,
    /// Pages it asked to unshare (their statuses follow those of `pages`), sorted.
    pub unshare: Vec<u64>,
    /// What reclaim read from each of `pages` (and stored), page `i` at `i * 4096`: a page
    /// moved holding anything else was written through a pin meanwhile (`reclaim.rs`,
    /// `read_back`). Empty when not kept.
    pub data: Vec<u8>,
    /// The frame each of `pages` held when reclaim read it (0: unknown); empty for a DROP
    /// made without an agent (the program is stopped then: nothing can change under it).
    pub frames: Vec<u64>,
    /// Where in the scratch the agent put the DROP's first page (known once it answered).
    pub scratch_first: Option<usize>,
    /// When it was sent.
    pub sent: Instant,
    /// Whether its lateness was counted and said.
    pub said_late: bool,
}

/// Why a DROP has no answer.
#[derive(Debug)]
pub(crate) enum DropWait {
    /// Not yet: the agent may still be moving pages.
    NotYet,
    /// The agent's end closed: no page moves any more (the process exited or exec'd, or the
    /// agent stopped); the error says how.
    Gone(io::Error),
    /// The agent answered with something that is not the answer to this DROP.
    Protocol(io::Error),
}

/// A greeted agent, or the daemon's own means of dropping pages in a process without one.
#[derive(Debug)]
pub(crate) struct AgentConn {
    /// The agent's socket; `None` for a process managed without an agent, whose DROPs the
    /// daemon carries out itself with injected system calls (`agentless.rs`): they are settled
    /// before the batch ends, never outstanding.
    sock: Option<OwnedFd>,
    seq: u32,
    /// Most pages one DROP may name (the agent's scratch size).
    pub max_drop_pages: usize,
    /// The DROP in flight, if one timed out.
    pub pending: Option<PendingDrop>,
    /// Scratch pages in use, as the agent counts them (its DROPs' pages follow each other
    /// until a FREE); [`usize::MAX`] when unknown (a FREE not answered, a DROP refused for
    /// want of room).
    pub scratch_used: usize,
}

impl AgentConn {
    /// Wraps a connected socket.
    pub(crate) fn new(sock: OwnedFd, max_drop_pages: usize) -> io::Result<Self> {
        Ok(AgentConn {
            sock: Some(sock),
            seq: 0,
            max_drop_pages,
            pending: None,
            scratch_used: 0,
        })
    }

    /// The DROP channel of a process without an agent: injected system calls.
    pub(crate) fn injected(max_drop_pages: usize) -> Self {
        AgentConn {
            sock: None,
            seq: 0,
            max_drop_pages,
            pending: None,
            scratch_used: 0,
        }
    }

    /// Whether DROPs are injected system calls rather than messages to an agent.
    pub(crate) fn is_injected(&self) -> bool {
        self.sock.is_none()
    }

    fn sock(&self) -> io::Result<BorrowedFd<'_>> {
        self.sock.as_ref().map(|s| s.as_fd()).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "a process managed without an agent has no socket",
            )
        })
    }

    /// Sends one message, with descriptors (at most [`sys::MAX_SENT_FDS`]); returns its
    /// sequence number.
    pub(crate) fn send(&mut self, msg: &Message, fds: &[BorrowedFd<'_>]) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        sys::send_with_fds(self.sock()?, &protocol::encode(msg, self.seq), fds)?;
        Ok(self.seq)
    }

    /// Sends a DROP of `runs` that also unshares `unshare`; returns its sequence number.
    pub(crate) fn send_drop(
        &mut self,
        runs: &[(u64, u32)],
        unshare: &[(u64, u32)],
    ) -> io::Result<u32> {
        self.send(
            &Message::Drop {
                runs: runs.to_vec(),
                unshare: unshare.to_vec(),
            },
            &[],
        )
    }

    /// Has the agent free what DROPs moved into its scratch (the daemon has read it back), and
    /// waits up to `timeout` for its answer: freeing raises a REMOVE event that waits for the
    /// fault handler, which must be free to read it before a DROP holds it back
    /// (`reclaim::drop_by_agent`). On `Ok` the scratch is empty.
    pub(crate) fn free_scratch(&mut self, timeout: Duration) -> Result<(), DropWait> {
        let seq = self.send(&Message::Free, &[]).map_err(DropWait::Gone)?;
        self.wait_drop(seq, 0, timeout)?;
        self.scratch_used = 0;
        Ok(())
    }

    /// Waits up to `timeout` for the answer to DROP `seq` of `pages` pages: the per-page
    /// statuses (0 = moved) and the scratch page the moved pages start at. Signals do not end
    /// the wait; answers to older DROPs (which timed out and were settled otherwise) are
    /// skipped.
    pub(crate) fn wait_drop(
        &mut self,
        seq: u32,
        pages: usize,
        timeout: Duration,
    ) -> Result<(Vec<u8>, usize), DropWait> {
        let deadline = Instant::now() + timeout;
        let sock = self.sock().map_err(DropWait::Protocol)?;
        let mut buf = vec![0u8; MAX_PACKET];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            match sys::poll_read(&[sock], ms) {
                Ok(r) if r[0] => {}
                Ok(_) => return Err(DropWait::NotYet),
                Err(e) => return Err(DropWait::Protocol(e)),
            }
            let n = match sys::recv_with_fd_nonblocking(sock, &mut buf) {
                Ok((0, _)) => {
                    return Err(DropWait::Gone(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "agent closed its connection",
                    )))
                }
                Ok((n, _)) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    continue
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                    ) =>
                {
                    return Err(DropWait::Gone(e))
                }
                Err(e) => return Err(DropWait::Protocol(e)),
            };
            match protocol::decode(&buf[..n]) {
                Ok((Message::DropDone { .. }, s)) if s != seq => continue, // a late answer
                Ok((
                    Message::DropDone {
                        status,
                        scratch_first,
                    },
                    _,
                )) if status.len() == pages => return Ok((status, scratch_first as usize)),
                Ok((other, _)) => {
                    return Err(DropWait::Protocol(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("agent answered a DROP of {pages} pages with {other:?}"),
                    )))
                }
                Err(e) => {
                    return Err(DropWait::Protocol(io::Error::new(
                        io::ErrorKind::InvalidData,
                        e,
                    )))
                }
            }
        }
    }
}
