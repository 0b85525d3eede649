//! `hugelab compare`'s summary: its numbers on small workloads, derived by hand
//! from what Linux 6.18 does (mm/memory.c alloc_anon_folio and
//! mm/huge_memory.c do_huge_pmd_anonymous_page), not from the model's output.

mod common;
use common::TempWorkload;

use serde_json::Value;
use std::process::Command;

fn compare(args: &[&str]) -> (String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .arg("compare")
        .args(args)
        .output()
        .expect("the hugelab binary runs");
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert_eq!(o.status.code(), Some(0), "{err}");
    (out, err)
}

/// The summary row of `setting` in `compare --json`.
fn row<'a>(doc: &'a Value, setting: &str) -> &'a Value {
    doc["summary"]
        .as_array()
        .expect("a summary array")
        .iter()
        .find(|r| r["setting"] == setting)
        .unwrap_or_else(|| panic!("no summary row {setting}: {doc}"))
}

fn share(row: &Value, size: &str) -> Value {
    row["by_size"]
        .as_array()
        .expect("by_size")
        .iter()
        .find(|s| s["size"] == size)
        .map_or(Value::Null, |s| s["share_pct"].clone())
}

const NEVER: &str = "transparent_hugepage/enabled=never";

/// 2 MiB written a page at a time, 2 MiB-aligned:
/// - 4K: every page faults, 512 faults, 2048 kB of 4K pages.
/// - 64K: the first write in each 64K block finds it empty and inside the VMA,
///   so it gets a 64K folio mapped by 16 PTEs: 2M / 64K = 32 faults,
///   (32 - 512) / 512 = -93.75 %; the same 2048 kB, all of it in 64K folios.
/// - PMD (enabled=always, hugepages-2048kB inherit by default): one fault maps
///   the whole 2M: (1 - 512) / 512 = -99.8046875 %; all of it in a 2M folio.
#[test]
fn summary_of_2m_written_with_64k_mthp_and_pmd_thp() {
    let w = TempWorkload::new("spawn a\na mmap buf 2M align=2M\na write buf\n");
    let w = w.path();
    let k64 = format!("64K:{NEVER},transparent_hugepage/hugepages-64kB/enabled=always");
    let base = format!("4K:{NEVER}");
    let pmd = "PMD:transparent_hugepage/enabled=always";
    let args = ["--setting", &base, "--setting", &k64, "--setting", pmd];
    let mut json_args = args.to_vec();
    json_args.extend(["--json", w]);
    let (out, _) = compare(&json_args);
    let doc: Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(doc["baseline"], "4K");

    let r = row(&doc, "4K");
    assert_eq!(r["page_faults"], 512);
    assert_eq!(r["page_faults_change_pct"], 0.0);
    assert_eq!(r["anon_kb"], 2048);
    assert_eq!(r["large_folio_kb"], 0);
    assert_eq!(r["large_folio_share_pct"], 0.0);
    assert_eq!(r["fallbacks"], 0);

    let r = row(&doc, "64K");
    assert_eq!(r["page_faults"], 32);
    assert_eq!(r["page_faults_change_pct"], -93.75);
    assert_eq!(r["anon_kb"], 2048);
    assert_eq!(r["anon_change_pct"], 0.0);
    assert_eq!(r["large_folio_kb"], 2048);
    assert_eq!(r["large_folio_share_pct"], 100.0);
    assert_eq!(share(r, "64kB"), 100.0);
    assert_eq!(r["fallbacks"], 0);

    let r = row(&doc, "PMD");
    assert_eq!(r["page_faults"], 1);
    assert_eq!(r["page_faults_change_pct"], -99.8046875);
    assert_eq!(r["anon_change_pct"], 0.0);
    assert_eq!(share(r, "2048kB"), 100.0);
    assert_eq!(share(r, "64kB"), Value::Null);

    // The table says the same, the summary before the full table.
    let mut text_args = args.to_vec();
    text_args.push(w);
    let (out, _) = compare(&text_args);
    let summary_at = out.find("Summary at snapshot 'end' against 4K (512 page faults, 2048 kB");
    let full_at = out.find("| counter");
    assert!(summary_at.is_some() && summary_at < full_at, "{out}");
    let line = |setting: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("| {setting} ")))
            .unwrap_or_else(|| panic!("no row {setting}:\n{out}"))
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect::<Vec<_>>()
    };
    // setting, page faults, anon memory, in large folios, in 64K, in 2M, fallbacks
    assert_eq!(
        line("64K"),
        ["64K", "-93.8%", "0.0%", "100.0%", "100.0%", "0.0%", "0"]
    );
    assert_eq!(
        line("PMD"),
        ["PMD", "-99.8%", "0.0%", "100.0%", "0.0%", "100.0%", "0"]
    );
}

