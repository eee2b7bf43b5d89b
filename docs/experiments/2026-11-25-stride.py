#!/usr/bin/env python3
"""Order alternates by round. Cost of the sealed backend's 4112-byte stride in the swap file, without the daemon or
the cipher: pwrite runs of 16 slots at slot * STRIDE, pread single slots back, punch-hole
single slots (the daemon's discard), STRIDE 4096 (plain) against 4112 (sealed), alternating.
An unnamed file in /var/tmp (like the daemon's default), 2 GiB of slots."""
import mmap, os, random, sys, time

SLOTS = 1 << 19  # 2 GiB of 4 KiB slots
OPS = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2
import ctypes
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]

def one(stride, seed):
    fd = os.open("/var/tmp", os.O_TMPFILE | os.O_RDWR, 0o600)
    rng = random.Random(seed)
    data = os.urandom(16 * stride)
    t_w = t_r = t_d = 0.0
    for i in range(OPS):
        s = rng.randrange(0, SLOTS - 16) & ~15
        t0 = time.perf_counter()
        os.pwrite(fd, data, s * stride)
        t1 = time.perf_counter()
        r = rng.randrange(0, SLOTS)
        os.pread(fd, stride, r * stride)
        t2 = time.perf_counter()
        d = rng.randrange(0, SLOTS)
        libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, d * stride, stride)
        t3 = time.perf_counter()
        t_w += t1 - t0; t_r += t2 - t1; t_d += t3 - t2
    os.close(fd)
    return t_w / (OPS * 16) * 1e6, t_r / OPS * 1e6, t_d / OPS * 1e6

res = {4096: [], 4112: []}
for rnd in range(6):
    for stride in ((4096, 4112) if rnd % 2 == 0 else (4112, 4096)):
        res[stride].append(one(stride, rnd))
for stride, v in res.items():
    for k, name in enumerate(["write us/page", "read us/slot", "punch us/slot"]):
        xs = sorted(x[k] for x in v)
        print(f"stride {stride}: {name}: median {xs[len(xs)//2]:.2f} [{xs[0]:.2f}, {xs[-1]:.2f}]")
