//! What the daemon's integration tests share: running the daemon in front of a program and
//! reading its counters.
#![allow(dead_code)] // each test binary uses part of it

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;

pub const DAEMON: &str = env!("CARGO_BIN_EXE_uffd-daemon");
pub const CHECKER: &str = env!("CARGO_BIN_EXE_uffd-checker");

/// One daemon at a time: the machine has two cores and the tests measure nothing.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn can_run() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
        .is_ok();
    if !root && !dev {
        eprintln!("SKIP: needs root or read/write access to /dev/userfaultfd");
    }
    root || dev
}

pub fn have(program: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        eprintln!("SKIP: {program} is not installed (.ci/run installs it)");
    }
    found
}

pub fn stats_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("uffd-test-{name}-{}.json", std::process::id()))
}

pub struct Run {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
    pub stats: serde_json::Value,
}

impl Run {
    pub fn get(&self, key: &str) -> u64 {
        self.stats[key]
            .as_u64()
            .unwrap_or_else(|| panic!("stats lack {key}: {}", self.stats))
    }
}

pub fn run_under(limit: &str, name: &str, program: &[&str]) -> Run {
    run_with(&["--limit", limit], name, program)
}

/// Runs `program` under `uffd-daemon run ARGS`.
pub fn run_with(args: &[&str], name: &str, program: &[&str]) -> Run {
    let path = stats_path(name);
    let _ = std::fs::remove_file(&path);
    let out = Command::new(DAEMON)
        .arg("run")
        .args(args)
        .arg("--stats-json")
        .arg(&path)
        .arg("--")
        .args(program)
        .output()
        .expect("running uffd-daemon");
    let stats = std::fs::read_to_string(&path)
        .map(|s| serde_json::from_str(&s).expect("stats JSON"))
        .unwrap_or(serde_json::Value::Null);
    let _ = std::fs::remove_file(&path);
    let run = Run {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        stats,
    };
    eprintln!(
        "--- {name}: status {}\nstdout:\n{}\nstderr:\n{}\nstats: {}",
        run.status, run.stdout, run.stderr, run.stats
    );
    run
}

pub fn assert_paged(run: &Run, limit_bytes: u64) {
    let limit_pages = limit_bytes / 4096;
    assert_paged_within(run, limit_bytes, limit_pages / 6 + 64);
}

/// The daemon's own count of its metadata: the parts add up, and the whole stays a small
/// fraction of the managed memory (a loose guard: 3% of it plus 4 MiB of fixed parts; measured
/// 0.6-1.5% on the comparison workloads, ARCHITECTURE.md, metadata).
pub fn assert_metadata(run: &Run) {
    let total = run.get("daemon_metadata_max_bytes");
    let managed = run.get("daemon_metadata_managed_pages");
    assert!(total > 0 && managed > 0, "no metadata sample");
    let parts: u64 = ["pagetable", "policy", "slots", "zswap"]
        .iter()
        .map(|p| run.get(&format!("daemon_metadata_{p}_bytes")))
        .sum();
    assert_eq!(parts, total, "the metadata parts do not add up");
    let bound = managed * 4096 * 3 / 100 + (4 << 20);
    assert!(
        total <= bound,
        "metadata {total} bytes for {managed} managed pages (bound {bound})"
    );
}

/// Every agent thread named itself, none of them touched memory the daemon manages (such a
/// fault can wait for the reclaim that waits for the agent), and every DROP was answered.
pub fn assert_agents(run: &Run) {
    assert!(
        run.get("agent_threads") >= 1,
        "no agent thread named itself"
    );
    assert_eq!(
        run.get("agent_faults"),
        0,
        "an agent thread faulted on managed memory"
    );
    assert_eq!(
        run.get("drop_timeouts"),
        0,
        "an agent did not answer a DROP"
    );
    assert_eq!(
        run.get("agents_lost"),
        0,
        "an agent's connection failed while its process lived on"
    );
}

