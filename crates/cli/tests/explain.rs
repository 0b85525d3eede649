//! `hugelab explain`: one pinned decision chain per reason a fault gets the
//! folio size it gets. Each workload is small and its chain derived from
//! Linux 6.18 (mm/memory.c do_anonymous_page / alloc_anon_folio,
//! mm/huge_memory.c thp_vma_allowable_orders / do_huge_pmd_anonymous_page):
//! the wording is what users read, so it is pinned too.

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
