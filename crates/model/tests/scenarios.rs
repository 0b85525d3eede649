//! Runs every `scenarios/*.hlw` and `scenarios/model-only/*.hlw` on the
//! model: each must run to its end and
//! meet every `expect` (whose values come from the kernel's behaviour, see the
//! comments in each file), and give the same observation twice.

use hugelab_model::Model;
use hugelab_workload::{parse_file, run};
use std::path::PathBuf;

fn scenarios() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in [root.clone(), root.join("model-only")] {
        files.extend(
            std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "hlw")),
        );
    }
    files.sort();
    files
}

#[test]
fn every_scenario_passes_on_the_model() {
    let files = scenarios();
    assert!(
        files.len() >= 25,
        "expected at least 25 scenarios, found {}",
        files.len()
    );
    let mut failures = Vec::new();
    for file in &files {
        let workload = match parse_file(file) {
            Ok(w) => w,
            Err(e) => {
                failures.push(format!("{e}"));
                continue;
            }
        };
        match run(&mut Model::default(), &workload) {
            Err(e) => failures.push(format!("{e}")),
            Ok(obs) => {
                assert!(
                    !obs.expects.is_empty(),
                    "{} has no expect line",
                    file.display()
                );
                for e in obs.failed_expects() {
                    failures.push(format!(
                        "{}:{}:{}: expect {} {} {}: actual {:?}",
                        obs.workload, e.line, e.col, e.counter, e.op, e.expected, e.actual
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenario failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn scenarios_are_deterministic() {
    for file in scenarios() {
        let Ok(workload) = parse_file(&file) else {
            continue;
        };
        let a = run(&mut Model::default(), &workload).map(|o| serde_json_string(&o));
        let b = run(&mut Model::default(), &workload).map(|o| serde_json_string(&o));
        assert_eq!(a, b, "{} gave two different observations", file.display());
    }
}

fn serde_json_string(obs: &hugelab_workload::Observation) -> String {
    format!("{obs:?}")
}

/// After every statement of every scenario, the model's invariants hold
/// (hugelab_model::debug_vm), and after the last process exits nothing is
/// left but the huge zero folio.
#[test]
fn invariants_hold_after_every_statement() {
    use hugelab_workload::{Backend, BackendErrorKind, StmtKind};
    let mut failures = Vec::new();
    for file in &scenarios() {
        let workload = parse_file(file).expect("scenario parses");
        let mut model = Model::default();
        for stmt in &workload.stmts {
            if matches!(
                stmt.kind,
                StmtKind::Snapshot { .. }
                    | StmtKind::Expect { .. }
                    | StmtKind::ExpectErrno { .. }
                    | StmtKind::ExpectSignal { .. }
            ) {
                continue;
            }
            // A refused system call, or a process killed by a signal, is an
            // outcome: the invariants must hold after it too.
            if let Err(e) = model.execute(stmt) {
                assert!(
                    matches!(
                        e.kind,
                        BackendErrorKind::Errno(_) | BackendErrorKind::Killed { .. }
                    ),
                    "{}:{}: {}",
                    file.display(),
                    stmt.pos.line,
                    e.message
                );
            }
            for broken in hugelab_model::debug_vm::check(&model) {
                failures.push(format!("{}:{}: {broken}", file.display(), stmt.pos.line));
            }
        }
        let names: Vec<String> = model.machine.tasks.keys().cloned().collect();
        for name in names {
            let text = format!("spawn {name}\n{name} exit\n");
            let exit = hugelab_workload::parse("exit.hlw", &text).expect("exit parses");
            model.execute(&exit.stmts[1]).expect("exit runs");
        }
        // With every process gone no reservation is left, and emptied
        // pools leave only the vmemmap pages HVO's restores allocated.
        for h in &model.machine.hugetlb.hstates {
            if h.resv_huge_pages != 0 {
                failures.push(format!(
                    "{}: {} HugeTLB reservations left after every process exited",
                    file.display(),
                    h.resv_huge_pages
                ));
            }
        }
        let empty = "set hugepages/hugepages-2048kB/nr_hugepages 0\n\
                     set hugepages/hugepages-1048576kB/nr_hugepages 0\n";
        for stmt in &hugelab_workload::parse("empty.hlw", empty)
            .expect("parses")
            .stmts
        {
            model.execute(stmt).expect("the pools empty");
        }
        let m = &model.machine;
        let zero = m.huge_zero_folio.map_or(0, |_| 512);
        // The fragmentation generator's unmovable pages stay to the end,
        // and so do the page cache pages of the workload's files (filemap).
        let cache = m.page_cache.all_pages().count() as u64;
        let kept = zero + m.vmemmap.zone_frames() + m.unmovable_pages + cache;
        if m.zone.nr_free_pages() + kept != m.zone.spanned_pages() {
            failures.push(format!(
                "{}: {} frames still allocated after every process exited and the pools emptied",
                file.display(),
                m.zone.spanned_pages() - m.zone.nr_free_pages() - kept
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Recording the fault decisions (`hugelab explain`) takes every fault the
/// long way, past the first-touch fast path: it must not change a single
/// counter, and every recorded fault must end in a decision.
#[test]
fn tracing_changes_nothing_it_observes() {
    use hugelab_model::trace::Step;
    for file in scenarios() {
        let Ok(workload) = parse_file(&file) else {
            continue;
        };
        let plain = run(&mut Model::default(), &workload).map(|o| serde_json_string(&o));
        let mut traced = Model::default();
        traced.machine.start_trace();
        let with = run(&mut traced, &workload).map(|o| serde_json_string(&o));
        assert_eq!(plain, with, "{}: tracing changed the run", file.display());
        let trace = traced.machine.take_trace().expect("still tracing");
        for f in &trace.faults {
            let last = f.steps.last();
            assert!(
                matches!(
                    last,
                    Some(
                        Step::Mapped { .. }
                            | Step::ZeroPage { .. }
                            | Step::Oom
                            | Step::Wp { reused: true, .. }
                            | Step::Wp { huge: false, .. }
                    )
                ),
                "{}: a fault at {:#x} ends in {last:?}",
                file.display(),
                f.addr
            );
        }
    }
}

/// workloads/android-64k-fallback.hlw: after the churn most of `measure`'s
/// 64K faults fall back; with defrag=always (async direct compaction for
/// the costly order) none do.
#[test]
fn android_churn_makes_most_64k_faults_fall_back_unless_compaction_runs() {
    let file =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../workloads/android-64k-fallback.hlw");
    let workload = parse_file(&file).expect("parses");
    let phase = |obs: &hugelab_workload::Observation, name: &str| {
        let at = |label: &str| {
            let s = obs.snapshots.iter().find(|s| s.label == label).unwrap();
            s.counters.get(name).copied().unwrap_or(0)
        };
        at("measured") - at("churned")
    };
    let obs = run(&mut Model::default(), &workload).expect("runs");
    let (alloc, fallback) = (
        phase(&obs, "mthp.64kB.anon_fault_alloc"),
        phase(&obs, "mthp.64kB.anon_fault_fallback"),
    );
    assert_eq!(alloc + fallback, 256, "16M of first 64K faults");
    assert!(fallback * 4 > 256 * 3, "most fall back: {fallback} of 256");
    assert_eq!(
        phase(&obs, "vmstat.compact_stall"),
        0,
        "no compaction at defrag=madvise"
    );

    let thp = hugelab_model::huge_mm::ThpSettings {
        defrag: hugelab_workload::ThpDefrag::Always,
        ..Default::default()
    };
    let obs = run(&mut Model::default().with_thp_settings(thp), &workload).expect("runs");
    assert!(
        phase(&obs, "mthp.64kB.anon_fault_fallback") < fallback / 2,
        "compaction gives most of them their 64K folio"
    );
    assert!(phase(&obs, "vmstat.compact_success") > 0);
}
