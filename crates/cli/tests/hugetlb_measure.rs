//! `hugelab hugetlb measure` on this machine: the vmemmap HVO gives back as
//! the memmap counters show it equals the model's prediction, and the pool
//! and sysctl come back; a dry run and bad arguments change nothing.
//! The measuring test is skipped, saying why, where the machine does not
//! allow it (not root, read-only sysfs).

mod common;

use common::{assert_refused_as_nobody, cannot_run, hugelab, machine_state, read, state_dir};
use hugelab_model::hugetlb_vmemmap::{hugetlb_vmemmap_optimizable_pages, HvoRule, VmemmapGeometry};
use std::sync::{Mutex, MutexGuard};

/// The tests look at machine-wide settings: one at a time.
static MACHINE: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    MACHINE.lock().unwrap_or_else(|p| p.into_inner())
}

const POOL_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
const HVO: &str = "/proc/sys/vm/hugetlb_optimize_vmemmap";

fn pool_and_hvo() -> (String, String) {
    (read(POOL_2M), read(HVO))
}

#[test]
fn measured_saving_is_the_models_and_the_machine_comes_back() {
    let _one = one_at_a_time();
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    if !std::path::Path::new(POOL_2M).exists() || !std::path::Path::new(HVO).exists() {
        eprintln!("skipped: this kernel has no 2M HugeTLB pool or no HVO sysctl");
        return;
    }
    let state = state_dir("hugetlb-measure");
    let before = pool_and_hvo();
    let out = hugelab(
        &[
            "hugetlb", "measure", "--size", "2M", "--pages", "64", "--repeat", "3", "--json",
        ],
        &state,
    );
    assert_eq!(pool_and_hvo(), before, "the pool or HVO was left changed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sizes = v["sizes"].as_array().unwrap();
    assert_eq!(sizes.len(), 1);
    let s = &sizes[0];
    assert_eq!(s["size"], "2M");
    assert!(
        s["short"].is_null(),
        "the pool did not reach 64 pages: {}",
        s["short"]
    );
    let pages = s["pages_per_grow"].as_u64().unwrap();
    assert_eq!(pages, 64 - before.0.parse::<u64>().unwrap());
    let model =
        hugetlb_vmemmap_optimizable_pages(VmemmapGeometry::default(), 2 << 20, HvoRule::Linux618);
    assert_eq!(model, 7);
    for (setting, given_back) in [("hvo_off", 0), ("hvo_on", model)] {
        let f = &s[setting];
        assert_eq!(f["cycles"], 3, "{f}");
        assert_eq!(f["model_given_back_per_page"], given_back, "{f}");
        // Exact: every cycle, not just the median.
        for field in ["memmap_given_back_per_page", "memmap_taken_back_per_page"] {
            for stat in ["median", "min", "max"] {
                assert_eq!(
                    f[field][stat].as_f64(),
                    Some(given_back as f64),
                    "{field} {f}"
                );
            }
        }
        for field in ["grow_ms", "shrink_ms"] {
            assert!(f[field]["min"].as_f64().unwrap() > 0.0, "{field} {f}");
        }
    }
    let cycles = s["cycles"].as_array().unwrap();
    assert_eq!(
        cycles.len(),
        2 * (1 + 3),
        "a warm-up and 3 cycles per setting"
    );
    for c in cycles {
        assert_eq!(c["reached"], 64, "{c}");
        assert!(c["grow_s"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["shrink_s"].as_f64().unwrap() > 0.0, "{c}");
        let hvo = c["hvo"].as_bool().unwrap();
        let back = if hvo { model as i64 } else { 0 };
        assert_eq!(
            c["grow"]["memmap"].as_i64(),
            Some(-back * pages as i64),
            "{c}"
        );
        assert_eq!(
            c["shrink"]["memmap"].as_i64(),
            Some(back * pages as i64),
            "{c}"
        );
    }
    let checks = s["free_pages"].as_array().unwrap();
    assert_eq!(checks.len(), 2);
    for f in checks {
        assert!(f["noise_per_page"].as_f64().unwrap() >= 0.0, "{f}");
        assert_eq!(f["memmap_given_back_per_page"].as_f64(), Some(7.0), "{f}");
    }
    let restored: Vec<(String, String)> = serde_json::from_value(v["restored"].clone()).unwrap();
    assert!(
        restored.contains(&("vm.hugetlb_optimize_vmemmap".to_string(), before.1.clone())),
        "{restored:?}"
    );
    assert!(!state.join("journal.json").exists(), "a journal was left");
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn dry_run_changes_nothing() {
    let _one = one_at_a_time();
    if !std::path::Path::new(POOL_2M).exists() {
        eprintln!("skipped: this kernel has no 2M HugeTLB pool");
        return;
    }
    let state = state_dir("hugetlb-measure-dry");
    let found = machine_state(&state);
    let out = hugelab(
        &[
            "hugetlb",
            "measure",
            "--size",
            "2M",
            "--pages",
            "64",
            "--dry-run",
        ],
        &state,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("dry run: nothing is changed"),
        "{stdout}"
    );
    let pool = read(POOL_2M);
    assert!(
        stdout.contains(&format!(
            "2M: hugepages/hugepages-2048kB/nr_hugepages {pool} -> 64 -> {pool}, 1 warm-up and 5 measured cycles"
        )),
        "{stdout}"
    );
    assert!(!stdout.contains("1G:"), "{stdout}");
    assert_eq!(
        machine_state(&state),
        found,
        "the dry run changed a tunable"
    );
    assert!(!state.join("journal.json").exists());
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn bad_arguments_are_refused_in_one_sentence_and_change_nothing() {
    let _one = one_at_a_time();
    let state = state_dir("hugetlb-measure-bad");
    let found = machine_state(&state);
    let cases: [(&[&str], &str); 4] = [
        (
            &["--size", "4M"],
            "hugelab: --size 4M is not a HugeTLB size hugelab measures: 2M or 1G\n",
        ),
        (&["--repeat", "0"], "hugelab: --repeat must be at least 1\n"),
        (&["--pages", "0"], "hugelab: --pages must be at least 1\n"),
        (
            &["--size", "2M", "--pages", "100000000"],
            "do not fit in this machine's MemAvailable",
        ),
    ];
    for (args, message) in cases {
        let mut all = vec!["hugetlb", "measure"];
        all.extend(args);
        let out = hugelab(&all, &state);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // A value clap cannot parse: its own message, exit 2.
    let out = hugelab(&["hugetlb", "measure", "--pages", "many"], &state);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'many' for '--pages <N>'"));
    assert_eq!(machine_state(&state), found);
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn not_root_is_refused_in_one_sentence() {
    let _one = one_at_a_time();
    assert_refused_as_nobody(&["hugetlb", "measure", "--size", "2M", "--pages", "2"]);
}
