//! The per-page word: generation, reference count and flags, updated with compare-and-swap
//! (the kernel's `folio->flags` with `LRU_GEN_MASK`, `LRU_REFS_MASK`, `PG_referenced`,
//! `PG_workingset`), plus what the LRU keeps of the page (its list, type and id), so that a
//! node is this word and two links: 16 bytes per resident page.
//!
//! Layout of the word (low bits first):
//!
//! | bits | field | kernel |
//! |---|---|---|
//! | 0..3 | generation + 1 (0: not on an LRU list, isolated) | `LRU_GEN_MASK` |
//! | 3..5 | references beyond the first two (0..=3) | `LRU_REFS_MASK` |
//! | 5 | referenced (first access through the descriptor path) | `PG_referenced` |
//! | 6 | workingset | `PG_workingset` |
//! | 7 | fresh: faulted in, its accessed bit not yet seen (for [`crate::Config::look_twice`]) | |
//! | 8 | reused: promoted for an access since it was added (kept until eviction) | `PG_workingset` on mapped folios (6.14) |
//! | 9..11 | list generation: the generation whose list the node is on | the folio's `lru` list |
//! | 11 | page type (0 anon, 1 file) | `folio_is_file_lru` |
//! | 12..64 | page id ([`PAGE_ID_BITS`] bits) | the folio itself |
//!
//! Every update of bits 0..9 is one CAS loop on the whole word, so a promotion by the aging
//! walk ([`PageFlags::update_gen`]), an access counted through the descriptor path
//! ([`PageFlags::inc_refs`]) and the protection of a page by eviction ([`PageFlags::inc_gen`])
//! never lose each other's effect. Each generation change returns the old generation, so the
//! caller can account the move in a batch of per-generation count deltas ([`GenBatch`]).
//!
//! INVARIANT: the flag updates change only bits 0..9 (checked by a `debug_assert!` in every
//! CAS loop); the list generation changes only through [`PageFlags::set_list_gen`], itself a
//! CAS loop that changes only bits 9..11; the type and page id never change while the word
//! lives.

use crate::policy::{PageId, PageType};
use crate::sync::{AtomicU64, Ordering};
use crate::MAX_NR_TIERS;

const GEN_SHIFT: u32 = 0;
const GEN_MASK: u64 = 0b111 << GEN_SHIFT;
const REFS_SHIFT: u32 = 3;
/// Width of the reference field (the kernel's `LRU_REFS_WIDTH = MAX_NR_TIERS - 2`).
pub(crate) const REFS_WIDTH: u32 = MAX_NR_TIERS as u32 - 2;
const REFS_MASK: u64 = ((1 << REFS_WIDTH) - 1) << REFS_SHIFT;
const REFERENCED: u64 = 1 << 5;
const WORKINGSET: u64 = 1 << 6;
const FRESH: u64 = 1 << 7;
const REUSED: u64 = 1 << 8;
const REFS_FLAGS: u64 = REFERENCED | WORKINGSET;
/// The bits the flag operations own (everything above is the node's).
const FLAGS_MASK: u64 = (1 << 9) - 1;
const LIST_GEN_SHIFT: u32 = 9;
const LIST_GEN_MASK: u64 = 0b11 << LIST_GEN_SHIFT;
const TYPE_SHIFT: u32 = 11;
const TYPE_BIT: u64 = 1 << TYPE_SHIFT;
const PAGE_SHIFT: u32 = 12;
/// Bits of a page id in the word: ids of resident pages are below `2^PAGE_ID_BITS`.
pub(crate) const PAGE_ID_BITS: u32 = u64::BITS - PAGE_SHIFT;
/// The largest page id [`crate::Mglru`] can hold, `2^52 - 1` (its node keeps the id in the 52
/// upper bits of the page's flags word). A 64-bit byte address shifted right by 12 (a 4 KiB
/// page number) is always within it; [`crate::Mglru::add`] rejects a larger id with
/// [`crate::Error::PageIdTooLarge`].
pub const MAX_PAGE_ID: PageId = (1 << PAGE_ID_BITS) - 1;

// The fields fill the word exactly, and generations fit their 3-bit fields.
const _: () = assert!(REFS_SHIFT + REFS_WIDTH <= 5);
const _: () = assert!(FLAGS_MASK & LIST_GEN_MASK == 0 && LIST_GEN_MASK & TYPE_BIT == 0);
const _: () = assert!(crate::MAX_NR_GENS < (GEN_MASK >> GEN_SHIFT) as usize);
const _: () = assert!(crate::MAX_NR_GENS <= (LIST_GEN_MASK >> LIST_GEN_SHIFT) as usize + 1);

