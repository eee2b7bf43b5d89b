//! The supervisor: starts the program with the agent, accepts agents (`connection`), keeps
//! the list of address spaces (`space`), scans the tree (`scanner`), holds processes for
//! debuggers and core dumps (`hold`), adopts programs without an agent (`agentless`), and runs
//! the monitor that reaps, retires and drives reclaim. The data path (`fault`, `reclaim`,
//! `tiers`) never calls into it.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::config::PolicyConfig;
use crate::mm::Mm;
use crate::reclaim;
use crate::sys::{self, Uffd, PAGE_SIZE_U64};
use crate::tiers::{TierConfig, Tiers};

pub(crate) mod agentless;
mod connection;
pub(crate) mod hold;
mod requests;
pub(crate) mod scanner;
pub(crate) mod space;

pub(crate) use crate::shared::Shared;
use connection::accept_loop;
use scanner::{adopt_exec, learn_rseq_of, start_agentless};
use space::retire;

/// The agent shared object, built from `agent/agent.c` by build.rs.
pub(crate) static AGENT_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libuffd_agent.so"));

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
    sys::raise_fd_limit();
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
    if kind == crate::unmanaged::Kind::Static || sys::geteuid() == 0 {
        return Ok(Some(kind));
    }
    let why = match kind {
        crate::unmanaged::Kind::Static => "is statically linked: the agent cannot load into it",
        _ => "is set-user-ID or set-group-ID: the loader ignores LD_PRELOAD for it",
    };
    if policy == crate::unmanaged::Policy::Error {
        bail!("{program} {why} (unmanaged = \"error\")");
    }
    tracing::warn!("{program} {why}; its memory is unmanaged and outside the limit");
    Ok(None)
}

