//! The composed daemon, tier by tier: zswap only, zswap in front of a swap file, a swap file
//! alone, and simulated pmem, each in front of real programs that check their data; and a
//! backing device that fails (injected EIO, a real ENOSPC on a full tmpfs) losing nothing.

use std::path::PathBuf;
use std::process::Command;

mod common;
use common::*;

/// A tier setup: its name and the daemon arguments that select it.
struct Setup {
    name: &'static str,
    args: Vec<String>,
    /// Expect pages in zswap.
    zswap: bool,
    /// Expect pages on the backing device.
    device: bool,
    _pmem: Option<TempFile>,
}

struct TempFile(PathBuf);
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn setups() -> Vec<Setup> {
    let pmem = std::env::temp_dir().join(format!("uffd-test-pmem-{}", std::process::id()));
    let _ = std::fs::remove_file(&pmem);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        Setup {
            name: "zswap",
            args: s(&["--backend", "none", "--zswap", "1G"]),
            zswap: true,
            device: false,
            _pmem: None,
        },
        Setup {
            // A pool far smaller than what is evicted: the shrinker writes back.
            name: "zswap+file",
            args: s(&["--backend", "file", "--zswap", "1M"]),
            zswap: true,
            device: true,
            _pmem: None,
        },
        Setup {
            name: "file",
            args: s(&["--backend", "file", "--zswap", "off"]),
            zswap: false,
            device: true,
            _pmem: None,
        },
        Setup {
            name: "pmem",
            args: vec![
                "--backend".into(),
                format!("pmem:{}", pmem.display()),
                "--swap-size".into(),
                "1G".into(),
                "--zswap".into(),
                "1M".into(),
            ],
            zswap: true,
            device: true,
            _pmem: Some(TempFile(pmem)),
        },
    ]
}

fn args_with<'a>(setup: &'a Setup, limit: &'a str) -> Vec<&'a str> {
    let mut v: Vec<&str> = vec!["--limit", limit];
    v.extend(setup.args.iter().map(String::as_str));
    v
}

/// The counters show each tier doing its part.
fn assert_tiers(run: &Run, setup: &Setup) {
    let (zin, zout) = (run.get("zswpin"), run.get("zswpout"));
    let device = run.get("pswpout");
    assert!(
        device >= run.get("zswpwb"),
        "pswpout counts zswap writeback too"
    );
    if setup.zswap {
        assert!(zout > 0 && zin > 0, "{}: zswap was not used", setup.name);
    } else {
        assert_eq!(zout, 0, "{}: zswap is off", setup.name);
    }
    if setup.device {
        assert!(device > 0, "{}: nothing reached the device", setup.name);
        assert!(
            run.get("pswpin") > 0,
            "{}: nothing was read from the device",
            setup.name
        );
    } else {
        assert_eq!(device, 0, "{}: there is no device", setup.name);
    }
    assert_eq!(run.get("backend_write_errors"), 0, "{}", setup.name);
    assert_eq!(run.get("writeback_errors"), 0, "{}", setup.name);
    // Encryption at rest is on by default: whatever reaches a device is sealed, and every
    // page read back authenticated.
    assert_eq!(
        run.stats["backend_encrypted"].as_bool(),
        Some(setup.device),
        "{}",
        setup.name
    );
    assert_eq!(run.get("backend_auth_failures"), 0, "{}", setup.name);
}

/// Fork (pages shared by parent and child in zswap and on the device), mremap, munmap and
/// MADV_DONTNEED over evicted pages, read(2) into evicted pages, in every setup.
#[test]
fn checker_in_every_setup() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let checker = checker();
    for setup in setups() {
        let run = run_with(&args_with(&setup, "8M"), setup.name, &[&checker, "all"]);
        assert_eq!(run.status, 0, "{}: the checker found bad pages", setup.name);
        assert!(run.stdout.contains("checker: ALL OK"), "{}", setup.name);
        assert_paged(&run, 32 << 20);
        assert_tiers(&run, &setup);
        assert!(run.get("fork_events") >= 1 && run.get("remap_events") >= 2);
        assert_eq!(
            run.get("swap_slots_in_use"),
            0,
            "{}: slots leaked",
            setup.name
        );
    }
}