/// The tier of a page with `refs` accesses beyond the first (the kernel's `lru_tier_from_refs`:
/// `order_base_2(refs + 1)`): 0 → tier 0, 1 → tier 1, 2..=3 → tier 2, 4 → tier 3.
pub(crate) fn tier_from_refs(refs: usize) -> usize {
    let n = refs + 1;
    // order_base_2(n) = ceil(log2(n)).
    (usize::BITS - (n - 1).leading_zeros()) as usize
}

/// The atomic word of one resident page: its flags, its list generation, its type and its id.
///
/// `pub` (with its methods) only so that the loom models reach it through `mglru::__loom`
/// under `cfg(mglru_loom)`; in every other build it is private to the crate, which the
/// `allow` below says to `unreachable_pub`.
#[derive(Debug)]
#[cfg_attr(not(mglru_loom), allow(unreachable_pub))]
pub struct PageFlags(AtomicU64);

#[cfg_attr(not(mglru_loom), allow(unreachable_pub))]
impl PageFlags {
    /// Page `page` of type `page_type`, on the list of generation `gen` and in that generation,
    /// with no references.
    ///
    /// # Panics
    ///
    /// If `page` is above [`MAX_PAGE_ID`] (callers check it and return
    /// [`crate::Error::PageIdTooLarge`]) or `gen` is not below [`crate::MAX_NR_GENS`].
    pub fn new(page: PageId, page_type: PageType, gen: usize) -> Self {
        assert!(
            page <= MAX_PAGE_ID,
            "page id {page:#x} above {MAX_PAGE_ID:#x}"
        );
        assert!(gen < crate::MAX_NR_GENS, "generation index {gen}");
        let gen = gen as u64;
        Self(AtomicU64::new(
            ((gen + 1) << GEN_SHIFT)
                | (gen << LIST_GEN_SHIFT)
                | ((page_type.idx() as u64) << TYPE_SHIFT)
                | (page << PAGE_SHIFT),
        ))
    }

    fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// The page id. A Relaxed load is enough: the id bits are written once, when the word is
    /// made, and never change while it lives (every update preserves them); the node that
    /// holds the word reached this thread through the LRU's owner (`&mut`, or the lock of
    /// [`crate::SharedMglru`]), which orders its creation before this load. The other bits may
    /// change concurrently, but they are masked off.
    pub fn page(&self) -> PageId {
        self.0.load(Ordering::Relaxed) >> PAGE_SHIFT
    }

    /// The page type (immutable, as the id: a Relaxed load, see [`PageFlags::page`]).
    pub fn page_type(&self) -> PageType {
        PageType::from_idx(((self.0.load(Ordering::Relaxed) & TYPE_BIT) >> TYPE_SHIFT) as usize)
    }

    /// The generation whose list the node is on (the flags may already say a younger one).
    /// Changed only by the LRU's owner (`&mut`), so a Relaxed load sees the owner's last store.
    pub fn list_gen(&self) -> usize {
        ((self.0.load(Ordering::Relaxed) & LIST_GEN_MASK) >> LIST_GEN_SHIFT) as usize
    }

