//! Encryption at rest: the backing device holds only sealed pages.
//!
//! `SealedBackend` wraps a backend (swap file, pmem) and seals every page written through it
//! with AES-256-GCM (`ring`: AES-NI and carry-less multiplication, VAES where the CPU has
//! them), one page at a time inside each write and read, so a folio is still one write and a
//! run of slots still one read. The file and pmem backends do not know about it, and neither
//! does the fault path: a page that fails authentication is a failed read, which the fault
//! path already answers by stopping the client rather than handing it wrong bytes.
//!
//! * **The key** is made at start from `getrandom(2)` and lives only in one page of the
//!   daemon's memory, mapped for it alone: locked (`mlock`, so it is never swapped out),
//!   left out of core dumps (`MADV_DONTDUMP`) and of forked children (`MADV_DONTFORK`), and
//!   wiped before it is unmapped when the backend is dropped. It is never written anywhere.
//!   The raw key bytes are wiped as soon as the cipher's key schedule is built (in the same
//!   locked page), and the stack below the building frame is scrubbed after it (best effort:
//!   the compiler may have left copies in registers or spilled them elsewhere).
//! * **Nonces never repeat under the key**: a per-daemon 64-bit write counter (one atomic add
//!   per write, one value per page; the first 8 bytes of the 96-bit nonce, the rest zero).
//!   Rewriting a slot takes a new counter value, so its nonce is new too.
//! * **Associated data is the page's slot** (its absolute number, so a page's index within a
//!   multi-page write is bound with it): a sealed page copied to another slot's offset fails
//!   authentication, even with its nonce moved along.
//! * **The tag goes to the device, in a page of tags; the nonce's counter stays in memory.**
//!   The device holds slots in groups of 255: slot `s` of group `g = s / 255` at page
//!   `g * 256 + s % 255`, and the group's 255 tags, 16 bytes each, in its last page
//!   (`data_offset`, `tag_offset`). Data pages stay whole and page-aligned, so a swap file
//!   writes and drops them whole (a page-straddling 4112-byte record made every write a
//!   read-modify-write of two pages once the file's pages left the page cache), a run of slots
//!   within a group is one read of its pages plus one of its tags, and a folio one write of each.
//!   The wrapper maps its callers' `slot * 4096` offsets (and discards) onto this. The daemon
//!   keeps, for each sealed slot, only the 8-byte counter that made its nonce, in a side table
//!   of chunks of 64 slots that exist while one of their slots is sealed (`Tiers::put` forgets a
//!   slot when its last reference goes). Since the nonce a page must open under is not on the
//!   device, a page rolled back to an older sealing of the same slot (with its old tag) fails as
//!   well as an altered one.
//!
//!   Why not all of it in memory (24 bytes a slot, the device left at `s * 4096`): the side
//!   table is as dense as the slots in use, and random faults leave a quarter of the slots
//!   spanned free; in the daemon, paging 256 MiB through a swap file under a 64 MiB limit, the
//!   24-byte table cost 32-34 bytes per stored page and took the daemon's metadata from 0.54%
//!   of the managed memory to 1.18% (the project's goal is 1%); with the counters alone it
//!   went to 0.76%. What the tag pages cost: 0.4% more device, and a write of the group's tag
//!   page beside each write of its data pages.
//! * **Freed swap space holds only ciphertext**: nothing is ever written to the device
//!   unsealed, and a freed slot's counter is forgotten at once, so even this daemon can no
//!   longer open what remains there; the key dies with the daemon.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM, NONCE_LEN};

use super::Backend;
use crate::sys::{PAGE_SIZE, PAGE_SIZE_U64};

/// The cipher's name, as the stats say it.
pub(super) const CIPHER: &str = "aes-256-gcm";

/// Bytes of a tag.
const TAG_LEN: usize = 16;
/// Slots in a group: their pages, then one page of their tags.
const GROUP_SLOTS: u64 = (PAGE_SIZE / TAG_LEN) as u64 - 1;
/// Device pages a group takes.
const GROUP_PAGES: u64 = GROUP_SLOTS + 1;

/// Bytes of device that `nslots` sealed slots need.
pub(super) fn device_bytes(nslots: u64) -> u64 {
    nslots.div_ceil(GROUP_SLOTS) * GROUP_PAGES * PAGE_SIZE_U64
}

/// Where the device holds slot `slot`'s sealed page.
pub(in crate::tiers) fn data_offset(slot: u64) -> u64 {
    ((slot / GROUP_SLOTS) * GROUP_PAGES + slot % GROUP_SLOTS) * PAGE_SIZE_U64
}

