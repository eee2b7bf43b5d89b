//! A proptest state machine: random sequences of calls against a naive model (a vector of
//! per-slot counts), on small devices in every configuration (order-aware or not, discard hook
//! or not, rotational or not, a partial last cluster). After every call the device must agree
//! with the model and pass `check_integrity`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use swap_alloc::{
    DeviceConfig, DeviceId, DiscardHook, SlotUsage, SwapDevice, SwapEntry, SwapError,
};
use swap_alloc_baseline::order_unaware;

const CS: usize = 16;

#[derive(Debug, Default)]
struct CountingDiscard(AtomicU64);

impl DiscardHook for CountingDiscard {
    fn discard(&self, _device: DeviceId, first: u64, nr: u64) {
        assert_eq!(first % CS as u64, 0);
        assert_eq!(nr, CS as u64);
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Slot {
    count: u16,
    cache: bool,
}

impl Slot {
    fn free(self) -> bool {
        self.count == 0 && !self.cache
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(u32, bool),
    Batch(u32, usize),
    Dup(usize),
    Put(usize),
    PutRaw(u64),
    PutRange(usize),
    Prepare(usize),
    Clear(usize),
    PutBatch(Vec<usize>),
    Discards,
    BadOrder(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..=4, any::<bool>()).prop_map(|(o, c)| Op::Alloc(o, c)),
        1 => (0u32..=2, 1usize..6).prop_map(|(o, n)| Op::Batch(o, n)),
        2 => any::<usize>().prop_map(Op::Dup),
        5 => any::<usize>().prop_map(Op::Put),
        1 => (0u64..110).prop_map(Op::PutRaw),
        2 => any::<usize>().prop_map(Op::PutRange),
        1 => any::<usize>().prop_map(Op::Prepare),
        1 => any::<usize>().prop_map(Op::Clear),
        1 => proptest::collection::vec(any::<usize>(), 1..6).prop_map(Op::PutBatch),
        1 => Just(Op::Discards),
        1 => (5u32..12).prop_map(Op::BadOrder),
    ]
}

struct Model {
    slots: Vec<Slot>,
    /// Live allocations: (first offset, order).
    allocs: Vec<(u64, u32)>,
}

impl Model {
    fn run_free(&self, off: u64, order: u32) -> bool {
        let nr = 1usize << order;
        let o = off as usize;
        o + nr <= self.slots.len() && self.slots[o..o + nr].iter().all(|s| s.free())
    }

    fn any_free_cluster(&self) -> bool {
        self.slots
            .chunks(CS)
            .any(|c| c.len() == CS && c.iter().all(|s| s.free()))
    }

    fn pick(&self, sel: usize) -> Option<(u64, u32)> {
        (!self.allocs.is_empty()).then(|| self.allocs[sel % self.allocs.len()])
    }

    /// A slot of a live allocation, or any slot if there is none.
    fn pick_slot(&self, sel: usize) -> u64 {
        match self.pick(sel) {
            Some((off, order)) => off + (sel as u64 >> 8) % (1 << order),
            None => (sel % self.slots.len()) as u64,
        }
    }

    fn record_alloc(
        &mut self,
        e: SwapEntry,
        order: u32,
        cached: bool,
    ) -> Result<(), TestCaseError> {
        let nr = 1u64 << order;
        let off = e.offset();
        prop_assert_eq!(
            off % nr,
            0,
            "allocation of order {} misaligned: {}",
            order,
            e
        );
        prop_assert_eq!(
            off / CS as u64,
            (off + nr - 1) / CS as u64,
            "crosses a cluster"
        );
        prop_assert!(self.run_free(off, order), "slots of {} handed out twice", e);
        for s in &mut self.slots[off as usize..(off + nr) as usize] {
            *s = if cached {
                Slot {
                    count: 0,
                    cache: true,
                }
            } else {
                Slot {
                    count: 1,
                    cache: false,
                }
            };
        }
        self.allocs.push((off, order));
        Ok(())
    }

    /// Forgets allocations whose slots are all free.
    fn prune(&mut self) {
        let slots = &self.slots;
        self.allocs.retain(|&(off, order)| {
            !slots[off as usize..off as usize + (1 << order)]
                .iter()
                .all(|s| s.free())
        });
    }

    fn expect_put(&self, off: u64) -> Result<bool, SwapError> {
        let e = SwapEntry::new(DeviceId::default(), off).unwrap();
        match self.slots.get(off as usize) {
            None => Err(SwapError::OutOfRange {
                entry: e,
                nslots: self.slots.len() as u64,
            }),
            Some(s) if s.free() => Err(SwapError::SlotFree { entry: e }),
            Some(s) if s.count == 0 => Err(SwapError::NoReference { entry: e }),
            Some(s) => Ok(s.count == 1 && !s.cache),
        }
    }

    fn apply_put(&mut self, off: u64) {
        self.slots[off as usize].count -= 1;
    }
}

fn entry(off: u64) -> SwapEntry {
    SwapEntry::new(DeviceId::default(), off).unwrap()
}

fn run(config_sel: u8, nslots: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let hook = Arc::new(CountingDiscard::default());
    let mut cfg = DeviceConfig::new(nslots).cluster_slots(CS).nr_cpus(2);
    if config_sel & 1 != 0 {
        cfg = cfg.discard(hook.clone());
    }
    if config_sel & 2 != 0 {
        cfg = cfg.rotational(true);
    }
    if config_sel & 8 != 0 {
        // Refill partly used clusters first; a cluster qualifies once 1 or 5 slots are free.
        cfg = cfg.nonfull_first(if config_sel & 16 != 0 { 5 } else { 1 });
    }
    let dev = if config_sel & 4 != 0 {
        order_unaware(cfg).unwrap()
    } else {
        SwapDevice::new(cfg).unwrap()
    };
    let mut m = Model {
        slots: vec![Slot::default(); nslots as usize],
        allocs: Vec::new(),
    };
    for (step, op) in ops.into_iter().enumerate() {
        // Alternate the CPU hint so that two per-CPU current clusters are in play.
        swap_alloc::set_cpu_hint(Some(step % 3 / 2));
        match op {
            Op::Alloc(order, cached) => {
                let usage = if cached {
                    SlotUsage::Cached
                } else {
                    SlotUsage::Referenced
                };
                let had_room = m.slots.iter().any(|s| s.free());
                let had_cluster = m.any_free_cluster();
                match dev.alloc_with(order, usage) {
                    Ok(e) => m.record_alloc(e, order, cached)?,
                    Err(SwapError::NoSpace { order: o }) => {
                        prop_assert_eq!(o, order);
                        prop_assert!(!(order == 0 && had_room), "order 0 failed with free slots");
                        prop_assert!(!had_cluster, "order {} failed with a free cluster", order);
                    }
                    Err(e) => prop_assert!(false, "unexpected {:?}", e),
                }
            }
            Op::Batch(order, n) => {
                let mut out = Vec::new();
                let got = dev
                    .alloc_batch(order, n, SlotUsage::Referenced, &mut out)
                    .unwrap();
                prop_assert_eq!(got, out.len());
                for e in out {
                    m.record_alloc(e, order, false)?;
                }
            }
            Op::Dup(sel) => {
                let off = m.pick_slot(sel);
                let s = m.slots[off as usize];
                let r = dev.dup(entry(off));
                if s.free() {
                    prop_assert_eq!(r, Err(SwapError::SlotFree { entry: entry(off) }));
                } else {
                    prop_assert_eq!(r, Ok(s.count + 1));
                    m.slots[off as usize].count += 1;
                }
            }
            Op::Put(sel) => {
                let off = m.pick_slot(sel);
                let want = m.expect_put(off);
                prop_assert_eq!(dev.put(entry(off)), want.clone());
                if want.is_ok() {
                    m.apply_put(off);
                }
            }
            Op::PutRaw(off) => {
                let want = m.expect_put(off);
                prop_assert_eq!(dev.put(entry(off)), want.clone());
                if want.is_ok() {
                    m.apply_put(off);
                }
            }
            Op::PutRange(sel) => {
                if let Some((off, order)) = m.pick(sel) {
                    let nr = 1usize << order;
                    let range = &m.slots[off as usize..off as usize + nr];
                    let bad = range.iter().position(|s| s.count == 0);
                    let r = dev.put_range(entry(off), order);
                    match bad {
                        Some(i) => {
                            prop_assert!(r.is_err(), "put_range over slot {} with no reference", i);
                        }
                        None => {
                            let freed = range.iter().filter(|s| s.count == 1 && !s.cache).count();
                            prop_assert_eq!(r, Ok(freed));
                            for s in &mut m.slots[off as usize..off as usize + nr] {
                                s.count -= 1;
                            }
                        }
                    }
                }
            }
            Op::Prepare(sel) => {
                let off = m.pick_slot(sel);
                let s = m.slots[off as usize];
                let r = dev.swapcache_prepare(entry(off));
                if s.free() {
                    prop_assert_eq!(r, Err(SwapError::SlotFree { entry: entry(off) }));
                } else if s.cache {
                    prop_assert_eq!(r, Err(SwapError::CacheExists { entry: entry(off) }));
                } else {
                    prop_assert_eq!(r, Ok(()));
                    m.slots[off as usize].cache = true;
                }
            }
            Op::Clear(sel) => {
                let off = m.pick_slot(sel);
                let s = m.slots[off as usize];
                let r = dev.swapcache_clear(entry(off));
                if s.free() {
                    prop_assert_eq!(r, Err(SwapError::SlotFree { entry: entry(off) }));
                } else if !s.cache {
                    prop_assert_eq!(r, Err(SwapError::NotCached { entry: entry(off) }));
                } else {
                    prop_assert_eq!(r, Ok(s.count == 0));
                    m.slots[off as usize].cache = false;
                }
            }
            Op::PutBatch(sels) => {
                let offs: Vec<u64> = sels.iter().map(|&s| m.pick_slot(s)).collect();
                let entries: Vec<SwapEntry> = offs.iter().map(|&o| entry(o)).collect();
                let r = dev.put_batch(&entries);
                let mut freed = 0;
                let mut want = Ok(0);
                for (i, &off) in offs.iter().enumerate() {
                    match m.expect_put(off) {
                        Ok(f) => {
                            m.apply_put(off);
                            freed += usize::from(f);
                            want = Ok(freed);
                        }
                        Err(e) => {
                            want = Err(SwapError::InBatch {
                                index: i,
                                source: Box::new(e),
                            });
                            break;
                        }
                    }
                }
                prop_assert_eq!(r, want);
            }
            Op::Discards => {
                dev.run_discards();
            }
            Op::BadOrder(order) => {
                let max = dev.max_order();
                prop_assert_eq!(
                    dev.alloc(order),
                    Err(SwapError::OrderTooLarge { order, max })
                );
            }
        }
        m.prune();
        if let Err(e) = dev.check_integrity() {
            prop_assert!(false, "step {}: {}", step, e);
        }
        for (off, s) in m.slots.iter().enumerate() {
            let d = dev.slot(entry(off as u64)).unwrap();
            prop_assert_eq!((d.count, d.has_cache), (s.count, s.cache), "slot {}", off);
        }
        let in_use = m.slots.iter().filter(|s| !s.free()).count() as u64;
        prop_assert_eq!(dev.in_use(), in_use);
        prop_assert_eq!(dev.stats().in_use, in_use);
    }
    swap_alloc::set_cpu_hint(None);
    Ok(())
}

proptest! {
    // Under miri: a few cases (each runs ~1000 times slower), and no regression file (miri's
    // isolation refuses file access).
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 256 },
        failure_persistence: if cfg!(miri) { None } else { ProptestConfig::default().failure_persistence },
        ..ProptestConfig::default()
    })]

    #[test]
    fn device_agrees_with_model(
        config_sel in 0u8..32,
        nslots in prop_oneof![Just(64u64), Just(96), 70u64..100],
        ops in proptest::collection::vec(op(), 1..if cfg!(miri) { 24 } else { 160 }),
    ) {
        run(config_sel, nslots, ops)?;
    }
}
