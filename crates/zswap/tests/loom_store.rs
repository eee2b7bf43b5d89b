//! Loom models of the store's locking protocol: writeback against load, store against store.
//! The index is mutex-sharded (not lock-free); these models check that an entry under writeback
//! is neither lost nor duplicated whatever the interleaving, and that racing stores leak nothing.
#![cfg(zswap_loom)]

use loom::thread;
use std::sync::Arc;
use zswap::{Compressor, Config, LoadError, Zswap, PAGE_SIZE};

/// loom's coroutines get 32 KiB stacks by default; compressors want more.
const STACK: usize = 1 << 20;

/// Runs `f` as a loom model whose body runs on a thread with a large stack.
fn model(f: impl Fn() + Send + Sync + 'static) {
    let f = Arc::new(f);
    let mut builder = loom::model::Builder::new();
    // The integrity walk locks each of the pool's 255 size classes several times: every lock is
    // a loom branch, so allow more than the default 1000 per execution.
    builder.max_branches = 20_000;
    builder.check(move || {
        let f = f.clone();
        spawn(move || f()).join().expect("model body");
    });
}

fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .expect("spawn")
}

fn small_store() -> Zswap {
    let mut c = Config::new(Compressor::Lz4);
    c.index_shards = 1;
    c.max_span_pages = 1;
    Zswap::new(c).expect("store")
}

fn page(seed: u8) -> Vec<u8> {
    (0..PAGE_SIZE).map(|i| (i / 64) as u8 ^ seed).collect()
}

/// A load racing a writeback of the same entry: exactly one of them gets the page (the load,
/// or the device), never neither, never a wrong page.
#[test]
fn writeback_vs_load() {
    model(|| {
        let zswap = Arc::new(small_store());
        let p = page(1);
        zswap.store(9, &p).expect("store");
        let device = Arc::new(std::sync::Mutex::new(None::<Vec<u8>>));
        let shrinker = {
            let (zswap, device) = (zswap.clone(), device.clone());
            spawn(move || {
                zswap.scan_objects(1, &mut |k: u64, pg: &[u8]| {
                    assert_eq!(k, 9);
                    *device.lock().expect("device") = Some(pg.to_vec());
                    Ok(())
                })
            })
        };
        let mut out = vec![0u8; PAGE_SIZE];
        let loaded = match zswap.load(9, &mut out) {
            Ok(()) => true,
            Err(LoadError::NotFound { .. }) => false,
            Err(e) => panic!("{e}"),
        };
        let r = shrinker.join().expect("shrinker");
        let written = device.lock().expect("device").take();
        if loaded {
            assert_eq!(out, p);
            assert_eq!(
                r.written_back, 0,
                "the page was both loaded and written back"
            );
            assert!(written.is_none() || r.written_back == 0);
        } else {
            assert_eq!(r.written_back, 1);
            assert_eq!(written.as_deref(), Some(p.as_slice()), "page lost");
        }
        assert!(!zswap.contains(9));
        zswap.check_integrity().expect("consistent");
    });
}

/// A load racing a writeback whose device write fails: the load always gets the page.
#[test]
fn failed_writeback_vs_load() {
    model(|| {
        let zswap = Arc::new(small_store());
        let p = page(2);
        zswap.store(3, &p).expect("store");
        let shrinker = {
            let zswap = zswap.clone();
            spawn(move || {
                zswap.scan_objects(1, &mut |_: u64, _: &[u8]| Err(std::io::Error::other("EIO")))
            })
        };
        let mut out = vec![0u8; PAGE_SIZE];
        zswap
            .load(3, &mut out)
            .expect("a failed writeback keeps the page for the load");
        assert_eq!(out, p);
        shrinker.join().expect("shrinker");
        zswap.check_integrity().expect("consistent");
        assert_eq!(zswap.stats().stored_pages, 0);
    });
}

/// Two stores of the same entry and an invalidation: the survivor is one of the stored pages,
/// and the replaced objects are freed (no leak in index, LRU or pool).
#[test]
fn store_vs_store_vs_invalidate() {
    model(|| {
        let zswap = Arc::new(small_store());
        let (a, b) = (page(3), page(4));
        let t = {
            let (zswap, a) = (zswap.clone(), a.clone());
            spawn(move || zswap.store(5, &a).expect("store a"))
        };
        let u = {
            let zswap = zswap.clone();
            spawn(move || zswap.invalidate(5, 1))
        };
        zswap.store(5, &b).expect("store b");
        t.join().expect("t");
        u.join().expect("u");
        zswap.check_integrity().expect("consistent");
        let mut out = vec![0u8; PAGE_SIZE];
        match zswap.load(5, &mut out) {
            Ok(()) => assert!(out == a || out == b),
            Err(LoadError::NotFound { .. }) => {}
            Err(e) => panic!("{e}"),
        }
        assert_eq!(zswap.stats().stored_pages, 0);
        assert_eq!(zswap.stats().pool_total_size, 0, "leaked pool memory");
    });
}

