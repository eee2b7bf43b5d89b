//! Where evicted pages go in the foundation: an uncompressed swap file with a simple slot map.
//!
//! The slot map hands out page-sized slots of the file and keeps a reference count per slot
//! (a page shared by a parent and its forked child is stored once with a count of two, as the
//! kernel's `swap_duplicate`). `crates/swap-alloc` and `crates/zswap` replace both in the
//! composition issue.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use thiserror::Error;

use crate::sys::PAGE_SIZE;

/// A misuse of the slot map. Each names the slot.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlotError {
    /// The slot is beyond the map.
    #[error("slot {0} is beyond the {1} slots of the map")]
    OutOfRange(u32, u32),
    /// The slot is free.
    #[error("slot {0} is free")]
    Free(u32),
    /// The reference count would overflow.
    #[error("slot {0} has the maximum reference count")]
    Overflow(u32),
}

/// Page-sized slots with reference counts. Slot numbers are dense from 0 and reused LIFO.
#[derive(Debug, Default)]
pub struct SlotMap {
    refs: Vec<u16>,
    free: Vec<u32>,
    in_use: usize,
}

impl SlotMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a free slot with a reference count of one, growing the map when none is free;
    /// `None` once `limit` slots are in use.
    pub fn alloc(&mut self, limit: u32) -> Option<u32> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                if self.refs.len() >= limit as usize {
                    return None;
                }
                self.refs.push(0);
                (self.refs.len() - 1) as u32
            }
        };
        debug_assert_eq!(self.refs[slot as usize], 0);
        self.refs[slot as usize] = 1;
        self.in_use += 1;
        Some(slot)
    }

    fn count_mut(&mut self, slot: u32) -> Result<&mut u16, SlotError> {
        let len = self.refs.len() as u32;
        match self.refs.get_mut(slot as usize) {
            None => Err(SlotError::OutOfRange(slot, len)),
            Some(0) => Err(SlotError::Free(slot)),
            Some(c) => Ok(c),
        }
    }

    /// Adds a reference (`swap_duplicate`).
    pub fn dup(&mut self, slot: u32) -> Result<(), SlotError> {
        let c = self.count_mut(slot)?;
        *c = c.checked_add(1).ok_or(SlotError::Overflow(slot))?;
        Ok(())
    }

    /// Drops a reference (`swap_free`); returns whether the slot became free.
    pub fn put(&mut self, slot: u32) -> Result<bool, SlotError> {
        let c = self.count_mut(slot)?;
        *c -= 1;
        if *c == 0 {
            self.free.push(slot);
            self.in_use -= 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// The reference count of a slot (0 when free or out of range).
    pub fn count(&self, slot: u32) -> u16 {
        self.refs.get(slot as usize).copied().unwrap_or(0)
    }

    /// Slots with a non-zero count.
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    /// Full consistency check (tests).
    pub fn check_integrity(&self) {
        let used = self.refs.iter().filter(|&&c| c > 0).count();
        assert_eq!(
            used, self.in_use,
            "in_use counter disagrees with the counts"
        );
        assert_eq!(
            used + self.free.len(),
            self.refs.len(),
            "every slot is either used or on the free list"
        );
        for &s in &self.free {
            assert_eq!(
                self.refs[s as usize], 0,
                "slot {s} on the free list has references"
            );
        }
    }
}

/// The swap file: page slots in a file that only the daemon's user can read, removed at exit.
#[derive(Debug)]
pub struct SwapFile {
    file: File,
    path: Option<PathBuf>,
    slots: Mutex<SlotMap>,
    max_slots: u32,
}

impl SwapFile {
    /// Creates `path` (which must not exist) with mode 0600, or, without a path, an unnamed
    /// temporary file in `dir` (`O_TMPFILE`), which vanishes with the daemon. `max_bytes` caps
    /// its size.
    pub fn create(path: Option<&Path>, dir: &Path, max_bytes: u64) -> io::Result<Self> {
        let (file, path) = match path {
            Some(p) => {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(p)
                    .map_err(|e| {
                        io::Error::new(e.kind(), format!("creating swap file {}: {e}", p.display()))
                    })?;
                (f, Some(p.to_path_buf()))
            }
            None => {
                let f = std::fs::OpenOptions::new()
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
                    })?;
                (f, None)
            }
        };
        let max_slots = (max_bytes / PAGE_SIZE as u64).min(u32::MAX as u64) as u32;
        Ok(SwapFile {
            file,
            path,
            slots: Mutex::new(SlotMap::new()),
            max_slots,
        })
    }

    /// Stores pages (`data.len()` a multiple of the page size); returns their slots, or an error
    /// with nothing kept (no slot leaks on a failed write).
    pub fn store(&self, data: &[u8]) -> io::Result<Vec<u32>> {
        let n = data.len() / PAGE_SIZE;
        let mut slots = Vec::with_capacity(n);
        {
            let mut map = self.slots.lock();
            for _ in 0..n {
                match map.alloc(self.max_slots) {
                    Some(s) => slots.push(s),
                    None => {
                        for &s in &slots {
                            let _ = map.put(s);
                        }
                        return Err(io::Error::new(
                            io::ErrorKind::StorageFull,
                            "swap file is full",
                        ));
                    }
                }
            }
        }
        // Write runs of consecutive slots with one call each.
        let mut i = 0;
        let mut result = Ok(());
        while i < n {
            let mut j = i + 1;
            while j < n && slots[j] == slots[j - 1] + 1 {
                j += 1;
            }
            let off = slots[i] as u64 * PAGE_SIZE as u64;
            if let Err(e) = self
                .file
                .write_all_at(&data[i * PAGE_SIZE..j * PAGE_SIZE], off)
            {
                result = Err(e);
                break;
            }
            i = j;
        }
        if let Err(e) = result {
            let mut map = self.slots.lock();
            for &s in &slots {
                let _ = map.put(s);
            }
            return Err(e);
        }
        Ok(slots)
    }

    /// Reads one page.
    pub fn read(&self, slot: u32, out: &mut [u8]) -> io::Result<()> {
        debug_assert_eq!(out.len(), PAGE_SIZE);
        if self.slots.lock().count(slot) == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {slot} is not in use"),
            ));
        }
        self.file.read_exact_at(out, slot as u64 * PAGE_SIZE as u64)
    }

    /// Adds a reference to a slot.
    pub fn dup(&self, slot: u32) -> Result<(), SlotError> {
        self.slots.lock().dup(slot)
    }

    /// Drops a reference to a slot.
    ///
    /// A freed slot is not punched out of the file: punching outside the slot lock once lost
    /// a page (the slot was handed out again and written before the hole was punched), and
    /// the space is reused anyway. Cluster-level discard comes with `crates/swap-alloc`.
    pub fn put(&self, slot: u32) -> Result<(), SlotError> {
        self.slots.lock().put(slot)?;
        Ok(())
    }

    /// Slots in use.
    pub fn slots_in_use(&self) -> usize {
        self.slots.lock().in_use()
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Alloc,
        Dup(usize),
        Put(usize),
        PutBogus(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Alloc),
            1 => (0usize..64).prop_map(Op::Dup),
            3 => (0usize..64).prop_map(Op::Put),
            1 => (0u32..200).prop_map(Op::PutBogus),
        ]
    }

    proptest! {
        /// The slot map against a model: a vector of counts.
        #[test]
        fn slot_map_matches_model(ops in proptest::collection::vec(op(), 1..300), limit in 1u32..40) {
            let mut map = SlotMap::new();
            let mut model: Vec<u16> = Vec::new(); // count per slot
            let mut live: Vec<u32> = Vec::new(); // slots with count > 0 (with multiplicity of refs)
            for op in ops {
                match op {
                    Op::Alloc => {
                        let got = map.alloc(limit);
                        let in_use = model.iter().filter(|&&c| c > 0).count();
                        if in_use as u32 >= limit && !model.contains(&0) {
                            prop_assert_eq!(got, None);
                        } else if let Some(s) = got {
                            if s as usize >= model.len() { model.resize(s as usize + 1, 0); }
                            prop_assert_eq!(model[s as usize], 0, "slot {} handed out twice", s);
                            model[s as usize] = 1;
                            live.push(s);
                        } else {
                            prop_assert!(in_use as u32 >= limit || model.len() as u32 >= limit);
                        }
                    }
                    Op::Dup(i) if !live.is_empty() => {
                        let s = live[i % live.len()];
                        prop_assert!(map.dup(s).is_ok());
                        model[s as usize] += 1;
                        live.push(s);
                    }
                    Op::Put(i) if !live.is_empty() => {
                        let s = live.swap_remove(i % live.len());
                        let freed = map.put(s).unwrap();
                        model[s as usize] -= 1;
                        prop_assert_eq!(freed, model[s as usize] == 0);
                    }
                    Op::PutBogus(s) => {
                        let free = model.get(s as usize).copied().unwrap_or(0) == 0;
                        if free {
                            prop_assert!(map.put(s).is_err());
                        }
                    }
                    _ => {}
                }
                map.check_integrity();
                for (s, &c) in model.iter().enumerate() {
                    prop_assert_eq!(map.count(s as u32), c);
                }
            }
        }
    }

    #[test]
    fn errors_name_the_slot() {
        let mut map = SlotMap::new();
        assert_eq!(map.put(5), Err(SlotError::OutOfRange(5, 0)));
        let s = map.alloc(10).unwrap();
        assert!(map.put(s).unwrap());
        assert_eq!(map.put(s), Err(SlotError::Free(s)));
        assert_eq!(
            map.dup(s).unwrap_err().to_string(),
            format!("slot {s} is free")
        );
    }

    #[test]
    fn swap_file_roundtrip_and_mode() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("uffd-daemon-test-{}.swap", std::process::id()));
        let f = SwapFile::create(Some(&path), &dir, 64 * 4096).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let data: Vec<u8> = (0..3 * PAGE_SIZE).map(|i| (i * 7 % 251) as u8).collect();
        let slots = f.store(&data).unwrap();
        assert_eq!(slots.len(), 3);
        let mut out = vec![0u8; PAGE_SIZE];
        for (i, &s) in slots.iter().enumerate() {
            f.read(s, &mut out).unwrap();
            assert_eq!(&out[..], &data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
        }
        f.dup(slots[0]).unwrap();
        f.put(slots[0]).unwrap();
        f.read(slots[0], &mut out).unwrap();
        f.put(slots[0]).unwrap();
        assert!(
            f.read(slots[0], &mut out).is_err(),
            "a freed slot must not be readable"
        );
        // Refusing to overwrite an existing file.
        assert!(SwapFile::create(Some(&path), &dir, 4096).is_err());
        drop(f);
        assert!(
            !path.exists(),
            "the swap file is removed when the daemon lets go of it"
        );
    }

    #[test]
    fn full_swap_file_keeps_nothing() {
        let dir = std::env::temp_dir();
        let f = SwapFile::create(None, &dir, 2 * 4096).unwrap();
        let data = vec![1u8; 3 * PAGE_SIZE];
        assert!(f.store(&data).is_err());
        assert_eq!(f.slots_in_use(), 0);
        assert_eq!(f.store(&data[..2 * PAGE_SIZE]).unwrap().len(), 2);
    }
}
