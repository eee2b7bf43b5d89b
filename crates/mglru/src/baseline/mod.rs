//! The baselines the multi-generational LRU is measured against: the active/inactive lists of
//! Linux before MGLRU, exact LRU and CLOCK.

mod active_inactive;
mod clock;
mod lru;

pub use active_inactive::ActiveInactive;
pub use clock::Clock;
pub use lru::Lru;

use crate::list::{Linked, Links};
use crate::PageId;

/// A page of a baseline policy.
#[derive(Debug, Clone)]
pub(crate) struct BNode {
    pub(crate) page: PageId,
    pub(crate) links: Links,
    /// `PG_active` (active/inactive) or unused.
    pub(crate) active: bool,
    /// `PG_referenced` (an access through the descriptor path, or a second look).
    pub(crate) referenced: bool,
}

impl crate::list::Keyed for BNode {
    fn page(&self) -> PageId {
        self.page
    }
}

impl BNode {
    pub(crate) fn new(page: PageId) -> Self {
        Self {
            page,
            links: Links::default(),
            active: false,
            referenced: false,
        }
    }
}

impl Linked for BNode {
    fn links(&self) -> &Links {
        &self.links
    }
    fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }
}
