//! The setups a workload runs under, and the one place where a daemon setup becomes the
//! daemon's command line.

use std::path::Path;

/// Where pages go when the program's resident memory exceeds the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Setup {
    /// The daemon with no tier flags: whatever `uffd-daemon run --limit L` does by default.
    DaemonDefault,
    /// The daemon, compressed pool only (`--backend none --zswap SIZE`).
    DaemonZswap,
    /// The daemon, compressed pool in front of a swap file.
    DaemonZswapFile,
    /// The daemon, swap file only.
    DaemonFile,
    /// `file` with encryption at rest off (`--encrypt off`).
    DaemonFilePlain,
    /// `default` with encryption at rest off (`--encrypt off`).
    DaemonDefaultPlain,
    /// The daemon, a simulated persistent-memory file (on tmpfs) only.
    DaemonPmem,
    /// The kernel: a swap file on the disk of /var/tmp, cgroup v1 limit.
    KernelSwap,
    /// The kernel: the same swap file with zswap (lzo) in front, its pool capped at about the
    /// limit (`max_pool_percent` = limit/RAM, at least 1): the like-for-like row.
    KernelZswap,
    /// The kernel: zswap at the kernel's defaults (`max_pool_percent` 20, the kernel's default
    /// compressor, acceptance threshold and shrinker setting) in front of the swap file.
    KernelZswapDefault,
    /// The kernel: a zram device (lzo-rle or lzo) as swap.
    KernelZram,
    /// No limit, no swap: the program alone (the reference for slowdowns).
    Bare,
}

/// Every setup, in the order they are listed.
pub const ALL: [Setup; 12] = [
    Setup::DaemonZswap,
    Setup::DaemonZswapFile,
    Setup::DaemonFile,
    Setup::DaemonFilePlain,
    Setup::DaemonPmem,
    Setup::DaemonDefault,
    Setup::DaemonDefaultPlain,
    Setup::KernelSwap,
    Setup::KernelZswap,
    Setup::KernelZswapDefault,
    Setup::KernelZram,
    Setup::Bare,
];

/// The setups run when `--setups` is not given: each daemon tier setup, and the kernel's swap
/// at its defaults beside the like-for-like `kzswap`.
pub const DEFAULT: [Setup; 9] = [
    Setup::DaemonZswap,
    Setup::DaemonZswapFile,
    Setup::DaemonFile,
    Setup::DaemonPmem,
    Setup::DaemonDefault,
    Setup::KernelSwap,
    Setup::KernelZswap,
    Setup::KernelZswapDefault,
    Setup::KernelZram,
];

impl Setup {
    /// The name used on the command line and in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Setup::DaemonDefault => "default",
            Setup::DaemonZswap => "zswap",
            Setup::DaemonZswapFile => "zswap+file",
            Setup::DaemonFile => "file",
            Setup::DaemonFilePlain => "file-plain",
            Setup::DaemonDefaultPlain => "default-plain",
            Setup::DaemonPmem => "pmem",
            Setup::KernelSwap => "kswap",
            Setup::KernelZswap => "kzswap",
            Setup::KernelZswapDefault => "kzswap-default",
            Setup::KernelZram => "zram",
            Setup::Bare => "bare",
        }
    }

    /// Parses a setup name.
    pub fn parse(s: &str) -> Result<Self, String> {
        ALL.iter().copied().find(|x| x.name() == s).ok_or_else(|| {
            format!(
                "unknown setup {s:?}; allowed: {}",
                ALL.iter().map(|x| x.name()).collect::<Vec<_>>().join(", ")
            )
        })
    }

    /// True for the daemon's setups.
    pub fn is_daemon(self) -> bool {
        !self.is_kernel() && self != Setup::Bare
    }

    /// True for the kernel's swap setups (a memory cgroup and a swap area).
    pub fn is_kernel(self) -> bool {
        matches!(
            self,
            Setup::KernelSwap | Setup::KernelZswap | Setup::KernelZswapDefault | Setup::KernelZram
        )
    }

    /// One-line description for the report.
    pub fn describe(self) -> &'static str {
        match self {
            Setup::DaemonDefault => "uffd-daemon, no tier flags (its default store)",
            Setup::DaemonZswap => "uffd-daemon, compressed pool only (lz4), pool 4x limit",
            Setup::DaemonZswapFile => {
                "uffd-daemon, compressed pool (lz4, pool = limit) + swap file"
            }
            Setup::DaemonFile => "uffd-daemon, swap file only (pages sealed: AES-256-GCM)",
            Setup::DaemonFilePlain => "uffd-daemon, swap file only, --encrypt off",
            Setup::DaemonDefaultPlain => "uffd-daemon, no tier flags but --encrypt off",
            Setup::DaemonPmem => "uffd-daemon, simulated pmem file on tmpfs only",
            Setup::KernelSwap => "kernel swap file on the disk of /var/tmp, memcg v1 limit",
            Setup::KernelZswap => "kernel zswap (lzo, pool ~limit) + swap file, memcg v1 limit",
            Setup::KernelZswapDefault => {
                "kernel zswap at its defaults (max_pool_percent 20, default compressor) + swap \
                 file, memcg v1 limit"
            }
            Setup::KernelZram => "kernel zram swap (lzo-rle), memcg v1 limit",
            Setup::Bare => "the program alone: no limit, no swap",
        }
    }
}

