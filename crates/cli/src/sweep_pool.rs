//! `hugelab sweep`'s local engine: a pool of worker processes, each this
//! binary re-executed as `hugelab __sweep-worker`, fed batches of cells on
//! stdin (a JSON array per line) and answering one outcome per cell on
//! stdout (a JSON line each, in the batch's order), so that a cell that
//! panics costs its cell and one that kills its process (out of memory, an
//! abort) costs its cell and a fresh worker, never the sweep.
//!
//! A batch is as many cells as run in about a second at the mean time per
//! cell seen so far (one cell at first), and no more than an even share of
//! what is left, so that every worker keeps busy to the end.

use anyhow::{Context, Result};
use hugelab_sweep::{run_cells, Cell, Outcome};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The hidden subcommand a worker process runs.
pub const WORKER_ARG: &str = "__sweep-worker";

/// How long a batch should run.
const BATCH_TIME: Duration = Duration::from_secs(1);

struct Queue {
    cells: VecDeque<Cell>,
    /// Mean seconds per cell of the batches answered so far.
    per_cell: Option<f64>,
    /// Stop handing out cells (the sweep could not record one).
    stop: bool,
}

impl Queue {
    fn batch(&mut self, jobs: usize) -> Vec<Cell> {
        if self.stop {
            return Vec::new();
        }
        let share = self.cells.len().div_ceil(jobs).max(1);
        let want = self.per_cell.map_or(1, |t| {
            (BATCH_TIME.as_secs_f64() / t.max(1e-6)).ceil() as usize
        });
        let n = want.clamp(1, share).min(self.cells.len());
        self.cells.drain(..n).collect()
    }

    fn answered(&mut self, cells: usize, took: Duration) {
        let t = took.as_secs_f64() / cells as f64;
        self.per_cell = Some(self.per_cell.map_or(t, |m| 0.7 * m + 0.3 * t));
    }
}

/// An outcome, and its JSON line as the worker answered it (none for one
/// made here: a cell whose worker died).
pub type Answer = (Outcome, Option<String>);

/// Runs `cells` on `jobs` worker processes; `record` takes each outcome as
/// it comes (on this thread), in any order.
pub fn run(
    cells: Vec<Cell>,
    jobs: usize,
    mut record: impl FnMut(Answer) -> Result<()>,
) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the hugelab binary to start workers")?;
    let queue = Mutex::new(Queue {
        cells: cells.into(),
        per_cell: None,
        stop: false,
    });
    let (tx, rx) = channel();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            let (tx, queue, exe) = (tx.clone(), &queue, &exe);
            s.spawn(move || feed(exe, queue, jobs, tx));
        }
        drop(tx);
        let mut result = Ok(());
        for outcome in rx {
            if result.is_ok() {
                result = record(outcome);
                if result.is_err() {
                    queue.lock().expect("no panic holding it").stop = true;
                }
            }
        }
        result
    })
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

