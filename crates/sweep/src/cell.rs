//! A cell's run on the model, as `hugelab compare` runs a setting (its
//! `set`s, then the machine shape's statements, then the workload, on a
//! fresh model: `hugelab_compare::run_on_model`), and the rows it gives:
//! one per snapshot and counter.

use crate::plan::{fnv1a, Cell};
use anyhow::{bail, Result};
use hugelab_compare::machine::machine_statements;
use hugelab_compare::{parse_setting, run_on_model, StmtStream};
use hugelab_workload::{stream_bytes, stream_file, Bytes, Counters};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// One row of a sweep's output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    pub workload: String,
    pub setting: String,
    pub machine: String,
    pub snapshot: String,
    /// The `snapshot` statement's line; none at `end`.
    pub line: Option<u32>,
    pub counter: String,
    pub value: i64,
}

/// A row as the writers take it: borrowed from its cell and snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RowRef<'a> {
    pub workload: &'a str,
    pub setting: &'a str,
    pub machine: &'a str,
    pub snapshot: &'a str,
    pub line: Option<u32>,
    pub counter: &'a str,
    pub value: i64,
}

impl Row {
    pub fn as_ref(&self) -> RowRef<'_> {
        RowRef {
            workload: &self.workload,
            setting: &self.setting,
            machine: &self.machine,
            snapshot: &self.snapshot,
            line: self.line,
            counter: &self.counter,
            value: self.value,
        }
    }
}

/// The counters a cell's run took at one snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotValues {
    pub label: String,
    pub line: Option<u32>,
    pub counters: Counters,
}

/// A finished cell: its key and its snapshots, in the order taken.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellRows {
    pub key: String,
    pub snapshots: Vec<SnapshotValues>,
}

impl CellRows {
    /// The cell's rows: each snapshot in order, its counters by name.
    pub fn rows<'a>(&'a self, cell: &'a Cell) -> impl Iterator<Item = RowRef<'a>> + 'a {
        self.snapshots.iter().flat_map(move |s| {
            s.counters.iter().map(move |(counter, value)| RowRef {
                workload: &cell.workload,
                setting: &cell.setting,
                machine: &cell.machine,
                snapshot: &s.label,
                line: s.line,
                counter,
                value: *value,
            })
        })
    }

    pub fn row_count(&self) -> usize {
        self.snapshots.iter().map(|s| s.counters.len()).sum()
    }
}

/// What became of a cell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Done(CellRows),
    /// The run stopped (the workload's error at its line, a shape the
    /// workload cannot take, a worker that died): the sentence why.
    Failed {
        key: String,
        error: String,
    },
}

impl Outcome {
    pub fn key(&self) -> &str {
        match self {
            Outcome::Done(rows) => &rows.key,
            Outcome::Failed { key, .. } => key,
        }
    }
}

/// Runs one cell on a fresh model, reading the workload from its path.
pub fn run_cell(cell: &Cell) -> Result<CellRows> {
    run_cell_on(cell, Box::new(stream_file(Path::new(&cell.workload))?))
}

/// Runs one cell on a fresh model, its workload's file being `bytes` (as
/// read where the sweep was planned and shipped here): they must be the
/// bytes the plan hashed.
pub fn run_cell_shipped(cell: &Cell, bytes: &Bytes) -> Result<CellRows> {
    let hash = format!("{:016x}", fnv1a(bytes.as_ref()));
    if hash != cell.hash {
        bail!(
            "{}: the workload shipped to run the cell is not the file the sweep planned \
             (FNV-1a {hash}, not {}): it changed in between",
            cell.workload,
            cell.hash
        );
    }
    let path = Path::new(&cell.workload);
    run_cell_on(cell, Box::new(stream_bytes(path, bytes.clone())?))
}

fn run_cell_on(cell: &Cell, stmts: StmtStream) -> Result<CellRows> {
    let setting = parse_setting(&cell.spec)?;
    let before = machine_statements(&cell.shape)?;
    let (obs, _) = run_on_model(&setting, &cell.workload, &before, stmts)?;
    let snapshots = obs
        .snapshots
        .into_iter()
        .map(|s| SnapshotValues {
            label: s.label,
            line: s.line,
            counters: s.counters,
        })
        .collect();
    Ok(CellRows {
        key: cell.key(),
        snapshots,
    })
}

/// For the tests of the engines: the process running a cell of the setting
/// this names kills itself with SIGKILL, as the kernel's OOM killer ends one.
pub const ABORT_ON_ENV: &str = "HUGELAB_SWEEP_TEST_ABORT_ON";

/// Runs each cell, in order: one outcome per cell, a failure (an error, or
/// a panic of the model) costing its cell only.
pub fn run_cells(cells: &[Cell]) -> Vec<Outcome> {
    run_cells_by(cells, run_cell)
}

/// [`run_cells`] with each workload's bytes given (by path, as the cells
/// name it) rather than read here: a cluster's worker, which may not see
/// the files. A cell whose workload is not among them fails.
pub fn run_cells_shipped(cells: &[Cell], workloads: &HashMap<String, Bytes>) -> Vec<Outcome> {
    run_cells_by(cells, |cell| match workloads.get(&cell.workload) {
        Some(bytes) => run_cell_shipped(cell, bytes),
        None => bail!(
            "{}: the workload was not shipped with the cell",
            cell.workload
        ),
    })
}

fn run_cells_by(cells: &[Cell], run: impl Fn(&Cell) -> Result<CellRows>) -> Vec<Outcome> {
    let abort_on = std::env::var(ABORT_ON_ENV).ok();
    cells
        .iter()
        .map(|cell| {
            if abort_on.as_deref() == Some(cell.setting.as_str()) {
                // SAFETY: raise has no preconditions; SIGKILL ends the process here.
                unsafe { libc::raise(libc::SIGKILL) };
            }
            let failed = |error: String| Outcome::Failed {
                key: cell.key(),
                error,
            };
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cell))) {
                Ok(Ok(rows)) => Outcome::Done(rows),
                Ok(Err(e)) => failed(format!("{e:#}")),
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    failed(format!("the model panicked running it: {msg}"))
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan;

    #[test]
    fn shipped_bytes_run_as_the_file_and_must_be_the_planned_ones() {
        let dir = std::env::temp_dir().join(format!("hugelab-cell-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.hlw");
        let text = "spawn a\na mmap buf 8M align=2M\na write buf\nsnapshot s\n";
        std::fs::write(&path, text).unwrap();
        let name = path.display().to_string();
        let settings = ["PMD:transparent_hugepage/enabled=always".to_string()];
        let cells = plan(std::slice::from_ref(&name), &settings, &[]).unwrap();
        let shipped = HashMap::from([(name.clone(), Bytes(text.as_bytes().into()))]);
        assert_eq!(run_cells_shipped(&cells, &shipped), run_cells(&cells));
        // Bytes other than the planned file's, or none: the cell fails.
        let changed = HashMap::from([(name, Bytes(b"spawn a\n"[..].into()))]);
        let Outcome::Failed { error, .. } = &run_cells_shipped(&cells, &changed)[0] else {
            panic!("a changed workload ran");
        };
        assert!(error.contains("not the file the sweep planned"), "{error}");
        let Outcome::Failed { error, .. } = &run_cells_shipped(&cells, &HashMap::new())[0] else {
            panic!("a workload not shipped ran");
        };
        assert!(error.contains("was not shipped"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
