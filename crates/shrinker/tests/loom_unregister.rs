//! Loom model: a shrink walk concurrent with unregistration.
//!
//! Claims checked: after `unregister` returns (in fact, once it drops the
//! callback object, which it does before returning) no callback runs; the walk
//! never touches a shrinker's memory after its grace period (the sync shim's
//! epoch model marks retired objects dead and checks every access).
//!
//! Every callback reads a loom-tracked cell that the callback object's `Drop`
//! writes: a callback concurrent with or after the drop fails the model.
#![cfg(shrinker_loom)]

use std::sync::Arc;

use loom::cell::UnsafeCell;
use shrinker::{
    Count, Scan, ShrinkControl, ShrinkRequest, Shrinker, ShrinkerConfig, ShrinkerRegistry,
};

/// A flag the callback object clears when dropped.
struct Alive(UnsafeCell<bool>);

// SAFETY: accesses go through loom's tracked cell, which reports any
// unsynchronised pair as a failure of the model.
unsafe impl Sync for Alive {}

struct Probe {
    alive: Arc<Alive>,
    objects: u64,
}

impl Probe {
    fn check(&self) {
        self.alive.0.with(|p| {
            // SAFETY: `p` points into the live `Alive` (kept by an `Arc`);
            // loom checks this read against the write in `drop`.
            let alive = unsafe { *p };
            assert!(alive, "callback ran after its shrinker was unregistered");
        });
    }
}

impl Shrinker for Probe {
    fn count_objects(&self, _: &ShrinkControl) -> Count {
        self.check();
        Count::Objects(self.objects)
    }
    fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
        self.check();
        Scan::Freed(sc.nr_to_scan)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.alive.0.with_mut(|p| {
            // SAFETY: loom checks this write against every callback's read.
            unsafe { *p = false };
        });
    }
}

fn probe(objects: u64) -> (Probe, Arc<Alive>) {
    let alive = Arc::new(Alive(UnsafeCell::new(true)));
    (
        Probe {
            alive: Arc::clone(&alive),
            objects,
        },
        alive,
    )
}

#[test]
fn shrink_concurrent_with_unregister() {
    loom::model(|| {
        let registry = ShrinkerRegistry::default();
        let (a, a_alive) = probe(1);
        let (b, _b_alive) = probe(1);
        let ha = registry
            .register(ShrinkerConfig::new("a"), a)
            .expect("register a");
        let _hb = registry
            .register(ShrinkerConfig::new("b"), b)
            .expect("register b");

        let r = registry.clone();
        let t = loom::thread::spawn(move || r.shrink(&ShrinkRequest::new(0)).expect("shrink"));

        let report = ha.unregister();
        assert!(
            report.in_flight <= 1,
            "only the one walker can hold a reference"
        );
        // After unregister returns, the callback object is gone.
        assert_eq!(Arc::strong_count(&a_alive), 1);

        let freed = t.join().expect("shrinker thread");
        // b always runs (1 object at priority 0 scans 2); a ran or not.
        assert!(freed == 2 || freed == 4, "freed {freed}");
    });
}

#[test]
fn two_shrinks_and_drop_of_handle() {
    loom::model(|| {
        let registry = ShrinkerRegistry::default();
        let (a, _alive) = probe(1);
        let ha = registry
            .register(ShrinkerConfig::new("a"), a)
            .expect("register a");

        let r = registry.clone();
        let t = loom::thread::spawn(move || r.shrink(&ShrinkRequest::new(0)).expect("shrink"));
        let r2 = registry.clone();
        let t2 = loom::thread::spawn(move || r2.shrink(&ShrinkRequest::new(0)).expect("shrink"));

        drop(ha);
        let f1 = t.join().expect("t1");
        let f2 = t2.join().expect("t2");
        assert!(f1 <= 2 && f2 <= 2);
        assert!(registry.is_empty());
    });
}

/// Unregistering the shrinker the walk reaches second: the walk may see it
/// live, dying (reference refused) or gone from the table.
#[test]
fn unregister_the_second_shrinker_of_a_walk() {
    loom::model(|| {
        let registry = ShrinkerRegistry::default();
        let (a, _a_alive) = probe(1);
        let (b, b_alive) = probe(1);
        let _ha = registry
            .register(ShrinkerConfig::new("a"), a)
            .expect("register a");
        let hb = registry
            .register(ShrinkerConfig::new("b"), b)
            .expect("register b");

        let r = registry.clone();
        let t = loom::thread::spawn(move || r.shrink(&ShrinkRequest::new(0)).expect("shrink"));

        let report = hb.unregister();
        assert!(report.in_flight <= 1);
        assert_eq!(Arc::strong_count(&b_alive), 1);
        let freed = t.join().expect("shrinker thread");
        assert!(freed == 2 || freed == 4, "freed {freed}");
    });
}
