//! The index of one shard: swap entry -> [`Entry`], a two-level radix keyed by the entry number
//! (the kernel indexes zswap entries with an xarray per swap device).
//!
//! Swap entries are small dense integers handed out by a slot allocator in clusters, so the
//! index is an array of chunks of [`CHUNK_ENTRIES`] entries, each allocated on its first store
//! and freed when its last entry goes. A shard holds every 64 MiB region `r` of swap space with
//! `r % shards == shard`; its *local chunk number* is `(r / shards) * 256 + chunk within the
//! region`. Local numbers below [`DENSE_CHUNKS`] index a vector of chunk pointers (the fast,
//! compact case: 8 bytes of top level per 64 entries); larger ones (swap entries beyond about
//! `DENSE_CHUNKS * 64 * shards`, never seen from a swap allocator of a realistic size) go
//! through a `BTreeMap`.
//!
//! An [`Entry`] is 16 bytes: a payload word (a pool handle, the same-filled word, or a pointer
//! to a multi-page object holding one of its `Arc` references), the page's CRC32C, and a word of
//! flags (kind, under writeback, on the LRU) and the page's slot in its multi-page object. The
//! LRU links of an entry live in [`Lru`], at the entry's position (chunk id, offset); the index
//! keeps the `ON_LRU` flag and the links in step.

use crate::lru::{Lru, CHUNK_ENTRIES, CHUNK_SHIFT};
use crate::pool::Handle;
use crate::store::{Payload, Shared, ENTRIES_PER_SHARD};
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// Local chunk numbers below this are kept in the dense vector of a shard.
pub(crate) const DENSE_CHUNKS: u64 = 1 << 16;

const CHUNKS_PER_REGION_SHIFT: u32 = ENTRIES_PER_SHARD.trailing_zeros() - CHUNK_SHIFT;
const OFFSET_MASK: u64 = CHUNK_ENTRIES as u64 - 1;

const KIND_MASK: u32 = 0b11;
const KIND_EMPTY: u32 = 0;
const KIND_SAME: u32 = 1;
const KIND_COMPRESSED: u32 = 2;
const KIND_SHARED: u32 = 3;
/// Set while `scan_objects` writes the entry back.
const WRITEBACK: u32 = 1 << 2;
/// Set exactly while the entry's position is linked on the LRU.
const ON_LRU: u32 = 1 << 3;
const SLOT_SHIFT: u32 = 16;

/// One stored page: 16 bytes.
///
/// INVARIANT: with kind `KIND_SHARED`, `word` is a pointer from `Arc::into_raw` and the entry
/// owns that strong reference (given back by `into_payload` or `Drop`).
#[derive(Debug)]
pub(crate) struct Entry {
    word: u64,
    crc: u32,
    meta: u32,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 16);

/// A borrowed view of an entry's payload.
#[derive(Debug)]
pub(crate) enum PayloadRef<'a> {
    Same(u64),
    Compressed(Handle),
    Shared(SharedRef<'a>, u16),
}

/// The multi-page object of an entry, borrowed for as long as the entry is.
#[derive(Debug)]
pub(crate) struct SharedRef<'a> {
    arc: ManuallyDrop<Arc<Shared>>,
    _entry: PhantomData<&'a Entry>,
}

impl std::ops::Deref for SharedRef<'_> {
    type Target = Arc<Shared>;
    fn deref(&self) -> &Arc<Shared> {
        &self.arc
    }
}

impl Entry {
    const EMPTY: Entry = Entry {
        word: 0,
        crc: 0,
        meta: KIND_EMPTY,
    };

    pub(crate) fn new(payload: Payload, crc: u32) -> Entry {
        let (word, meta) = match payload {
            Payload::Same(w) => (w, KIND_SAME),
            Payload::Compressed(h) => (h.raw(), KIND_COMPRESSED),
            Payload::Shared { obj, slot } => (
                Arc::into_raw(obj) as usize as u64,
                KIND_SHARED | (u32::from(slot) << SLOT_SHIFT),
            ),
        };
        // INVARIANT: a shared payload's strong reference moved into `word`.
        Entry { word, crc, meta }
    }

