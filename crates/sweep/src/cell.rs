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

/// The counters a cell's run took at one snapshot: a value for each of
/// its cell's [`CellRows::names`], none for a counter this snapshot did
/// not take (a process that had exited, a region not yet mapped).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotValues {
    pub label: String,
    pub line: Option<u32>,
    pub values: Vec<Option<i64>>,
}

/// A finished cell: its key and its snapshots, in the order taken. The
/// counters' names are held once per cell, not once per snapshot: a
/// recorded program takes thousands of readings of the same few hundred
/// counters, and an outcome travels from a worker to the sweep (a JSON
/// line) and is kept until the output is written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellRows {
    pub key: String,
    /// Every counter a snapshot of the cell took, in order.
    pub names: Vec<String>,
    pub snapshots: Vec<SnapshotValues>,
}

/// A snapshot as a run took it, or as read back from an output: (label,
/// line, counters).
pub type Taken = (String, Option<u32>, Counters);

impl CellRows {
    /// A cell's rows from its snapshots as taken.
    pub fn new(key: String, taken: Vec<Taken>) -> CellRows {
        let names: std::collections::BTreeSet<&String> =
            taken.iter().flat_map(|s| s.2.keys()).collect();
        let names: Vec<String> = names.into_iter().cloned().collect();
        let snapshots = taken
            .into_iter()
            .map(|(label, line, counters)| SnapshotValues {
                label,
                line,
                values: names.iter().map(|n| counters.get(n).copied()).collect(),
            })
            .collect();
        CellRows {
            key,
            names,
            snapshots,
        }
    }

    /// The counters snapshot `s` took, by name.
    pub fn counters(&self, s: &SnapshotValues) -> Counters {
        self.names
            .iter()
            .zip(&s.values)
            .filter_map(|(name, v)| Some((name.clone(), (*v)?)))
            .collect()
    }

    /// The cell's rows: each snapshot in order, its counters by name.
    pub fn rows<'a>(&'a self, cell: &'a Cell) -> impl Iterator<Item = RowRef<'a>> + 'a {
        self.snapshots.iter().flat_map(move |s| {
            self.names
                .iter()
                .zip(&s.values)
                .filter_map(move |(counter, value)| {
                    Some(RowRef {
                        workload: &cell.workload,
                        setting: &cell.setting,
                        machine: &cell.machine,
                        snapshot: &s.label,
                        line: s.line,
                        counter,
                        value: (*value)?,
                    })
                })
        })
    }

    pub fn row_count(&self) -> usize {
        let taken = |s: &SnapshotValues| s.values.iter().flatten().count();
        self.snapshots.iter().map(taken).sum()
    }
}

/// What became of a cell. As JSON, `{"rows": {...}}` or `{"failed":
/// {"key": ..., "error": ...}}`: externally tagged, which serde reads in one
/// pass (an internal tag makes it buffer the whole outcome first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    #[serde(rename = "rows")]
    Done(CellRows),
    /// The run stopped (the workload's error at its line, a shape the
    /// workload cannot take, a worker that died): the sentence why.
    Failed { key: String, error: String },
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
    let taken = obs.snapshots.into_iter();
    let taken = taken.map(|s| (s.label, s.line, s.counters)).collect();
    Ok(CellRows::new(cell.key(), taken))
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

    #[test]
    fn a_cells_rows_name_each_counter_once_and_keep_each_snapshots_own() {
        let snap = |label: &str, counters: &[(&str, i64)]| {
            let counters = counters.iter().map(|(n, v)| (n.to_string(), *v));
            (label.to_string(), None, counters.collect())
        };
        // `b.rss` is gone at the second snapshot; `c.rss` came at it.
        let first = snap("s", &[("vmstat.pgfault", 3), ("proc.b.rss", 8)]);
        let second = snap("end", &[("vmstat.pgfault", 5), ("proc.c.rss", 4)]);
        let cell = Cell {
            workload: "w.hlw".into(),
            hash: "0".into(),
            setting: "PMD".into(),
            spec: "PMD:transparent_hugepage/enabled=always".into(),
            machine: "own".into(),
            shape: Vec::new(),
        };
        let rows = CellRows::new("k".into(), vec![first, second]);
        assert_eq!(rows.names, ["proc.b.rss", "proc.c.rss", "vmstat.pgfault"]);
        let got: Vec<(&str, &str, i64)> = rows
            .rows(&cell)
            .map(|r| (r.snapshot, r.counter, r.value))
            .collect();
        assert_eq!(
            got,
            [
                ("s", "proc.b.rss", 8),
                ("s", "vmstat.pgfault", 3),
                ("end", "proc.c.rss", 4),
                ("end", "vmstat.pgfault", 5),
            ]
        );
        assert_eq!(rows.row_count(), 4);
        let end = &rows.snapshots[1];
        assert_eq!(rows.counters(end).get("proc.c.rss"), Some(&4));
        assert!(!rows.counters(end).contains_key("proc.b.rss"));
        // On the wire each name is written once, and read back the same.
        let line = serde_json::to_string(&Outcome::Done(rows.clone())).unwrap();
        assert_eq!(line.matches("vmstat.pgfault").count(), 1, "{line}");
        assert_eq!(
            serde_json::from_str::<Outcome>(&line).unwrap(),
            Outcome::Done(rows)
        );
    }
}
