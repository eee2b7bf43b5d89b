//! Loom model of `SharedMglru`: descriptor accesses under the read lock run at the same time
//! as each other and are ordered against eviction under the write lock.
#![cfg(mglru_loom)]

use loom::sync::Arc;
use loom::thread;
use mglru::{Config, Hint, NoAccess, PageType, SharedMglru};

#[test]
fn accesses_race_with_eviction() {
    loom::model(|| {
        let lru = Arc::new(SharedMglru::new(Config::default()).unwrap());
        lru.add(1, Hint::sequential(PageType::Anon)).unwrap();
        lru.add(2, Hint::fault(PageType::Anon)).unwrap();
        let reader = {
            let lru = lru.clone();
            thread::spawn(move || (lru.mark_accessed(2), lru.mark_accessed(2)))
        };
        let evictor = {
            let lru = lru.clone();
            thread::spawn(move || lru.evict(1, &mut NoAccess))
        };
        let third = lru.mark_accessed(2);
        let (a, b) = reader.join().unwrap();
        let victims = evictor.join().unwrap();
        // The cold, oldest page goes; the accessed one stays, with all three accesses counted.
        assert_eq!(victims, vec![1]);
        assert!(a && b && third);
        assert_eq!(lru.tier(2), Some(2));
        assert_eq!(lru.len(), 1);
        lru.with(|m| m.check_integrity()).unwrap();
    });
}
