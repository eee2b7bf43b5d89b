//! Proptest state machine: the registry against a naive model of registered
//! shrinkers, their objects per group, group bitmaps and deferred work.
//!
//! The model recomputes the kernel's `do_shrink_slab` formula by hand, walks
//! in id order, and allocates ids lowest-free, so every observable value
//! (freed counts, objects left, bits, `nr_deferred`, ids) must match exactly.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use shrinker::{
    Count, GroupId, Scan, ShrinkControl, ShrinkRequest, Shrinker, ShrinkerConfig, ShrinkerError,
    ShrinkerHandle, ShrinkerRegistry,
};

/// Objects per group key (`None`: root). Shared between the real shrinker and
/// the test so that the test can add objects.
type Objects = Arc<Mutex<BTreeMap<Option<u32>, u64>>>;

struct Cache(Objects);

impl Shrinker for Cache {
    fn count_objects(&self, sc: &ShrinkControl) -> Count {
        match self
            .0
            .lock()
            .unwrap()
            .get(&sc.group.map(|g| g.index()))
            .copied()
            .unwrap_or(0)
        {
            0 => Count::Empty,
            n => Count::Objects(n),
        }
    }
    fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan {
        let mut m = self.0.lock().unwrap();
        let o = m.entry(sc.group.map(|g| g.index())).or_insert(0);
        let n = (*o).min(sc.nr_to_scan);
        *o -= n;
        Scan::Freed(n)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Register {
        memcg: bool,
        seeks: u32,
        batch: u64,
    },
    Unregister(usize),
    AddObjects {
        shrinker: usize,
        group: Option<usize>,
        n: u64,
    },
    CreateGroup {
        parent: Option<usize>,
    },
    Offline(usize),
    Shrink {
        priority: u32,
        group: Option<usize>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (any::<bool>(), 0u32..4, prop_oneof![Just(0u64), 1u64..300]).prop_map(|(memcg, seeks, batch)| Op::Register { memcg, seeks, batch }),
        1 => (0usize..16).prop_map(Op::Unregister),
        4 => (0usize..16, proptest::option::of(0usize..8), 0u64..5000).prop_map(|(shrinker, group, n)| Op::AddObjects { shrinker, group, n }),
        1 => proptest::option::of(0usize..8).prop_map(|parent| Op::CreateGroup { parent }),
        1 => (0usize..8).prop_map(Op::Offline),
        4 => (0u32..=12, proptest::option::of(0usize..8)).prop_map(|(priority, group)| Op::Shrink { priority, group }),
    ]
}

struct ModelShrinker {
    id: u32,
    /// The model's own copy of the objects.
    model: Objects,
    memcg: bool,
    seeks: u32,
    batch: u64,
    objects: Objects,
    root_deferred: i64,
    handle: ShrinkerHandle,
}

struct ModelGroup {
    gid: GroupId,
    parent: Option<u32>,
    /// By shrinker id.
    bits: BTreeMap<u32, bool>,
    deferred: BTreeMap<u32, i64>,
}

/// The kernel formula, written out independently of the crate.
fn model_shrink(
    objects: &Objects,
    key: Option<u32>,
    seeks: u32,
    batch: u64,
    priority: u32,
    deferred: &mut i64,
) -> Option<u64> {
    let freeable = objects.lock().unwrap().get(&key).copied().unwrap_or(0) as i64;
    if freeable == 0 {
        return None;
    }
    let nr = std::mem::take(deferred).clamp(0, 2 * freeable);
    let delta = if seeks > 0 {
        (freeable >> priority) * 4 / seeks as i64
    } else {
        freeable / 2
    };
    let mut total = ((nr >> priority) + delta).min(2 * freeable);
    let batch = if batch == 0 { 128 } else { batch as i64 };
    let (mut scanned, mut freed) = (0i64, 0u64);
    while total >= batch || total >= freeable {
        let n = batch.min(total);
        let mut m = objects.lock().unwrap();
        let o = m.entry(key).or_insert(0);
        let f = (*o).min(n as u64);
        *o -= f;
        freed += f;
        total -= n;
        scanned += n;
    }
    *deferred = (nr + delta - scanned).clamp(0, 2 * freeable);
    Some(freed)
}

fn lowest_free(used: impl Iterator<Item = u32>) -> u32 {
    let used: Vec<u32> = used.collect();
    (0..).find(|i| !used.contains(i)).unwrap()
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let reg = ShrinkerRegistry::default();
    let mut shrinkers: Vec<ModelShrinker> = Vec::new();
    let mut groups: BTreeMap<u32, ModelGroup> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Register {
                memcg,
                seeks,
                batch,
            } => {
                let objects: Objects = Arc::default();
                let cfg = ShrinkerConfig::new("m")
                    .memcg_aware(memcg)
                    .seeks(seeks)
                    .batch(batch);
                let handle = reg.register(cfg, Cache(objects.clone())).unwrap();
                let expect = lowest_free(shrinkers.iter().map(|s| s.id));
                prop_assert_eq!(handle.id().index(), expect);
                for g in groups.values_mut() {
                    g.bits.remove(&expect);
                    g.deferred.remove(&expect);
                }
                shrinkers.push(ModelShrinker {
                    id: expect,
                    model: Arc::default(),
                    memcg,
                    seeks,
                    batch,
                    objects,
                    root_deferred: 0,
                    handle,
                });
                shrinkers.sort_by_key(|s| s.id);
            }
            Op::Unregister(i) => {
                if shrinkers.is_empty() {
                    continue;
                }
                let s = shrinkers.remove(i % shrinkers.len());
                let report = s.handle.unregister();
                prop_assert_eq!(report.in_flight, 0);
                for g in groups.values_mut() {
                    g.bits.remove(&s.id);
                    g.deferred.remove(&s.id);
                }
            }
            Op::AddObjects { shrinker, group, n } => {
                if shrinkers.is_empty() {
                    continue;
                }
                let s = &shrinkers[shrinker % shrinkers.len()];
                let gid = group.and_then(|g| groups.keys().nth(g % groups.len().max(1)).copied());
                *s.objects.lock().unwrap().entry(gid).or_insert(0) += n;
                *s.model.lock().unwrap().entry(gid).or_insert(0) += n;
                if let Some(g) = gid {
                    let res = reg.set_shrinker_bit(groups[&g].gid, 0, s.handle.id());
                    if s.memcg {
                        prop_assert_eq!(res, Ok(()));
                        groups.get_mut(&g).unwrap().bits.insert(s.id, true);
                    } else {
                        prop_assert_eq!(res, Err(ShrinkerError::NotMemcgAware(s.handle.id())));
                    }
                }
            }
            Op::CreateGroup { parent } => {
                let parent =
                    parent.and_then(|p| groups.keys().nth(p % groups.len().max(1)).copied());
                let g = reg.create_group(parent.map(|p| groups[&p].gid)).unwrap();
                prop_assert_eq!(g.index(), lowest_free(groups.keys().copied()));
                groups.insert(
                    g.index(),
                    ModelGroup {
                        gid: g,
                        parent,
                        bits: BTreeMap::new(),
                        deferred: BTreeMap::new(),
                    },
                );
            }
            Op::Offline(i) => {
                let Some(&g) = groups.keys().nth(i % groups.len().max(1)) else {
                    continue;
                };
                let res = reg.offline_group(groups[&g].gid);
                if groups.values().any(|c| c.parent == Some(g)) {
                    let has_children = matches!(res, Err(ShrinkerError::GroupHasChildren { .. }));
                    prop_assert!(has_children, "offline with children: {:?}", res);
                    continue;
                }
                prop_assert_eq!(res, Ok(()));
                let mg = groups.remove(&g).unwrap();
                for (id, v) in mg.deferred {
                    if v <= 0 {
                        continue;
                    }
                    match mg.parent {
                        Some(p) => {
                            *groups.get_mut(&p).unwrap().deferred.entry(id).or_insert(0) += v
                        }
                        None => {
                            if let Some(s) = shrinkers.iter_mut().find(|s| s.id == id) {
                                s.root_deferred += v;
                            }
                        }
                    }
                }
            }
            Op::Shrink { priority, group } => {
                let gid = group.and_then(|g| groups.keys().nth(g % groups.len().max(1)).copied());
                let mut expect = 0u64;
                match gid {
                    None => {
                        for s in shrinkers.iter_mut() {
                            let (seeks, batch) = (s.seeks, s.batch);
                            expect += model_shrink(
                                &s.model,
                                None,
                                seeks,
                                batch,
                                priority,
                                &mut s.root_deferred,
                            )
                            .unwrap_or(0);
                        }
                    }
                    Some(g) => {
                        let mg = groups.get_mut(&g).unwrap();
                        for s in shrinkers.iter().filter(|s| s.memcg) {
                            if !mg.bits.get(&s.id).copied().unwrap_or(false) {
                                continue;
                            }
                            let d = mg.deferred.entry(s.id).or_insert(0);
                            match model_shrink(&s.model, Some(g), s.seeks, s.batch, priority, d) {
                                Some(f) => expect += f,
                                None => {
                                    mg.bits.insert(s.id, false);
                                }
                            }
                        }
                    }
                }
                let req = match gid {
                    None => ShrinkRequest::new(priority),
                    Some(g) => ShrinkRequest::new(priority).group(groups[&g].gid),
                };
                prop_assert_eq!(reg.shrink(&req), Ok(expect));
            }
        }
        check(&reg, &shrinkers, &groups)?;
    }
    Ok(())
}

