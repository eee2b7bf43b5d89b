//! The per-page flags word: generation, reference count and flags, updated with compare-and-swap
//! (the kernel's `folio->flags` with `LRU_GEN_MASK`, `LRU_REFS_MASK`, `PG_referenced`,
//! `PG_workingset`).
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
//!
//! Every update is one CAS loop on the whole word, so a promotion by the aging walk
//! ([`PageFlags::update_gen`]), an access counted through the descriptor path
//! ([`PageFlags::inc_refs`]) and the protection of a page by eviction ([`PageFlags::inc_gen`])
//! never lose each other's effect. Each generation change returns the old generation, so the
//! caller can account the move in a batch of per-generation count deltas ([`GenBatch`]).

use crate::sync::{AtomicU32, Ordering};
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
const REFS_FLAGS: u64 = REFERENCED | WORKINGSET;

/// The tier of a page with `refs` accesses beyond the first (the kernel's `lru_tier_from_refs`:
/// `order_base_2(refs + 1)`): 0 → tier 0, 1 → tier 1, 2..=3 → tier 2, 4 → tier 3.
pub(crate) fn tier_from_refs(refs: usize) -> usize {
    let n = refs + 1;
    // order_base_2(n) = ceil(log2(n)).
    (usize::BITS - (n - 1).leading_zeros()) as usize
}

/// The atomic flags word of one page.
#[derive(Debug)]
pub struct PageFlags(AtomicU32);

impl PageFlags {
    /// A page on the list of generation `gen`, with no references.
    pub fn new(gen: usize) -> Self {
        Self(AtomicU32::new(((gen as u32) + 1) << GEN_SHIFT))
    }

    // The word is 32 bits (8 are used), computed on as u64: a node stays at 24 bytes.
    fn load(&self) -> u64 {
        u64::from(self.0.load(Ordering::Acquire))
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

    #[cfg(test)]
    pub(crate) fn is_referenced(&self) -> bool {
        self.load() & REFERENCED != 0
    }

    #[cfg(test)]
    pub(crate) fn is_workingset(&self) -> bool {
        self.load() & WORKINGSET != 0
    }

    fn update(&self, mut f: impl FnMut(u64) -> Option<u64>) -> u64 {
        let mut old = self.load();
        loop {
            let Some(new) = f(old) else { return old };
            let new = u32::try_from(new).expect("page flags fit in 32 bits");
            match self
                .0
                .compare_exchange_weak(old as u32, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return old,
                Err(cur) => old = u64::from(cur),
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

    #[test]
    fn tiers_follow_order_base_2() {
        let tiers: Vec<usize> = (0..=4).map(tier_from_refs).collect();
        assert_eq!(tiers, vec![0, 1, 2, 2, 3]);
    }

    #[test]
    fn inc_refs_walks_referenced_workingset_then_counts() {
        let f = PageFlags::new(1);
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
        let f = PageFlags::new(0);
        f.inc_refs();
        f.inc_refs();
        assert_eq!(f.update_gen(3, true), Some((0, true)));
        assert_eq!((f.gen(), f.refs(), f.is_referenced()), (Some(3), 0, false));
        // Promoted meanwhile: inc_gen keeps the newer generation.
        assert_eq!(f.inc_gen(0, 1), (Some(3), 3));
        let g = PageFlags::new(0);
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
        let f = PageFlags::new(1);
        f.set_fresh();
        assert_eq!(f.update_gen(3, true), Some((1, false)));
        assert_eq!(f.gen(), Some(1));
        assert_eq!(f.update_gen(3, true), Some((1, true)));
        assert_eq!(f.gen(), Some(3));
        let g = PageFlags::new(1);
        g.set_fresh();
        assert_eq!(g.update_gen(3, false), Some((1, true)));
    }
}
