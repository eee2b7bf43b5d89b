//! Report section `daemon`: the fault path of uffd-daemon against a bare userfaultfd handler.
//!
//! Side by side, in one run, on this machine:
//! * fault service latency (p50, p99) and fault throughput for a zero-fill fault and for a page
//!   restored from the store, through the daemon (a client program under `uffd-daemon run`),
//!   and through a bare handler (a thread in this process doing `UFFDIO_ZEROPAGE` /
//!   `UFFDIO_COPY` for a toucher thread, the minimal design);
//! * eviction throughput (MiB/s) while a client writes 4x the limit;
//! * the share of faults served on the faulting thread's CPU and handler wakeups per fault.
//!
//! Latencies are measured inside the client, around the first access to each page, so they
//! include the whole round trip (fault, handler wakeup, service, wake of the faulting thread).

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use uffd_daemon::sys::{self, Fill, RawUffdMsg, Uffd, UffdEvent, PAGE_SIZE};

use uffd_daemon::config::{AccessMode, Overrides, PolicyKind};

use super::{Options, Report};

/// Argument that makes the report binary act as the measured client.
pub const CLIENT_ARG: &str = "__fault-client";

fn map(bytes: usize) -> *mut u8 {
    uffd_daemon::sys::map_anonymous(bytes).expect("mmap")
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Touches every page of `base` once (a write of one byte), timing each access.
fn touch_timed(base: *mut u8, pages: usize, write: bool) -> Vec<u64> {
    let mut lat = Vec::with_capacity(pages);
    for i in 0..pages {
        let t = Instant::now();
        // SAFETY: `i` is within the mapping.
        unsafe {
            let p = base.add(i * PAGE_SIZE);
            if write {
                std::ptr::write_volatile(p, (i as u8) | 1);
            } else {
                std::ptr::read_volatile(p);
            }
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    lat
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Reads one byte of each page in `order`, timing each access.
fn touch_timed_order(base: *mut u8, order: &[usize]) -> Vec<u64> {
    let mut lat = Vec::with_capacity(order.len());
    for &i in order {
        let t = Instant::now();
        // SAFETY: the caller's indices are within the mapping.
        unsafe { std::ptr::read_volatile(base.add(i * PAGE_SIZE)) };
        lat.push(t.elapsed().as_nanos() as u64);
    }
    lat
}

fn summary(mut lat: Vec<u64>, elapsed_s: f64) -> serde_json::Value {
    let n = lat.len();
    lat.sort_unstable();
    json!({
        "faults": n,
        "p50_us": percentile(&lat, 0.5) as f64 / 1000.0,
        "p99_us": percentile(&lat, 0.99) as f64 / 1000.0,
        "faults_per_s": n as f64 / elapsed_s,
    })
}

/// The client side, run under the daemon: `__fault-client <mode> <pages> <evict_pages>`.
/// Prints one JSON line.
pub fn client_main(args: &[String]) -> i32 {
    let mode = args.first().map(String::as_str).unwrap_or("zero");
    let pages: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(16384);
    let out = match mode {
        // First touch of never-written pages: zero fills.
        "zero" => {
            let base = map(pages * PAGE_SIZE);
            let t = Instant::now();
            let lat = touch_timed(base, pages, true);
            summary(lat, t.elapsed().as_secs_f64())
        }
        // Fill 4x the limit (eviction throughput), then read the oldest pages back: restores.
        "restore" => {
            let base = map(pages * PAGE_SIZE);
            let t = Instant::now();
            for i in 0..pages {
                // SAFETY: within the mapping; fills each page so that it is stored, not zero.
                unsafe {
                    std::ptr::write_bytes(base.add(i * PAGE_SIZE), (i % 251) as u8 | 1, PAGE_SIZE)
                };
            }
            let fill_s = t.elapsed().as_secs_f64();
            let probe = pages / 2; // the first half was evicted long ago
                                   // In a scattered order (a stride coprime with the count), so that every touch is
                                   // a single fault: sequential touches would be served by readahead.
            let stride = (1..)
                .map(|k| 7919 * k)
                .find(|s| gcd(*s, probe) == 1)
                .unwrap_or(1);
            let order: Vec<usize> = (0..probe).map(|k| k * stride % probe).collect();
            let t = Instant::now();
            let lat = touch_timed_order(base, &order);
            let mut bad = 0;
            for i in 0..probe {
                // SAFETY: within the mapping.
                let b = unsafe { std::ptr::read_volatile(base.add(i * PAGE_SIZE + 100)) };
                if b != (i % 251) as u8 | 1 {
                    bad += 1;
                }
            }
            let mut v = summary(lat, t.elapsed().as_secs_f64());
            v["fill_s"] = fill_s.into();
            v["fill_mib"] = ((pages * PAGE_SIZE) >> 20).into();
            v["bad_pages"] = bad.into();
            v
        }
        // A skewed workload for the replacement policy: `pages` pages, the first
        // `pages / 8` hot. Every page is written once; then `touches` random touches go 90% to
        // the hot pages and 10% to the rest, each checking the page's tag and writing it.
        "skew" => {
            let touches: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(200_000);
            let base = map(pages * PAGE_SIZE);
            let tag = |i: usize, gen: u64| ((i as u64).wrapping_mul(0x9E37_79B9) ^ gen) | 1;
            let mut gens = vec![0u64; pages];
            for i in 0..pages {
                // SAFETY: within the mapping; each page gets a tag in its first and a
                // compressible body.
                unsafe {
                    let p = base.add(i * PAGE_SIZE);
                    std::ptr::write_bytes(p, (i % 7) as u8, PAGE_SIZE);
                    std::ptr::write_volatile(p.cast::<u64>(), tag(i, 0));
                }
            }
            let hot = (pages / 8).max(1);
            let mut x: u64 = 0x2545_F491_4F6C_DD1D;
            let mut bad = 0u64;
            let t = Instant::now();
            for _ in 0..touches {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = if x % 10 != 0 {
                    (x >> 8) as usize % hot
                } else {
                    hot + (x >> 8) as usize % (pages - hot).max(1)
                };
                // SAFETY: `i` is within the mapping.
                unsafe {
                    let p = base.add(i * PAGE_SIZE).cast::<u64>();
                    if std::ptr::read_volatile(p) != tag(i, gens[i]) {
                        bad += 1;
                    }
                    gens[i] += 1;
                    std::ptr::write_volatile(p, tag(i, gens[i]));
                }
            }
            let secs = t.elapsed().as_secs_f64();
            json!({"touches": touches, "touches_per_s": touches as f64 / secs, "bad_pages": bad})
        }
        other => {
            eprintln!("fault client: unknown mode {other}");
            return 2;
        }
    };
    println!("{out}");
    i32::from(out.get("bad_pages").and_then(|b| b.as_u64()).unwrap_or(0) != 0)
}

/// A bare userfaultfd handler in this process: one thread, poll + read + fill, no bookkeeping.
fn bare(
    pages: usize,
    restore: bool,
    pin: Option<(usize, usize)>,
) -> anyhow::Result<serde_json::Value> {
    let (uffd, _) = Uffd::create_local(sys::UFFD_FEATURE_THREAD_ID)?;
    let base = map(pages * PAGE_SIZE);
    uffd.register(base as u64, (pages * PAGE_SIZE) as u64, false)?;
    let uffd = Arc::new(uffd);
    let stop = Arc::new(AtomicBool::new(false));
    let h = {
        let (uffd, stop) = (Arc::clone(&uffd), Arc::clone(&stop));
        std::thread::spawn(move || {
            if let Some((handler_cpu, _)) = pin {
                sys::pin_to_cpu(handler_cpu);
            }
            let page = vec![0x5au8; PAGE_SIZE];
            let mut msgs: [RawUffdMsg; 16] = std::array::from_fn(|_| RawUffdMsg::default());
            let mut served = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if !matches!(sys::poll_read(&[uffd.as_fd()], 50).as_deref(), Ok([true])) {
                    continue;
                }
                let n = uffd.read_msgs(&mut msgs).unwrap_or(0);
                for m in &msgs[..n] {
                    if let UffdEvent::PageFault { address, .. } = m.decode() {
                        let r = if restore {
                            uffd.copy(address, &page)
                        } else {
                            uffd.zeropage(address)
                        };
                        if matches!(r, Ok(Fill::Filled) | Ok(Fill::Exists)) {
                            served += 1;
                        }
                    }
                }
            }
            (served, sys::thread_voluntary_switches())
        })
    };
    if let Some((_, toucher_cpu)) = pin {
        sys::pin_to_cpu(toucher_cpu);
    }
    let t = Instant::now();
    let lat = touch_timed(base, pages, false);
    let elapsed = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (served, wakeups) = h
        .join()
        .map_err(|_| anyhow::anyhow!("bare handler panicked"))?;
    // Unpin this thread again.
    // SAFETY: cpu_set_t is plain data; setting all CPUs.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in 0..libc::CPU_SETSIZE as usize {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        libc::munmap(base.cast(), pages * PAGE_SIZE);
    }
    let mut v = summary(lat, elapsed);
    v["wakeups_per_fault"] = (wakeups as f64 / served.max(1) as f64).into();
    Ok(v)
}

fn under_daemon(
    limit: u64,
    mode: &str,
    pages: usize,
) -> anyhow::Result<(serde_json::Value, serde_json::Value)> {
    under_daemon_with(limit, mode, &[pages.to_string()], &Overrides::default())
}

fn under_daemon_with(
    limit: u64,
    mode: &str,
    client_args: &[String],
    o: &Overrides,
) -> anyhow::Result<(serde_json::Value, serde_json::Value)> {
    let exe = std::env::current_exe()?;
    let stats_path =
        std::env::temp_dir().join(format!("uffd-bench-{}-{mode}.json", std::process::id()));
    let out_path =
        std::env::temp_dir().join(format!("uffd-bench-{}-{mode}.out", std::process::id()));
    let r = uffd_daemon::config::resolve(
        None,
        &Overrides {
            limit: Some(limit),
            ..o.clone()
        },
    )?;
    let config = uffd_daemon::Config {
        limit_bytes: r.limit,
        auto_limit: r.auto,
        tiers: r.tiers,
        policy: r.policy,
        stats_json: Some(stats_path.clone()),
    };
    let status = uffd_daemon::run(
        &config,
        "sh",
        &[
            "-c".into(),
            format!(
                "exec \"$0\" {CLIENT_ARG} {mode} {} > {}",
                client_args.join(" "),
                out_path.display()
            ),
            exe.to_string_lossy().into_owned(),
        ],
    )?;
    anyhow::ensure!(status == 0, "the {mode} client failed with status {status}");
    let client: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&out_path)?.trim())?;
    let stats: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats_path)?)?;
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&stats_path);
    Ok((client, stats))
}

