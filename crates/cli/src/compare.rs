//! `hugelab compare`: one workload under several settings. First a summary in
//! the shape of the multi-size THP series' tables — a row per setting with page
//! faults, anonymous memory, the share of it in large folios and the fallbacks,
//! against the first setting — then the full table: rows are counters, a column
//! per setting and the change against the first.
//!
//! Each setting runs as `setting_run` says: its `set`s before the workload,
//! the workload's own `set`s of the same tunables in its prelude dropped and
//! said (docs/language.md, "Settings over a workload").

pub(crate) use crate::setting_run::parse_settings;
use crate::setting_run::{
    change_cell, change_pct, per_kb, per_size, run_under, short_size, Setting, MEMORY_MAX,
    SERIES_SETTINGS,
};
use crate::table;
use anyhow::{bail, Result};
use clap::Args;
use hugelab_model::Model;
use hugelab_workload::prelude::{PreludeLine, SettingEffect};
use hugelab_workload::{counters, stream_file, Counters, Observation, Statements};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
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

/// What `--json` prints: the summary first, then every counter per setting.
#[derive(Serialize)]
struct JsonDoc<'a> {
    workload: &'a str,
    /// The snapshot compared.
    snapshot: &'a str,
    /// Every snapshot the workload took, in order (`end` last).
    snapshots: &'a [String],
    baseline: &'a str,
    summary: &'a [Summary],
    /// Each setting: what it sets and which of the workload's lines it overrode.
    settings: Vec<JsonSetting<'a>>,
    /// Columns that came out identical, and why.
    notes: &'a [String],
    counters: BTreeMap<&'a str, &'a Counters>,
}

#[derive(Serialize)]
struct JsonSetting<'a> {
    name: &'a str,
    /// `TUNABLE=VALUE`, as given.
    sets: Vec<String>,
    /// The workload's prelude `set` lines of the same tunables, dropped.
    overrides: &'a [PreludeLine],
    /// Prelude lines that set a THP size to other than `inherit` while the
    /// setting sets `transparent_hugepage/enabled`: those sizes do not follow it.
    not_inheriting: &'a [PreludeLine],
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
    if let Some(s) = settings.iter().find(|s| s.memory_max.is_some()) {
        bail!(
            "--setting {}: compare runs no memory cgroup, so it cannot take {MEMORY_MAX} \
             (hugelab bench can)",
            s.name
        );
    }
    let file = args
        .file
        .as_ref()
        .map_or(BUILTIN_NAME.to_string(), |f| f.display().to_string());
    // The snapshot to compare: the first one the workload takes, else `end`.
    let mut label = args.snapshot.clone();
    let mut snapshots: Vec<String> = Vec::new();
    let mut columns: Vec<(String, Counters)> = Vec::new();
    let mut effects: Vec<SettingEffect> = Vec::new();
    for setting in &settings {
        let (obs, effect) = run_setting(setting, args.file.as_ref(), &file)?;
        snapshots = obs.snapshots.iter().map(|s| s.label.clone()).collect();
        let label = label.get_or_insert_with(|| {
            let first = obs.snapshots.iter().find(|s| s.line.is_some());
            first.map_or("end".to_string(), |s| s.label.clone())
        });
        let Some(snap) = obs.snapshot(label) else {
            bail!(
                "{file} has no snapshot '{label}'; its snapshots are {}",
                snapshots.join(", ")
            );
        };
        columns.push((setting.name.clone(), snap.counters.clone()));
        effects.push(effect);
    }
    let label = label.unwrap_or_else(|| "end".to_string());
    let summary = summarize(&columns);
    let notes = identical_columns(&settings, &columns, &label);
    if args.json {
        let compared = Compared {
            file: &file,
            label: &label,
            snapshots: &snapshots,
            settings: &settings,
            effects: &effects,
            columns: &columns,
            summary: &summary,
            notes: &notes,
        };
        println!("{}", serde_json::to_string_pretty(&json_doc(&compared))?);
        return Ok(ExitCode::SUCCESS);
    }
    let which = match (&args.snapshot, snapshots.len()) {
        (Some(_), _) => String::new(),
        (None, 0 | 1) => " (the workload takes no snapshot: its end)".to_string(),
        (None, _) => format!(
            " (the workload's first; --snapshot NAME for another of {})",
            snapshots.join(", ")
        ),
    };
    println!("# {file} at snapshot '{label}'{which}, model backend");
    for (setting, effect) in settings.iter().zip(&effects) {
        print!("{}", render_effect(&setting.name, effect));
    }
    for note in &notes {
        println!("note: {note}");
    }
    print!("{}", render_summary(&summary, &label));
    print!("{}", render(&columns, args.all, &args.counters));
    Ok(ExitCode::SUCCESS)
}

