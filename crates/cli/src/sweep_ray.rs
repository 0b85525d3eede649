//! `hugelab sweep --ray ADDRESS`: the cells run on a Ray cluster through
//! the Python package's Ray engine (`python -m hugelab._ray_sweep`), which
//! this process starts and talks to as it talks to its local workers: the
//! plan, the journal, the writer, the progress bar and the summaries stay
//! here. The engine connects and says so (`{"ready": ...}`), reads the
//! cells left (a JSON array, one line) and answers one outcome per cell, a
//! JSON line each (`{"rows": ...}` or `{"failed": ...}`), in any order,
//! then `{"done": ...}`; or `{"error": SENTENCE}` when it cannot go on.

use crate::sweep_pool::Answer;
use anyhow::{bail, Context, Result};
use hugelab_sweep::{Cell, Outcome};
use serde::Deserialize;
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread::JoinHandle;

/// The module the engine runs.
pub const MODULE: &str = "hugelab._ray_sweep";
/// The environment variable naming the Python to run it with.
pub const PYTHON_ENV: &str = "HUGELAB_PYTHON";

/// The engine's lines that are not outcomes.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Said {
    Ready(serde_json::Value),
    Done(serde_json::Value),
    Error(String),
}

/// The engine process, connected to the cluster.
pub struct Engine {
    python: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    stderr: Option<JoinHandle<String>>,
    /// The cluster's CPUs, as the engine counted them.
    pub workers: u64,
}

/// The Python to run the engine with: `--python`, else `HUGELAB_PYTHON`,
/// else `python3`.
pub fn python(given: Option<PathBuf>) -> PathBuf {
    given
        .or_else(|| std::env::var_os(PYTHON_ENV).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("python3"))
}

impl Engine {
    /// Starts the engine with `python` and waits until it is connected to
    /// the cluster at `address`: one sentence if it cannot be started, the
    /// package or Ray is missing, or the cluster cannot be reached.
    pub fn connect(python: PathBuf, address: &str) -> Result<Engine> {
        let mut child = Command::new(&python)
            .args(["-m", MODULE, "--address", address])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "--ray runs the Ray engine of the Python package hugelab with {}, which \
                     cannot be started ({e}): give --python PATH or set {PYTHON_ENV}",
                    python.display()
                )
            })?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut stderr = child.stderr.take().expect("piped");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut engine = Engine {
            python,
            child,
            stdin,
            stdout,
            stderr: Some(stderr),
            workers: 0,
        };
        match engine.said()? {
            Said::Ready(doc) => {
                engine.workers = doc["workers"].as_u64().unwrap_or(0);
                Ok(engine)
            }
            Said::Error(sentence) => bail!("{sentence}"),
            Said::Done(_) => bail!("the Ray engine said it was done before it was given cells"),
        }
    }

    /// The engine's next line that is not an outcome; its death, said.
    fn said(&mut self) -> Result<Said> {
        match self.next()? {
            Some(Err(said)) => Ok(said),
            Some(Ok(_)) => bail!("the Ray engine answered an outcome before it was given cells"),
            None => Err(self.died()),
        }
    }

    /// The next line: an outcome (and its JSON) or something said; none at
    /// the end of the engine's output.
    fn next(&mut self) -> Result<Option<Result<Answer, Said>>> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let line = line.trim_end_matches('\n');
        if line.starts_with("{\"rows\"") || line.starts_with("{\"failed\"") {
            let outcome: Outcome = serde_json::from_str(line)
                .with_context(|| format!("the Ray engine answered a bad outcome: {line}"))?;
            return Ok(Some(Ok((outcome, Some(line.to_string())))));
        }
        let said: Said = serde_json::from_str(line)
            .with_context(|| format!("the Ray engine said what hugelab cannot read: {line}"))?;
        Ok(Some(Err(said)))
    }

    /// Why the engine stopped answering: its exit and its last words.
    fn died(&mut self) -> anyhow::Error {
        drop(self.stdin.take());
        let status = self
            .child
            .wait()
            .map_or("an unknown status".to_string(), |s| s.to_string());
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let python = self.python.display();
        // python -m's words for a package it cannot import.
        if stderr.contains("No module named 'hugelab'") {
            return anyhow::anyhow!(
                "--ray needs the Python package hugelab, which {python} cannot import: \
                 pip install 'hugelab[ray]' (or give --python PATH or set {PYTHON_ENV})"
            );
        }
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
        anyhow::anyhow!(
            "the Ray engine ({python} -m {MODULE}) stopped ({status}){}",
            last.map_or(String::new(), |l| format!(": {}", l.trim()))
        )
    }

    /// Runs `cells` on the cluster; `record` takes each outcome as it comes.
    /// Every cell gets exactly one outcome, or this fails (the cells
    /// recorded before are in the journal: a re-run resumes from them).
    /// Returns the engine's account of the run (its tasks, failed tasks,
    /// duplicates dropped, the cells' CPU seconds in the workers).
    pub fn run(
        mut self,
        cells: Vec<Cell>,
        mut record: impl FnMut(Answer) -> Result<()>,
    ) -> Result<serde_json::Value> {
        let mut line = serde_json::to_string(&cells)?;
        line.push('\n');
        let mut stdin = self.stdin.take().expect("taken once");
        if stdin
            .write_all(line.as_bytes())
            .and_then(|_| stdin.flush())
            .is_err()
        {
            return Err(self.died());
        }
        drop(stdin);
        let mut left: HashSet<String> = cells.iter().map(Cell::key).collect();
        let planned = left.len();
        let account = loop {
            match self.next()? {
                Some(Ok(answer)) => {
                    if !left.remove(answer.0.key()) {
                        bail!(
                            "the Ray engine answered twice, or for a cell not in this sweep: {}",
                            answer.0.key()
                        );
                    }
                    record(answer)?;
                }
                Some(Err(Said::Done(account))) => break account,
                Some(Err(Said::Error(sentence))) => bail!("{sentence}"),
                Some(Err(Said::Ready(_))) => bail!("the Ray engine said it was ready twice"),
                None => return Err(self.died()),
            }
        };
        let _ = self.child.wait();
        if !left.is_empty() {
            bail!(
                "the Ray engine finished with {} of {planned} cells unanswered",
                left.len()
            );
        }
        Ok(account)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
