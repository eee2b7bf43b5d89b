//! Doubly linked lists threaded through a slab of page nodes by index (the kernel's
//! `list_head` in `struct folio`), and the page-id index that maps a page to its slot.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::PageId;

/// No node.
pub(crate) const NIL: u32 = u32::MAX;

/// A deterministic hasher for page ids (a `splitmix64` finaliser): the same trace gives the
/// same walk order, so replays are reproducible.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

/// A `HashMap` keyed by page id (or region) with [`IdHasher`].
pub(crate) type IdMap<V> = HashMap<PageId, V, BuildHasherDefault<IdHasher>>;

/// The links of one node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Links {
    pub(crate) prev: u32,
    pub(crate) next: u32,
}

impl Default for Links {
    fn default() -> Self {
        Self {
            prev: NIL,
            next: NIL,
        }
    }
}

/// A node type that carries [`Links`].
pub(crate) trait Linked {
    fn links(&self) -> &Links;
    fn links_mut(&mut self) -> &mut Links;
}

/// The head of one list. The head is the young end (where `list_add` puts pages), the tail the
/// old end (where eviction takes them, `lru_to_folio`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListHead {
    head: u32,
    tail: u32,
    len: usize,
}

impl Default for ListHead {
    fn default() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl ListHead {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn tail(&self) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }

    pub(crate) fn head(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    pub(crate) fn push_head<N: Linked>(&mut self, nodes: &mut [N], i: u32) {
        let old = self.head;
        *nodes[i as usize].links_mut() = Links {
            prev: NIL,
            next: old,
        };
        if old == NIL {
            self.tail = i;
        } else {
            nodes[old as usize].links_mut().prev = i;
        }
        self.head = i;
        self.len += 1;
    }

    pub(crate) fn push_tail<N: Linked>(&mut self, nodes: &mut [N], i: u32) {
        let old = self.tail;
        *nodes[i as usize].links_mut() = Links {
            prev: old,
            next: NIL,
        };
        if old == NIL {
            self.head = i;
        } else {
            nodes[old as usize].links_mut().next = i;
        }
        self.tail = i;
        self.len += 1;
    }

    /// Unlinks `i`, which must be on this list.
    pub(crate) fn unlink<N: Linked>(&mut self, nodes: &mut [N], i: u32) {
        let Links { prev, next } = *nodes[i as usize].links();
        if prev == NIL {
            self.head = next;
        } else {
            nodes[prev as usize].links_mut().next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            nodes[next as usize].links_mut().prev = prev;
        }
        *nodes[i as usize].links_mut() = Links::default();
        self.len -= 1;
    }

    /// The nodes from head (young) to tail (old).
    pub(crate) fn iter<'a, N: Linked>(&self, nodes: &'a [N]) -> impl Iterator<Item = u32> + 'a {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let i = cur;
            cur = nodes[i as usize].links().next;
            Some(i)
        })
    }
}

/// Page ids per index chunk (log2).
const CHUNK_SHIFT: u32 = 6;
const CHUNK: usize = 1 << CHUNK_SHIFT;

#[derive(Debug)]
struct Chunk {
    slots: [u32; CHUNK],
    used: u32,
}

/// The page-id index: a radix of 64-entry chunks of slot numbers, keyed by `page >> 6`.
///
/// Page ids are meant to be page frame numbers (the daemon's are addresses shifted by 12),
/// dense within mappings: a resident set of `n` pages then costs about 4 bytes per page id
/// its chunks cover, against about 30 for a hash map of (id, slot) pairs with its growth
/// slack. A sparse id space costs a chunk (264 bytes) per isolated id.
#[derive(Debug, Default)]
pub(crate) struct PageIndex {
    chunks: IdMap<Box<Chunk>>,
    len: usize,
}

impl PageIndex {
    fn split(page: PageId) -> (u64, usize) {
        (page >> CHUNK_SHIFT, (page as usize) & (CHUNK - 1))
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn get(&self, page: PageId) -> Option<u32> {
        let (c, i) = Self::split(page);
        let v = self.chunks.get(&c)?.slots[i];
        (v != NIL).then_some(v)
    }

    /// Sets the slot of `page`, which must not be present.
    pub(crate) fn insert(&mut self, page: PageId, slot: u32) {
        debug_assert_ne!(slot, NIL);
        let (c, i) = Self::split(page);
        let chunk = self.chunks.entry(c).or_insert_with(|| {
            Box::new(Chunk {
                slots: [NIL; CHUNK],
                used: 0,
            })
        });
        debug_assert_eq!(chunk.slots[i], NIL, "page {page} indexed twice");
        chunk.slots[i] = slot;
        chunk.used += 1;
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, page: PageId) -> Option<u32> {
        let (c, i) = Self::split(page);
        let chunk = self.chunks.get_mut(&c)?;
        let v = std::mem::replace(&mut chunk.slots[i], NIL);
        if v == NIL {
            return None;
        }
        chunk.used -= 1;
        self.len -= 1;
        if chunk.used == 0 {
            self.chunks.remove(&c);
        }
        Some(v)
    }

    /// Heap bytes: the chunks and the map's table.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.chunks.len() * std::mem::size_of::<Chunk>()
            + self.chunks.capacity() * (std::mem::size_of::<(u64, Box<Chunk>)>() + 1)
    }
}

