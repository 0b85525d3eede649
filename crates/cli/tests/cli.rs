//! The `hugelab` binary: exit codes and messages for good and bad input.

mod common;
use common::{run as hugelab, stderr, TempWorkload};

fn workload(text: &str) -> TempWorkload {
    TempWorkload::new(text)
}

/// Runs `text` as a workload file (`hugelab run FILE`): its exit code, the
/// file's path and what it printed on stderr.
fn run_text(text: &str) -> (Option<i32>, String, String) {
    let w = workload(text);
    let o = hugelab(&["run", w.path()]);
    (o.status.code(), w.path().to_string(), stderr(&o))
}

#[test]
fn missing_file_is_one_sentence_and_exit_2() {
    let o = hugelab(&["run", "/nonexistent/w.hlw"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("/nonexistent/w.hlw"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn malformed_workload_names_file_line_and_column() {
    let w = workload("spawn a\na mmap buf 8M\na madvise buf HUGE\n");
    let o = hugelab(&["run", w.path()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains(&format!("{}:3:", w.path())), "{err}");
    assert!(err.contains("unknown advice 'HUGE'"), "{err}");
}

#[test]
fn failed_expectation_exits_1_with_counter_expected_and_actual() {
    let w = workload(
        "set transparent_hugepage/enabled never\nset transparent_hugepage/hugepages-64kB/enabled always\n\
         spawn a\na mmap buf 2M\na write buf\nexpect mthp.64kB.anon_fault_alloc == 31\n",
    );
    let o = hugelab(&["run", w.path()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("mthp.64kB.anon_fault_alloc == 31"), "{err}");
    assert!(err.contains("actual 32"), "{err}");
}

#[test]
fn passing_run_prints_table_and_json() {
    let text = "set transparent_hugepage/enabled always\nspawn a\na mmap buf 4M\na write buf\nsnapshot mid\nexpect vmstat.thp_fault_alloc == 2\n";
    let w = workload(text);
    let o = hugelab(&["run", w.path()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("vmstat.thp_fault_alloc"), "{out}");
    assert!(out.contains(" mid |"), "{out}");
    let o = hugelab(&["run", "--json", w.path()]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    assert_eq!(doc["snapshots"][0]["label"], "mid");
    assert_eq!(doc["snapshots"][0]["counters"]["vmstat.thp_fault_alloc"], 2);
}

#[test]
fn unsupported_statement_is_refused_not_ignored() {
    let (code, _, err) = run_text("spawn a\na mmap buf 2M\na mmap sh 2M shared\na mprotect sh r\n");
    assert_eq!(code, Some(2));
    assert!(
        err.contains(":4:")
            && err.contains(
                "mprotect of a shared anonymous region is not supported by the model backend"
            ),
        "{err}"
    );
}

#[test]
fn compare_defaults_to_the_seed_configurations() {
    let o = hugelab(&["compare"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for column in ["4K", "16K", "32K+16K", "64K+32K+16K", "PMD"] {
        assert!(out.contains(column), "missing column {column}:\n{out}");
    }
    assert!(out.contains("vmstat.pgfault"), "{out}");
}

#[test]
fn compare_rejects_a_bad_setting_with_its_position() {
    let o = hugelab(&[
        "compare",
        "--setting",
        "x:transparent_hugepage/enabled=sometimes",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("--setting x:1:"), "{err}");
}

#[test]
fn counter_typo_fails_at_parse_time_with_a_suggestion() {
    let (code, path, err) = run_text("spawn a\na mmap buf 2M\nexpect vmstat.thp_faul_alloc == 0\n");
    assert_eq!(code, Some(2));
    assert_eq!(
        err.trim(),
        format!(
            "hugelab: {path}:3:8: unknown counter 'vmstat.thp_faul_alloc'; did you mean vmstat.thp_fault_alloc?"
        )
    );
}

#[test]
fn run_json_shows_no_counter_the_model_does_not_model() {
    let w = workload("spawn a\na mmap buf 2M\na write buf\n");
    let o = hugelab(&["run", "--json", w.path()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let counters = doc["snapshots"][0]["counters"]
        .as_object()
        .expect("counters");
    assert!(counters.contains_key("vmstat.thp_fault_alloc"));
    for name in counters.keys() {
        assert!(
            hugelab_workload::counters::lookup(name).is_some(),
            "{name} is not in the registry"
        );
        // No swap in the model: no swap-out counters reported as 0.
        assert!(!name.ends_with("swpout"), "{name}");
    }
}

#[test]
fn a_refused_call_is_an_outcome_the_workload_goes_on() {
    let text = "spawn a\na mmap buf 2M align=2M\na mmap ro 64K prot=r\n\
                a pin ro\nexpect errno == EFAULT\na write buf\nexpect vmstat.pgfault >= 1\n";
    let w = workload(text);
    let o = hugelab(&["run", w.path()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("line 4: a pin ro: "), "{out}");
    assert!(out.contains("EFAULT; the workload went on"), "{out}");
    assert!(out.contains("2 passed, 0 failed"), "{out}");

    let (code, _, err) = run_text(&text.replace("EFAULT", "EAGAIN"));
    assert_eq!(code, Some(1));
    assert!(
        err.contains(":5:1: expect errno == EAGAIN failed: actual EFAULT"),
        "{err}"
    );
}

#[test]
fn compare_counter_rows_are_checked_against_the_registry() {
    let o = hugelab(&["compare", "--counter", "vmstat.thp_faul_alloc"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains(
            "unknown counter 'vmstat.thp_faul_alloc'; did you mean vmstat.thp_fault_alloc?"
        ),
        "{err}"
    );
    let o = hugelab(&["compare", "--counter", "vmstat.pgfault"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("| vmstat.")).collect();
    assert_eq!(rows.len(), 1, "{out}");
}

#[test]
fn what_is_gone_leaves_the_json_and_expect_still_sees_its_last_values() {
    let text = "spawn a\na mmap r 64K\na mmap x 8K\na write r\na write x\nsnapshot one\n\
                a munmap x:4K\na munmap x+4K\nexpect smaps.a.x.Rss == 0\n\
                a munmap r\nexpect smaps.a.r.Rss == 0\nexpect folios.a.r.4kB == 0\n\
                a mmap r 128K\na write r:8K\nexpect smaps.a.r.Rss == 8\n\
                spawn b\nb mmap q 8K\nb write q\nb exit\nexpect stat.b.minflt == 2\nexpect smaps.b.q.Rss == 0\n";
    let w = workload(text);
    let o = hugelab(&["run", "--json", w.path()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(doc["expects"].as_array().unwrap().len(), 6);
    let one = doc["snapshots"][0]["counters"].as_object().unwrap();
    assert_eq!(one["smaps.a.x.Rss"], 8);
    assert_eq!(one["smaps.a.r.Rss"], 64);
    let end = doc["snapshots"][1]["counters"].as_object().unwrap();
    assert_eq!(end["smaps.a.r.Rss"], 8, "the new region r");
    let gone: Vec<&String> = end
        .keys()
        .filter(|k| k.starts_with("smaps.a.x.") || k.contains(".b."))
        .collect();
    assert!(gone.is_empty(), "gone region x and process b: {gone:?}");

    // A wrong value for a gone counter fails like any other.
    let (code, path, err) = run_text(&text.replace("stat.b.minflt == 2", "stat.b.minflt == 3"));
    assert_eq!(code, Some(1));
    assert!(
        err.contains(&format!(
            "{path}:20:1: expect stat.b.minflt == 3 failed: actual 2"
        )),
        "{err}"
    );
}

/// `hugelab hugetlb plan 1T`: seed 003's "~16GB (1G hugepage)/~12GB (2MB
/// hugepage)" per TiB come out under the 2021 series' rule (6 of 8 vmemmap
/// pages freed per 2M page, 4094 of 4096 per 1G page), and Linux 6.18
/// frees one page more of each.
#[test]
fn hugetlb_plan_gives_seed_003s_savings() {
    let o = hugelab(&["hugetlb", "plan", "1T", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let plans: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let saved = |size: u64, rule: &str| {
        let p = plans
            .as_array()
            .expect("a list of plans")
            .iter()
            .find(|p| p["hpage_size"] == size && p["rule"] == rule)
            .unwrap_or_else(|| panic!("no plan for {size} {rule}"));
        let (without, with) = (p["vmemmap_bytes"].as_u64(), p["vmemmap_bytes_hvo"].as_u64());
        (
            without.unwrap() - with.unwrap(),
            p["freed_pages_per_hpage"].as_u64().unwrap(),
        )
    };
    const GIB: u64 = 1 << 30;
    assert_eq!(saved(2 << 20, "Series2021"), (12 * GIB, 6));
    assert_eq!(saved(GIB, "Series2021"), (16 * GIB - (8 << 20), 4094));
    assert_eq!(saved(2 << 20, "Linux618"), (14 * GIB, 7));
    assert_eq!(saved(GIB, "Linux618"), (16 * GIB - (4 << 20), 4095));
    let table = hugelab(&["hugetlb", "plan", "1T", "--size", "2M"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("12.00 GiB") && !text.contains("1G "),
        "{text}"
    );
}

#[test]
fn hugetlb_plan_refuses_bad_sizes_in_one_sentence() {
    for args in [
        &["hugetlb", "plan", "1M"][..],
        &["hugetlb", "plan", "1T", "--size", "3M"],
        &["hugetlb", "plan", "1T", "--base-page", "3K"],
        &["hugetlb", "plan", "1T", "--struct-page", "0"],
    ] {
        let o = hugelab(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = stderr(&o);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}
