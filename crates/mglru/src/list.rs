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
        mix(self.0)
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

    /// Renames slot `from` to `to` at the ends of the list (the node moved in the slab).
    pub(crate) fn relocate(&mut self, from: u32, to: u32) {
        if self.head == from {
            self.head = to;
        }
        if self.tail == from {
            self.tail = to;
        }
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

/// A node that knows its page: the index keeps only slot numbers and reads keys from the nodes.
pub(crate) trait Keyed {
    fn page(&self) -> PageId;
}

/// splitmix64's finaliser (of [`IdHasher`] and of the page index's positions): page ids are
/// often consecutive, hashes must not be.
fn mix(page: PageId) -> u64 {
    let mut z = page.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The page-id index: an open-addressing table (linear probing, deletion by backward shift, no
/// tombstones) of slot numbers only. The key of an entry is the page of the node in that slot,
/// read through the `key` function every method takes, so an entry is 4 bytes; the table is
/// kept between half and three quarters full (grown by a quarter when full, shrunk to two
/// thirds full when under half), so 5.3 to 8 bytes per resident page whatever the spread of
/// page ids. (It replaced a radix of
/// 64-slot chunks: 4 bytes per page id its chunks covered, which a resident set spread at
/// random over its address space, as the daemon's under random access, makes every id.)
#[derive(Debug, Default)]
pub(crate) struct PageIndex {
    table: Vec<u32>,
    len: usize,
}

impl PageIndex {
    fn home(page: PageId, cap: usize) -> usize {
        ((u128::from(mix(page)) * cap as u128) >> 64) as usize
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn find(&self, page: PageId, key: impl Fn(u32) -> PageId) -> Option<usize> {
        let cap = self.table.len();
        if cap == 0 {
            return None;
        }
        let mut i = Self::home(page, cap);
        loop {
            let s = self.table[i];
            if s == NIL {
                return None;
            }
            if key(s) == page {
                return Some(i);
            }
            i += 1;
            if i == cap {
                i = 0;
            }
        }
    }

    pub(crate) fn get(&self, page: PageId, key: impl Fn(u32) -> PageId) -> Option<u32> {
        self.find(page, key).map(|i| self.table[i])
    }

    /// Places `slot` (whose key is `page`) in the first free position from its home.
    fn place(&mut self, page: PageId, slot: u32) {
        let cap = self.table.len();
        let mut i = Self::home(page, cap);
        while self.table[i] != NIL {
            i += 1;
            if i == cap {
                i = 0;
            }
        }
        self.table[i] = slot;
    }

    fn resize(&mut self, cap: usize, key: impl Fn(u32) -> PageId) {
        let old = std::mem::replace(&mut self.table, vec![NIL; cap]);
        for s in old.into_iter().filter(|&s| s != NIL) {
            self.place(key(s), s);
        }
    }

    /// Sets the slot of `page`, which must not be present; `key` must already give `page` for
    /// `slot`.
    pub(crate) fn insert(&mut self, page: PageId, slot: u32, key: impl Fn(u32) -> PageId) {
        debug_assert_ne!(slot, NIL);
        debug_assert!(self.find(page, &key).is_none(), "page {page} indexed twice");
        if (self.len + 1) * 4 > self.table.len() * 3 {
            let cap = (self.table.len() + self.table.len() / 4).max(64);
            self.resize(cap, &key);
        }
        self.place(page, slot);
        self.len += 1;
    }

    /// Points the entry of `page` (at slot `from`) to slot `to`; `key` must still give `page`
    /// for `from`.
    fn relocate(&mut self, page: PageId, from: u32, to: u32, key: impl Fn(u32) -> PageId) {
        let pos = self.find(page, key).expect("relocate: the page is indexed");
        debug_assert_eq!(self.table[pos], from);
        self.table[pos] = to;
    }

    /// Takes `page` out; `key` must still give the keys of every slot in the table.
    pub(crate) fn remove(&mut self, page: PageId, key: impl Fn(u32) -> PageId) -> Option<u32> {
        let mut hole = self.find(page, &key)?;
        let slot = std::mem::replace(&mut self.table[hole], NIL);
        self.len -= 1;
        // Backward shift: pull later entries of the run into the hole when their home allows.
        let cap = self.table.len();
        let mut j = hole;
        loop {
            j += 1;
            if j == cap {
                j = 0;
            }
            let s = self.table[j];
            if s == NIL {
                break;
            }
            let h = Self::home(key(s), cap);
            // May `s` (home `h`, at `j`) sit at `hole`? Only if `hole` is cyclically in [h, j).
            let movable = if hole <= j {
                h <= hole || h > j
            } else {
                h <= hole && h > j
            };
            if movable {
                self.table[hole] = s;
                self.table[j] = NIL;
                hole = j;
            }
        }
        if self.table.len() > 64 && self.len * 2 < self.table.len() {
            let cap = (self.len * 3 / 2).max(64);
            self.resize(cap, &key);
        }
        Some(slot)
    }

    /// Heap bytes: the table.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.table.capacity() * std::mem::size_of::<u32>()
    }
}

/// Free slots a slab keeps before it compacts.
const COMPACT_MIN_FREE: usize = 1024;

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

impl<N: Keyed> Slab<N> {
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn get(&self, page: PageId) -> Option<u32> {
        let nodes = &self.nodes;
        self.index.get(page, |s| nodes[s as usize].page())
    }

    /// Inserts a node for `page` (which must not be present) and returns its slot.
    pub(crate) fn insert(&mut self, page: PageId, node: N) -> u32 {
        debug_assert_eq!(node.page(), page);
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
        let nodes = &self.nodes;
        self.index.insert(page, i, |s| nodes[s as usize].page());
        i
    }

    /// Frees the slot of `page`; the node must already be unlinked.
    pub(crate) fn remove(&mut self, page: PageId) -> Option<u32> {
        let nodes = &self.nodes;
        let i = self.index.remove(page, |s| nodes[s as usize].page())?;
        self.free.push(i);
        Some(i)
    }

    /// Whether free slots are worth giving back: more than an eighth as many as live nodes (and
    /// a thousand). A slab never shrinks by itself: freed slots are reused, so a slab whose
    /// resident set moved elsewhere (another address space, a smaller working set) keeps its
    /// peak's memory until compacted.
    pub(crate) fn should_compact(&self) -> bool {
        self.free.len() > self.len() / 8 + COMPACT_MIN_FREE
    }

    /// Moves the nodes above `len()` into the free slots below it, then gives back the spare
    /// capacity: afterwards the slab holds exactly its live nodes. The links of the moved
    /// nodes' neighbours are fixed here; `moved(node, from, to)` must fix what outside the
    /// slab names a slot (list heads and tails). O(slots).
    pub(crate) fn compact(&mut self, mut moved: impl FnMut(&N, u32, u32))
    where
        N: Linked,
    {
        let live = self.len();
        let mut free_above = vec![false; self.nodes.len() - live];
        let mut holes = Vec::new();
        for &f in &self.free {
            match (f as usize).checked_sub(live) {
                Some(k) => free_above[k] = true,
                None => holes.push(f),
            }
        }
        let movers = (live..self.nodes.len()).filter(|&s| !free_above[s - live]);
        for (to, from) in holes.into_iter().zip(movers) {
            let from = from as u32;
            let page = self.nodes[from as usize].page();
            let nodes = &self.nodes;
            self.index
                .relocate(page, from, to, |s| nodes[s as usize].page());
            self.nodes.swap(from as usize, to as usize);
            let Links { prev, next } = *self.nodes[to as usize].links();
            if prev != NIL {
                self.nodes[prev as usize].links_mut().next = to;
            }
            if next != NIL {
                self.nodes[next as usize].links_mut().prev = to;
            }
            moved(&self.nodes[to as usize], from, to);
        }
        self.nodes.truncate(live);
        self.nodes.shrink_to_fit();
        self.free = Vec::new();
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
        // Under miri: a few cases (each runs ~1000 times slower), and no regression file
        // (miri's isolation refuses file access).
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 256 },
            failure_persistence: if cfg!(miri) { None } else { ProptestConfig::default().failure_persistence },
            ..ProptestConfig::default()
        })]
        /// The index against a map: ids dense, at the ends of the id space and far apart;
        /// the table grows and shrinks with its contents.
        #[test]
        #[cfg_attr(miri, ignore = "minutes per case under miri, and mglru has no unsafe code of its own")]
        fn page_index_matches_a_map(ops in prop::collection::vec(
            (any::<bool>(), prop_oneof![0u64..200, (0u64..4).prop_map(|i| u64::MAX - i), 1u64 << 40..(1u64 << 40) + 70]),
            1..500,
        )) {
            let mut index = PageIndex::default();
            let mut model = std::collections::HashMap::new();
            // The key of each slot (slots are handed out once, as a slab's node would be).
            let mut keys: Vec<PageId> = Vec::new();
            for (add, page) in ops {
                if add && !model.contains_key(&page) {
                    let slot = keys.len() as u32;
                    keys.push(page);
                    index.insert(page, slot, |s| keys[s as usize]);
                    model.insert(page, slot);
                } else {
                    prop_assert_eq!(index.remove(page, |s| keys[s as usize]), model.remove(&page));
                }
                prop_assert_eq!(index.len(), model.len());
                for (&p, &v) in &model {
                    prop_assert_eq!(index.get(p, |s| keys[s as usize]), Some(v));
                }
                // Between half and three quarters full (or the minimum size).
                let cap = index.table.len();
                prop_assert!(model.len() * 4 <= cap * 3);
                prop_assert!(cap <= 64 || model.len() * 2 >= cap);
                prop_assert_eq!(index.table.iter().filter(|&&s| s != NIL).count(), model.len());
            }
        }
    }

    #[derive(Debug, Default)]
    struct N(Links);
    impl Keyed for N {
        fn page(&self) -> PageId {
            0
        }
    }
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
