//! The readahead window of one address space: how many of the evicted pages that follow a
//! faulting page a restore brings back with it.
//!
//! The kernel's VMA swap readahead (`mm/swap_state.c`: `swap_vma_ra_win`, `__swapin_nr_pages`)
//! keeps, per VMA, the last fault address, the last window and the readahead hits since (the
//! `swap_readahead_info` word): readahead pages sit in the swap cache unmapped, so a use of one
//! is a minor fault that finds it there and counts a hit. The next window is the hits plus two
//! rounded up to a power of two; with no hits it is one page unless the fault is next to the
//! last one, and it never shrinks below half the last window in one step. So a stream whose
//! pages are used keeps a full window, and readahead whose pages go unused stops.
//!
//! Here a page read ahead is mapped at once (a fault is a round trip to the daemon, which is
//! what readahead saves), so a read of it makes no fault and the daemon cannot count hits the
//! kernel's way. What it can see ([`Readahead::observe`]):
//!
//! * a fault that continues a run's stream (at the run's end, or up to a maximum window past
//!   it: a run stops at a page already present, which the program reads without a fault) went
//!   past the run's pages: they were read on the way (hits; a stream that strides over pages
//!   counts them as read);
//! * a stream that makes no further fault while [`STREAMS`] newer ones do left its last run
//!   behind: its pages still unused are misses (though the program may come back for them);
//! * and, whenever it happens, a write-protect fault on a page read ahead (`access =
//!   "faults+wp"`): a hit.
//!
//! The page table marks each page read ahead until a use is seen or it leaves (`mm.rs`), which
//! is what `Stats::readahead_hit_pages` and `readahead_unused_pages` count (the latter when a
//! marked page is evicted, removed, or still there at exit: the measure of waste).
//!
//! **Streams.** The kernel keeps one readahead state per VMA. Here a fault is matched to the
//! most recent of [`STREAMS`] streams whose last run it continues, and a fault that continues
//! none starts a stream in the place of the least recently used. So a sequential reader keeps
//! its window while the same program faults elsewhere in between (its own metadata, another
//! thread's stream): with one state per address space, a test client that updates a small
//! array of counters as it reads had its window halved by each fault on the array, and read
//! about 3 pages ahead per fault instead of 15.
//!
//! **The window** of a stream is sized in two parts:
//!
//! 1. **Position**: it doubles (up to the maximum, `2^page_cluster`) while the stream's faults
//!    continue its last run (at most [`SLACK_PAGES`] past its end), and halves otherwise; a new
//!    stream starts at one page. So random faults never read ahead, and a stride of more than
//!    three pages never starts readahead.
//! 2. **Hit ratio** (one per address space): the share of readahead pages judged used, an
//!    average over the last few dozen outcomes ([`Readahead::record`]: each moves it a
//!    sixteenth of the way to 1 for a hit, to 0 for a miss), starting at 1. It caps the window
//!    at `ratio × maximum`, rounded to the nearest page: the full window while at least 97% of
//!    the pages are used, none (one page) below `1.5 / maximum` (1 in 11 for 16). Sequential
//!    streams, whose pages are all used, keep the full window. Faults that come in adjacent
//!    pairs on random records (8 KiB objects) double the window at the second page of each
//!    pair and read ahead a page nobody uses; each is a miss a few pairs later, and readahead
//!    stops.
//!
//! A window the cap cut short is judged at its stream's next fault instead (a probe): a fault
//! past the end of the run continues the stream into the pages a longer window would have
//! read, which counts as a hit; a stream that goes no further, as a miss. So a ratio that fell
//! to 0 rises again with a sequential stream (two pages from its fourth fault on, the full
//! window some fifteen faults later) and stays near 0 under random pairs (two records that lie
//! next to each other let a few pages through).
//!
//! Why misses are judged when a stream is left and not when a page leaves unused: a page read
//! ahead is evicted only once it has aged through the oldest generation, thousands of faults
//! later. Tried that way, the ratio learned so late that random pairs still read ahead a page
//! for every 18 swapped in (24% with position alone).

use std::ops::Range;

use crate::sys::{PAGE_SIZE, PAGE_SIZE_U64};

/// Pages past the end of a stream's last run a fault may land and still double its window: a
/// run stops at a page already present, which the program reads without a fault.
pub(crate) const SLACK_PAGES: u64 = 2;

/// Streams followed per address space.
pub(crate) const STREAMS: usize = 8;

/// 1.0 in the hit ratio's fixed point.
const ONE: u32 = 1 << 16;

