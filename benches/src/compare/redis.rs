//! A small RESP client for the `redis` workload: fills a server with keys whose 2 KiB values
//! are derived from their names (so every value can be checked), runs `redis-benchmark -t get`
//! over the same keys, reads every key back and compares it, and shuts the server down.
//!
//! Keys are `key:%012d`, the names `redis-benchmark -r N` generates, so its GETs hit the filled
//! keys. Values compress about 3:1 (a third pseudo-random, the rest a repeated motif), like the
//! pages of `usemem`.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// Keys per pipelined batch.
const BATCH: usize = 256;

/// The name of key `i`, as `redis-benchmark -r` writes it.
pub fn key(i: u64) -> String {
    format!("key:{i:012}")
}

/// The value of key `i`: `len` bytes, the key's number in the first 8, then a third
/// pseudo-random, then a 64-byte motif repeated.
pub fn value(i: u64, len: usize) -> Vec<u8> {
    let mut s = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED;
    let mut next = || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut v = Vec::with_capacity(len + 8);
    v.extend_from_slice(&i.to_le_bytes());
    while v.len() < len / 3 {
        v.extend_from_slice(&next().to_le_bytes());
    }
    let motif: Vec<u8> = (0..8).flat_map(|_| next().to_le_bytes()).collect();
    while v.len() < len {
        v.extend_from_slice(&motif);
    }
    v.truncate(len);
    v
}

fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// A reply: simple string/integer as text, a bulk string, or nil.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Simple(String),
    Bulk(Vec<u8>),
    Nil,
}

struct Conn {
    r: BufReader<UnixStream>,
    w: UnixStream,
}

