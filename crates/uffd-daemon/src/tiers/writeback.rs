//! Asynchronous writeback of the swap file, the way the kernel's swap does it: a write returns
//! once its pages are in the page cache and their writeback has started; a thread of its own
//! (the completer) waits for the disk, oldest write first, and only then lets the pages leave
//! RAM (`POSIX_FADV_DONTNEED`). Reclaim never waits on the disk, only on room: at most
//! `cap` bytes are in flight, and a writer that would pass it waits for the completer (the
//! kernel's writeback throttling).
//!
//! Until the disk has confirmed a write, the daemon keeps its own copy of the bytes. The page
//! cache alone is not enough: after a failed writeback the kernel marks the cached page clean
//! and may drop it at any time, and a later read would return whatever the disk holds. With the
//! copy, a write the disk fails loses nothing: the copy is *held* (served to reads, counted,
//! said once), and new writes are refused for a while (1 s, doubling to 64 s) so that reclaim
//! keeps pages resident or in zswap instead of piling more onto a failing device. This is the
//! kernel's `end_swap_bio_write` on error: the page stays in RAM, dirty.
//!
//! The copies are an interval map of disjoint byte ranges: a new write replaces the bytes of
//! older copies it overlaps (the rest of them stays), a discard removes the bytes it covers. A
//! read takes the file's bytes, then lays the copies over them: the copies are always the
//! newest bytes of their ranges.
//!
//! Which write a writeback error belongs to cannot be told apart (the kernel reports an error
//! once per file, to whichever wait looks first): on an error, every write still in flight is
//! held. So are the most recently confirmed ones (up to `settle` bytes, kept a while after
//! their confirmation): a filesystem on a failing disk may confirm a write and lose it all the
//! same. ext4 ends the writeback of a range written into unwritten extents only after it has
//! converted them, and when the conversion fails it logs "potential data loss" but reports
//! nothing: the range then reads back as zeros. Such a loss comes with the disk's other
//! failures, which a later wait does report.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Bytes in flight by default: deep enough that the disk always has writes queued, small
/// enough that the copies cost little (32 MiB, twice that in RAM until confirmed: the copy and
/// the page cache).
pub(super) const DEFAULT_CAP: u64 = 32 << 20;

/// Bytes of confirmed writes whose copies are kept by default, held if a later wait reports an
/// error.
pub(super) const DEFAULT_SETTLE: u64 = 8 << 20;

const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(64);

/// What the writeback needs from the file: wait for a range to reach the disk, and drop it
/// from the page cache. The swap file implements it with `sync_file_range` and `fadvise`; the
/// tests with failures of their choosing.
pub(super) trait Device: Send + Sync + 'static {
    /// Waits until `[offset, offset + len)` is on the device; an error the device reported.
    fn wait(&self, offset: u64, len: u64) -> io::Result<()>;
    /// The range is on the device: its pages may leave RAM.
    fn uncache(&self, offset: u64, len: u64);
}

/// Where a copy stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Its write waits for the disk.
    InFlight,
    /// Its write was confirmed recently: kept a while, held if a later wait fails.
    Settling,
    /// A wait failed: kept until its bytes are replaced or discarded.
    Held,
}

#[derive(Debug)]
struct Copy {
    /// The write it came from (the completer removes the copies of the write it confirmed).
    seq: u64,
    data: Vec<u8>,
    stage: Stage,
}

#[derive(Debug)]
struct Refusal {
    until: Instant,
    error: io::Error,
}

#[derive(Debug, Default)]
struct State {
    next_seq: u64,
    /// Disjoint ranges by first byte.
    copies: BTreeMap<u64, Copy>,
    /// Writes waiting for the disk, oldest first: `(offset, len, seq)`.
    queue: VecDeque<(u64, u64, u64)>,
    /// Writes confirmed, oldest first, whose copies may still be settling.
    settling: VecDeque<(u64, u64, u64)>,
    in_flight_bytes: u64,
    settling_bytes: u64,
    held_bytes: u64,
    refusal: Option<Refusal>,
    backoff: Option<Duration>,
    shutdown: bool,
}

impl State {
    fn bytes_of(&mut self, stage: Stage) -> &mut u64 {
        match stage {
            Stage::InFlight => &mut self.in_flight_bytes,
            Stage::Settling => &mut self.settling_bytes,
            Stage::Held => &mut self.held_bytes,
        }
    }

