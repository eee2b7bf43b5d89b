#!/usr/bin/env python3
"""--limit auto measured (issue #21): each workload bare, under `uffd-daemon run --limit auto`,
and under the kernel's way (a memcg v1 limit lowered by a PSI-driven loop, Senpai's rule), in
alternating rounds. As root, from the workspace root, after
`cargo build --release -p bench --bin compare && cargo build --release -p uffd-daemon --bin uffd-daemon`:

    python3 docs/experiments/2026-11-27-autolimit.py --rounds 3 --out /var/tmp/autolimit.json

Workloads (every one checks its data):
  redis   redis-server filled with ~600 MiB of 2 KiB values derived from their keys, then
          redis-benchmark GETs (-c 16) over the first tenth of the keys for --seconds, then
          every key read back and compared
  zipf    usemem --mode zipf over 1 GiB (Zipf 0.99 over page ranks, scattered), --seconds
  moved   usemem --mode moved over 1 GiB: a hot tenth, moved to a disjoint tenth and back
  hot     usemem --mode random over 256 MiB: all of it is the working set

Setups:
  bare     the program alone (no daemon, no cgroup, no swap)
  auto     uffd-daemon run --limit auto (its defaults: 1% stall target, 1 s interval,
           lz4 zswap in front of a sealed swap file)
  ksenpai  the kernel: the program in a memcg v1 group (memory.limit_in_bytes) and in a
           cgroup v2 group mounted only for its memory.pressure (PSI per group; no controller
           is enabled there); a loop in this script reads the group's `some` stall every 1 s
           and sets the limit with the daemon's rule (limit.rs AutoLimit::decide, ported
           below), backing: kernel zswap at its defaults (lzo, max_pool_percent 20) in front
           of a swap file on the disk of /var/tmp

The resident anonymous memory of the program's tree (RssAnon of every process under the run,
the daemon excluded) is sampled every second for every setup. The machine's comparison lock
(/var/tmp/uffd-compare.lock) is held for the whole run.
"""

import argparse
import fcntl
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPARE = os.path.join(ROOT, "target/release/compare")
DAEMON = os.environ.get("DAEMON", os.path.join(ROOT, "target/release/uffd-daemon"))
WORK = "/var/tmp/uffd-autolimit-run"
CG1 = "/sys/fs/cgroup/memory/uffd-autolimit"
CG2_MNT = "/var/tmp/uffd-autolimit-cg2"
CG2 = CG2_MNT + "/uffd-autolimit"
SWAPFILE = "/var/tmp/uffd-autolimit.swap"
PAGE = 4096


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def rss_anon_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid):
    out = []
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def tree_rss_mib(root, exclude):
    total, stack, seen = 0, [root], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        if p != exclude:
            total += rss_anon_kib(p)
        stack += children(p)
    return total / 1024


# ---- the controller's rule, ported from crates/uffd-daemon/src/limit.rs (AutoLimit::decide) ----
class Rule:
    def __init__(self, floor, ceiling, target=1.0, probe=0.02, backoff=0.5, max_probe=0.25):
        self.floor, self.ceiling, self.target = floor, ceiling, target
        self.probe, self.backoff, self.max_probe = probe, backoff, max_probe
        self.ticks = self.streak = self.hold = self.hold_until = 0
        self.probed = False
        self.last_resident = None

    def decide(self, limit, resident, stall):
        self.ticks += 1
        ratio = stall / self.target
        growing = self.last_resident is None or resident > self.last_resident * 1.01
        self.last_resident = resident
        if ratio >= 1.0:
            raise_ = self.backoff * min(ratio - 1.0, 1.0)
            self.streak = 0
            self.hold = min(max(self.hold * 2, 2), 64) if self.probed else max(self.hold, 2)
            self.hold_until = self.ticks + self.hold
            self.probed = False
            nxt = max(limit, int(resident * (1.0 + raise_) + 0.999))
        elif self.ticks < self.hold_until or growing:
            self.probed = False
            nxt = limit
        else:
            self.probed = True
            probe = min(self.probe * (1 << min(self.streak, 8)), self.max_probe)
            self.streak += 1
            if self.streak > 1:
                self.hold //= 2
            base = min(limit, resident)
            cut = max(base * probe * (1.0 - ratio), 1.0)
            nxt = int(base - cut)
        return min(max(nxt, self.floor), max(self.ceiling, self.floor))


