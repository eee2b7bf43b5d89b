//! Instruments one replay: per window of requests, MGLRU's and LRU's misses, MGLRU's walks,
//! generation sizes (oldest first) and the aging controller's window (evictions and refaults
//! of probation and demoted victims, and probation's refaults in and out of eviction order).
//!
//! ```text
//! cargo run --release -p mglru --example probe -- WORKLOAD CAPACITY WINDOW [VARIANT]
//! ```
//!
//! WORKLOAD: `loop:PAGES:ROUNDS`, `moved:SET:ALPHA:SEED[:MULT:PHASES]` (the report's
//! `moving_hot_set`, MULT x SET requests per phase, PHASES phases: 5 and 3 by default), `wss:SCAN:SEED` (the report's periodic scan) or a trace
//! file. VARIANT as in the `cells` example (`default`, `knob=value,...`).

use mglru::replay::{parse_trace, workload};
use mglru::{AccessBits, AccessKind, Config, Hint, Lru, Mglru, PageId, PageType, Policy};

fn step(
    p: &mut dyn Policy,
    bits: &mut AccessBits,
    cap: usize,
    page: PageId,
    faults_only: bool,
) -> bool {
    if p.contains(page) {
        if !faults_only {
            bits.set(page);
        }
        p.access(page, AccessKind::Mapped);
        return false;
    }
    if p.len() >= cap {
        for v in p.evict(p.len() + 1 - cap, bits) {
            bits.clear(v);
        }
    }
    p.add(page, Hint::fault(PageType::Anon)).expect("add");
    bits.set(page);
    true
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let w: Vec<&str> = args[0].split(':').collect();
    let trace: Vec<PageId> = match w[0] {
        "loop" => workload::looping(w[1].parse().unwrap(), w[2].parse().unwrap()),
        "moved" => {
            let set: usize = w[1].parse().unwrap();
            // Optional phase length (in sets) and number of phases: 5 and 3 by default.
            let mult: usize = w.get(4).map_or(5, |v| v.parse().unwrap());
            let phases: usize = w.get(5).map_or(3, |v| v.parse().unwrap());
            workload::moving_hot_set(
                set,
                w[2].parse().unwrap(),
                mult * set,
                phases,
                w[3].parse().unwrap(),
            )
        }
        "wss" => workload::zipf_with_periodic_scan(
            10_000,
            0.9,
            w[1].parse().unwrap(),
            40_000,
            800_000,
            w[2].parse().unwrap(),
        ),
        "dzipf" => {
            // The comparison driver's Zipf run: every page written once in order, then
            // Zipf(theta) reads over page ranks scattered by a permutation.
            let pages: usize = w[1].parse().unwrap();
            let z = workload::Zipf::new(pages, w[2].parse().unwrap());
            let mut rng = workload::SplitMix::new(w[4].parse().unwrap());
            let mut perm: Vec<PageId> = (0..pages as PageId).collect();
            for i in (1..pages).rev() {
                let j = (rng.next_u64() % (i as u64 + 1)) as usize;
                perm.swap(i, j);
            }
            let reqs: usize = w[3].parse().unwrap();
            let mut t: Vec<PageId> = (0..pages as PageId).collect();
            t.extend((0..reqs).map(|_| perm[z.sample(&mut rng) as usize]));
            t
        }
        path => parse_trace(&std::fs::read_to_string(path).unwrap()).unwrap(),
    };
    let cap: usize = args[1].parse().unwrap();
    let window: usize = args[2].parse().unwrap();
    let cfg = cells_config(args.get(3).map(String::as_str).unwrap_or("default"));
    // FAULTS_ONLY=1: hits set no accessed bit (the daemon's `--access faults`).
    let faults_only = std::env::var("FAULTS_ONLY").is_ok_and(|v| v == "1");
    let mut mg = Mglru::new(cfg).unwrap();
    let mut lru = Lru::new();
    let mut bits = [AccessBits::new(), AccessBits::new()];
    let (mut wm, mut wl, mut tm, mut tl) = (0u64, 0u64, 0u64, 0u64);
    let mut last_walks = 0;
    for (k, &page) in trace.iter().enumerate() {
        if step(&mut mg, &mut bits[0], cap, page, faults_only) {
            wm += 1;
            tm += 1;
        }
        if step(&mut lru, &mut bits[1], cap, page, faults_only) {
            wl += 1;
            tl += 1;
        }
        if (k + 1) % window == 0 {
            let s = mg.stats();
            let gens: Vec<u64> = s.generations.iter().map(|g| g.pages[0]).collect();
            println!(
                "{:>8} mglru {:>6} lru {:>6} walks {:>3} gens {:?} ev {:?} rf {:?} order {:?}",
                k + 1,
                wm,
                wl,
                s.walks - last_walks,
                gens,
                s.aging_evicted,
                s.aging_refaulted,
                s.refault_order
            );
            last_walks = s.walks;
            wm = 0;
            wl = 0;
        }
    }
    let n = trace.len() as f64;
    println!(
        "total miss %: mglru {:.2} lru {:.2}",
        tm as f64 * 100.0 / n,
        tl as f64 * 100.0 / n
    );
    // The cost of aging per fault: walks, pages they scanned and their time, per miss.
    let s = mg.stats();
    println!(
        "aging: {} walks, {} pages scanned ({:.3} per miss), {:.0} ns of walks per miss",
        s.walks,
        s.walk_totals.pages_scanned,
        s.walk_totals.pages_scanned as f64 / tm.max(1) as f64,
        s.walk_totals.nanos as f64 / tm.max(1) as f64
    );
}

fn cells_config(spec: &str) -> Config {
    let mut c = Config::default();
    for part in spec.split(',').filter(|p| !p.is_empty() && *p != "default") {
        let (k, v) = part.split_once('=').expect("knob=value");
        let n: u64 = v.parse().expect("a number");
        match k {
            "eviction_aging" => c.eviction_aging = n as u32,
            "demotion_feedback" => c.demotion_feedback = n != 0,
            "loop_eviction" => c.loop_eviction = n as u32,
            "idle_youngest_demotion" => c.idle_youngest_demotion = n != 0,
            "young_bound_aging" => c.young_bound_aging = n != 0,
            "look_twice" => c.look_twice = n != 0,
            "loop_window" => c.loop_window = n as u32,
            "loop_order" => c.loop_order = n as u32,
            "refault_window" => c.refault_window = n,
            "refault_activation" => c.refault_activation = n != 0,
            _ => panic!("unknown knob {k}"),
        }
    }
    c
}
