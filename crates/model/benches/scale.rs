//! Scale benchmark for the budgets of issue 12
//! (`cargo bench -p hugelab-model --bench scale`).
//!
//! Each family of the issue runs at three or four sizes, a factor of about 4
//! apart, and gets a fitted growth exponent `k` (the least-squares slope of
//! log(time) against log(size)) next to its budget with PASS or MISS. The
//! point is to keep the budgets visible while the model's internals change:
//! a budget that today's model misses is printed as a MISS, not hidden.
//!
//! Every case runs in a child process (this binary, re-executed with
//! `HUGELAB_SCALE_CASE=<family>/<variant>/<size>`), for two reasons: the
//! child's VmHWM is an honest peak RSS of that case alone, and the parent can
//! kill a case that runs past the time limit and print "> 120 s" instead of
//! blocking the whole run. Once a size times out, the larger sizes of that
//! variant are not run.
//!
//! Cases only use the model's stable public API: `parse`, `run`,
//! `Backend::{execute, read}` and `Model::footprint_bytes`. `run` executes
//! every statement through `Backend::execute` of a [`Stopwatch`] wrapped
//! around the model, which times exactly the statements a case marked, so
//! the `expect` lines of the case (which prove the work was done) are checked
//! by `run` itself but never timed.
//!
//! Usage (after `--` on the cargo command line):
//!
//! * `FILTER...`: run only families or variants matching: a family number
//!   (`1`), part of a family key (`reclaim`), or `<number or key>/<variant>`
//!   (`6/mthp64`, `cow/4k`);
//! * `--quick` or `HUGELAB_SCALE_QUICK=1`: only the two smallest sizes;
//! * `--timeout SECS` or `HUGELAB_SCALE_TIMEOUT=SECS`: the per-case limit
//!   (default 120 s, setup included);
//! * `--json FILE` or `HUGELAB_SCALE_JSON=FILE`: every figure as JSON too;
//! * `--repeat N` or `HUGELAB_SCALE_REPEAT=N`: run each case N times (default
//!   3), each in a fresh child, and report the run with the median time (its
//!   other figures too), with the fastest and slowest time beside it.
//!
//! Timings are wall-clock on one core of whatever machine ran them, and noisy
//! on a shared VM: quote them with the machine.

use hugelab_model::Model;
use hugelab_workload::gone::Gone;
use hugelab_workload::{
    parse, run, run_file, Backend, BackendError, BackendErrorKind, Lookahead, Observation, Reading,
    RunError, Statements, Stmt, Workload,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The base page and the PMD THP of the modelled machine (x86-64).
const PAGE: u64 = 4 * KIB;
const THP: u64 = 2 * MIB;

/// The environment variable that turns this binary into the child of one case.
const CASE_ENV: &str = "HUGELAB_SCALE_CASE";
/// The line a child prints its outcome on, as JSON after this prefix.
const RESULT_PREFIX: &str = "HUGELAB_SCALE_RESULT ";
const DEFAULT_TIMEOUT_S: u64 = 120;
/// Runs of each case by default: a shared 2-vCPU VM varies by 2x from run
/// to run, so one run says little.
const DEFAULT_REPEAT: u32 = 3;

// ---------------------------------------------------------------------------
// Workload scripts and the stopwatch backend
// ---------------------------------------------------------------------------

/// A workload text written one statement per line, remembering which lines
/// are timed and under which label, so that [`Stopwatch`] can time exactly
/// those statements while `run` executes and checks the whole workload.
struct Script {
    text: String,
    lines: u32,
    timed: BTreeMap<u32, &'static str>,
}

impl Script {
    /// A script on a machine of `memory` bytes (rounded up to MiB).
    fn new(memory: u64) -> Self {
        let mut s = Script {
            text: String::new(),
            lines: 0,
            timed: BTreeMap::new(),
        };
        s.line(format!(
            "machine memory={}",
            hlw_size(memory.div_ceil(MIB) * MIB)
        ));
        s
    }

    /// Appends one untimed line (a statement or an `expect`).
    fn line(&mut self, line: impl AsRef<str>) -> &mut Self {
        let line = line.as_ref();
        debug_assert!(!line.contains('\n'), "one line at a time: {line:?}");
        self.text.push_str(line);
        self.text.push('\n');
        self.lines += 1;
        self
    }

    /// Appends one statement whose execution time counts under `label`.
    fn timed(&mut self, label: &'static str, line: impl AsRef<str>) -> &mut Self {
        self.line(line);
        self.timed.insert(self.lines, label);
        self
    }

    /// The line number the next line will get.
    fn next_line(&self) -> u32 {
        self.lines + 1
    }

    fn parse(&self, name: &str) -> Result<Workload, CaseError> {
        parse(name, &self.text).map_err(|e| CaseError::Failed(format!("does not parse: {e}")))
    }

    /// Parses and runs the script on a fresh model, and insists that every
    /// `expect` passed and every call succeeded.
    fn run(&self, name: &str) -> Result<Ran, CaseError> {
        let workload = self.parse(name)?;
        Ran::new(workload, &self.timed)
    }
}

/// Explicit THP knobs for a case, so that a change of the model's defaults
/// cannot silently change what a case measures: `enabled`, the PMD size's and
/// the 64 KiB size's `enabled`, every other mTHP size off.
fn thp_knobs(s: &mut Script, enabled: &str, pmd: &str, mthp64: &str) {
    s.line(format!("set transparent_hugepage/enabled {enabled}"));
    s.line("set transparent_hugepage/use_zero_page 1");
    s.line("set transparent_hugepage/shrink_underused 1");
    s.line("set transparent_hugepage/khugepaged/max_ptes_none 511");
    for kb in [16, 32, 64, 128, 256, 512, 1024, 2048] {
        let value = match kb {
            64 => mthp64,
            2048 => pmd,
            _ => "never",
        };
        s.line(format!(
            "set transparent_hugepage/hugepages-{kb}kB/enabled {value}"
        ));
    }
}

/// 4 KiB pages only.
fn thp_off(s: &mut Script) {
    thp_knobs(s, "never", "never", "never");
}

/// PMD THPs in `madvise(MADV_HUGEPAGE)` regions only.
fn thp_madvise(s: &mut Script) {
    thp_knobs(s, "madvise", "inherit", "never");
}

/// The model behind `run`: times the statements whose line a [`Script`]
/// marked and every `read`, and samples the model's footprint at the end of
/// each block of timed statements (not after each one: with many processes
/// `footprint_bytes` walks every page table, and would dwarf a cheap statement).
struct Stopwatch<'a> {
    model: &'a mut Model,
    timed: &'a BTreeMap<u32, &'static str>,
    /// Seconds spent in the timed statements, by label.
    spent: BTreeMap<&'static str, f64>,
    reads: Vec<f64>,
    peak_footprint: u64,
    /// The label of the last statement executed, if it was timed.
    open_label: Option<&'static str>,
    /// When the last statement returned: what follows it in `run` is reading
    /// and checking only (the "tail" of `expect` lines).
    last_execute_end: Option<Instant>,
    /// When the last whole reading began (the `end` snapshot's, at the end).
    last_read_start: Option<Instant>,
}

impl Backend for Stopwatch<'_> {
    fn name(&self) -> &str {
        self.model.name()
    }

    fn prepare(&mut self, ahead: &Lookahead) -> Result<(), BackendError> {
        self.model.prepare(ahead)
    }

    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        self.execute_retiring(stmt, &mut Gone::default())
    }

    fn read_counter(&mut self, name: &str) -> Option<Result<Reading, BackendError>> {
        self.model.read_counter(name)
    }

    fn execute_retiring(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        let label = self.timed.get(&stmt.pos.line).copied();
        if self.open_label.is_some() && self.open_label != label {
            self.peak_footprint = self.peak_footprint.max(self.model.footprint_bytes());
        }
        self.open_label = label;
        let t = Instant::now();
        let result = Backend::execute_retiring(self.model, stmt, gone);
        let seconds = t.elapsed().as_secs_f64();
        if let Some(label) = label {
            *self.spent.entry(label).or_default() += seconds;
        }
        self.last_execute_end = Some(Instant::now());
        result
    }

    fn read(&mut self) -> Result<Reading, BackendError> {
        let t = Instant::now();
        self.last_read_start = Some(t);
        let reading = Backend::read(self.model);
        self.reads.push(t.elapsed().as_secs_f64());
        reading
    }
}