    fn is_empty(&self) -> bool {
        self.meta & KIND_MASK == KIND_EMPTY
    }

    pub(crate) fn crc(&self) -> u32 {
        self.crc
    }

    pub(crate) fn is_same(&self) -> bool {
        self.meta & KIND_MASK == KIND_SAME
    }

    pub(crate) fn is_shared(&self) -> bool {
        self.meta & KIND_MASK == KIND_SHARED
    }

    /// Compressed and multi-page entries go on the LRU; same-filled ones never do.
    fn belongs_on_lru(&self) -> bool {
        matches!(self.meta & KIND_MASK, KIND_COMPRESSED | KIND_SHARED)
    }

    pub(crate) fn writeback(&self) -> bool {
        self.meta & WRITEBACK != 0
    }

    pub(crate) fn set_writeback(&mut self, on: bool) {
        if on {
            self.meta |= WRITEBACK;
        } else {
            self.meta &= !WRITEBACK;
        }
    }

    pub(crate) fn on_lru(&self) -> bool {
        self.meta & ON_LRU != 0
    }

    pub(crate) fn payload(&self) -> PayloadRef<'_> {
        match self.meta & KIND_MASK {
            KIND_SAME => PayloadRef::Same(self.word),
            KIND_SHARED => {
                // SAFETY: by the type invariant `word` came from `Arc::into_raw` and this entry
                // holds that reference while it lives; `ManuallyDrop` keeps the view from giving
                // it back, and the view borrows the entry so it cannot outlive it.
                let arc = unsafe { Arc::from_raw(self.word as usize as *const Shared) };
                PayloadRef::Shared(
                    SharedRef {
                        arc: ManuallyDrop::new(arc),
                        _entry: PhantomData,
                    },
                    (self.meta >> SLOT_SHIFT) as u16,
                )
            }
            // Empty entries are never handed out; read as a handle that names nothing.
            _ => PayloadRef::Compressed(Handle::from_raw(self.word)),
        }
    }

    /// The payload, taking over the entry's reference to a multi-page object.
    pub(crate) fn into_payload(self) -> Payload {
        let this = ManuallyDrop::new(self);
        match this.meta & KIND_MASK {
            KIND_SAME => Payload::Same(this.word),
            KIND_SHARED => {
                // SAFETY: type invariant; `ManuallyDrop` keeps `Drop` from giving the reference
                // back a second time.
                let obj = unsafe { Arc::from_raw(this.word as usize as *const Shared) };
                Payload::Shared {
                    obj,
                    slot: (this.meta >> SLOT_SHIFT) as u16,
                }
            }
            _ => Payload::Compressed(Handle::from_raw(this.word)),
        }
    }

    /// Points the entry at pool handle `raw`, keeping its flags (a debug hook). A multi-page
    /// object's reference it held is dropped (not its pool chunks, as before the index change).
    pub(crate) fn set_handle(&mut self, raw: u64) {
        let flags = self.meta & (WRITEBACK | ON_LRU);
        let new = Entry::new(Payload::Compressed(Handle::from_raw(raw)), self.crc);
        let old = std::mem::replace(self, new);
        drop(old.into_payload());
        self.meta |= flags;
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if self.is_shared() {
            // SAFETY: type invariant: the entry owns this strong reference and gives it back
            // once, here (`into_payload` forgets the entry).
            drop(unsafe { Arc::from_raw(self.word as usize as *const Shared) });
        }
    }
}

#[derive(Debug)]
struct Chunk {
    /// Swap entry at offset 0.
    base: u64,
    /// Id in the LRU's chunk space: positions of this chunk are `id * 64 + offset`.
    id: u32,
    /// Non-empty entries.
    count: u32,
    entries: [Entry; CHUNK_ENTRIES],
}

