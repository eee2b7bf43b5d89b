//! `SharedMglru` with real threads: readers count accesses while a writer adds and evicts.

use std::sync::Arc;
use std::thread;

use mglru::{Config, Hint, NoAccess, PageType, SharedMglru};

#[test]
fn readers_and_a_writer() {
    let lru = Arc::new(SharedMglru::new(Config::default()).unwrap());
    for p in 0..1000 {
        lru.add(p, Hint::fault(PageType::Anon)).unwrap();
    }
    // The writer adds and evicts one page at a time, so which pages the readers find resident
    // depends on the interleaving; the structure must be intact whatever it was.
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let lru = lru.clone();
            thread::spawn(move || {
                let mut hits = 0;
                for round in 0..50 {
                    for p in 0..100 {
                        hits += usize::from(lru.mark_accessed((p + round) % 2000));
                    }
                }
                hits
            })
        })
        .collect();
    let writer = {
        let lru = lru.clone();
        thread::spawn(move || {
            let mut evicted = 0;
            for p in 1000..2000 {
                lru.add(p, Hint::fault(PageType::Anon)).unwrap();
                evicted += lru.evict(1, &mut NoAccess).len();
            }
            evicted
        })
    };
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    assert_eq!(writer.join().unwrap(), 1000);
    assert_eq!(lru.len(), 1000);
    lru.with(|m| m.check_integrity()).unwrap();
    assert_eq!(lru.stats().evicted, 1000);
}
