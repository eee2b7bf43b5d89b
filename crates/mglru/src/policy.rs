//! What every replacement policy of the crate shares: page ids, hints, the access source the
//! embedder implements, and the [`Policy`] trait the replay and the benchmarks drive.

use std::ops::Range;

use crate::Error;

/// A page id. The embedder chooses the packing; the daemon packs (address space id, page
/// address). Consecutive ids are neighbours for the aging walk's regions and look-around.
///
/// [`crate::Mglru`] holds ids up to [`crate::MAX_PAGE_ID`] (`2^52 - 1`, which every 64-bit
/// byte address shifted right by 12 is within) and rejects larger ones with
/// [`crate::Error::PageIdTooLarge`]; the baselines take any `u64`.
pub type PageId = u64;

/// The two LRU types of the kernel: anonymous pages (need swap to be evicted) and file pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageType {
    /// Anonymous (swap-backed) pages; evicted only when swappiness is not zero.
    Anon = 0,
    /// File (page cache) pages.
    File = 1,
}

impl PageType {
    /// Both types, in index order.
    pub const ALL: [PageType; 2] = [PageType::Anon, PageType::File];

    pub(crate) fn idx(self) -> usize {
        self as usize
    }

    pub(crate) fn from_idx(i: usize) -> Self {
        if i == 0 {
            PageType::Anon
        } else {
            PageType::File
        }
    }
}

/// How a page arrived, which decides where it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Faulted in by an access; starts where [`crate::Config::fault_placement`] says.
    Fault,
    /// Part of a sequential stream (`MADV_SEQUENTIAL`-like): starts in the oldest generation.
    Sequential,
    /// Known hot (the kernel's `PG_active`, e.g. a migrated hot page): starts in the youngest.
    Active,
    /// Known cold (read ahead, not yet used): starts in the oldest generation.
    Cold,
}

/// What the embedder knows about a page it adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hint {
    /// Anonymous or file.
    pub page_type: PageType,
    /// How it arrived.
    pub arrival: Arrival,
}

impl Hint {
    /// A page faulted in by an access.
    pub fn fault(page_type: PageType) -> Self {
        Self {
            page_type,
            arrival: Arrival::Fault,
        }
    }

    /// A page of a sequential stream.
    pub fn sequential(page_type: PageType) -> Self {
        Self {
            page_type,
            arrival: Arrival::Sequential,
        }
    }

    /// A page with the given arrival.
    pub fn new(page_type: PageType, arrival: Arrival) -> Self {
        Self { page_type, arrival }
    }
}

/// How a resident page was accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    /// Through a mapping: the access source's accessed bit is set and the policy learns of it
    /// only when it tests that bit (MGLRU, active/inactive, CLOCK). Exact LRU, the idealised
    /// reference, sees each one.
    Mapped,
    /// Through a file-descriptor-like path (`read(2)`, `mark_page_accessed`): counted at once,
    /// and for MGLRU it raises the page's tier.
    Descriptor,
}

/// The source of access information the embedder implements: test and clear the "accessed"
/// signal of pages (the kernel's page table walk and `ptep_test_and_clear_young`).
///
/// Pages the policy does not hold may be reported; they are ignored.
pub trait AccessSource {
    /// Tests and clears the accessed signal of every page in `range`, calling `young` with each
    /// page whose signal was set.
    fn test_and_clear_young(&mut self, range: Range<PageId>, young: &mut dyn FnMut(PageId));

    /// Tests and clears the accessed signal of one page (the eviction-time check, `rmap`'s
    /// `folio_referenced`). The default asks [`AccessSource::test_and_clear_young`] for the
    /// one-page range.
    fn test_and_clear_page(&mut self, page: PageId) -> bool {
        let mut hit = false;
        self.test_and_clear_young(page..page.saturating_add(1), &mut |p| hit |= p == page);
        hit
    }
}

/// An access source that never reports an access (every page looks cold).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoAccess;

impl AccessSource for NoAccess {
    fn test_and_clear_young(&mut self, _range: Range<PageId>, _young: &mut dyn FnMut(PageId)) {}
}

/// A page-replacement policy over page ids: the common interface of [`crate::Mglru`] and the
/// baselines ([`crate::ActiveInactive`], [`crate::Lru`], [`crate::Clock`]).
pub trait Policy {
    /// A short name (`mglru`, `active-inactive`, `lru`, `clock`).
    fn name(&self) -> &'static str;

    /// Resident pages.
    fn len(&self) -> usize;

    /// Whether no page is resident.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `page` is resident.
    fn contains(&self, page: PageId) -> bool;

    /// Makes `page` resident. A page with a shadow entry is a refault and is detected as one.
    fn add(&mut self, page: PageId, hint: Hint) -> Result<(), Error>;

    /// Takes the shadow entry of a page just evicted, as a token of at most
    /// [`crate::SHADOW_TOKEN_BITS`] bits the embedder keeps where the page went (the kernel
    /// keeps it in the page cache's slot) and hands back to [`Policy::add_refault`]. Policies
    /// without shadow entries return `None`.
    fn take_shadow(&mut self, page: PageId) -> Option<u32> {
        let _ = page;
        None
    }

    /// [`Policy::add`] for a page coming back with the token [`Policy::take_shadow`] gave.
    fn add_refault(&mut self, page: PageId, hint: Hint, token: u32) -> Result<(), Error> {
        let _ = token;
        self.add(page, hint)
    }

    /// Records an access to a resident page; false if the page is not resident.
    fn access(&mut self, page: PageId, kind: AccessKind) -> bool;

    /// Forgets a resident page (unmapped, freed) without leaving a shadow; false if absent.
    fn remove(&mut self, page: PageId) -> bool;

    /// Chooses and removes up to `n` victims, aging as the policy needs, testing accessed bits
    /// through `source`. Fewer are returned only when too few pages are evictable.
    fn evict(&mut self, n: usize, source: &mut dyn AccessSource) -> Vec<PageId>;

    /// Heap bytes of the policy's own metadata (nodes, index, shadow entries), for an
    /// embedder's accounting.
    fn metadata_bytes(&self) -> usize;
}
