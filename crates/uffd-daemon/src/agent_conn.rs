//! The daemon's end of one agent's connection.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::protocol::{self, Message, MAX_PACKET};
use crate::sys;

/// How long the daemon waits for an agent to carry out one DROP.
pub const DROP_TIMEOUT_MS: u64 = 10_000;

/// A greeted agent.
#[derive(Debug)]
pub struct AgentConn {
    sock: OwnedFd,
    seq: u32,
    /// Most pages one DROP may name (the agent's scratch size).
    pub max_drop_pages: usize,
}

impl AgentConn {
    /// Wraps a connected socket.
    pub fn new(sock: OwnedFd, max_drop_pages: usize) -> io::Result<Self> {
        sys::set_recv_timeout(sock.as_raw_fd(), DROP_TIMEOUT_MS)?;
        Ok(AgentConn {
            sock,
            seq: 0,
            max_drop_pages,
        })
    }

    /// Sends one message, with an optional descriptor.
    pub fn send(&mut self, msg: &Message, fd: Option<i32>) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        sys::send_with_fd(self.sock.as_raw_fd(), &protocol::encode(msg, self.seq), fd)
    }

    /// Asks the agent to drop `runs` and waits for its per-page answer (0 = dropped).
    ///
    /// A timeout (`ErrorKind::WouldBlock`/`TimedOut`) leaves the connection usable: a late
    /// answer is recognised by its sequence number and skipped by the next call.
    pub fn drop_pages(&mut self, runs: &[(u64, u32)]) -> io::Result<Vec<u8>> {
        let pages: usize = runs.iter().map(|r| r.1 as usize).sum();
        self.send(
            &Message::Drop {
                runs: runs.to_vec(),
            },
            None,
        )?;
        let want = self.seq;
        let mut buf = vec![0u8; MAX_PACKET];
        loop {
            let (n, _) = sys::recv_with_fd(self.sock.as_raw_fd(), &mut buf)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "agent closed its connection",
                ));
            }
            match protocol::decode(&buf[..n]) {
                Ok((Message::DropDone { .. }, seq)) if seq != want => continue, // a late answer
                Ok((Message::DropDone { status }, _)) if status.len() == pages => {
                    return Ok(status)
                }
                Ok((other, _)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("agent answered a DROP of {pages} pages with {other:?}"),
                    ))
                }
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
        }
    }
}
