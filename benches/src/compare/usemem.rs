//! `usemem` (the `usemem` binary, and `compare __usemem`): a checked anonymous-memory workload in the spirit of vm-scalability's `usemem`
//! (the program the Linux swap work of 2017-2024 measured with).
//!
//! It maps a private anonymous working set, writes every 4 KiB page with a pattern derived from
//! (page index, pass), then for a fixed time touches pages (uniformly random, or in order,
//! wrapping, or Zipf-distributed over page ranks with the hot pages scattered). Each touch
//! verifies the whole page against the pattern of its current pass and
//! writes the next pass's pattern. With `--final-check` every page is verified once more at the
//! end. Any mismatch ends the program with exit status 3 and a message naming the page, the
//! word, the pass and both values.
//!
//! Page contents compress about 3:1 with lz4/lzo (a third of each page pseudo-random, the rest a
//! repeated 64-byte motif), close to the ratio measured on real heaps (python3, redis-server),
//! so compressed tiers are neither flattered by zero-like pages nor defeated by random ones.
//!
//! Latency: the first read of each touch is timed on its own (that is where a fault happens);
//! a touch whose first read took longer than `--fault-threshold-ns` (default 2000) counts as a
//! faulted touch. The whole touch (fault, verify, rewrite) is timed too. Both go into
//! log-linear histograms (about 3% resolution) kept in a few KiB, so measuring does not add to
//! the resident set under test.
//!
//! Output: one JSON line on stdout.
//!
//! Zipf (`--mode zipf`, exponent `--zipf-theta`, 0.99 by default as in YCSB): page rank `k` is
//! drawn with probability proportional to `1/k^theta` by rejection-inversion ([`Zipf`]), and a
//! seeded permutation of the pages maps ranks to pages, so the hot pages are scattered over the
//! working set rather than packed at its start (where a sequential readahead or a per-region
//! policy would find them for free).
//!
//! Moved hot set (`--mode moved`): a hot set of `--hot-fraction` of the pages (a tenth by
//! default), scattered by the same seeded permutation, touched uniformly at random; every
//! `--move-every` seconds it moves to a disjoint set of the same size and, at the next move,
//! back (A, B, A, ...): a working set that changes without growing, for `--limit auto`.
//!
//! `--mode threads` is another workload in the same binary: [`super::threads`].
//!
//! ```text
//! usemem --bytes 1G --mode random|sequential|zipf|moved --seconds 10 [--final-check] [--seed 1]
//!        [--hot-fraction 0.1 --move-every S]   (moved: the hot set and how often it moves)
//!        [--touchers N]   (N threads touching, each in its own stripe of the pages)
//! usemem --bytes 1G --mode threads [--threads 32] [--rounds N]
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::json;

use super::hist::Histogram;
use super::parse_size;

const PAGE: usize = 4096;
const WORDS: usize = PAGE / 8;
/// Words of each page that are pseudo-random; the rest repeat an 8-word motif.
const RANDOM_WORDS: usize = WORDS / 3;

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform double in [0, 1) from 53 random bits.
fn unit_f64(x: &mut u64) -> f64 {
    (splitmix(x) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Zipf-distributed ranks `1..=n` (`P(k)` proportional to `1/k^theta`), by rejection-inversion
/// (W. Hörmann and G. Derflinger, "Rejection-inversion to generate variates from monotone
/// discrete distributions", 1996; the form of Apache Commons' `RejectionInversionZipfSampler`):
/// O(1) time and memory per draw for any `n`, no table, about 1.1 uniforms per draw.
#[derive(Debug, Clone)]
pub struct Zipf {
    n: u64,
    theta: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s: f64,
}

/// `ln(1 + x) / x`, accurate near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, accurate near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

impl Zipf {
    /// A sampler of ranks `1..=n` with exponent `theta` (> 0).
    pub fn new(n: u64, theta: f64) -> Result<Self, String> {
        if n == 0 {
            return Err("zipf: n must be at least 1".into());
        }
        if !(theta.is_finite() && theta > 0.0) {
            return Err(format!("zipf: exponent {theta} must be finite and > 0"));
        }
        let mut z = Zipf {
            n,
            theta,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            s: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(n as f64 + 0.5);
        z.s = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        Ok(z)
    }

    /// `H(x)`, an integral of `h`: `(x^(1-theta) - 1) / (1 - theta)` (`ln x` at theta = 1).
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.theta) * log_x) * log_x
    }

    /// `h(x) = x^-theta`.
    fn h(&self, x: f64) -> f64 {
        (-self.theta * x.ln()).exp()
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.theta)).max(-1.0);
        (helper1(t) * x).exp()
    }

    /// One rank in `1..=n`, drawing uniforms from `rng` (splitmix64 state).
    pub fn sample(&self, rng: &mut u64) -> u64 {
        loop {
            let u = self.h_integral_n + unit_f64(rng) * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = ((x + 0.5) as u64).clamp(1, self.n);
            let kf = k as f64;
            if kf - x <= self.s || u >= self.h_integral(kf + 0.5) - self.h(kf) {
                return k;
            }
        }
    }
}

