//! What a program can do to its own process that the daemon must survive without changing
//! what the program sees: signals, descriptors, privileges, fork flags, locked memory, its own
//! threads' lifetimes. Every case checks the program's data and that the daemon went on
//! managing it (the limit held, the agent connected).

use std::process::Command;
use std::time::Duration;

mod common;
use common::*;

/// A program under Ctrl-C that ignores SIGINT (a REPL, gdb, psql): the terminal sends SIGINT
/// to the daemon too. The daemon's waits for its agents' answers must not end on it: a DROP
/// given up while the agent was still moving pages left them unprotected (a write could then
/// land in a page that moved away) and stopped eviction from that process for good.
#[test]
fn sigint_to_the_daemon_stops_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let path = stats_path("sigint");
    let _ = std::fs::remove_file(&path);
    let mut child = Command::new(DAEMON)
        .args(["run", "--limit", "16M", "--stats-json"])
        .arg(&path)
        .args(["--", DAEMON, "workload", "--size", "96M"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("uffd-daemon");
    let pid = child.id() as i32;
    // The daemon handles signals once it has started the program.
    let children = format!("/proc/{pid}/task/{pid}/children");
    while std::fs::read_to_string(&children).is_ok_and(|c| c.trim().is_empty()) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut sent = 0;
    while child.try_wait().expect("wait").is_none() {
        // SAFETY: kill(2) with integer arguments, to our own child.
        unsafe { libc::kill(pid, libc::SIGINT) };
        sent += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("stats")).expect("json");
    let _ = std::fs::remove_file(&path);
    eprintln!("{sent} SIGINTs sent; stdout {stdout}; stats {stats}");
    let run = Run {
        status: out.status.code().unwrap_or(-1),
        stdout,
        stderr: String::new(),
        stats,
    };
    assert_eq!(run.status, 0, "the workload found bad pages");
    assert!(run.stdout.contains("0 bad pages"));
    assert!(sent > 100, "too few signals to matter ({sent})");
    assert_paged(&run, 16 << 20);
}

/// A process stopped (Ctrl-Z, a debugger) while its agent has a DROP to carry out: the DROP is
/// answered late, after the process resumes. Until then every page of the batch stays
/// protected (the agent may still move it); the late answer settles the batch; nothing is
/// lost and eviction goes on.
#[test]
fn a_stopped_process_answers_late_and_loses_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    let cfg = std::env::temp_dir().join(format!("uffd-test-stop-{}.toml", std::process::id()));
    std::fs::write(&cfg, "[test]\ndrop_timeout_ms = 20\n").expect("config");
    let path = stats_path("stopped");
    let _ = std::fs::remove_file(&path);
    let cfg_s = cfg.to_string_lossy().into_owned();
    let mut child = Command::new(DAEMON)
        .args(["run", "--limit", "16M", "--config", &cfg_s, "--stats-json"])
        .arg(&path)
        .args(["--", DAEMON, "workload", "--size", "96M"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("uffd-daemon");
    let pid = child.id() as i32;
    let children = format!("/proc/{pid}/task/{pid}/children");
    let program = loop {
        let c = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(p) = c.split_whitespace().next() {
            break p.parse::<i32>().expect("pid");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut stops = 0;
    while child.try_wait().expect("wait").is_none() {
        std::thread::sleep(Duration::from_millis(30));
        // SAFETY: kill(2) with integer arguments, to our own grandchild.
        unsafe { libc::kill(program, libc::SIGSTOP) };
        std::thread::sleep(Duration::from_millis(150));
        // SAFETY: as above.
        unsafe { libc::kill(program, libc::SIGCONT) };
        stops += 1;
    }
    let out = child.wait_with_output().expect("output");
    let _ = std::fs::remove_file(&cfg);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("stats")).expect("json");
    let _ = std::fs::remove_file(&path);
    eprintln!("{stops} stops; stdout {stdout}; stats {stats}");
    assert_eq!(out.status.code(), Some(0), "the workload found bad pages");
    assert!(stdout.contains("0 bad pages"));
    let get = |k: &str| stats[k].as_u64().unwrap_or_else(|| panic!("no {k}"));
    assert!(
        get("drop_timeouts") >= 1,
        "no DROP was late: the test did not stop the agent mid-DROP ({stops} stops)"
    );
    assert_eq!(get("agents_lost"), 0, "a late answer lost the agent");
    assert!(get("evicted_pages") > 24576 / 2, "eviction did not go on");
    assert!(
        get("resident_pages_max") <= 4096 + 4096 / 6 + 64,
        "the limit did not hold"
    );
}
