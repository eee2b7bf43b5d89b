//! Agents' connections: the accept loop (bounded handshakes), the greeting (who is this, is it
//! of our tree, is its uffd a uffd), and the connection's life after it.
use crate::fault::start_mm;
use crate::protocol::{
    HELLO_AGENT_RESTART, HELLO_API_BY_DAEMON, HELLO_FORK_CHILD, HELLO_NEED_UFFD, MAX_PACKET,
};
use crate::sys::PidFd;
use crate::sys::Uffd;
use requests::answer_request;
use requests::{
    leave_management, lock_request, release_to_program, shmem_remove_request, step_out,
};
use space::live_mm;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent_conn::AgentConn;
use crate::bind;
use crate::maps;
use crate::mm::Mm;
use crate::protocol::{self, Message};
use crate::shared::Shared;
use crate::stats::Stats;
use crate::sys::{self, PAGE_SIZE_U64};

use super::{hold, requests, space};

pub(crate) fn refuse(sock: &OwnedFd, why: &str) {
    let msg = protocol::encode(
        &Message::Error {
            code: libc::EPERM,
            message: why.to_string(),
        },
        0,
    );
    let fd = sock.as_fd();
    let _ = sys::send_with_fd(fd, &msg, None);
    // Close gracefully: a Unix socket closed with unread input resets the connection, and the
    // peer would lose the error message. Stop writing, consume what it sent, then close.
    let _ = sys::shutdown_write(fd);
    let _ = sys::set_recv_timeout(fd, 200);
    let mut buf = vec![0u8; MAX_PACKET];
    for _ in 0..16 {
        match sys::recv_with_fd(fd, &mut buf) {
            Ok((n, _)) if n > 0 => continue,
            _ => break,
        }
    }
}

/// Handshakes in progress at most (each on a thread of its own, for at most
/// [`GREETING_TIMEOUT_MS`]): a flood of connections that never greet waits in the listen
/// backlog instead of taking a thread each.
pub(crate) const MAX_HANDSHAKES: usize = 32;

/// How long a connection may take to greet.
pub(crate) const GREETING_TIMEOUT_MS: u64 = 2_000;

/// Accepts agents' connections for the daemon's whole life: an accept error (the descriptor
/// limit reached, memory short) is counted, said once, and retried after a growing pause, never
/// the end of accepting.
pub(crate) fn accept_loop(shared: &Arc<Shared>, lfd: OwnedFd) {
    let in_flight = Arc::new((parking_lot::Mutex::new(0usize), parking_lot::Condvar::new()));
    let mut backoff = Duration::from_millis(1);
    loop {
        {
            let (n, cv) = &*in_flight;
            let mut n = n.lock();
            while *n >= MAX_HANDSHAKES {
                cv.wait(&mut n);
            }
        }
        let sock = match sys::accept(&lfd) {
            Ok(sock) => sock,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                if shared.stats.accept_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        "accepting an agent's connection failed ({e}); retrying \
                     (processes of the tree wait to start until it works)"
                    );
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        backoff = Duration::from_millis(1);
        let shared = Arc::clone(shared);
        *in_flight.0.lock() += 1;
        let done = Arc::clone(&in_flight);
        let spawned = std::thread::Builder::new()
            .name("uffd-conn".into())
            .spawn(move || {
                handle_connection(shared, sock);
                *done.0.lock() -= 1;
                done.1.notify_one();
            });
        if spawned.is_err() {
            *in_flight.0.lock() -= 1;
        }
    }
}

/// Whether `fd` is a userfaultfd (an anonymous inode named `[userfaultfd]`): a greeting's
/// descriptor is checked before anything reads it or trusts what comes out of it.
pub(crate) fn is_userfaultfd(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|t| t.as_os_str() == "anon_inode:[userfaultfd]")
}

