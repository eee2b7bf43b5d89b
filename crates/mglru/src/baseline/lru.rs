//! Exact LRU: every access, mapped or not, moves the page to the young end. An idealised
//! reference (no real kernel sees every mapped access), not something a pager can run.

use super::BNode;
use crate::list::{ListHead, Slab};
use crate::policy::{AccessKind, AccessSource, Hint, PageId, Policy};
use crate::Error;

/// Exact least-recently-used replacement.
#[derive(Debug, Default)]
pub struct Lru {
    slab: Slab<BNode>,
    list: ListHead,
}

impl Lru {
    /// An empty LRU.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Policy for Lru {
    fn name(&self) -> &'static str {
        "lru"
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
        self.list.push_head(&mut self.slab.nodes, i);
        Ok(())
    }

    fn access(&mut self, page: PageId, _kind: AccessKind) -> bool {
        let Some(i) = self.slab.get(page) else {
            return false;
        };
        self.list.unlink(&mut self.slab.nodes, i);
        self.list.push_head(&mut self.slab.nodes, i);
        true
    }

    fn remove(&mut self, page: PageId) -> bool {
        let Some(i) = self.slab.get(page) else {
            return false;
        };
        self.list.unlink(&mut self.slab.nodes, i);
        self.slab.remove(page);
        true
    }

    fn metadata_bytes(&self) -> usize {
        self.slab.heap_bytes()
    }

    fn evict(&mut self, n: usize, _source: &mut dyn AccessSource) -> Vec<PageId> {
        let mut victims = Vec::with_capacity(n.min(self.len()));
        while victims.len() < n {
            let Some(i) = self.list.tail() else { break };
            let page = self.slab.nodes[i as usize].page;
            self.list.unlink(&mut self.slab.nodes, i);
            self.slab.remove(page);
            victims.push(page);
        }
        victims
    }
}
