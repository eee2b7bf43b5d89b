//! Metadata bytes per stored page ([`zswap::Stats::metadata_bytes`]: index, LRU, multi-page
//! object headers, the pool's span bookkeeping, all computed from capacities, so the figure is
//! the same on every machine).
//!
//! Stores N pages (200k in release builds, as many as the daemon keeps for 1 GiB under a
//! 256 MiB limit; 20k in debug builds, to stay quick) at dense swap entries, in 4 KiB and
//! 64 KiB folios, of compressible and of barely compressible pages; prints the figure after the
//! fill and after invalidating a pseudo-random half (the holes a daemon's faults leave), and
//! checks it against the budget. Run with
//! `cargo test --release -p zswap --test metadata -- --nocapture` for the figures.

mod common;

use common::{next, page, Kind};
use zswap::{Compressor, Config, Zswap, PAGE_SIZE};

/// Pages stored per case.
const PAGES: usize = if cfg!(debug_assertions) {
    20_000
} else {
    200_000
};

#[derive(Debug, Clone, Copy)]
enum Data {
    /// Text-like pages (lz4 about 3x).
    Compressible,
    /// 2 KiB of random bytes then text: lz4 about 1.8x.
    BarelyCompressible,
}

fn make_page(data: Data, seed: u64) -> Vec<u8> {
    let mut p = page(Kind::Compressible, seed);
    if let Data::BarelyCompressible = data {
        let mut x = seed | 1;
        for w in p[..2048].chunks_exact_mut(8) {
            w.copy_from_slice(&next(&mut x).to_ne_bytes());
        }
    }
    p
}

/// (bytes per stored page after the fill, bytes per stored page after freeing half).
fn measure(data: Data, folio_pages: usize, units: bool) -> (f64, f64) {
    let mut c = Config::new(Compressor::Lz4);
    c.max_pool_bytes = u64::MAX / 2;
    if !units {
        c.multi_page_min_pages = 0;
    }
    let zswap = Zswap::new(c).expect("store");
    // A few hundred distinct pages, reused: compression cost, not content, is what matters.
    let pages: Vec<Vec<u8>> = (0..256).map(|i| make_page(data, i * 7919 + 1)).collect();
    let mut folio = vec![0u8; folio_pages * PAGE_SIZE];
    for f in 0..PAGES / folio_pages {
        for (i, dst) in folio.chunks_exact_mut(PAGE_SIZE).enumerate() {
            dst.copy_from_slice(&pages[(f * folio_pages + i) % pages.len()]);
        }
        zswap
            .store((f * folio_pages) as u64, &folio)
            .expect("store");
    }
    let s = zswap.stats();
    assert_eq!(s.stored_pages, PAGES as u64);
    let filled = s.metadata_bytes as f64 / s.stored_pages as f64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for k in 0..PAGES as u64 {
        if next(&mut x) & 1 == 0 {
            zswap.invalidate(k, 1);
        }
    }
    let s = zswap.stats();
    let half = s.metadata_bytes as f64 / s.stored_pages.max(1) as f64;
    (filled, half)
}

#[test]
#[cfg_attr(
    miri,
    ignore = "too slow under miri (it compresses thousands of pages; each takes ~0.1 s there); the unit tests and the smaller tests cover the same unsafe code"
)]
fn metadata_bytes_per_stored_page() {
    // (folio pages, multi-page units, budget in bytes per stored page after the fill).
    // 64 KiB page by page is the daemon's setting; with units, each unit's object adds its
    // header, chunk list and a few pool objects of nearly a page each, shared by 16 entries
    // (whose pages keep no CRC or slot of their own).
    let cases = [(1, false, 26.0), (16, false, 26.0), (16, true, 30.0)];
    for data in [Data::Compressible, Data::BarelyCompressible] {
        for (folio_pages, units, budget) in cases {
            let (filled, half) = measure(data, folio_pages, units);
            println!(
                "metadata: {PAGES} pages, {data:?}, {} KiB folios{}: {filled:.1} bytes per \
                 stored page; after freeing a random half: {half:.1}",
                folio_pages * 4,
                if folio_pages == 1 {
                    ""
                } else if units {
                    " in 16-page units"
                } else {
                    " compressed page by page"
                },
            );
            assert!(
                filled <= budget,
                "{filled:.1} bytes per page, budget {budget}"
            );
            // Holes cost their entry slot until the chunk of 64 empties: at most twice.
            assert!(
                half <= 2.0 * budget,
                "{half:.1} bytes per page after freeing half"
            );
        }
    }
}
