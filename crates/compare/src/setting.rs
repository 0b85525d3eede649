//! What `compare`, `predict` and the Python package share: a setting
//! (`NAME:TUNABLE=VALUE,...`, as `bench` takes it too), a workload run under
//! it on a backend, and the changes against the first setting their tables
//! print.
//!
//! Each setting's `set`s run before the workload, which is read as a stream
//! through `hugelab_workload::prelude::UnderSetting`: the workload's own
//! `set` of a setting's tunable in its prelude is dropped and said, one later
//! is refused (docs/language.md, "Settings over a workload").

use anyhow::{bail, Context, Result};
use hugelab_workload::prelude::{same_variable, SettingEffect, UnderSetting};
use hugelab_workload::{
    counters, parse, run_stream, stmt, Backend, Counters, Lookahead, Observation, ParseError,
    RunError, SetValue, Stmt, StmtKind, Tunable, Workload,
};
use std::collections::{BTreeMap, BTreeSet};

/// The multi-size THP series' configurations: 4K pages only, then 16K,
/// 32K+16K, 64K+32K+16K small-order THP, then PMD THP.
pub const SERIES_SETTINGS: &[&str] = &[
    "4K:transparent_hugepage/enabled=never",
    "16K:transparent_hugepage/enabled=never,transparent_hugepage/hugepages-16kB/enabled=always",
    "32K+16K:transparent_hugepage/enabled=never,transparent_hugepage/hugepages-16kB/enabled=always,transparent_hugepage/hugepages-32kB/enabled=always",
    "64K+32K+16K:transparent_hugepage/enabled=never,transparent_hugepage/hugepages-16kB/enabled=always,transparent_hugepage/hugepages-32kB/enabled=always,transparent_hugepage/hugepages-64kB/enabled=always",
    "PMD:transparent_hugepage/enabled=always",
];

pub struct Setting {
    pub name: String,
    /// The setting's `set` statements, to run before the workload.
    pub workload: Workload,
    /// What they set, in the order given, each tunable once.
    pub sets: Vec<(Tunable, SetValue)>,
    /// `memory.max=SIZE`: the memory limit of the program's cgroup, bytes
    /// (None: `max`, or not given). Not a tunable: `bench` gives it to each
    /// run's cgroup, `predict` to the model's cgroup the workload runs in.
    pub memory_max: Option<u64>,
}

impl Setting {
    /// What the setting writes, whatever the order and the alias it names.
    pub fn values(&self) -> BTreeMap<Tunable, SetValue> {
        self.sets
            .iter()
            .map(|(t, v)| (same_variable(t), *v))
            .collect()
    }
}

/// Parses every `--setting` (`compare` and `bench`): a name used twice is
/// refused, since its columns could not be told apart.
pub fn parse_settings(specs: &[String]) -> Result<Vec<Setting>> {
    let mut settings: Vec<Setting> = Vec::new();
    for spec in specs {
        let s = parse_setting(spec)?;
        if settings.iter().any(|o| o.name == s.name) {
            bail!(
                "--setting '{spec}': the name '{}' is already used by an earlier --setting; \
                 give each setting its own name",
                s.name
            );
        }
        settings.push(s);
    }
    Ok(settings)
}

/// Parses `NAME:TUNABLE=VALUE,...` into `set` statements, checked by the
/// workload parser like any other.
pub fn parse_setting(spec: &str) -> Result<Setting> {
    let (name, assignments) = spec
        .split_once(':')
        .with_context(|| format!("--setting '{spec}': expected NAME:TUNABLE=VALUE,..."))?;
    if name.is_empty() {
        bail!("--setting '{spec}': the setting needs a name before ':'");
    }
    let mut text = String::new();
    let mut memory_max = None;
    for assignment in assignments.split(',').filter(|a| !a.is_empty()) {
        let (tunable, value) = assignment
            .split_once('=')
            .with_context(|| format!("--setting '{spec}': '{assignment}' is not TUNABLE=VALUE"))?;
        if tunable == MEMORY_MAX {
            if memory_max.replace(parse_memory_max(spec, value)?).is_some() {
                bail!("--setting '{spec}': sets {MEMORY_MAX} twice; give it one value");
            }
        } else {
            text.push_str(&format!("set {tunable} {value}\n"));
        }
    }
    let workload = parse(&format!("--setting {name}"), &text)?;
    let sets: Vec<(Tunable, SetValue)> = workload
        .stmts
        .iter()
        .filter_map(|s| match &s.kind {
            StmtKind::Set(stmt::Set { tunable, value }) => Some((tunable.clone(), *value)),
            _ => None,
        })
        .collect();
    let mut seen = BTreeSet::new();
    for (tunable, _) in &sets {
        if !seen.insert(same_variable(tunable)) {
            bail!(
                "--setting '{spec}': sets {} twice (or under two names); give it one value",
                tunable.path()
            );
        }
    }
    Ok(Setting {
        name: name.to_string(),
        workload,
        sets,
        memory_max: memory_max.flatten(),
    })
}

