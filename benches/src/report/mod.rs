//! The report sections. Each returns the figures as JSON and a readable table.

pub mod daemon;
pub mod mglru;
pub mod shrinker;
pub mod swap_alloc;
pub mod swap_alloc_workload;
pub mod zswap;

/// Options shared by every section.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Short runs (seconds, not minutes); figures are noisier.
    pub quick: bool,
}

/// What a section measured.
#[derive(Debug)]
pub struct Report {
    /// Machine-readable figures; the keys are documented by each section.
    pub json: serde_json::Value,
    /// The same figures as a table for people.
    pub table: String,
}

/// A section's runner.
pub type Runner = fn(&Options) -> anyhow::Result<Report>;

/// The section names the report command accepts, with their runners.
pub const SECTIONS: &[(&str, Runner)] = &[
    ("swap-alloc", swap_alloc::run),
    ("zswap", zswap::run),
    ("shrinker", shrinker::run),
    ("mglru", mglru::run),
    ("daemon", daemon::run),
];