/// Each outcome moves the ratio `1 / 2^WEIGHT_SHIFT` of the way to 1 (hit) or 0 (miss).
const WEIGHT_SHIFT: u32 = 4;

/// Outcomes of one kind applied at once at most: after 64 alike the ratio is within 2% of
/// their value, and a long run of them costs no more than 64 steps.
const MAX_STEPS: u64 = 64;

/// One stream: where its last run was, and its window.
#[derive(Debug, Clone, Copy, Default)]
struct Stream {
    /// Holds a run.
    live: bool,
    /// Its last run, `[start, end)`.
    start: u64,
    end: u64,
    /// Its last window, in pages.
    window: usize,
    /// The last window was cut by the hit ratio: the stream's next fault (or its end) judges
    /// what a longer one would have read.
    capped: bool,
    /// The last run's readahead pages have been judged.
    judged: bool,
    /// When it last restored a run (for least-recently-used replacement).
    used: u64,
}

/// The fault being served, from [`Readahead::observe`] to [`Readahead::restored`]: a retried
/// fault (`EAGAIN`: an event was queued) is the same fault, judged once and given the same
/// window.
#[derive(Debug, Clone, Copy)]
struct Current {
    addr: u64,
    /// Its stream, once it has one (a restore fault, or a fault that continues a stream).
    stream: Option<usize>,
    /// The window chosen for it.
    window: Option<usize>,
}

/// The readahead state of one address space (kept by its fault handler).
#[derive(Debug, Clone)]
pub(crate) struct Readahead {
    streams: [Stream; STREAMS],
    /// Runs restored so far (the streams' clock).
    tick: u64,
    /// Share of judged readahead pages that were used, in 1/65536.
    ratio: u32,
    current: Option<Current>,
    /// The largest window asked for last (the slack of a stream's continuation).
    max: usize,
}

/// What a fault tells of the readahead pages of a run (page address ranges, either empty).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct RunOutcome {
    /// Pages the fault went past: read on the way.
    pub(crate) passed: Range<u64>,
    /// Pages of a run left behind: unused so far.
    pub(crate) left: Range<u64>,
}

/// The pages of a range of page addresses.
pub(crate) fn pages(r: &Range<u64>) -> impl Iterator<Item = u64> {
    r.clone().step_by(PAGE_SIZE)
}

impl Default for Readahead {
    fn default() -> Self {
        Readahead {
            streams: [Stream::default(); STREAMS],
            tick: 0,
            ratio: ONE,
            current: None,
            max: 1,
        }
    }
}

impl Stream {
    /// Whether a fault at `addr` continues this stream: at its last run's first page or
    /// later, at most `slack` pages past its end.
    fn continues(&self, addr: u64, slack: u64) -> bool {
        self.live && addr >= self.start && addr <= self.end + slack * PAGE_SIZE_U64
    }

    /// The readahead pages of its last run (those after the faulting page).
    fn ahead(&self) -> Range<u64> {
        let first = self.start + PAGE_SIZE_U64;
        first..self.end.max(first)
    }
}

impl Readahead {
    /// Every missing fault, first: what a fault at `addr` tells of earlier runs (`restore`:
    /// it restores a stored page, and so may start a stream). A fault that continues a
    /// stream, at most `max` pages (the largest window) past its last run, went past the
    /// run's pages (all of them when it lies at or past the run's end; those up to it when it
    /// lies inside the run, a page of which was evicted before the stream reached it: the rest
    /// are not judged). A restore fault that continues none starts a stream in the place of
    /// the least recently used, whose last run, if not judged yet, was left behind.
    ///
    /// The caller counts as hits the passed pages still marked read ahead (clearing their
    /// marks), as misses the left pages still marked, and [`Readahead::record`]s both.
    pub(crate) fn observe(&mut self, addr: u64, max: usize, restore: bool) -> RunOutcome {
        if self.current.is_some_and(|c| c.addr == addr) {
            return RunOutcome::default();
        }
        self.current = Some(Current {
            addr,
            stream: None,
            window: None,
        });
        self.max = max;
        let slack = SLACK_PAGES.max(max as u64);
        let matched = (0..STREAMS)
            .filter(|&i| self.streams[i].continues(addr, slack))
            .max_by_key(|&i| self.streams[i].used);
        if let Some(i) = matched {
            self.set_stream(i);
            let s = &mut self.streams[i];
            if s.judged || addr == s.start {
                return RunOutcome::default();
            }
            s.judged = true;
            let ahead = s.ahead();
            let passed = ahead.start..addr.clamp(ahead.start, ahead.end);
            return RunOutcome {
                passed: if passed.is_empty() { 0..0 } else { passed },
                left: 0..0,
            };
        }
        if !restore {
            return RunOutcome::default();
        }
        let i = (0..STREAMS)
            .min_by_key(|&i| (self.streams[i].live, self.streams[i].used))
            .unwrap_or(0);
        let old = std::mem::take(&mut self.streams[i]);
        self.set_stream(i);
        if old.capped {
            self.judge(false);
        }
        RunOutcome {
            passed: 0..0,
            left: if old.live && !old.judged && !old.ahead().is_empty() {
                old.ahead()
            } else {
                0..0
            },
        }
    }

