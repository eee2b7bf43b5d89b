//! The backing devices beneath zswap: a swap file, a pmem (DAX) device or file, and the
//! failure-injecting double the tests use. A new device is a new [`Backend`]: the tiers, the
//! fault path and reclaim only ever call `write`, `read` and `discard` at `slot * 4096`.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use swap_alloc::{DeviceId, DiscardHook};

use super::FailWrites;
use crate::sys::PAGE_SIZE_U64;

/// The backing device's interface: page-granular reads and writes at byte offsets.
pub trait Backend: Send + Sync + fmt::Debug {
    /// `file` or `pmem` (and how it is mapped).
    fn describe(&self) -> String;
    /// Writes `data` (whole pages) at `offset`. `Ok` means the device holds it.
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Writes each `(offset, data)`, returning the outcome of each in order. A device that
    /// does better with several writes in flight (a file on a disk) overrides it; `Ok` means
    /// the device holds that write, as for [`Backend::write`].
    fn write_all(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        writes.iter().map(|&(o, d)| self.write(o, d)).collect()
    }
    /// Reads `out.len()` bytes at `offset`.
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()>;
    /// Reads each `(offset, out)`, all or nothing (a run of pages and their tags). A device
    /// that does better with the reads together (a network store: one round trip) overrides
    /// it.
    fn read_all(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        for (offset, out) in reads.iter_mut() {
            self.read(*offset, out)?;
        }
        Ok(())
    }
    /// The slots `[offset, offset + len)` are free: the backend may drop their contents.
    fn discard(&self, _offset: u64, _len: u64) {}
    /// The run is over: drop what the device holds for it (a network store's keys). Nothing is
    /// read or written after.
    fn close(&self) {}
    /// The device's own counters, into the stats.
    fn counters(&self, _v: &mut serde_json::Value) {}
}

fn create_private(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", path.display())))
}

/// A swap file, read and written with `pread`/`pwrite` and kept out of the page cache: every
/// write goes through to the disk before it returns (`sync_file_range`), and the pages it went
/// through, and those a read brought in, are dropped from the page cache at once
/// (`POSIX_FADV_DONTNEED`; file readahead is off, `POSIX_FADV_RANDOM`). Through the page cache
/// alone, evicted pages stayed in RAM as the file's dirty cache (522 MB `Dirty` with no disk
/// write done, in the measurement): the limit moved memory, it did not free it. The
/// kernel's swap writes around the page cache too. A write the disk fails is an error of
/// `write`, where the caller keeps the pages resident, and never one that writeback finds later,
/// when they would be gone.
///
/// Writes are serialised (`io`): a device error is reported once per file, to whichever wait
/// looks first, so only one batch of writes may be waited for at a time for the error to be
/// its own.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    path: Option<PathBuf>,
    io: parking_lot::Mutex<()>,
}

impl FileBackend {
    /// Creates `path` (must not exist) with mode 0600, or an unnamed `O_TMPFILE` in `dir`.
    pub fn create(path: Option<&Path>, dir: &Path) -> io::Result<Self> {
        let file = match path {
            Some(p) => create_private(p)?,
            None => std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
                .open(dir)
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("creating a temporary swap file in {}: {e}", dir.display()),
                    )
                })?,
        };
        // No readahead: slots are read where faults are, and a neighbour read ahead would only
        // sit in the page cache (the daemon reads runs of slots itself when it wants them).
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::Random);
        Ok(FileBackend {
            file,
            path: path.map(Path::to_path_buf),
            io: parking_lot::Mutex::new(()),
        })
    }

    /// Drops the pages `[offset, offset + len)` covers whole from the page cache (what the
    /// kernel's `POSIX_FADV_DONTNEED` does: clean pages only, and the range has been written
    /// through or only read). Pages it covers in part stay: the sealed layout's pages of tags,
    /// written 16 bytes a slot, which would otherwise be read back from the disk before each
    /// such write; they are a 256th of the pages written.
    fn uncache(&self, offset: u64, len: usize) {
        let start = offset.next_multiple_of(PAGE_SIZE_U64);
        let end = (offset + len as u64) & !(PAGE_SIZE_U64 - 1);
        if end > start {
            let _ = rustix::fs::fadvise(
                &self.file,
                start,
                std::num::NonZeroU64::new(end - start),
                rustix::fs::Advice::DontNeed,
            );
        }
    }
}

