//! Does the deferred split shrinker's give-back prediction come true in the
//! model? Runs a workload statement by statement; right before a `reclaim`
//! it takes each process's utilization report, and after it compares the
//! process's Rss drop with `give_back.rss_kb`; and the report of every
//! process together (each folio once) with what the machine got back
//! (`give_back.freed_kb` against the rise of MemFree, less the huge zero
//! folio the same reclaim frees) and with the Rss drop of all processes —
//! whenever the prediction's stated assumptions hold (see
//! `hugelab_workload::utilization`):
//!
//! - (queue membership, which a live scan cannot see, is known to the
//!   model's report: so every `reclaim` is checked, also after one that
//!   dropped examined THPs from the queue, and after `shrink_underused 0`);
//! - no pin is in force (a pinned folio fails to split);
//! - for a process's own report, the process shares no large folio with
//!   another process (its partially mapped state is judged from its own
//!   mappings); the report of every process sees every mapping.
//!
//! Reclaims where an assumption fails are counted, not checked. The two
//! checks of the report of every process are made at every reclaim without
//! a pin, even with no process: a guard against vacuous runs must count
//! the processes' own checks ([`Outcome::process_checks`]).

use hugelab_model::mm_types::Pfn;
use hugelab_model::pgtable::Pmd;
use hugelab_model::sparse::page_folio;
use hugelab_model::thp_utilization::Scope;
use hugelab_model::Model;
use hugelab_workload::utilization::{utilization_report, DEFAULT_BUCKETS};
use hugelab_workload::{parse, Backend, StmtKind};
use std::collections::{BTreeMap, HashMap, HashSet};

/// What a prediction is checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Measured {
    /// A process's own report (`rss_kb`) against the drop of its Rss.
    ProcessRss(String),
    /// The report of every process (`freed_kb`) against the rise of
    /// MemFree, less the huge zero folio the same reclaim frees.
    Freed,
    /// The report of every process (`rss_kb`) against the drop of the
    /// processes' Rss summed.
    AllRss,
}

/// One check at one `reclaim`: the predicted kB and the measured change
/// (signed: a measure that moved the wrong way shows as negative).
#[derive(Clone, Debug)]
pub struct Check {
    pub line: u32,
    pub measured: Measured,
    pub predicted: u64,
    pub actual: i64,
}

impl Check {
    pub fn holds(&self) -> bool {
        i64::try_from(self.predicted) == Ok(self.actual)
    }
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (line, want, got) = (self.line, self.predicted, self.actual);
        match &self.measured {
            Measured::ProcessRss(proc) => write!(
                f,
                "reclaim at line {line}: process {proc}'s own report predicted its Rss to drop \
                 by {want} kB (rss_kb); the measured drop was {got} kB"
            ),
            Measured::Freed => write!(
                f,
                "reclaim at line {line}: the report of every process predicted {want} kB given \
                 back to the machine (freed_kb); the measured rise of MemFree, less the huge \
                 zero folio, was {got} kB"
            ),
            Measured::AllRss => write!(
                f,
                "reclaim at line {line}: the report of every process predicted their Rss \
                 together to drop by {want} kB (rss_kb); the measured drop was {got} kB"
            ),
        }
    }
}

/// What the checks of one workload found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Per reclaim: one check per process whose own report was checked,
    /// then the two checks of the report of every process.
    pub checked: Vec<Check>,
    /// Reclaims (or processes at one) whose assumptions did not hold.
    pub skipped: u64,
}

impl Outcome {
    pub fn mismatches(&self) -> impl Iterator<Item = &Check> {
        self.checked.iter().filter(|c| !c.holds())
    }

    /// The checks of a process's own report (those of every process are
    /// made at every reclaim, with or without processes).
    pub fn process_checks(&self) -> impl Iterator<Item = &Check> {
        self.checked
            .iter()
            .filter(|c| matches!(c.measured, Measured::ProcessRss(_)))
    }
}

