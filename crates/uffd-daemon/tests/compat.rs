//! Compatibility: programs nobody on this project wrote, run bare and then under the daemon
//! at about a third of the bare run's peak resident memory. The exit status and the output
//! must be the same as the bare run's (byte for byte: every program here prints the same on
//! every run, checksums of its data included), and where the program's memory is larger than
//! the limit, pages must have gone out and come back (`evicted_pages`, `swapins`).
//!
//! A case that differs fails with every difference it found, named, and the end of the
//! daemon's stderr. Each run has a deadline, a guard against a hang (measured times are not
//! asserted).
//!
//! These need `/dev/userfaultfd` or root, and the programs (`.ci/run` installs them); a case
//! skips with a printed reason only where its program is absent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::*;

/// The lowest limit a case runs under: below it the daemon's fixed costs dominate.
const FLOOR: u64 = 16 << 20;
const BARE_DEADLINE: Duration = Duration::from_secs(120);
const DAEMON_DEADLINE: Duration = Duration::from_secs(120);

/// A third of the bare run's peak, in whole MiB, and at least `FLOOR`.
fn limit_for(peak_rss: u64) -> u64 {
    ((peak_rss / 3) >> 20 << 20).max(FLOOR)
}

/// What differed between a bare run and the run under the daemon.
struct Differences {
    what: String,
    found: Vec<String>,
}

impl Differences {
    fn new(name: &str, limit: u64, bare_peak: u64) -> Differences {
        Differences {
            what: format!(
                "{name} under the daemon at {} MiB (bare peak RSS {} MiB)",
                limit >> 20,
                bare_peak >> 20
            ),
            found: Vec::new(),
        }
    }

    fn note(&mut self, difference: String) {
        self.found.push(difference);
    }

    fn status(&mut self, bare: i32, run: &Run) {
        if run.timed_out {
            self.note(format!(
                "killed at its deadline (a hang); its threads waited in: {}",
                run.hung_in
            ));
        } else if run.status != bare {
            let why = match run.status {
                86 => " (86: an agent lost its daemon and ended its process)",
                _ => "",
            };
            self.note(format!(
                "exit status {} under the daemon, {bare} bare{why}",
                run.status
            ));
        }
    }

    fn output(&mut self, stream: &str, bare: &str, daemon: &str) {
        if bare == daemon {
            return;
        }
        let (b, d): (Vec<&str>, Vec<&str>) = (bare.lines().collect(), daemon.lines().collect());
        let at = b.iter().zip(&d).position(|(x, y)| x != y);
        self.note(match at {
            Some(i) => format!(
                "{stream} differs at line {}: bare {:?}, under the daemon {:?}",
                i + 1,
                b[i],
                d[i]
            ),
            None if d.len() > b.len() => format!(
                "{stream} has {} more lines under the daemon: {:?}",
                d.len() - b.len(),
                &d[b.len()..d.len().min(b.len() + 8)]
            ),
            None => format!(
                "{stream} lacks the bare run's last {} lines under the daemon: {:?}",
                b.len() - d.len(),
                &b[d.len()..b.len().min(d.len() + 8)]
            ),
        });
    }

    /// Pages went out and came back, if the program's memory was larger than the limit.
    fn paged(&mut self, run: &Run, bare_peak: u64, limit: u64) {
        if bare_peak <= limit {
            return;
        }
        if run.stats.is_null() {
            self.note("the daemon wrote no --stats-json (it did not end normally)".into());
            return;
        }
        for key in ["evicted_pages", "swapins"] {
            if run.stats[key].as_u64().unwrap_or(0) == 0 {
                self.note(format!("no paging: {key} is 0"));
            }
        }
    }

    fn assert_none(self, run: &Run) {
        if self.found.is_empty() {
            return;
        }
        let tail: Vec<&str> = run.stderr.lines().rev().take(8).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!(
            "{} differs from the bare run:\n  - {}\nstderr under the daemon ends with:\n{}",
            self.what,
            self.found.join("\n  - "),
            tail.join("\n")
        );
    }
}

/// Runs `program` bare, then under the daemon at a third of its bare peak resident memory,
/// and asserts the same exit status and output and, for memory larger than the limit, that
/// paging happened. Returns the daemon's run.
fn same_under_a_third(name: &str, program: &[&str]) -> Run {
    let bare = run_bare(name, program, BARE_DEADLINE);
    assert!(
        bare.status == 0 && !bare.timed_out,
        "{name} fails bare (status {}): the case itself is wrong\n{}",
        bare.status,
        bare.stderr
    );
    let limit = limit_for(bare.peak_rss);
    let run = run_with_deadline(
        &["--limit", &format!("{}M", limit >> 20)],
        name,
        program,
        DAEMON_DEADLINE,
    );
    let mut d = Differences::new(name, limit, bare.peak_rss);
    d.status(bare.status, &run);
    d.output("stdout", &bare.stdout, &run.stdout);
    d.paged(&run, bare.peak_rss, limit);
    d.assert_none(&run);
    run
}

/// A directory for what a case builds or collects at test time, removed when the case ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(case: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("uffd-compat-{}-{case}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a scratch directory");
        Scratch(dir)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn client(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(file)
}

fn root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

// ---- 1. Language runtimes ------------------------------------------------------------------

#[test]
fn python_dict_and_list() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("python3") {
        return;
    }
    let script = r#"
import hashlib
n = 400_000
d = {}
for i in range(n):
    d["key-%d" % i] = ("v%d-" % (i * 7919 % 100003)) * 10
l = [d["key-%d" % i] for i in range(0, n, 3)]
h = hashlib.sha256()
for k in sorted(d):
    h.update(k.encode())
    h.update(d[k].encode())
print("python: %d entries, %d in the list, sha256 %s" % (len(d), len(l), h.hexdigest()))
"#;
    same_under_a_third("python-dict", &[&real_python(), "-c", script]);
}

