//! The utilization report's give-back prediction against the model's own
//! reclaim: the bimodal workload, and cases where the report's stated
//! limits make it differ.

mod prediction;

use prediction::check_predictions;

const BIMODAL: &str = include_str!("../../../workloads/bimodal-utilization.hlw");

#[test]
fn bimodal_workload_gives_back_what_was_predicted() {
    let out = check_predictions(BIMODAL);
    assert_eq!(out.skipped, 0);
    let checked: Vec<(String, u64, u64)> = out
        .checked
        .iter()
        .map(|(_, p, want, got)| (p.clone(), *want, *got))
        .collect();
    // (12*508 + 410 + 512 + 492 + 511) zero-filled pages of 16 under-used THPs.
    assert_eq!(checked, [("a".to_string(), 32084, 32084)]);
}

const SETTINGS: &str = "set transparent_hugepage/enabled madvise\n\
    set transparent_hugepage/hugepages-2048kB/enabled inherit\n\
    set transparent_hugepage/khugepaged/max_ptes_none 409\n";

/// (predicted, actual) Rss drop of process a at the workload's reclaim.
fn a_at_reclaim(body: &str) -> (u64, u64) {
    let out = check_predictions(&format!("{SETTINGS}{body}"));
    let (_, p, want, got) = out
        .checked
        .iter()
        .find(|(_, p, _, _)| p == "a")
        .expect("process a was checked");
    assert_eq!(p, "a");
    (*want, *got)
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
