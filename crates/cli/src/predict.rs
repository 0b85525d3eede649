//! `hugelab predict FILE`: a workload (normally a recording of a real
//! program) replayed on the model under each setting, one setting per
//! thread, and the figures `bench` measures, predicted: page faults, OOM
//! kills, khugepaged's collapses, fallbacks per size, the memory in each
//! folio size, and peak anonymous memory as the processes map it and as
//! their memory cgroup holds it (predict_report prints them, predict_why
//! explains the largest differences, docs/predict.md says where each comes
//! from).
//!
//! The workload's processes run in a memory cgroup that predict declares
//! ([`CGROUP`]), with the setting's `memory.max=SIZE` as its limit if it
//! has one: every `spawn` without a `cgroup=` of its own joins it, and
//! children follow their parent by fork. Snapshots and counter `expect`s of
//! the workload are skipped: predict reads the end and the model's peaks.

use crate::predict_report::{self, Figures, Prediction};
use crate::predict_why::{self, WhyFold};
use crate::setting_run::{parse_settings, run_under, Setting, SERIES_SETTINGS};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use hugelab_model::Model;
use hugelab_workload::prelude::SettingEffect;
use hugelab_workload::recorded::{read_header, RecordingHeader};
use hugelab_workload::{parse, stream_file, Observation, Stmt, StmtKind};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The memory cgroup the workload's processes run in.
pub const CGROUP: &str = "predicted";
/// The assignment of a setting that is the cgroup's limit, not a tunable.
const MEMORY_MAX: &str = "memory.max";

#[derive(Args)]
pub struct PredictArgs {
    /// A setting: NAME:TUNABLE=VALUE,... as `compare` and `bench` take it,
    /// and `memory.max=SIZE` for the limit of the cgroup the program runs
    /// in (repeat for each setting; the first is the baseline). Default: the
    /// multi-size THP series' configurations (4K, 16K, 32K+16K, 64K+32K+16K, PMD).
    #[arg(long = "setting", value_name = "NAME:TUNABLE=VALUE,...")]
    settings: Vec<String>,
    /// Print JSON instead of tables: every figure per setting.
    #[arg(long)]
    json: bool,
    /// Also draw the figures per setting in an SVG.
    #[arg(long, value_name = "F.svg")]
    plot: Option<PathBuf>,
    /// For the largest differences against the first setting: which regions
    /// gain or lose faults, and the kernel decisions that cause it
    /// (`explain`'s chains; the run is slower).
    #[arg(long)]
    why: bool,
    /// How many settings run at once, each on its own thread. Default: the
    /// number of CPUs.
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,
    /// The workload (.hlw, .hlw.gz, .hlw.zst), normally a `hugelab record`ing.
    file: PathBuf,
}

/// A setting of predict: its tunables, and its cgroup's limit.
pub(crate) struct PredictSetting {
    pub(crate) setting: Setting,
    /// The `cgroup` statement the workload's processes run in.
    pub(crate) cgroup: Stmt,
    /// `memory.max`, as given.
    pub(crate) memory_max: Option<String>,
}

/// Parses each `--setting`: `memory.max=SIZE` taken out as the cgroup's
/// limit (checked as the language checks a `cgroup` statement), the rest
/// as `compare` reads a setting.
pub(crate) fn parse_predict_settings(specs: &[String]) -> Result<Vec<PredictSetting>> {
    let mut limits = Vec::new();
    let mut rest = Vec::new();
    for spec in specs {
        let (name, assignments) = spec.split_once(':').unwrap_or((spec, ""));
        let mut max = None;
        let mut kept = Vec::new();
        for a in assignments.split(',').filter(|a| !a.is_empty()) {
            match a.split_once('=') {
                Some((MEMORY_MAX, v)) if max.is_some() => {
                    bail!("--setting '{spec}': sets {MEMORY_MAX} twice; give it one value ({v})")
                }
                Some((MEMORY_MAX, v)) => max = Some(v.to_string()),
                _ => kept.push(a),
            }
        }
        limits.push(max);
        rest.push(if spec.contains(':') {
            format!("{name}:{}", kept.join(","))
        } else {
            spec.clone()
        });
    }
    let settings = parse_settings(&rest)?;
    settings
        .into_iter()
        .zip(limits)
        .zip(specs)
        .map(|((setting, memory_max), spec)| {
            let text = match &memory_max {
                Some(v) => format!("cgroup {CGROUP} memory.max={v}\n"),
                None => format!("cgroup {CGROUP}\n"),
            };
            let mut w = parse(&format!("--setting {}", setting.name), &text)
                .map_err(|e| anyhow!("--setting '{spec}': {MEMORY_MAX}: {}", e.message))?;
            let cgroup = w.stmts.remove(0);
            Ok(PredictSetting {
                setting,
                cgroup,
                memory_max,
            })
        })
        .collect()
}

/// What a run counts besides the model: the recording's clock.
#[derive(Default)]
struct Clock {
    /// The sum of the workload's `sleep`s, in ns.
    slept_ns: u64,
}

