//! Trace replay: a simulated memory of a fixed number of pages in front of a [`Policy`], and
//! the synthetic workloads of the benchmark.
//!
//! Every request sets the page's accessed bit (in [`AccessBits`]); a hit also tells the policy
//! of a mapped access; a miss evicts down to the capacity and adds the page as faulted.

use std::collections::BTreeSet;
use std::ops::Range;

use crate::error::ReplayError;
use crate::{
    AccessKind, AccessSource, ActiveInactive, Clock, Config, Hint, Lru, Mglru, PageId, PageType,
    Policy,
};

/// Accessed bits of a simulated memory: an [`AccessSource`] over a sorted set.
#[derive(Debug, Default, Clone)]
pub struct AccessBits {
    set: BTreeSet<PageId>,
    /// Calls to `test_and_clear_young` (ranges walked).
    pub range_calls: u64,
    /// Calls to `test_and_clear_page`.
    pub page_calls: u64,
}

impl AccessBits {
    /// No bit set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the bit of `page` (an access).
    pub fn set(&mut self, page: PageId) {
        self.set.insert(page);
    }

    /// Clears the bit of `page` (it left memory).
    pub fn clear(&mut self, page: PageId) {
        self.set.remove(&page);
    }

    /// Whether the bit of `page` is set.
    pub fn is_set(&self, page: PageId) -> bool {
        self.set.contains(&page)
    }
}

impl AccessSource for AccessBits {
    fn test_and_clear_young(&mut self, range: Range<PageId>, young: &mut dyn FnMut(PageId)) {
        self.range_calls += 1;
        let hits: Vec<PageId> = self.set.range(range).copied().collect();
        for p in hits {
            self.set.remove(&p);
            young(p);
        }
    }

    fn test_and_clear_page(&mut self, page: PageId) -> bool {
        self.page_calls += 1;
        self.set.remove(&page)
    }
}

/// The outcome of one replay.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayResult {
    /// The policy's name.
    pub policy: String,
    /// Pages of memory.
    pub capacity: usize,
    /// Requests replayed.
    pub requests: u64,
    /// Requests that were not resident.
    pub misses: u64,
}

impl ReplayResult {
    /// `misses / requests` (0 for an empty trace).
    pub fn miss_ratio(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.misses as f64 / self.requests as f64
        }
    }
}

/// Replays `trace` on a memory of `capacity` pages managed by `policy`. A page the policy
/// cannot hold (for [`Mglru`], an id above [`crate::MAX_PAGE_ID`]) stops the replay with
/// [`ReplayError::Rejected`].
pub fn replay(
    policy: &mut dyn Policy,
    capacity: usize,
    trace: &[PageId],
) -> Result<ReplayResult, ReplayError> {
    let mut bits = AccessBits::new();
    replay_with(policy, capacity, trace, &mut bits)
}

/// [`replay`] with the caller's accessed bits (to read their counters afterwards).
pub fn replay_with(
    policy: &mut dyn Policy,
    capacity: usize,
    trace: &[PageId],
    bits: &mut AccessBits,
) -> Result<ReplayResult, ReplayError> {
    if capacity == 0 {
        return Err(ReplayError::ZeroCapacity);
    }
    let mut misses = 0;
    for (k, &page) in trace.iter().enumerate() {
        if policy.contains(page) {
            bits.set(page);
            policy.access(page, AccessKind::Mapped);
            continue;
        }
        misses += 1;
        if policy.len() >= capacity {
            let n = policy.len() + 1 - capacity;
            for victim in policy.evict(n, bits) {
                bits.clear(victim);
            }
        }
        // The page is not resident, so only an id the policy cannot hold fails (MGLRU's
        // limit is MAX_PAGE_ID): stop with the request rather than replay a different trace.
        if let Err(source) = policy.add(page, Hint::fault(PageType::Anon)) {
            return Err(ReplayError::Rejected {
                request: k,
                policy: policy.name().to_string(),
                source,
            });
        }
        // The faulting access sets the bit once the page is mapped: after the eviction that
        // made room for it, so that eviction's look-around cannot clear it.
        bits.set(page);
    }
    Ok(ReplayResult {
        policy: policy.name().to_string(),
        capacity,
        requests: trace.len() as u64,
        misses,
    })
}

/// Parses a trace: one page id per line (decimal or `0x` hex, any `u64`), blank lines and `#`
/// comments skipped. Ids are kept as they are (their adjacency matters to MGLRU's regions and
/// look-around); [`replay`] reports an id a policy cannot hold.
pub fn parse_trace(text: &str) -> Result<Vec<PageId>, ReplayError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let v = match t.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16),
            None => t.parse(),
        };
        match v {
            Ok(p) => out.push(p),
            Err(_) => {
                return Err(ReplayError::BadLine {
                    line: n + 1,
                    content: t.chars().take(64).collect(),
                })
            }
        }
    }
    Ok(out)
}

/// The policy names [`policy_by_name`] accepts.
pub const POLICIES: [&str; 4] = ["mglru", "active-inactive", "lru", "clock"];

/// A policy by name, MGLRU with `cfg`.
pub fn policy_by_name(name: &str, cfg: &Config) -> Result<Box<dyn Policy>, ReplayError> {
    Ok(match name {
        // The default configuration is valid; a bad one is reported as an unknown policy.
        "mglru" => Box::new(
            Mglru::new(cfg.clone()).map_err(|e| ReplayError::UnknownPolicy(e.to_string()))?,
        ),
        "active-inactive" => Box::new(ActiveInactive::default()),
        "lru" => Box::new(Lru::new()),
        "clock" => Box::new(Clock::new()),
        _ => return Err(ReplayError::UnknownPolicy(name.to_string())),
    })
}

