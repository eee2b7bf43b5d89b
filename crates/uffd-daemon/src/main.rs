//! `uffd-daemon`: the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use uffd_daemon::config::{self, Overrides};
use uffd_daemon::tiers::BackendSpec;
use uffd_daemon::{parse_size, Config};

#[derive(Parser, Debug)]
#[command(
    name = "uffd-daemon",
    version,
    about = "Pages the anonymous memory of unmodified programs from userspace (userfaultfd)"
)]
struct Cli {
    /// More messages: each -v one level more (debug: every decision and the final counters;
    /// trace). UFFD_DAEMON_LOG (a tracing filter, e.g. `uffd_daemon::fault=debug`) overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Fewer messages: -q warnings and errors only, -qq errors only.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    quiet: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

// (Parsed once at start: the size of its largest variant costs nothing.)
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run PROGRAM under the daemon, keeping its resident anonymous memory under --limit.
    Run {
        /// Resident limit for the whole process tree (e.g. 256M, 1G); or `auto`, a limit set
        /// from the tree's memory stall (`auto:1G`: with a hard ceiling); or `limit` in --config.
        #[arg(long, value_parser = parse_limit)]
        limit: Option<LimitArg>,
        /// Under --limit auto: the stall to keep under, in percent of wall time (default 1).
        #[arg(long, value_parser = parse_pct)]
        stall_target: Option<f64>,
        /// Under --limit auto: the limit never goes below this (default 16M).
        #[arg(long, value_parser = parse_size)]
        limit_floor: Option<u64>,
        /// Configuration file (TOML; see the README). Options given here override it.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The backing device below zswap: none, file (an unnamed temporary file in
        /// /var/tmp), file:PATH (created 0600, must not exist, removed at exit), pmem:PATH
        /// (a DAX device, a file on a DAX mount, or a file mapped as simulated pmem) or
        /// redis-cluster:HOST:PORT[,HOST:PORT...] (a Redis Cluster; [redis_cluster] in the
        /// config file for a password, timeouts and the replicas to wait for); or a chain of
        /// two, NEAR,FAR: file,redis-cluster:HOST:PORT,... (pages go to the file, and its
        /// oldest move to the cluster as it fills; --near-size, [tiers] migrate_*).
        #[arg(long, value_parser = BackendSpec::parse)]
        backend: Option<BackendSpec>,
        /// Same as --backend file:PATH.
        #[arg(long, conflicts_with = "backend")]
        swap_file: Option<PathBuf>,
        /// Size of the swap space (slots, and the backing device). Default 8G.
        #[arg(long, value_parser = parse_size, alias = "swap-max")]
        swap_size: Option<u64>,
        /// A chain's first tier (the file of --backend file,redis-cluster:...): its size.
        /// Default a quarter of the swap space.
        #[arg(long, value_parser = parse_size)]
        near_size: Option<u64>,
        /// The zswap pool limit (e.g. 512M), or `off` to write evicted pages straight to the
        /// backing device. Default: on, 20% of RAM as the kernel's max_pool_percent.
        #[arg(long, value_parser = parse_zswap)]
        zswap: Option<ZswapArg>,
        /// zswap's compressor: lz4, zstd, zstd:LEVEL, deflate, deflate-iaa. Default lz4.
        #[arg(long, value_parser = config::parse_compressor)]
        compressor: Option<zswap::Compressor>,
        /// Replacement policy: mglru or clock. Default mglru.
        #[arg(long, value_parser = config::parse_policy)]
        policy: Option<config::PolicyKind>,
        /// Access source of the policy: faults or faults+wp. Default faults.
        #[arg(long, value_parser = config::parse_access)]
        access: Option<config::AccessMode>,
        /// Memory of the tree the daemon cannot manage (static or set-ID programs, shared or
        /// locked memory): `warn` counts it and says it once per process (default), `error`
        /// refuses such a program at start and stops the tree when it finds one later.
        #[arg(long, value_parser = uffd_daemon::unmanaged::Policy::parse)]
        unmanaged: Option<uffd_daemon::unmanaged::Policy>,
        /// Encryption at rest, on or off: every page written to the backing device sealed with
        /// AES-256-GCM under a key made at start and held only in the daemon's locked memory,
        /// and authenticated when read back. Default on.
        #[arg(long, value_parser = config::parse_on_off, value_name = "on|off")]
        encrypt: Option<bool>,
        /// Write the final counters as JSON to this file.
        #[arg(long)]
        stats_json: Option<PathBuf>,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// The built-in demo: 512 MiB of checksummed pages under a 128 MiB limit, every page verified.
    Demo {
        /// Size of the demo array.
        #[arg(long, value_parser = parse_size, default_value = "512M")]
        size: u64,
        /// Resident limit.
        #[arg(long, value_parser = parse_size, default_value = "128M")]
        limit: u64,
    },
    /// Print the counters of running daemons (all, or the one with this pid) as JSON.
    Stat {
        /// The daemon's pid.
        #[arg(long)]
        pid: Option<u32>,
        /// The Prometheus text format instead of JSON.
        #[arg(long)]
        prometheus: bool,
    },
    /// The demo's workload itself (what `demo` runs under the daemon).
    #[command(hide = true)]
    Workload {
        #[arg(long, value_parser = parse_size, default_value = "512M")]
        size: u64,
        #[arg(long, default_value_t = 0x5eed)]
        seed: u64,
    },
}

/// `--zswap SIZE|off`.
#[derive(Debug, Clone, Copy)]
struct ZswapArg(Option<u64>);

fn parse_zswap(s: &str) -> Result<ZswapArg, String> {
    match s {
        "off" | "none" => Ok(ZswapArg(None)),
        _ => parse_size(s).map(|n| ZswapArg(Some(n))),
    }
}

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("uffd-daemon: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `--limit`: a size, or `auto` with an optional ceiling.
#[derive(Debug, Clone, Copy)]
enum LimitArg {
    Fixed(u64),
    Auto(Option<u64>),
}

fn parse_limit(s: &str) -> Result<LimitArg, String> {
    match s.strip_prefix("auto") {
        Some("") => Ok(LimitArg::Auto(None)),
        Some(rest) => match rest.strip_prefix(':') {
            Some(c) => parse_size(c)
                .map(|c| LimitArg::Auto(Some(c)))
                .map_err(|e| format!("the ceiling of auto: {e}")),
            None => Err(format!("{s:?}: expected a size, auto or auto:CEILING")),
        },
        None => parse_size(s).map(LimitArg::Fixed),
    }
}

fn parse_pct(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{s:?}: expected a percentage such as 1 or 0.5%"))?;
    if v > 0.0 && v <= 100.0 {
        Ok(v)
    } else {
        Err(format!("{s:?}: a share of wall time in (0, 100]"))
    }
}

fn real_main() -> anyhow::Result<i32> {
    let cli = Cli::parse();
    uffd_daemon::log::init(i32::from(cli.verbose) - i32::from(cli.quiet));
    match cli.cmd {
        Cmd::Run {
            limit,
            stall_target,
            limit_floor,
            config: config_path,
            backend,
            swap_file,
            swap_size,
            near_size,
            zswap,
            compressor,
            policy,
            access,
            unmanaged,
            encrypt,
            stats_json,
            command,
        } => {
            let (limit, auto_limit) = match limit {
                Some(LimitArg::Fixed(l)) => (Some(l), None),
                Some(LimitArg::Auto(ceiling)) => (ceiling, Some(true)),
                None => (None, None),
            };
            let o = Overrides {
                limit,
                auto_limit,
                limit_floor,
                stall_target,
                backend: backend.or(swap_file.map(|p| BackendSpec::File(Some(p)))),
                swap_size,
                near_size,
                zswap: zswap.map(|z| z.0),
                compressor,
                policy,
                access,
                unmanaged,
                encrypt,
            };
            let r = config::resolve(config_path.as_deref(), &o)?;
            let config = Config {
                limit_bytes: r.limit,
                auto_limit: r.auto,
                tiers: r.tiers,
                policy: r.policy,
                stats_json,
            };
            uffd_daemon::run(&config, &command[0], &command[1..])
        }
        Cmd::Demo { size, limit } => demo(size, limit),
        Cmd::Stat { pid, prometheus } => stat(pid, prometheus),
        Cmd::Workload { size, seed } => Ok(if uffd_daemon::demo::workload(size, seed) == 0 {
            0
        } else {
            1
        }),
    }
}

fn demo(size: u64, limit: u64) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let stats_path = std::env::temp_dir().join(format!("uffd-demo-{}.json", std::process::id()));
    println!(
        "demo: {} MiB of checksummed pages under a {} MiB limit",
        size >> 20,
        limit >> 20
    );
    // All the tiers at work: a zswap pool smaller than what is evicted, so that its
    // shrinker writes the coldest pages back to an unnamed swap file.
    let r = config::resolve(
        None,
        &Overrides {
            limit: Some(limit),
            swap_size: Some(4 * size + (64 << 20)),
            zswap: Some(Some((size / 8).max(4 << 20))),
            ..Overrides::default()
        },
    )?;
    println!(
        "demo: tiers: zswap lz4 with a {} MiB pool, then an unnamed swap file; policy mglru",
        (size / 8).max(4 << 20) >> 20
    );
    let config = Config {
        limit_bytes: r.limit,
        auto_limit: r.auto,
        tiers: r.tiers,
        policy: r.policy,
        stats_json: Some(stats_path.clone()),
    };
    let t = std::time::Instant::now();
    let status = uffd_daemon::run(
        &config,
        &exe.to_string_lossy(),
        &["workload".into(), "--size".into(), size.to_string()],
    )?;
    let elapsed = t.elapsed().as_secs_f64();
    let stats: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats_path)?)?;
    let _ = std::fs::remove_file(&stats_path);
    let g = |k: &str| stats[k].as_u64().unwrap_or(0);
    println!(
        "demo: faults {} (zero fills {}, restored {}), evicted {} pages, written {} MiB, read {} MiB, \
         resident max {} MiB (limit {} MiB), elapsed {elapsed:.2}s",
        g("faults"),
        g("zero_fills"),
        g("swapins"),
        g("evicted_pages"),
        g("bytes_written") >> 20,
        g("bytes_read") >> 20,
        (g("resident_pages_max") * 4096) >> 20,
        limit >> 20
    );
    println!(
        "demo: zswpout {} zswpin {} zswpwb {} pswpout {} pswpin {}, pool {} MiB (ratio {:.2}), \
         restore p50 from zswap {} us",
        g("zswpout"),
        g("zswpin"),
        g("zswpwb"),
        g("pswpout"),
        g("pswpin"),
        g("zswap_pool_bytes") >> 20,
        stats["zswap_compression_ratio"].as_f64().unwrap_or(0.0),
        stats["fault_zswap_p50_us"].as_f64().unwrap_or(0.0),
    );
    if status == 0 {
        println!("demo: every page verified");
    } else {
        println!("demo: FAILED (workload exit status {status})");
    }
    Ok(status)
}

