//! `hugelab._native`: the Rust half of the Python package `hugelab`. The
//! model runs in-process, through `hugelab_compare` as `hugelab run`,
//! `hugelab compare`, `hugelab explain` and `hugelab utilization` run it; each function returns JSON (the documents the
//! CLI's `--json` prints) that `hugelab/__init__.py` turns into result
//! objects and pandas DataFrames. `scan.rs` is the live `hugelab scan`.
//!
//! Errors become the exceptions of `hugelab._errors`, carrying the CLI's
//! message (`file:line:col: ...`) and, for a workload's, its place.

use anyhow::{bail, Result};
use hugelab_compare::explain::explain;
use hugelab_compare::machine::{machine_statements, MACHINE_FILE};
use hugelab_compare::utilization::{report, reports_json, scan_model};
use hugelab_compare::{compare, parse_settings, run_on_model, Setting, StmtStream};
use hugelab_model::thp_utilization::Scope;
use hugelab_workload::counters::FAMILIES;
use hugelab_workload::utilization::MAX_PTES_NONE_OFF;
use hugelab_workload::{stream_file, ParseError, RunError, Statements};
use pyo3::prelude::*;
use std::io::Cursor;
use std::path::Path;

mod scan;
mod sweep;

/// What a workload given as text is called in messages.
const TEXT_NAME: &str = "<string>";

/// A workload: a path (`.hlw`, `.hlw.gz`, `.hlw.zst`), or .hlw text.
struct Source {
    text: String,
    is_path: bool,
}

impl Source {
    fn name(&self) -> &str {
        if self.is_path {
            &self.text
        } else {
            TEXT_NAME
        }
    }

    /// A fresh stream of the workload's statements.
    fn open(&self) -> Result<StmtStream> {
        Ok(if self.is_path {
            Box::new(stream_file(Path::new(&self.text))?)
        } else {
            let bytes = Cursor::new(self.text.clone().into_bytes());
            Box::new(Statements::new(TEXT_NAME, bytes))
        })
    }
}

/// `NAME:TUNABLE=VALUE,...` from a setting's name and pairs, refusing what
/// that form cannot carry.
pub(crate) fn spec(name: &str, sets: &[(String, String)]) -> Result<String> {
    if name.is_empty() || name.contains(':') {
        bail!("setting '{name}': a setting's name must be non-empty and hold no ':'");
    }
    let mut parts = Vec::new();
    for (tunable, value) in sets {
        if [tunable, value]
            .iter()
            .any(|s| s.contains([',', '=']) || s.is_empty())
        {
            bail!(
                "setting '{name}': '{tunable}' = '{value}': a tunable and its value must be \
                 non-empty and hold no ',' or '='"
            );
        }
        parts.push(format!("{tunable}={value}"));
    }
    Ok(format!("{name}:{}", parts.join(",")))
}

fn settings(given: &[(String, Vec<(String, String)>)]) -> Result<Vec<Setting>> {
    let specs = given
        .iter()
        .map(|(name, sets)| spec(name, sets))
        .collect::<Result<Vec<String>>>()?;
    parse_settings(&specs)
}

fn run_json(
    source: &Source,
    sets: &[(String, String)],
    machine: &[(String, String)],
) -> Result<String> {
    let setting = settings(&[("settings".to_string(), sets.to_vec())])?.remove(0);
    let before = machine_statements(machine)?;
    let (obs, effect) = run_on_model(&setting, source.name(), &before, source.open()?)?;
    Ok(serde_json::json!({
        "observation": obs,
        "overrides": effect.overridden,
        "not_inheriting": effect.unreached,
    })
    .to_string())
}

fn compare_json(
    source: &Source,
    given: &[(String, Vec<(String, String)>)],
    snapshot: Option<&str>,
    machine: &[(String, String)],
) -> Result<String> {
    if given.is_empty() {
        bail!("compare needs at least one setting");
    }
    let settings = settings(given)?;
    let before = machine_statements(machine)?;
    let c = compare(settings, source.name(), snapshot, &before, || source.open())?;
    Ok(serde_json::to_string(&c.json())?)
}

fn explain_json(source: &Source, line: Option<u32>) -> Result<String> {
    let run = explain(source.name(), source.open()?, line)?;
    Ok(serde_json::json!({
        "explained": run.explained,
        "stopped": run.stopped.map(|e| e.to_string()),
    })
    .to_string())
}

/// Where `utilization` looks: a process, a region of it, or every process.
struct Within {
    snapshot: Option<String>,
    proc: Option<String>,
    region: Option<String>,
}

fn utilization_json(
    source: &Source,
    within: &Within,
    buckets: usize,
    max_ptes_none: Option<u32>,
) -> Result<String> {
    if !(1..=512).contains(&buckets) {
        bail!("buckets: {buckets} is not in 1..=512");
    }
    if let Some(n) = max_ptes_none.filter(|n| *n > MAX_PTES_NONE_OFF) {
        bail!("max_ptes_none: {n} is not in 0..={MAX_PTES_NONE_OFF}");
    }
    let scope = match (&within.proc, &within.region) {
        (Some(proc), Some(region)) => Scope::Region { proc, region },
        (Some(proc), None) => Scope::Process(proc),
        (None, Some(_)) => bail!("region: a region needs its process (proc=)"),
        (None, None) => Scope::All,
    };
    let each = matches!(scope, Scope::All);
    let snapshot = within.snapshot.as_deref();
    let r = report(max_ptes_none, buckets, each, || {
        let (scan, _) = scan_model(source.name(), source.open()?, snapshot, scope)?;
        Ok(scan)
    })?;
    Ok(reports_json(&r, each)?.to_string())
}