/// Runs the section.
pub fn run(opts: &Options) -> anyhow::Result<Report> {
    let zero_pages = if opts.quick { 16384 } else { 65536 };
    let limit: u64 = if opts.quick { 32 << 20 } else { 128 << 20 };
    let restore_pages = (4 * limit / PAGE_SIZE as u64) as usize;

    let bare_zero = bare(zero_pages, false, None)?;
    let bare_copy = bare(zero_pages, true, None)?;
    let bare_same_cpu = bare(zero_pages, true, Some((0, 0)))?;
    let bare_other_cpu = bare(zero_pages, true, Some((1, 0)))?;

    // Zero fills under a limit above the footprint (no reclaim).
    let (d_zero, s_zero) = under_daemon((zero_pages * PAGE_SIZE) as u64 * 2, "zero", zero_pages)?;
    // Restores: the client fills 4x the limit, then reads the oldest half back.
    let (d_restore, s_restore) = under_daemon(limit, "restore", restore_pages)?;
    anyhow::ensure!(
        d_restore["bad_pages"].as_u64() == Some(0),
        "restored pages did not verify"
    );

    // The replacement policy and its access source on a skewed workload: misses (restores)
    // per 1000 touches, the machine-independent figure, and touches per second.
    let skew_pages = (4 * limit / PAGE_SIZE as u64) as usize;
    let touches = if opts.quick { 100_000 } else { 400_000 };
    let mut policies = serde_json::Map::new();
    for (name, kind, access) in [
        ("clock/faults", PolicyKind::Clock, AccessMode::Faults),
        ("mglru/faults", PolicyKind::Mglru, AccessMode::Faults),
        ("clock/faults+wp", PolicyKind::Clock, AccessMode::FaultsWp),
        ("mglru/faults+wp", PolicyKind::Mglru, AccessMode::FaultsWp),
    ] {
        let o = Overrides {
            policy: Some(kind),
            access: Some(access),
            ..Overrides::default()
        };
        let (c, st) = under_daemon_with(
            limit,
            "skew",
            &[skew_pages.to_string(), touches.to_string()],
            &o,
        )?;
        anyhow::ensure!(c["bad_pages"].as_u64() == Some(0), "{name}: bad pages");
        let misses = st["swapins"].as_u64().unwrap_or(0);
        policies.insert(
            name.into(),
            json!({
                "misses_per_1000_touches": misses as f64 * 1000.0 / touches as f64,
                "touches_per_s": c["touches_per_s"],
                "wp_access_faults": st["wp_access_faults"],
                "evicted_pages": st["evicted_pages"],
            }),
        );
    }
    let g = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0) as f64;
    let evict_mib_s = g(&s_restore, "evicted_pages") * PAGE_SIZE as f64
        / (1 << 20) as f64
        / d_restore["fill_s"].as_f64().unwrap_or(1.0).max(1e-9);
    let local_share =
        g(&s_restore, "faults_local_cpu") / g(&s_restore, "faults_cpu_known").max(1.0);
    let wakeups_per_fault = (g(&s_zero, "handler_wakeups") + g(&s_restore, "handler_wakeups"))
        / (g(&s_zero, "faults") + g(&s_restore, "faults")).max(1.0);

    let json = json!({
        "fault_latency": {
            "daemon_zero_fill": d_zero,
            "daemon_restore": d_restore,
            "bare_zeropage": bare_zero,
            "bare_copy": bare_copy,
            "bare_copy_same_cpu_pinned": bare_same_cpu,
            "bare_copy_other_cpu_pinned": bare_other_cpu,
        },
        "eviction_mib_per_s": evict_mib_s,
        "faults_on_faulting_cpu_share": local_share,
        "handler_wakeups_per_fault": wakeups_per_fault,
        "daemon_stats_restore": s_restore,
        "policy_skewed_90_10": policies,
        "limit_mib": limit >> 20,
    });
    let row = |name: &str, v: &serde_json::Value| {
        format!(
            "{name:<34} {:>9.1} {:>9.1} {:>12.0}\n",
            v["p50_us"].as_f64().unwrap_or(0.0),
            v["p99_us"].as_f64().unwrap_or(0.0),
            v["faults_per_s"].as_f64().unwrap_or(0.0)
        )
    };
    let mut table = format!(
        "{:<34} {:>9} {:>9} {:>12}\n",
        "fault path", "p50 us", "p99 us", "faults/s"
    );
    table += &row(
        "daemon: zero fill",
        &json["fault_latency"]["daemon_zero_fill"],
    );
    table += &row("bare handler: UFFDIO_ZEROPAGE", &bare_zero);
    table += &row(
        "daemon: restore from zswap (lz4)",
        &json["fault_latency"]["daemon_restore"],
    );
    table += &row("bare handler: UFFDIO_COPY", &bare_copy);
    table += &row("bare handler: COPY, same CPU", &bare_same_cpu);
    table += &row("bare handler: COPY, other CPU", &bare_other_cpu);
    table += &format!(
        "eviction throughput: {evict_mib_s:.0} MiB/s (client writing {} MiB under {} MiB)\n",
        (restore_pages * PAGE_SIZE) >> 20,
        limit >> 20
    );
    table += &format!(
        "faults served on the faulting thread's CPU: {:.0}%\n",
        local_share * 100.0
    );
    table += &format!("handler wakeups per fault: {wakeups_per_fault:.2}\n");
    table += &format!(
        "\npolicy on a 90/10 skew ({} MiB, hot {} MiB, limit {} MiB, {touches} touches):\n{:<18} {:>14} {:>12} {:>12}\n",
        (skew_pages * PAGE_SIZE) >> 20,
        (skew_pages / 8 * PAGE_SIZE) >> 20,
        limit >> 20,
        "policy/access",
        "misses/1000",
        "touches/s",
        "wp faults"
    );
    for (name, v) in &json["policy_skewed_90_10"]
        .as_object()
        .cloned()
        .unwrap_or_default()
    {
        table += &format!(
            "{name:<18} {:>14.1} {:>12.0} {:>12}\n",
            v["misses_per_1000_touches"].as_f64().unwrap_or(0.0),
            v["touches_per_s"].as_f64().unwrap_or(0.0),
            v["wp_access_faults"].as_u64().unwrap_or(0)
        );
    }
    Ok(Report { json, table })
}
