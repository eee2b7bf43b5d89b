//! Where each page of a chain of backends is: the location index (`chain.rs`).
//!
//! A chain stores a swap slot's page in one of two tiers, the near one (a file, bounded) or the
//! far one (a Redis Cluster), each addressed by places of its own (a near place is a page of the
//! file, a far place a page of the cluster's keys). The index maps each slot to its one place and
//! allocates the places. It does no I/O: the chain writes a page's new copy first, then asks the
//! index to switch to it, and the index hands back the old place to release (its seal forgotten,
//! its key unlinked) only when nobody reads it any more. So:
//!
//! * **One place per page.** A slot maps to at most one place, and a place backs at most one
//!   slot. A place is free in its allocator only when no slot maps to it, no reader holds it, and
//!   no write or migration that took it is in flight.
//! * **Readers pin.** A read looks its pages up and pins their places under the index's lock, then
//!   reads with the lock let go, then unpins. A place whose page was moved or freed meanwhile is
//!   *doomed*: still allocated, released at its last unpin. A read thus always reads the bytes it
//!   looked up, even while a migration moves them or the slot is freed and stored anew.
//! * **A migration is a compare-and-switch.** The migrator takes the coldest near pages (pinned),
//!   copies each to a fresh far place, and then, for each, switches the slot to the far copy only
//!   if the slot still maps to the near place it copied (else the far copy is released: the page
//!   was freed or rewritten meanwhile).
//!
//! Releasing a place is done by a callback the caller gives, run under the index's lock before
//! the place can be allocated again (so a late release never forgets a new page's seal).

use std::collections::{BTreeMap, HashMap};

/// A page's place in one tier of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Place {
    /// A page of the near tier (the file).
    Near(u32),
    /// A page of the far tier (the cluster).
    Far(u32),
}

impl Place {
    /// The place's page number within its tier.
    pub(super) fn index(self) -> u32 {
        match self {
            Place::Near(i) | Place::Far(i) => i,
        }
    }
}

/// A bitmap allocator of places `0..cap`, grown a word at a time as it fills, next fit from a
/// cursor (consecutive allocations get consecutive places while the space after the cursor is
/// free, so a batch is written as one run).
#[derive(Debug)]
struct Bitmap {
    words: Vec<u64>,
    cap: u32,
    used: u32,
    cursor: usize,
}

impl Bitmap {
    fn new(cap: u32) -> Self {
        Bitmap {
            words: Vec::new(),
            cap,
            used: 0,
            cursor: 0,
        }
    }

    fn max_words(&self) -> usize {
        (self.cap as usize).div_ceil(64)
    }

    fn alloc(&mut self) -> Option<u32> {
        if self.used >= self.cap {
            return None;
        }
        let n = self.words.len();
        for k in 0..n {
            let w = (self.cursor + k) % n;
            let free = !self.words[w];
            if free != 0 {
                let bit = free.trailing_zeros();
                let i = w as u32 * 64 + bit;
                if i < self.cap {
                    self.words[w] |= 1 << bit;
                    self.used += 1;
                    self.cursor = w;
                    return Some(i);
                }
            }
        }
        if n < self.max_words() {
            self.words.push(1);
            self.used += 1;
            self.cursor = n;
            return Some(n as u32 * 64);
        }
        None
    }

    fn free(&mut self, i: u32) {
        let (w, bit) = (i as usize / 64, i % 64);
        debug_assert!(self.is_set(i), "freeing free place {i}");
        self.words[w] &= !(1 << bit);
        self.used -= 1;
    }

    fn is_set(&self, i: u32) -> bool {
        self.words
            .get(i as usize / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn heap_bytes(&self) -> usize {
        self.words.capacity() * 8
    }
}

/// A slot's entry: its place, and for a near place its key in the cold list.
#[derive(Debug, Clone, Copy)]
struct Entry {
    place: Place,
    seq: u64,
}

/// A near page the migrator took: its slot and its near place (pinned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cold {
    pub(super) slot: u32,
    pub(super) near: u32,
}

/// The location index: see the module's documentation.
#[derive(Debug)]
pub(super) struct LocationIndex {
    map: HashMap<u32, Entry>,
    near: Bitmap,
    far: Bitmap,
    /// Near pages by write order (oldest first): `seq -> (slot, written at, seconds)`.
    cold: BTreeMap<u64, (u32, u32)>,
    next_seq: u64,
    /// Readers (and the migrator) of each pinned place.
    pins: HashMap<Place, u32>,
    /// Places no slot maps to any more, released at their last unpin.
    doomed: HashMap<Place, ()>,
    /// Places allocated for writes in flight (not yet committed or abandoned).
    reserved: u64,
}

impl LocationIndex {
    /// An index of `near_cap` near places and at most `far_cap` far places.
    pub(super) fn new(near_cap: u32, far_cap: u32) -> Self {
        LocationIndex {
            map: HashMap::new(),
            near: Bitmap::new(near_cap),
            far: Bitmap::new(far_cap),
            cold: BTreeMap::new(),
            next_seq: 0,
            pins: HashMap::new(),
            doomed: HashMap::new(),
            reserved: 0,
        }
    }