/// Checks that the daemon's `/proc` is of its own pid namespace, and returns that namespace's
/// name (`pid:[INODE]`). The daemon reads the tree's processes there by the numbers the kernel
/// gives it (a socket's peer credentials, `pidfd_open`, `kill`: its own namespace's); a `/proc`
/// of another namespace (a daemon started by `unshare -p` without `--mount-proc`) would name
/// other processes by the same numbers.
fn check_proc() -> anyhow::Result<String> {
    let me = sys::getpid();
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
    let (pid_ns, agentless) = preflight(config, program)?;
    raise_fd_limit();
    let started = Instant::now();
    let rd = RunDir::set_up()?;
    let (shared, _swap_guard) = make_shared(config, &rd.dir)?;
    catch_signals();
    {
        let (shared, ctl) = (Arc::clone(&shared), rd.ctl);
        std::thread::Builder::new()
            .name("uffd-ctl".into())
            .spawn(move || serve_control(ctl, shared, started))?;
    }
    {
        let shared = Arc::clone(&shared);
        let lfd = rd.listen_fd.try_clone()?;
        std::thread::Builder::new()
            .name("uffd-accept".into())
            .spawn(move || accept_loop(&shared, lfd))?;
    }
    let root = start_program(program, args, &rd.so, &rd.agent_sock, &pid_ns, agentless)?;
    if agentless {
        start_agentless(&shared, root);
    }
    let scan_stop = Arc::new(AtomicBool::new(false));
    let scan_thread = {
        let (shared, stop) = (Arc::clone(&shared), Arc::clone(&scan_stop));
        std::thread::Builder::new()
            .name("uffd-scan".into())
            .spawn(move || scanner::scanner(shared, stop))?
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
    tracing::debug!("{}", shared.stats_json());
    drop(rd.cleanup);
    Ok(status)
}

/// What is checked before anything starts: the limit, the kernel, /proc, the program (and
/// whether it needs managing without an agent), the tiers' capacity, and every output path.
/// Returns the daemon's pid namespace and whether the program runs without the agent.
fn preflight(config: &Config, program: &str) -> anyhow::Result<(String, bool)> {
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
        tracing::warn!("{w}");
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
    Ok((pid_ns, agentless.is_some()))
}

/// The run directory and what lives in it: the agent library, the agents' socket, the control
/// socket. Removed when `cleanup` drops.
struct RunDir {
    dir: PathBuf,
    /// Shows the directory live to other daemons until the daemon exits.
    _lock: std::fs::File,
    cleanup: RunDirGuard,
    so: PathBuf,
    agent_sock: PathBuf,
    listen_fd: OwnedFd,
    ctl: UnixListener,
}

impl RunDir {
    fn set_up() -> anyhow::Result<RunDir> {
        let (dir, lock) = crate::rundir::create()?;
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
        let listen_fd = sys::seqpacket_socket().map_err(|e| anyhow::anyhow!("socket: {e}"))?;
        bind_listen(&listen_fd, &agent_sock)?;
        let ctl_path = dir.join("ctl.sock");
        let ctl = UnixListener::bind(&ctl_path)
            .with_context(|| format!("binding the control socket {}", ctl_path.display()))?;
        std::fs::set_permissions(&ctl_path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("setting the mode of {}", ctl_path.display()))?;
        Ok(RunDir {
            dir,
            _lock: lock,
            cleanup,
            so,
            agent_sock,
            listen_fd,
            ctl,
        })
    }
}

/// The tiers and the state shared by every thread; and the guard that removes a named backing
/// file at exit whatever happens (the tiers themselves live as long as the threads).
fn make_shared(config: &Config, dir: &Path) -> anyhow::Result<(Arc<Shared>, Option<RunDirGuard>)> {
    let tiers = Tiers::new(config.tiers.clone())?;
    let swap_guard = match &config.tiers.backend {
        crate::tiers::BackendSpec::File(Some(p)) => Some(RunDirGuard::file(p.clone())),
        crate::tiers::BackendSpec::Pmem(p) if p.is_file() => Some(RunDirGuard::file(p.clone())),
        _ => None,
    };
    // A daemon killed with SIGKILL cannot remove its named backing file: the next one does,
    // from this note (rundir.rs).
    if let Some(g) = &swap_guard {
        crate::rundir::note_backing_file(dir, &g.0);
    }
    tracing::debug!("tiers: {}", tiers.describe());
    let mut shared = Shared::new(
        tiers,
        config.policy,
        (config.limit_bytes / PAGE_SIZE_U64) as usize,
        config.auto_limit,
    );
    shared.lifeline = Some(
        sys::Lifeline::new()
            .context("making the pipe that tells the agents of the daemon's end (its lifeline)")?,
    );
    Ok((Arc::new(shared), swap_guard))
}

/// The daemon's signals: it is a subreaper (orphans of the tree stay in it), ignores SIGPIPE,
/// and catches the termination signals to pass them on. A signal ignored where the daemon was
/// started (`nohup`, a shell's background job, a service manager) stays ignored: by the
/// daemon, which passes on only what it catches, and so by the program, which inherits the
/// disposition across its exec as it would bare (a caught signal is reset to the default
/// there).
fn catch_signals() {
    let _ = sys::set_child_subreaper();
    sys::ignore_sigpipe();
    sys::catch_signals(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT]);
}

/// Starts the program with the agent preloaded. A program the agent cannot load into
/// (`agentless`) stops at its exec, before its first instruction, for the daemon to make its
/// uffd (agentless.rs); its environment keeps LD_PRELOAD for the dynamic programs it may run,
/// and this thread, the monitor's, is its tracer. Returns its pid.
fn start_program(
    program: &str,
    args: &[String],
    so: &Path,
    agent_sock: &Path,
    pid_ns: &str,
    agentless: bool,
) -> anyhow::Result<i32> {
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", so.display()),
        _ => so.display().to_string(),
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LD_PRELOAD", preload)
        .env("UFFD_DAEMON_SOCK", agent_sock)
        .env("UFFD_DAEMON_PID", std::process::id().to_string())
        .env("UFFD_DAEMON_PIDNS", pid_ns);
    if agentless {
        sys::trace_me_at_exec(&mut cmd);
    }
    let child = cmd.spawn().with_context(|| format!("starting {program}"))?;
    let root = child.id() as i32;
    std::mem::forget(child); // reaped by the monitor's waitpid(-1)
    Ok(root)
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
    if path.as_os_str().len() > sys::UNIX_PATH_MAX {
        bail!("socket path {} is too long", path.display());
    }
    if let Err(e) = sys::bind_unix(fd, path) {
        bail!("binding {}: {e}", path.display());
    }
    // Any process of the tree connects, whatever its privileges: who it is is checked at
    // accept (rundir.rs).
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    if let Err(e) = sys::listen(fd, 128) {
        bail!("listen: {e}");
    }
    Ok(())
}