/// The setting, then the workload (`path`, or the built-in one), on a
/// fresh model.
fn run_setting(
    setting: &Setting,
    path: Option<&PathBuf>,
    file: &str,
) -> Result<(Observation, SettingEffect)> {
    let mut model = Model::default();
    match path {
        Some(path) => run_under(setting, &mut model, file, stream_file(path)?, &[], Some),
        None => {
            let text = zstd::stream::read::Decoder::new(BUILTIN)?;
            let stmts = Statements::new(file, std::io::BufReader::new(text));
            run_under(setting, &mut model, file, stmts, &[], Some)
        }
    }
}

/// Everything a comparison found, for [`json_doc`].
struct Compared<'a> {
    file: &'a str,
    label: &'a str,
    snapshots: &'a [String],
    settings: &'a [Setting],
    effects: &'a [SettingEffect],
    columns: &'a [(String, Counters)],
    summary: &'a [Summary],
    notes: &'a [String],
}

/// What `--json` prints: what the tables and [`render_effect`]'s lines say.
fn json_doc<'a>(c: &Compared<'a>) -> JsonDoc<'a> {
    JsonDoc {
        workload: c.file,
        snapshot: c.label,
        snapshots: c.snapshots,
        baseline: &c.columns[0].0,
        summary: c.summary,
        settings: c
            .settings
            .iter()
            .zip(c.effects)
            .map(|(s, e)| JsonSetting {
                name: &s.name,
                sets: s
                    .sets
                    .iter()
                    .map(|(t, v)| format!("{}={v}", t.path()))
                    .collect(),
                overrides: &e.overridden,
                not_inheriting: &e.unreached,
            })
            .collect(),
        notes: c.notes,
        counters: c.columns.iter().map(|(n, c)| (n.as_str(), c)).collect(),
    }
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

/// A note for each column identical to an earlier one: the model is
/// deterministic, so two settings that write the same values give the same
/// column, and so do settings whose differences the workload never reaches.
fn identical_columns(
    settings: &[Setting],
    columns: &[(String, Counters)],
    label: &str,
) -> Vec<String> {
    let mut notes = Vec::new();
    for (i, (name, counters)) in columns.iter().enumerate() {
        let Some(j) = columns[..i].iter().position(|(_, c)| c == counters) else {
            continue;
        };
        let earlier = &columns[j].0;
        notes.push(if settings[i].values() == settings[j].values() {
            format!(
                "setting {name} sets exactly what setting {earlier} sets: the same column twice"
            )
        } else {
            format!(
                "setting {name}'s counters at snapshot '{label}' are those of setting {earlier}: \
                 what differs between them does not change this workload"
            )
        });
    }
    notes
}

/// Per-region rows (`folios.*`, `smaps.<proc>.<region>.<field>`): many, and
/// summed up by the per-process and system-wide rows.
fn is_per_region(name: &str) -> bool {
    name.starts_with("folios.") || (name.starts_with("smaps.") && name.split('.').count() == 4)
}

/// The part of anonymous memory held by folios of one size.
#[derive(Debug, Serialize)]
struct SizeShare {
    /// The folio size as sysfs names it (`64kB`, `2048kB`).
    size: String,
    /// kB in folios of this size: `mthp.<size>.nr_anon` × the size.
    kb: i64,
    /// `kb` as a percentage of `anon_kb`; `None` without anonymous memory.
    share_pct: Option<f64>,
}

