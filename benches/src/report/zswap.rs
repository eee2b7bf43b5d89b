//! Report section `zswap`: the compressed page store against the raw compressor, large-folio
//! stores against page-by-page stores, and pool memory per compressed byte, on page data taken
//! at run time from real processes (python3 with much of the stdlib imported, redis-server filled
//! by redis-benchmark; see `zswap-sample`, `crates/zswap/sample`). Nothing captured is written anywhere.
//!
//! JSON: `{"data": {...}, "results": {COMPRESSOR: {"4k"|"64k"|"2m": {KEYS}}, "pool": {...}}}` with
//! KEYS `store_mb_per_s`, `load_mb_per_s`, `raw_compress_mb_per_s`, `raw_decompress_mb_per_s`,
//! `store_load_vs_raw` (raw compress+decompress time / store+load time: 1.0 = as fast as the raw
//! compressor, goal >= 0.85), `page_by_page_store_mb_per_s`, `folio_vs_page_by_page` (time of
//! storing the same pages one by one / time of the folio store, goal >= 1.2 at 64k),
//! `store_mb_per_s_batch2` (folio pages compressed page by page on 2 threads, wall time: batch
//! threads only apply to page-by-page compression),
//! `page_by_page_store_mb_per_s_wall` and `folio_batch2_vs_page_by_page` (both in wall time), `pool_bytes_per_compressed_byte`
//! and `compression_ratio`. The folio figures are the store's defaults: folios of 4 pages or more
//! compressed in multi-page units (16 pages); for folios above one page,
//! `folio_compressed_page_by_page` has the same figures with multi-page units off (the kernel's
//! page-by-page compression) and `load_one_page_of_each_folio` the cost of single-page loads:
//! `us_per_load` (one page out of each folio, each decompressing its unit),
//! `page_at_a_time_load_mb_per_s` (every page, one load each, in order), and both for the
//! page-by-page store. Per compressor `pool` (`64MiB`, `256MiB` of pages stored): pool bytes per
//! compressed byte after storing, after freeing a random half, and after compaction (goal
//! <= 1.10; `..._compacted_in_classes_only` with zsmalloc's compaction alone).

use super::{Options, Report};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};
use zswap::{Compressor, Config, PageCodec, Zswap, PAGE_SIZE};

const FOLIOS: [(&str, usize); 3] = [("4k", 1), ("64k", 16), ("2m", 512)];

/// What the passes are timed with. The machine is shared and loaded, so single-threaded passes
/// are timed with the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`: time this thread ran,
/// whatever else the machine does); the multi-threaded batch store needs wall time.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Clock {
    ThreadCpu,
    Wall,
}

struct Timer(Clock, Instant, Duration);

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

