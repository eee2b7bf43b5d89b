//! The bloom filter of dense regions (the kernel's `lrugen->filters`, one per generation
//! parity, `1 << BLOOM_FILTER_SHIFT` bits, two hash functions).
//!
//! The aging walk for `max_seq` tests the filter of `max_seq` and skips regions not in it; it
//! adds each region where at least one in [`DENSE_FRACTION`] resident pages was young to the
//! filter of `max_seq + 1`, for the next walk. A false positive costs one needless region scan;
//! a false negative cannot happen for regions that were added, so a dense region is never
//! skipped by the next walk.

/// Bits per filter (the kernel's `BLOOM_FILTER_SHIFT = 15`).
pub(crate) const BLOOM_FILTER_SHIFT: u32 = 15;

/// A region is dense if `young * DENSE_FRACTION >= resident` (the kernel's `suitable_to_scan`:
/// on average one young PTE per cache line of eight).
pub(crate) const DENSE_FRACTION: usize = 8;

/// One filter.
#[derive(Debug, Clone)]
pub(crate) struct BloomFilter {
    bits: Vec<u64>,
}

impl BloomFilter {
    pub(crate) fn heap_bytes(&self) -> usize {
        self.bits.capacity() * 8
    }

    pub(crate) fn new() -> Self {
        Self {
            bits: vec![0; (1usize << BLOOM_FILTER_SHIFT) / 64],
        }
    }

    fn keys(region: u64) -> [usize; 2] {
        // hash_64 of the kernel: multiply by the golden ratio, then two slices of the top bits.
        let h = region.wrapping_mul(0x61c8_8646_80b5_83eb);
        let h = (h ^ (h >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let mask = (1u64 << BLOOM_FILTER_SHIFT) - 1;
        [
            (h & mask) as usize,
            ((h >> BLOOM_FILTER_SHIFT) & mask) as usize,
        ]
    }

    pub(crate) fn clear(&mut self) {
        self.bits.iter_mut().for_each(|w| *w = 0);
    }

    pub(crate) fn insert(&mut self, region: u64) {
        for k in Self::keys(region) {
            self.bits[k / 64] |= 1 << (k % 64);
        }
    }

    pub(crate) fn contains(&self, region: u64) -> bool {
        Self::keys(region)
            .iter()
            .all(|&k| self.bits[k / 64] & (1 << (k % 64)) != 0)
    }
}

#[cfg(all(test, not(mglru_loom)))]
mod tests {
    use super::*;

    #[test]
    fn inserted_regions_are_found_and_few_others() {
        let mut f = BloomFilter::new();
        for r in (0..1000u64).map(|r| r * 7919) {
            f.insert(r);
        }
        assert!((0..1000u64).all(|r| f.contains(r * 7919)));
        let false_pos = (0..10_000u64)
            .map(|r| r * 7919 + 1)
            .filter(|&r| f.contains(r))
            .count();
        // Two hashes, 2^15 bits, 1000 keys: about 0.4% false positives.
        assert!(false_pos < 300, "{false_pos} false positives");
        f.clear();
        assert!(!f.contains(0));
    }
}
