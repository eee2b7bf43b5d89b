//! The daemon: starts the program with the agent, accepts agents, and runs the monitor that
//! registers new memory, retires dead address spaces and drives reclaim.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use parking_lot::{Condvar, Mutex};

use crate::agent_conn::AgentConn;
use crate::bind;
use crate::config::{AccessMode, PolicyConfig};
use crate::fault;
use crate::maps;
use crate::mm::{Mm, MmState, Page, ZERO_SLOT};
use crate::protocol::{
    self, Message, HELLO_AGENT_RESTART, HELLO_API_BY_DAEMON, HELLO_FORK_CHILD, HELLO_NEED_UFFD,
    MAX_PACKET,
};
use crate::reclaim;
use crate::stats::{Histogram, Samples, Stats};
use crate::sys::{self, Fill, PidFd, Uffd, PAGE_SIZE, PAGE_SIZE_U64};
use crate::tiers::{TierConfig, Tiers};
use crate::unmanaged::Census;

/// The agent shared object, built from `agent/agent.c` by build.rs.
pub static AGENT_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libuffd_agent.so"));

pub use crate::wire::EXIT_DAEMON_LOST;

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Resident limit for the managed memory of the whole process tree, in bytes (under
    /// `auto_limit`, where the limit starts).
    pub limit_bytes: u64,
    /// `--limit auto`: the controller that sets the limit from the tree's stall.
    pub auto_limit: Option<crate::limit::AutoConfig>,
    /// The tiers below resident memory.
    pub tiers: TierConfig,
    /// The replacement policy and its access source.
    pub policy: PolicyConfig,
    /// Where to write the final counters as JSON.
    pub stats_json: Option<PathBuf>,
    /// Log decisions to stderr.
    pub verbose: bool,
}

/// State shared by the handler threads, the connection threads and the monitor.
#[derive(Debug)]
pub struct Shared {
    /// Counters.
    pub stats: Stats,
    /// Service time of faults restored from zswap.
    pub lat_zswap: Histogram,
    /// Service time of faults restored from the backing device.
    pub lat_backend: Histogram,
    /// Service time of zero-fill faults.
    pub lat_zero: Histogram,
    /// Where evicted pages go.
    pub tiers: Tiers,
    /// The policy settings (each address space has its own policy).
    pub policy: PolicyConfig,
    /// The resident limit and reclaim's watermarks (set by the controller under `auto`).
    pub limit: crate::limit::Limit,
    /// The time the tree's threads spend waiting on faults.
    pub stall: crate::limit::StallMeter,
    /// The limit's controller, under `--limit auto`.
    pub auto_limit: Option<crate::limit::AutoLimit>,
    resident: AtomicUsize,
    /// Every live address space.
    pub mms: Mutex<Vec<Arc<Mm>>>,
    next_id: AtomicU64,
    kick: Mutex<bool>,
    kick_cv: Condvar,
    /// Held while a forked child is looked for and bound (`bind.rs`): one at a time, so that
    /// no two address spaces are bound to one process.
    pub(crate) bind_lock: Mutex<()>,
    /// Notified when a forked child is bound (its greeting may be waiting for that).
    pub(crate) bind_cv: Condvar,
    stalled: AtomicBool,
    /// After stores failed for a whole batch (swap space full, a failing device): how many
    /// batches in a row, and when reclaim may try again (a pause that doubles up to a second,
    /// instead of a CPU's worth of failed writes).
    pub store_backoff: Mutex<(u32, Option<Instant>)>,
    /// The idle keepers (`[fault] idle_poll_us`), if any.
    pub idle_poll: Option<crate::idlepoll::IdlePoll>,
    /// Log decisions.
    pub verbose: bool,
    /// An injected DROP is stopping a program now.
    pub injecting: AtomicBool,
    /// The thread it stops: its faults are not held at the limit (it stops only once served).
    /// Its number in its own pid namespace, as the faults name it (`inject.rs`).
    pub injecting_tid: AtomicI32,
    /// The process it stops (the daemon's number).
    pub injecting_pid: AtomicI32,
    /// The daemon's lifeline (`sys::Lifeline`): its read end handed to each agent with the
    /// answer to its greeting, so that the agent sees the daemon's end without looking the
    /// daemon up by a number, which means nothing in a pid namespace below the daemon's.
    /// (`run` makes it, and does not start without it.)
    pub lifeline: Option<sys::Lifeline>,
    /// Durations of the stops of injections, beyond the calls made in them (`inject.rs`).
    pub inject_stop_times: Samples,
    /// Durations of whole stops, from the seize to the detach (the program's thread stands
    /// still meanwhile).
    pub inject_hold_times: Samples,
    /// Durations of DROP batches carried out by agents, from the request to the answer.
    pub drop_agent_times: Samples,
    /// Durations of DROP batches carried out by injection, from the seize to the settlement.
    pub drop_inject_times: Samples,
    /// Why processes could not be managed without an agent (the image, the reason): the
    /// census does not say them again, and an image is not tried twice.
    pub agentless_refusals: Mutex<std::collections::HashMap<i32, (PathBuf, String)>>,
    /// Processes that exec'd an image without the agent (seen by the scanner), for the
    /// monitor, the only thread that makes ptrace calls, to manage without one.
    pub adopt_queue: Mutex<Vec<i32>>,
    /// Exit statuses the monitor's ptrace waits reaped (a tracee that exited mid-stop).
    pub reaped: Mutex<Vec<(i32, i32)>>,
}

impl Shared {
    /// Shared state for a limit of `limit_pages`, or one the controller `auto` sets.
    pub fn new(
        tiers: Tiers,
        policy: PolicyConfig,
        limit_pages: usize,
        auto: Option<crate::limit::AutoConfig>,
        verbose: bool,
    ) -> Self {
        let auto_limit = auto.map(crate::limit::AutoLimit::new);
        let limit_pages = auto_limit
            .as_ref()
            .map_or(limit_pages, |a| a.initial_pages());
        Shared {
            stats: Stats::default(),
            lat_zswap: Histogram::default(),
            lat_backend: Histogram::default(),
            lat_zero: Histogram::default(),
            tiers,
            policy,
            limit: crate::limit::Limit::new(limit_pages),
            stall: crate::limit::StallMeter::default(),
            auto_limit,
            resident: AtomicUsize::new(0),
            mms: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            kick: Mutex::new(false),
            kick_cv: Condvar::new(),
            bind_lock: Mutex::new(()),
            bind_cv: Condvar::new(),
            stalled: AtomicBool::new(false),
            store_backoff: Mutex::new((0, None)),
            idle_poll: crate::idlepoll::IdlePoll::start(
                policy.fault_idle_poll,
                policy.fault_idle_poll_mode,
            ),
            verbose,
            injecting: AtomicBool::new(false),
            injecting_tid: AtomicI32::new(0),
            injecting_pid: AtomicI32::new(0),
            lifeline: None,
            inject_stop_times: Samples::default(),
            inject_hold_times: Samples::default(),
            drop_agent_times: Samples::default(),
            drop_inject_times: Samples::default(),
            agentless_refusals: Mutex::new(std::collections::HashMap::new()),
            adopt_queue: Mutex::new(Vec::new()),
            reaped: Mutex::new(Vec::new()),
        }
    }

    /// Resident managed pages now.
    pub fn resident(&self) -> usize {
        self.resident.load(Ordering::Relaxed)
    }

    /// Adds resident pages.
    pub fn resident_add(&self, n: usize) {
        let now = self.resident.fetch_add(n, Ordering::Relaxed) + n;
        self.stats.set_resident(now as u64);
    }

    /// Removes resident pages.
    pub fn resident_sub(&self, n: usize) {
        let now = self.resident.fetch_sub(n, Ordering::Relaxed) - n;
        self.stats.set_resident(now as u64);
    }

