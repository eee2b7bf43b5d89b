//! The daemon in front of real programs. Every test checks the data, not only the exit code,
//! and that paging really happened (the counters).
//!
//! These need `/dev/userfaultfd` or root (kernel-mode faults, EVENT_FORK). CI has both; the
//! tests skip with a printed reason only where neither exists.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::*;

#[test]
fn demo_workload_verifies_every_page() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = run_under("16M", "demo", &[DAEMON, "workload", "--size", "64M"]);
    assert_eq!(run.status, 0, "the workload found bad pages");
    assert!(run.stdout.contains("0 bad pages"));
    assert_paged(&run, 16 << 20);
    assert!(run.get("swapins") > 0);
}

#[test]
fn checker_fork_mremap_munmap_madvise() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let checker = checker();
    let run = run_under("8M", "checker", &[&checker, "all"]);
    assert_eq!(run.status, 0, "the checker found bad pages");
    assert!(run.stdout.contains("checker: ALL OK"));
    assert!(!run.stdout.contains("MISMATCH"));
    assert!(run.stdout.contains("checker: OK mremap grow in place"));
    assert_paged(&run, 32 << 20); // a forked child's copy-on-write pages count in both
    assert!(run.get("swapins") > 0);
    assert!(run.get("fork_events") >= 1, "the fork was not seen");
    assert!(
        run.get("remap_events") >= 2,
        "the move and the grow that had to move were not both seen"
    );
    assert!(run.get("unmap_events") >= 1);
    assert!(run.get("remove_events") >= 1, "MADV_DONTNEED was not seen");
    assert!(
        run.get("readahead_pages") > 0,
        "no readahead run was restored"
    );
    assert_eq!(run.get("processes"), 2, "parent and forked child");
}

#[test]
fn stress_ng_vm_verify() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("stress-ng") {
        return;
    }
    let run = run_under(
        "64M",
        "stress-ng",
        &[
            "stress-ng",
            "--vm",
            "2",
            "--vm-bytes",
            "256M",
            "--vm-method",
            "rand-set",
            "--verify",
            "--timeout",
            "10s",
        ],
    );
    assert_eq!(run.status, 0, "stress-ng failed");
    let all = format!("{}{}", run.stdout, run.stderr);
    assert!(
        all.contains("successful run completed"),
        "stress-ng did not complete successfully"
    );
    assert!(!all.contains("fail"), "stress-ng reported a failure");
    assert_paged(&run, 64 << 20);
    assert!(run.get("swapins") > 0);
    assert!(
        run.get("fork_events") >= 2,
        "stress-ng's workers are forked children"
    );
    assert!(run.get("processes") >= 3);
    // stress-ng's processes hold more anonymous memory the daemon does not manage (stack,
    // libraries' copy-on-write data) than the scanner's margin: that must not make it read
    // their maps on every tick (it did, 1000 times a second). The periodic scan is one per
    // process per 100 ms or so; memory mapped later adds a few.
    let secs = run.stats["elapsed_s"].as_f64().unwrap_or(0.0).ceil() as u64 + 1;
    let bound = 20 * run.get("processes") * secs + 50;
    assert!(
        run.get("maps_scans") <= bound,
        "{} maps scans in {secs} s for {} processes (at most {bound})",
        run.get("maps_scans"),
        run.get("processes")
    );
}

#[test]
fn python_dict_under_a_quarter_of_its_size() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("python3") {
        return;
    }
    // About 200 MiB of dict and strings, under 48 MiB.
    let script = r#"
import random, sys
n = 1_000_000
d = {}
for i in range(n):
    d[i] = ("v%d-" % i) * 8
bad = sum(1 for i in range(n) if d[i] != ("v%d-" % i) * 8)
r = random.Random(1)
for _ in range(n // 50):
    i = r.randrange(n)
    if d[i] != ("v%d-" % i) * 8:
        bad += 1
print("python dict: %d entries, %d bad" % (len(d), bad))
sys.exit(1 if bad or len(d) != n else 0)
"#;
    // The interpreter itself, not a version manager's shell shim: the shim's forks of a shell
    // would count their copy-on-write pages twice (see ARCHITECTURE.md, accounting).
    let real = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    let python = String::from_utf8_lossy(&real.stdout).trim().to_string();
    let run = run_under("48M", "python", &[&python, "-c", script]);
    assert_eq!(run.status, 0);
    assert!(
        run.stdout.contains("1000000 entries, 0 bad"),
        "python's data did not verify"
    );
    // A python dict's table is allocated by malloc's internal mmap and filled at once: it is
    // resident before the scanner registers it (ARCHITECTURE.md, accounting). Seen up to a
    // third above the limit for a moment, then reclaimed.
    assert_paged_within(&run, 48 << 20, (48 << 20) / 4096 / 3);
    assert!(run.get("swapins") > 0);
}

