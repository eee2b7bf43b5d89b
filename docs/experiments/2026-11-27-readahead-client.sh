#!/bin/bash
# The readahead test client (tests/clients/readahead.c, built with `cc -O2`) under the daemon's
# defaults, before and after alternated, three rounds; one JSON line per run on stdout.
#   BEFORE=/path/uffd-daemon AFTER=/path/uffd-daemon CLIENT=/path/readahead \
#     docs/experiments/2026-11-27-readahead-client.sh > client.jsonl
set -eu
stats=$(mktemp)
for i in 1 2 3; do
  for side in before after; do
    case $side in before) bin=$BEFORE;; after) bin=$AFTER;; esac
    for cfg in "16M 64 pairs 30000" "256M 1024 pairs 200000" "256M 1024 random 200000" \
               "256M 1024 sequential 600000"; do
      set -- $cfg
      t0=$(date +%s.%N)
      line=$("$bin" run --limit "$1" --stats-json "$stats" -- "$CLIENT" "$3" "$2" "$4" 2>/dev/null)
      t1=$(date +%s.%N)
      python3 - "$side" "$i" "$1" "$2" "$3" "$4" "$t0" "$t1" "$line" \
          "$(cut -d' ' -f1 /proc/loadavg)" "$stats" <<'PY'
import json, sys
side, i, limit, mib, mode, touches, t0, t1, line, load, stats = sys.argv[1:]
s = json.load(open(stats))
keep = ['faults', 'swapins', 'bytes_read', 'readahead_pages', 'readahead_hit_pages',
        'readahead_unused_pages', 'evicted_pages', 'zswpin', 'pswpin']
print(json.dumps(dict(side=side, round=int(i), limit=limit, mib=int(mib), mode=mode,
                      touches=int(touches), wall_s=float(t1) - float(t0), client=line,
                      load=float(load), **{k: s.get(k) for k in keep})))
PY
    done
  done
done
rm -f "$stats"