/// Where the device holds slot `slot`'s tag: in the last page of its group.
pub(in crate::tiers) fn tag_offset(slot: u64) -> u64 {
    ((slot / GROUP_SLOTS) * GROUP_PAGES + GROUP_SLOTS) * PAGE_SIZE_U64
        + (slot % GROUP_SLOTS) * TAG_LEN as u64
}

/// The runs of `[first, first + n)` that lie in one group each, as `(start, len)` relative to
/// `first`.
fn group_runs(first: u64, n: usize) -> impl Iterator<Item = (usize, usize)> {
    let end = first + n as u64;
    let mut at = first;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let group_end = (at / GROUP_SLOTS + 1) * GROUP_SLOTS;
        let stop = group_end.min(end);
        let run = ((at - first) as usize, (stop - at) as usize);
        at = stop;
        Some(run)
    })
}
/// Bytes of the key.
const KEY_LEN: usize = 32;
/// Slots per chunk of the side table.
const CHUNK_SLOTS: u64 = 64;
/// Shards of the side table (chunk `c` is in shard `c % SHARDS`).
const SHARDS: usize = 16;
/// Past this counter value writes are refused rather than let the counter wrap (never reached:
/// 2^63 pages at a billion a second is three centuries).
const COUNTER_LIMIT: u64 = 1 << 63;

/// What the daemon keeps to open a sealed slot: the counter value its nonce was made from
/// (0: the slot holds nothing sealed). The checksumming backend (`checksum.rs`) keeps its
/// checksums in the same table, as nonzero values of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::tiers) struct Seal {
    pub(in crate::tiers) counter: u64,
}

impl Seal {
    pub(in crate::tiers) const EMPTY: Seal = Seal { counter: 0 };
}

/// The seals of 64 consecutive slots.
struct Chunk {
    seals: [Seal; CHUNK_SLOTS as usize],
    /// Seals with a nonzero counter.
    live: u32,
}

/// Hashes a chunk's key (its number divided by `SHARDS`, so consecutive keys in a shard are
/// consecutive numbers) by one multiplication: the table's low bits are then a bijection of
/// the key's, and its top bits are well mixed.
#[derive(Default)]
struct ChunkHasher(u64);

impl Hasher for ChunkHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type ChunkMap = HashMap<u32, Box<Chunk>, BuildHasherDefault<ChunkHasher>>;

/// The side table: the seal of every sealed slot, in chunks that exist only while one of
/// their slots is sealed. A shard's lock is held only to copy seals in or out.
pub(in crate::tiers) struct SealTable {
    shards: Box<[CachePadded<Mutex<ChunkMap>>]>,
}

/// Heap bytes of a table with no seal (its shards).
pub(in crate::tiers) const EMPTY_TABLE_BYTES: usize =
    SHARDS * size_of::<CachePadded<Mutex<ChunkMap>>>();

/// Where a slot's seal lives: shard, key in the shard, index in the chunk.
fn locate(slot: u64) -> (usize, u32, usize) {
    let chunk = slot / CHUNK_SLOTS;
    (
        (chunk % SHARDS as u64) as usize,
        (chunk / SHARDS as u64) as u32,
        (slot % CHUNK_SLOTS) as usize,
    )
}

impl SealTable {
    pub(in crate::tiers) fn new() -> Self {
        SealTable {
            shards: (0..SHARDS)
                .map(|_| CachePadded::new(Mutex::new(ChunkMap::default())))
                .collect(),
        }
    }

    /// Calls `f(chunk, index in the chunk, index in the range, how many)` for each chunk's
    /// part of the slots `first..first + n`, under its shard's lock, creating missing chunks
    /// when `create` (otherwise a missing chunk is `None`).
    fn each_chunk(
        &self,
        first: u64,
        n: usize,
        create: bool,
        mut f: impl FnMut(Option<&mut Chunk>, usize, usize, usize),
    ) {
        let mut done = 0;
        while done < n {
            let slot = first + done as u64;
            let (shard, key, idx) = locate(slot);
            let k = (CHUNK_SLOTS as usize - idx).min(n - done);
            let mut map = self.shards[shard].lock();
            let chunk = if create {
                Some(&mut **map.entry(key).or_insert_with(|| {
                    Box::new(Chunk {
                        seals: [Seal::EMPTY; CHUNK_SLOTS as usize],
                        live: 0,
                    })
                }))
            } else {
                map.get_mut(&key).map(|c| &mut **c)
            };
            f(chunk, idx, done, k);
            done += k;
        }
    }

