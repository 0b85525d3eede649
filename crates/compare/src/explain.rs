//! What `hugelab explain` finds (and `predict --why` folds): why each fault
//! of a statement got the folio size it got, and what each collapse
//! (`khugepaged`, `MADV_COLLAPSE`) scanned and why each range collapsed or
//! not. The workload runs on the model with its tracepoints on
//! (hugelab_model::trace); each statement's faults are grouped by their
//! chain of decisions, its collapsed ranges by their outcome, each decision
//! named after the kernel function that takes it. The CLI prints it as a
//! table or JSON, the Python package as DataFrames.

use anyhow::{bail, Result};
use hugelab_model::trace::{group, CollapseStep, FaultGroup, FaultTrace, Step};
use hugelab_model::Model;
use hugelab_workload::gone::Gone;
use hugelab_workload::{
    run_stream, Backend, BackendError, Lookahead, ParseError, Reading, RunError, Stmt,
};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BTreeMap;

/// One statement's faults and collapses, grouped.
#[derive(Serialize)]
pub struct Explained {
    pub line: u32,
    pub statement: String,
    pub faults: u64,
    pub totals: Totals,
    pub groups: Vec<Group>,
    /// What khugepaged or MADV_COLLAPSE did, in order, equal ranges
    /// together.
    pub collapses: Vec<CollapseGroup>,
}

/// What a statement's faults got and its collapses did, counted.
#[derive(Default, Serialize)]
pub struct Totals {
    /// Faults per outcome ("got 64K", "got the zero page"), keyed by rank
    /// so that the largest folio comes first however totals are added up;
    /// serialized as a list of `[outcome, faults]`, in that order.
    #[serde(serialize_with = "outcomes_in_order")]
    pub got: BTreeMap<(Reverse<u32>, String), u64>,
    /// Faults that tried a larger size and fell back.
    pub fell_back: u64,
    /// PMD ranges hpage_collapse_scan_pmd looked at.
    pub ranges: u64,
    /// Ranges collapse_huge_page made a THP of.
    pub collapsed: u64,
    /// Ranges that were not collapsed, per scan_result.
    pub not_collapsed: BTreeMap<String, u64>,
}

/// Equal collapse steps in a row: `ranges` PMD ranges (0 for a step that
/// is not about one range) from `first` to `last`.
#[derive(Serialize)]
pub struct CollapseGroup {
    pub ranges: u64,
    pub first: String,
    pub last: String,
    pub step: CollapseStep,
    /// The step in words.
    pub chain: Vec<String>,
}

#[derive(Serialize)]
pub struct Group {
    pub faults: u64,
    pub write: bool,
    /// The first and last faulting address, as `region+offset`.
    pub first: String,
    pub last: String,
    pub steps: Vec<Step>,
    /// The steps in words.
    pub chain: Vec<String>,
}

/// A process's regions: (name, start, length).
type Regions = Vec<(String, u64, u64)>;

/// The model, handing the faults of the statements asked for (all of them
/// without a line) to `sink`, statement by statement (`predict --why` folds
/// them as they come).
pub struct Explaining<F: FnMut(Explained)> {
    pub model: Model,
    line: Option<u32>,
    sink: F,
    /// Statements handed to `sink`.
    explained: u64,
}

impl<F: FnMut(Explained)> Explaining<F> {
    /// Every statement that faults or collapses, on `model`, to `sink`.
    pub fn all(model: Model, sink: F) -> Explaining<F> {
        Explaining {
            model,
            line: None,
            sink,
            explained: 0,
        }
    }

