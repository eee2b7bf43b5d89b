"""Fills a redis-server with keys whose values are derived from their names, reads every key
back and compares, then shuts the server down. Speaks RESP over a raw socket (no client
library needed). Usage: redis_fill_check.py PORT NKEYS VALUE_BYTES"""
import hashlib
import socket
import sys
import time

port, nkeys, vbytes = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])


def value(i):
    seed = hashlib.sha256(b"key:%d" % i).digest()
    return (seed * (vbytes // len(seed) + 1))[:vbytes]


def connect():
    deadline = time.time() + 30
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=120)
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


def cmd(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


class Reader:
    def __init__(self, s):
        self.s, self.buf = s, b""

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise EOFError("redis closed the connection")
            self.buf += chunk
        l, self.buf = self.buf.split(b"\r\n", 1)
        return l

    def exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise EOFError("redis closed the connection")
            self.buf += chunk
        d, self.buf = self.buf[:n], self.buf[n + 2:]
        return d

    def reply(self):
        l = self.line()
        if l[:1] in (b"+", b":"):
            return l[1:]
        if l[:1] == b"-":
            raise RuntimeError(l.decode())
        if l[:1] == b"$":
            n = int(l[1:])
            return None if n < 0 else self.exact(n)
        if l[:1] == b"*":
            return [self.reply() for _ in range(int(l[1:]))]
        raise RuntimeError("bad reply %r" % l)


s = connect()
r = Reader(s)
batch = 500
for start in range(0, nkeys, batch):
    end = min(nkeys, start + batch)
    s.sendall(b"".join(cmd("SET", "key:%d" % i, value(i)) for i in range(start, end)))
    for _ in range(start, end):
        assert r.reply() == b"OK"
bad = 0
for start in range(0, nkeys, batch):
    end = min(nkeys, start + batch)
    s.sendall(cmd("MGET", *["key:%d" % i for i in range(start, end)]))
    vals = r.reply()
    for i, v in zip(range(start, end), vals):
        if v != value(i):
            bad += 1
s.sendall(cmd("DBSIZE"))
size = int(r.reply())
print("redis: %d keys of %d bytes, dbsize %d, %d bad" % (nkeys, vbytes, size, bad))
try:
    s.sendall(cmd("SHUTDOWN", "NOSAVE"))
    r.reply()
except (EOFError, OSError):
    pass
sys.exit(1 if bad or size != nkeys else 0)
