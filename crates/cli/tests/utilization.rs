//! `hugelab utilization`: the report of the bimodal workload, and bad input.

mod common;
use common::{run as hugelab, stderr, TempWorkload};

use serde_json::Value;

const BIMODAL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../workloads/bimodal-utilization.hlw"
);

/// `hugelab utilization BIMODAL --json` with `extra` arguments: the report.
fn report(extra: &[&str]) -> Value {
    let mut args = vec!["utilization", BIMODAL, "--json"];
    args.extend_from_slice(extra);
    let o = hugelab(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("the report is JSON")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn bimodal_heap_is_bimodal_and_the_give_back_is_the_rss_drop_at_reclaim() {
    let r = report(&["--snapshot", "before"]);
    let sizes = r["sizes"].as_array().unwrap();
    assert_eq!(sizes.len(), 1, "{r}");
    let thp = &sizes[0];
    assert_eq!(u(&thp["size_kb"]), 2048);
    let buckets = thp["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 10);
    let folios: Vec<u64> = buckets.iter().map(|b| u(&b["folios"])).collect();
    let total: u64 = folios.iter().sum();
    assert_eq!(total, 30, "{folios:?}");
    // Most THPs nearly empty or nearly full; the two at max_ptes_none's
    // edge (409 and 410 zero-filled pages) in between.
    assert_eq!((folios[0], folios[9]), (15, 13), "{folios:?}");
    assert_eq!(folios[2], 2, "{folios:?}");
    let g = &r["give_back"];
    assert_eq!(u(&g["underused_folios"]), 16);
    assert_eq!(u(&g["underused_kb"]), 32084);
    assert_eq!(u(&g["partial_folios"]), 0);
    // The bloat section is always in the JSON: faulted and collapsed THPs.
    let bloat = r["bloat"].as_array().unwrap();
    let by_cause: Vec<(&str, u64)> = bloat
        .iter()
        .map(|b| (b["cause"].as_str().unwrap(), u(&b["never_written_kb"])))
        .collect();
    assert_eq!(by_cause, [("fault", 29704), ("madvise_collapse", 1968)]);

    // The model's Rss of the process at `before` and after the reclaim
    // (`hugelab run`): the drop is what was predicted.
    let o = hugelab(&["run", BIMODAL, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let obs: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rss = |label: &str| {
        let snap = obs["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["label"] == label)
            .unwrap_or_else(|| panic!("no snapshot {label}"));
        u(&snap["counters"]["smaps.a.Rss"])
    };
    assert_eq!(rss("before") - rss("end"), u(&g["underused_kb"]));
}

#[test]
fn settings_override_scope_and_end_snapshot() {
    // At max_ptes_none 511 the under-used check is off.
    let r = report(&["--snapshot", "before", "--max-ptes-none", "511"]);
    assert_eq!(u(&r["settings"]["max_ptes_none"]), 511);
    assert_eq!(u(&r["give_back"]["underused_folios"]), 0);
    // One region: the THP of the huge zero PMD write, one page written.
    let r = report(&["--snapshot", "before", "--proc", "a", "--region", "lazy"]);
    let b = &r["sizes"][0]["buckets"][0];
    assert_eq!((u(&b["folios"]), u(&b["zero_pages"])), (1, 511));
    assert_eq!(u(&r["give_back"]["underused_kb"]), 511 * 4);
    // At the end, after the reclaim: 14 THPs left, none of them under-used.
    let r = report(&[]);
    let total: u64 = r["sizes"][0]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| u(&b["folios"]))
        .sum();
    assert_eq!(total, 14);
    assert_eq!(u(&r["give_back"]["underused_folios"]), 0);
}

#[test]
fn text_report_has_the_histogram_the_give_back_and_with_why_the_bloat() {
    let o = hugelab(&["utilization", BIMODAL, "--snapshot", "before", "--why"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("| 460-512"), "{out}");
    // One shrinker, deferred_split_scan; "under-used" is its thp_underused
    // part only.
    assert!(
        out.contains(
            "Deferred split shrinker at max_ptes_none=409, shrink_underused=1: it would give back"
        ),
        "{out}"
    );
    assert!(
        out.contains("it would split 16 THPs as under-used"),
        "{out}"
    );
    assert!(out.contains("would drop by 32084 kB"), "{out}");
    assert!(out.contains("madvise_collapse"), "{out}");
}

/// Exit 2 and one line on stderr that contains every part of `want`.
fn fails_with(args: &[&str], want: &[&str]) {
    let o = hugelab(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    for w in want {
        assert!(err.contains(w), "{err} lacks {w}");
    }
}

#[test]
fn bad_input_is_one_sentence_and_exit_2() {
    fails_with(
        &["utilization", "/nonexistent/w.hlw"],
        &["/nonexistent/w.hlw"],
    );
    fails_with(
        &["utilization", BIMODAL, "--snapshot", "nope"],
        &["no snapshot named 'nope'", "before"],
    );
    fails_with(
        &["utilization", BIMODAL, "--proc", "zz"],
        &["no process 'zz'"],
    );
    fails_with(
        &["utilization", BIMODAL, "--proc", "a", "--region", "nope"],
        &["no region 'nope'"],
    );
    let dir = std::env::temp_dir().join(format!("hugelab-util-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.hlw");
    std::fs::write(&bad, "spawn a\na mmap buf 8M\na madvise buf HUGE\n").unwrap();
    let bad = bad.to_str().unwrap();
    fails_with(
        &["utilization", bad],
        &[&format!("{bad}:3:"), "unknown advice 'HUGE'"],
    );
    // A statement the model cannot run: file:line:col too.
    let unsupported = dir.join("unsupported.hlw");
    std::fs::write(&unsupported, "spawn a\na mmap buf 8M\na write nope\n").unwrap();
    let unsupported = unsupported.to_str().unwrap();
    fails_with(
        &["utilization", unsupported],
        &[&format!("{unsupported}:3:")],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two processes whose THPs are written as noted: `a` one THP whole and one
/// at one page, `b` one THP at two pages.
const TWO: &str = "\
set transparent_hugepage/enabled madvise
set transparent_hugepage/shrink_underused 1
set transparent_hugepage/hugepages-2048kB/enabled inherit
set transparent_hugepage/khugepaged/max_ptes_none 409
spawn a
a mmap buf 4M align=2M
a madvise buf HUGEPAGE
a write buf:2M
a write buf+2M:4K
spawn b
b mmap buf 2M align=2M
b madvise buf HUGEPAGE
b write buf:8K
";

/// "Every process, each on its own": a report per process, then the total.
/// thp_underused splits a THP with more than max_ptes_none (409) zero-filled
/// subpages: a's one-page THP (511 zero-filled), b's two-page one (510).
#[test]
fn every_process_on_its_own_then_the_total() {
    let w = TempWorkload::new(TWO);
    let file = w.path();
    let o = hugelab(&["utilization", file, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let procs = r["processes"].as_object().expect("processes by name");
    assert_eq!(procs.keys().collect::<Vec<_>>(), ["a", "b"], "{r}");
    let g = |v: &Value| (u(&v["underused_folios"]), u(&v["underused_kb"]));
    assert_eq!(g(&procs["a"]["give_back"]), (1, 511 * 4));
    assert_eq!(g(&procs["b"]["give_back"]), (1, 510 * 4));
    assert_eq!(g(&r["give_back"]), (2, (511 + 510) * 4));
    let full = |v: &Value| u(&v["sizes"][0]["buckets"][9]["folios"]);
    assert_eq!((full(&procs["a"]), full(&procs["b"]), full(&r)), (1, 0, 1));
    // One process asked for: that report, no per-process part.
    let o = hugelab(&["utilization", file, "--json", "--proc", "b"]);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(r.get("processes").is_none(), "{r}");
    assert_eq!(g(&r["give_back"]), (1, 510 * 4));

    let o = hugelab(&["utilization", file]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let a = out.find("), process a\n").expect("a report of a");
    let b = out.find("), process b\n").expect("a report of b");
    let total = out
        .find("), total of the 2 processes (a, b)\n")
        .expect("the total");
    assert!(a < b && b < total, "{out}");
    assert!(
        out[a..b].contains("it would split 1 THP as under-used"),
        "{out}"
    );
    assert!(
        out[total..].contains("it would split 2 THPs as under-used"),
        "{out}"
    );
}

/// The scope of every process with one process (the bimodal workload's
/// `a`): the JSON still maps it to its report, which is the total; the text
/// prints that report once and names the process.
#[test]
fn one_process_still_has_its_report_in_processes() {
    let r = report(&["--snapshot", "before"]);
    let procs = r["processes"].as_object().expect("processes by name");
    assert_eq!(procs.keys().collect::<Vec<_>>(), ["a"], "{r}");
    let mut total = r.clone();
    total.as_object_mut().unwrap().remove("processes");
    assert_eq!(procs["a"], total, "{r}");

    let o = hugelab(&["utilization", BIMODAL, "--snapshot", "before"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("(model), every process (only process a)\n"),
        "{out}"
    );
    assert_eq!(out.matches("it would split 16 THPs").count(), 1, "{out}");
}

/// A THP shared after fork, each process then writing its own part of it.
const FORK_WRITES: &str = "\
set transparent_hugepage/enabled madvise
set transparent_hugepage/hugepages-2048kB/enabled inherit
spawn a
a mmap buf 2M align=2M
a madvise buf HUGEPAGE
a write buf:8K
a fork b
b write buf+1M:400K
a write buf+1536K:400K
";

/// `--why` counts the never-written subpages of a folio two processes share
/// once, each subpage never written by either. By the kernel's rules: `a`'s
/// first write faults in one THP (do_huge_pmd_anonymous_page) and writes
/// subpages 0-1; fork shares it (copy_huge_pmd, both PMDs write-protected).
/// `b`'s writes to subpages 256-355 find the folio mapped by two mms, so
/// do_huge_pmd_wp_page splits b's PMD and wp_page_copy copies each page into
/// an order-0 folio (the copies hold the writes; the THP's subpages stay
/// unwritten); the same for `a`'s writes to subpages 384-483. So b maps the
/// THP's 412 subpages but 256-355, a the 412 but 384-483, together all 512,
/// of which only 0-1 were ever written: 510 never written = 2040 kB. Either
/// process alone sees 412 - 2 = 410 (1640 kB), the most a merge that takes
/// the larger of the two counts can say.
#[test]
fn why_counts_a_folio_shared_after_fork_once_subpage_by_subpage() {
    let w = TempWorkload::new(FORK_WRITES);
    let file = w.path();
    let o = hugelab(&["utilization", file, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let never_written = |v: &Value| {
        let b = v["bloat"].as_array().unwrap();
        assert_eq!(b.len(), 1, "{v}");
        assert_eq!(
            (b[0]["cause"].as_str(), u(&b[0]["folios"])),
            (Some("fault"), 1)
        );
        u(&b[0]["never_written_kb"])
    };
    assert_eq!(never_written(&r), 510 * 4, "{r}");
    assert_eq!(never_written(&r["processes"]["a"]), 410 * 4, "{r}");
    assert_eq!(never_written(&r["processes"]["b"]), 410 * 4, "{r}");
    // The text's total has it too.
    let o = hugelab(&["utilization", file, "--why"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let total = out.find("total of the 2 processes").expect("the total");
    assert!(
        out[total..].contains("| fault      | 2.0 MiB (1) |"),
        "{out}"
    );
}

/// Conclusion first: the shrinker's verdict before the histogram, and the
/// empty buckets between the bimodal heap's modes as one row.
#[test]
fn the_verdict_comes_before_the_histogram_and_empty_buckets_are_one_row() {
    let o = hugelab(&["utilization", BIMODAL, "--snapshot", "before"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let verdict = out.find("it would split 16 THPs").expect("the verdict");
    let histogram = out.find("| 0-50 ").expect("the histogram");
    assert!(verdict < histogram, "{out}");
    // 15 THPs in 0-50, 2 in 102-152, 13 in 460-512: the rest are empty.
    for row in ["| 51-101 (none) ", "| 153-459 (none) "] {
        assert!(out.contains(row), "no {row} row:\n{out}");
    }
    assert!(!out.contains("| 204-255 "), "{out}");
    assert!(!out.contains("| partially mapped "), "{out}");
}

/// The SVG names the workload and the snapshot, draws the max_ptes_none
/// threshold (409: under-used below 512 - 409 = 103 subpages in use) and
/// says what the shrinker gives back (16 THPs, 32084 kB = 31.3 MiB).
#[test]
fn svg_names_the_workload_and_draws_the_threshold_and_the_give_back() {
    let dir = std::env::temp_dir().join(format!("hugelab-util-svg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("u.svg");
    let o = hugelab(&[
        "utilization",
        BIMODAL,
        "--snapshot",
        "before",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&svg)
        .unwrap()
        .replace("&apos;", "'")
        .replace("&#39;", "'");
    std::fs::remove_dir_all(&dir).unwrap();
    for want in [
        "bimodal-utilization.hlw at snapshot 'before', every process",
        "max_ptes_none=409: under-used below 103 subpages in use",
        "the shrinker splits 16 THPs and gives back 31.3 MiB",
    ] {
        assert!(text.contains(want), "no {want} in the SVG");
    }
}

const GIVE_BACK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scenarios/reclaim-split-gives-back-unmapped-subpages.hlw"
);

/// The scenario's 17 partially mapped THPs and one under-used one: what
/// the report says the split gives back is what the model's `reclaim` then
/// frees (MemFree, memory.current), and its Rss figure is the Rss drop. The
/// figures are the scenario's, derived from Linux 6.18 and checked on the
/// kernel by its `expect` lines and by the kernel test of `scan`.
#[test]
fn give_back_counts_the_unmapped_subpages_the_split_frees() {
    let o = hugelab(&["utilization", GIVE_BACK, "--snapshot", "before", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let g = &r["give_back"];
    assert_eq!(u(&g["partial_folios"]), 17, "{g}");
    assert_eq!(u(&g["partial_unmapped_kb"]), (16 * 256 + 256) * 4, "{g}");
    assert_eq!(u(&g["partial_kb"]), 255 * 4, "{g}");
    assert_eq!(u(&g["underused_kb"]), 511 * 4, "{g}");
    assert_eq!(u(&g["freed_kb"]), 20472, "{g}");
    assert_eq!(u(&g["rss_kb"]), 766 * 4, "{g}");

    let o = hugelab(&["run", GIVE_BACK, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let obs: Value = serde_json::from_slice(&o.stdout).unwrap();
    let at = |label: &str, counter: &str| {
        let snap = obs["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["label"] == label)
            .unwrap_or_else(|| panic!("no snapshot {label}"));
        snap["counters"][counter].as_i64().unwrap()
    };
    let change = |counter: &str| at("after", counter) - at("before", counter);
    let freed = u(&g["freed_kb"]) as i64;
    assert_eq!(change("meminfo.MemFree"), freed);
    assert_eq!(change("memcg.g.memory.current"), -freed);
    assert_eq!(change("smaps.a.Rss"), -(u(&g["rss_kb"]) as i64));

    // The verdict says both, the memory given back first.
    let o = hugelab(&["utilization", GIVE_BACK, "--snapshot", "before"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(
            "it would give back 20472 kB (20.0 MiB) to the machine (and to the memory cgroups' \
             charge), and the Rss of what was scanned would drop by 3064 kB (3.0 MiB)."
        ),
        "{out}"
    );
    assert!(
        out.contains("free 17408 kB (17.0 MiB) of subpages no scanned process maps"),
        "{out}"
    );
}
