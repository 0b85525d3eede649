//! A sweep's state between its plan and its output: which cells are
//! finished (read back from an earlier output, from the journal, or
//! recorded now), the journal `OUT.partial` each finished cell is appended
//! to as it comes, and the output written whole at the end.
//!
//! The journal is JSON Lines, one finished cell's [`Outcome`] per line (as a
//! worker process answered it, copied as it is); a line cut short
//! by a kill is dropped on resume (and cut off the file). The output is
//! written to `OUT.tmp` and renamed over `OUT`, so a reader never sees half
//! a file; the journal goes once the output holds its cells. The output
//! names a cell by its workload path, setting name and machine label only:
//! a re-run takes the cells it finds there as they are (delete the output
//! to run again after changing a workload file or what a setting sets).

use crate::cell::{CellRows, Outcome, Row, RowRef, Taken};
use crate::format::{self, Format};
use crate::plan::Cell;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

/// The output file and its format.
pub type Output = (PathBuf, Format);

pub struct Sweep {
    cells: Vec<Cell>,
    keys: HashMap<String, usize>,
    done: Vec<Option<CellRows>>,
    failed: Vec<(usize, String)>,
    output: Option<Output>,
    journal: Option<(PathBuf, File)>,
    /// Cells found finished in the existing output.
    pub from_output: usize,
    /// Cells found finished in the journal.
    pub from_journal: usize,
    /// Cells of the existing output that are not in this plan: left out.
    pub dropped: usize,
}

/// A path with `suffix` added to its name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The journal of a sweep writing `output`.
pub fn journal_path(output: &Path) -> PathBuf {
    beside(output, ".partial")
}

impl Sweep {
    /// The sweep of `cells` into `output` (none: rows in memory only),
    /// after reading back what an earlier run of it finished. Fails,
    /// creating nothing, on an output that cannot be read back or written.
    pub fn start(cells: Vec<Cell>, output: Option<Output>) -> Result<Sweep> {
        let keys = cells
            .iter()
            .enumerate()
            .map(|(i, c)| (c.key(), i))
            .collect();
        let mut sweep = Sweep {
            done: vec![None; cells.len()],
            cells,
            keys,
            failed: Vec::new(),
            output: output.clone(),
            journal: None,
            from_output: 0,
            from_journal: 0,
            dropped: 0,
        };
        let Some((path, format)) = output else {
            return Ok(sweep);
        };
        if path.exists() {
            let rows = format::read(format, &path).with_context(|| {
                format!(
                    "{}: the existing output cannot be read back as {format:?} to resume \
                     from it; remove it or give another output",
                    path.display()
                )
            })?;
            sweep.take_rows(rows);
        }
        let journal = journal_path(&path);
        let valid = if journal.exists() {
            sweep.take_journal(&journal)?
        } else {
            0
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&journal)
            .with_context(|| format!("{}: cannot write the output there", path.display()))?;
        file.set_len(valid)?;
        sweep.journal = Some((journal, file));
        Ok(sweep)
    }

    /// The cells of an earlier output, each run of rows of one cell.
    fn take_rows(&mut self, rows: Vec<Row>) {
        let names: HashMap<(&str, &str, &str), usize> = self
            .cells
            .iter()
            .enumerate()
            .map(|(i, c)| (c.names(), i))
            .collect();
        let mut found: Vec<(usize, Vec<Taken>)> = Vec::new();
        let mut last: Option<(String, String, String)> = None;
        for row in rows {
            let here = (
                row.workload.clone(),
                row.setting.clone(),
                row.machine.clone(),
            );
            if last.as_ref() != Some(&here) {
                match names.get(&(here.0.as_str(), here.1.as_str(), here.2.as_str())) {
                    Some(&i) => found.push((i, Vec::new())),
                    None => self.dropped += 1,
                }
                last = Some(here);
            }
            let Some((i, snapshots)) = found.last_mut() else {
                continue;
            };
            if self.cells[*i].names() != (&row.workload[..], &row.setting[..], &row.machine[..]) {
                continue; // a dropped cell's rows
            }
            match snapshots.last_mut() {
                Some((label, _, counters)) if *label == row.snapshot => {
                    counters.insert(row.counter, row.value);
                }
                _ => snapshots.push((row.snapshot, row.line, [(row.counter, row.value)].into())),
            }
        }
        for (i, snapshots) in found {
            if self.done[i].is_none() {
                self.from_output += 1;
            }
            let key = self.cells[i].key();
            self.done[i] = Some(CellRows::new(key, snapshots));
        }
    }

    /// The journal's finished cells; the length of its whole lines.
    fn take_journal(&mut self, path: &Path) -> Result<u64> {
        let mut reader = BufReader::new(File::open(path)?);
        let (mut valid, mut line) = (0u64, String::new());
        loop {
            line.clear();
            let n = reader.read_line(&mut line)?;
            if n == 0 || !line.ends_with('\n') {
                break;
            }
            let Ok(Outcome::Done(rows)) = serde_json::from_str::<Outcome>(&line) else {
                break;
            };
            valid += n as u64;
            if let Some(&i) = self.keys.get(&rows.key) {
                if self.done[i].is_none() {
                    self.from_journal += 1;
                    self.done[i] = Some(rows);
                }
            }
        }
        Ok(valid)
    }

    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    /// The cells left to run, in the plan's order.
    pub fn todo(&self) -> Vec<Cell> {
        let left = self
            .cells
            .iter()
            .zip(&self.done)
            .filter(|(_, d)| d.is_none());
        left.map(|(c, _)| c.clone()).collect()
    }

