//! The active/inactive lists of Linux before MGLRU (v5.9 to v6.0 `mm/vmscan.c` and
//! `mm/workingset.c`), for one LRU type:
//!
//! - faulted pages start on the inactive list (anon since v5.9), known-hot pages on the active;
//! - `shrink_inactive_list` with `page_check_references`: a page whose accessed bit is set is
//!   marked referenced and rotated once, activated if it is found referenced again; a page with
//!   no accessed bit is evicted;
//! - `shrink_active_list` when the inactive list is low (`inactive * ratio < active`, ratio
//!   `sqrt(10 * GiB)` or 1): pages move to the inactive list whether accessed or not (only
//!   executable file pages are kept active), with their accessed bits cleared;
//! - `mark_page_accessed` for descriptor accesses: referenced, then activation;
//! - workingset detection: a shadow entry records the non-resident age at eviction; a refault
//!   whose distance is at most the active list's size comes back active.

use std::collections::VecDeque;

use super::BNode;
use crate::list::{IdMap, ListHead, Slab};
use crate::policy::{AccessKind, AccessSource, Arrival, Hint, PageId, Policy};
use crate::Error;

/// Pages moved per `shrink_active_list` call (`SWAP_CLUSTER_MAX`).
const SWAP_CLUSTER_MAX: usize = 32;

/// The two-list LRU of Linux before MGLRU.
#[derive(Debug)]
pub struct ActiveInactive {
    slab: Slab<BNode>,
    active: ListHead,
    inactive: ListHead,
    /// `lruvec->nonresident_age`: evictions and activations so far.
    nonresident_age: u64,
    shadows: IdMap<u64>,
    shadow_fifo: VecDeque<(PageId, u64)>,
    max_shadows: usize,
    /// Refaults that came back active.
    pub refaults_activated: u64,
}

impl Default for ActiveInactive {
    fn default() -> Self {
        Self::new(1 << 20)
    }
}

impl ActiveInactive {
    /// An empty pair of lists keeping at most `max_shadows` shadow entries.
    pub fn new(max_shadows: usize) -> Self {
        Self {
            slab: Slab::default(),
            active: ListHead::default(),
            inactive: ListHead::default(),
            nonresident_age: 0,
            shadows: IdMap::default(),
            shadow_fifo: VecDeque::new(),
            max_shadows,
            refaults_activated: 0,
        }
    }

    /// Pages on the active list.
    pub fn nr_active(&self) -> usize {
        self.active.len()
    }

    /// Pages on the inactive list.
    pub fn nr_inactive(&self) -> usize {
        self.inactive.len()
    }

    fn inactive_is_low(&self) -> bool {
        let (inactive, active) = (self.inactive.len() as u64, self.active.len() as u64);
        // Pages are 4 KiB: GiB = pages >> 18.
        let gb = (inactive + active) >> 18;
        let ratio = if gb > 0 { (10 * gb).isqrt() } else { 1 };
        inactive * ratio < active
    }

    fn activate(&mut self, i: u32) {
        let node = &mut self.slab.nodes[i as usize];
        if node.active {
            return;
        }
        node.active = true;
        self.inactive.unlink(&mut self.slab.nodes, i);
        self.active.push_head(&mut self.slab.nodes, i);
    }

    fn shrink_active(&mut self, nr: usize, source: &mut dyn AccessSource) {
        for _ in 0..nr {
            let Some(i) = self.active.tail() else { break };
            let page = self.slab.nodes[i as usize].page;
            // page_referenced clears the accessed bits; anon pages are deactivated anyway.
            let _ = source.test_and_clear_page(page);
            self.active.unlink(&mut self.slab.nodes, i);
            self.slab.nodes[i as usize].active = false;
            self.inactive.push_head(&mut self.slab.nodes, i);
        }
    }