/// What running a script left: the observation, the timings and the model.
struct Ran {
    workload: Workload,
    obs: Observation,
    model: Model,
    spent: BTreeMap<&'static str, f64>,
    /// Seconds of each `Backend::read` that `run` made, in order.
    reads: Vec<f64>,
    /// Wall time of the whole `run`.
    run_seconds: f64,
    /// Wall time of the `expect` lines after the last statement (the tail
    /// without the `end` snapshot's reading).
    expects_seconds: f64,
    /// The largest model footprint after a block of timed statements or at the end.
    peak_footprint: u64,
}

impl Ran {
    fn new(workload: Workload, timed: &BTreeMap<u32, &'static str>) -> Result<Ran, CaseError> {
        let mut model = Model::default();
        let mut sw = Stopwatch {
            model: &mut model,
            timed,
            spent: BTreeMap::new(),
            reads: Vec::new(),
            peak_footprint: 0,
            open_label: None,
            last_execute_end: None,
            last_read_start: None,
        };
        let start = Instant::now();
        let obs = run(&mut sw, &workload).map_err(|e| match &e {
            RunError::Backend { error, .. } if error.kind == BackendErrorKind::Unsupported => {
                CaseError::Unsupported(e.to_string())
            }
            _ => CaseError::Failed(e.to_string()),
        })?;
        let end = Instant::now();
        let tail_seconds = sw
            .last_execute_end
            .map_or(0.0, |t| end.duration_since(t).as_secs_f64());
        // The expect lines after the last statement: up to the `end`
        // snapshot's reading (expects read single counters, or share the
        // first whole reading, which this then leaves out).
        let expects_seconds = match (sw.last_execute_end, sw.last_read_start) {
            (Some(done), Some(read)) if read > done => read.duration_since(done).as_secs_f64(),
            _ => tail_seconds,
        };
        let (spent, reads, peak) = (sw.spent, sw.reads, sw.peak_footprint);
        check(&obs)?;
        let peak_footprint = peak.max(model.footprint_bytes());
        Ok(Ran {
            workload,
            obs,
            model,
            spent,
            reads,
            run_seconds: end.duration_since(start).as_secs_f64(),
            expects_seconds,
            peak_footprint,
        })
    }

    /// Seconds spent in the statements timed under `label`.
    fn seconds(&self, label: &str) -> f64 {
        self.spent.get(label).copied().unwrap_or(0.0)
    }

    /// The statement on line `line` of the workload, to execute it again.
    fn stmt_at(&self, line: u32) -> Result<&Stmt, CaseError> {
        self.workload
            .stmts
            .iter()
            .find(|s| s.pos.line == line)
            .ok_or_else(|| CaseError::Failed(format!("no statement on line {line}")))
    }
}

/// A case must prove its work: every call succeeded, every `expect` passed,
/// and there was at least one `expect`.
fn check(obs: &Observation) -> Result<(), CaseError> {
    if let Some(c) = obs.failed_calls.first() {
        return Err(CaseError::Failed(format!(
            "line {}: {}: {}",
            c.line, c.statement, c.message
        )));
    }
    let failures: Vec<String> = obs
        .failed_expects()
        .take(3)
        .map(|e| e.failure(&obs.workload))
        .collect();
    if !failures.is_empty() {
        return Err(CaseError::Failed(failures.join("; ")));
    }
    if obs.expects.is_empty() {
        return Err(CaseError::Failed("the case checks nothing".into()));
    }
    Ok(())
}

/// Peak resident set of this process (VmHWM of /proc/self/status), in bytes.
fn vm_hwm() -> Option<u64> {
    vm_hwm_of("self")
}

/// VmHWM of /proc/<pid>/status, in bytes.
fn vm_hwm_of(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * KIB)
}

/// A size as the workload language writes it: the largest binary suffix that
/// divides it exactly.
fn hlw_size(bytes: u64) -> String {
    for (unit, suffix) in [(GIB, "G"), (MIB, "M"), (KIB, "K")] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

// ---------------------------------------------------------------------------
// What a case reports
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
enum Unit {
    Seconds,
    Bytes,
    /// A plain number (a ratio, bytes per page...).
    Number,
}

/// A named figure beyond the timed quantity (the exit time next to the
/// fault time, the JSON size of an observation...).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Extra {
    name: String,
    value: f64,
    unit: Unit,
}

/// The figures of one case at one size.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Measure {
    /// What was timed, for people.
    what: String,
    /// Wall time of the timed part.
    seconds: f64,
    /// How many things the timed part did, and what they are (for the rate).
    units: f64,
    unit: String,
    /// The model's own memory (`Model::footprint_bytes`), where it means something.
    footprint: Option<u64>,
    /// VmHWM of the child that ran the case.
    peak_rss: Option<u64>,
    extras: Vec<Extra>,
}

impl Measure {
    fn new(what: impl Into<String>, seconds: f64, units: u64, unit: &str) -> Self {
        Measure {
            what: what.into(),
            seconds,
            units: units as f64,
            unit: unit.to_string(),
            footprint: None,
            peak_rss: None,
            extras: Vec::new(),
        }
    }

    fn footprint(mut self, bytes: u64) -> Self {
        self.footprint = Some(bytes);
        self
    }

    fn extra(mut self, name: &str, value: f64, unit: Unit) -> Self {
        self.extras.push(Extra {
            name: name.to_string(),
            value,
            unit,
        });
        self
    }

    fn get(&self, name: &str) -> Option<f64> {
        self.extras.iter().find(|e| e.name == name).map(|e| e.value)
    }

    fn rate(&self) -> f64 {
        self.units / self.seconds
    }
}

/// Why a case has no figures.
#[derive(Debug)]
enum CaseError {
    /// The model (or the language) does not do this yet: not a failure.
    Unsupported(String),
    /// The case broke: a parse error, a failed call or a failed `expect`.
    Failed(String),
}

/// How one case at one size ended.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Outcome {
    Measured(Measure),
    Unsupported(String),
    Failed(String),
    /// Killed at the time limit; the child's VmHWM just before.
    TimedOut {
        limit_s: f64,
        peak_rss: Option<u64>,
    },
    /// Not run, and why.
    Skipped(String),
}

impl From<Result<Measure, CaseError>> for Outcome {
    fn from(r: Result<Measure, CaseError>) -> Self {
        match r {
            Ok(m) => Outcome::Measured(m),
            Err(CaseError::Unsupported(why)) => Outcome::Unsupported(why),
            Err(CaseError::Failed(why)) => Outcome::Failed(why),
        }
    }
}

// ---------------------------------------------------------------------------
// Family 1 and 2: reclaim (the deferred split shrinker, its under-used check included)
// ---------------------------------------------------------------------------

/// `bystanders` processes, unrelated to the one under test, each with 64 MiB
/// of 4 KiB pages written: work a shrinker must not scale with.
fn spawn_bystanders(s: &mut Script, bystanders: u64) {
    for p in 0..bystanders {
        s.line(format!("spawn p{p}"))
            .line(format!("p{p} mmap m 64M"))
            .line(format!("p{p} write m"));
    }
}

/// Family 1: `n` PMD THPs, each with one 4 KiB page zapped by
/// `MADV_DONTNEED` (so each is PTE-mapped, partially mapped and on the
/// deferred split queue); `reclaim` must split all `n`.
fn deferred_split(n: u64, bystanders: u64) -> Result<Measure, CaseError> {
    let mut s = Script::new(n * THP + bystanders * 64 * MIB + 4 * GIB);
    thp_madvise(&mut s);
    spawn_bystanders(&mut s, bystanders);
    s.line("spawn a")
        .line(format!("a mmap buf {} align=2M", hlw_size(n * THP)))
        .line("a madvise buf HUGEPAGE")
        .line("a write buf");
    for i in 0..n {
        s.line(format!(
            "a madvise buf+{}:4K DONTNEED",
            hlw_size(i * THP + MIB)
        ));
    }
    s.line(format!(
        "expect mthp.2048kB.nr_anon_partially_mapped == {n}"
    ))
    .line(format!("expect vmstat.thp_deferred_split_page == {n}"))
    .timed("reclaim", "reclaim")
    .line(format!("expect vmstat.thp_split_page == {n}"))
    .line("expect mthp.2048kB.nr_anon_partially_mapped == 0");
    let ran = s.run("deferred-split")?;
    Ok(Measure::new("reclaim", ran.seconds("reclaim"), n, "THPs").footprint(ran.peak_footprint))
}

