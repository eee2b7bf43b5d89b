//! Proptest state machine: `Mglru` against a naive model (a `BTreeMap` of resident pages).
//! After every step: the same pages resident, none lost or held twice, counts consistent
//! (`check_integrity`), victims distinct and previously resident, evicted pages refaultable.
//! A twin LRU takes the same steps except `shrink_to_fit`: compaction must change nothing
//! (the same victims, generations and tiers).

use std::collections::{BTreeMap, BTreeSet};

use mglru::{
    AccessBits, Arrival, Config, Error, FaultPlacement, Hint, Mglru, PageId, PageType, MAX_PAGE_ID,
    MIN_NR_GENS,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Add(PageId, PageType, Arrival),
    Touch(PageId),
    Fd(PageId),
    Remove(PageId),
    Evict(usize),
    Age,
    /// `shrink_to_fit`, on one of the two LRUs only.
    Shrink,
}

fn op() -> impl Strategy<Value = Op> {
    // Pages from a few regions (region_shift is 4 below) so walks, filters and look-around
    // all see dense and sparse regions; and the last ids a node holds, next to the first ones
    // it cannot (rejected, nothing changes).
    let page = prop_oneof![
        8 => 0u64..48,
        2 => 1000u64..1010,
        1 => 5000u64..5004,
        2 => MAX_PAGE_ID - 20..=MAX_PAGE_ID + 3,
    ];
    let ty = prop_oneof![Just(PageType::Anon), Just(PageType::File)];
    let arrival = prop_oneof![
        Just(Arrival::Fault),
        Just(Arrival::Sequential),
        Just(Arrival::Active),
        Just(Arrival::Cold)
    ];
    prop_oneof![
        4 => (page.clone(), ty, arrival).prop_map(|(p, t, a)| Op::Add(p, t, a)),
        3 => page.clone().prop_map(Op::Touch),
        2 => page.clone().prop_map(Op::Fd),
        1 => page.prop_map(Op::Remove),
        2 => (0usize..12).prop_map(Op::Evict),
        1 => Just(Op::Age),
        1 => Just(Op::Shrink),
    ]
}

fn config() -> impl Strategy<Value = Config> {
    (
        3usize..=4,
        prop_oneof![Just(0u32), Just(1), Just(60), Just(100), Just(200)],
        prop_oneof![
            Just(FaultPlacement::Youngest),
            Just(FaultPlacement::SecondOldest),
            Just(FaultPlacement::Oldest)
        ],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0u64..=2,
        any::<bool>(),
        0u32..=4,
        (
            any::<bool>(),
            prop_oneof![Just(0u32), Just(1), Just(5), Just(8)],
            any::<bool>(),
            prop_oneof![Just(0u32), Just(1), Just(4), Just(8)],
            prop_oneof![Just(0u32), Just(1), Just(3), Just(8)],
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                gens,
                swappiness,
                fault_placement,
                bloom,
                look,
                look_twice,
                window,
                young_bound,
                eviction_aging,
                (
                    demotion_feedback,
                    loop_eviction,
                    idle_youngest_demotion,
                    loop_order,
                    loop_window,
                    refault_activation,
                ),
            )| {
                Config {
                    max_nr_gens: gens,
                    swappiness,
                    fault_placement,
                    region_shift: 4,
                    bloom_filter: bloom,
                    look_around: look,
                    max_shadows: 1 << 16,
                    look_twice,
                    refault_window: window,
                    young_bound_aging: young_bound,
                    eviction_aging,
                    demotion_feedback,
                    loop_eviction,
                    idle_youngest_demotion,
                    loop_order,
                    loop_window,
                    refault_activation,
                }
            },
        )
}