/// The monitor loop: reaps, retires, reclaims. Returns the root's exit status.
fn monitor(shared: &Arc<Shared>, root: i32) -> anyhow::Result<i32> {
    let mut root_status: Option<i32> = None;
    loop {
        // Signals: forward termination requests to the program; it decides.
        let sig = sys::take_caught_signal();
        if sig != 0 && root_status.is_none() && sig != libc::SIGINT && sig != libc::SIGQUIT {
            let _ = sys::kill(root, sig);
        }
        if let Some(st) = reap(shared, root) {
            root_status = Some(st);
        }
        // Images exec'd without the agent: managed without one where the agent cannot load.
        let queued = std::mem::take(&mut *shared.adopt_queue.lock());
        for pid in queued {
            adopt_exec(shared, pid);
        }
        retire_exited(shared);
        // Done when the program has exited and no process of its tree is left (a forked child
        // that never named itself, for example one created by a raw clone, cannot be waited
        // for and does not hold the daemon).
        if root_status.is_some() && shared.mms.lock().iter().all(|m| m.pid().is_none()) {
            return Ok(root_status.unwrap_or(1));
        }
        reclaim::settle_outstanding(shared);
        // Under `--limit auto`: the controller reads the stall and sets the limit (limit.rs);
        // a lowered limit is reclaimed to just below, at the rate the controller's step sets.
        if let Some(a) = &shared.auto_limit {
            a.tick(&shared.limit, &shared.stall, shared.resident());
        }
        // Reclaim is idle: the scratch areas the last DROPs left pages in are freed.
        if shared.resident() <= shared.limit.high() {
            reclaim::free_idle_scratch(shared);
        }
        if shared.resident() > shared.limit.high() {
            reclaim::to_low_watermark(shared);
        }
        // Sleep until kicked or 5 ms pass.
        shared.wait_for_kick(Duration::from_millis(5));
    }
}

/// Reaps every child (the daemon is a subreaper); returns the root's status if it ended. A
/// stop is a tracee's: one left seized when it did not stop in time for an injection
/// (`inject.rs`) stops when it can, and is let go here, its signal delivered. Exits that the
/// ptrace waits of an injection reaped count too.
fn reap(shared: &Shared, root: i32) -> Option<i32> {
    let mut root_status = None;
    while let Some((pid, st)) = sys::reap_any() {
        if let sys::TraceeState::Stopped { sig, event } = sys::decode_wait_status(st) {
            // (It did not stop in time because its way to the stop met a page of the
            // batch, most likely its rseq area: learnt now, left out of batches.)
            learn_rseq_of(shared, pid);
            let _ = sys::ptrace_detach(pid, if event == 0 { sig } else { 0 });
            continue;
        }
        if pid == root {
            root_status = Some(sys::shell_status(st));
        }
    }
    for (pid, st) in std::mem::take(&mut *shared.reaped.lock()) {
        if pid == root {
            root_status = Some(st);
        }
    }
    root_status
}

/// Retires the address spaces whose process exited.
fn retire_exited(shared: &Shared) {
    let mms: Vec<Arc<Mm>> = shared.mms.lock().clone();
    for m in &mms {
        // (Without a pidfd, which the daemon may have failed to open when it was out of
        // descriptors, the pid itself: the monitor reaps the tree, so a gone pid is gone.)
        let exited = match m.pidfd.lock().as_ref() {
            Some(p) => p.exited(),
            None => m.pid().is_some_and(sys::process_gone),
        };
        if exited {
            retire(shared, m);
        }
    }
}
