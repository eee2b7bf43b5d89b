//! The multi-generational LRU itself: generations, tiers, the aging walk, eviction with the PID
//! controller, and workingset (shadow entry) detection. Names follow `mm/vmscan.c` (v6.1).

use std::collections::VecDeque;
use std::ops::Range;

use crate::bloom::{BloomFilter, DENSE_FRACTION};
use crate::flags::{tier_from_refs, GenBatch, PageFlags, MAX_PAGE_ID, REFS_WIDTH};
use crate::list::{IdMap, Keyed, Linked, Links, ListHead, Slab};
use crate::policy::{AccessKind, AccessSource, Arrival, Hint, PageId, PageType, Policy};
use crate::{Error, MAX_NR_GENS, MAX_NR_TIERS, MIN_LRU_BATCH, MIN_NR_GENS};

/// Pages scanned from the oldest generation in one batch before the type and tier are chosen
/// again (the kernel's `MAX_LRU_BATCH` is 4096 but it reconsiders once per `evict_folios`).
const SCAN_BATCH: usize = MIN_LRU_BATCH;

/// The default [`Config::eviction_aging`].
const DEFAULT_EVICTION_AGING: u32 = 8;

/// The default [`Config::loop_eviction`]: loop mode while probation's victims come back at
/// least 5/8 of the time.
const DEFAULT_LOOP_EVICTION: u32 = 5;

/// The default [`Config::loop_order`]: loop mode while at most 1/8 of probation's recent
/// refaults come back out of eviction order.
const DEFAULT_LOOP_ORDER: u32 = 1;

/// The default [`Config::loop_window`]: loop mode also while probation's victims come back
/// within 3 memories' worth of evictions at least [`LOOP_WINDOW_EIGHTHS`]/8 of the time, in
/// order.
const DEFAULT_LOOP_WINDOW: u32 = 3;

/// The rate loop mode's long window needs, in eighths.
const LOOP_WINDOW_EIGHTHS: u32 = 7;

/// Loop mode's refaults waiting to be evicted are at most this share of the resident pages
/// (plus [`MIN_LRU_BATCH`]); the oldest are forgotten first.
const LOOP_VICTIMS_FRACTION: usize = 8;

/// A walk finds the protected pages (all generations but the oldest) idle when it finds fewer
/// young pages than this share of them; the eviction clock then runs until a walk finds more.
const IDLE_FRACTION: (u64, u64) = (1, 4);

/// [`Config::idle_youngest_demotion`]: the youngest generation is idle when a walk finds fewer
/// than `1/IDLE_YOUNGEST` of its pages young...
const IDLE_YOUNGEST: u64 = 256;
/// ... and it is considered only when it holds at least `1/IDLE_YOUNGEST_MIN` of the pages.
const IDLE_YOUNGEST_MIN: u64 = 16;

/// Where a freshly faulted page starts (the question debated in the seed review).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPlacement {
    /// The youngest generation, `max_seq` (what v6.1 does: `folio_add_lru` marks a page added
    /// in a fault `PG_active`, and `lru_gen_add_folio` puts active pages in `max_seq`).
    Youngest,
    /// The second-oldest generation, `min_seq + 1` (what the groundwork patch did for anon
    /// pages not yet in the swap cache, and where v6.1 puts inactive anon pages outside
    /// faults).
    SecondOldest,
    /// The young end of the oldest generation, `min_seq` (where v6.1's `lru_gen_add_folio`
    /// puts clean inactive pages; the classic lists' inactive head, where anon pages start
    /// since v5.9). With [`Config::look_twice`], if the eviction-time check is the first to
    /// see the fault's own accessed bit, the page gets one more generation; if the walk or a
    /// look-around saw it first, the page goes with the oldest generation unless accessed
    /// again. A page accessed again is promoted by the walk or the check like any other. The
    /// default (a deviation from v6.1, see the crate documentation).
    Oldest,
}

/// The knobs of [`Mglru`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Most generations alive at once, 3 or 4 (the kernel's `MAX_NR_GENS` is 4; at least
    /// `MIN_NR_GENS = 2` are always alive, and a third is needed to hold the pages the aging
    /// finds young while the two oldest are evicted).
    pub max_nr_gens: usize,
    /// 0..=200: the weight of anon against file pages (`vm.swappiness`); 0 evicts no anon page.
    pub swappiness: u32,
    /// Where faulted pages start.
    pub fault_placement: FaultPlacement,
    /// log2 of the pages in one region of the aging walk (9: 512 pages, a PMD of 4 KiB pages).
    pub region_shift: u32,
    /// Whether the aging walk skips regions that were not dense in the previous walk.
    pub bloom_filter: bool,
    /// Whether the eviction-time check of a page also tests and promotes its neighbours
    /// (`lru_gen_look_around`), or only the page itself.
    pub look_around: bool,
    /// Most shadow entries kept; the oldest are dropped first.
    pub max_shadows: usize,
    /// Whether the first accessed bit seen on a faulted page is taken as the fault's own access
    /// rather than a reuse: the page is not promoted for it (the walk clears it and leaves the
    /// page where it is; the eviction-time check gives it one more generation). This is the
    /// "look twice" rule of `folio_check_references` ("all mapped folios start out with page
    /// table references from the instantiating fault"), which v6.1's MGLRU bypasses (its
    /// look-around marks the folio under check referenced, so the check activates it). On by
    /// default (a deviation from v6.1, see the crate documentation). A recent refault is not
    /// fresh: it has a history, and its first accessed bit counts as a reuse.
    pub look_twice: bool,
    /// Generations of refault distance within which a refault counts as recent (feeds the
    /// controller and comes back in the workingset). 0, the kernel's rule, counts only pages
    /// evicted from the generation that is still the oldest.
    pub refault_window: u64,
    /// Whether the aging also runs when more than `MIN_NR_GENS + 1` generations are alive but
    /// the youngest holds more than `1 / MIN_NR_GENS` of the pages (`should_run_aging`'s bound
    /// on hot pages, which v6.1 checks only with exactly `MIN_NR_GENS + 1` generations). With
    /// faulted pages starting in the oldest generation, that generation is refilled as fast as
    /// it is evicted, `min_seq` rarely moves and v6.1's rule would stop aging: pages promoted
    /// once would stay in the young generations however cold they became. On by default (a
    /// deviation from v6.1, see the crate documentation).
    pub young_bound_aging: bool,
    /// The eviction clock for idle protected pages: when the last aging walk found fewer young
    /// pages than a quarter of the pages outside the oldest generation (the protected ones),
    /// the aging also runs once the pages evicted since the last aging reach
    /// `1 / eviction_aging` of the resident pages, until a walk finds them used again (0: off,
    /// as in v6.1). With faulted pages starting in the oldest generation, that generation is
    /// refilled as fast as it is evicted and `min_seq` stands still, so without it a hot set
    /// that stopped being used (the workload moved to other pages) keeps the young
    /// generations until the young bound fires, while the new hot set is churned through the
    /// oldest. A walk that finds most protected pages used (a loop, a stable hot set) stops
    /// the clock, so their protection lasts as before, and so does
    /// [`Config::demotion_feedback`] while the pages the clock demoted keep coming back. 8 by
    /// default (a deviation from v6.1, see the crate documentation).
    pub eviction_aging: u32,
    /// Whether the eviction clock ([`Config::eviction_aging`]) is held back while the victims
    /// that had been promoted for a reuse (demoted by the aging, then evicted) come back more
    /// often than the victims never promoted since they were added (probation's): a
    /// refault rate per kind of victim over about a memory's worth of evictions, compared as
    /// the PID controller compares tiers (`positive_ctrl_err`, gains 1:1). The clock demotes
    /// protected pages that a walk found idle; when demoted pages keep coming back, they were
    /// in use (their reuse period is longer than the walks', or the access source shows no
    /// reuse at all, as the daemon's `--access faults`), and demoting more of them costs
    /// faults. After a move the demoted pages do not come back, and the clock runs. On by
    /// default (part of the fourth deviation from v6.1; v6.1 has no clock).
    pub demotion_feedback: bool,
    /// Loop mode, in eighths (0: off, as in v6.1): while probation's victims (pages never
    /// promoted since they were added) come back within a memory's worth of evictions at
    /// least `loop_eviction / 8` of the time, the working set is larger than memory and its
    /// pages are reused in about the order they were used (a loop): every page evicted is
    /// needed again, so what matters is which pages stay. A refault of a probation victim
    /// within that window then gets no protection (no `workingset`, not counted as a recent
    /// refault) and is the next victim, the most recent first, instead of pushing out the
    /// pages already resident. The resident set stays put and each round of the loop misses
    /// only the pages beyond memory, as LIRS keeps its LIR set on a loop (Jiang and Zhang,
    /// SIGMETRICS 2002: a new block whose reuse distance exceeds the LIR set's recency stays
    /// HIR, and LIRS evicts resident HIR blocks first). The victims come from the eviction's
    /// scan otherwise. 5 by default (a deviation from v6.1, see the crate documentation).
    pub loop_eviction: u32,
    /// Idle youngest demotion (off in v6.1): when an aging walk finds fewer than 1/256 of the
    /// pages of the youngest generation young (and that generation holds at least 1/16 of the
    /// resident pages), the pages of it the walk did not find young move to the young end of
    /// the oldest generation at once, instead of sinking one generation per aging. The
    /// eviction-time check still promotes any of them used since the walk (their first bit is
    /// a reuse: they are not fresh). Not while [`Config::demotion_feedback`] holds the eviction
    /// clock back (the pages demoted before came back), nor for pages in regions the walk
    /// skipped (the bloom filter: their bits were not tested). Pages promoted once and then
    /// not used again before the next walk are what a loop over more than a memory leaves in
    /// the youngest generation; they kept a quarter to a half of memory from the pages the
    /// loop reuses next. On by default (a deviation from v6.1, see the crate documentation).
    pub idle_youngest_demotion: bool,
    /// The order test of loop mode, in eighths (0: off, as in v6.1 and before 2026-11-27):
    /// loop mode ([`Config::loop_eviction`]) also needs probation's victims to come back in
    /// about the order they were evicted, at most `loop_order / 8` of their recent refaults
    /// evicted in an earlier eviction epoch (1/8 of memory evicted) than the refault before.
    /// A loop brings its pages back in the order it evicted them (none out of order); a
    /// skewed working set larger than memory brings back as many of probation's victims (a
    /// Zipf(1.0) set of 5,000 pages at 3,000: four fifths of them within a memory's worth of
    /// evictions) but in no order (two fifths out of order), and loop mode there evicts the
    /// pages that were just shown to be reused. 1 by default (a refinement of the fifth deviation from
    /// v6.1, see the crate documentation).
    pub loop_order: u32,
    /// Loop mode's long window, in memories' worth of evictions (0 or 1: off, as in v6.1 and
    /// before 2026-11-27): loop mode ([`Config::loop_eviction`]) also holds while at least
    /// 7/8 of probation's victims come back within this many memories' worth of evictions,
    /// with the order test of [`Config::loop_order`] (which this needs: off without it), and
    /// such a refault is then the next victim. A loop over two or three times memory brings
    /// its victims back after more than one memory's worth of evictions, which the rate over
    /// one memory does not see; a skewed set brings many of its victims back within several
    /// memories too, but in no order. 3 by default (a refinement of the fifth deviation from
    /// v6.1, see the crate documentation).
    pub loop_window: u32,
    /// Refault-distance activation (off by default and in v6.1; measured in
    /// `docs/experiments/2026-11-28-mglru-phase6.md`): a refault whose distance, the pages
    /// evicted since its eviction, is at most the resident pages is placed in the youngest
    /// generation at once, with `workingset` (the test of the kernel's `workingset_refault`:
    /// with that much more memory the page would have stayed; here against all resident pages,
    /// the share a refault may challenge since v5.8), and every `1/8` of the resident pages
    /// so activated since the last aging also runs the aging, so the generations move with
    /// the activations as the classic active list is shrunk by them. The distance is counted in
    /// eviction epochs (`1/8` of memory), which shadow tokens carry, so both ways of keeping
    /// shadows decide alike. Loop mode's refaults are never activated. It forgets a hot set
    /// that comes back faster (a returning set refaults within a memory) but not one that
    /// moves to pages never seen (no shadows), and periodic scans over less than a memory
    /// refault within the distance too: off by default, since it loses overall.
    pub refault_activation: bool,
}

