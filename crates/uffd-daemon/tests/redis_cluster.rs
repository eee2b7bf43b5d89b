//! The Redis Cluster tier (issue #22), against a real six-node cluster that each test starts
//! on free loopback ports and stops at its end (`common::cluster`): the backend alone (writes,
//! reads, discards racing rewrites, WAIT, a master killed among acknowledged writes), the tiers
//! over it (only ciphertext in the cluster, a run read in one round trip), and the daemon
//! paging real programs to it (with and without zswap, a master SIGKILLed mid-run, a lost
//! page stopping its program).

use std::io;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uffd_daemon::tiers::{
    Backend, BackendSpec, RedisClusterBackend, RedisClusterConfig, TierConfig, Tiers, STRIPE_PAGES,
};

mod common;
use common::cluster::{cli, have_redis, TestCluster};
use common::*;

const PAGE: usize = 4096;

fn config(c: &TestCluster, replicas: u32) -> RedisClusterConfig {
    RedisClusterConfig {
        nodes: c.nodes_arg().split(',').map(str::to_string).collect(),
        replicas,
        connect_timeout: Duration::from_millis(500),
        response_timeout: Duration::from_millis(1000),
        wait_timeout: Duration::from_millis(300),
        read_retry: Duration::from_secs(30),
        write_retry: Duration::from_millis(500),
        ..RedisClusterConfig::default()
    }
}

/// A page that says which page it is and which version.
fn page(n: u64, generation: u64) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    for (i, w) in p.chunks_exact_mut(8).enumerate() {
        let v = n
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(generation << 32)
            .wrapping_add(i as u64);
        w.copy_from_slice(&v.to_le_bytes());
    }
    p
}

fn off(p: u64) -> u64 {
    p * PAGE as u64
}

fn can_test() -> bool {
    have_redis()
}

/// Writes, reads (alone, as a run, in parts, several at once), a missing key, discards racing
/// rewrites of the same pages, and the run's keys gone after `close`.
#[test]
fn backend_writes_reads_and_discards() {
    if !can_test() {
        return;
    }
    let c = TestCluster::start("basic");
    let b = RedisClusterBackend::connect(&config(&c, 1)).unwrap();
    // A run of 16 pages, single pages in 40 stripes, and 16-byte parts of a page (as the
    // sealing layer writes tags).
    let run: Vec<u8> = (0..16).flat_map(|i| page(i, 0)).collect();
    b.write(off(32), &run).unwrap();
    let singles: Vec<(u64, Vec<u8>)> = (0..40)
        .map(|s| (s * STRIPE_PAGES + 7, page(s * STRIPE_PAGES + 7, 0)))
        .collect();
    let writes: Vec<(u64, &[u8])> = singles.iter().map(|(p, d)| (off(*p), &d[..])).collect();
    assert!(b.write_all(&writes).iter().all(Result::is_ok));
    let tags: Vec<u8> = (0..255u8).flat_map(|i| [i; 16]).collect();
    for k in 0..255 {
        b.write(
            off(255) + 16 * k,
            &tags[16 * k as usize..16 * (k as usize + 1)],
        )
        .unwrap();
    }
    let mut out = vec![0u8; 16 * PAGE];
    b.read(off(32), &mut out).unwrap();
    assert_eq!(out, run, "the run");
    let mut a = vec![0u8; PAGE];
    let mut t = vec![0u8; 48];
    let mut reads: Vec<(u64, &mut [u8])> = vec![(off(39), &mut a[..]), (off(255) + 160, &mut t)];
    b.read_all(&mut reads).unwrap();
    assert_eq!(a, page(7, 0));
    assert_eq!(t, tags[160..208]);
    for (p, d) in &singles {
        b.read(off(*p), &mut a).unwrap();
        assert_eq!(&a, d, "page {p}");
    }
    let e = b.read(off(5000), &mut a).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("no such key"), "{e}");
    assert_eq!(b.stats().missing_keys.load(Ordering::Relaxed), 1);

    // Discards and rewrites of the same pages, back to back: the unlinker runs beside, and a
    // rewritten page must never be unlinked after its write.
    for round in 1..=300u64 {
        let p = 1000 + round % 24;
        let d = page(p, round);
        b.write(off(p), &d).unwrap();
        b.discard(off(p), PAGE as u64);
        let d2 = page(p, round + 10_000);
        b.write(off(p), &d2).unwrap();
        if round % 3 == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        b.read(off(p), &mut a).unwrap();
        assert_eq!(
            a, d2,
            "round {round}: a rewritten page was lost to a discard"
        );
    }
    std::thread::sleep(Duration::from_millis(200));
    for p in 1000..1024u64 {
        b.read(off(p), &mut a)
            .unwrap_or_else(|e| panic!("page {p}: {e}"));
    }
    // Pages discarded and left alone are unlinked.
    b.discard(off(32), 16 * PAGE as u64);
    let t0 = Instant::now();
    while b.read(off(40), &mut a).is_ok() {
        assert!(t0.elapsed() < Duration::from_secs(10), "never unlinked");
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = b.stats();
    assert!(st.discarded_keys.load(Ordering::Relaxed) >= 316);
    assert!(st.keys_unlinked.load(Ordering::Relaxed) >= 16);
    eprintln!(
        "unlinks cancelled by a rewrite: {}",
        st.unlinks_cancelled.load(Ordering::Relaxed)
    );
    assert!(c.keys() > 0);
    b.close();
    assert_eq!(c.keys(), 0, "keys left after close: {:?}", c.key_names());
    assert!(b.read(off(39), &mut a).is_err(), "a closed backend reads");
}

