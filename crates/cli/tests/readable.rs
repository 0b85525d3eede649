//! Output people read puts its conclusion first and stays readable: `bench`
//! (and `bench --from`) prints its summary before the per-metric tables,
//! `run --counter` shows only the counters asked for, `run` over many files
//! ends with a total, `run --json` over many files is JSON Lines, and
//! `counters` says what each counter means in a narrow table (`--json
//! FAMILY` is that family only).

mod common;
use common::{run as hugelab, stderr, TempWorkload as TempFile};

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// 1 MiB written with only 64K mTHP enabled: alloc_anon_folio maps 16 64K
/// folios, one fault each (mm/memory.c), and no PMD THP.
const MTHP_64K_1M: &str = "set transparent_hugepage/enabled never\n\
     set transparent_hugepage/hugepages-64kB/enabled always\n\
     set transparent_hugepage/hugepages-2048kB/enabled never\n\
     spawn a\n\
     a mmap buf 1M align=2M\n\
     a write buf\n\
     expect mthp.64kB.anon_fault_alloc == 16\n";

#[test]
fn bench_from_prints_the_summary_before_the_metric_tables() {
    let saved = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/kernel-build.json");
    let o = hugelab(&["bench", "--from", saved]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with("change of the mean vs 4K"),
        "the summary is not first:\n{out}"
    );
    let summary = out.find("| setting ").expect("the summary table");
    let real_time = out.find("real-time [s]").expect("the real-time table");
    assert!(summary < real_time, "{out}");
}

#[test]
fn run_counter_shows_only_the_counters_named_zeros_too() {
    let w = TempFile::new(MTHP_64K_1M);
    let o = hugelab(&[
        "run",
        "--counter",
        "mthp.64kB.anon_fault_alloc",
        "--counter",
        "vmstat.thp_fault_alloc",
        w.path(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| counter"))
        .collect();
    assert_eq!(
        rows.iter()
            .map(|r| r.split('|').map(str::trim).collect::<Vec<_>>()[1..3].join(" "))
            .collect::<Vec<_>>(),
        ["mthp.64kB.anon_fault_alloc 16", "vmstat.thp_fault_alloc 0"],
        "{out}"
    );
}

#[test]
fn run_counter_refuses_an_unknown_name_with_the_nearest_one() {
    let w = TempFile::new(MTHP_64K_1M);
    let o = hugelab(&["run", "--counter", "vmstat.pgfalt", w.path()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("did you mean vmstat.pgfault?"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn run_over_many_files_ends_with_a_total() {
    let good = TempFile::new(&format!("{MTHP_64K_1M}snapshot after\n"));
    // The same 16 faults, one expectation wrong.
    let bad = TempFile::new(&format!(
        "{MTHP_64K_1M}expect mthp.64kB.anon_fault_fallback == 1\n"
    ));
    let statements = |t: &str| {
        t.lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .count()
    };
    let n = statements(MTHP_64K_1M) * 2 + 2;
    let o = hugelab(&["run", "--check", good.path(), bad.path()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    let last = out.lines().last().unwrap_or_default();
    // Snapshots: `after` and `end` in the first file, `end` in the second.
    assert_eq!(
        last,
        format!(
            "total: 2 files, 3 snapshots, {n} statements (invariants checked after each); \
             expectations: 2 passed, 1 failed, 0 not checked (unknown)"
        ),
        "{out}"
    );
}

#[test]
fn run_json_over_many_files_is_json_lines() {
    let a = TempFile::new(MTHP_64K_1M);
    let b = TempFile::new(&format!("{MTHP_64K_1M}snapshot after\n"));
    let o = hugelab(&["run", "--json", a.path(), b.path()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let docs: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one JSON document"))
        .collect();
    assert_eq!(docs.len(), 2, "{out}");
    assert_eq!(docs[0]["workload"], a.path());
    assert_eq!(docs[1]["workload"], b.path());
    assert_eq!(docs[1]["snapshots"].as_array().unwrap().len(), 2);
}

#[test]
fn counters_says_what_each_counter_means_in_a_narrow_table() {
    for family in [None, Some("vmstat"), Some("mthp"), Some("memcg")] {
        let mut args = vec!["counters"];
        args.extend(family);
        let o = hugelab(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let out = stdout(&o);
        let widest = out.lines().map(|l| l.chars().count()).max().unwrap_or(0);
        assert!(widest <= 150, "{family:?}: {widest} columns\n{out}");
    }
    let out = stdout(&hugelab(&["counters", "vmstat"]));
    let row = out
        .lines()
        .find(|l| l.starts_with("| vmstat.thp_fault_fallback "))
        .expect("a row for thp_fault_fallback");
    assert!(row.contains("fall"), "no meaning: {row}");
    let out = stdout(&hugelab(&["counters"]));
    assert!(out.contains("  vmstat.<field>: /proc/vmstat\n"), "{out}");
}

#[test]
fn counters_json_of_a_family_is_that_family_only() {
    let o = hugelab(&["counters", "--json", "vmstat"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let families = v.as_array().expect("an array of families");
    assert_eq!(families.len(), 1, "{v}");
    assert_eq!(families[0]["name"], "vmstat");
    let pgfault = &families[0]["fields"][0];
    assert_eq!(pgfault["name"], "pgfault");
    assert!(pgfault["what"].as_str().is_some_and(|w| !w.is_empty()));
    // memcg has two shapes: both.
    let v: serde_json::Value =
        serde_json::from_slice(&hugelab(&["counters", "--json", "memcg"]).stdout).unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(2));
    let o = hugelab(&["counters", "--json", "vmsta"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no counter family 'vmsta'"));
}
