//! Corrupt stored data and bad handles (forged or stale locations) give errors, never a panic
//! or, with CRC on, wrong bytes.
//! The proptest drives the same function as the cargo-fuzz target `zswap_load`.

mod common;

use common::{page, Kind};
use proptest::prelude::*;
use zswap::{Compressor, Config, LoadError, Zswap, PAGE_SIZE};

proptest! {
    // Under miri: 2 cases (each runs ~1000 times slower; 4 took 35 s of CPU there), and no
    // regression file (miri's isolation refuses file access).
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 2 } else { 256 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn fuzz_logic_on_random_inputs(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        zswap::fuzzing::load_corrupted(&data);
    }
}

#[test]
fn fuzz_logic_detects_damage() {
    // Deterministic inputs with CRC on and corruption triples: some loads must fail.
    let mut x = 7u64;
    let mut failed = 0;
    // Under miri a few rounds: each is ~1000x slower (8 took 47 s of CPU there).
    for _ in 0..if cfg!(miri) { 4 } else { 300 } {
        let data: Vec<u8> = (0..64)
            .map(|_| (common::next(&mut x) >> 24) as u8)
            .collect();
        let mut data = data;
        data[0] |= 0x80;
        failed += zswap::fuzzing::load_corrupted(&data);
    }
    assert!(failed > 0);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "zstd is a C library: miri cannot call foreign functions (zstd is one of the compressors it tries)"
)]
fn every_single_byte_flip_is_caught_with_crc() {
    for compressor in [
        Compressor::Lz4,
        Compressor::Zstd { level: 1 },
        Compressor::Deflate { level: 6 },
    ] {
        let p = page(Kind::Compressible, 42);
        let mut caught = 0;
        for offset in (0..PAGE_SIZE).step_by(97) {
            let zswap = Zswap::new(Config::new(compressor)).expect("store");
            zswap.store(7, &p).expect("store");
            assert!(zswap.debug_corrupt(7, offset, 0x5a));
            let mut out = vec![0u8; PAGE_SIZE];
            match zswap.load(7, &mut out) {
                Ok(()) => assert_eq!(
                    out, p,
                    "{compressor:?}: wrong bytes after a flip at {offset}"
                ),
                Err(LoadError::Corrupt { entry, .. } | LoadError::CrcMismatch { entry, .. }) => {
                    assert_eq!(entry, 7);
                    caught += 1;
                    assert!(zswap.contains(7), "a failed load keeps the entry");
                    assert_eq!(zswap.stats().decompress_fail, 1);
                    assert_eq!(zswap.invalidate(7, 1), 1);
                    zswap.check_integrity().expect("consistent");
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
        assert!(caught > 0, "{compressor:?}: no corruption detected at all");
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "zstd is a C library: miri cannot call foreign functions (zstd is one of the compressors it tries)"
)]
fn byte_flips_in_a_multi_page_object_are_caught_with_crc() {
    for compressor in [
        Compressor::Lz4,
        Compressor::Zstd { level: 1 },
        Compressor::Deflate { level: 6 },
    ] {
        let data = common::folio(&[Kind::Compressible; 16], 42);
        let mut caught = 0;
        for offset in (0..16 * PAGE_SIZE).step_by(1499) {
            let zswap = Zswap::new(Config::new(compressor)).expect("store");
            zswap.store(32, &data).expect("store");
            assert!(zswap.debug_is_multi_page(35));
            assert!(zswap.debug_corrupt(35, offset, 0x5a));
            let mut out = vec![0u8; PAGE_SIZE];
            match zswap.load(35, &mut out) {
                Ok(()) => assert!(
                    out[..] == data[3 * PAGE_SIZE..4 * PAGE_SIZE],
                    "{compressor:?}: wrong bytes after a flip at {offset}"
                ),
                Err(LoadError::Corrupt { entry, .. } | LoadError::CrcMismatch { entry, .. }) => {
                    assert_eq!(entry, 35);
                    caught += 1;
                    assert!(zswap.contains(35), "a failed load keeps the entry");
                    // The whole folio load fails too, and leaves every entry.
                    let mut all = vec![0u8; 16 * PAGE_SIZE];
                    assert!(zswap.load(32, &mut all).is_err());
                    assert_eq!(zswap.stats().stored_pages, 16);
                    assert_eq!(zswap.invalidate(32, 16), 16);
                    assert_eq!(zswap.stats().pool_total_size, 0);
                    zswap.check_integrity().expect("consistent");
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
        assert!(caught > 0, "{compressor:?}: no corruption detected at all");
    }
}

#[test]
fn forged_and_stale_handles_are_errors() {
    let zswap = Zswap::new(Config::new(Compressor::Lz4)).expect("store");
    let a = page(Kind::Compressible, 1);
    let b = page(Kind::Compressible, 2);
    zswap.store(1, &a).expect("store");
    zswap.store(2, &b).expect("store");
    let hb = zswap.debug_handle(2).expect("compressed");
    let mut out = vec![0u8; PAGE_SIZE];
    // Entry 1 now names entry 2's object: CRC catches the swap.
    zswap.debug_set_handle(1, hb.raw());
    assert!(matches!(
        zswap.load(1, &mut out),
        Err(LoadError::CrcMismatch { entry: 1, .. })
    ));
    // The right object with a wrong length: a prefix, or bytes past it within its slot.
    for len in [1, hb.len() - 1, hb.len() + 1, hb.len() + 15] {
        zswap.debug_set_handle(1, hb.with_len(len).raw());
        match zswap.load(1, &mut out) {
            Err(LoadError::Corrupt { entry: 1, .. } | LoadError::CrcMismatch { entry: 1, .. }) => {}
            // Longer than the object's slot: the pool refuses it.
            Err(LoadError::Pool { entry: 1, .. }) => {}
            other => panic!("length {len}: {other:?}"),
        }
    }
    // A stale location: the object was freed (the slot is free, an error)...
    zswap.store(3, &page(Kind::Compressible, 3)).expect("store");
    let stale = zswap.debug_handle(3).expect("compressed");
    assert_eq!(zswap.invalidate(3, 1), 1);
    zswap.debug_set_handle(1, stale.raw());
    assert!(matches!(
        zswap.load(1, &mut out),
        Err(LoadError::Pool { entry: 1, .. })
    ));
    // ... then its slot taken by another page: CRC tells (no generation does any more).
    zswap.store(4, &page(Kind::Compressible, 3)).expect("store");
    assert_eq!(zswap.debug_handle(4).map(|h| h.slot()), Some(stale.slot()));
    assert!(matches!(
        zswap.load(1, &mut out),
        Err(LoadError::CrcMismatch { entry: 1, .. })
    ));
    // The neighbouring slot: another object (entry 1's own, leaked by the forging) or none.
    zswap.debug_set_handle(1, hb.raw() ^ (1 << 12));
    assert!(zswap.load(1, &mut out).is_err());
    // Spans and classes that hold nothing, bits above a handle, garbage.
    for raw in [hb.raw() + (1 << 23), hb.raw() | (1 << 60), u64::MAX, 0] {
        zswap.debug_set_handle(1, raw);
        assert!(
            matches!(
                zswap.load(1, &mut out),
                Err(LoadError::Pool { entry: 1, .. })
            ),
            "{raw:#x}"
        );
    }
    // Entries 2 and 4 are untouched.
    zswap.load(2, &mut out).expect("load");
    assert_eq!(out, b);
    zswap.load(4, &mut out).expect("load");
    assert_eq!(out, page(Kind::Compressible, 3));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "zstd is a C library: miri cannot call foreign functions"
)]
fn crc_off_still_never_panics() {
    let mut c = Config::new(Compressor::Zstd { level: 1 });
    c.crc = false;
    let zswap = Zswap::new(c).expect("store");
    let p = page(Kind::Compressible, 9);
    let mut out = vec![0u8; PAGE_SIZE];
    for offset in 0..64 {
        zswap.store(3, &p).expect("store");
        zswap.debug_corrupt(3, offset * 31, 0xff);
        let _ = zswap.load(3, &mut out);
        zswap.invalidate(3, 1);
    }
}