/// Python's `mmap.mmap(-1, n)` is `MAP_SHARED|MAP_ANONYMOUS`: four forked children each fill a
/// quarter of 96 MiB, the parent checks every page after they exit and prints a digest. The
/// shared pages are paged by identity (`src/shmem.rs`), through the children's faults and the
/// parent's.
#[test]
fn python_fork_children_fill_a_shared_anonymous_mmap() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("python3") {
        return;
    }
    let script = r#"
import hashlib, mmap, os
n = 96 << 20
m = mmap.mmap(-1, n)
def block(k):
    return bytes((k * 37 + j) % 251 for j in range(4096))
kids = []
for k in range(4):
    pid = os.fork()
    if pid == 0:
        b = block(k)
        for off in range(k * n // 4, (k + 1) * n // 4, 4096):
            m[off:off + 4096] = b
        os._exit(0)
    kids.append(pid)
for p in kids:
    os.waitpid(p, 0)
bad = sum(m[off:off + 4096] != block(k)
          for k in range(4) for off in range(k * n // 4, (k + 1) * n // 4, 4096))
print("python shared mmap: %d MiB, %d bad pages, sha1 %s" % (n >> 20, bad, hashlib.sha1(m).hexdigest()))
"#;
    let run = same_under_a_third("python-shared-mmap", &[&real_python(), "-c", script]);
    assert!(run.stdout.contains("96 MiB, 0 bad pages"), "{}", run.stdout);
    assert!(
        run.get("shmem_evicted_pages") > 0 && run.get("shmem_swapins") > 0,
        "the shared mapping was not paged: shmem_evicted_pages {}, shmem_swapins {}",
        run.get("shmem_evicted_pages"),
        run.get("shmem_swapins")
    );
}

#[test]
fn perl_hash_sorted() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("perl") {
        return;
    }
    // The hash first, then the rows: sorting keys whose strings lie between the rows' would
    // touch every page at random, minutes of thrashing under the limit.
    let script = r#"
use strict;
use Digest::MD5;
my %h;
$h{"key$_"} = $_ * 7919 % 100003 for 0 .. 249_999;
my @rows = map { join("", "r", $_, "-") x 40 } 0 .. 249_999;
my $md5 = Digest::MD5->new;
my $bytes = 0;
for my $r (@rows) { $md5->add($r); $bytes += length $r; }
my @keys = sort keys %h;
$md5->add($_, $h{$_}) for @keys;
printf "perl: %d entries, %d row bytes, md5 %s\n", scalar(@keys), $bytes, $md5->hexdigest;
"#;
    same_under_a_third("perl-hash", &["perl", "-e", script]);
}

#[test]
fn node_objects_json() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("node") {
        return;
    }
    let script = r#"
const crypto = require("crypto");
const a = [];
for (let i = 0; i < 500000; i++)
    a.push({ id: i, name: "item-" + i, tags: ["t" + (i % 7), "u" + (i % 13)], v: (i * 7919) % 100003 });
const json = JSON.stringify(a);
const back = JSON.parse(json);
let sum = 0;
for (const o of back) sum += o.v;
const digest = crypto.createHash("sha256").update(json).digest("hex");
console.log("node: %d objects, %d JSON bytes, sum %d, sha256 %s", back.length, json.length, sum, digest);
"#;
    same_under_a_third("node-json", &["node", "-e", script]);
}

#[test]
fn java_hashmap() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("javac") || !have("java") {
        return;
    }
    let scratch = Scratch::new("java");
    let classes = scratch.path("classes");
    let javac = Command::new("javac")
        .arg("-d")
        .arg(&classes)
        .arg(client("CompatHashMap.java"))
        .output()
        .expect("running javac");
    assert!(
        javac.status.success(),
        "javac failed: {}",
        String::from_utf8_lossy(&javac.stderr)
    );
    let cp = classes.to_string_lossy().into_owned();
    same_under_a_third(
        "java-hashmap",
        &["java", "-cp", &cp, "CompatHashMap", "1500000"],
    );
}

// ---- 2. A database -------------------------------------------------------------------------

#[test]
fn sqlite_in_memory_aggregates() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("sqlite3") {
        return;
    }
    let sql = "
CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v INTEGER, pad TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 400000)
INSERT INTO t SELECT x, printf('key-%08d', (x * 7919) % 1000003), (x * 104729) % 100003,
                     printf('%0200d', x) FROM c;
CREATE INDEX t_k ON t(k);
SELECT count(*), sum(v), sum(length(pad)), min(k), max(k) FROM t;
SELECT v % 7, count(*), sum(id), avg(v) FROM t GROUP BY v % 7 ORDER BY 1;
SELECT k, v FROM t ORDER BY k LIMIT 3;
SELECT count(*), sum(v) FROM t WHERE k BETWEEN 'key-00100000' AND 'key-00200000';
UPDATE t SET v = v + 1 WHERE id % 3 = 0;
DELETE FROM t WHERE id % 5 = 0;
SELECT count(*), sum(v), total(length(k)) FROM t;
PRAGMA integrity_check;
";
    same_under_a_third("sqlite", &["sqlite3", ":memory:", sql]);
}

// ---- 3. Servers that fork and drop privileges ----------------------------------------------

#[test]
fn forked_workers_drop_privileges() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("python3") {
        return;
    }
    if !root() {
        eprintln!("SKIP: dropping privileges to nobody needs root");
        return;
    }
    // A pre-forking server's shape: the master forks workers, each worker drops to nobody and
    // forks a child for the request, which computes over 48 MiB and reports through a pipe.
    let script = r#"
