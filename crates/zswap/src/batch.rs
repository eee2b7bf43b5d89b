//! Persistent threads that compress parts of a large folio (the batching of the 2024 series,
//! made parallel). Spawning a thread per folio costs about 90 us on the machines measured, more
//! than compressing a 64 KiB folio with lz4; handing a part to a parked thread costs about 9 us.
//!
//! A worker gets a copy of its pages (so nothing it reads can be freed under it), compresses them
//! with its own reused context and sends back the compressed bytes; the storing thread allocates
//! the pool objects. A worker that cannot start or dies only makes the storing thread do that
//! part itself.

use crate::compress::{CodecError, Compressor, PageCodec, SCRATCH_SIZE};
use crate::pool::MAX_OBJECT;
use crate::PAGE_SIZE;
use std::sync::mpsc::{channel, Receiver, Sender};

/// What a worker made of one page.
#[derive(Debug)]
pub(crate) enum Part {
    /// One repeated word.
    Same { word: u64, crc: u32 },
    /// Compressed bytes at `off..off + len` of the reply's buffer.
    Compressed { off: usize, len: usize, crc: u32 },
}

/// Why a worker stopped early, at which page of the folio.
#[derive(Debug)]
pub(crate) enum PartError {
    Poor(usize),
    Codec(CodecError),
}

/// A worker's answer for one job.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) first_page: usize,
    pub(crate) parts: Vec<Part>,
    pub(crate) bytes: Vec<u8>,
    pub(crate) error: Option<(usize, PartError)>,
}

#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) first_page: usize,
    pub(crate) pages: Vec<u8>,
    pub(crate) reply: Sender<Reply>,
}

/// Settings a worker needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PageRules {
    pub(crate) crc: bool,
    pub(crate) same_filled: bool,
}

/// The persistent batch threads.
#[derive(Debug)]
pub(crate) struct BatchPool {
    senders: Vec<Sender<Job>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BatchPool {
    /// Starts `n` threads (none if `n` is 0 or a thread cannot be started).
    pub(crate) fn start(n: usize, compressor: Compressor, rules: PageRules) -> BatchPool {
        let mut pool = BatchPool {
            senders: Vec::new(),
            threads: Vec::new(),
        };
        for i in 0..n {
            let (tx, rx) = channel::<Job>();
            let spawned = std::thread::Builder::new()
                .name(format!("zswap-batch-{i}"))
                .spawn(move || worker(rx, compressor, rules));
            if let Ok(handle) = spawned {
                pool.senders.push(tx);
                pool.threads.push(handle);
            }
        }
        pool
    }

    /// Number of running threads.
    pub(crate) fn len(&self) -> usize {
        self.senders.len()
    }

    /// Hands `job` to thread `i % len`; gives it back if that thread is gone.
    pub(crate) fn submit(&self, i: usize, job: Job) -> Result<(), Job> {
        match self.senders.get(i % self.senders.len().max(1)) {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }
}

impl Drop for BatchPool {
    fn drop(&mut self) {
        self.senders.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn worker(rx: Receiver<Job>, compressor: Compressor, rules: PageRules) {
    let Ok(mut codec) = PageCodec::new(compressor) else {
        return;
    };
    let mut out = vec![0u8; SCRATCH_SIZE];
    for job in rx {
        let reply = compress_part(&mut codec, &mut out, rules, &job);
        // The storing thread may have given up on a panic of its own; nothing to do then.
        let _ = job.reply.send(reply);
    }
}

/// Compresses the pages of `job` (also used by the storing thread for a part no worker took).
pub(crate) fn compress_part(
    codec: &mut PageCodec,
    out: &mut [u8],
    rules: PageRules,
    job: &Job,
) -> Reply {
    let mut reply = Reply {
        first_page: job.first_page,
        parts: Vec::with_capacity(job.pages.len() / PAGE_SIZE),
        bytes: Vec::with_capacity(job.pages.len() / 2),
        error: None,
    };
    for (i, page) in job.pages.chunks_exact(PAGE_SIZE).enumerate() {
        let crc = if rules.crc { crc32c::crc32c(page) } else { 0 };
        if rules.same_filled {
            if let Some(word) = crate::store::same_filled_word(page) {
                reply.parts.push(Part::Same { word, crc });
                continue;
            }
        }
        match codec.compress(page, out) {
            Ok(n) if n > MAX_OBJECT => {
                reply.error = Some((job.first_page + i, PartError::Poor(n)));
                break;
            }
            Ok(n) => {
                reply.parts.push(Part::Compressed {
                    off: reply.bytes.len(),
                    len: n,
                    crc,
                });
                reply.bytes.extend_from_slice(&out[..n]);
            }
            Err(e) => {
                reply.error = Some((job.first_page + i, PartError::Codec(e)));
                break;
            }
        }
    }
    reply
}