/// Family 2: `n` PMD THPs with 4 pages written each (508 zero-filled pages,
/// over `max_ptes_none` 409); `reclaim` must split all `n` as under-used.
fn underused_split(n: u64) -> Result<Measure, CaseError> {
    let mut s = Script::new(n * THP + 4 * GIB);
    thp_madvise(&mut s);
    s.line("set transparent_hugepage/khugepaged/max_ptes_none 409")
        .line("spawn a")
        .line(format!("a mmap buf {} align=2M", hlw_size(n * THP)))
        .line("a madvise buf HUGEPAGE")
        .line("a write buf step=512K")
        .line(format!("expect vmstat.thp_fault_alloc == {n}"))
        .timed("reclaim", "reclaim")
        .line(format!("expect vmstat.thp_underused_split_page == {n}"))
        .line("expect mthp.2048kB.nr_anon == 0");
    let ran = s.run("underused-split")?;
    Ok(Measure::new("reclaim", ran.seconds("reclaim"), n, "THPs").footprint(ran.peak_footprint))
}

// ---------------------------------------------------------------------------
// Family 3 and 4: fork, exit, first-touch faults of 4 KiB pages
// ---------------------------------------------------------------------------

/// Forks and exits per size in family 3: a mean over several, since one fork
/// of a small process takes well under a millisecond.
const FORK_REPS: u64 = 8;

/// Family 3: a process with `bytes` of 4 KiB pages forks a child that exits
/// at once, `FORK_REPS` times; the mean of fork + exit.
fn fork_exit(bytes: u64) -> Result<Measure, CaseError> {
    let pages = bytes / PAGE;
    let mut s = Script::new(bytes + 4 * GIB);
    thp_off(&mut s);
    s.line("spawn a")
        .line(format!("a mmap buf {}", hlw_size(bytes)))
        .line("a write buf")
        .line(format!("expect vmstat.pgfault == {pages}"));
    for i in 0..FORK_REPS {
        s.timed("fork", format!("a fork b{i}"));
        if i == 0 {
            s.line(format!("expect smaps.b0.buf.Rss == {}", bytes / KIB));
        }
        s.timed("exit", format!("b{i} exit"));
    }
    s.line(format!("expect vmstat.pgfault == {pages}"))
        .line(format!("expect smaps.a.buf.Pss == {}", bytes / KIB));
    let ran = s.run("fork-exit")?;
    let (fork, exit) = (ran.seconds("fork"), ran.seconds("exit"));
    let reps = FORK_REPS as f64;
    Ok(Measure::new(
        format!("fork + exit (mean of {FORK_REPS})"),
        (fork + exit) / reps,
        pages,
        "pages",
    )
    .footprint(ran.peak_footprint)
    .extra("fork", fork / reps, Unit::Seconds)
    .extra("exit", exit / reps, Unit::Seconds))
}

/// Family 4: write `bytes` of 4 KiB pages (first-touch faults), then exit;
/// both timed, apart.
fn write_then_exit(bytes: u64) -> Result<Measure, CaseError> {
    let pages = bytes / PAGE;
    let mut s = Script::new(bytes + 4 * GIB);
    thp_off(&mut s);
    s.line("spawn a")
        .line(format!("a mmap buf {}", hlw_size(bytes)))
        .timed("faults", "a write buf")
        .line(format!("expect vmstat.pgfault == {pages}"))
        .timed("exit", "a exit")
        .line("expect meminfo.AnonPages == 0")
        .line("expect vmstat.nr_anon_pages == 0");
    let ran = s.run("write-exit")?;
    let (faults, exit) = (ran.seconds("faults"), ran.seconds("exit"));
    Ok(Measure::new("first-touch faults", faults, pages, "faults")
        .footprint(ran.peak_footprint)
        .extra("exit", exit, Unit::Seconds)
        .extra("exit/faults", exit / faults, Unit::Number))
}

// ---------------------------------------------------------------------------
// Family 5: COW faults, PMD THP against 4 KiB
// ---------------------------------------------------------------------------

/// Family 5, PMD THP: `n` pages in PMD THPs shared with a child by fork;
/// the parent writes one byte per page, each a COW copy: the first write
/// of each THP meets the write-protected PMD (split + copy), the other 511
/// a PTE of the PTE-mapped THP (what issue 12 measured at 3.4x a 4K COW,
/// when every such fault summed the folio's 512 page mapcounts).
fn cow_thp(n: u64) -> Result<Measure, CaseError> {
    let thps = n / (THP / PAGE);
    let mut s = Script::new(n * PAGE + 4 * GIB);
    thp_madvise(&mut s);
    s.line("spawn a")
        .line(format!("a mmap buf {} align=2M", hlw_size(n * PAGE)))
        .line("a madvise buf HUGEPAGE")
        .line("a write buf")
        .line(format!("expect vmstat.thp_fault_alloc == {thps}"))
        .line("a fork b")
        .timed("cow", "a write buf")
        .line(format!("expect vmstat.thp_split_pmd == {thps}"))
        .line(format!("expect stat.a.minflt == {}", thps + n))
        .line(format!("expect folios.a.buf.4kB == {n}"))
        .line(format!("expect folios.b.buf.2048kB.pmd == {thps}"));
    cow_measure(s.run("cow-thp")?, n)
}

/// Family 5, PMD THP, first write only: `n` THPs shared with a child by
/// fork; the parent writes one byte per 2 MiB, so each write meets a
/// write-protected PMD: the PMD is split (512 PTEs and mapcounts, as the
/// kernel does) and one page copied. `n` is the family's size / 16. No
/// budget: the split's cost per fault is the kernel's too.
fn cow_thp_first(faults: u64) -> Result<Measure, CaseError> {
    // A THP per 16 of the family's sizes: the same sizes as the per-page
    // variants would make hundreds of GiB here.
    let n = faults / 16;
    let mut s = Script::new(n * THP + 4 * GIB);
    thp_madvise(&mut s);
    s.line("spawn a")
        .line(format!("a mmap buf {} align=2M", hlw_size(n * THP)))
        .line("a madvise buf HUGEPAGE")
        .line("a write buf")
        .line(format!("expect vmstat.thp_fault_alloc == {n}"))
        .line("a fork b")
        .timed("cow", "a write buf step=2M")
        .line(format!("expect vmstat.thp_split_pmd == {n}"))
        .line(format!("expect folios.a.buf.4kB == {n}"))
        .line(format!("expect folios.b.buf.2048kB.pmd == {n}"));
    cow_measure(s.run("cow-thp")?, n)
}

/// Family 5, 4 KiB: `n` pages shared with a child by fork; the parent writes
/// one byte per page, each a COW copy.
fn cow_4k(n: u64) -> Result<Measure, CaseError> {
    let mut s = Script::new(n * PAGE + 4 * GIB);
    thp_off(&mut s);
    s.line("spawn a")
        .line(format!("a mmap buf {}", hlw_size(n * PAGE)))
        .line("a write buf")
        .line("a fork b")
        .line(format!("expect smaps.a.buf.Pss == {}", n * PAGE / KIB / 2))
        .timed("cow", "a write buf")
        .line(format!("expect stat.a.minflt == {}", 2 * n))
        .line(format!("expect smaps.a.buf.Pss == {}", n * PAGE / KIB));
    cow_measure(s.run("cow-4k")?, n)
}

fn cow_measure(ran: Ran, n: u64) -> Result<Measure, CaseError> {
    let cow = ran.seconds("cow");
    Ok(Measure::new("COW write faults", cow, n, "faults")
        .footprint(ran.peak_footprint)
        .extra("per fault", cow / n as f64, Unit::Seconds))
}

// ---------------------------------------------------------------------------
// Family 6: snapshots with many processes
// ---------------------------------------------------------------------------

/// How many `expect` lines follow a statement that changes nothing.
const EXPECTS: u64 = 1000;

