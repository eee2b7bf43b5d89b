//! The LRU of stored entries (the kernel's `zswap_list_lru`), coldest at the tail.
//!
//! Entries join the list when stored and leave it when loaded, invalidated or taken for
//! writeback; the only other way in is an entry whose writeback failed, put back as the newest
//! (`lru_relink`). Nothing is ever moved up on access (zswap entries are not accessed in place:
//! a load frees them). So the order is the order of insertion, and the list is a FIFO: a queue
//! of *positions* of the index, 4 bytes each, instead of a doubly linked list (8 bytes of links
//! per entry). The index hands out chunks of [`CHUNK_ENTRIES`] entries; each live chunk has an
//! id from this list's id space, and a position is `id * CHUNK_ENTRIES + offset`.
//!
//! Removal is lazy: an entry leaving the list only clears its position's `LIVE` mark, and its
//! queued position becomes dead, skipped when it reaches the tail and dropped when the queue is
//! rebuilt, which happens once dead positions outnumber a quarter of the live ones (amortised
//! O(1)). A position reused by a newer entry is queued again; to tell its live copy from dead
//! ones without an id, each position keeps a count of its queued copies: the live copy is the last one, so a copy
//! at the tail is live exactly when its position is marked live and has one copy left. The
//! count saturates at [`SATURATED`] (a position taken and stored again 127 times between two
//! rebuilds of the queue): then any of its copies counts as live, which may write a newer entry
//! back early, out of order, until the next rebuild counts exactly again. A chunk id whose
//! positions are still queued is not reused until they have left the queue.
//!
//! Per chunk id the list keeps the chunk's first swap entry and one byte per position (the
//! mark and the count): 4 bytes per entry in the queue and 1.25 per entry slot of a live chunk.
//!
//! Stale positions: the index sets an entry's `ON_LRU` flag exactly while its position is
//! marked live, both under the entry's shard lock and this list's lock. A reader that peeks at
//! the tail without the shard lock (`scan_objects`) re-checks, under the shard lock and then
//! this lock, that the entry at that key still has that position, is flagged, and is still the
//! tail.

use std::collections::VecDeque;

/// log2 of [`CHUNK_ENTRIES`].
pub(crate) const CHUNK_SHIFT: u32 = 6;
/// Entries per index chunk (the xarray's `XA_CHUNK_SIZE`).
pub(crate) const CHUNK_ENTRIES: usize = 1 << CHUNK_SHIFT;
/// Chunk ids are below this, so that every position fits a `u32`.
pub(crate) const MAX_CHUNKS: u32 = (u32::MAX >> CHUNK_SHIFT) - 1;

/// The position's live copy is queued.
const LIVE: u8 = 0x80;
/// The queued copies of a position (saturating).
const COPIES: u8 = 0x7f;
/// A count of copies that no longer counts: any copy is taken as the live one.
pub(crate) const SATURATED: u8 = COPIES;
/// Positions per block of the queue.
const BLOCK: usize = 1024;
/// The queue is rebuilt when dead positions exceed the live ones divided by this (so the
/// queue holds at most 1.25 positions per live one: 5 bytes) ...
const DEAD_RATIO: usize = 4;
/// ... and this.
const MIN_DEAD_TO_REBUILD: usize = 64;
/// Never a position (chunk ids are below [`MAX_CHUNKS`]): a dead copy during a rebuild.
const NIL: u32 = u32::MAX;

const _: () = assert!(((MAX_CHUNKS - 1) << CHUNK_SHIFT | (CHUNK_ENTRIES as u32 - 1)) < NIL);

#[derive(Debug)]
struct ChunkMarks {
    /// Swap entry at offset 0 of the chunk.
    base: u64,
    /// Queued positions of this chunk (live or dead).
    queued: u32,
    /// The index freed the chunk: the id is reused once `queued` is 0.
    released: bool,
    /// Per position: `LIVE` and the count of queued copies.
    marks: [u8; CHUNK_ENTRIES],
}

/// A FIFO of positions in blocks of [`BLOCK`] (no doubling: at most one partly used block at
/// each end).
#[derive(Debug, Default)]
struct Queue {
    blocks: VecDeque<Box<[u32; BLOCK]>>,
    /// Index of the first position in the first block.
    front: usize,
    /// Positions queued.
    len: usize,
}

