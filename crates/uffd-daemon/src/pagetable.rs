//! The daemon's page table: the state of every managed page of one address space, one word
//! per page, in tables of 512 words (one per 2 MiB of address space, the kernel's PTE page
//! under a PMD) allocated when their first page is added and freed with their last.
//!
//! A managed gigabyte costs 2 MiB here (8 bytes per page, 0.2%), against about 30 bytes per
//! page for the `BTreeMap<u64, Page>` it replaced (the `metadata` binary of `benches/` measures
//! both). Lookups go through an ordered map of tables (one entry per 2 MiB), then index the
//! table: a gigabyte is 512 tables instead of 262,144 tree entries.

use std::collections::BTreeMap;
use std::ops::Range;

pub use crate::tiers::ZERO_SLOT;

/// The state of one managed page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// Present in the client, and held by the replacement policy.
    Resident {
        /// The accessed bit the policy's access source tests and clears: set by the fault
        /// that brought the page in, and by a write-protect fault when the access source
        /// arms write protection.
        referenced: bool,
        /// Brought in by readahead, and no use of it seen since (the kernel's `PG_readahead`
        /// on a swap-cache folio): cleared when the daemon sees the program use the page
        /// (counted `readahead_hit_pages`); a page that leaves with it still set (evicted,
        /// removed, unmapped) is counted `readahead_unused_pages`. The fault path keeps it
        /// and `referenced` from being set together.
        readahead: bool,
    },
    /// Chosen for eviction by batch `batch`: write-protected, contents being read and stored.
    Evicting {
        /// The reclaim batch that owns it (numbers wrap at 2^32: far more than ever in flight).
        batch: u32,
    },
    /// Contents stored in `slot`; the agent has been asked to drop the page.
    Dropping {
        /// Store slot (or [`ZERO_SLOT`]).
        slot: u32,
    },
    /// Stored in `slot`, and maybe still present too: a page that was `Dropping` when its
    /// address space forked or was mremapped. A missing fault is served from the slot; a
    /// write-protect fault just lifts the protection (no eviction of this address is in
    /// flight); reclaim leaves it alone.
    Inherited {
        /// Store slot (or [`ZERO_SLOT`]).
        slot: u32,
    },
    /// Not present in the client; contents in `slot`.
    Evicted {
        /// Store slot (or [`ZERO_SLOT`]).
        slot: u32,
    },
}

impl Page {
    /// Whether the page counts as resident.
    pub fn is_resident(self) -> bool {
        !matches!(self, Page::Evicted { .. })
    }

    /// The store slot, if the page holds one.
    pub fn slot(self) -> Option<u32> {
        match self {
            Page::Dropping { slot } | Page::Inherited { slot } | Page::Evicted { slot }
                if slot != ZERO_SLOT =>
            {
                Some(slot)
            }
            _ => None,
        }
    }

    // The word: 0 is "no page"; the low 3 bits are the state; `Resident`'s bit 3 is the
    // referenced bit and bit 4 the readahead mark; the other states keep their batch or slot
    // in the high 32 bits and the policy's shadow entry (token + 1, 0 for none) in bits 3..32.
    const RESIDENT: u64 = 1;
    const EVICTING: u64 = 2;
    const DROPPING: u64 = 3;
    const INHERITED: u64 = 4;
    const EVICTED: u64 = 5;
    const TAG: u64 = 7;
    const REFERENCED: u64 = 1 << 3;
    const READAHEAD: u64 = 1 << 4;
    const SHADOW_SHIFT: u32 = 3;
    const SHADOW_MASK: u64 = ((1 << 29) - 1) << Self::SHADOW_SHIFT;

    fn encode(self) -> u64 {
        match self {
            Page::Resident {
                referenced,
                readahead,
            } => {
                Self::RESIDENT
                    | if referenced { Self::REFERENCED } else { 0 }
                    | if readahead { Self::READAHEAD } else { 0 }
            }
            Page::Evicting { batch } => Self::EVICTING | (u64::from(batch) << 32),
            Page::Dropping { slot } => Self::DROPPING | (u64::from(slot) << 32),
            Page::Inherited { slot } => Self::INHERITED | (u64::from(slot) << 32),
            Page::Evicted { slot } => Self::EVICTED | (u64::from(slot) << 32),
        }
    }