    fn set_stream(&mut self, i: usize) {
        if let Some(c) = &mut self.current {
            c.stream = Some(i);
        }
    }

    /// Records outcomes of readahead pages: `hits` seen used, `misses` judged unused (the
    /// misses first: when both come at once, the hits are the newer news).
    pub(crate) fn record(&mut self, hits: u64, misses: u64) {
        for _ in 0..misses.min(MAX_STEPS) {
            self.judge(false);
        }
        for _ in 0..hits.min(MAX_STEPS) {
            self.judge(true);
        }
    }

    /// Moves the ratio a step towards 1 (used) or 0; at least one unit, so that it reaches
    /// either end.
    fn judge(&mut self, used: bool) {
        let target = if used { i64::from(ONE) } else { 0 };
        let delta = target - i64::from(self.ratio);
        let step = match delta >> WEIGHT_SHIFT {
            0 => delta.signum(),
            s => s,
        };
        self.ratio = (i64::from(self.ratio) + step) as u32;
    }

    /// The most pages the hit ratio allows: `ratio × max` rounded to the nearest page, at
    /// least one.
    fn cap(&self, max: usize) -> usize {
        let pages = (u64::from(self.ratio) * max as u64 + u64::from(ONE / 2)) >> 16;
        (pages as usize).clamp(1, max.max(1))
    }

    /// The window for a restore fault at `addr`, in pages (the faulting one included), at most
    /// `max`: its stream's, after [`Readahead::observe`] (called here if it was not).
    pub(crate) fn window(&mut self, addr: u64, max: usize) -> usize {
        let c = match self.current {
            Some(c) if c.addr == addr && c.stream.is_some() => c,
            _ => {
                self.current = None;
                self.observe(addr, max, true);
                match self.current {
                    Some(c) => c,
                    None => return 1,
                }
            }
        };
        if let Some(w) = c.window {
            return w;
        }
        let i = c.stream.unwrap_or(0);
        let s = self.streams[i];
        let continues = s.continues(addr, SLACK_PAGES);
        if s.capped {
            self.judge(continues && addr >= s.end);
        }
        let wanted = if !s.live {
            1
        } else if continues {
            (s.window * 2).min(max)
        } else {
            (s.window / 2).max(1)
        };
        let cap = self.cap(max);
        let window = wanted.min(cap);
        let s = &mut self.streams[i];
        s.capped = wanted > cap;
        s.window = window;
        if let Some(c) = &mut self.current {
            c.window = Some(window);
        }
        window
    }

    /// The fault at `addr` filled `pages` pages from there on: its stream's last run now
    /// (a fault that did not go through [`Readahead::window`], such as a restore of a page
    /// mid-eviction, keeps its stream's window).
    pub(crate) fn restored(&mut self, addr: u64, pages: usize) {
        if !self
            .current
            .is_some_and(|c| c.addr == addr && c.stream.is_some())
        {
            self.current = None;
            self.observe(addr, self.max, true);
        }
        let Some(i) = self.current.take().and_then(|c| c.stream) else {
            return;
        };
        self.tick += 1;
        // The pages of this run are judged with it, not with an older run of another stream
        // that held them (they were evicted and faulted again since).
        let end = addr + pages as u64 * PAGE_SIZE_U64;
        for s in &mut self.streams {
            let ahead = s.ahead();
            if s.live && ahead.start < end && addr < ahead.end {
                s.judged = true;
            }
        }
        let s = &mut self.streams[i];
        s.live = true;
        s.start = addr;
        s.end = end;
        s.judged = false;
        s.window = s.window.max(1);
        s.used = self.tick;
    }