impl Queue {
    fn push_back(&mut self, pos: u32) {
        let at = self.front + self.len;
        if at == self.blocks.len() * BLOCK {
            self.blocks.push_back(Box::new([0; BLOCK]));
        }
        self.blocks[at / BLOCK][at % BLOCK] = pos;
        self.len += 1;
    }

    fn front(&self) -> Option<u32> {
        (self.len > 0).then(|| self.blocks[0][self.front])
    }

    fn pop_front(&mut self) {
        if self.len == 0 {
            return;
        }
        self.len -= 1;
        self.front += 1;
        if self.front == BLOCK {
            self.blocks.pop_front();
            self.front = 0;
        }
        if self.len == 0 {
            // At most the one block left: start over at its beginning.
            self.front = 0;
        }
    }

    fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + '_ {
        (0..self.len).map(|i| self.at(i))
    }

    /// The `i`-th position from the front.
    fn at(&self, i: usize) -> u32 {
        let i = self.front + i;
        self.blocks[i / BLOCK][i % BLOCK]
    }

    fn set(&mut self, i: usize, pos: u32) {
        let i = self.front + i;
        self.blocks[i / BLOCK][i % BLOCK] = pos;
    }

    /// Keeps the first `len` positions; frees the blocks past them.
    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        if self.len == 0 {
            self.front = 0;
        }
        let blocks = (self.front + self.len).div_ceil(BLOCK).max(1);
        self.blocks.truncate(blocks);
    }

    fn heap_bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<Box<[u32; BLOCK]>>()
            + self.blocks.len() * std::mem::size_of::<[u32; BLOCK]>()
    }
}

/// The marks of `pos` (whose chunk id is live: it is queued or about to be).
fn marks_of(chunks: &mut [Option<Box<ChunkMarks>>], pos: u32) -> (&mut ChunkMarks, usize) {
    let chunk = chunks[(pos >> CHUNK_SHIFT) as usize]
        .as_mut()
        .unwrap_or_else(|| unreachable!("a queued position has a live chunk id"));
    (chunk, pos as usize & (CHUNK_ENTRIES - 1))
}

/// The list. Not synchronised: the store keeps it behind one lock, taken after shard locks.
#[derive(Debug)]
pub(crate) struct Lru {
    /// Per chunk id: the chunk's marks, `None` for a free id.
    chunks: Vec<Option<Box<ChunkMarks>>>,
    free_ids: Vec<u32>,
    queue: Queue,
    /// Positions marked live.
    live: usize,
    /// Ids whose chunk the index freed but whose positions are still queued.
    released: usize,
}

impl Lru {
    pub(crate) fn new() -> Lru {
        Lru {
            chunks: Vec::new(),
            free_ids: Vec::new(),
            queue: Queue::default(),
            live: 0,
            released: 0,
        }
    }

    /// Entries on the list.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Heap bytes held (from capacities).
    pub(crate) fn heap_bytes(&self) -> usize {
        let live = self.chunks.len() - self.free_ids.len();
        self.chunks.capacity() * std::mem::size_of::<Option<Box<ChunkMarks>>>()
            + self.free_ids.capacity() * std::mem::size_of::<u32>()
            + live * std::mem::size_of::<ChunkMarks>()
            + self.queue.heap_bytes()
    }

    /// A chunk id for a new index chunk whose first entry is `base`; None when all
    /// [`MAX_CHUNKS`] ids are taken.
    pub(crate) fn alloc_chunk(&mut self, base: u64) -> Option<u32> {
        let marks = Box::new(ChunkMarks {
            base,
            queued: 0,
            released: false,
            marks: [0; CHUNK_ENTRIES],
        });
        if let Some(id) = self.free_ids.pop() {
            self.chunks[id as usize] = Some(marks);
            return Some(id);
        }
        let id = u32::try_from(self.chunks.len())
            .ok()
            .filter(|&id| id < MAX_CHUNKS)?;
        self.chunks.push(Some(marks));
        Some(id)
    }

    /// Gives back the id of an index chunk that holds no entry (so none of its positions is
    /// live); the id is reused once none of its positions is queued.
    pub(crate) fn free_chunk(&mut self, id: u32) {
        let Some(Some(c)) = self.chunks.get_mut(id as usize) else {
            return;
        };
        debug_assert!(c.marks.iter().all(|m| m & LIVE == 0));
        if c.released {
            return;
        }
        c.released = true;
        if c.queued == 0 {
            self.chunks[id as usize] = None;
            self.free_ids.push(id);
        } else {
            self.released += 1;
        }
    }