/// The index of one shard. Not synchronised: each is behind its shard's lock.
#[derive(Debug)]
pub(crate) struct Index {
    /// log2 of the number of shards.
    shard_bits: u32,
    /// Chunks by local chunk number below [`DENSE_CHUNKS`].
    dense: Vec<Option<Box<Chunk>>>,
    /// Chunks by local chunk number from [`DENSE_CHUNKS`] up.
    sparse: BTreeMap<u64, Box<Chunk>>,
    chunks: usize,
}

impl Index {
    pub(crate) fn new(shards: usize) -> Index {
        Index {
            shard_bits: shards.trailing_zeros(),
            dense: Vec::new(),
            sparse: BTreeMap::new(),
            chunks: 0,
        }
    }

    fn local(&self, key: u64) -> u64 {
        let region = key / ENTRIES_PER_SHARD;
        ((region >> self.shard_bits) << CHUNKS_PER_REGION_SHIFT)
            | ((key >> CHUNK_SHIFT) & ((1 << CHUNKS_PER_REGION_SHIFT) - 1))
    }

    fn chunk(&self, key: u64) -> Option<&Chunk> {
        let local = self.local(key);
        if local < DENSE_CHUNKS {
            self.dense.get(local as usize)?.as_deref()
        } else {
            self.sparse.get(&local).map(|c| &**c)
        }
    }

    fn chunk_mut(&mut self, key: u64) -> Option<&mut Chunk> {
        let local = self.local(key);
        if local < DENSE_CHUNKS {
            self.dense.get_mut(local as usize)?.as_deref_mut()
        } else {
            self.sparse.get_mut(&local).map(|c| &mut **c)
        }
    }

    /// The entry stored at `key`.
    pub(crate) fn get(&self, key: u64) -> Option<&Entry> {
        let e = &self.chunk(key)?.entries[(key & OFFSET_MASK) as usize];
        (!e.is_empty()).then_some(e)
    }

    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut Entry> {
        let e = &mut self.chunk_mut(key)?.entries[(key & OFFSET_MASK) as usize];
        (!e.is_empty()).then_some(e)
    }

