//! What the tiers are made of: the backing device, the swap space, the compressed tier, as the
//! configuration and the command line give them.

use std::path::PathBuf;

use zswap::Compressor;

/// Where the backing device lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSpec {
    /// No backing device: zswap only (pages zswap refuses stay resident).
    None,
    /// A swap file: the named path (created 0600, must not exist, removed at exit), or an
    /// unnamed temporary file when `None`.
    File(Option<PathBuf>),
    /// A pmem-backed device: a DAX character device (`/dev/daxX.Y`), a file on a DAX mount
    /// (mapped with `MAP_SYNC`), or else an ordinary file mapped shared ("simulated pmem").
    /// A file is created 0600 (must not exist) and removed at exit.
    Pmem(PathBuf),
}

impl BackendSpec {
    /// Parses `none`, `file`, `file:PATH`, `pmem:PATH`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "none" => Ok(BackendSpec::None),
            None if s == "file" => Ok(BackendSpec::File(None)),
            Some(("file", p)) if !p.is_empty() => Ok(BackendSpec::File(Some(PathBuf::from(p)))),
            Some(("pmem", p)) if !p.is_empty() => Ok(BackendSpec::Pmem(PathBuf::from(p))),
            _ => Err(format!(
                "unknown backend {s:?}: expected none, file, file:PATH or pmem:PATH"
            )),
        }
    }
}

/// An injected failure, for tests of the failure paths (`[backend] fail_writes_after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailWrites {
    /// Writes succeed for this many bytes, then every write fails.
    pub after_bytes: u64,
    /// The errno they fail with (`EIO` or `ENOSPC`).
    pub errno: i32,
}

/// The tiers' configuration.
#[derive(Debug, Clone)]
pub struct TierConfig {
    /// The compressed tier; `None` to write evicted pages straight to the backend.
    pub zswap: Option<ZswapTier>,
    /// The backing device.
    pub backend: BackendSpec,
    /// Size of the swap space (slots on the device, and the backend's size), bytes.
    pub swap_bytes: u64,
    /// Evict aligned runs of 16 pages as one order-4 folio.
    pub large_folios: bool,
    /// Punch freed clusters out of a swap file (the discard hook).
    pub discard: bool,
    /// Seal every page written to the backend with AES-256-GCM under a key held only in the
    /// daemon's locked memory (`SealedBackend`). No effect without a backend.
    pub encrypt: bool,
    /// Failure injection (tests).
    pub fail_writes: Option<FailWrites>,
    /// Directory for an unnamed swap file.
    pub tmp_dir: PathBuf,
}

/// The compressed tier's settings.
#[derive(Debug, Clone)]
pub struct ZswapTier {
    /// The compressor.
    pub compressor: Compressor,
    /// The pool's limit in bytes.
    pub max_pool_bytes: u64,
    /// Accept threshold, percent of the limit.
    pub accept_threshold_percent: u8,
    /// Compress large folios as one multi-page object (better ratio, costlier single loads).
    pub multi_page: bool,
    /// CRC32C of every page, checked on load.
    pub crc: bool,
    /// Writeback to the backend starts when the pool passes this percentage of its limit.
    pub writeback_start_percent: u8,
}

impl Default for ZswapTier {
    fn default() -> Self {
        ZswapTier {
            compressor: Compressor::Lz4,
            max_pool_bytes: 256 << 20,
            accept_threshold_percent: 90,
            multi_page: false,
            crc: true,
            writeback_start_percent: 95,
        }
    }
}
