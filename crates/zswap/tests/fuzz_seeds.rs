//! The fuzz corpus of zswap's load path, replayed on the stable toolchain: every input `cargo
//! fuzz` kept for `fuzz/fuzz_targets/zswap_load.rs` (minimised with `cargo fuzz cmin`, in
//! `fuzz/seeds/zswap_load`) goes through `zswap::fuzzing::load_corrupted`, which panics if a
//! load of corrupted pool contents or a forged handle panics, or returns bytes other than those
//! stored with CRC on. CI cannot run libFuzzer (it needs nightly): this is the fuzzing CI does.

use std::path::Path;

#[test]
#[cfg_attr(
    miri,
    ignore = "reads the corpus directory, which miri's isolation refuses (and its 865 inputs, at about 10 s each there, would take over two hours); tests/corruption.rs runs the same function on random inputs under miri"
)]
fn zswap_load_corpus_replays() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/zswap_load");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        zswap::fuzzing::load_corrupted(&data);
        n += 1;
    }
    // cmin kept 865 inputs on 2026-11-27.
    assert!(n >= 500, "only {n} inputs in {}", dir.display());
}