/// A cluster that requires a password: refused without it and with a wrong one (the error
/// says why), served with it (`[redis_cluster] password`).
#[test]
fn backend_authenticates() {
    if !can_test() {
        return;
    }
    let c = TestCluster::start_with("auth", Some("s3cret-pw"));
    let mut cfg = config(&c, 1);
    let e = RedisClusterBackend::connect(&cfg).unwrap_err().to_string();
    eprintln!("without the password: {e}");
    assert!(
        e.contains("connecting to the Redis Cluster") && e.contains("[redis_cluster] password"),
        "{e}"
    );
    cfg.password = Some("wrong".into());
    let e = RedisClusterBackend::connect(&cfg).unwrap_err().to_string();
    eprintln!("with a wrong password: {e}");
    assert!(e.contains("[redis_cluster] password"), "{e}");
    assert!(!e.contains("wrong"), "the password is in the error: {e}");
    cfg.password = Some("s3cret-pw".into());
    let b = RedisClusterBackend::connect(&cfg).unwrap();
    assert!(!format!("{b:?} {}", b.describe()).contains("s3cret"));
    let d = page(7, 7);
    b.write(off(3), &d).unwrap();
    let mut a = vec![0u8; PAGE];
    b.read(off(3), &mut a).unwrap();
    assert_eq!(a, d);
    b.close();
    assert_eq!(c.keys(), 0);
}

/// A master whose replica is down cannot acknowledge a write with WAIT 1: those writes fail
/// (naming WAIT) and the others succeed; with replicas = 0 they all do.
#[test]
fn wait_fails_writes_a_master_cannot_replicate() {
    if !can_test() {
        return;
    }
    let mut c = TestCluster::start("wait");
    let (replica, _, master) = c
        .roles()
        .into_iter()
        .find(|&(_, is_master, _)| !is_master)
        .expect("a replica");
    c.kill(replica);
    // The master sees its replica go (the connection closes).
    let t0 = Instant::now();
    while !cli(master.unwrap(), &["info", "replication"]).contains("connected_slaves:0") {
        assert!(t0.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(50));
    }
    let b = RedisClusterBackend::connect(&config(&c, 1)).unwrap();
    let pages: Vec<(u64, Vec<u8>)> = (0..48)
        .map(|s| (s * STRIPE_PAGES, page(s * STRIPE_PAGES, 1)))
        .collect();
    let writes: Vec<(u64, &[u8])> = pages.iter().map(|(p, d)| (off(*p), &d[..])).collect();
    let r = b.write_all(&writes);
    let failed: Vec<&io::Error> = r.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        !failed.is_empty() && failed.len() < pages.len(),
        "{} of {} failed",
        failed.len(),
        pages.len()
    );
    for e in &failed {
        assert!(e.to_string().contains("WAIT 1"), "{e}");
    }
    assert!(b.stats().wait_shortfalls.load(Ordering::Relaxed) > 0);
    let mut a = vec![0u8; PAGE];
    for ((p, d), r) in pages.iter().zip(&r) {
        if r.is_ok() {
            b.read(off(*p), &mut a).unwrap();
            assert_eq!(&a, d);
        }
    }
    let b0 = RedisClusterBackend::connect(&config(&c, 0)).unwrap();
    assert!(b0.write_all(&writes).iter().all(Result::is_ok));
    b.close();
    b0.close();
    assert_eq!(c.keys(), 0);
}