/// A seeded permutation of `0..n` (Fisher-Yates): rank `k` of a skewed draw is page `perm[k-1]`.
fn permutation(n: usize, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    let mut x = seed ^ 0x05EE_D0F9_A6E5;
    for i in (1..n).rev() {
        let j = (splitmix(&mut x) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

/// The expected contents of `page` at `pass`, word by word.
fn pattern(page: usize, pass: u32, seed: u64, out: &mut [u64; WORDS]) {
    let mut s = seed ^ ((page as u64) << 20) ^ (u64::from(pass) << 52) ^ (page as u64 >> 44);
    for w in out.iter_mut().take(RANDOM_WORDS) {
        *w = splitmix(&mut s);
    }
    let mut motif = [0u64; 8];
    for m in &mut motif {
        *m = splitmix(&mut s);
    }
    for (k, w) in out.iter_mut().enumerate().skip(RANDOM_WORDS) {
        *w = motif[k % 8];
    }
    // The first and last words name the page and the pass, so a page seen at the wrong place
    // or from the wrong pass is told apart from a corrupt one.
    out[0] = ((page as u64) << 24) | u64::from(pass & 0xff_ffff);
    out[WORDS - 1] = !out[0];
}

/// How the touch phase picks pages.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Random,
    Sequential,
    Zipf,
    /// A hot set that moves to a disjoint one and back (see the module docs).
    Moved,
    /// Not a usemem mode: the threads workload ([`super::threads`]).
    Threads,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Random => "random",
            Mode::Sequential => "sequential",
            Mode::Zipf => "zipf",
            Mode::Moved => "moved",
            Mode::Threads => "threads",
        }
    }
}