impl Default for Config {
    /// The kernel's design with six deviations: faulted pages start in the oldest generation
    /// ([`FaultPlacement::Oldest`]) and their first accessed bit is the fault's own
    /// ([`Config::look_twice`]), so a faulted page earns its protection by a second access;
    /// and the aging's bound on the youngest generation applies with any number of
    /// generations ([`Config::young_bound_aging`]), so the aging does not stop while faults
    /// refill the oldest generation; and while a walk finds the protected generations idle,
    /// the aging also runs per eighth of memory evicted ([`Config::eviction_aging`]), so a hot
    /// set that moved is forgotten, unless the pages it demotes come back more than
    /// probation's victims ([`Config::demotion_feedback`]); loop mode
    /// ([`Config::loop_eviction`], with its order test, [`Config::loop_order`], and long
    /// window, [`Config::loop_window`]); and a youngest generation an aging walk finds idle is
    /// demoted at once ([`Config::idle_youngest_demotion`]). Everything else (4 generations,
    /// swappiness 60, PMD regions, bloom filter, look-around, the kernel's refault rule) is
    /// v6.1's.
    /// [`Config::v6_1`] is the v6.1 rules unchanged.
    fn default() -> Self {
        Self {
            fault_placement: FaultPlacement::Oldest,
            look_twice: true,
            young_bound_aging: true,
            eviction_aging: DEFAULT_EVICTION_AGING,
            demotion_feedback: true,
            loop_eviction: DEFAULT_LOOP_EVICTION,
            idle_youngest_demotion: true,
            loop_order: DEFAULT_LOOP_ORDER,
            loop_window: DEFAULT_LOOP_WINDOW,
            ..Self::v6_1()
        }
    }
}

impl Config {
    /// The v6.1 rules: faulted pages start in the youngest generation and their fault's
    /// accessed bit counts as a reuse (the walk or the eviction-time check promotes them).
    pub fn v6_1() -> Self {
        Self {
            max_nr_gens: MAX_NR_GENS,
            swappiness: 60,
            fault_placement: FaultPlacement::Youngest,
            region_shift: 9,
            bloom_filter: true,
            look_around: true,
            max_shadows: 1 << 20,
            look_twice: false,
            refault_window: 0,
            young_bound_aging: false,
            eviction_aging: 0,
            demotion_feedback: false,
            loop_eviction: 0,
            idle_youngest_demotion: false,
            loop_order: 0,
            loop_window: 0,
            refault_activation: false,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |field, value: u64, allowed| {
            Err(Error::InvalidConfig {
                field,
                value,
                allowed,
            })
        };
        if !(MIN_NR_GENS + 1..=MAX_NR_GENS).contains(&self.max_nr_gens) {
            return bad("max_nr_gens", self.max_nr_gens as u64, "3..=4");
        }
        if self.swappiness > 200 {
            return bad("swappiness", u64::from(self.swappiness), "0..=200");
        }
        if self.loop_eviction > 8 {
            return bad("loop_eviction", u64::from(self.loop_eviction), "0..=8");
        }
        if self.loop_order > 8 {
            return bad("loop_order", u64::from(self.loop_order), "0..=8");
        }
        if self.loop_window > 64 {
            return bad("loop_window", u64::from(self.loop_window), "0..=64");
        }
        if self.refault_window > MAX_NR_GENS as u64 {
            return bad("refault_window", self.refault_window, "0..=4");
        }
        if self.region_shift > 30 {
            return bad("region_shift", u64::from(self.region_shift), "0..=30");
        }
        Ok(())
    }
}

/// What the embedder learns about a page coming back (`lru_gen_test_recent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refault {
    /// The page's type at eviction.
    pub page_type: PageType,
    /// The tier the page was evicted from.
    pub tier: usize,
    /// Generations between its eviction and now: `min_seq` now minus `min_seq` at eviction.
    pub distance: u64,
    /// Whether it counts for the controller and the workingset: `distance` at most
    /// [`Config::refault_window`] (0 by default: evicted from the generation that is still the
    /// oldest, as in the kernel).
    pub recent: bool,
}

/// Counters of one type and tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Pages evicted from this tier.
    pub evicted: u64,
    /// Recent refaults of pages evicted from this tier.
    pub refaulted: u64,
    /// Pages of this tier moved to the next generation at eviction (tier protection).
    pub protected: u64,
    /// Pages of this tier promoted to the youngest generation by the aging walk or a
    /// look-around.
    pub promoted: u64,
}

/// Pages of one generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerationStats {
    /// The generation's sequence number.
    pub seq: u64,
    /// Pages by type (`[anon, file]`); exact once batches are applied (after every call).
    pub pages: [u64; 2],
    /// Pages evicted from it, by type.
    pub evicted: [u64; 2],
    /// Recent refaults counted while it was the oldest generation (the kernel's `refaulted`
    /// per history generation), by type.
    pub refaulted: [u64; 2],
    /// Pages moved into it by the aging walk, look-arounds, activation or tier protection, by
    /// type.
    pub promoted: [u64; 2],
}

/// One aging walk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalkStats {
    /// `max_seq` the walk aged (the new generation is `seq + 1`).
    pub seq: u64,
    /// Regions tested through the access source.
    pub regions_scanned: u64,
    /// Regions skipped because the bloom filter did not hold them.
    pub regions_skipped: u64,
    /// Resident pages in the scanned regions (the cost of the walk).
    pub pages_scanned: u64,
    /// Pages found young (promoted, or with `look_twice` a fresh page's first bit cleared).
    pub young: u64,
    /// Wall time of the walk in nanoseconds (the walk alone, not the drain of the oldest
    /// generation that `inc_max_seq` may do after it). A measurement, not a machine-independent
    /// figure.
    pub nanos: u64,
}

/// A snapshot of the counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// The youngest generation.
    pub max_seq: u64,
    /// The oldest generation per type.
    pub min_seq: [u64; 2],
    /// Live generations, oldest first.
    pub generations: Vec<GenerationStats>,
    /// Per type and tier.
    pub tiers: [[TierStats; MAX_NR_TIERS]; 2],
    /// Aging walks done.
    pub walks: u64,
    /// Sums over all walks.
    pub walk_totals: WalkStats,
    /// The last walk.
    pub last_walk: WalkStats,
    /// Pages found young by the eviction-time check and moved to the youngest generation.
    pub activated: u64,
    /// Neighbours promoted by look-arounds (not counting the checked page).
    pub look_around_promoted: u64,
    /// Pages evicted.
    pub evicted: u64,
    /// Pages added that had a shadow entry (recent or not).
    pub refaults: u64,
    /// The aging controller's window: victims never promoted since they were added
    /// (probation) and victims that had been (demoted), `[probation, demoted]`, halved every
    /// memory's worth of evictions.
    pub aging_evicted: [u64; 2],
    /// Refaults within a memory's worth of evictions of the victims counted in
    /// `aging_evicted`, `[probation, demoted]`.
    pub aging_refaulted: [u64; 2],
    /// Of probation's refaults in that window, those that came back in eviction order and
    /// out of it ([`Config::loop_order`]).
    pub refault_order: [u64; 2],
    /// Pages moved to the oldest generation by [`Config::idle_youngest_demotion`].
    pub idle_demoted: u64,
    /// Refaults placed in the youngest generation by [`Config::refault_activation`].
    pub refault_activated: u64,
}