    fn explain(
        &mut self,
        stmt: &Stmt,
        run: impl FnOnce(&mut Model) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let wanted = self.line.is_none_or(|l| l == stmt.pos.line);
        if !wanted {
            return run(&mut self.model);
        }
        // The statement's process and regions as they are before it runs
        // (it may exit, or be killed, during it), and every process's, for
        // khugepaged.
        let regions = stmt
            .kind
            .process()
            .and_then(|p| self.model.regions(p))
            .unwrap_or_default();
        let m = &self.model.machine;
        let procs: Vec<(u32, String, Regions)> = m
            .tasks
            .iter()
            .map(|(name, t)| {
                let r = m.mms.get(t.mm).expect("a task's mm").regions.iter();
                let r = r.map(|(n, r)| (n.clone(), r.start, r.len)).collect();
                (t.mm, name.clone(), r)
            })
            .collect();
        self.model.machine.start_trace();
        let result = run(&mut self.model);
        let trace = self.model.machine.take_trace().unwrap_or_default();
        let at = |addr: u64| {
            regions
                .iter()
                .find(|(_, start, len)| addr >= *start && addr < start + len)
                .map_or(format!("{addr:#x}"), |(name, start, _)| {
                    format!("{name}+{}", hugelab_workload::Size(addr - start))
                })
        };
        let groups: Vec<Group> = group(&trace.faults)
            .into_iter()
            .map(|g: FaultGroup| Group {
                faults: g.faults,
                write: g.write,
                first: at(g.first),
                last: at(g.last),
                chain: g.steps.iter().map(Step::describe).collect(),
                steps: g.steps,
            })
            .collect();
        // An address of a process's mm: `proc region+offset`.
        let at_mm = |mm_id: u32, addr: u64| {
            let Some((_, name, regions)) = procs.iter().find(|(id, _, _)| *id == mm_id) else {
                return format!("{addr:#x}");
            };
            regions
                .iter()
                .find(|(_, start, len)| addr >= *start && addr < start + len)
                .map_or(format!("{name} {addr:#x}"), |(region, start, _)| {
                    format!("{name} {region}+{}", hugelab_workload::Size(addr - start))
                })
        };
        let collapses = collapse_groups(&trace.collapses, &at_mm);
        if !groups.is_empty() || !collapses.is_empty() || self.line.is_some() {
            self.explained += 1;
            (self.sink)(Explained {
                line: stmt.pos.line,
                statement: stmt.to_string(),
                faults: trace.faults.len() as u64,
                totals: totals(&trace.faults, &trace.collapses),
                groups,
                collapses,
            });
        }
        result
    }
}

impl<F: FnMut(Explained)> Backend for Explaining<F> {
    fn name(&self) -> &str {
        self.model.name()
    }
    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        self.explain(stmt, |m| m.execute(stmt))
    }
    fn execute_retiring(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        self.explain(stmt, |m| m.execute_retiring(stmt, gone))
    }
    fn read(&mut self) -> Result<Reading, BackendError> {
        self.model.read()
    }
    fn read_counter(&mut self, name: &str) -> Option<Result<Reading, BackendError>> {
        self.model.read_counter(name)
    }
    fn prepare(&mut self, ahead: &Lookahead) -> Result<(), BackendError> {
        self.model.prepare(ahead)
    }
    fn needs_lookahead(&self) -> bool {
        self.model.needs_lookahead()
    }
}

/// What a fault ended with, for the totals: its folio's size, or the
/// zero page, or the page it reused, copied, or none.
fn outcome(f: &FaultTrace) -> (u32, String) {
    for step in f.steps.iter().rev() {
        let got = match step {
            Step::Mapped { order } => (100 + order, format!("got {}", trace_size(*order))),
            Step::ZeroPage { huge: true } => (10, "got the huge zero folio".into()),
            Step::ZeroPage { huge: false } => (9, "got the zero page".into()),
            Step::Wp { reused: true, .. } => (8, "reused their page in place".into()),
            Step::Wp { huge: false, .. } => (7, "got a 4K copy".into()),
            Step::Oom => (0, "got no page (VM_FAULT_OOM)".into()),
            _ => continue,
        };
        return got;
    }
    (1, "ended otherwise".into())
}

fn trace_size(order: u32) -> String {
    hugelab_model::trace::size_name(order)
}

/// `Totals::got` as the list people and scripts read: `[outcome, faults]`,
/// the largest folio first.
fn outcomes_in_order<S: serde::Serializer>(
    got: &BTreeMap<(Reverse<u32>, String), u64>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(got.iter().map(|((_, what), n)| (what, n)))
}

