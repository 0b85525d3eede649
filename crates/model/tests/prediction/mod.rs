//! Does the under-used shrinker's give-back prediction come true in the
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
//! Reclaims where an assumption fails are counted, not checked.

use hugelab_model::mm_types::{page_folio, Pfn};
use hugelab_model::pgtable::Pmd;
use hugelab_model::thp_utilization::Scope;
use hugelab_model::Model;
use hugelab_workload::utilization::{utilization_report, DEFAULT_BUCKETS};
use hugelab_workload::{parse, Backend, StmtKind};
use std::collections::{BTreeMap, HashMap, HashSet};

/// What the checks of one workload found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Per process checked: (reclaim line, process, predicted kB, Rss drop
    /// kB); and per reclaim "all: freed" (predicted `freed_kb`, MemFree
    /// rise) and "all: Rss" (predicted `rss_kb`, the processes' Rss drop).
    pub checked: Vec<(u32, String, u64, u64)>,
    /// Reclaims (or processes at one) whose assumptions did not hold.
    pub skipped: u64,
}

impl Outcome {
    pub fn mismatches(&self) -> impl Iterator<Item = &(u32, String, u64, u64)> {
        self.checked.iter().filter(|(_, _, want, got)| want != got)
    }
}

/// Large folios each process maps.
fn large_folios(model: &Model) -> BTreeMap<String, HashSet<Pfn>> {
    let m = &model.machine;
    model
        .tasks
        .iter()
        .map(|(name, t)| {
            let mut set = HashSet::new();
            for (_, pmd) in t.mm.pmds.range(0..=u64::MAX) {
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

fn rss_kb(model: &mut Model, proc: &str) -> u64 {
    let r = model.read().expect("the model reads");
    r.counters
        .get(&format!("smaps.{proc}.Rss"))
        .copied()
        .unwrap_or(0) as u64
}

fn mem_free_kb(model: &mut Model) -> u64 {
    model.read().expect("the model reads").counters["meminfo.MemFree"] as u64
}

/// The huge zero folio's kB that `reclaim` frees besides the splits
/// (shrink_huge_zero_folio_scan: when no mm maps it).
fn huge_zero_freed_kb(model: &Model) -> u64 {
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
                    out.skipped += u64::from(before.len() < model.tasks.len());
                    let all = model.folio_uses(Scope::All).unwrap();
                    let all = utilization_report(&all, settings, DEFAULT_BUCKETS).give_back;
                    let procs: Vec<String> = model.tasks.keys().cloned().collect();
                    let rss_all: u64 = procs.iter().map(|p| rss_kb(&mut model, p)).sum();
                    let free = mem_free_kb(&mut model) + huge_zero_freed_kb(&model);
                    let _ = model.execute(stmt);
                    for (proc, predicted, rss) in before {
                        let after = rss_kb(&mut model, &proc);
                        out.checked
                            .push((stmt.pos.line, proc, predicted, rss - after));
                    }
                    let rss_after: u64 = procs.iter().map(|p| rss_kb(&mut model, p)).sum();
                    let line = stmt.pos.line;
                    let freed = mem_free_kb(&mut model).saturating_sub(free);
                    out.checked
                        .push((line, "all: freed".into(), all.freed_kb, freed));
                    out.checked.push((
                        line,
                        "all: Rss".into(),
                        all.rss_kb,
                        rss_all.saturating_sub(rss_after),
                    ));
                    continue;
                }
            }
            _ => {}
        }
        let _ = model.execute(stmt);
    }
    out
}
