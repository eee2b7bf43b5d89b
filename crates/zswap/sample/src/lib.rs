//! Page data for the benchmarks, taken from real processes at benchmark time: the anonymous
//! memory of a `python3` that has imported much of the standard library and of a `redis-server`
//! filled by `redis-benchmark`, read through `/proc/PID/maps` and `/proc/PID/mem`. Nothing is
//! written to disk. When those programs are absent, a clearly labelled synthetic mix is used.
//!
//! **Benchmark support, not for embedding** (`publish = false`; it was `zswap::sample`): zswap's
//! criterion benches take it as a dev-dependency and the report command
//! (`benches/src/report/zswap.rs`) as a dependency, so that spawning python3 and redis never
//! compiles into the store.
#![warn(unreachable_pub)]
#![deny(missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zswap::PAGE_SIZE;

/// Pages captured for a benchmark run.
#[derive(Debug, Default)]
pub struct Sample {
    /// Page contents, `PAGE_SIZE` bytes each, all-zero pages left out.
    pub pages: Vec<u8>,
    /// (source, pages taken from it).
    pub sources: Vec<(String, usize)>,
    /// All-zero pages skipped (unpopulated or zeroed memory).
    pub zero_pages_skipped: usize,
    /// Problems met (a program missing, a read failing); empty when all went well.
    pub notes: Vec<String>,
    /// True when the data is the synthetic fallback, not real process memory.
    pub synthetic: bool,
}

impl Sample {
    /// Number of pages.
    pub fn nr_pages(&self) -> usize {
        self.pages.len() / PAGE_SIZE
    }
}

/// Kills and reaps a child we started, whatever happens.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const PYTHON_SCRIPT: &str = r#"
import sys, os, json, re, collections, decimal, fractions, datetime, email, email.parser, http.client
import http.server, urllib.request, xml.dom.minidom, xml.etree.ElementTree, sqlite3, asyncio, unittest
import argparse, logging, csv, difflib, textwrap, pickle, inspect, ast, dis, tokenize, typing, dataclasses
import statistics, random, string, hashlib, base64, zipfile, tarfile, configparser, pprint, heapq, bisect
words = [w for w in dir(__builtins__)] + list(sys.modules)
data = {i: (str(i) * 3, words[i % len(words)], i * 1.5) for i in range(120000)}
text = [json.dumps({"id": i, "name": words[i % len(words)], "tags": [i % 7, i % 11]}) for i in range(40000)]
print("ready", flush=True)
sys.stdin.read()
"#;

/// Reads the private anonymous, writable mappings of `pid` (`[heap]` and unnamed), up to
/// `max_pages` non-zero pages. Returns (pages, zero pages skipped).
pub fn read_anon_pages(pid: u32, max_pages: usize) -> std::io::Result<(Vec<u8>, usize)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))?;
    let mut out = Vec::new();
    let mut zero = 0;
    let mut buf = vec![0u8; 64 * PAGE_SIZE];
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms), Some(_off), Some(_dev), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path = f.next().unwrap_or("");
        if !perms.starts_with("rw") || !perms.ends_with('p') || inode != "0" {
            continue;
        }
        if !(path.is_empty() || path == "[heap]") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let mut addr = start;
        while addr < end && out.len() / PAGE_SIZE < max_pages {
            let n = ((end - addr) as usize).min(buf.len());
            if mem.read_exact_at(&mut buf[..n], addr).is_err() {
                addr += n as u64;
                continue;
            }
            for page in buf[..n].chunks_exact(PAGE_SIZE) {
                if page.iter().all(|&b| b == 0) {
                    zero += 1;
                } else if out.len() / PAGE_SIZE < max_pages {
                    out.extend_from_slice(page);
                }
            }
            addr += n as u64;
        }
    }
    Ok((out, zero))
}