    fn marks(&mut self, pos: u32) -> (&mut ChunkMarks, usize) {
        marks_of(&mut self.chunks, pos)
    }

    /// Queues `pos` as the most recently used. The caller's entry is not on the list.
    pub(crate) fn push_head(&mut self, pos: u32) {
        let (c, off) = self.marks(pos);
        let m = c.marks[off];
        debug_assert!(m & LIVE == 0, "position {pos} pushed twice");
        let copies = (m & COPIES).saturating_add(1).min(SATURATED);
        c.marks[off] = LIVE | copies;
        c.queued += 1;
        self.queue.push_back(pos);
        self.live += 1;
    }

    /// Takes `pos` off the list (its queued copy becomes dead). The caller's entry is on it.
    pub(crate) fn remove(&mut self, pos: u32) {
        let (c, off) = self.marks(pos);
        debug_assert!(
            c.marks[off] & LIVE != 0,
            "position {pos} is not on the list"
        );
        c.marks[off] &= !LIVE;
        self.live -= 1;
        if self.queue.len - self.live > (self.live / DEAD_RATIO).max(MIN_DEAD_TO_REBUILD) {
            self.rebuild();
        }
    }

    /// Whether the queued copy `pos` at the tail is its position's live copy.
    fn tail_is_live(&self, pos: u32) -> bool {
        let Some(Some(c)) = self.chunks.get((pos >> CHUNK_SHIFT) as usize) else {
            return false;
        };
        let m = c.marks[pos as usize & (CHUNK_ENTRIES - 1)];
        m & LIVE != 0 && matches!(m & COPIES, 1 | SATURATED)
    }

    /// Drops the copy at the tail, which is dead.
    fn pop_dead(&mut self, pos: u32) {
        self.queue.pop_front();
        let id = pos >> CHUNK_SHIFT;
        let (c, off) = self.marks(pos);
        if c.marks[off] & COPIES != SATURATED {
            c.marks[off] -= 1;
        }
        c.queued -= 1;
        if c.released && c.queued == 0 {
            self.chunks[id as usize] = None;
            self.free_ids.push(id);
            self.released -= 1;
        }
    }

    /// The coldest entry, as (swap entry, position), without taking it off the list (dead
    /// copies in front of it are dropped).
    pub(crate) fn tail(&mut self) -> Option<(u64, u32)> {
        while let Some(pos) = self.queue.front() {
            if self.tail_is_live(pos) {
                let base = self.chunk_base(pos >> CHUNK_SHIFT)?;
                return Some((base + u64::from(pos & (CHUNK_ENTRIES as u32 - 1)), pos));
            }
            self.pop_dead(pos);
        }
        None
    }

    /// Rebuilds the queue with the live copies only, in order and in place (no allocation),
    /// and recounts the copies exactly; frees the ids of released chunks. Three passes over the
    /// queue under the LRU lock.
    fn rebuild(&mut self) {
        let Lru {
            chunks,
            queue,
            free_ids,
            released,
            ..
        } = self;
        let n = queue.len;
        for i in 0..n {
            let (c, off) = marks_of(chunks, queue.at(i));
            c.marks[off] &= LIVE;
            c.queued = 0;
        }
        // The live copy of a position is its last: walk from the newest, overwrite dead copies.
        let mut gone = Vec::new();
        for i in (0..n).rev() {
            let pos = queue.at(i);
            let (c, off) = marks_of(chunks, pos);
            if c.marks[off] == LIVE {
                c.marks[off] = LIVE | 1;
                c.queued += 1;
            } else {
                if c.released && c.queued == 0 {
                    // Listed once: a released chunk has no live position, so `queued` is free
                    // to mark it.
                    c.queued = u32::MAX;
                    gone.push(pos >> CHUNK_SHIFT);
                }
                queue.set(i, NIL);
            }
        }
        let mut kept = 0;
        for i in 0..n {
            let pos = queue.at(i);
            if pos != NIL {
                queue.set(kept, pos);
                kept += 1;
            }
        }
        queue.truncate(kept);
        for id in gone {
            chunks[id as usize] = None;
            free_ids.push(id);
            *released -= 1;
        }
    }