#[test]
fn stress_ng_verify_in_every_setup() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("stress-ng") {
        return;
    }
    for setup in setups() {
        let run = run_with(
            &args_with(&setup, "64M"),
            setup.name,
            &[
                "stress-ng",
                "--vm",
                "2",
                "--vm-bytes",
                "192M",
                "--vm-method",
                "rand-set",
                "--verify",
                "--timeout",
                "6s",
            ],
        );
        let all = format!("{}{}", run.stdout, run.stderr);
        assert_eq!(run.status, 0, "{}: stress-ng failed", setup.name);
        assert!(all.contains("successful run completed"), "{}", setup.name);
        assert!(
            !all.contains("fail"),
            "{}: stress-ng reported a failure",
            setup.name
        );
        assert_paged(&run, 64 << 20);
        assert_tiers(&run, &setup);
    }
}

#[test]
fn python_in_every_setup() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("python3") {
        return;
    }
    let script = r#"
import sys
n = 600_000
d = {i: ("w%d-" % i) * 8 for i in range(n)}
l = [bytes([i % 251]) * 300 for i in range(n // 4)]
bad = sum(1 for i in range(n) if d[i] != ("w%d-" % i) * 8)
bad += sum(1 for i, b in enumerate(l) if b != bytes([i % 251]) * 300)
print("python: %d bad" % bad)
sys.exit(1 if bad else 0)
"#;
    let python = real_python();
    for setup in setups() {
        // (48 MiB: malloc's arenas fill a few MiB before the scanner registers them, the
        // slack assert_paged allows; ARCHITECTURE.md, accounting.)
        let run = run_with(
            &args_with(&setup, "48M"),
            setup.name,
            &[&python, "-c", script],
        );
        assert_eq!(run.status, 0, "{}", setup.name);
        assert!(
            run.stdout.contains("python: 0 bad"),
            "{}: python's data did not verify",
            setup.name
        );
        // (malloc fills a dict's table before the scanner registers it: ARCHITECTURE.md.)
        assert_paged_within(&run, 48 << 20, (48 << 20) / 4096 / 3);
        assert_tiers(&run, &setup);
    }
}

#[test]
fn redis_in_every_setup() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("redis-server") || !have("python3") {
        return;
    }
    for setup in setups() {
        // About 60 MiB of values under 24 MiB.
        let run = redis_under(&args_with(&setup, "24M"), setup.name, 30_000);
        assert_paged(&run, 24 << 20);
        assert_tiers(&run, &setup);
    }
}