/// Distinct pages of a trace.
pub fn distinct(trace: &[PageId]) -> usize {
    let mut v = trace.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len()
}

/// Synthetic workloads of the benchmark (deterministic for a seed).
pub mod workload {
    use crate::PageId;

    /// A small deterministic generator (`splitmix64`).
    #[derive(Debug, Clone)]
    pub struct SplitMix(u64);

    impl SplitMix {
        /// Seeded generator.
        pub fn new(seed: u64) -> Self {
            Self(seed)
        }

        /// The next 64 random bits.
        pub fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        /// Uniform in `[0, 1)`.
        pub fn next_f64(&mut self) -> f64 {
            (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// A Zipf sampler over `0..n` with exponent `alpha` (inverse CDF by binary search).
    #[derive(Debug, Clone)]
    pub struct Zipf {
        cdf: Vec<f64>,
    }

    impl Zipf {
        /// Zipf over `n` items.
        pub fn new(n: usize, alpha: f64) -> Self {
            let mut cdf = Vec::with_capacity(n);
            let mut sum = 0.0;
            for k in 1..=n {
                sum += 1.0 / (k as f64).powf(alpha);
                cdf.push(sum);
            }
            for c in &mut cdf {
                *c /= sum;
            }
            Self { cdf }
        }

        /// One sample (rank 0 is the most popular).
        pub fn sample(&self, rng: &mut SplitMix) -> u64 {
            let u = rng.next_f64();
            self.cdf.partition_point(|&c| c < u) as u64
        }
    }

    /// A Zipf(alpha) hot set of `hot` pages interleaved with a one-pass scan of pages never
    /// reused: `scan_per_hot` scan requests after each `hot_per_group` hot requests (1:1 is
    /// `(1, 1)`, 1:4 is `(1, 4)`), `len` requests in all. Hot pages are spread over the ids so
    /// both occupy many regions.
    pub fn zipf_with_scan(
        hot: usize,
        alpha: f64,
        hot_per_group: usize,
        scan_per_group: usize,
        len: usize,
        seed: u64,
    ) -> Vec<PageId> {
        let z = Zipf::new(hot, alpha);
        let mut rng = SplitMix::new(seed);
        let mut out = Vec::with_capacity(len);
        let mut scan: PageId = 1 << 32;
        while out.len() < len {
            for _ in 0..hot_per_group {
                out.push(z.sample(&mut rng));
            }
            for _ in 0..scan_per_group {
                out.push(scan);
                scan += 1;
            }
        }
        out.truncate(len);
        out
    }

    /// A loop over `pages` pages, `rounds` times.
    pub fn looping(pages: usize, rounds: usize) -> Vec<PageId> {
        (0..rounds).flat_map(|_| 0..pages as PageId).collect()
    }

    /// A random permutation of `0..n` (Fisher-Yates with [`SplitMix`]): rank to page id
    /// offset, so a Zipf set's popular pages are spread over its ids as a heap's are.
    fn permutation(n: usize, rng: &mut SplitMix) -> Vec<PageId> {
        let mut v: Vec<PageId> = (0..n as PageId).collect();
        for i in (1..n).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
        v
    }

    /// First page id of the second hot set of [`moving_hot_set`] and of the scanned range of
    /// [`zipf_with_periodic_scan`] (far from the first set, so no region holds both).
    pub const SECOND_SET_BASE: PageId = 1 << 32;

    /// A hot set that moves: `phases` phases of `phase_len` requests each, Zipf(`alpha`) over
    /// `set` pages; even phases use set A (ids `0..set`), odd ones a disjoint set B of the same
    /// size (ids `SECOND_SET_BASE..SECOND_SET_BASE + set`), so with 3 phases the hot set moves
    /// to B and back to A. Ranks are mapped to ids by a fixed random permutation per set.
    pub fn moving_hot_set(
        set: usize,
        alpha: f64,
        phase_len: usize,
        phases: usize,
        seed: u64,
    ) -> Vec<PageId> {
        let z = Zipf::new(set, alpha);
        let mut rng = SplitMix::new(seed);
        let perm = [permutation(set, &mut rng), permutation(set, &mut rng)];
        let base = [0, SECOND_SET_BASE];
        let mut out = Vec::with_capacity(phase_len * phases);
        for phase in 0..phases {
            let s = phase % 2;
            for _ in 0..phase_len {
                out.push(base[s] + perm[s][z.sample(&mut rng) as usize]);
            }
        }
        out
    }

    /// A working set with periodic full scans: Zipf(`alpha`) over `hot` pages (ids spread by a
    /// permutation of `0..hot`) and, after every `period` hot requests, one pass over the same
    /// `scan` pages (ids `SECOND_SET_BASE..`, in order: a backup, a checksum or a collector's
    /// sweep over a data set), `len` requests in all.
    pub fn zipf_with_periodic_scan(
        hot: usize,
        alpha: f64,
        scan: usize,
        period: usize,
        len: usize,
        seed: u64,
    ) -> Vec<PageId> {
        let z = Zipf::new(hot, alpha);
        let mut rng = SplitMix::new(seed);
        let perm = permutation(hot, &mut rng);
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            for _ in 0..period {
                out.push(perm[z.sample(&mut rng) as usize]);
            }
            out.extend((0..scan as PageId).map(|p| SECOND_SET_BASE + p));
        }
        out.truncate(len);
        out
    }
}