fn spawn(exe: &std::path::Path) -> std::io::Result<Worker> {
    let mut child = Command::new(exe)
        .arg(WORKER_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdin = child.stdin.take().expect("piped");
    let stdout = BufReader::new(child.stdout.take().expect("piped"));
    Ok(Worker {
        child,
        stdin,
        stdout,
    })
}

fn failed(cell: &Cell, error: String) -> Answer {
    let key = cell.key();
    (Outcome::Failed { key, error }, None)
}

/// One pool slot: takes batches until none is left, each on its worker
/// process (started again after one dies).
fn feed(exe: &std::path::Path, queue: &Mutex<Queue>, jobs: usize, tx: Sender<Answer>) {
    let mut worker: Option<Worker> = None;
    loop {
        let batch = queue.lock().expect("no panic holding it").batch(jobs);
        if batch.is_empty() {
            break;
        }
        let w = match worker.take().map_or_else(|| spawn(exe), Ok) {
            Ok(w) => worker.insert(w),
            Err(e) => {
                for cell in &batch {
                    let _ = tx.send(failed(cell, format!("cannot start a worker process: {e}")));
                }
                continue;
            }
        };
        let start = Instant::now();
        let answered = answer(w, &batch, &tx);
        if answered == batch.len() {
            queue
                .lock()
                .expect("no panic holding it")
                .answered(batch.len(), start.elapsed());
            continue;
        }
        // The worker died on batch[answered]: that cell fails, the rest
        // go back to the queue for a fresh worker.
        let mut dead = worker.take().expect("inserted above");
        drop(dead.stdin);
        let status = dead
            .child
            .wait()
            .map_or("unknown".to_string(), |s| s.to_string());
        let cell = &batch[answered];
        let why =
            format!("the worker process running it died ({status}): out of memory or a crash");
        let _ = tx.send(failed(cell, why));
        let mut q = queue.lock().expect("no panic holding it");
        for cell in batch[answered + 1..].iter().rev() {
            q.cells.push_front(cell.clone());
        }
    }
    if let Some(w) = worker {
        drop(w.stdin); // end of input: the worker exits
        let mut child = w.child;
        let _ = child.wait();
    }
}

/// Sends `batch` to the worker and passes on its outcomes: how many came.
fn answer(w: &mut Worker, batch: &[Cell], tx: &Sender<Answer>) -> usize {
    let Ok(mut line) = serde_json::to_string(batch) else {
        return 0;
    };
    line.push('\n');
    if w.stdin
        .write_all(line.as_bytes())
        .and_then(|_| w.stdin.flush())
        .is_err()
    {
        return 0;
    }
    let mut answer = String::new();
    for n in 0..batch.len() {
        answer.clear();
        let got = w.stdout.read_line(&mut answer).ok().filter(|n| *n > 0);
        let Some(outcome) = got.and_then(|_| serde_json::from_str::<Outcome>(&answer).ok()) else {
            return n;
        };
        let line = answer.trim_end_matches('\n').to_string();
        let _ = tx.send((outcome, Some(line)));
    }
    batch.len()
}

/// `hugelab __sweep-worker`: runs the batches of cells it reads, answering
/// each cell's outcome as a JSON line; a panic costs its cell (`run_cells`).
pub fn worker_main() -> ExitCode {
    std::panic::set_hook(Box::new(|_| {})); // the message goes in the outcome
                                            // A worker dies with the sweep that started it, mid-cell too.
                                            // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and nothing else.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let Ok(cells) = line
            .map_err(anyhow::Error::from)
            .and_then(|l| Ok(serde_json::from_str::<Vec<Cell>>(&l)?))
        else {
            return ExitCode::from(2);
        };
        for cell in &cells {
            let outcome = run_cells(std::slice::from_ref(cell)).remove(0);
            let Ok(text) = serde_json::to_string(&outcome) else {
                return ExitCode::from(2);
            };
            if writeln!(out, "{text}").and_then(|_| out.flush()).is_err() {
                return ExitCode::from(2);
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(n: usize) -> Queue {
        let cell = Cell {
            workload: "w.hlw".into(),
            hash: "0".into(),
            setting: "s".into(),
            spec: "s:".into(),
            machine: "own".into(),
            shape: Vec::new(),
        };
        Queue {
            cells: vec![cell; n].into(),
            per_cell: None,
            stop: false,
        }
    }

    #[test]
    fn a_batch_runs_about_a_second_within_an_even_share() {
        let mut q = queue(100);
        // Nothing timed yet: one cell.
        assert_eq!(q.batch(2).len(), 1);
        // 50 ms a cell: 20 cells make a second.
        q.answered(1, Duration::from_millis(50));
        assert_eq!(q.batch(2).len(), 20);
        // 1 ms a cell wants 1000, but 79 left over 2 workers: 40.
        q.per_cell = Some(0.001);
        assert_eq!(q.batch(2).len(), 40);
        // 2 s a cell: one at a time.
        q.per_cell = Some(2.0);
        assert_eq!(q.batch(2).len(), 1);
        q.stop = true;
        assert!(q.batch(2).is_empty());
    }
}
