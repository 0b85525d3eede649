//! `hugelab diff`: each workload on the model and on this machine's kernel,
//! every counter both report side by side, every mismatch marked.
//!
//! The model starts from the machine's current tunables, so that a workload
//! that sets only some of them means the same on both sides. A counter the
//! kernel backend could not read reliably is `unknown`, never a number. A few
//! kernel counters count attempts rather than outcomes, or depend on state the
//! workload does not control; they are compared as bounds, which the counter
//! registry (`hugelab_workload::counters`) declares with the reason. A
//! statement whose system call failed on either side is compared by errno,
//! one during which a process was killed on either side by signal.
//!
//! A workload is deterministic, so a counter that is unknown because of
//! *noise* (another process's activity in its window: [`diff_noise`]) is
//! measured again: the workload runs again on the kernel, up to `--retries`
//! more times, while a counter is noisy in every run so far, or unknown
//! because of where the run's folios were placed (kpageflags reading 0 for
//! their pages: [`diff_noise::depends_on_placement`]; such a re-run holds
//! [`PLACEMENT_DECOY`] of memory, so the pages the last run freed go
//! elsewhere). The model runs
//! once. Each counter is taken from a run in which it was known or else not
//! noisy ([`combine`]), never from a noisy run when a clean one exists, and never
//! chosen for agreeing with the model: a mismatch in any clean run is a
//! mismatch, whatever the other runs read. What is noisy in every run is
//! counted apart (`noisy`), as is what is unknown by construction; `diff`
//! fails on mismatches, and on noisy counters with `--strict`.

use crate::diff_noise;
use crate::kernel_limit::{kernel_run_planned, plan, print_dry_run, KernelLimitArgs};
use crate::table;
use crate::workload_args::{CounterOutput, WorkloadFiles};
use anyhow::Result;
use clap::Args;
use hugelab_kernel::sysfs;
use hugelab_model::Model;
use hugelab_workload::counters::{self, BoundKind};
use hugelab_workload::{
    run_file, stmt, Backend, BackendErrorKind, Errno, ExpectOutcome, Observation, Pos, RunError,
    Signal, Snapshot, Stmt, StmtKind, Tunable,
};
use serde::Serialize;
use std::path::Path;
use std::process::ExitCode;

/// `run`'s arguments without `--backend` and `--counter`, each help in
/// diff's words.
#[derive(Args)]
#[command(
    mut_arg("json", |a| a.help("Print one JSON document for all workloads instead of tables")),
    mut_arg("all", |a| a.help("Show every compared counter, zeros included")),
    mut_arg("check", |a| a.help("Check the model's invariants after every statement (slower)")),
    mut_arg("files", |a| a.help(
        "Workload files (.hlw, .hlw.gz, .hlw.zst), each read as a stream, once per backend"
    )),
)]
pub struct DiffArgs {
    #[command(flatten)]
    output: CounterOutput,
    /// Run a workload on the kernel up to N more times while a counter is
    /// noisy (another process's activity in its window), or unknown because
    /// /proc/kpageflags read 0 for its folios' pages, in every run so far;
    /// each counter is taken from a run in which it was not
    #[arg(long, value_name = "N", default_value_t = 4)]
    retries: usize,
    /// Fail (exit 1) on counters still noisy after the retries too, not
    /// only on mismatches
    #[arg(long)]
    strict: bool,
    #[command(flatten)]
    limits: KernelLimitArgs,
    #[command(flatten)]
    workloads: WorkloadFiles,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Verdict {
    Match,
    Mismatch,
    WithinBound,
    /// Unknown on the kernel because of noise ([`diff_noise`]).
    Noisy,
    /// Unknown on the kernel by construction: every run has the reason.
    Unknown,
}

impl Verdict {
    /// Match when both sides agree, else Mismatch.
    fn same(equal: bool) -> Verdict {
        if equal {
            Verdict::Match
        } else {
            Verdict::Mismatch
        }
    }

    /// Noisy or Unknown, as the kernel's reason says.
    fn unknown(why: &str) -> Verdict {
        if diff_noise::is_noise(why) {
            Verdict::Noisy
        } else {
            Verdict::Unknown
        }
    }
}

#[derive(Clone, Serialize)]
struct Row {
    snapshot: String,
    counter: String,
    model: i64,
    kernel: Option<i64>,
    verdict: Verdict,
    /// Which kernel run (1: the first) the kernel's value is from.
    kernel_run: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    /// When the kernel's value is unknown: its change since the snapshot
    /// before, if the kernel run still knows it (see [`stitch`]).
    #[serde(skip)]
    change: Option<i64>,
}

#[derive(Clone, Serialize)]
struct FailedExpect {
    backend: String,
    #[serde(flatten)]
    outcome: ExpectOutcome,
}

/// A statement whose system call failed on at least one side.
#[derive(Clone, Serialize)]
struct CallRow {
    line: u32,
    statement: String,
    model: Errno,
    kernel: Errno,
    verdict: Verdict,
}

/// A statement during which a process was killed on at least one side:
/// the signal on each (0: not killed).
#[derive(Clone, Serialize)]
struct KillRow {
    line: u32,
    statement: String,
    process: String,
    model: Signal,
    kernel: Signal,
    verdict: Verdict,
}

#[derive(Serialize)]
struct WorkloadDiff {
    workload: String,
    /// How many times the workload ran on the kernel (1 + the retries
    /// its noisy counters took).
    kernel_runs: usize,
    rows: Vec<Row>,
    calls: Vec<CallRow>,
    kills: Vec<KillRow>,
    failed_expects: Vec<FailedExpect>,
}

impl WorkloadDiff {
    /// Every verdict: the counters', the calls' and the kills'.
    fn verdicts(&self) -> impl Iterator<Item = Verdict> + '_ {
        self.rows
            .iter()
            .map(|r| r.verdict)
            .chain(self.calls.iter().map(|c| c.verdict))
            .chain(self.kills.iter().map(|k| k.verdict))
    }