/// An 80K region, 2M-aligned, written a page at a time, with 64K, 32K and
/// 16K enabled: the fault at 0 gets a 64K folio (its block lies in the VMA);
/// the fault at 64K finds no 64K or 32K block inside the VMA (they would end
/// at 128K and 96K) and gets 16K. 2 faults against 20 with 4K: -90 %;
/// anonymous memory 80 kB both times; 64 kB of it (80 %) in a 64K folio and
/// 16 kB (20 %) in a 16K one.
#[test]
fn summary_shares_by_size_at_an_unaligned_region_end() {
    let w = TempWorkload::new("spawn a\na mmap buf 80K align=2M\na write buf\n");
    let w = w.path();
    let mthp = format!(
        "64K+32K+16K:{NEVER},transparent_hugepage/hugepages-16kB/enabled=always,\
         transparent_hugepage/hugepages-32kB/enabled=always,\
         transparent_hugepage/hugepages-64kB/enabled=always"
    );
    let base = format!("4K:{NEVER}");
    let (out, _) = compare(&["--json", "--setting", &base, "--setting", &mthp, w]);
    let doc: Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(row(&doc, "4K")["page_faults"], 20);
    let r = row(&doc, "64K+32K+16K");
    assert_eq!(r["page_faults"], 2);
    assert_eq!(r["page_faults_change_pct"], -90.0);
    assert_eq!(r["anon_kb"], 80);
    assert_eq!(r["large_folio_kb"], 80);
    assert_eq!(share(r, "64kB"), 80.0);
    assert_eq!(share(r, "16kB"), 20.0);
    assert_eq!(share(r, "32kB"), Value::Null);
}

/// Fallbacks. A 4M machine; `fill` (3M, MADV_NOHUGEPAGE, so 4K pages under
/// every setting) leaves less than 2M free, so no free 2M block exists. Then
/// 64K of a fresh 2M-aligned region is written.
/// - 4K: 768 + 16 faults, no large folio tried: 0 fallbacks.
/// - PMD: the first fault in `t` tries a PMD folio, the allocation fails
///   (thp_fault_fallback and the 2048kB anon_fault_fallback, counted once in
///   the summary) and the fault goes on at PTE level with a 4K page (the other
///   sizes are at their default, never); the next 15 faults find a PTE table
///   and try no PMD: 1 fallback, the same 784 faults, no large folio.
#[test]
fn summary_counts_a_pmd_fallback_once() {
    let w = TempWorkload::new(
        "machine memory=4M\nspawn a\na mmap fill 3M align=2M\na madvise fill NOHUGEPAGE\n\
         a write fill\na mmap t 2M align=2M\na write t:64K\n",
    );
    let w = w.path();
    let base = format!("4K:{NEVER}");
    let pmd = "PMD:transparent_hugepage/enabled=always";
    let (out, _) = compare(&["--json", "--setting", &base, "--setting", pmd, w]);
    let doc: Value = serde_json::from_str(&out).expect("valid JSON");
    let r = row(&doc, "4K");
    assert_eq!(r["page_faults"], 784);
    assert_eq!(r["fallbacks"], 0);
    let r = row(&doc, "PMD");
    assert_eq!(r["page_faults"], 784);
    assert_eq!(r["page_faults_change_pct"], 0.0);
    assert_eq!(r["fallbacks"], 1);
    assert_eq!(r["fallbacks_change_pct"], Value::Null);
    assert_eq!(r["large_folio_kb"], 0);
    assert_eq!(doc["counters"]["PMD"]["vmstat.thp_fault_fallback"], 1);
}

/// `hugelab compare ARGS` that must be refused: exit 2 and one line on
/// stderr, which is returned.
fn compare_refused(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .arg("compare")
        .args(args)
        .output()
        .expect("the hugelab binary runs");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err
}

