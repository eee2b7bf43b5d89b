//! # mglru: the multi-generational LRU as a page-replacement policy library
//!
//! ## The problem
//!
//! A pager must choose which resident pages to evict. Exact LRU needs to see every access,
//! which nobody sees for mapped memory; the accessed bit tells only *whether* a page was used
//! since the bit was last cleared. Linux's two-list scheme (active/inactive) scans for those
//! bits page by page through reverse maps and keeps only two ages. The multi-generational LRU
//! (Yu Zhao, merged in v6.1) keeps up to four generations, makes a new one by walking the access
//! information by address (cheap, sequential, and skipping sparse regions), evicts from the
//! oldest, and uses refault feedback to protect pages accessed often through file descriptors.
//!
//! ## The kernel design this follows (`mm/vmscan.c`, `mm/workingset.c`, v6.1)
//!
//! - **Generations.** `max_seq` (shared) and `min_seq[type]` for anon and file pages; between
//!   `MIN_NR_GENS = 2` and `max_nr_gens` (3 or 4, [`Config::max_nr_gens`]) generations alive.
//!   Each page has a flags word holding its generation index (`seq % max_nr_gens`), a reference
//!   count and the `referenced`/`workingset` bits, updated by compare-and-swap; the same 64-bit
//!   word holds the generation whose list the page is on, its type and its id (so page ids are
//!   at most [`MAX_PAGE_ID`], `2^52 - 1`, and a node is 16 bytes). Pages promoted
//!   by the aging only change their flags; the lists are sorted lazily at eviction
//!   (`sort_folio`), and the per-generation counts are updated in batches ([`Mglru::nr_pages`]
//!   is exact after every call returns). [`Mglru::is_active`] is true for the two youngest.
//! - **Aging** (`inc_max_seq` after a walk): the walk asks the embedder's [`AccessSource`] to
//!   test and clear the accessed bits of each region (`2^region_shift` consecutive page ids, a
//!   PMD by default) holding resident pages and moves the young pages to the youngest
//!   generation. Regions where at least one page in eight was young go into a bloom filter, and
//!   the next walk skips the regions not in it. If all generations are in use, the oldest is
//!   drained into the next (`inc_min_seq`).
//! - **Eviction** from the oldest generation of a type chosen by swappiness and the controller
//!   (`get_type_to_scan`): a page of a tier above the controller's `tier_idx` is protected (moved
//!   to the next generation); every other page gets the per-page check (`folio_referenced` with
//!   `lru_gen_look_around`: the accessed bits of it and its neighbours are tested, the young ones
//!   promoted, the region marked dense) and is evicted if it was not young. `min_seq` moves up
//!   when the oldest generation is empty (`try_to_inc_min_seq`). Aging runs when only two
//!   generations are left, or three with a badly skewed spread (`should_run_aging`; by default
//!   also whenever the youngest holds more than half of the pages, see below).
//! - **Tiers** by accesses through the descriptor path ([`Mglru::mark_accessed`],
//!   `folio_inc_refs`): tier = `order_base_2(refs + 1)`, four tiers. **PID controller**
//!   (`get_tier_idx`, `positive_ctrl_err`): refaults / (evictions + protections) per tier, tier 0
//!   as the set point with gain 1 against gain 2 for the others, averaged across generations.
//! - **Workingset detection**: an evicted page leaves a shadow entry (`min_seq` and references
//!   at eviction); a page added again with a shadow is a refault ([`Mglru::refault`] tells it
//!   without consuming it, `lru_gen_test_recent`), counted for its tier if it was evicted from
//!   the generation that is still the oldest; a faulted refault comes back with `workingset`
//!   set, one tier up (`lru_gen_refault`).
//! - **Hints**: [`Arrival::Sequential`] and [`Arrival::Cold`] pages start in the oldest
//!   generation, [`Arrival::Active`] ones in the youngest; faulted pages start where
//!   [`Config::fault_placement`] says (oldest by default, second-oldest as in the groundwork
//!   patch, youngest as in v6.1; debated in the seed review).
//!
//! ## How it differs from the kernel
//!
//! - Page ids, not folios; there are no zones, memcgs or NUMA nodes (one `lruvec`), no
//!   mm_struct list (the walk covers the regions of resident pages, in id order), and no large
//!   folios. The embedder packs its own ids; neighbours by id are neighbours for regions.
//! - Eviction runs page by page until it has the requested number of victims, reconsidering
//!   type and tier every 64 pages; there is no writeback, so a victim is gone at once.
//! - Shadow entries are bounded by [`Config::max_shadows`] (oldest dropped first) instead of by
//!   the shadow-node shrinker.
//! - `NR_HIST_GENS = 1`, as in v6.1.
//! - With swappiness 0, anon pages are still drained into the next generation when the oldest
//!   retires (the kernel leaves them and accepts a cold/hot inversion).
//! - **The default configuration deviates from v6.1 in six rules** ([`Config::v6_1`] keeps
//!   v6.1's; the README gives the measurements behind each):
//!   1. faulted pages start at the young end of the oldest generation
//!      ([`FaultPlacement::Oldest`]), not in the youngest (v6.1's `folio_add_lru` marks pages
//!      added in a fault active);
//!   2. [`Config::look_twice`]: the first accessed bit of a freshly faulted page is the fault's
//!      own, not a reuse (`folio_check_references`' rule, which v6.1's MGLRU bypasses because
//!      its look-around marks the folio under check referenced). The walk or a look-around
//!      clears it and leaves the page in place; the eviction-time check, if first, gives the
//!      page one more generation. A recent refault is not fresh, so its first bit promotes it:
//!      the protection of refaulting mapped pages, which tiers cannot give since only
//!      descriptor accesses raise a tier;
//!   3. [`Config::young_bound_aging`]: the aging also runs when more than `MIN_NR_GENS + 1`
//!      generations are alive but the youngest holds more than `1 / MIN_NR_GENS` of the pages.
//!      With faults entering the oldest generation, it is refilled as fast as it is evicted and
//!      v6.1's `should_run_aging` would stop the aging altogether;
//!   4. [`Config::eviction_aging`]: when an aging walk finds fewer young pages than a quarter
//!      of the pages outside the oldest generation (the protected set stopped being used: the
//!      hot set moved), the aging also runs each time `1/8` of memory has been evicted, until
//!      a walk finds the protected pages used again. Without it a moved hot set kept the young
//!      generations while the new one was churned through the oldest (issue #20). With
//!      [`Config::demotion_feedback`] the clock holds back while the victims it demoted come
//!      back more often than the victims never promoted since they were added: the walk's
//!      bits cannot tell a moved set from pages reused over longer periods than the walks'
//!      (or see any reuse when only faults set bits), the refaults of the demoted pages can;
//!   5. [`Config::loop_eviction`] (loop mode): while at least 5/8 of the victims never
//!      promoted since they were added come back within a memory's worth of evictions (the
//!      working set is larger than memory and reused in order, a loop), such a refault gets
//!      no protection and is the next victim, the most recent first, so the resident pages
//!      stay and each round misses only what does not fit (LIRS's behaviour on loops; the
//!      kernel has no counterpart: its refault-distance rule activates every loop refault).
//!      With [`Config::loop_order`] (since 2026-11-27) those refaults must also come back in
//!      about the order they were evicted (at most 1/8 out of order), which a loop does and a
//!      skewed set larger than memory, whose victims come back as often, does not; and with
//!      that test, [`Config::loop_window`] lets loop mode also read 3 memories' worth of
//!      evictions (at least 7/8 back, in order), which reaches loops over 2-3 times memory;
//!   6. [`Config::idle_youngest_demotion`]: when an aging walk finds fewer than 1/256 of the
//!      youngest generation's pages young (and it holds at least 1/16 of memory), the pages it
//!      did not find young move to the young end of the oldest generation at once instead of
//!      sinking one generation per aging (not while the demotion feedback holds the clock
//!      back). A loop over more than a memory leaves the pages one pass promoted there, unused
//!      until the next pass; they kept a quarter to a half of memory from the pages reused
//!      next (lirs_cs, loops over 3x memory, periodic scans).
//!
//!   Why: with v6.1's rules every faulted page is promoted twice for one access (placed
//!   youngest, then promoted again for the fault's accessed bit, and look-arounds promote the
//!   fault bits of its neighbours), so a one-pass scan is protected like the hot set and the
//!   replays in the README come out up to 4 points worse than exact LRU and worse than the
//!   active/inactive lists on scan mixes. With rules 1-3 they are within 0.5 points of LRU on
//!   the README's original traces and better than active/inactive on the scan mixes. The
//!   cost: the aging runs far less often and a reused page stays protected longer, which a
//!   workload whose hot set moves pays for; rule 4 shortens that (the README says by how much
//!   and where it still loses to LRU).
//! - [`Config::refault_window`] (off by default): refaults that many generations away still
//!   count as recent.
//! - [`Config::refault_activation`] (off by default, measured and not kept as a default on
//!   2026-11-28): `mm/workingset.c`'s refault-distance test, a refault within a memory's worth
//!   of evictions goes to the youngest generation at once, and the activations drive the aging.
//! - The eviction-time check and the walk take an [`AccessSource`] argument instead of walking
//!   page tables: the embedder owns its access information.
//!
//! ## Concurrency
//!
//! [`Mglru`] is a plain `&mut self` structure except [`Mglru::mark_accessed`], which takes
//! `&self` and updates the page's flags word with compare-and-swap. [`SharedMglru`] puts it
//! behind a reader-writer lock (the kernel's `lru_lock`): descriptor accesses under the read
//! lock run in parallel, everything else takes the write lock. The loom models in
//! `tests/loom_*.rs` check the flags word's races and readers against eviction.
//!
//! ## Invariants
//!
//! Every resident page is on exactly one generation list and indexed once; its flags generation
//! is never older than its list's; per-generation counts equal the pages whose flags name the
//! generation; 2 to `max_nr_gens` generations per type; with swappiness > 0,
//! `min_seq[file] >= min_seq[anon]`. [`Mglru::check_integrity`] walks all of it (the tests call
//! it after every step).
//!
//! ## Example
//!
//! ```
//! use mglru::{AccessBits, Config, Hint, Mglru, PageType};
//!
//! let mut lru = Mglru::new(Config::default()).unwrap();
//! let mut bits = AccessBits::new(); // the embedder's accessed bits
//! for page in 0..100 {
//!     lru.add(page, Hint::fault(PageType::Anon)).unwrap();
//!     bits.set(page); // the faulting access sets the accessed bit
//! }
//! lru.age(&mut bits); // pages 0..100 are now one generation older
//! lru.age(&mut bits);
//! for page in 0..10 {
//!     bits.set(page); // the hot pages are touched again
//! }
//! let victims = lru.evict(20, &mut bits);
//! assert_eq!(victims.len(), 20);
//! assert!(victims.iter().all(|&p| p >= 10), "hot pages are kept");
//! assert!(lru.refault(victims[0]).is_some(), "a shadow entry remains");
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(unreachable_pub)]
#![deny(missing_docs)]

