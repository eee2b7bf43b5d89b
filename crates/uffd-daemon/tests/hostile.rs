//! A hostile client inside the tree: it may send anything on the agent socket. Nothing it
//! sends may reach another client's memory or stop the daemon from serving the others.

mod common;
use common::*;

/// Greetings carrying descriptors that are not userfaultfds (a pipe, /dev/null: the daemon used
/// to wrap any descriptor, and a pipe's contents were then trusted as uffd events, a forged fork
/// event naming another client's uffd), and a flood of connections that never greet. Each
/// greeting is refused with an error that names the problem; the half greetings hold no more
/// than a bounded number of the daemon's threads; the bystander pages and reads back every
/// byte of its memory.
#[test]
fn bad_descriptors_and_half_greetings_hurt_no_one() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("python3") {
        return;
    }
    let script = r#"
import array, mmap, os, socket, struct, time
path = os.environ["UFFD_DAEMON_SOCK"]
daemon = int(os.environ["UFFD_DAEMON_PID"])
region = mmap.mmap(-1, 4 << 20)
base = struct.unpack("<Q", struct.pack("<q", id(region)))[0]  # any address: only checked for shape
base = (base + 0xfffff) & ~0xfff
def hello(fd):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    payload = struct.pack("<IIIIQQQQQI", os.getpid(), os.getppid(), 0, 0, 0xffffffff,
                          base, 4 << 20, base, base + 4096, 512) + b"\0" * 4
    head = struct.pack("<IHHII", 0x41444655, 1, 1, len(payload), 1)
    s.sendmsg([head + payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    reply = s.recv(65536)
    s.close()
    magic, version, kind, plen, seq = struct.unpack("<IHHII", reply[:16])
    assert kind == 5, "expected an ERROR, got kind %d" % kind
    return reply[20:].decode()
def hello_fork():
    # A fork child's greeting (flag 1) from a process whose agent has already greeted: it
    # would have taken the agent's place.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    payload = struct.pack("<IIIIQQQQQI", os.getpid(), os.getppid(), 1, 0, 0xffffffff,
                          base, 4 << 20, base, base + 4096, 512) + b"\0" * 4
    s.send(struct.pack("<IHHII", 0x41444655, 1, 1, len(payload), 1) + payload)
    reply = s.recv(65536)
    s.close()
    assert struct.unpack("<IHHII", reply[:16])[2] == 5, "a second greeting was accepted"
    return reply[20:].decode()
print("again:", hello_fork())
r, w = os.pipe()
# A forged fork event (uffd_msg: event 0x13, the descriptor number 3) waiting in the pipe.
os.write(w, struct.pack("<BBHI", 0x13, 0, 0, 0) + struct.pack("<I", 3) + b"\0" * 20)
print("pipe:", hello(r))
null = os.open("/dev/null", os.O_RDWR)
print("null:", hello(null))
def threads():
    with open("/proc/%d/status" % daemon) as f:
        return int([l for l in f if l.startswith("Threads:")][0].split()[1])
before = threads()
half = []
for _ in range(200):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.setblocking(False)
    try:
        s.connect(path)
    except BlockingIOError:
        pass
    half.append(s)
time.sleep(0.3)
print("daemon threads: %d before, %d with 200 half greetings" % (before, threads()))
data = bytearray(48 << 20)
for i in range(0, len(data), 512):
    data[i] = (i // 512) % 251
bad = sum(1 for i in range(0, len(data), 512) if data[i] != (i // 512) % 251)
print("bystander: %d bad bytes" % bad)
for s in half:
    s.close()
# A connection that never greets is told why it is dropped, not reset.
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(path)
s.settimeout(20)
t0 = time.time()
reply = s.recv(65536)
s.close()
kind = struct.unpack("<IHHII", reply[:16])[2] if len(reply) >= 16 else -1
print("silent: kind %d after %.1f s: %s" % (kind, time.time() - t0, reply[20:].decode()))
"#;
    let run = run_under("12M", "hostile", &["python3", "-c", script]);
    assert_eq!(run.status, 0, "the hostile client's own checks failed");
    assert!(
        run.stdout
            .contains("pipe: the HELLO's descriptor is not a userfaultfd"),
        "{}",
        run.stdout
    );
    assert!(run
        .stdout
        .contains("null: the HELLO's descriptor is not a userfaultfd"));
    assert!(run.stdout.contains("bystander: 0 bad bytes"));
    assert!(
        run.stdout
            .contains("again: this process already has an agent connection"),
        "{}",
        run.stdout
    );
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("daemon threads:"))
        .expect("thread count");
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        nums[1] <= nums[0] + 40,
        "half greetings took a thread each: {line}"
    );
    assert!(run.get("protocol_errors") >= 3);
    assert!(run.get("evicted_pages") > 0 && run.get("swapins") > 0);
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("silent: kind 5 after")
                && l.ends_with("s: no greeting within 2000 ms of connecting")),
        "{}",
        run.stdout
    );
    assert!(run.get("greeting_timeouts") >= 1);
}