impl Timer {
    fn start(clock: Clock) -> Timer {
        Timer(clock, Instant::now(), thread_cpu())
    }
    fn elapsed(&self) -> Duration {
        match self.0 {
            Clock::Wall => self.1.elapsed(),
            Clock::ThreadCpu => thread_cpu().saturating_sub(self.2),
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn median_f(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// How many times faster `fast` is than `slow` (time of `slow` / time of `fast`).
fn ratio_of(slow: Duration, fast: Duration) -> f64 {
    slow.as_secs_f64() / fast.as_secs_f64().max(1e-9)
}

fn mb_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e6
}

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

fn store_config(compressor: Compressor, batch_threads: usize) -> Config {
    let mut c = Config::new(compressor);
    c.max_pool_bytes = u64::MAX / 2;
    c.crc = false;
    c.batch_threads = batch_threads;
    c.batch_min_pages = 16;
    c
}

/// The store compressing every folio page by page (multi-page units off), as the kernel does.
fn per_page_config(compressor: Compressor, batch_threads: usize) -> Config {
    let mut c = store_config(compressor, batch_threads);
    c.multi_page_min_pages = 0;
    c
}

/// Time of loading one page out of each stored folio (page `i % folio_pages` of folio `i`):
/// with multi-page units, each such load decompresses its whole unit. Returns (time, loads).
fn one_page_load_pass(
    config: Config,
    data: &[u8],
    folio_pages: usize,
) -> anyhow::Result<(Duration, usize)> {
    let zswap = Zswap::new(config)?;
    let folio = folio_pages * PAGE_SIZE;
    let mut stored = Vec::with_capacity(data.len() / folio);
    for (i, f) in data.chunks_exact(folio).enumerate() {
        if zswap.store((i * folio_pages) as u64, f).is_ok() {
            stored.push((i * folio_pages + i % folio_pages) as u64);
        }
    }
    let mut out = vec![0u8; PAGE_SIZE];
    let t = Timer::start(Clock::ThreadCpu);
    for &k in &stored {
        zswap.load(k, &mut out)?;
    }
    let d = t.elapsed();
    std::hint::black_box(&out);
    Ok((d, stored.len()))
}

/// Time of loading every page of every stored folio one page at a time, in order (faults on
/// the pages of a folio one after the other).
fn page_at_a_time_load_pass(
    config: Config,
    data: &[u8],
    folio_pages: usize,
) -> anyhow::Result<Duration> {
    let zswap = Zswap::new(config)?;
    let folio = folio_pages * PAGE_SIZE;
    let mut stored = Vec::with_capacity(data.len() / folio);
    for (i, f) in data.chunks_exact(folio).enumerate() {
        if zswap.store((i * folio_pages) as u64, f).is_ok() {
            stored.push((i * folio_pages) as u64);
        }
    }
    let mut out = vec![0u8; PAGE_SIZE];
    let t = Timer::start(Clock::ThreadCpu);
    for &k in &stored {
        for j in 0..folio_pages as u64 {
            zswap.load(k + j, &mut out)?;
        }
    }
    let d = t.elapsed();
    std::hint::black_box(&out);
    Ok(d)
}

/// Pages that are not one repeated word and that lz4 compresses below a page: the store would
/// otherwise skip compression (same-filled) or refuse them (compress-poor), and the comparison
/// with the raw compressor would not be like for like. Returns (pages, same-filled, poor).
fn like_for_like(pages: &[u8]) -> anyhow::Result<(Vec<u8>, usize, usize)> {
    let mut codec = PageCodec::new(Compressor::Lz4)?;
    let mut buf = vec![0u8; 3 * PAGE_SIZE];
    let (mut out, mut same, mut poor) = (Vec::with_capacity(pages.len()), 0, 0);
    for p in pages.chunks_exact(PAGE_SIZE) {
        if p.chunks_exact(8).all(|w| w == &p[..8]) {
            same += 1;
        } else if codec.compress(p, &mut buf)? >= PAGE_SIZE {
            poor += 1;
        } else {
            out.extend_from_slice(p);
        }
    }
    Ok((out, same, poor))
}

struct Raw {
    compress: Duration,
    decompress: Duration,
    compressed_bytes: usize,
}

fn raw_pass(compressor: Compressor, data: &[u8]) -> anyhow::Result<Raw> {
    let mut codec = PageCodec::new(compressor)?;
    let mut scratch = vec![0u8; 3 * PAGE_SIZE];
    let mut arena = Vec::with_capacity(data.len());
    let mut lens = Vec::with_capacity(data.len() / PAGE_SIZE);
    let t = Timer::start(Clock::ThreadCpu);
    for p in data.chunks_exact(PAGE_SIZE) {
        let n = codec.compress(p, &mut scratch)?;
        arena.extend_from_slice(&scratch[..n]);
        lens.push(n);
    }
    let compress = t.elapsed();
    let mut out = vec![0u8; PAGE_SIZE];
    let mut off = 0;
    let t = Timer::start(Clock::ThreadCpu);
    for &n in &lens {
        codec.decompress(&arena[off..off + n], &mut out)?;
        off += n;
    }
    let decompress = t.elapsed();
    std::hint::black_box(&out);
    Ok(Raw {
        compress,
        decompress,
        compressed_bytes: arena.len(),
    })
}

struct Stored {
    store: Duration,
    load: Duration,
    pool_bytes: u64,
    compressed_bytes: u64,
    rejected: u64,
}

fn zswap_pass(
    config: Config,
    data: &[u8],
    folio_pages: usize,
    clock: Clock,
) -> anyhow::Result<Stored> {
    let zswap = Zswap::new(config)?;
    let folio = folio_pages * PAGE_SIZE;
    let mut ok = vec![false; data.len() / folio];
    let t = Timer::start(clock);
    for (i, f) in data.chunks_exact(folio).enumerate() {
        ok[i] = zswap.store((i * folio_pages) as u64, f).is_ok();
    }
    let store = t.elapsed();
    let s = zswap.stats();
    let mut out = vec![0u8; folio];
    let t = Timer::start(clock);
    for (i, _) in ok.iter().enumerate().filter(|(_, ok)| **ok) {
        zswap.load((i * folio_pages) as u64, &mut out)?;
    }
    let load = t.elapsed();
    std::hint::black_box(&out);
    Ok(Stored {
        store,
        load,
        pool_bytes: s.pool_total_size,
        compressed_bytes: s.compressed_bytes,
        rejected: s.reject_compress_poor,
    })
}

/// Pages stored for the pool-memory figures: 64 MiB and (not with `--quick`) 256 MiB, the
/// captured pages repeated as needed (packing depends on object sizes, not contents), so that the
/// per-class partly filled spans weigh what they weigh in a pool of realistic size.
const POOL_SIZES: [(&str, usize); 2] = [("64MiB", 16_384), ("256MiB", 65_536)];

/// Pool bytes per compressed byte: after a dense fill, after freeing a pseudo-random half of
/// the pages, after compaction.
fn pool_pass(compressor: Compressor, data: &[u8], pool_pages: usize) -> anyhow::Result<Value> {
    let mut v = pool_pass_with(compressor, data, pool_pages, true)?;
    let in_classes = pool_pass_with(compressor, data, pool_pages, false)?;
    v["pool_bytes_per_compressed_byte_compacted_in_classes_only"] =
        in_classes["pool_bytes_per_compressed_byte_compacted"].clone();
    Ok(v)
}

fn pool_pass_with(
    compressor: Compressor,
    data: &[u8],
    pool_pages: usize,
    across_classes: bool,
) -> anyhow::Result<Value> {
    let mut config = store_config(compressor, 1);
    config.compact_across_classes = across_classes;
    let zswap = Zswap::new(config)?;
    let pages: Vec<&[u8]> = data.chunks_exact(PAGE_SIZE).collect();
    for i in 0..pool_pages {
        let _ = zswap.store(i as u64, pages[i % pages.len()]);
    }
    let ratio = |z: &Zswap| {
        let s = z.stats();
        s.pool_total_size as f64 / s.compressed_bytes.max(1) as f64
    };
    let filled = ratio(&zswap);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..pool_pages as u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if x & 1 == 0 {
            zswap.invalidate(i, 1);
        }
    }
    let fragmented = ratio(&zswap);
    let released = zswap.compact();
    let compacted = ratio(&zswap);
    Ok(json!({
        "pool_bytes_per_compressed_byte_filled": round(filled, 4),
        "pool_bytes_per_compressed_byte_half_freed": round(fragmented, 4),
        "pool_bytes_per_compressed_byte_compacted": round(compacted, 4),
        "compaction_released_bytes": released,
        "pages_compacted": zswap.stats().pages_compacted,
        "pool_pages_stored": pool_pages,
    }))
}

fn compressors() -> Vec<(String, Compressor)> {
    vec![
        ("lz4".into(), Compressor::Lz4),
        ("zstd-1".into(), Compressor::Zstd { level: 1 }),
        ("deflate-1".into(), Compressor::Deflate { level: 1 }),
        ("deflate-iaa".into(), Compressor::DeflateIaa),
    ]
}

/// Runs this section.
pub fn run(opts: &Options) -> anyhow::Result<Report> {
    let (per_source, requests, reps) = if opts.quick {
        (1024, 20_000, 3)
    } else {
        (8192, 100_000, 7)
    };
    let sample = zswap_sample::capture(per_source, requests);
    let (mut data, same, poor) = like_for_like(&sample.pages)?;
    // A whole number of 2 MiB folios.
    let whole = data.len() / (512 * PAGE_SIZE) * (512 * PAGE_SIZE);
    anyhow::ensure!(
        whole > 0,
        "fewer than 512 usable pages captured: {:?}",
        sample.notes
    );
    data.truncate(whole);
    let bytes = data.len();

    let mut results = Map::new();
    let mut table = format!(
        "data: {} pages ({} MiB){}; from {}; skipped {} zero, {} same-filled, {} lz4-incompressible\n",
        bytes / PAGE_SIZE,
        bytes >> 20,
        if sample.synthetic { " SYNTHETIC" } else { "" },
        sample.sources.iter().map(|(s, n)| format!("{s}: {n}")).collect::<Vec<_>>().join(", "),
        sample.zero_pages_skipped,
        same,
        poor
    );
    table += &format!(
        "{:<12} {:>5} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8} {:>9} {:>7} {:>6}\n",
        "compressor",
        "folio",
        "store",
        "load",
        "raw-comp",
        "raw-dec",
        "vs-raw",
        "pg-by-pg",
        "folio/pg",
        "batch2",
        "pool/c",
        "ratio"
    );
    for (name, compressor) in compressors() {
        if let Err(e) = PageCodec::new(compressor) {
            results.insert(name.clone(), json!({ "unavailable": e.to_string() }));
            table += &format!("{name:<12} unavailable: {e}\n");
            continue;
        }
        let mut per_folio = Map::new();
        for (label, folio_pages) in FOLIOS {
            let (mut rc, mut rd, mut st, mut ld, mut pbp, mut b2) = (
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
            );
            let mut pbp_wall = Vec::new();
            // Folio stores compressed page by page (multi-page units off), and one-page loads.
            let (mut pp_st, mut pp_ld, mut pp_each) = (Vec::new(), Vec::new(), Vec::new());
            let (mut one_unit, mut one_pp, mut one_n) = (Vec::new(), Vec::new(), 0);
            let (mut seq_unit, mut seq_pp) = (Vec::new(), Vec::new());
            let mut pp_last = None;
            // Ratios are taken within each repetition (paired, adjacent passes) and their median
            // reported: slow phases of the shared machine then hit both sides of a ratio.
            let (mut vs_raw_each, mut folio_each, mut batch_each) =
                (Vec::new(), Vec::new(), Vec::new());
            let mut last = None;
            let mut raw_bytes = 0;
            for _ in 0..reps {
                // Interleaved in one loop so that noise hits all variants alike.
                let raw = raw_pass(compressor, &data)?;
                rc.push(raw.compress);
                rd.push(raw.decompress);
                raw_bytes = raw.compressed_bytes;
                let s = zswap_pass(
                    store_config(compressor, 1),
                    &data,
                    folio_pages,
                    Clock::ThreadCpu,
                )?;
                st.push(s.store);
                ld.push(s.load);
                vs_raw_each.push(ratio_of(raw.compress + raw.decompress, s.store + s.load));
                let one =
                    zswap_pass(store_config(compressor, 1), &data, 1, Clock::ThreadCpu)?.store;
                pbp.push(one);
                folio_each.push(ratio_of(one, s.store));
                last = Some(s);
                if folio_pages > 1 {
                    let pp = zswap_pass(
                        per_page_config(compressor, 1),
                        &data,
                        folio_pages,
                        Clock::ThreadCpu,
                    )?;
                    pp_st.push(pp.store);
                    pp_ld.push(pp.load);
                    pp_each.push(ratio_of(one, pp.store));
                    pp_last = Some(pp);
                    let (d, n) =
                        one_page_load_pass(store_config(compressor, 1), &data, folio_pages)?;
                    one_unit.push(d / n.max(1) as u32);
                    one_n = n;
                    let (d, n) =
                        one_page_load_pass(per_page_config(compressor, 1), &data, folio_pages)?;
                    one_pp.push(d / n.max(1) as u32);
                    seq_unit.push(page_at_a_time_load_pass(
                        store_config(compressor, 1),
                        &data,
                        folio_pages,
                    )?);
                    seq_pp.push(page_at_a_time_load_pass(
                        per_page_config(compressor, 1),
                        &data,
                        folio_pages,
                    )?);
                }
                if folio_pages > 1 {
                    let b = zswap_pass(
                        per_page_config(compressor, 2),
                        &data,
                        folio_pages,
                        Clock::Wall,
                    )?
                    .store;
                    let p = zswap_pass(store_config(compressor, 1), &data, 1, Clock::Wall)?.store;
                    b2.push(b);
                    pbp_wall.push(p);
                    batch_each.push(ratio_of(p, b));
                }
            }
            let Some(s) = last else {
                anyhow::bail!("no repetitions")
            };
            let (rc, rd, st, ld, pbp) =
                (median(rc), median(rd), median(st), median(ld), median(pbp));
            let vs_raw = median_f(vs_raw_each);
            let folio_vs_pbp = median_f(folio_each);
            let batch_vs_pbp = (!batch_each.is_empty()).then(|| median_f(batch_each));
            let pool = s.pool_bytes as f64 / s.compressed_bytes.max(1) as f64;
            let ratio = bytes as f64 / s.compressed_bytes.max(1) as f64;
            let per_page = pp_last.map(|pp| {
                json!({
                    "store_mb_per_s": round(mb_per_s(bytes, median(pp_st.clone())), 1),
                    "load_mb_per_s": round(mb_per_s(bytes, median(pp_ld.clone())), 1),
                    "folio_vs_page_by_page": round(median_f(pp_each.clone()), 3),
                    "pool_bytes_per_compressed_byte":
                        round(pp.pool_bytes as f64 / pp.compressed_bytes.max(1) as f64, 4),
                    "compression_ratio": round(bytes as f64 / pp.compressed_bytes.max(1) as f64, 3),
                })
            });
            let one_page = (!one_unit.is_empty()).then(|| {
                json!({
                    "loads": one_n,
                    "us_per_load": round(median(one_unit.clone()).as_secs_f64() * 1e6, 2),
                    "us_per_load_page_by_page": round(median(one_pp.clone()).as_secs_f64() * 1e6, 2),
                    "page_at_a_time_load_mb_per_s": round(mb_per_s(bytes, median(seq_unit.clone())), 1),
                    "page_at_a_time_load_mb_per_s_page_by_page": round(mb_per_s(bytes, median(seq_pp.clone())), 1),
                })
            });
            let batch2 = (!b2.is_empty()).then(|| mb_per_s(bytes, median(b2)));
            let pbp_wall = (!pbp_wall.is_empty()).then(|| mb_per_s(bytes, median(pbp_wall)));
            per_folio.insert(
                label.into(),
                json!({
                    "store_mb_per_s": round(mb_per_s(bytes, st), 1),
                    "load_mb_per_s": round(mb_per_s(bytes, ld), 1),
                    "raw_compress_mb_per_s": round(mb_per_s(bytes, rc), 1),
                    "raw_decompress_mb_per_s": round(mb_per_s(bytes, rd), 1),
                    "store_load_vs_raw": round(vs_raw, 3),
                    "page_by_page_store_mb_per_s": round(mb_per_s(bytes, pbp), 1),
                    "folio_vs_page_by_page": round(folio_vs_pbp, 3),
                    "store_mb_per_s_batch2": batch2.map(|x| round(x, 1)),
                    "page_by_page_store_mb_per_s_wall": pbp_wall.map(|x| round(x, 1)),
                    "folio_batch2_vs_page_by_page": batch_vs_pbp.map(|x| round(x, 3)),
                    "pool_bytes_per_compressed_byte": round(pool, 4),
                    "compression_ratio": round(ratio, 3),
                    "raw_compression_ratio": round(bytes as f64 / raw_bytes.max(1) as f64, 3),
                    "reject_compress_poor": s.rejected,
                    "folio_compressed_page_by_page": per_page,
                    "load_one_page_of_each_folio": one_page,
                }),
            );
            table += &format!(
                "{:<12} {:>5} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.3} {:>9.1} {:>8.3} {:>9} {:>7.4} {:>6.3}\n",
                name,
                label,
                mb_per_s(bytes, st),
                mb_per_s(bytes, ld),
                mb_per_s(bytes, rc),
                mb_per_s(bytes, rd),
                vs_raw,
                mb_per_s(bytes, pbp),
                folio_vs_pbp,
                batch_vs_pbp.map_or("-".into(), |x| format!("{x:.3}")),
                pool,
                ratio
            );
            if let (Some(pp), false) = (&per_page, one_unit.is_empty()) {
                table += &format!(
                    "{:<12} {:>5}   folio compressed page by page: store {} load {} folio/pg {} ratio {}; one page of each folio: {} us ({} us page by page); every page one at a time: {} MB/s ({} page by page)\n",
                    name,
                    label,
                    pp["store_mb_per_s"],
                    pp["load_mb_per_s"],
                    pp["folio_vs_page_by_page"],
                    pp["compression_ratio"],
                    round(median(one_unit.clone()).as_secs_f64() * 1e6, 2),
                    round(median(one_pp.clone()).as_secs_f64() * 1e6, 2),
                    round(mb_per_s(bytes, median(seq_unit.clone())), 1),
                    round(mb_per_s(bytes, median(seq_pp.clone())), 1),
                );
            }
        }
        let mut pools = Map::new();
        for (label, pages) in POOL_SIZES.into_iter().take(if opts.quick { 1 } else { 2 }) {
            let pool = pool_pass(compressor, &data, pages)?;
            table += &format!(
                "{:<12} pool of {label} of pages: pool bytes/compressed byte: filled {}, half freed {}, compacted {} (within classes only: {})\n",
                name,
                pool["pool_bytes_per_compressed_byte_filled"],
                pool["pool_bytes_per_compressed_byte_half_freed"],
                pool["pool_bytes_per_compressed_byte_compacted"],
                pool["pool_bytes_per_compressed_byte_compacted_in_classes_only"]
            );
            pools.insert(label.into(), pool);
        }
        per_folio.insert("pool".into(), Value::Object(pools));
        results.insert(name, Value::Object(per_folio));
    }
    table += "timing: thread CPU time for single-threaded passes; batch2 = page-by-page store time / 2-thread folio store time, both in wall time; ratios are medians of per-repetition ratios\n";
    table += "store/load/raw: MB/s of uncompressed pages (medians); vs-raw = raw (compress+decompress) \
              time / zswap (store+load) time; folio/pg = page-by-page store time / folio store time\n";
    let json = json!({
        "data": {
            "pages": bytes / PAGE_SIZE,
            "synthetic": sample.synthetic,
            "sources": sample.sources.iter().map(|(s, n)| json!({"source": s, "pages": n})).collect::<Vec<_>>(),
            "zero_pages_skipped": sample.zero_pages_skipped,
            "same_filled_skipped": same,
            "lz4_incompressible_skipped": poor,
            "notes": sample.notes,
            "repetitions": reps,
            "timing": "thread CPU time (CLOCK_THREAD_CPUTIME_ID) for single-threaded passes; wall time for store_mb_per_s_batch2 and page_by_page_store_mb_per_s_wall",
        },
        "results": Value::Object(results),
    });
    Ok(Report { json, table })
}
