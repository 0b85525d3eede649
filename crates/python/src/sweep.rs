//! `hugelab.sweep`'s native half: the plan, the resume state and the writer
//! of `hugelab_sweep` (the CLI's), and `run_cells` for the worker processes
//! the Python side starts. Cells and outcomes cross as JSON, as they would
//! between any engine's processes.

use crate::{spec, to_py};
use anyhow::{bail, Result};
use hugelab_sweep::{plan, run_cells as run, run_cells_shipped, Cell, Format, Outcome, Sweep};
use hugelab_workload::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::HashMap;
use std::path::PathBuf;

/// A shape's label: its pairs as `--machine` takes them.
fn shape_label(shape: &[(String, String)]) -> String {
    let pairs: Vec<String> = shape.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(",")
}

fn start(
    workloads: &[String],
    settings: &[(String, Vec<(String, String)>)],
    machines: &[Vec<(String, String)>],
    output: Option<&str>,
    format: Option<&str>,
) -> Result<Sweep> {
    let specs = settings
        .iter()
        .map(|(name, sets)| spec(name, sets))
        .collect::<Result<Vec<String>>>()?;
    let shapes: Vec<(String, Vec<(String, String)>)> = machines
        .iter()
        .map(|m| (shape_label(m), m.clone()))
        .collect();
    let output = match (output, format) {
        (None, Some(_)) => bail!("format says how to write the output: give output too"),
        (None, None) => None,
        (Some(path), format) => {
            let path = PathBuf::from(path);
            let format = Format::of(&path, format)?;
            Some((path, format))
        }
    };
    let cells = plan(workloads, &specs, &shapes)?;
    Sweep::start(cells, output)
}

/// A sweep under way: the cells left to run, the outcomes recorded (and
/// journaled), the output written at the end.
#[pyclass(module = "hugelab._native")]
pub struct SweepRun {
    sweep: Option<Sweep>,
}

fn taken(sweep: &mut Option<Sweep>) -> PyResult<&mut Sweep> {
    sweep
        .as_mut()
        .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("the sweep is finished"))
}

#[pymethods]
impl SweepRun {
    /// Plans the sweep and reads back what an earlier run of it left in
    /// `output` and its journal.
    #[new]
    #[pyo3(signature = (workloads, settings, machines, output, format))]
    fn new(
        py: Python<'_>,
        workloads: Vec<String>,
        settings: Vec<(String, Vec<(String, String)>)>,
        machines: Vec<Vec<(String, String)>>,
        output: Option<String>,
        format: Option<String>,
    ) -> PyResult<SweepRun> {
        let sweep = py
            .detach(|| {
                start(
                    &workloads,
                    &settings,
                    &machines,
                    output.as_deref(),
                    format.as_deref(),
                )
            })
            .map_err(|e| to_py(py, e))?;
        Ok(SweepRun { sweep: Some(sweep) })
    }

    /// The cells left to run, as JSON.
    fn todo(&mut self) -> PyResult<String> {
        let cells = taken(&mut self.sweep)?.todo();
        serde_json::to_string(&cells)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
    }

    /// (cells in the plan, found in the output, found in the journal).
    fn counts(&mut self) -> PyResult<(usize, usize, usize)> {
        let s = taken(&mut self.sweep)?;
        Ok((s.cells().len(), s.from_output, s.from_journal))
    }

    /// Records the outcomes (JSON, as `run_cells` gives them): how many
    /// were taken (a second outcome of a cell already finished is not).
    fn record(&mut self, py: Python<'_>, outcomes: &str) -> PyResult<usize> {
        let sweep = taken(&mut self.sweep)?;
        let result = (|| -> Result<usize> {
            let mut taken = 0;
            for outcome in serde_json::from_str::<Vec<Outcome>>(outcomes)? {
                taken += usize::from(sweep.record(outcome)?);
            }
            Ok(taken)
        })();
        result.map_err(|e| to_py(py, e))
    }

    /// Records each of `cells` (JSON, as `todo` gives them) as failed, for
    /// `error` (the worker process running them died).
    fn record_failed(&mut self, py: Python<'_>, cells: &str, error: &str) -> PyResult<()> {
        let sweep = taken(&mut self.sweep)?;
        let result = (|| -> Result<()> {
            for cell in serde_json::from_str::<Vec<Cell>>(cells)? {
                let (key, error) = (cell.key(), error.to_string());
                sweep.record(Outcome::Failed { key, error })?;
            }
            Ok(())
        })();
        result.map_err(|e| to_py(py, e))
    }