const SCENARIO_64K: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scenarios/mthp-64k-only-8m.hlw"
);
const SET_64K: &str = "transparent_hugepage/hugepages-64kB/enabled";

/// The README's example. mthp-64k-only-8m.hlw sets every size never but
/// 64kB (line 32: always) and `enabled` never. A setting of 64kB never wins
/// over line 32: no size is allowed, every one of the 2048 4K pages of its
/// 8 MiB faults alone (do_anonymous_page, order 0), 0 % in large folios;
/// 64kB always: 128 faults of a 64K folio each, 100 % in 64K.
#[test]
fn a_setting_wins_over_the_workloads_prelude_set_and_says_so() {
    let (k4, k64) = (
        format!("4K:{SET_64K}=never"),
        format!("64K:{SET_64K}=always"),
    );
    let args = ["--setting", &k4, "--setting", &k64, SCENARIO_64K];
    let (out, _) = compare(&[&["--json"], &args[..]].concat());
    let doc: Value = serde_json::from_str(&out).unwrap();
    let (r4, r64) = (row(&doc, "4K"), row(&doc, "64K"));
    assert_eq!(r4["page_faults"], 2048);
    assert_eq!(r4["large_folio_kb"], 0);
    assert_eq!(r4["large_folio_share_pct"], 0.0);
    assert_eq!(r64["page_faults"], 128);
    assert_eq!(share(r64, "64kB"), 100.0);
    let overrides = &doc["settings"][0]["overrides"];
    assert_eq!(overrides[0]["line"], 32, "{doc}");
    assert_eq!(
        overrides[0]["statement"],
        format!("set {SET_64K} always"),
        "{doc}"
    );
    assert_eq!(doc["settings"][0]["overrides"].as_array().unwrap().len(), 1);
    let (out, _) = compare(&args);
    let said = format!("setting 4K overrides line 32: set {SET_64K} always");
    assert!(out.lines().any(|l| l == said), "{out}");
    // Said before the summary it explains.
    assert!(out.find(&said) < out.find("Summary"), "{out}");
}

/// The trap of the README's old example: `enabled` never does not reach a
/// size the workload sets to always (only `inherit` follows it), and the two
/// columns come out the same: both are said, never a silent identical column.
#[test]
fn a_setting_the_workload_keeps_from_a_size_is_said() {
    let k4 = "4K:transparent_hugepage/enabled=never";
    let k64 = format!("64K:{SET_64K}=always");
    let (out, _) = compare(&["--setting", k4, "--setting", &k64, SCENARIO_64K]);
    let line = out
        .lines()
        .find(|l| l.starts_with("setting 4K sets transparent_hugepage/enabled"))
        .unwrap_or_else(|| panic!("no line on enabled: {out}"));
    assert!(
        line.contains(&format!("line 32: set {SET_64K} always")),
        "{line}"
    );
    // Sizes the workload sets never, as the setting does, are not listed.
    assert!(!line.contains("hugepages-16kB"), "{line}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("note: setting 64K's counters") && l.contains("setting 4K")),
        "{out}"
    );
}

/// A `set` of a setting's tunable after the workload started is part of the
/// experiment: the setting cannot hold, and the run is refused there.
#[test]
fn a_mid_run_set_of_a_settings_tunable_is_refused() {
    let w = TempWorkload::new(
        "set transparent_hugepage/enabled never\nspawn a\na mmap r 2M\na write r\n\
         set transparent_hugepage/enabled always\na write r\n",
    );
    let w = w.path();
    let err = compare_refused(&[
        "--setting",
        "off:transparent_hugepage/enabled=never",
        "--setting",
        "on:transparent_hugepage/enabled=always",
        w,
    ]);
    assert!(err.contains(&format!("{w}:5:1: setting off")), "{err}");
    assert!(err.contains("transparent_hugepage/enabled"), "{err}");
}