impl Backend for FileBackend {
    fn describe(&self) -> String {
        match &self.path {
            Some(p) => format!("file {}", p.display()),
            None => "file (unnamed)".into(),
        }
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_all(&[(offset, data)]).pop().unwrap_or(Ok(()))
    }
    /// Every write copied into the page cache and its writeback started, then each waited for
    /// (the disk has them all in flight at once), then the pages dropped. An error a wait
    /// reports cannot be told apart between the batch's writes: all of them fail then.
    fn write_all(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        let _io = self.io.lock();
        let mut out: Vec<io::Result<()>> = writes
            .iter()
            .map(|&(offset, data)| {
                self.file.write_all_at(data, offset)?;
                crate::sys::start_writeback(&self.file, offset, data.len() as u64)
            })
            .collect();
        let mut failed = None;
        for (&(offset, data), r) in writes.iter().zip(&out) {
            if r.is_ok() {
                if let Err(e) = crate::sys::write_through(&self.file, offset, data.len() as u64) {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            for r in out.iter_mut().filter(|r| r.is_ok()) {
                *r = Err(io::Error::new(e.kind(), e.to_string()));
            }
            return out;
        }
        for (&(offset, data), r) in writes.iter().zip(&out) {
            if r.is_ok() {
                self.uncache(offset, data.len());
            }
        }
        out
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(out, offset)?;
        self.uncache(offset, out.len());
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) {
        let _ = rustix::fs::fallocate(
            &self.file,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            offset,
            len,
        );
    }
}

impl Drop for FileBackend {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A pmem-backed device mapped into the daemon and accessed by memory copy.
pub struct PmemBackend {
    map: crate::sys::SharedFileMap,
    mode: &'static str,
    path: PathBuf,
    remove_at_exit: bool,
    _file: File,
}

impl fmt::Debug for PmemBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PmemBackend")
            .field("path", &self.path)
            .field("len", &self.map.len())
            .field("mode", &self.mode)
            .finish()
    }
}

impl PmemBackend {
    /// Opens a DAX character device, or creates `path` (must not exist) of `len` bytes,
    /// fully allocated so that a store can never fault for lack of space, and maps it: with
    /// `MAP_SYNC` where the file system is DAX, shared otherwise.
    pub fn open(path: &Path, len: u64) -> io::Result<Self> {
        let meta = std::fs::metadata(path).ok();
        let is_dax_dev = meta
            .as_ref()
            .is_some_and(|m| m.file_type().is_char_device());
        let (file, len, remove) = if is_dax_dev {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(path)
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("opening {}: {e}", path.display()))
                })?;
            let size = dax_device_size(path).unwrap_or(len).min(len.max(1));
            (f, size, false)
        } else {
            let f = create_private(path)?;
            if let Err(e) = crate::sys::allocate_file(&f, len) {
                let _ = std::fs::remove_file(path);
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "allocating {len} bytes for pmem file {}: {e}",
                        path.display()
                    ),
                ));
            }
            (f, len, true)
        };
        let map = match crate::sys::SharedFileMap::new(&file, len as usize) {
            Ok(m) => m,
            Err(e) => {
                if remove {
                    let _ = std::fs::remove_file(path);
                }
                return Err(io::Error::new(
                    e.kind(),
                    format!("mapping pmem {}: {e}", path.display()),
                ));
            }
        };
        // (Not DAX: the seeds' "simulated pmem", an ordinary shared mapping of the file.)
        let mode = match (is_dax_dev, map.is_sync()) {
            (true, _) => "dax device",
            (false, true) => "dax file, MAP_SYNC",
            (false, false) => "simulated (shared file mapping)",
        };
        Ok(PmemBackend {
            map,
            mode,
            path: path.to_path_buf(),
            remove_at_exit: remove,
            _file: file,
        })
    }
}

fn dax_device_size(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let s = std::fs::read_to_string(format!("/sys/bus/dax/devices/{name}/size")).ok()?;
    s.trim().parse().ok()
}

impl Backend for PmemBackend {
    fn describe(&self) -> String {
        format!("pmem {} ({})", self.path.display(), self.mode)
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.map.write_at(offset, data)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.map.read_at(offset, out)
    }
}

impl Drop for PmemBackend {
    fn drop(&mut self) {
        if self.remove_at_exit {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Failure injection around a backend (tests of the failure paths).
#[derive(Debug)]
pub(super) struct Failing {
    pub(super) inner: Box<dyn Backend>,
    pub(super) fail: FailWrites,
    pub(super) written: AtomicU64,
}

impl Backend for Failing {
    fn describe(&self) -> String {
        format!(
            "{} (writes fail with errno {} after {} bytes)",
            self.inner.describe(),
            self.fail.errno,
            self.fail.after_bytes
        )
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let before = self.written.fetch_add(data.len() as u64, Ordering::Relaxed);
        if before + data.len() as u64 > self.fail.after_bytes {
            return Err(io::Error::from_raw_os_error(self.fail.errno));
        }
        self.inner.write(offset, data)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, out)
    }
    fn read_all(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        self.inner.read_all(reads)
    }
    fn discard(&self, offset: u64, len: u64) {
        self.inner.discard(offset, len)
    }
    fn close(&self) {
        self.inner.close()
    }
    fn counters(&self, v: &mut serde_json::Value) {
        self.inner.counters(v)
    }
}

pub(super) struct Discarder(pub(super) Arc<dyn Backend>);
impl DiscardHook for Discarder {
    fn discard(&self, _device: DeviceId, first: u64, nr: u64) {
        self.0.discard(first * PAGE_SIZE_U64, nr * PAGE_SIZE_U64);
    }
}

/// An `Arc<dyn Backend>` as a backend (for wrapping).
#[derive(Debug)]
pub(super) struct ArcBackend(pub(super) Arc<dyn Backend>);
impl Backend for ArcBackend {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write(offset, data)
    }
    fn write_all(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        self.0.write_all(writes)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.0.read(offset, out)
    }
    fn read_all(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        self.0.read_all(reads)
    }
    fn discard(&self, offset: u64, len: u64) {
        self.0.discard(offset, len)
    }
    fn close(&self) {
        self.0.close()
    }
    fn counters(&self, v: &mut serde_json::Value) {
        self.0.counters(v)
    }
}
