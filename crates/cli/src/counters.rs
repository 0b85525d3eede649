//! `hugelab counters`: the counter registry, as a table of families or of
//! one family's fields.

use crate::table;
use anyhow::{bail, Result};
use clap::Args;
use hugelab_workload::counters::{Family, Field, Reported, FAMILIES};
use std::process::ExitCode;

#[derive(Args)]
pub struct CountersArgs {
    /// Print the whole registry as JSON.
    #[arg(long)]
    json: bool,
    /// A family (vmstat, mthp, smaps...): list its fields.
    family: Option<String>,
}

pub fn main(args: CountersArgs) -> Result<ExitCode> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(FAMILIES)?);
        return Ok(ExitCode::SUCCESS);
    }
    match args.family {
        None => print!("{}", families()),
        Some(name) => {
            // A family name may have more than one shape (memcg's files
            // and its memory.events fields): each is listed.
            let matching: Vec<_> = FAMILIES.iter().filter(|f| f.name == name).collect();
            if matching.is_empty() {
                let mut names: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
                names.dedup();
                bail!(
                    "no counter family '{name}'; the families are {}",
                    names.join(", ")
                );
            }
            for f in matching {
                print!("{}", fields(f));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn families() -> String {
    let header = ["family", "scope", "fields", "kinds", "units", "source"].map(String::from);
    let rows: Vec<Vec<String>> = FAMILIES
        .iter()
        .map(|f| {
            let mut kinds: Vec<String> = f.fields.iter().map(kind).collect();
            kinds.sort();
            kinds.dedup();
            let mut units: Vec<String> = f.fields.iter().map(|x| lower(x.unit)).collect();
            units.sort();
            units.dedup();
            vec![
                f.pattern.to_string(),
                lower(f.scope),
                f.fields.len().to_string(),
                kinds.join(", "),
                units.join(", "),
                f.source.to_string(),
            ]
        })
        .collect();
    table::render_text(&header, &rows)
}

fn fields(f: &Family) -> String {
    let header = ["counter", "kind", "unit", "bound in diff"].map(String::from);
    let rows: Vec<Vec<String>> = f
        .fields
        .iter()
        .map(|x| {
            let name = f
                .pattern
                .rsplit_once('.')
                .map_or(x.name.to_string(), |(p, _)| format!("{p}.{}", x.name));
            vec![
                name,
                kind(x),
                lower(x.unit),
                x.bound.map_or(String::new(), |b| {
                    format!("{}: {}", b.kind.describe(), b.why)
                }),
            ]
        })
        .collect();
    format!(
        "# {} ({})\n{}",
        f.pattern,
        f.source,
        table::render_text(&header, &rows)
    )
}

/// `event`, `gauge` or `gauge (since start)`.
fn kind(x: &Field) -> String {
    match (lower(x.kind).as_str(), x.reported) {
        ("gauge", Reported::SinceStart) => "gauge (since start)".to_string(),
        (k, _) => k.to_string(),
    }
}

/// A registry enum as its JSON spelling.
fn lower(v: impl serde::Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
