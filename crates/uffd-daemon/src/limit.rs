//! The resident limit, the memory stall of the tree, and the controller that sets the limit
//! from that stall (`--limit auto`).
//!
//! **The limit** ([`Limit`]) is the number of resident pages the tree may hold, with the two
//! watermarks reclaim works between (it starts above `high` and stops at `low`). It can change
//! while the daemon runs: every reader loads it.
//!
//! **The stall** ([`StallMeter`]) is measured, not guessed: a fault is outstanding from the
//! moment its handler reads the message until it is answered, throttling at the limit included
//! (its thread is blocked in the kernel all that time). The meter keeps the kernel's PSI
//! "some" figure for the tree: the wall time during which at least one of its threads waited on
//! a fault; and the sum of all the waits (the mean number of threads stalled). The part of a
//! fault before the handler reads its message (the kernel's queue) is not seen: the handlers
//! poll their uffd, so it is short next to a restore.
//!
//! **The controller** ([`AutoLimit`]) is TMO's Senpai (Weiner et al., ASPLOS'22), per tree and
//! without cgroup v2: every interval it reads the stall of the interval; under the target it
//! lowers the limit below what is resident by a step that shrinks as the stall nears the target
//! (so cold memory leaves at a rate, not in one burst); over it, it raises the limit at once, by
//! up to half, in proportion to the excess. Floor and ceiling bound it; a fixed `--limit` given
//! with `auto` is the ceiling, a hard one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The resident limit and reclaim's watermarks, in pages.
#[derive(Debug)]
pub struct Limit {
    pages: AtomicUsize,
    high: AtomicUsize,
    low: AtomicUsize,
}

impl Limit {
    /// A limit of `pages`, with its watermarks.
    pub fn new(pages: usize) -> Self {
        let l = Limit {
            pages: AtomicUsize::new(0),
            high: AtomicUsize::new(0),
            low: AtomicUsize::new(0),
        };
        l.set(pages);
        l
    }

    /// Sets the limit and its watermarks: reclaim in batches ahead of the limit so that the
    /// limit itself is rarely crossed.
    pub fn set(&self, pages: usize) {
        let pages = pages.max(1);
        let margin = (pages / 16).clamp(64, 4096);
        self.high
            .store(pages.saturating_sub(margin).max(1), Ordering::Relaxed);
        self.low
            .store(pages.saturating_sub(2 * margin).max(1), Ordering::Relaxed);
        self.pages.store(pages, Ordering::Relaxed);
    }

    /// The limit.
    pub fn pages(&self) -> usize {
        self.pages.load(Ordering::Relaxed)
    }

    /// Reclaim starts above this many resident pages ...
    pub fn high(&self) -> usize {
        self.high.load(Ordering::Relaxed)
    }

    /// ... and stops at this many.
    pub fn low(&self) -> usize {
        self.low.load(Ordering::Relaxed)
    }
}

/// Time the tree's threads spent waiting on faults (see the module docs).
#[derive(Debug)]
pub struct StallMeter {
    epoch: Instant,
    some: Mutex<Stretch>,
    total_ns: AtomicU64,
}

#[derive(Debug, Default)]
struct Stretch {
    /// Faults outstanding now.
    outstanding: u64,
    /// Since when at least one was (ns from `epoch`).
    since: u64,
    /// Closed stretches of time with at least one outstanding, in ns.
    ns: u64,
    /// When the last one closed.
    last_end: u64,
}

impl Default for StallMeter {
    fn default() -> Self {
        StallMeter {
            epoch: Instant::now(),
            some: Mutex::new(Stretch::default()),
            total_ns: AtomicU64::new(0),
        }
    }
}

impl StallMeter {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// A fault read at `read_at` turned out to wait on the limit (a restore from a tier, or
    /// throttling): it is outstanding from then. (A first touch served with zeros is not a
    /// stall: it would be one at any limit, as the kernel's PSI does not count minor faults.)
    pub fn begin_at(&self, read_at: Instant) {
        let at = read_at.saturating_duration_since(self.epoch).as_nanos() as u64;
        let mut s = self.some.lock();
        if s.outstanding == 0 {
            // (Not before the end of the last stretch: that time is counted already.)
            s.since = at.max(s.last_end);
        }
        s.outstanding += 1;
    }