/// Reads a greeting from `sock` (and the descriptor it carries), refusing the connection with
/// a reason if it is not a valid HELLO of process `pid`.
pub(crate) fn read_hello(
    shared: &Shared,
    sock: &OwnedFd,
    pid: i32,
) -> Option<(protocol::Hello, Option<OwnedFd>)> {
    let stats = &shared.stats;
    let mut buf = vec![0u8; MAX_PACKET];
    let (n, fd) = match sys::recv_with_fd(sock, &mut buf) {
        Ok(x) => x,
        Err(e) => {
            match e.kind() {
                std::io::ErrorKind::InvalidData => {
                    Stats::add(&stats.protocol_errors, 1);
                    refuse(sock, &e.to_string());
                }
                // No greeting in time (SO_RCVTIMEO): dropped, with the reason, so that a
                // client merely slow (a loaded machine) is told why rather than reset.
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    Stats::add(&stats.greeting_timeouts, 1);
                    refuse(
                        sock,
                        &format!("no greeting within {GREETING_TIMEOUT_MS} ms of connecting"),
                    );
                }
                _ => {}
            }
            return None;
        }
    };
    let hello = match protocol::decode(&buf[..n]) {
        Ok((Message::Hello(h), _)) => h,
        // Requests from a program thread on a connection of its own, answered with a status.
        Ok((Message::Release { start, len }, _)) => {
            let r = release_to_program(shared, pid, start, len);
            answer_request(
                sock,
                pid,
                r,
                &format!("hand {start:#x}+{len:#x} over to its own userfaultfd"),
            );
            return None;
        }
        Ok((Message::Lock { start, len, flags }, _)) => {
            let r = lock_request(shared, pid, start, len, flags);
            answer_request(
                sock,
                pid,
                r,
                &format!("keep {start:#x}+{len:#x} from reclaim"),
            );
            return None;
        }
        Ok((Message::ShmemRemove { start, len, flags }, _)) => {
            let r = shmem_remove_request(shared, pid, start, len, flags);
            answer_request(sock, pid, r, &format!("remove {start:#x}+{len:#x}"));
            return None;
        }
        Ok((Message::Leave, _)) => {
            let r = leave_management(shared, pid);
            answer_request(sock, pid, r, "stop managing it");
            return None;
        }
        Ok((Message::StepOut, _)) => {
            let r = step_out(shared, pid);
            answer_request(sock, pid, r, "let its agent's threads step out");
            return None;
        }
        Ok((
            Message::Hold {
                pid: target,
                reason,
            },
            _,
        )) => {
            let r = hold::request(shared, pid, target, reason);
            answer_request(sock, pid, r, "bring its evicted pages back for inspection");
            return None;
        }
        Ok((other, _)) => {
            Stats::add(&stats.protocol_errors, 1);
            refuse(sock, &format!("expected HELLO, got {other:?}"));
            return None;
        }
        Err(e) => {
            Stats::add(&stats.protocol_errors, 1);
            tracing::warn!("bad greeting from pid {pid}: {e}");
            refuse(sock, &e.to_string());
            return None;
        }
    };
    // The agent names its process as it sees it (`getpid()`: its own pid namespace's number);
    // the peer's credentials name it in the daemon's (the kernel translates them for the
    // reader: `net/core/sock.c`, `cred_to_ucred`, `pid_vnr`). The same process has both as the
    // first and last of its `NStgid` numbers: one number in the daemon's namespace, several
    // below it (`unshare -pf`: 1 there).
    let own = maps::ns_tgids(pid);
    if own.last() != Some(&(hello.pid as i32)) {
        Stats::add(&stats.protocol_errors, 1);
        refuse(
            sock,
            &format!(
                "HELLO names pid {} but the peer is pid {pid} (its numbers from the daemon's pid \
                 namespace down: {own:?})",
                hello.pid
            ),
        );
        return None;
    }
    Some((hello, fd))
}

/// Serves one new agent connection: checks who it is, reads its greeting, sets it up.
pub(crate) fn handle_connection(shared: Arc<Shared>, sock: OwnedFd) {
    let Some(pid) = peer_of_tree(&shared, &sock) else {
        return;
    };
    let _ = sys::set_recv_timeout(&sock, GREETING_TIMEOUT_MS);
    let Some((hello, fd)) = greeting(&shared, &sock, pid) else {
        return;
    };
    let max_drop = (hello.scratch_pages as usize).min(protocol::MAX_DROP_PAGES);
    if hello.flags & HELLO_AGENT_RESTART != 0 {
        agent_back(&shared, sock, pid, max_drop);
    } else if hello.flags & HELLO_FORK_CHILD != 0 {
        fork_child_greets(&shared, sock, pid, max_drop);
    } else {
        new_address_space(&shared, sock, pid, hello, fd, max_drop);
    }
}