    /// Records that the node is now on the list of generation `gen`. A CAS loop that changes
    /// only the list generation's bits: a reader may be counting an access on the same word
    /// at the same time ([`PageFlags::inc_refs`] through `mark_accessed`), and neither loses
    /// the other's change.
    pub fn set_list_gen(&self, gen: usize) {
        debug_assert!(gen < crate::MAX_NR_GENS, "generation index {gen}");
        let bits = ((gen as u64) << LIST_GEN_SHIFT) & LIST_GEN_MASK;
        let mut old = self.0.load(Ordering::Relaxed);
        loop {
            let new = (old & !LIST_GEN_MASK) | bits;
            if new == old {
                return;
            }
            match self
                .0
                .compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(cur) => old = cur,
            }
        }
    }

    fn gen_of(word: u64) -> Option<usize> {
        let g = (word & GEN_MASK) >> GEN_SHIFT;
        (g != 0).then(|| (g - 1) as usize)
    }

    /// The page's generation index (`seq % max_nr_gens`), `None` while isolated.
    pub fn gen(&self) -> Option<usize> {
        Self::gen_of(self.load())
    }

    /// Accesses beyond the first, counting the workingset flag as one (`folio_lru_refs`).
    pub fn refs(&self) -> usize {
        let w = self.load();
        (((w & REFS_MASK) >> REFS_SHIFT) + u64::from(w & WORKINGSET != 0)) as usize
    }

    /// The tier of the page (by [`PageFlags::refs`]).
    pub fn tier(&self) -> usize {
        tier_from_refs(self.refs())
    }

    /// Whether the page was promoted for an access since it was added (by the aging walk, a
    /// look-around or the eviction-time check): it was protected at least once, so its
    /// eviction is a demotion's outcome, not a probation's.
    pub(crate) fn is_reused(&self) -> bool {
        self.load() & REUSED != 0
    }

    #[cfg(all(test, not(mglru_loom)))]
    pub(crate) fn is_referenced(&self) -> bool {
        self.load() & REFERENCED != 0
    }

    #[cfg(all(test, not(mglru_loom)))]
    pub(crate) fn is_workingset(&self) -> bool {
        self.load() & WORKINGSET != 0
    }

    /// The bits the flag operations own (0..9), for tests of the layout.
    #[cfg(all(test, not(mglru_loom)))]
    fn flag_bits(&self) -> u64 {
        self.load() & FLAGS_MASK
    }

    /// One CAS loop over the flag bits: `f` gets the whole word and returns the new one (or
    /// `None` to leave it); it must not change bits above the flags.
    fn update(&self, mut f: impl FnMut(u64) -> Option<u64>) -> u64 {
        let mut old = self.load();
        loop {
            let Some(new) = f(old) else { return old };
            debug_assert_eq!(
                new & !FLAGS_MASK,
                old & !FLAGS_MASK,
                "a flag update changed the node's bits"
            );
            match self
                .0
                .compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return old,
                Err(cur) => old = cur,
            }
        }
    }

    /// Marks a page just faulted in: the first accessed bit seen is the fault's own.
    pub(crate) fn set_fresh(&self) {
        self.update(|w| (w & FRESH == 0).then_some(w | FRESH));
    }

    /// Sets the workingset flag (a refault of a page that was part of the working set).
    pub(crate) fn set_workingset(&self) {
        self.update(|w| (w & WORKINGSET == 0).then_some(w | WORKINGSET));
    }

    /// One access through the descriptor path (`folio_inc_refs`): the first sets referenced,
    /// the second workingset, the next ones count up to the field's maximum.
    pub fn inc_refs(&self) {
        self.update(|w| {
            if w & REFERENCED == 0 {
                Some(w | REFERENCED)
            } else if w & WORKINGSET == 0 {
                Some(w | WORKINGSET)
            } else if w & REFS_MASK == REFS_MASK {
                None
            } else {
                Some(w + (1 << REFS_SHIFT))
            }
        });
    }

    /// Promotion by the aging walk or a look-around (`folio_update_gen`): moves the page to
    /// generation `gen` and clears its references. Returns the old generation, or `None` if the
    /// page is isolated (then only referenced is set, for the eviction that isolated it).
    ///
    /// With `look_twice`, a fresh page is not moved: its fresh mark is cleared (the fault's
    /// own access is not a reuse). Returns `(old generation, whether the page was moved)`.
    pub fn update_gen(&self, gen: usize, look_twice: bool) -> Option<(usize, bool)> {
        debug_assert!(gen < crate::MAX_NR_GENS, "generation index {gen}");
        let mut moved = true;
        let old = self.update(|w| {
            moved = true;
            if w & GEN_MASK == 0 {
                Some(w | REFERENCED)
            } else if look_twice && w & FRESH != 0 {
                moved = false;
                Some(w & !FRESH)
            } else {
                Some(
                    (w & !(GEN_MASK | REFS_MASK | REFS_FLAGS | FRESH))
                        | REUSED
                        | (((gen as u64) + 1) << GEN_SHIFT),
                )
            }
        });
        Self::gen_of(old).map(|o| (o, moved))
    }

    /// Protection at eviction and draining of the oldest generation (`folio_inc_gen`): a page
    /// still in the oldest generation `min_gen` moves to `next_gen` with its references
    /// cleared; a page promoted meanwhile keeps its newer generation. Returns `(old, new)`.
    pub fn inc_gen(&self, min_gen: usize, next_gen: usize) -> (Option<usize>, usize) {
        debug_assert!(next_gen < crate::MAX_NR_GENS, "generation index {next_gen}");
        let mut new_gen = next_gen;
        let old = self.update(|w| match Self::gen_of(w) {
            Some(g) if g != min_gen => {
                new_gen = g;
                None
            }
            _ => {
                new_gen = next_gen;
                Some(
                    (w & !(GEN_MASK | REFS_MASK | REFS_FLAGS))
                        | (((next_gen as u64) + 1) << GEN_SHIFT),
                )
            }
        });
        (Self::gen_of(old), new_gen)
    }

    /// Isolation for eviction (`lru_gen_del_folio`): clears the generation, returns the old one.
    pub(crate) fn isolate(&self) -> Option<usize> {
        Self::gen_of(self.update(|w| Some(w & !GEN_MASK)))
    }

    /// Clears references of a page that was not referenced through the descriptor path since
    /// it was last seen, and then clears referenced (what `isolate_folio` does to a page it
    /// hands to the per-page check).
    pub(crate) fn clear_refs_for_check(&self) {
        self.update(|w| {
            let w = if w & REFERENCED == 0 {
                w & !(REFS_MASK | REFS_FLAGS)
            } else {
                w
            };
            Some(w & !REFERENCED)
        });
    }
}