    /// Writes the output; returns `{"columns": {name: values}, "failed":
    /// [{workload, setting, machine, error}]}` as JSON.
    fn finish(&mut self, py: Python<'_>) -> PyResult<String> {
        let sweep = self
            .sweep
            .take()
            .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("the sweep is finished"))?;
        py.detach(|| finish_json(sweep)).map_err(|e| to_py(py, e))
    }
}

fn finish_json(sweep: Sweep) -> Result<String> {
    let finished = sweep.finish()?;
    let rows = finished.rows();
    let column = |f: fn(&hugelab_sweep::RowRef) -> serde_json::Value| -> Vec<serde_json::Value> {
        rows.iter().map(f).collect()
    };
    let failed: Vec<serde_json::Value> = finished
        .failed
        .iter()
        .map(|(i, error)| {
            let c: &Cell = &finished.cells[*i];
            serde_json::json!({
                "workload": c.workload, "setting": c.setting, "machine": c.machine, "error": error,
            })
        })
        .collect();
    Ok(serde_json::json!({
        "cells": finished.cells.len(),
        "failed": failed,
        "columns": {
            "workload": column(|r| r.workload.into()),
            "setting": column(|r| r.setting.into()),
            "machine": column(|r| r.machine.into()),
            "snapshot": column(|r| r.snapshot.into()),
            "line": column(|r| r.line.into()),
            "counter": column(|r| r.counter.into()),
            "value": column(|r| r.value.into()),
        },
    })
    .to_string())
}

fn value_error(e: impl std::fmt::Display) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(e.to_string())
}

/// Runs cells (JSON, as `SweepRun.todo` gives them) in this process: their
/// outcomes as JSON, one per cell, a failure costing its cell only. With
/// `workloads` (path to the file's bytes, as read where the sweep was
/// planned), the workloads are those bytes, not the files: a cluster's
/// worker that cannot see them.
#[pyfunction]
#[pyo3(signature = (cells, workloads=None))]
pub fn run_cells<'py>(
    py: Python<'py>,
    cells: &str,
    workloads: Option<HashMap<String, Bound<'py, PyBytes>>>,
) -> PyResult<String> {
    let outcomes = outcomes_of(py, cells, workloads)?;
    serde_json::to_string(&outcomes).map_err(value_error)
}

/// `run_cells`, each outcome as (its cell's key, its own JSON line): what
/// a Ray task returns, so that the engine passes the lines on as they are
/// instead of parsing and writing the batch's outcomes again.
#[pyfunction]
#[pyo3(signature = (cells, workloads=None))]
pub fn run_cells_lines<'py>(
    py: Python<'py>,
    cells: &str,
    workloads: Option<HashMap<String, Bound<'py, PyBytes>>>,
) -> PyResult<Vec<(String, String)>> {
    let outcomes = outcomes_of(py, cells, workloads)?;
    py.detach(|| {
        outcomes
            .iter()
            .map(|o| Ok((o.key().to_string(), serde_json::to_string(o)?)))
            .collect::<serde_json::Result<Vec<_>>>()
    })
    .map_err(value_error)
}

/// The cells' outcomes, run with the GIL released.
fn outcomes_of<'py>(
    py: Python<'py>,
    cells: &str,
    workloads: Option<HashMap<String, Bound<'py, PyBytes>>>,
) -> PyResult<Vec<Outcome>> {
    let cells: Vec<Cell> = serde_json::from_str(cells).map_err(value_error)?;
    Ok(match workloads {
        None => py.detach(|| run(&cells)),
        Some(w) => {
            let shipped: HashMap<String, Bytes> = w
                .into_iter()
                .map(|(k, v)| (k, Bytes(v.as_bytes().into())))
                .collect();
            py.detach(|| run_cells_shipped(&cells, &shipped))
        }
    })
}

/// Each cell's key (JSON, as `SweepRun.todo` gives them), in order: what
/// names it in its outcome.
#[pyfunction]
pub fn cell_keys(cells: &str) -> PyResult<Vec<String>> {
    let cells: Vec<Cell> = serde_json::from_str(cells).map_err(value_error)?;
    Ok(cells.iter().map(Cell::key).collect())
}
