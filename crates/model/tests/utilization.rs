//! The utilization report's give-back prediction against the model's own
//! reclaim: the bimodal workload, and cases where the report's stated
//! limits make it differ.

mod prediction;

use prediction::{check_predictions, Check, Measured};

const BIMODAL: &str = include_str!("../../../workloads/bimodal-utilization.hlw");

#[test]
fn bimodal_workload_gives_back_what_was_predicted() {
    let out = check_predictions(BIMODAL);
    assert_eq!(out.skipped, 0);
    assert_eq!(out.mismatches().count(), 0);
    let checked: Vec<(Measured, u64, i64)> = out
        .checked
        .iter()
        .map(|c| (c.measured.clone(), c.predicted, c.actual))
        .collect();
    // (12*508 + 410 + 512 + 492 + 511) zero-filled pages of 16 under-used
    // THPs: all of it freed, and all of it a's Rss.
    assert_eq!(
        checked,
        [
            (Measured::ProcessRss("a".to_string()), 32084, 32084),
            (Measured::Freed, 32084, 32084),
            (Measured::AllRss, 32084, 32084),
        ]
    );
}

/// The harness itself: the report of every process is checked at every
/// reclaim, also with no process, so a guard against vacuous runs counts
/// the processes' own checks; and a measure that moved the wrong way is a
/// mismatch (a MemFree drop against nothing predicted), said as what it is.
#[test]
fn the_harness_counts_process_checks_apart_and_keeps_the_sign() {
    let out = check_predictions("reclaim\n");
    assert_eq!(out.checked.len(), 2, "{out:?}");
    assert_eq!(out.process_checks().count(), 0, "{out:?}");
    let dropped = Check {
        line: 7,
        measured: Measured::Freed,
        predicted: 0,
        actual: -4,
    };
    assert!(!dropped.holds());
    let why = dropped.to_string();
    assert!(
        why.contains("predicted 0 kB given back to the machine (freed_kb)")
            && why.contains("rise of MemFree, less the huge zero folio, was -4 kB"),
        "{why}"
    );
}

/// (predicted, measured) of the check of `what` at the workload's reclaim.
fn at_reclaim(body: &str, what: Measured) -> (u64, i64) {
    let out = check_predictions(&format!("{SETTINGS}{body}"));
    let c = out
        .checked
        .iter()
        .find(|c| c.measured == what)
        .unwrap_or_else(|| panic!("{what:?} was not checked: {out:?}"));
    (c.predicted, c.actual)
}

#[test]
fn splitting_partially_mapped_thps_frees_their_unmapped_halves() {
    // The case: 16 THPs full of data, the second half of each
    // unmapped. The split frees the 16 unmapped halves (16 MiB); no mapped
    // page is zero-filled, so no Rss changes.
    let mut body =
        String::from("spawn a\na mmap buf 32M align=2M\na madvise buf HUGEPAGE\na write buf\n");
    for i in 0..16 {
        body.push_str(&format!("a munmap buf+{}M:1M\n", 2 * i + 1));
    }
    body.push_str("reclaim\n");
    assert_eq!(at_reclaim(&body, Measured::Freed), (16384, 16384));
    assert_eq!(at_reclaim(&body, Measured::AllRss), (0, 0));
    // One written page in a THP, its second half unmapped: 256 unmapped and
    // 255 zero-filled subpages freed, the latter off the Rss.
    let body = "spawn a\na mmap buf 2M align=2M\na madvise buf HUGEPAGE\na write buf:4K\n\
        a munmap buf+1M:1M\nreclaim\n";
    assert_eq!(at_reclaim(body, Measured::Freed), (511 * 4, 511 * 4));
    assert_eq!(at_reclaim(body, Measured::AllRss), (255 * 4, 255 * 4));
}