/// A named swap file (`--backend file:PATH`) is removed on every exit the daemon controls:
/// the program's own exit (with encryption on, the default, and off: the stats say which),
/// a termination signal (forwarded to the program, which dies of it), and a program that
/// cannot be started after the file was made.
#[test]
fn named_swap_file_is_removed_on_every_exit() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let swap =
        TempFile(std::env::temp_dir().join(format!("uffd-test-named-swap-{}", std::process::id())));
    let _ = std::fs::remove_file(&swap.0);
    let backend = format!("file:{}", swap.0.display());
    for encrypt in ["on", "off"] {
        let run = run_with(
            &[
                "--limit",
                "16M",
                "--zswap",
                "off",
                "--backend",
                &backend,
                "--encrypt",
                encrypt,
            ],
            "named-swap",
            &[DAEMON, "workload", "--size", "40M"],
        );
        assert_eq!(
            run.status, 0,
            "encrypt {encrypt}: the workload found bad pages"
        );
        assert!(run.stdout.contains("0 bad pages"), "encrypt {encrypt}");
        assert!(
            run.get("pswpin") > 0,
            "encrypt {encrypt}: the device was not used"
        );
        assert_eq!(
            run.stats["backend_encrypted"].as_bool(),
            Some(encrypt == "on"),
            "{}",
            run.stats
        );
        assert_eq!(run.get("backend_auth_failures"), 0);
        assert!(!swap.0.exists(), "encrypt {encrypt}: the swap file is left");
    }
    // The program cannot be started: the daemon fails after making the file.
    let out = Command::new(DAEMON)
        .args(["run", "--limit", "16M", "--backend", &backend, "--"])
        .arg("/nonexistent/uffd-test-program")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("starting"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!swap.0.exists(), "left after a failed start");
    // SIGTERM to the daemon: forwarded to the program, which dies of it; the daemon exits.
    let mut daemon = daemon_with_its_swap_file(&backend, &swap.0);
    // SAFETY: kill(2) of our own child with a constant signal.
    assert_eq!(unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) }, 0);
    let status = daemon.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
    assert!(!swap.0.exists(), "left after SIGTERM");
    // SIGKILL: the daemon cannot clean up; the next daemon to start removes the file (noted in
    // the dead daemon's run directory) along with that directory.
    let mut daemon = daemon_with_its_swap_file(&backend, &swap.0);
    let dead = daemon.id();
    // SAFETY: kill(2) of our own child with a constant signal.
    assert_eq!(unsafe { libc::kill(dead as i32, libc::SIGKILL) }, 0);
    let _ = daemon.wait();
    assert!(
        swap.0.exists(),
        "the test needs the file left behind by SIGKILL"
    );
    let out = Command::new(DAEMON)
        .args(["run", "--limit", "16M", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        !swap.0.exists(),
        "the next daemon did not remove the dead one's swap file"
    );
    assert!(
        !uffd_daemon::run_base().join(dead.to_string()).exists(),
        "the dead daemon's run directory stayed"
    );
}

/// `uffd-daemon run --backend BACKEND -- sleep 60`, once it has made its swap file at `path`.
fn daemon_with_its_swap_file(backend: &str, path: &std::path::Path) -> std::process::Child {
    let daemon = Command::new(DAEMON)
        .args([
            "run",
            "--limit",
            "16M",
            "--backend",
            backend,
            "--",
            "sleep",
            "60",
        ])
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "the swap file never appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    daemon
}

fn write_config(name: &str, text: &str) -> TempFile {
    let p = std::env::temp_dir().join(format!("uffd-test-{name}-{}.toml", std::process::id()));
    std::fs::write(&p, text).unwrap();
    TempFile(p)
}

/// The fault path's two placement modes together (`[fault] realtime`, opt-in: SCHED_FIFO
/// handlers, as root; `spread`, on by default and set here explicitly: a handler moves off
/// its client's CPU): the data survives and the paging works as without them. (Whether
/// `spread` moves the handler depends on where the scheduler puts the client, so the count is
/// printed, not asserted; `sys::move_off_cpu` has its own test.)
#[test]
fn realtime_and_spread_lose_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let cfg = write_config(
        "fault-modes",
        "[zswap]
max_pool = \"64M\"\n[fault]\nrealtime = true\nspread = true\n",
    );
    let run = run_with(
        &["--limit", "16M", "--config", &cfg.0.to_string_lossy()],
        "fault-modes",
        &[DAEMON, "workload", "--size", "48M"],
    );
    assert_eq!(run.status, 0, "the workload found bad pages");
    assert!(run.stdout.contains("0 bad pages"), "{}", run.stdout);
    assert_paged(&run, 16 << 20);
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        assert!(
            run.get("realtime_handlers") >= 1,
            "root: handlers SCHED_FIFO"
        );
    }
    assert!(run.stats.get("handler_moves").is_some());
    eprintln!("handler_moves: {}", run.get("handler_moves"));
}