#[derive(Debug, Clone, Copy)]
struct Shadow {
    seq: u64,
    /// The eviction epoch it was evicted in (see [`AgingCtrl`]).
    epoch: u64,
    /// Whether it had been promoted for a reuse since it was added (a demotion's victim).
    reused: bool,
    /// Which FIFO slot is this entry's (wrapping; the FIFO holds far fewer than 2^32).
    stamp: u32,
    page_type: PageType,
    refs: u8,
}

/// A resident page: its word (flags, list generation, type and id; see [`crate::flags`]) and
/// its links on the list of its list generation.
#[derive(Debug)]
struct Node {
    word: PageFlags,
    links: Links,
}

impl Node {
    fn page(&self) -> PageId {
        self.word.page()
    }

    /// The generation whose list the node is on (its flags may already say a younger one).
    fn list_gen(&self) -> usize {
        self.word.list_gen()
    }

    fn page_type(&self) -> PageType {
        self.word.page_type()
    }
}

impl Keyed for Node {
    fn page(&self) -> PageId {
        // The id bits of the word never change while the node lives, and the node reached
        // this thread through the LRU's owner: a Relaxed load of them is exact (see
        // `PageFlags::page`).
        self.word.page()
    }
}

/// Bits of a shadow token ([`Mglru::take_shadow`]): the page type, its references (3 bits),
/// whether it had been promoted for a reuse, the low 12 bits of its eviction epoch and the low
/// 11 bits of the generation it was evicted from.
pub const SHADOW_TOKEN_BITS: u32 = 28;
const TOKEN_EPOCH_BITS: u32 = 12;
const TOKEN_SEQ_BITS: u32 = SHADOW_TOKEN_BITS - 5 - TOKEN_EPOCH_BITS;
const TOKEN_EPOCH_SHIFT: u32 = 5;
const TOKEN_SEQ_SHIFT: u32 = TOKEN_EPOCH_SHIFT + TOKEN_EPOCH_BITS;

/// Eviction epochs per memory's worth of evictions (an epoch ends when the pages evicted in it
/// reach `1 / EPOCHS_PER_TURNOVER` of the resident pages).
const EPOCHS_PER_TURNOVER: u64 = 8;

/// Refaults within this many epochs (about one memory's worth of evictions, ARC's ghost lists)
/// count for the aging controller.
const CTRL_REFAULT_EPOCHS: u64 = EPOCHS_PER_TURNOVER;

/// The demotion feedback ([`Config::demotion_feedback`]): evictions and recent refaults of
/// victims never promoted since they were added (`[0]`, probation) and of victims that had
/// been (`[1]`, demoted). Probation's window is halved every memory's worth of evictions,
/// the demoted victims' every memory's worth of demoted victims (without demotions there is
/// no news about them, so what was learnt stays). Also the eviction epoch clock that
/// measures refault distances for it.
#[derive(Debug, Default, Clone)]
struct AgingCtrl {
    evicted: [u64; 2],
    refaulted: [u64; 2],
    epoch: u64,
    /// Evictions in the current epoch.
    in_epoch: u64,
    /// Probation's recent refaults that came back in eviction order and out of it (evicted
    /// in an earlier epoch than the refault before: [`Config::loop_order`]), halved with
    /// probation's window, and the eviction epoch of the last one.
    in_order: u64,
    out_of_order: u64,
    last_epoch: u64,
    /// Loop mode's long window ([`Config::loop_window`]) in epochs (0: none), and over it,
    /// halved once per window: probation's victims, their refaults, those in and out of
    /// eviction order, and the eviction epoch of the last one.
    far_epochs: u64,
    far_evicted: u64,
    far_refaulted: u64,
    far_in_order: u64,
    far_out_of_order: u64,
    far_last_epoch: u64,
}

impl AgingCtrl {
    fn on_evict(&mut self, reused: bool, len: usize) {
        self.evicted[usize::from(reused)] += 1;
        if !reused {
            self.far_evicted += 1;
        }
        self.in_epoch += 1;
        if self.in_epoch * EPOCHS_PER_TURNOVER >= len as u64 {
            self.in_epoch = 0;
            self.epoch += 1;
            if self.far_epochs > 0 && self.epoch % self.far_epochs == 0 {
                self.far_evicted /= 2;
                self.far_refaulted /= 2;
                self.far_in_order /= 2;
                self.far_out_of_order /= 2;
            }
            if self.epoch % EPOCHS_PER_TURNOVER == 0 {
                self.evicted[0] /= 2;
                self.refaulted[0] /= 2;
                self.in_order /= 2;
                self.out_of_order /= 2;
            }
        }
        // The demoted victims' window halves on their own turnover: no demotions, no news.
        if self.evicted[1] > len as u64 {
            self.evicted[1] /= 2;
            self.refaulted[1] /= 2;
        }
    }

    fn on_refault(&mut self, reused: bool, epoch: u64) {
        if self.far_epochs > 0 && !reused && self.is_far(epoch) {
            self.far_refaulted += 1;
            if epoch < self.far_last_epoch {
                self.far_out_of_order += 1;
            } else {
                self.far_in_order += 1;
            }
            self.far_last_epoch = epoch;
        }
        if self.is_near(epoch) {
            self.refaulted[usize::from(reused)] += 1;
            if !reused {
                if epoch < self.last_epoch {
                    self.out_of_order += 1;
                } else {
                    self.in_order += 1;
                }
                self.last_epoch = epoch;
            }
        }
    }

    /// Whether probation's victims come back within the window at least `eighths / 8` of the
    /// time (with at least `MIN_LRU_BATCH` of their refaults in the window): loop mode.
    ///
    /// With `order` > 0 (the order test, [`Config::loop_order`]), also at most `order / 8` of
    /// those refaults out of eviction order.
    /// Loop mode by the long window ([`Config::loop_window`]): probation's victims come back
    /// within it at least [`LOOP_WINDOW_EIGHTHS`]/8 of the time (at least `MIN_LRU_BATCH` of
    /// them) and at most `order / 8` of them out of eviction order; never without the order
    /// test (`order` 0).
    fn far_loop_mode(&self, order: u32) -> bool {
        self.far_epochs > 0
            && order > 0
            && self.far_out_of_order * 8
                <= (self.far_in_order + self.far_out_of_order) * u64::from(order)
            && self.far_refaulted >= MIN_LRU_BATCH as u64
            && self.far_refaulted * 8 >= self.far_evicted * u64::from(LOOP_WINDOW_EIGHTHS)
    }

    fn loop_mode(&self, eighths: u32, order: u32) -> bool {
        eighths > 0
            && (order == 0
                || self.out_of_order * 8 <= (self.in_order + self.out_of_order) * u64::from(order))
            && self.refaulted[0] >= MIN_LRU_BATCH as u64
            && self.refaulted[0] * 8 >= self.evicted[0] * u64::from(eighths)
    }

    /// Whether a victim of `epoch` is within loop mode's long window.
    fn is_far(&self, epoch: u64) -> bool {
        self.epoch.saturating_sub(epoch) <= self.far_epochs
    }

    fn is_near(&self, epoch: u64) -> bool {
        self.epoch.saturating_sub(epoch) <= CTRL_REFAULT_EPOCHS
    }

    /// Whether demoted victims come back more often than probation's (with at least
    /// `MIN_LRU_BATCH` of their refaults in the window): the eviction clock holds back.
    fn demoted_in_use(&self) -> bool {
        let pos = |k: usize| CtrlPos {
            refaulted: self.refaulted[k],
            total: self.evicted[k],
            gain: 1,
        };
        !positive_ctrl_err(pos(0), pos(1))
    }
}

// A node per resident page: keep it at two words (the daemon's metadata budget is 1% of the
// memory it manages, and the nodes are most of it).
#[cfg(not(mglru_loom))]
const _: () = assert!(std::mem::size_of::<Node>() == 16);

impl Linked for Node {
    fn links(&self) -> &Links {
        &self.links
    }
    fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }
}

/// The refault and eviction history the PID controller reads (`NR_HIST_GENS = 1`: the current
/// window plus an exponential moving average carried over when `min_seq` moves).
#[derive(Debug, Default, Clone)]
struct Ctrl {
    avg_refaulted: [[u64; MAX_NR_TIERS]; 2],
    avg_total: [[u64; MAX_NR_TIERS]; 2],
    refaulted: [[u64; MAX_NR_TIERS]; 2],
    evicted: [[u64; MAX_NR_TIERS]; 2],
    /// Indexed by `tier - 1`.
    protected: [[u64; MAX_NR_TIERS]; 2],
}

/// A set point or process variable of the controller (`struct ctrl_pos`).
#[derive(Debug, Clone, Copy)]
struct CtrlPos {
    refaulted: u64,
    total: u64,
    gain: u64,
}

impl Ctrl {
    fn read_pos(&self, ty: usize, tier: usize, gain: u64) -> CtrlPos {
        let mut total = self.avg_total[ty][tier] + self.evicted[ty][tier];
        if tier > 0 {
            total += self.protected[ty][tier - 1];
        }
        CtrlPos {
            refaulted: self.avg_refaulted[ty][tier] + self.refaulted[ty][tier],
            total,
            gain,
        }
    }

    /// Carries the window into the averages and clears it (`reset_ctrl_pos(.., true)`).
    fn carry_over(&mut self, ty: usize) {
        for tier in 0..MAX_NR_TIERS {
            self.avg_refaulted[ty][tier] =
                (self.avg_refaulted[ty][tier] + self.refaulted[ty][tier]) / 2;
            let mut sum = self.avg_total[ty][tier] + self.evicted[ty][tier];
            if tier > 0 {
                sum += self.protected[ty][tier - 1];
            }
            self.avg_total[ty][tier] = sum / 2;
            self.refaulted[ty][tier] = 0;
            self.evicted[ty][tier] = 0;
            if tier > 0 {
                self.protected[ty][tier - 1] = 0;
            }
        }
    }
}

