//! Integrity without encryption: with `--encrypt off`, every page written to the backing device
//! has its CRC-32C kept in the daemon's memory and checked when it is read back. A page the
//! device lost or altered is then a failed read, which the fault path answers by stopping the
//! client rather than handing it wrong bytes, as it does for a sealed page that fails
//! authentication.
//!
//! Why: a filesystem on a failing disk may confirm a write and lose it. ext4, when the disk under
//! it fails its metadata writes, logs "failed to convert unwritten extents to written extents --
//! potential data loss" and reads the range back as zeros, while `sync_file_range`, `fsync` and
//! an `O_DIRECT` `pwrite` had all reported success (measured on a loop device over a full
//! tmpfs, `docs/experiments/2026-11-27-async-writeback.md`). Sealed pages catch that by their
//! tags; plain ones did not, and the program read zeros.
//!
//! The checksums live in the sealing layer's side table (`seal::SealTable`, chunks of 64 slots
//! that exist while one of their slots holds a page): 8 bytes a stored page. The device layout
//! is unchanged (slot `s` at `s * 4096`), and nothing of it reaches the device.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::seal::{slots_of, Seal, SealTable};
use super::Backend;
use crate::sys::PAGE_SIZE;

/// The checksum's name, as the stats say it.
pub(super) const CHECKSUM: &str = "crc32c";

/// A slot's entry: the CRC with bit 32 set, so that it is never the table's empty value.
fn entry(page: &[u8]) -> Seal {
    Seal {
        counter: (1 << 32) | u64::from(crc32c::crc32c(page)),
    }
}

/// A backend whose pages are checked against the checksum they were written with.
pub(super) struct ChecksummedBackend<B> {
    inner: B,
    sums: SealTable,
    failures: AtomicU64,
}

impl<B: fmt::Debug> fmt::Debug for ChecksummedBackend<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChecksummedBackend")
            .field("inner", &self.inner)
            .field("checksum", &CHECKSUM)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> ChecksummedBackend<B> {
    pub(super) fn new(inner: B) -> Self {
        ChecksummedBackend {
            inner,
            sums: SealTable::new(),
            failures: AtomicU64::new(0),
        }
    }

    /// The slot is free: its checksum goes.
    pub(super) fn forget(&self, slot: u64) {
        self.sums.forget(slot);
    }

    /// Pages read back whose checksum did not match.
    pub(super) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Heap bytes of the side table.
    pub(super) fn metadata_bytes(&self) -> usize {
        self.sums.heap_bytes()
    }
}

impl<B: Backend> Backend for ChecksummedBackend<B> {
    fn describe(&self) -> String {
        format!(
            "{}, pages checked by CRC-32C (kept in memory)",
            self.inner.describe()
        )
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_all(&[(offset, data)]).pop().unwrap_or(Ok(()))
    }

    /// The writes go to the device as they are; each one's checksums are recorded once the
    /// device holds it (a reader finds the page there).
    fn write_all(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        let shapes: Vec<io::Result<(u64, usize)>> = writes
            .iter()
            .map(|&(offset, data)| slots_of(offset, data.len()))
            .collect();
        let ok: Vec<(u64, &[u8])> = writes
            .iter()
            .zip(&shapes)
            .filter(|(_, s)| s.is_ok())
            .map(|(&w, _)| w)
            .collect();
        let mut results = self.inner.write_all(&ok).into_iter();
        writes
            .iter()
            .zip(shapes)
            .map(|(&(_, data), shape)| {
                let (first, _) = shape?;
                results.next().unwrap_or(Ok(()))?;
                let sums: Vec<Seal> = data.chunks_exact(PAGE_SIZE).map(entry).collect();
                self.sums.record(first, &sums);
                Ok(())
            })
            .collect()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let (first, n) = slots_of(offset, out.len())?;
        let mut sums = vec![Seal::EMPTY; n];
        if let Err(slot) = self.sums.lookup(first, &mut sums) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("slot {slot} holds no page written by this daemon"),
            ));
        }
        self.inner.read(offset, out)?;
        let bad = out
            .chunks_exact(PAGE_SIZE)
            .zip(&sums)
            .position(|(page, sum)| entry(page) != *sum);
        if let Some(i) = bad {
            // Nothing of a failed read reaches the caller.
            out.fill(0);
            self.failures.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the page of slot {} read back with another checksum (CRC-32C) than it was \
                     written with: the backing device lost or altered it",
                    first + i as u64
                ),
            ));
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    /// The device's bytes, visible to the test.
    #[derive(Debug, Default)]
    struct Mem(Mutex<Vec<u8>>);
    impl Backend for &Mem {
        fn describe(&self) -> String {
            "mem".into()
        }
        fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            let mut m = self.0.lock();
            let end = offset as usize + data.len();
            if m.len() < end {
                m.resize(end, 0);
            }
            m[offset as usize..end].copy_from_slice(data);
            Ok(())
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
            let m = self.0.lock();
            out.copy_from_slice(&m[offset as usize..offset as usize + out.len()]);
            Ok(())
        }
    }

    #[test]
    fn a_page_changed_on_the_device_fails_its_read_and_the_rest_reads_back() {
        let mem = Mem::default();
        let b = ChecksummedBackend::new(&mem);
        let pages: Vec<u8> = (0..4 * PAGE_SIZE).map(|i| (i / 7) as u8).collect();
        b.write(8 * PAGE_SIZE as u64, &pages).unwrap();
        let mut out = vec![0u8; 4 * PAGE_SIZE];
        b.read(8 * PAGE_SIZE as u64, &mut out).unwrap();
        assert_eq!(out, pages);
        // A lost write reads back as zeros.
        mem.0.lock()[10 * PAGE_SIZE..11 * PAGE_SIZE].fill(0);
        let e = b.read(8 * PAGE_SIZE as u64, &mut out).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("slot 10"), "{e}");
        assert!(out.iter().all(|&x| x == 0), "nothing of a failed read");
        assert_eq!(b.failures(), 1);
        let mut one = vec![0u8; PAGE_SIZE];
        b.read(9 * PAGE_SIZE as u64, &mut one).unwrap();
        assert_eq!(one, pages[PAGE_SIZE..2 * PAGE_SIZE]);
        // A freed slot is forgotten; a zero page written is a page like another.
        b.forget(9);
        assert_eq!(
            b.read(9 * PAGE_SIZE as u64, &mut one).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        b.write(9 * PAGE_SIZE as u64, &[0u8; PAGE_SIZE]).unwrap();
        b.read(9 * PAGE_SIZE as u64, &mut one).unwrap();
        assert!(one.iter().all(|&x| x == 0));
        assert!(b.metadata_bytes() > 0);
    }
}
