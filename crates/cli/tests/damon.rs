//! DAMON on this machine: a kernel run turns every running kdamond off for
//! its duration and on again after, and the commands' `--dry-run` say so.
//! Skipped, with the reason printed, when not root or no kdamond runs.

mod common;

use common::{cannot_run, run, state_dir};
use hugelab_kernel::{damon, sysfs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The kdamonds running now, or why this test cannot use them.
fn running() -> Result<Vec<PathBuf>, String> {
    if let Some(why) = cannot_run() {
        return Err(format!("the kernel backend cannot run here: {why}"));
    }
    let on: Vec<PathBuf> = damon::running(Path::new(damon::ADMIN))
        .map_err(|e| e.to_string())?
        .iter()
        .map(|k| k.state_file())
        .collect();
    if on.is_empty() {
        return Err("no kdamond is running on this machine".into());
    }
    Ok(on)
}

fn states(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|f| sysfs::read_value(f).unwrap())
        .collect()
}

#[test]
fn a_kernel_diff_turns_damon_off_for_the_run_and_on_after() {
    let files = match running() {
        Ok(f) => f,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let state = state_dir("damon");
    let wl = state.join("damon.hlw");
    // The sleep keeps the run going long enough to see DAMON off in it.
    std::fs::write(
        &wl,
        "spawn a\na mmap buf 2M\na write buf\nsleep 1s\na read buf\nsnapshot\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(["diff", wl.to_str().unwrap()])
        .env("HUGELAB_STATE_DIR", &state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Other runs on the machine may hold the settings lock for a while.
    let deadline = Instant::now() + Duration::from_secs(600);
    let off = vec!["off".to_string(); files.len()];
    let mut seen_off = false;
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        if states(&files) == off {
            seen_off = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "diff: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(seen_off, "DAMON was never off during the run");
    let on = vec!["on".to_string(); files.len()];
    assert_eq!(states(&files), on, "DAMON is on again after the run");
    assert!(!state.join("journal.json").exists());
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn dry_runs_list_the_kdamonds() {
    let files = match running() {
        Ok(f) => f,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let setting = "a:transparent_hugepage/enabled=never";
    let bench = |json: &'static str| {
        let args = [
            "bench",
            json,
            "--setting",
            setting,
            "--dry-run",
            "--",
            "true",
        ];
        args.into_iter()
            .filter(|a| !a.is_empty())
            .collect::<Vec<_>>()
    };
    let measure = |json: &'static str| {
        let args = ["hugetlb", "measure", json, "--dry-run"];
        args.into_iter()
            .filter(|a| !a.is_empty())
            .collect::<Vec<_>>()
    };
    let names: Vec<String> = files.iter().map(|f| damon::tunable_name(f)).collect();
    for command in [
        &bench as &dyn Fn(&'static str) -> Vec<&'static str>,
        &measure,
    ] {
        let args = command("");
        let out = run(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        for name in &names {
            let line = format!("{name} = off (now on): kdamond ");
            assert!(text.contains(&line), "{args:?} lacks {line}:\n{text}");
        }
        let args = command("--json");
        let out = run(&args);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let listed: Vec<&str> = v["damon"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["tunable"].as_str().unwrap())
            .collect();
        assert_eq!(listed, names, "{args:?}");
    }
    // A dry run changes nothing.
    let on = vec!["on".to_string(); files.len()];
    assert_eq!(states(&files), on);
}