    /// Drops a reference to a store slot.
    pub fn put_slot(&self, slot: u32) {
        if let Err(e) = self.tiers.put(slot) {
            eprintln!("uffd-daemon: BUG: {e}");
            debug_assert!(false, "{e}");
        }
    }

    /// Adds a reference to a store slot.
    pub fn dup_slot(&self, slot: u32) {
        if let Err(e) = self.tiers.dup(slot) {
            eprintln!("uffd-daemon: BUG: {e}");
            debug_assert!(false, "{e}");
        }
    }

    /// Wakes the monitor when resident memory passed the high watermark.
    pub fn maybe_kick_reclaim(&self) {
        if self.resident() > self.limit.high() {
            let mut k = self.kick.lock();
            if !*k {
                *k = true;
                self.kick_cv.notify_one();
            }
        }
    }

    /// Whether the last reclaim pass above the limit freed nothing.
    pub fn reclaim_stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// Wakes the monitor to reclaim now.
    pub fn kick_reclaim(&self) {
        let mut k = self.kick.lock();
        if !*k {
            *k = true;
            self.kick_cv.notify_one();
        }
    }

    /// Whether the access source arms write protection on resident pages.
    pub fn wp_access(&self) -> bool {
        self.policy.access == AccessMode::FaultsWp
    }

    /// The counters as JSON: the daemon's, the tiers', and the metadata estimate.
    pub fn stats_json(&self) -> serde_json::Value {
        if let Some(p) = &self.idle_poll {
            p.report(&self.stats);
        }
        let mut v = self.stats.to_json();
        self.tiers.to_json(&mut v);
        // How idle CPUs were kept polling during fault storms ("kernel", "keepers", "off").
        v["idle_poll"] = self
            .idle_poll
            .as_ref()
            .map_or("off", |p| p.mode().name())
            .into();
        v["limit_pages"] = (self.limit.pages() as u64).into();
        // The tree's memory stall (limit.rs): wall time with a fault outstanding, and the sum
        // of all the waits, in seconds.
        v["memory_stall_some_s"] = (self.stall.some_ns() as f64 / 1e9).into();
        v["memory_stall_total_s"] = (self.stall.total_ns() as f64 / 1e9).into();
        if let Some(a) = &self.auto_limit {
            a.to_json(&mut v);
        }
        self.inject_stop_times.report("inject_stop", &mut v);
        self.inject_hold_times.report("inject_hold", &mut v);
        self.drop_agent_times.report("drop_agent", &mut v);
        self.drop_inject_times.report("drop_inject", &mut v);
        for (name, h) in [
            ("zswap", &self.lat_zswap),
            ("backend", &self.lat_backend),
            ("zero", &self.lat_zero),
        ] {
            if let (Some(p50), Some(p99)) = (h.quantile_us(0.5), h.quantile_us(0.99)) {
                v[format!("fault_{name}_p50_us")] = p50.into();
                v[format!("fault_{name}_p99_us")] = p99.into();
            }
        }
        v
    }

    pub(crate) fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The descriptors the answer to a completed greeting carries: the one it hands the
    /// process, if any (its uffd), then the daemon's lifeline, which the agent's threads poll
    /// (`agent.c`, watchdog_thread).
    pub(crate) fn greeting_fds(&self, fd: Option<RawFd>) -> Vec<RawFd> {
        fd.into_iter()
            .chain(self.lifeline.as_ref().map(sys::Lifeline::raw))
            .collect()
    }
}

/// Starts the handler thread of `mm` and adds it to the live list.
pub fn start_mm(shared: &Arc<Shared>, mm: &Arc<Mm>) -> std::io::Result<()> {
    let (s, m) = (Arc::clone(shared), Arc::clone(mm));
    let h = std::thread::Builder::new()
        .name(format!("uffd-fault-{}", mm.id))
        .spawn(move || fault::handler_thread(s, m))?;
    *mm.handler.lock() = Some(h);
    shared.mms.lock().push(Arc::clone(mm));
    Stats::add(&shared.stats.processes, 1);
    Stats::add(&shared.stats.processes_live, 1);
    Ok(())
}

/// Called by the handler of a fork event: the child shares every stored page.
pub fn adopt_forked_child(shared: &Arc<Shared>, parent: &Arc<Mm>, uffd: Uffd) {
    if let Err(e) = uffd.set_nonblocking() {
        eprintln!("uffd-daemon: child uffd: {e}");
    }
    let state: MmState = {
        let mut st = parent.state.lock();
        // Pages the parent unshared before are shared again now: a refusal is not a pin.
        st.unshared.clear();
        st.fork_copy(shared)
    };
    let mm = match Mm::new(
        shared.new_id(),
        uffd,
        0,
        parent.region,
        parent.probe,
        parent.scratch,
        &shared.policy,
    ) {
        Ok(m) => Arc::new(m),
        Err(e) => {
            eprintln!("uffd-daemon: cannot track a forked child: {e}");
            return;
        }
    };
    *mm.state.lock() = state;
    // The child has a copy of whatever the parent's last DROP left in the scratch.
    *mm.scratch_filled.lock() = Some(Instant::now());
    mm.forked_from
        .store(parent.pid().unwrap_or(0), Ordering::Release);
    if parent.agentless.load(Ordering::Acquire) {
        // No agent in the child to name it: the daemon binds it by a token (agentless.rs).
        crate::agentless::forked(&mm);
    }
    if shared.verbose {
        eprintln!(
            "uffd-daemon: fork of pid {:?}: child mm {}",
            parent.pid(),
            mm.id
        );
    }
    if let Err(e) = start_mm(shared, &mm) {
        eprintln!("uffd-daemon: cannot start the handler of a forked child: {e}");
    }
}

/// Releases everything an address space held: its handler, its stored pages, its counts.
pub fn retire(shared: &Shared, mm: &Arc<Mm>) {
    if mm.retired.swap(true, Ordering::AcqRel) {
        return;
    }
    mm.stop.signal();
    let handler = mm.handler.lock().take();
    if let Some(h) = handler {
        let _ = h.join();
    }
    *mm.agent.lock() = None;
    {
        let mut st = mm.state.lock();
        #[cfg(debug_assertions)]
        st.check_integrity();
        let pages = std::mem::take(&mut st.pages);
        for (a, p) in pages.iter() {
            st.release(shared, a, p);
        }
    }
    shared.mms.lock().retain(|m| !Arc::ptr_eq(m, mm));
    shared.stats.processes_live.fetch_sub(1, Ordering::Relaxed);
    if shared.verbose {
        eprintln!("uffd-daemon: retired mm {} (pid {:?})", mm.id, mm.pid());
    }
}

/// Locked memory (mlock, mlockall) is the program's promise that its pages stay in RAM and
/// never reach swap: the daemon leaves it alone. A locked mapping not registered yet is never
/// registered; a registered one is unregistered and its pages forgotten once all of them are
/// resident (mlock faults them in; with `MLOCK_ONFAULT` an evicted page keeps its registration
/// until it comes back). The census counts it (`unmanaged_locked_bytes`) and says it. Checked when the process has locked memory at all
/// (`VmLck`, read from its status; the mappings' flags cost a read of smaps).
fn leave_locked_memory(shared: &Shared, mm: &Mm, pid: i32) {
    // A lock asked for more than a second before this scan has been seen by now (the agent
    // locks right after the answer), or it failed: its request has done its work.
    let seen = Instant::now().checked_sub(Duration::from_secs(1));
    mm.state
        .lock()
        .lock_requests
        .retain(|&(_, _, t)| seen.is_none_or(|seen| t > seen));
    if maps::locked_bytes(pid) == 0 {
        return;
    }
    let Ok(vmas) = maps::read_vm_flags(pid) else {
        return;
    };
    let mut st = mm.state.lock();
    for &(s, e, _) in vmas.iter().filter(|v| v.2.locked) {
        if mm.in_agent_region(s) || st.refused.contains(&(s, e)) {
            continue;
        }
        // (Registered by the scan or by the agent's mmap wrapper, whose ranges the table may
        // hold pages of before the scan adds them.)
        if !st.locked.contains(&(s, e)) {
            st.locked.push((s, e));
        }
        let all_resident = st
            .pages
            .range(s..e)
            .all(|(_, p)| matches!(p, Page::Resident { .. }));
        if !all_resident || mm.uffd.unregister(s, e - s).is_err() {
            continue;
        }
        st.forget_range(shared, s, e);
        st.remove_range(s, e);
        st.locked.retain(|&r| r != (s, e));
        st.refuse(s, e);
    }
}