import hashlib, os, sys
NOBODY = 65534
r, w = os.pipe()
workers = []
for n in range(3):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        child = os.fork()
        if child == 0:
            block = hashlib.sha256(b"worker %d" % n).digest() * 128
            data = bytearray(block * (48 * 256))
            for i in range(0, len(data), 4096):
                data[i] = (i // 4096 + n) % 251
            total = sum(data[i] for i in range(0, len(data), 4096))
            line = "worker %d: uid %d gid %d, %d bytes, sum %d, sha256 %s\n" % (
                n, os.getuid(), os.getgid(), len(data), total, hashlib.sha256(data).hexdigest())
            os.write(w, line.encode())
            os._exit(0)
        _, st = os.waitpid(child, 0)
        status = os.waitstatus_to_exitcode(st)
        os.write(w, b"worker %d: its child exited with %d\n" % (n, status))
        os._exit(status)
    workers.append(pid)
os.close(w)
statuses = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in workers]
out = b""
while True:
    chunk = os.read(r, 65536)
    if not chunk:
        break
    out += chunk
for line in sorted(out.decode().splitlines()):
    print(line)
print("worker exit statuses:", statuses)
sys.exit(0 if statuses == [0, 0, 0] else 1)
"#;
    same_under_a_third("fork-setuid", &[&real_python(), "-c", script]);
}

/// util-linux setpriv changes its uid keeping its capabilities (PR_SET_KEEPCAPS), raises its
/// effective set again with capset in its own thread, then changes its gid: glibc makes that
/// setresgid in every thread and aborts when their results differ. It aborted under the daemon
/// (exit 134: the agent's threads had not followed the capset and lacked CAP_SETGID; issue
/// #16). The issue's command as it was reported, then one that also sets the inheritable,
/// ambient and bounding sets and runs python over 48 MiB as nobody.
#[test]
fn setpriv_drops_to_nobody() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("setpriv") || !have("python3") {
        return;
    }
    if !root() {
        eprintln!("SKIP: setpriv --reuid needs root");
        return;
    }
    let nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let mut echo = vec!["setpriv"];
    echo.extend(nobody);
    echo.extend(["/bin/echo", "hi"]);
    let run = same_under_a_third("setpriv-echo", &echo);
    assert_eq!(run.stdout, "hi\n");
    let script = r#"
import hashlib, os
data = bytearray(hashlib.sha256(b"setpriv").digest() * (48 * 1024 * 1024 // 32))
for i in range(0, len(data), 4096):
    data[i] = (i // 4096) % 251
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
print("ids", os.getresuid(), os.getresgid(), os.getgroups())
for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs"):
    print(key, status[key].strip())
print("sha256", hashlib.sha256(data).hexdigest())
"#;
    let python = real_python();
    let mut caps = vec!["setpriv"];
    caps.extend(nobody);
    caps.extend([
        "--inh-caps=+net_bind_service",
        "--ambient-caps=+net_bind_service",
        "--bounding-set=-all,+net_bind_service",
        &python,
        "-c",
        script,
    ]);
    let run = same_under_a_third("setpriv-caps", &caps);
    assert!(
        run.stdout
            .contains("ids (65534, 65534, 65534) (65534, 65534, 65534) []")
            && run.stdout.contains("CapAmb 0000000000000400"),
        "{}",
        run.stdout
    );
}

#[test]
fn redis_server_forks_and_serves() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("redis-server") || !have("python3") {
        return;
    }
    let keys = 40_000;
    let bare = redis_session(None, "redis-bare", keys);
    assert!(
        bare.client_ok && bare.server.status == 0,
        "redis fails bare: the case itself is wrong: {}",
        bare.report
    );
    let limit = limit_for(bare.server.peak_rss);
    let under = redis_session(
        Some(&["--limit", &format!("{}M", limit >> 20)]),
        "redis-compat",
        keys,
    );
    let run = Run {
        status: under.server.status,
        stdout: under.report,
        stderr: under.server.stderr,
        stats: under.stats,
        timed_out: under.server.timed_out,
        hung_in: under.server.hung_in,
    };
    let mut d = Differences::new("redis-server", limit, bare.server.peak_rss);
    d.status(0, &run);
    d.output("the client's report", &bare.report, &run.stdout);
    if !under.client_ok {
        d.note("the client's checks failed".into());
    }
    d.paged(&run, bare.server.peak_rss, limit);
    d.assert_none(&run);
}

/// PostgreSQL keeps its buffer pool in shared anonymous memory (`MAP_SHARED|MAP_ANONYMOUS`,
/// `huge_pages=off`) that the postmaster maps and every backend it forks shares: the kind of
/// memory issue #16 left unmanaged before it was paged by page identity (`shmem.rs`). A 1.5
/// million row table (about 200 MiB) built, indexed and queried through a 192 MiB
/// `shared_buffers` under a third of the bare peak; the queries' answers must be the bare run's
/// and shared pages must have been evicted and read back.
#[test]
fn postgres_shared_buffers_are_paged() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const PG: &str = "/usr/lib/postgresql/15/bin";
    if !can_run() || !have("psql") || !Path::new(PG).join("postgres").exists() {
        return;
    }
    let scratch = Scratch::new("postgres");
    let dir = scratch.path("");
    let dir = dir.to_string_lossy().trim_end_matches('/').to_string();
    let sql = "CREATE TABLE t AS SELECT i, md5(i::text) AS h, repeat(chr(65 + i % 26), 60) AS pad \
               FROM generate_series(1, 1500000) i;\n\
               CREATE INDEX t_h ON t (h);\n\
               SELECT count(*), sum(hashtext(h)::bigint), sum(length(pad)) FROM t;\n\
               SELECT i FROM t WHERE h = md5('777777');\n\
               SELECT count(*), sum(i) FROM t WHERE i % 7 = 3;\n\
               SELECT sum(hashtext(h)::bigint) FROM t WHERE i BETWEEN 100000 AND 900000;\n\
               SELECT count(*) FROM (SELECT DISTINCT substr(h, 1, 5) FROM t) s;\n";
    std::fs::write(scratch.path("q.sql"), sql).unwrap();
    // The server runs in the script's process group (not daemonized by `pg_ctl start`), so
    // that the bare run's peak, and so the limit, counts its memory.
    let script = format!(
        "set -e\n\
         D={dir}\n\
         rm -rf $D/data; mkdir -p $D/data; chown postgres $D $D/data\n\
         runuser -u postgres -- {PG}/initdb -D $D/data -A trust --no-sync -U postgres >/dev/null\n\
         runuser -u postgres -- {PG}/postgres -D $D/data -c shared_buffers=192MB \
         -c huge_pages=off -c listen_addresses='' -c unix_socket_directories=$D -c fsync=off \
         -c synchronous_commit=off -c full_page_writes=off -c max_wal_size=2GB \
         -c maintenance_work_mem=64MB -c autovacuum=off >$D/log 2>&1 &\n\
         server=$!\n\
         for i in $(seq 1 300); do runuser -u postgres -- {PG}/pg_isready -q -h $D && break; \
         sleep 0.1; done\n\
         runuser -u postgres -- psql -h $D -d postgres -qAt -v ON_ERROR_STOP=1 -f $D/q.sql\n\
         runuser -u postgres -- {PG}/pg_ctl -D $D/data -m fast -w stop >/dev/null\n\
         wait $server\n"
    );
    std::fs::write(scratch.path("run.sh"), script).unwrap();
    let run_sh = scratch.path("run.sh").to_string_lossy().into_owned();
    // Not `same_under_a_third`: each backend calls setsid(), out of the process group whose
    // peak that measures. The buffer pool alone is 192 MiB, the bare peak of its busiest
    // backend about 230 MiB: 64 MiB is under a third of it.
    let program = ["sh", run_sh.as_str()];
    let bare = run_bare("postgres", &program, BARE_DEADLINE);
    assert!(
        bare.status == 0 && bare.stdout.contains("1500000|2068759067615|90000000"),
        "postgres fails bare: the case itself is wrong\n{}\n{}",
        bare.stdout,
        bare.stderr
    );
    let limit = 64 << 20;
    let run = run_with_deadline(&["--limit", "64M"], "postgres", &program, DAEMON_DEADLINE);
    let mut d = Differences::new("postgres", limit, bare.peak_rss.max(230 << 20));
    d.status(0, &run);
    d.output("stdout", &bare.stdout, &run.stdout);
    d.paged(&run, 230 << 20, limit);
    d.assert_none(&run);
    assert!(
        run.get("shmem_evicted_pages") > 0 && run.get("shmem_swapins") > 0,
        "the buffer pool was not paged: shmem_evicted_pages {}, shmem_swapins {}",
        run.get("shmem_evicted_pages"),
        run.get("shmem_swapins")
    );
}