/// A setting's memory limit of the program's cgroup (`memory.max=20M`).
pub const MEMORY_MAX: &str = "memory.max";

/// The value of `memory.max=`: a size as the workload language writes one,
/// or `max` (no limit).
fn parse_memory_max(spec: &str, value: &str) -> Result<Option<u64>> {
    if value == "max" {
        return Ok(None);
    }
    let bytes = hugelab_workload::units::parse_size(value)
        .map_err(|e| anyhow::anyhow!("--setting '{spec}': {MEMORY_MAX}: {e}"))?;
    Ok(Some(bytes))
}

/// The setting's statements, then `before` (statements of the caller's,
/// e.g. a cgroup to run in), then the workload's `stmts`, each passed
/// through `edit` (which may drop it), on `backend`: the workload's prelude
/// `set`s of the setting's tunables dropped (and said in the effect).
pub fn run_under(
    setting: &Setting,
    backend: &mut dyn Backend,
    file: &str,
    stmts: impl Iterator<Item = Result<Stmt, ParseError>>,
    before: &[Stmt],
    mut edit: impl FnMut(Stmt) -> Option<Stmt>,
) -> Result<(Observation, SettingEffect)> {
    let sets = setting.workload.stmts.iter().chain(before).cloned().map(Ok);
    let tunables = setting.sets.iter().map(|(t, v)| (t, v));
    let mut effect = SettingEffect::default();
    let none = Lookahead::default(); // the model needs none
    let under = UnderSetting::new(stmts, file, &setting.name, tunables, &mut effect);
    let edited = under.filter_map(|s| match s {
        Ok(s) => edit(s).map(Ok),
        Err(e) => Some(Err(e)),
    });
    match run_stream(backend, file, &none, sets.chain(edited)) {
        Ok(obs) => Ok((obs, effect)),
        // The workload's own error (or a `set` the setting cannot hold):
        // the same under every setting, and it names its line.
        Err(e @ RunError::Parse(_)) => Err(e.into()),
        Err(e) => Err(e).with_context(|| format!("under setting {}", setting.name)),
    }
}

/// The change from `base` to `v` in percent; `None` when `base` is 0 and `v` is not.
pub fn change_pct(base: i64, v: i64) -> Option<f64> {
    match (base, v) {
        (0, 0) => Some(0.0),
        (0, _) => None,
        _ => Some((v - base) as f64 * 100.0 / base as f64),
    }
}

/// `64K`, `2M`: a size in kB as the series' tables write it.
pub fn short_size(size: &str) -> String {
    let kb = per_kb(size);
    if kb >= 1024 && kb.is_multiple_of(1024) {
        format!("{}M", kb / 1024)
    } else {
        format!("{kb}K")
    }
}

/// A change as the series' tables print it: `0.0%` for none, else signed.
pub fn change_cell(base: i64, v: i64) -> String {
    match change_pct(base, v) {
        Some(0.0) => "0.0%".into(),
        Some(p) => format!("{p:+.1}%"),
        None => "n/a".into(),
    }
}

/// The kB of a sysfs size name (`64kB` → 64), for ordering.
pub fn per_kb(size: &str) -> u64 {
    size.trim_end_matches("kB").parse().unwrap_or(0)
}

/// `(size in kB, value)` of every `mthp.<size>.<stat>` counter, smallest size first.
pub fn per_size(c: &Counters, stat: &str) -> Vec<(u64, i64)> {
    // Only the mthp family's names, looked up: a run's counters are
    // hundreds, its mthp ones a few dozen, and a sweep summarizes each cell.
    use std::ops::Bound::{Excluded, Included};
    let mthp = c.range::<str, _>((Included("mthp."), Excluded("mthp/")));
    let mut out: Vec<(u64, i64)> = mthp
        .filter_map(|(name, v)| {
            let counter = counters::lookup(name)?;
            let mthp = counter.family.name == "mthp" && counter.field.name == stat;
            Some((counter.size_kb.filter(|_| mthp)?, *v))
        })
        .collect();
    out.sort_unstable();
    out
}
