//! Loom models: group bitmaps under concurrent registration, unregistration,
//! array growth and shrinking; the set-bit / clear-bit handshake; and
//! `synchronize`.
//!
//! Under `shrinker_loom` a bitmap unit holds 2 shrinkers and the id table
//! starts with 1 slot, so a third registration grows both the id table and
//! every group's arrays while other threads walk them.
#![cfg(shrinker_loom)]

use std::sync::Arc;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use shrinker::{
    Count, Scan, ShrinkControl, ShrinkRequest, Shrinker, ShrinkerConfig, ShrinkerRegistry,
};

/// A cache whose object count is shared with the test.
struct Cache(Arc<AtomicU64>);

impl Shrinker for Cache {
    fn count_objects(&self, _: &ShrinkControl) -> Count {
        match self.0.load(Ordering::SeqCst) {
            0 => Count::Empty,
            n => Count::Objects(n),
        }
    }
    fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
        // Never frees below 1 object, so that the bit must stay set.
        let n = self.0.load(Ordering::SeqCst);
        let take = sc.nr_to_scan.min(n.saturating_sub(1));
        self.0.fetch_sub(take, Ordering::SeqCst);
        Scan::Freed(take)
    }
}

fn memcg(name: &str) -> ShrinkerConfig {
    ShrinkerConfig::new(name).memcg_aware(true)
}

#[test]
fn register_grows_arrays_while_shrinking_and_unregistering() {
    loom::model(|| {
        let registry = ShrinkerRegistry::default();
        let g = registry.create_group(None).expect("group");
        let a_objs = Arc::new(AtomicU64::new(0));
        let b_objs = Arc::new(AtomicU64::new(3));
        let ha = registry
            .register(memcg("a"), Cache(a_objs.clone()))
            .expect("a");
        let hb = registry.register(memcg("b"), Cache(b_objs)).expect("b");
        hb.set_shrinker_bit(g, 0).expect("bit b");

        // Thread 1: registers c (id 2: grows the id table and the group's
        // arrays from 1 to 2 units) and sets its bit.
        let r = registry.clone();
        let c_objs = Arc::new(AtomicU64::new(2));
        let c_objs2 = c_objs.clone();
        let t1 = loom::thread::spawn(move || {
            let hc = r.register(memcg("c"), Cache(c_objs2)).expect("c");
            hc.set_shrinker_bit(g, 0).expect("bit c");
            hc
        });
        // Thread 2: shrinks the group.
        let r2 = registry.clone();
        let t2 = loom::thread::spawn(move || {
            r2.shrink(&ShrinkRequest::new(0).group(g)).expect("shrink")
        });
        // Main: a gains an object and sets its bit in the unit being grown
        // past, then b is unregistered.
        a_objs.store(1, Ordering::SeqCst);
        ha.set_shrinker_bit(g, 0).expect("bit a");
        hb.unregister();

        let hc = t1.join().expect("t1");
        t2.join().expect("t2");
        // No bit was lost to the growth: a and c have objects.
        assert!(
            registry.shrinker_bit(g, 0, ha.id()).expect("a bit"),
            "a's bit lost"
        );
        assert!(
            registry.shrinker_bit(g, 0, hc.id()).expect("c bit"),
            "c's bit lost"
        );
        assert!(a_objs.load(Ordering::SeqCst) >= 1 && c_objs.load(Ordering::SeqCst) >= 1);
        assert_eq!(registry.len(), 2);
    });
}

#[test]
fn set_bit_races_with_empty_clear() {
    loom::model(|| {
        let registry = ShrinkerRegistry::default();
        let g = registry.create_group(None).expect("group");
        let objs = Arc::new(AtomicU64::new(0));
        let h = registry
            .register(memcg("a"), Cache(objs.clone()))
            .expect("a");
        h.set_shrinker_bit(g, 0).expect("bit");
        let id = h.id();

        // Thread: a new object arrives, then the bit is set (list_lru_add).
        let r = registry.clone();
        let o = objs.clone();
        let t = loom::thread::spawn(move || {
            o.fetch_add(2, Ordering::SeqCst);
            r.set_shrinker_bit(g, 0, id).expect("bit");
        });
        // Main: the shrink sees the cache empty and clears the bit.
        registry
            .shrink(&ShrinkRequest::new(12).group(g))
            .expect("shrink");
        t.join().expect("t");
        // The object must never be stranded behind a cleared bit.
        if objs.load(Ordering::SeqCst) > 0 {
            assert!(
                registry.shrinker_bit(g, 0, id).expect("bit"),
                "objects present but bit cleared"
            );
        }
    });
}

/// A flag written after an update; callbacks that did not see the update
/// touch state that the updater frees after `synchronize`.
struct Flagged {
    stop: Arc<AtomicBool>,
    state: Arc<Shared>,
}

struct Shared(UnsafeCell<u64>);

// SAFETY: every access goes through loom's tracked cell.
unsafe impl Sync for Shared {}

impl Shrinker for Flagged {
    fn count_objects(&self, _: &ShrinkControl) -> Count {
        if !self.stop.load(Ordering::SeqCst) {
            // SAFETY: loom checks this access against the updater's write.
            self.state.0.with(|p| unsafe { assert_eq!(*p, 0) });
        }
        Count::Objects(0)
    }
    fn scan_objects(&self, _: &mut ShrinkControl) -> Scan {
        Scan::Stop
    }
}

#[test]
fn synchronize_waits_for_shrinks_in_flight() {
    loom::model(|| {
        let registry = ShrinkerRegistry::default();
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Shared(UnsafeCell::new(0)));
        let _h = registry
            .register(
                ShrinkerConfig::new("f"),
                Flagged {
                    stop: stop.clone(),
                    state: state.clone(),
                },
            )
            .expect("register");
        let r = registry.clone();
        let t = loom::thread::spawn(move || r.shrink(&ShrinkRequest::new(0)).expect("shrink"));
        stop.store(true, Ordering::SeqCst);
        registry.synchronize();
        // Every callback that missed `stop` has returned: this write is safe.
        // SAFETY: loom checks this write against the callbacks' reads.
        state.0.with_mut(|p| unsafe { *p = 0 });
        t.join().expect("t");
    });
}