/// The workload's statement as predict runs it: a `spawn` without a
/// cgroup joins [`CGROUP`]; snapshots and counter expects are dropped.
fn edit(mut stmt: Stmt, clock: &mut Clock) -> Option<Stmt> {
    match &mut stmt.kind {
        StmtKind::Spawn(s) if s.cgroup.is_none() => s.cgroup = Some(CGROUP.to_string()),
        StmtKind::Snapshot(_) | StmtKind::Expect(_) => return None,
        StmtKind::Sleep(s) => clock.slept_ns += s.ns,
        _ => {}
    }
    Some(stmt)
}

/// Runs the workload at `path` under `s` on a fresh model (traced and
/// folded for `--why`): its figures.
fn run_one(s: &PredictSetting, path: &Path, file: &str, why: bool) -> Result<Prediction> {
    let mut clock = Clock::default();
    let before = std::slice::from_ref(&s.cgroup);
    let stmts = stream_file(path)?;
    let edit = |stmt| edit(stmt, &mut clock);
    let (obs, effect, model, fold): (Observation, SettingEffect, Model, Option<WhyFold>) = if why {
        let mut fold = WhyFold::default();
        let mut e = crate::explain::Explaining::all(Model::default(), |x| fold.add(&x));
        let (obs, effect) = run_under(&s.setting, &mut e, file, stmts, before, edit)?;
        let model = e.model;
        (obs, effect, model, Some(fold))
    } else {
        let mut model = Model::default();
        let (obs, effect) = run_under(&s.setting, &mut model, file, stmts, before, edit)?;
        (obs, effect, model, None)
    };
    let figures = Figures::read(&obs, &model, CGROUP);
    let m = &model.machine;
    let scan_ms = m.thp.khugepaged.scan_sleep_millisecs;
    let khugepaged_clock = hugelab_model::khugepaged::hugepage_pmd_enabled(m)
        && clock.slept_ns > scan_ms.saturating_mul(1_000_000);
    Ok(Prediction {
        setting: s.setting.name.clone(),
        sets: s
            .setting
            .sets
            .iter()
            .map(|(t, v)| format!("{}={v}", t.path()))
            .collect(),
        memory_max: s.memory_max.clone(),
        figures,
        effect,
        slept_ms: clock.slept_ns / 1_000_000,
        khugepaged_clock,
        kills: obs
            .kills
            .iter()
            .map(|k| format!("line {}: {}", k.line, k.message))
            .collect(),
        why: fold,
    })
}

/// Runs every setting, at most `jobs` at once, each on its own thread
/// reading the file itself: the predictions in the order of the settings
/// (the same as one after the other: each has its own model), or the
/// first setting's error.
pub(crate) fn run_all(
    settings: &[PredictSetting],
    path: &Path,
    file: &str,
    why: bool,
    jobs: usize,
) -> Result<Vec<Prediction>> {
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<Prediction>>>> =
        settings.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, settings.len().max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(s) = settings.get(i) else { break };
                let r = run_one(s, path, file, why);
                *results[i].lock().expect("no thread panics holding it") = Some(r);
            });
        }
    });
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .expect("no thread panics holding it")
                .expect("every setting ran")
        })
        .collect()
}

/// The recording's header, if the file is one: refused when it was
/// recorded on a kernel other than the model's.
fn check_header(path: &Path, file: &str) -> Result<Option<RecordingHeader>> {
    let header = read_header(path)?;
    if let Some(h) = &header {
        let model = hugelab_model::LINUX_VERSION;
        if !h.kernel_is(model) {
            bail!(
                "{file} was recorded on Linux {}, but the model follows Linux {model}: \
                 record the program on a {model} kernel to predict it",
                h.kernel
            );
        }
    }
    Ok(header)
}

pub fn main(args: PredictArgs) -> Result<ExitCode> {
    let specs: Vec<String> = if args.settings.is_empty() {
        SERIES_SETTINGS.iter().map(|s| s.to_string()).collect()
    } else {
        args.settings.clone()
    };
    let settings = parse_predict_settings(&specs)?;
    let file = args.file.display().to_string();
    if !args.file.exists() {
        bail!("{file}: no such workload file");
    }
    let header = check_header(&args.file, &file)?;
    let jobs = match args.jobs {
        Some(0) => bail!("--jobs 0: at least one setting must run at a time"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let predictions = run_all(&settings, &args.file, &file, args.why, jobs)?;
    let notes = predict_report::notes(header.as_ref(), &predictions);
    if let Some(plot) = &args.plot {
        predict_report::write_plot(&file, &predictions, plot)
            .with_context(|| format!("--plot {}", plot.display()))?;
    }
    if args.json {
        let doc = predict_report::to_json(&file, header.as_ref(), &predictions, &notes);
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", predict_report::render(&file, &predictions, &notes));
    if args.why {
        print!("{}", predict_why::render(&predictions));
    }
    Ok(ExitCode::SUCCESS)
}