fn totals(faults: &[FaultTrace], collapses: &[CollapseStep]) -> Totals {
    let mut t = Totals::default();
    for f in faults {
        let (rank, what) = outcome(f);
        *t.got.entry((Reverse(rank), what)).or_default() += 1;
        if f.steps.iter().any(|s| matches!(s, Step::Fallback { .. })) {
            t.fell_back += 1;
        }
    }
    for c in collapses {
        let CollapseStep::Range { scan, collapse, .. } = c else {
            continue;
        };
        t.ranges += 1;
        match collapse.map(|(_, r)| r).unwrap_or(*scan) {
            hugelab_model::trace::Scan::Succeed => t.collapsed += 1,
            r => *t.not_collapsed.entry(r.name().to_string()).or_default() += 1,
        }
    }
    t
}

impl Totals {
    /// Adds `other`'s counts in (a total over statements).
    pub fn add(&mut self, other: &Totals) {
        for (key, n) in &other.got {
            *self.got.entry(key.clone()).or_default() += n;
        }
        self.fell_back += other.fell_back;
        self.ranges += other.ranges;
        self.collapsed += other.collapsed;
        for (r, n) in &other.not_collapsed {
            *self.not_collapsed.entry(r.clone()).or_default() += n;
        }
    }
}

/// A step with its range's address left out, to compare outcomes.
fn outcome_of(step: &CollapseStep) -> CollapseStep {
    let mut key = step.clone();
    if let CollapseStep::Range { haddr, .. } = &mut key {
        *haddr = 0;
    }
    key
}

/// Collapse steps with equal outcomes in a row, together.
fn collapse_groups(steps: &[CollapseStep], at: &impl Fn(u32, u64) -> String) -> Vec<CollapseGroup> {
    // (step, ranges, first address, last address)
    let mut out: Vec<(CollapseStep, u64, u64, u64)> = Vec::new();
    for step in steps {
        let addr = match step {
            CollapseStep::Range { haddr, .. } => Some(*haddr),
            _ => None,
        };
        if let (Some(addr), Some((prev, n, _, last))) = (addr, out.last_mut()) {
            if *n > 0 && outcome_of(prev) == outcome_of(step) {
                *n += 1;
                *last = addr;
                continue;
            }
        }
        let a = addr.unwrap_or(0);
        out.push((step.clone(), u64::from(addr.is_some()), a, a));
    }
    out.into_iter()
        .map(|(step, ranges, first, last)| {
            let (first, last) = match &step {
                CollapseStep::Range { mm_id, .. } => (at(*mm_id, first), at(*mm_id, last)),
                _ => (String::new(), String::new()),
            };
            CollapseGroup {
                ranges,
                first,
                last,
                chain: step.describe(at),
                step,
            }
        })
        .collect()
}

/// What a workload's run explained: the statements asked for, and why the
/// run stopped early, if it did after explaining some (what ran is
/// explained; the reason follows it).
pub struct Explanation {
    pub explained: Vec<Explained>,
    pub stopped: Option<RunError>,
}

/// Runs the workload (`stmts`, called `file`) on a fresh model and explains
/// the statement starting on `line` (every statement that faults or
/// collapses without one).
pub fn explain(
    file: &str,
    stmts: impl Iterator<Item = Result<Stmt, ParseError>>,
    line: Option<u32>,
) -> Result<Explanation> {
    let mut out = Vec::new();
    let mut e = Explaining {
        model: Model::default(),
        line,
        sink: |x| out.push(x),
        explained: 0,
    };
    let stopped = run_stream(&mut e, file, &Lookahead::default(), stmts).err();
    let explained = e.explained;
    if explained == 0 {
        if let Some(err) = stopped {
            return Err(anyhow::Error::new(err).context(format!("cannot run {file}")));
        }
    }
    if let Some(l) = line {
        if explained == 0 {
            bail!("{file}:{l}: no statement starts on this line");
        }
    }
    Ok(Explanation {
        explained: out,
        stopped,
    })
}
