//! Several threads storing, loading and invalidating their own ranges of entries while another
//! thread writes the coldest entries back and compacts the pool. Every page a thread gets back,
//! from the store or from the "device" its writeback went to, must be the one it stored.

mod common;

use common::{folio, next, Kind};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use zswap::{Compressor, Config, LoadError, Zswap, PAGE_SIZE};

fn hammer(config: Config) {
    let zswap = Arc::new(Zswap::new(config).expect("store"));
    let device: Arc<Mutex<HashMap<u64, Vec<u8>>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let shrinker = {
        let (zswap, device, stop) = (zswap.clone(), device.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                rounds += 1;
                let fail = rounds % 3 == 0;
                zswap.scan_objects(4, &mut |k: u64, p: &[u8]| {
                    if fail {
                        return Err(std::io::Error::other("EIO"));
                    }
                    device.lock().insert(k, p.to_vec());
                    Ok(())
                });
                if rounds % 16 == 0 {
                    zswap.compact();
                }
                std::thread::yield_now();
            }
        })
    };
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let (zswap, device) = (zswap.clone(), device.clone());
            std::thread::spawn(move || {
                // Thread t owns entries [t * 16384 - 64, t * 16384 + 64): across a shard boundary.
                let base = (t + 1) * 16_384 - 64;
                let mut mine: HashMap<u64, Vec<u8>> = HashMap::new();
                let mut x = 0x9e37_79b9 ^ t;
                // Under miri (data races, use after free) a few rounds: each is ~1000x slower
                // (12 took 2.5 minutes of CPU there).
                for _ in 0..if cfg!(miri) { 6 } else { 1500 } {
                    let r = next(&mut x);
                    let order = (r % 4) as u32;
                    let nr = 1u64 << order;
                    let at = base + (r >> 8) % (128 - nr);
                    match (r >> 20) % 4 {
                        0 | 1 => {
                            let kinds: Vec<Kind> = (0..nr)
                                .map(|i| {
                                    if (r >> (30 + i)) & 7 == 0 {
                                        Kind::Same
                                    } else {
                                        Kind::Compressible
                                    }
                                })
                                .collect();
                            let data = folio(&kinds, r);
                            zswap.store(at, &data).expect("store");
                            for (i, p) in data.chunks_exact(PAGE_SIZE).enumerate() {
                                mine.insert(at + i as u64, p.to_vec());
                            }
                        }
                        2 => {
                            let mut out = vec![0u8; PAGE_SIZE];
                            match zswap.load(at, &mut out) {
                                Ok(()) => {
                                    let want =
                                        mine.remove(&at).expect("loaded a page never stored");
                                    assert!(out == want, "thread {t}: entry {at} wrong bytes");
                                }
                                Err(LoadError::NotFound { .. }) => {
                                    if let Some(want) = mine.remove(&at) {
                                        let got = device.lock().remove(&at);
                                        assert!(got == Some(want), "thread {t}: entry {at} lost");
                                    }
                                }
                                Err(e) => panic!("load: {e}"),
                            }
                        }
                        _ => {
                            zswap.invalidate(at, nr as usize);
                            for k in at..at + nr {
                                mine.remove(&k);
                            }
                        }
                    }
                }
                // Everything still owned is in the store or on the device, intact.
                for (k, want) in mine {
                    let mut out = vec![0u8; PAGE_SIZE];
                    match zswap.load(k, &mut out) {
                        Ok(()) => assert!(out == want, "entry {k} wrong at the end"),
                        Err(_) => assert!(device.lock().remove(&k) == Some(want), "entry {k} lost"),
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    stop.store(true, Ordering::Relaxed);
    shrinker.join().expect("shrinker");
    zswap.check_integrity().expect("consistent");
    // Threads invalidated or loaded all they stored; whatever remains was invalidated late.
    let left = zswap.stats().stored_pages;
    let removed = if cfg!(miri) {
        // The threads' ranges alone: invalidating 64K entries one by one took two minutes
        // under miri.
        (0..3u64)
            .map(|t| zswap.invalidate((t + 1) * 16_384 - 64, 128))
            .sum()
    } else {
        zswap.invalidate(0, 4 * 16_384)
    };
    assert_eq!(removed, left as usize);
    assert_eq!(zswap.stats().pool_total_size, 0);
    assert!(
        zswap.stats().written_back_pages > 0,
        "the shrinker wrote nothing back"
    );
}

#[test]
fn threads_with_writeback_lz4() {
    let mut c = Config::new(Compressor::Lz4);
    c.index_shards = 4;
    hammer(c);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "zstd is a C library: miri cannot call foreign functions"
)]
fn threads_with_writeback_zstd_batched() {
    let mut c = Config::new(Compressor::Zstd { level: 1 });
    c.batch_threads = 2;
    c.batch_min_pages = 4;
    hammer(c);
}
