//! `hugelab sweep` on the model: real sweeps over scenario workloads, row
//! counts from arithmetic on the inputs, every value equal to `hugelab run
//! --json` of the same cell, the same bytes whatever the number of workers,
//! a sweep killed and resumed, a worker killed mid-cell, and bad input.

mod common;

use common::{run, state_dir, stderr};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PMD: &str = "PMD:transparent_hugepage/enabled=always";
const M64K: &str =
    "64K:transparent_hugepage/enabled=never,transparent_hugepage/hugepages-64kB/enabled=always";
/// Scenarios that set no tunable and no machine of their own.
const SCENARIOS: [&str; 3] = [
    "scenarios/file-private-fork-child-writes.hlw",
    "scenarios/mmap-fills-a-hole-and-merges-both-sides.hlw",
    "scenarios/file-private-read-1m-then-write-parts.hlw",
];

fn path(rel: &str) -> String {
    format!("{}/../../{rel}", env!("CARGO_MANIFEST_DIR"))
}

fn sweep(args: &[&str]) -> std::process::Output {
    let mut all = vec!["sweep"];
    all.extend(args);
    run(&all)
}

fn csv_rows(file: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("workload,setting,machine,snapshot,line,counter,value")
    );
    // The test's names hold no ',' or '"': a plain split is the CSV.
    lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect()
}