/// The pid of the connection's peer, if it is a process of the daemon's tree (of any uid: a
/// process of the tree may have dropped its privileges, as a server's workers do); otherwise
/// the connection is refused with the reason.
fn peer_of_tree(shared: &Shared, sock: &OwnedFd) -> Option<i32> {
    let stats = &shared.stats;
    let cred = sys::peer_cred(sock).ok()?;
    if maps::in_tree(cred.pid, maps::me()) {
        return Some(cred.pid);
    }
    // Out of descriptors, the daemon cannot read /proc to tell who it is: say that.
    if let Err(e) = std::fs::File::open("/proc/self/stat") {
        if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
            Stats::add(&stats.accept_errors, 1);
            refuse(sock, "the daemon is out of descriptors (RLIMIT_NOFILE)");
            return None;
        }
    }
    Stats::add(&stats.protocol_errors, 1);
    tracing::warn!(
        "refusing a connection from pid {} uid {}: not a process this daemon started",
        cred.pid,
        cred.uid
    );
    refuse(sock, "this daemon serves only the processes it started");
    None
}

/// Reads the greeting. A process that cannot make its uffd (a user without access to
/// /dev/userfaultfd) is lent the device, and its second greeting, with the uffd made from
/// it, is the one returned.
fn greeting(
    shared: &Shared,
    sock: &OwnedFd,
    pid: i32,
) -> Option<(protocol::Hello, Option<OwnedFd>)> {
    let (hello, fd) = read_hello(shared, sock, pid)?;
    if hello.flags & HELLO_NEED_UFFD == 0 {
        return Some((hello, fd));
    }
    let dev = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
    {
        Ok(d) => d,
        Err(e) => {
            refuse(
                sock,
                &format!("the daemon cannot open /dev/userfaultfd: {e}"),
            );
            return None;
        }
    };
    let ack = protocol::encode(
        &Message::HelloAck {
            status: 0,
            max_drop_pages: 0,
        },
        0,
    );
    sys::send_with_fd(sock, &ack, Some(dev.as_fd())).ok()?;
    drop(dev);
    let again = read_hello(shared, sock, pid)?;
    if again.0.flags & (HELLO_NEED_UFFD | HELLO_FORK_CHILD | HELLO_AGENT_RESTART) != 0 {
        Stats::add(&shared.stats.protocol_errors, 1);
        refuse(
            sock,
            "a second HELLO must carry the uffd made with the device",
        );
        return None;
    }
    Some(again)
}

/// Makes the connection `mm`'s agent, answering the greeting (with the uffd the daemon keeps
/// for it if `give_uffd`: a fork child's, or the agent's after a step out). One agent per
/// address space: a second greeting would take the first one's place (and with it a DROP it
/// may have outstanding), so it is refused; so is an agent coming back to an address space the
/// daemon manages without one (`only_agent`).
///
/// The answer is sent with the slot held and the connection is in it before the slot is let
/// go: the program runs on once its agent is answered, and a request of its own that finds
/// no agent (a STEP_OUT before `unshare`) would miss the connection it must close, leaving the
/// agent thread waiting on it while the program waited for that thread to end.
fn attach_agent(
    shared: &Shared,
    mm: &Mm,
    sock: OwnedFd,
    max_drop: usize,
    only_agent: bool,
    give_uffd: bool,
) -> bool {
    let mut slot = mm.agent.lock();
    if slot.is_some() || (only_agent && mm.agentless.load(Ordering::Acquire)) {
        drop(slot);
        Stats::add(&shared.stats.protocol_errors, 1);
        refuse(&sock, "this process already has an agent connection");
        return false;
    }
    let Ok(mut conn) = AgentConn::new(sock, max_drop) else {
        return false;
    };
    let ack = Message::HelloAck {
        status: 0,
        max_drop_pages: max_drop as u32,
    };
    let uffd = give_uffd.then(|| mm.uffd.as_fd());
    if conn.send(&ack, &shared.greeting_fds(uffd)).is_err() {
        return false;
    }
    *slot = Some(conn);
    true
}

/// The agent's threads of a managed process, back after they stepped out (also an agent
/// whose earlier connection was lost: only its watchdog had to step out): like a fork child,
/// it gets back the uffd the daemon kept (the new agent thread named itself through its
/// scratch fault before greeting).
fn agent_back(shared: &Shared, sock: OwnedFd, pid: i32, max_drop: usize) {
    let Some(mm) = live_mm(shared, pid) else {
        refuse(&sock, "no managed address space is known for this pid");
        return;
    };
    if !attach_agent(shared, &mm, sock, max_drop, true, true) {
        return;
    }
    mm.stepped_out.store(false, Ordering::Release);
    Stats::add(&shared.stats.agent_restarts, 1);
    // The call may have changed what the process maps; pick up anything new.
    let _ = hold::scan_and_register(shared, &mm);
}