    fn decode(word: u64) -> Option<Page> {
        let slot = (word >> 32) as u32;
        Some(match word & Self::TAG {
            0 => return None,
            Self::RESIDENT => Page::Resident {
                referenced: word & Self::REFERENCED != 0,
                readahead: word & Self::READAHEAD != 0,
            },
            Self::EVICTING => Page::Evicting { batch: slot },
            Self::DROPPING => Page::Dropping { slot },
            Self::INHERITED => Page::Inherited { slot },
            Self::EVICTED => Page::Evicted { slot },
            t => unreachable!("page table word {word:#x} has unknown state {t}"),
        })
    }
}

const PAGE_SHIFT: u32 = 12;
/// Pages per table (log2).
const TABLE_SHIFT: u32 = 9;
const TABLE_PAGES: usize = 1 << TABLE_SHIFT;
/// Address bits one table covers.
const TABLE_ADDR_SHIFT: u32 = PAGE_SHIFT + TABLE_SHIFT;

#[derive(Clone)]
struct Table {
    words: [u64; TABLE_PAGES],
    /// Words that are not zero.
    used: u32,
}

fn split(addr: u64) -> (u64, usize) {
    debug_assert_eq!(
        addr % (1 << PAGE_SHIFT),
        0,
        "unaligned page address {addr:#x}"
    );
    (
        addr >> TABLE_ADDR_SHIFT,
        ((addr >> PAGE_SHIFT) as usize) & (TABLE_PAGES - 1),
    )
}

fn join(table: u64, idx: usize) -> u64 {
    (table << TABLE_ADDR_SHIFT) | ((idx as u64) << PAGE_SHIFT)
}

/// The page table of one address space: page address to [`Page`].
#[derive(Clone, Default)]
pub struct PageTable {
    tables: BTreeMap<u64, Box<Table>>,
    len: usize,
}

impl std::fmt::Debug for PageTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageTable")
            .field("pages", &self.len)
            .field("tables", &self.tables.len())
            .finish()
    }
}

impl PageTable {
    /// An empty table.
    pub fn new() -> PageTable {
        PageTable::default()
    }

    /// Pages held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no page is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes used (tables and the map's share).
    pub fn heap_bytes(&self) -> usize {
        // A BTreeMap node holds up to 11 entries; count a key, a pointer and a child link
        // per entry as its share.
        self.tables.len() * (std::mem::size_of::<Table>() + 24)
    }

    /// The page at `addr`.
    pub fn get(&self, addr: u64) -> Option<Page> {
        let (t, i) = split(addr);
        self.tables.get(&t).and_then(|t| Page::decode(t.words[i]))
    }

    /// Whether a page is held at `addr`.
    pub fn contains(&self, addr: u64) -> bool {
        self.get(addr).is_some()
    }

    /// Sets the page at `addr`; returns what was there. A shadow entry set on the page
    /// stays while it moves between the states that are out of the policy (`Evicting`,
    /// `Dropping`, `Inherited`, `Evicted`) and goes when it becomes `Resident`.
    pub fn insert(&mut self, addr: u64, page: Page) -> Option<Page> {
        let (t, i) = split(addr);
        let table = self.tables.entry(t).or_insert_with(|| {
            Box::new(Table {
                words: [0; TABLE_PAGES],
                used: 0,
            })
        });
        let word = table.words[i];
        let old = Page::decode(word);
        let mut new = page.encode();
        if !matches!(page, Page::Resident { .. }) && !matches!(old, Some(Page::Resident { .. })) {
            new |= word & Page::SHADOW_MASK;
        }
        table.words[i] = new;
        if old.is_none() {
            table.used += 1;
            self.len += 1;
        }
        old
    }

    /// Keeps the replacement policy's shadow entry (a token below 2^28,
    /// [`mglru::SHADOW_TOKEN_BITS`]) in the word of a page that left the policy, as the kernel
    /// keeps it in the swap cache's slot: it costs no memory of its own. Returns false (and
    /// keeps nothing) if the page is absent or `Resident`.
    pub fn set_shadow(&mut self, addr: u64, token: u32) -> bool {
        const _: () = assert!(mglru::SHADOW_TOKEN_BITS < 29);
        let (t, i) = split(addr);
        let Some(table) = self.tables.get_mut(&t) else {
            return false;
        };
        let w = &mut table.words[i];
        if *w == 0 || *w & Page::TAG == Page::RESIDENT || token >= 1 << mglru::SHADOW_TOKEN_BITS {
            return false;
        }
        *w = (*w & !Page::SHADOW_MASK) | ((u64::from(token) + 1) << Page::SHADOW_SHIFT);
        true
    }

