//! Criterion micro-benchmarks, each side by side with its baseline in one run:
//! - `store_load/*`: a 64 KiB folio stored and loaded back through zswap vs the raw compressor
//!   compressing and decompressing the same 16 pages with a reused context;
//! - `folio_vs_pages/*`: one 16-page folio store vs 16 single-page stores of the same pages.
//!
//! Pages come from real processes captured at start (python3, redis-server; see
//! `zswap-sample`, `crates/zswap/sample`), or a labelled synthetic mix when those are not installed.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::Duration;
use zswap::{Compressor, Config, PageCodec, Zswap, PAGE_SIZE};

const FOLIO_PAGES: usize = 16;

fn folios() -> Vec<Vec<u8>> {
    let sample = zswap_sample::capture(512, 20_000);
    if sample.synthetic {
        eprintln!("zswap benches: SYNTHETIC page data ({:?})", sample.notes);
    }
    // Like for like: drop same-filled and lz4-incompressible pages.
    let mut lz4 = PageCodec::new(Compressor::Lz4).expect("lz4");
    let mut buf = vec![0u8; 3 * PAGE_SIZE];
    let pages: Vec<&[u8]> = sample
        .pages
        .chunks_exact(PAGE_SIZE)
        .filter(|p| !p.chunks_exact(8).all(|w| w == &p[..8]))
        .filter(|p| lz4.compress(p, &mut buf).is_ok_and(|n| n < PAGE_SIZE))
        .collect();
    pages
        .chunks_exact(FOLIO_PAGES)
        .take(32)
        .map(|c| c.concat())
        .collect()
}

fn config(compressor: Compressor) -> Config {
    let mut c = Config::new(compressor);
    c.crc = false;
    c.max_pool_bytes = u64::MAX / 2;
    c
}

fn benches(c: &mut Criterion) {
    let folios = folios();
    let bytes = (folios.len() * FOLIO_PAGES * PAGE_SIZE) as u64;
    for (name, compressor) in [
        ("lz4", Compressor::Lz4),
        ("zstd-1", Compressor::Zstd { level: 1 }),
    ] {
        let mut g = c.benchmark_group("store_load");
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function(BenchmarkId::new("zswap", name), |b| {
            let zswap = Zswap::new(config(compressor)).expect("store");
            let mut out = vec![0u8; FOLIO_PAGES * PAGE_SIZE];
            b.iter(|| {
                for (i, f) in folios.iter().enumerate() {
                    zswap.store((i * FOLIO_PAGES) as u64, f).expect("store");
                }
                for i in 0..folios.len() {
                    zswap
                        .load((i * FOLIO_PAGES) as u64, &mut out)
                        .expect("load");
                }
            });
        });
        g.bench_function(BenchmarkId::new("raw", name), |b| {
            let mut codec = PageCodec::new(compressor).expect("codec");
            let mut packed = vec![0u8; 3 * PAGE_SIZE];
            let mut out = vec![0u8; PAGE_SIZE];
            b.iter(|| {
                for f in &folios {
                    for p in f.chunks_exact(PAGE_SIZE) {
                        let n = codec.compress(p, &mut packed).expect("compress");
                        codec
                            .decompress(&packed[..n], &mut out)
                            .expect("decompress");
                    }
                }
            });
        });
        g.finish();

        let mut g = c.benchmark_group("folio_vs_pages");
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function(BenchmarkId::new("folio_store", name), |b| {
            let zswap = Zswap::new(config(compressor)).expect("store");
            b.iter(|| {
                for (i, f) in folios.iter().enumerate() {
                    zswap.store((i * FOLIO_PAGES) as u64, f).expect("store");
                }
            });
        });
        g.bench_function(BenchmarkId::new("page_by_page_store", name), |b| {
            let zswap = Zswap::new(config(compressor)).expect("store");
            b.iter(|| {
                for (i, f) in folios.iter().enumerate() {
                    for (j, p) in f.chunks_exact(PAGE_SIZE).enumerate() {
                        zswap.store((i * FOLIO_PAGES + j) as u64, p).expect("store");
                    }
                }
            });
        });
        g.finish();
    }
}

criterion_group! {
    name = store;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(store);
