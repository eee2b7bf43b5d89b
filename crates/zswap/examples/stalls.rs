//! How long loads wait on the store's occasional whole-structure work: 200k pages stored page
//! by page, three quarters of them loaded in random order (timed one by one: the LRU's queue is
//! rebuilt once dead positions outnumber live ones), then `compact()` while another thread loads
//! the rest (the longest of those loads is the longest compaction step it met).
//!
//! `cargo run --release -p zswap --example stalls`
use std::time::Instant;
use zswap::{Compressor, Config, Zswap, PAGE_SIZE};

fn main() {
    let mut c = Config::new(Compressor::Lz4);
    c.max_pool_bytes = u64::MAX / 2;
    c.multi_page_min_pages = 0;
    let z = std::sync::Arc::new(Zswap::new(c).unwrap());
    let n = 200_000u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut page = vec![0u8; PAGE_SIZE];
    for k in 0..n {
        for (i, b) in page.iter_mut().enumerate() {
            *b = if i % 64 < 40 {
                (i / 64) as u8 ^ k as u8
            } else {
                next() as u8
            };
        }
        z.store(k, &page).unwrap();
    }
    // Loads in random order, timed: the LRU rebuilds when dead copies outnumber live ones.
    let mut keys: Vec<u64> = (0..n).collect();
    for i in (1..keys.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        keys.swap(i, j);
    }
    let mut lat = Vec::with_capacity(keys.len());
    for &k in &keys[..(n as usize * 3 / 4)] {
        let t = Instant::now();
        z.load(k, &mut page).unwrap();
        lat.push(t.elapsed().as_nanos() as u64);
    }
    lat.sort_unstable();
    let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q) as usize];
    println!(
        "loads: p50 {} ns, p99 {} ns, p99.99 {} ns, max {} ns, >200us: {}",
        p(0.5),
        p(0.99),
        p(0.9999),
        lat[lat.len() - 1],
        lat.iter().filter(|&&l| l > 200_000).count()
    );
    // Compaction with a thread loading meanwhile: the longest load is the longest class step.
    let rest: Vec<u64> = keys[(n as usize * 3 / 4)..].to_vec();
    let z2 = z.clone();
    let t = std::thread::spawn(move || {
        let mut page = vec![0u8; PAGE_SIZE];
        let mut max = 0u128;
        let mut n = 0;
        for &k in &rest {
            let t = Instant::now();
            z2.load_shared(k, &mut page).unwrap();
            max = max.max(t.elapsed().as_nanos());
            n += 1;
        }
        (max, n)
    });
    let t0 = Instant::now();
    let released = z.compact();
    let took = t0.elapsed();
    let (max, loads) = t.join().unwrap();
    println!(
        "compact: released {released} bytes in {:?}; {loads} loads meanwhile, longest {} us",
        took,
        max / 1000
    );
}
