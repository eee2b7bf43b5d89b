//! Clusters and the cluster lists (the kernel's `swap_cluster_info` and the lists in
//! `swap_info_struct`).
//!
//! A cluster's own state (`ClusterInner`) sits behind the cluster lock. The lists sit behind
//! the device lock and are intrusive doubly linked lists threaded through a per-cluster link
//! array, so moving a cluster between lists is O(1). A cluster's `state` is changed only while
//! both its cluster lock and the device lock are held, so a holder of either sees a state that
//! agrees with the lists (the kernel's rule that `ci->flags` mirrors list membership).

use crate::sync::Mutex;

/// Allocation orders served: 0 (one slot) to 9 (512 slots: 2 MiB of 4 KiB pages).
pub const NR_ORDERS: usize = 10;

/// A free slot.
pub(crate) const SLOT_FREE: u16 = 0;
/// The has-cache flag of a slot (the kernel's `SWAP_HAS_CACHE`).
pub(crate) const SLOT_HAS_CACHE: u16 = 0x4000;
/// The reference count bits of a slot.
pub(crate) const SLOT_COUNT_MASK: u16 = 0x3fff;
/// A slot beyond the end of the device in its last cluster: permanently used.
pub(crate) const SLOT_BAD: u16 = 0xffff;
/// The largest reference count a slot holds (the kernel continues counts on extra pages past
/// `SWAP_MAP_MAX`; this crate refuses with [`SwapError::CountOverflow`](crate::SwapError)).
pub const MAX_SLOT_COUNT: u16 = SLOT_COUNT_MASK;

/// Which list a cluster is on (the kernel's `CLUSTER_FLAG_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClusterState {
    /// No slot in use; on the free list.
    Free,
    /// Some slots freed since the cluster was last allocated from; on `nonfull[order]`.
    Nonfull,
    /// Partly used and either in use as a current cluster or failed an allocation of its
    /// order; on `frag[order]`.
    Frag,
    /// Every slot in use; on the full list.
    Full,
    /// Empty and waiting for (or undergoing) discard: on the discard list, or off every list
    /// while the discard hook runs. Never allocated from.
    Discard,
}

/// The state behind one cluster lock.
#[derive(Debug)]
pub(crate) struct ClusterInner {
    /// Slots in use (including `SLOT_BAD` tail slots).
    pub(crate) count: u32,
    /// The order the cluster serves; meaningful while `count > 0`.
    pub(crate) order: u8,
    /// Which list the cluster is on.
    pub(crate) state: ClusterState,
    /// One word per slot: `SLOT_FREE`, `SLOT_BAD`, or a count with the has-cache flag.
    /// Allocated while the cluster has slots in use (see [`SlotMap`]).
    pub(crate) map: SlotMap,
    /// Acquisitions of this cluster's lock (statistics, counted under the lock).
    pub(crate) lock_count: u64,
}

/// A cluster's lock and state, one per 64-byte cache line: the per-cluster part of the
/// device's metadata, kept for every cluster of the device whether in use or not (64 bytes
/// per 512 slots; the kernel's unpadded `swap_cluster_info` is about 32). A line of its own
/// keeps the lock words of two CPUs' current clusters, usually neighbours, from sharing a
/// line; crossbeam's `CachePadded` (128 bytes on x86_64, against the adjacent-line
/// prefetcher) would double the array for that second line.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct ClusterSlot(pub(crate) Mutex<ClusterInner>);

impl std::ops::Deref for ClusterSlot {
    type Target = Mutex<ClusterInner>;
    fn deref(&self) -> &Mutex<ClusterInner> {
        &self.0
    }
}

#[cfg(not(swap_alloc_loom))]
const _: () = assert!(std::mem::size_of::<ClusterSlot>() == 64);

/// Zeros for reading the map of a cluster that has none.
static ZEROS: [u16; crate::device::MAX_CLUSTER_SLOTS] =
    [SLOT_FREE; crate::device::MAX_CLUSTER_SLOTS];