    /// Records the seals of `first..first + seals.len()`.
    pub(in crate::tiers) fn record(&self, first: u64, seals: &[Seal]) {
        self.each_chunk(first, seals.len(), true, |chunk, idx, at, k| {
            let Some(c) = chunk else { return };
            for (dst, src) in c.seals[idx..idx + k].iter_mut().zip(&seals[at..at + k]) {
                if dst.counter == 0 {
                    c.live += 1;
                }
                *dst = *src;
            }
        });
    }

    /// Copies out the seals of `first..first + out.len()`; the first slot without one is the
    /// error.
    pub(in crate::tiers) fn lookup(&self, first: u64, out: &mut [Seal]) -> Result<(), u64> {
        let mut missing = None;
        self.each_chunk(first, out.len(), false, |chunk, idx, at, k| {
            match chunk {
                Some(c) => out[at..at + k].copy_from_slice(&c.seals[idx..idx + k]),
                None => out[at..at + k].fill(Seal::EMPTY),
            }
            if missing.is_none() {
                missing = out[at..at + k]
                    .iter()
                    .position(|s| s.counter == 0)
                    .map(|i| first + (at + i) as u64);
            }
        });
        missing.map_or(Ok(()), Err)
    }

    /// Forgets a slot's seal (the slot is free); frees its chunk with the chunk's last seal.
    pub(in crate::tiers) fn forget(&self, slot: u64) {
        let (shard, key, idx) = locate(slot);
        let mut map = self.shards[shard].lock();
        let Some(c) = map.get_mut(&key) else { return };
        if c.seals[idx].counter == 0 {
            return;
        }
        c.seals[idx] = Seal::EMPTY;
        c.live -= 1;
        if c.live == 0 {
            map.remove(&key);
            // Give the table's peak back once it is three quarters empty, all of it once empty.
            if map.is_empty() {
                *map = ChunkMap::default();
            } else if map.capacity() > 64 && map.len() < map.capacity() / 4 {
                let len = map.len();
                map.shrink_to(len * 2);
            }
        }
    }

    /// Heap bytes: the shards, each map's table (from its capacity) and the chunks.
    pub(in crate::tiers) fn heap_bytes(&self) -> usize {
        let entry = size_of::<(u32, Box<Chunk>)>() + 1; // + hashbrown's control byte
        EMPTY_TABLE_BYTES
            + self
                .shards
                .iter()
                .map(|s| {
                    let m = s.lock();
                    m.capacity() * entry + m.len() * size_of::<Chunk>()
                })
                .sum::<usize>()
    }
}

/// Zeroes 16 KiB of the stack below the caller's frame, where the frames of the functions it
/// called lay (best effort: what they left of the key schedule).
#[inline(never)]
fn scrub_stack() {
    let mut buf = [0u8; 16 << 10];
    crate::sys::wipe(&mut buf);
    std::hint::black_box(&mut buf);
}

/// The daemon's sealing key, in memory of its own: locked, out of core dumps and children,
/// wiped on drop; the raw key it is built from lies there too, wiped once the key schedule is
/// built.
struct LockedKey(crate::sys::Secret<LessSafeKey, KEY_LEN>);

impl LockedKey {
    /// A fresh random key.
    fn generate() -> io::Result<Self> {
        let key = Self::build()?;
        scrub_stack();
        Ok(key)
    }

    /// Out of line so that `scrub_stack` can reach the frames below it.
    #[inline(never)]
    fn build() -> io::Result<Self> {
        crate::sys::Secret::new(
            |raw| {
                crate::sys::random_bytes(raw)
                    .map_err(|e| io::Error::new(e.kind(), format!("drawing the key: {e}")))
            },
            |raw| {
                UnboundKey::new(&AES_256_GCM, raw)
                    .map(LessSafeKey::new)
                    .map_err(|_| io::Error::other("AES-256-GCM refused a 32-byte key"))
            },
        )
        .map(LockedKey)
    }

    fn get(&self) -> &LessSafeKey {
        self.0.get()
    }
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[..8].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

thread_local! {
    /// Where a write's pages are sealed before the one write to the device, and where a read
    /// lands before its pages are opened into the caller's buffer. It only ever holds
    /// ciphertext and tags.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Scratch capacity a thread keeps between calls: an eviction batch's pages with their tags
/// (`reclaim::BATCH_PAGES`), so that sealing a batch neither allocates nor faults in memory.
const SCRATCH_KEEP: usize = 256 * (PAGE_SIZE + TAG_LEN);

/// Runs `f` on `len` bytes of this thread's scratch.
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut buf) => {
            buf.resize(len, 0);
            let r = f(&mut buf[..]);
            if buf.capacity() > SCRATCH_KEEP {
                *buf = Vec::new();
            }
            r
        }
        Err(_) => f(&mut vec![0; len]),
    })
}