// ---- 4. Heavy threading --------------------------------------------------------------------

#[test]
fn threads_atomics_and_stripes() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("cc") {
        return;
    }
    let scratch = Scratch::new("threads");
    let exe = scratch.path("atomic_stripes");
    let cc = Command::new("cc")
        .args(["-O2", "-Wall", "-pthread", "-o"])
        .arg(&exe)
        .arg(client("atomic_stripes.c"))
        .output()
        .expect("running cc");
    assert!(
        cc.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    // 192 MiB: 96 MiB of counters hit at random by 32 threads, 96 MiB of stripes.
    let exe = exe.to_string_lossy().into_owned();
    let run = same_under_a_third("atomic-stripes", &[&exe, "192", "32", "20000"]);
    assert!(
        run.stdout.contains("sum 640000 of 640000 expected") && run.stdout.contains(" 0 bad"),
        "atomic_stripes: {}",
        run.stdout
    );
}

// ---- 5. Programs that close descriptors, exec, ignore SIGINT -------------------------------

#[test]
fn shell_closes_descriptors_then_execs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("perl") {
        return;
    }
    // The shell closes 3-9 (where the agent's descriptors are), forks a perl that allocates,
    // then execs another.
    let perl = r#"my @a; push @a, ("x$_-" x 40) for 1 .. 600_000; my $n = 0; $n += length for @a; print "perl: $n bytes\n";"#;
    let script = format!(
        "exec 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-; perl -e '{perl}'; echo between; exec perl -e '{perl}'"
    );
    same_under_a_third("sh-close-exec", &["sh", "-c", &script]);
}

#[test]
fn python_closerange_then_allocates() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("python3") {
        return;
    }
    // What a daemonizing program does before its work: close every inherited descriptor.
    let script = r#"
import hashlib, os
os.closerange(3, 1024)
n = 150_000
rows = [("row-%d-" % i) * 40 for i in range(n)]
bad = sum(1 for i in range(n) if rows[i] != ("row-%d-" % i) * 40)
print("python after closerange: %d rows, %d bad, sha256 %s"
      % (n, bad, hashlib.sha256("".join(rows).encode()).hexdigest()))
"#;
    same_under_a_third("python-closerange", &[&real_python(), "-c", script]);
}

#[test]
fn open_descriptors_are_the_programs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() {
        return;
    }
    // A program sees the descriptors it inherited and opened, none of the daemon's.
    same_under_a_third("ls-proc-fd", &["ls", "/proc/self/fd"]);
}

#[test]
fn programs_that_ignore_sigint() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("python3") {
        return;
    }
    // SIGINT to the whole process group, as a terminal's ^C sends it (under the daemon the
    // daemon is in the group too), in the middle of the work: the program ignores it.
    let script = r#"
