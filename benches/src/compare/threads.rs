//! `threads` (`usemem --mode threads`): many threads faulting at once on one large malloc'd
//! buffer, and a check that no update was lost (the lost-update workload of issue #16; the same
//! program as `crates/uffd-daemon/tests/clients/atomic_stripes.c`, in Rust, sized by bytes).
//!
//! The buffer (`--bytes`, one `malloc`) is cut in two halves. The first half is words that
//! every thread increments with an atomic fetch-and-add, each at a word picked at random
//! (xorshift64 per thread), `--rounds` times. The second half is one stripe per thread, which
//! its thread fills with plain stores of a pattern of (thread, word), a slice every 64 rounds,
//! and the rest after its last round. At the end the stripes are read back (one thread each)
//! and the words summed: the sum must be exactly `threads * rounds` and every stripe word
//! equal to its pattern.
//!
//! Timed: `init_s` (the counters zeroed by one thread, as the C client does: the buffer's first
//! touch), `work_s` (all threads from the first start to the last join: the phase where they
//! fault at once), `check_s`. The driver reports the workload's wall time beside the same
//! program run bare.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::{json, Value};

fn pattern(thread: usize, word: usize) -> u64 {
    ((thread as u64) << 48) ^ (word as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The buffer, `free`d on drop.
struct Malloced {
    ptr: *mut u64,
    words: usize,
}

impl Malloced {
    fn new(bytes: usize) -> Result<Self, String> {
        // SAFETY: malloc has no preconditions; a null result is handled below.
        let ptr = unsafe { libc::malloc(bytes) }.cast::<u64>();
        if ptr.is_null() {
            return Err(format!("threads: malloc of {bytes} bytes failed"));
        }
        Ok(Self {
            ptr,
            words: bytes / 8,
        })
    }
}

impl Drop for Malloced {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from malloc and no borrow of the buffer outlives `self`.
        unsafe { libc::free(self.ptr.cast()) };
    }
}

/// Runs the workload: `bytes` of buffer, `threads` threads, `rounds` atomic adds each.
pub fn run(bytes: usize, threads: usize, rounds: u64, seed: u64) -> Result<Value, String> {
    let t0 = Instant::now();
    let buf = Malloced::new(bytes)?;
    let ncounters = buf.words / 2;
    let stripe_words = (buf.words - ncounters) / threads;
    if ncounters == 0 || stripe_words == 0 {
        return Err(format!(
            "threads: {bytes} bytes is too small for {threads} stripes"
        ));
    }
    // The counters are zeroed by this thread, word by word (the buffer's first touch).
    // SAFETY: the first `ncounters` words are inside the allocation; u64 is valid for any bits.
    unsafe { std::ptr::write_bytes(buf.ptr, 0, ncounters) };
    // SAFETY: the allocation is `words` u64s, suitably aligned (malloc aligns to 16); the
    // counters (the first `ncounters` words, now initialized) are only accessed through this
    // shared slice of atomics, the stripes only through the disjoint mutable slice below, and
    // both live no longer than `buf`.
    let counters: &[AtomicU64] =
        unsafe { std::slice::from_raw_parts(buf.ptr.cast::<AtomicU64>(), ncounters) };
    // SAFETY: the words after the counters, inside the allocation, disjoint from `counters`;
    // they are written before they are read (every stripe word is stored by its thread).
    let stripes: &mut [u64] =
        unsafe { std::slice::from_raw_parts_mut(buf.ptr.add(ncounters), stripe_words * threads) };
    let init_s = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    std::thread::scope(|s| {
        for (index, mine) in stripes.chunks_mut(stripe_words).enumerate() {
            s.spawn(move || {
                let mut x = 0x2545_F491_4F6C_DD1D_u64.wrapping_mul(index as u64 + 1) ^ seed;
                if x == 0 {
                    x = 1;
                }
                let step = stripe_words * 64 / (rounds as usize + 1) + 1;
                let mut next_store = 0usize;
                for r in 0..rounds {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    counters[(x % ncounters as u64) as usize].fetch_add(1, Ordering::Relaxed);
                    if r % 64 == 0 {
                        let end = (next_store + step).min(stripe_words);
                        for (k, w) in mine[next_store..end].iter_mut().enumerate() {
                            *w = pattern(index, next_store + k);
                        }
                        next_store = end;
                    }
                }
                for (k, w) in mine[next_store..].iter_mut().enumerate() {
                    *w = pattern(index, next_store + k);
                }
            });
        }
    });
    let work_s = t1.elapsed().as_secs_f64();

    let t2 = Instant::now();
    let bad_words: usize = std::thread::scope(|s| {
        let handles: Vec<_> = stripes
            .chunks(stripe_words)
            .enumerate()
            .map(|(index, mine)| {
                s.spawn(move || {
                    mine.iter()
                        .enumerate()
                        .filter(|&(k, &w)| w != pattern(index, k))
                        .count()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(usize::MAX))
            .sum()
    });
    let mut sum = 0u64;
    let mut touched = 0u64;
    for c in counters {
        let v = c.load(Ordering::Relaxed);
        sum = sum.wrapping_add(v);
        touched += u64::from(v != 0);
    }
    let check_s = t2.elapsed().as_secs_f64();
    let wall_s = t0.elapsed().as_secs_f64();
    let expected = threads as u64 * rounds;
    let adds = expected;
    let report = json!({
        "workload": "usemem",
        "mode": "threads",
        "bytes": bytes,
        "threads": threads,
        "rounds": rounds,
        "init_s": init_s,
        "work_s": work_s,
        "check_s": check_s,
        "wall_s": wall_s,
        "adds": adds,
        "adds_per_s": adds as f64 / work_s,
        "sum": sum,
        "expected": expected,
        "words_touched": touched,
        "bad_stripe_words": bad_words,
        "check": if sum == expected && bad_words == 0 { "ok" } else { "mismatch" },
    });
    if sum != expected || bad_words != 0 {
        return Err(format!(
            "threads: LOST UPDATES: sum {sum} of {expected} expected ({} lost); {bad_words} bad \
             stripe words",
            expected as i128 - sum as i128
        ));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_stripes_check_out() {
        let v = run(4 << 20, 8, 5000, 1).unwrap();
        assert_eq!(v["sum"], 40000);
        assert_eq!(v["bad_stripe_words"], 0);
        assert_eq!(v["check"], "ok");
    }
}
