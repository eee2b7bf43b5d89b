//! Instruments a moved hot set (`workload::moving_hot_set`: Zipf over set A, then over a
//! disjoint set B, then A again): per window of requests, the misses of MGLRU, LRU and the
//! active/inactive lists, split into first touches (the same for every policy) and re-misses;
//! for MGLRU the pages of the stale set still resident and the generation sizes split by set,
//! the walks and the activations.
//!
//! ```text
//! cargo run --release -p mglru --example moved -- [--set N] [--alpha A] [--cap-frac F] \
//!     [--phase-len N] [--window N] [--seed N] [VARIANT]
//! ```
//!
//! The report's `moved_zA_Nk` traces use seed `11`, `12`, `13` (alpha 0.9, 1.0, 1.1) plus the
//! set size (`--seed 5012` for `moved_z1.0_5k`). VARIANT is `default` (the default), `v61`,
//! `eN` (the default with `eviction_aging` N) or a comma-separated list of `knob=value`
//! changes to the default (`look_twice=0,eviction_aging=16`).

use std::collections::HashSet;

use mglru::replay::workload::{self, SECOND_SET_BASE};
use mglru::{
    AccessBits, AccessKind, ActiveInactive, Config, Hint, Lru, Mglru, PageId, PageType, Policy,
};

struct Counts {
    misses: u64,
    first: u64,
}

fn step(
    p: &mut dyn Policy,
    bits: &mut AccessBits,
    cap: usize,
    page: PageId,
    resident: &mut HashSet<PageId>,
) -> bool {
    if p.contains(page) {
        bits.set(page);
        p.access(page, AccessKind::Mapped);
        return false;
    }
    if p.len() >= cap {
        for v in p.evict(p.len() + 1 - cap, bits) {
            bits.clear(v);
            resident.remove(&v);
        }
    }
    p.add(page, Hint::fault(PageType::Anon)).expect("add");
    resident.insert(page);
    bits.set(page);
    true
}

fn main() {
    let mut set = 20_000usize;
    let mut alpha = 1.0f64;
    let mut frac = 0.4f64;
    let mut phase_len = 0usize;
    let mut window = 0usize;
    let mut seed = 7u64;
    let mut variant = "default".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().expect("a value");
        match a.as_str() {
            "--set" => set = val().parse().expect("set"),
            "--alpha" => alpha = val().parse().expect("alpha"),
            "--cap-frac" => frac = val().parse().expect("frac"),
            "--phase-len" => phase_len = val().parse().expect("phase len"),
            "--window" => window = val().parse().expect("window"),
            "--seed" => seed = val().parse().expect("seed"),
            v => variant = v.to_string(),
        }
    }
    if phase_len == 0 {
        phase_len = 5 * set;
    }
    if window == 0 {
        window = set / 2;
    }
    let cfg = match variant.as_str() {
        "v61" => Config::v6_1(),
        e if e.starts_with('e') => Config {
            eviction_aging: e[1..].parse().expect("eN"),
            ..Config::default()
        },
        spec => {
            let mut c = Config::default();
            for part in spec.split(',').filter(|p| !p.is_empty() && *p != "default") {
                let (k, v) = part.split_once('=').expect("knob=value");
                let n: u64 = v.parse().expect("a number");
                match k {
                    "eviction_aging" => c.eviction_aging = n as u32,
                    "look_twice" => c.look_twice = n != 0,
                    "demotion_feedback" => c.demotion_feedback = n != 0,
                    "loop_eviction" => c.loop_eviction = n as u32,
                    "idle_youngest_demotion" => c.idle_youngest_demotion = n != 0,
                    "look_around" => c.look_around = n != 0,
                    "refault_activation" => c.refault_activation = n != 0,
                    _ => panic!("unknown knob {k}"),
                }
            }
            c
        }
    };
    let trace = workload::moving_hot_set(set, alpha, phase_len, 3, seed);
    let cap = (set as f64 * frac) as usize;
    let mut mg = Mglru::new(cfg).expect("config");
    let mut lru = Lru::new();
    let mut ai = ActiveInactive::default();
    let mut bits = [AccessBits::new(), AccessBits::new(), AccessBits::new()];
    let mut res = [HashSet::new(), HashSet::new(), HashSet::new()];
    let mut seen = HashSet::new();
    let mut tot = [0u64; 3];
    let mut win = [
        Counts {
            misses: 0,
            first: 0,
        },
        Counts {
            misses: 0,
            first: 0,
        },
        Counts {
            misses: 0,
            first: 0,
        },
    ];
    let mut last_walks = 0;
    let mut last_act = 0;
    let mut last_la = 0;
    println!(
        "set {set} alpha {alpha} cap {cap} ({:.0}%) phase {phase_len} {variant}",
        frac * 100.0
    );
    println!("{:>8} {:>5} {:>6} {:>6} {:>6} {:>6} | {:>6} {:>5} {:>4} {:>4} {:>4}  gens oldest..youngest (A/B)", "req", "phase", "first", "mglru", "lru", "a-i", "staleM", "staleL", "walk", "act", "la");
    for (k, &page) in trace.iter().enumerate() {
        let first = seen.insert(page);
        let pols: [&mut dyn Policy; 3] = [&mut mg, &mut lru, &mut ai];
        for (j, p) in pols.into_iter().enumerate() {
            if step(p, &mut bits[j], cap, page, &mut res[j]) {
                win[j].misses += 1;
                tot[j] += 1;
                if first {
                    win[j].first += 1;
                }
            }
        }
        if (k + 1) % window == 0 {
            let phase = k / phase_len;
            let cur_b = phase % 2 == 1;
            let stale = |r: &HashSet<PageId>| {
                r.iter()
                    .filter(|&&p| (p >= SECOND_SET_BASE) != cur_b)
                    .count()
            };
            let s = mg.stats();
            let mut gens = String::new();
            for g in &s.generations {
                let (mut a, mut b) = (0, 0);
                for &p in &res[0] {
                    if mg.generation(p) == Some(g.seq) {
                        if p >= SECOND_SET_BASE {
                            b += 1;
                        } else {
                            a += 1;
                        }
                    }
                }
                gens += &format!(" {a}/{b}");
            }
            println!(
                "{:>8} {:>5} {:>6} {:>6} {:>6} {:>6} | {:>6} {:>5} {:>4} {:>4} {:>4} {}",
                k + 1,
                phase,
                win[0].first,
                win[0].misses,
                win[1].misses,
                win[2].misses,
                stale(&res[0]),
                stale(&res[1]),
                s.walks - last_walks,
                s.activated - last_act,
                s.look_around_promoted - last_la,
                gens
            );
            last_walks = s.walks;
            last_act = s.activated;
            last_la = s.look_around_promoted;
            for w in &mut win {
                w.misses = 0;
                w.first = 0;
            }
        }
    }
    let n = trace.len() as f64;
    println!(
        "total miss %: mglru {:.2} lru {:.2} a-i {:.2}; first touches {:.2}",
        tot[0] as f64 * 100.0 / n,
        tot[1] as f64 * 100.0 / n,
        tot[2] as f64 * 100.0 / n,
        seen.len() as f64 * 100.0 / n
    );
    println!("{:?}", mg.stats().tiers[0]);
}