/// A cluster's slot map, allocated on first write and released when the cluster is empty
/// again (the kernel's dynamically allocated swap table, which replaced the fixed
/// `swap_map` in 6.18's swap-table series): an 8 GiB device with a few hundred MiB in use
/// costs its in-use clusters' maps, not 2 bytes per slot of the whole device. Reads of an
/// unallocated map see every slot free.
#[derive(Debug)]
pub(crate) struct SlotMap {
    slots: Option<Box<[u16]>>,
    len: usize,
}

impl SlotMap {
    /// An unallocated map of `len` free slots.
    pub(crate) fn new(len: usize) -> SlotMap {
        assert!(len <= ZEROS.len());
        SlotMap { slots: None, len }
    }

    /// Frees the words; every slot must be free.
    pub(crate) fn release(&mut self) {
        debug_assert!(self.iter().all(|&v| v == SLOT_FREE));
        self.slots = None;
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.slots.as_ref().map_or(0, |s| s.len() * 2)
    }
}

impl std::ops::Deref for SlotMap {
    type Target = [u16];
    fn deref(&self) -> &[u16] {
        match &self.slots {
            Some(s) => s,
            None => &ZEROS[..self.len],
        }
    }
}

impl std::ops::DerefMut for SlotMap {
    fn deref_mut(&mut self) -> &mut [u16] {
        let len = self.len;
        self.slots
            .get_or_insert_with(|| vec![SLOT_FREE; len].into_boxed_slice())
    }
}

/// A list of clusters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListId {
    Free,
    Full,
    Discard,
    Nonfull(usize),
    Frag(usize),
}

impl ListId {
    pub(crate) const COUNT: usize = 3 + 2 * NR_ORDERS;

    pub(crate) fn index(self) -> usize {
        match self {
            ListId::Free => 0,
            ListId::Full => 1,
            ListId::Discard => 2,
            ListId::Nonfull(o) => 3 + o,
            ListId::Frag(o) => 3 + NR_ORDERS + o,
        }
    }

    /// The list a cluster in `state` with order class `class` belongs on.
    pub(crate) fn for_state(state: ClusterState, class: usize) -> Self {
        match state {
            ClusterState::Free => ListId::Free,
            ClusterState::Nonfull => ListId::Nonfull(class),
            ClusterState::Frag => ListId::Frag(class),
            ClusterState::Full => ListId::Full,
            ClusterState::Discard => ListId::Discard,
        }
    }
}

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Link {
    prev: u32,
    next: u32,
    /// `ListId::index()` of the list the cluster is on, or `NIL`.
    list: u32,
}

#[derive(Clone, Copy, Debug)]
struct Head {
    first: u32,
    last: u32,
    len: usize,
}

/// The cluster lists, behind the device lock.
#[derive(Debug)]
pub(crate) struct Lists {
    links: Vec<Link>,
    heads: Vec<Head>,
    /// Clusters in `Discard` state taken off the discard list while their hook runs.
    pub(crate) discarding: usize,
    /// Acquisitions of the device lock (statistics, counted under the lock).
    pub(crate) lock_count: u64,
}