/// True if the process variable has few refaults or a refault rate not above the set point's
/// (`positive_ctrl_err`): its pages may be evicted.
fn positive_ctrl_err(sp: CtrlPos, pv: CtrlPos) -> bool {
    let b = MIN_LRU_BATCH as u128;
    (pv.refaulted as u128) < b
        || pv.refaulted as u128 * (sp.total as u128 + b) * sp.gain as u128
            <= (sp.refaulted as u128 + 1) * pv.total as u128 * pv.gain as u128
}

/// Whether the nodes can hold `page` (52 bits of id, see [`crate::flags`]).
fn check_page_id(page: PageId) -> Result<(), Error> {
    if page > MAX_PAGE_ID {
        return Err(Error::PageIdTooLarge {
            page,
            max: MAX_PAGE_ID,
        });
    }
    Ok(())
}

/// The outcome of the eviction-time check of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Not accessed: evict.
    Cold,
    /// Accessed: promoted to the youngest generation.
    Young,
    /// The first accessed bit of a fresh page, with `look_twice`: one more generation.
    FirstReference,
}

/// The multi-generational LRU over page ids. See the crate documentation.
///
/// Page ids are at most [`MAX_PAGE_ID`] (`2^52 - 1`): a node is 16 bytes, the page's flags
/// word holding the id in its upper 52 bits. Larger ids are rejected by [`Mglru::add`] and
/// [`Mglru::add_refault`].
#[derive(Debug)]
pub struct Mglru {
    cfg: Config,
    slab: Slab<Node>,
    lists: [[ListHead; 2]; MAX_NR_GENS],
    /// Pages per generation index and type by the generation in their flags.
    nr_pages: [[i64; 2]; MAX_NR_GENS],
    max_seq: u64,
    min_seq: [u64; 2],
    ctrl: Ctrl,
    filters: [BloomFilter; 2],
    /// Which `seq` each filter was reset for (`None`: never; the walk then scans everything).
    filter_seq: [Option<u64>; 2],
    /// Resident pages per region.
    regions: IdMap<u32>,
    shadows: IdMap<Shadow>,
    shadow_fifo: VecDeque<(PageId, u32)>,
    next_stamp: u32,
    tiers: [[TierStats; MAX_NR_TIERS]; 2],
    /// Per generation index and type, reset when the index is reused.
    gen_evicted: [[u64; 2]; MAX_NR_GENS],
    gen_refaulted: [[u64; 2]; MAX_NR_GENS],
    gen_promoted: [[u64; 2]; MAX_NR_GENS],
    walks: u64,
    walk_totals: WalkStats,
    last_walk: WalkStats,
    activated: u64,
    look_around_promoted: u64,
    evicted: u64,
    /// `evicted` when `max_seq` last moved (the eviction clock's origin).
    evicted_at_aging: u64,
    /// Whether the last walk found most protected pages idle (the eviction clock runs fast).
    aging_fast: bool,
    aging_ctrl: AgingCtrl,
    /// Loop mode's refaults, the next victims, most recent last ([`Config::loop_eviction`]).
    loop_victims: VecDeque<PageId>,
    /// Pages moved to the oldest generation by [`Config::idle_youngest_demotion`].
    idle_demoted: u64,
    /// Refaults placed in the youngest generation by [`Config::refault_activation`].
    refault_activated: u64,
    /// Of those, since `max_seq` last moved.
    activated_since_aging: u64,

    refaults: u64,
}

