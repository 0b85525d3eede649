//! `hugelab compare`: one workload under several settings. First a summary in
//! the shape of the multi-size THP series' tables — a row per setting with page
//! faults, anonymous memory, the share of it in large folios and the fallbacks,
//! against the first setting — then the full table: rows are counters, a column
//! per setting and the change against the first.
//!
//! The runs and the figures are `hugelab_compare`'s (shared with the Python
//! package); this module prints them. Each setting runs as its `setting`
//! module says: its `set`s before the workload, the workload's own `set`s of
//! the same tunables in its prelude dropped and said (docs/language.md,
//! "Settings over a workload").

use crate::table;
use anyhow::{bail, Result};
use clap::Args;
pub(crate) use hugelab_compare::parse_settings;
use hugelab_compare::setting::{change_cell, per_kb, short_size, SERIES_SETTINGS};
use hugelab_compare::{compare, StmtStream, Summary};
use hugelab_workload::prelude::SettingEffect;
use hugelab_workload::{counters, stream_file, Counters, Statements};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

/// The built-in workload: a recorded part of a tinyconfig kernel build
/// (`make -j2 mm/`: make, 49 cc1 and as, the shell and tools around them),
/// up to its moment of most anonymous memory (scripts/compare-workload).
const BUILTIN: &[u8] = include_bytes!("../workloads/kbuild-mm.hlw.zst");
const BUILTIN_NAME: &str = "kbuild-mm.hlw.zst";

#[derive(Args)]
pub struct CompareArgs {
    /// A setting: NAME:TUNABLE=VALUE,TUNABLE=VALUE... (repeat for each column;
    /// the first is the baseline; each name once). It wins over the
    /// workload's own `set` of the same tunable before its first statement
    /// (said in a line); a `set` of it later is refused. Default: the
    /// multi-size THP series' configurations (4K, 16K, 32K+16K, 64K+32K+16K, PMD).
    #[arg(long = "setting", value_name = "NAME:TUNABLE=VALUE,...")]
    settings: Vec<String>,
    /// The snapshot to compare. Default: the workload's first snapshot, else
    /// `end`; the header and the summary name it.
    #[arg(long)]
    snapshot: Option<String>,
    /// Show every counter: zeros too, and the per-region `smaps.*` and `folios.*`
    /// rows that are hidden by default.
    #[arg(long)]
    all: bool,
    /// Show only these counters in the full table, zeros included (repeat;
    /// names as `hugelab counters` lists them).
    #[arg(long = "counter", value_name = "NAME")]
    counters: Vec<String>,
    /// Print JSON instead of tables: the summary and every counter.
    #[arg(long)]
    json: bool,
    /// The workload (.hlw, .hlw.gz, .hlw.zst). Default: a built-in recording
    /// of a part of a kernel build (make, cc1, as), up to its peak of
    /// anonymous memory.
    file: Option<PathBuf>,
}

pub fn main(args: CompareArgs) -> Result<ExitCode> {
    for name in &args.counters {
        if counters::lookup(name).is_none() {
            bail!("--counter: {}", counters::unknown_counter_message(name));
        }
    }
    let specs: Vec<String> = if args.settings.is_empty() {
        SERIES_SETTINGS.iter().map(|s| s.to_string()).collect()
    } else {
        args.settings.clone()
    };
    let settings = parse_settings(&specs)?;
    let file = args
        .file
        .as_ref()
        .map_or(BUILTIN_NAME.to_string(), |f| f.display().to_string());
    let open = || -> Result<StmtStream> {
        Ok(match &args.file {
            Some(path) => Box::new(stream_file(path)?),
            None => {
                let text = zstd::stream::read::Decoder::new(BUILTIN)?;
                Box::new(Statements::new(&file, std::io::BufReader::new(text)))
            }
        })
    };
    let c = compare(settings, &file, args.snapshot.as_deref(), &[], open)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&c.json())?);
        return Ok(ExitCode::SUCCESS);
    }
    let which = match (&args.snapshot, c.snapshots.len()) {
        (Some(_), _) => String::new(),
        (None, 0 | 1) => " (the workload takes no snapshot: its end)".to_string(),
        (None, _) => format!(
            " (the workload's first; --snapshot NAME for another of {})",
            c.snapshots.join(", ")
        ),
    };
    println!("# {file} at snapshot '{}'{which}, model backend", c.label);
    for (setting, effect) in c.settings.iter().zip(&c.effects) {
        print!("{}", render_effect(&setting.name, effect));
    }
    for note in &c.notes {
        println!("note: {note}");
    }
    print!("{}", render_summary(&c.summary, &c.label));
    print!("{}", render(&c.columns, args.all, &args.counters));
    Ok(ExitCode::SUCCESS)
}