/// Large folios each process maps.
fn large_folios(model: &Model) -> BTreeMap<String, HashSet<Pfn>> {
    let m = &model.machine;
    m.tasks
        .iter()
        .map(|(name, t)| {
            let mut set = HashSet::new();
            let mm = m.mms.get(t.mm).expect("a task's mm");
            for (_, pmd) in mm.pmds.range(0..=u64::MAX) {
                match pmd {
                    Pmd::Huge { pfn, .. } => {
                        set.insert(*pfn);
                    }
                    Pmd::HugeZero { .. } => {}
                    Pmd::Table(table) => {
                        for pte in table.ptes.iter() {
                            let Some(page) = pte.pfn() else { continue };
                            let folio = page_folio(m, page);
                            if m.zone.memmap.page(folio).order() > 0 {
                                set.insert(folio);
                            }
                        }
                    }
                }
            }
            (name.clone(), set)
        })
        .collect()
}

/// Processes that map no large folio another process maps too.
fn unshared(model: &Model) -> Vec<String> {
    let folios = large_folios(model);
    let mut owners: HashMap<Pfn, u32> = HashMap::new();
    for set in folios.values() {
        for f in set {
            *owners.entry(*f).or_default() += 1;
        }
    }
    folios
        .into_iter()
        .filter(|(_, set)| set.iter().all(|f| owners[f] == 1))
        .map(|(name, _)| name)
        .collect()
}

fn rss_kb(model: &mut Model, proc: &str) -> i64 {
    let r = model.read().expect("the model reads");
    r.counters
        .get(&format!("smaps.{proc}.Rss"))
        .copied()
        .unwrap_or(0)
}

fn mem_free_kb(model: &mut Model) -> i64 {
    model.read().expect("the model reads").counters["meminfo.MemFree"]
}

/// The huge zero folio's kB that `reclaim` frees besides the splits
/// (shrink_huge_zero_folio_scan: when no mm maps it).
fn huge_zero_freed_kb(model: &Model) -> i64 {
    let m = &model.machine;
    if m.huge_zero_folio.is_some() && m.huge_zero_refcount == 1 {
        2048
    } else {
        0
    }
}

/// Runs `text` on a fresh model, checking the prediction at every
/// `reclaim` where its assumptions hold. Statements the model refuses as the
/// kernel would (an errno, a SIGSEGV) are skipped over.
pub fn check_predictions(text: &str) -> Outcome {
    let w = parse("prediction.hlw", text).expect("the workload parses");
    let mut model = Model::default();
    let mut out = Outcome::default();
    for stmt in &w.stmts {
        match &stmt.kind {
            StmtKind::Snapshot { .. } | StmtKind::Expect { .. } | StmtKind::ExpectErrno { .. } => {
                continue
            }
            StmtKind::Reclaim => {
                if !model.pins.is_empty() {
                    out.skipped += 1;
                } else {
                    let settings = model.shrinker_settings();
                    let mut before = Vec::new();
                    for proc in unshared(&model) {
                        let folios = model.folio_uses(Scope::Process(&proc)).unwrap();
                        let report = utilization_report(&folios, settings, DEFAULT_BUCKETS);
                        let rss = rss_kb(&mut model, &proc);
                        before.push((proc, report.give_back.rss_kb, rss));
                    }
                    out.skipped += u64::from(before.len() < model.machine.tasks.len());
                    let all = model.folio_uses(Scope::All).unwrap();
                    let all = utilization_report(&all, settings, DEFAULT_BUCKETS).give_back;
                    let procs: Vec<String> = model.machine.tasks.keys().cloned().collect();
                    let rss_all: i64 = procs.iter().map(|p| rss_kb(&mut model, p)).sum();
                    let free = mem_free_kb(&mut model) + huge_zero_freed_kb(&model);
                    let _ = model.execute(stmt);
                    let line = stmt.pos.line;
                    for (proc, predicted, rss) in before {
                        let actual = rss - rss_kb(&mut model, &proc);
                        out.checked.push(Check {
                            line,
                            measured: Measured::ProcessRss(proc),
                            predicted,
                            actual,
                        });
                    }
                    let rss_after: i64 = procs.iter().map(|p| rss_kb(&mut model, p)).sum();
                    out.checked.push(Check {
                        line,
                        measured: Measured::Freed,
                        predicted: all.freed_kb(),
                        actual: mem_free_kb(&mut model) - free,
                    });
                    out.checked.push(Check {
                        line,
                        measured: Measured::AllRss,
                        predicted: all.rss_kb,
                        actual: rss_all - rss_after,
                    });
                    continue;
                }
            }
            _ => {}
        }
        let _ = model.execute(stmt);
    }
    out
}