/// Family 6: a parent with 16 MiB (PMD THPs, or 64 KiB mTHP) forks `p - 1`
/// children; each maps and writes 256 KiB of its own and writes 16 KiB of the
/// inherited region (a COW copy). Timed: the first whole reading (the `end`
/// snapshot's, with nothing computed before: what a snapshot costs), a
/// second read with no statement in between, a read after a statement that
/// changes nothing, the `EXPECTS` expect lines after that statement (each a
/// single-counter read, `Backend::read_counter`), and one such read alone
/// after the no-op statement again.
fn snapshot(p: u64, mthp64: bool) -> Result<Measure, CaseError> {
    let mut s = Script::new(16 * GIB);
    if mthp64 {
        thp_knobs(&mut s, "never", "never", "always");
    } else {
        thp_madvise(&mut s);
    }
    s.line("spawn a")
        .line("a mmap buf 16M align=2M")
        .line("a madvise buf HUGEPAGE")
        .line("a write buf");
    for i in 1..p {
        s.line(format!("a fork c{i}"))
            .line(format!("c{i} mmap own 256K"))
            .line(format!("c{i} write own"))
            .line(format!(
                "c{i} write buf+{}:16K",
                hlw_size(i * 64 * KIB % (16 * MIB))
            ));
    }
    let last = p - 1;
    s.line(format!("expect smaps.c{last}.own.Rss == 256"));
    let noop = s.next_line();
    s.line("a read buf:4K");
    for _ in 0..EXPECTS {
        s.line("expect smaps.a.buf.Rss == 16384");
    }
    let mut ran = s.run("snapshot")?;
    let first = ran.reads.first().copied().unwrap_or(f64::NAN);
    let per_expect = ran.expects_seconds / EXPECTS as f64;
    let again = timed_read(&mut ran.model)?;
    let noop = ran.stmt_at(noop)?.clone();
    Backend::execute(&mut ran.model, &noop).map_err(|e| CaseError::Failed(e.message))?;
    let after_noop = timed_read(&mut ran.model)?;
    Backend::execute(&mut ran.model, &noop).map_err(|e| CaseError::Failed(e.message))?;
    let expect_after_noop = timed_read_counter(&mut ran.model, "smaps.a.buf.Rss", 16384)?;
    Ok(
        Measure::new("read after the last statement", first, p, "processes")
            .footprint(ran.peak_footprint)
            .extra("read again", again, Unit::Seconds)
            .extra("read after a no-op", after_noop, Unit::Seconds)
            .extra("expect after a no-op", expect_after_noop, Unit::Seconds)
            .extra(
                "per expect (1000 after a no-op, run)",
                per_expect,
                Unit::Seconds,
            ),
    )
}

/// One `Backend::read_counter` of the model (what an `expect` of `name`
/// costs when no reading was taken since the last statement), timed; it
/// must read `want`.
fn timed_read_counter(model: &mut Model, name: &str, want: i64) -> Result<f64, CaseError> {
    let t = Instant::now();
    let reading = Backend::read_counter(model, name)
        .ok_or_else(|| CaseError::Failed("the model reads no single counter".into()))?
        .map_err(|e| CaseError::Failed(e.message))?;
    let seconds = t.elapsed().as_secs_f64();
    match reading.counters.get(name) {
        Some(&v) if v == want => Ok(seconds),
        other => Err(CaseError::Failed(format!(
            "{name} read {other:?}, not {want}"
        ))),
    }
}

/// One `Backend::read` of the model, timed; its counters must not be empty.
fn timed_read(model: &mut Model) -> Result<f64, CaseError> {
    let t = Instant::now();
    let reading = Backend::read(model).map_err(|e| CaseError::Failed(e.message))?;
    let seconds = t.elapsed().as_secs_f64();
    if reading.counters.is_empty() {
        return Err(CaseError::Failed("a read reported no counters".into()));
    }
    Ok(seconds)
}

// ---------------------------------------------------------------------------
// Family 7: mmap/write/munmap cycles in a live process
// ---------------------------------------------------------------------------

/// How family 7 names and surrounds its regions.
#[derive(Clone, Copy, PartialEq)]
enum Churn {
    /// A fresh region name per cycle (`r0`, `r1`, ...).
    Fresh,
    /// The same name `r` every cycle (needs region name reuse).
    Reuse,
    /// Fresh names, in a process that forked 64 children first.
    Forks,
}

const CHURN_FORKS: u64 = 64;

/// Family 7: `k` cycles of mmap 64 KiB, write it, munmap it, in a process
/// still alive at the end. Timed: the whole `run`; also the JSON size of the
/// observation `run` returns.
fn churn(k: u64, kind: Churn) -> Result<Measure, CaseError> {
    let mut s = Script::new(16 * GIB);
    thp_off(&mut s);
    s.line("spawn a");
    let base_pages = if kind == Churn::Forks {
        4 * MIB / PAGE
    } else {
        0
    };
    if kind == Churn::Forks {
        s.line("a mmap base 4M").line("a write base");
        for i in 0..CHURN_FORKS {
            s.timed("forks", format!("a fork c{i}"));
        }
    }
    for i in 0..k {
        let r = if kind == Churn::Reuse {
            "r".to_string()
        } else {
            format!("r{i}")
        };
        s.timed("cycles", format!("a mmap {r} 64K"))
            .timed("cycles", format!("a write {r}"))
            .timed("cycles", format!("a munmap {r}"));
    }
    s.line(format!("expect vmstat.pgfault == {}", base_pages + k * 16))
        .line(format!("expect smaps.a.Rss == {}", base_pages * PAGE / KIB));
    let workload = match (kind, s.parse("churn")) {
        (Churn::Reuse, Err(CaseError::Failed(why))) => {
            return Err(CaseError::Unsupported(format!("region name reuse: {why}")))
        }
        (_, w) => w?,
    };
    let ran = Ran::new(workload, &s.timed)?;
    let json = serde_json::to_string(&ran.obs)
        .map_err(|e| CaseError::Failed(format!("observation to JSON: {e}")))?;
    let mut m = Measure::new("run of the workload", ran.run_seconds, k, "cycles")
        .footprint(ran.peak_footprint)
        .extra("cycles", ran.seconds("cycles"), Unit::Seconds);
    if kind == Churn::Forks {
        m = m.extra("forks", ran.seconds("forks"), Unit::Seconds);
    }
    Ok(m.extra("reads", ran.reads.iter().sum(), Unit::Seconds)
        .extra("observation JSON", json.len() as f64, Unit::Bytes))
}

// ---------------------------------------------------------------------------
// Family 8: parsing many statements
// ---------------------------------------------------------------------------

/// A workload of `n` statements: one process and one 1 GiB region, then
/// writes, reads and `MADV_DONTNEED`s of single pages across it. No names
/// are created after the first two lines, so a streaming parser could run it
/// in constant memory.
fn many_statements(n: u64) -> String {
    let mut text = Vec::with_capacity(usize::try_from(n * 32).unwrap_or(usize::MAX));
    write_many_statements(n, &mut text).expect("writing to memory");
    String::from_utf8(text).expect("ASCII")
}

/// `many_statements(n)` into `w`, a line at a time.
fn write_many_statements(n: u64, w: &mut impl std::io::Write) -> std::io::Result<()> {
    w.write_all(b"spawn a\na mmap buf 1G\n")?;
    let pages = GIB / PAGE;
    for i in 2..n {
        let page = i % pages;
        let range = if page == 0 {
            "buf:4K".to_string()
        } else {
            format!("buf+{}:4K", hlw_size(page * PAGE))
        };
        match i % 3 {
            0 => writeln!(w, "a write {range}"),
            1 => writeln!(w, "a read {range}"),
            _ => writeln!(w, "a madvise {range} DONTNEED"),
        }?;
    }
    Ok(())
}

/// Family 8, streamed parse: `n` statements parsed and checked one at a
/// time from text in memory (`Statements`), none kept. The peak RSS beyond
/// the text is what the parser and checker hold.
fn stream_parse(n: u64) -> Result<Measure, CaseError> {
    let text = many_statements(n);
    let t = Instant::now();
    let mut parsed = 0u64;
    for stmt in Statements::new("many.hlw", text.as_bytes()) {
        stmt.map_err(|e| CaseError::Failed(e.to_string()))?;
        parsed += 1;
    }
    let seconds = t.elapsed().as_secs_f64();
    if parsed != n {
        return Err(CaseError::Failed(format!(
            "parsed {parsed} statements of {n}"
        )));
    }
    let beyond = vm_hwm().unwrap_or(0).saturating_sub(text.len() as u64);
    Ok(Measure::new("streamed parse", seconds, n, "statements")
        .extra("text", text.len() as f64, Unit::Bytes)
        .extra("peak RSS beyond the text", beyond as f64, Unit::Bytes))
}

