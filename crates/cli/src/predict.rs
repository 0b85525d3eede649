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

use crate::predict_report::{self, Figures, LayoutSpread, Prediction};
use crate::predict_why::{self, WhyFold};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use hugelab_compare::setting::{parse_settings, run_under, Setting, MEMORY_MAX, SERIES_SETTINGS};
use hugelab_model::Model;
use hugelab_workload::gone::Gone;
use hugelab_workload::layout::Relayout;
use hugelab_workload::prelude::SettingEffect;
use hugelab_workload::recorded::{read_header, RecordingHeader};
use hugelab_workload::{
    parse, stream_file, Backend, BackendError, BackendErrorKind, Lookahead, Observation, Reading,
    Stmt, StmtKind,
};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The memory cgroup the workload's processes run in.
pub const CGROUP: &str = "predicted";

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
    /// Replay in N address layouts: the recording's, and N-1 as address-space
    /// randomisation places other runs of the program; each figure is then
    /// also given as its mean and range over them (under THP, where a VMA
    /// starts modulo 2 MiB changes the faults from run to run).
    #[arg(long, value_name = "N", default_value_t = 1)]
    layouts: usize,
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

/// Parses each `--setting` as `compare` and `bench` read one; its
/// `memory.max=SIZE` becomes the limit of the cgroup the program runs in.
pub(crate) fn parse_predict_settings(specs: &[String]) -> Result<Vec<PredictSetting>> {
    parse_settings(specs)?
        .into_iter()
        .zip(specs)
        .map(|(setting, spec)| {
            let memory_max = setting.memory_max.map(memory_max_text);
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

/// A limit in bytes as the language writes a size: the largest whole unit.
fn memory_max_text(bytes: u64) -> String {
    [(30, "G"), (20, "M"), (10, "K")]
        .iter()
        .find(|(shift, _)| bytes >= 1 << shift && bytes.is_multiple_of(1 << shift))
        .map_or(bytes.to_string(), |(shift, unit)| {
            format!("{}{unit}", bytes >> shift)
        })
}

/// What a run keeps beside the model: the recording's clock, the
/// processes an OOM kill ended, and the address layout it replays in.
struct Replay {
    /// The sum of the workload's `sleep`s, in ns.
    slept_ns: u64,
    /// Processes the OOM killer killed, and the children and threads they
    /// would have made after: the recording goes on naming them, the
    /// prediction leaves their statements out (a killed program does
    /// nothing more).
    dead: BTreeSet<String>,
    relayout: Relayout,
}

impl Replay {
    fn new(layout: usize) -> Replay {
        Replay {
            slept_ns: 0,
            dead: BTreeSet::new(),
            relayout: Relayout::new(layout as u64),
        }
    }
}

/// The workload's statement as predict runs it: a `spawn` without a
/// cgroup joins [`CGROUP`]; snapshots and counter expects are dropped, and
/// so is what a killed process would have done; addresses move to the
/// replay's layout.
fn edit(mut stmt: Stmt, replay: &RefCell<Replay>) -> Option<Stmt> {
    let mut r = replay.borrow_mut();
    r.relayout.apply(&mut stmt.kind);
    if let Some(proc) = stmt.kind.process() {
        if r.dead.contains(proc) {
            match &stmt.kind {
                StmtKind::Fork(f) => r.dead.insert(f.child.clone()),
                StmtKind::Thread(t) => r.dead.insert(t.thread.clone()),
                _ => false,
            };
            return None;
        }
    }
    match &mut stmt.kind {
        StmtKind::Spawn(s) => {
            r.dead.remove(&s.proc);
            s.cgroup.get_or_insert_with(|| CGROUP.to_string());
        }
        StmtKind::Snapshot(_) | StmtKind::Expect(_) => return None,
        StmtKind::Sleep(s) => r.slept_ns += s.ns,
        _ => {}
    }
    Some(stmt)
}

/// A backend that notes in [`Replay::dead`] each process the run kills.
struct Killable<'a> {
    inner: &'a mut dyn Backend,
    replay: &'a RefCell<Replay>,
}

impl Backend for Killable<'_> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        let r = self.inner.execute(stmt);
        self.note(&r);
        r
    }
    fn execute_retiring(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        let r = self.inner.execute_retiring(stmt, gone);
        self.note(&r);
        r
    }
    fn read(&mut self) -> Result<Reading, BackendError> {
        self.inner.read()
    }
    fn read_counter(&mut self, name: &str) -> Option<Result<Reading, BackendError>> {
        self.inner.read_counter(name)
    }
    fn prepare(&mut self, ahead: &Lookahead) -> Result<(), BackendError> {
        self.inner.prepare(ahead)
    }
    fn needs_lookahead(&self) -> bool {
        self.inner.needs_lookahead()
    }
}

impl Killable<'_> {
    fn note(&self, r: &Result<(), BackendError>) {
        if let Err(BackendError {
            kind: BackendErrorKind::Killed { proc, .. },
            ..
        }) = r
        {
            self.replay.borrow_mut().dead.insert(proc.clone());
        }
    }
}