struct Args {
    bytes: usize,
    mode: Mode,
    zipf_theta: f64,
    hot_fraction: f64,
    move_every: f64,
    threads: usize,
    touchers: usize,
    rounds: u64,
    seconds: f64,
    max_touches: u64,
    final_check: bool,
    seed: u64,
    fault_threshold_ns: u64,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        bytes: 256 << 20,
        mode: Mode::Random,
        zipf_theta: 0.99,
        hot_fraction: 0.1,
        move_every: 0.0,
        threads: 32,
        touchers: 1,
        rounds: 32768,
        seconds: 10.0,
        max_touches: u64::MAX,
        final_check: false,
        seed: 1,
        fault_threshold_ns: 2000,
    };
    let mut it = args.iter().cloned();
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--bytes" => {
                a.bytes = parse_size(&val("--bytes")?).map_err(|e| e.to_string())? as usize
            }
            "--mode" => {
                a.mode = match val("--mode")?.as_str() {
                    "random" => Mode::Random,
                    "sequential" => Mode::Sequential,
                    "zipf" => Mode::Zipf,
                    "moved" => Mode::Moved,
                    "threads" => Mode::Threads,
                    m => {
                        return Err(format!(
                            "--mode {m}: allowed: random, sequential, zipf, moved, threads"
                        ))
                    }
                }
            }
            "--zipf-theta" => {
                a.zipf_theta = val("--zipf-theta")?
                    .parse()
                    .map_err(|e| format!("--zipf-theta: {e}"))?
            }
            "--hot-fraction" => {
                a.hot_fraction = val("--hot-fraction")?
                    .parse()
                    .map_err(|e| format!("--hot-fraction: {e}"))?
            }
            "--move-every" => {
                a.move_every = val("--move-every")?
                    .parse()
                    .map_err(|e| format!("--move-every: {e}"))?
            }
            "--threads" => {
                a.threads = val("--threads")?
                    .parse()
                    .map_err(|e| format!("--threads: {e}"))?
            }
            "--touchers" => {
                a.touchers = val("--touchers")?
                    .parse()
                    .map_err(|e| format!("--touchers: {e}"))?
            }
            "--rounds" => {
                a.rounds = val("--rounds")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?
            }
            "--seconds" => {
                a.seconds = val("--seconds")?
                    .parse()
                    .map_err(|e| format!("--seconds: {e}"))?
            }
            "--touches" => {
                a.max_touches = val("--touches")?
                    .parse()
                    .map_err(|e| format!("--touches: {e}"))?
            }
            "--seed" => a.seed = val("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--fault-threshold-ns" => {
                a.fault_threshold_ns = val("--fault-threshold-ns")?
                    .parse()
                    .map_err(|e| format!("--fault-threshold-ns: {e}"))?
            }
            "--final-check" => a.final_check = true,
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: usemem --bytes SIZE \
                     --mode random|sequential|zipf|moved|threads --seconds S [--touches N] \
                     [--final-check] [--seed N] [--fault-threshold-ns N] [--zipf-theta T] \
                     [--hot-fraction F] [--move-every S] [--threads N] [--rounds N]"
                ))
            }
        }
    }
    if a.bytes < PAGE {
        return Err(format!("--bytes {} is smaller than one page", a.bytes));
    }
    if a.bytes / PAGE > u32::MAX as usize {
        return Err(format!("--bytes {} is over 2^32 pages", a.bytes));
    }
    if a.touchers == 0 || a.touchers > 64 || a.touchers > a.bytes / PAGE {
        return Err(format!(
            "--touchers {} must be 1-64 and at most one a page",
            a.touchers
        ));
    }
    if !(a.hot_fraction > 0.0 && a.hot_fraction <= 0.5) {
        return Err(format!(
            "--hot-fraction {} must be in (0, 0.5]: the set it moves to is disjoint",
            a.hot_fraction
        ));
    }
    if a.move_every <= 0.0 {
        // By default the set moves twice in the run: A, B, A.
        a.move_every = a.seconds / 3.0;
    }
    if a.mode == Mode::Threads && a.threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    Ok(a)
}

/// The working set: a private anonymous mapping, unmapped on drop.
struct Mapping {
    base: *mut u64,
    pages: usize,
}

impl Mapping {
    fn new(pages: usize) -> Result<Self, String> {
        let base = uffd_daemon::sys::map_anonymous(pages * PAGE)
            .map_err(|e| format!("mmap of {} bytes: {e}", pages * PAGE))?;
        Ok(Self {
            base: base.cast(),
            pages,
        })
    }

    fn page_ptr(&self, page: usize) -> *mut u64 {
        assert!(page < self.pages);
        // SAFETY: `page < pages`, so the offset stays inside the mapping.
        unsafe { self.base.add(page * WORDS) }
    }

