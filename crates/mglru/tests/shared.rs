//! `SharedMglru` with real threads: readers count accesses while a writer adds and evicts.

use std::sync::Arc;
use std::thread;

use mglru::{Config, Hint, NoAccess, PageType, SharedMglru};

/// Pages faulted in first, rounds of 100 accesses per reader, pages the writer adds and evicts.
/// Under miri a tenth or less of each: the full sizes took 12 minutes of CPU there.
const RESIDENT: u64 = if cfg!(miri) { 110 } else { 1000 };
const ROUNDS: usize = if cfg!(miri) { 3 } else { 50 };
const WRITES: u64 = if cfg!(miri) { 50 } else { 1000 };

#[test]
fn readers_and_a_writer() {
    // v6.1's placement: faulted pages start in the youngest generation, away from the writer's.
    let lru = Arc::new(SharedMglru::new(Config::v6_1()).unwrap());
    for p in 0..RESIDENT {
        lru.add(p, Hint::fault(PageType::Anon)).unwrap();
    }
    // The writer adds sequential pages, which go alone to the oldest generation, and evicts one
    // page each time: always the one it just added. So the readers' pages stay resident.
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let lru = lru.clone();
            thread::spawn(move || {
                let mut hits = 0;
                for _ in 0..ROUNDS {
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
            for p in RESIDENT..RESIDENT + WRITES {
                lru.add(p, Hint::sequential(PageType::Anon)).unwrap();
                victims.extend(lru.evict(1, &mut NoAccess));
            }
            victims
        })
    };
    for r in readers {
        assert_eq!(r.join().unwrap(), ROUNDS * 100);
    }
    assert_eq!(
        writer.join().unwrap(),
        (RESIDENT..RESIDENT + WRITES).collect::<Vec<_>>()
    );
    assert_eq!(lru.len(), RESIDENT as usize);
    for p in 0..100 {
        assert_eq!(
            lru.tier(p),
            Some(3),
            "{} accesses reach the top tier",
            2 * ROUNDS
        );
    }
    assert_eq!(lru.tier(100), Some(0));
    lru.with(|m| m.check_integrity()).unwrap();
    assert_eq!(lru.stats().evicted, WRITES);
}