/// Writes to the device fail with EIO after a few MiB: evictions that need the device are
/// given up (pages stay resident), writeback failures leave pages in zswap; the program's
/// data is intact and the failure is in the counters and the log.
#[test]
fn failing_device_loses_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    for (name, zswap) in [("eio-direct", "off"), ("eio-writeback", "2M")] {
        let cfg = write_config(
            name,
            &format!(
                "[tiers]\nbackend = \"file\"\n[zswap]\nenabled = {}\nmax_pool = \"{}\"\n\
                 [test]\nfail_writes_after = \"4M\"\nfail_errno = \"EIO\"\n",
                zswap != "off",
                if zswap == "off" { "4M" } else { zswap }
            ),
        );
        let run = run_with(
            &["--limit", "16M", "--config", &cfg.0.to_string_lossy()],
            name,
            &[DAEMON, "workload", "--size", "40M"],
        );
        assert_eq!(run.status, 0, "{name}: the workload found bad pages");
        assert!(run.stdout.contains("0 bad pages"), "{name}");
        let errors = run.get("backend_write_errors") + run.get("writeback_errors");
        assert!(errors > 0, "{name}: the injected failure was not hit");
        assert!(
            run.stderr.contains("failed") && run.stderr.contains("Input/output error"),
            "{name}: the failure is not in the log: {}",
            run.stderr
        );
    }
}

/// The disk fails writes after they were accepted (asynchronous writeback): after 4 MiB every
/// wait for writeback reports EIO and the range reads back as garbage, as a write the disk lost
/// would. The pages it held stay in the daemon's memory and are served from there; new writes
/// pause; the program's data is intact, sealed or not.
#[test]
fn writes_the_disk_loses_after_accepting_them_lose_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    for encrypt in ["on", "off"] {
        let name = format!("lost-writeback-{encrypt}");
        let cfg = write_config(
            &name,
            "[tiers]\nbackend = \"file\"\n[zswap]\nenabled = false\n\
             [test]\nfail_writeback_after = \"4M\"\n",
        );
        let run = run_with(
            &[
                "--limit",
                "16M",
                "--encrypt",
                encrypt,
                "--config",
                &cfg.0.to_string_lossy(),
            ],
            &name,
            &[DAEMON, "workload", "--size", "48M"],
        );
        assert_eq!(run.status, 0, "{name}: {}\n{}", run.stdout, run.stderr);
        assert!(run.stdout.contains("0 bad pages"), "{name}: {}", run.stdout);
        assert!(
            run.get("file_writeback_errors") > 0,
            "{name}: the injected failure was not hit"
        );
        assert!(
            run.stderr.contains("kept in the daemon's memory"),
            "{name}: the failure is not in the log: {}",
            run.stderr
        );
        assert_eq!(run.get("backend_auth_failures"), 0, "{name}");
    }
}