/// Registers the managed memory of `mm` that is not registered yet, and records the pages
/// already present in it.
pub fn scan_and_register(shared: &Shared, mm: &Mm) -> bool {
    let Some(pid) = mm.pid() else { return true };
    let Ok(vmas) = maps::read_maps(pid) else {
        return true;
    };
    // The agent's probe page is gone: the process exec'd an image without the agent (a static
    // or set-ID program, or one whose environment dropped LD_PRELOAD). This address space is
    // no more; the census counts the new one as unmanaged.
    if !vmas.is_empty() && !vmas.iter().any(|v| v.start <= mm.probe && mm.probe < v.end) {
        return false;
    }
    Stats::add(&shared.stats.maps_scans, 1);
    leave_locked_memory(shared, mm, pid);
    for v in vmas.iter().filter(|v| v.is_managed()) {
        // Never the agent's own region.
        let parts: Vec<(u64, u64)> = [
            (v.start, v.end.min(mm.region.0)),
            (v.start.max(mm.region.1), v.end),
        ]
        .into_iter()
        .filter(|(s, e)| s < e)
        .collect();
        for (s, e) in parts {
            let gaps = mm.state.lock().uncovered(s, e);
            for (gs, ge) in gaps {
                match mm.uffd.register(gs, ge - gs, true) {
                    Ok(()) => {
                        Stats::add(&shared.stats.ranges_registered, 1);
                        let present = maps::present_pages(pid, gs, ge).unwrap_or_default();
                        let mut st = mm.state.lock();
                        st.add_range(gs, ge);
                        for a in present {
                            if !st.pages.contains(a) {
                                st.make_resident(shared, a, mglru::Arrival::Cold, false);
                            }
                        }
                    }
                    Err(e) => {
                        if shared.verbose {
                            eprintln!(
                                "uffd-daemon: pid {pid}: cannot register {gs:#x}-{ge:#x}: {e}"
                            );
                        }
                        mm.state.lock().refused.push((gs, ge));
                    }
                }
            }
        }
    }
    // A held process (`hold.rs`): what this scan registered (new mappings, and those the
    // agent's mmap wrapper registered) is the kernel's again at once.
    if crate::hold::is_held(mm) {
        let _ = crate::hold::bring_back(shared, mm, Duration::ZERO);
    }
    shared.maybe_kick_reclaim();
    true
}

