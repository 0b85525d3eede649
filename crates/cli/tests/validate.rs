//! `hugelab validate`: a recorded program predicted and measured under the
//! same settings (root; skipped with a reason otherwise). The program's
//! faults and memory follow from its source; the test checks that the
//! prediction of a recording of it meets the goal against the kernel's
//! measurement, and that the machine is left as it was.

mod common;

use serde_json::Value;
use std::path::Path;

/// Maps 16 MiB (2 MiB-aligned by over-mapping), writes every page, holds
/// them 50 ms (longer than the bench's 1 ms sampling of the cgroup's anon
/// memory), gives the second half back with MADV_DONTNEED and exits: under
/// 4K pages 4096 faults on the buffer, under PMD THP 8, and at the peak 16
/// MiB of anonymous memory either way.
const WRITER: &str = r#"
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
int main(void) {
    size_t len = 16 << 20, pmd = 2 << 20;
    char *raw = mmap(0, len + pmd, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return 1;
    char *buf = (char *)(((uintptr_t)raw + pmd - 1) & ~(uintptr_t)(pmd - 1));
    for (size_t i = 0; i < len; i += 4096) buf[i] = 1;
    usleep(50000);
    madvise(buf + len / 2, len / 2, MADV_DONTNEED);
    return 0;
}
"#;

const SETTINGS: [&str; 2] = [
    "4K:transparent_hugepage/enabled=never",
    "PMD:transparent_hugepage/enabled=always",
];

fn row<'a>(doc: &'a Value, setting: &str, figure: &str) -> &'a Value {
    doc["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["setting"] == setting && r["figure"] == figure)
        .unwrap_or_else(|| panic!("no row {setting} {figure} in {doc:#}"))
}

#[test]
fn a_recorded_program_is_predicted_within_the_goal_and_the_machine_is_unchanged() {
    if let Some(why) = common::cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let bin = match common::compile_c("validate", "writer", WRITER) {
        Ok(b) => b,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let state = common::state_dir("validate");
    let before = common::machine_state(&state);
    let recording = state.join("writer.hlw.zst");
    let out = common::hugelab(
        &[
            "record",
            "-o",
            recording.to_str().unwrap(),
            "--",
            bin.to_str().unwrap(),
        ],
        &state,
    );
    assert!(out.status.success(), "record: {}", common::stderr(&out));
    let mut args = vec!["validate", "--json", "--runs", "3", "--warmup", "1"];
    for s in SETTINGS {
        args.extend(["--setting", s]);
    }
    args.extend([recording.to_str().unwrap(), "--", bin.to_str().unwrap()]);
    let out = common::hugelab(&args, &state);
    assert!(out.status.success(), "validate: {}", common::stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    // The buffer's faults, from the program's arithmetic: the measured
    // means are the kernel's, and the prediction meets the goal on them.
    let faults_4k = row(&doc, "4K", "page faults");
    let faults_pmd = row(&doc, "PMD", "page faults");
    let (m4k, mpmd) = (
        faults_4k["measured"]["mean"].as_f64().unwrap(),
        faults_pmd["measured"]["mean"].as_f64().unwrap(),
    );
    assert!(m4k - mpmd >= 4096.0 - 8.0 - 64.0, "{m4k} vs {mpmd}");
    assert_eq!(faults_4k["within_goal"], true, "{faults_4k:#}");
    // A handful of faults separate the two: hugelab's child reports its
    // count before its last steps to the exec (1 to 4 seen here), which is
    // more than 5 % of the ~60 faults under PMD, so that is checked in faults.
    for r in [faults_4k, faults_pmd] {
        let (p, m) = (
            r["predicted"].as_f64().unwrap(),
            r["measured"]["mean"].as_f64().unwrap(),
        );
        assert!((p - m).abs() <= 8.0, "{r:#}");
    }
    // 16 MiB at the peak under both; under PMD all of it in THPs.
    for s in ["4K", "PMD"] {
        let r = row(&doc, s, "peak anon (cgroup)");
        let predicted = r["predicted"].as_f64().unwrap();
        assert!((16384.0..16384.0 * 1.1).contains(&predicted), "{r:#}");
        assert_eq!(r["within_goal"], true, "{r:#}");
    }
    let thp = row(&doc, "PMD", "AnonHugePages at peak");
    assert_eq!(thp["predicted"].as_f64(), Some(16384.0), "{thp:#}");
    assert_eq!(thp["within_goal"], true, "{thp:#}");
    assert_eq!(
        row(&doc, "PMD", "OOM kills")["predicted"].as_f64(),
        Some(0.0)
    );
    // Predict is timed against one bench run of each setting.
    assert!(doc["predict_s"].as_f64().unwrap() > 0.0);
    assert!(doc["bench_once_each_s"].as_f64().unwrap() > 0.0);
    assert_eq!(
        common::machine_state(&state),
        before,
        "a tunable left changed"
    );
    let _ = std::fs::remove_dir_all(&state);
    let _ = std::fs::remove_dir_all(bin.parent().unwrap());
}

#[test]
fn a_setting_the_model_does_not_know_is_one_sentence_before_anything_runs() {
    let workload = common::TempWorkload::new("spawn p\np mmap a 4K\np write a\n");
    let out = common::run(&[
        "validate",
        "--setting",
        "x:transparent_hugepage/enable=always",
        workload.path(),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = common::stderr(&out);
    assert!(
        err.contains("unknown tunable 'transparent_hugepage/enable'"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn a_missing_recording_is_one_sentence() {
    let out = common::run(&["validate", "/nonexistent/x.hlw.zst", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let err = common::stderr(&out);
    assert!(err.contains("/nonexistent/x.hlw.zst"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!Path::new("/nonexistent").exists());
}

#[test]
fn dry_run_predicts_and_lists_the_plan_without_changing_anything() {
    let workload = common::TempWorkload::new("spawn p\np mmap a 4M\np write a\n");
    let out = common::run(&[
        "validate",
        "--dry-run",
        "--setting",
        SETTINGS[0],
        "--setting",
        SETTINGS[1],
        workload.path(),
        "--",
        "true",
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("transparent_hugepage/enabled"), "{text}");
}