/// Family 8, streamed run: `n` statements written to a file, then parsed,
/// checked and run on the model one at a time (`run_file`, what `hugelab
/// run` does). The peak RSS beyond the model's own state (its footprint at
/// the end) and beyond the process before the run is what streaming costs.
fn stream_run(n: u64) -> Result<Measure, CaseError> {
    let dir = std::env::temp_dir().join(format!("hugelab-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| CaseError::Failed(e.to_string()))?;
    let path = dir.join("many.hlw");
    // Written a line at a time: the text must not count in the peak RSS.
    let write = || -> std::io::Result<()> {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&path)?);
        write_many_statements(n, &mut w)?;
        // Every write faults (its page was never written, or DONTNEED since).
        let writes = (2..n).filter(|i| i % 3 == 0).count();
        writeln!(w, "expect vmstat.pgfault >= {writes}")?;
        w.into_inner()?.sync_all()
    };
    write().map_err(|e| CaseError::Failed(e.to_string()))?;
    let before = vm_rss().unwrap_or(0);
    let mut model = Model::default();
    let t = Instant::now();
    let result = run_file(&mut model, &path);
    let seconds = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    let obs = result.map_err(|e| CaseError::Failed(e.to_string()))?;
    check(&obs)?;
    let beyond = vm_hwm()
        .unwrap_or(0)
        .saturating_sub(before + model.footprint_bytes());
    Ok(Measure::new("streamed run", seconds, n, "statements")
        .footprint(model.footprint_bytes())
        .extra("peak RSS beyond the model", beyond as f64, Unit::Bytes))
}

/// VmRSS of this process, in bytes.
fn vm_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * KIB)
}

/// Family 8, whole workload: `parse` of `n` statements from text in memory
/// into one AST (what the library's `parse` still offers). The peak RSS
/// beyond the text is what holding the AST costs.
fn parse_many(n: u64) -> Result<Measure, CaseError> {
    let text = many_statements(n);
    let t = Instant::now();
    let workload = parse("many.hlw", &text).map_err(|e| CaseError::Failed(e.to_string()))?;
    let seconds = t.elapsed().as_secs_f64();
    let parsed = workload.stmts.len() as u64;
    if parsed != n {
        return Err(CaseError::Failed(format!(
            "parsed {parsed} statements of {n}"
        )));
    }
    let peak = vm_hwm().unwrap_or(0);
    let beyond = peak.saturating_sub(text.len() as u64);
    drop(workload);
    Ok(Measure::new("parse", seconds, n, "statements")
        .extra("text", text.len() as f64, Unit::Bytes)
        .extra("peak RSS beyond the text", beyond as f64, Unit::Bytes))
}

// ---------------------------------------------------------------------------
// Family 9: first-touch 4 KiB faults
// ---------------------------------------------------------------------------

const FIRST_TOUCH_RUNS: usize = 5;

/// Family 9: write every 4 KiB page of a region once, THP off; the median of
/// `FIRST_TOUCH_RUNS` fresh models (one run is ~0.1-1 s on a shared VM, so
/// the median with its spread says more than one run).
fn first_touch(bytes: u64) -> Result<Measure, CaseError> {
    let pages = bytes / PAGE;
    let mut s = Script::new(bytes + 8 * GIB);
    thp_off(&mut s);
    s.line("spawn a")
        .line(format!("a mmap buf {} align=2M", hlw_size(bytes)))
        .timed("touch", "a write buf")
        .line(format!("expect vmstat.pgfault == {pages}"));
    let mut runs = Vec::new();
    let mut footprint = 0;
    for _ in 0..FIRST_TOUCH_RUNS {
        let ran = s.run("first-touch")?;
        runs.push(ran.seconds("touch"));
        footprint = ran.peak_footprint;
    }
    runs.sort_by(f64::total_cmp);
    let median = runs[runs.len() / 2];
    Ok(Measure::new(
        format!("first touch (median of {FIRST_TOUCH_RUNS})"),
        median,
        pages,
        "faults",
    )
    .footprint(footprint)
    .extra("fastest", runs[0], Unit::Seconds)
    .extra("slowest", runs[runs.len() - 1], Unit::Seconds)
    .extra(
        "model bytes/page",
        footprint as f64 / pages as f64,
        Unit::Number,
    ))
}

// ---------------------------------------------------------------------------
// The families and their budgets
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum SizeKind {
    Count,
    Bytes,
}

struct Variant {
    key: &'static str,
    run: fn(u64) -> Result<Measure, CaseError>,
}

struct Family {
    id: u32,
    key: &'static str,
    title: &'static str,
    sizes: Vec<u64>,
    size_kind: SizeKind,
    variants: Vec<Variant>,
    budget: fn(&[CaseResult]) -> Vec<Verdict>,
}

impl Family {
    fn size_label(&self, size: u64) -> String {
        match self.size_kind {
            SizeKind::Bytes => hlw_size(size),
            SizeKind::Count if size >= 1_000_000 && size.is_multiple_of(1_000_000) => {
                format!("{}M", size / 1_000_000)
            }
            SizeKind::Count => size.to_string(),
        }
    }

    fn variant(&self, key: &str) -> Option<&Variant> {
        self.variants.iter().find(|v| v.key == key)
    }
}

fn families() -> Vec<Family> {
    let v = |key, run| Variant { key, run };
    vec![
        Family {
            id: 1,
            key: "reclaim-deferred",
            title: "reclaim of N PMD THPs, each partly unmapped (deferred split shrinker)",
            sizes: vec![512, 2048, 8192, 32768],
            size_kind: SizeKind::Count,
            variants: vec![
                v("alone", |n| deferred_split(n, 0)),
                v("bystanders64", |n| deferred_split(n, 64)),
            ],
            budget: budget_deferred,
        },
        Family {
            id: 2,
            key: "reclaim-underused",
            title: "reclaim of N under-used PMD THPs (4 pages written each)",
            sizes: vec![512, 2048, 8192, 32768],
            size_kind: SizeKind::Count,
            variants: vec![v("alone", underused_split)],
            budget: budget_underused,
        },
        Family {
            id: 3,
            key: "fork-exit",
            title: "fork + child exit of a process with S of 4 KiB pages",
            sizes: vec![64 * MIB, 256 * MIB, GIB],
            size_kind: SizeKind::Bytes,
            variants: vec![v("4k", fork_exit)],
            budget: budget_fork_exit,
        },
        Family {
            id: 4,
            key: "write-exit",
            title: "write S of 4 KiB pages, then exit",
            sizes: vec![4 * GIB, 16 * GIB, 64 * GIB],
            size_kind: SizeKind::Bytes,
            variants: vec![v("4k", write_then_exit)],
            budget: budget_write_exit,
        },
        Family {
            id: 5,
            key: "cow",
            title: "N COW write faults after fork: pages of PMD THPs vs 4 KiB pages (and the first write of each THP alone)",
            sizes: vec![32768, 131072, 524288],
            size_kind: SizeKind::Count,
            variants: vec![
                v("thp", cow_thp),
                v("4k", cow_4k),
                v("thp-first", cow_thp_first),
            ],
            budget: budget_cow,
        },
        Family {
            id: 6,
            key: "snapshot",
            title: "counters with P live processes (a parent and P-1 forked children)",
            sizes: vec![33, 129, 513],
            size_kind: SizeKind::Count,
            variants: vec![
                v("pmd", |p| snapshot(p, false)),
                v("mthp64", |p| snapshot(p, true)),
            ],
            budget: budget_snapshot,
        },
        Family {
            id: 7,
            key: "churn",
            title: "K mmap/write/munmap cycles of 64 KiB, process alive at the end",
            sizes: vec![2500, 10000, 40000],
            size_kind: SizeKind::Count,
            variants: vec![
                v("fresh", |k| churn(k, Churn::Fresh)),
                v("reuse", |k| churn(k, Churn::Reuse)),
                v("forks64", |k| churn(k, Churn::Forks)),
            ],
            budget: budget_churn,
        },
        Family {
            id: 8,
            key: "parse",
            title: "N statements: streamed parse, streamed run on the model, whole-AST parse",
            sizes: vec![1_000_000, 4_000_000, 10_000_000],
            size_kind: SizeKind::Count,
            variants: vec![
                v("stream", stream_parse),
                v("run", stream_run),
                v("ast", parse_many),
            ],
            budget: budget_parse,
        },
        Family {
            id: 9,
            key: "first-touch",
            title: "first-touch 4 KiB faults of a region of S, THP off",
            sizes: vec![512 * MIB, 2 * GIB, 8 * GIB],
            size_kind: SizeKind::Bytes,
            variants: vec![v("4k", first_touch)],
            budget: budget_first_touch,
        },
    ]
}

