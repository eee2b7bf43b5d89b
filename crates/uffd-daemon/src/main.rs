//! `uffd-daemon`: the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use uffd_daemon::{parse_size, Config};

#[derive(Parser, Debug)]
#[command(
    name = "uffd-daemon",
    version,
    about = "Pages the anonymous memory of unmodified programs from userspace (userfaultfd)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run PROGRAM under the daemon, keeping its resident anonymous memory under --limit.
    Run {
        /// Resident limit for the whole process tree (e.g. 256M, 1G).
        #[arg(long, value_parser = parse_size)]
        limit: u64,
        /// Swap file to create (mode 0600; must not exist; removed at exit). Default: an
        /// unnamed temporary file in /var/tmp.
        #[arg(long)]
        swap_file: Option<PathBuf>,
        /// Largest size of the swap file.
        #[arg(long, value_parser = parse_size, default_value = "64G")]
        swap_max: u64,
        /// Write the final counters as JSON to this file.
        #[arg(long)]
        stats_json: Option<PathBuf>,
        /// Log decisions and the final counters to stderr.
        #[arg(long, short)]
        verbose: bool,
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

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("uffd-daemon: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn real_main() -> anyhow::Result<i32> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Run {
            limit,
            swap_file,
            swap_max,
            stats_json,
            verbose,
            command,
        } => {
            let config = Config {
                limit_bytes: limit,
                swap_file,
                swap_max_bytes: swap_max,
                stats_json,
                verbose,
            };
            uffd_daemon::run(&config, &command[0], &command[1..])
        }
        Cmd::Demo { size, limit } => demo(size, limit),
        Cmd::Stat { pid } => stat(pid),
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
    let config = Config {
        limit_bytes: limit,
        swap_file: None,
        swap_max_bytes: 4 * size + (64 << 20),
        stats_json: Some(stats_path.clone()),
        verbose: false,
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
    if status == 0 {
        println!("demo: every page verified");
    } else {
        println!("demo: FAILED (workload exit status {status})");
    }
    Ok(status)
}

fn stat(pid: Option<u32>) -> anyhow::Result<i32> {
    use std::io::Read;
    let base = uffd_daemon::default_run_base();
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
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        let name = d
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        println!("{{\"daemon_pid\": {name}, \"stats\": {}}}", out.trim());
        found += 1;
    }
    if found == 0 {
        anyhow::bail!("no running uffd-daemon found under {}", base.display());
    }
    Ok(0)
}
