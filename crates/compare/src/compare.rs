//! The workload under each setting on a fresh model: the compared
//! snapshot's counters per setting, the summary in the shape of the
//! multi-size THP series' tables (a row per setting with page faults,
//! anonymous memory, the share of it in large folios and the fallbacks,
//! against the first setting), and a note for each column identical to an
//! earlier one. `hugelab compare` prints it as tables or JSON, the Python
//! package as DataFrames.

use crate::setting::{change_pct, per_size, run_under, Setting, MEMORY_MAX};
use anyhow::{bail, Result};
use hugelab_model::Model;
use hugelab_workload::prelude::{PreludeLine, SettingEffect};
use hugelab_workload::{Counters, Observation, ParseError, Stmt};
use serde::Serialize;
use std::collections::BTreeMap;

/// A workload's statements, read as a stream.
pub type StmtStream = Box<dyn Iterator<Item = Result<Stmt, ParseError>>>;

/// Everything a comparison found.
pub struct Comparison {
    /// The workload's name (its path, or what the caller calls it).
    pub file: String,
    /// The snapshot compared.
    pub label: String,
    /// Every snapshot the workload took, in order (`end` last).
    pub snapshots: Vec<String>,
    pub settings: Vec<Setting>,
    /// What each setting changed of the workload.
    pub effects: Vec<SettingEffect>,
    /// Each setting's name and its counters at the snapshot.
    pub columns: Vec<(String, Counters)>,
    pub summary: Vec<Summary>,
    /// Columns that came out identical, and why.
    pub notes: Vec<String>,
}

/// `setting`, then `before`, then the workload's `stmts` on a fresh model.
pub fn run_on_model(
    setting: &Setting,
    file: &str,
    before: &[Stmt],
    stmts: StmtStream,
) -> Result<(Observation, SettingEffect)> {
    let mut model = Model::default();
    run_under(setting, &mut model, file, stmts, before, Some)
}

/// Runs the workload (`open` gives a fresh stream of it each time) under
/// each setting, `before` between the setting and the workload, and
/// compares the counters at `snapshot`: by default the first snapshot the
/// workload takes, else `end`.
pub fn compare(
    settings: Vec<Setting>,
    file: &str,
    snapshot: Option<&str>,
    before: &[Stmt],
    mut open: impl FnMut() -> Result<StmtStream>,
) -> Result<Comparison> {
    if let Some(s) = settings.iter().find(|s| s.memory_max.is_some()) {
        bail!(
            "--setting {}: compare runs no memory cgroup, so it cannot take {MEMORY_MAX} \
             (hugelab bench can)",
            s.name
        );
    }
    let mut label = snapshot.map(str::to_string);
    let mut snapshots: Vec<String> = Vec::new();
    let mut columns: Vec<(String, Counters)> = Vec::new();
    let mut effects: Vec<SettingEffect> = Vec::new();
    for setting in &settings {
        let (obs, effect) = run_on_model(setting, file, before, open()?)?;
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
    Ok(Comparison {
        file: file.to_string(),
        label,
        snapshots,
        settings,
        effects,
        columns,
        summary,
        notes,
    })
}

/// What `hugelab compare --json` prints: the summary first, then every
/// counter per setting.
#[derive(Serialize)]
pub struct JsonDoc<'a> {
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

impl Comparison {
    /// The comparison as `--json` prints it: what the tables and the
    /// effect lines say.
    pub fn json(&self) -> JsonDoc<'_> {
        JsonDoc {
            workload: &self.file,
            snapshot: &self.label,
            snapshots: &self.snapshots,
            baseline: self.columns.first().map_or("", |c| c.0.as_str()),
            summary: &self.summary,
            settings: self
                .settings
                .iter()
                .zip(&self.effects)
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
            notes: &self.notes,
            counters: self.columns.iter().map(|(n, c)| (n.as_str(), c)).collect(),
        }
    }
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

/// The part of anonymous memory held by folios of one size.
#[derive(Debug, Serialize)]
pub struct SizeShare {
    /// The folio size as sysfs names it (`64kB`, `2048kB`).
    pub size: String,
    /// kB in folios of this size: `mthp.<size>.nr_anon` × the size.
    pub kb: i64,
    /// `kb` as a percentage of `anon_kb`; `None` without anonymous memory.
    pub share_pct: Option<f64>,
}

/// One setting in the terms of the multi-size THP series' tables.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub setting: String,
    /// `vmstat.pgfault`: every fault the workload took (an event: a delta).
    pub page_faults: i64,
    pub page_faults_change_pct: Option<f64>,
    /// `meminfo.AnonPages`, kB: anonymous memory mapped at the snapshot (a
    /// gauge; it includes PMD-mapped THPs, which AnonHugePages counts again).
    pub anon_kb: i64,
    pub anon_change_pct: Option<f64>,
    /// kB of anonymous memory in folios larger than the base page, and its share.
    pub large_folio_kb: i64,
    pub large_folio_share_pct: Option<f64>,
    /// Per size, smallest first; sizes with no folio left out.
    pub by_size: Vec<SizeShare>,
    /// Failed large-folio allocations at fault time, all sizes.
    pub fallbacks: i64,
    pub fallbacks_change_pct: Option<f64>,
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
pub fn summarize(columns: &[(String, Counters)]) -> Vec<Summary> {
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
