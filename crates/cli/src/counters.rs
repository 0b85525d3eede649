//! `hugelab counters`: the counter registry, as a table of families or of
//! one family's fields, a line each with what it means.

use crate::table;
use anyhow::{bail, Result};
use clap::Args;
use hugelab_workload::counters::{CounterKind, Family, Field, Reported, FAMILIES};
use std::process::ExitCode;

#[derive(Args)]
pub struct CountersArgs {
    /// Print the registry (or the family's part of it) as JSON.
    #[arg(long)]
    json: bool,
    /// A family (vmstat, mthp, smaps...): list its fields.
    family: Option<String>,
}

pub fn main(args: CountersArgs) -> Result<ExitCode> {
    // A family name may have more than one shape (memcg's files and its
    // memory.events fields): each is listed.
    let matching: Vec<&Family> = match &args.family {
        None => FAMILIES.iter().collect(),
        Some(name) => FAMILIES.iter().filter(|f| f.name == name).collect(),
    };
    if let (Some(name), true) = (&args.family, matching.is_empty()) {
        let mut names: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
        names.dedup();
        bail!(
            "no counter family '{name}'; the families are {}",
            names.join(", ")
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&matching)?);
        return Ok(ExitCode::SUCCESS);
    }
    match args.family {
        None => print!("{}", families()),
        Some(_) => {
            let parts: Vec<String> = matching.iter().map(|f| fields(f)).collect();
            print!("{}", parts.join("\n"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The widest line the word-wrapped notes take.
const WIDTH: usize = 100;

/// `text` wrapped at word boundaries to `WIDTH`: the first line after
/// `first`, the others after `indent` spaces.
fn wrap(first: &str, text: &str, indent: usize) -> String {
    let lines = table::wrap(text, WIDTH - first.chars().count(), WIDTH - indent);
    format!(
        "{first}{}\n",
        lines.join(&format!("\n{}", " ".repeat(indent)))
    )
}

/// A table of the families (what their names look like, their kinds and
/// units), then where the kernel keeps each family, a line each.
fn families() -> String {
    let header = ["family", "scope", "fields", "kinds", "units"].map(String::from);
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
            ]
        })
        .collect();
    let mut out = table::render_text(&header, &rows);
    out.push_str("\nwhere the kernel keeps them:\n");
    for f in FAMILIES {
        out.push_str(&wrap("  ", &format!("{}: {}", f.pattern, f.source), 4));
    }
    out.push_str(KIND_NOTE);
    out.push_str("`hugelab counters FAMILY` lists a family's counters and what each means.\n");
    out
}

/// What `gauge*` means, under every table that uses it.
const KIND_NOTE: &str = "gauge*: a machine-wide gauge, reported as its change since the workload \
                         started\n";

/// A family's counters, a line each with its meaning, then the bounds
/// `hugelab diff` compares some of them with, each bound once.
fn fields(f: &Family) -> String {
    let header = ["counter", "kind", "unit", "meaning"].map(String::from);
    let name = |x: &Field| {
        f.pattern
            .rsplit_once('.')
            .map_or(x.name.to_string(), |(p, _)| format!("{p}.{}", x.name))
    };
    let rows: Vec<Vec<String>> = f
        .fields
        .iter()
        .map(|x| vec![name(x), kind(x), lower(x.unit), x.what.to_string()])
        .collect();
    let title = format!("{} ({}): {}", f.pattern, lower(f.scope), f.source);
    let mut out = wrap("# ", &title, 2);
    out.push_str(&table::render_text(&header, &rows));
    if f.fields
        .iter()
        .any(|x| x.reported == Reported::SinceStart && x.kind != CounterKind::Event)
    {
        out.push_str(KIND_NOTE);
    }
    // Fields with the same reason, together: "a, b: kind: why", or "a
    // (kind), b (kind): why" when their bounds differ.
    let mut bounds: Vec<(&str, Vec<(&str, String)>)> = Vec::new();
    for x in f.fields {
        let Some(b) = x.bound else { continue };
        let named = (x.name, b.kind.describe());
        match bounds.iter_mut().find(|(why, _)| *why == b.why) {
            Some((_, names)) => names.push(named),
            None => bounds.push((b.why, vec![named])),
        }
    }
    if !bounds.is_empty() {
        out.push_str("bounds `hugelab diff` compares the kernel with the model by:\n");
        for (why, names) in bounds {
            let one_kind = names.iter().all(|(_, k)| *k == names[0].1);
            let text = if one_kind {
                let list: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
                format!("{}: {}: {why}", list.join(", "), names[0].1)
            } else {
                let list: Vec<String> = names.iter().map(|(n, k)| format!("{n} ({k})")).collect();
                format!("{}: {why}", list.join(", "))
            };
            out.push_str(&wrap("  ", &text, 4));
        }
    }
    out
}

/// `event`, `gauge` or `gauge*` (reported as its change since the start).
fn kind(x: &Field) -> String {
    match (lower(x.kind).as_str(), x.reported) {
        ("gauge", Reported::SinceStart) => "gauge*".to_string(),
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