    /// The shadow entry kept with the page at `addr`, if any.
    pub fn shadow(&self, addr: u64) -> Option<u32> {
        let (t, i) = split(addr);
        let w = self.tables.get(&t)?.words[i];
        if w & Page::TAG == Page::RESIDENT {
            return None;
        }
        let field = (w & Page::SHADOW_MASK) >> Page::SHADOW_SHIFT;
        (field != 0).then(|| field as u32 - 1)
    }

    /// Removes the page at `addr`; returns it.
    pub fn remove(&mut self, addr: u64) -> Option<Page> {
        let (t, i) = split(addr);
        let table = self.tables.get_mut(&t)?;
        let old = Page::decode(table.words[i])?;
        table.words[i] = 0;
        table.used -= 1;
        self.len -= 1;
        if table.used == 0 {
            self.tables.remove(&t);
        }
        Some(old)
    }

    /// Clears the `referenced` bit of the `Resident` pages in `range` that have it, calling
    /// `young` with each one's address, in address order (the access source's walk). The
    /// readahead mark is left as it is.
    pub fn take_referenced(&mut self, range: Range<u64>, mut young: impl FnMut(u64)) {
        let Range { start, end } = range;
        if start >= end {
            return;
        }
        let mask = Page::TAG | Page::REFERENCED;
        let want = Page::RESIDENT | Page::REFERENCED;
        let first = start >> TABLE_ADDR_SHIFT;
        let last = (end - 1) >> TABLE_ADDR_SHIFT;
        for (&t, table) in self.tables.range_mut(first..=last) {
            let lo = if t == first { split(start).1 } else { 0 };
            let hi = if t == last {
                (((end - 1) >> PAGE_SHIFT) as usize & (TABLE_PAGES - 1)) + 1
            } else {
                TABLE_PAGES
            };
            for (i, w) in table.words[lo..hi].iter_mut().enumerate() {
                if *w & mask == want {
                    *w &= !Page::REFERENCED;
                    young(join(t, lo + i));
                }
            }
        }
    }