fn capture_python(max_pages: usize, s: &mut Sample) -> Result<(), String> {
    let child = Command::new("python3")
        .arg("-c")
        .arg(PYTHON_SCRIPT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("python3: {e}"))?;
    let mut child = Reaped(child);
    let stdout = child.0.stdout.take().ok_or("python3: no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| format!("python3: {e}"))?;
    if line.trim() != "ready" {
        return Err(format!("python3 did not start: {line:?}"));
    }
    let (pages, zero) =
        read_anon_pages(child.0.id(), max_pages).map_err(|e| format!("python3 memory: {e}"))?;
    // Closing stdin lets the script end; `Reaped` kills and reaps it in any case.
    drop(child.0.stdin.take());
    s.sources
        .push(("python3 (stdlib imported)".into(), pages.len() / PAGE_SIZE));
    s.zero_pages_skipped += zero;
    s.pages.extend_from_slice(&pages);
    Ok(())
}

fn capture_redis(max_pages: usize, requests: usize, s: &mut Sample) -> Result<(), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let server = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("redis-server: {e}"))?;
    let server = Reaped(server);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let mut pong = [0u8; 7];
            if c.write_all(b"PING\r\n").is_ok()
                && c.read_exact(&mut pong).is_ok()
                && &pong == b"+PONG\r\n"
            {
                break;
            }
        }
        if Instant::now() > deadline {
            return Err("redis-server did not answer PING".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-q",
            "-n",
            &requests.to_string(),
        ])
        .args([
            "-r",
            "200000",
            "-d",
            "96",
            "-t",
            "set,lpush,sadd,hset,zadd,rpush",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("redis-benchmark: {e}"))?;
    if !status.success() {
        return Err(format!("redis-benchmark failed: {status}"));
    }
    let (pages, zero) =
        read_anon_pages(server.0.id(), max_pages).map_err(|e| format!("redis memory: {e}"))?;
    s.sources.push((
        format!("redis-server after redis-benchmark -n {requests}"),
        pages.len() / PAGE_SIZE,
    ));
    s.zero_pages_skipped += zero;
    s.pages.extend_from_slice(&pages);
    Ok(())
}

/// A synthetic mix standing in for process memory: text-like runs, small integers, pointers
/// and some random bytes. Only used when the real programs are missing, and labelled so.
pub fn synthetic(nr_pages: usize) -> Vec<u8> {
    let mut x = 0x243f_6a88_85a3_08d3u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = Vec::with_capacity(nr_pages * PAGE_SIZE);
    for i in 0..nr_pages {
        let mut page = Vec::with_capacity(PAGE_SIZE);
        while page.len() < PAGE_SIZE {
            let r = next();
            match (r >> 60) % 4 {
                0 => page.extend_from_slice(b"self.value = None; return "),
                1 => page.extend_from_slice(&(r % 1000).to_le_bytes()),
                2 => page.extend_from_slice(&(0x5555_0000_0000u64 + (r & 0xfff8)).to_le_bytes()),
                _ if i % 8 == 0 => page.extend_from_slice(&r.to_le_bytes()),
                _ => page.extend_from_slice(&[0u8; 16]),
            }
        }
        page.truncate(PAGE_SIZE);
        out.extend_from_slice(&page);
    }
    out
}

/// Captures up to `max_pages_per_source` pages from python3 and from redis-server; falls back to
/// a synthetic mix (flagged in [`Sample::synthetic`]) only when neither yields pages.
pub fn capture(max_pages_per_source: usize, redis_requests: usize) -> Sample {
    let mut s = Sample::default();
    if let Err(e) = capture_python(max_pages_per_source, &mut s) {
        s.notes.push(e);
    }
    if let Err(e) = capture_redis(max_pages_per_source, redis_requests, &mut s) {
        s.notes.push(e);
    }
    if s.pages.is_empty() {
        s.synthetic = true;
        s.pages = synthetic(2 * max_pages_per_source);
        s.sources.push((
            "SYNTHETIC mix (python3/redis-server unavailable)".into(),
            2 * max_pages_per_source,
        ));
    }
    s
}