/// HVO (vm.hugetlb_optimize_vmemmap) applies to the pages allocated while it
/// is on (mm/hugetlb_vmemmap.c). A 2 MiB page has 512 struct pages of 64
/// bytes: 8 pages of vmemmap, of which Linux 6.18 keeps 1, so 16 pages
/// allocated with HVO on give back 16 × 7 = 112 pages, and none with it off.
/// The workload turns HVO on itself before its pool grows; the setting wins.
#[test]
fn a_setting_of_hvo_wins_over_the_workloads_own() {
    let w = TempWorkload::new(
        "set vm.hugetlb_optimize_vmemmap 1\nset hugepages/hugepages-2048kB/nr_hugepages 16\n\
         snapshot grown\n",
    );
    let w = w.path();
    let (out, _) = compare(&[
        "--json",
        "--setting",
        "off:vm.hugetlb_optimize_vmemmap=0",
        "--setting",
        "on:vm.hugetlb_optimize_vmemmap=1",
        w,
    ]);
    let doc: Value = serde_json::from_str(&out).unwrap();
    let memmap = |s: &str| {
        let c = &doc["counters"][s];
        c["vmstat.nr_memmap_pages"].as_i64().unwrap()
            + c["vmstat.nr_memmap_boot_pages"].as_i64().unwrap()
    };
    assert_eq!((memmap("off"), memmap("on")), (0, -112), "{doc}");
    assert_eq!(doc["settings"][0]["overrides"][0]["line"], 1);
    // Turning it off again after the pool grew is the experiment: refused.
    let w = TempWorkload::new(
        "set vm.hugetlb_optimize_vmemmap 1\nset hugepages/hugepages-2048kB/nr_hugepages 16\n\
         set vm.hugetlb_optimize_vmemmap 0\n",
    );
    let w = w.path();
    let err = compare_refused(&["--setting", "on:vm.hugetlb_optimize_vmemmap=1", w]);
    assert!(err.contains(&format!(
        "{w}:3:1: setting on sets vm.hugetlb_optimize_vmemmap"
    )));
}

/// Two settings of one name would be two columns no one can tell apart.
#[test]
fn a_setting_name_used_twice_is_refused() {
    let err = compare_refused(&[
        "--setting",
        "A:transparent_hugepage/enabled=never",
        "--setting",
        "A:transparent_hugepage/enabled=always",
    ]);
    assert!(err.contains("the name 'A' is already used"), "{err}");
    let err = compare_refused(&[
        "--setting",
        "A:transparent_hugepage/enabled=never,transparent_hugepage/enabled=always",
    ]);
    assert!(
        err.contains("sets transparent_hugepage/enabled twice"),
        "{err}"
    );
}

/// A memory limit needs a cgroup, which compare does not run (bench does).
#[test]
fn a_memory_limit_is_refused() {
    let err = compare_refused(&["--setting", "LIM:memory.max=20M"]);
    assert!(
        err.contains("--setting LIM: compare runs no memory cgroup"),
        "{err}"
    );
}

/// Two names for the same values: the same column twice, and said so.
#[test]
fn two_settings_of_the_same_values_are_noted() {
    let args = [
        "--setting",
        "A:transparent_hugepage/enabled=never",
        "--setting",
        "B:transparent_hugepage/enabled=never",
        SCENARIO_64K,
    ];
    let (out, _) = compare(&args);
    assert!(
        out.contains("note: setting B sets exactly what setting A sets"),
        "{out}"
    );
    let (out, _) = compare(&[&["--json"], &args[..]].concat());
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["notes"].as_array().unwrap().len(), 1, "{doc}");
}

/// The built-in workload takes snapshots `peak` and then `end`: the default
/// is the first, and the header and the summary say which; `--snapshot`
/// picks another; an unknown one lists those there are.
#[test]
fn the_compared_snapshot_is_named_and_can_be_chosen() {
    let (out, _) = compare(&[]);
    let header = out.lines().next().unwrap();
    assert!(header.contains("snapshot 'peak'"), "{header}");
    assert!(header.contains("peak, end"), "{header}");
    let summary = out.lines().find(|l| l.starts_with("Summary")).unwrap();
    assert!(summary.contains("snapshot 'peak'"), "{summary}");
    let (out, _) = compare(&["--snapshot", "end"]);
    let summary = out.lines().find(|l| l.starts_with("Summary")).unwrap();
    assert!(summary.contains("snapshot 'end'"), "{summary}");
    let err = compare_refused(&["--snapshot", "nope"]);
    assert!(err.contains("no snapshot 'nope'"), "{err}");
    assert!(err.contains("peak, end"), "{err}");
}