/// The pages of one multi-page object in two index shards, dropped from both sides at once (an
/// invalidation of one half, a load of the other): each page is dropped once and the object's
/// chunks are freed exactly once, by whichever side drops the last reference.
#[test]
fn shared_object_released_from_two_shards() {
    model(|| {
        let mut c = Config::new(Compressor::Lz4);
        c.index_shards = 2;
        c.max_span_pages = 1;
        c.multi_page_unit_pages = 4;
        let zswap = Arc::new(Zswap::new(c).expect("store"));
        let data: Vec<u8> = (0..4).flat_map(|i| page(10 + i)).collect();
        // Entries 16382..16386: two in shard 0, two in shard 1.
        zswap.store(16_382, &data).expect("store");
        assert!(zswap.debug_is_multi_page(16_382) && zswap.debug_is_multi_page(16_385));
        let t = {
            let zswap = zswap.clone();
            spawn(move || zswap.invalidate(16_382, 2))
        };
        let mut out = vec![0u8; 2 * PAGE_SIZE];
        zswap.load(16_384, &mut out).expect("load");
        assert!(out[..] == data[2 * PAGE_SIZE..]);
        assert_eq!(t.join().expect("t"), 2);
        zswap.check_integrity().expect("consistent");
        let s = zswap.stats();
        assert_eq!((s.stored_pages, s.compressed_bytes), (0, 0));
        assert_eq!(s.pool_total_size, 0, "leaked pool memory");
    });
}

/// Two scans racing each other and a store of a newer entry: `scan_objects` peeks at the LRU's
/// tail without the shard lock, then re-checks under the shard lock and the LRU lock that the
/// entry is still there, on the LRU and still the coldest. Each entry is written back at most
/// once, only the two cold entries are taken, and nothing is lost.
#[test]
fn scan_vs_scan_vs_store() {
    model(|| {
        let zswap = Arc::new(small_store());
        zswap.store(1, &page(5)).expect("store");
        zswap.store(2, &page(6)).expect("store");
        let written = Arc::new(std::sync::Mutex::new(Vec::new()));
        let scan = || {
            let (zswap, written) = (zswap.clone(), written.clone());
            spawn(move || {
                zswap.scan_objects(1, &mut |k: u64, _: &[u8]| {
                    written.lock().expect("device").push(k);
                    Ok(())
                })
            })
        };
        let (t, u) = (scan(), scan());
        zswap.store(3, &page(7)).expect("store");
        let done = t.join().expect("t").written_back + u.join().expect("u").written_back;
        let mut w = written.lock().expect("device").clone();
        w.sort_unstable();
        assert_eq!(w.len(), done);
        assert!(w.windows(2).all(|p| p[0] != p[1]), "written twice: {w:?}");
        assert!(
            w.iter().all(|&k| k == 1 || k == 2),
            "not the coldest: {w:?}"
        );
        for k in 1..=3 {
            assert!(
                zswap.contains(k) != w.contains(&k),
                "entry {k} lost or kept twice"
            );
        }
        zswap.check_integrity().expect("consistent");
    });
}

/// A scan racing the reuse of the position it peeked at: entry 1 is loaded and stored again
/// (same key, so the same LRU position, now queued twice: a dead copy at the tail, the live one
/// at the head) while the scan peeks at the tail. The scan must not take the new entry 1 for the
/// coldest: after the re-store, entry 2 is colder. It writes back either the old entry 1 (before
/// the load took it) or entry 2, never the new page of entry 1.
#[test]
fn scan_vs_reuse_of_the_peeked_position() {
    model(|| {
        let zswap = Arc::new(small_store());
        let (old, new) = (page(8), page(9));
        zswap.store(1, &old).expect("store");
        zswap.store(2, &page(10)).expect("store");
        let written = Arc::new(std::sync::Mutex::new(Vec::new()));
        let scan = {
            let (zswap, written) = (zswap.clone(), written.clone());
            spawn(move || {
                zswap.scan_objects(1, &mut |k: u64, pg: &[u8]| {
                    written.lock().expect("device").push((k, pg.to_vec()));
                    Ok(())
                })
            })
        };
        let mut out = vec![0u8; PAGE_SIZE];
        match zswap.load(1, &mut out) {
            Ok(()) => assert_eq!(out, old),
            Err(LoadError::NotFound { .. }) => {}
            Err(e) => panic!("{e}"),
        }
        zswap.store(1, &new).expect("store again");
        scan.join().expect("scan");
        for (k, pg) in written.lock().expect("device").iter() {
            assert!(
                *k == 2 || *pg == old,
                "the newest entry was written back before a colder one"
            );
        }
        zswap.check_integrity().expect("consistent");
    });
}