impl Conn {
    fn connect(sock: &Path, timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        loop {
            match UnixStream::connect(sock) {
                Ok(s) => {
                    s.set_read_timeout(Some(Duration::from_secs(120)))?;
                    let w = s.try_clone()?;
                    let mut c = Conn {
                        r: BufReader::with_capacity(1 << 20, s),
                        w,
                    };
                    // The socket exists before the server is ready for commands: ping it.
                    let mut buf = Vec::new();
                    command(&mut buf, &[b"PING"]);
                    c.w.write_all(&buf)?;
                    if c.reply()? == Reply::Simple("PONG".into()) {
                        return Ok(c);
                    }
                }
                Err(e) if Instant::now() > deadline => {
                    return Err(e).with_context(|| format!("connect to {}", sock.display()))
                }
                Err(_) => {}
            }
            if super::proc::interrupted() {
                bail!("interrupted");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn reply(&mut self) -> Result<Reply> {
        let mut line = Vec::new();
        self.r.read_until(b'\n', &mut line)?;
        if line.len() < 3 || !line.ends_with(b"\r\n") {
            bail!(
                "redis closed the connection or sent a short line: {:?}",
                String::from_utf8_lossy(&line)
            );
        }
        let body = &line[1..line.len() - 2];
        match line[0] {
            b'+' | b':' => Ok(Reply::Simple(String::from_utf8_lossy(body).into_owned())),
            b'-' => bail!("redis error: {}", String::from_utf8_lossy(body)),
            b'$' => {
                let n: i64 = std::str::from_utf8(body)?.parse()?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let mut d = vec![0; n as usize + 2];
                self.r.read_exact(&mut d)?;
                d.truncate(n as usize);
                Ok(Reply::Bulk(d))
            }
            c => bail!("unexpected reply type {:?}", c as char),
        }
    }
}

/// What one session measured.
#[derive(Debug, Default)]
pub struct Session {
    /// SETs per second while filling.
    pub set_rps: f64,
    /// GETs per second reported by redis-benchmark.
    pub get_rps: f64,
    /// redis-benchmark's GET latency p50 and p99, microseconds.
    pub get_p50_us: Option<f64>,
    /// See `get_p50_us`.
    pub get_p99_us: Option<f64>,
    /// Seconds spent reading every key back and comparing.
    pub check_s: f64,
    /// Keys compared.
    pub checked: u64,
    /// Keys whose value differed or was missing, and the first of them described.
    pub bad: u64,
    /// Description of the first bad key.
    pub first_bad: Option<String>,
}

/// Fill, benchmark, check, shut down. `keys` keys of `vbytes` bytes; `gets` requests for
/// redis-benchmark.
pub fn session(sock: &Path, keys: u64, vbytes: usize, gets: u64) -> Result<Session> {
    let mut c = Conn::connect(sock, Duration::from_secs(60))?;
    let mut s = Session::default();

    let t = Instant::now();
    let mut buf = Vec::with_capacity(BATCH * (vbytes + 64));
    let mut i = 0;
    while i < keys {
        let end = (i + BATCH as u64).min(keys);
        buf.clear();
        for k in i..end {
            command(&mut buf, &[b"SET", key(k).as_bytes(), &value(k, vbytes)]);
        }
        c.w.write_all(&buf)?;
        for k in i..end {
            let r = c.reply()?;
            if r != Reply::Simple("OK".into()) {
                bail!("SET {} answered {r:?}", key(k));
            }
        }
        i = end;
        if super::proc::interrupted() {
            bail!("interrupted");
        }
    }
    s.set_rps = keys as f64 / t.elapsed().as_secs_f64();

    let out = Command::new("redis-benchmark")
        .args([
            "-s",
            &sock.display().to_string(),
            "-t",
            "get",
            "-n",
            &gets.to_string(),
        ])
        .args([
            "-r",
            &keys.to_string(),
            "-d",
            &vbytes.to_string(),
            "-c",
            "16",
            "--csv",
        ])
        .output()
        .context("run redis-benchmark")?;
    if !out.status.success() {
        bail!(
            "redis-benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let csv = String::from_utf8_lossy(&out.stdout);
    let (rps, p50, p99) = parse_benchmark_csv(&csv)
        .ok_or_else(|| anyhow!("no GET line in redis-benchmark's output: {csv}"))?;
    s.get_rps = rps;
    s.get_p50_us = p50;
    s.get_p99_us = p99;

    let t = Instant::now();
    let mut i = 0;
    while i < keys {
        let end = (i + BATCH as u64).min(keys);
        buf.clear();
        for k in i..end {
            command(&mut buf, &[b"GET", key(k).as_bytes()]);
        }
        c.w.write_all(&buf)?;
        for k in i..end {
            let r = c.reply()?;
            s.checked += 1;
            let ok = matches!(&r, Reply::Bulk(v) if *v == value(k, vbytes));
            if !ok {
                s.bad += 1;
                if s.first_bad.is_none() {
                    let what = match &r {
                        Reply::Nil => "missing".to_string(),
                        Reply::Bulk(v) => {
                            let want = value(k, vbytes);
                            let at = v.iter().zip(&want).position(|(a, b)| a != b);
                            format!("{} bytes, first difference at byte {at:?}", v.len())
                        }
                        Reply::Simple(x) => format!("reply {x}"),
                    };
                    s.first_bad = Some(format!("{}: {what}", key(k)));
                }
            }
        }
        i = end;
        if super::proc::interrupted() {
            bail!("interrupted");
        }
    }
    s.check_s = t.elapsed().as_secs_f64();

    buf.clear();
    command(&mut buf, &[b"SHUTDOWN", b"NOSAVE"]);
    c.w.write_all(&buf)?;
    // The server closes the connection as it exits; an error reply would mean it refused.
    let mut rest = Vec::new();
    let _ = c.r.read_to_end(&mut rest);
    if rest.starts_with(b"-") {
        bail!("SHUTDOWN refused: {}", String::from_utf8_lossy(&rest));
    }
    Ok(s)
}

/// Parses `redis-benchmark --csv` for the GET line: (rps, p50 us, p99 us).
pub fn parse_benchmark_csv(csv: &str) -> Option<(f64, Option<f64>, Option<f64>)> {
    let mut header: Vec<String> = Vec::new();
    for line in csv.lines() {
        let cols: Vec<String> = line
            .split(',')
            .map(|c| c.trim().trim_matches('"').to_string())
            .collect();
        if cols.first().map(String::as_str) == Some("test") {
            header = cols;
            continue;
        }
        if cols.first().map(String::as_str) == Some("GET") {
            let col = |name: &str| -> Option<f64> {
                let i = header.iter().position(|h| h == name)?;
                cols.get(i)?.parse().ok()
            };
            let rps = col("rps").or_else(|| cols.get(1)?.parse().ok())?;
            return Some((
                rps,
                col("p50_latency_ms").map(|v| v * 1000.0),
                col("p99_latency_ms").map(|v| v * 1000.0),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_distinct_and_sized() {
        assert_eq!(value(1, 2048).len(), 2048);
        assert_ne!(value(1, 2048), value(2, 2048));
        assert_eq!(value(5, 2048), value(5, 2048));
        assert_eq!(key(42), "key:000000000042");
    }

    #[test]
    fn parses_benchmark_csv() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\
                   \"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                   \"GET\",\"51282.05\",\"0.170\",\"0.040\",\"0.159\",\"0.287\",\"0.391\",\"1.159\"\n";
        let (rps, p50, p99) = parse_benchmark_csv(csv).unwrap();
        assert_eq!(rps, 51282.05);
        assert!((p50.unwrap() - 159.0).abs() < 1e-9);
        assert!((p99.unwrap() - 391.0).abs() < 1e-9);
        assert_eq!(parse_benchmark_csv("nothing"), None);
    }
}
