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
    /// Text-like, compresses 2-4x.
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
            w.to_ne_bytes()
                .iter()
                .copied()
                .cycle()
                .take(PAGE_SIZE)
                .collect()
        }
        Kind::Random => (0..PAGE_SIZE / 8)
            .flat_map(|_| next(&mut x).to_ne_bytes())
            .collect(),
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
    kinds
        .iter()
        .enumerate()
        .flat_map(|(i, &k)| page(k, seed.wrapping_add(i as u64 * 7919)))
        .collect()
}

pub fn is_same_filled(p: &[u8]) -> bool {
    p.chunks_exact(8).all(|c| c == &p[..8])
}