/// The daemon out of descriptors (its limit lowered, a tree of many processes): it keeps
/// accepting (an accept error used to end accepting for good, and every later fork or exec in
/// the tree hung in its greeting), processes it cannot serve run unmanaged and say so, and
/// every process of the tree finishes.
#[test]
fn out_of_descriptors_nothing_hangs() {
    use std::os::unix::process::CommandExt;
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("python3") {
        return;
    }
    let script = r#"
import subprocess
procs = [subprocess.Popen(["sleep", "1"]) for _ in range(24)]
for p in procs:
    p.wait()
print("done", [p.returncode for p in procs].count(0))
"#;
    let path = stats_path("nofile");
    let python = real_python();
    let mut cmd = daemon_command(&["--limit", "64M"], &path, &[&python, "-c", script]);
    // SAFETY: setrlimit in the child before exec; no allocation, no lock.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 48,
                rlim_max: 48,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let done = Bounded::spawn(cmd, "nofile").wait(std::time::Duration::from_secs(120));
    let run = finish_run("nofile", done, &path);
    assert!(!run.timed_out, "the tree hung: {}", run.hung_in);
    assert_eq!(run.status, 0);
    assert!(run.stdout.contains("done 24"), "{}", run.stdout);
    assert!(
        run.stderr.contains("out of descriptors") || run.get("accept_errors") > 0,
        "the test did not run the daemon out of descriptors"
    );
}

/// Sizes and paths that cannot work are refused before the program starts, by name; a swap
/// space that fills up is said once and retried with a pause (it was retried in a loop: 350k
/// failed writes in 10 s), and the program's data stays whole.
#[test]
fn bad_sizes_are_refused_and_a_full_swap_space_backs_off() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    for (args, needle) in [
        (&["--swap-size", "4K"][..], "at least 4M"),
        (&["--swap-size", "0"][..], "at least 4M"),
        (&["--swap-size", "99999T"][..], "16T"),
        (
            &["--stats-json", "/proc/none/x.json"][..],
            "cannot be written",
        ),
    ] {
        let out = std::process::Command::new(DAEMON)
            .args(["run", "--limit", "8M"])
            .args(args)
            .args(["--", "true"])
            .output()
            .expect("uffd-daemon");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let exe = c_client("lifecycle").to_string_lossy().into_owned();
    let run = run_with(
        &["--limit", "8M", "--zswap", "off", "--swap-size", "4M"],
        "swap-full",
        &[&exe, "inner", "48"],
    );
    assert_eq!(run.status, 0, "wrong data");
    assert!(run.stdout.contains("inner: 48 MiB, 0 bad words"));
    assert!(run.stderr.contains("the swap space is full"), "not said");
    assert_eq!(
        run.stderr.matches("the swap space is full").count(),
        1,
        "said more than once"
    );
    assert!(run.get("store_stalls") >= 1);
    assert!(run.get("store_refused_full_pages") > 0);
    assert!(
        run.stderr.contains("smaller than the limit"),
        "a swap space below the limit not warned about at start: {}",
        run.stderr
    );
    assert!(
        run.get("backend_errors") < 20_000,
        "no back-off: {} failed stores",
        run.get("backend_errors")
    );
}

/// Without a backing device, pages that do not compress and pages beyond a full pool cannot
/// leave memory: said at start, said once per cause while running with what to change,
/// counted by cause, and the program's data stays whole (it was counted only as
/// `store_refused`, with nothing said unless a whole batch failed).
#[test]
fn no_backend_refusals_are_said_and_counted_by_cause() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    // 48 MiB, random (no compressor takes it) or a compressible pattern that a pool of 1 MiB
    // cannot hold; every chunk's digest checked three times.
    let script = r#"
import os, sys, hashlib
chunks = []
for i in range(48):
    c = os.urandom(1 << 20) if sys.argv[1] == 'random' else (b'%08d' % i) * (1 << 17)
    chunks.append((c, hashlib.sha256(c).digest()))
for r in range(3):
    for c, d in chunks:
        assert hashlib.sha256(c).digest() == d
print('checked', len(chunks))
"#;
    for (data, pool, counter, needle) in [
        (
            "random",
            "64M",
            "store_refused_incompressible_pages",
            "compresses poorly",
        ),
        ("pattern", "1M", "store_refused_pool_pages", "pool holds"),
    ] {
        let run = run_with(
            &["--limit", "16M", "--backend", "none", "--zswap", pool],
            "no-backend",
            &["python3", "-c", script, data],
        );
        assert_eq!(run.status, 0, "{}", run.stderr);
        assert!(run.stdout.contains("checked 48"), "{}", run.stdout);
        assert!(
            run.stderr.contains("no backing device (--backend none)"),
            "not warned at start: {}",
            run.stderr
        );
        assert!(
            run.get(counter) > 0,
            "{counter} not counted: {}",
            run.stderr
        );
        assert_eq!(
            run.stderr.matches(needle).count(),
            1,
            "{needle:?} not said exactly once: {}",
            run.stderr
        );
    }
}