    /// A fault read at `read_at` was answered, or given up (its range went away).
    pub fn end(&self, read_at: Instant) {
        self.total_ns
            .fetch_add(read_at.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let now = self.now_ns();
        let mut s = self.some.lock();
        debug_assert!(s.outstanding > 0, "a fault ended that never began");
        s.outstanding = s.outstanding.saturating_sub(1);
        if s.outstanding == 0 {
            s.ns += now.saturating_sub(s.since);
            s.last_end = now;
        }
    }

    /// Wall time with at least one fault outstanding, up to now (PSI's "some"), in ns.
    pub fn some_ns(&self) -> u64 {
        let now = self.now_ns();
        let s = self.some.lock();
        s.ns + if s.outstanding > 0 {
            now.saturating_sub(s.since)
        } else {
            0
        }
    }

    /// The sum of every answered fault's wait, in ns.
    pub fn total_ns(&self) -> u64 {
        self.total_ns.load(Ordering::Relaxed)
    }
}

/// The controller's settings (`--limit auto`, the `[limit]` section).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoConfig {
    /// The stall the controller aims under: a share of wall time, in percent.
    pub target_pct: f64,
    /// The limit never goes below this many pages ...
    pub floor_pages: usize,
    /// ... nor above this many (a fixed `--limit` given with `auto`; else the machine's RAM).
    pub ceiling_pages: usize,
    /// How often the stall is read and the limit set.
    pub interval: Duration,
    /// At most this share of the resident pages is taken away in one interval (when the
    /// stall is zero; less as it nears the target).
    pub probe: f64,
    /// At most this share is added to the limit in one interval (when the stall is twice the
    /// target or more).
    pub backoff: f64,
}

impl AutoConfig {
    /// The defaults: a 1% stall target, probing 2% a second, backing off by up to half.
    pub fn new(floor_pages: usize, ceiling_pages: usize) -> Self {
        AutoConfig {
            target_pct: 1.0,
            floor_pages,
            ceiling_pages,
            interval: Duration::from_secs(1),
            probe: 0.02,
            backoff: 0.5,
        }
    }
}

/// One reading of the controller: when, the limit it set, the stall it read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds since the daemon started.
    pub t: f64,
    /// The limit set after the reading, in pages.
    pub limit_pages: usize,
    /// Resident pages at the reading.
    pub resident_pages: usize,
    /// The stall over the interval, in percent of wall time.
    pub stall_pct: f64,
}

/// Resident pages up by more than this share of themselves in an interval: the program is
/// growing, and the controller does not probe below it.
const GROWING: f64 = 0.01;

/// The shortest time an early reading covers (see [`AutoLimit::tick`]).
pub const EARLY_MIN: Duration = Duration::from_millis(50);

/// The most samples kept: beyond it every other one is dropped (the history halves its rate).
const HISTORY: usize = 4096;

/// The limit controller (see the module docs).
#[derive(Debug)]
pub struct AutoLimit {
    /// Its settings.
    pub cfg: AutoConfig,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    start: Instant,
    last: Instant,
    last_some_ns: u64,
    last_pct: f64,
    history: VecDeque<Sample>,
    changes: u64,
    /// Readings taken before the interval's end, its stall budget spent.
    early: u64,
    ctl: Ctl,
}

/// What the rule remembers of earlier intervals (see [`AutoLimit::decide`]).
#[derive(Debug, Default, Clone, Copy)]
struct Ctl {
    ticks: u64,
    /// Probes in a row that ended under the target.
    streak: u32,
    /// Intervals to wait before the next probe after a stall, and until when.
    hold: u64,
    hold_until: u64,
    /// The last interval began with a probe.
    probed: bool,
    /// Resident pages at the last reading (none before the first).
    last_resident: Option<usize>,
}

impl AutoLimit {
    /// A controller with these settings.
    pub fn new(cfg: AutoConfig) -> Self {
        let now = Instant::now();
        AutoLimit {
            cfg,
            state: Mutex::new(State {
                start: now,
                last: now,
                last_some_ns: 0,
                last_pct: 0.0,
                history: VecDeque::new(),
                changes: 0,
                early: 0,
                ctl: Ctl::default(),
            }),
        }
    }

    /// The limit to start with: the ceiling (the program starts with nothing resident; the
    /// controller brings the limit down from there as it learns what the program bears).
    pub fn initial_pages(&self) -> usize {
        self.cfg.ceiling_pages
    }

