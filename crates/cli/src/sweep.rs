//! `hugelab sweep`: every workload × machine shape × setting on the model,
//! one row per cell, snapshot and counter, written as Parquet, CSV or JSON
//! in the plan's order (the same inputs give the same bytes), resumable,
//! then a summary per workload like `compare`'s. The plan, the cells' runs,
//! the writers and the journal are `hugelab_sweep`'s (shared with the
//! Python package); the local engine is `sweep_pool`'s worker processes,
//! the Ray engine `sweep_ray`'s (the Python package's, started from here).

use crate::compare::render_summary;
use crate::sweep_pool;
use crate::sweep_ray;
use anyhow::{bail, Result};
use clap::Args;
use hugelab_compare::setting::SERIES_SETTINGS;
use hugelab_sweep::resume::journal_path;
use hugelab_sweep::summary::{summaries, WorkloadSummary};
use hugelab_sweep::{parse_shape, plan, Format, Sweep};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct SweepArgs {
    /// A setting: NAME:TUNABLE=VALUE,... as `compare` takes it (repeat; the
    /// first is each summary's baseline). Default: compare's, the
    /// multi-size THP series' configurations (4K, 16K, 32K+16K,
    /// 64K+32K+16K, PMD).
    #[arg(long = "setting", value_name = "NAME:TUNABLE=VALUE,...")]
    settings: Vec<String>,
    /// A machine shape: KEY=VALUE,... with the `machine` statement's keys
    /// (memory=4G) and fragment (fragment=10%, fragment=10% pattern=clustered)
    /// (repeat). Default: each workload's own machine.
    #[arg(long = "machine", value_name = "KEY=VALUE,...")]
    machines: Vec<String>,
    /// Worker processes. Default: one per core.
    #[arg(long, conflicts_with = "ray")]
    jobs: Option<usize>,
    /// Run the cells on the Ray cluster whose head is at ADDRESS (HOST:PORT,
    /// or auto), through the Python package's Ray engine (pip install
    /// 'hugelab[ray]'); each CPU of the cluster is a worker.
    #[arg(long, value_name = "ADDRESS")]
    ray: Option<String>,
    /// The Python that runs the Ray engine. Default: $HUGELAB_PYTHON, else python3.
    #[arg(long, value_name = "PATH", requires = "ray")]
    python: Option<PathBuf>,
    /// The output: OUT.parquet, OUT.csv or OUT.json (the rows; a re-run
    /// skips the cells already in it). Without it, only the summary.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    output: Option<PathBuf>,
    /// The output's format when its extension does not say: parquet, csv, json.
    #[arg(long)]
    format: Option<String>,
    /// Print JSON instead of tables: the counts, the failed cells and the summaries.
    #[arg(long)]
    json: bool,
    /// The workloads (.hlw, .hlw.gz, .hlw.zst).
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

/// What `--json` prints.
#[derive(Serialize)]
struct JsonDoc<'a> {
    output: Option<String>,
    cells: usize,
    /// Cells run now.
    ran: usize,
    /// Cells found finished in the existing output and in its journal.
    from_output: usize,
    from_journal: usize,
    rows: usize,
    failed: Vec<JsonFailure<'a>>,
    /// The Ray engine's account (tasks, failed tasks, duplicates dropped,
    /// the cells' CPU seconds in the workers); absent for the local engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    engine: Option<serde_json::Value>,
    summaries: &'a [WorkloadSummary],
}

#[derive(Serialize)]
struct JsonFailure<'a> {
    workload: &'a str,
    setting: &'a str,
    machine: &'a str,
    error: &'a str,
}

fn progress_bar(len: usize) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} cells (ETA {eta})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}

/// What an earlier run left that this one takes, if anything.
fn say_resuming(sweep: &Sweep, out: &std::path::Path, left: usize) {
    if sweep.from_output + sweep.from_journal + sweep.dropped > 0 {
        eprintln!(
            "resuming: {} cells already in {}, {} in {}, {left} of {} left to run{}",
            sweep.from_output,
            out.display(),
            sweep.from_journal,
            journal_path(out).display(),
            sweep.cells().len(),
            match sweep.dropped {
                0 => String::new(),
                n => format!("; {n} cells of the output not in this sweep are left out"),
            }
        );
    }
}

pub fn main(args: SweepArgs) -> Result<ExitCode> {
    let specs: Vec<String> = if args.settings.is_empty() {
        SERIES_SETTINGS.iter().map(|s| s.to_string()).collect()
    } else {
        args.settings.clone()
    };
    let machines = args
        .machines
        .iter()
        .map(|m| Ok((m.clone(), parse_shape(m)?)))
        .collect::<Result<Vec<_>>>()?;
    let jobs = match args.jobs {
        Some(0) => bail!("--jobs 0: a sweep needs at least one worker"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let output = match (&args.output, &args.format) {
        (None, Some(_)) => bail!("--format says how to write the output: give it with -o OUT"),
        (None, None) => None,
        (Some(path), format) => Some((path.clone(), Format::of(path, format.as_deref())?)),
    };
    let files: Vec<String> = args.files.iter().map(|f| f.display().to_string()).collect();
    let cells = plan(&files, &specs, &machines)?;
    // Connected before the journal is made: a cluster that cannot be
    // reached leaves nothing behind.
    let engine = match &args.ray {
        Some(address) => Some(sweep_ray::Engine::connect(
            sweep_ray::python(args.python.clone()),
            address,
        )?),
        None => None,
    };
    let mut sweep = Sweep::start(cells, output)?;
    let todo = sweep.todo();
    if let Some(out) = &args.output {
        say_resuming(&sweep, out, todo.len());
    }
    let (from_output, from_journal, ran) = (sweep.from_output, sweep.from_journal, todo.len());
    let bar = progress_bar(todo.len());
    let record = |(outcome, json): sweep_pool::Answer| {
        bar.inc(1);
        sweep.record_encoded(outcome, json.as_deref()).map(|_| ())
    };
    let account = match engine {
        Some(engine) => Some(engine.run(todo, record)?),
        None => {
            sweep_pool::run(todo, jobs, record)?;
            None
        }
    };
    bar.finish_and_clear();
    let finished = sweep.finish()?;
    let summaries = summaries(&finished);
    for (i, error) in &finished.failed {
        let c = &finished.cells[*i];
        eprintln!(
            "cell {} under {} on machine {} failed: {error}",
            c.workload, c.setting, c.machine
        );
    }
    if args.json {
        let doc = JsonDoc {
            output: args.output.as_ref().map(|p| p.display().to_string()),
            cells: finished.cells.len(),
            ran,
            from_output,
            from_journal,
            rows: finished.rows().len(),
            failed: finished
                .failed
                .iter()
                .map(|(i, error)| {
                    let c = &finished.cells[*i];
                    JsonFailure {
                        workload: &c.workload,
                        setting: &c.setting,
                        machine: &c.machine,
                        error,
                    }
                })
                .collect(),
            engine: account,
            summaries: &summaries,
        };
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for s in &summaries {
            println!("# {} on machine {}, model backend", s.workload, s.machine);
            print!("{}", render_summary(&s.summary, &s.snapshot));
        }
    }
    if !finished.failed.is_empty() {
        let kept = args.output.as_ref().map_or(String::new(), |out| {
            format!(
                "; {} holds the others, and a re-run runs the failed ones again",
                out.display()
            )
        });
        eprintln!(
            "{} of {} cells failed{kept}",
            finished.failed.len(),
            finished.cells.len()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
