//! Builds the in-client agent (`agent/agent.c`) as a shared object that the daemon embeds and
//! writes out at run time, so that `cargo run -p uffd-daemon` needs nothing else.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let src = PathBuf::from("agent/agent.c");
    println!("cargo:rerun-if-changed={}", src.display());
    let so = out.join("libuffd_agent.so");
    let compiler = cc::Build::new().get_compiler();
    let status = Command::new(compiler.path())
        .args([
            "-O2",
            "-g",
            "-fPIC",
            "-shared",
            "-pthread",
            // Bind every symbol at load: a lazy binding in the agent thread would walk the
            // dynamic linker's link maps, which live in memory the daemon pages (agent.c).
            "-Wl,-z,now",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fvisibility=hidden",
            "-o",
        ])
        .arg(&so)
        .arg(&src)
        .status()
        .expect("running the C compiler for agent/agent.c");
    assert!(status.success(), "building agent/agent.c failed");
}