/// `hugelab run --json` of `prefix` then the workload: a cell's run, its
/// setting's and shape's statements written before the workload's.
fn run_json(workload: &str, prefix: &str) -> Value {
    let text = std::fs::read_to_string(workload).unwrap();
    let file = common::TempWorkload::new(&format!("{prefix}{text}"));
    let out = run(&["run", "--json", file.path()]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn rows_are_each_cells_counters_at_each_snapshot_as_run_gives_them() {
    let dir = state_dir("sweep-rows");
    let out = dir.join("rows.csv");
    let workloads: Vec<String> = SCENARIOS[..2].iter().map(|s| path(s)).collect();
    let o = sweep(&[
        "--setting",
        PMD,
        "--setting",
        M64K,
        "--machine",
        "memory=256M",
        "--machine",
        "memory=256M,fragment=10%",
        "-o",
        out.to_str().unwrap(),
        "--jobs",
        "2",
        &workloads[0],
        &workloads[1],
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = csv_rows(&out);
    let mut expected_rows = 0;
    let mut cells = 0;
    for workload in &workloads {
        for (machine, shape) in [
            ("memory=256M", "machine memory=256M\n"),
            (
                "memory=256M,fragment=10%",
                "machine memory=256M\nfragment unmovable=10%\n",
            ),
        ] {
            for (setting, sets) in [
                ("PMD", "set transparent_hugepage/enabled always\n"),
                ("64K", "set transparent_hugepage/enabled never\nset transparent_hugepage/hugepages-64kB/enabled always\n"),
            ] {
                cells += 1;
                let prefix = format!("{sets}{shape}");
                let doc = run_json(workload, &prefix);
                let added = prefix.lines().count() as u64;
                let machine = if machine.contains(',') { format!("\"{machine}\"") } else { machine.to_string() };
                let mine: Vec<&Vec<String>> = rows
                    .iter()
                    .filter(|r| r[0] == *workload && r[1] == setting)
                    .filter(|r| r[2] == machine.trim_matches('"') || r[2..].join(",").starts_with(&machine))
                    .collect();
                let mut want = 0;
                for snap in doc["snapshots"].as_array().unwrap() {
                    let label = snap["label"].as_str().unwrap();
                    let counters = snap["counters"].as_object().unwrap();
                    want += counters.len();
                    let line = snap["line"].as_u64().map_or(String::new(), |l| (l - added).to_string());
                    let got: BTreeMap<&str, i64> = mine
                        .iter()
                        .map(|r| &r[r.len() - 4..])
                        .filter(|r| r[0] == label)
                        .inspect(|r| assert_eq!(r[1], line, "{label}'s line"))
                        .map(|r| (r[2].as_str(), r[3].parse().unwrap()))
                        .collect();
                    let run: BTreeMap<&str, i64> =
                        counters.iter().map(|(k, v)| (k.as_str(), v.as_i64().unwrap())).collect();
                    assert_eq!(got, run, "{workload} {setting} {machine} at {label}");
                }
                assert_eq!(mine.len(), want);
                expected_rows += want;
            }
        }
    }
    // 2 workloads × 2 shapes × 2 settings, each its snapshots' counters.
    assert_eq!(cells, 8);
    assert_eq!(rows.len(), expected_rows);
}

#[test]
fn the_same_inputs_give_the_same_bytes_whatever_the_workers() {
    let dir = state_dir("sweep-bytes");
    let workloads: Vec<String> = SCENARIOS.iter().map(|s| path(s)).collect();
    for ext in ["parquet", "csv", "json"] {
        let mut files = Vec::new();
        for jobs in ["1", "2"] {
            let out = dir.join(format!("jobs{jobs}.{ext}"));
            let mut args = vec!["--jobs", jobs, "-o", out.to_str().unwrap()];
            args.extend(workloads.iter().map(String::as_str));
            let o = sweep(&args);
            assert!(o.status.success(), "{}", stderr(&o));
            files.push(std::fs::read(&out).unwrap());
        }
        assert_eq!(files[0], files[1], "{ext}: --jobs 1 and --jobs 2 differ");
        assert!(!files[0].is_empty());
    }
    let parquet = std::fs::read(dir.join("jobs1.parquet")).unwrap();
    assert!(parquet.starts_with(b"PAR1") && parquet.ends_with(b"PAR1"));
}

/// A workload that takes the model a while: `n` small regions mapped,
/// written and unmapped one after another.
fn slow_workload(n: usize) -> String {
    let mut text = "spawn a\n".to_string();
    for i in 0..n {
        text.push_str(&format!("a mmap b{i} 256K\na write b{i}\na munmap b{i}\n"));
    }
    text + "snapshot s\n"
}

/// The pids of `parent`'s children that are sweep workers.
fn children(parent: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:"));
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let worker = String::from_utf8_lossy(&cmdline).contains("__sweep-worker");
        if worker && ppid.map(str::trim) == Some(&parent.to_string()) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn a_killed_sweep_resumes_running_each_cell_once_to_the_same_bytes() {
    let dir = state_dir("sweep-resume");
    let workloads: Vec<String> = (0..4)
        .map(|i| {
            let p = dir.join(format!("slow{i}.hlw"));
            std::fs::write(&p, slow_workload(4000 + i)).unwrap();
            p.display().to_string()
        })
        .collect();
    let settings = ["--setting", PMD, "--setting", M64K];
    let args = |out: &Path| {
        let mut a: Vec<String> = ["sweep", "--jobs", "1", "--json", "-o"]
            .map(String::from)
            .to_vec();
        a.push(out.display().to_string());
        a.extend(settings.map(String::from));
        a.extend(workloads.iter().cloned());
        a
    };
    let whole = dir.join("whole.parquet");
    let o = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(args(&whole))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));

    let out = dir.join("cut.parquet");
    let journal = dir.join("cut.parquet.partial");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(args(&out))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::fs::read_to_string(&journal).map_or(0, |j| j.lines().count()) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no cell journaled"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the sweep ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let workers = children(child.id());
    assert_eq!(workers.len(), 1, "--jobs 1: one worker process");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.exists(), "a killed sweep wrote its output");
    // Its worker dies with it, mid-cell (PR_SET_PDEATHSIG).
    let start = Instant::now();
    while workers
        .iter()
        .any(|pid| Path::new(&format!("/proc/{pid}")).exists())
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "worker {workers:?} outlived the sweep"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    let o = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(args(&out))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    let (ran, journaled) = (
        doc["ran"].as_u64().unwrap(),
        doc["from_journal"].as_u64().unwrap(),
    );
    assert!((2..8).contains(&journaled), "{doc}");
    assert_eq!(ran + journaled, 8, "4 workloads × 2 settings, each once");
    assert!(stderr(&o).contains(&format!("resuming: 0 cells already in {}", out.display())));
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&whole).unwrap());
    assert!(!journal.exists());

    // Over a finished output: every cell read back, none run, same bytes.
    let o = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(args(&out))
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (doc["ran"].as_u64(), doc["from_output"].as_u64()),
        (Some(0), Some(8))
    );
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&whole).unwrap());
}