    /// A free near place for a write, if the near tier has one.
    pub(super) fn alloc_near(&mut self) -> Option<Place> {
        let p = self.near.alloc().map(Place::Near);
        self.reserved += u64::from(p.is_some());
        p
    }

    /// A free far place for a write or a migration's copy.
    pub(super) fn alloc_far(&mut self) -> Option<Place> {
        let p = self.far.alloc().map(Place::Far);
        self.reserved += u64::from(p.is_some());
        p
    }

    /// Near places in use (pages, doomed places, writes in flight), and the near tier's size.
    pub(super) fn near_usage(&self) -> (u32, u32) {
        (self.near.used, self.near.cap)
    }

    /// Far places in use.
    pub(super) fn far_used(&self) -> u32 {
        self.far.used
    }

    /// Pages the index maps, near and far.
    pub(super) fn pages(&self) -> (usize, usize) {
        let near = self.cold.len();
        (near, self.map.len() - near)
    }

    fn bitmap(&mut self, p: Place) -> &mut Bitmap {
        match p {
            Place::Near(_) => &mut self.near,
            Place::Far(_) => &mut self.far,
        }
    }

    /// `p` no longer backs a slot: released now, or at its last unpin.
    fn retire(&mut self, p: Place, release: &mut dyn FnMut(Place)) {
        if self.pins.contains_key(&p) {
            self.doomed.insert(p, ());
        } else {
            release(p);
            self.bitmap(p).free(p.index());
        }
    }

    /// A write to `p` (from `alloc_*`) failed: the place goes back.
    pub(super) fn abandon(&mut self, p: Place, release: &mut dyn FnMut(Place)) {
        self.reserved -= 1;
        release(p);
        self.bitmap(p).free(p.index());
    }

    /// `slot`'s page is now at `p` (written there, from `alloc_*`); its old place, if any, is
    /// retired.
    pub(super) fn commit(
        &mut self,
        slot: u32,
        p: Place,
        now_s: u32,
        release: &mut dyn FnMut(Place),
    ) {
        self.reserved -= 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Place::Near(_) = p {
            self.cold.insert(seq, (slot, now_s));
        }
        if let Some(old) = self.map.insert(slot, Entry { place: p, seq }) {
            self.cold.remove(&old.seq);
            self.retire(old.place, release);
        }
    }

    /// `slot` is free: its place is retired.
    pub(super) fn free(&mut self, slot: u32, release: &mut dyn FnMut(Place)) {
        if let Some(old) = self.map.remove(&slot) {
            self.cold.remove(&old.seq);
            self.retire(old.place, release);
        }
    }

    /// Where `slot` is, pinned until [`LocationIndex::unpin`]; `None` if it is in no tier.
    pub(super) fn pin(&mut self, slot: u32) -> Option<Place> {
        let p = self.map.get(&slot)?.place;
        *self.pins.entry(p).or_insert(0) += 1;
        Some(p)
    }

    /// Where `slot` is, without pinning.
    pub(super) fn place(&self, slot: u32) -> Option<Place> {
        self.map.get(&slot).map(|e| e.place)
    }

    /// Lets go of a pin; a doomed place is released at its last.
    pub(super) fn unpin(&mut self, p: Place, release: &mut dyn FnMut(Place)) {
        let n = self.pins.get_mut(&p).expect("unpinning a place not pinned");
        *n -= 1;
        if *n == 0 {
            self.pins.remove(&p);
            if self.doomed.remove(&p).is_some() {
                release(p);
                self.bitmap(p).free(p.index());
            }
        }
    }

    /// Up to `max` of the oldest near pages, each pinned: all of them if `all`, else only those
    /// written at or before `cutoff_s`.
    pub(super) fn coldest(&mut self, max: usize, all: bool, cutoff_s: u32) -> Vec<Cold> {
        let picked: Vec<Cold> = self
            .cold
            .values()
            .take_while(|&&(_, at)| all || at <= cutoff_s)
            .take(max)
            .map(|&(slot, _)| {
                let near = self.map[&slot].place.index();
                Cold { slot, near }
            })
            .collect();
        for c in &picked {
            *self.pins.entry(Place::Near(c.near)).or_insert(0) += 1;
        }
        picked
    }

