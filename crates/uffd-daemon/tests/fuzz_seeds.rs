//! The fuzz corpus of the agent message decoder, replayed on the stable toolchain: every input
//! `cargo fuzz` kept for `fuzz/fuzz_targets/protocol_decode.rs` (minimised with `cargo fuzz
//! cmin`, in `fuzz/seeds/protocol_decode`) goes through the same entry point the fuzzer calls,
//! which panics on a decoder panic or on a message that does not survive re-encoding. CI cannot
//! run libFuzzer (it needs nightly), so this is the fuzzing CI does; `fuzz/README.md` says how
//! to grow the corpus.

use std::path::Path;

#[test]
fn protocol_decode_corpus_replays() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/protocol_decode");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        uffd_daemon::fuzz_protocol_decode(&data);
        n += 1;
    }
    // The corpus is there and is not a stub: cmin kept 33 inputs on 2026-11-27.
    assert!(n >= 20, "only {n} inputs in {}", dir.display());
}
