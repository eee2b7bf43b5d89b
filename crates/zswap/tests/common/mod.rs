//! Page generators shared by the integration tests.
#![allow(dead_code)]

use zswap::PAGE_SIZE;

/// xorshift64*: deterministic, no dependencies.
pub fn next(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// What a test page looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Text-like, compresses 2-4x. Under miri, runs of repeated bytes instead: there storing
    /// a page of short words with lz4 took 3.5 s and loading it 1.7 s, a page of runs about a
    /// third of that, and the store and load tests go through many pages of this kind.
    Compressible,
    /// One repeated word.
    Same,
    /// Random bytes: does not compress below a page.
    Random,
}

pub fn page(kind: Kind, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    match kind {
        Kind::Same => {
            let w = next(&mut x) % 3; // often zero, sometimes another word
            let w = if w == 0 { 0 } else { next(&mut x) };
            w.to_ne_bytes().repeat(PAGE_SIZE / 8)
        }
        Kind::Random => {
            let mut p = Vec::with_capacity(PAGE_SIZE);
            for _ in 0..PAGE_SIZE / 8 {
                p.extend_from_slice(&next(&mut x).to_ne_bytes());
            }
            p
        }
        Kind::Compressible if cfg!(miri) => {
            let mut p = vec![0u8; PAGE_SIZE];
            let mut pos = 0;
            while pos < PAGE_SIZE {
                let r = next(&mut x);
                let end = (pos + 1 + (r % 64) as usize).min(PAGE_SIZE);
                p[pos..end].fill((r >> 40) as u8);
                pos = end;
            }
            p
        }
        Kind::Compressible => {
            const WORDS: [&[u8]; 8] = [
                b"import ", b"self.", b"return ", b"None", b"  ", b"\n", b"page_", b"0123",
            ];
            let mut p = Vec::with_capacity(PAGE_SIZE + 16);
            while p.len() < PAGE_SIZE {
                let r = next(&mut x);
                p.extend_from_slice(WORDS[(r % 8) as usize]);
                if r % 5 == 0 {
                    p.push((r >> 40) as u8);
                }
            }
            p.truncate(PAGE_SIZE);
            p
        }
    }
}

pub fn folio(kinds: &[Kind], seed: u64) -> Vec<u8> {
    // Page by page, not byte by byte through iterator adapters: under miri that took as long
    // as storing the folio.
    let mut f = Vec::with_capacity(kinds.len() * PAGE_SIZE);
    for (i, &k) in kinds.iter().enumerate() {
        f.extend_from_slice(&page(k, seed.wrapping_add(i as u64 * 7919)));
    }
    f
}

pub fn is_same_filled(p: &[u8]) -> bool {
    p.chunks_exact(8).all(|c| c == &p[..8])
}