    /// The migrator copied `c` to `to`: the slot now maps there if it still maps to the near
    /// place copied (true); otherwise the copy is released (false). The caller still unpins
    /// the near place.
    pub(super) fn switch(&mut self, c: Cold, to: Place, release: &mut dyn FnMut(Place)) -> bool {
        match self.map.get(&c.slot) {
            Some(e) if e.place == Place::Near(c.near) => {
                self.commit(c.slot, to, 0, release);
                true
            }
            _ => {
                self.abandon(to, release);
                false
            }
        }
    }

    /// Heap bytes of the index (counted in the daemon's metadata).
    pub(super) fn heap_bytes(&self) -> usize {
        // A hash table entry is its key and value plus a control byte; a B-tree entry its key
        // and value and about a third more for its nodes' slack.
        self.map.capacity() * (std::mem::size_of::<(u32, Entry)>() + 1)
            + self.cold.len() * std::mem::size_of::<(u64, (u32, u32))>() * 4 / 3
            + self.pins.capacity() * (std::mem::size_of::<(Place, u32)>() + 1)
            + self.near.heap_bytes()
            + self.far.heap_bytes()
    }

    /// Checks every invariant (tests, and debug builds at the end of a migration batch).
    pub(super) fn check_integrity(&self) -> Result<(), String> {
        let mut seen: HashMap<Place, u32> = HashMap::new();
        for (&slot, e) in &self.map {
            if let Some(other) = seen.insert(e.place, slot) {
                return Err(format!("{:?} backs slots {other} and {slot}", e.place));
            }
            let set = match e.place {
                Place::Near(i) => self.near.is_set(i),
                Place::Far(i) => self.far.is_set(i),
            };
            if !set {
                return Err(format!("slot {slot} maps to free {:?}", e.place));
            }
            if matches!(e.place, Place::Near(_))
                != self.cold.get(&e.seq).is_some_and(|c| c.0 == slot)
            {
                return Err(format!("slot {slot}: cold list disagrees ({:?})", e.place));
            }
            if self.doomed.contains_key(&e.place) {
                return Err(format!("slot {slot} maps to doomed {:?}", e.place));
            }
        }
        if self.cold.len()
            != self
                .map
                .values()
                .filter(|e| matches!(e.place, Place::Near(_)))
                .count()
        {
            return Err("the cold list holds pages no slot maps to".into());
        }
        for p in self.doomed.keys() {
            if !self.pins.contains_key(p) {
                return Err(format!("doomed {p:?} is not pinned"));
            }
        }
        let used = u64::from(self.near.used) + u64::from(self.far.used);
        let held = self.map.len() as u64 + self.doomed.len() as u64 + self.reserved;
        if used != held {
            return Err(format!(
                "{used} places allocated, {held} accounted for (pages, doomed, in flight)"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashSet};

    /// The devices as the model sees them: the value each place holds, and released places.
    #[derive(Default)]
    struct Devices {
        held: HashMap<Place, u64>,
    }

    impl Devices {
        fn release(&mut self) -> impl FnMut(Place) + '_ {
            |p| {
                assert!(
                    self.held.remove(&p).is_some(),
                    "{p:?} released twice or never written"
                );
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Store a value in a slot (a new page, or a rewrite), near if there is room.
        Write(u32, bool),
        /// Free a slot.
        Free(u32),
        /// A reader looks a slot up and pins its place (read later).
        BeginRead(u32),
        /// The oldest reader reads its place and unpins.
        EndRead,
        /// The migrator takes up to n cold pages and reads them (copies made later).
        BeginMigrate(usize),
        /// The migrator writes its copies and switches.
        EndMigrate,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..24, any::<bool>()).prop_map(|(s, n)| Op::Write(s, n)),
            2 => (0u32..24).prop_map(Op::Free),
            2 => (0u32..24).prop_map(Op::BeginRead),
            2 => Just(Op::EndRead),
            1 => (1usize..6).prop_map(Op::BeginMigrate),
            1 => Just(Op::EndMigrate),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Against a model (a `BTreeMap` of slot to value): every read, including ones that
        /// began before a migration, a free or a rewrite of their slot, returns the value the
        /// slot held when the read looked it up; every slot reads its newest value; no place
        /// backs two slots or is released while pinned or twice; and when everything is let go
        /// the allocators hold exactly the slots' places.
        #[test]
        fn the_index_agrees_with_a_model(ops in proptest::collection::vec(op(), 1..120)) {
            let mut ix = LocationIndex::new(8, 64);
            let mut dev = Devices::default();
            let mut model: BTreeMap<u32, u64> = BTreeMap::new();
            let mut readers: Vec<(Place, u64)> = Vec::new();
            let mut migrating: Vec<(Cold, u64)> = Vec::new();
            let mut next = 1u64;
            for op in ops {
                match op {
                    Op::Write(slot, near) => {
                        let p = if near { ix.alloc_near() } else { None };
                        let Some(p) = p.or_else(|| ix.alloc_far()) else { continue };
                        prop_assert!(!dev.held.contains_key(&p), "{:?} handed out while held", p);
                        dev.held.insert(p, next);
                        ix.commit(slot, p, 0, &mut dev.release());
                        model.insert(slot, next);
                        next += 1;
                    }
                    Op::Free(slot) => {
                        ix.free(slot, &mut dev.release());
                        model.remove(&slot);
                    }
                    Op::BeginRead(slot) => {
                        let p = ix.pin(slot);
                        prop_assert_eq!(p.is_some(), model.contains_key(&slot));
                        if let Some(p) = p {
                            readers.push((p, model[&slot]));
                        }
                    }
                    Op::EndRead => {
                        if !readers.is_empty() {
                            let (p, want) = readers.remove(0);
                            prop_assert_eq!(dev.held.get(&p).copied(), Some(want), "a read of {:?}", p);
                            ix.unpin(p, &mut dev.release());
                        }
                    }
                    Op::BeginMigrate(n) => {
                        if migrating.is_empty() {
                            for c in ix.coldest(n, true, 0) {
                                let v = dev.held[&Place::Near(c.near)];
                                migrating.push((c, v));
                            }
                        }
                    }
                    Op::EndMigrate => {
                        for (c, v) in std::mem::take(&mut migrating) {
                            if let Some(to) = ix.alloc_far() {
                                dev.held.insert(to, v);
                                ix.switch(c, to, &mut dev.release());
                            }
                            ix.unpin(Place::Near(c.near), &mut dev.release());
                        }
                    }
                }
                ix.check_integrity().map_err(TestCaseError::fail)?;
                for (&slot, &v) in &model {
                    let p = ix.place(slot).expect("a stored slot has a place");
                    prop_assert_eq!(dev.held.get(&p).copied(), Some(v), "slot {}", slot);
                }
            }
            for (c, _) in std::mem::take(&mut migrating) {
                ix.unpin(Place::Near(c.near), &mut dev.release());
            }
            for (p, _) in std::mem::take(&mut readers) {
                ix.unpin(p, &mut dev.release());
            }
            ix.check_integrity().map_err(TestCaseError::fail)?;
            let places: HashSet<Place> = model.keys().map(|&s| ix.place(s).unwrap()).collect();
            prop_assert_eq!(places.len(), model.len());
            prop_assert_eq!(dev.held.keys().copied().collect::<HashSet<_>>(), places);
            prop_assert_eq!(ix.near.used + ix.far.used, model.len() as u32);
        }
    }

    #[test]
    fn the_bitmap_fills_grows_and_reuses() {
        let mut b = Bitmap::new(130);
        let got: Vec<u32> = (0..130).map(|_| b.alloc().unwrap()).collect();
        assert_eq!(got, (0..130).collect::<Vec<_>>(), "consecutive while free");
        assert_eq!(b.alloc(), None, "full at its capacity");
        b.free(5);
        b.free(129);
        let mut again = [b.alloc().unwrap(), b.alloc().unwrap()];
        again.sort_unstable();
        assert_eq!(again, [5, 129]);
        assert_eq!(b.alloc(), None);
    }

    /// Oldest first, and by age only those written at or before the cutoff.
    #[test]
    fn coldest_is_oldest_first() {
        let mut ix = LocationIndex::new(16, 16);
        let mut rel = |_p: Place| {};
        for (slot, at) in [(7u32, 1u32), (3, 5), (9, 9)] {
            let p = ix.alloc_near().unwrap();
            ix.commit(slot, p, at, &mut rel);
        }
        let c = ix.coldest(2, true, 0);
        assert_eq!(c.iter().map(|c| c.slot).collect::<Vec<_>>(), [7, 3]);
        for c in c {
            ix.unpin(Place::Near(c.near), &mut rel);
        }
        let c = ix.coldest(8, false, 4);
        assert_eq!(c.iter().map(|c| c.slot).collect::<Vec<_>>(), [7]);
        ix.unpin(Place::Near(c[0].near), &mut rel);
        ix.check_integrity().unwrap();
    }
}
