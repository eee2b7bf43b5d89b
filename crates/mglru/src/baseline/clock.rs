//! CLOCK (second chance): the hand sweeps from the old end; a page whose accessed bit (or
//! descriptor-path reference) is set gets the bit cleared and another round.

use super::BNode;
use crate::list::{ListHead, Slab};
use crate::policy::{AccessKind, AccessSource, Hint, PageId, Policy};
use crate::Error;

/// CLOCK replacement over the embedder's accessed bits.
#[derive(Debug, Default)]
pub struct Clock {
    slab: Slab<BNode>,
    /// The ring: the tail is under the hand, new pages go in just behind it (the head).
    ring: ListHead,
}

impl Clock {
    /// An empty CLOCK.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Policy for Clock {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn len(&self) -> usize {
        self.slab.len()
    }

    fn contains(&self, page: PageId) -> bool {
        self.slab.get(page).is_some()
    }

    fn add(&mut self, page: PageId, _hint: Hint) -> Result<(), Error> {
        if self.contains(page) {
            return Err(Error::AlreadyResident(page));
        }
        let i = self.slab.insert(page, BNode::new(page));
        self.ring.push_head(&mut self.slab.nodes, i);
        Ok(())
    }

    fn access(&mut self, page: PageId, kind: AccessKind) -> bool {
        let Some(i) = self.slab.get(page) else {
            return false;
        };
        if kind == AccessKind::Descriptor {
            self.slab.nodes[i as usize].referenced = true;
        }
        true
    }

    fn remove(&mut self, page: PageId) -> bool {
        let Some(i) = self.slab.get(page) else {
            return false;
        };
        self.ring.unlink(&mut self.slab.nodes, i);
        self.slab.remove(page);
        true
    }

    fn metadata_bytes(&self) -> usize {
        self.slab.heap_bytes()
    }

    fn evict(&mut self, n: usize, source: &mut dyn AccessSource) -> Vec<PageId> {
        let mut victims = Vec::with_capacity(n.min(self.len()));
        while victims.len() < n {
            let Some(i) = self.ring.tail() else { break };
            let node = &mut self.slab.nodes[i as usize];
            let page = node.page;
            // Both tests run so both signals are cleared.
            let young = source.test_and_clear_page(page);
            let referenced = std::mem::take(&mut node.referenced);
            self.ring.unlink(&mut self.slab.nodes, i);
            if young || referenced {
                self.ring.push_head(&mut self.slab.nodes, i);
            } else {
                self.slab.remove(page);
                victims.push(page);
            }
        }
        victims
    }
}
