//! Replays a page-reference trace (one page id per line) on a memory of `--capacity` pages
//! managed by `--policy`, and prints one JSON object with the miss ratio.
//!
//! ```text
//! cargo run --release -p mglru --example replay -- --policy mglru --capacity 1000 trace.txt
//! ```

use std::process::ExitCode;

use mglru::replay::{parse_trace, policy_by_name, replay, POLICIES};
use mglru::Config;

const USAGE: &str = "usage: replay --policy <mglru|active-inactive|lru|clock> --capacity <PAGES> \
                     [--v6.1] [--no-bloom-filter] \
                     [--fault-placement <oldest|second-oldest|youngest>] [--max-nr-gens <3|4>] \
                     [--look-twice] [--no-look-twice] [--no-young-bound-aging] \
                     [--refault-window <GENS>] <TRACE>";

fn run() -> Result<String, String> {
    let mut args = std::env::args().skip(1);
    let (mut policy, mut capacity, mut trace) = (None, None, None);
    let mut cfg = Config::default();
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value\n{USAGE}"));
        match a.as_str() {
            "--policy" => policy = Some(value("--policy")?),
            "--capacity" => {
                let v = value("--capacity")?;
                capacity = Some(
                    v.parse::<usize>()
                        .map_err(|_| format!("--capacity {v:?} is not a page count"))?,
                );
            }
            // The v6.1 rules; options after it change them.
            "--v6.1" => cfg = Config::v6_1(),
            "--no-bloom-filter" => cfg.bloom_filter = false,
            "--look-twice" => cfg.look_twice = true,
            "--no-look-twice" => cfg.look_twice = false,
            "--no-young-bound-aging" => cfg.young_bound_aging = false,
            "--refault-window" => {
                let v = value("--refault-window")?;
                cfg.refault_window = v
                    .parse()
                    .map_err(|_| format!("--refault-window {v:?} is not a number"))?;
            }
            "--fault-placement" => {
                cfg.fault_placement = match value("--fault-placement")?.as_str() {
                    "youngest" => mglru::FaultPlacement::Youngest,
                    "second-oldest" => mglru::FaultPlacement::SecondOldest,
                    "oldest" => mglru::FaultPlacement::Oldest,
                    v => {
                        return Err(format!(
                            "--fault-placement {v:?}: oldest, second-oldest or youngest"
                        ))
                    }
                }
            }
            "--max-nr-gens" => {
                let v = value("--max-nr-gens")?;
                cfg.max_nr_gens = v
                    .parse()
                    .map_err(|_| format!("--max-nr-gens {v:?} is not a number"))?;
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            _ if a.starts_with("--") => return Err(format!("unknown option {a}\n{USAGE}")),
            _ => trace = Some(a),
        }
    }
    let policy = policy.ok_or(format!(
        "--policy is required ({})\n{USAGE}",
        POLICIES.join(", ")
    ))?;
    let capacity = capacity.ok_or(format!("--capacity is required\n{USAGE}"))?;
    let path = trace.ok_or(format!("a trace file is required\n{USAGE}"))?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let trace = parse_trace(&text).map_err(|e| format!("{path}: {e}"))?;
    let mut p = policy_by_name(&policy, &cfg).map_err(|e| e.to_string())?;
    let r = replay(p.as_mut(), capacity, &trace).map_err(|e| e.to_string())?;
    Ok(serde_json::json!({
        "policy": r.policy,
        "capacity": r.capacity,
        "requests": r.requests,
        "misses": r.misses,
        "miss_ratio": r.miss_ratio(),
    })
    .to_string())
}

fn main() -> ExitCode {
    match run() {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("replay: {e}");
            ExitCode::FAILURE
        }
    }
}
