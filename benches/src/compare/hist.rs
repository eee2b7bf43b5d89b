//! Percentiles: a log-linear histogram for latencies recorded inside a measured program (a few
//! KiB, about 3% resolution), and exact percentiles and medians of small samples.

/// Sub-buckets per power of two (32: values are kept to within 1/32, about 3%).
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Values below this are kept exactly.
const LINEAR: u64 = 2 * SUB;
const BUCKETS: usize = (LINEAR + (64 - SUB_BITS as u64 - 1) * SUB) as usize;

/// A histogram of `u64` values (nanoseconds) with log-linear buckets, as in HdrHistogram: every
/// bucket spans at most 1/32 of its lowest value.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

fn bucket_of(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // v >= 2^(SUB_BITS+1), so e >= SUB_BITS + 1
    let sub = (v >> (e - SUB_BITS)) & (SUB - 1);
    (LINEAR + u64::from(e - SUB_BITS - 1) * SUB + sub) as usize
}

/// The smallest value that falls into bucket `b`.
fn bucket_low(b: usize) -> u64 {
    let b = b as u64;
    if b < LINEAR {
        return b;
    }
    let e = (b - LINEAR) / SUB + u64::from(SUB_BITS) + 1;
    let sub = (b - LINEAR) % SUB;
    (1 << e) | (sub << (e - u64::from(SUB_BITS)))
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            total: 0,
        }
    }

    /// Adds one value.
    pub fn record(&mut self, v: u64) {
        self.counts[bucket_of(v)] += 1;
        self.total += 1;
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (c, o) in self.counts.iter_mut().zip(&other.counts) {
            *c += o;
        }
        self.total += other.total;
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The value at quantile `q` (0.0..=1.0): the middle of the bucket holding the value of rank
    /// `ceil(q * count)`, so within 1/64 of the exact value. 0 when empty.
    pub fn percentile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let lo = bucket_low(b);
                let hi = if b + 1 < BUCKETS {
                    bucket_low(b + 1)
                } else {
                    u64::MAX
                };
                return lo + (hi - lo) / 2;
            }
        }
        u64::MAX
    }
}

/// The value at quantile `q` of `values` (nearest rank on a sorted copy); `None` when empty.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).max(1);
    Some(v[rank - 1])
}

/// The median of `values` (mean of the two middle values for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in (0..100_000u64).chain([1 << 40, u64::MAX / 3, u64::MAX]) {
            let b = bucket_of(v);
            assert!(b >= last, "bucket of {v} went back");
            last = b;
            let lo = bucket_low(b);
            assert!(lo <= v, "{v}: low {lo}");
            if b + 1 < BUCKETS {
                let hi = bucket_low(b + 1);
                assert!(v < hi, "{v}: high {hi}");
                assert!(
                    (hi - lo) as f64 <= (lo as f64 / 32.0).max(1.0),
                    "{v}: [{lo}, {hi})"
                );
            }
        }
    }

    #[test]
    fn histogram_percentiles_are_close() {
        let mut h = Histogram::new();
        for v in 1..=10_000u64 {
            h.record(v * 100);
        }
        for (q, exact) in [(0.5, 500_000.0), (0.99, 990_000.0), (1.0, 1_000_000.0)] {
            let got = h.percentile(q) as f64;
            assert!(
                (got - exact).abs() / exact < 0.02,
                "q {q}: {got} vs {exact}"
            );
        }
        assert_eq!(Histogram::new().percentile(0.5), 0);
    }

    #[test]
    fn exact_percentiles_and_medians() {
        let v = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&v, 0.5), Some(3.0));
        assert_eq!(percentile(&v, 0.99), Some(5.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(median(&v), Some(3.0));
        assert_eq!(median(&[1.0, 2.0, 10.0, 20.0]), Some(6.0));
        assert_eq!(median(&[]), None);
    }
}
