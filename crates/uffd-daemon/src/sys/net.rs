//! The agents' `SOCK_SEQPACKET` sockets: the listening socket, accepting, descriptors passed
//! with `SCM_RIGHTS`, and the options the daemon reads and sets. On rustix, except the peer's
//! credentials (below).
//!
//! Every descriptor is taken borrowed (`impl AsFd`, `BorrowedFd`): the borrow checker keeps it
//! open for the call.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, Shutdown, SocketAddrUnix, SocketFlags,
    SocketType,
};

/// Longest path a Unix socket address holds (`sun_path`, without its terminating NUL).
pub const UNIX_PATH_MAX: usize = 107;

/// A new `AF_UNIX`, `SOCK_SEQPACKET` socket, close-on-exec.
pub fn seqpacket_socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Binds `sock` to the filesystem path `path` (at most [`UNIX_PATH_MAX`] bytes:
/// `ENAMETOOLONG` otherwise).
pub fn bind_unix(sock: impl AsFd, path: &Path) -> io::Result<()> {
    let addr = SocketAddrUnix::new(path)?;
    Ok(rustix::net::bind(sock, &addr)?)
}

/// `listen(2)` with a backlog of `backlog` connections.
pub fn listen(sock: impl AsFd, backlog: i32) -> io::Result<()> {
    Ok(rustix::net::listen(sock, backlog)?)
}

/// Accepts one connection on the listening socket `sock` (close-on-exec). `Interrupted` when a
/// signal came first.
pub fn accept(sock: impl AsFd) -> io::Result<OwnedFd> {
    Ok(rustix::net::accept_with(sock, SocketFlags::CLOEXEC)?)
}

/// Stops writing on a connected socket (`shutdown(SHUT_WR)`): the peer reads the end of the
/// stream after what was sent.
pub fn shutdown_write(sock: impl AsFd) -> io::Result<()> {
    Ok(rustix::net::shutdown(sock, Shutdown::Write)?)
}

/// Sends `data` with an optional descriptor over a `SOCK_SEQPACKET` socket.
pub fn send_with_fd(sock: impl AsFd, data: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    send_with_fds(sock, data, fd.as_slice())
}

/// Most descriptors [`send_with_fds`] sends with one packet.
pub const MAX_SENT_FDS: usize = 2;

/// Sends `data` with up to [`MAX_SENT_FDS`] descriptors, in this order, over a
/// `SOCK_SEQPACKET` socket (`MSG_NOSIGNAL`: a peer gone is `EPIPE`, not a signal). A signal
/// during the send retries it.
pub fn send_with_fds(sock: impl AsFd, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_SENT_FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let sock = sock.as_fd();
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_SENT_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        let pushed = control.push(SendAncillaryMessage::ScmRights(fds));
        debug_assert!(pushed, "the control buffer holds MAX_SENT_FDS descriptors");
    }
    let iov = [IoSlice::new(data)];
    loop {
        match rustix::net::sendmsg(sock, &iov, &mut control, SendFlags::NOSIGNAL) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return r.map(drop).map_err(io::Error::from),
        }
    }
}

/// Receives one packet and at most one descriptor. Returns the length (0 at end of stream).
pub fn recv_with_fd(sock: impl AsFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    recv_with_fd_flags(sock, buf, RecvFlags::empty())
}

/// [`recv_with_fd`] that never blocks (`MSG_DONTWAIT`): `WouldBlock` when nothing is queued.
pub fn recv_with_fd_nonblocking(
    sock: impl AsFd,
    buf: &mut [u8],
) -> io::Result<(usize, Option<OwnedFd>)> {
    recv_with_fd_flags(sock, buf, RecvFlags::DONTWAIT)
}

/// Room for the control messages of one packet: 64 bytes, aligned for `cmsghdr` (a header and
/// 12 descriptors; a packet that carries more is refused as truncated).
#[repr(C, align(8))]
struct ControlSpace([MaybeUninit<u8>; 64]);

fn recv_with_fd_flags(
    sock: impl AsFd,
    buf: &mut [u8],
    flags: RecvFlags,
) -> io::Result<(usize, Option<OwnedFd>)> {
    let len = buf.len();
    let mut space = ControlSpace([MaybeUninit::uninit(); 64]);
    let mut control = RecvAncillaryBuffer::new(&mut space.0);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = rustix::net::recvmsg(
        sock,
        &mut iov,
        &mut control,
        RecvFlags::CMSG_CLOEXEC | flags,
    )?;
    // The first descriptor is kept; any other is closed as it is dropped (here, or with the
    // buffer for those not drained).
    let mut received = None;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            for fd in fds {
                if received.is_none() {
                    received = Some(fd);
                }
            }
        }
    }
    if msg.flags.contains(ReturnFlags::TRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("packet larger than the {len}-byte maximum"),
        ));
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control message truncated",
        ));
    }
    Ok((msg.bytes, received))
}

/// Credentials of the peer of a Unix socket (`SO_PEERCRED`). Hand-written: rustix reads the pid
/// into a non-zero `Pid`, and the kernel answers 0 for a peer whose pid namespace is not below
/// the daemon's (any process may connect to the agents' socket).
pub fn peer_cred(sock: impl AsFd) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are live and sized for SO_PEERCRED.
    let r = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

/// Sets a receive timeout on a socket (0: none, as the kernel takes a zero `timeval`).
pub fn set_recv_timeout(sock: impl AsFd, ms: u64) -> io::Result<()> {
    let timeout = (ms != 0).then(|| Duration::from_millis(ms));
    Ok(rustix::net::sockopt::set_socket_timeout(
        sock,
        rustix::net::sockopt::Timeout::Recv,
        timeout,
    )?)
}