    fn count(&self, verdict: Verdict) -> usize {
        self.verdicts().filter(|v| *v == verdict).count()
    }

    /// Whether a re-run may read what this comparison could not: a noisy
    /// counter, or one unknown because of where its folios were placed.
    fn worth_a_rerun(&self) -> bool {
        self.count(Verdict::Noisy) > 0 || self.rows.iter().any(Row::placed_unknown)
    }
}

impl Row {
    /// Unknown because kpageflags read 0 for its folios' pages in this run.
    fn placed_unknown(&self) -> bool {
        self.verdict == Verdict::Unknown
            && self
                .note
                .as_deref()
                .is_some_and(diff_noise::depends_on_placement)
    }
}

/// A workload this machine cannot run now (`BackendErrorKind::Unavailable`)
/// or whose statements the kernel backend does not execute (model-only:
/// `BackendErrorKind::Unsupported`): neither passed nor failed.
#[derive(Serialize)]
struct Skipped {
    workload: String,
    reason: String,
}

#[derive(Default, Serialize)]
struct Totals {
    workloads: usize,
    skipped: usize,
    /// The kernel runs of the workloads compared, retries included.
    kernel_runs: usize,
    compared: usize,
    matches: usize,
    mismatches: usize,
    within_bound: usize,
    /// Unknown in every kernel run because of noise.
    noisy: usize,
    /// Unknown by construction.
    unknown: usize,
    failed_expects: usize,
}

impl Totals {
    fn add(&mut self, d: &WorkloadDiff) {
        self.kernel_runs += d.kernel_runs;
        for v in d.verdicts() {
            self.compared += 1;
            match v {
                Verdict::Match => self.matches += 1,
                Verdict::Mismatch => self.mismatches += 1,
                Verdict::WithinBound => self.within_bound += 1,
                Verdict::Noisy => self.noisy += 1,
                Verdict::Unknown => self.unknown += 1,
            }
        }
        self.failed_expects += d.failed_expects.len();
    }

    fn line(&self) -> String {
        format!(
            "{} workloads ({} skipped on the kernel: model-only, or not possible here now; {} kernel runs), {} counters compared: {} matches, {} mismatches, {} within declared bounds, {} noisy (another process's activity in every run), {} unknown by construction; {} failed expectations",
            self.workloads,
            self.skipped,
            self.kernel_runs,
            self.compared,
            self.matches,
            self.mismatches,
            self.within_bound,
            self.noisy,
            self.unknown,
            self.failed_expects
        )
    }
}

/// What one workload gave.
enum Outcome {
    Compared(WorkloadDiff),
    Skipped(Skipped),
}