    /// Removes the bytes `[a, b)` from the copies (keeping what lies outside), adjusting the
    /// byte counts.
    fn cut(&mut self, a: u64, b: u64) {
        let mut hit: Vec<u64> = Vec::new();
        if let Some((&o, c)) = self.copies.range(..a).next_back() {
            if o + c.data.len() as u64 > a {
                hit.push(o);
            }
        }
        hit.extend(self.copies.range(a..b).map(|(&o, _)| o));
        for o in hit {
            let Some(c) = self.copies.remove(&o) else {
                continue;
            };
            let end = o + c.data.len() as u64;
            *self.bytes_of(c.stage) -= c.data.len() as u64;
            if o < a {
                let left = c.data[..(a - o) as usize].to_vec();
                *self.bytes_of(c.stage) += left.len() as u64;
                self.copies.insert(
                    o,
                    Copy {
                        seq: c.seq,
                        data: left,
                        stage: c.stage,
                    },
                );
            }
            if end > b {
                let right = c.data[(b - o) as usize..].to_vec();
                *self.bytes_of(c.stage) += right.len() as u64;
                self.copies.insert(
                    b,
                    Copy {
                        seq: c.seq,
                        data: right,
                        stage: c.stage,
                    },
                );
            }
        }
    }

    /// The copies of write `seq` within `[a, b)` in `stage` go.
    fn remove(&mut self, a: u64, b: u64, seq: u64, stage: Stage) {
        let done: Vec<u64> = self
            .copies
            .range(a..b)
            .filter(|(_, c)| c.seq == seq && c.stage == stage)
            .map(|(&o, _)| o)
            .collect();
        for o in done {
            if let Some(c) = self.copies.remove(&o) {
                *self.bytes_of(stage) -= c.data.len() as u64;
            }
        }
    }

    /// Write `seq`, `[a, b)`, is on the device: its copies settle, and the oldest settling
    /// ones past `settle` bytes go.
    fn confirm(&mut self, a: u64, b: u64, seq: u64, settle: u64) {
        let mut moved = 0;
        for (_, c) in self.copies.range_mut(a..b) {
            if c.seq == seq && c.stage == Stage::InFlight {
                c.stage = Stage::Settling;
                moved += c.data.len() as u64;
            }
        }
        self.in_flight_bytes -= moved;
        self.settling_bytes += moved;
        if moved > 0 {
            self.settling.push_back((a, b - a, seq));
        }
        while self.settling_bytes > settle {
            let Some((o, len, s)) = self.settling.pop_front() else {
                break;
            };
            self.remove(o, o + len, s, Stage::Settling);
        }
    }
}

/// Counters of the writeback, for the stats.
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// Writes confirmed on the device.
    pub completed: AtomicU64,
    /// Writeback errors the device reported.
    pub errors: AtomicU64,
    /// Writes refused because the device failed recently.
    pub refused: AtomicU64,
    /// Times a writer waited for room under the cap, and for how long.
    pub throttled: AtomicU64,
    pub throttled_ns: AtomicU64,
}

/// The in-flight table and its completer thread.
pub(super) struct Writeback {
    inner: Arc<Inner>,
    completer: Option<std::thread::JoinHandle<()>>,
}

struct Inner {
    state: Mutex<State>,
    /// The completer waits here for writes.
    work: Condvar,
    /// Writers wait here for room.
    room: Condvar,
    cap: u64,
    settle: u64,
    counters: Counters,
    device: Box<dyn Device>,
}

impl std::fmt::Debug for Writeback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.state.lock();
        f.debug_struct("Writeback")
            .field("cap", &self.inner.cap)
            .field("in_flight_bytes", &st.in_flight_bytes)
            .field("held_bytes", &st.held_bytes)
            .finish()
    }
}

/// A write admitted into the table: its copy is in place; [`Writeback::started`] or
/// [`Writeback::abandon`] ends it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Admitted {
    offset: u64,
    len: u64,
    seq: u64,
}