    /// The pages with addresses in `range`, in address order.
    pub fn range(&self, range: Range<u64>) -> impl Iterator<Item = (u64, Page)> + '_ {
        let Range { start, end } = range;
        let first = start >> TABLE_ADDR_SHIFT;
        let last = end.saturating_sub(1) >> TABLE_ADDR_SHIFT;
        (start < end)
            .then(|| self.tables.range(first..=last))
            .into_iter()
            .flatten()
            .flat_map(move |(&t, table)| {
                table.words.iter().enumerate().filter_map(move |(i, &w)| {
                    let addr = join(t, i);
                    if w == 0 || addr < start || addr >= end {
                        return None;
                    }
                    Page::decode(w).map(|p| (addr, p))
                })
            })
    }

    /// Every page, in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Page)> + '_ {
        self.tables.iter().flat_map(|(&t, table)| {
            table
                .words
                .iter()
                .enumerate()
                .filter_map(move |(i, &w)| Page::decode(w).map(|p| (join(t, i), p)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn page_strategy() -> impl Strategy<Value = Page> {
        prop_oneof![
            (any::<bool>(), any::<bool>()).prop_map(|(referenced, readahead)| Page::Resident {
                referenced,
                readahead
            }),
            any::<u32>().prop_map(|batch| Page::Evicting { batch }),
            any::<u32>().prop_map(|slot| Page::Dropping { slot }),
            any::<u32>().prop_map(|slot| Page::Inherited { slot }),
            any::<u32>().prop_map(|slot| Page::Evicted { slot }),
        ]
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, Page),
        Remove(u64),
        Range(u64, u64),
        TakeReferenced(u64, u64),
        SetShadow(u64, u32),
    }

    // Addresses from a few 2 MiB tables, their edges, and far apart.
    fn addr_strategy() -> impl Strategy<Value = u64> {
        prop_oneof![
            (0u64..3 * 512).prop_map(|p| 0x7f00_0000_0000 + p * 4096),
            (0u64..4).prop_map(|p| (0xffff_ffff_f000u64 >> 12 << 12) - p * 4096),
            (0u64..16).prop_map(|p| p * 4096),
        ]
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (addr_strategy(), page_strategy()).prop_map(|(a, p)| Op::Insert(a, p)),
            3 => addr_strategy().prop_map(Op::Remove),
            1 => (addr_strategy(), addr_strategy()).prop_map(|(a, b)| Op::Range(a, b)),
            1 => (addr_strategy(), addr_strategy()).prop_map(|(a, b)| Op::TakeReferenced(a, b)),
            2 => (addr_strategy(), 0u32..1 << 28).prop_map(|(a, t)| Op::SetShadow(a, t)),
        ]
    }

    proptest! {
        #[test]
        fn matches_a_btreemap(ops in prop::collection::vec(op_strategy(), 1..400)) {
            let mut table = PageTable::new();
            let mut model: std::collections::BTreeMap<u64, Page> = Default::default();
            let mut shadows: std::collections::BTreeMap<u64, u32> = Default::default();
            for op in ops {
                match op {
                    Op::Insert(a, p) => {
                        let old = model.insert(a, p);
                        prop_assert_eq!(table.insert(a, p), old);
                        let out = |p: Option<Page>| p.is_some_and(|p| !matches!(p, Page::Resident { .. }));
                        if !(out(Some(p)) && out(old)) {
                            shadows.remove(&a);
                        }
                    }
                    Op::Remove(a) => {
                        prop_assert_eq!(table.remove(a), model.remove(&a));
                        shadows.remove(&a);
                    }
                    Op::SetShadow(a, t) => {
                        let ok = model.get(&a).is_some_and(|p| !matches!(p, Page::Resident { .. }));
                        prop_assert_eq!(table.set_shadow(a, t), ok);
                        if ok {
                            shadows.insert(a, t);
                        }
                    }
                    Op::Range(a, b) => {
                        let got: Vec<_> = table.range(a..b).collect();
                        let want: Vec<_> = if a < b {
                            model.range(a..b).map(|(&k, &v)| (k, v)).collect()
                        } else {
                            Vec::new()
                        };
                        prop_assert_eq!(got, want);
                    }
                    Op::TakeReferenced(a, b) => {
                        let mut got = Vec::new();
                        table.take_referenced(a..b, |x| got.push(x));
                        let mut want = Vec::new();
                        for (&k, v) in model.range_mut(a..b.max(a)) {
                            if let Page::Resident { referenced: true, readahead } = *v {
                                *v = Page::Resident { referenced: false, readahead };
                                want.push(k);
                            }
                        }
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(table.len(), model.len());
                for (&a, &p) in &model {
                    prop_assert_eq!(table.get(a), Some(p));
                    prop_assert_eq!(table.shadow(a), shadows.get(&a).copied());
                }
                let all: Vec<_> = table.iter().collect();
                let want: Vec<_> = model.iter().map(|(&k, &v)| (k, v)).collect();
                prop_assert_eq!(all, want);
                // No empty table is kept.
                prop_assert!(table.tables.values().all(|t| t.used > 0));
            }
        }
    }

    #[test]
    fn tables_come_and_go() {
        let mut t = PageTable::new();
        assert!(t.is_empty());
        for i in 0..1024u64 {
            t.insert(0x40_0000 + i * 4096, Page::Evicted { slot: i as u32 });
        }
        assert_eq!(t.tables.len(), 2);
        assert_eq!(t.heap_bytes(), 2 * (std::mem::size_of::<Table>() + 24));
        for i in 0..512u64 {
            assert_eq!(
                t.remove(0x40_0000 + i * 4096),
                Some(Page::Evicted { slot: i as u32 })
            );
        }
        assert_eq!(t.tables.len(), 1);
        assert_eq!(t.len(), 512);
        assert_eq!(t.get(0x40_0000), None);
        assert_eq!(
            t.get(0x60_0000),
            Some(Page::Evicted { slot: 512 }),
            "the second table is intact"
        );
    }
}
