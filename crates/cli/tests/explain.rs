//! `hugelab explain`: one pinned decision chain per reason a fault gets the
//! folio size it gets. Each workload is small and its chain derived from
//! Linux 6.18 (mm/memory.c do_anonymous_page / alloc_anon_folio,
//! mm/huge_memory.c thp_vma_allowable_orders / do_huge_pmd_anonymous_page):
//! the wording is what users read, so it is pinned too. The collapses of
//! `khugepaged` and MADV_COLLAPSE are pinned against mm/khugepaged.c's
//! rules (hpage_collapse_scan_pmd's order of checks and limits,
//! madvise_collapse's results it goes on after, madvise_collapse_errno).

mod common;

use serde_json::Value;
use std::path::PathBuf;

/// The settings every case starts from: THP on for every VMA, only 64K
/// among the mTHP sizes.
const PRELUDE: &str = "\
set transparent_hugepage/enabled always
set transparent_hugepage/hugepages-16kB/enabled never
set transparent_hugepage/hugepages-32kB/enabled never
set transparent_hugepage/hugepages-64kB/enabled always
set transparent_hugepage/hugepages-128kB/enabled never
set transparent_hugepage/hugepages-256kB/enabled never
set transparent_hugepage/hugepages-512kB/enabled never
set transparent_hugepage/hugepages-1024kB/enabled never
set transparent_hugepage/hugepages-2048kB/enabled inherit
";