/// Deltas of per-generation, per-type page counts, accumulated while pages move and applied
/// in one go (the kernel's `lru_gen_mm_walk::nr_pages` and `reset_batch_size`). Between the
/// moves and [`GenBatch::apply`] the counts are stale; after it they are exact.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct GenBatch {
    delta: [[i64; 2]; crate::MAX_NR_GENS],
    moved_in: [[u64; 2]; crate::MAX_NR_GENS],
    dirty: bool,
}

impl GenBatch {
    /// Records a move of one page of type `ty` from `old` to `new`.
    pub(crate) fn record(&mut self, ty: usize, old: usize, new: usize) {
        if old != new {
            self.delta[old][ty] -= 1;
            self.delta[new][ty] += 1;
            self.moved_in[new][ty] += 1;
            self.dirty = true;
        }
    }

    /// Adds the deltas to `counts` and the pages moved into each generation to `promoted`, and
    /// resets the batch.
    pub(crate) fn apply(
        &mut self,
        counts: &mut [[i64; 2]; crate::MAX_NR_GENS],
        promoted: &mut [[u64; 2]; crate::MAX_NR_GENS],
    ) {
        if !self.dirty {
            return;
        }
        for g in 0..crate::MAX_NR_GENS {
            for t in 0..2 {
                counts[g][t] += self.delta[g][t];
                promoted[g][t] += self.moved_in[g][t];
                self.delta[g][t] = 0;
                self.moved_in[g][t] = 0;
            }
        }
        self.dirty = false;
    }
}

#[cfg(all(test, not(mglru_loom)))]
mod tests {
    use super::*;

    use proptest::prelude::*;

    /// One operation on a word.
    #[derive(Debug, Clone)]
    enum Op {
        SetFresh,
        SetWorkingset,
        IncRefs,
        UpdateGen(usize, bool),
        IncGen(usize, usize),
        Isolate,
        ClearRefsForCheck,
        SetListGen(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let gen = 0..crate::MAX_NR_GENS;
        prop_oneof![
            Just(Op::SetFresh),
            Just(Op::SetWorkingset),
            Just(Op::IncRefs),
            (gen.clone(), any::<bool>()).prop_map(|(g, t)| Op::UpdateGen(g, t)),
            (gen.clone(), gen.clone()).prop_map(|(a, b)| Op::IncGen(a, b)),
            Just(Op::Isolate),
            Just(Op::ClearRefsForCheck),
            gen.prop_map(Op::SetListGen),
        ]
    }

    /// Applies `op`, returning what it returned (as text, to compare two words' answers).
    fn apply(f: &PageFlags, op: &Op) -> String {
        match *op {
            Op::SetFresh => {
                f.set_fresh();
                String::new()
            }
            Op::SetWorkingset => {
                f.set_workingset();
                String::new()
            }
            Op::IncRefs => {
                f.inc_refs();
                String::new()
            }
            Op::UpdateGen(g, t) => format!("{:?}", f.update_gen(g, t)),
            Op::IncGen(a, b) => format!("{:?}", f.inc_gen(a, b)),
            Op::Isolate => format!("{:?}", f.isolate()),
            Op::ClearRefsForCheck => {
                f.clear_refs_for_check();
                String::new()
            }
            Op::SetListGen(g) => {
                f.set_list_gen(g);
                String::new()
            }
        }
    }

