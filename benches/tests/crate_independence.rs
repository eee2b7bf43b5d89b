//! The library crates stay independent: `swap-alloc`, `zswap`, `shrinker` and `mglru` depend on
//! none of each other and never on the daemon (`uffd-daemon`), in any kind of dependency
//! (normal, build or dev). The one exception: a library may take its *own* test-support crate
//! (a `publish = false` package under its directory, such as `crates/swap-alloc/baseline`) as a
//! dev-dependency, or itself (to switch a test-only feature on). A test-support crate in turn
//! depends on no library but its own, and no library takes one as a normal or build dependency.
//!
//! Read from `cargo metadata --format-version 1 --no-deps`, the manifests as written.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The embeddable library crates.
const LIBRARIES: [&str; 4] = ["swap-alloc", "zswap", "shrinker", "mglru"];
/// What no library may depend on, besides each other.
const DAEMON: &str = "uffd-daemon";

#[derive(Debug)]
struct Package {
    name: String,
    dir: PathBuf,
    publish_false: bool,
    /// (dependency name, kind: "normal", "dev" or "build").
    deps: Vec<(String, String)>,
}

fn workspace_packages() -> Vec<Package> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(&root)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| Package {
            name: p["name"].as_str().expect("name").to_string(),
            dir: Path::new(p["manifest_path"].as_str().expect("manifest_path"))
                .parent()
                .expect("manifest's directory")
                .to_path_buf(),
            // `publish = false` reads as an empty list of registries.
            publish_false: p["publish"].as_array().is_some_and(Vec::is_empty),
            deps: p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .map(|d| {
                    (
                        d["name"].as_str().expect("dependency name").to_string(),
                        d["kind"].as_str().unwrap_or("normal").to_string(),
                    )
                })
                .collect(),
        })
        .collect()
}

/// The library whose test-support crate `p` is, if it is one: a `publish = false` package in
/// a subdirectory of that library's directory.
fn support_of<'a>(p: &Package, libraries: &'a [&Package]) -> Option<&'a str> {
    libraries
        .iter()
        .find(|lib| p.publish_false && p.dir != lib.dir && p.dir.starts_with(&lib.dir))
        .map(|lib| lib.name.as_str())
}

#[test]
fn library_crates_depend_on_none_of_each_other_nor_on_the_daemon() {
    let packages = workspace_packages();
    let libraries: Vec<&Package> = LIBRARIES
        .iter()
        .map(|name| {
            packages
                .iter()
                .find(|p| p.name == *name)
                .unwrap_or_else(|| panic!("library crate {name} is not in the workspace"))
        })
        .collect();
    let support: Vec<(&Package, &str)> = packages
        .iter()
        .filter_map(|p| support_of(p, &libraries).map(|lib| (p, lib)))
        .collect();
    let mut problems = Vec::new();

    for lib in &libraries {
        for (dep, kind) in &lib.deps {
            if dep == &lib.name {
                // A dev-dependency on itself, to turn a test-only feature on.
                if kind != "dev" {
                    problems.push(format!(
                        "{} depends on itself as a {kind} dependency",
                        lib.name
                    ));
                }
                continue;
            }
            if LIBRARIES.contains(&dep.as_str()) || dep == DAEMON {
                problems.push(format!("{} has a {kind} dependency on {dep}", lib.name));
            }
            if let Some((_, owner)) = support.iter().find(|(s, _)| &s.name == dep) {
                if *owner != lib.name {
                    problems.push(format!(
                        "{} depends on {dep}, the test-support crate of {owner}",
                        lib.name
                    ));
                } else if kind != "dev" {
                    problems.push(format!(
                        "{} takes its test-support crate {dep} as a {kind} dependency \
                         (allowed only as a dev-dependency)",
                        lib.name
                    ));
                }
            }
        }
    }
    for (s, owner) in &support {
        for (dep, kind) in &s.deps {
            if (LIBRARIES.contains(&dep.as_str()) && dep != owner) || dep == DAEMON {
                problems.push(format!(
                    "test-support crate {} (of {owner}) has a {kind} dependency on {dep}",
                    s.name
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the library crates must stay independent:\n  {}",
        problems.join("\n  ")
    );
}

/// The rule above only means something if it sees the crates it is about.
#[test]
fn the_check_sees_the_test_support_crates() {
    let packages = workspace_packages();
    let libraries: Vec<&Package> = packages
        .iter()
        .filter(|p| LIBRARIES.contains(&p.name.as_str()))
        .collect();
    assert_eq!(libraries.len(), LIBRARIES.len());
    let support: Vec<(&str, &str)> = packages
        .iter()
        .filter_map(|p| support_of(p, &libraries).map(|lib| (p.name.as_str(), lib)))
        .collect();
    assert!(
        support.contains(&("swap-alloc-baseline", "swap-alloc")),
        "{support:?}"
    );
    assert!(support.contains(&("zswap-sample", "zswap")), "{support:?}");
}