/// A real disk that fails under the swap file's filesystem: ext4 on a loop device whose
/// backing file lives on a 24 MiB tmpfs, so that the disk's writes fail once the tmpfs is full
/// while the filesystem still thinks it has 230 MiB free. Writeback then reports errors, and
/// ext4 also loses writes it confirmed ("failed to convert unwritten extents to written extents
/// -- potential data loss": the range reads back as zeros). Writes in flight and the last ones
/// confirmed are kept in the daemon's memory and served from there: the program's data is
/// intact, sealed or not, and no page fails its check. (Without the copies of the confirmed
/// writes, 3 runs of 4 read a lost page back; each was stopped by its checksum or tag.)
#[test]
fn a_filesystem_on_a_failing_disk_loses_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uffd-test-loop-{}", std::process::id()));
    let (t, m) = (dir.join("t"), dir.join("m"));
    std::fs::create_dir_all(&t).unwrap();
    std::fs::create_dir_all(&m).unwrap();
    let sh = |cmd: &str| {
        let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    for encrypt in ["off", "on"] {
        sh(&format!("mount -t tmpfs -o size=24m tmpfs {}", t.display()));
        sh(&format!("truncate -s 256M {}/img", t.display()));
        let dev = sh(&format!("losetup -f --show {}/img", t.display()));
        sh(&format!("mkfs.ext4 -q -O ^has_journal {dev}"));
        sh(&format!("mount -o errors=continue {dev} {}", m.display()));
        let swap = m.join("swap");
        let run = run_with(
            &[
                "--limit",
                "16M",
                "--zswap",
                "off",
                "--encrypt",
                encrypt,
                "--backend",
                &format!("file:{}", swap.display()),
            ],
            &format!("failing-disk-{encrypt}"),
            &[DAEMON, "workload", "--size", "64M"],
        );
        let _ = Command::new("umount").arg(&m).status();
        let _ = Command::new("losetup").args(["-d", &dev]).status();
        let _ = Command::new("umount").arg(&t).status();
        assert_eq!(
            run.status, 0,
            "encrypt {encrypt}: {}\n{}",
            run.stdout, run.stderr
        );
        assert!(run.stdout.contains(" 0 bad pages"), "{}", run.stdout);
        assert!(
            run.get("file_writeback_errors") + run.get("backend_write_errors") > 0,
            "encrypt {encrypt}: the disk never failed: the test does not reach what it tests"
        );
        assert_eq!(run.get("backend_checksum_failures"), 0, "encrypt {encrypt}");
        assert_eq!(run.get("backend_auth_failures"), 0, "encrypt {encrypt}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A real ENOSPC: the swap file lives on a 4 MiB tmpfs.
#[test]
fn full_device_loses_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uffd-test-tmpfs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    assert!(mounted, "mounting a small tmpfs needs root (CI has it)");
    let swap = dir.join("swap");
    let run = run_with(
        &[
            "--limit",
            "16M",
            "--zswap",
            "off",
            "--backend",
            &format!("file:{}", swap.display()),
        ],
        "enospc",
        &[DAEMON, "workload", "--size", "40M"],
    );
    let _ = Command::new("umount").arg(&dir).status();
    let _ = std::fs::remove_dir(&dir);
    assert_eq!(run.status, 0, "the workload found bad pages");
    assert!(run.stdout.contains("0 bad pages"));
    assert!(
        run.get("backend_write_errors") > 0,
        "the device never filled"
    );
    assert!(
        run.stderr.contains("No space left on device"),
        "{}",
        run.stderr
    );
    assert!(run.get("evicted_pages") > 0, "what fit was evicted");
}

#[test]
fn bad_configuration_is_named() {
    let cfg = write_config("bad", "[zswap]\nmax_pol = \"4M\"\n");
    let out = Command::new(DAEMON)
        .args(["run", "--limit", "16M", "--config"])
        .arg(&cfg.0)
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("max_pol"), "{err}");
    let out = Command::new(DAEMON)
        .args([
            "run",
            "--limit",
            "16M",
            "--backend",
            "tape:/dev/st0",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("tape"));
}

/// Data at rest, end to end: a program's pages evicted to a named swap file, then the daemon
/// killed with SIGKILL (it cannot clean up, and the file stays behind): with encryption on (the
/// default) no copy of the program's text is in what is left; with it off the same search
/// finds thousands (the search works). The issue found 2.6 million copies of a token in such a
/// file.
#[test]
fn what_sigkill_leaves_behind_is_ciphertext() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    const MARKER: &[u8] = b"PLAINTEXT-OF-AN-EVICTED-PAGE";
    let script = "import time\n\
                  b = bytearray(b'PLAINTEXT-OF-AN-EVICTED-PAGE' * (48 << 20 >> 5))\n\
                  print('filled', flush=True)\n\
                  time.sleep(60)\n";
    for encrypt in ["on", "off"] {
        let (mut daemon, swap) = daemon_until_filled("kill9", encrypt, script);
        // SAFETY: kill(2) of our own child with a constant signal.
        assert_eq!(unsafe { libc::kill(daemon.id() as i32, libc::SIGKILL) }, 0);
        let _ = daemon.wait();
        let left = std::fs::read(&swap.0).expect("the file SIGKILL leaves behind");
        let copies = left.windows(MARKER.len()).filter(|w| *w == MARKER).count();
        eprintln!("encrypt {encrypt}: {copies} copies in {} bytes", left.len());
        if encrypt == "on" {
            assert_eq!(copies, 0, "plaintext in the file left behind");
        } else {
            assert!(copies > 1000, "the search found {copies}: it does not work");
        }
    }
}

/// Pages of `path` in the page cache (mincore over a shared read-only mapping of it).
fn cached_bytes(path: &std::path::Path) -> u64 {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    if len == 0 {
        return 0;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh read-only shared mapping of a file we opened, unmapped below; mincore
    // writes one byte per page into a vector of that many bytes.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let pages = len.div_ceil(4096);
        let mut vec = vec![0u8; pages];
        assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
        libc::munmap(p, len);
        vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * 4096
    }
}

/// The file tier frees what it evicts: evicted pages reach the disk and leave the page cache
/// (through the page cache alone, they stayed in RAM as the swap file's dirty pages: the limit
/// moved memory instead of freeing it). With encryption on the pages of tags stay, a 256th.
#[test]
fn the_swap_file_keeps_evicted_pages_out_of_the_page_cache() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let script = "import time\n\
                  b = bytearray(b'x' * (48 << 20))\n\
                  for i in range(0, len(b), 4096): b[i] = i // 4096 % 251\n\
                  print('filled', flush=True)\n\
                  time.sleep(60)\n";
    for encrypt in ["on", "off"] {
        let (mut daemon, swap) = daemon_until_filled("uncached", encrypt, script);
        // Writeback is asynchronous: the last writes (32 MiB in flight at most) leave the
        // page cache once the disk has them. The program sleeps meanwhile; nothing is written.
        let mut cached = cached_bytes(&swap.0);
        for _ in 0..100 {
            if cached < (32 << 20) / 20 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            cached = cached_bytes(&swap.0);
        }
        // SAFETY: kill(2) of our own child with a constant signal.
        assert_eq!(unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) }, 0);
        let _ = daemon.wait();
        eprintln!("encrypt {encrypt}: {cached} bytes of the swap file cached");
        // At least 32 MiB were evicted: 5% of it.
        assert!(
            cached < (32 << 20) / 20,
            "encrypt {encrypt}: {cached} bytes of the swap file in the page cache"
        );
    }
}

