//! Cross-crate benchmarks and workload drivers.
//!
//! Every figure here is measured side by side, in one run, with the baseline the issue names.
//! `cargo run --release -p bench --bin report -- <section> [--quick] [--json]` runs one section;
//! each section lives in its own module under `report/`.

pub mod compare;
pub mod metadata;
pub mod report;
