//! zswap's writeback driven by `crates/shrinker`: a Zswap registered as a shrinker
//! (`count_objects` / `scan_objects`), shrunk by the registry, writes its coldest entries back to
//! a device and frees them; a failing device frees nothing and keeps every page.
//!
//! It lives in the `bench` crate, which depends on both, because the library crates depend on
//! none of each other, not even for tests (was `crates/zswap/tests/shrinker_registration.rs`).

#[path = "../../crates/zswap/tests/common/mod.rs"]
mod common;

use common::{page, Kind};
use parking_lot::Mutex;
use shrinker::{
    Count, Scan, ShrinkControl, ShrinkRequest, Shrinker, ShrinkerConfig, ShrinkerRegistry,
};
use std::collections::HashMap;
use std::sync::Arc;
use zswap::{Compressor, Config, Zswap, PAGE_SIZE};

/// The glue the daemon needs: a store plus its backing device.
struct ZswapShrinker {
    zswap: Arc<Zswap>,
    device: Arc<Mutex<HashMap<u64, Vec<u8>>>>,
    fail: bool,
}

impl Shrinker for ZswapShrinker {
    fn count_objects(&self, _: &ShrinkControl) -> Count {
        match self.zswap.count_objects() {
            0 => Count::Empty,
            n => Count::Objects(n as u64),
        }
    }

    fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
        let fail = self.fail;
        let device = &self.device;
        let r = self
            .zswap
            .scan_objects(sc.nr_to_scan as usize, &mut |k: u64, p: &[u8]| {
                if fail {
                    return Err(std::io::Error::other("EIO"));
                }
                device.lock().insert(k, p.to_vec());
                Ok(())
            });
        if r.written_back == 0 && r.failed > 0 {
            Scan::Stop
        } else {
            Scan::Freed(r.written_back as u64)
        }
    }
}

fn filled(n: u64) -> (Arc<Zswap>, Vec<Vec<u8>>) {
    let zswap = Arc::new(Zswap::new(Config::new(Compressor::Lz4)).expect("store"));
    let pages: Vec<Vec<u8>> = (0..n).map(|k| page(Kind::Compressible, k)).collect();
    for (k, p) in pages.iter().enumerate() {
        zswap.store(k as u64, p).expect("store");
    }
    (zswap, pages)
}

#[test]
fn registry_shrink_writes_back_coldest_pages() {
    let (zswap, pages) = filled(2000);
    let device = Arc::new(Mutex::new(HashMap::new()));
    let registry = ShrinkerRegistry::default();
    let handle = registry
        .register(
            ShrinkerConfig::new("zswap"),
            ZswapShrinker {
                zswap: zswap.clone(),
                device: device.clone(),
                fail: false,
            },
        )
        .expect("register");
    let freed = registry.shrink(&ShrinkRequest::new(0)).expect("shrink");
    assert!(freed > 0);
    assert_eq!(zswap.stats().written_back_pages, freed);
    assert_eq!(zswap.stats().stored_pages, 2000 - freed);
    // The coldest (first stored) went first, and every page is somewhere, intact.
    let dev = device.lock();
    assert!(
        (0..freed).all(|k| dev.contains_key(&k)),
        "not the coldest entries"
    );
    let mut out = vec![0u8; PAGE_SIZE];
    for (k, want) in pages.iter().enumerate() {
        match dev.get(&(k as u64)) {
            Some(p) => assert_eq!(p, want),
            None => {
                zswap.load(k as u64, &mut out).expect("still stored");
                assert_eq!(&out, want);
            }
        }
    }
    drop(dev);
    handle.unregister();
}

#[test]
fn failing_device_frees_nothing() {
    let (zswap, _) = filled(300);
    let registry = ShrinkerRegistry::default();
    let device = Arc::new(Mutex::new(HashMap::new()));
    let handle = registry
        .register(
            ShrinkerConfig::new("zswap"),
            ZswapShrinker {
                zswap: zswap.clone(),
                device,
                fail: true,
            },
        )
        .expect("register");
    let freed = registry.shrink(&ShrinkRequest::new(0)).expect("shrink");
    assert_eq!(freed, 0);
    assert_eq!(zswap.stats().stored_pages, 300);
    assert!(zswap.stats().reject_reclaim_fail > 0);
    zswap.check_integrity().expect("consistent");
    handle.unregister();
}