fn refuse(sock: &OwnedFd, why: &str) {
    let msg = protocol::encode(
        &Message::Error {
            code: libc::EPERM,
            message: why.to_string(),
        },
        0,
    );
    let fd = sock.as_raw_fd();
    let _ = sys::send_with_fd(fd, &msg, None);
    // Close gracefully: a Unix socket closed with unread input resets the connection, and the
    // peer would lose the error message. Stop writing, consume what it sent, then close.
    // SAFETY: shutdown(2) on our own socket.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
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
const MAX_HANDSHAKES: usize = 32;

/// How long a connection may take to greet.
const GREETING_TIMEOUT_MS: u64 = 2_000;

/// Accepts agents' connections for the daemon's whole life: an accept error (the descriptor
/// limit reached, memory short) is counted, said once, and retried after a growing pause, never
/// the end of accepting.
fn accept_loop(shared: &Arc<Shared>, lfd: RawFd) {
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
        // SAFETY: accept4 on our listening socket; null address arguments are allowed.
        let fd = unsafe {
            libc::accept4(
                lfd,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if shared.stats.accept_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                eprintln!(
                    "uffd-daemon: accepting an agent's connection failed ({e}); retrying \
                     (processes of the tree wait to start until it works)"
                );
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
            continue;
        }
        backoff = Duration::from_millis(1);
        // SAFETY: `fd` is a fresh descriptor we own.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
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
fn is_userfaultfd(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|t| t.as_os_str() == "anon_inode:[userfaultfd]")
}

/// A program registers memory the daemon manages with a userfaultfd of its own (its
/// `UFFDIO_REGISTER` failed with `EBUSY`; the agent's `ioctl` wrapper asks): the daemon steps
/// aside. It waits for an eviction of that address space in flight to end and keeps new ones
/// out (the agent lock), brings back every page of the range that it evicted (the program's
/// handler would otherwise see a missing fault where the page has data), unregisters the
/// range, forgets its pages and never registers it again (`own_uffd_bytes`).
fn release_to_program(shared: &Shared, pid: i32, start: u64, len: u64) -> std::io::Result<()> {
    let Some(mm) = live_mm(shared, pid) else {
        return Ok(()); // not managed: nothing of ours is registered there
    };
    let _agent = agent_without_drop(&mm)?;
    let (managed, restored) =
        restore_and_step_aside(shared, &mm, start, start + len, Unregister::Whole)?;
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
fn leave_management(shared: &Shared, pid: i32) -> std::io::Result<()> {
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
        eprintln!(
            "uffd-daemon: pid {pid}: the agent's threads could not start again after a call that \
             needs the process alone (a new user namespace): its {} MiB are brought back and the \
             process is no longer managed (counted in unmanaged_no_agent_bytes)",
            managed >> 20
        );
        return Ok(());
    }
    Stats::add(&shared.stats.tsync_left_processes, 1);
    Stats::add(&shared.stats.tsync_left_bytes, managed);
    eprintln!(
        "uffd-daemon: pid {pid} puts every thread under a seccomp filter (TSYNC), the agent's \
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
fn step_out(shared: &Shared, pid: i32) -> std::io::Result<()> {
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
fn lock_request(
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

/// The live (not retired) address space of `pid`, if the daemon manages one.
pub(crate) fn live_mm(shared: &Shared, pid: i32) -> Option<Arc<Mm>> {
    shared
        .mms
        .lock()
        .iter()
        .find(|m| m.pid() == Some(pid) && !m.retired.load(Ordering::Acquire))
        .cloned()
}

/// The agent slot of `mm` once no DROP is outstanding on it (the monitor settles one when its
/// answer comes), held so that no new one starts. `EAGAIN` after 10 s.
fn agent_without_drop(mm: &Mm) -> std::io::Result<parking_lot::MutexGuard<'_, Option<AgentConn>>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let g = mm.agent.lock();
        if g.as_ref().is_none_or(|a| a.pending.is_none()) {
            return Ok(g);
        }
        drop(g);
        if Instant::now() > deadline {
            return Err(std::io::Error::from_raw_os_error(libc::EAGAIN));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How [`restore_and_step_aside`] unregisters.
pub(crate) enum Unregister {
    /// The whole range at once (a program's own registration: one anonymous range).
    Whole,
    /// Each part the daemon registered (a range that may hold mappings no userfaultfd takes,
    /// which the kernel refuses to unregister).
    Parts,
}

/// Brings back every page of `[start, end)` the daemon evicted (the program's memory reads as
/// before), unregisters it, forgets its pages and refuses to register it again (a hold takes
/// the refusal back when it ends, `hold.rs`). Returns the bytes of it the daemon had
/// registered and the pages it brought back.
pub(crate) fn restore_and_step_aside(
    shared: &Shared,
    mm: &Mm,
    start: u64,
    end: u64,
    how: Unregister,
) -> std::io::Result<(u64, u64)> {
    // Runs of consecutive pages in consecutive slots come back with one read of what the
    // backend holds of them and one UFFDIO_COPY: a page at a time, a hold of pages the swap
    // file holds took 80 us a page, one disk read each.
    const RUN: usize = 64;
    let mut buf = vec![0u8; RUN * PAGE_SIZE];
    let mut restored = 0u64;
    loop {
        let mut st = mm.state.lock();
        let stored: Vec<(u64, u32)> = st
            .pages
            .range(start..end)
            .filter_map(|(a, p)| p.slot().map(|s| (a, s)))
            .collect();
        let mut again = false;
        let mut i = 0;
        while i < stored.len() {
            let (a0, s0) = stored[i];
            let mut n = 1;
            while s0 != ZERO_SLOT
                && n < RUN
                && stored.get(i + n) == Some(&(a0 + n as u64 * PAGE_SIZE_U64, s0 + n as u32))
            {
                n += 1;
            }
            let got = if s0 == ZERO_SLOT {
                buf[..PAGE_SIZE].fill(0);
                1
            } else {
                shared.tiers.read_run(s0, n, &mut buf[..n * PAGE_SIZE])?.0
            };
            let (_, filled) = mm.uffd.copy_run(a0, &buf[..got * PAGE_SIZE]);
            for k in 0..filled {
                let a = a0 + k as u64 * PAGE_SIZE_U64;
                if let Some(p) = st.pages.remove(a) {
                    st.release(shared, a, p);
                }
            }
            restored += filled as u64;
            i += filled;
            if filled == got {
                continue;
            }
            // The run stopped at this page (present already, the end of a mapping, an event
            // pending): it alone.
            let a = stored[i].0;
            match mm
                .uffd
                .copy(a, &buf[filled * PAGE_SIZE..(filled + 1) * PAGE_SIZE])
            {
                Ok(f @ (Fill::Filled | Fill::Exists)) => {
                    restored += u64::from(f == Fill::Filled);
                    if let Some(p) = st.pages.remove(a) {
                        st.release(shared, a, p);
                    }
                }
                // An event is queued: the handler must read it, and it may need the state lock.
                Ok(Fill::Again) => {
                    again = true;
                    break;
                }
                Ok(Fill::Gone) => {}
                Err(e) => return Err(e),
            }
            i += 1;
        }
        if again {
            drop(st);
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let parts = st.registered_parts(start, end);
        let managed: u64 = parts.iter().map(|(s, e)| e - s).sum();
        match how {
            Unregister::Whole => mm.uffd.unregister(start, end - start)?,
            Unregister::Parts => {
                for (s, e) in parts {
                    mm.uffd.unregister(s, e - s)?;
                }
            }
        }
        st.forget_range(shared, start, end);
        st.remove_range(start, end);
        st.refuse(start, end);
        return Ok((managed, restored));
    }
}

/// Answers a program thread's request (RELEASE, LOCK, LEAVE) with `HelloAck`: status 0, or
/// the errno of what failed, which is also said.
fn answer_request(sock: &OwnedFd, pid: i32, r: std::io::Result<()>, what: &str) {
    let status = match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("uffd-daemon: pid {pid}: cannot {what}: {e}");
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
    let _ = sys::send_with_fd(sock.as_raw_fd(), &ack, None);
}

/// Reads a greeting from `sock` (and the descriptor it carries), refusing the connection with
/// a reason if it is not a valid HELLO of process `pid`.
fn read_hello(
    shared: &Shared,
    sock: &OwnedFd,
    pid: i32,
) -> Option<(protocol::Hello, Option<OwnedFd>)> {
    let stats = &shared.stats;
    let mut buf = vec![0u8; MAX_PACKET];
    let (n, fd) = match sys::recv_with_fd(sock.as_raw_fd(), &mut buf) {
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
            let r = crate::hold::request(shared, pid, target, reason);
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
            eprintln!("uffd-daemon: bad greeting from pid {pid}: {e}");
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
fn handle_connection(shared: Arc<Shared>, sock: OwnedFd) {
    let stats = &shared.stats;
    let cred = match sys::peer_cred(sock.as_raw_fd()) {
        Ok(c) => c,
        Err(_) => return,
    };
    // Any uid: a process of the tree may have dropped its privileges (a server's workers).
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    if !bind::in_tree(cred.pid, me) {
        // Out of descriptors, the daemon cannot read /proc to tell who it is: say that.
        if let Err(e) = std::fs::File::open("/proc/self/stat") {
            if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                Stats::add(&stats.accept_errors, 1);
                refuse(&sock, "the daemon is out of descriptors (RLIMIT_NOFILE)");
                return;
            }
        }
        Stats::add(&stats.protocol_errors, 1);
        eprintln!("uffd-daemon: refusing a connection from pid {} uid {}: not a process this daemon started", cred.pid, cred.uid);
        refuse(&sock, "this daemon serves only the processes it started");
        return;
    }
    let _ = sys::set_recv_timeout(sock.as_raw_fd(), GREETING_TIMEOUT_MS);
    let Some((mut hello, mut fd)) = read_hello(&shared, &sock, cred.pid) else {
        return;
    };
    if hello.flags & HELLO_NEED_UFFD != 0 {
        // A process that cannot make its uffd (a user without access to /dev/userfaultfd):
        // lend it the device, then read its second greeting, with the uffd made from it.
        let dev = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/userfaultfd")
        {
            Ok(d) => d,
            Err(e) => {
                refuse(
                    &sock,
                    &format!("the daemon cannot open /dev/userfaultfd: {e}"),
                );
                return;
            }
        };
        let ack = protocol::encode(
            &Message::HelloAck {
                status: 0,
                max_drop_pages: 0,
            },
            0,
        );
        if sys::send_with_fd(sock.as_raw_fd(), &ack, Some(dev.as_raw_fd())).is_err() {
            return;
        }
        drop(dev);
        let Some(again) = read_hello(&shared, &sock, cred.pid) else {
            return;
        };
        if again.0.flags & (HELLO_NEED_UFFD | HELLO_FORK_CHILD | HELLO_AGENT_RESTART) != 0 {
            Stats::add(&stats.protocol_errors, 1);
            refuse(
                &sock,
                "a second HELLO must carry the uffd made with the device",
            );
            return;
        }
        (hello, fd) = again;
    }
    let pid = cred.pid;
    let region = (hello.region_start, hello.region_start + hello.region_len);
    let max_drop = (hello.scratch_pages as usize).min(protocol::MAX_DROP_PAGES);

    if hello.flags & HELLO_AGENT_RESTART != 0 {
        // The agent's threads of a managed process, back after they stepped out: like a fork
        // child, it gets back the uffd the daemon kept (the new agent thread named itself
        // through its scratch fault before greeting).
        let Some(mm) = live_mm(&shared, pid) else {
            refuse(&sock, "no managed address space is known for this pid");
            return;
        };
        // One agent per address space, as for a fork child. (Also an agent whose earlier
        // connection was lost: only its watchdog had to step out.)
        let mut slot = mm.agent.lock();
        if slot.is_some() || mm.agentless.load(Ordering::Acquire) {
            drop(slot);
            Stats::add(&stats.protocol_errors, 1);
            refuse(&sock, "this process already has an agent connection");
            return;
        }
        let mut conn = match AgentConn::new(sock, max_drop) {
            Ok(c) => c,
            Err(_) => return,
        };
        let ack = Message::HelloAck {
            status: 0,
            max_drop_pages: max_drop as u32,
        };
        if conn
            .send(&ack, &shared.greeting_fds(Some(mm.uffd.raw())))
            .is_err()
        {
            return;
        }
        *slot = Some(conn);
        mm.stepped_out.store(false, Ordering::Release);
        drop(slot);
        Stats::add(&stats.agent_restarts, 1);
        // The call may have changed what the process maps; pick up anything new.
        let _ = scan_and_register(&shared, &mm);
        return;
    }
    if hello.flags & HELLO_FORK_CHILD != 0 {
        // The child was bound to its process in its probe fault before it connected (or, if
        // it was not found then, it is bound now by the token in its probe page: `bind.rs`);
        // find its mm.
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
            if bind::bind_at_greeting(&shared, pid) {
                continue;
            }
            if Instant::now() > deadline {
                refuse(&sock, "no forked address space is known for this pid");
                return;
            }
            let mut g = shared.bind_lock.lock();
            shared.bind_cv.wait_for(&mut g, Duration::from_millis(20));
        };
        // One agent per address space: a second greeting would take the first one's place
        // (and with it a DROP it may have outstanding).
        let mut slot = mm.agent.lock();
        if slot.is_some() {
            drop(slot);
            Stats::add(&stats.protocol_errors, 1);
            refuse(&sock, "this process already has an agent connection");
            return;
        }
        let mut conn = match AgentConn::new(sock, max_drop) {
            Ok(c) => c,
            Err(_) => return,
        };
        let ack = Message::HelloAck {
            status: 0,
            max_drop_pages: max_drop as u32,
        };
        if conn
            .send(&ack, &shared.greeting_fds(Some(mm.uffd.raw())))
            .is_err()
        {
            return;
        }
        *slot = Some(conn);
        drop(slot);
        // Traced from its birth (a tracer that follows forks): held (`hold.rs`).
        crate::hold::at_greeting(&shared, &mm, pid);
        // Registrations were inherited; pick up anything new.
        let _ = scan_and_register(&shared, &mm);
        return;
    }

    // A process that started (or exec'd) with the agent: it brings its uffd.
    let Some(fd) = fd else {
        refuse(&sock, "HELLO without a userfaultfd attached");
        return;
    };
    if !is_userfaultfd(&fd) {
        Stats::add(&stats.protocol_errors, 1);
        eprintln!(
            "uffd-daemon: pid {} greeted with a descriptor that is not a userfaultfd; refused",
            cred.pid
        );
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
    let old: Vec<Arc<Mm>> = shared
        .mms
        .lock()
        .iter()
        .filter(|m| m.pid() == Some(pid))
        .cloned()
        .collect();
    for m in old {
        retire(&shared, &m);
    }
    let uffd = Uffd::from_owned(fd);
    let mm = match Mm::new(
        shared.new_id(),
        uffd,
        pid,
        region,
        hello.probe,
        hello.scratch,
        &shared.policy,
    ) {
        Ok(m) => Arc::new(m),
        Err(_) => return,
    };
    // The peer itself (whatever became of its number since it connected); then its number,
    // checked to be the peer's still.
    if let Ok(p) = PidFd::of_peer(sock.as_raw_fd()).or_else(|_| PidFd::open(pid)) {
        *mm.pidfd.lock() = Some(p);
    }
    bind::note_pid_namespace(&mm, pid);
    if start_mm(&shared, &mm).is_err() {
        return;
    }
    // Traced from its start (`gdb PROGRAM`, `strace PROGRAM`: PTRACE_TRACEME before the exec):
    // held, its memory the kernel's while traced (`hold.rs`).
    crate::hold::at_greeting(&shared, &mm, pid);
    let _ = scan_and_register(&shared, &mm);
    let mut conn = match AgentConn::new(sock, max_drop) {
        Ok(c) => c,
        Err(_) => return,
    };
    if conn
        .send(
            &Message::HelloAck {
                status: 0,
                max_drop_pages: max_drop as u32,
            },
            &shared.greeting_fds(None),
        )
        .is_err()
    {
        return;
    }
    *mm.agent.lock() = Some(conn);
    if shared.verbose {
        eprintln!("uffd-daemon: managing pid {pid} (mm {})", mm.id);
    }
}

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::Relaxed);
}

fn serve_control(listener: UnixListener, shared: Arc<Shared>, started: Instant) {
    for s in listener.incoming() {
        let Ok(mut s) = s else { continue };
        let mut v = shared.stats_json();
        v["elapsed_s"] = started.elapsed().as_secs_f64().into();
        v["pids"] = shared
            .mms
            .lock()
            .iter()
            .filter_map(|m| m.pid())
            .collect::<Vec<_>>()
            .into();
        let _ = writeln!(s, "{v}");
    }
}

/// The daemon holds several descriptors per client (its uffd, socket, pidfd, two eventfds):
/// the soft limit goes up to the hard one, so that a tree of a few hundred processes does not
/// run the daemon out of them (the accept loop and the greetings survive it anyway).
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit structure.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Says at start (or, with `unmanaged = "error"`, refuses) a program the agent cannot load
/// into and the daemon cannot manage without it (a set-ID program when the daemon is not root:
/// tracing it would run it without its privileges). Returns the program's kind if the agent
/// cannot load into it (statically linked, or set-ID): the daemon manages it without one.
fn check_program(
    program: &str,
    policy: crate::unmanaged::Policy,
) -> anyhow::Result<Option<crate::unmanaged::Kind>> {
    let path = if program.contains('/') {
        Some(PathBuf::from(program))
    } else {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(program))
                .find(|c| c.is_file())
        })
    };
    let Some(kind) = path.as_deref().and_then(crate::unmanaged::program_kind) else {
        return Ok(None);
    };
    // SAFETY: geteuid cannot fail.
    if kind == crate::unmanaged::Kind::Static || unsafe { libc::geteuid() } == 0 {
        return Ok(Some(kind));
    }
    let why = match kind {
        crate::unmanaged::Kind::Static => "is statically linked: the agent cannot load into it",
        _ => "is set-user-ID or set-group-ID: the loader ignores LD_PRELOAD for it",
    };
    if policy == crate::unmanaged::Policy::Error {
        bail!("{program} {why} (unmanaged = \"error\")");
    }
    eprintln!("uffd-daemon: {program} {why}; its memory is unmanaged and outside the limit");
    Ok(None)
}

/// Checks that the daemon's `/proc` is of its own pid namespace, and returns that namespace's
/// name (`pid:[INODE]`). The daemon reads the tree's processes there by the numbers the kernel
/// gives it (a socket's peer credentials, `pidfd_open`, `kill`: its own namespace's); a `/proc`
/// of another namespace (a daemon started by `unshare -p` without `--mount-proc`) would name
/// other processes by the same numbers.
fn check_proc() -> anyhow::Result<String> {
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    let seen = std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str().and_then(|s| s.parse::<i32>().ok()));
    if seen != Some(me) {
        bail!(
            "/proc is not of the daemon's pid namespace (it names this process {seen:?}, the \
             kernel {me}): mount one for it (unshare --pid --fork --mount-proc, or mount -t proc)"
        );
    }
    let ns = std::fs::read_link("/proc/self/ns/pid").context("reading /proc/self/ns/pid")?;
    Ok(ns.to_string_lossy().into_owned())
}

/// Checks, before starting anything, that this kernel and these privileges give the agent the
/// userfaultfd it needs, and says what is missing otherwise.
fn check_kernel_support() -> anyhow::Result<()> {
    let names = [
        (sys::UFFD_FEATURE_PAGEFAULT_FLAG_WP, "PAGEFAULT_FLAG_WP"),
        (
            sys::UFFD_FEATURE_EVENT_FORK,
            "EVENT_FORK (needs CAP_SYS_PTRACE)",
        ),
        (sys::UFFD_FEATURE_EVENT_REMAP, "EVENT_REMAP"),
        (sys::UFFD_FEATURE_EVENT_REMOVE, "EVENT_REMOVE"),
        (sys::UFFD_FEATURE_EVENT_UNMAP, "EVENT_UNMAP"),
        (sys::UFFD_FEATURE_THREAD_ID, "THREAD_ID"),
        (sys::UFFD_FEATURE_MOVE, "MOVE (Linux 6.8 or later)"),
    ];
    match Uffd::create_local(sys::REQUIRED_FEATURES) {
        Ok((_, granted)) => {
            let missing: Vec<&str> = names.iter().filter(|(bit, _)| granted & bit == 0).map(|(_, n)| *n).collect();
            if !missing.is_empty() {
                bail!("this kernel's userfaultfd lacks features uffd-daemon needs: {}", missing.join(", "));
            }
            Ok(())
        }
        Err(e) => bail!(
            "cannot create a userfaultfd with the features uffd-daemon needs ({e}): run as root, or \
             give read/write access to /dev/userfaultfd and CAP_SYS_PTRACE (for EVENT_FORK); \
             Linux 6.8 or later is needed for UFFDIO_MOVE"
        ),
    }
}

/// `uffd-daemon run`: runs `program` under the daemon; returns the program's exit status.
pub fn run(config: &Config, program: &str, args: &[String]) -> anyhow::Result<i32> {
    if config.limit_bytes < 16 * PAGE_SIZE_U64 {
        bail!(
            "--limit {} is too small: at least 64 KiB",
            config.limit_bytes
        );
    }
    check_kernel_support()?;
    let pid_ns = check_proc()?;
    let agentless = check_program(program, config.policy.unmanaged)?;
    for w in crate::config::capacity_warnings(config.limit_bytes, &config.tiers) {
        eprintln!("uffd-daemon: warning: {w}");
    }
    // Every output path is checked before the program starts, not after it has run.
    if let Some(p) = &config.stats_json {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(p)
            .with_context(|| format!("--stats-json {}: cannot be written", p.display()))?;
    }
    raise_fd_limit();
    let started = Instant::now();
    // (The lock shows the directory live to other daemons until the daemon exits.)
    let (dir, _run_dir_lock) = crate::rundir::create()?;
    let cleanup = RunDirGuard(dir.clone());
    let so = dir.join("libuffd_agent.so");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&so)
            .with_context(|| format!("writing the agent library {}", so.display()))?;
        f.write_all(AGENT_SO)?;
    }
    let agent_sock = dir.join("agent.sock");
    // SAFETY: socket(2) with constant arguments.
    let lfd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if lfd < 0 {
        bail!("socket: {}", std::io::Error::last_os_error());
    }
    // SAFETY: `lfd` is a fresh descriptor we own.
    let listen_fd = unsafe { OwnedFd::from_raw_fd(lfd) };
    bind_listen(&listen_fd, &agent_sock)?;
    let ctl_path = dir.join("ctl.sock");
    let ctl = UnixListener::bind(&ctl_path)
        .with_context(|| format!("binding the control socket {}", ctl_path.display()))?;
    std::fs::set_permissions(&ctl_path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("setting the mode of {}", ctl_path.display()))?;

    let tiers = Tiers::new(config.tiers.clone())?;
    // Backing files are removed at exit whatever happens (the tiers themselves live as long
    // as the threads).
    let _swap_guard = match &config.tiers.backend {
        crate::tiers::BackendSpec::File(Some(p)) => Some(RunDirGuard::file(p.clone())),
        crate::tiers::BackendSpec::Pmem(p) if p.is_file() => Some(RunDirGuard::file(p.clone())),
        _ => None,
    };
    // A daemon killed with SIGKILL cannot remove its named backing file: the next one does,
    // from this note (rundir.rs).
    if let Some(g) = &_swap_guard {
        crate::rundir::note_backing_file(&dir, &g.0);
    }
    if config.verbose {
        eprintln!("uffd-daemon: tiers: {}", tiers.describe());
    }
    let mut shared = Shared::new(
        tiers,
        config.policy,
        (config.limit_bytes / PAGE_SIZE_U64) as usize,
        config.auto_limit,
        config.verbose,
    );
    shared.lifeline = Some(
        sys::Lifeline::new()
            .context("making the pipe that tells the agents of the daemon's end (its lifeline)")?,
    );
    let shared = Arc::new(shared);

    // A signal ignored where the daemon was started (`nohup`, a shell's background job, a
    // service manager) stays ignored: by the daemon, which passes on only what it catches,
    // and so by the program, which inherits the disposition across its exec as it would
    // bare (a caught signal is reset to the default there).
    // SAFETY: prctl and signal with constant arguments; the handler only stores an atomic.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            if libc::signal(sig, on_signal as *const () as libc::sighandler_t) == libc::SIG_IGN {
                libc::signal(sig, libc::SIG_IGN);
            }
        }
    }

    {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("uffd-ctl".into())
            .spawn(move || serve_control(ctl, shared, started))?;
    }
    {
        let shared = Arc::clone(&shared);
        let lfd = listen_fd.as_raw_fd();
        std::thread::Builder::new()
            .name("uffd-accept".into())
            .spawn(move || accept_loop(&shared, lfd))?;
    }

    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", so.display()),
        _ => so.display().to_string(),
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LD_PRELOAD", preload)
        .env("UFFD_DAEMON_SOCK", &agent_sock)
        .env("UFFD_DAEMON_PID", std::process::id().to_string())
        .env("UFFD_DAEMON_PIDNS", &pid_ns);
    // A program the agent cannot load into stops at its exec, before its first instruction,
    // for the daemon to make its uffd (agentless.rs). (Its environment keeps LD_PRELOAD for
    // the dynamic programs it may run.) This thread, the monitor's, is its tracer.
    if agentless.is_some() {
        sys::trace_me_at_exec(&mut cmd);
    }
    let child = cmd.spawn().with_context(|| format!("starting {program}"))?;
    let root = child.id() as i32;
    std::mem::forget(child); // reaped by the monitor's waitpid(-1)
    if agentless.is_some() {
        start_agentless(&shared, root);
    }

    let scan_stop = Arc::new(AtomicBool::new(false));
    let scan_thread = {
        let (shared, stop) = (Arc::clone(&shared), Arc::clone(&scan_stop));
        std::thread::Builder::new()
            .name("uffd-scan".into())
            .spawn(move || scanner(shared, stop))?
    };
    let status = monitor(&shared, root);
    scan_stop.store(true, Ordering::Relaxed);
    let _ = scan_thread.join();
    // Every program has ended: a network backend drops the run's pages now (the tiers live on
    // with the threads that hold them, and are never dropped).
    shared.tiers.close();
    let status = status?;
    if let Some(p) = &config.stats_json {
        let mut v = shared.stats_json();
        v["elapsed_s"] = started.elapsed().as_secs_f64().into();
        v["exit_status"] = status.into();
        std::fs::write(p, serde_json::to_string_pretty(&v)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if config.verbose {
        eprintln!("uffd-daemon: {}", shared.stats_json());
    }
    drop(cleanup);
    Ok(status)
}

/// Removes a directory tree (or a single file) when dropped.
struct RunDirGuard(PathBuf);
impl RunDirGuard {
    fn file(path: PathBuf) -> Self {
        RunDirGuard(path)
    }
}
impl Drop for RunDirGuard {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

fn bind_listen(fd: &OwnedFd, path: &Path) -> anyhow::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        bail!("socket path {} is too long", path.display());
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: `addr` is a valid sockaddr_un; the length is its size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as u32,
        )
    };
    if rc < 0 {
        bail!(
            "binding {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    // Any process of the tree connects, whatever its privileges: who it is is checked at
    // accept (rundir.rs).
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    // SAFETY: listen on our bound socket.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } < 0 {
        bail!("listen: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The census of unmanaged memory (`unmanaged.rs`), and with `unmanaged = "error"` the end of
/// a tree that has some.
fn census_round(shared: &Shared, census: &mut Census) {
    if census.stopped {
        return;
    }
    let managed: std::collections::HashSet<i32> = shared
        .mms
        .lock()
        .iter()
        .filter(|m| !m.agent.try_lock().is_some_and(|a| a.is_none()))
        .filter_map(|m| m.pid())
        .collect();
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    census.reasons = shared
        .agentless_refusals
        .lock()
        .iter()
        .map(|(&p, (_, why))| (p, why.clone()))
        .collect();
    let held: std::collections::HashMap<i32, crate::unmanaged::Kind> = shared
        .mms
        .lock()
        .iter()
        .filter_map(|m| Some((m.pid()?, crate::hold::census_kind(m)?)))
        .collect();
    let found = census.take(me, &managed, &held, &shared.stats, shared.policy.unmanaged);
    if let Some((pid, kind)) = found {
        census.stopped = true;
        eprintln!(
            "uffd-daemon: unmanaged = \"error\": pid {pid} has {} memory the daemon cannot \
             manage; stopping the process tree",
            kind.name()
        );
        let mut tree = Vec::new();
        let mut stack = vec![me];
        while let Some(p) = stack.pop() {
            for c in std::fs::read_to_string(format!("/proc/{p}/task/{p}/children"))
                .unwrap_or_default()
                .split_ascii_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                tree.push(c);
                stack.push(c);
            }
        }
        for p in tree {
            // (Through a pidfd, checked in the tree once it is open: a number reused since
            // the walk names no process outside it.)
            bind::kill_in_tree(p);
        }
    }
}

/// The scanner: registers new memory, periodically and at once when a process's anonymous
/// RSS grew beyond what the daemon tracks (memory populated before it was registered).
/// It runs apart from reclaim so that a slow eviction never delays registration.
fn scanner(shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let mut tick: u64 = 0;
    let mut census = Census::default();
    let mut judged = std::collections::HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        tick += 1;
        let mut rss_total = 0u64;
        // (A copy: the list's lock must not be held below. A `for` over `lock().clone()`
        // would hold it for the whole loop, and a fork event's handler needs it to add the
        // child while the parent's agent, in a DROP that reclaim waits for, waits for that
        // very handler to read its REMOVE event.)
        let mms: Vec<Arc<Mm>> = shared.mms.lock().clone();
        for m in mms {
            let Some(pid) = m.pid() else { continue };
            // Never wait behind a DROP in flight: a held lock means an agent is there.
            let no_agent = m.agent.try_lock().is_some_and(|a| a.is_none());
            if no_agent || m.retired.load(Ordering::Relaxed) {
                continue;
            }
            let (rss, tracer) = maps::rss_and_tracer(pid).unwrap_or((0, 0));
            rss_total += rss;
            // A tracer came or went (`hold.rs`): from the same read, every 2 ms.
            crate::hold::note_tracer(&shared, &m, pid, tracer);
            crate::hold::note_self_mem(&shared, &m, pid);
            let tracked = |m: &Mm| m.state.lock().resident as u64 * PAGE_SIZE_U64;
            let untracked = m.untracked_rss.load(Ordering::Relaxed);
            let last = m.last_scan_tick.load(Ordering::Relaxed);
            // Anonymous memory the daemon never manages (the stack, copy-on-write pages of
            // libraries' data: often more than the margin) would otherwise trigger a scan on
            // every tick: stress-ng's processes had their maps read 1000 times a second.
            if tick.saturating_sub(last) >= 50 || rss > tracked(&m) + untracked + (256 << 10) {
                m.last_scan_tick.store(tick, Ordering::Relaxed);
                if !scan_and_register(&shared, &m) {
                    retire(&shared, &m);
                    // The new image may be one the agent cannot load into: the monitor looks.
                    shared.adopt_queue.lock().push(pid);
                    shared.kick_reclaim(); // (wakes the monitor)
                    continue;
                }
                let after = maps::rss_anon_bytes(pid).unwrap_or(0);
                m.untracked_rss
                    .store(after.saturating_sub(tracked(&m)), Ordering::Relaxed);
            }
        }
        shared
            .stats
            .rss_anon_max_bytes
            .fetch_max(rss_total, Ordering::Relaxed);
        // The daemon's own memory: all of it, and what is beyond the zswap pool (metadata:
        // page tables, policy, zswap's index, slot maps; and buffers). Every 20 ms.
        if tick % 250 == 0 {
            // Give back what the allocator holds free (metadata that shrank after a peak).
            // SAFETY: malloc_trim only releases free memory of the allocator.
            unsafe { libc::malloc_trim(0) };
        }
        if tick % 50 == 0 {
            census_round(&shared, &mut census);
        }
        if tick % 5 == 0 {
            // Every 10 ms: the children of processes without an agent, and programs the
            // agent cannot load into started by a spawn (they fill memory from their first
            // instruction).
            crate::agentless::bind_children(&shared);
            crate::agentless::find_new_images(&shared, &mut judged);
        }
        if tick % 50 == 0 {
            // Every 100 ms: the metadata structures' own count of their bytes.
            let (slots, zswap) = shared.tiers.metadata_bytes();
            let (mut table, mut policy, mut managed) = (0, 0, 0);
            for m in shared.mms.lock().iter() {
                let st = m.state.lock();
                table += st.pages.heap_bytes();
                policy += st.policy.metadata_bytes();
                managed += st.pages.len();
            }
            let bytes = (slots + zswap + table + policy) as u64;
            let s = &shared.stats;
            if bytes > s.daemon_metadata_max_bytes.load(Ordering::Relaxed) {
                let parts = [
                    (&s.daemon_metadata_max_bytes, bytes),
                    (&s.daemon_metadata_managed_pages, managed as u64),
                    (&s.daemon_metadata_pagetable_bytes, table as u64),
                    (&s.daemon_metadata_policy_bytes, policy as u64),
                    (&s.daemon_metadata_slots_bytes, slots as u64),
                    (&s.daemon_metadata_zswap_bytes, zswap as u64),
                ];
                for (c, v) in parts {
                    c.store(v, Ordering::Relaxed);
                }
            }
        }
        if tick % 10 == 0 {
            // SAFETY: getpid cannot fail.
            let me = unsafe { libc::getpid() };
            if let Some(own) = maps::rss_anon_bytes(me) {
                let pool = shared.tiers.pool_bytes();
                let s = &shared.stats;
                s.daemon_rss_anon_max_bytes
                    .fetch_max(own, Ordering::Relaxed);
                s.daemon_overhead_max_bytes
                    .fetch_max(own.saturating_sub(pool), Ordering::Relaxed);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The program was started stopped at its exec: manage it without the agent if it cannot load
/// the agent, and let it go.
fn start_agentless(shared: &Arc<Shared>, root: i32) {
    if crate::agentless::needs_agentless(root) {
        match crate::agentless::adopt(shared, root, true) {
            Ok(()) => {
                if shared.verbose {
                    eprintln!("uffd-daemon: pid {root} is managed without the agent");
                }
            }
            Err(e) => {
                note_inject_error(shared, root, &e);
                crate::agentless::refused(shared, root, &e);
                // Still stopped at its exec if the stop came: let it go.
                let _ = sys::ptrace_detach(root, 0);
            }
        }
    } else {
        // A set-ID program run by root without secure mode: the agent loads as usual.
        let mut stop = crate::inject::Stop::stopped(root);
        if let Ok(s) = stop.as_mut() {
            s.release();
        }
    }
}

/// A process of the tree exec'd an image (its old address space is retired): if the agent
/// cannot load into the new one, the daemon manages it without (`agentless.rs`).
fn adopt_exec(shared: &Arc<Shared>, pid: i32) {
    // (A new image that loaded the agent may have greeted already; one that will, a dynamic
    // one outside secure mode, is told by its image below.)
    if shared.mms.lock().iter().any(|m| m.pid() == Some(pid)) {
        return;
    }
    if !crate::agentless::needs_agentless(pid) || crate::agentless::has_uffd_ranges(pid) {
        return;
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    if exe.is_some() && crate::agentless::refused_image(shared, pid) == exe {
        return; // (this image was refused already, and said)
    }
    match crate::agentless::adopt(shared, pid, false) {
        Ok(()) => {}
        Err(e) => {
            note_inject_error(shared, pid, &e);
            if !matches!(e, crate::inject::InjectError::Gone(_)) {
                crate::agentless::refused(shared, pid, &e);
            }
        }
    }
}

/// Notes the rseq page of thread `tid`, in a ptrace stop, in its process's address space.
fn learn_rseq_of(shared: &Shared, tid: i32) {
    let Some(pid) = maps::tgid_of(tid) else {
        return;
    };
    let Some(mm) = shared
        .mms
        .lock()
        .iter()
        .find(|m| m.pid() == Some(pid))
        .cloned()
    else {
        return;
    };
    let page = sys::ptrace_rseq_area(tid)
        .ok()
        .filter(|&a| a != 0)
        .map_or(u64::MAX, |a| a & !(PAGE_SIZE_U64 - 1));
    let mut known = mm.rseq_pages.lock();
    if !known.iter().any(|&(t, _)| t == tid) {
        known.push((tid, page));
    }
}

/// Records what an injection's failure says: an exit status it reaped, a count.
pub fn note_inject_error(shared: &Shared, pid: i32, e: &crate::inject::InjectError) {
    Stats::add(&shared.stats.inject_errors, 1);
    if shared.verbose {
        eprintln!("uffd-daemon: pid {pid}: injection failed: {e}");
    }
    if let crate::inject::InjectError::Gone(Some(st)) = e {
        shared.reaped.lock().push((pid, *st));
    }
}

/// The monitor loop: reaps, retires, reclaims. Returns the root's exit status.
fn monitor(shared: &Arc<Shared>, root: i32) -> anyhow::Result<i32> {
    let mut root_status: Option<i32> = None;
    loop {
        // Signals: forward termination requests to the program; it decides.
        let sig = SIGNAL.swap(0, Ordering::Relaxed);
        if sig != 0 && root_status.is_none() && sig != libc::SIGINT && sig != libc::SIGQUIT {
            // SAFETY: kill(2) with integer arguments.
            unsafe { libc::kill(root, sig) };
        }
        // Reap every child (we are a subreaper); remember the root's status. A stop is a
        // tracee's: one left seized when it did not stop in time for an injection
        // (`inject.rs`) stops when it can, and is let go here, its signal delivered.
        loop {
            let mut st: libc::c_int = 0;
            // SAFETY: waitpid with a valid status pointer.
            let pid = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG | libc::__WALL) };
            if pid <= 0 {
                break;
            }
            if let sys::TraceeState::Stopped { sig, event } = sys::decode_wait_status(st) {
                // (It did not stop in time because its way to the stop met a page of the
                // batch, most likely its rseq area: learnt now, left out of batches.)
                learn_rseq_of(shared, pid);
                let _ = sys::ptrace_detach(pid, if event == 0 { sig } else { 0 });
                continue;
            }
            if pid == root {
                root_status = Some(if libc::WIFEXITED(st) {
                    libc::WEXITSTATUS(st)
                } else if libc::WIFSIGNALED(st) {
                    128 + libc::WTERMSIG(st)
                } else {
                    1
                });
            }
        }
        // Exits that the ptrace waits of an injection reaped.
        for (pid, st) in std::mem::take(&mut *shared.reaped.lock()) {
            if pid == root {
                root_status = Some(st);
            }
        }
        // Images exec'd without the agent: managed without one where the agent cannot load.
        let queued = std::mem::take(&mut *shared.adopt_queue.lock());
        for pid in queued {
            adopt_exec(shared, pid);
        }
        // Retire address spaces whose process exited.
        let mms: Vec<Arc<Mm>> = shared.mms.lock().clone();
        for m in &mms {
            // (Without a pidfd, which the daemon may have failed to open when it was out of
            // descriptors, the pid itself: the monitor reaps the tree, so a gone pid is gone.)
            let exited = match m.pidfd.lock().as_ref() {
                Some(p) => p.exited(),
                None => m.pid().is_some_and(|pid| {
                    // SAFETY: kill(2) with signal 0 only checks that the process exists.
                    let rc = unsafe { libc::kill(pid, 0) };
                    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
                }),
            };
            if exited {
                retire(shared, m);
            }
        }
        // Done when the program has exited and no process of its tree is left (a forked child
        // that never named itself, for example one created by a raw clone, cannot be waited
        // for and does not hold the daemon).
        if root_status.is_some() && shared.mms.lock().iter().all(|m| m.pid().is_none()) {
            return Ok(root_status.unwrap_or(1));
        }
        // DROPs that were not answered in time: settle those answered since, so that writers
        // waiting on their pages go on.
        for m in shared.mms.lock().clone() {
            let (_, outstanding) = reclaim::poll_pending_drop(shared, &m);
            // Writers held on pages moved while their DROP was in flight go on once none is
            // (the monitor is the reclaim thread: no batch of its runs now).
            if !outstanding && m.wp_waiters.swap(false, Ordering::AcqRel) {
                let ranges = m.state.lock().ranges.clone();
                for (s, e) in ranges {
                    let _ = m.uffd.wake(s, e - s);
                }
            }
        }
        // Under `--limit auto`: the controller reads the stall and sets the limit (limit.rs);
        // a lowered limit is reclaimed to just below, at the rate the controller's step sets.
        if let Some(a) = &shared.auto_limit {
            a.tick(&shared.limit, &shared.stall, shared.resident());
        }
        // Reclaim is idle: the scratch areas the last DROPs left pages in are freed.
        if shared.resident() <= shared.limit.high() {
            reclaim::free_idle_scratch(shared);
        }
        // Reclaim down to the low watermark, biggest address space first.
        if shared.resident() > shared.limit.high() {
            let deadline = Instant::now() + Duration::from_millis(50);
            while shared.resident() > shared.limit.low() && Instant::now() < deadline {
                let mut cands: Vec<Arc<Mm>> = shared.mms.lock().clone();
                cands.sort_by_key(|m| std::cmp::Reverse(m.state.lock().resident));
                let mut progress = 0;
                let pinned_before = shared.stats.pinned_refusals.load(Ordering::Relaxed);
                for m in cands.iter().take(3) {
                    let want = shared.resident().saturating_sub(shared.limit.low());
                    if want == 0 {
                        break;
                    }
                    progress += reclaim::evict_batch(shared, m, want);
                    // zswap near its limit: its shrinker writes the coldest entries back to
                    // the backing device before stores start being refused.
                    shared.tiers.balance();
                }
                // Faults held at the limit can go now: wake their handlers at once rather than
                // at their next poll timeout.
                if progress > 0 {
                    for m in shared.mms.lock().iter() {
                        if m.throttled.swap(false, Ordering::AcqRel) {
                            m.retry.signal();
                        }
                    }
                }
                // Stalled only if nothing is on its way either: a DROP sent and not yet
                // answered (an agent thread descheduled on a loaded machine) frees its pages
                // when the answer comes, and letting faults through meanwhile took the
                // resident pages to twice the limit under load.
                let answer_due = progress == 0
                    && shared.mms.lock().iter().any(|m| {
                        m.agent
                            .try_lock()
                            .is_some_and(|a| a.as_ref().is_some_and(|a| a.pending.is_some()))
                    });
                // Nor while pages a DROP refused as shared wait to be unshared: the next DROP
                // unshares them, and the one after moves them.
                let unshare_due = progress == 0
                    && shared
                        .mms
                        .lock()
                        .iter()
                        .any(|m| m.state.try_lock().is_some_and(|st| !st.unshare.is_empty()));
                // Nor when a DROP found pinned pages: they are left out of the next picks,
                // which take other pages. (Faults let through while a pinned buffer was being
                // found took the resident pages to 2.7 times the limit under load.)
                let pinned_found =
                    shared.stats.pinned_refusals.load(Ordering::Relaxed) > pinned_before;
                shared.stalled.store(
                    progress == 0
                        && !answer_due
                        && !unshare_due
                        && !pinned_found
                        && shared.resident() >= shared.limit.pages(),
                    Ordering::Relaxed,
                );
                if progress == 0 && !unshare_due && !pinned_found {
                    break;
                }
            }
        }
        // Sleep until kicked or 5 ms pass.
        let mut k = shared.kick.lock();
        if !*k {
            shared.kick_cv.wait_for(&mut k, Duration::from_millis(5));
        }
        *k = false;
    }
}
