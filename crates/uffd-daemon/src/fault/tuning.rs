//! The fault path's tuning, apart from what it does: how long the handler reads its uffd
//! without sleeping after a fault ([`Spin`], the guest haltpoll governor's rule), and how many
//! handlers may spin at once.

use crate::mm::Mm;
use crate::stats::Stats;
use crate::sys::{self, RawUffdMsg};

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Adaptive polling of the uffd after a fault, with the rule of the guest haltpoll cpuidle
/// governor (`drivers/cpuidle/governors/haltpoll.c`, `adjust_poll_limit`): the window is
/// unchanged when the next message came while polling; it grows (doubling, from a quarter of
/// the maximum) when the handler slept but the message came within reach of the maximum; it
/// halves, and drops to zero below a quarter of the maximum, when the handler slept longer.
/// So a client that stops faulting costs one window, and one that never faults costs nothing:
/// the handler polls only after a fault, and not while the resident pages are over the limit.
///
/// "Within reach" is twice the maximum, not the maximum: the time a sleeping handler measures
/// includes its own wakeup, which is what polling saves (about 40 us across CPUs on the
/// 2-vCPU VM this was measured on, about the window itself).
///
/// At most half the machine's online CPUs poll at once, over all the handlers of the process,
/// so that polling never takes every CPU from the clients and from reclaim (on one CPU, none:
/// the client could not run while the handler polled); a handler that finds the budget taken
/// sleeps at once.
#[derive(Debug)]
pub(super) struct Spin {
    /// `[fault] spin_us`; zero turns polling off.
    pub(super) max: Duration,
    /// The current window.
    limit: Duration,
}

impl Spin {
    pub(super) fn new(max: Duration) -> Self {
        Spin {
            max,
            limit: Duration::ZERO,
        }
    }

    /// Reads `mm`'s uffd without sleeping until a message comes or the window since `since`
    /// closes; returns how many messages were read (0: none came, or the budget of polling
    /// handlers was taken). With `before_read`, the uffd is polled first and `before_read` runs
    /// between finding it readable and reading it (the scan of `remove_scan.rs`, which must
    /// see a REMOVE's caller before the read lets it go).
    pub(super) fn poll(
        &self,
        mm: &Mm,
        msgs: &mut [RawUffdMsg],
        since: Instant,
        stats: &Stats,
        mut before_read: Option<&mut dyn FnMut()>,
    ) -> std::io::Result<usize> {
        if self.limit.is_zero() {
            return Ok(0);
        }
        let Some(_slot) = SpinSlot::take() else {
            return Ok(0);
        };
        let n = loop {
            let ready = match before_read.as_deref_mut() {
                None => true,
                Some(f) => {
                    let ready = sys::poll_read(&[mm.uffd.as_fd()], 0)?[0];
                    if ready {
                        f();
                    }
                    ready
                }
            };
            if ready {
                match mm.uffd.read_msgs(msgs) {
                    Ok(0) => {}
                    Ok(n) => break n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            // Reclaim waits for the gate the handler holds while it polls: let it go.
            if since.elapsed() >= self.limit || mm.gate_wanted.load(Ordering::Acquire) > 0 {
                break 0;
            }
            // A few pause instructions between reads (a read of an empty uffd is about half a
            // microsecond): they leave the core to a hyperthread sibling.
            for _ in 0..16 {
                std::hint::spin_loop();
            }
        };
        Stats::add(&stats.spin_ns, since.elapsed().as_nanos() as u64);
        if n > 0 {
            Stats::add(&stats.spin_hits, 1);
        }
        Ok(n)
    }

    /// After a sleep: the next message came `idle` after the end of the last fault.
    pub(super) fn adjust(&mut self, idle: Duration) {
        let grow_start = self.max / 4;
        if idle > self.limit && idle <= 2 * self.max {
            self.limit = (self.limit * 2).max(grow_start).min(self.max);
        } else if idle > 2 * self.max {
            self.limit /= 2;
            if self.limit < grow_start {
                self.limit = Duration::ZERO;
            }
        }
    }
}

/// Handlers polling now (a budget, not a lock: a stale count only lets one handler more or
/// less poll for a moment).
static SPINNING: AtomicUsize = AtomicUsize::new(0);

/// One handler's share of the polling budget, given back on drop.
#[derive(Debug)]
pub(super) struct SpinSlot;

impl SpinSlot {
    pub(super) fn take() -> Option<SpinSlot> {
        static MAX: OnceLock<usize> = OnceLock::new();
        let max = *MAX.get_or_init(|| sys::nr_cpus() / 2);
        if SPINNING.fetch_add(1, Ordering::Relaxed) < max {
            Some(SpinSlot)
        } else {
            SPINNING.fetch_sub(1, Ordering::Relaxed);
            None
        }
    }
}

impl Drop for SpinSlot {
    fn drop(&mut self) {
        SPINNING.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn spin_window_follows_the_haltpoll_rule() {
        let mut s = Spin::new(50 * US);
        assert_eq!(s.limit, Duration::ZERO, "no polling before the first fault");
        // A sleep that a longer window would have covered grows it: from a quarter of the
        // maximum, doubling, never past the maximum.
        s.adjust(30 * US);
        assert_eq!(s.limit, 12_500 * Duration::from_nanos(1));
        s.adjust(30 * US);
        assert_eq!(s.limit, 25 * US);
        s.adjust(90 * US);
        assert_eq!(s.limit, 50 * US);
        s.adjust(90 * US);
        assert_eq!(s.limit, 50 * US);
        // A message within the window changes nothing.
        s.adjust(10 * US);
        assert_eq!(s.limit, 50 * US);
        // Long sleeps (the client stopped faulting) halve it, then turn polling off.
        s.adjust(1000 * US);
        assert_eq!(s.limit, 25 * US);
        s.adjust(1000 * US);
        assert_eq!(s.limit, 12_500 * Duration::from_nanos(1));
        s.adjust(1000 * US);
        assert_eq!(s.limit, Duration::ZERO);
        // Off stays off.
        let mut off = Spin::new(Duration::ZERO);
        off.adjust(Duration::ZERO);
        off.adjust(1000 * US);
        assert_eq!(off.limit, Duration::ZERO);
    }

    #[test]
    fn at_most_half_the_cpus_poll() {
        let max = sys::nr_cpus() / 2;
        let slots: Vec<_> = std::iter::from_fn(SpinSlot::take).take(max + 1).collect();
        assert_eq!(slots.len(), max);
        drop(slots);
        assert_eq!(SpinSlot::take().is_some(), max > 0, "slots are given back");
    }
}