    /// The first swap entry of chunk `id`, if the id is live.
    pub(crate) fn chunk_base(&self, id: u32) -> Option<u64> {
        self.chunks.get(id as usize)?.as_ref().map(|c| c.base)
    }

    /// Number of chunk ids held by index chunks (not counting freed chunks whose positions are
    /// still queued).
    pub(crate) fn live_chunks(&self) -> usize {
        self.chunks.len() - self.free_ids.len() - self.released
    }

    /// Checks the marks and counts against the queue; returns the live positions, hottest
    /// first.
    pub(crate) fn check(&self) -> Result<Vec<u32>, String> {
        let mut copies: std::collections::HashMap<u32, u32> = Default::default();
        let mut queued: std::collections::HashMap<u32, u32> = Default::default();
        for pos in self.queue.iter() {
            if self
                .chunks
                .get((pos >> CHUNK_SHIFT) as usize)
                .and_then(Option::as_ref)
                .is_none()
            {
                return Err(format!("LRU position {pos} queued in a free chunk id"));
            }
            *copies.entry(pos).or_default() += 1;
            *queued.entry(pos >> CHUNK_SHIFT).or_default() += 1;
        }
        let mut live = 0;
        let mut released = 0;
        for (id, c) in self.chunks.iter().enumerate() {
            let Some(c) = c else { continue };
            let id = id as u32;
            if c.queued != queued.get(&id).copied().unwrap_or(0) {
                return Err(format!("LRU chunk {id}: counts {} queued", c.queued));
            }
            if c.released {
                released += 1;
                if c.queued == 0 {
                    return Err(format!("LRU chunk {id} released but not freed"));
                }
            }
            for (off, &m) in c.marks.iter().enumerate() {
                let pos = (id << CHUNK_SHIFT) | off as u32;
                let n = copies.get(&pos).copied().unwrap_or(0);
                let count = u32::from(m & COPIES);
                let sat = u32::from(SATURATED);
                if (count != sat && count != n) || (count == sat && n < count) {
                    return Err(format!(
                        "LRU position {pos}: {count} copies counted, {n} queued"
                    ));
                }
                if m & LIVE != 0 {
                    if c.released || n == 0 {
                        return Err(format!("LRU position {pos} live but not queued"));
                    }
                    live += 1;
                }
            }
        }
        if live != self.live || released != self.released {
            return Err(format!(
                "LRU counts {} live, {} released; marks say {live}, {released}",
                self.live, self.released
            ));
        }
        // The live copy of each live position is its last: walk from the newest.
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(self.live);
        for pos in self.queue.iter().rev() {
            let c = self.chunks[(pos >> CHUNK_SHIFT) as usize].as_ref();
            let m = c.map_or(0, |c| c.marks[pos as usize & (CHUNK_ENTRIES - 1)]);
            if m & LIVE != 0 && seen.insert(pos) {
                out.push(pos);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn order_removal_and_chunk_ids() {
        let mut lru = Lru::new();
        let a = lru.alloc_chunk(1000).expect("id");
        let b = lru.alloc_chunk(64).expect("id");
        let pos = |id: u32, off: u32| (id << CHUNK_SHIFT) | off;
        lru.push_head(pos(a, 3));
        lru.push_head(pos(b, 0));
        lru.push_head(pos(a, 5));
        assert_eq!(lru.len(), 3);
        assert_eq!(lru.tail(), Some((1003, pos(a, 3))));
        lru.remove(pos(b, 0));
        lru.remove(pos(a, 3));
        assert_eq!(lru.tail(), Some((1005, pos(a, 5))));
        assert_eq!(lru.check().expect("walk"), vec![pos(a, 5)]);
        lru.free_chunk(b);
        // b's positions left the queue at the tail: the freed id is reused.
        let c = lru.alloc_chunk(4096).expect("id");
        assert_eq!(c, b);
        lru.push_head(pos(c, 63));
        assert_eq!(lru.check().expect("walk"), vec![pos(c, 63), pos(a, 5)]);
        lru.remove(pos(a, 5));
        assert_eq!(lru.tail(), Some((4096 + 63, pos(c, 63))));
        lru.remove(pos(c, 63));
        assert_eq!((lru.len(), lru.tail()), (0, None));
        assert_eq!(lru.live_chunks(), 2);
    }

    #[test]
    fn a_reused_position_is_taken_in_its_new_place() {
        let mut lru = Lru::new();
        let a = lru.alloc_chunk(0).expect("id");
        lru.push_head(a << CHUNK_SHIFT); // entry 0
        lru.push_head((a << CHUNK_SHIFT) | 1); // entry 1
        lru.remove(a << CHUNK_SHIFT); // entry 0 loaded...
        lru.push_head(a << CHUNK_SHIFT); // ... and stored again: now the newest
        assert_eq!(lru.tail(), Some((1, (a << CHUNK_SHIFT) | 1)));
        lru.remove((a << CHUNK_SHIFT) | 1);
        assert_eq!(lru.tail(), Some((0, a << CHUNK_SHIFT)));
        lru.check().expect("consistent");
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Push or (if live) remove the key.
        Toggle(u64),
        /// Free the chunk of the key if it holds no live entry (as the index does when its
        /// last entry goes).
        FreeChunk(u64),
        /// Take the tail (as writeback does).
        TakeTail,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0u64..200).prop_map(Op::Toggle),
            2 => (0u64..200).prop_map(Op::FreeChunk),
            2 => Just(Op::TakeTail),
        ]
    }

    proptest! {
        // Under miri: a few cases (each runs ~1000 times slower), and no regression file (miri's
        // isolation refuses file access).
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 256 },
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// The FIFO against a list of keys: order, membership, chunk ids (freed, reused only
        /// once their positions are out of the queue) and the rebuild of the queue. With up to
        /// a few hundred operations no position saturates, so the order is exact.
        #[test]
        #[cfg_attr(miri, ignore = "minutes per case under miri; the LRU has no unsafe code, and the store tests run it there")]
        fn lru_matches_list(ops in proptest::collection::vec(op(), 1..if cfg!(miri) { 40 } else { 400 })) {
            let mut lru = Lru::new();
            // Chunk number -> id, as the index keeps it.
            let mut ids: std::collections::HashMap<u64, u32> = Default::default();
            let mut order: std::collections::VecDeque<u64> = Default::default();
            let pos_of = |ids: &std::collections::HashMap<u64, u32>, k: u64| {
                ids.get(&(k >> CHUNK_SHIFT)).map(|&id| (id << CHUNK_SHIFT) | (k & 63) as u32)
            };
            for op in ops {
                match op {
                    Op::Toggle(k) => {
                        if order.contains(&k) {
                            let pos = pos_of(&ids, k).expect("live chunk");
                            lru.remove(pos);
                            order.retain(|&x| x != k);
                        } else {
                            let chunk = k >> CHUNK_SHIFT;
                            if !ids.contains_key(&chunk) {
                                let id = lru.alloc_chunk(chunk << CHUNK_SHIFT).expect("id");
                                prop_assert!(!ids.values().any(|&x| x == id), "id {} in use", id);
                                ids.insert(chunk, id);
                            }
                            lru.push_head(pos_of(&ids, k).expect("live chunk"));
                            order.push_front(k);
                        }
                    }
                    Op::FreeChunk(k) => {
                        let chunk = k >> CHUNK_SHIFT;
                        if !order.iter().any(|&x| x >> CHUNK_SHIFT == chunk) {
                            if let Some(id) = ids.remove(&chunk) {
                                lru.free_chunk(id);
                            }
                        }
                    }
                    Op::TakeTail => {
                        let got = lru.tail();
                        let want = order.back().copied();
                        prop_assert_eq!(got.map(|g| g.0), want);
                        if let Some((k, pos)) = got {
                            prop_assert_eq!(Some(pos), pos_of(&ids, k));
                            lru.remove(pos);
                            order.pop_back();
                        }
                    }
                }
                let walk: Vec<u64> = lru
                    .check()
                    .map_err(TestCaseError::fail)?
                    .into_iter()
                    .map(|pos| lru.chunk_base(pos >> CHUNK_SHIFT).unwrap_or(u64::MAX) + u64::from(pos & 63))
                    .collect();
                prop_assert_eq!(walk, order.iter().copied().collect::<Vec<_>>());
                prop_assert_eq!(lru.len(), order.len());
                prop_assert_eq!(lru.live_chunks(), ids.len());
                // Dead copies never outnumber live ones by more than the rebuild threshold.
                prop_assert!(
                    lru.queue.len - lru.live <= (lru.live / DEAD_RATIO).max(MIN_DEAD_TO_REBUILD)
                );
            }
        }
    }
}