    /// Takes a cell's outcome: a finished cell is journaled (a second
    /// outcome of a cell already finished is dropped: false).
    pub fn record(&mut self, outcome: Outcome) -> Result<bool> {
        self.record_encoded(outcome, None)
    }

    /// [`Sweep::record`], with the outcome's JSON (one line, as serde_json
    /// writes it) when the caller has it: the journal copies it rather
    /// than writing it again.
    pub fn record_encoded(&mut self, outcome: Outcome, json: Option<&str>) -> Result<bool> {
        let Some(&i) = self.keys.get(outcome.key()) else {
            bail!("an outcome for a cell not in the plan: {}", outcome.key());
        };
        if self.done[i].is_some() {
            return Ok(false);
        }
        match outcome {
            Outcome::Done(_) => {
                if let Some((_, file)) = &mut self.journal {
                    let mut line = match json {
                        Some(json) => json.to_string(),
                        None => serde_json::to_string(&outcome)?,
                    };
                    line.push('\n');
                    file.write_all(line.as_bytes())?;
                }
                let Outcome::Done(rows) = outcome else {
                    unreachable!("matched above")
                };
                self.failed.retain(|(f, _)| *f != i);
                self.done[i] = Some(rows);
            }
            Outcome::Failed { error, .. } => {
                if !self.failed.iter().any(|(f, _)| *f == i) {
                    self.failed.push((i, error));
                }
            }
        }
        Ok(true)
    }

    /// Writes every finished cell's rows, in the plan's order, to the
    /// output (whole, by a rename), and drops the journal.
    pub fn finish(mut self) -> Result<Finished> {
        // In the plan's order, whatever order the cells failed in.
        self.failed.sort_by_key(|(i, _)| *i);
        let finished = Finished {
            cells: self.cells,
            done: self.done,
            failed: self.failed,
        };
        if let Some((path, format)) = &self.output {
            let tmp = beside(path, ".tmp");
            let file = File::create(&tmp)
                .with_context(|| format!("{}: cannot write the output", tmp.display()))?;
            format::write(*format, &finished.rows(), file.try_clone()?)?;
            file.sync_all()?;
            std::fs::rename(&tmp, path)?;
        }
        if let Some((journal, file)) = self.journal {
            drop(file);
            std::fs::remove_file(journal)?;
        }
        Ok(finished)
    }
}

/// A sweep's end: every cell, what each finished with, the failures.
pub struct Finished {
    pub cells: Vec<Cell>,
    /// Per cell in the plan's order: its rows, if it finished.
    pub done: Vec<Option<CellRows>>,
    /// Cells that failed (index in the plan) and why, in the plan's order.
    pub failed: Vec<(usize, String)>,
}

impl Finished {
    /// The rows of every finished cell, in the plan's order.
    pub fn rows(&self) -> Vec<RowRef<'_>> {
        let each = self.cells.iter().zip(&self.done);
        each.filter_map(|(c, d)| Some(d.as_ref()?.rows(c)))
            .flatten()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{plan, run_cells};

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hugelab-sweep-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn cells(dir: &Path) -> Vec<Cell> {
        let workload = dir.join("w.hlw");
        std::fs::write(
            &workload,
            "spawn a\na mmap buf 8M align=2M\na write buf\nsnapshot s\n",
        )
        .unwrap();
        let settings = [
            "4K:transparent_hugepage/enabled=never",
            "PMD:transparent_hugepage/enabled=always",
        ];
        let settings: Vec<String> = settings.map(String::from).to_vec();
        plan(&[workload.display().to_string()], &settings, &[]).unwrap()
    }

    fn sweep_all(cells: Vec<Cell>, out: &Path) -> Vec<u8> {
        let mut sweep = Sweep::start(cells, Some((out.to_path_buf(), Format::Csv))).unwrap();
        for outcome in run_cells(&sweep.todo()) {
            assert!(sweep.record(outcome).unwrap());
        }
        sweep.finish().unwrap();
        std::fs::read(out).unwrap()
    }

    #[test]
    fn a_sweep_resumes_from_its_journal_and_its_output() {
        let dir = dir("resume");
        let cells = cells(&dir);
        let whole = sweep_all(cells.clone(), &dir.join("whole.csv"));
        // 2 settings × 2 snapshots (s and end), each a row per counter.
        let out = dir.join("cut.csv");
        let mut sweep = Sweep::start(cells.clone(), Some((out.clone(), Format::Csv))).unwrap();
        let outcomes = run_cells(&cells);
        assert!(sweep.record(outcomes[1].clone()).unwrap());
        drop(sweep); // killed: the journal holds cell 1, and half a line
        let journal = journal_path(&out);
        let mut file = OpenOptions::new().append(true).open(&journal).unwrap();
        file.write_all(b"{\"key\":\"cut sh").unwrap();
        let mut sweep = Sweep::start(cells.clone(), Some((out.clone(), Format::Csv))).unwrap();
        assert_eq!(
            (sweep.from_journal, sweep.todo(), sweep.from_output),
            (1, vec![cells[0].clone()], 0)
        );
        assert!(sweep.record(outcomes[0].clone()).unwrap());
        assert!(
            !sweep.record(outcomes[1].clone()).unwrap(),
            "a cell's second outcome is dropped"
        );
        sweep.finish().unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), whole);
        assert!(!journal.exists());
        // A re-run over the output finds both cells there, runs none, and
        // writes the same bytes.
        let sweep = Sweep::start(cells.clone(), Some((out.clone(), Format::Csv))).unwrap();
        assert_eq!((sweep.from_output, sweep.todo().len()), (2, 0));
        sweep.finish().unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), whole);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
