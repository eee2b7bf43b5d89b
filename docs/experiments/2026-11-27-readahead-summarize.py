#!/usr/bin/env python3
"""Before/after tables of docs/experiments/2026-11-27-readahead.md from the compare JSON
outputs (B1, B2, B3: before; A1, A2, A3: after; run in the order B1 A1 A2 B2 A3 B3, the last
pair sequential only)."""
import gzip, json, statistics, sys, os

d = sys.argv[1] if len(sys.argv) > 1 else "."

def load(tag):
    p = os.path.join(d, f"2026-11-27-readahead-{tag}.json.gz")
    if os.path.exists(p):
        return json.load(gzip.open(p))
    return json.load(open(os.path.join(d, f"{tag}.json")))

runs = {"before": [], "after": []}
for tag in ["B1", "B2", "B3", "A1", "A2", "A3"]:
    side = "before" if tag[0] == "B" else "after"
    for r in load(tag)["runs"]:
        if r["status"] != "ok":
            print("not ok:", tag, r["workload"], r["setup"], r["status"], file=sys.stderr)
            continue
        m = dict(r["metrics"])
        w = r.get("workload_report") or {}
        checked = w.get("pages_checked") or 0
        m["pages_checked"] = checked
        if checked:
            for k in ["d_faults", "d_swapin_pages", "d_evicted_pages"]:
                m[k + "_per_1k_checked"] = 1000.0 * m.get(k, 0) / checked
            m["moved_per_1k_checked"] = 1000.0 * (m.get("d_swapin_pages", 0) + m.get("d_evicted_pages", 0)) / checked
        m["zswpin_over_swapin_pages"] = m.get("d_zswpin", 0) / max(m.get("d_swapin_pages", 1), 1)
        runs[side].append((r["workload"], r["setup"], m))

def spread(vals, fmt):
    vals = sorted(vals)
    med = statistics.median(vals)
    return f"{fmt(med)} [{fmt(vals[0])}, {fmt(vals[-1])}]"

def f0(v): return f"{v:,.0f}"
def f1(v): return f"{v:.1f}"
def f2(v): return f"{v:.2f}"
def f3(v): return f"{v:.3f}"

cells = [("random", "default"), ("random", "zswap"), ("zipf", "default"), ("zipf", "zswap"),
         ("sequential", "default"), ("sequential", "zswap")]

def table(title, cols):
    print(f"\n{title}\n")
    print("| workload | setup | | runs | " + " | ".join(c[0] for c in cols) + " |")
    print("|---|---|---|---:|" + "---:|" * len(cols))
    for (w, s) in cells:
        for side in ["before", "after"]:
            ms = [m for (ww, ss, m) in runs[side] if ww == w and ss == s]
            if not ms:
                continue
            row = [w, s, side, str(len(ms))]
            for (_, key, fmt) in cols:
                vals = [m[key] for m in ms if key in m and m[key] is not None]
                row.append(spread(vals, fmt) if vals else "-")
            print("| " + " | ".join(row) + " |")

table("Readahead (pages, whole run: fill, 5 s of touches, final check):", [
    ("swapped in", "d_swapin_pages", f0),
    ("read ahead", "d_readahead_pages", f0),
    ("hits", "d_readahead_hit_pages", f0),
    ("unused", "d_readahead_unused_pages", f0),
    ("unused % of swapped in", "d_readahead_unused_pct", f3),
])
table("Per 1000 pages the workload checked (touches + final check): machine-independent", [
    ("pages checked", "pages_checked", f0),
    ("faults", "d_faults_per_1k_checked", f1),
    ("swapped in", "d_swapin_pages_per_1k_checked", f1),
    ("evicted", "d_evicted_pages_per_1k_checked", f1),
    ("moved (in + out)", "moved_per_1k_checked", f1),
])
table("Throughput and time (noisy: the machine was busy)", [
    ("touches/s", "throughput", f0),
    ("fault p50 us", "fault_p50_us", f1),
    ("final check s", "final_check_s", f2),
    ("cpu sum s", "cpu_total_s", f2),
    ("other CPU busy s", "other_busy_s", f1),
    ("elapsed s", "elapsed_s", f1),
])
table("zswap loads per page swapped in (retried faults load again)", [
    ("zswpin", "d_zswpin", f0),
    ("zswpin / swapped in", "zswpin_over_swapin_pages", f3),
])