/// One line per setting that overrode a line of the workload, and one for
/// the THP sizes its `transparent_hugepage/enabled` does not reach.
fn render_effect(name: &str, effect: &SettingEffect) -> String {
    let mut out = String::new();
    let lines = |l: Vec<String>| l.join("; ");
    if !effect.overridden.is_empty() {
        let each = effect
            .overridden
            .iter()
            .map(|o| format!("line {}: {}", o.line, o.statement));
        out.push_str(&format!(
            "setting {name} overrides {}\n",
            lines(each.collect())
        ));
    }
    if !effect.unreached.is_empty() {
        let each = effect
            .unreached
            .iter()
            .map(|u| format!("line {}: {}", u.line, u.statement));
        out.push_str(&format!(
            "setting {name} sets transparent_hugepage/enabled, which a THP size follows only \
             when set to inherit, so not at {}\n",
            lines(each.collect())
        ));
    }
    out
}

/// Per-region rows (`folios.*`, `smaps.<proc>.<region>.<field>`): many, and
/// summed up by the per-process and system-wide rows.
fn is_per_region(name: &str) -> bool {
    name.starts_with("folios.") || (name.starts_with("smaps.") && name.split('.').count() == 4)
}

fn pct_cell(p: Option<f64>) -> String {
    p.map_or("n/a".into(), |p| format!("{p:.1}%"))
}

/// The summary table: a row per setting, changes against the first one.
pub(crate) fn render_summary(summary: &[Summary], snapshot: &str) -> String {
    let Some(base) = summary.first() else {
        return String::new();
    };
    let sizes: Vec<&str> = {
        let mut seen: Vec<(u64, &str)> = summary
            .iter()
            .flat_map(|s| &s.by_size)
            .map(|b| (per_kb(&b.size), b.size.as_str()))
            .collect();
        seen.sort_unstable();
        seen.dedup();
        seen.into_iter().map(|(_, s)| s).collect()
    };
    let mut header: Vec<String> = ["setting", "page faults", "anon memory", "in large folios"]
        .map(String::from)
        .to_vec();
    header.extend(sizes.iter().map(|s| format!("in {}", short_size(s))));
    header.push("fallbacks".into());
    let rows: Vec<Vec<String>> = summary
        .iter()
        .map(|s| {
            let mut row = vec![
                s.setting.clone(),
                change_cell(base.page_faults, s.page_faults),
                change_cell(base.anon_kb, s.anon_kb),
                pct_cell(s.large_folio_share_pct),
            ];
            row.extend(sizes.iter().map(|size| {
                let share = s.by_size.iter().find(|b| b.size == *size);
                share.map_or("0.0%".into(), |b| pct_cell(b.share_pct))
            }));
            row.push(match s.fallbacks_change_pct {
                Some(p) if base.fallbacks != 0 => format!("{} ({p:+.1}%)", s.fallbacks),
                _ => s.fallbacks.to_string(),
            });
            row
        })
        .collect();
    format!(
        "Summary at snapshot '{snapshot}' against {} ({} page faults, {} kB of anonymous \
         memory): page faults and anonymous memory (AnonPages) as change; the share of \
         anonymous memory in folios larger than a base page, in all and by size; fallbacks \
         to a smaller folio, counted.\n{}\n",
        base.setting,
        base.page_faults,
        base.anon_kb,
        table::render(&header, &rows)
    )
}

/// The full table; with `only`, just those counters, in that order.
fn render(columns: &[(String, Counters)], all: bool, only: &[String]) -> String {
    let names: Vec<&String> = if only.is_empty() {
        let all_names: BTreeSet<&String> = columns.iter().flat_map(|(_, c)| c.keys()).collect();
        all_names.into_iter().collect()
    } else {
        only.iter().collect()
    };
    let mut header = vec!["counter".to_string()];
    header.extend(columns.iter().map(|(n, _)| n.clone()));
    header.extend(
        columns
            .iter()
            .skip(1)
            .map(|(n, _)| format!("{n} vs {}", columns[0].0)),
    );
    let mut rows = Vec::new();
    for name in names {
        let values: Vec<i64> = columns
            .iter()
            .map(|(_, c)| c.get(name).copied().unwrap_or(0))
            .collect();
        let hidden = values.iter().all(|v| *v == 0) || is_per_region(name);
        if !all && only.is_empty() && hidden {
            continue;
        }
        let mut row = vec![name.clone()];
        row.extend(values.iter().map(i64::to_string));
        row.extend(values.iter().skip(1).map(|v| change_cell(values[0], *v)));
        rows.push(row);
    }
    table::render(&header, &rows)
}
