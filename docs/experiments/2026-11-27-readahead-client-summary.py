#!/usr/bin/env python3
"""Table of docs/experiments/2026-11-27-readahead.md from the runs of the readahead test client
(tests/clients/readahead.c) under the daemon's defaults, before and after alternated: one JSON
line per run (2026-11-27-readahead-client.jsonl.gz)."""
import gzip, json, statistics, sys
path = sys.argv[1] if len(sys.argv) > 1 else "2026-11-27-readahead-client.jsonl.gz"
rows = [json.loads(l) for l in (gzip.open(path, "rt") if path.endswith(".gz") else open(path))]
def spread(v, f):
    v = sorted(v)
    return f"{f(statistics.median(v))} [{f(v[0])}, {f(v[-1])}]"
f0 = lambda x: f"{x:,.0f}"
f1 = lambda x: f"{x:.1f}"
f2 = lambda x: f"{x:.2f}"
print("| client | limit | | runs | swapped in | read ahead | unused | unused % of swapped in | faults | evicted | wall s |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for (limit, mib, mode, touches) in [("16M", 64, "pairs", 30000), ("256M", 1024, "pairs", 200000),
                                    ("256M", 1024, "random", 200000), ("256M", 1024, "sequential", 600000)]:
    for side in ["before", "after"]:
        rs = [r for r in rows if r["side"] == side and r["limit"] == limit and r["mode"] == mode]
        assert all(r["client"].endswith(", 0 bad pages") for r in rs)
        pin = [r["bytes_read"] / 4096 for r in rs]
        print(f"| `{mode} {mib} {touches}` | {limit} | {side} | {len(rs)} | "
              + " | ".join([
                  spread(pin, f0),
                  spread([r["readahead_pages"] for r in rs], f0),
                  spread([r["readahead_unused_pages"] for r in rs], f0),
                  spread([100 * r["readahead_unused_pages"] / (r["bytes_read"] / 4096) for r in rs], f2),
                  spread([r["faults"] for r in rs], f0),
                  spread([r["evicted_pages"] for r in rs], f0),
                  spread([r["wall_s"] for r in rs], f1),
              ]) + " |")
loads = [r["load"] for r in rows]
print(f"\n1-minute load average at the end of each run: {min(loads)} to {max(loads)}, median {statistics.median(loads)}")