proptest! {
    // Under miri: a few cases (each runs ~1000 times slower), and no regression file (miri's
    // isolation refuses file access).
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 192 },
        failure_persistence: if cfg!(miri) { None } else { ProptestConfig::default().failure_persistence },
        ..ProptestConfig::default()
    })]

    #[test]
    fn mglru_matches_model(cfg in config(), ops in proptest::collection::vec(op(), 1..if cfg!(miri) { 24 } else { 160 })) {
        let mut lru = Mglru::new(cfg.clone()).unwrap();
        let mut bits = AccessBits::new();
        let mut twin = Mglru::new(cfg.clone()).unwrap();
        let mut twin_bits = AccessBits::new();
        let mut model: BTreeMap<PageId, PageType> = BTreeMap::new();
        let mut evicted_ever: BTreeSet<PageId> = BTreeSet::new();
        for op in ops {
            match op {
                #[allow(clippy::map_entry)] // the model is checked against the LRU in between
                Op::Add(p, ty, arrival) => {
                    let activated_before = lru.stats().refault_activated;
                    let r = lru.add(p, Hint::new(ty, arrival));
                    prop_assert_eq!(&twin.add(p, Hint::new(ty, arrival)), &r);
                    if p > MAX_PAGE_ID {
                        prop_assert_eq!(r, Err(Error::PageIdTooLarge { page: p, max: MAX_PAGE_ID }));
                    } else if model.contains_key(&p) {
                        prop_assert!(r.is_err());
                    } else {
                        let refault = r.unwrap();
                        prop_assert_eq!(refault.is_some(), evicted_ever.remove(&p));
                        model.insert(p, ty);
                        let seq = lru.generation(p).unwrap();
                        // Refault activation: only a refault, only with the option, and it
                        // goes to the youngest generation whatever its arrival.
                        let activated = lru.stats().refault_activated - activated_before;
                        prop_assert!(activated <= 1);
                        if activated == 1 {
                            prop_assert!(cfg.refault_activation && refault.is_some());
                            prop_assert_eq!(seq, lru.max_seq());
                        } else {
                        match arrival {
                            Arrival::Active => prop_assert_eq!(seq, lru.max_seq()),
                            Arrival::Sequential | Arrival::Cold => prop_assert_eq!(seq, lru.min_seq(ty)),
                            Arrival::Fault => match cfg.fault_placement {
                                FaultPlacement::Youngest => prop_assert_eq!(seq, lru.max_seq()),
                                FaultPlacement::SecondOldest => prop_assert_eq!(seq, lru.min_seq(ty) + 1),
                                FaultPlacement::Oldest => prop_assert_eq!(seq, lru.min_seq(ty)),
                            },
                        }
                        }
                        prop_assert_eq!(lru.is_active(p), Some(seq + 1 >= lru.max_seq()));
                    }
                }
                Op::Touch(p) => {
                    if model.contains_key(&p) {
                        bits.set(p);
                        twin_bits.set(p);
                    }
                }
                Op::Fd(p) => {
                    let before = lru.tier(p);
                    prop_assert_eq!(lru.mark_accessed(p), model.contains_key(&p));
                    twin.mark_accessed(p);
                    if let (Some(b), Some(a)) = (before, lru.tier(p)) {
                        prop_assert!(a >= b, "a descriptor access never lowers the tier");
                    }
                }
                Op::Remove(p) => {
                    prop_assert_eq!(lru.remove(p), model.remove(&p).is_some());
                    twin.remove(p);
                    bits.clear(p);
                    twin_bits.clear(p);
                    prop_assert!(lru.refault(p).is_none() || evicted_ever.contains(&p));
                }
                Op::Evict(n) => {
                    let evictable = model
                        .values()
                        .filter(|&&t| cfg.swappiness != 0 || t == PageType::File)
                        .count();
                    let victims = lru.evict(n, &mut bits);
                    prop_assert_eq!(&twin.evict(n, &mut twin_bits), &victims);
                    prop_assert_eq!(victims.len(), n.min(evictable));
                    let distinct: BTreeSet<_> = victims.iter().copied().collect();
                    prop_assert_eq!(distinct.len(), victims.len(), "a victim twice");
                    for v in victims {
                        let ty = model.remove(&v);
                        prop_assert!(ty.is_some(), "victim {} was not resident", v);
                        if cfg.swappiness == 0 {
                            prop_assert_eq!(ty, Some(PageType::File));
                        }
                        bits.clear(v);
                        twin_bits.clear(v);
                        prop_assert!(lru.refault(v).is_some(), "no shadow for {}", v);
                        evicted_ever.insert(v);
                    }
                }
                Op::Age => {
                    let before = lru.max_seq();
                    lru.age(&mut bits);
                    twin.age(&mut twin_bits);
                    prop_assert_eq!(lru.max_seq(), before + 1);
                }
                Op::Shrink => {
                    let bytes = lru.metadata_bytes();
                    lru.shrink_to_fit();
                    prop_assert!(lru.metadata_bytes() <= bytes);
                }
            }
            if let Err(e) = lru.check_integrity() {
                prop_assert!(false, "integrity: {}", e);
            }
            prop_assert_eq!(lru.len(), model.len());
            for (&p, &ty) in &model {
                prop_assert!(lru.contains(p));
                prop_assert_eq!(lru.generation(p), twin.generation(p));
                prop_assert_eq!(lru.tier(p), twin.tier(p));
                let seq = lru.generation(p).unwrap();
                prop_assert!(seq >= lru.min_seq(ty) && seq <= lru.max_seq());
            }
            for ty in PageType::ALL {
                let gens = lru.max_seq() + 1 - lru.min_seq(ty);
                prop_assert!(gens >= MIN_NR_GENS as u64 && gens <= cfg.max_nr_gens as u64);
                let total: u64 = (lru.min_seq(ty)..=lru.max_seq()).map(|s| lru.nr_pages(s, ty)).sum();
                prop_assert_eq!(total as usize, model.values().filter(|&&t| t == ty).count());
            }
        }
    }
}