/// Files a daemon setup's tier lives in (created by the daemon, removed by the driver after).
#[derive(Debug, Clone)]
pub struct DaemonPaths<'a> {
    /// The swap file of `file` and `zswap+file`.
    pub swap_file: &'a Path,
    /// The simulated pmem file.
    pub pmem_file: &'a Path,
    /// Where the daemon writes its final counters.
    pub stats_json: &'a Path,
}

/// Formats a byte count the way the daemon parses sizes (`256M`, `1G`, or bytes).
pub fn size_arg(bytes: u64) -> String {
    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;
    if bytes % G == 0 {
        format!("{}G", bytes / G)
    } else if bytes % M == 0 {
        format!("{}M", bytes / M)
    } else {
        bytes.to_string()
    }
}

/// The arguments after `uffd-daemon run` (up to, not including, `--`) for a daemon setup, or
/// `None` for a kernel setup. This is the only place that knows the daemon's tier flags.
/// `swap_bytes` sizes the backend (`--swap-size`), as large as the kernel setups' swap area:
/// the pmem file is allocated whole, so the daemon's 64G default would not fit on tmpfs.
pub fn daemon_args(
    setup: Setup,
    limit: u64,
    swap_bytes: u64,
    paths: &DaemonPaths<'_>,
) -> Option<Vec<String>> {
    let mut a = vec!["--limit".to_string(), size_arg(limit)];
    let file = format!("file:{}", paths.swap_file.display());
    let pmem = format!("pmem:{}", paths.pmem_file.display());
    let tier: Vec<String> = match setup {
        Setup::DaemonDefault => vec![],
        Setup::DaemonZswap => vec![
            "--backend".into(),
            "none".into(),
            "--zswap".into(),
            size_arg(4 * limit),
            "--compressor".into(),
            "lz4".into(),
        ],
        Setup::DaemonZswapFile => vec![
            "--backend".into(),
            file,
            "--swap-size".into(),
            size_arg(swap_bytes),
            "--zswap".into(),
            size_arg(limit),
            "--compressor".into(),
            "lz4".into(),
        ],
        Setup::DaemonFile | Setup::DaemonFilePlain => vec![
            "--backend".into(),
            file,
            "--swap-size".into(),
            size_arg(swap_bytes),
            "--zswap".into(),
            "off".into(),
        ],
        Setup::DaemonDefaultPlain => vec![],
        Setup::DaemonPmem => vec![
            "--backend".into(),
            pmem,
            "--swap-size".into(),
            size_arg(swap_bytes),
            "--zswap".into(),
            "off".into(),
        ],
        Setup::KernelSwap
        | Setup::KernelZswap
        | Setup::KernelZswapDefault
        | Setup::KernelZram
        | Setup::Bare => return None,
    };
    a.extend(tier);
    if matches!(setup, Setup::DaemonFilePlain | Setup::DaemonDefaultPlain) {
        a.push("--encrypt".into());
        a.push("off".into());
    }
    a.push("--stats-json".into());
    a.push(paths.stats_json.display().to_string());
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn args(s: Setup) -> Option<String> {
        let (f, p, j) = (
            PathBuf::from("/t/s"),
            PathBuf::from("/m/p"),
            PathBuf::from("/t/j"),
        );
        let paths = DaemonPaths {
            swap_file: &f,
            pmem_file: &p,
            stats_json: &j,
        };
        daemon_args(s, 256 << 20, 2 << 30, &paths).map(|v| v.join(" "))
    }

    #[test]
    fn daemon_setups_map_to_their_flags() {
        assert_eq!(
            args(Setup::DaemonDefault).unwrap(),
            "--limit 256M --stats-json /t/j"
        );
        assert_eq!(
            args(Setup::DaemonZswap).unwrap(),
            "--limit 256M --backend none --zswap 1G --compressor lz4 --stats-json /t/j"
        );
        assert_eq!(
            args(Setup::DaemonZswapFile).unwrap(),
            "--limit 256M --backend file:/t/s --swap-size 2G --zswap 256M --compressor lz4 \
             --stats-json /t/j"
        );
        assert_eq!(
            args(Setup::DaemonFile).unwrap(),
            "--limit 256M --backend file:/t/s --swap-size 2G --zswap off --stats-json /t/j"
        );
        assert_eq!(
            args(Setup::DaemonPmem).unwrap(),
            "--limit 256M --backend pmem:/m/p --swap-size 2G --zswap off --stats-json /t/j"
        );
        assert_eq!(
            args(Setup::DaemonFilePlain).unwrap(),
            "--limit 256M --backend file:/t/s --swap-size 2G --zswap off --encrypt off \
             --stats-json /t/j"
        );
        assert_eq!(
            args(Setup::DaemonDefaultPlain).unwrap(),
            "--limit 256M --encrypt off --stats-json /t/j"
        );
        for k in [
            Setup::KernelSwap,
            Setup::KernelZswap,
            Setup::KernelZswapDefault,
            Setup::KernelZram,
            Setup::Bare,
        ] {
            assert_eq!(args(k), None);
            assert!(!k.is_daemon());
            assert_eq!(k.is_kernel(), k != Setup::Bare);
        }
    }

    #[test]
    fn names_round_trip() {
        for s in ALL {
            assert_eq!(Setup::parse(s.name()), Ok(s));
        }
        assert!(Setup::parse("swap").unwrap_err().contains("allowed"));
        assert_eq!(size_arg(3 << 29), "1536M");
        assert_eq!(size_arg(12345), "12345");
    }
}