impl Writeback {
    /// Starts the completer thread: at most `cap` bytes in flight, and the copies of the
    /// last `settle` bytes confirmed kept.
    pub(super) fn new(device: Box<dyn Device>, cap: u64, settle: u64) -> io::Result<Self> {
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            room: Condvar::new(),
            cap: cap.max(1),
            settle,
            counters: Counters::default(),
            device,
        });
        let i = Arc::clone(&inner);
        let completer = std::thread::Builder::new()
            .name("uffd-writeback".into())
            .spawn(move || i.complete())?;
        Ok(Writeback {
            inner,
            completer: Some(completer),
        })
    }

    /// Admits the writes `(offset, data)`: waits for room under the cap (a batch larger than
    /// the cap goes in alone), then puts a copy of each in the table. Refused, with the
    /// device's error, while the device is in its back-off after a failure.
    pub(super) fn admit(&self, writes: &[(u64, &[u8])]) -> io::Result<Vec<Admitted>> {
        let total: u64 = writes.iter().map(|(_, d)| d.len() as u64).sum();
        let mut st = self.inner.state.lock();
        if let Some(r) = &st.refusal {
            if Instant::now() < r.until {
                self.inner.counters.refused.fetch_add(1, Ordering::Relaxed);
                return Err(io::Error::new(
                    r.error.kind(),
                    format!(
                        "the swap file's device failed a write ({}): writes paused for {:.0?}",
                        r.error,
                        r.until.saturating_duration_since(Instant::now())
                    ),
                ));
            }
            st.refusal = None;
        }
        if st.in_flight_bytes > 0 && st.in_flight_bytes + total > self.inner.cap {
            let t = Instant::now();
            while st.in_flight_bytes > 0 && st.in_flight_bytes + total > self.inner.cap {
                self.inner.room.wait(&mut st);
            }
            let c = &self.inner.counters;
            c.throttled.fetch_add(1, Ordering::Relaxed);
            c.throttled_ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        let mut out = Vec::with_capacity(writes.len());
        for &(offset, data) in writes {
            let len = data.len() as u64;
            st.cut(offset, offset + len);
            let seq = st.next_seq;
            st.next_seq += 1;
            st.copies.insert(
                offset,
                Copy {
                    seq,
                    data: data.to_vec(),
                    stage: Stage::InFlight,
                },
            );
            st.in_flight_bytes += len;
            out.push(Admitted { offset, len, seq });
        }
        Ok(out)
    }

    /// The write is in the page cache and its writeback started: the completer waits for it.
    pub(super) fn started(&self, w: Admitted) {
        let mut st = self.inner.state.lock();
        st.queue.push_back((w.offset, w.len, w.seq));
        drop(st);
        self.inner.work.notify_one();
    }

    /// The write never reached the page cache (the caller reports its error): its copy goes.
    pub(super) fn abandon(&self, w: Admitted) {
        let mut st = self.inner.state.lock();
        st.remove(w.offset, w.offset + w.len, w.seq, Stage::InFlight);
        drop(st);
        self.inner.room.notify_all();
    }

    /// Lays the copies over `out`, the file's bytes at `offset`: the newest bytes of every
    /// range still in flight or held.
    pub(super) fn overlay(&self, offset: u64, out: &mut [u8]) {
        let end = offset + out.len() as u64;
        let st = self.inner.state.lock();
        if st.copies.is_empty() {
            return;
        }
        let before = st
            .copies
            .range(..offset)
            .next_back()
            .filter(|(&o, c)| o + c.data.len() as u64 > offset);
        for (&o, c) in before.into_iter().chain(st.copies.range(offset..end)) {
            let a = o.max(offset);
            let b = (o + c.data.len() as u64).min(end);
            out[(a - offset) as usize..(b - offset) as usize]
                .copy_from_slice(&c.data[(a - o) as usize..(b - o) as usize]);
        }
    }

    /// `[offset, offset + len)` is free: its copies go.
    pub(super) fn discard(&self, offset: u64, len: u64) {
        let mut st = self.inner.state.lock();
        st.cut(offset, offset + len);
        drop(st);
        self.inner.room.notify_all();
    }

    /// Waits until nothing is in flight (confirmed or held).
    pub(super) fn drain(&self) {
        let mut st = self.inner.state.lock();
        while st.in_flight_bytes > 0 || !st.queue.is_empty() {
            self.inner.room.wait(&mut st);
        }
    }

    /// Forgets the copies of confirmed writes: reads see what the device holds (tests that
    /// alter the device behind the daemon's back).
    pub(super) fn forget_settled(&self) {
        let mut st = self.inner.state.lock();
        while let Some((o, len, s)) = st.settling.pop_front() {
            st.remove(o, o + len, s, Stage::Settling);
        }
    }

    /// Bytes in flight and held.
    pub(super) fn bytes(&self) -> (u64, u64) {
        let st = self.inner.state.lock();
        (st.in_flight_bytes, st.held_bytes)
    }

    /// Bytes of confirmed writes still kept.
    pub(super) fn settling_bytes(&self) -> u64 {
        self.inner.state.lock().settling_bytes
    }

    pub(super) fn counters(&self) -> &Counters {
        &self.inner.counters
    }
}