#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
enum Status {
    Pass,
    Miss,
    /// Not measured (filtered out, failed, unsupported).
    Unknown,
    /// A figure to watch, with no budget to meet.
    Info,
}

#[derive(Debug, Serialize)]
struct Verdict {
    budget: String,
    status: Status,
    detail: String,
}

/// Which side of the limit a figure must stay on.
#[derive(Clone, Copy)]
enum Bound {
    AtMost(f64),
    AtLeast(f64),
}

impl Bound {
    fn holds(self, value: f64) -> bool {
        match self {
            Bound::AtMost(limit) => value <= limit,
            Bound::AtLeast(limit) => value >= limit,
        }
    }
}

/// One budget on one figure of one case.
struct Budget<'a> {
    text: String,
    variant: &'a str,
    size: u64,
    bound: Bound,
    figure: fn(&Measure) -> Option<f64>,
    show: fn(f64) -> String,
}

fn find<'c>(cases: &'c [CaseResult], variant: &str, size: u64) -> Option<&'c Outcome> {
    cases
        .iter()
        .find(|c| c.variant == variant && c.size == size)
        .map(|c| &c.outcome)
}

/// Judges a budget: a measured figure against its bound; a case that timed
/// out (or was not run because a smaller one did) misses, since the time
/// limit is far above every budget; anything else is unknown.
fn judge(cases: &[CaseResult], b: Budget) -> Verdict {
    let (status, detail) = match find(cases, b.variant, b.size) {
        Some(Outcome::Measured(m)) => match (b.figure)(m) {
            Some(v) if b.bound.holds(v) => (Status::Pass, (b.show)(v)),
            Some(v) => (Status::Miss, (b.show)(v)),
            None => (Status::Unknown, "no figure".into()),
        },
        Some(Outcome::TimedOut { limit_s, .. }) => {
            (Status::Miss, format!("timed out after {limit_s} s"))
        }
        Some(Outcome::Skipped(why)) if why.contains("timed out") => {
            (Status::Miss, format!("not run: {why}"))
        }
        Some(Outcome::Skipped(why) | Outcome::Unsupported(why) | Outcome::Failed(why)) => {
            (Status::Unknown, why.clone())
        }
        None => (Status::Unknown, "not run (filtered out, or --quick)".into()),
    };
    Verdict {
        budget: format!("{} [{}]", b.text, b.variant),
        status,
        detail,
    }
}

fn seconds_of(m: &Measure) -> Option<f64> {
    Some(m.seconds)
}

fn rate_of(m: &Measure) -> Option<f64> {
    Some(m.rate())
}

fn budget_deferred(cases: &[CaseResult]) -> Vec<Verdict> {
    ["alone", "bystanders64"]
        .into_iter()
        .map(|variant| {
            judge(
                cases,
                Budget {
                    text: "reclaim of 32768 partly unmapped THPs <= 1 s".into(),
                    variant,
                    size: 32768,
                    bound: Bound::AtMost(1.0),
                    figure: seconds_of,
                    show: fmt_secs,
                },
            )
        })
        .collect()
}

fn budget_underused(cases: &[CaseResult]) -> Vec<Verdict> {
    vec![judge(
        cases,
        Budget {
            text: "reclaim of 32768 under-used THPs <= 1 s (family 1's budget, assumed)".into(),
            variant: "alone",
            size: 32768,
            bound: Bound::AtMost(1.0),
            figure: seconds_of,
            show: fmt_secs,
        },
    )]
}

fn budget_fork_exit(cases: &[CaseResult]) -> Vec<Verdict> {
    vec![judge(
        cases,
        Budget {
            text: "fork + exit with 1 GiB of 4 KiB pages <= 3 ms".into(),
            variant: "4k",
            size: GIB,
            bound: Bound::AtMost(3e-3),
            figure: seconds_of,
            show: fmt_secs,
        },
    )]
}

fn budget_write_exit(cases: &[CaseResult]) -> Vec<Verdict> {
    [4 * GIB, 16 * GIB, 64 * GIB]
        .into_iter()
        .map(|size| {
            judge(
                cases,
                Budget {
                    text: format!("exit of {} <= half its fault time", hlw_size(size)),
                    variant: "4k",
                    size,
                    bound: Bound::AtMost(0.5),
                    figure: |m| m.get("exit/faults"),
                    show: |r| format!("exit/faults = {r:.2}"),
                },
            )
        })
        .collect()
}

/// PMD-THP COW fault at most 1.5 times a 4 KiB COW fault, at every size
/// where both ran.
fn budget_cow(cases: &[CaseResult]) -> Vec<Verdict> {
    let per_fault = |variant, size| match find(cases, variant, size) {
        Some(Outcome::Measured(m)) => m.get("per fault"),
        _ => None,
    };
    let mut sizes: Vec<u64> = cases.iter().map(|c| c.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
        .into_iter()
        .map(|size| {
            let budget = format!("PMD-THP COW fault <= 1.5 x 4K COW fault, N = {size}");
            match (per_fault("thp", size), per_fault("4k", size)) {
                (Some(thp), Some(base)) => Verdict {
                    budget,
                    status: if thp <= 1.5 * base {
                        Status::Pass
                    } else {
                        Status::Miss
                    },
                    detail: format!(
                        "{} / {} = {:.2}x",
                        fmt_secs(thp),
                        fmt_secs(base),
                        thp / base
                    ),
                },
                _ => Verdict {
                    budget,
                    status: Status::Unknown,
                    detail: "both variants must be measured".into(),
                },
            }
        })
        .collect()
}

fn budget_snapshot(cases: &[CaseResult]) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for variant in ["pmd", "mthp64"] {
        verdicts.push(judge(
            cases,
            Budget {
                text: "snapshot (read) with 513 processes <= 20 ms".into(),
                variant,
                size: 513,
                bound: Bound::AtMost(20e-3),
                figure: seconds_of,
                show: fmt_secs,
            },
        ));
        verdicts.push(judge(
            cases,
            Budget {
                text: "expect after a no-op statement (one counter read) <= 10 us, 513 processes"
                    .into(),
                variant,
                size: 513,
                bound: Bound::AtMost(10e-6),
                figure: |m| m.get("expect after a no-op"),
                show: fmt_secs,
            },
        ));
        verdicts.push(judge(
            cases,
            Budget {
                text: "per expect of 1000 after a no-op (run) <= 10 us, 513 processes".into(),
                variant,
                size: 513,
                bound: Bound::AtMost(10e-6),
                figure: |m| m.get("per expect (1000 after a no-op, run)"),
                show: fmt_secs,
            },
        ));
    }
    verdicts
}

/// No budget in the brief: how the observation's JSON and the peak RSS grow
/// with K, which should be flat while the process lives.
fn budget_churn(cases: &[CaseResult]) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for variant in ["fresh", "reuse", "forks64"] {
        if measured(cases, variant).next().is_none() {
            continue;
        }
        let growth = |figure: fn(&Measure) -> Option<f64>| {
            let points: Vec<(f64, f64)> = measured(cases, variant)
                .filter_map(|(size, m)| figure(m).map(|y| (size as f64, y)))
                .collect();
            slope(&points).map_or("-".to_string(), |k| format!("K^{k:.2}"))
        };
        verdicts.push(Verdict {
            budget: format!("growth with K (no budget given) [{variant}]"),
            status: Status::Info,
            detail: format!(
                "observation JSON {}, peak RSS {}",
                growth(|m| m.get("observation JSON")),
                growth(|m| m.peak_rss.map(|b| b as f64))
            ),
        });
    }
    verdicts
}

fn budget_parse(cases: &[CaseResult]) -> Vec<Verdict> {
    vec![
        judge(
            cases,
            Budget {
                text: "streamed parse of 10M statements >= 5 M statements/s".into(),
                variant: "stream",
                size: 10_000_000,
                bound: Bound::AtLeast(5e6),
                figure: rate_of,
                show: |r| fmt_rate(r, "statements"),
            },
        ),
        judge(
            cases,
            Budget {
                text: "10M streamed statements run in <= 200 MB peak RSS beyond the model".into(),
                variant: "run",
                size: 10_000_000,
                bound: Bound::AtMost(200e6),
                figure: |m| m.get("peak RSS beyond the model"),
                show: |b| fmt_bytes(b as u64),
            },
        ),
    ]
}