    /// The next limit for a stall of `stall_pct` over the last interval, with `limit` set and
    /// `resident` pages resident; `c` is the controller's memory of earlier intervals. The rule,
    /// apart from the clock:
    ///
    /// * under target, and not holding: below what is resident (lowering a limit nothing
    ///   presses against would do nothing) by a step that shrinks to nothing at the target, and
    ///   doubles with each interval in a row that stayed under it (up to a quarter), so that a
    ///   program whose cold memory is large gives it up in a few intervals;
    /// * over target: up at once, from what is resident, in proportion to the excess, by up to
    ///   `backoff`; the step goes back to its start and probing pauses for a number of
    ///   intervals that doubles each time a probe ends in a stall (up to 64), and halves after
    ///   each probe that did not: a limit just below the working set is tried rarely, so that
    ///   the stall it costs averages out under the target. A stall no probe caused pauses
    ///   probing without doubling the pause;
    /// * under target but growing (resident up by more than [`GROWING`] of itself since the
    ///   last reading, or the first reading): no probe. A limit below what a program is still filling throttles the
    ///   fill; the stall it costs is no news about the working set, yet it doubled the pause
    ///   and raised the limit by half (measured on redis filling 600 MiB and usemem filling
    ///   1 GiB: the first probe, taken mid-fill, stalled them 10-16%).
    fn decide(&self, c: &mut Ctl, limit: usize, resident: usize, stall_pct: f64) -> usize {
        let cfg = &self.cfg;
        c.ticks += 1;
        let ratio = stall_pct / cfg.target_pct;
        // (The first reading has nothing to compare with: the program is starting, so growing.)
        let growing = c
            .last_resident
            .is_none_or(|last| resident as f64 > last as f64 * (1.0 + GROWING));
        c.last_resident = Some(resident);
        let next = if ratio >= 1.0 {
            let raise = cfg.backoff * (ratio - 1.0).min(1.0);
            c.streak = 0;
            // (A stall that no probe caused, a program growing or changing phase, is no news
            // about the working set: it pauses probing without lengthening the pause.)
            c.hold = if c.probed {
                (c.hold * 2).clamp(2, 64)
            } else {
                c.hold.max(2)
            };
            c.hold_until = c.ticks + c.hold;
            c.probed = false;
            limit.max((resident as f64 * (1.0 + raise)).ceil() as usize)
        } else if c.ticks < c.hold_until || growing {
            c.probed = false;
            limit
        } else {
            c.probed = true;
            let probe = (cfg.probe * f64::from(1u32 << c.streak.min(8))).min(0.25);
            c.streak += 1;
            if c.streak > 1 {
                // The last probe cost no stall over the target.
                c.hold /= 2;
            }
            let base = limit.min(resident) as f64;
            let cut = (base * probe * (1.0 - ratio)).max(1.0);
            (base - cut) as usize
        };
        next.clamp(
            cfg.floor_pages.max(1),
            cfg.ceiling_pages.max(cfg.floor_pages).max(1),
        )
    }

    /// Reads the stall if an interval has passed, or earlier if the interval's stall budget
    /// is spent already, and sets `limit`; true if it did.
    ///
    /// The early reading: once the stall since the last reading exceeds what the target allows
    /// over a whole interval, the interval cannot end under the target, and waiting for its end
    /// only prolongs the thrashing at a limit the program cannot bear (the measured cause of
    /// most of the stall under `auto`: a probe that cut into the hot set was undone only at
    /// the next reading, a second later). The reading is taken then (at least
    /// [`EARLY_MIN`] after the last), and the limit rises at once, as TMO's Senpai raises a
    /// cgroup's limit as soon as pressure is over its target.
    pub fn tick(&self, limit: &Limit, stall: &StallMeter, resident: usize) -> bool {
        let now = Instant::now();
        let mut st = self.state.lock();
        let wall = now.duration_since(st.last);
        let some = stall.some_ns();
        let budget_ns = self.cfg.target_pct / 100.0 * self.cfg.interval.as_nanos() as f64;
        let early = wall >= EARLY_MIN
            && wall < self.cfg.interval
            && some.saturating_sub(st.last_some_ns) as f64 > budget_ns;
        if wall < self.cfg.interval && !early {
            return false;
        }
        if early {
            st.early += 1;
        }
        let pct =
            (some.saturating_sub(st.last_some_ns)) as f64 / wall.as_nanos().max(1) as f64 * 100.0;
        st.last = now;
        st.last_some_ns = some;
        st.last_pct = pct;
        let old = limit.pages();
        let new = self.decide(&mut st.ctl, old, resident, pct);
        if new != old {
            limit.set(new);
            st.changes += 1;
        }
        if st.history.len() >= HISTORY {
            let kept: VecDeque<Sample> = st.history.iter().copied().step_by(2).collect();
            st.history = kept;
        }
        let t = now.duration_since(st.start).as_secs_f64();
        st.history.push_back(Sample {
            t,
            limit_pages: new,
            resident_pages: resident,
            stall_pct: pct,
        });
        true
    }