/// Writers keep writing (WAIT 1) while a master is SIGKILLed; reads started at once wait out
/// the failover; every acknowledged page is then read back as written (0 lost), and once the
/// old master is back (a replica now) writes to all slots succeed again.
#[test]
fn a_master_killed_mid_run_loses_no_acknowledged_page() {
    if !can_test() {
        return;
    }
    let mut c = TestCluster::start("failover");
    let b = Arc::new(RedisClusterBackend::connect(&config(&c, 1)).unwrap());
    let acked: Arc<Mutex<Vec<u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (b, acked, stop) = (Arc::clone(&b), Arc::clone(&acked), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut next = 0u64;
            let mut failed = 0u64;
            while !stop.load(Ordering::Relaxed) && next < 60_000 {
                // A batch of 16 pages spread over stripes, each written once.
                let batch: Vec<(u64, Vec<u8>)> = (next..next + 16)
                    .map(|i| {
                        let p = (i % 64) * STRIPE_PAGES + i / 64;
                        (p, page(p, 3))
                    })
                    .collect();
                next += 16;
                let w: Vec<(u64, &[u8])> = batch.iter().map(|(p, d)| (off(*p), &d[..])).collect();
                for ((p, _), r) in batch.iter().zip(b.write_all(&w)) {
                    match r {
                        Ok(()) => acked.lock().unwrap().push(*p),
                        Err(_) => failed += 1,
                    }
                }
            }
            failed
        })
    };
    let t0 = Instant::now();
    while acked.lock().unwrap().len() < 2000 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the writer is stuck"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let victim = c.masters()[0];
    c.kill(victim);
    let before: Vec<u64> = acked.lock().unwrap().clone();
    // Reads now: those of the dead master's stripes wait for the failover.
    let t1 = Instant::now();
    let mut a = vec![0u8; PAGE];
    let mut slowest = Duration::ZERO;
    for &p in &before {
        let r0 = Instant::now();
        b.read(off(p), &mut a)
            .unwrap_or_else(|e| panic!("acknowledged page {p} lost: {e}"));
        slowest = slowest.max(r0.elapsed());
        assert_eq!(a, page(p, 3), "acknowledged page {p} came back wrong");
    }
    eprintln!(
        "{} acknowledged pages read back across the failover in {:?} (slowest read {slowest:?})",
        before.len(),
        t1.elapsed()
    );
    c.wait_failover(victim);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let failed = writer.join().unwrap();
    let all: Vec<u64> = acked.lock().unwrap().clone();
    for &p in &all {
        b.read(off(p), &mut a)
            .unwrap_or_else(|e| panic!("acknowledged page {p} lost: {e}"));
        assert_eq!(a, page(p, 3), "acknowledged page {p} came back wrong");
    }
    let st = b.stats();
    eprintln!(
        "acknowledged {} pages ({} after the kill), {failed} writes failed; retries {}, WAIT \
         shortfalls {}, connects {}",
        all.len(),
        all.len() - before.len(),
        st.retries.load(Ordering::Relaxed),
        st.wait_shortfalls.load(Ordering::Relaxed),
        st.connects.load(Ordering::Relaxed)
    );
    assert!(
        st.retries.load(Ordering::Relaxed) > 0,
        "the kill went unseen"
    );
    // The old master comes back as the new one's replica: every stripe takes writes again.
    c.restart(victim);
    c.wait_healthy(&[]);
    let fresh: Vec<(u64, Vec<u8>)> = (0..64)
        .map(|s| (s * STRIPE_PAGES + 255, page(s, 9)))
        .collect();
    let w: Vec<(u64, &[u8])> = fresh.iter().map(|(p, d)| (off(*p), &d[..])).collect();
    for (r, (p, _)) in b.write_all(&w).into_iter().zip(&fresh) {
        r.unwrap_or_else(|e| panic!("page {p} after the old master came back: {e}"));
    }
    b.close();
    assert_eq!(c.keys(), 0, "keys left: {:?}", &c.key_names()[..]);
}

