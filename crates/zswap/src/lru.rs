//! The LRU of stored entries (the kernel's `zswap_list_lru`), coldest at the tail.
//!
//! The list has no nodes of its own: it links *positions* of the index (see `index.rs`). The
//! index hands out chunks of [`CHUNK_ENTRIES`] entries; each live chunk has an id from this
//! list's id space, and the list keeps, per id, the chunk's first swap entry and one link pair
//! (8 bytes) per entry of the chunk. An entry's position is `id * CHUNK_ENTRIES + offset`, so a
//! position names a swap entry while its chunk lives, and the links cost 8 bytes per entry
//! instead of a 24-byte node with a key and a unique id.
//!
//! Stale positions: the index sets an entry's `ON_LRU` flag exactly while its position is
//! linked, both under the entry's shard lock and this list's lock. A reader that peeks at the
//! tail without the shard lock (`scan_objects`) re-checks, under the shard lock and then this
//! lock, that the entry at that key still has that position, is flagged, and is still the tail;
//! no id is needed to tell a reused position from the one it peeked.

/// log2 of [`CHUNK_ENTRIES`].
pub(crate) const CHUNK_SHIFT: u32 = 6;
/// Entries per index chunk (the xarray's `XA_CHUNK_SIZE`).
pub(crate) const CHUNK_ENTRIES: usize = 1 << CHUNK_SHIFT;
/// Chunk ids are below this, so that every position fits a `u32` below [`NIL`].
pub(crate) const MAX_CHUNKS: u32 = (u32::MAX >> CHUNK_SHIFT) - 1;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
}

#[derive(Debug)]
struct ChunkLinks {
    /// Swap entry at offset 0 of the chunk.
    base: u64,
    links: [Link; CHUNK_ENTRIES],
}

/// The list. Not synchronised: the store keeps it behind one lock, taken after shard locks.
#[derive(Debug)]
pub(crate) struct Lru {
    /// Per chunk id: the chunk's links, `None` for a free id.
    chunks: Vec<Option<Box<ChunkLinks>>>,
    free_ids: Vec<u32>,
    head: u32,
    tail: u32,
    len: usize,
}

impl Lru {
    pub(crate) fn new() -> Lru {
        Lru {
            chunks: Vec::new(),
            free_ids: Vec::new(),
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes held (from capacities).
    pub(crate) fn heap_bytes(&self) -> usize {
        let live = self.chunks.len() - self.free_ids.len();
        self.chunks.capacity() * std::mem::size_of::<Option<Box<ChunkLinks>>>()
            + self.free_ids.capacity() * std::mem::size_of::<u32>()
            + live * std::mem::size_of::<ChunkLinks>()
    }

    /// A chunk id for a new index chunk whose first entry is `base`; None when all
    /// [`MAX_CHUNKS`] ids are taken.
    pub(crate) fn alloc_chunk(&mut self, base: u64) -> Option<u32> {
        let links = Box::new(ChunkLinks {
            base,
            links: [Link {
                prev: NIL,
                next: NIL,
            }; CHUNK_ENTRIES],
        });
        if let Some(id) = self.free_ids.pop() {
            self.chunks[id as usize] = Some(links);
            return Some(id);
        }
        let id = u32::try_from(self.chunks.len())
            .ok()
            .filter(|&id| id < MAX_CHUNKS)?;
        self.chunks.push(Some(links));
        Some(id)
    }

    /// Gives back the id of an index chunk that holds no entry (so none of its positions is
    /// linked).
    pub(crate) fn free_chunk(&mut self, id: u32) {
        if let Some(slot) = self.chunks.get_mut(id as usize) {
            if slot.take().is_some() {
                self.free_ids.push(id);
            }
        }
    }

    fn link(&mut self, pos: u32) -> &mut Link {
        let chunk = self.chunks[(pos >> CHUNK_SHIFT) as usize]
            .as_mut()
            .unwrap_or_else(|| unreachable!("a linked position has a live chunk"));
        &mut chunk.links[pos as usize & (CHUNK_ENTRIES - 1)]
    }

    /// Links `pos` as the most recently used. The caller's entry is not linked yet.
    pub(crate) fn push_head(&mut self, pos: u32) {
        let head = self.head;
        *self.link(pos) = Link {
            prev: NIL,
            next: head,
        };
        if head != NIL {
            self.link(head).prev = pos;
        } else {
            self.tail = pos;
        }
        self.head = pos;
        self.len += 1;
    }

    /// Unlinks `pos`, which the caller's entry says is linked.
    pub(crate) fn remove(&mut self, pos: u32) {
        let Link { prev, next } = *self.link(pos);
        if prev != NIL {
            self.link(prev).next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.link(next).prev = prev;
        } else {
            self.tail = prev;
        }
        *self.link(pos) = Link {
            prev: NIL,
            next: NIL,
        };
        self.len -= 1;
    }

    /// The coldest entry, as (swap entry, position), without unlinking it.
    pub(crate) fn tail(&self) -> Option<(u64, u32)> {
        if self.tail == NIL {
            return None;
        }
        let chunk = self.chunks[(self.tail >> CHUNK_SHIFT) as usize].as_ref()?;
        let key = chunk.base + u64::from(self.tail & (CHUNK_ENTRIES as u32 - 1));
        Some((key, self.tail))
    }

    /// The first swap entry of chunk `id`, if the id is live.
    pub(crate) fn chunk_base(&self, id: u32) -> Option<u64> {
        self.chunks.get(id as usize)?.as_ref().map(|c| c.base)
    }

    /// Number of live chunk ids.
    pub(crate) fn live_chunks(&self) -> usize {
        self.chunks.len() - self.free_ids.len()
    }

    /// Walks the list from head to tail checking every link; returns the linked positions,
    /// hottest first.
    pub(crate) fn check(&self) -> Result<Vec<u32>, String> {
        let mut out = Vec::with_capacity(self.len);
        let mut prev = NIL;
        let mut at = self.head;
        while at != NIL {
            if out.len() > self.len {
                return Err(format!(
                    "LRU longer than its length {} (a cycle?)",
                    self.len
                ));
            }
            let chunk = self
                .chunks
                .get((at >> CHUNK_SHIFT) as usize)
                .and_then(Option::as_ref)
                .ok_or(format!("LRU position {at} in a dead chunk"))?;
            let l = chunk.links[at as usize & (CHUNK_ENTRIES - 1)];
            if l.prev != prev {
                return Err(format!("LRU position {at}: prev {} != {prev}", l.prev));
            }
            out.push(at);
            prev = at;
            at = l.next;
        }
        if prev != self.tail || out.len() != self.len {
            return Err(format!(
                "LRU tail {} / length {} disagree with the walk ({prev}, {})",
                self.tail,
                self.len,
                out.len()
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // The freed id is reused for a new chunk with another base.
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
}