    fn page(&mut self, page: usize) -> &mut [u64; WORDS] {
        // SAFETY: inside the mapping, aligned to a page; `&mut self` makes the borrow unique.
        unsafe { &mut *self.page_ptr(page).cast::<[u64; WORDS]>() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`; no reference into it outlives
        // `self`.
        unsafe { libc::munmap(self.base.cast(), self.pages * PAGE) };
    }
}

fn verify(page: usize, pass: u32, got: &[u64; WORDS], want: &[u64; WORDS]) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    let k = (0..WORDS).find(|&k| got[k] != want[k]).unwrap_or(0);
    let bad = (0..WORDS).filter(|&k| got[k] != want[k]).count();
    let all_zero = got.iter().all(|&w| w == 0);
    Err(format!(
        "usemem: DATA MISMATCH at page {page} (pass {pass}): word {k} is {:#018x}, expected \
         {:#018x}; {bad} of {WORDS} words differ{}; first word {:#018x} (page {}, pass {})",
        got[k],
        want[k],
        if all_zero {
            "; the page reads as all zeros"
        } else {
            ""
        },
        got[0],
        got[0] >> 24,
        got[0] & 0xff_ffff,
    ))
}

/// One toucher's pages: `pages` pages of the working set from page `first`.
struct Stripe {
    base: *mut u64,
    first: usize,
    pages: usize,
}

// SAFETY: each stripe names pages no other stripe does, in a mapping that outlives the
// touchers (they run in a scope inside `run`, which owns it).
unsafe impl Send for Stripe {}

impl Stripe {
    /// Page `page` of the stripe (its index in the whole working set is `first + page`).
    fn page(&mut self, page: usize) -> &mut [u64; WORDS] {
        assert!(page < self.pages);
        // SAFETY: inside the stripe, hence the mapping, aligned to a page; `&mut self` and the
        // stripes' disjointness make the borrow unique.
        unsafe {
            &mut *self
                .base
                .add((self.first + page) * WORDS)
                .cast::<[u64; WORDS]>()
        }
    }

    /// The first word of `page`, read once (this is the access that may fault).
    fn first_word(&mut self, page: usize) -> u64 {
        // SAFETY: as in `page`.
        unsafe { std::ptr::read_volatile(self.page(page).as_ptr()) }
    }
}

/// What one toucher did.
struct Touched {
    touches: u64,
    elapsed: Duration,
    fault_hist: Histogram,
    touch_hist: Histogram,
}

/// The touch loop over one stripe: pages chosen by `a.mode` among the stripe's, each verified
/// against its current pass and rewritten with the next, until `deadline` or `max_touches`.
fn touch_stripe(
    mut stripe: Stripe,
    passes: &mut [u32],
    a: &Args,
    mut rng: u64,
    deadline: Duration,
    max_touches: u64,
) -> Result<Touched, String> {
    let pages = stripe.pages;
    let mut want = [0u64; WORDS];
    let mut fault_hist = Histogram::new();
    let mut touch_hist = Histogram::new();
    let mut next_seq = 0usize;
    // Zipf: ranks drawn skewed, scattered over the pages by a seeded permutation (built before
    // the touch phase; 4 bytes a page, like `passes`).
    let zipf = if a.mode == Mode::Zipf {
        Some((
            Zipf::new(pages as u64, a.zipf_theta)?,
            permutation(pages, a.seed.wrapping_add(stripe.first as u64)),
        ))
    } else {
        None
    };
    // Moved: two disjoint scattered sets of `hot` pages, A and B.
    let hot = ((pages as f64 * a.hot_fraction) as usize).max(1);
    let moved = (a.mode == Mode::Moved)
        .then(|| permutation(pages, a.seed.wrapping_add(stripe.first as u64)));
    let t1 = Instant::now();
    let mut touches = 0u64;
    let mut elapsed = Duration::ZERO;
    while touches < max_touches && elapsed < deadline {
        let p = match (a.mode, &zipf) {
            (Mode::Zipf, Some((z, perm))) => perm[z.sample(&mut rng) as usize - 1] as usize,
            (Mode::Moved, _) => {
                let perm = moved.as_deref().unwrap_or_default();
                let set = (elapsed.as_secs_f64() / a.move_every) as usize % 2;
                let k = (splitmix(&mut rng) % hot as u64) as usize;
                perm.get(set * hot + k).map_or(k, |&q| q as usize)
            }
            (Mode::Sequential, _) => {
                let p = next_seq;
                next_seq = (next_seq + 1) % pages;
                p
            }
            _ => (splitmix(&mut rng) % pages as u64) as usize,
        };
        let global = stripe.first + p;
        let start = Instant::now();
        let _ = stripe.first_word(p);
        let faulted = start.elapsed();
        let pass = passes[p];
        pattern(global, pass, a.seed, &mut want);
        verify(global, pass, stripe.page(p), &want)?;
        pattern(global, pass + 1, a.seed, &mut want);
        *stripe.page(p) = want;
        passes[p] = pass + 1;
        let end = Instant::now();
        let f = faulted.as_nanos() as u64;
        if f > a.fault_threshold_ns {
            fault_hist.record(f);
        }
        touch_hist.record((end - start).as_nanos() as u64);
        touches += 1;
        elapsed = end - t1;
    }
    Ok(Touched {
        touches,
        elapsed,
        fault_hist,
        touch_hist,
    })
}

fn run(a: &Args) -> Result<serde_json::Value, String> {
    let pages = a.bytes / PAGE;
    let mut map = Mapping::new(pages)?;
    let mut passes = vec![0u32; pages];
    let mut want = [0u64; WORDS];

    // Fill: every page written once with pass 0.
    let t0 = Instant::now();
    for p in 0..pages {
        pattern(p, 0, a.seed, &mut want);
        *map.page(p) = want;
    }
    let fill_s = t0.elapsed().as_secs_f64();

    // Touch phase: each toucher thread in its own stripe of pages (one stripe, on this thread,
    // by default), so that no page is touched by two threads at once.
    let deadline = Duration::from_secs_f64(a.seconds);
    let n = a.touchers;
    let per = pages / n;
    let base = map.base;
    let stripes: Vec<(Stripe, &mut [u32])> = {
        let mut rest = &mut passes[..];
        (0..n)
            .map(|t| {
                let len = if t + 1 == n { pages - per * t } else { per };
                let (mine, more) = std::mem::take(&mut rest).split_at_mut(len);
                rest = more;
                (
                    Stripe {
                        base,
                        first: per * t,
                        pages: len,
                    },
                    mine,
                )
            })
            .collect()
    };
    let max_touches = a.max_touches / n as u64;
    let results: Vec<Result<Touched, String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = stripes
            .into_iter()
            .enumerate()
            .map(|(t, (stripe, passes))| {
                let seed = a.seed;
                sc.spawn(move || {
                    touch_stripe(
                        stripe,
                        passes,
                        a,
                        seed ^ 0xDEAD_BEEF ^ (t as u64).wrapping_mul(0x9E37_79B9),
                        deadline,
                        max_touches,
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a toucher panicked".into()))
            })
            .collect()
    });
    let mut fault_hist = Histogram::new();
    let mut touch_hist = Histogram::new();
    let mut touches = 0u64;
    let mut elapsed = Duration::ZERO;
    for r in results {
        let r = r?;
        fault_hist.merge(&r.fault_hist);
        touch_hist.merge(&r.touch_hist);
        touches += r.touches;
        elapsed = elapsed.max(r.elapsed);
    }
    let touch_s = elapsed.as_secs_f64();

    // Final check: every page once more, in order.
    let mut final_check_s = None;
    if a.final_check {
        let t2 = Instant::now();
        for (p, &pass) in passes.iter().enumerate() {
            pattern(p, pass, a.seed, &mut want);
            verify(p, pass, map.page(p), &want)?;
        }
        final_check_s = Some(t2.elapsed().as_secs_f64());
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    Ok(json!({
        "workload": "usemem",
        "mode": a.mode.name(),
        "touchers": n,
        "zipf_theta": (a.mode == Mode::Zipf).then_some(a.zipf_theta),
        "hot_fraction": (a.mode == Mode::Moved).then_some(a.hot_fraction),
        "move_every_s": (a.mode == Mode::Moved).then_some(a.move_every),
        "bytes": pages * PAGE,
        "pages": pages,
        "fill_s": fill_s,
        "fill_mib_s": (pages * PAGE) as f64 / (1 << 20) as f64 / fill_s,
        "touch_s": touch_s,
        "touches": touches,
        "touches_per_s": touches as f64 / touch_s,
        "mib_per_s": touches as f64 * PAGE as f64 / (1 << 20) as f64 / touch_s,
        "fault_threshold_ns": a.fault_threshold_ns,
        "faulted_touches": fault_hist.count(),
        "fault_p50_us": us(fault_hist.percentile(0.50)),
        "fault_p99_us": us(fault_hist.percentile(0.99)),
        "touch_p50_us": us(touch_hist.percentile(0.50)),
        "touch_p99_us": us(touch_hist.percentile(0.99)),
        "final_check_s": final_check_s,
        "pages_checked": touches + if a.final_check { pages as u64 } else { 0 },
        "check": "ok",
    }))
}

/// Runs usemem with `args` (without the program name).
pub fn main_with(args: &[String]) -> ExitCode {
    let args = match parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("usemem: {e}");
            return ExitCode::from(2);
        }
    };
    let result = if args.mode == Mode::Threads {
        super::threads::run(args.bytes, args.threads, args.rounds, args.seed)
    } else {
        run(&args)
    };
    match result {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            println!(
                "{}",
                json!({"workload": "usemem", "check": "mismatch", "error": e})
            );
            ExitCode::from(3)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sampler's frequencies against the exact Zipf probabilities on a small `n`: a
    /// chi-square test (fixed seed, so deterministic) at the 0.1% level, for the workload's
    /// exponent and for others on both sides of 1.
    #[test]
    fn zipf_matches_the_exact_distribution() {
        const N: u64 = 50;
        const DRAWS: usize = 400_000;
        // chi-square, 49 degrees of freedom, upper 0.1% point.
        const CRITICAL: f64 = 85.35;
        for theta in [0.99, 0.5, 1.0, 1.5] {
            let z = Zipf::new(N, theta).unwrap();
            let mut seen = [0u64; N as usize];
            let mut rng = 42;
            for _ in 0..DRAWS {
                let k = z.sample(&mut rng);
                assert!((1..=N).contains(&k), "rank {k} out of 1..={N}");
                seen[k as usize - 1] += 1;
            }
            let norm: f64 = (1..=N).map(|k| (k as f64).powf(-theta)).sum();
            let chi2: f64 = (1..=N)
                .map(|k| {
                    let expect = DRAWS as f64 * (k as f64).powf(-theta) / norm;
                    let d = seen[k as usize - 1] as f64 - expect;
                    d * d / expect
                })
                .sum();
            assert!(
                chi2 < CRITICAL,
                "theta {theta}: chi-square {chi2:.1} >= {CRITICAL} (counts {seen:?})"
            );
            // The head, where a wrong sampler shows first: P(1) within 1% of exact.
            let p1 = seen[0] as f64 / DRAWS as f64;
            let exact = 1.0 / norm;
            assert!(
                (p1 / exact - 1.0).abs() < 0.01,
                "theta {theta}: P(1) {p1} vs {exact}"
            );
        }
        assert!(Zipf::new(0, 0.99).is_err());
        assert!(Zipf::new(10, 0.0).is_err());
        assert_eq!(Zipf::new(1, 0.99).unwrap().sample(&mut 7), 1);
    }

    #[test]
    fn permutation_is_a_seeded_bijection() {
        let p = permutation(1000, 3);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<u32>>());
        assert_eq!(p, permutation(1000, 3));
        assert_ne!(p, permutation(1000, 4));
        // Scattered: the 10 hottest ranks do not sit in the first 10 pages.
        assert!(p[..10].iter().filter(|&&x| x < 10).count() < 5);
    }

    #[test]
    fn touchers_share_the_work_and_every_page_checks() {
        for (mode, touchers) in [
            ("random", 1),
            ("random", 3),
            ("zipf", 4),
            ("sequential", 2),
            ("moved", 2),
        ] {
            let args: Vec<String> = [
                "--bytes",
                "1M",
                "--mode",
                mode,
                "--touchers",
                &touchers.to_string(),
                "--touches",
                "4000",
                "--seconds",
                "5",
                "--final-check",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let a = parse_args(&args).expect("args");
            let v = run(&a).expect("every page checks");
            assert_eq!(v["touchers"], touchers, "{mode}");
            // Each toucher does its share of the touches, all pages checked at the end.
            assert_eq!(
                v["touches"],
                4000 / touchers as u64 * touchers as u64,
                "{mode}"
            );
            assert_eq!(v["check"], "ok");
        }
        assert!(parse_args(&["--touchers".to_string(), "0".to_string()]).is_err());
    }

    #[test]
    fn patterns_differ_by_page_and_pass() {
        let (mut a, mut b, mut c) = ([0; WORDS], [0; WORDS], [0; WORDS]);
        pattern(7, 3, 1, &mut a);
        pattern(7, 4, 1, &mut b);
        pattern(8, 3, 1, &mut c);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert!(verify(7, 3, &a, &a).is_ok());
        let e = verify(7, 4, &a, &b).unwrap_err();
        assert!(e.contains("page 7"), "{e}");
    }
}