/// The workload under `s` on `backend`, with what predict changes.
fn replay_on(
    s: &PredictSetting,
    backend: &mut dyn Backend,
    path: &Path,
    file: &str,
    replay: &RefCell<Replay>,
) -> Result<(Observation, SettingEffect)> {
    let before = std::slice::from_ref(&s.cgroup);
    let stmts = stream_file(path)?;
    let mut killable = Killable {
        inner: backend,
        replay,
    };
    let edit = |stmt| edit(stmt, replay);
    run_under(&s.setting, &mut killable, file, stmts, before, edit)
}

/// Runs the workload at `path` under `s` in address layout `layout` on a
/// fresh model (traced and folded for `--why`): its figures.
fn run_one(
    s: &PredictSetting,
    path: &Path,
    file: &str,
    why: bool,
    layout: usize,
) -> Result<Prediction> {
    let replay = RefCell::new(Replay::new(layout));
    let (obs, effect, model, fold) = if why {
        let mut fold = WhyFold::default();
        let mut e = crate::explain::Explaining::all(Model::default(), |x| fold.add(&x));
        let (obs, effect) = replay_on(s, &mut e, path, file, &replay)?;
        let model = e.model;
        (obs, effect, model, Some(fold))
    } else {
        let mut model = Model::default();
        let (obs, effect) = replay_on(s, &mut model, path, file, &replay)?;
        (obs, effect, model, None)
    };
    let clock = replay.into_inner();
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
        layouts: None,
    })
}

/// Runs every setting in every layout, at most `jobs` runs at once, each on
/// its own thread reading the file itself: the predictions in the order of
/// the settings (the same as one after the other: each has its own model),
/// each the recording's layout's with the spread over `layouts`, or the
/// first run's error. `--why` folds the recording's layout only.
pub(crate) fn run_all(
    settings: &[PredictSetting],
    path: &Path,
    file: &str,
    why: bool,
    jobs: usize,
    layouts: usize,
) -> Result<Vec<Prediction>> {
    let layouts = layouts.max(1);
    let units = settings.len() * layouts;
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<Prediction>>>> =
        (0..units).map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, units.max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= units {
                    break;
                }
                let (s, layout) = (&settings[i / layouts], i % layouts);
                let r = run_one(s, path, file, why && layout == 0, layout);
                *results[i].lock().expect("no thread panics holding it") = Some(r);
            });
        }
    });
    let mut runs = results.into_iter().map(|r| {
        r.into_inner()
            .expect("no thread panics holding it")
            .expect("every run ran")
    });
    let mut out = Vec::with_capacity(settings.len());
    for _ in settings {
        let mut mine: Vec<Prediction> = runs.by_ref().take(layouts).collect::<Result<_>>()?;
        let spread = (layouts > 1).then(|| LayoutSpread::of(mine.iter().map(|p| &p.figures)));
        let mut first = mine.swap_remove(0);
        first.layouts = spread;
        out.push(first);
    }
    Ok(out)
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

/// The settings given, or the mTHP series' when none was.
pub(crate) fn settings_or_series(specs: &[String]) -> Vec<String> {
    if specs.is_empty() {
        SERIES_SETTINGS.iter().map(|s| s.to_string()).collect()
    } else {
        specs.to_vec()
    }
}

/// What predict computes: the recording's header (if the file is one),
/// each setting's prediction in order, and the notes under the tables.
pub(crate) struct Predicted {
    pub(crate) header: Option<RecordingHeader>,
    pub(crate) predictions: Vec<Prediction>,
    pub(crate) notes: Vec<String>,
    /// How many settings ran at once.
    pub(crate) jobs: usize,
}

/// Checks `specs` against the model and the file's header, then replays
/// `path` under each setting, `jobs` at once (default: one per CPU).
pub(crate) fn predict(
    path: &Path,
    specs: &[String],
    jobs: Option<usize>,
    why: bool,
    layouts: usize,
) -> Result<Predicted> {
    if layouts == 0 {
        bail!("--layouts 0: at least the recording's own layout must run");
    }
    let settings = parse_predict_settings(specs)?;
    let file = path.display().to_string();
    if !path.exists() {
        bail!("{file}: no such workload file");
    }
    let header = check_header(path, &file)?;
    let jobs = match jobs {
        Some(0) => bail!("--jobs 0: at least one setting must run at a time"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let predictions = run_all(&settings, path, &file, why, jobs, layouts)?;
    let notes = predict_report::notes(header.as_ref(), &predictions);
    Ok(Predicted {
        header,
        predictions,
        notes,
        jobs,
    })
}

pub fn main(args: PredictArgs) -> Result<ExitCode> {
    let specs = settings_or_series(&args.settings);
    let Predicted {
        header,
        predictions,
        notes,
        ..
    } = predict(&args.file, &specs, args.jobs, args.why, args.layouts)?;
    let file = args.file.display().to_string();
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
        let folds: Vec<(&str, &WhyFold)> = predictions
            .iter()
            .filter_map(|p| Some((p.setting.as_str(), p.why.as_ref()?)))
            .collect();
        print!("{}", predict_why::render(&folds));
    }
    Ok(ExitCode::SUCCESS)
}
