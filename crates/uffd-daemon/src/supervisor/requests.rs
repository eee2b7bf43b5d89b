//! The requests an agent makes of the daemon on its connection, besides DROP answers: memory
//! released to the program, leaving management, stepping out around a call that needs the
//! process alone, and locking memory.
use space::{agent_without_drop, live_mm, restore_and_step_aside};

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::protocol::{self, Message};
use crate::shared::Shared;
use crate::stats::Stats;
use crate::sys::{self};

use super::space::{self, Unregister};

/// A program registers memory the daemon manages with a userfaultfd of its own (its
/// `UFFDIO_REGISTER` failed with `EBUSY`; the agent's `ioctl` wrapper asks): the daemon steps
/// aside. It waits for an eviction of that address space in flight to end and keeps new ones
/// out (the agent lock), brings back every page of the range that it evicted (the program's
/// handler would otherwise see a missing fault where the page has data), unregisters the
/// range, forgets its pages and never registers it again (`own_uffd_bytes`).
pub(crate) fn release_to_program(
    shared: &Shared,
    pid: i32,
    start: u64,
    len: u64,
) -> std::io::Result<()> {
    let Some(mm) = live_mm(shared, pid) else {
        return Ok(()); // not managed: nothing of ours is registered there
    };
    let _agent = agent_without_drop(&mm)?;
    // Shared anonymous memory in the range: its evicted pages written back into the inode,
    // the range no mapper any more (before the unregistration below ends the daemon's faults).
    let shared_restored = shared
        .shmem
        .step_aside(shared, &mm, start, start.saturating_add(len))?;
    Stats::add(&shared.stats.own_uffd_pages_restored, shared_restored);
    let (managed, restored) =
        restore_and_step_aside(shared, &mm, start, start + len, Unregister::Whole)?;
    shared
        .shmem
        .unmap(shared, &mm, start, start.saturating_add(len));
    Stats::add(&shared.stats.own_uffd_bytes, managed);
    Stats::add(&shared.stats.own_uffd_pages_restored, restored);
    Ok(())
}

/// The process is about to put all its threads under a seccomp filter
/// (`SECCOMP_FILTER_FLAG_TSYNC`), the agent's threads too, and any call of theirs could then
/// be one the filter kills the process for: the daemon stops managing it, as it would a
/// process that never had an agent. The agent's connection is closed with no DROP in flight
/// (the agent's threads end on that), every evicted page is brought back, everything the daemon
/// registered is unregistered, and nothing of the process is registered again. The census
/// counts it from then on (`unmanaged_no_agent_bytes`).
pub(crate) fn leave_management(shared: &Shared, pid: i32) -> std::io::Result<()> {
    let Some(mm) = live_mm(shared, pid) else {
        return Ok(());
    };
    let conn = agent_without_drop(&mm)?.take();
    drop(conn);
    let (managed, restored) =
        restore_and_step_aside(shared, &mm, 0, crate::wire::USER_END, Unregister::Parts)?;
    Stats::add(&shared.stats.own_uffd_pages_restored, restored);
    // The same request comes from an agent whose threads stepped out and could not start or
    // greet again (`step_out`): the process goes on without them.
    if mm.stepped_out.swap(false, Ordering::AcqRel) {
        Stats::add(&shared.stats.agent_restart_left_processes, 1);
        tracing::warn!(
            "pid {pid}: the agent's threads could not start again after a call that \
             needs the process alone (a new user namespace): its {} MiB are brought back and the \
             process is no longer managed (counted in unmanaged_no_agent_bytes)",
            managed >> 20
        );
        return Ok(());
    }
    Stats::add(&shared.stats.tsync_left_processes, 1);
    Stats::add(&shared.stats.tsync_left_bytes, managed);
    tracing::warn!(
        "pid {pid} puts every thread under a seccomp filter (TSYNC), the agent's \
         too: its {} MiB are brought back and the process is no longer managed (counted in \
         unmanaged_no_agent_bytes)",
        managed >> 20
    );
    Ok(())
}