    fn prune_shadows(&mut self) {
        while self.shadows.len() > self.max_shadows
            || self.shadow_fifo.len() > 2 * self.max_shadows.max(self.shadows.len()) + 1024
        {
            let Some((page, age)) = self.shadow_fifo.pop_front() else {
                break;
            };
            if self.shadows.get(&page) == Some(&age) {
                self.shadows.remove(&page);
            }
        }
    }
}

impl Policy for ActiveInactive {
    fn name(&self) -> &'static str {
        "active-inactive"
    }

    fn len(&self) -> usize {
        self.slab.len()
    }

    fn contains(&self, page: PageId) -> bool {
        self.slab.get(page).is_some()
    }

    fn add(&mut self, page: PageId, hint: Hint) -> Result<(), Error> {
        if self.contains(page) {
            return Err(Error::AlreadyResident(page));
        }
        let mut active = hint.arrival == Arrival::Active;
        if let Some(eviction) = self.shadows.remove(&page) {
            // workingset_refault: the workingset size for anon with swap is the active list.
            let distance = self.nonresident_age - eviction;
            if distance <= self.active.len() as u64 {
                active = true;
                self.nonresident_age += 1;
                self.refaults_activated += 1;
            }
        }
        let mut node = BNode::new(page);
        node.active = active;
        let i = self.slab.insert(page, node);
        if active {
            self.active.push_head(&mut self.slab.nodes, i);
        } else if matches!(hint.arrival, Arrival::Sequential | Arrival::Cold) {
            self.inactive.push_tail(&mut self.slab.nodes, i);
        } else {
            self.inactive.push_head(&mut self.slab.nodes, i);
        }
        Ok(())
    }

    fn access(&mut self, page: PageId, kind: AccessKind) -> bool {
        let Some(i) = self.slab.get(page) else {
            return false;
        };
        if kind == AccessKind::Descriptor {
            // mark_page_accessed.
            let node = &mut self.slab.nodes[i as usize];
            if !node.referenced {
                node.referenced = true;
            } else if !node.active {
                node.referenced = false;
                self.activate(i);
                self.nonresident_age += 1;
            }
        }
        true
    }

    fn remove(&mut self, page: PageId) -> bool {
        let Some(i) = self.slab.get(page) else {
            return false;
        };
        if self.slab.nodes[i as usize].active {
            self.active.unlink(&mut self.slab.nodes, i);
        } else {
            self.inactive.unlink(&mut self.slab.nodes, i);
        }
        self.slab.remove(page);
        true
    }

    fn metadata_bytes(&self) -> usize {
        self.slab.heap_bytes()
            + self.shadows.capacity() * (std::mem::size_of::<(PageId, u64)>() + 1)
            + self.shadow_fifo.capacity() * std::mem::size_of::<(PageId, u64)>()
    }

    fn evict(&mut self, n: usize, source: &mut dyn AccessSource) -> Vec<PageId> {
        let mut victims = Vec::with_capacity(n.min(self.len()));
        while victims.len() < n && !self.is_empty() {
            if self.inactive_is_low() || self.inactive.is_empty() {
                self.shrink_active(SWAP_CLUSTER_MAX, source);
            }
            let Some(i) = self.inactive.tail() else {
                continue;
            };
            let page = self.slab.nodes[i as usize].page;
            // page_check_references.
            let referenced_ptes = source.test_and_clear_page(page);
            let referenced_page = std::mem::take(&mut self.slab.nodes[i as usize].referenced);
            if referenced_ptes {
                self.slab.nodes[i as usize].referenced = true;
                self.inactive.unlink(&mut self.slab.nodes, i);
                if referenced_page {
                    self.slab.nodes[i as usize].active = true;
                    self.active.push_head(&mut self.slab.nodes, i);
                } else {
                    self.inactive.push_head(&mut self.slab.nodes, i);
                }
                continue;
            }
            self.inactive.unlink(&mut self.slab.nodes, i);
            self.slab.remove(page);
            self.shadows.insert(page, self.nonresident_age);
            self.shadow_fifo.push_back((page, self.nonresident_age));
            self.nonresident_age += 1;
            victims.push(page);
        }
        self.prune_shadows();
        victims
    }
}