/// Every observable value of the registry equals the model's.
fn check(
    reg: &ShrinkerRegistry,
    shrinkers: &[ModelShrinker],
    groups: &BTreeMap<u32, ModelGroup>,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(reg.len(), shrinkers.len());
    for s in shrinkers {
        prop_assert_eq!(
            &*s.objects.lock().unwrap(),
            &*s.model.lock().unwrap(),
            "objects of shrinker {}",
            s.id
        );
        prop_assert_eq!(
            reg.nr_deferred(s.handle.id(), None, 0),
            Ok(s.root_deferred),
            "root deferred of {}",
            s.id
        );
        for g in groups.values() {
            let bit = reg.shrinker_bit(g.gid, 0, s.handle.id()).unwrap();
            prop_assert_eq!(
                bit,
                g.bits.get(&s.id).copied().unwrap_or(false),
                "bit of {} in {}",
                s.id,
                g.gid
            );
            let d = reg.nr_deferred(s.handle.id(), Some(g.gid), 0).unwrap();
            prop_assert_eq!(
                d,
                g.deferred.get(&s.id).copied().unwrap_or(0),
                "deferred of {} in {}",
                s.id,
                g.gid
            );
        }
    }
    Ok(())
}

proptest! {
    // Under miri: a few cases (each runs ~1000 times slower), and no regression file (miri's
    // isolation refuses file access).
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 128 },
        failure_persistence: if cfg!(miri) { None } else { ProptestConfig::default().failure_persistence },
        ..ProptestConfig::default()
    })]

    #[test]
    fn registry_matches_model(ops in proptest::collection::vec(op(), 1..if cfg!(miri) { 16 } else { 60 })) {
        run(ops)?;
    }
}
