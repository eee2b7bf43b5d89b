//! Fuzzes zswap's load path with corrupted pool contents and forged handles.
//!
//! The logic lives in `zswap::fuzzing::load_corrupted` so that a stable-toolchain proptest
//! (`crates/zswap/tests/corruption.rs`) runs it too; it panics if a load panics, or if a load
//! with CRC on succeeds with bytes other than those stored.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    zswap::fuzzing::load_corrupted(data);
});
