//! The built-in demo workload: an array of checksummed pages written, then read back in random
//! and sequential order and verified, page by page.

use std::time::Instant;

/// What one page holds: 64-byte records shaped like a program's heap objects (a random word
/// from a 64-bit xorshift stream seeded by (page, generation), the page index, the
/// generation, a record number and constant tags), so that every byte can be recomputed and
/// checked and the page compresses about as well as real heap data (lz4: about 3x).
pub fn fill_page(page: &mut [u8], index: u64, generation: u64) {
    let mut x = index.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ generation.wrapping_mul(0xD1B5_4A32_D192_ED03)
        ^ 0x2545_F491_4F6C_DD1D;
    for (r, rec) in page.chunks_mut(64).enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let words = [
            x,
            index,
            generation,
            r as u64,
            0x0000_7f3a_9c00_0000 | (r as u64) << 4,
            0x6f62_6a65_6374_2d31, // "object-1"
            0,
            0xffff_ffff_0000_0000,
        ];
        for (w, chunk) in words.iter().zip(rec.chunks_mut(8)) {
            chunk.copy_from_slice(&w.to_le_bytes()[..chunk.len()]);
        }
    }
}

/// Whether `page` holds what [`fill_page`] wrote.
pub fn check_page(page: &[u8], index: u64, generation: u64) -> bool {
    let mut want = [0u8; 4096];
    fill_page(&mut want[..page.len()], index, generation);
    page == &want[..page.len()]
}

/// Runs the workload over `size` bytes; prints a summary; returns the number of bad pages.
pub fn workload(size: u64, seed: u64) -> u64 {
    const PAGE: usize = 4096;
    let pages = (size as usize / PAGE).max(1);
    let mut map = match crate::sys::AnonMap::new(pages * PAGE) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("workload: mmap of {size} bytes failed: {e}");
            return u64::MAX;
        }
    };
    let mem = map.as_mut_slice();
    let mut generation = vec![0u64; pages];
    let t0 = Instant::now();
    for (i, p) in mem.chunks_exact_mut(PAGE).enumerate() {
        fill_page(p, i as u64, 0);
    }
    let t_write = t0.elapsed();

    // Random order: verify every page once, rewrite one in four with a new generation.
    let mut order: Vec<usize> = (0..pages).collect();
    let mut x = seed | 1;
    for i in (1..pages).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut bad = 0u64;
    let t1 = Instant::now();
    for (k, &i) in order.iter().enumerate() {
        let p = &mut mem[i * PAGE..(i + 1) * PAGE];
        if !check_page(p, i as u64, generation[i]) {
            bad += 1;
            if bad <= 5 {
                eprintln!("workload: MISMATCH in page {i} (random pass)");
            }
        }
        if k % 4 == 0 {
            generation[i] += 1;
            fill_page(p, i as u64, generation[i]);
        }
    }
    let t_random = t1.elapsed();
    let t2 = Instant::now();
    for (i, p) in mem.chunks_exact(PAGE).enumerate() {
        if !check_page(p, i as u64, generation[i]) {
            bad += 1;
            if bad <= 5 {
                eprintln!("workload: MISMATCH in page {i} (sequential pass)");
            }
        }
    }
    let t_seq = t2.elapsed();
    let mib = (pages * PAGE) as f64 / (1 << 20) as f64;
    println!(
        "workload: {pages} pages ({mib:.0} MiB): write {:.2}s, random verify+rewrite {:.2}s, sequential verify {:.2}s; {} bad pages",
        t_write.as_secs_f64(),
        t_random.as_secs_f64(),
        t_seq.as_secs_f64(),
        bad
    );
    drop(map); // (unmapped)
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_check_and_detect_corruption() {
        let mut p = vec![0u8; 4096];
        fill_page(&mut p, 7, 1);
        assert!(check_page(&p, 7, 1));
        assert!(!check_page(&p, 7, 2));
        assert!(!check_page(&p, 8, 1));
        p[100] ^= 1;
        assert!(!check_page(&p, 7, 1));
    }

    #[test]
    fn small_workload_verifies() {
        assert_eq!(workload(64 * 4096, 3), 0);
    }
}