mod baseline;
mod bloom;
mod error;
mod flags;
mod list;
mod lrugen;
mod policy;
pub mod replay;
mod shared;
mod sync;

/// Generations always alive (`MIN_NR_GENS`).
pub const MIN_NR_GENS: usize = 2;
/// Most generations alive (`MAX_NR_GENS`); [`Config::max_nr_gens`] may lower it to 3.
pub const MAX_NR_GENS: usize = 4;
/// Tiers (`MAX_NR_TIERS`).
pub const MAX_NR_TIERS: usize = 4;
/// The controller's noise floor and the eviction batch (`MIN_LRU_BATCH`, `BITS_PER_LONG`).
pub const MIN_LRU_BATCH: usize = 64;

pub use baseline::{ActiveInactive, Clock, Lru};
pub use error::{Error, ReplayError};
pub use flags::MAX_PAGE_ID;
pub use lrugen::{
    Config, FaultPlacement, GenerationStats, Mglru, Refault, Stats, TierStats, WalkStats,
    SHADOW_TOKEN_BITS,
};
pub use policy::{AccessKind, AccessSource, Arrival, Hint, NoAccess, PageId, PageType, Policy};
pub use replay::{AccessBits, ReplayResult};
pub use shared::SharedMglru;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
// Not under miri, where it took 145 s of CPU (1,000 pages): the crate-level example above makes
// the same calls on 100 pages there.
#[cfg(not(miri))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The per-page flags word, for the loom models only (`cfg(mglru_loom)`).
#[cfg(mglru_loom)]
#[doc(hidden)]
pub mod __loom {
    pub use crate::flags::PageFlags;
}
