#!/usr/bin/env python3
"""Summarizes 2026-11-27-autolimit.py's JSON: medians [min, max] over the rounds, offload and
throughput loss against bare's median, and one SVG per workload of limit, resident and stall
against time (round 1 of auto and ksenpai).

    python3 docs/experiments/2026-11-27-autolimit-summarize.py RESULTS.json [SVG_DIR]
"""

import json
import statistics
import sys
from collections import defaultdict


def med(v):
    return statistics.median(v) if v else float("nan")


def cell(v, fmt="{:.0f}"):
    if not v:
        return "-"
    return (fmt + " [" + fmt + ", " + fmt + "]").format(med(v), min(v), max(v))


def summarize(results):
    by = defaultdict(list)
    for r in results:
        by[(r["workload"], r["setup"])].append(r)
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    setups = list(dict.fromkeys(r["setup"] for r in results))
    print("| workload | setup | throughput | x bare | resident mean MiB | offloaded (mean) | "
          "resident final MiB | offloaded (final) | stall s (daemon) | checks |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for w in workloads:
        bare = by.get((w, "bare"), [])
        bthr = med([r["throughput"] for r in bare if r.get("throughput")])
        brss = med([r["rss_mean_mib"] for r in bare if "rss_mean_mib" in r])
        for s in setups:
            every = by.get((w, s), [])
            # Figures from the runs whose data checked; the others are counted in `checks`.
            rs = [r for r in every if r.get("check") == "ok" and r.get("exit") == 0]
            thr = [r["throughput"] for r in rs if r.get("throughput")]
            xb = [t / bthr for t in thr]
            mean = [r["rss_mean_mib"] for r in rs if "rss_mean_mib" in r]
            fin = [r["rss_final_mib"] for r in rs if "rss_final_mib" in r]
            off_mean = [100 * (1 - m / brss) for m in mean]
            off_fin = [100 * (1 - f / brss) for f in fin]
            stall = [r["daemon"]["memory_stall_some_s"] for r in rs if r.get("daemon")]
            failed = [r for r in every if r not in rs]
            checks = f"{len(rs)} ok" + (f", {len(failed)} FAILED ({failed[0].get('check')}, "
                                        f"exit {failed[0].get('exit')})" if failed else "")
            print(f"| {w} | {s} | {cell(thr)} | {cell(xb, '{:.3f}')} | {cell(mean)} | "
                  f"{cell(off_mean, '{:.0f}%')} | {cell(fin)} | {cell(off_fin, '{:.0f}%')} | "
                  f"{cell(stall, '{:.2f}') if stall else '-'} | {checks} |")
    print()
    print("The daemon's work under auto (medians [min, max]): pages evicted, pages restored, "
          "restored per evicted, stall (PSI some) s over the whole run, limit changes:")
    print()
    print("| workload | evicted | restored | restored/evicted | stall s | limit changes |")
    print("|---|---|---|---|---|---|")
    for w in workloads:
        rs = [r["daemon"] for r in by.get((w, "auto"), []) if r.get("daemon")]
        if not rs:
            continue
        ev = [d["evicted_pages"] for d in rs]
        sw = [d["swapins"] for d in rs]
        ratio = [d["swapins"] / max(d["evicted_pages"], 1) for d in rs]
        st = [d["memory_stall_some_s"] for d in rs]
        ch = [d["limit_changes"] for d in rs]
        print(f"| {w} | {cell(ev)} | {cell(sw)} | {cell(ratio, '{:.2f}')} | "
              f"{cell(st, '{:.2f}')} | {cell(ch)} |")
    print()
    print("Load (1-min loadavg) before -> after each run:")
    for r in results:
        print(f"  round {r['round']} {r['workload']:6} {r['setup']:8} "
              f"{r['load_before']} -> {r['load_after']}")


def svg(w, runs, path):
    """Limit (dashed) and resident (solid), MiB, left axis; stall %, right axis (dots)."""
    W, H, L, R, T, B = 760, 360, 60, 60, 30, 40
    series = []
    for r in runs:
        if r.get("daemon") and r["daemon"].get("limit_history"):
            h = r["daemon"]["limit_history"]
            series.append(("auto", "#1f77b4", [(x[0], x[1] / 256, x[2] / 256, x[3]) for x in h]))
        if r.get("ksenpai_history"):
            h = r["ksenpai_history"]
            name = "ksenpai" + ("" if r.get("check") == "ok" else " (killed: memcg OOM)")
            series.append((name, "#d62728", [(x[0], min(x[1], 1e5), x[2], x[3]) for x in h]))
    if not series:
        return
    tmax = max(p[0] for _, _, s in series for p in s) or 1
    bare = [r for r in runs if r["setup"] == "bare" and r.get("rss_mean_mib")]
    mmax = max([max(p[2] for p in s) for _, _, s in series] + [b["rss_mean_mib"] for b in bare])
    mmax *= 1.15
    smax = max(5.0, min(50.0, max(p[3] for _, _, s in series for p in s)))
    x = lambda t: L + (W - L - R) * t / tmax
    y = lambda m: H - B - (H - T - B) * min(m, mmax) / mmax
    ys = lambda p: H - B - (H - T - B) * min(p, smax) / smax
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'font-family="sans-serif" font-size="11">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="16" font-size="13">{w}: limit (dashed), resident (solid), '
         f'stall % (dots, right axis); 1% target; round 1</text>',
         f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>',
         f'<line x1="{W-R}" y1="{T}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
         f'<line x1="{L}" y1="{ys(1):.1f}" x2="{W-R}" y2="{ys(1):.1f}" stroke="#999" '
         f'stroke-dasharray="2,3"/>']
    for i in range(6):
        m = mmax * i / 5
        o.append(f'<text x="{L-5}" y="{y(m)+4:.1f}" text-anchor="end">{m:.0f}</text>')
        p = smax * i / 5
        o.append(f'<text x="{W-R+5}" y="{ys(p)+4:.1f}">{p:.0f}%</text>')
        t = tmax * i / 5
        o.append(f'<text x="{x(t):.1f}" y="{H-B+15}" text-anchor="middle">{t:.0f}</text>')
    o.append(f'<text x="{(W)/2}" y="{H-5}" text-anchor="middle">seconds</text>')
    o.append(f'<text x="12" y="{H/2}" transform="rotate(-90 12 {H/2})" '
             f'text-anchor="middle">MiB</text>')
    for b in bare[:1]:
        o.append(f'<line x1="{L}" y1="{y(b["rss_mean_mib"]):.1f}" x2="{W-R}" '
                 f'y2="{y(b["rss_mean_mib"]):.1f}" stroke="#2ca02c"/>')
        o.append(f'<text x="{W-R-5}" y="{y(b["rss_mean_mib"])-4:.1f}" text-anchor="end" '
                 f'fill="#2ca02c">bare resident</text>')
    for k, (name, color, s) in enumerate(series):
        lim = " ".join(f"{x(p[0]):.1f},{y(p[1]):.1f}" for p in s)
        res = " ".join(f"{x(p[0]):.1f},{y(p[2]):.1f}" for p in s)
        o.append(f'<polyline points="{lim}" fill="none" stroke="{color}" '
                 f'stroke-dasharray="5,3"/>')
        o.append(f'<polyline points="{res}" fill="none" stroke="{color}" stroke-width="2"/>')
        for p in s:
            o.append(f'<circle cx="{x(p[0]):.1f}" cy="{ys(p[3]):.1f}" r="2" fill="{color}"/>')
        o.append(f'<text x="{L+10}" y="{T+14+14*k}" fill="{color}">{name}</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


def main():
    d = json.load(open(sys.argv[1]))
    summarize(d["results"])
    if len(sys.argv) > 2:
        by = defaultdict(list)
        for r in d["results"]:
            if r["round"] == 0:
                by[r["workload"]].append(r)
        for w, runs in by.items():
            svg(w, runs, f"{sys.argv[2]}/2026-11-27-autolimit-{w}.svg")


if __name__ == "__main__":
    main()