impl Mglru {
    /// A new, empty LRU.
    pub fn new(cfg: Config) -> Result<Self, Error> {
        cfg.validate()?;
        let far_epochs = if cfg.loop_window > 1 {
            u64::from(cfg.loop_window) * EPOCHS_PER_TURNOVER
        } else {
            0
        };
        Ok(Self {
            // As lru_gen_init_lruvec: max_seq starts so that every generation index is live.
            max_seq: (cfg.max_nr_gens - 1) as u64,
            min_seq: [0; 2],
            cfg,
            slab: Slab::default(),
            lists: Default::default(),
            nr_pages: [[0; 2]; MAX_NR_GENS],
            ctrl: Ctrl::default(),
            filters: [BloomFilter::new(), BloomFilter::new()],
            filter_seq: [None; 2],
            regions: IdMap::default(),
            shadows: IdMap::default(),
            shadow_fifo: VecDeque::new(),
            next_stamp: 0,
            tiers: Default::default(),
            gen_evicted: [[0; 2]; MAX_NR_GENS],
            gen_refaulted: [[0; 2]; MAX_NR_GENS],
            gen_promoted: [[0; 2]; MAX_NR_GENS],
            walks: 0,
            walk_totals: WalkStats::default(),
            last_walk: WalkStats::default(),
            activated: 0,
            look_around_promoted: 0,
            evicted: 0,
            evicted_at_aging: 0,
            aging_fast: false,
            aging_ctrl: AgingCtrl {
                far_epochs,
                ..AgingCtrl::default()
            },
            loop_victims: VecDeque::new(),
            idle_demoted: 0,
            refault_activated: 0,
            activated_since_aging: 0,
            refaults: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    fn gen(&self, seq: u64) -> usize {
        (seq % self.cfg.max_nr_gens as u64) as usize
    }

    /// The sequence number of generation index `gen` for type `ty` (within the live window).
    fn seq_of_gen(&self, ty: usize, gen: usize) -> u64 {
        let n = self.cfg.max_nr_gens as u64;
        let lo = self.min_seq[ty];
        let off = (gen as u64 + n - lo % n) % n;
        lo + off
    }

    fn can_swap(&self) -> bool {
        self.cfg.swappiness != 0
    }

    /// The youngest generation.
    pub fn max_seq(&self) -> u64 {
        self.max_seq
    }

    /// The oldest generation of a type.
    pub fn min_seq(&self, page_type: PageType) -> u64 {
        self.min_seq[page_type.idx()]
    }

    /// Resident pages.
    pub fn len(&self) -> usize {
        self.slab.len()
    }

    /// Whether no page is resident.
    pub fn is_empty(&self) -> bool {
        self.slab.len() == 0
    }

    /// Whether `page` is resident.
    pub fn contains(&self, page: PageId) -> bool {
        self.slab.get(page).is_some()
    }

    fn node(&self, page: PageId) -> Option<&Node> {
        self.slab.get(page).map(|i| &self.slab.nodes[i as usize])
    }

    /// The generation (sequence number) a resident page belongs to.
    pub fn generation(&self, page: PageId) -> Option<u64> {
        let n = self.node(page)?;
        let g = n.word.gen()?;
        Some(self.seq_of_gen(n.page_type().idx(), g))
    }

    /// The tier of a resident page (by its accesses through the descriptor path).
    pub fn tier(&self, page: PageId) -> Option<usize> {
        Some(self.node(page)?.word.tier())
    }

    /// Whether a resident page is in one of the two youngest generations (`lru_gen_is_active`).
    pub fn is_active(&self, page: PageId) -> Option<bool> {
        self.generation(page).map(|s| s + 1 >= self.max_seq)
    }

    /// Pages in generation `seq` of a type (0 outside the live window).
    pub fn nr_pages(&self, seq: u64, page_type: PageType) -> u64 {
        let ty = page_type.idx();
        if seq < self.min_seq[ty] || seq > self.max_seq {
            return 0;
        }
        self.nr_pages[self.gen(seq)][ty].max(0) as u64
    }

    /// Pages in the two youngest generations (the `Active(anon)`/`Active(file)` counters).
    pub fn nr_active(&self, page_type: PageType) -> u64 {
        self.nr_pages(self.max_seq, page_type)
            + self.nr_pages(self.max_seq.saturating_sub(1), page_type)
    }

    fn region_of(&self, page: PageId) -> u64 {
        page >> self.cfg.region_shift
    }

    fn region_range(&self, region: u64) -> Range<PageId> {
        let start = region << self.cfg.region_shift;
        let end = start.saturating_add(1 << self.cfg.region_shift);
        start..end
    }

    /// Adds a page. A page with a shadow entry is a refault: a recent one feeds the controller,
    /// and a faulted one (or one evicted at the top tier) comes back with `workingset` set,
    /// which puts it one tier up (`lru_gen_refault`).
    ///
    /// Page ids above [`MAX_PAGE_ID`] (`2^52 - 1`) are rejected with
    /// [`Error::PageIdTooLarge`], and the LRU is left as it was.
    pub fn add(&mut self, page: PageId, hint: Hint) -> Result<Option<Refault>, Error> {
        check_page_id(page)?;
        if self.contains(page) {
            return Err(Error::AlreadyResident(page));
        }
        let shadow = self.shadows.remove(&page);
        self.add_with(page, hint, shadow)
    }

    /// Takes the shadow entry of an evicted page out of the LRU, as a token of
    /// [`SHADOW_TOKEN_BITS`] bits for the embedder to keep where the page was (the kernel's
    /// `lru_gen_eviction` returns it for the page cache's or swap cache's slot), and give back
    /// to [`Mglru::add_refault`] when the page returns. `None` if it has none.
    pub fn take_shadow(&mut self, page: PageId) -> Option<u32> {
        let s = self.shadows.remove(&page)?;
        let seq = (s.seq & ((1 << TOKEN_SEQ_BITS) - 1)) as u32;
        let epoch = (s.epoch & ((1 << TOKEN_EPOCH_BITS) - 1)) as u32;
        Some(
            (seq << TOKEN_SEQ_SHIFT)
                | (epoch << TOKEN_EPOCH_SHIFT)
                | (u32::from(s.reused) << 4)
                | (u32::from(s.refs) << 1)
                | s.page_type.idx() as u32,
        )
    }

    /// [`Mglru::add`] for a page whose shadow entry the embedder kept (a token from
    /// [`Mglru::take_shadow`]; the kernel's `lru_gen_refault`). The generation it was evicted
    /// from is known modulo 2^11 generations and its eviction epoch (for
    /// [`Config::demotion_feedback`]) modulo 2^12 epochs of 1/8 of memory evicted: a refault
    /// further back than that may be taken for a nearer one (a very old one for a recent one
    /// with a probability of about 1/2048 for the workingset rule and 9/4096 for the
    /// feedback). Page ids above [`MAX_PAGE_ID`] are rejected as by [`Mglru::add`].
    pub fn add_refault(
        &mut self,
        page: PageId,
        hint: Hint,
        token: u32,
    ) -> Result<Option<Refault>, Error> {
        check_page_id(page)?;
        if self.contains(page) {
            return Err(Error::AlreadyResident(page));
        }
        self.shadows.remove(&page);
        let page_type = PageType::from_idx((token & 1) as usize);
        let mask = (1u64 << TOKEN_SEQ_BITS) - 1;
        let min = self.min_seq[page_type.idx()];
        let distance = min.wrapping_sub(u64::from(token >> TOKEN_SEQ_SHIFT)) & mask;
        let epoch_mask = (1u64 << TOKEN_EPOCH_BITS) - 1;
        let epoch_token = u64::from(token >> TOKEN_EPOCH_SHIFT) & epoch_mask;
        let epochs = self.aging_ctrl.epoch.wrapping_sub(epoch_token) & epoch_mask;
        let shadow = Shadow {
            seq: min.saturating_sub(distance),
            epoch: self.aging_ctrl.epoch.saturating_sub(epochs),
            reused: token & (1 << 4) != 0,
            stamp: 0,
            page_type,
            refs: ((token >> 1) & 7) as u8,
        };
        self.add_with(page, hint, Some(shadow))
    }

    fn add_with(
        &mut self,
        page: PageId,
        hint: Hint,
        shadow: Option<Shadow>,
    ) -> Result<Option<Refault>, Error> {
        let ty = hint.page_type.idx();
        let mut workingset = false;
        let mut loop_victim = false;
        let mut activate = false;
        let refault = shadow.map(|shadow| {
            let rf = self.refault_of(&shadow);
            self.refaults += 1;
            self.aging_ctrl.on_refault(shadow.reused, shadow.epoch);
            // Loop mode: a probation victim back within a window whose test holds is the
            // next victim.
            let ctrl = &self.aging_ctrl;
            loop_victim = self.cfg.loop_eviction > 0
                && !shadow.reused
                && ((ctrl.is_near(shadow.epoch)
                    && ctrl.loop_mode(self.cfg.loop_eviction, self.cfg.loop_order))
                    || (ctrl.is_far(shadow.epoch) && ctrl.far_loop_mode(self.cfg.loop_order)));
            activate = self.cfg.refault_activation && !loop_victim && self.refault_is_near(&shadow);
            if (rf.recent || activate) && !loop_victim {
                let sty = shadow.page_type.idx();
                self.ctrl.refaulted[sty][rf.tier] += 1;
                self.tiers[sty][rf.tier].refaulted += 1;
                let oldest = self.gen(self.min_seq[sty]);
                self.gen_refaulted[oldest][sty] += 1;
                let in_fault = hint.arrival == Arrival::Fault;
                workingset = in_fault || usize::from(shadow.refs) == 1 << REFS_WIDTH;
            }
            rf
        });
        let seq = match hint.arrival {
            _ if activate => self.max_seq,
            Arrival::Active => self.max_seq,
            Arrival::Fault => match self.cfg.fault_placement {
                FaultPlacement::Youngest => self.max_seq,
                FaultPlacement::SecondOldest => (self.min_seq[ty] + 1).min(self.max_seq),
                FaultPlacement::Oldest => self.min_seq[ty],
            },
            Arrival::Sequential | Arrival::Cold => self.min_seq[ty],
        };
        let gen = self.gen(seq);
        // `add` and `add_refault` checked the id against MAX_PAGE_ID.
        let word = PageFlags::new(page, hint.page_type, gen);
        if workingset {
            word.set_workingset();
        }
        // A recent refault has a history: its first accessed bit is a reuse.
        if hint.arrival == Arrival::Fault && !workingset {
            word.set_fresh();
        }
        let i = self.slab.insert(
            page,
            Node {
                word,
                links: Links::default(),
            },
        );
        self.lists[gen][ty].push_head(&mut self.slab.nodes, i);
        self.nr_pages[gen][ty] += 1;
        *self.regions.entry(self.region_of(page)).or_insert(0) += 1;
        if activate {
            self.refault_activated += 1;
            self.activated_since_aging += 1;
        }
        if loop_victim {
            self.loop_victims.push_back(page);
            let most = self.len() / LOOP_VICTIMS_FRACTION + MIN_LRU_BATCH;
            while self.loop_victims.len() > most {
                self.loop_victims.pop_front();
            }
        }
        Ok(refault)
    }

    /// [`Config::refault_activation`]'s test: whether the pages evicted since the page's
    /// eviction, counted in whole eviction epochs of `1/8` of memory (what a shadow token
    /// carries), are at most the resident pages (`workingset_refault`'s refault distance
    /// against the workingset size). Within the current epoch or the last 8.
    fn refault_is_near(&self, shadow: &Shadow) -> bool {
        self.aging_ctrl.epoch.saturating_sub(shadow.epoch) <= EPOCHS_PER_TURNOVER
    }

    fn refault_of(&self, shadow: &Shadow) -> Refault {
        let min_seq = self.min_seq[shadow.page_type.idx()];
        Refault {
            page_type: shadow.page_type,
            tier: tier_from_refs(usize::from(shadow.refs)),
            distance: min_seq.saturating_sub(shadow.seq),
            recent: min_seq.saturating_sub(shadow.seq) <= self.cfg.refault_window,
        }
    }

    /// Whether a non-resident page was evicted and still has a shadow entry, and how far back
    /// (`lru_gen_test_recent`). Does not consume the entry: [`Mglru::add`] does.
    pub fn refault(&self, page: PageId) -> Option<Refault> {
        if self.contains(page) {
            return None;
        }
        self.shadows.get(&page).map(|s| self.refault_of(s))
    }

    /// Counts an access through the descriptor path (`folio_mark_accessed`): raises the page's
    /// tier. Lock-free on the page's flags word: callers may share `&self` across threads (see
    /// [`crate::SharedMglru`]). False if the page is not resident.
    pub fn mark_accessed(&self, page: PageId) -> bool {
        match self.node(page) {
            Some(n) => {
                n.word.inc_refs();
                true
            }
            None => false,
        }
    }

    /// Removes a resident page without a shadow entry (unmapped or freed). False if absent.
    pub fn remove(&mut self, page: PageId) -> bool {
        let Some(i) = self.slab.get(page) else {
            return false;
        };
        let n = &self.slab.nodes[i as usize];
        let ty = n.page_type().idx();
        let list_gen = n.list_gen();
        if let Some(g) = n.word.isolate() {
            self.nr_pages[g][ty] -= 1;
        }
        self.lists[list_gen][ty].unlink(&mut self.slab.nodes, i);
        self.slab.remove(page);
        self.dec_region(page);
        self.maybe_compact();
        true
    }

    /// Gives back the memory of a resident set that shrank: the nodes move down into the slots
    /// freed by removals and evictions, and the spare capacity is released. Nothing else
    /// changes (generations, tiers, list order, shadows). Removals and evictions do it on their
    /// own once free slots outnumber an eighth of the live nodes (and a thousand), so a policy whose
    /// pages went elsewhere (another address space, a smaller working set) does not keep its
    /// peak's memory.
    pub fn shrink_to_fit(&mut self) {
        let lists = &mut self.lists;
        self.slab.compact(|n, from, to| {
            lists[n.list_gen()][n.page_type().idx()].relocate(from, to);
        });
        self.regions.shrink_to_fit();
    }

    fn maybe_compact(&mut self) {
        if self.slab.should_compact() {
            self.shrink_to_fit();
        } else if self.regions.capacity() > 4 * self.regions.len() + 1024 {
            self.regions.shrink_to(2 * self.regions.len());
        }
    }

    fn dec_region(&mut self, page: PageId) {
        let r = self.region_of(page);
        if let Some(c) = self.regions.get_mut(&r) {
            *c -= 1;
            if *c == 0 {
                self.regions.remove(&r);
            }
        }
    }

    fn nr_evictable(&self) -> usize {
        if self.can_swap() {
            self.len()
        } else {
            (0..MAX_NR_GENS)
                .map(|g| self.lists[g][PageType::File.idx()].len())
                .sum()
        }
    }

    /// Makes a new generation now: walks the access source (skipping sparse regions if the
    /// bloom filter is on), promotes young pages to the current youngest generation, then
    /// increments `max_seq` (draining the oldest generation if all of them are in use).
    pub fn age(&mut self, source: &mut dyn AccessSource) -> WalkStats {
        self.try_to_inc_min_seq();
        self.walk(source);
        self.inc_max_seq();
        self.last_walk
    }

    /// The aging walk for `max_seq` (`walk_mm` over the regions of resident pages).
    fn walk(&mut self, source: &mut dyn AccessSource) {
        let start = std::time::Instant::now();
        let max_seq = self.max_seq;
        let new_gen = self.gen(max_seq);
        let next = ((max_seq + 1) % 2) as usize;
        let cur = (max_seq % 2) as usize;
        self.filters[next].clear();
        self.filter_seq[next] = Some(max_seq + 1);
        let use_filter = self.cfg.bloom_filter && self.filter_seq[cur] == Some(max_seq);

        // Pages the eviction does not reach yet: every generation but the oldest.
        let protected: u64 = (0..2)
            .flat_map(|ty| (self.min_seq[ty] + 1..=max_seq).map(move |seq| (ty, seq)))
            .map(|(ty, seq)| self.nr_pages[self.gen(seq)][ty].max(0) as u64)
            .sum();
        let mut regions: Vec<(u64, u32)> = self.regions.iter().map(|(&r, &c)| (r, c)).collect();
        regions.sort_unstable();
        let mut stats = WalkStats {
            seq: max_seq,
            ..WalkStats::default()
        };
        let mut batch = GenBatch::default();
        // Idle youngest demotion: the youngest generation's pages (per type) before the walk,
        // and those the walk finds young while they are few enough for it to be idle; the
        // regions the walk skips (their pages were not tested).
        let demote = self.cfg.idle_youngest_demotion;
        let youngest_before = self.nr_pages[new_gen].map(|c| c.max(0) as u64);
        let youngest_cap: u64 = youngest_before.iter().sum::<u64>() / IDLE_YOUNGEST;
        let mut youngest_young: Vec<u32> = Vec::new();
        let mut youngest_young_count = [0u64; 2];
        let mut skipped: Vec<u64> = Vec::new();
        for (region, resident) in regions {
            if use_filter && !self.filters[cur].contains(region) {
                stats.regions_skipped += 1;
                if demote {
                    skipped.push(region);
                }
                continue;
            }
            stats.regions_scanned += 1;
            stats.pages_scanned += u64::from(resident);
            let range = self.region_range(region);
            let mut young = 0usize;
            {
                let slab = &self.slab;
                let tiers = &mut self.tiers;
                let look_twice = self.cfg.look_twice;
                let youngest_young = &mut youngest_young;
                let youngest_young_count = &mut youngest_young_count;
                source.test_and_clear_young(range, &mut |p| {
                    if let Some(i) = slab.get(p) {
                        let n = &slab.nodes[i as usize];
                        let tier = n.word.tier();
                        if let Some((old, moved)) = n.word.update_gen(new_gen, look_twice) {
                            young += 1;
                            if demote && old == new_gen {
                                youngest_young_count[n.page_type().idx()] += 1;
                                // Past the cap the generation is not idle: no need to know.
                                if youngest_young.len() as u64 <= youngest_cap {
                                    youngest_young.push(i);
                                }
                            }
                            if moved {
                                batch.record(n.page_type().idx(), old, new_gen);
                                tiers[n.page_type().idx()][tier].promoted += 1;
                            }
                        }
                    }
                });
            }
            stats.young += young as u64;
            if self.cfg.bloom_filter && young * DENSE_FRACTION >= resident as usize {
                self.filters[next].insert(region);
            }
        }
        batch.apply(&mut self.nr_pages, &mut self.gen_promoted);
        self.aging_fast = stats.young * IDLE_FRACTION.1 < protected * IDLE_FRACTION.0;
        if demote {
            self.demote_idle_youngest(
                &youngest_before,
                &youngest_young_count,
                &youngest_young,
                &skipped,
            );
        }
        stats.nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.walks += 1;
        self.walk_totals.nanos = self.walk_totals.nanos.saturating_add(stats.nanos);
        self.walk_totals.seq = max_seq;
        self.walk_totals.regions_scanned += stats.regions_scanned;
        self.walk_totals.regions_skipped += stats.regions_skipped;
        self.walk_totals.pages_scanned += stats.pages_scanned;
        self.walk_totals.young += stats.young;
        self.last_walk = stats;
    }

    /// [`Config::idle_youngest_demotion`], after a walk: if the walk found fewer than
    /// `1/IDLE_YOUNGEST` of the youngest generation's pages young (of a type), the pages of it
    /// that it did not find young (`young`: the slots of those it did) and that are in regions
    /// it walked (`skipped`: sorted regions it did not) move to the young end of the oldest
    /// generation.
    fn demote_idle_youngest(
        &mut self,
        before: &[u64; 2],
        young_count: &[u64; 2],
        young: &[u32],
        skipped: &[u64],
    ) {
        if self.cfg.demotion_feedback && self.aging_ctrl.demoted_in_use() {
            return;
        }
        let g = self.gen(self.max_seq);
        let least = (self.len() as u64 / IDLE_YOUNGEST_MIN).max(MIN_LRU_BATCH as u64);
        let mut young_set: Option<std::collections::HashSet<u32>> = None;
        for ty in 0..2 {
            if before[ty] < least || young_count[ty] * IDLE_YOUNGEST >= before[ty] {
                continue;
            }
            let young_set = young_set.get_or_insert_with(|| young.iter().copied().collect());
            let oldest = self.gen(self.min_seq[ty]);
            if oldest == g {
                continue;
            }
            let idle: Vec<u32> = self.lists[g][ty]
                .iter(&self.slab.nodes)
                .filter(|&i| {
                    let n = &self.slab.nodes[i as usize];
                    n.word.gen() == Some(g)
                        && !young_set.contains(&i)
                        && skipped.binary_search(&self.region_of(n.page())).is_err()
                })
                .collect();
            for i in idle {
                // `inc_gen` moves the page only if its flags still name `g`, clearing its
                // references, as the drain of a generation does.
                let (old, new) = self.slab.nodes[i as usize].word.inc_gen(g, oldest);
                if old == Some(g) && new == oldest {
                    self.nr_pages[g][ty] -= 1;
                    self.nr_pages[oldest][ty] += 1;
                    self.idle_demoted += 1;
                    self.move_node(i, ty, g, oldest, true);
                }
            }
        }
    }

    /// `inc_max_seq`: opens a new youngest generation.
    fn inc_max_seq(&mut self) {
        for ty in [PageType::File.idx(), PageType::Anon.idx()] {
            if self.max_seq - self.min_seq[ty] + 1 == self.cfg.max_nr_gens as u64 {
                self.inc_min_seq(ty);
            }
        }
        self.max_seq += 1;
        self.evicted_at_aging = self.evicted;
        self.activated_since_aging = 0;
        // The new youngest reuses the index of a retired generation.
        let g = self.gen(self.max_seq);
        self.gen_evicted[g] = [0; 2];
        self.gen_refaulted[g] = [0; 2];
        self.gen_promoted[g] = [0; 2];
    }

    /// `inc_min_seq`: moves every page of the oldest generation to the next one (pages promoted
    /// meanwhile go to their own generation), then retires the oldest.
    fn inc_min_seq(&mut self, ty: usize) {
        let old_gen = self.gen(self.min_seq[ty]);
        // The kernel skips the drain of anon pages when they cannot be evicted and accepts the
        // cold/hot inversion; here they are always drained, so a list never holds pages whose
        // generation is older than the list's.
        {
            let next_gen = self.gen(self.min_seq[ty] + 1);
            // Youngest first onto the old end of `next_gen`, so the moved pages keep their
            // order and stay older than the pages already there.
            while let Some(i) = self.lists[old_gen][ty].head() {
                let n = &self.slab.nodes[i as usize];
                let (old, new) = n.word.inc_gen(old_gen, next_gen);
                if let Some(old) = old {
                    if old != new {
                        self.nr_pages[old][ty] -= 1;
                        self.nr_pages[new][ty] += 1;
                    }
                }
                self.lists[old_gen][ty].unlink(&mut self.slab.nodes, i);
                if new == next_gen {
                    self.lists[new][ty].push_tail(&mut self.slab.nodes, i);
                } else {
                    // Promoted meanwhile: to the young end of its own generation.
                    self.lists[new][ty].push_head(&mut self.slab.nodes, i);
                }
                self.slab.nodes[i as usize].word.set_list_gen(new);
            }
        }
        self.ctrl.carry_over(ty);
        self.min_seq[ty] += 1;
    }

    /// `try_to_inc_min_seq`: retires empty oldest generations. Keeps `min_seq[file] >=
    /// min_seq[anon]` when anon pages can be evicted.
    #[allow(clippy::needless_range_loop)] // several arrays indexed by type
    fn try_to_inc_min_seq(&mut self) -> bool {
        let can_swap = self.can_swap();
        let mut min_seq = self.min_seq;
        let first = usize::from(!can_swap);
        for (ty, seq) in min_seq.iter_mut().enumerate().skip(first) {
            while *seq + MIN_NR_GENS as u64 <= self.max_seq {
                if !self.lists[self.gen(*seq)][ty].is_empty() {
                    break;
                }
                *seq += 1;
            }
        }
        if can_swap {
            min_seq[0] = min_seq[0].min(min_seq[1]);
            min_seq[1] = min_seq[0].max(self.min_seq[1]);
        }
        let mut success = false;
        for ty in first..2 {
            if min_seq[ty] != self.min_seq[ty] {
                self.ctrl.carry_over(ty);
                self.min_seq[ty] = min_seq[ty];
                success = true;
            }
        }
        if success {
            self.prune_shadows();
        }
        success
    }

    /// `should_run_aging`: age when only `MIN_NR_GENS` generations are left, or when three are
    /// left but the youngest holds too many pages or the oldest too few. With
    /// [`Config::young_bound_aging`], the bound on the youngest generation applies whatever the
    /// number of generations.
    fn should_run_aging(&self) -> bool {
        let can_swap = self.can_swap();
        let min_seq = self.min_seq[usize::from(!can_swap)];
        let n = MIN_NR_GENS as u64;
        if min_seq + n > self.max_seq {
            return true;
        }
        // The eviction clock, while the last walk found the protected pages idle and the pages
        // it demoted do not come back more than probation's victims.
        let k = u64::from(self.cfg.eviction_aging);
        let held = self.cfg.demotion_feedback && self.aging_ctrl.demoted_in_use();
        if self.aging_fast
            && !held
            && k > 0
            && (self.evicted - self.evicted_at_aging) * k >= self.len() as u64
        {
            return true;
        }
        // Refault activation: an aging per 1/8 of memory activated.
        if self.cfg.refault_activation
            && self.activated_since_aging * EPOCHS_PER_TURNOVER >= self.len() as u64
        {
            return true;
        }
        if min_seq + n < self.max_seq && !self.cfg.young_bound_aging {
            return false;
        }
        let (mut young, mut old, mut total) = (0u64, 0u64, 0u64);
        for ty in usize::from(!can_swap)..2 {
            for seq in self.min_seq[ty]..=self.max_seq {
                let size = self.nr_pages[self.gen(seq)][ty].max(0) as u64;
                total += size;
                if seq == self.max_seq {
                    young += size;
                } else if seq + n == self.max_seq {
                    old += size;
                }
            }
        }
        if young * n > total {
            return true;
        }
        // The lower bound on the oldest generation only with exactly MIN_NR_GENS + 1 of them.
        min_seq + n == self.max_seq && old * (n + 2) < total
    }

    /// `get_tier_idx`: the highest tier whose refault rate does not exceed twice tier 0's; the
    /// tiers above it are protected.
    fn get_tier_idx(&self, ty: usize) -> usize {
        let sp = self.ctrl.read_pos(ty, 0, 1);
        let mut tier = 1;
        while tier < MAX_NR_TIERS {
            let pv = self.ctrl.read_pos(ty, tier, 2);
            if !positive_ctrl_err(sp, pv) {
                break;
            }
            tier += 1;
        }
        tier - 1
    }

    /// `get_type_to_scan`: compares tier 0 of anon and file weighted by swappiness, then the
    /// tiers of the chosen type against tier 0 of the other.
    fn get_type_to_scan(&self) -> (usize, usize) {
        let s = u64::from(self.cfg.swappiness);
        let gain = [s, 200 - s];
        let sp = self.ctrl.read_pos(0, 0, gain[0]);
        let pv = self.ctrl.read_pos(1, 0, gain[1]);
        let ty = usize::from(positive_ctrl_err(sp, pv));
        let sp = self.ctrl.read_pos(1 - ty, 0, gain[1 - ty]);
        let mut tier = 1;
        while tier < MAX_NR_TIERS {
            let pv = self.ctrl.read_pos(ty, tier, gain[ty]);
            if !positive_ctrl_err(sp, pv) {
                break;
            }
            tier += 1;
        }
        (ty, tier - 1)
    }

    /// Chooses up to `n` victims from the oldest generations (`lru_gen_shrink_lruvec`), aging
    /// when generations run low. Victims leave shadow entries. Returns fewer than `n` only when
    /// fewer pages are evictable (anon pages are not evictable with swappiness 0).
    pub fn evict(&mut self, n: usize, source: &mut dyn AccessSource) -> Vec<PageId> {
        let mut victims = Vec::with_capacity(n.min(self.len()));
        // Each page can be moved up at most a bounded number of times before it is evicted,
        // since nothing sets accessed bits or references meanwhile; the bound guards bugs.
        let mut budget = (self.len() as u64 + 1) * (MAX_NR_GENS + MAX_NR_TIERS + 4) as u64 * 4;
        let mut idle = 0;
        while victims.len() < n && self.nr_evictable() > 0 {
            if self.evict_loop_victim(&mut victims) {
                continue;
            }
            self.try_to_inc_min_seq();
            if self.should_run_aging() {
                self.walk(source);
                self.inc_max_seq();
            }
            let scanned = self.evict_batch(n, &mut victims, source);
            if scanned == 0 {
                idle += 1;
                if !self.try_to_inc_min_seq() {
                    self.walk(source);
                    self.inc_max_seq();
                }
                if idle > 4 * MAX_NR_GENS {
                    debug_assert!(false, "eviction made no progress");
                    break;
                }
            } else {
                idle = 0;
            }
            budget = budget.saturating_sub(scanned as u64 + 1);
            if budget == 0 {
                debug_assert!(false, "eviction scan budget exhausted");
                break;
            }
        }
        self.prune_shadows();
        self.maybe_compact();
        victims
    }

    /// Loop mode ([`Config::loop_eviction`]): evicts the most recent loop refault that is
    /// still in the oldest generation and was not promoted since, without the per-page check
    /// (its accessed bit is its own fault's). True if one was evicted.
    fn evict_loop_victim(&mut self, victims: &mut Vec<PageId>) -> bool {
        while let Some(page) = self.loop_victims.pop_back() {
            let Some(i) = self.slab.get(page) else {
                continue;
            };
            let n = &self.slab.nodes[i as usize];
            let ty = n.page_type().idx();
            let gen = self.gen(self.min_seq[ty]);
            if n.list_gen() != gen || n.word.gen() != Some(gen) {
                continue;
            }
            if ty == PageType::Anon.idx() && !self.can_swap() {
                continue;
            }
            self.evict_node(i, ty, gen);
            victims.push(page);
            return true;
        }
        false
    }

    /// `isolate_folios` + `evict_folios`: one batch from the oldest generation of the chosen
    /// type, the other type if that one has nothing, until `victims` holds `want` pages.
    /// Returns the pages scanned.
    fn evict_batch(
        &mut self,
        want: usize,
        victims: &mut Vec<PageId>,
        source: &mut dyn AccessSource,
    ) -> usize {
        let s = self.cfg.swappiness;
        let (anon, file) = (PageType::Anon.idx(), PageType::File.idx());
        let (mut ty, mut tier) = if s == 0 {
            (file, None)
        } else if self.min_seq[anon] < self.min_seq[file] {
            (anon, None)
        } else if s == 1 {
            (file, None)
        } else if s == 200 {
            (anon, None)
        } else {
            let (t, tier) = self.get_type_to_scan();
            (t, Some(tier))
        };
        for _ in usize::from(s == 0)..2 {
            let tier_idx = tier.unwrap_or_else(|| self.get_tier_idx(ty));
            let scanned = self.scan_oldest(ty, tier_idx, want, victims, source);
            if scanned > 0 {
                return scanned;
            }
            ty = 1 - ty;
            tier = None;
        }
        0
    }

    /// Scans the old end of the oldest generation of `ty`: sorts promoted pages to their
    /// generation, protects tiers above `tier_idx`, checks the rest for a young accessed bit and
    /// evicts the cold ones (`scan_folios` + `sort_folio` + `shrink_folio_list`).
    fn scan_oldest(
        &mut self,
        ty: usize,
        tier_idx: usize,
        want: usize,
        victims: &mut Vec<PageId>,
        source: &mut dyn AccessSource,
    ) -> usize {
        let gen = self.gen(self.min_seq[ty]);
        let next_gen = self.gen(self.min_seq[ty] + 1);
        let max_gen = self.gen(self.max_seq);
        let mut scanned = 0;
        let mut batch = GenBatch::default();
        while scanned < SCAN_BATCH && victims.len() < want {
            let Some(i) = self.lists[gen][ty].tail() else {
                break;
            };
            scanned += 1;
            let n = &self.slab.nodes[i as usize];
            let page = n.page();
            let fg = n.word.gen().unwrap_or(gen);
            // Promoted by the aging walk or a look-around: sort it to its generation.
            if fg != gen {
                self.move_node(i, ty, gen, fg, true);
                continue;
            }
            // Protected by its tier: one more generation, references cleared.
            let tier = n.word.tier();
            if tier > tier_idx {
                let (old, new) = n.word.inc_gen(gen, next_gen);
                if let Some(old) = old {
                    batch.record(ty, old, new);
                }
                self.ctrl.protected[ty][tier - 1] += 1;
                self.tiers[ty][tier].protected += 1;
                self.move_node(i, ty, gen, new, false);
                continue;
            }
            // The per-page check (with look-around): a young page goes to the youngest.
            self.slab.nodes[i as usize].word.clear_refs_for_check();
            match self.check_young(page, max_gen, &mut batch, source) {
                Check::Young => {
                    self.activated += 1;
                    self.move_node(i, ty, gen, max_gen, true);
                    continue;
                }
                Check::FirstReference => {
                    // Look twice: one more generation, at its old end.
                    let (old, new) = self.slab.nodes[i as usize].word.inc_gen(gen, next_gen);
                    if let Some(old) = old {
                        batch.record(ty, old, new);
                    }
                    self.move_node(i, ty, gen, new, false);
                    continue;
                }
                Check::Cold => {}
            }
            self.evict_node(i, ty, gen);
            victims.push(page);
        }
        batch.apply(&mut self.nr_pages, &mut self.gen_promoted);
        scanned
    }

    fn move_node(&mut self, i: u32, ty: usize, from: usize, to: usize, young_end: bool) {
        self.lists[from][ty].unlink(&mut self.slab.nodes, i);
        if young_end {
            self.lists[to][ty].push_head(&mut self.slab.nodes, i);
        } else {
            self.lists[to][ty].push_tail(&mut self.slab.nodes, i);
        }
        self.slab.nodes[i as usize].word.set_list_gen(to);
    }

    /// The eviction-time check of one page: tests its accessed bit and, with look-around, those
    /// of its neighbours in the same region, promoting the young ones; marks the region dense in
    /// the current bloom filter if enough of them were young (`lru_gen_look_around`).
    fn check_young(
        &mut self,
        page: PageId,
        max_gen: usize,
        batch: &mut GenBatch,
        source: &mut dyn AccessSource,
    ) -> Check {
        let range = if self.cfg.look_around {
            let r = self.region_range(self.region_of(page));
            let half = MIN_LRU_BATCH as u64;
            page.saturating_sub(half).max(r.start)..page.saturating_add(half).min(r.end)
        } else {
            page..page.saturating_add(1)
        };
        let window = range.end - range.start;
        let mut young = 0usize;
        let mut check = Check::Cold;
        {
            let slab = &self.slab;
            let tiers = &mut self.tiers;
            let promoted = &mut self.look_around_promoted;
            let look_twice = self.cfg.look_twice;
            source.test_and_clear_young(range, &mut |p| {
                if let Some(i) = slab.get(p) {
                    let n = &slab.nodes[i as usize];
                    let tier = n.word.tier();
                    if let Some((old, moved)) = n.word.update_gen(max_gen, look_twice) {
                        young += 1;
                        if moved {
                            batch.record(n.page_type().idx(), old, max_gen);
                        }
                        if p == page {
                            check = if moved {
                                Check::Young
                            } else {
                                Check::FirstReference
                            };
                        } else if moved {
                            *promoted += 1;
                            tiers[n.page_type().idx()][tier].promoted += 1;
                        }
                    }
                }
            });
        }
        if self.cfg.look_around && self.cfg.bloom_filter {
            let region = self.region_of(page);
            let resident = u64::from(self.regions.get(&region).copied().unwrap_or(0));
            let cur = (self.max_seq % 2) as usize;
            if self.filter_seq[cur] == Some(self.max_seq)
                && (young * DENSE_FRACTION) as u64 >= resident.min(window)
            {
                self.filters[cur].insert(region);
            }
        }
        check
    }

    fn evict_node(&mut self, i: u32, ty: usize, gen: usize) {
        let n = &self.slab.nodes[i as usize];
        let page = n.page();
        let refs = n.word.refs();
        let reused = n.word.is_reused();
        let tier = tier_from_refs(refs);
        if let Some(g) = n.word.isolate() {
            self.nr_pages[g][ty] -= 1;
        }
        self.lists[gen][ty].unlink(&mut self.slab.nodes, i);
        self.slab.remove(page);
        self.dec_region(page);
        self.ctrl.evicted[ty][tier] += 1;
        self.tiers[ty][tier].evicted += 1;
        self.gen_evicted[gen][ty] += 1;
        self.evicted += 1;
        // lru_gen_eviction: the token holds min_seq and the references.
        let stamp = self.next_stamp;
        self.next_stamp = self.next_stamp.wrapping_add(1);
        let len = self.len();
        self.aging_ctrl.on_evict(reused, len);
        self.shadows.insert(
            page,
            Shadow {
                seq: self.min_seq[ty],
                epoch: self.aging_ctrl.epoch,
                reused,
                page_type: PageType::from_idx(ty),
                refs: refs as u8,
                stamp,
            },
        );
        self.shadow_fifo.push_back((page, stamp));
    }

    /// Drops shadow entries beyond `max_shadows`, oldest first, and stale FIFO slots.
    fn prune_shadows(&mut self) {
        while self.shadows.len() > self.cfg.max_shadows
            || self.shadow_fifo.len() > 2 * self.cfg.max_shadows.max(self.shadows.len())
        {
            let Some((page, stamp)) = self.shadow_fifo.pop_front() else {
                break;
            };
            if self.shadows.get(&page).is_some_and(|s| s.stamp == stamp) {
                self.shadows.remove(&page);
            }
        }
        if self.shadow_fifo.len() > 4 * self.shadows.len() + 1024 {
            let shadows = &self.shadows;
            self.shadow_fifo
                .retain(|(p, st)| shadows.get(p).is_some_and(|s| s.stamp == *st));
        }
        // Give back what a past peak left: both grow by doubling and never shrink alone.
        if self.shadows.capacity() > 4 * self.shadows.len() + 1024 {
            self.shadows.shrink_to(2 * self.shadows.len());
        }
        if self.shadow_fifo.capacity() > 4 * self.shadow_fifo.len() + 1024 {
            self.shadow_fifo.shrink_to(2 * self.shadow_fifo.len());
        }
    }

    /// Heap bytes of the metadata: nodes, the page index, regions, shadow entries, filters.
    pub fn metadata_bytes(&self) -> usize {
        self.slab.heap_bytes()
            + self.regions.capacity() * (std::mem::size_of::<(PageId, u32)>() + 1)
            + self.shadows.capacity() * (std::mem::size_of::<(PageId, Shadow)>() + 1)
            + self.shadow_fifo.capacity() * std::mem::size_of::<(PageId, u32)>()
            + self.loop_victims.capacity() * std::mem::size_of::<PageId>()
            + self
                .filters
                .iter()
                .map(BloomFilter::heap_bytes)
                .sum::<usize>()
    }

    /// Shadow entries held.
    pub fn nr_shadows(&self) -> usize {
        self.shadows.len()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let lo = self.min_seq[0].min(self.min_seq[1]);
        let generations = (lo..=self.max_seq)
            .map(|seq| GenerationStats {
                seq,
                pages: [
                    self.nr_pages(seq, PageType::Anon),
                    self.nr_pages(seq, PageType::File),
                ],
                evicted: self.gen_evicted[self.gen(seq)],
                refaulted: self.gen_refaulted[self.gen(seq)],
                promoted: self.gen_promoted[self.gen(seq)],
            })
            .collect();
        Stats {
            max_seq: self.max_seq,
            min_seq: self.min_seq,
            generations,
            tiers: self.tiers,
            walks: self.walks,
            walk_totals: self.walk_totals,
            last_walk: self.last_walk,
            activated: self.activated,
            look_around_promoted: self.look_around_promoted,
            evicted: self.evicted,
            refaults: self.refaults,
            aging_evicted: self.aging_ctrl.evicted,
            aging_refaulted: self.aging_ctrl.refaulted,
            refault_order: [self.aging_ctrl.in_order, self.aging_ctrl.out_of_order],
            idle_demoted: self.idle_demoted,
            refault_activated: self.refault_activated,
        }
    }

    /// Walks every structure and checks the invariants: each resident page on exactly one list,
    /// list generations never younger than flag generations, per-generation counts equal to the
    /// pages whose flags name that generation, region counts exact, 2..=max_nr_gens generations.
    /// For tests (`O(pages)`).
    #[allow(clippy::needless_range_loop)] // several arrays indexed by type
    pub fn check_integrity(&self) -> Result<(), String> {
        let n = self.cfg.max_nr_gens as u64;
        for ty in 0..2 {
            let gens = self.max_seq + 1 - self.min_seq[ty];
            if gens < MIN_NR_GENS as u64 || gens > n {
                return Err(format!("type {ty}: {gens} generations"));
            }
        }
        if self.can_swap() && self.min_seq[1] < self.min_seq[0] {
            return Err("min_seq[file] < min_seq[anon]".into());
        }
        let mut seen = IdMap::<()>::default();
        let mut counts = [[0i64; 2]; MAX_NR_GENS];
        let mut regions = IdMap::<u32>::default();
        for ty in 0..2 {
            for g in 0..self.cfg.max_nr_gens {
                let list = &self.lists[g][ty];
                let mut len = 0;
                for i in list.iter(&self.slab.nodes) {
                    len += 1;
                    let node = &self.slab.nodes[i as usize];
                    if self.slab.get(node.page()) != Some(i) {
                        return Err(format!("page {} on a list but not indexed", node.page()));
                    }
                    if seen.insert(node.page(), ()).is_some() {
                        return Err(format!("page {} on two lists", node.page()));
                    }
                    if node.list_gen() != g || node.page_type().idx() != ty {
                        return Err(format!("page {} list_gen/type mismatch", node.page()));
                    }
                    let Some(fg) = node.word.gen() else {
                        return Err(format!("page {} isolated but listed", node.page()));
                    };
                    if self.seq_of_gen(ty, fg) < self.seq_of_gen(ty, g) {
                        return Err(format!("page {} flags older than its list", node.page()));
                    }
                    counts[fg][ty] += 1;
                    *regions.entry(self.region_of(node.page())).or_insert(0) += 1;
                }
                if len != list.len() {
                    return Err(format!("list {g}/{ty} length {} != {len}", list.len()));
                }
            }
        }
        if seen.len() != self.slab.len() {
            return Err(format!(
                "{} listed, {} indexed",
                seen.len(),
                self.slab.len()
            ));
        }
        if counts != self.nr_pages {
            return Err(format!("counts {counts:?} != nr_pages {:?}", self.nr_pages));
        }
        if regions != self.regions {
            return Err("region counts differ".into());
        }
        Ok(())
    }
}

impl Policy for Mglru {
    fn name(&self) -> &'static str {
        "mglru"
    }
    fn len(&self) -> usize {
        Mglru::len(self)
    }
    fn contains(&self, page: PageId) -> bool {
        Mglru::contains(self, page)
    }
    fn add(&mut self, page: PageId, hint: Hint) -> Result<(), Error> {
        Mglru::add(self, page, hint).map(|_| ())
    }
    fn take_shadow(&mut self, page: PageId) -> Option<u32> {
        Mglru::take_shadow(self, page)
    }
    fn add_refault(&mut self, page: PageId, hint: Hint, token: u32) -> Result<(), Error> {
        Mglru::add_refault(self, page, hint, token).map(|_| ())
    }
    fn access(&mut self, page: PageId, kind: AccessKind) -> bool {
        match kind {
            AccessKind::Mapped => self.contains(page),
            AccessKind::Descriptor => self.mark_accessed(page),
        }
    }
    fn remove(&mut self, page: PageId) -> bool {
        Mglru::remove(self, page)
    }
    fn metadata_bytes(&self) -> usize {
        Mglru::metadata_bytes(self)
    }

    fn evict(&mut self, n: usize, source: &mut dyn AccessSource) -> Vec<PageId> {
        Mglru::evict(self, n, source)
    }
}