/// Raw bytes of a key (`redis-cli --raw GET`), from whichever master has it.
fn raw_values(c: &TestCluster) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for k in c.key_names() {
        let out = Command::new("redis-cli")
            .args(["-c", "-p", &c.ports[0].to_string(), "--raw", "GET", &k])
            .output()
            .unwrap();
        v.push(out.stdout);
    }
    v
}

/// The tiers over the cluster: a folio and single pages stored with encryption on leave only
/// ciphertext in the cluster (off, the same search finds the plaintext); a folio comes back
/// as a run with one pipeline; freeing the slots unlinks their keys.
#[test]
fn the_cluster_holds_only_ciphertext() {
    if !can_test() {
        return;
    }
    let c = TestCluster::start("sealed");
    for encrypt in [true, false] {
        let t = Tiers::new(TierConfig {
            zswap: None,
            backend: BackendSpec::RedisCluster(Box::new(config(&c, 1))),
            swap_bytes: 64 << 20,
            large_folios: true,
            discard: true,
            encrypt,
            checksums: true,
            fail_writes: None,
            fail_writeback_after: None,
            tmp_dir: std::env::temp_dir(),
        })
        .unwrap();
        let secret = |n: u64| {
            let mut p = page(n, 0);
            for chunk in p.chunks_exact_mut(256) {
                chunk[..12].copy_from_slice(b"SECRET-PAGE-");
            }
            p
        };
        let folio: Vec<u8> = (0..16).flat_map(secret).collect();
        let f = t.store_units(&[(4, &folio[..])]).pop().unwrap().unwrap();
        let mut slots = f.clone();
        for i in 100..140 {
            let p = secret(i);
            slots.extend(t.store_units(&[(0, &p[..])]).pop().unwrap().unwrap());
        }
        let values = raw_values(&c);
        assert!(!values.is_empty());
        let plain = values
            .iter()
            .any(|v| v.windows(12).any(|w| w == b"SECRET-PAGE-"));
        assert_eq!(
            plain, !encrypt,
            "encrypt {encrypt}: plaintext in the cluster"
        );
        let mut v = serde_json::json!({});
        t.to_json(&mut v);
        let reads = v["cluster_read_pipelines"].as_u64().unwrap();
        let mut run = vec![0u8; 16 * PAGE];
        let (n, _) = t.read_run(f[0], 16, &mut run).unwrap();
        assert_eq!(n, 16);
        assert_eq!(run, folio);
        t.to_json(&mut v);
        assert_eq!(
            v["cluster_read_pipelines"].as_u64().unwrap(),
            reads + 1,
            "a run of 16 pages (and its tags) is one pipeline"
        );
        for s in slots {
            t.put(s).unwrap();
        }
        t.close();
        assert_eq!(c.keys(), 0, "keys left: {:?}", c.key_names());
    }
}