/// The program makes a call the kernel allows only to a process of one thread
/// (`unshare(CLONE_NEWUSER)`, `setns` into a user, mount or time namespace: the agent's
/// `unshare` and `setns` wrappers ask), so the agent's threads end for the moment of it and
/// then start again. The daemon waits for a DROP in flight to settle and closes the agent's
/// connection (the agent thread ends on that) with none outstanding. Everything else is kept:
/// the uffd (the daemon's own reference keeps the registrations alive after the agent's copy
/// closes), the page states, the stored pages; faults are served meanwhile, and nothing of the
/// process is evicted until its agent greets again (`HELLO_AGENT_RESTART`).
pub(crate) fn step_out(shared: &Shared, pid: i32) -> std::io::Result<()> {
    let Some(mm) = live_mm(shared, pid) else {
        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
    };
    if mm.agentless.load(Ordering::Acquire) {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut slot = agent_without_drop(&mm)?;
    let conn = slot.take();
    mm.stepped_out.store(true, Ordering::Release);
    // The agent thread ends through glibc's thread exit, which touches the program's memory
    // (its thread count, its allocator's caches): faults of the program's, not of an agent
    // thread that a DROP could wait for, since none can be sent any more. The new agent thread
    // names itself again.
    mm.agent_tid.store(0, Ordering::Relaxed);
    drop(slot);
    drop(conn);
    Stats::add(&shared.stats.agent_step_outs, 1);
    Ok(())
}

/// A program thread is about to lock `[start, start + len)` (`mlock`, `mlock2`, `mlockall`):
/// from the answer on, reclaim chooses no page of it, and none is in the middle of an eviction
/// (the agent slot is held while the request is noted, and no DROP is outstanding), so no page
/// of it reaches a tier after the lock. Or, without `LOCK_ON`, a lock asked for did not happen
/// the request is withdrawn.
pub(crate) fn lock_request(
    shared: &Shared,
    pid: i32,
    start: u64,
    len: u64,
    flags: u32,
) -> std::io::Result<()> {
    let Some(mm) = live_mm(shared, pid) else {
        return Ok(());
    };
    let end = start.saturating_add(len);
    let _agent = agent_without_drop(&mm)?;
    let mut st = mm.state.lock();
    if flags & protocol::LOCK_ON == 0 {
        st.lock_requests.retain(|&(s, e, _)| (s, e) != (start, end));
        return Ok(());
    }
    // Bounded: a program locking many small ranges keeps the newest requests.
    if st.lock_requests.len() >= 1024 {
        st.lock_requests.remove(0);
    }
    st.lock_requests.push((start, end, Instant::now()));
    Ok(())
}

/// A program thread's `madvise(MADV_REMOVE)` of `[start, start + len)`: announced before the
/// call (REMOVE events of shared anonymous memory there are that call's until it returns:
/// `shmem.rs`, `fault/events.rs`), ended after it once the handler has applied what it read
/// (the call returns as soon as its REMOVE events are read, not applied).
pub(crate) fn shmem_remove_request(
    shared: &Shared,
    pid: i32,
    start: u64,
    len: u64,
    flags: u32,
) -> std::io::Result<()> {
    let Some(mm) = live_mm(shared, pid) else {
        return Ok(());
    };
    let end = start.saturating_add(len);
    if flags & crate::wire::SHMEM_REMOVE_DONE == 0 {
        let mut r = mm.shmem_removes.lock();
        // Bounded: the oldest announcement of a call that never said it returned goes first.
        if r.len() >= 64 {
            r.remove(0);
        }
        r.push((start, end));
        return Ok(());
    }
    crate::shmem::wait_handler_settled(&mm);
    let mut r = mm.shmem_removes.lock();
    if let Some(i) = r.iter().position(|&x| x == (start, end)) {
        r.remove(i);
    }
    Ok(())
}

/// Answers a program thread's request (RELEASE, LOCK, LEAVE) with `HelloAck`: status 0, or
/// the errno of what failed, which is also said.
pub(crate) fn answer_request(sock: &OwnedFd, pid: i32, r: std::io::Result<()>, what: &str) {
    let status = match r {
        Ok(()) => 0,
        Err(e) => {
            tracing::warn!("pid {pid}: cannot {what}: {e}");
            e.raw_os_error().unwrap_or(libc::EIO)
        }
    };
    let ack = protocol::encode(
        &Message::HelloAck {
            status,
            max_drop_pages: 0,
        },
        0,
    );
    let _ = sys::send_with_fd(sock, &ack, None);
}