    pub(crate) fn contains(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// The LRU position of `key` (while its chunk lives).
    pub(crate) fn pos(&self, key: u64) -> Option<u32> {
        let c = self.chunk(key)?;
        Some((c.id << CHUNK_SHIFT) | (key & OFFSET_MASK) as u32)
    }

    /// Makes sure the chunk holding `key` exists; false when the LRU has no chunk id left.
    pub(crate) fn ensure_chunk(&mut self, key: u64, lru: &mut Lru) -> bool {
        if self.chunk(key).is_some() {
            return true;
        }
        let base = key & !OFFSET_MASK;
        let Some(id) = lru.alloc_chunk(base) else {
            return false;
        };
        let chunk = Box::new(Chunk {
            base,
            id,
            count: 0,
            entries: std::array::from_fn(|_| Entry::EMPTY),
        });
        let local = self.local(key);
        if local < DENSE_CHUNKS {
            let i = local as usize;
            if self.dense.len() <= i {
                // Grow to a power of two at most: the top level is 8 bytes per 64 entries.
                let want = (i + 1).next_power_of_two().min(DENSE_CHUNKS as usize);
                self.dense.reserve_exact(want - self.dense.len());
                self.dense.resize_with(want, || None);
            }
            self.dense[i] = Some(chunk);
        } else {
            self.sparse.insert(local, chunk);
        }
        self.chunks += 1;
        true
    }

    /// Frees the chunk of `key` if it holds no entry (undoing `ensure_chunk`).
    pub(crate) fn free_if_empty(&mut self, key: u64, lru: &mut Lru) {
        if self.chunk(key).is_some_and(|c| c.count == 0) {
            self.free_chunk(key, lru);
        }
    }

    fn free_chunk(&mut self, key: u64, lru: &mut Lru) {
        let local = self.local(key);
        let chunk = if local < DENSE_CHUNKS {
            self.dense.get_mut(local as usize).and_then(Option::take)
        } else {
            self.sparse.remove(&local)
        };
        if let Some(c) = chunk {
            debug_assert_eq!(c.count, 0);
            lru.free_chunk(c.id);
            self.chunks -= 1;
        }
    }

    /// Stores `entry` at `key` (whose chunk exists: [`Index::ensure_chunk`]), linking it at the
    /// LRU's head if it is compressed; returns the entry it replaced, already unlinked.
    pub(crate) fn insert(&mut self, key: u64, mut entry: Entry, lru: &mut Lru) -> Option<Entry> {
        let Some(chunk) = self.chunk_mut(key) else {
            unreachable!("insert after ensure_chunk under the same lock");
        };
        let off = (key & OFFSET_MASK) as usize;
        let pos = (chunk.id << CHUNK_SHIFT) | off as u32;
        let mut old = std::mem::replace(&mut chunk.entries[off], Entry::EMPTY);
        let old = if old.is_empty() {
            chunk.count += 1;
            None
        } else {
            if old.on_lru() {
                lru.remove(pos);
                old.meta &= !ON_LRU;
            }
            Some(old)
        };
        if entry.belongs_on_lru() {
            lru.push_head(pos);
            entry.meta |= ON_LRU;
        }
        chunk.entries[off] = entry;
        old
    }

    /// Removes the entry at `key` (unlinked from the LRU); frees its chunk if it was the last.
    pub(crate) fn remove(&mut self, key: u64, lru: &mut Lru) -> Option<Entry> {
        let chunk = self.chunk_mut(key)?;
        let off = (key & OFFSET_MASK) as usize;
        if chunk.entries[off].is_empty() {
            return None;
        }
        let pos = (chunk.id << CHUNK_SHIFT) | off as u32;
        let mut e = std::mem::replace(&mut chunk.entries[off], Entry::EMPTY);
        chunk.count -= 1;
        let empty = chunk.count == 0;
        if e.on_lru() {
            lru.remove(pos);
            e.meta &= !ON_LRU;
        }
        if empty {
            self.free_chunk(key, lru);
        }
        Some(e)
    }

    /// Takes the entry at `key` off the LRU (it stays stored).
    pub(crate) fn lru_unlink(&mut self, key: u64, lru: &mut Lru) {
        let Some(pos) = self.pos(key) else { return };
        if let Some(e) = self.get_mut(key) {
            if e.on_lru() {
                lru.remove(pos);
                e.meta &= !ON_LRU;
            }
        }
    }

    /// Puts the entry at `key` back at the LRU's head if it belongs there and is off it.
    pub(crate) fn lru_relink(&mut self, key: u64, lru: &mut Lru) {
        let Some(pos) = self.pos(key) else { return };
        if let Some(e) = self.get_mut(key) {
            if e.belongs_on_lru() && !e.on_lru() {
                lru.push_head(pos);
                e.meta |= ON_LRU;
            }
        }
    }

    /// Number of live chunks.
    pub(crate) fn chunk_count(&self) -> usize {
        self.chunks
    }

    /// Heap bytes held (from capacities).
    pub(crate) fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        // A B-tree node holds up to 11 keys and values with two words of overhead: count the
        // pairs at an average two-thirds fill.
        let sparse = self.sparse.len() * (size_of::<u64>() + size_of::<Box<Chunk>>()) * 3 / 2;
        self.dense.capacity() * size_of::<Option<Box<Chunk>>>()
            + sparse
            + self.chunks * size_of::<Chunk>()
    }