pub fn main(args: DiffArgs) -> Result<ExitCode> {
    if args.limits.dry_run {
        print_dry_run(&args.workloads.files, &args.limits)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut diffs = Vec::new();
    let mut skipped = Vec::new();
    let mut totals = Totals::default();
    for file in &args.workloads.files {
        totals.workloads += 1;
        match diff_file(file, &args)? {
            Outcome::Skipped(s) => {
                totals.skipped += 1;
                if !args.output.json {
                    print!("# {}\nSKIPPED on the kernel: {}\n\n", s.workload, s.reason);
                }
                skipped.push(s);
            }
            Outcome::Compared(d) => {
                totals.add(&d);
                if !args.output.json {
                    print!("{}", render(&d, args.output.all));
                }
                diffs.push(d);
            }
        }
    }
    if args.output.json {
        let doc = serde_json::json!({ "workloads": diffs, "skipped": skipped, "totals": totals });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("{}", totals.line());
        let placed = diffs.iter().any(|d| d.rows.iter().any(Row::placed_unknown));
        if let Some(hint) = placed.then(uninitialised_hint).flatten() {
            println!("{hint}");
        }
    }
    let noisy_fails = args.strict && totals.noisy > 0;
    Ok(
        if totals.mismatches > 0 || totals.failed_expects > 0 || noisy_fails {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        },
    )
}

/// Where folios were unknown for their placement and the kernel has memory
/// it has not initialised (whose pages read 0 in /proc/kpageflags), the
/// sentence that says so and how to finish it.
fn uninitialised_hint() -> Option<String> {
    let u = hugelab_kernel::meminit::uninitialised().ok()?;
    (!u.blocks.is_empty()).then(|| {
        format!(
            "note: {} MiB of this machine's memory is not yet initialised by the kernel (deferred init), and /proc/kpageflags reads 0 for its pages, hence the folios unknown by placement; `hugelab settings init-memory` makes the kernel finish",
            u.bytes() >> 20
        )
    })
}

/// Whether a kernel run's error says the machine cannot run the workload
/// now, or the kernel backend cannot run it at all.
fn is_skip(e: &anyhow::Error) -> bool {
    e.downcast_ref::<RunError>()
        .is_some_and(|e| e.is_unavailable() || e.is_unsupported())
}

/// The memory a re-run after folios unknown for their placement holds
/// while it runs (`meminit::hold_recently_freed`).
const PLACEMENT_DECOY: u64 = 64 << 20;

/// One workload on the model, once, and on the kernel, again while a
/// counter is noisy, or unknown by placement, in every run so far (at most
/// `--retries` more times).
fn diff_file(file: &Path, args: &DiffArgs) -> Result<Outcome> {
    // Refused before either side runs: the model would fail on its own
    // machine's memory first.
    let plan = plan(file, &args.limits)?;
    let model_side = |found: &dyn Fn(&Tunable) -> Result<String>| -> Result<Observation> {
        let mut model = model_from(found)?;
        if args.workloads.check {
            model = model.with_invariant_checks();
        }
        Ok(run_file(&mut model, file)?)
    };
    // The model starts from the tunables the kernel run finds under the
    // settings lock: read before it, they could be another run's.
    let mut model_run = None;
    let first = kernel_run_planned(&plan, |k| {
        model_run = Some(model_side(&|t| Ok(k.found_tunable(t)?))?);
        Ok(run_file(k, file)?)
    });
    let model_obs = match model_run {
        Some(obs) => obs,
        // No kernel backend here: the machine's tunables as they are.
        None => model_side(&|t| Ok(sysfs::read_tunable(t)?))?,
    };
    let context = || format!("{}: kernel backend", file.display());
    let first = match first {
        Ok(obs) => obs,
        Err(e) if is_skip(&e) => {
            return Ok(Outcome::Skipped(Skipped {
                workload: model_obs.workload.clone(),
                reason: e.to_string(),
            }))
        }
        Err(e) => return Err(e.context(context())),
    };
    let mut runs = vec![compare(&model_obs, &first)];
    let mut d = combine(&runs);
    while d.worth_a_rerun() && d.kernel_runs <= args.retries {
        // Folios unknown for their placement would get the same pages
        // again: the memory freed last is held meanwhile (best effort, and
        // only where it is a sliver of what is free, so that no THP fault
        // of the workload can fall back for want of it).
        let roomy =
            hugelab_kernel::hugetlb::mem_available().is_ok_and(|(a, _)| a >= PLACEMENT_DECOY * 64);
        let placed = roomy && d.rows.iter().any(Row::placed_unknown);
        let _decoy = placed
            .then(|| hugelab_kernel::meminit::hold_recently_freed(PLACEMENT_DECOY).ok())
            .flatten();
        match kernel_run_planned(&plan, |k| Ok(run_file(k, file)?)) {
            Ok(obs) => runs.push(compare(&model_obs, &obs)),
            // The machine cannot run it again now (a pool it could fill
            // a moment ago): the runs so far stand.
            Err(e) if is_skip(&e) => break,
            Err(e) => return Err(e.context(context())),
        }
        d = combine(&runs);
    }
    Ok(Outcome::Compared(d))
}

/// The comparison of one workload from the comparisons of its kernel runs
/// (first run first): each counter from the first run in which it was
/// known, else the first in which it was not noisy (unknown by placement
/// or construction), or from the first clean run that mismatches, if one does — a
/// mismatch in a clean window is a mismatch even if another run matches:
/// the runs are not searched for agreement. A counter noisy in every run is
/// taken from the first. The calls and kills are taken from the first run
/// whose calls or kills mismatch, else from the first; the failed
/// expectations of every run are kept (each once).
fn combine(runs: &[WorkloadDiff]) -> WorkloadDiff {
    let mut rows: Vec<Vec<Row>> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for (n, run) in runs.iter().enumerate() {
        for row in &run.rows {
            let key = (row.snapshot.as_str(), row.counter.as_str());
            let i = *index.entry(key).or_insert_with(|| {
                rows.push(Vec::new());
                rows.len() - 1
            });
            rows[i].push(Row {
                kernel_run: n + 1,
                ..row.clone()
            });
        }
    }
    let mut failed_expects: Vec<FailedExpect> = Vec::new();
    for f in runs.iter().flat_map(|r| &r.failed_expects) {
        let key = |g: &FailedExpect| (g.backend.clone(), g.outcome.line, g.outcome.col);
        if !failed_expects.iter().any(|g| key(g) == key(f)) {
            failed_expects.push(f.clone());
        }
    }
    let mismatched = |d: &&WorkloadDiff| {
        d.calls
            .iter()
            .map(|c| c.verdict)
            .chain(d.kills.iter().map(|k| k.verdict))
            .any(|v| v == Verdict::Mismatch)
    };
    let taken = runs.iter().find(mismatched).unwrap_or(&runs[0]);
    WorkloadDiff {
        workload: taken.workload.clone(),
        kernel_runs: runs.len(),
        rows: stitch(rows),
        calls: taken.calls.clone(),
        kills: taken.kills.clone(),
        failed_expects,
    }
}

/// Each counter's row at each snapshot from its rows of the runs (`rows`:
/// one group per snapshot and counter, in the order of the snapshots, each
/// in run order), as [`pick`] chooses; a counter still noisy at a snapshot
/// whose value at the snapshot before is known (from any run, or itself
/// stitched) and whose change since is known in some run (the first such)
/// gets the sum: the workload is deterministic, so the change is the same
/// in every run whose windows were clean for it. The value is then
/// compared with the model's as any other, and the note says where its two
/// parts come from. Counters compared by a sum with another are not
/// stitched.
fn stitch(groups: Vec<Vec<Row>>) -> Vec<Row> {
    let mut order: Vec<String> = Vec::new();
    for g in &groups {
        if !order.contains(&g[0].snapshot) {
            order.push(g[0].snapshot.clone());
        }
    }
    let at = |label: &str| order.iter().position(|l| l == label).unwrap_or(0);
    // Counter → (snapshot index, kernel value, run) of its latest known row.
    let mut known: std::collections::HashMap<String, (usize, i64, usize)> = Default::default();
    let mut out = Vec::with_capacity(groups.len());
    for group in groups {
        let changes: Vec<(usize, i64)> = group
            .iter()
            .filter_map(|r| r.change.map(|d| (r.kernel_run, d)))
            .collect();
        let mut row = pick(group);
        let i = at(&row.snapshot);
        let sum_partner =
            counters::bound(&row.counter).is_some_and(|b| matches!(b.kind, BoundKind::SumWith(_)));
        if let (Verdict::Noisy, false, Some(&(j, before, from)), Some(&(run, d))) = (
            row.verdict,
            sum_partner,
            known.get(&row.counter),
            changes.first(),
        ) {
            if j + 1 == i {
                let k = before + d;
                let (verdict, bound) = verdict_of(&row.counter, row.model, k);
                let how = format!(
                    "{} from kernel run {from}, the change since ({d:+}) from run {run}",
                    order[j]
                );
                row.note = Some(bound.map_or(how.clone(), |b| format!("{b}; {how}")));
                (row.kernel, row.verdict, row.kernel_run) = (Some(k), verdict, run);
            }
        }
        if let Some(k) = row.kernel {
            known.insert(row.counter.clone(), (i, k, row.kernel_run));
        }
        out.push(row);
    }
    out
}

/// One counter's row from its rows of the runs, in run order (see
/// [`combine`]).
fn pick(mut rows: Vec<Row>) -> Row {
    let clean = |r: &Row| r.verdict != Verdict::Noisy;
    let known = |r: &Row| clean(r) && !r.placed_unknown();
    let at = rows
        .iter()
        .position(|r| clean(r) && r.verdict == Verdict::Mismatch)
        .or_else(|| rows.iter().position(known))
        .or_else(|| rows.iter().position(clean))
        .unwrap_or(0);
    rows.swap_remove(at)
}

/// A model whose tunables are this machine's values as `found` gives them,
/// with the CPU's protection keys if it has them (a `machine pkeys=` line
/// overrides both sides: the kernel backend refuses the other shape).
/// Tunables the model does not model (sysctls, hugetlb pools) are left out.
fn model_from(found: &dyn Fn(&Tunable) -> Result<String>) -> Result<Model> {
    let mut model = Model::default().with_pkeys(hugelab_kernel::machine::protection_keys());
    for tunable in sysfs::known_tunables() {
        let text = found(&tunable)?;
        let value = tunable
            .parse_value(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", sysfs::tunable_file(&tunable).display()))?;
        let stmt = Stmt {
            pos: Pos::default(),
            kind: StmtKind::Set(stmt::Set { tunable, value }),
        };
        match model.execute(&stmt) {
            Ok(()) => {}
            Err(e) if e.kind == BackendErrorKind::Unsupported => {}
            // A file the kernel refuses to write whatever it holds
            // (a gigantic pool's nr_overcommit_hugepages): nothing to copy.
            Err(e) if matches!(e.kind, BackendErrorKind::Errno(_)) => {}
            Err(e) => anyhow::bail!(
                "the model cannot start from this machine's {stmt}: {}",
                e.message
            ),
        }
    }
    Ok(model)
}

fn compare(model: &Observation, kernel: &Observation) -> WorkloadDiff {
    let mut rows = Vec::new();
    for ms in &model.snapshots {
        let Some(ks) = kernel.snapshots.iter().find(|k| k.label == ms.label) else {
            continue;
        };
        for (name, &m) in &ms.counters {
            let (kernel, verdict, note) = match (ks.counters.get(name), ks.unknown.get(name)) {
                (Some(&k), _) => match counters::bound(name) {
                    Some(b) if k != m && matches!(b.kind, BoundKind::SumWith(_)) => {
                        let (verdict, note) = by_sum(name, m, k, ms, ks, b.why);
                        (Some(k), verdict, note)
                    }
                    _ => {
                        let (verdict, note) = verdict_of(name, m, k);
                        (Some(k), verdict, note)
                    }
                },
                (None, Some(why)) => (None, Verdict::unknown(why), Some(why.clone())),
                (None, None) => continue,
            };
            rows.push(Row {
                snapshot: ms.label.clone(),
                counter: name.clone(),
                model: m,
                kernel,
                verdict,
                kernel_run: 1,
                note,
                change: kernel
                    .is_none()
                    .then(|| ks.changes.get(name).copied())
                    .flatten(),
            });
        }
    }
    let failed_expects = [model, kernel]
        .iter()
        .flat_map(|o| {
            o.failed_expects().map(|e| FailedExpect {
                backend: o.backend.clone(),
                outcome: e.clone(),
            })
        })
        .collect();
    WorkloadDiff {
        workload: model.workload.clone(),
        kernel_runs: 1,
        rows,
        calls: compare_calls(model, kernel),
        kills: compare_kills(model, kernel),
        failed_expects,
    }
}

/// Every process killed on either side, by line and process: the signals
/// must be the same.
fn compare_kills(model: &Observation, kernel: &Observation) -> Vec<KillRow> {
    let mut keys: Vec<(u32, &str, &str)> = model
        .kills
        .iter()
        .chain(&kernel.kills)
        .map(|k| (k.line, k.process.as_str(), k.statement.as_str()))
        .collect();
    keys.sort();
    keys.dedup_by_key(|(line, proc, _)| (*line, *proc));
    let signal = |o: &Observation, line, proc: &str| {
        o.kills
            .iter()
            .find(|k| k.line == line && k.process == proc)
            .map_or(Signal::NONE, |k| k.signal)
    };
    keys.into_iter()
        .map(|(line, proc, statement)| {
            let (m, k) = (signal(model, line, proc), signal(kernel, line, proc));
            KillRow {
                line,
                statement: statement.to_string(),
                process: proc.to_string(),
                model: m,
                kernel: k,
                verdict: Verdict::same(m == k),
            }
        })
        .collect()
}

/// Every statement that failed on either side, by line: the errnos must be
/// the same.
fn compare_calls(model: &Observation, kernel: &Observation) -> Vec<CallRow> {
    let mut lines: Vec<(u32, &str)> = model
        .failed_calls
        .iter()
        .chain(&kernel.failed_calls)
        .map(|c| (c.line, c.statement.as_str()))
        .collect();
    lines.sort();
    lines.dedup_by_key(|(line, _)| *line);
    let errno = |o: &Observation, line| {
        o.failed_calls
            .iter()
            .find(|c| c.line == line)
            .map_or(Errno::OK, |c| c.errno)
    };
    lines
        .into_iter()
        .map(|(line, statement)| {
            let (m, k) = (errno(model, line), errno(kernel, line));
            CallRow {
                line,
                statement: statement.to_string(),
                model: m,
                kernel: k,
                verdict: Verdict::same(m == k),
            }
        })
        .collect()
}

/// A kernel value against the model's: equal, within the counter's
/// declared bound (not a sum with another), or a mismatch.
fn verdict_of(name: &str, model: i64, kernel: i64) -> (Verdict, Option<String>) {
    if kernel == model {
        return (Verdict::Match, None);
    }
    match counters::bound(name) {
        Some(b) if within(b.kind, model, kernel) => (Verdict::WithinBound, Some(b.why.to_string())),
        _ => (Verdict::Mismatch, None),
    }
}

fn within(kind: BoundKind, model: i64, kernel: i64) -> bool {
    match kind {
        BoundKind::KernelAtLeastModel => kernel >= model,
        BoundKind::KernelAtMostModel => kernel <= model,
        BoundKind::KernelAboveModelBy(n) => kernel >= model && kernel - model <= n,
        BoundKind::SumWith(_) => false,
    }
}

/// A counter compared by its sum with its partner (`BoundKind::SumWith`),
/// whose own values differ (`model` != `kernel`): within the bound when
/// the two sums are equal (the note says why), unknown when the kernel
/// could not read the partner, a mismatch otherwise (also when a side does
/// not report the partner).
fn by_sum(
    name: &str,
    model: i64,
    kernel: i64,
    ms: &Snapshot,
    ks: &Snapshot,
    why: &str,
) -> (Verdict, Option<String>) {
    let Some(partner) = counters::sum_partner(name) else {
        return (Verdict::Mismatch, None);
    };
    if let Some(unknown) = ks.unknown.get(&partner) {
        return (
            Verdict::unknown(unknown),
            Some(format!(
                "compared by its sum with {partner}, which is unknown: {unknown}"
            )),
        );
    }
    match (ms.counters.get(&partner), ks.counters.get(&partner)) {
        (Some(mp), Some(kp)) if model + mp == kernel + kp => (
            Verdict::WithinBound,
            Some(format!(
                "{name} is compared by its sum with {partner} ({}): {why}",
                model + mp
            )),
        ),
        _ => (Verdict::Mismatch, None),
    }
}

fn render(d: &WorkloadDiff, all: bool) -> String {
    let header: Vec<String> = ["snapshot", "counter", "model", "kernel", ""]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rows: Vec<Vec<String>> = d
        .rows
        .iter()
        .filter(|r| all || r.verdict != Verdict::Match || r.model != 0)
        .map(|r| {
            vec![
                r.snapshot.clone(),
                r.counter.clone(),
                r.model.to_string(),
                r.kernel.map_or("unknown".to_string(), |k| k.to_string()),
                match r.verdict {
                    Verdict::Match => String::new(),
                    Verdict::Mismatch => "MISMATCH".to_string(),
                    Verdict::WithinBound => "within bound".to_string(),
                    Verdict::Noisy => "noisy".to_string(),
                    Verdict::Unknown => "unknown".to_string(),
                },
            ]
        })
        .collect();
    let mut out = format!("# {}\n{}", d.workload, table::render(&header, &rows));
    for c in &d.calls {
        let verdict = match c.verdict {
            Verdict::Mismatch => "  MISMATCH",
            _ => "",
        };
        out.push_str(&format!(
            "line {}: {}: model {}, kernel {}{verdict}\n",
            c.line, c.statement, c.model, c.kernel
        ));
    }
    for k in &d.kills {
        let verdict = match k.verdict {
            Verdict::Mismatch => "  MISMATCH",
            _ => "",
        };
        let killed = |s: Signal| match s {
            Signal::NONE => "not killed".to_string(),
            s => format!("killed by {s}"),
        };
        out.push_str(&format!(
            "line {}: {}: {}: model {}, kernel {}{verdict}\n",
            k.line,
            k.statement,
            k.process,
            killed(k.model),
            killed(k.kernel)
        ));
    }
    let mut notes: Vec<&String> = d.rows.iter().filter_map(|r| r.note.as_ref()).collect();
    notes.sort();
    notes.dedup();
    for n in notes {
        out.push_str(&format!("note: {n}\n"));
    }
    for f in &d.failed_expects {
        let e = &f.outcome;
        out.push_str(&format!(
            "{}:{}:{}: expect {} {} {} failed on the {}: actual {}\n",
            d.workload,
            e.line,
            e.col,
            e.counter,
            e.op,
            e.show(e.expected),
            f.backend,
            e.actual.map_or("not reported".to_string(), |a| e.show(a))
        ));
    }
    out.push_str(&format!(
        "{} counters compared, {} mismatches, {} noisy; {}\n\n",
        d.verdicts().count(),
        d.count(Verdict::Mismatch),
        d.count(Verdict::Noisy),
        table::plural(d.kernel_runs as u64, "kernel run", "kernel runs")
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hugelab_workload::Kill;

    fn obs(backend: &str, counters: &[(&str, i64)], unknown: &[(&str, &str)]) -> Observation {
        Observation {
            backend: backend.into(),
            workload: "w.hlw".into(),
            snapshots: vec![Snapshot {
                label: "end".into(),
                line: None,
                counters: counters.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
                unknown: unknown
                    .iter()
                    .map(|(n, w)| (n.to_string(), w.to_string()))
                    .collect(),
                changes: Default::default(),
            }],
            expects: Vec::new(),
            failed_calls: Vec::new(),
            kills: Vec::new(),
        }
    }

    fn verdicts(d: &WorkloadDiff) -> Vec<(&str, Verdict)> {
        d.rows
            .iter()
            .map(|r| (r.counter.as_str(), r.verdict))
            .collect()
    }

    const PAGES: &str = "vmstat.nr_memmap_pages";
    const BOOT: &str = "vmstat.nr_memmap_boot_pages";

    #[test]
    fn memmap_counters_are_compared_by_their_sum() {
        // Equal: a match. Different, equal sums: within the bound.
        let model = obs("model", &[(PAGES, -112), (BOOT, 0)], &[]);
        let same = obs("kernel", &[(PAGES, -112), (BOOT, 0)], &[]);
        let moved = obs("kernel", &[(PAGES, 16), (BOOT, -128)], &[]);
        let wrong = obs("kernel", &[(PAGES, 16), (BOOT, -120)], &[]);
        let d = compare(&model, &same);
        assert_eq!(
            verdicts(&d),
            [(BOOT, Verdict::Match), (PAGES, Verdict::Match)]
        );
        let d = compare(&model, &moved);
        assert_eq!(
            verdicts(&d),
            [(BOOT, Verdict::WithinBound), (PAGES, Verdict::WithinBound)]
        );
        let note = d.rows[1].note.as_deref().unwrap();
        assert!(
            note.starts_with(
                "vmstat.nr_memmap_pages is compared by its sum with vmstat.nr_memmap_boot_pages (-112): HVO frees"
            ),
            "{note}"
        );
        let d = compare(&model, &wrong);
        assert_eq!(
            verdicts(&d),
            [(BOOT, Verdict::Mismatch), (PAGES, Verdict::Mismatch)]
        );
        // A partner the kernel could not read makes it unknown.
        let noisy = obs("kernel", &[(PAGES, 16)], &[(BOOT, "another process")]);
        let d = compare(&model, &noisy);
        assert_eq!(d.rows[1].verdict, Verdict::Noisy);
        assert!(d.rows[1]
            .note
            .as_deref()
            .unwrap()
            .contains("another process"));
    }

    fn kill(line: u32, process: &str, signal: Signal) -> Kill {
        Kill {
            line,
            col: 1,
            statement: format!("{process} write buf"),
            process: process.into(),
            signal,
            message: String::new(),
        }
    }

    #[test]
    fn kills_are_compared_line_by_line() {
        let mut model = obs("model", &[], &[]);
        let mut kernel = obs("kernel", &[], &[]);
        model.kills = vec![kill(6, "b", Signal::SIGBUS), kill(9, "c", Signal::SIGBUS)];
        kernel.kills = vec![kill(6, "b", Signal::SIGBUS), kill(12, "a", Signal::SIGKILL)];
        let d = compare(&model, &kernel);
        let got: Vec<(u32, &str, Signal, Signal, Verdict)> = d
            .kills
            .iter()
            .map(|k| (k.line, k.process.as_str(), k.model, k.kernel, k.verdict))
            .collect();
        assert_eq!(
            got,
            [
                (6, "b", Signal::SIGBUS, Signal::SIGBUS, Verdict::Match),
                (9, "c", Signal::SIGBUS, Signal::NONE, Verdict::Mismatch),
                (12, "a", Signal::NONE, Signal::SIGKILL, Verdict::Mismatch),
            ]
        );
        let text = render(&d, false);
        assert!(
            text.contains(
                "line 9: c write buf: c: model killed by SIGBUS, kernel not killed  MISMATCH"
            ),
            "{text}"
        );
        assert!(
            text.contains("3 counters compared, 2 mismatches, 0 noisy; 1 kernel run\n"),
            "{text}"
        );
    }

    const FAULTS: &str = "vmstat.pgfault";
    const ANON: &str = "vmstat.nr_anon_pages";
    const NOISE: &str =
        "another process faulted during line 3 (pgfault +9; the agents' own +1, the runner's +0)";
    const FORKED: &str = "fork (line 2) copied the agent's own memory and page tables too";

    /// (counter, kernel value, verdict, run) of each row of the runs'
    /// combination, by counter name.
    fn combined(runs: &[Observation]) -> Vec<(String, Option<i64>, Verdict, usize)> {
        let model = obs("model", &[(FAULTS, 4), (ANON, 512)], &[]);
        let diffs: Vec<WorkloadDiff> = runs.iter().map(|k| compare(&model, k)).collect();
        let d = combine(&diffs);
        assert_eq!(d.kernel_runs, runs.len());
        d.rows
            .iter()
            .map(|r| (r.counter.clone(), r.kernel, r.verdict, r.kernel_run))
            .collect()
    }

    fn row(
        c: &str,
        k: Option<i64>,
        v: Verdict,
        run: usize,
    ) -> (String, Option<i64>, Verdict, usize) {
        (c.to_string(), k, v, run)
    }

    #[test]
    fn noisy_counters_come_from_the_first_clean_run() {
        let noisy = obs("kernel", &[], &[(FAULTS, NOISE), (ANON, NOISE)]);
        let clean = obs("kernel", &[(FAULTS, 4), (ANON, 512)], &[]);
        let half = obs("kernel", &[(ANON, 512)], &[(FAULTS, NOISE)]);
        assert_eq!(
            combined(&[noisy.clone(), half, clean.clone()]),
            [
                row(ANON, Some(512), Verdict::Match, 2),
                row(FAULTS, Some(4), Verdict::Match, 3),
            ]
        );
        // Noisy in every run: noisy, from the first, with its reason.
        let d = compare(&obs("model", &[(FAULTS, 4)], &[]), &noisy);
        let d = combine(&[d]);
        assert_eq!(d.rows[0].verdict, Verdict::Noisy);
        assert_eq!(d.rows[0].note.as_deref(), Some(NOISE));
        // A clean run never gives way to a noisy one.
        assert_eq!(
            combined(&[clean, noisy]),
            [
                row(ANON, Some(512), Verdict::Match, 1),
                row(FAULTS, Some(4), Verdict::Match, 1),
            ]
        );
    }

    /// Two snapshots, `mid` then `end`, of pgfault alone: (value or noise,
    /// change since `mid` at `end`).
    fn two(mid: Result<i64, &str>, end: Result<i64, &str>, change: Option<i64>) -> Observation {
        let snap = |label: &str, v: Result<i64, &str>, change: Option<i64>| Snapshot {
            label: label.into(),
            line: None,
            counters: v.iter().map(|v| (FAULTS.to_string(), *v)).collect(),
            unknown: v
                .err()
                .map(|w| (FAULTS.to_string(), w.to_string()))
                .into_iter()
                .collect(),
            changes: change
                .map(|d| (FAULTS.to_string(), d))
                .into_iter()
                .collect(),
        };
        let mut o = obs("kernel", &[], &[]);
        o.snapshots = vec![snap("mid", mid, None), snap("end", end, change)];
        o
    }

    /// A counter noisy at `end` in every run: its value at `mid` from one
    /// run and its change since from another make it known, and compared.
    #[test]
    fn a_noisy_value_is_stitched_from_a_clean_value_before_and_a_clean_change_after() {
        let model = two(Ok(3), Ok(7), None);
        // Run 1: mid clean (3), end noisy, its change since mid unknown.
        // Run 2: mid noisy, end noisy, but the change since mid known (+4).
        let runs = [
            two(Ok(3), Err(NOISE), None),
            two(Err(NOISE), Err(NOISE), Some(4)),
        ];
        let d = combine(&runs.iter().map(|k| compare(&model, k)).collect::<Vec<_>>());
        let end = d.rows.iter().find(|r| r.snapshot == "end").unwrap();
        assert_eq!(
            (end.kernel, end.verdict, end.kernel_run),
            (Some(7), Verdict::Match, 2)
        );
        assert!(
            end.note
                .as_deref()
                .unwrap()
                .contains("mid from kernel run 1"),
            "{:?}",
            end.note
        );
        // A change that does not add up to the model's value is a mismatch.
        let runs = [
            two(Ok(3), Err(NOISE), None),
            two(Err(NOISE), Err(NOISE), Some(5)),
        ];
        let d = combine(&runs.iter().map(|k| compare(&model, k)).collect::<Vec<_>>());
        let end = d.rows.iter().find(|r| r.snapshot == "end").unwrap();
        assert_eq!((end.kernel, end.verdict), (Some(8), Verdict::Mismatch));
        // Without a known value before, the change alone says nothing.
        let runs = [two(Err(NOISE), Err(NOISE), Some(4))];
        let d = combine(&runs.iter().map(|k| compare(&model, k)).collect::<Vec<_>>());
        let end = d.rows.iter().find(|r| r.snapshot == "end").unwrap();
        assert_eq!((end.kernel, end.verdict), (None, Verdict::Noisy));
    }

    #[test]
    fn a_mismatch_in_a_clean_run_stays_a_mismatch_whatever_other_runs_read() {
        // Run 1: pgfault clean and wrong, anon noisy. Run 2: both clean and
        // right. The re-run was for anon; pgfault is not shopped for.
        let first = obs("kernel", &[(FAULTS, 5)], &[(ANON, NOISE)]);
        let second = obs("kernel", &[(FAULTS, 4), (ANON, 512)], &[]);
        assert_eq!(
            combined(&[first.clone(), second.clone()]),
            [
                row(ANON, Some(512), Verdict::Match, 2),
                row(FAULTS, Some(5), Verdict::Mismatch, 1),
            ]
        );
        // The other way round: the later clean run's mismatch wins over
        // the earlier match.
        let noisy_anon = obs("kernel", &[(FAULTS, 4)], &[(ANON, NOISE)]);
        let wrong = obs("kernel", &[(FAULTS, 5), (ANON, 512)], &[]);
        assert_eq!(
            combined(&[noisy_anon, wrong]),
            [
                row(ANON, Some(512), Verdict::Match, 2),
                row(FAULTS, Some(5), Verdict::Mismatch, 2),
            ]
        );
    }

    #[test]
    fn folios_unknown_by_placement_come_from_a_run_that_read_them() {
        const PLACED: &str =
            "/proc/kpageflags read 0 for 3 pages of a's region r, so their folios are not known";
        let placed = obs("kernel", &[(FAULTS, 4)], &[(ANON, PLACED)]);
        let d = compare(&obs("model", &[(FAULTS, 4), (ANON, 512)], &[]), &placed);
        // Not noise, yet worth a re-run.
        assert_eq!(d.count(Verdict::Noisy), 0);
        assert!(d.worth_a_rerun());
        let read = obs("kernel", &[(FAULTS, 4), (ANON, 512)], &[]);
        assert_eq!(
            combined(&[placed.clone(), read]),
            [
                row(ANON, Some(512), Verdict::Match, 2),
                row(FAULTS, Some(4), Verdict::Match, 1),
            ]
        );
        // Unknown by placement in one run, noisy in the other: the run
        // that was not noisy, still unknown.
        let noisy = obs("kernel", &[(FAULTS, 4)], &[(ANON, NOISE)]);
        assert_eq!(
            combined(&[noisy, placed]),
            [
                row(ANON, None, Verdict::Unknown, 2),
                row(FAULTS, Some(4), Verdict::Match, 1),
            ]
        );
        // A fork's unknowns are no reason to run again.
        let forked = obs("kernel", &[(FAULTS, 4)], &[(ANON, FORKED)]);
        assert!(!compare(&obs("model", &[(FAULTS, 4), (ANON, 512)], &[]), &forked).worth_a_rerun());
    }

    #[test]
    fn unknown_by_construction_is_not_noise() {
        let forked = obs("kernel", &[(FAULTS, 4)], &[(ANON, FORKED)]);
        let d = compare(&obs("model", &[(FAULTS, 4), (ANON, 512)], &[]), &forked);
        assert_eq!(d.count(Verdict::Noisy), 0);
        assert_eq!(d.count(Verdict::Unknown), 1);
        let mut totals = Totals::default();
        totals.add(&combine(&[d]));
        assert_eq!(
            (
                totals.matches,
                totals.noisy,
                totals.unknown,
                totals.kernel_runs
            ),
            (1, 0, 1, 1)
        );
    }
}