/// The groups `hugelab explain --json` gives the last statement of
/// `body` (after the prelude): (faults, chain) each.
fn explain_last(name: &str, body: &str) -> Vec<(u64, Vec<String>)> {
    let dir = std::env::temp_dir().join(format!("hugelab-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file: PathBuf = dir.join(format!("{name}.hlw"));
    let text = format!("{PRELUDE}{body}");
    std::fs::write(&file, &text).unwrap();
    let line = text.lines().count();
    let out = common::run(&["explain", "--json", &format!("{}:{line}", file.display())]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let stmts = v.as_array().unwrap();
    assert_eq!(stmts.len(), 1, "{v}");
    stmts[0]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let chain = g["chain"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect();
            (g["faults"].as_u64().unwrap(), chain)
        })
        .collect()
}

fn chain(steps: &[&str]) -> Vec<String> {
    steps.iter().map(|s| s.to_string()).collect()
}

const MTHP_NEVER: &str = "1M,512K,256K,128K,32K,16K: hugepages-<size>kB/enabled never";

#[test]
fn a_pmd_fault_that_gets_its_thp() {
    let got = explain_last("pmd", "spawn a\na mmap buf 4M align=2M\na write buf\n");
    assert_eq!(
        got,
        vec![(
            2,
            chain(&[
                "thp_vma_allowable_orders (PMD): 2M allowed",
                "thp_vma_suitable_orders: 2M fit",
                "__alloc_pages(order 9, GFP_TRANSHUGE_LIGHT|__GFP_NORETRY): ok",
                "mapped a 2M folio",
            ])
        )]
    );
}

#[test]
fn a_vma_too_small_for_the_pmd_gets_the_largest_mthp_that_fits() {
    // 1M: do_huge_pmd_anonymous_page's suitable check fails, then the
    // mTHP path maps 64K folios.
    let got = explain_last(
        "suitable",
        "spawn a\na mmap buf 1M align=2M\na write buf:64K\n",
    );
    assert_eq!(
        got,
        vec![(
            1,
            chain(&[
                "thp_vma_allowable_orders (PMD): 2M allowed",
                "thp_vma_suitable_orders: 2M cross the VMA's bounds",
                &format!("thp_vma_allowable_orders (mTHP): 64K allowed; {MTHP_NEVER}"),
                "thp_vma_suitable_orders: 64K fit",
                "__alloc_pages(order 4, GFP_TRANSHUGE_LIGHT): ok",
                "mapped a 64K folio",
            ])
        )]
    );
}

#[test]
fn a_populated_pte_rules_the_mthp_out() {
    // The read maps the zero page; the write's 64K range is then not
    // pte_none, and alloc_anon_folio takes order 0.
    let got = explain_last(
        "ptes",
        "spawn a\na mmap buf 1M align=2M\na read buf:4K\na write buf:4K\n",
    );
    assert_eq!(
        got,
        vec![(1, chain(&["do_wp_page: copied into a new page"]))]
    );
    let got = explain_last(
        "ptes2",
        "spawn a\na mmap buf 1M align=2M\na read buf+4K:4K\na write buf:4K\n",
    );
    assert_eq!(
        got,
        vec![(
            1,
            chain(&[
                &format!("thp_vma_allowable_orders (mTHP): 64K allowed; {MTHP_NEVER}"),
                "thp_vma_suitable_orders: 64K fit",
                "pte_range_none: the 64K range has a populated PTE",
                "__alloc_pages(order 0, GFP_HIGHUSER_MOVABLE): ok",
                "mapped a 4K folio",
            ])
        )]
    );
}

#[test]
fn read_faults_map_zero_pages() {
    let got = explain_last("zero", "spawn a\na mmap buf 3M align=2M\na read buf\n");
    assert_eq!(
        got,
        vec![
            (
                1,
                chain(&[
                    "thp_vma_allowable_orders (PMD): 2M allowed",
                    "thp_vma_suitable_orders: 2M fit",
                    "read fault: the huge zero folio",
                ])
            ),
            (
                1,
                chain(&[
                    "thp_vma_allowable_orders (PMD): 2M allowed",
                    "thp_vma_suitable_orders: 2M cross the VMA's bounds",
                    "read fault: the shared zero page",
                ])
            ),
            (255, chain(&["read fault: the shared zero page"])),
        ]
    );
}

#[test]
fn each_tunable_and_vma_veto_is_named() {
    let cases = [
        (
            "set transparent_hugepage/hugepages-2048kB/enabled never\n",
            "2M: hugepages-<size>kB/enabled never",
            "64K allowed; 1M,512K,256K,128K,32K,16K: hugepages-<size>kB/enabled never",
        ),
        (
            "set transparent_hugepage/enabled never\nset transparent_hugepage/hugepages-64kB/enabled inherit\n",
            "2M: hugepages-<size>kB/enabled inherit, enabled never",
            "none allowed; 1M,512K,256K,128K,32K,16K: hugepages-<size>kB/enabled never; 64K: hugepages-<size>kB/enabled inherit, enabled never",
        ),
        (
            "set transparent_hugepage/enabled madvise\nset transparent_hugepage/hugepages-64kB/enabled madvise\n",
            "2M: madvise, and the VMA has no MADV_HUGEPAGE",
            "none allowed; 1M,512K,256K,128K,32K,16K: hugepages-<size>kB/enabled never; 64K: madvise, and the VMA has no MADV_HUGEPAGE",
        ),
    ];
    for (i, (settings, pmd, mthp)) in cases.iter().enumerate() {
        let got = explain_last(
            &format!("veto{i}"),
            &format!("{settings}spawn a\na mmap buf 2M align=2M\na write buf:4K\n"),
        );
        let first = &got[0].1;
        assert_eq!(
            first[0],
            format!("thp_vma_allowable_orders (PMD): none allowed; {pmd}"),
            "case {i}"
        );
        assert_eq!(
            first[1],
            format!("thp_vma_allowable_orders (mTHP): {mthp}"),
            "case {i}"
        );
    }
    for (i, (stmt, why)) in [
        ("a madvise buf nohugepage", "MADV_NOHUGEPAGE"),
        ("a thp_disable on", "PR_SET_THP_DISABLE"),
    ]
    .iter()
    .enumerate()
    {
        let got = explain_last(
            &format!("vma{i}"),
            &format!("spawn a\na mmap buf 2M align=2M\n{stmt}\na write buf:4K\n"),
        );
        assert_eq!(
            got,
            vec![(
                1,
                chain(&[
                    &format!("thp_vma_allowable_orders (PMD): none allowed; 2M: {why}"),
                    &format!(
                        "thp_vma_allowable_orders (mTHP): none allowed; {MTHP_NEVER}; 64K: {why}"
                    ),
                    "__alloc_pages(order 0, GFP_HIGHUSER_MOVABLE): ok",
                    "mapped a 4K folio",
                ])
            )],
            "{stmt}"
        );
    }
}

#[test]
fn copy_on_write_after_fork() {
    // The child's write: the THP is shared, so do_huge_pmd_wp_page splits
    // the PMD and do_wp_page copies the one page.
    let got = explain_last(
        "cow",
        "spawn a\na mmap buf 2M align=2M\na write buf\na fork b\nb write buf:4K\n",
    );
    assert_eq!(
        got,
        vec![(
            1,
            chain(&[
                "do_huge_pmd_wp_page: PMD split, the write retried at the PTE level",
                "do_wp_page: copied into a new page",
            ])
        )]
    );
}

#[test]
fn no_free_block_falls_back_to_the_next_order() {
    // A 64M machine whose memory a 4K-page fill took: the 2M allocation
    // finds no free block (thp_fault_fallback), so does 64K; order 0 gets
    // a page.
    let body = "machine memory=64M\nset transparent_hugepage/enabled never\nspawn a\na mmap fill 62M align=2M\na write fill\nset transparent_hugepage/enabled always\na mmap t 2M align=2M\na write t:4K\n";
    let got = explain_last("nofree", body);
    assert_eq!(
        got,
        vec![(
            1,
            chain(&[
                "thp_vma_allowable_orders (PMD): 2M allowed",
                "thp_vma_suitable_orders: 2M fit",
                "__alloc_pages(order 9, GFP_TRANSHUGE_LIGHT|__GFP_NORETRY): no free block",
                "2M falls back (thp_fault_fallback, anon_fault_fallback)",
                &format!("thp_vma_allowable_orders (mTHP): 64K allowed; {MTHP_NEVER}"),
                "thp_vma_suitable_orders: 64K fit",
                "__alloc_pages(order 4, GFP_TRANSHUGE_LIGHT): ok",
                "mapped a 64K folio",
            ])
        )]
    );
}

#[test]
fn a_line_without_a_statement_is_refused() {
    let dir = std::env::temp_dir().join(format!("hugelab-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("empty-line.hlw");
    std::fs::write(&file, "spawn a\n\n").unwrap();
    let out = common::run(&["explain", &format!("{}:2", file.display())]);
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains(":2: no statement starts on this line"),
        "{}",
        common::stderr(&out)
    );
}

/// 64M, filled with 4K pages, then pageblocks 3-5 emptied but for their
/// last page each: 2012 free pages and no free 2M block (the model-only compaction
/// scenarios' machine).
const FRAGMENTED: &str = "machine memory=64M
set transparent_hugepage/enabled never
spawn a
a mmap fill 62M align=2M
a write fill
a munmap fill+2M:2044K
a munmap fill+4M:2044K
a munmap fill+6M:2044K
set transparent_hugepage/enabled always
set transparent_hugepage/hugepages-64kB/enabled never
";

#[test]
fn direct_compaction_and_kcompactd_are_named() {
    // defrag=always: GFP_TRANSHUGE (direct reclaim; __GFP_NORETRY for a VMA
    // without MADV_HUGEPAGE), and alloc_pages_mpol's first, local-node try
    // adds __GFP_NORETRY anyway; the slow path compacts async first.
    let got = explain_last(
        "compact",
        &format!("{FRAGMENTED}set transparent_hugepage/defrag always\na mmap t 2M align=2M\na write t:4K\n"),
    );
    assert_eq!(
        got[0].1,
        chain(&[
            "thp_vma_allowable_orders (PMD): 2M allowed",
            "thp_vma_suitable_orders: 2M fit",
            "__alloc_pages(order 9, GFP_TRANSHUGE|__GFP_NORETRY): no free block",
            "try_to_compact_pages(order 9, async): COMPACT_SUCCESS",
            "mapped a 2M folio",
        ])
    );
    // defrag=defer: fail fast, wake kcompactd, fall back.
    let got = explain_last(
        "kcompactd",
        &format!("{FRAGMENTED}set transparent_hugepage/defrag defer\na mmap t 2M align=2M\na write t:4K\n"),
    );
    assert_eq!(
        got[0].1[..5],
        chain(&[
            "thp_vma_allowable_orders (PMD): 2M allowed",
            "thp_vma_suitable_orders: 2M fit",
            "__alloc_pages(order 9, GFP_TRANSHUGE_LIGHT|__GFP_KSWAPD_RECLAIM|__GFP_NORETRY): no free block",
            "wakeup_kcompactd(order 9)",
            "2M falls back (thp_fault_fallback, anon_fault_fallback)",
        ])[..]
    );
}

#[test]
fn a_charge_over_memory_max_falls_back_to_an_order_that_fits() {
    // 2M limit, 1M used: the madvised THP (GFP_TRANSHUGE, may reclaim;
    // nothing to reclaim without swap) cannot be charged; alloc_anon_folio
    // then gets a 64K folio charged (mm/huge_memory.c
    // vma_alloc_anon_folio_pmd, mm/memory.c alloc_anon_folio).
    let body = "set transparent_hugepage/enabled madvise
cgroup g memory.max=2M
spawn a cgroup=g
a mmap fill 1M
a madvise fill nohugepage
a write fill
a mmap buf 2M align=2M
a madvise buf hugepage
a write buf:4K
";
    let got = explain_last("charge", body);
    assert_eq!(
        got,
        vec![(
            1,
            chain(&[
                "thp_vma_allowable_orders (PMD): 2M allowed",
                "thp_vma_suitable_orders: 2M fit",
                "__alloc_pages(order 9, GFP_TRANSHUGE|__GFP_NORETRY): ok",
                "mem_cgroup_charge(2M to g): over memory.max",
                "2M falls back (thp_fault_fallback, thp_fault_fallback_charge, anon_fault_fallback, anon_fault_fallback_charge)",
                &format!("thp_vma_allowable_orders (mTHP): 64K allowed; {MTHP_NEVER}"),
                "thp_vma_suitable_orders: 64K fit",
                "__alloc_pages(order 4, GFP_TRANSHUGE): ok",
                "mem_cgroup_charge(64K to g): ok",
                "mapped a 64K folio",
            ])
        )]
    );
}

#[test]
fn the_memcg_oom_killer_is_named_with_its_victim() {
    let body = "set transparent_hugepage/enabled never
cgroup g memory.max=1M
spawn a cgroup=g
a mmap buf 2M
a write buf
";
    let got = explain_last("oom", body);
    let (faults, last) = got.last().unwrap();
    assert_eq!(*faults, 1);
    assert_eq!(
        last[last.len() - 4..],
        chain(&[
            "__alloc_pages(order 0, GFP_HIGHUSER_MOVABLE): ok",
            "mem_cgroup_charge(4K to g): over memory.max",
            "mem_cgroup_out_of_memory(g): select_bad_process chose the faulting process (oom_badness 256 pages), SIGKILL",
            "no page: VM_FAULT_OOM",
        ])[..]
    );
    // What was charged before it fills the group: 64K folios while one
    // fits, then a 64K charge fails (GFP_TRANSHUGE_LIGHT: no reclaim) and
    // falls back to 4K, and 4K pages up to the limit; with the PUD, PMD
    // and PTE tables (charged as kmem) that is memory.max, 256 pages.
    let mut pages = 3;
    for (faults, chain) in &got {
        for step in chain {
            if step == "mem_cgroup_charge(64K to g): ok" {
                pages += 16 * faults;
            } else if step == "mem_cgroup_charge(4K to g): ok" {
                pages += faults;
            }
        }
    }
    assert_eq!(pages, 256, "{got:?}");
    assert!(got.iter().any(|(_, c)| c.contains(
        &"64K falls back (anon_fault_fallback_charge, anon_fault_fallback)".to_string()
    )));
}

/// `hugelab explain --json` of the last statement of `body` (after the
/// prelude): its totals and its collapse groups as (ranges, first, chain).
fn explain_collapses(name: &str, body: &str) -> (Value, Vec<(u64, String, Vec<String>)>) {
    let dir = std::env::temp_dir().join(format!("hugelab-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file: PathBuf = dir.join(format!("{name}.hlw"));
    let text = format!("{PRELUDE}{body}");
    std::fs::write(&file, &text).unwrap();
    let line = text.lines().count();
    let out = common::run(&["explain", "--json", &format!("{}:{line}", file.display())]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let stmt = &v.as_array().unwrap()[0];
    let groups = stmt["collapses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let chain = g["chain"].as_array().unwrap();
            (
                g["ranges"].as_u64().unwrap(),
                g["first"].as_str().unwrap().to_string(),
                chain
                    .iter()
                    .map(|s| s.as_str().unwrap().to_string())
                    .collect(),
            )
        })
        .collect();
    (stmt["totals"].clone(), groups)
}

/// `buf` of `len` mapped in 4K pages (MADV_NOHUGEPAGE while writing
/// `writes`), then MADV_HUGEPAGE, which registers the mm with khugepaged.
fn pte_mapped(len: &str, writes: &[&str]) -> String {
    let mut s = format!("spawn a\na mmap buf {len} align=2M\na madvise buf NOHUGEPAGE\n");
    for w in writes {
        s.push_str(&format!("a write {w}\n"));
    }
    s.push_str("a madvise buf HUGEPAGE\n");
    s
}

#[test]
fn khugepaged_names_the_limit_a_range_exceeds_and_where_the_scan_stopped() {
    // hpage_collapse_scan_pmd: ++none_or_zero, and `none_or_zero <=
    // khugepaged_max_ptes_none` goes on; the first one over fails the range
    // with SCAN_EXCEED_NONE_PTE at that PTE. With max_ptes_none 256:
    // 256 none PTEs collapse; after 64 present PTEs, the 257th none PTE
    // (PTE 321) fails.
    let body = format!(
        "set transparent_hugepage/khugepaged/max_ptes_none 256\n{}khugepaged\n",
        pte_mapped("6M", &["buf:1M", "buf+2M:2M", "buf+4M:256K"])
    );
    let (totals, got) = explain_collapses("exceed-none", &body);
    let collapsed = "collapse_huge_page(__alloc_pages(order 9, GFP_TRANSHUGE)): \
                     SCAN_SUCCEED: the range is now one 2M THP";
    assert_eq!(
        got,
        vec![
            (
                1,
                "a buf+0".into(),
                chain(&[
                    "hpage_collapse_scan_pmd: 512 of 512 PTEs scanned: 256 none or zero \
                     (max_ptes_none 256), 0 shared (max_ptes_shared 256): SCAN_SUCCEED",
                    collapsed,
                ])
            ),
            (
                1,
                "a buf+2M".into(),
                chain(&[
                    "hpage_collapse_scan_pmd: 512 of 512 PTEs scanned: 0 none or zero \
                     (max_ptes_none 256), 0 shared (max_ptes_shared 256): SCAN_SUCCEED",
                    collapsed,
                ])
            ),
            (
                1,
                "a buf+4M".into(),
                chain(&[
                    "hpage_collapse_scan_pmd: 321 of 512 PTEs scanned: 257 none or zero \
                     (max_ptes_none 256), 0 shared (max_ptes_shared 256); more none or zero \
                     PTEs than max_ptes_none: SCAN_EXCEED_NONE_PTE"
                ])
            ),
        ]
    );
    assert_eq!(totals["ranges"], 3);
    assert_eq!(totals["collapsed"], 2);
    assert_eq!(totals["not_collapsed"]["SCAN_EXCEED_NONE_PTE"], 1);
}

#[test]
fn khugepaged_counts_the_ptes_of_shared_pages_against_max_ptes_shared() {
    // After fork, the child writes its first 100 pages (copies): 412 PTEs
    // in each process map pages both map (folio_maybe_mapped_shared).
    // `shared > khugepaged_max_ptes_shared` fails: with 411 the 412th
    // shared PTE, the last one, ends the scan with SCAN_EXCEED_SHARED_PTE,
    // in the parent and in the child.
    let body = format!(
        "set transparent_hugepage/khugepaged/max_ptes_shared 411\n{}a fork b\nb write buf:400K\nkhugepaged\n",
        pte_mapped("2M", &["buf"])
    );
    let (totals, got) = explain_collapses("exceed-shared", &body);
    let exceeded = chain(&[
        "hpage_collapse_scan_pmd: 512 of 512 PTEs scanned: 0 none or zero (max_ptes_none 511), \
         412 shared (max_ptes_shared 411); more shared PTEs than max_ptes_shared: \
         SCAN_EXCEED_SHARED_PTE",
    ]);
    assert_eq!(
        got,
        vec![
            (1, "a buf+0".into(), exceeded.clone()),
            (1, "b buf+0".into(), exceeded)
        ]
    );
    assert_eq!(totals["collapsed"], 0);
    assert_eq!(totals["not_collapsed"]["SCAN_EXCEED_SHARED_PTE"], 2);
}

#[test]
fn madvise_collapse_goes_on_past_a_pinned_range_and_returns_eagain() {
    // MADV_COLLAPSE applies no max_ptes_* limit. The pinned first page
    // fails is_refcount_suitable (SCAN_PAGE_COUNT) at the first PTE, one
    // of the results madvise_collapse goes on after; the next range
    // collapses; the call returns madvise_collapse_errno(SCAN_PAGE_COUNT),
    // -EAGAIN.
    let body = format!(
        "{}a pin buf:4K\na madvise buf COLLAPSE\n",
        pte_mapped("4M", &["buf"])
    );
    let (totals, got) = explain_collapses("collapse-pinned", &body);
    assert_eq!(
        got,
        vec![
            (
                1,
                "a buf+0".into(),
                chain(&[
                    "hpage_collapse_scan_pmd: 1 of 512 PTEs scanned: 0 none or zero, 0 shared \
                     (MADV_COLLAPSE applies no limit); a page has references beyond its \
                     mappings (a pin): SCAN_PAGE_COUNT"
                ])
            ),
            (
                1,
                "a buf+2M".into(),
                chain(&[
                    "hpage_collapse_scan_pmd: 512 of 512 PTEs scanned: 0 none or zero, 0 shared \
                     (MADV_COLLAPSE applies no limit): SCAN_SUCCEED",
                    "collapse_huge_page(__alloc_pages(order 9, GFP_TRANSHUGE)): SCAN_SUCCEED: \
                     the range is now one 2M THP",
                ])
            ),
            (
                0,
                String::new(),
                chain(&[
                    "madvise_collapse returns EAGAIN (madvise_collapse_errno(SCAN_PAGE_COUNT))"
                ])
            ),
        ]
    );
    assert_eq!(totals["ranges"], 2);
    assert_eq!(totals["collapsed"], 1);
}

#[test]
fn madvise_collapse_stops_at_an_empty_range_and_returns_einval() {
    // The first range has no PTE table while the PMD table exists (the
    // second range faulted): find_pmd_or_thp_or_none gives SCAN_PMD_NONE,
    // which is not among the results madvise_collapse goes on after, so
    // the second range is never scanned; madvise_collapse_errno gives
    // -EINVAL for it.
    let body = format!("{}a madvise buf COLLAPSE\n", pte_mapped("4M", &["buf+2M"]));
    let (_, got) = explain_collapses("collapse-pmd-none", &body);
    assert_eq!(
        got,
        vec![
            (
                1,
                "a buf+0".into(),
                chain(&[
                    "hpage_collapse_scan_pmd: no PTE table in the range (nothing mapped): \
                         SCAN_PMD_NONE"
                ])
            ),
            (
                0,
                String::new(),
                chain(&["madvise_collapse returns EINVAL (madvise_collapse_errno(SCAN_PMD_NONE))"])
            ),
        ]
    );
}

#[test]
fn khugepaged_passes_over_a_vma_the_pmd_order_is_not_allowed_in() {
    // khugepaged_scan_mm_slot skips a VMA thp_vma_allowable_order refuses
    // (MADV_NOHUGEPAGE) and scans the others of the registered mm.
    let body = format!(
        "{}a mmap off 2M align=2M\na madvise off NOHUGEPAGE\na write off\nkhugepaged\n",
        pte_mapped("2M", &["buf"])
    );
    let (totals, got) = explain_collapses("vma-not-allowed", &body);
    let names: Vec<&str> = got
        .iter()
        .flat_map(|(_, _, c)| c)
        .map(String::as_str)
        .collect();
    assert!(
        names.contains(
            &"khugepaged_scan_mm_slot passes over the VMA at a off+0 (2M): \
              thp_vma_allowable_order: the PMD order is not allowed"
        ),
        "{names:#?}"
    );
    assert_eq!(totals["ranges"], 1);
    assert_eq!(totals["collapsed"], 1);
}

#[test]
fn khugepaged_does_not_run_while_the_pmd_size_is_disabled() {
    // hugepage_pmd_enabled: hugepages-2048kB inherit and enabled never.
    let body = format!(
        "{}set transparent_hugepage/enabled never\nkhugepaged\n",
        pte_mapped("2M", &["buf"])
    );
    let (totals, got) = explain_collapses("stopped", &body);
    assert_eq!(
        got,
        vec![(
            0,
            String::new(),
            chain(&[
                "khugepaged_do_scan: hugepage_pmd_enabled is false (the PMD size is \
                     disabled): the thread does not run"
            ])
        )]
    );
    assert_eq!(totals["ranges"], 0);
}

#[test]
fn the_totals_line_comes_first_and_counts_fallbacks() {
    // The 64M machine filled with 4K pages: a 2M write fault finds no free
    // 2M block and falls back to 64K (see no_free_block_falls_back_...).
    let dir = std::env::temp_dir().join(format!("hugelab-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("totals.hlw");
    let text = format!(
        "{PRELUDE}machine memory=64M\nset transparent_hugepage/enabled never\nspawn a\n\
         a mmap fill 62M align=2M\na write fill\nset transparent_hugepage/enabled always\n\
         a mmap t 2M align=2M\na write t:4K\n"
    );
    std::fs::write(&file, &text).unwrap();
    let line = text.lines().count();
    let out = common::run(&["explain", &format!("{}:{line}", file.display())]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let out = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[1], "  1 fault: 1 got 64K; 1 fell back", "{out}");
    // The whole file: every statement, then the total over them. The
    // prelude's hugepages-64kB/enabled always does not follow the top-level
    // `never` (only `inherit` does): the 62M fill is 992 64K faults.
    let out = common::run(&["explain", file.to_str().unwrap()]);
    let out = String::from_utf8(out.stdout).unwrap();
    let last = out.lines().last().unwrap();
    assert_eq!(
        last, "total over 2 statements: 993 faults: 993 got 64K; 1 fell back",
        "{out}"
    );
}

#[test]
fn the_file_total_lists_the_largest_folio_first_whatever_statement_got_it_first() {
    // The first statement's faults get only 4K (every THP size off), a
    // later one's 64K: the total over the file still starts with 64K.
    let dir = std::env::temp_dir().join(format!("hugelab-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("order.hlw");
    let text = format!(
        "{PRELUDE}set transparent_hugepage/enabled never\n\
         set transparent_hugepage/hugepages-64kB/enabled never\nspawn a\n\
         a mmap small 64K align=64K\na write small\n\
         set transparent_hugepage/hugepages-64kB/enabled always\n\
         a mmap big 128K align=64K\na write big\n"
    );
    std::fs::write(&file, &text).unwrap();
    let out = common::run(&["explain", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let out = String::from_utf8(out.stdout).unwrap();
    assert!(out.contains("  16 faults: 16 got 4K\n"), "{out}");
    assert!(out.contains("  2 faults: 2 got 64K\n"), "{out}");
    let last = out.lines().last().unwrap();
    assert_eq!(
        last, "total over 2 statements: 18 faults: 2 got 64K, 16 got 4K",
        "{out}"
    );
}