def write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def read(path):
    with open(path) as f:
        return f.read()


def psi_some_us(path):
    for line in read(path).splitlines():
        if line.startswith("some"):
            return int(line.split("total=")[1])
    return 0


class Kernel:
    """Swap file + zswap at its defaults, the two groups; undone by close()."""

    def __init__(self, swap_bytes):
        self.zswap_enabled = read("/sys/module/zswap/parameters/enabled").strip()
        if subprocess.run(["swapon", "--show", "--noheadings"], capture_output=True,
                          text=True).stdout.strip():
            sys.exit("a swap area is already on; refusing to touch it")
        subprocess.run(["fallocate", "-l", str(swap_bytes), SWAPFILE], check=True)
        os.chmod(SWAPFILE, 0o600)
        subprocess.run(["mkswap", SWAPFILE], check=True, capture_output=True)
        subprocess.run(["swapon", SWAPFILE], check=True)
        write("/sys/module/zswap/parameters/enabled", "Y")
        os.makedirs(CG2_MNT, exist_ok=True)
        if not os.path.exists(CG2_MNT + "/cgroup.procs"):
            subprocess.run(["mount", "-t", "cgroup2", "none", CG2_MNT], check=True)
        self.backing = {
            k: read(f"/sys/module/zswap/parameters/{k}").strip()
            for k in ["enabled", "compressor", "max_pool_percent", "zpool"]
            if os.path.exists(f"/sys/module/zswap/parameters/{k}")
        }

    def close(self):
        for g in [CG1, CG2]:
            try:
                os.rmdir(g)
            except OSError:
                pass
        subprocess.run(["umount", CG2_MNT], capture_output=True)
        subprocess.run(["swapoff", SWAPFILE], capture_output=True)
        try:
            os.remove(SWAPFILE)
        except OSError:
            pass
        write("/sys/module/zswap/parameters/enabled", self.zswap_enabled)


def make_groups():
    for g in [CG1, CG2]:
        if os.path.isdir(g):
            os.rmdir(g)
        os.mkdir(g)


def senpai_loop(stop, hist, t0, interval=1.0):
    """Senpai on memcg v1: the group's PSI `some` (cgroup v2 file), the daemon's rule."""
    ram = os.sysconf("SC_PHYS_PAGES") * PAGE
    rule = Rule(floor=16 << 20, ceiling=ram)
    limit = ram
    last_t, last_some = time.monotonic(), psi_some_us(CG2 + "/memory.pressure")
    while not stop.wait(interval):
        now = time.monotonic()
        some = psi_some_us(CG2 + "/memory.pressure")
        stall = (some - last_some) / ((now - last_t) * 1e6) * 100
        last_t, last_some = now, some
        try:
            st = dict(l.split() for l in read(CG1 + "/memory.stat").splitlines())
        except OSError:
            break
        resident = int(st["total_rss"])
        new = rule.decide(limit, resident, stall)
        t_set = time.monotonic()
        try:
            if new < limit:
                # memcg v1 reclaims in the writer until usage is under the new limit, while
                # the program keeps charging: first cap the group just above its usage (the
                # program then reclaims for itself, in its own stall), then go down.
                usage = int(read(CG1 + "/memory.usage_in_bytes"))
                if usage + (4 << 20) < limit:
                    write(CG1 + "/memory.limit_in_bytes", usage + (4 << 20))
            write(CG1 + "/memory.limit_in_bytes", new)
            limit = new
        except OSError:
            # EBUSY: the kernel could not reclaim down to it; keep what it has.
            limit = int(read(CG1 + "/memory.limit_in_bytes"))
        hist.append([round(now - t0, 3), limit >> 20, round(resident / (1 << 20), 1),
                     round(stall, 3), round(time.monotonic() - t_set, 3)])
    # The measured phase is over: no limit for the data check (a memcg v1 limit OOM-kills a
    # program whose working set grows faster than the loop raises it; see the report).
    try:
        write(CG1 + "/memory.limit_in_bytes", -1)
    except OSError:
        pass  # the group's last task died (ENODEV)


# ---- redis ----
VALUE = 2048