/// A backend whose pages are sealed with AES-256-GCM: see the module's documentation.
pub struct SealedBackend<B> {
    inner: B,
    key: LockedKey,
    /// The next write counter value (the first is 1: 0 marks an empty seal).
    next_counter: AtomicU64,
    seals: SealTable,
    auth_failures: AtomicU64,
}

impl<B: fmt::Debug> fmt::Debug for SealedBackend<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealedBackend")
            .field("inner", &self.inner)
            .field("cipher", &CIPHER)
            .field("writes", &(self.next_counter.load(Ordering::Relaxed) - 1))
            .finish_non_exhaustive()
    }
}

/// The slots `offset..offset + len` covers.
pub(in crate::tiers) fn slots_of(offset: u64, len: usize) -> io::Result<(u64, usize)> {
    if offset % PAGE_SIZE_U64 != 0 || len % PAGE_SIZE != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "sealed backend access of {len} bytes at {offset:#x}: whole pages at page offsets only"
            ),
        ));
    }
    Ok((offset / PAGE_SIZE_U64, len / PAGE_SIZE))
}

impl<B: Backend> SealedBackend<B> {
    /// Wraps `inner` with a fresh key (fails if the key's memory cannot be locked).
    pub fn new(inner: B) -> io::Result<Self> {
        Ok(SealedBackend {
            inner,
            key: LockedKey::generate()?,
            next_counter: AtomicU64::new(1),
            seals: SealTable::new(),
            auth_failures: AtomicU64::new(0),
        })
    }

    /// The slot is free: forget its seal (what the device still holds there can no longer be
    /// opened, not even by this daemon).
    pub fn forget(&self, slot: u64) {
        self.seals.forget(slot);
    }

    /// Pages read back that failed authentication.
    pub fn auth_failures(&self) -> u64 {
        self.auth_failures.load(Ordering::Relaxed)
    }

    /// Heap bytes of the side table of seals.
    pub fn metadata_bytes(&self) -> usize {
        self.seals.heap_bytes()
    }

    /// Seals the pages of `data` (slots from `first`, counters from `base`) into `cts`, their
    /// tags into `tags`.
    fn seal_pages(
        &self,
        first: u64,
        base: u64,
        data: &[u8],
        cts: &mut [u8],
        tags: &mut [u8],
    ) -> io::Result<()> {
        let key = self.key.get();
        let pages = data.chunks_exact(PAGE_SIZE);
        for (i, ((page, ct), tag)) in pages
            .zip(cts.chunks_exact_mut(PAGE_SIZE))
            .zip(tags.chunks_exact_mut(TAG_LEN))
            .enumerate()
        {
            let (slot, counter) = (first + i as u64, base + i as u64);
            ct.copy_from_slice(page);
            let t = key
                .seal_in_place_separate_tag(nonce(counter), Aad::from(slot.to_le_bytes()), ct)
                .map_err(|_| io::Error::other(format!("sealing the page of slot {slot}")))?;
            tag.copy_from_slice(t.as_ref());
        }
        Ok(())
    }

    /// The seal recorded for a slot (tests).
    #[cfg(test)]
    pub(in crate::tiers) fn seal_of(&self, slot: u64) -> Option<u64> {
        let mut s = [Seal::EMPTY];
        self.seals.lookup(slot, &mut s).ok().map(|()| s[0].counter)
    }

    /// Records `from`'s seal as `to`'s (tests: an attacker who could move the nonce too).
    #[cfg(test)]
    fn copy_seal(&self, from: u64, to: u64) {
        let mut s = [Seal::EMPTY];
        self.seals.lookup(from, &mut s).unwrap();
        self.seals.record(to, &s);
    }
}

impl<B: Backend> Backend for SealedBackend<B> {
    fn describe(&self) -> String {
        format!(
            "{}, sealed with AES-256-GCM (a page of tags per {GROUP_SLOTS} pages; key in locked memory)",
            self.inner.describe()
        )
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_all(&[(offset, data)]).pop().unwrap_or(Ok(()))
    }