impl Inner {
    fn complete(&self) {
        let mut st = self.state.lock();
        loop {
            while st.queue.is_empty() && !st.shutdown {
                self.work.wait(&mut st);
            }
            if st.shutdown {
                return;
            }
            let Some(&(offset, len, seq)) = st.queue.front() else {
                continue;
            };
            drop(st);
            let r = self.device.wait(offset, len);
            if r.is_ok() {
                self.device.uncache(offset, len);
            }
            st = self.state.lock();
            match r {
                Ok(()) => {
                    st.queue.pop_front();
                    st.confirm(offset, offset + len, seq, self.settle);
                    st.backoff = None;
                    self.counters.completed.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    // Every write still in flight may be the one that failed, and the last
                    // ones confirmed may have been lost: all held.
                    st.queue.clear();
                    st.settling.clear();
                    let mut moved = 0;
                    for c in st.copies.values_mut().filter(|c| c.stage != Stage::Held) {
                        c.stage = Stage::Held;
                        moved += c.data.len() as u64;
                    }
                    st.in_flight_bytes = 0;
                    st.settling_bytes = 0;
                    st.held_bytes += moved;
                    let backoff = st
                        .backoff
                        .map_or(FIRST_BACKOFF, |b| (b * 2).min(MAX_BACKOFF));
                    st.backoff = Some(backoff);
                    let first = self.counters.errors.fetch_add(1, Ordering::Relaxed) == 0;
                    if first {
                        tracing::warn!(
                            "the swap file's device failed a write: {e}; {moved} bytes kept \
                             in the daemon's memory, writes paused for {backoff:?}"
                        );
                    }
                    st.refusal = Some(Refusal {
                        until: Instant::now() + backoff,
                        error: e,
                    });
                }
            }
            self.room.notify_all();
        }
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        self.inner.state.lock().shutdown = true;
        self.inner.work.notify_all();
        if let Some(t) = self.completer.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::AtomicBool;

    /// A device whose waits fail while `fail` is set, and that blocks while `hold` is set.
    #[derive(Default)]
    struct Dev {
        fail: AtomicBool,
        hold: AtomicBool,
        waited: Mutex<Vec<(u64, u64)>>,
    }
    impl Device for Arc<Dev> {
        fn wait(&self, offset: u64, len: u64) -> io::Result<()> {
            while self.hold.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.waited.lock().push((offset, len));
            if self.fail.load(Ordering::Acquire) {
                Err(io::Error::from_raw_os_error(libc::EIO))
            } else {
                Ok(())
            }
        }
        fn uncache(&self, _: u64, _: u64) {}
    }

    fn write(wb: &Writeback, offset: u64, data: &[u8]) -> io::Result<()> {
        for a in wb.admit(&[(offset, data)])? {
            wb.started(a);
        }
        Ok(())
    }

    #[test]
    fn confirmed_writes_leave_the_table() {
        let dev = Arc::new(Dev::default());
        let wb = Writeback::new(Box::new(Arc::clone(&dev)), 1 << 20, 4096).unwrap();
        write(&wb, 0, &[1; 4096]).unwrap();
        write(&wb, 8192, &[2; 4096]).unwrap();
        wb.drain();
        assert_eq!(wb.bytes(), (0, 0));
        assert_eq!(
            wb.settling_bytes(),
            4096,
            "the last write confirmed settles"
        );
        let mut out = [9u8; 4096];
        wb.overlay(8192, &mut out);
        assert_eq!(out, [2u8; 4096]);
        // A later error holds it.
        dev.fail.store(true, Ordering::Release);
        write(&wb, 16384, &[3; 4096]).unwrap();
        wb.drain();
        assert_eq!(
            wb.bytes(),
            (0, 8192),
            "the settling write and the failed one held"
        );
        assert_eq!(wb.settling_bytes(), 0);
        dev.fail.store(false, Ordering::Release);
        let wb = Writeback::new(Box::new(Arc::clone(&dev)), 1 << 20, 0).unwrap();
        write(&wb, 0, &[1; 4096]).unwrap();
        write(&wb, 8192, &[2; 4096]).unwrap();
        wb.drain();
        assert_eq!(wb.bytes(), (0, 0));
        assert_eq!(dev.waited.lock().len(), 5);
        let mut out = [9u8; 4096];
        wb.overlay(0, &mut out);
        assert_eq!(out, [9u8; 4096], "nothing laid over once confirmed");
    }

    #[test]
    fn a_failed_writeback_is_held_served_and_pauses_writes() {
        let dev = Arc::new(Dev::default());
        dev.hold.store(true, Ordering::Release);
        dev.fail.store(true, Ordering::Release);
        let wb = Writeback::new(Box::new(Arc::clone(&dev)), 1 << 20, 0).unwrap();
        write(&wb, 4096, &[7; 4096]).unwrap();
        write(&wb, 3 * 4096, &[8; 8192]).unwrap();
        dev.hold.store(false, Ordering::Release);
        wb.drain();
        assert_eq!(wb.bytes(), (0, 3 * 4096), "all in flight held");
        assert_eq!(wb.counters().errors.load(Ordering::Relaxed), 1);
        let mut out = vec![0u8; 6 * 4096];
        wb.overlay(0, &mut out);
        assert!(out[..4096].iter().all(|&b| b == 0));
        assert!(out[4096..8192].iter().all(|&b| b == 7));
        assert!(out[8192..12288].iter().all(|&b| b == 0));
        assert!(out[12288..20480].iter().all(|&b| b == 8));
        let e = write(&wb, 0, &[1; 4096]).unwrap_err();
        assert_eq!(e.kind(), io::Error::from_raw_os_error(libc::EIO).kind());
        assert!(e.to_string().contains("paused"), "{e}");
        // Discarding half of the second write releases that half only.
        wb.discard(3 * 4096, 4096);
        assert_eq!(wb.bytes(), (0, 2 * 4096));
        let mut out = vec![0u8; 2 * 4096];
        wb.overlay(3 * 4096, &mut out);
        assert!(out[..4096].iter().all(|&b| b == 0));
        assert!(out[4096..].iter().all(|&b| b == 8));
    }

    #[test]
    fn writers_wait_for_room_under_the_cap() {
        let dev = Arc::new(Dev::default());
        dev.hold.store(true, Ordering::Release);
        let wb = Arc::new(Writeback::new(Box::new(Arc::clone(&dev)), 8192, 0).unwrap());
        write(&wb, 0, &[1; 8192]).unwrap();
        let w = Arc::clone(&wb);
        let t = std::thread::spawn(move || write(&w, 8192, &[2; 4096]).unwrap());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "the second write waits for the first");
        dev.hold.store(false, Ordering::Release);
        t.join().unwrap();
        wb.drain();
        assert_eq!(wb.counters().throttled.load(Ordering::Relaxed), 1);
        // A batch larger than the cap is admitted alone.
        write(&wb, 0, &[3; 16384]).unwrap();
        wb.drain();
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(u64, u64, u8),
        Discard(u64, u64),
        Fail(bool),
        Drain,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..64, 1u64..24, any::<u8>()).prop_map(|(o, l, b)| Op::Write(o, l, b)),
            1 => (0u64..64, 1u64..24).prop_map(|(o, l)| Op::Discard(o, l)),
            1 => any::<bool>().prop_map(Op::Fail),
            1 => Just(Op::Drain),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Against a model of the newest bytes written: after any mix of writes, discards,
        /// failed and confirmed writebacks, nothing stays in flight, the copies are disjoint,
        /// every copy left (held, or settling within its bound) holds the newest bytes of its
        /// range, and the byte counts add up.
        #[test]
        fn the_newest_bytes_are_always_read(
            ops in proptest::collection::vec(op(), 1..40),
            settle in prop_oneof![Just(0u64), Just(16u64), Just(1u64 << 20)],
        ) {
            let dev = Arc::new(Dev::default());
            let wb = Writeback::new(Box::new(Arc::clone(&dev)), 1 << 20, settle).unwrap();
            let mut model = [0u8; 96];
            for op in ops {
                match op {
                    Op::Write(o, l, b) => {
                        if write(&wb, o, &vec![b; l as usize]).is_ok() {
                            model[o as usize..(o + l) as usize].fill(b);
                        }
                    }
                    Op::Discard(o, l) => {
                        wb.discard(o, l);
                        model[o as usize..(o + l) as usize].fill(0);
                    }
                    Op::Fail(f) => dev.fail.store(f, Ordering::Release),
                    Op::Drain => wb.drain(),
                }
            }
            wb.drain();
            let (in_flight, held) = wb.bytes();
            prop_assert_eq!(in_flight, 0);
            let st = wb.inner.state.lock();
            let copied: u64 = st.copies.values().map(|c| c.data.len() as u64).sum();
            prop_assert_eq!(copied, held + st.settling_bytes);
            prop_assert!(st.settling_bytes <= settle);
            let mut last = 0;
            for (&o, c) in &st.copies {
                prop_assert!(o >= last, "copies overlap");
                last = o + c.data.len() as u64;
                prop_assert!(c.stage != Stage::InFlight);
                prop_assert_eq!(&model[o as usize..last as usize], &c.data[..]);
            }
        }
    }
}