import hashlib, os, signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
rows = [("row-%d-" % i) * 40 for i in range(100_000)]
os.killpg(0, signal.SIGINT)
time.sleep(0.2)
rows += [("row-%d-" % i) * 40 for i in range(100_000, 200_000)]
bad = sum(1 for i, r in enumerate(rows) if r != ("row-%d-" % i) * 40)
print("python ignoring SIGINT: %d rows, %d bad, sha256 %s"
      % (len(rows), bad, hashlib.sha256("".join(rows).encode()).hexdigest()))
"#;
    same_under_a_third("python-sigint", &[&real_python(), "-c", script]);
    // The shell's way: trap '' INT is inherited through exec.
    let shell = r#"trap '' INT; kill -INT 0; sleep 0.2; exec perl -e 'my @a; push @a, ("y$_-" x 40) for 1 .. 600_000; my $n = 0; $n += length for @a; print "perl: $n bytes\n";'"#;
    same_under_a_third("sh-sigint", &["sh", "-c", shell]);
}

// ---- 6. CPython's own regression tests -----------------------------------------------------

/// The modules of CPython's test suite that exercise what the daemon interposes on: processes,
/// descriptors, threads, mappings.
const CPYTHON_MODULES: [&str; 5] = [
    "test_subprocess",
    "test_posix",
    "test_threading",
    "test_mmap",
    "test_os",
];
/// The limit the issue ran them under.
const CPYTHON_LIMIT: &str = "64M";

/// One test's outcome in a `--junit-xml` report of `python3 -m test`.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Passed,
    /// Skipped, failed, erred, expected failure, unexpected success: the element's first
    /// child, with its `message` attribute where it has one.
    Other(String),
}

/// Parses the `<testcase>` elements that libregrtest's `RegressionTestResult` writes: a test
/// that passed is an empty element; anything else has a child (`skipped`, `failure`, `error`,
/// `output` for an expected failure, `outcome` for an unexpected success). Elements without a
/// name (a test whose subtests failed) are left out.
fn junit_outcomes(xml: &str) -> BTreeMap<String, Outcome> {
    let mut out = BTreeMap::new();
    let mut rest = xml;
    while let Some(at) = rest.find("<testcase ") {
        rest = &rest[at..];
        let end = rest.find('>').unwrap_or(rest.len());
        let tag = &rest[..end];
        let name = attribute(tag, "name");
        let outcome = if tag.ends_with('/') {
            Outcome::Passed
        } else {
            let body = &rest[end..rest.find("</testcase>").unwrap_or(rest.len())];
            // The captured output (`system-out`, `system-err`) comes before the outcome.
            let child = ["<failure", "<error", "<skipped", "<output", "<outcome"]
                .iter()
                .filter_map(|t| body.find(t))
                .min()
                .map(|i| &body[i..body[i..].find('>').map_or(body.len(), |j| i + j)]);
            match child {
                Some(child) => {
                    let kind = child[1..].split([' ', '/']).next().unwrap_or("");
                    match attribute(child, "message") {
                        Some(m) => Outcome::Other(format!(
                            "{kind}: {}",
                            m.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
                        )),
                        None => Outcome::Other(kind.to_string()),
                    }
                }
                None => Outcome::Other("an outcome this parser does not know".into()),
            }
        };
        if let Some(name) = name {
            out.insert(name, outcome);
        }
        rest = &rest[end.min(rest.len())..];
    }
    out
}

/// An attribute's value in a start tag, unescaped.
fn attribute(tag: &str, key: &str) -> Option<String> {
    let pat = format!(" {key}=\"");
    let start = tag.find(&pat)? + pat.len();
    let len = tag[start..].find('"')?;
    let mut value = String::new();
    let mut rest = &tag[start..start + len];
    while let Some(amp) = rest.find('&') {
        value.push_str(&rest[..amp]);
        let semi = rest[amp..].find(';').map_or(rest.len(), |i| amp + i);
        let entity = &rest[amp + 1..semi];
        let c = match entity {
            "quot" => Some('"'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            _ => entity
                .strip_prefix('#')
                .and_then(|n| n.parse().ok())
                .and_then(char::from_u32),
        };
        match c {
            Some(c) => value.push(c),
            None => value.push_str(&rest[amp..(semi + 1).min(rest.len())]),
        }
        rest = &rest[(semi + 1).min(rest.len())..];
    }
    value.push_str(rest);
    Some(value)
}

/// One module of CPython's tests, run by `python3 -m test -v --junit-xml`.
struct Module {
    outcomes: BTreeMap<String, Outcome>,
    /// The test the verbose output names last: the one running when a hung run was killed.
    last_started: String,
    run: Run,
}

/// How long a run whose report is written may take to exit.
const EXIT_GRACE: Duration = Duration::from_secs(20);

fn cpython_module(
    scratch: &Scratch,
    python: &str,
    module: &str,
    limit: Option<&str>,
    deadline: Duration,
) -> Module {
    let name = format!(
        "cpython-{module}{}",
        if limit.is_some() { "" } else { "-bare" }
    );
    let xml = scratch.path(&format!("{name}.xml"));
    let _ = std::fs::remove_file(&xml);
    let xml_arg = xml.to_string_lossy().into_owned();
    let program = [python, "-m", "test", "-v", "--junit-xml", &xml_arg, module];
    let stats = stats_path(&name);
    let cmd = match limit {
        Some(limit) => daemon_command(&["--limit", limit], &stats, &program),
        None => {
            let mut cmd = Command::new(python);
            cmd.args(&program[1..]);
            cmd
        }
    };
    // libregrtest writes the report once every test has ended: from then on only the exit of
    // the interpreter is left.
    let done = Bounded::spawn(cmd, &name).wait_or_grace(deadline, &|| xml.exists(), EXIT_GRACE);
    let run = finish_run(&name, done, &stats);
    let outcomes = junit_outcomes(&std::fs::read_to_string(&xml).unwrap_or_default());
    let last_started = run
        .stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("test") && l.contains(" ("))
        .unwrap_or("")
        .to_string();
    Module {
        outcomes,
        last_started,
        run,
    }
}