    /// Each write's pages sealed into this thread's scratch, then all of them (pages and
    /// tags, a pair of writes per group a write spans) to the device in one batch; a write's
    /// seals are published once the device holds all of its parts.
    fn write_all(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        let total: usize = writes.iter().map(|(_, d)| d.len() / PAGE_SIZE).sum();
        with_scratch(total * (PAGE_SIZE + TAG_LEN), |buf| {
            let (cts, tags) = buf.split_at_mut(total * PAGE_SIZE);
            // (first slot, first counter, pages, first page in the scratch) of each write.
            let mut sealed: Vec<io::Result<(u64, u64, usize, usize)>> =
                Vec::with_capacity(writes.len());
            let mut k = 0;
            for &(offset, data) in writes {
                sealed.push((|| {
                    let (first, n) = slots_of(offset, data.len())?;
                    let base = self.next_counter.fetch_add(n as u64, Ordering::Relaxed);
                    if base >= COUNTER_LIMIT {
                        return Err(io::Error::other(
                            "the sealing key's nonce counter is exhausted",
                        ));
                    }
                    self.seal_pages(
                        first,
                        base,
                        data,
                        &mut cts[k * PAGE_SIZE..(k + n) * PAGE_SIZE],
                        &mut tags[k * TAG_LEN..(k + n) * TAG_LEN],
                    )?;
                    Ok((first, base, n, k))
                })());
                if let Ok((_, _, n, _)) = sealed.last().expect("just pushed") {
                    k += n;
                }
            }
            // The device's writes, each with the index of the write it is part of.
            let (cts, tags) = (&*cts, &*tags);
            let mut parts: Vec<(u64, &[u8])> = Vec::new();
            let mut owner: Vec<usize> = Vec::new();
            for (w, s) in sealed.iter().enumerate() {
                let Ok((first, _, n, k)) = *s else { continue };
                for (at, len) in group_runs(first, n) {
                    let slot = first + at as u64;
                    let (p0, p1) = (k + at, k + at + len);
                    parts.push((data_offset(slot), &cts[p0 * PAGE_SIZE..p1 * PAGE_SIZE]));
                    parts.push((tag_offset(slot), &tags[p0 * TAG_LEN..p1 * TAG_LEN]));
                    owner.extend([w, w]);
                }
            }
            let mut failed: Vec<Option<io::Error>> = (0..writes.len()).map(|_| None).collect();
            for (r, &w) in self.inner.write_all(&parts).into_iter().zip(&owner) {
                if let Err(e) = r {
                    failed[w].get_or_insert(e);
                }
            }
            sealed
                .into_iter()
                .zip(failed)
                .map(|(s, f)| {
                    let (first, base, n, _) = s?;
                    if let Some(e) = f {
                        return Err(e);
                    }
                    // Published only once the device holds the pages: a reader finds them
                    // there.
                    let seals: Vec<Seal> =
                        (0..n as u64).map(|i| Seal { counter: base + i }).collect();
                    self.seals.record(first, &seals);
                    Ok(())
                })
                .collect()
        })
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let (first, n) = slots_of(offset, out.len())?;
        let mut seals = vec![Seal::EMPTY; n];
        if let Err(slot) = self.seals.lookup(first, &mut seals) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("slot {slot} holds no page sealed by this daemon"),
            ));
        }
        let key = self.key.get();
        let failed = with_scratch(n * TAG_LEN, |tags| -> io::Result<Option<u64>> {
            // The ciphertext lands in `out` itself and is opened in place. Every group's pages
            // and tags are asked for together (one round trip to a network store).
            {
                let mut parts: Vec<(u64, &mut [u8])> = Vec::with_capacity(4);
                let (mut pages_rest, mut tags_rest) = (&mut out[..], &mut tags[..]);
                for (at, len) in group_runs(first, n) {
                    let slot = first + at as u64;
                    let (p, rest) = pages_rest.split_at_mut(len * PAGE_SIZE);
                    pages_rest = rest;
                    let (t, rest) = tags_rest.split_at_mut(len * TAG_LEN);
                    tags_rest = rest;
                    parts.push((data_offset(slot), p));
                    parts.push((tag_offset(slot), t));
                }
                self.inner.read_all(&mut parts)?;
            }
            let sealed = tags.chunks_exact(TAG_LEN).zip(&seals);
            for (i, ((tag, seal), page)) in sealed.zip(out.chunks_exact_mut(PAGE_SIZE)).enumerate()
            {
                let slot = first + i as u64;
                let mut t = [0u8; TAG_LEN];
                t.copy_from_slice(tag);
                let opened = key.open_in_place_separate_tag(
                    nonce(seal.counter),
                    Aad::from(slot.to_le_bytes()),
                    Tag::from(t),
                    page,
                    0..,
                );
                if opened.is_err() {
                    return Ok(Some(slot));
                }
            }
            Ok(None)
        })?;
        if let Some(slot) = failed {
            // Nothing of a failed read reaches the caller.
            out.fill(0);
            self.auth_failures.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the page of slot {slot} failed authentication (AES-GCM tag mismatch): it \
                     was altered on the backing device, or is not the page last sealed there"
                ),
            ));
        }
        Ok(())
    }

    fn close(&self) {
        self.inner.close()
    }

    fn counters(&self, v: &mut serde_json::Value) {
        self.inner.counters(v)
    }
    fn flush(&self) {
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len: u64) {
        let (first, n) = (offset / PAGE_SIZE_U64, len / PAGE_SIZE_U64);
        // The data pages; a tag left behind opens nothing without its seal, which is forgotten.
        for (at, run) in group_runs(first, n as usize) {
            let slot = first + at as u64;
            self.inner
                .discard(data_offset(slot), run as u64 * PAGE_SIZE_U64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A backend in memory (the test double): the device's bytes, visible to the test.
    #[derive(Debug, Default)]
    struct MemBackend(Mutex<Vec<u8>>);

    impl Backend for MemBackend {
        fn describe(&self) -> String {
            "memory".into()
        }
        fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            let mut v = self.0.lock();
            let end = offset as usize + data.len();
            if v.len() < end {
                v.resize(end, 0);
            }
            v[offset as usize..end].copy_from_slice(data);
            Ok(())
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
            let v = self.0.lock();
            let src = v
                .get(offset as usize..offset as usize + out.len())
                .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            out.copy_from_slice(src);
            Ok(())
        }
    }

    fn page(fill: u8) -> Vec<u8> {
        let mut p = vec![fill; PAGE_SIZE];
        p[..16].copy_from_slice(b"PLAINTEXT-MARKER");
        p
    }

    /// A slot's sealed page (ciphertext, then tag) as the device holds it.
    fn device(b: &SealedBackend<MemBackend>, slot: u64) -> Vec<u8> {
        let v = b.inner.0.lock();
        let mut out = v[data_offset(slot) as usize..][..PAGE_SIZE].to_vec();
        out.extend_from_slice(&v[tag_offset(slot) as usize..][..TAG_LEN]);
        out
    }

    /// Puts `sealed` (ciphertext, then tag) on the device where slot `slot`'s go.
    fn put_device(b: &SealedBackend<MemBackend>, slot: u64, sealed: &[u8]) {
        b.inner
            .write(data_offset(slot), &sealed[..PAGE_SIZE])
            .unwrap();
        b.inner
            .write(tag_offset(slot), &sealed[PAGE_SIZE..])
            .unwrap();
    }

    /// Groups: a run across a group's end is split there, pages and tags land where the
    /// offsets say, and the device is as large as the slots need.
    #[test]
    fn runs_across_groups_round_trip() {
        let b = SealedBackend::new(MemBackend::default()).unwrap();
        let first = GROUP_SLOTS - 3;
        let run: Vec<u8> = (0..8).flat_map(|i| page(i as u8 + 1)).collect();
        b.write(first * PAGE_SIZE_U64, &run).unwrap();
        let mut out = vec![0u8; run.len()];
        b.read(first * PAGE_SIZE_U64, &mut out).unwrap();
        assert_eq!(out, run);
        assert_eq!(
            group_runs(first, 8).collect::<Vec<_>>(),
            vec![(0, 3), (3, 5)]
        );
        assert_eq!(data_offset(GROUP_SLOTS), GROUP_PAGES * PAGE_SIZE_U64);
        assert_eq!(tag_offset(0), GROUP_SLOTS * PAGE_SIZE_U64);
        assert!(tag_offset(GROUP_SLOTS - 1) + TAG_LEN as u64 <= GROUP_PAGES * PAGE_SIZE_U64);
        assert!(b.inner.0.lock().len() as u64 <= device_bytes(first + 8));
        // The data pages of the run are whole on the device: a page's offset is page-aligned.
        for s in first..first + 8 {
            assert_eq!(data_offset(s) % PAGE_SIZE_U64, 0);
        }
    }

    #[test]
    fn round_trip_and_only_ciphertext_on_the_device() {
        let b = SealedBackend::new(MemBackend::default()).unwrap();
        let run: Vec<u8> = (0..16).flat_map(|i| page(i as u8)).collect();
        b.write(32 * PAGE_SIZE_U64, &run).unwrap();
        let mut out = vec![0u8; run.len()];
        b.read(32 * PAGE_SIZE_U64, &mut out).unwrap();
        assert_eq!(out, run);
        let dev = b.inner.0.lock().clone();
        assert!(!dev.windows(16).any(|w| w == b"PLAINTEXT-MARKER"));
        // Slot 31 (never written, inside the device) is refused, not read as zeros.
        let e = b
            .read(31 * PAGE_SIZE_U64, &mut out[..PAGE_SIZE])
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(b.read(100, &mut out[..PAGE_SIZE]).is_err(), "unaligned");
        assert_eq!(b.auth_failures(), 0);
    }

    /// Every rewrite of a slot takes a new nonce; the same page gives a new ciphertext; a
    /// rolled-back ciphertext (an older sealing of the same slot) is refused.
    #[test]
    fn nonces_never_repeat_and_rollback_fails() {
        let b = SealedBackend::new(MemBackend::default()).unwrap();
        let p = page(7);
        let mut nonces = std::collections::HashSet::new();
        let mut ciphertexts = std::collections::HashSet::new();
        b.write(0, &page(1)).unwrap();
        let old = device(&b, 0);
        for _ in 0..200 {
            b.write(0, &p).unwrap();
            let counter = b.seal_of(0).unwrap();
            assert!(nonces.insert(counter), "nonce {counter} repeated");
            assert!(ciphertexts.insert(device(&b, 0)), "ciphertext repeated");
        }
        // Other slots written meanwhile draw from the same counter.
        b.write(PAGE_SIZE_U64, &p).unwrap();
        assert!(nonces.insert(b.seal_of(1).unwrap()));
        // The older sealing of slot 0, tag and all, put back.
        b.inner.write(0, &old).unwrap();
        let mut out = vec![0u8; PAGE_SIZE];
        assert_eq!(
            b.read(0, &mut out).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        assert!(out.iter().all(|&x| x == 0), "no unauthenticated bytes");
        assert_eq!(b.auth_failures(), 1);
    }

    /// A ciphertext copied to another slot fails, even with its tag and nonce moved along:
    /// the slot is the associated data.
    #[test]
    fn a_page_moved_to_another_slot_fails() {
        let b = SealedBackend::new(MemBackend::default()).unwrap();
        b.write(0, &page(1)).unwrap();
        b.write(5 * PAGE_SIZE_U64, &page(2)).unwrap();
        put_device(&b, 5, &device(&b, 0));
        let mut out = vec![0u8; PAGE_SIZE];
        assert!(b.read(5 * PAGE_SIZE_U64, &mut out).is_err());
        b.copy_seal(0, 5);
        assert!(b.read(5 * PAGE_SIZE_U64, &mut out).is_err());
        b.read(0, &mut out).unwrap();
        assert_eq!(out, page(1));
        assert_eq!(b.auth_failures(), 2);
    }

    #[test]
    fn a_flipped_bit_fails_the_read_of_a_run() {
        let b = SealedBackend::new(MemBackend::default()).unwrap();
        let run: Vec<u8> = (0..16).flat_map(|i| page(i as u8)).collect();
        b.write(0, &run).unwrap();
        b.inner.0.lock()[data_offset(9) as usize + 2000] ^= 0x10;
        let mut out = vec![0u8; run.len()];
        let e = b.read(0, &mut out).unwrap_err();
        assert!(e.to_string().contains("slot 9"), "{e}");
        assert!(out.iter().all(|&x| x == 0));
        // The pages before it are whole, read alone.
        b.read(0, &mut out[..9 * PAGE_SIZE]).unwrap();
        assert_eq!(out[..9 * PAGE_SIZE], run[..9 * PAGE_SIZE]);
        // A bit of a tag (page 3's) is as good as one of the page.
        b.inner.0.lock()[tag_offset(3) as usize + 5] ^= 0x80;
        let e = b.read(0, &mut out[..9 * PAGE_SIZE]).unwrap_err();
        assert!(e.to_string().contains("slot 3"), "{e}");
        assert_eq!(b.auth_failures(), 2);
    }

    /// Chunks come with their first seal and go with their last; the table's bytes follow.
    #[test]
    fn the_side_table_holds_only_live_chunks() {
        let b = SealedBackend::new(MemBackend::default()).unwrap();
        let empty = b.metadata_bytes();
        let run: Vec<u8> = (0..16).flat_map(|i| page(i as u8)).collect();
        for k in 0..64u64 {
            b.write(k * 16 * PAGE_SIZE_U64, &run).unwrap();
        }
        let full = b.metadata_bytes() - empty;
        let per_page = full as f64 / 1024.0;
        tracing::info!("seal table: {per_page:.1} bytes per sealed page (1024 pages)");
        assert!((8.0..10.0).contains(&per_page), "{per_page}");
        for s in 0..1024 {
            b.forget(s);
        }
        for shard in b.seals.shards.iter() {
            assert!(shard.lock().is_empty());
        }
        assert_eq!(b.metadata_bytes(), EMPTY_TABLE_BYTES);
        assert!(b.read(0, &mut vec![0; PAGE_SIZE]).is_err(), "forgotten");
        b.forget(5); // twice: nothing happens
    }

    #[test]
    fn the_key_page_is_locked_and_wiped() {
        let key = LockedKey::generate().unwrap();
        assert!(key.0.seed_is_wiped(), "the raw key is wiped");
        assert!(key.0.resident().unwrap(), "resident");
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let locked_kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmLck:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        assert!(locked_kb >= 4, "VmLck {locked_kb} kB");
        // Two keys differ (and each is wiped and unmapped when dropped).
        let (a, b) = (
            SealedBackend::new(MemBackend::default()).unwrap(),
            SealedBackend::new(MemBackend::default()).unwrap(),
        );
        a.write(0, &page(1)).unwrap();
        b.write(0, &page(1)).unwrap();
        assert_eq!(a.seal_of(0), b.seal_of(0), "the same nonce");
        assert_ne!(device(&a, 0), device(&b, 0), "under different keys");
    }

    /// The cost of sealing against a plain copy, and of the sealed path against the plain one
    /// through a memory backend and through a swap file (page cache), best of 5 rounds
    /// (printed, not asserted):
    /// `cargo test --release -p uffd-daemon --lib tiers::seal::tests::cost_per_page -- --nocapture`.
    #[test]
    fn cost_per_page() {
        const PAGES: usize = 8 * 1024;
        /// The best of 5 rounds of `f` (which handles `PAGES` pages), ns per page.
        fn best(mut f: impl FnMut()) -> f64 {
            (0..5)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_nanos() as f64 / PAGES as f64
                })
                .fold(f64::INFINITY, f64::min)
        }
        let src = page(3);
        let mut dst = vec![0u8; PAGE_SIZE];
        let memcpy = best(|| {
            for i in 0..PAGES {
                dst.copy_from_slice(std::hint::black_box(&src));
                dst[0] = i as u8;
                std::hint::black_box(&mut dst);
            }
        });
        let key = LockedKey::generate().unwrap();
        let key = key.get();
        let mut buf = src.clone();
        let (mut seal, mut open) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..5 {
            let t = Instant::now();
            let tags: Vec<Tag> = (0..PAGES as u64)
                .map(|i| {
                    let aad = Aad::from(i.to_le_bytes());
                    key.seal_in_place_separate_tag(nonce(i + 1), aad, &mut buf)
                        .unwrap()
                })
                .collect();
            seal = seal.min(t.elapsed().as_nanos() as f64 / PAGES as f64);
            let t = Instant::now();
            for (i, &tag) in tags.iter().enumerate().rev() {
                let aad = Aad::from((i as u64).to_le_bytes());
                key.open_in_place_separate_tag(nonce(i as u64 + 1), aad, tag, &mut buf, 0..)
                    .unwrap();
            }
            open = open.min(t.elapsed().as_nanos() as f64 / PAGES as f64);
            assert_eq!(buf, src);
        }
        // Through a backend: a 16-page write and its read, sealed and plain.
        let run: Vec<u8> = (0..16).flat_map(|i| page(i as u8)).collect();
        let mut out = vec![0u8; run.len()];
        let mut through = |b: &dyn Backend| {
            best(|| {
                for k in 0..PAGES as u64 / 16 {
                    let off = (k % 64) * 16 * PAGE_SIZE_U64;
                    b.write(off, &run).unwrap();
                    b.read(off, &mut out).unwrap();
                }
            })
        };
        let mem_plain = through(&MemBackend::default());
        let mem_sealed = through(&SealedBackend::new(MemBackend::default()).unwrap());
        let dir = std::env::temp_dir();
        let file_plain = through(&super::super::FileBackend::create(None, &dir).unwrap());
        let file_sealed = through(
            &SealedBackend::new(super::super::FileBackend::create(None, &dir).unwrap()).unwrap(),
        );
        assert_eq!(out, run);
        tracing::info!(
            "per 4 KiB page, best of 5 rounds of {PAGES}: memcpy {memcpy:.0} ns, seal {seal:.0} \
             ns, open {open:.0} ns (seal+open {:.2} us, {:.1}x a memcpy each way); a 16-page \
             write and its read, per page: memory backend plain {mem_plain:.0} ns, sealed \
             {mem_sealed:.0} ns; swap file in {} plain {file_plain:.0} ns, sealed \
             {file_sealed:.0} ns",
            (seal + open) / 1000.0,
            (seal + open) / 2.0 / memcpy,
            dir.display(),
        );
    }
}