/// A slab of nodes with a page-id index and a free list of slots.
#[derive(Debug)]
pub(crate) struct Slab<N> {
    pub(crate) nodes: Vec<N>,
    free: Vec<u32>,
    index: PageIndex,
}

impl<N> Default for Slab<N> {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            free: Vec::new(),
            index: PageIndex::default(),
        }
    }
}

impl<N> Slab<N> {
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn get(&self, page: PageId) -> Option<u32> {
        self.index.get(page)
    }

    /// Inserts a node for `page` (which must not be present) and returns its slot.
    pub(crate) fn insert(&mut self, page: PageId, node: N) -> u32 {
        let i = if let Some(i) = self.free.pop() {
            self.nodes[i as usize] = node;
            i
        } else {
            if self.nodes.len() == self.nodes.capacity() {
                // Grow by an eighth, not by doubling: a resident set just past a power of
                // two would otherwise hold nearly twice its nodes' memory.
                self.nodes.reserve_exact((self.nodes.len() / 8).max(64));
            }
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        };
        self.index.insert(page, i);
        i
    }

    /// Frees the slot of `page`; the node must already be unlinked.
    pub(crate) fn remove(&mut self, page: PageId) -> Option<u32> {
        let i = self.index.remove(page)?;
        self.free.push(i);
        Some(i)
    }

    /// Heap bytes: nodes, free list and index.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<N>()
            + self.free.capacity() * 4
            + self.index.heap_bytes()
    }
}

#[cfg(all(test, not(mglru_loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The radix index against a map: ids dense, at chunk edges and far apart; chunks
        /// freed when empty.
        #[test]
        fn page_index_matches_a_map(ops in prop::collection::vec(
            (any::<bool>(), prop_oneof![0u64..200, (0u64..4).prop_map(|i| u64::MAX - i), 1u64 << 40..(1u64 << 40) + 70]),
            1..500,
        )) {
            let mut index = PageIndex::default();
            let mut model = std::collections::HashMap::new();
            let mut next = 0u32;
            for (add, page) in ops {
                if add && !model.contains_key(&page) {
                    index.insert(page, next);
                    model.insert(page, next);
                    next += 1;
                } else {
                    prop_assert_eq!(index.remove(page), model.remove(&page));
                }
                prop_assert_eq!(index.len(), model.len());
                for (&p, &v) in &model {
                    prop_assert_eq!(index.get(p), Some(v));
                }
                prop_assert!(index.chunks.values().all(|c| c.used > 0));
                let used: u32 = index.chunks.values().map(|c| c.used).sum();
                prop_assert_eq!(used as usize, model.len());
            }
        }
    }

    #[derive(Debug, Default)]
    struct N(Links);
    impl Linked for N {
        fn links(&self) -> &Links {
            &self.0
        }
        fn links_mut(&mut self) -> &mut Links {
            &mut self.0
        }
    }

    #[test]
    fn push_unlink_iterate() {
        let mut nodes: Vec<N> = (0..5).map(|_| N::default()).collect();
        let mut l = ListHead::default();
        l.push_head(&mut nodes, 0);
        l.push_head(&mut nodes, 1);
        l.push_tail(&mut nodes, 2);
        l.push_head(&mut nodes, 3);
        assert_eq!(l.iter(&nodes).collect::<Vec<_>>(), vec![3, 1, 0, 2]);
        l.unlink(&mut nodes, 1);
        l.unlink(&mut nodes, 2);
        assert_eq!(l.iter(&nodes).collect::<Vec<_>>(), vec![3, 0]);
        assert_eq!((l.head(), l.tail(), l.len()), (Some(3), Some(0), 2));
        l.unlink(&mut nodes, 3);
        l.unlink(&mut nodes, 0);
        assert!(l.is_empty() && l.head().is_none() && l.tail().is_none());
    }
}