#[test]
fn cpython_regression_tests() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Debian's interpreter with Debian's copy of the tests (libpython3.11-testsuite).
    let python = "/usr/bin/python3";
    if !can_run() || !have(python) {
        return;
    }
    let has_tests = Command::new(python)
        .args(["-c", "import test.libregrtest, test.test_os"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_tests {
        eprintln!(
            "SKIP: {python} has no test suite (libpython3.11-testsuite; .ci/run installs it)"
        );
        return;
    }
    let scratch = Scratch::new("cpython");
    let mut failures = Vec::new();
    for module in CPYTHON_MODULES {
        let start = Instant::now();
        let bare = cpython_module(&scratch, python, module, None, BARE_DEADLINE);
        let bare_time = start.elapsed();
        assert!(
            !bare.run.timed_out && !bare.outcomes.is_empty(),
            "{module} does not run bare (status {}): the case itself is wrong",
            bare.run.status
        );
        // A guard against a hang, not a timing assertion: the daemon may well be slower.
        let deadline = (bare_time * 4).max(Duration::from_secs(90));
        let under = cpython_module(&scratch, python, module, Some(CPYTHON_LIMIT), deadline);
        let passed = |m: &Module| {
            m.outcomes
                .iter()
                .filter(|(_, o)| **o == Outcome::Passed)
                .count()
        };
        eprintln!(
            "=== {module}: bare {} of {} passed; under the daemon {} of {} passed (status {})",
            passed(&bare),
            bare.outcomes.len(),
            passed(&under),
            under.outcomes.len(),
            under.run.status,
        );
        if under.run.timed_out && under.outcomes.is_empty() {
            failures.push(format!(
                "{module}: killed at its deadline of {} s under the daemon (bare: {} s), its \
                 tests unfinished; the test running then: {:?}; its threads waited in: {}",
                deadline.as_secs(),
                bare_time.as_secs(),
                under.last_started,
                under.run.hung_in,
            ));
            continue;
        }
        if under.run.timed_out {
            failures.push(format!(
                "{module}: every test ended under the daemon (the report was written) but the \
                 run did not end within {} s; killed while its threads waited in: {}",
                EXIT_GRACE.as_secs(),
                under.run.hung_in,
            ));
        } else if under.outcomes.is_empty() {
            failures.push(format!(
                "{module}: no results under the daemon (exit status {}); stderr ends with: {}",
                under.run.status,
                under
                    .run
                    .stderr
                    .lines()
                    .rev()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" | ")
            ));
            continue;
        }
        for (test, outcome) in &bare.outcomes {
            if *outcome != Outcome::Passed {
                continue;
            }
            match under.outcomes.get(test) {
                Some(Outcome::Passed) => {}
                Some(Outcome::Other(what)) => {
                    failures.push(format!("{test}: passes bare, under the daemon {what}"))
                }
                None => failures.push(format!("{test}: passes bare, no result under the daemon")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "CPython's tests that pass bare and not under the daemon at {CPYTHON_LIMIT}:\n  - {}",
        failures.join("\n  - ")
    );
}

#[test]
fn junit_outcomes_reads_libregrtest_reports() {
    let xml = concat!(
        r#"<testsuites><testsuite tests="5">"#,
        r#"<testcase name="t.A.ok" status="run" result="completed" time="0.1" />"#,
        r#"<testcase name="t.A.skip" status="run" result="completed"><skipped>no fork</skipped></testcase>"#,
        r#"<testcase name="t.A.fail" status="run" result="completed"><system-out /><system-err />"#,
        r#"<failure type="AssertionError" message="AssertionError: 3 &lt; 4 in &#39;&#230;&#39;&#10;">tb</failure></testcase>"#,
        r#"<testcase name="t.A.err" status="run" result="completed"><system-out>x</system-out>"#,
        r#"<error type="OSError" message="OSError: [Errno 9] Bad file descriptor&#10;">tb</error></testcase>"#,
        r#"<testcase /></testsuite></testsuites>"#,
    );
    let got = junit_outcomes(xml);
    let want = [
        (
            "t.A.err",
            Outcome::Other("error: OSError: [Errno 9] Bad file descriptor".into()),
        ),
        (
            "t.A.fail",
            Outcome::Other("failure: AssertionError: 3 < 4 in 'æ'".into()),
        ),
        ("t.A.ok", Outcome::Passed),
        ("t.A.skip", Outcome::Other("skipped".into())),
    ];
    assert_eq!(
        got.into_iter().collect::<Vec<_>>(),
        want.into_iter()
            .map(|(n, o)| (n.to_string(), o))
            .collect::<Vec<_>>()
    );
}

// ---- 7. Sandboxes: new user namespaces -----------------------------------------------------

/// Whether this machine lets a process make a user namespace at all (bare): where it does
/// not (`user.max_user_namespaces = 0`, a kernel without them), the cases below skip.
fn user_namespaces_work() -> bool {
    let ok = Command::new("unshare")
        .args(["-U", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP: this machine refuses a new user namespace bare (unshare -U true)");
    }
    ok
}

/// util-linux `unshare -U` and `unshare -r` make a user namespace with unshare(2), which the
/// kernel refuses to a process of more than one thread: the agent's two threads made every
/// managed process one of three, and both failed with EINVAL under the daemon ("unshare
/// failed: Invalid argument", exit 1). Then a program paged in the namespace: python over 48
/// MiB, exec'd by `unshare -r`, as root there.
#[test]
fn unshare_makes_a_user_namespace() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("unshare") || !have("python3") || !user_namespaces_work() {
        return;
    }
    let run = same_under_a_third("unshare-U-id", &["unshare", "-U", "id"]);
    assert!(run.stdout.starts_with("uid=65534("), "{}", run.stdout);
    assert_eq!(run.get("agent_step_outs"), 1);
    assert_eq!(run.get("agent_restarts"), 1);
    let run = same_under_a_third("unshare-r-whoami", &["unshare", "-r", "whoami"]);
    assert_eq!(run.stdout, "root\n");
    let script = r#"
import hashlib, os
data = bytearray(hashlib.sha256(b"userns").digest() * (48 * 1024 * 1024 // 32))
for i in range(0, len(data), 4096):
    data[i] = (i // 4096) % 251
print("uid", os.getuid(), "gid", os.getgid(), open("/proc/self/uid_map").read().split())
print("sha256", hashlib.sha256(data).hexdigest())
"#;
    let python = real_python();
    let run = same_under_a_third(
        "unshare-r-python",
        &["unshare", "-r", &python, "-c", script],
    );
    assert!(
        run.stdout.starts_with("uid 0 gid 0 ['0', '0', '1']"),
        "{}",
        run.stdout
    );
    assert_eq!(run.get("agent_restarts"), 1);
    assert_eq!(run.get("agent_restart_left_processes"), 0);
}

/// A process holding a user namespace made by `unshare -rm` (root in it is root outside) and a
/// mount namespace of its own, for others to enter; killed when dropped.
struct NamespaceHolder(std::process::Child);

impl NamespaceHolder {
    fn new() -> NamespaceHolder {
        let child = Command::new("unshare")
            .args(["-rm", "sleep", "120"])
            .spawn()
            .expect("running unshare -rm sleep");
        let holder = NamespaceHolder(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_link(holder.ns("user")).ok()
            == std::fs::read_link("/proc/self/ns/user").ok()
        {
            assert!(
                Instant::now() < deadline,
                "the holder made no user namespace"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        holder
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn ns(&self, kind: &str) -> String {
        format!("/proc/{}/ns/{kind}", self.0.id())
    }
}

impl Drop for NamespaceHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// util-linux `nsenter -U -m` enters another process's user and mount namespaces with setns(2)
/// ("reassociate to namespace 'ns/user' failed: Invalid argument" under the daemon: the
/// kernel wants a process of one thread for the one, an unshared fs_struct for the other),
/// then runs python over 48 MiB there.
#[test]
fn nsenter_enters_a_user_and_mount_namespace() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("nsenter") || !have("unshare") || !user_namespaces_work() {
        return;
    }
    let holder = NamespaceHolder::new();
    let target = holder.pid().to_string();
    let script = r#"
import hashlib, os
data = bytearray(hashlib.sha256(b"nsenter").digest() * (48 * 1024 * 1024 // 32))
for i in range(0, len(data), 4096):
    data[i] = (i // 4096) % 251
print("uid", os.getuid(), open("/proc/self/uid_map").read().split())
print("sha256", hashlib.sha256(data).hexdigest())
"#;
    let python = real_python();
    let run = same_under_a_third(
        "nsenter-user-mnt",
        &[
            "nsenter", "-t", &target, "-U", "-m", "--", &python, "-c", script,
        ],
    );
    drop(holder);
    assert!(
        run.stdout.starts_with("uid 0 ['0', '0', '1']"),
        "{}",
        run.stdout
    );
    // One setns per namespace, each with the agent's threads stepped out and back.
    assert_eq!(run.get("agent_step_outs"), 2);
    assert_eq!(run.get("agent_restarts"), 2);
}

/// bubblewrap joins a user namespace made earlier (`--userns FD`, what flatpak and the like
/// pass it) with setns(2) in its own process, which the kernel refuses to a process of more
/// than one thread ("Joining the specified user namespace failed" under the daemon); its
/// sandboxed program then pages there (python over 48 MiB).
#[test]
fn bubblewrap_joins_a_user_namespace() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run()
        || !have("bwrap")
        || !have("unshare")
        || !have("python3")
        || !user_namespaces_work()
    {
        return;
    }
    // The namespace to join: root in it is root outside.
    let holder = NamespaceHolder::new();
    let ns = holder.ns("user");
    let script = r#"
import hashlib, os
data = bytearray(hashlib.sha256(b"bwrap").digest() * (48 * 1024 * 1024 // 32))
for i in range(0, len(data), 4096):
    data[i] = (i // 4096) % 251
print("uid", os.getuid(), open("/proc/self/uid_map").read().split())
print("sha256", hashlib.sha256(data).hexdigest())
"#;
    let python = real_python();
    let sandbox = format!(
        "exec bwrap --userns 3 --ro-bind / / --proc /proc --dev /dev --tmpfs /tmp -- \
         {python} -c '{script}' 3<{ns}"
    );
    let run = same_under_a_third("bwrap-userns", &["sh", "-c", &sandbox]);
    drop(holder);
    assert!(
        run.stdout.starts_with("uid 0 ['0', '0', '1']"),
        "{}",
        run.stdout
    );
    assert_eq!(run.get("agent_step_outs"), 1);
    assert_eq!(run.get("agent_restarts"), 1);
}

// ---- 8. Sandboxes: new pid namespaces -------------------------------------------------------

/// Whether this machine lets a process make a pid namespace at all (bare): where it does not,
/// the cases below skip.
fn pid_namespaces_work() -> bool {
    let ok = Command::new("unshare")
        .args(["-pf", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP: this machine refuses a new pid namespace bare (unshare -pf true)");
    }
    ok
}

/// Python in a pid namespace: 48 MiB written, then a fork child that checks the inherited
/// pages (every page's marker, and a hash of all of them) and writes 32 MiB of its own; the
/// parent checks its pages again after the child. Standard output is the same on every run;
/// each process's own `RssAnon` at its end goes to standard error (`pidns-rss`, KiB).
const PIDNS_SCRIPT: &str = r#"
import hashlib, os, sys
def rss_anon():
    with open("/proc/self/status") as f:
        return int([l for l in f if l.startswith("RssAnon:")][0].split()[1])
data = bytearray(hashlib.sha256(b"pidns").digest() * (48 * 1024 * 1024 // 32))
for i in range(0, len(data), 4096):
    data[i] = (i // 4096) % 251
sys.stdout.flush()
pid = os.fork()
if pid == 0:
    ok = all(data[i] == (i // 4096) % 251 for i in range(0, len(data), 4096))
    mine = bytearray(hashlib.sha256(b"child").digest() * (32 * 1024 * 1024 // 32))
    for i in range(0, len(mine), 4096):
        mine[i] = (i // 4096) % 13
    print("child: inherited", ok, hashlib.sha256(data).hexdigest()[:16],
          "own", hashlib.sha256(mine).hexdigest()[:16])
    sys.stdout.flush()
    print("pidns-rss child", rss_anon(), file=sys.stderr)
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
ok = all(data[i] == (i // 4096) % 251 for i in range(0, len(data), 4096))
print("parent:", ok, hashlib.sha256(data).hexdigest()[:16], "child status", status)
print("pidns-rss parent", rss_anon(), file=sys.stderr)
"#;

/// What [`PIDNS_SCRIPT`] must show under the daemon: the same output as bare (checked by
/// `same_under_a_third`), both processes managed (each one's own anonymous RSS within the
/// limit and a little slack, where bare they hold 48 to 80 MiB), the child bound to its process
/// and no greeting refused.
fn assert_pidns_script_managed(run: &Run) {
    assert!(
        run.stdout.contains("child: inherited True") && run.stdout.contains("parent: True"),
        "{}",
        run.stdout
    );
    let limit_kib = run.get("limit_pages") * 4;
    let rss: Vec<u64> = run
        .stderr
        .lines()
        .filter_map(|l| {
            l.split_once("pidns-rss ")?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(rss.len(), 2, "the script's RssAnon lines: {}", run.stderr);
    for kib in rss {
        assert!(
            kib <= limit_kib + (8 << 10),
            "a process held {kib} KiB of anonymous memory under a {limit_kib} KiB limit: not \
             managed"
        );
    }
    assert!(run.get("fork_children_bound") >= 1);
    assert_eq!(run.get("fork_children_unbound"), 0);
    assert_eq!(run.get("protocol_errors"), 0, "a greeting was refused");
    assert_eq!(run.get("agents_lost"), 0);
}

/// util-linux `unshare -pf` makes a pid namespace whose first process (pid 1 there) runs the
/// program, with and without a `/proc` of its own; `unshare -p` (no fork) execs a shell that
/// stays in the daemon's namespace (and cannot start the agent's threads: said, unmanaged) and
/// whose children are in the new one, so python there is an image exec'd in it, greeting the
/// daemon with its own namespace's pid. Before the fix: the fork child was bound to the
/// daemon's pid 1 ("cannot read the mappings of forked child 1", a SIGKILL to pid 1), its
/// watchdog found no daemon by its number (exit 86), the daemon waited for pid 1 to exit (a
/// hang), and the greeting was refused ("HELLO names pid 1 but the peer is pid N").
#[test]
fn unshare_makes_a_pid_namespace() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("unshare") || !have("python3") || !pid_namespaces_work() {
        return;
    }
    let python = real_python();
    let run = same_under_a_third(
        "unshare-pf-python",
        &["unshare", "-pf", &python, "-c", PIDNS_SCRIPT],
    );
    assert_pidns_script_managed(&run);
    // The namespace's first process (unshare's child) and python's child.
    assert_eq!(run.get("fork_children_bound"), 2);
    let run = same_under_a_third(
        "unshare-pf-mount-proc-python",
        &[
            "unshare",
            "-pf",
            "--mount-proc",
            &python,
            "-c",
            PIDNS_SCRIPT,
        ],
    );
    assert_pidns_script_managed(&run);
    assert_eq!(run.get("fork_children_bound"), 2);
    let run = same_under_a_third(
        "unshare-p-sh-python",
        &[
            "unshare",
            "-p",
            "sh",
            "-c",
            "\"$0\" -c \"$1\"; exit $?",
            &python,
            PIDNS_SCRIPT,
        ],
    );
    assert_pidns_script_managed(&run);
    assert!(
        run.stderr
            .contains("its children are to be in a new pid namespace"),
        "the shell in the old namespace ran unmanaged without a word: {}",
        run.stderr
    );
}

/// bubblewrap's pid namespace (`--unshare-pid`: its own init is pid 1 there, the program pid
/// 2), all of its namespaces (`--unshare-all`), and a user namespace with the pid namespace
/// (`--unshare-user --unshare-pid`, as an unprivileged sandbox makes them). Before the fix the
/// program's process was bound to the daemon's pid 2 (`kthreadd` here), whose empty mappings
/// made the daemon forget every range of the child as if dont-fork, and the daemon then
/// waited for `kthreadd` to exit.
#[test]
fn bubblewrap_makes_a_pid_namespace() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !have("bwrap") || !have("python3") || !pid_namespaces_work() {
        return;
    }
    let python = real_python();
    let mut cases = vec![
        ("bwrap-unshare-pid", vec!["--unshare-pid"]),
        ("bwrap-unshare-all", vec!["--unshare-all"]),
    ];
    if user_namespaces_work() {
        cases.push((
            "bwrap-unshare-user-pid",
            vec!["--unshare-user", "--unshare-pid"],
        ));
    }
    for (name, flags) in cases {
        let mut argv = vec!["bwrap"];
        argv.extend(flags);
        argv.extend([
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--",
        ]);
        argv.extend([python.as_str(), "-c", PIDNS_SCRIPT]);
        let run = same_under_a_third(name, &argv);
        assert_pidns_script_managed(&run);
    }
}