    /// The hit ratio, 0 to 1 (tests).
    #[cfg(test)]
    fn ratio(&self) -> f64 {
        f64::from(self.ratio) / f64::from(ONE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const P: u64 = PAGE_SIZE_U64;
    const MAX: usize = 16;
    const BASE: u64 = 0x7f00_0000_0000;

    fn splitmix(x: &mut u64) -> u64 {
        *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// One restore fault as the fault path makes it, for a program that reads every page it
    /// goes past (no page evicted or written in between, so every judged page is still marked
    /// read ahead): observed, judged, then the window, then the run (at most `restored`
    /// pages: a run stops at a page that is not evicted). Returns the window.
    fn fault(ra: &mut Readahead, addr: u64, restored: usize) -> usize {
        let o = ra.observe(addr, MAX, true);
        ra.record(
            pages(&o.passed).count() as u64,
            pages(&o.left).count() as u64,
        );
        let w = ra.window(addr, MAX);
        ra.restored(addr, w.min(restored));
        w
    }

    /// A stream reading from `BASE + k GiB` on, one fault per run.
    struct Reader {
        at: u64,
        windows: Vec<usize>,
    }

    impl Reader {
        fn new(k: u64) -> Self {
            Reader {
                at: BASE + (k << 30),
                windows: Vec::new(),
            }
        }

        fn step(&mut self, ra: &mut Readahead) {
            let w = fault(ra, self.at, MAX);
            self.windows.push(w);
            self.at += w as u64 * P;
        }
    }

    /// The windows of one sequential stream whose pages are all used: doubling to the full
    /// window, then kept.
    fn full_ramp(n: usize) -> Vec<usize> {
        (0..n).map(|k| (1 << k.min(4)).min(MAX)).collect()
    }

    #[test]
    fn a_sequential_stream_reaches_and_keeps_the_full_window() {
        let mut ra = Readahead::default();
        let mut r = Reader::new(0);
        for _ in 0..20 {
            r.step(&mut ra);
        }
        assert_eq!(r.windows, full_ramp(20));
        assert_eq!(ra.ratio(), 1.0);
    }

    /// Streams keep their windows while the program faults elsewhere in between: other
    /// streams (up to [`STREAMS`]) and random pages.
    #[test]
    fn interleaved_streams_keep_their_windows() {
        let mut ra = Readahead::default();
        let mut readers: Vec<Reader> = (0..STREAMS as u64 - 1).map(Reader::new).collect();
        let mut x = 5u64;
        for _ in 0..30 {
            for r in &mut readers {
                r.step(&mut ra);
            }
            // A random page (the program's metadata, say): a stream of its own.
            fault(
                &mut ra,
                BASE + (100 << 30) + splitmix(&mut x) % (1 << 20) * P,
                MAX,
            );
        }
        for r in &readers {
            assert_eq!(r.windows, full_ramp(30));
        }
        // Beyond what it follows, the least recently used stream starts over.
        let mut ra = Readahead::default();
        let mut readers: Vec<Reader> = (0..STREAMS as u64 + 1).map(Reader::new).collect();
        for _ in 0..10 {
            for r in &mut readers {
                r.step(&mut ra);
            }
        }
        assert!(readers.iter().all(|r| r.windows.iter().all(|&w| w == 1)));
    }

    #[test]
    fn random_faults_read_nothing_ahead() {
        let mut ra = Readahead::default();
        let mut x = 7u64;
        let ahead: usize = (0..1000)
            .map(|_| fault(&mut ra, BASE + splitmix(&mut x) % 262_144 * P, MAX) - 1)
            .sum();
        assert_eq!(ahead, 0, "random faults read ahead");
    }

    /// Pairs of adjacent faults at random places (8 KiB records): position alone reads one
    /// page ahead at the second fault of each pair, and nobody uses it; each is a miss when
    /// its stream is dropped a few pairs later, and readahead stops.
    #[test]
    fn readahead_whose_pages_go_unused_stops() {
        let mut ra = Readahead::default();
        let mut x = 11u64;
        let mut ahead = Vec::new();
        for _ in 0..5000 {
            let p = BASE + splitmix(&mut x) % 131_072 * 2 * P;
            ahead.push(fault(&mut ra, p, MAX) + fault(&mut ra, p + P, MAX) - 2);
        }
        assert!(ahead[..10].iter().all(|&n| n == 1), "{:?}", &ahead[..10]);
        let first: usize = ahead[..100].iter().sum();
        assert!(
            first < 60,
            "{first} pages read ahead in the first 100 pairs"
        );
        let rest: usize = ahead[100..].iter().sum();
        assert!(
            rest <= 10,
            "{rest} pages read ahead after the first 100 pairs"
        );
        assert!(ra.ratio() < 0.01, "ratio {}", ra.ratio());
    }

    #[test]
    fn a_stream_after_unused_readahead_gets_its_window_back() {
        let mut ra = Readahead::default();
        while ra.ratio() > 0.0 {
            ra.record(0, 256);
        }
        let mut r = Reader::new(0);
        for _ in 0..40 {
            r.step(&mut ra);
        }
        assert_eq!(&r.windows[..4], &[1, 1, 1, 2], "probes, then readahead");
        let full = r
            .windows
            .iter()
            .position(|&w| w == MAX)
            .expect("never full");
        assert!(
            full <= 25,
            "full window only at fault {full}: {:?}",
            r.windows
        );
        assert!(
            r.windows[full..].iter().all(|&w| w == MAX),
            "{:?}",
            r.windows
        );
    }

    /// A fault retried after `EAGAIN` is the same fault: the same window, judged once, and
    /// the probe it carries is not judged by its own retry.
    #[test]
    fn a_retried_fault_gets_the_same_window() {
        let mut ra = Readahead::default();
        while ra.ratio() > 0.0 {
            ra.record(0, 256);
        }
        fault(&mut ra, BASE, MAX);
        assert_eq!(ra.window(BASE + P, MAX), 1, "capped: a probe");
        assert_eq!(ra.observe(BASE + P, MAX, true), RunOutcome::default());
        assert_eq!(ra.window(BASE + P, MAX), 1);
        assert_eq!(ra.ratio(), 0.0, "the retry judged its own probe");
        ra.restored(BASE + P, 1);
        fault(&mut ra, BASE + 2 * P, MAX);
        assert!(ra.ratio() > 0.0, "the stream's next fault judges it");
        // Without a cap as well: a retry does not double the window again.
        let mut ra = Readahead::default();
        fault(&mut ra, BASE, MAX);
        let o = ra.observe(BASE + P, MAX, true);
        assert_eq!(ra.window(BASE + P, MAX), 2);
        assert_eq!(ra.observe(BASE + P, MAX, true), RunOutcome::default());
        assert_eq!(ra.window(BASE + P, MAX), 2);
        assert_eq!(
            o,
            RunOutcome::default(),
            "a run of one page has nothing to judge"
        );
    }

    #[test]
    fn the_cap_follows_the_ratio() {
        let mut ra = Readahead::default();
        assert_eq!(ra.cap(MAX), 16);
        for (ratio, cap) in [
            (1.0, 16),
            (0.97, 16),
            (0.75, 12),
            (0.5, 8),
            (0.3, 5),
            (0.2, 3),
            (0.09, 1),
        ] {
            ra.ratio = (ratio * f64::from(ONE)) as u32;
            assert_eq!(ra.cap(MAX), cap, "ratio {ratio}");
        }
        ra.ratio = ONE;
        assert_eq!(ra.cap(1), 1, "page_cluster 0: never a readahead");
    }

    #[test]
    fn a_run_is_passed_by_a_fault_that_continues_it() {
        let judge = |addr: u64| {
            let mut ra = Readahead::default();
            ra.observe(BASE, MAX, true);
            ra.restored(BASE, 4);
            ra.observe(addr, MAX, true)
        };
        let run = BASE + P..BASE + 4 * P;
        let passed = |r| RunOutcome {
            passed: r,
            left: 0..0,
        };
        assert_eq!(judge(BASE + 4 * P), passed(run.clone()));
        assert_eq!(
            judge(BASE + 20 * P),
            passed(run.clone()),
            "a maximum window on"
        );
        assert_eq!(judge(BASE + 21 * P), RunOutcome::default(), "elsewhere");
        assert_eq!(judge(BASE - P), RunOutcome::default());
        assert_eq!(
            judge(BASE + 2 * P),
            passed(BASE + P..BASE + 2 * P),
            "inside the run, a page of which was evicted early: the rest is not judged"
        );
        assert_eq!(judge(BASE), RunOutcome::default(), "the run's own page");
    }

    /// A stream dropped for a new one left its last run behind; one that goes on is judged
    /// once.
    #[test]
    fn a_run_is_left_when_its_stream_is_dropped() {
        let mut ra = Readahead::default();
        fault(&mut ra, BASE, MAX);
        fault(&mut ra, BASE + P, MAX); // run [1, 3)
        let mut left = Vec::new();
        for k in 1..=STREAMS as u64 {
            let o = ra.observe(BASE + (k << 30), MAX, true);
            left.push(o.left.clone());
            ra.window(BASE + (k << 30), MAX);
            ra.restored(BASE + (k << 30), 1);
        }
        let lost = BASE + 2 * P..BASE + 3 * P;
        assert_eq!(left.iter().filter(|r| !r.is_empty()).count(), 1);
        assert_eq!(
            left[STREAMS - 1],
            lost,
            "dropped with the eighth new stream"
        );
        // A fault that continues a stream but restores nothing (a zero fill) judges it, and
        // starts no stream when it continues none.
        let mut ra = Readahead::default();
        fault(&mut ra, BASE, MAX);
        fault(&mut ra, BASE + P, MAX);
        assert_eq!(
            ra.observe(BASE + 3 * P, MAX, false).passed,
            BASE + 2 * P..BASE + 3 * P
        );
        assert_eq!(ra.observe(BASE + 99 * P, MAX, false), RunOutcome::default());
        assert_eq!(ra.streams.iter().filter(|s| s.live).count(), 1);
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A fault at page `p` (restoring or not) whose run stops after at most `n` pages.
        Fault(u64, bool, usize),
        /// Outcomes recorded (write-protect hits, say).
        Record(u64, u64),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let op = prop_oneof![
            // Faults mostly near each other (streams), some anywhere.
            6 => (0u64..96, any::<bool>(), 1usize..=16).prop_map(|(p, r, n)| Op::Fault(p, r, n)),
            2 => (0u64..1 << 20, any::<bool>(), 1usize..=16)
                .prop_map(|(p, r, n)| Op::Fault(p, r, n)),
            1 => (0u64..40, 0u64..300).prop_map(|(h, u)| Op::Record(h, u)),
        ];
        prop::collection::vec(op, 1..400)
    }

    proptest! {
        /// Against a model of the pages read ahead and not judged yet (a set): every page
        /// judged was read ahead in a run and is judged once; the window is from 1 page to
        /// the maximum and never above what the ratio allowed when it was chosen; the ratio
        /// stays within 0..=1.
        #[test]
        fn pages_are_judged_once_and_windows_stay_in_bounds(ops in ops(), shift in 0u32..=4) {
            let max = 1usize << shift;
            let mut ra = Readahead::default();
            let mut unjudged: BTreeSet<u64> = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Fault(p, restore, n) => {
                        let addr = BASE + p * P;
                        let o = ra.observe(addr, max, restore);
                        prop_assert!(o.passed.is_empty() || o.left.is_empty());
                        for a in pages(&o.passed).chain(pages(&o.left)) {
                            prop_assert!(unjudged.remove(&a), "page {:#x} judged twice or never read ahead", a);
                        }
                        ra.record(pages(&o.passed).count() as u64, pages(&o.left).count() as u64);
                        if restore {
                            let w = ra.window(addr, max);
                            prop_assert!((1..=max).contains(&w), "window {}", w);
                            // (The ratio changes in `window` only before the cap is taken.)
                            prop_assert!(w <= ra.cap(max), "window {} above cap {}", w, ra.cap(max));
                            let run = w.min(n);
                            ra.restored(addr, run);
                            // The run's pages, read ahead now (a page read ahead again is
                            // judged at most once more: the older mark is gone with it).
                            for k in 1..run as u64 {
                                unjudged.insert(addr + k * P);
                            }
                        }
                    }
                    Op::Record(h, u) => ra.record(h, u),
                }
                prop_assert!(ra.ratio <= ONE);
            }
        }

        /// Four sequential streams, stepped in rounds in any order, with a random fault (a
        /// stream of its own) at any point of each round, each keep the windows of a stream
        /// alone: with every page used, the streams cost a sequential reader nothing.
        #[test]
        fn interleaved_streams_each_ramp_as_if_alone(
            rounds in prop::collection::vec((Just([0usize, 1, 2, 3]).prop_shuffle(), 0usize..5), 1..60),
            noise in 0u64..1 << 20,
        ) {
            let mut ra = Readahead::default();
            let mut readers: Vec<Reader> = (0..4).map(Reader::new).collect();
            let mut x = noise;
            for (order, random_after) in rounds {
                for (j, k) in order.into_iter().enumerate() {
                    readers[k].step(&mut ra);
                    if j == random_after {
                        fault(&mut ra, BASE + (100 << 30) + splitmix(&mut x) % (1 << 20) * P, MAX);
                    }
                }
            }
            for r in &readers {
                prop_assert_eq!(&r.windows, &full_ramp(r.windows.len()));
            }
        }
    }
}