#[test]
fn exit_status_is_the_programs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let run = run_under("16M", "exit", &["sh", "-c", "exit 7"]);
    assert_eq!(run.status, 7);
    let run = run_under("16M", "signal", &["sh", "-c", "kill -TERM $$"]);
    assert_eq!(run.status, 128 + 15);
}

/// Waits for a line starting with `prefix` on a child's stdout.
fn wait_line(r: &mut impl BufRead, prefix: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).expect("reading the client's output") == 0 {
            panic!("the client ended before printing {prefix:?}");
        }
        if line.starts_with(prefix) {
            return line;
        }
    }
}

#[test]
fn client_stops_when_the_daemon_dies() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let checker = checker();
    let mut daemon = Command::new(DAEMON)
        .args(["run", "--limit", "8M", "--", &checker, "hold"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the daemon");
    let mut out = BufReader::new(daemon.stdout.take().expect("stdout"));
    let ready = wait_line(&mut out, "READY ");
    let client: i32 = ready.trim()["READY ".len()..].parse().expect("client pid");
    wait_line(&mut out, "round 1:"); // pages have been evicted and read back at least once
                                     // SAFETY: kill(2) of the daemon we started.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGKILL) };
    let _ = daemon.wait();
    // The client must stop by itself, with a clear message, and never report bad data.
    let mut rest = String::new();
    let mut err = String::new();
    let _ = out.read_to_string(&mut rest);
    let _ = daemon
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err);
    eprintln!("client stdout after the kill:\n{rest}\nstderr:\n{err}");
    assert!(!rest.contains("MISMATCH"), "the client saw bad data");
    assert!(
        rest.lines()
            .filter(|l| l.starts_with("round"))
            .all(|l| l.ends_with(" 0 bad pages")),
        "the client saw bad data"
    );
    assert!(
        err.contains("the uffd-daemon serving this process died"),
        "no clear message from the client"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{client}")).exists() && Instant::now() < deadline {
        // It may linger as a zombie of init for a moment.
        let stat = std::fs::read_to_string(format!("/proc/{client}/stat")).unwrap_or_default();
        if stat.contains(") Z ") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stat = std::fs::read_to_string(format!("/proc/{client}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z "),
        "the client is still running: {stat}"
    );
}

/// `uffd-daemon stat` with a daemon stopped (SIGSTOP, a debugger): that daemon is skipped with a
/// word after a bounded wait, not waited for (stat used to hang while any daemon was stopped).
#[test]
fn stat_skips_a_stopped_daemon() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let mut daemon = Command::new(DAEMON)
        .args(["run", "--limit", "16M", "--", "sleep", "30"])
        .spawn()
        .expect("starting the daemon");
    let pid = daemon.id();
    let dir = uffd_daemon::default_run_base().join(pid.to_string());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dir.join("ctl.sock").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: kill(2) with integer arguments, to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    let started = Instant::now();
    let mut stat = Command::new(DAEMON)
        .args(["stat", "--pid", &pid.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("uffd-daemon stat");
    let mut finished = None;
    while started.elapsed() < Duration::from_secs(20) {
        if let Some(st) = stat.try_wait().expect("waiting for stat") {
            finished = Some(st);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = started.elapsed();
    if finished.is_none() {
        let _ = stat.kill();
    }
    let out = stat.wait_with_output().expect("stat's output");
    // SAFETY: as above; then the daemon's program is ended and the daemon reaped.
    unsafe {
        libc::kill(pid as i32, libc::SIGCONT);
        libc::kill(pid as i32, libc::SIGTERM);
    }
    let _ = daemon.wait();
    assert!(
        finished.is_some(),
        "stat hung on a stopped daemon for {took:?}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did not answer"), "stat said: {err}");
    assert!(took < Duration::from_secs(10), "stat took {took:?}");
}

#[test]
fn stat_reports_a_running_daemon_and_strangers_are_refused() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let swap = std::env::temp_dir().join(format!("uffd-test-swap-{}", std::process::id()));
    let _ = std::fs::remove_file(&swap);
    let mut daemon = Command::new(DAEMON)
        .args(["run", "--limit", "16M", "--swap-file"])
        .arg(&swap)
        .args(["--", "sleep", "3"])
        .spawn()
        .expect("starting the daemon");
    let pid = daemon.id();
    let dir = uffd_daemon::default_run_base().join(pid.to_string());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dir.join("ctl.sock").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    // The swap file exists while the daemon runs, readable by its owner only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&swap)
        .expect("the swap file exists while the daemon runs")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the swap file must be private");
    // So is the control socket (counters), in a directory of the daemon's own.
    let ctl = std::fs::symlink_metadata(dir.join("ctl.sock")).expect("ctl.sock");
    assert_eq!(
        ctl.permissions().mode() & 0o777,
        0o600,
        "ctl.sock must be 0600"
    );
    let out = Command::new(DAEMON)
        .args(["stat", "--pid", &pid.to_string()])
        .output()
        .expect("uffd-daemon stat");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stat failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(text.trim()).expect("stat prints JSON");
    assert!(v["stats"]["processes"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert!(v["stats"].get("faults").is_some());
    // As root (CI, this machine): idle CPUs are kept polling through the kernel (`[fault]
    // idle_poll`, on by default); the handlers are real-time only if asked (`realtime`).
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(v["stats"]["idle_poll"], "kernel", "{v}");
    }
    assert_eq!(v["stats"]["realtime_handlers"].as_u64(), Some(0), "{v}");
    // The same counters in the Prometheus text format.
    let out = Command::new(DAEMON)
        .args(["stat", "--prometheus", "--pid", &pid.to_string()])
        .output()
        .expect("uffd-daemon stat --prometheus");
    let prom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let faults = format!("uffd_daemon_faults_total{{daemon_pid=\"{pid}\"}} ");
    assert!(
        prom.contains("# TYPE uffd_daemon_faults_total counter"),
        "{prom}"
    );
    assert!(prom.contains(&faults), "{prom}");
    assert!(
        prom.contains("# TYPE uffd_daemon_resident_pages gauge"),
        "{prom}"
    );

    // A process this daemon did not start is refused, whatever it sends.
    // (std has no SOCK_SEQPACKET: plain libc.)
    // SAFETY: plain socket calls on a fresh descriptor with a valid sockaddr_un.
    unsafe {
        let s = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
        assert!(s >= 0);
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let p = dir.join("agent.sock");
        for (d, b) in addr.sun_path.iter_mut().zip(p.to_string_lossy().as_bytes()) {
            *d = *b as libc::c_char;
        }
        let rc = libc::connect(
            s,
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as u32,
        );
        assert_eq!(rc, 0, "connecting to the agent socket");
        let junk = [0x55u8; 40];
        libc::send(s, junk.as_ptr().cast(), junk.len(), libc::MSG_NOSIGNAL);
        let mut buf = [0u8; 4096];
        let n = libc::recv(s, buf.as_mut_ptr().cast(), buf.len(), 0);
        assert!(n > 0, "expected an error message before the close");
        let reply = uffd_daemon::protocol::decode(&buf[..n as usize]).expect("a well-formed reply");
        match reply.0 {
            uffd_daemon::protocol::Message::Error { message, .. } => assert!(
                message.contains("only the processes it started"),
                "{message}"
            ),
            other => panic!("expected an ERROR, got {other:?}"),
        }
        let n = libc::recv(s, buf.as_mut_ptr().cast(), buf.len(), 0);
        assert_eq!(n, 0, "the daemon closes the connection");
        libc::close(s);
    }
    assert!(daemon.wait().expect("daemon").success());
    assert!(!swap.exists(), "the swap file is removed at exit");
    // An existing file is never overwritten.
    std::fs::write(&swap, b"precious").expect("writing a file");
    let out = Command::new(DAEMON)
        .args(["run", "--limit", "16M", "--swap-file"])
        .arg(&swap)
        .args(["--", "true"])
        .output()
        .expect("daemon");
    assert!(
        !out.status.success(),
        "the daemon must refuse an existing swap file"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("creating the swap file")
            && String::from_utf8_lossy(&out.stderr).contains("File exists"),
        "a clear error"
    );
    assert_eq!(std::fs::read(&swap).expect("file"), b"precious");
    let _ = std::fs::remove_file(&swap);
}

#[test]
fn redis_server_every_key_read_back() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("redis-server") || !have("python3") {
        return;
    }
    // About 100 MiB of values under a 32 MiB limit.
    let run = redis_under(&["--limit", "32M"], "redis", 50_000);
    assert_paged(&run, 32 << 20);
    assert!(run.get("swapins") > 0);
}

#[test]
fn malformed_messages_from_a_client_get_an_error_and_a_close() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("python3") {
        return;
    }
    // A managed process (in the daemon's tree) speaking garbage on the agent socket: each
    // connection gets an ERROR naming the problem and is closed; the daemon keeps serving.
    let script = r#"
import os, socket, struct, sys
path = os.environ["UFFD_DAEMON_SOCK"]
def attempt(payload):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    s.send(payload)
    reply = s.recv(65536)
    rest = s.recv(65536)
    s.close()
    magic, version, kind, plen, seq = struct.unpack("<IHHII", reply[:16])
    assert kind == 5, "expected an ERROR, got kind %d" % kind
    assert rest == b"", "the daemon must close the connection"
    return reply[20:].decode()
msgs = [
    attempt(b"\x55" * 40),                                             # bad magic
    attempt(struct.pack("<IHHII", 0x41444655, 9, 1, 0, 0)),            # bad version
    attempt(struct.pack("<IHHII", 0x41444655, 1, 1, 999, 0)),          # length lies
    attempt(struct.pack("<IHHII", 0x41444655, 1, 77, 0, 0)),           # unknown kind
    attempt(struct.pack("<IHHII", 0x41444655, 1, 3, 8, 0) + struct.pack("<II", 0, 0)),  # not a HELLO
    attempt(struct.pack("<IHHII", 0x41444655, 1, 1, 69984, 0) + b"\x00" * 69984),  # oversized
]
for m in msgs:
    print("refused:", m)
data = bytearray(64 << 20)       # and the daemon still pages this process
for i in range(0, len(data), 4096):
    data[i] = i % 251
assert all(data[i] == i % 251 for i in range(0, len(data), 4096))
print("still served")
"#;
    let run = run_under("16M", "malformed", &["python3", "-c", script]);
    assert_eq!(run.status, 0, "the client's checks failed");
    for needle in [
        "bad magic",
        "unsupported protocol version",
        "payload bytes",
        "unknown message kind",
        "expected HELLO",
        "still served",
    ] {
        assert!(
            run.stdout.contains(needle),
            "missing {needle:?} in the replies"
        );
    }
    assert!(run.get("protocol_errors") >= 5);
    assert!(run.get("evicted_pages") > 0);
}

/// A client in a pid namespace below the daemon's (`unshare -pf`): its agent knows the daemon
/// by the pidfd the daemon handed it with its greeting's answer, not by the daemon's pid, which
/// names nothing there (or another process). It pages, then stops by itself with the message
/// when the daemon dies. Before the fix its watchdog looked the daemon up by number, found
/// none (ESRCH) and ended the process at once with exit 86, before the program ran.
#[test]
fn a_client_in_a_pid_namespace_stops_when_the_daemon_dies() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("unshare") {
        return;
    }
    let checker = checker();
    let mut daemon = Command::new(DAEMON)
        .args([
            "run", "--limit", "8M", "--", "unshare", "-pf", &checker, "hold",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the daemon");
    let mut out = BufReader::new(daemon.stdout.take().expect("stdout"));
    let ready = wait_line(&mut out, "READY ");
    // Its own number there: the namespace's first process.
    assert_eq!(ready.trim(), "READY 1");
    wait_line(&mut out, "round 1:"); // pages have been evicted and read back at least once
                                     // SAFETY: kill(2) of the daemon we started.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGKILL) };
    let _ = daemon.wait();
    // The client must stop by itself (its output pipe closes), with a clear message.
    let mut err_pipe = daemon.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let mut err = String::new();
        let _ = out.read_to_string(&mut rest);
        let _ = err_pipe.read_to_string(&mut err);
        let _ = tx.send((rest, err));
    });
    let (rest, err) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the client in the pid namespace went on running after its daemon died");
    eprintln!("client stdout after the kill:\n{rest}\nstderr:\n{err}");
    assert!(
        rest.lines()
            .filter(|l| l.starts_with("round"))
            .all(|l| l.ends_with(" 0 bad pages")),
        "the client saw bad data"
    );
    assert!(
        err.contains("uffd-agent[1]: the uffd-daemon serving this process died"),
        "no clear message from the client"
    );
}
