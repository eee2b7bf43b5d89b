//! `report <section>... [--quick] [--json]`: runs benchmark sections and prints a table or JSON.

use bench::report::{Options, SECTIONS};

fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(bench::report::daemon::CLIENT_ARG) {
        std::process::exit(bench::report::daemon::client_main(&argv[2..]));
    }
    let mut quick = false;
    let mut json = false;
    let mut names = Vec::new();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--quick" => quick = true,
            "--json" => json = true,
            "-h" | "--help" => {
                println!("usage: report <section>... [--quick] [--json]");
                println!(
                    "sections: {}",
                    SECTIONS.iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
                );
                return Ok(());
            }
            other if other.starts_with('-') => anyhow::bail!("unknown option {other:?}"),
            other => names.push(other.to_string()),
        }
    }
    if names.is_empty() {
        anyhow::bail!(
            "name at least one section: {}",
            SECTIONS.iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
        );
    }
    let opts = Options { quick };
    let mut out = serde_json::Map::new();
    for name in &names {
        let Some((_, runner)) = SECTIONS.iter().find(|s| s.0 == name) else {
            anyhow::bail!(
                "unknown section {name:?}; expected one of: {}",
                SECTIONS.iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
            );
        };
        let report = runner(&opts)?;
        if json {
            out.insert(name.clone(), report.json);
        } else {
            println!("== {name} ==\n{}", report.table);
        }
    }
    if json {
        let value = if names.len() == 1 {
            out.into_iter().next().map(|(_, v)| v).unwrap_or_default()
        } else {
            serde_json::Value::Object(out)
        };
        println!("{}", serde_json::to_string_pretty(&value)?);
    }
    Ok(())
}