    /// The controller's figures into the counters' JSON: the stall of the last interval, the
    /// number of limit changes, and the history of (seconds, limit pages, resident pages,
    /// stall %).
    pub fn to_json(&self, v: &mut serde_json::Value) {
        let st = self.state.lock();
        v["memory_stall_pct"] = st.last_pct.into();
        v["limit_auto"] = true.into();
        v["limit_changes"] = st.changes.into();
        v["limit_early_readings"] = st.early.into();
        v["limit_target_stall_pct"] = self.cfg.target_pct.into();
        v["limit_history"] = st
            .history
            .iter()
            .map(|s| {
                serde_json::json!([
                    (s.t * 1000.0).round() / 1000.0,
                    s.limit_pages,
                    s.resident_pages,
                    (s.stall_pct * 1000.0).round() / 1000.0
                ])
            })
            .collect::<Vec<_>>()
            .into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctl() -> AutoLimit {
        AutoLimit::new(AutoConfig::new(100, 100_000))
    }

    /// A controller's memory that has seen `resident` once (the first reading never probes).
    fn seen(c: &AutoLimit, limit: usize, resident: usize) -> Ctl {
        let mut m = Ctl::default();
        assert_eq!(
            c.decide(&mut m, limit, resident, 0.0),
            limit,
            "first reading"
        );
        m.ticks = 0;
        m
    }

    #[test]
    fn watermarks_follow_the_limit() {
        let l = Limit::new(32768);
        assert_eq!((l.pages(), l.high(), l.low()), (32768, 30720, 28672));
        l.set(1000);
        assert_eq!((l.pages(), l.high(), l.low()), (1000, 936, 872));
        l.set(0);
        assert_eq!(l.pages(), 1);
    }

    #[test]
    fn under_target_the_step_doubles_from_what_is_resident_up_to_a_quarter() {
        let c = ctl();
        let mut m = seen(&c, 50_000, 10_000);
        // No stall: 2% below resident (not below the old limit's value), then 4%, 8%, ...
        assert_eq!(c.decide(&mut m, 50_000, 10_000, 0.0), 9_800);
        assert_eq!(c.decide(&mut m, 9_800, 9_800, 0.0), 9_408);
        assert_eq!(c.decide(&mut m, 9_408, 9_408, 0.0), 8_655);
        assert_eq!(c.decide(&mut m, 8_655, 8_655, 0.0), 7_270);
        assert_eq!(c.decide(&mut m, 7_270, 7_270, 0.0), 5_452);
        // A quarter at most.
        assert_eq!(c.decide(&mut m, 5_452, 5_452, 0.0), 4_089);
        // Half the target: half the step.
        let mut m = seen(&c, 50_000, 10_000);
        assert_eq!(c.decide(&mut m, 50_000, 10_000, 0.5), 9_900);
        // A limit below resident (reclaim behind): from the limit. Never under the floor.
        let mut m = seen(&c, 8_000, 10_000);
        assert_eq!(c.decide(&mut m, 8_000, 10_000, 0.0), 7_840);
        let mut m = seen(&c, 101, 101);
        assert_eq!(c.decide(&mut m, 101, 101, 0.0), 100);
    }

    #[test]
    fn over_target_the_limit_rises_at_once_and_probing_pauses_longer_each_time() {
        let c = ctl();
        let mut m = seen(&c, 10_000, 10_000);
        assert_eq!(c.decide(&mut m, 10_000, 10_000, 1.5), 12_500);
        // Holding for 2 intervals: no probe.
        assert_eq!(c.decide(&mut m, 12_500, 10_000, 0.0), 12_500);
        assert_eq!(c.decide(&mut m, 12_500, 10_000, 0.0), 9_800);
        // The probe stalled: up by half (the excess is capped), and a hold of 4.
        assert_eq!(c.decide(&mut m, 9_800, 9_800, 10.0), 14_700);
        for _ in 0..3 {
            assert_eq!(c.decide(&mut m, 14_700, 9_800, 0.0), 14_700);
        }
        assert_eq!(c.decide(&mut m, 14_700, 9_800, 0.0), 9_604);
        // Never over the ceiling; a limit above what is resident is not lowered by a raise.
        let mut m = seen(&c, 90_000, 90_000);
        assert_eq!(c.decide(&mut m, 90_000, 90_000, 10.0), 100_000);
        let mut m = seen(&c, 50_000, 10_000);
        assert_eq!(c.decide(&mut m, 50_000, 10_000, 3.0), 50_000);
    }

    #[test]
    fn a_growing_program_is_not_probed_and_its_stall_does_not_lengthen_the_pause() {
        let c = ctl();
        let mut m = seen(&c, 50_000, 10_000);
        assert_eq!(c.decide(&mut m, 50_000, 10_000, 0.0), 9_800);
        // Filling: 10% more resident in an interval; no probe below it.
        assert_eq!(c.decide(&mut m, 50_000, 11_000, 0.0), 50_000);
        assert_eq!(c.decide(&mut m, 50_000, 12_000, 0.0), 50_000);
        // Growth of 1% or less is not growth: the probe resumes, its step where it was.
        assert_eq!(c.decide(&mut m, 50_000, 12_100, 0.0), 11_616);
        // A stall while growing (no probe began the interval) pauses for 2, not doubled.
        let mut m = seen(&c, 50_000, 10_000);
        assert_eq!(c.decide(&mut m, 50_000, 10_000, 0.0), 9_800);
        assert_eq!(c.decide(&mut m, 9_800, 11_000, 0.0), 9_800);
        assert_eq!(c.decide(&mut m, 9_800, 9_800, 3.0), 14_700);
        assert_eq!(m.hold, 2);
    }

    #[test]
    fn the_meter_counts_wall_time_with_any_fault_outstanding_once() {
        let m = StallMeter::default();
        let t0 = Instant::now();
        m.begin_at(t0);
        m.begin_at(t0);
        std::thread::sleep(Duration::from_millis(20));
        m.end(t0);
        std::thread::sleep(Duration::from_millis(20));
        m.end(t0);
        let some = m.some_ns();
        // One stretch of about 40 ms, not two waits summed (which the total is).
        assert!((40_000_000..200_000_000).contains(&some), "{some}");
        assert!(m.total_ns() >= 60_000_000, "{}", m.total_ns());
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(m.some_ns(), some, "nothing outstanding: no stall accrues");
    }

    #[test]
    fn tick_waits_for_an_interval_and_keeps_a_history() {
        let mut cfg = AutoConfig::new(10, 1000);
        cfg.interval = Duration::from_millis(5);
        let c = AutoLimit::new(cfg);
        let l = Limit::new(1000);
        let m = StallMeter::default();
        assert!(!c.tick(&l, &m, 500));
        std::thread::sleep(Duration::from_millis(6));
        // The first reading only looks; the second probes.
        assert!(c.tick(&l, &m, 500));
        assert_eq!(l.pages(), 1000);
        std::thread::sleep(Duration::from_millis(6));
        assert!(c.tick(&l, &m, 500));
        assert_eq!(l.pages(), 490);
        let mut v = serde_json::json!({});
        c.to_json(&mut v);
        assert_eq!(v["limit_changes"], 1);
        assert_eq!(v["limit_history"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_spent_stall_budget_raises_the_limit_before_the_interval_ends() {
        // 1% of a 1 s interval: 10 ms of stall is the whole budget.
        let c = AutoLimit::new(AutoConfig::new(100, 100_000));
        let l = Limit::new(1000);
        let m = StallMeter::default();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(!c.tick(&l, &m, 900), "no stall, no interval: no reading");
        // A fault outstanding for 60 ms: six times the budget, well before the second.
        m.begin_at(t0);
        std::thread::sleep(EARLY_MIN + Duration::from_millis(10));
        assert!(
            c.tick(&l, &m, 900),
            "the budget is spent: the reading is now"
        );
        assert!(t0.elapsed() < Duration::from_millis(500));
        assert!(l.pages() > 1000, "the limit rises at once: {}", l.pages());
        m.end(t0);
        // Under the budget: no early reading.
        std::thread::sleep(EARLY_MIN + Duration::from_millis(10));
        assert!(!c.tick(&l, &m, 900));
        let mut v = serde_json::json!({});
        c.to_json(&mut v);
        assert_eq!(v["limit_early_readings"], 1);
    }
}