/// A forked child's agent. The child was bound to its process in its probe fault before it
/// connected (or, if it was not found then, it is bound now by the token in its probe page:
/// `bind.rs`); its address space is found by that.
fn fork_child_greets(shared: &Shared, sock: OwnedFd, pid: i32, max_drop: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mm = loop {
        let found = shared
            .mms
            .lock()
            .iter()
            .find(|m| m.pid() == Some(pid) && !m.retired.load(Ordering::Acquire))
            .cloned();
        if let Some(m) = found {
            break m;
        }
        // (Each time: the probe fault that writes the token may not have been read yet.)
        if bind::bind_at_greeting(shared, pid) {
            continue;
        }
        if Instant::now() > deadline {
            refuse(&sock, "no forked address space is known for this pid");
            return;
        }
        let mut g = shared.bind_lock.lock();
        shared.bind_cv.wait_for(&mut g, Duration::from_millis(20));
    };
    if !attach_agent(shared, &mm, sock, max_drop, false, true) {
        return;
    }
    // Traced from its birth (a tracer that follows forks): held (`hold.rs`).
    hold::at_greeting(shared, &mm, pid);
    // Registrations were inherited; pick up anything new.
    let _ = hold::scan_and_register(shared, &mm);
}

/// A process that started (or exec'd) with the agent: it brings its uffd, and gets a new
/// address space (an exec's replaces the old one of the same pid).
fn new_address_space(
    shared: &Arc<Shared>,
    sock: OwnedFd,
    pid: i32,
    mut hello: protocol::Hello,
    fd: Option<OwnedFd>,
    max_drop: usize,
) {
    let Some(fd) = fd else {
        refuse(&sock, "HELLO without a userfaultfd attached");
        return;
    };
    if !is_userfaultfd(&fd) {
        Stats::add(&shared.stats.protocol_errors, 1);
        tracing::warn!("pid {pid} greeted with a descriptor that is not a userfaultfd; refused");
        refuse(&sock, "the HELLO's descriptor is not a userfaultfd");
        return;
    }
    let fd = if hello.flags & HELLO_API_BY_DAEMON != 0 {
        // Its process lacks the privilege EVENT_FORK needs; the daemon has it. The agent's
        // probe and scratch are registered here too (missing faults only, as the agent does).
        let uffd = Uffd::from_owned(fd);
        let api = uffd.api(sys::REQUIRED_FEATURES).and_then(|f| {
            uffd.register(
                hello.probe,
                PAGE_SIZE_U64 * (1 + hello.scratch_pages as u64),
                false,
            )
            .map(|()| f)
        });
        match api {
            Ok(f) => hello.features = f,
            Err(e) => {
                refuse(
                    &sock,
                    &format!("UFFDIO_API or registering the agent's scratch: {e}"),
                );
                return;
            }
        }
        uffd.into_owned()
    } else {
        fd
    };
    if hello.features & sys::REQUIRED_FEATURES != sys::REQUIRED_FEATURES {
        refuse(
            &sock,
            &format!(
                "uffd features {:#x} lack required {:#x}",
                hello.features,
                sys::REQUIRED_FEATURES
            ),
        );
        return;
    }
    // An exec replaces the address space: the old one (same pid) is gone.
    space::retire_pid(shared, pid);
    let region = (hello.region_start, hello.region_start + hello.region_len);
    let Ok(mm) = Mm::new(
        shared.new_id(),
        Uffd::from_owned(fd),
        pid,
        region,
        hello.probe,
        hello.scratch,
        &shared.policy,
    ) else {
        return;
    };
    let mm = Arc::new(mm);
    // The peer itself (whatever became of its number since it connected); then its number,
    // checked to be the peer's still.
    if let Ok(p) = PidFd::of_peer(&sock).or_else(|_| PidFd::open(pid)) {
        *mm.pidfd.lock() = Some(p);
    }
    bind::note_pid_namespace(&mm, pid);
    if start_mm(shared, &mm).is_err() {
        return;
    }
    // Traced from its start (`gdb PROGRAM`, `strace PROGRAM`: PTRACE_TRACEME before the exec):
    // held, its memory the kernel's while traced (`hold.rs`).
    hold::at_greeting(shared, &mm, pid);
    let _ = hold::scan_and_register(shared, &mm);
    // (The process brought its uffd: the answer gives none.)
    if attach_agent(shared, &mm, sock, max_drop, false, false) {
        tracing::debug!("managing pid {pid} (mm {})", mm.id);
    }
}