fn cluster_args(c: &TestCluster, zswap: &str, cfg: &std::path::Path) -> Vec<String> {
    [
        "--limit",
        "16M",
        "--zswap",
        zswap,
        "--backend",
        &format!("redis-cluster:{}", c.nodes_arg()),
        "--config",
        &cfg.to_string_lossy(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The `[redis_cluster]` settings of the daemon tests: short WAIT and write retries (a batch
/// that cannot be replicated fails fast), reads that wait out a failover.
fn write_cluster_config(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("uffd-cluster-{name}-{}.toml", std::process::id()));
    std::fs::write(
        &p,
        "[redis_cluster]\nreplicas = 1\nwait_timeout_ms = 300\nresponse_timeout_ms = 1000\n\
         write_retry_ms = 500\nread_retry_ms = 30000\n",
    )
    .unwrap();
    p
}

fn assert_cluster_tier(run: &Run, name: &str) {
    assert!(
        run.get("pswpout") > 0,
        "{name}: nothing reached the cluster"
    );
    assert!(run.get("pswpin") > 0, "{name}: nothing was read back");
    assert_eq!(run.stats["backend_encrypted"].as_bool(), Some(true));
    assert_eq!(run.get("backend_auth_failures"), 0, "{name}");
    assert!(run.get("cluster_write_pipelines") > 0, "{name}");
    assert!(run.get("cluster_read_pipelines") > 0, "{name}");
    assert_eq!(run.get("cluster_missing_keys"), 0, "{name}");
}

/// The daemon pages the checker (fork, mremap, munmap...) and the demo's workload to the
/// cluster, with zswap off and with a small pool writing back to it: every page right, and the
/// cluster empty after.
#[test]
fn daemon_pages_programs_to_the_cluster() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !can_test() {
        return;
    }
    let checker = checker();
    let c = TestCluster::start("daemon");
    let cfg = write_cluster_config("daemon");
    for zswap in ["off", "1M"] {
        let name = format!("cluster-zswap-{zswap}");
        let mut args = cluster_args(&c, zswap, &cfg);
        args[1] = "8M".into();
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = run_with(&a, &name, &[&checker, "all"]);
        assert_eq!(run.status, 0, "{name}: the checker found bad pages");
        assert!(run.stdout.contains("checker: ALL OK"), "{name}");
        assert_cluster_tier(&run, &name);
        assert_eq!(run.get("swap_slots_in_use"), 0, "{name}: slots leaked");
        assert_eq!(c.keys(), 0, "{name}: keys left: {:?}", c.key_names());

        let args = cluster_args(&c, zswap, &cfg);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = run_with(&a, &name, &[DAEMON, "workload", "--size", "40M"]);
        assert_eq!(run.status, 0, "{name}: the workload found bad pages");
        assert!(run.stdout.contains("0 bad pages"), "{name}");
        assert_cluster_tier(&run, &name);
        if zswap != "off" {
            assert!(run.get("zswpwb") > 0, "{name}: zswap never wrote back");
        }
        assert_eq!(run.get("cluster_write_failures"), 0, "{name}");
        assert_eq!(c.keys(), 0, "{name}: keys left: {:?}", c.key_names());
    }
    let _ = std::fs::remove_file(cfg);
}

/// Waits until the cluster holds at least `n` keys, while the daemon `d` runs.
fn wait_keys(c: &TestCluster, n: u64, what: &str) {
    let t0 = Instant::now();
    while c.keys() < n {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{what}: the cluster never held {n} keys"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A master SIGKILLed while the daemon pages a program to the cluster, and brought back as a
/// replica after the failover: the program finishes with every page right.
#[test]
fn daemon_survives_a_master_killed_mid_run() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !can_test() {
        return;
    }
    let mut c = TestCluster::start("daemon-kill");
    let cfg = write_cluster_config("daemon-kill");
    for zswap in ["off", "2M"] {
        let name = format!("cluster-kill-zswap-{zswap}");
        let args = cluster_args(&c, zswap, &cfg);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let stats = stats_path(&name);
        let d = Bounded::spawn(
            daemon_command(&a, &stats, &[DAEMON, "workload", "--size", "64M"]),
            &name,
        );
        wait_keys(&c, 3000, &name);
        let victim = c.masters()[0];
        c.kill(victim);
        eprintln!("{name}: killed master {victim} with {} keys", c.keys());
        c.wait_failover(victim);
        c.restart(victim);
        let run = finish_run(&name, d.wait(HANG_GUARD), &stats);
        assert_eq!(run.status, 0, "{name}: the workload failed");
        assert!(run.stdout.contains("0 bad pages"), "{name}");
        assert_cluster_tier(&run, &name);
        assert!(
            run.get("cluster_retries") + run.get("cluster_write_failures") > 0,
            "{name}: the kill went unseen"
        );
        c.wait_healthy(&[]);
        assert_eq!(c.keys(), 0, "{name}: keys left: {:?}", c.key_names());
    }
    let _ = std::fs::remove_file(cfg);
}

/// Pages lost from the cluster (FLUSHALL on every master mid-run): the fault that needs one
/// cannot be served, and the daemon stops the program rather than hand it other bytes.
#[test]
fn a_lost_page_stops_the_program() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !can_test() {
        return;
    }
    let c = TestCluster::start("daemon-lost");
    let cfg = write_cluster_config("daemon-lost");
    let name = "cluster-lost";
    let args = cluster_args(&c, "off", &cfg);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let stats = stats_path(name);
    let d = Bounded::spawn(
        daemon_command(&a, &stats, &[DAEMON, "workload", "--size", "64M"]),
        name,
    );
    wait_keys(&c, 3000, name);
    for m in c.masters() {
        assert!(cli(m, &["flushall"]).contains("OK"));
    }
    let run = finish_run(name, d.wait(HANG_GUARD), &stats);
    assert_eq!(
        run.status,
        128 + libc::SIGKILL,
        "the program was not stopped"
    );
    assert!(!run.stdout.contains("bad pages"), "the program finished");
    assert!(
        run.stderr.contains("cannot read back page") && run.stderr.contains("no such key"),
        "{}",
        run.stderr
    );
    assert!(run.get("cluster_missing_keys") > 0);
    assert_eq!(c.keys(), 0, "keys left: {:?}", c.key_names());
    let _ = std::fs::remove_file(cfg);
}

/// The chain's settings for the daemon tests: the cluster's as above, and a file tier that
/// moves pages down by fill and by age (so that pages reach the cluster in a short run).
fn write_chain_config(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("uffd-chain-{name}-{}.toml", std::process::id()));
    std::fs::write(
        &p,
        "[tiers]\nnear_size = \"8M\"\nmigrate_age_ms = 2000\nmigrate_batch_pages = 128\n\
         [redis_cluster]\nreplicas = 1\nwait_timeout_ms = 300\nresponse_timeout_ms = 1000\n\
         write_retry_ms = 500\nread_retry_ms = 30000\n",
    )
    .unwrap();
    p
}

fn chain_args(c: &TestCluster, zswap: &str, cfg: &std::path::Path) -> Vec<String> {
    [
        "--limit",
        "16M",
        "--zswap",
        zswap,
        "--backend",
        &format!("file,redis-cluster:{}", c.nodes_arg()),
        "--config",
        &cfg.to_string_lossy(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Pages reached all three levels and came back from each: zswap (stored, written back), the
/// file (written, read by faults, moved down) and the cluster (moved into, read by faults),
/// with every page sealed and authenticated and nothing lost.
fn assert_three_levels(run: &Run, name: &str) {
    eprintln!(
        "{name}: zswap out {} wb {} in {}; file out {} in {} migrated {} failures {}; cluster \
         migrated in {} direct {} in {} failures {}; migrate batches {} abandoned {} failures \
         {}; spilled {} + {}",
        run.get("tier_zswap_pgout"),
        run.get("tier_zswap_migrated"),
        run.get("tier_zswap_pgin"),
        run.get("tier_file_pgout"),
        run.get("tier_file_pgin"),
        run.get("tier_file_migrated"),
        run.get("tier_file_failures"),
        run.get("tier_redis_cluster_migrated"),
        run.get("tier_redis_cluster_pgout"),
        run.get("tier_redis_cluster_pgin"),
        run.get("tier_redis_cluster_failures"),
        run.get("chain_migrate_batches"),
        run.get("chain_migrate_abandoned"),
        run.get("chain_migrate_failures"),
        run.get("chain_spilled_full"),
        run.get("chain_spilled_failed"),
    );
    assert_eq!(
        run.stats["tier_chain"].as_str(),
        Some("zswap,file,redis-cluster"),
        "{name}"
    );
    for (counter, what) in [
        ("tier_zswap_pgout", "nothing in zswap"),
        ("tier_zswap_migrated", "zswap never wrote back"),
        ("tier_file_pgout", "nothing reached the file"),
        ("tier_file_pgin", "no fault read the file"),
        ("tier_file_migrated", "nothing moved down"),
        ("tier_redis_cluster_migrated", "nothing reached the cluster"),
        ("tier_redis_cluster_pgin", "no fault read the cluster"),
    ] {
        assert!(run.get(counter) > 0, "{name}: {what}");
    }
    assert_eq!(
        run.stats["backend_encrypted"].as_bool(),
        Some(true),
        "{name}"
    );
    assert_eq!(run.get("backend_auth_failures"), 0, "{name}");
    assert_eq!(run.get("cluster_missing_keys"), 0, "{name}");
    assert_eq!(run.get("swap_slots_in_use"), 0, "{name}: slots leaked");
    // The file's pages either moved down or were read back (a fault frees its slot).
    assert!(
        run.get("tier_file_migrated") + run.get("tier_file_pgin") <= run.get("tier_file_pgout"),
        "{name}: more left the file than entered it"
    );
}

/// The daemon pages the demo's workload (which checks every page) through zswap, a small file
/// tier and the cluster: pages reach all three levels and come back from each, every page
/// right, and the cluster is empty after.
#[test]
fn daemon_pages_through_zswap_a_file_and_the_cluster() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !can_test() {
        return;
    }
    let c = TestCluster::start("chain");
    let cfg = write_chain_config("chain");
    let name = "chain-zswap-file-cluster";
    let args = chain_args(&c, "2M", &cfg);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = run_with(&a, name, &[DAEMON, "workload", "--size", "64M"]);
    assert_eq!(run.status, 0, "{name}: the workload failed: {}", run.stderr);
    assert!(run.stdout.contains("0 bad pages"), "{name}: {}", run.stdout);
    assert_three_levels(&run, name);
    assert_eq!(run.get("tier_file_failures"), 0, "{name}");
    assert_eq!(run.get("tier_redis_cluster_failures"), 0, "{name}");
    assert_eq!(run.get("cluster_write_failures"), 0, "{name}");
    assert_eq!(c.keys(), 0, "{name}: keys left: {:?}", c.key_names());
    let _ = std::fs::remove_file(cfg);
}

/// A master SIGKILLed while the daemon pages through zswap, the file and the cluster, brought
/// back as a replica after the failover: migrations to its slots fail and their pages stay in
/// the file (or resident) until it is back, faults wait out the failover, and the program
/// finishes with every page right.
#[test]
fn daemon_chain_survives_a_master_killed_mid_run() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !can_run() || !can_test() {
        return;
    }
    let mut c = TestCluster::start("chain-kill");
    let cfg = write_chain_config("chain-kill");
    let name = "chain-kill";
    let args = chain_args(&c, "2M", &cfg);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let stats = stats_path(name);
    let d = Bounded::spawn(
        daemon_command(&a, &stats, &[DAEMON, "workload", "--size", "64M"]),
        name,
    );
    wait_keys(&c, 3000, name);
    let victim = c.masters()[0];
    c.kill(victim);
    eprintln!("{name}: killed master {victim} with {} keys", c.keys());
    c.wait_failover(victim);
    c.restart(victim);
    let run = finish_run(name, d.wait(HANG_GUARD), &stats);
    assert_eq!(run.status, 0, "{name}: the workload failed: {}", run.stderr);
    assert!(run.stdout.contains("0 bad pages"), "{name}: {}", run.stdout);
    assert_three_levels(&run, name);
    assert!(
        run.get("cluster_retries") + run.get("cluster_write_failures") > 0,
        "{name}: the kill went unseen"
    );
    c.wait_healthy(&[]);
    assert_eq!(c.keys(), 0, "{name}: keys left: {:?}", c.key_names());
    let _ = std::fs::remove_file(cfg);
}