impl Lists {
    /// Heap bytes of the lists.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.links.capacity() * std::mem::size_of::<Link>()
            + self.heads.capacity() * std::mem::size_of::<Head>()
    }

    pub(crate) fn new(nclusters: usize) -> Self {
        Self {
            links: vec![
                Link {
                    prev: NIL,
                    next: NIL,
                    list: NIL
                };
                nclusters
            ],
            heads: vec![
                Head {
                    first: NIL,
                    last: NIL,
                    len: 0
                };
                ListId::COUNT
            ],
            discarding: 0,
            lock_count: 0,
        }
    }

    fn idx(i: u32) -> Option<usize> {
        (i != NIL).then_some(i as usize)
    }

    /// The list cluster `idx` is on.
    pub(crate) fn list_of(&self, idx: usize) -> Option<usize> {
        Self::idx(self.links[idx].list)
    }

    pub(crate) fn len(&self, list: ListId) -> usize {
        self.heads[list.index()].len
    }

    pub(crate) fn first(&self, list: ListId) -> Option<usize> {
        Self::idx(self.heads[list.index()].first)
    }

    pub(crate) fn next(&self, idx: usize) -> Option<usize> {
        Self::idx(self.links[idx].next)
    }

    /// Takes cluster `idx` off whatever list it is on (no-op if none).
    pub(crate) fn remove(&mut self, idx: usize) {
        let Link { prev, next, list } = self.links[idx];
        if list == NIL {
            return;
        }
        let head = &mut self.heads[list as usize];
        match Self::idx(prev) {
            Some(p) => self.links[p].next = next,
            None => head.first = next,
        }
        match Self::idx(next) {
            Some(n) => self.links[n].prev = prev,
            None => head.last = prev,
        }
        head.len -= 1;
        self.links[idx] = Link {
            prev: NIL,
            next: NIL,
            list: NIL,
        };
    }

    /// Appends cluster `idx` (which must be on no list) to the tail of `list`.
    pub(crate) fn push_back(&mut self, list: ListId, idx: usize) {
        debug_assert_eq!(self.links[idx].list, NIL);
        let li = list.index();
        let head = &mut self.heads[li];
        let me = idx as u32;
        self.links[idx] = Link {
            prev: head.last,
            next: NIL,
            list: li as u32,
        };
        match Self::idx(head.last) {
            Some(l) => self.links[l].next = me,
            None => head.first = me,
        }
        head.last = me;
        head.len += 1;
    }

    /// Moves cluster `idx` to the tail of `list`.
    pub(crate) fn move_to(&mut self, list: ListId, idx: usize) {
        self.remove(idx);
        self.push_back(list, idx);
    }

    /// Takes the first cluster off `list`.
    pub(crate) fn pop_front(&mut self, list: ListId) -> Option<usize> {
        let first = self.first(list)?;
        self.remove(first);
        Some(first)
    }

    /// Walks every list and checks its links; returns the membership it found, per cluster.
    pub(crate) fn verify(&self) -> Result<Vec<Option<usize>>, String> {
        let mut seen = vec![None; self.links.len()];
        for (li, head) in self.heads.iter().enumerate() {
            let mut n = 0;
            let mut prev = NIL;
            let mut cur = head.first;
            while let Some(c) = Self::idx(cur) {
                if c >= self.links.len() {
                    return Err(format!("list {li} links to cluster {c}, beyond the device"));
                }
                if seen[c].is_some() {
                    return Err(format!("cluster {c} is reached twice (list {li})"));
                }
                seen[c] = Some(li);
                let l = self.links[c];
                if l.list as usize != li || l.prev != prev {
                    return Err(format!("cluster {c} on list {li} has a bad link {l:?}"));
                }
                n += 1;
                prev = cur;
                cur = l.next;
            }
            if head.last != prev || head.len != n {
                return Err(format!(
                    "list {li}: length {} / tail {} but walked {n} clusters to {prev}",
                    head.len, head.last
                ));
            }
        }
        for (c, l) in self.links.iter().enumerate() {
            if seen[c].is_none() && l.list != NIL {
                return Err(format!(
                    "cluster {c} claims list {} but is not on it",
                    l.list
                ));
            }
        }
        Ok(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_moves_keep_links() {
        let mut l = Lists::new(4);
        for i in 0..4 {
            l.push_back(ListId::Free, i);
        }
        l.move_to(ListId::Frag(3), 1);
        l.move_to(ListId::Frag(3), 3);
        assert_eq!(l.pop_front(ListId::Free), Some(0));
        assert_eq!(l.len(ListId::Free), 1);
        assert_eq!(l.first(ListId::Frag(3)), Some(1));
        assert_eq!(l.next(1), Some(3));
        let seen = l.verify().unwrap();
        assert_eq!(seen[0], None);
        assert_eq!(seen[2], Some(ListId::Free.index()));
        l.remove(1);
        l.remove(1);
        assert_eq!(l.list_of(1), None);
        assert_eq!(l.first(ListId::Frag(3)), Some(3));
        l.verify().unwrap();
    }
}
