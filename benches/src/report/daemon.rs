//! Report section: not measured yet (filled in by its issue).

use super::{Options, Report};

/// Runs this section.
pub fn run(_opts: &Options) -> anyhow::Result<Report> {
    anyhow::bail!("this report section is not implemented yet")
}
