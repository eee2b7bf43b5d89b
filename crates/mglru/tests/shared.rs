//! `SharedMglru` with real threads: readers count accesses while a writer adds and evicts.

use std::sync::Arc;
use std::thread;

use mglru::{Config, Hint, NoAccess, PageType, SharedMglru};

#[test]
fn readers_and_a_writer() {
    // v6.1's placement: faulted pages start in the youngest generation, away from the writer's.
    let lru = Arc::new(SharedMglru::new(Config::v6_1()).unwrap());
    for p in 0..1000 {
        lru.add(p, Hint::fault(PageType::Anon)).unwrap();
    }
    // The writer adds sequential pages, which go alone to the oldest generation, and evicts one
    // page each time: always the one it just added. So the readers' pages stay resident.
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let lru = lru.clone();
            thread::spawn(move || {
                let mut hits = 0;
                for _ in 0..50 {
                    for p in 0..100 {
                        hits += usize::from(lru.mark_accessed(p));
                    }
                }
                hits
            })
        })
        .collect();
    let writer = {
        let lru = lru.clone();
        thread::spawn(move || {
            let mut victims = Vec::new();
            for p in 1000..2000 {
                lru.add(p, Hint::sequential(PageType::Anon)).unwrap();
                victims.extend(lru.evict(1, &mut NoAccess));
            }
            victims
        })
    };
    for r in readers {
        assert_eq!(r.join().unwrap(), 5000);
    }
    assert_eq!(writer.join().unwrap(), (1000..2000).collect::<Vec<_>>());
    assert_eq!(lru.len(), 1000);
    for p in 0..100 {
        assert_eq!(lru.tier(p), Some(3), "100 accesses reach the top tier");
    }
    assert_eq!(lru.tier(100), Some(0));
    lru.with(|m| m.check_integrity()).unwrap();
    assert_eq!(lru.stats().evicted, 1000);
}