    proptest! {
        // Under miri: a few cases (each runs ~1000 times slower), and no regression file
        // (miri's isolation refuses file access).
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 256 },
            failure_persistence: if cfg!(miri) { None } else { ProptestConfig::default().failure_persistence },
            ..ProptestConfig::default()
        })]
        /// The flag operations never touch the page id, type or list generation, and do not
        /// depend on them: a word with any page (up to 2^52 - 1) and type gives the same
        /// answers and flag bits as a bare one (page 0, anon) through any sequence of flag
        /// operations and list-generation changes.
        #[test]
        fn flag_operations_keep_the_node_bits(
            page in prop_oneof![0..=MAX_PAGE_ID, Just(MAX_PAGE_ID), MAX_PAGE_ID - 4096..=MAX_PAGE_ID],
            file in any::<bool>(),
            gen in 0..crate::MAX_NR_GENS,
            ops in proptest::collection::vec(op(), 0..64),
        ) {
            let ty = if file { PageType::File } else { PageType::Anon };
            let f = PageFlags::new(page, ty, gen);
            let bare = PageFlags::new(0, PageType::Anon, gen);
            let mut list_gen = gen;
            prop_assert_eq!((f.page(), f.page_type(), f.list_gen()), (page, ty, gen));
            for op in &ops {
                prop_assert_eq!(apply(&f, op), apply(&bare, op));
                if let Op::SetListGen(g) = *op {
                    list_gen = g;
                }
                prop_assert_eq!(f.flag_bits(), bare.flag_bits());
                prop_assert_eq!((f.page(), f.page_type(), f.list_gen()), (page, ty, list_gen));
                prop_assert_eq!((f.gen(), f.refs()), (bare.gen(), bare.refs()));
            }
        }
    }

    #[test]
    fn the_word_holds_the_largest_page_id() {
        let f = PageFlags::new(MAX_PAGE_ID, PageType::File, 3);
        assert_eq!(f.page(), (1 << 52) - 1);
        assert_eq!(
            (f.page_type(), f.list_gen(), f.gen()),
            (PageType::File, 3, Some(3))
        );
        f.set_list_gen(0);
        assert_eq!(
            (f.page(), f.page_type(), f.list_gen()),
            (MAX_PAGE_ID, PageType::File, 0)
        );
    }

    #[test]
    #[should_panic(expected = "above")]
    fn the_word_refuses_a_larger_page_id() {
        let _ = PageFlags::new(MAX_PAGE_ID + 1, PageType::Anon, 0);
    }

    #[test]
    fn tiers_follow_order_base_2() {
        let tiers: Vec<usize> = (0..=4).map(tier_from_refs).collect();
        assert_eq!(tiers, vec![0, 1, 2, 2, 3]);
    }

    #[test]
    fn inc_refs_walks_referenced_workingset_then_counts() {
        let f = PageFlags::new(7, PageType::Anon, 1);
        let mut seen = vec![];
        for _ in 0..7 {
            f.inc_refs();
            seen.push((f.refs(), f.tier()));
        }
        assert_eq!(
            seen,
            vec![(0, 0), (1, 1), (2, 2), (3, 2), (4, 3), (4, 3), (4, 3)]
        );
        assert!(f.is_referenced() && f.is_workingset());
    }

    #[test]
    fn update_gen_clears_refs_and_inc_gen_respects_promotion() {
        let f = PageFlags::new(7, PageType::Anon, 0);
        f.inc_refs();
        f.inc_refs();
        assert_eq!(f.update_gen(3, true), Some((0, true)));
        assert_eq!((f.gen(), f.refs(), f.is_referenced()), (Some(3), 0, false));
        // Promoted meanwhile: inc_gen keeps the newer generation.
        assert_eq!(f.inc_gen(0, 1), (Some(3), 3));
        let g = PageFlags::new(7, PageType::Anon, 0);
        g.inc_refs();
        g.inc_refs();
        assert_eq!(g.inc_gen(0, 1), (Some(0), 1));
        assert_eq!(g.refs(), 0);
        assert_eq!(g.isolate(), Some(1));
        assert_eq!(g.update_gen(2, false), None);
        assert!(g.is_referenced());
    }

    #[test]
    fn look_twice_spares_the_first_young_bit_of_a_fresh_page() {
        let f = PageFlags::new(7, PageType::Anon, 1);
        f.set_fresh();
        assert_eq!(f.update_gen(3, true), Some((1, false)));
        assert_eq!(f.gen(), Some(1));
        assert_eq!(f.update_gen(3, true), Some((1, true)));
        assert_eq!(f.gen(), Some(3));
        let g = PageFlags::new(7, PageType::Anon, 1);
        g.set_fresh();
        assert_eq!(g.update_gen(3, false), Some((1, true)));
    }
}