/// One setting in the terms of the multi-size THP series' tables.
#[derive(Debug, Serialize)]
struct Summary {
    setting: String,
    /// `vmstat.pgfault`: every fault the workload took (an event: a delta).
    page_faults: i64,
    page_faults_change_pct: Option<f64>,
    /// `meminfo.AnonPages`, kB: anonymous memory mapped at the snapshot (a
    /// gauge; it includes PMD-mapped THPs, which AnonHugePages counts again).
    anon_kb: i64,
    anon_change_pct: Option<f64>,
    /// kB of anonymous memory in folios larger than the base page, and its share.
    large_folio_kb: i64,
    large_folio_share_pct: Option<f64>,
    /// Per size, smallest first; sizes with no folio left out.
    by_size: Vec<SizeShare>,
    /// Failed large-folio allocations at fault time, all sizes.
    fallbacks: i64,
    fallbacks_change_pct: Option<f64>,
}

/// How the summary is derived from the counters the model reports (the same
/// names the kernel backend reads):
///
/// - page faults: `vmstat.pgfault`.
/// - anonymous memory: `meminfo.AnonPages` (NR_ANON_MAPPED in kB): every
///   mapped anonymous page once, whatever the size of its folio.
/// - coverage: for each large folio size, `mthp.<size>.nr_anon` (anonymous
///   folios of that size that exist now, a gauge) × the size, as a share of
///   AnonPages. This counts PMD-size folios whether PMD- or PTE-mapped;
///   AnonHugePages would count only the PMD-mapped ones. A folio counts whole
///   even when part of it is unmapped (`mthp.<size>.nr_anon_partially_mapped`
///   of them, waiting on the deferred split queue), so after partial unmaps
///   the share can overstate what is mapped and even pass 100 %.
/// - fallbacks: the sum over sizes of `mthp.<size>.anon_fault_fallback`: one
///   per failed large-folio allocation at fault time, so a fault that tries
///   64K and then 32K before taking 16K counts 2. The PMD size's counter moves
///   together with `vmstat.thp_fault_fallback`, which is therefore not added.
fn summarize(columns: &[(String, Counters)]) -> Vec<Summary> {
    let get = |c: &Counters, name: &str| c.get(name).copied().unwrap_or(0);
    let fallbacks = |c: &Counters| {
        per_size(c, "anon_fault_fallback")
            .iter()
            .map(|(_, v)| v)
            .sum()
    };
    let Some((_, base)) = columns.first() else {
        return Vec::new();
    };
    let (base_faults, base_anon, base_fallbacks) = (
        get(base, "vmstat.pgfault"),
        get(base, "meminfo.AnonPages"),
        fallbacks(base),
    );
    columns
        .iter()
        .map(|(setting, c)| {
            let anon_kb = get(c, "meminfo.AnonPages");
            let share = |kb: i64| (anon_kb != 0).then(|| kb as f64 * 100.0 / anon_kb as f64);
            let by_size: Vec<SizeShare> = per_size(c, "nr_anon")
                .into_iter()
                .filter(|(_, n)| *n != 0)
                .map(|(size_kb, n)| {
                    let kb = n * size_kb as i64;
                    SizeShare {
                        size: format!("{size_kb}kB"),
                        kb,
                        share_pct: share(kb),
                    }
                })
                .collect();
            let large_folio_kb = by_size.iter().map(|s| s.kb).sum();
            let (page_faults, fallbacks) = (get(c, "vmstat.pgfault"), fallbacks(c));
            Summary {
                setting: setting.clone(),
                page_faults,
                page_faults_change_pct: change_pct(base_faults, page_faults),
                anon_kb,
                anon_change_pct: change_pct(base_anon, anon_kb),
                large_folio_kb,
                large_folio_share_pct: share(large_folio_kb),
                by_size,
                fallbacks,
                fallbacks_change_pct: change_pct(base_fallbacks, fallbacks),
            }
        })
        .collect()
}

fn pct_cell(p: Option<f64>) -> String {
    p.map_or("n/a".into(), |p| format!("{p:.1}%"))
}

/// The summary table: a row per setting, changes against the first one.
fn render_summary(summary: &[Summary], snapshot: &str) -> String {
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