/// The exception for `err`: its class in `hugelab._errors`, the CLI's
/// message, and the place of a workload's error.
pub(crate) fn to_py(py: Python<'_>, err: anyhow::Error) -> PyErr {
    let message = format!("{err:#}");
    let place = err.chain().find_map(|e| {
        if let Some(p) = e.downcast_ref::<ParseError>() {
            return Some((p.file.clone(), p.line, p.col));
        }
        match e.downcast_ref::<RunError>()? {
            RunError::Parse(p) => Some((p.file.clone(), p.line, p.col)),
            RunError::Backend { file, error } => {
                Some((file.clone(), error.pos.line, error.pos.col))
            }
        }
    });
    let class = match &place {
        Some((file, _, _)) if file.starts_with("--setting") => "SettingError",
        Some((file, _, _)) if file == MACHINE_FILE => "MachineError",
        Some(_) => "WorkloadError",
        None if message.starts_with("--setting") || message.starts_with("setting ") => {
            "SettingError"
        }
        None if message.starts_with("machine shape") => "MachineError",
        None if message.contains(": cannot read the workload") => "WorkloadError",
        None => "Error",
    };
    let (file, line, col) = match place {
        Some((file, line, col)) if line > 0 => (Some(file), Some(line), Some(col)),
        Some((file, _, _)) => (Some(file), None, None),
        None => (None, None, None),
    };
    let made = py
        .import("hugelab._errors")
        .and_then(|m| m.getattr(class))
        .and_then(|c| c.call1((message, file, line, col)));
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

/// Runs a workload on the model under one setting (`settings`: tunable and
/// value pairs) and a machine shape: `{"observation", "overrides",
/// "not_inheriting"}` as JSON.
#[pyfunction]
#[pyo3(signature = (source, is_path, settings, machine))]
fn run(
    py: Python<'_>,
    source: String,
    is_path: bool,
    settings: Vec<(String, String)>,
    machine: Vec<(String, String)>,
) -> PyResult<String> {
    let source = Source {
        text: source,
        is_path,
    };
    py.detach(|| run_json(&source, &settings, &machine))
        .map_err(|e| to_py(py, e))
}

/// Compares a workload under several named settings: `hugelab compare
/// --json`'s document.
#[pyfunction]
#[pyo3(signature = (source, is_path, settings, snapshot, machine))]
fn compare_settings(
    py: Python<'_>,
    source: String,
    is_path: bool,
    settings: Vec<(String, Vec<(String, String)>)>,
    snapshot: Option<String>,
    machine: Vec<(String, String)>,
) -> PyResult<String> {
    let source = Source {
        text: source,
        is_path,
    };
    py.detach(|| compare_json(&source, &settings, snapshot.as_deref(), &machine))
        .map_err(|e| to_py(py, e))
}

/// Why each fault of the statement on `line` (every statement that faults
/// without one) got its folio size: `{"explained": hugelab explain --json's
/// document, "stopped": why the run stopped early, or null}`.
#[pyfunction]
#[pyo3(signature = (source, is_path, line))]
fn explain_faults(
    py: Python<'_>,
    source: String,
    is_path: bool,
    line: Option<u32>,
) -> PyResult<String> {
    let source = Source {
        text: source,
        is_path,
    };
    py.detach(|| explain_json(&source, line))
        .map_err(|e| to_py(py, e))
}

/// How full the large folios are at a snapshot, why they exist and what
/// the deferred split shrinker would give back: `hugelab utilization
/// --json`'s document (the model's).
#[pyfunction]
#[pyo3(signature = (source, is_path, snapshot, proc, region, buckets, max_ptes_none))]
#[allow(clippy::too_many_arguments)]
fn utilization(
    py: Python<'_>,
    source: String,
    is_path: bool,
    snapshot: Option<String>,
    proc: Option<String>,
    region: Option<String>,
    buckets: usize,
    max_ptes_none: Option<u32>,
) -> PyResult<String> {
    let source = Source {
        text: source,
        is_path,
    };
    let within = Within {
        snapshot,
        proc,
        region,
    };
    py.detach(|| utilization_json(&source, &within, buckets, max_ptes_none))
        .map_err(|e| to_py(py, e))
}

/// The counter registry: `hugelab counters --json`'s document.
#[pyfunction]
fn counters() -> PyResult<String> {
    serde_json::to_string(&FAMILIES)
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(compare_settings, m)?)?;
    m.add_function(wrap_pyfunction!(explain_faults, m)?)?;
    m.add_function(wrap_pyfunction!(utilization, m)?)?;
    m.add_function(wrap_pyfunction!(counters, m)?)?;
    m.add_function(wrap_pyfunction!(scan::scan, m)?)?;
    m.add_function(wrap_pyfunction!(sweep::run_cells, m)?)?;
    m.add_function(wrap_pyfunction!(sweep::cell_keys, m)?)?;
    m.add_function(wrap_pyfunction!(sweep::run_cells_lines, m)?)?;
    m.add_class::<sweep::SweepRun>()?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