fn budget_first_touch(cases: &[CaseResult]) -> Vec<Verdict> {
    vec![
        judge(
            cases,
            Budget {
                text: "first touch of 8 GiB >= 30 M faults/s".into(),
                variant: "4k",
                size: 8 * GIB,
                bound: Bound::AtLeast(30e6),
                figure: rate_of,
                show: |r| fmt_rate(r, "faults"),
            },
        ),
        judge(
            cases,
            Budget {
                text: "model memory <= 16 bytes per touched page".into(),
                variant: "4k",
                size: 8 * GIB,
                bound: Bound::AtMost(16.0),
                figure: |m| m.get("model bytes/page"),
                show: |b| format!("{b:.2} bytes/page"),
            },
        ),
    ]
}

// ---------------------------------------------------------------------------
// Growth exponents
// ---------------------------------------------------------------------------

/// The least-squares slope of ln(y) against ln(x): `k` in y ~ x^k. None with
/// fewer than two points or a non-positive value.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 2 || points.iter().any(|&(x, y)| x <= 0.0 || y <= 0.0) {
        return None;
    }
    let logs: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x.ln(), y.ln())).collect();
    let n = logs.len() as f64;
    let mx = logs.iter().map(|p| p.0).sum::<f64>() / n;
    let my = logs.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = logs.iter().map(|&(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = logs.iter().map(|&(x, _)| (x - mx).powi(2)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// The measured cases of a variant, by size.
fn measured<'c>(
    cases: &'c [CaseResult],
    variant: &'c str,
) -> impl Iterator<Item = (u64, &'c Measure)> + 'c {
    cases.iter().filter_map(move |c| match &c.outcome {
        Outcome::Measured(m) if c.variant == variant => Some((c.size, m)),
        _ => None,
    })
}

/// The growth exponent of one timed series of one variant.
#[derive(Debug, Serialize)]
struct Fit {
    variant: String,
    series: String,
    k: Option<f64>,
    /// Sizes that finished, of those run or tried.
    points: usize,
    of: usize,
}

/// Fits the timed quantity and every extra time of each variant.
fn fits(cases: &[CaseResult], variants: &[&str]) -> Vec<Fit> {
    let mut fits = Vec::new();
    for &variant in variants {
        let of = cases.iter().filter(|c| c.variant == variant).count();
        let mut series: Vec<(String, Vec<(f64, f64)>)> = vec![("time".into(), Vec::new())];
        for (size, m) in measured(cases, variant) {
            series[0].1.push((size as f64, m.seconds));
            for e in m.extras.iter().filter(|e| e.unit == Unit::Seconds) {
                match series.iter_mut().find(|(name, _)| *name == e.name) {
                    Some((_, points)) => points.push((size as f64, e.value)),
                    None => series.push((e.name.clone(), vec![(size as f64, e.value)])),
                }
            }
        }
        for (name, points) in series {
            fits.push(Fit {
                variant: variant.to_string(),
                series: name,
                k: slope(&points),
                points: points.len(),
                of,
            });
        }
    }
    fits
}

// ---------------------------------------------------------------------------
// Formatting
// ---------------------------------------------------------------------------

fn fmt_secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else if s >= 1e-6 {
        format!("{:.2} us", s * 1e6)
    } else {
        format!("{:.0} ns", s * 1e9)
    }
}

fn fmt_bytes(b: u64) -> String {
    if b >= MIB {
        format!("{:.1} MiB", b as f64 / MIB as f64)
    } else if b >= KIB {
        format!("{:.1} KiB", b as f64 / KIB as f64)
    } else {
        format!("{b} B")
    }
}

fn fmt_rate(per_s: f64, unit: &str) -> String {
    let (v, prefix) = if per_s >= 1e9 {
        (per_s / 1e9, "G ")
    } else if per_s >= 1e6 {
        (per_s / 1e6, "M ")
    } else if per_s >= 1e3 {
        (per_s / 1e3, "k ")
    } else {
        (per_s, "")
    };
    format!("{v:.2} {prefix}{unit}/s")
}

fn fmt_extra(e: &Extra) -> String {
    let value = match e.unit {
        Unit::Seconds => fmt_secs(e.value),
        Unit::Bytes => fmt_bytes(e.value as u64),
        Unit::Number => format!("{:.2}", e.value),
    };
    format!("{}: {value}", e.name)
}

/// The columns of the table, header and rows alike.
fn cells(
    variant: &str,
    size: &str,
    what: &str,
    time: &str,
    rate: &str,
    rss: &str,
    more: &str,
) -> String {
    format!("  {variant:<12}  {size:>6}  {what:<30}  {time:>10}  {rate:>20}  {rss:>9}  {more}")
}

fn header() -> String {
    cells(
        "variant",
        "size",
        "timed",
        "time",
        "rate",
        "peak RSS",
        "footprint, more",
    )
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("-".into(), |b| format!("{} MiB", b / MIB))
}

/// One table row for one case.
fn row(f: &Family, c: &CaseResult) -> String {
    let size = f.size_label(c.size);
    let cells = |what: &str, time: &str, rate: &str, rss: &str, more: &str| {
        cells(&c.variant, &size, what, time, rate, rss, more)
    };
    match &c.outcome {
        Outcome::Measured(m) => {
            let footprint = m.footprint.map(|b| format!("footprint: {}", fmt_bytes(b)));
            let more: Vec<String> = footprint
                .into_iter()
                .chain(m.extras.iter().map(fmt_extra))
                .collect();
            cells(
                &m.what,
                &fmt_secs(m.seconds),
                &fmt_rate(m.rate(), &m.unit),
                &mib(m.peak_rss),
                &more.join(", "),
            )
        }
        Outcome::TimedOut { limit_s, peak_rss } => cells(
            "(killed at the time limit)",
            &format!("> {limit_s} s"),
            "-",
            &mib(*peak_rss),
            "peak RSS when killed",
        ),
        Outcome::Skipped(why) => cells("not run", "-", "-", "-", why),
        Outcome::Unsupported(why) => cells("not supported yet", "-", "-", "-", &first_line(why)),
        Outcome::Failed(why) => cells("FAILED", "-", "-", "-", &first_line(why)),
    }
}

/// The first line of a message, cut at 200 characters: a row stays a row.
fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    line.chars().take(200).collect()
}

fn fit_line(f: &Fit) -> String {
    let k = f.k.map_or("-".into(), |k| format!("{k:.2}"));
    let note = if f.points < f.of {
        format!(
            " (from {} of {} sizes: the others have no time)",
            f.points, f.of
        )
    } else {
        String::new()
    };
    format!("  k [{}] {}: {k}{note}", f.variant, f.series)
}

fn verdict_line(v: &Verdict) -> String {
    let status = match v.status {
        Status::Pass => "PASS",
        Status::Miss => "MISS",
        Status::Unknown => "n/a ",
        Status::Info => "info",
    };
    format!("  {status}  {}: {}", v.budget, v.detail)
}

// ---------------------------------------------------------------------------
// The parent: options, children, report
// ---------------------------------------------------------------------------

struct Options {
    filters: Vec<String>,
    quick: bool,
    timeout: Duration,
    json: Option<PathBuf>,
    /// Runs of each case; the one with the median time is reported.
    repeat: u32,
    /// Whether anything asked for a run (`cargo bench` passes `--bench`).
    asked: bool,
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

fn options() -> Result<Options, String> {
    let mut opts = Options {
        filters: Vec::new(),
        quick: env_flag("HUGELAB_SCALE_QUICK"),
        timeout: Duration::from_secs(DEFAULT_TIMEOUT_S),
        json: std::env::var_os("HUGELAB_SCALE_JSON").map(PathBuf::from),
        repeat: DEFAULT_REPEAT,
        asked: false,
    };
    if let Ok(r) = std::env::var("HUGELAB_SCALE_REPEAT") {
        opts.repeat = parse_repeat(&r)?;
    }
    if let Ok(t) = std::env::var("HUGELAB_SCALE_TIMEOUT") {
        opts.timeout = parse_timeout(&t)?;
    }
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        opts.asked = true;
        match arg.as_str() {
            "--bench" => {}
            "--quick" => opts.quick = true,
            "--timeout" => opts.timeout = parse_timeout(&args.next().unwrap_or_default())?,
            "--json" => opts.json = Some(args.next().ok_or("--json needs a file")?.into()),
            "--repeat" => opts.repeat = parse_repeat(&args.next().unwrap_or_default())?,
            a if a.starts_with("--") => return Err(format!("unknown option {a}")),
            filter => opts.filters.push(filter.to_string()),
        }
    }
    Ok(opts)
}

fn parse_repeat(s: &str) -> Result<u32, String> {
    s.parse::<u32>()
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(|| format!("bad repeat count '{s}': a positive integer expected"))
}

/// Runs a case `repeat` times, each in a fresh child: the run with the
/// median time, with the fastest and slowest beside it. A run that does not
/// measure (fails, times out) is reported as it is, at once.
fn run_repeated(f: &Family, variant: &str, size: u64, opts: &Options) -> Outcome {
    let mut runs = Vec::new();
    for _ in 0..opts.repeat {
        match run_child(f, variant, size, opts.timeout) {
            Outcome::Measured(m) => runs.push(m),
            other => return other,
        }
    }
    runs.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let (fastest, slowest) = (runs[0].seconds, runs[runs.len() - 1].seconds);
    let n = runs.len();
    let mut median = runs.swap_remove(n / 2);
    if n > 1 {
        median = median
            .extra(&format!("fastest of {n}"), fastest, Unit::Seconds)
            .extra(&format!("slowest of {n}"), slowest, Unit::Seconds);
    }
    Outcome::Measured(median)
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .filter(|t| *t > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("bad timeout '{s}': seconds expected"))
}

/// Whether a filter selects this family's variant: its number, part of its
/// key, or `<number or key>/<variant>`.
fn selected(opts: &Options, f: &Family, variant: &str) -> bool {
    opts.filters.is_empty()
        || opts.filters.iter().any(|t| match t.split_once('/') {
            Some((fam, v)) => (fam == f.id.to_string() || f.key.contains(fam)) && v == variant,
            None => *t == f.id.to_string() || f.key.contains(t.as_str()),
        })
}

/// Reads a child's pipe to its end on a thread, so a chatty child cannot
/// block on a full pipe while the parent waits for it.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_string(&mut s);
        }
        s
    })
}

