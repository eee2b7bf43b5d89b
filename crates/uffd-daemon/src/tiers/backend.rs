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

use super::writeback::{self, Device, Writeback};
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
    /// Waits until every write returned so far is on the device itself (or known failed and
    /// held), not only accepted (a file's asynchronous writeback), and lets go of the copies
    /// of confirmed writes, so that reads see what the device holds.
    fn flush(&self) {}
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

/// A swap file, read and written with `pread`/`pwrite`, whose evicted pages reach the disk and
/// leave RAM. A write copies the pages into the page cache, starts their writeback
/// (`sync_file_range` with `WRITE`) and returns; the [`Writeback`] completer waits for the disk
/// and then drops the pages from the page cache (`POSIX_FADV_DONTNEED`; file readahead is off,
/// `POSIX_FADV_RANDOM`). Through the page cache alone, evicted pages stayed in RAM as the
/// file's dirty cache (522 MB `Dirty` with no disk write done, in the measurement):
/// the limit moved memory, it did not free it. Waiting for the disk inside each write made
/// reclaim as slow as the disk (a 32-thread program 2.3x slower); the kernel's swap writes
/// asynchronously too.
///
/// `Ok` from a write means the backend holds the bytes: in the page cache with the daemon's
/// copy beside them until the disk confirms, or, if the disk fails the write, in the daemon's
/// memory (held, served to reads, counted); see [`Writeback`].
#[derive(Debug)]
pub struct FileBackend {
    file: Arc<File>,
    path: Option<PathBuf>,
    writeback: Writeback,
}

/// The swap file as the completer sees it.
struct SwapFile(Arc<File>);

impl Device for SwapFile {
    fn wait(&self, offset: u64, len: u64) -> io::Result<()> {
        crate::sys::write_through(&self.0, offset, len)
    }
    fn uncache(&self, offset: u64, len: u64) {
        uncache(&self.0, offset, len);
    }
}

/// Drops the pages `[offset, offset + len)` covers whole from the page cache (what the
/// kernel's `POSIX_FADV_DONTNEED` does: clean pages only, and the range has been written
/// through or only read). Pages it covers in part stay: the sealed layout's pages of tags,
/// written 16 bytes a slot, which would otherwise be read back from the disk before each
/// such write; they are a 256th of the pages written.
fn uncache(file: &File, offset: u64, len: u64) {
    let start = offset.next_multiple_of(PAGE_SIZE_U64);
    let end = (offset + len) & !(PAGE_SIZE_U64 - 1);
    if end > start {
        let _ = rustix::fs::fadvise(
            file,
            start,
            std::num::NonZeroU64::new(end - start),
            rustix::fs::Advice::DontNeed,
        );
    }
}

/// The swap file of the failure tests (`[test] fail_writeback_after`): its writeback fails
/// after a number of bytes, and the failed range reads back as `0xEE` bytes, as a write the
/// disk lost would.
pub(super) struct LosingSwapFile {
    file: Arc<File>,
    after: u64,
    done: AtomicU64,
}

impl LosingSwapFile {
    pub(super) fn boxed(file: Arc<File>, after: u64) -> Box<dyn Device> {
        Box::new(LosingSwapFile {
            file,
            after,
            done: AtomicU64::new(0),
        })
    }
}

impl Device for LosingSwapFile {
    fn wait(&self, offset: u64, len: u64) -> io::Result<()> {
        crate::sys::write_through(&self.file, offset, len)?;
        if self.done.fetch_add(len, Ordering::Relaxed) + len <= self.after {
            return Ok(());
        }
        self.file
            .write_all_at(&vec![0xEE; len as usize], offset)
            .and_then(|()| crate::sys::write_through(&self.file, offset, len))?;
        uncache(&self.file, offset, len);
        Err(io::Error::from_raw_os_error(libc::EIO))
    }
    fn uncache(&self, offset: u64, len: u64) {
        uncache(&self.file, offset, len);
    }
}

impl FileBackend {
    /// Creates `path` (must not exist) with mode 0600, or an unnamed `O_TMPFILE` in `dir`.
    pub fn create(path: Option<&Path>, dir: &Path) -> io::Result<Self> {
        Self::with_device(path, dir, |f| Box::new(SwapFile(f)))
    }

    /// As [`FileBackend::create`], with the writeback's view of the file given by `device`
    /// (tests give one whose waits fail).
    pub(super) fn with_device(
        path: Option<&Path>,
        dir: &Path,
        device: impl FnOnce(Arc<File>) -> Box<dyn Device>,
    ) -> io::Result<Self> {
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
        let file = Arc::new(file);
        let writeback = Writeback::new(
            device(Arc::clone(&file)),
            writeback::DEFAULT_CAP,
            writeback::DEFAULT_SETTLE,
        )
        .map_err(|e| io::Error::new(e.kind(), format!("starting the writeback thread: {e}")))?;
        Ok(FileBackend {
            file,
            path: path.map(Path::to_path_buf),
            writeback,
        })
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
    /// Every write copied into the table and the page cache, and its writeback started; the
    /// disk then has them all in flight at once, and the completer waits for them.
    fn write_all(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        let admitted = match self.writeback.admit(writes) {
            Ok(a) => a,
            Err(e) => {
                return writes
                    .iter()
                    .map(|_| Err(io::Error::new(e.kind(), e.to_string())))
                    .collect()
            }
        };
        writes
            .iter()
            .zip(admitted)
            .map(|(&(offset, data), w)| {
                let r = self.file.write_all_at(data, offset).and_then(|()| {
                    crate::sys::start_writeback(&self.file, offset, data.len() as u64)
                });
                match r {
                    Ok(()) => self.writeback.started(w),
                    Err(_) => self.writeback.abandon(w),
                }
                r
            })
            .collect()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(out, offset)?;
        self.writeback.overlay(offset, out);
        uncache(&self.file, offset, out.len() as u64);
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) {
        self.writeback.discard(offset, len);
        let _ = rustix::fs::fallocate(
            &*self.file,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            offset,
            len,
        );
    }
    fn flush(&self) {
        self.writeback.drain();
        self.writeback.forget_settled();
    }
    fn counters(&self, v: &mut serde_json::Value) {
        let c = self.writeback.counters();
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (in_flight, held) = self.writeback.bytes();
        v["file_writeback_bytes"] = in_flight.into();
        v["file_writeback_held_bytes"] = held.into();
        v["file_writeback_settling_bytes"] = self.writeback.settling_bytes().into();
        v["file_writeback_completed"] = ld(&c.completed).into();
        v["file_writeback_errors"] = ld(&c.errors).into();
        v["file_writes_refused"] = ld(&c.refused).into();
        v["file_writeback_throttled"] = ld(&c.throttled).into();
        v["file_writeback_throttled_ns"] = ld(&c.throttled_ns).into();
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
    fn flush(&self) {
        self.inner.flush()
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
    fn flush(&self) {
        self.0.flush()
    }
    fn close(&self) {
        self.0.close()
    }
    fn counters(&self, v: &mut serde_json::Value) {
        self.0.counters(v)
    }
}