#[test]
fn a_worker_that_dies_costs_its_cell_only() {
    let dir = state_dir("sweep-crash");
    let workloads: Vec<String> = SCENARIOS.iter().map(|s| path(s)).collect();
    let out = dir.join("out.csv");
    let mut args = vec![
        "sweep",
        "--jobs",
        "2",
        "--setting",
        PMD,
        "--setting",
        M64K,
        "-o",
    ];
    args.push(out.to_str().unwrap());
    args.extend(workloads.iter().map(String::as_str));
    let o = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(&args)
        .env("HUGELAB_SWEEP_TEST_ABORT_ON", "64K")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    for w in &workloads {
        assert!(
            err.contains(&format!(
                "cell {w} under 64K on machine own failed: the worker process running it died"
            )),
            "{err}"
        );
    }
    assert!(
        err.contains(&format!(
            "3 of 6 cells failed; {} holds the others",
            out.display()
        )),
        "{err}"
    );
    let rows = csv_rows(&out);
    assert!(rows.iter().all(|r| r[1] == "PMD"));
    assert_eq!(
        rows.iter()
            .map(|r| &r[0])
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        3
    );

    // The re-run runs the failed cells only, to the bytes of a whole run.
    let o = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(&args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("resuming: 3 cells already in"),
        "{}",
        stderr(&o)
    );
    let whole = dir.join("whole.csv");
    args[8] = whole.to_str().unwrap();
    assert!(run(&args[..]).status.success());
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&whole).unwrap());
}

#[test]
fn bad_input_is_one_sentence_and_writes_nothing() {
    let dir = state_dir("sweep-bad");
    let out = dir.join("out.parquet");
    let o = out.to_str().unwrap();
    let scenario = path(SCENARIOS[0]);
    let cases: [(Vec<&str>, &str); 6] = [
        (
            vec!["-o", o, "/nonexistent/w.hlw"],
            "/nonexistent/w.hlw: cannot read the workload",
        ),
        (
            vec![
                "--setting",
                "x:transparent_hugepage/nope=1",
                "-o",
                o,
                &scenario,
            ],
            "unknown tunable",
        ),
        (
            vec!["--machine", "memory=0", "-o", o, &scenario],
            "--machine 'memory=0'",
        ),
        (
            vec!["--machine", "size", "-o", o, &scenario],
            "'size' is not KEY=VALUE",
        ),
        (
            vec!["-o", "/nonexistent/out.parquet", &scenario],
            "/nonexistent/out.parquet: cannot write the output there",
        ),
        (vec!["-o", "out.txt", &scenario], "give --format"),
    ];
    for (args, says) in cases {
        let r = sweep(&args);
        let err = stderr(&r);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(r.stdout.is_empty());
        let left: Vec<_> = std::fs::read_dir(&*dir).unwrap().collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
}

/// `--ray` runs the Python package's Ray engine: a Python that cannot be
/// started, or cannot import the package, is one sentence, before anything
/// is written. (A cluster that cannot be reached, and the sweep on a real
/// cluster: crates/python/tests/test_ray.py, with the package installed.)
#[test]
fn ray_without_its_python_engine_is_one_sentence_and_writes_nothing() {
    let dir = state_dir("sweep-ray-bad");
    let out = dir.join("out.parquet");
    let o = out.to_str().unwrap();
    let scenario = path(SCENARIOS[0]);
    // A Python that sees no installed package (-S: no site-packages).
    let bare = dir.join("bare-python");
    std::fs::write(&bare, "#!/bin/sh\nexec python3 -S \"$@\"\n").unwrap();
    let mut perms = std::fs::metadata(&bare).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&bare, perms).unwrap();
    let cases = [
        ("/nonexistent/python", "cannot be started"),
        (
            bare.to_str().unwrap(),
            "needs the Python package hugelab, which",
        ),
    ];
    for (python, says) in cases {
        let args = [
            "--ray",
            "127.0.0.1:1",
            "--python",
            python,
            "-o",
            o,
            &scenario,
        ];
        let r = sweep(&args);
        let err = stderr(&r);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(err.contains("pip install 'hugelab[ray]'") || python.starts_with("/nonexistent"));
        let left: Vec<_> = std::fs::read_dir(&*dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "bare-python")
            .collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
    // --jobs is the local engine's.
    let r = sweep(&["--ray", "auto", "--jobs", "2", &scenario]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
}