#[test]
fn a_thp_shared_after_fork_is_freed_once_and_leaves_both_rss() {
    // Both processes map the THP whole (4 written pages, 508 zero-filled):
    // one folio, under-used at 409, its 508 zero-filled pages freed once
    // and remapped in both.
    let body = "spawn a\na mmap buf 2M align=2M\na madvise buf HUGEPAGE\n\
        a write buf step=512K\na fork b\nreclaim\n";
    assert_eq!(at_reclaim(body, Measured::Freed), (508 * 4, 508 * 4));
    assert_eq!(
        at_reclaim(body, Measured::AllRss),
        (2 * 508 * 4, 2 * 508 * 4)
    );
}

const SETTINGS: &str = "set transparent_hugepage/enabled madvise\n\
    set transparent_hugepage/hugepages-2048kB/enabled inherit\n\
    set transparent_hugepage/khugepaged/max_ptes_none 409\n";

/// (predicted, actual) Rss drop of process a at the workload's reclaim.
fn a_at_reclaim(body: &str) -> (u64, i64) {
    at_reclaim(body, Measured::ProcessRss("a".to_string()))
}

#[test]
fn partially_mapped_folios_give_back_their_mapped_zero_pages() {
    // 64K mTHPs, half of each unmapped: split as partially mapped whatever
    // max_ptes_none says; 3 written pages of the 8 left in the first.
    let body = "set transparent_hugepage/hugepages-2048kB/enabled never\n\
        set transparent_hugepage/hugepages-64kB/enabled always\n\
        spawn a\na mmap buf 128K align=64K\na write buf:12K\na write buf+64K:4K\n\
        a munmap buf+32K:32K\na munmap buf+96K:32K\nreclaim\n";
    // 5 + 7 zero-filled pages still mapped.
    assert_eq!(a_at_reclaim(body), (48, 48));
}

#[test]
fn collapsed_and_huge_zero_thps_are_candidates_like_faulted_ones() {
    let body = "spawn a\na mmap buf 4M align=2M\na madvise buf NOHUGEPAGE\n\
        a write buf:40K\na madvise buf HUGEPAGE\na madvise buf COLLAPSE\n\
        a mmap z 2M align=2M\na madvise z HUGEPAGE\na read z\na write z:4K\nreclaim\n";
    // buf: one collapsed THP with 502 zero pages (the empty second 2M
    // stops MADV_COLLAPSE with EINVAL after it); z: 511.
    assert_eq!(a_at_reclaim(body), ((502 + 511) * 4, (502 + 511) * 4));
}

/// Runs `text` up to its first `reclaim`: the report's predicted give-back
/// for process a then, and a's Rss drop at that reclaim (no assumption
/// checked).
fn predicted_and_dropped(text: &str) -> (u64, u64) {
    use hugelab_model::thp_utilization::Scope;
    use hugelab_model::Model;
    use hugelab_workload::utilization::{utilization_report, DEFAULT_BUCKETS};
    use hugelab_workload::{parse, Backend, StmtKind};
    let w = parse("t.hlw", text).unwrap();
    let mut model = Model::default();
    let rss = |model: &mut Model| model.read().unwrap().counters["smaps.a.Rss"] as u64;
    for stmt in &w.stmts {
        match stmt.kind {
            StmtKind::Reclaim => {
                let folios = model.folio_uses(Scope::Process("a")).unwrap();
                let report =
                    utilization_report(&folios, model.shrinker_settings(), DEFAULT_BUCKETS);
                let before = rss(&mut model);
                model.execute(stmt).unwrap();
                return (report.give_back.rss_kb, before - rss(&mut model));
            }
            StmtKind::Snapshot { .. } | StmtKind::Expect { .. } => {}
            _ => model.execute(stmt).unwrap(),
        }
    }
    panic!("no reclaim");
}

#[test]
fn a_thp_queued_before_shrink_underused_0_is_still_split() {
    // Kernel-verified (workloads/underused-queued-then-shrinker-off.hlw):
    // the knob only gates queueing (deferred_split_folio), the scan ignores
    // it. The model's report knows the folio is queued and predicts it.
    let text = include_str!("../../../workloads/underused-queued-then-shrinker-off.hlw");
    assert_eq!(predicted_and_dropped(text), (511 * 4, 511 * 4));
}
