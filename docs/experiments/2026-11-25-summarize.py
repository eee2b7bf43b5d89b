#!/usr/bin/env python3
"""Tables of docs/experiments/2026-11-25-encryption-zipf-threads.md from the driver's --json
output: medians with [min, max] over the rounds, and paired per-round ratios (the setups
alternate within each round, so setup A's run in round r is compared with setup B's run in
the same round).

usage: 2026-11-25-summarize.py RUN.json[.gz] [PAIR_A:PAIR_B ...]
"""
import gzip
import json
import statistics
import sys


def fmt(v):
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def spread(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    return f"{fmt(statistics.median(vals))} [{fmt(min(vals))}, {fmt(max(vals))}]"


def pages_out(r):
    """Pages stored out: into the compressed pool plus onto the swap device (a page written
    back from the pool counts twice, alike for the daemon and the kernel)."""
    m = r["metrics"]
    if r["setup"] == "bare":
        return 0
    pre = "d_" if "d_pswpout" in m or "d_zswpout" in m else "k_"
    z, p = m.get(pre + "zswpout"), m.get(pre + "pswpout")
    if z is None and p is None:
        return None
    return (z or 0) + (p or 0)


def main():
    path = sys.argv[1]
    doc = json.load(gzip.open(path, "rt") if path.endswith(".gz") else open(path))
    runs = [r for r in doc["runs"] if r["status"] != "unavailable"]
    pairs = [p.split(":") for p in sys.argv[2:]]
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    setups = list(dict.fromkeys(r["setup"] for r in runs))
    cols = ["workload", "setup", "ok/runs", "throughput", "elapsed s", "cpu sum s",
            "daemon cpu s", "cpu us / swapin", "cpu us / page moved", "swapins", "pages out",
            "faults", "pages to swap device", "other CPU busy s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for w in workloads:
        for s in setups:
            rs = [r for r in runs if r["workload"] == w and r["setup"] == s]
            ok = [r for r in rs if r["status"] == "ok"]
            if not rs:
                continue
            g = lambda k: [r["metrics"].get(k) for r in ok]
            faults = g("d_faults") if any(v is not None for v in g("d_faults")) else g("majflt")
            out = [pages_out(r) for r in ok]
            moved = [None if o is None or r["metrics"].get("swapins") is None
                     or r["metrics"].get("cpu_total_s") is None or o + r["metrics"]["swapins"] == 0
                     else r["metrics"]["cpu_total_s"] * 1e6 / (o + r["metrics"]["swapins"])
                     for r, o in zip(ok, out)]
            print("| " + " | ".join([
                w, s, f"{len(ok)}/{len(rs)}", spread(g("throughput")), spread(g("elapsed_s")),
                spread(g("cpu_total_s")), spread(g("daemon_cpu_s")),
                spread(g("cpu_us_per_swapin")), spread(moved), spread(g("swapins")), spread(out),
                spread(faults),
                spread(g("dev_write_pages")), spread(g("other_busy_s"))]) + " |")
    bad = [r for r in runs if r["status"] != "ok"]
    for r in bad:
        print(f"\n- {r['workload']} / {r['setup']} round {r['repeat'] + 1}: {r['status']}: {r['reason']}")
    if pairs:
        print("\nPaired by round (A / B, same round; median [min, max] over the rounds where both ran):\n")
        cols = ["workload", "A / B", "rounds", "throughput", "elapsed", "cpu sum", "cpu per swapin",
                "fill rate", "final check s",
                "A slower (elapsed) in", "A more CPU in"]
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for w in workloads:
            for a, b in pairs:
                ratios = {k: [] for k in ["throughput", "elapsed_s", "cpu_total_s", "cpu_us_per_swapin",
                                          "fill_mib_s", "final_check_s"]}
                n = 0
                for rep in sorted({r["repeat"] for r in runs}):
                    ra = [r for r in runs if r["workload"] == w and r["setup"] == a and r["repeat"] == rep and r["status"] == "ok"]
                    rb = [r for r in runs if r["workload"] == w and r["setup"] == b and r["repeat"] == rep and r["status"] == "ok"]
                    if not ra or not rb:
                        continue
                    n += 1
                    for k in ratios:
                        x, y = ra[0]["metrics"].get(k), rb[0]["metrics"].get(k)
                        if x is not None and y:
                            ratios[k].append(x / y)
                if n:
                    slower = sum(1 for x in ratios["elapsed_s"] if x > 1)
                    more = sum(1 for x in ratios["cpu_total_s"] if x > 1)
                    print("| " + " | ".join([w, f"{a} / {b}", str(n)] + [spread(ratios[k]) for k in ratios]
                                            + [f"{slower} of {n}", f"{more} of {n}"]) + " |")


main()