/// Builds `tests/clients/NAME.c` with the system C compiler (once per test binary run) and
/// returns the executable's path.
pub fn c_client(name: &str) -> PathBuf {
    c_client_with(name, "")
}

/// [`c_client`] linked statically (`gcc -static`): a program the agent cannot load into.
pub fn c_client_static(name: &str) -> PathBuf {
    c_client_with(name, "-static")
}

fn c_client_with(name: &str, flag: &str) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(format!("{name}.c"));
    let out = std::env::temp_dir().join(format!(
        "uffd-test-client-{name}{flag}-{}",
        std::process::id()
    ));
    if !out.exists() {
        let st = Command::new("cc")
            .args(["-O2", "-g", "-pthread", "-Wall", "-Werror"])
            .args((!flag.is_empty()).then_some(flag))
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .status()
            .expect("running cc");
        assert!(st.success(), "building {}", src.display());
    }
    out
}

/// `assert_paged` with an explicit slack above the limit, in pages.
pub fn assert_paged_within(run: &Run, limit_bytes: u64, slack_pages: u64) {
    for key in [
        "faults",
        "zero_fills",
        "evicted_pages",
        "bytes_written",
        "bytes_read",
        "resident_pages_max",
    ] {
        assert!(
            run.stats.get(key).is_some(),
            "--stats-json lacks the key {key}"
        );
    }
    assert!(run.get("evicted_pages") > 0, "nothing was evicted");
    assert_metadata(run);
    assert_agents(run);
    assert!(
        run.get("bytes_written") > 0 && run.get("bytes_read") > 0,
        "nothing went through the swap file"
    );
    assert!(run.get("faults") > 0);
    // The limit holds. Slack: memory that glibc's malloc maps internally (not through the
    // agent's mmap wrapper) and fills at once is resident before the scanner registers it
    // (it polls RssAnon every 2 ms), and it counts from then on; a large table can land a few
    // MiB above the limit for a moment before reclaim catches up (ARCHITECTURE.md).
    let limit_pages = limit_bytes / 4096;
    assert!(
        run.get("resident_pages_max") <= limit_pages + slack_pages,
        "resident pages peaked at {} for a limit of {limit_pages}",
        run.get("resident_pages_max")
    );
}

/// The Python interpreter itself, not a version manager's shell shim (the shim's forks of a
/// shell would count their copy-on-write pages twice; see ARCHITECTURE.md, accounting).
pub fn real_python() -> String {
    let real = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    String::from_utf8_lossy(&real.stdout).trim().to_string()
}

/// redis-server under `uffd-daemon run ARGS`, filled with `keys` keys of 2 KiB whose values
/// derive from their names; every key is read back over RESP and compared. Asserts the data
/// and returns the daemon's counters.
pub fn redis_under(args: &[&str], name: &str, keys: usize) -> Run {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let path = stats_path(name);
    let _ = std::fs::remove_file(&path);
    let mut daemon = Command::new(DAEMON)
        .arg("run")
        .args(args)
        .arg("--stats-json")
        .arg(&path)
        .args([
            "--",
            "redis-server",
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("starting redis under the daemon");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/redis_fill_check.py"
    );
    let client = Command::new(real_python())
        .args([script, &port.to_string(), &keys.to_string(), "2048"])
        .output()
        .expect("running the redis client");
    let out = String::from_utf8_lossy(&client.stdout).into_owned();
    eprintln!("{out}{}", String::from_utf8_lossy(&client.stderr));
    let status = daemon.wait().expect("daemon");
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("stats")).expect("JSON");
    let _ = std::fs::remove_file(&path);
    eprintln!("--- {name}: stats: {stats}");
    assert!(client.status.success(), "the redis data did not verify");
    assert!(
        out.contains(&format!("{keys} keys of 2048 bytes, dbsize {keys}, 0 bad")),
        "redis: {out}"
    );
    assert!(status.success(), "redis-server exited with {status}");
    Run {
        status: 0,
        stdout: out,
        stderr: String::new(),
        stats,
    }
}