fn stat(pid: Option<u32>, prometheus: bool) -> anyhow::Result<i32> {
    use std::io::Read;
    let base = uffd_daemon::run_base();
    let dirs: Vec<PathBuf> = match pid {
        Some(p) => vec![base.join(p.to_string())],
        None => std::fs::read_dir(&base)
            .with_context(|| format!("no running daemon ({} is absent)", base.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect(),
    };
    let mut found = 0;
    for d in dirs {
        let Ok(mut s) = std::os::unix::net::UnixStream::connect(d.join("ctl.sock")) else {
            continue;
        };
        // A daemon that is stopped (SIGSTOP) or stuck must not hang the others' report.
        s.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
        let mut out = String::new();
        if let Err(e) = s.read_to_string(&mut out) {
            eprintln!(
                "uffd-daemon stat: {} did not answer ({e}); skipped",
                d.display()
            );
            continue;
        }
        let name = d
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // `<pid>`, or `<pid>-<n>` beside a daemon of another pid namespace with the same number.
        let Some(daemon_pid) = uffd_daemon::run_dir_pid(&name) else {
            continue;
        };
        if prometheus {
            let v: serde_json::Value = serde_json::from_str(out.trim())
                .with_context(|| format!("{} answered something that is not JSON", d.display()))?;
            print!("{}", uffd_daemon::stats::prometheus_text(&name, &v));
        } else {
            println!(
                "{{\"daemon_pid\": {daemon_pid}, \"stats\": {}}}",
                out.trim()
            );
        }
        found += 1;
    }
    if found == 0 {
        anyhow::bail!("no running uffd-daemon found under {}", base.display());
    }
    Ok(0)
}