def value(i):
    r = random.Random(i)
    head = b"%012d" % i + r.randbytes(VALUE // 3)
    motif = r.randbytes(64)
    return (head + motif * (VALUE // 64 + 1))[:VALUE]


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def connect(sock_path, timeout=30):
    deadline = time.time() + timeout
    while True:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock_path)
            return s
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


def redis_fill(s, keys):
    f = s.makefile("rb")
    for b in range(0, keys, 512):
        s.sendall(b"".join(resp(b"SET", b"key:%012d" % i, value(i))
                           for i in range(b, min(b + 512, keys))))
        for _ in range(b, min(b + 512, keys)):
            line = f.readline()
            if line != b"+OK\r\n":
                raise RuntimeError(f"SET answered {line!r}")


def redis_check(s, keys):
    f = s.makefile("rb")
    bad = 0
    for b in range(0, keys, 512):
        s.sendall(b"".join(resp(b"GET", b"key:%012d" % i) for i in range(b, min(b + 512, keys))))
        for i in range(b, min(b + 512, keys)):
            line = f.readline()
            if not line.startswith(b"$") or int(line[1:]) != VALUE:
                bad += 1
                continue
            v = f.read(VALUE + 2)[:VALUE]
            if v != value(i):
                bad += 1
    return bad


# ---- one run ----
def run_one(a, workload, setup, rnd):
    os.makedirs(WORK, exist_ok=True)
    stats_json = f"{WORK}/stats.json"
    for p in [stats_json]:
        if os.path.exists(p):
            os.remove(p)
    sock_path = f"{WORK}/redis.sock"
    if workload == "redis":
        prog = ["redis-server", "--port", "0", "--unixsocket", sock_path, "--unixsocketperm",
                "700", "--save", "", "--appendonly", "no", "--dir", WORK]
    else:
        mode, size, secs = {
            "zipf": ("zipf", "1G", a.seconds),
            "moved": ("moved", "1G", a.seconds),
            "hot": ("random", "256M", a.hot_seconds),
        }[workload]
        prog = [COMPARE, "__usemem", "--bytes", size, "--mode", mode, "--seconds", str(secs),
                "--final-check"]
    if setup == "auto":
        argv = [DAEMON, "run", "--limit", "auto", "--stats-json", stats_json, "--"] + prog
    elif setup == "daemon":
        # The daemon with a limit nothing reaches: its cost without the controller.
        argv = [DAEMON, "run", "--limit", "20G", "--stats-json", stats_json, "--"] + prog
    elif setup == "ksenpai":
        make_groups()
        argv = ["sh", "-c", f'echo $$ > {CG1}/cgroup.procs && echo $$ > {CG2}/cgroup.procs '
                f'&& exec "$@"', "sh"] + prog
    else:
        argv = prog
    res = {"workload": workload, "setup": setup, "round": rnd, "load_before": loadavg()}
    t0 = time.monotonic()
    out = open(f"{WORK}/out", "w+")
    p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    exclude = p.pid if setup in ("auto", "daemon") else -1
    samples, stop = [], threading.Event()
    phase = {"start": None, "end": None}

    def sampler():
        while not stop.wait(1.0):
            samples.append([round(time.monotonic() - t0, 2), round(tree_rss_mib(p.pid, exclude), 1)])

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    khist = []
    kstop = threading.Event()
    kth = None
    if setup == "ksenpai":
        kth = threading.Thread(target=senpai_loop, args=(kstop, khist, t0), daemon=True)
        kth.start()
        if workload != "redis":
            # usemem: the fill takes about a second, then the touch phase.
            threading.Timer(1.0 + (a.hot_seconds if workload == "hot" else a.seconds),
                            kstop.set).start()
    try:
      try:
        if workload == "redis":
            keys = a.redis_mib * (1 << 20) // 2700
            hot = keys // 10
            s = connect(sock_path)
            tf = time.monotonic()
            redis_fill(s, keys)
            res["fill_s"] = time.monotonic() - tf
            phase["start"] = time.monotonic() - t0
            done, spent, chunks = 0, 0.0, []
            while spent < a.seconds:
                n = 100000
                tc = time.monotonic()
                r = subprocess.run(["redis-benchmark", "-s", sock_path, "-t", "get", "-r",
                                    str(hot), "-n", str(n), "-c", "16", "-d", str(VALUE),
                                    "--csv"], capture_output=True, text=True)
                dt = time.monotonic() - tc
                if r.returncode != 0:
                    res["benchmark_error"] = (r.stdout + r.stderr)[-500:]
                    break
                done += n
                spent += dt
                chunks.append([round(tc - t0, 2), round(n / dt)])
            phase["end"] = time.monotonic() - t0
            kstop.set()
            res["throughput"] = done / spent if spent else None
            res["chunks"] = chunks
            tcheck = time.monotonic()
            res["bad"] = redis_check(s, keys)
            res["check_s"] = time.monotonic() - tcheck
            res["keys"], res["hot_keys"] = keys, hot
            s.sendall(resp(b"SHUTDOWN", b"NOSAVE"))
            s.close()
            res["check"] = "ok" if res["bad"] == 0 else f"MISMATCH {res['bad']} keys"
            if "benchmark_error" in res:
                res["check"] = "redis-benchmark failed"
      except (OSError, subprocess.SubprocessError) as e:
        # The server died under us (a memcg OOM kill: see the kernel log).
        res["check"] = f"FAILED: {e!r}"
        phase["end"] = phase["end"] or time.monotonic() - t0
        kstop.set()
      code = p.wait(timeout=a.seconds * 4 + 300)
    finally:
        stop.set()
        kstop.set()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    th.join()
    if kth:
        kth.join()
    res["exit"] = code
    res["wall_s"] = time.monotonic() - t0
    res["load_after"] = loadavg()
    out.seek(0)
    text = out.read()
    if workload != "redis":
        rep = [json.loads(l) for l in text.splitlines() if l.startswith("{\"")]
        rep = [r for r in rep if r.get("workload") == "usemem"]
        if rep:
            r = rep[-1]
            res["throughput"] = r.get("touches_per_s")
            res["check"] = r.get("check")
            # The touch phase: from the end of the fill to the final check.
            end = res["wall_s"] - (r.get("final_check_s") or 0)
            phase["start"], phase["end"] = end - r["touch_s"], end
        else:
            res["check"] = "no report: " + text[-300:]
    res["phase"] = phase
    res["rss"] = samples
    inside = [m for t, m in samples if phase["start"] is not None and phase["start"] <= t <= phase["end"]]
    if inside:
        res["rss_mean_mib"] = statistics.mean(inside)
        res["rss_final_mib"] = inside[-1]
    if setup in ("auto", "daemon") and os.path.exists(stats_json):
        st = json.load(open(stats_json))
        res["daemon"] = {k: v for k, v in st.items() if isinstance(v, (int, float, bool))}
        res["daemon"]["limit_history"] = st.get("limit_history")
    if setup == "ksenpai":
        res["ksenpai_history"] = khist
        res["kernel_backing"] = a.kernel.backing
        for g in [CG1, CG2]:
            try:
                os.rmdir(g)
            except OSError:
                pass
    if res.get("check") != "ok" or code != 0:
        res["output_tail"] = text[-1000:]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=45)
    ap.add_argument("--hot-seconds", type=float, default=25)
    ap.add_argument("--redis-mib", type=int, default=600)
    ap.add_argument("--workloads", default="redis,zipf,moved,hot")
    ap.add_argument("--setups", default="bare,auto,ksenpai")
    ap.add_argument("--out", default="/var/tmp/autolimit.json")
    a = ap.parse_args()
    # (A background job started from a script ignores SIGINT: SIGTERM undoes the setup too.)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    lock = open("/var/tmp/uffd-compare.lock", "a+")
    print("waiting for the machine lock", file=sys.stderr)
    fcntl.flock(lock, fcntl.LOCK_EX)
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    setups = a.setups.split(",")
    a.kernel = Kernel(8 << 30) if "ksenpai" in setups else None
    results = []
    try:
        for rnd in range(a.rounds):
            for w in a.workloads.split(","):
                for s in setups:
                    r = run_one(a, w, s, rnd)
                    results.append(r)
                    print(f"round {rnd} {w:6} {s:8} thr {r.get('throughput') or 0:10.0f} "
                          f"rss mean {r.get('rss_mean_mib', 0):7.1f} final "
                          f"{r.get('rss_final_mib', 0):7.1f} MiB check {r.get('check')} exit "
                          f"{r['exit']} load {r['load_before']} -> {r['load_after']}",
                          file=sys.stderr, flush=True)
                    with open(a.out, "w") as f:
                        json.dump({"argv": sys.argv, "results": results}, f)
    finally:
        if a.kernel:
            a.kernel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