/// Starts `python3 -c SCRIPT` under the daemon (limit 16M, no zswap, encryption `encrypt`, a
/// named swap file) and returns once the script has printed `filled`: the daemon and its
/// swap file.
fn daemon_until_filled(name: &str, encrypt: &str, script: &str) -> (std::process::Child, TempFile) {
    let swap = TempFile(
        std::env::temp_dir().join(format!("uffd-test-{name}-{encrypt}-{}", std::process::id())),
    );
    let _ = std::fs::remove_file(&swap.0);
    let mut daemon = Command::new(DAEMON)
        .args([
            "run",
            "--limit",
            "16M",
            "--zswap",
            "off",
            "--encrypt",
            encrypt,
        ])
        .arg("--backend")
        .arg(format!("file:{}", swap.0.display()))
        .args(["--", "python3", "-c", script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(daemon.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "filled", "encrypt {encrypt}");
    (daemon, swap)
}

/// 32 threads read and write their own pages at random on the swap file alone, and throw pages
/// away with `MADV_DONTNEED` meanwhile: faults waiting on the disk together are read together
/// (`fault/prefetch.rs`), and a page read for a fault is never handed to another fault after a
/// removal, a rewrite or a new eviction of its address. Every word of every page is checked on
/// each visit and at the end.
#[test]
fn threads_faulting_on_the_swap_file_together_lose_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("cc") {
        return;
    }
    let prog = c_client("stripes_dontneed").to_string_lossy().into_owned();
    // 96 MiB under 32M (a third), 32 threads: more threads than CPUs, most pages on the disk.
    let run = run_with(
        &["--limit", "32M", "--zswap", "off", "--backend", "file"],
        "stripes-dontneed",
        &[&prog, "96", "32", "8000"],
    );
    assert_eq!(run.status, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains(" 0 bad words"), "{}", run.stdout);
    assert!(run.get("pswpin") > 0 && run.get("pswpout") > 0);
    assert!(
        run.get("backend_batch_reads_used") > 0,
        "no faults were read together: the test does not reach what it tests"
    );
    assert_eq!(run.get("backend_auth_failures"), 0);
    assert_eq!(run.get("file_writeback_errors"), 0);
}