/// Waits for a child until `limit`, and kills it (by its own handle) past
/// it: `Some(success)` if it ended, `None` if it was killed, with its VmHWM
/// just before.
fn wait_or_kill(child: &mut Child, limit: Duration) -> (Option<bool>, Option<u64>) {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return (Some(status.success()), None),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let rss = vm_hwm_of(&child.id().to_string());
                let _ = child.kill();
                let _ = child.wait();
                return (None, rss);
            }
        }
    }
}

/// Runs one case in a child process (this binary with `CASE_ENV` set).
fn run_child(f: &Family, variant: &str, size: u64, timeout: Duration) -> Outcome {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return Outcome::Failed(format!("cannot find this binary: {e}")),
    };
    let spawned = Command::new(exe)
        .env(CASE_ENV, format!("{}/{variant}/{size}", f.id))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return Outcome::Failed(format!("cannot start the case: {e}")),
    };
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let (ended, rss) = wait_or_kill(&mut child, timeout);
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    if ended.is_none() {
        return Outcome::TimedOut {
            limit_s: timeout.as_secs_f64(),
            peak_rss: rss,
        };
    }
    out.lines()
        .find_map(|l| l.strip_prefix(RESULT_PREFIX))
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_else(|| {
            let why = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            Outcome::Failed(format!("the case died: {why}"))
        })
}

#[derive(Debug, Serialize)]
struct CaseResult {
    variant: String,
    size: u64,
    outcome: Outcome,
}

#[derive(Debug, Serialize)]
struct FamilyReport {
    id: u32,
    key: &'static str,
    title: &'static str,
    cases: Vec<CaseResult>,
    fits: Vec<Fit>,
    verdicts: Vec<Verdict>,
}

/// The sizes to run: all, or the two smallest in quick mode.
fn sizes(f: &Family, opts: &Options) -> Vec<u64> {
    let n = if opts.quick { 2 } else { f.sizes.len() };
    f.sizes.iter().copied().take(n).collect()
}

/// Runs a family's selected variants at its sizes, smallest first, printing
/// each row as it comes; a size that timed out stops the larger ones.
fn run_family(f: &Family, opts: &Options) -> Option<FamilyReport> {
    let variants: Vec<&str> = f
        .variants
        .iter()
        .map(|v| v.key)
        .filter(|v| selected(opts, f, v))
        .collect();
    if variants.is_empty() {
        return None;
    }
    println!("\n{}. {} ({})", f.id, f.title, f.key);
    println!("{}", header());
    let mut cases = Vec::new();
    for &variant in &variants {
        let mut timed_out: Option<u64> = None;
        for size in sizes(f, opts) {
            let outcome = match timed_out {
                Some(smaller) => Outcome::Skipped(format!(
                    "a smaller size ({}) timed out",
                    f.size_label(smaller)
                )),
                None => run_repeated(f, variant, size, opts),
            };
            if matches!(outcome, Outcome::TimedOut { .. }) {
                timed_out = Some(size);
            }
            let case = CaseResult {
                variant: variant.to_string(),
                size,
                outcome,
            };
            println!("{}", row(f, &case));
            flush();
            cases.push(case);
        }
    }
    let fits = fits(&cases, &variants);
    fits.iter().for_each(|fit| println!("{}", fit_line(fit)));
    let verdicts = (f.budget)(&cases);
    verdicts
        .iter()
        .for_each(|v| println!("{}", verdict_line(v)));
    Some(FamilyReport {
        id: f.id,
        key: f.key,
        title: f.title,
        cases,
        fits,
        verdicts,
    })
}

fn flush() {
    let _ = std::io::stdout().flush();
}

/// What a run printed, as JSON, for whoever compares baselines.
#[derive(Serialize)]
struct Report<'a> {
    timeout_s: f64,
    quick: bool,
    families: &'a [FamilyReport],
}

fn write_json(path: &PathBuf, report: &Report) -> Result<(), String> {
    let json = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    std::fs::write(path, json + "\n").map_err(|e| format!("{}: {e}", path.display()))
}

/// The child of one case: runs it and prints its outcome as one JSON line.
fn child_main(spec: &str) {
    let outcome = match case_of(spec) {
        Ok((family, variant, size)) => {
            let run = family.variant(&variant).map(|v| v.run);
            match run {
                Some(run) => Outcome::from(run(size)),
                None => Outcome::Failed(format!("no variant {variant}")),
            }
        }
        Err(why) => Outcome::Failed(why),
    };
    let outcome = match outcome {
        Outcome::Measured(mut m) => {
            m.peak_rss = vm_hwm();
            Outcome::Measured(m)
        }
        other => other,
    };
    let json = serde_json::to_string(&outcome).expect("an outcome serializes");
    println!("{RESULT_PREFIX}{json}");
}

/// `<family id>/<variant>/<size>` back to the family, variant and size.
fn case_of(spec: &str) -> Result<(Family, String, u64), String> {
    let bad = || format!("bad {CASE_ENV} '{spec}'");
    let mut parts = spec.splitn(3, '/');
    let (id, variant, size) = (parts.next(), parts.next(), parts.next());
    let id: u32 = id.and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let size: u64 = size.and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let family = families()
        .into_iter()
        .find(|f| f.id == id)
        .ok_or_else(bad)?;
    Ok((family, variant.ok_or_else(bad)?.to_string(), size))
}

fn main() {
    if let Ok(spec) = std::env::var(CASE_ENV) {
        child_main(&spec);
        return;
    }
    let opts = match options() {
        Ok(opts) => opts,
        Err(e) => {
            eprintln!("scale: {e}");
            std::process::exit(2);
        }
    };
    // `cargo test --benches` runs bench targets without arguments: this one
    // takes minutes, so it only runs when asked (`cargo bench` passes --bench).
    if !opts.asked {
        println!("scale: run it with `cargo bench -p hugelab-model --bench scale`");
        return;
    }
    println!(
        "hugelab scale benchmark (issue 12): each case in its own process, time limit {} s{}",
        opts.timeout.as_secs_f64(),
        if opts.quick {
            ", quick (two smallest sizes)"
        } else {
            ""
        }
    );
    let reports: Vec<FamilyReport> = families()
        .iter()
        .filter_map(|f| run_family(f, &opts))
        .collect();
    if let Some(path) = &opts.json {
        let report = Report {
            timeout_s: opts.timeout.as_secs_f64(),
            quick: opts.quick,
            families: &reports,
        };
        match write_json(path, &report) {
            Ok(()) => println!("\nJSON: {}", path.display()),
            Err(e) => eprintln!("scale: cannot write the JSON: {e}"),
        }
    }
}
