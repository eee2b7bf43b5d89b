//! The LRU of stored entries (the kernel's `zswap_list_lru`), coldest at the tail.
//!
//! A slab of doubly linked nodes: O(1) insert at the head, unlink by node index, pop at the tail.
//! Each node remembers the swap entry and the entry's unique id; unlinking checks the id, so a
//! node index that was popped and reused by another entry is never unlinked by mistake.

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    key: u64,
    id: u64,
    prev: u32,
    next: u32,
}

/// The list. Not synchronised: the store keeps it behind one lock, taken after a shard lock.
#[derive(Debug)]
pub(crate) struct Lru {
    nodes: Vec<Node>,
    free: u32,
    head: u32,
    tail: u32,
    len: usize,
}

impl Lru {
    pub(crate) fn new() -> Lru {
        Lru {
            nodes: Vec::new(),
            free: NIL,
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    /// Heap bytes held (from capacities).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Adds an entry as the most recently used; returns its node index.
    pub(crate) fn push_head(&mut self, key: u64, id: u64) -> u32 {
        let node = Node {
            key,
            id,
            prev: NIL,
            next: self.head,
        };
        let idx = if self.free != NIL {
            let idx = self.free;
            self.free = self.nodes[idx as usize].next;
            self.nodes[idx as usize] = node;
            idx
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        };
        if self.head != NIL {
            self.nodes[self.head as usize].prev = idx;
        } else {
            self.tail = idx;
        }
        self.head = idx;
        self.len += 1;
        idx
    }

    /// Unlinks node `idx` if it still belongs to entry `id`; returns whether it did.
    pub(crate) fn remove(&mut self, idx: u32, id: u64) -> bool {
        match self.nodes.get(idx as usize) {
            Some(n) if n.id == id && id != u64::MAX => {}
            _ => return false,
        }
        let Node { prev, next, .. } = self.nodes[idx as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
        // A free node has id u64::MAX, which no live entry has.
        self.nodes[idx as usize] = Node {
            key: u64::MAX,
            id: u64::MAX,
            prev: idx,
            next: self.free,
        };
        self.free = idx;
        self.len -= 1;
        true
    }

    /// Removes and returns the coldest entry as (key, id).
    pub(crate) fn pop_tail(&mut self) -> Option<(u64, u64)> {
        if self.tail == NIL {
            return None;
        }
        let idx = self.tail;
        let Node { key, id, .. } = self.nodes[idx as usize];
        self.remove(idx, id);
        Some((key, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_stale_indices() {
        let mut lru = Lru::new();
        let a = lru.push_head(10, 1);
        let _b = lru.push_head(11, 2);
        let c = lru.push_head(12, 3);
        assert_eq!(lru.len(), 3);
        assert!(lru.remove(c, 3));
        assert!(!lru.remove(c, 3), "already removed");
        assert_eq!(lru.pop_tail(), Some((10, 1)));
        // Node `a` is reused by a new entry; the old id no longer unlinks it.
        let d = lru.push_head(13, 4);
        assert_eq!(d, a);
        assert!(!lru.remove(a, 1));
        assert_eq!(lru.pop_tail(), Some((11, 2)));
        assert_eq!(lru.pop_tail(), Some((13, 4)));
        assert_eq!(lru.pop_tail(), None);
        assert_eq!(lru.len(), 0);
    }
}