    /// Every stored entry as (swap entry, entry, LRU position), after checking each chunk's
    /// count, that no chunk is empty and that its id is live in `lru` with its base.
    pub(crate) fn entries_checked<'a>(
        &'a self,
        lru: &Lru,
    ) -> Result<Vec<(u64, &'a Entry, u32)>, String> {
        let mut out = Vec::new();
        let mut chunks = 0;
        for c in self.dense.iter().flatten().chain(self.sparse.values()) {
            chunks += 1;
            let n = c.entries.iter().filter(|e| !e.is_empty()).count();
            if n == 0 || n != c.count as usize {
                return Err(format!(
                    "index chunk at {:#x}: count {} but {n} entries",
                    c.base, c.count
                ));
            }
            if self.chunk(c.base).map(|x| x.base) != Some(c.base) {
                return Err(format!("index chunk at {:#x} filed elsewhere", c.base));
            }
            if lru.chunk_base(c.id) != Some(c.base) {
                return Err(format!(
                    "index chunk at {:#x}: id {} not live",
                    c.base, c.id
                ));
            }
            for (off, e) in c.entries.iter().enumerate() {
                if !e.is_empty() {
                    out.push((c.base + off as u64, e, (c.id << CHUNK_SHIFT) | off as u32));
                }
            }
        }
        if chunks != self.chunks {
            return Err(format!(
                "index counts {} chunks, holds {chunks}",
                self.chunks
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::AtomicU32;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        Same,
        Compressed,
        Shared,
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, Kind, u64),
        Remove(u64),
        Unlink(u64),
        Relink(u64),
    }

    /// Dense small keys, keys across a region (shard) boundary, keys past the dense top level
    /// (the sparse `BTreeMap`), and keys at the top of the u64 range.
    fn key() -> impl Strategy<Value = u64> {
        prop_oneof![
            0u64..300,
            (ENTRIES_PER_SHARD - 70)..(ENTRIES_PER_SHARD + 70),
            (DENSE_CHUNKS << 15)..((DENSE_CHUNKS << 15) + 200),
            (u64::MAX - 140)..=u64::MAX,
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        let kind = prop_oneof![Just(Kind::Same), Just(Kind::Compressed), Just(Kind::Shared)];
        prop_oneof![
            4 => (key(), kind, any::<u64>()).prop_map(|(k, kind, v)| Op::Insert(k, kind, v)),
            3 => key().prop_map(Op::Remove),
            1 => key().prop_map(Op::Unlink),
            1 => key().prop_map(Op::Relink),
        ]
    }

    fn make(kind: Kind, v: u64, shared: &Arc<Shared>) -> Entry {
        let payload = match kind {
            Kind::Same => Payload::Same(v),
            Kind::Compressed => Payload::Compressed(Handle::from_raw(v)),
            Kind::Shared => Payload::Shared {
                obj: Arc::clone(shared),
                slot: (v % 512) as u16,
            },
        };
        Entry::new(payload, v as u32)
    }

    fn matches(e: &Entry, kind: Kind, v: u64, shared: &Arc<Shared>) -> bool {
        e.crc() == v as u32
            && match (e.payload(), kind) {
                (PayloadRef::Same(w), Kind::Same) => w == v,
                (PayloadRef::Compressed(h), Kind::Compressed) => h.raw() == v,
                (PayloadRef::Shared(o, slot), Kind::Shared) => {
                    Arc::ptr_eq(&o, shared) && slot == (v % 512) as u16
                }
                _ => false,
            }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        /// The index and its LRU links against a `BTreeMap` of key -> (kind, value, on LRU)
        /// and a list of LRU keys: entries, chunk allocation and freeing, LRU membership and
        /// order, and the multi-page objects' reference counts.
        #[test]
        fn index_matches_btreemap(shard_bits in 0u32..3, ops in proptest::collection::vec(op(), 1..120)) {
            let shards = 1usize << shard_bits;
            let shard_of = |k: u64| ((k / ENTRIES_PER_SHARD) as usize) & (shards - 1);
            let mut index: Vec<Index> = (0..shards).map(|_| Index::new(shards)).collect();
            let mut lru = Lru::new();
            let shared = Arc::new(Shared { chunks: Box::new([]), pages: 1, refs: AtomicU32::new(0) });
            let mut model: BTreeMap<u64, (Kind, u64, bool)> = BTreeMap::new();
            let mut order: std::collections::VecDeque<u64> = Default::default();
            for op in &ops {
                match *op {
                    Op::Insert(k, kind, v) => {
                        let ix = &mut index[shard_of(k)];
                        prop_assert!(ix.ensure_chunk(k, &mut lru));
                        let old = ix.insert(k, make(kind, v, &shared), &mut lru);
                        let was = model.insert(k, (kind, v, kind != Kind::Same));
                        prop_assert_eq!(old.is_some(), was.is_some());
                        if let (Some(old), Some((ok, ov, _))) = (old, was) {
                            prop_assert!(matches(&old, ok, ov, &shared));
                            prop_assert!(!old.on_lru());
                        }
                        order.retain(|&x| x != k);
                        if kind != Kind::Same {
                            order.push_front(k);
                        }
                    }
                    Op::Remove(k) => {
                        let ix = &mut index[shard_of(k)];
                        let got = ix.remove(k, &mut lru);
                        let want = model.remove(&k);
                        prop_assert_eq!(got.is_some(), want.is_some());
                        if let (Some(e), Some((kind, v, _))) = (got, want) {
                            prop_assert!(matches(&e, kind, v, &shared));
                            prop_assert!(!e.on_lru());
                        }
                        order.retain(|&x| x != k);
                    }
                    Op::Unlink(k) => {
                        index[shard_of(k)].lru_unlink(k, &mut lru);
                        if let Some(m) = model.get_mut(&k) {
                            m.2 = false;
                        }
                        order.retain(|&x| x != k);
                    }
                    Op::Relink(k) => {
                        index[shard_of(k)].lru_relink(k, &mut lru);
                        if let Some(m) = model.get_mut(&k) {
                            if m.0 != Kind::Same && !m.2 {
                                m.2 = true;
                                order.push_front(k);
                            }
                        }
                    }
                }
                // Entries, chunks and LRU agree with the model.
                let mut seen = 0;
                let mut chunks = 0;
                for ix in &index {
                    let entries = ix.entries_checked(&lru).map_err(TestCaseError::fail)?;
                    chunks += ix.chunk_count();
                    for (k, e, pos) in entries {
                        seen += 1;
                        let m = model.get(&k).copied();
                        prop_assert!(m.is_some(), "index holds {} the model does not", k);
                        let Some((kind, v, on)) = m else { continue };
                        prop_assert!(matches(e, kind, v, &shared));
                        prop_assert_eq!(e.on_lru(), on);
                        prop_assert_eq!(ix.pos(k), Some(pos));
                    }
                }
                prop_assert_eq!(seen, model.len());
                let want_chunks: std::collections::BTreeSet<u64> =
                    model.keys().map(|k| k >> CHUNK_SHIFT).collect();
                prop_assert_eq!(chunks, want_chunks.len());
                prop_assert_eq!(lru.live_chunks(), chunks);
                for (&k, &(kind, v, _)) in &model {
                    let e = index[shard_of(k)].get(k);
                    prop_assert!(e.is_some_and(|e| matches(e, kind, v, &shared)));
                }
                let walk: Vec<u64> = lru
                    .check()
                    .map_err(TestCaseError::fail)?
                    .into_iter()
                    .map(|pos| {
                        let id = pos >> CHUNK_SHIFT;
                        lru.chunk_base(id).unwrap_or(u64::MAX) + u64::from(pos & (CHUNK_ENTRIES as u32 - 1))
                    })
                    .collect();
                prop_assert_eq!(walk, order.iter().copied().collect::<Vec<_>>());
                let shared_entries = model.values().filter(|m| m.0 == Kind::Shared).count();
                prop_assert_eq!(Arc::strong_count(&shared), 1 + shared_entries);
            }
            drop(index);
            prop_assert_eq!(Arc::strong_count(&shared), 1, "dropping the index drops its references");
        }
    }
}
