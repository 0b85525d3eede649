//! `hugelab diff` waiting for another run's settings lock: its model starts
//! from the tunables as the kernel run finds them once it holds the lock,
//! not from the other run's values read while that run held them.
//! Skipped, with the reason printed, when the kernel backend cannot run.

mod common;

use common::{cannot_run, hugelab, machine_state, read, state_dir};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SIZE_64K: &str = "/sys/kernel/mm/transparent_hugepage/hugepages-64kB/enabled";

#[test]
fn a_diff_that_waited_for_the_lock_models_the_tunables_it_found_after() {
    if let Some(why) = cannot_run() {
        eprintln!("skipped: the kernel backend cannot run here: {why}");
        return;
    }
    if !std::path::Path::new(SIZE_64K).exists() {
        eprintln!("skipped: no 64K mTHP size on this kernel");
        return;
    }
    let state = state_dir("diff-lock");
    let before = machine_state(&state);
    // The holder sets 64K to what this machine does not have now, and keeps
    // the lock (and that value) for a while.
    let other = if read(SIZE_64K) == "always" {
        "never"
    } else {
        "always"
    };
    let hold = state.join("hold.hlw");
    std::fs::write(
        &hold,
        format!("set transparent_hugepage/hugepages-64kB/enabled {other}\nsleep 3s\n"),
    )
    .unwrap();
    let mut holder = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(["run", "--backend", "kernel", hold.to_str().unwrap()])
        .env("HUGELAB_STATE_DIR", &state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    while read(SIZE_64K) != other && Instant::now() < deadline {
        assert!(
            holder.try_wait().unwrap().is_none(),
            "the holder ended first"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let wl = state.join("w.hlw");
    std::fs::write(&wl, "spawn a\na mmap r 1M\na write r\nsnapshot s\n").unwrap();
    let out = hugelab(&["diff", wl.to_str().unwrap()], &state);
    holder.wait().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("waiting for the settings lock"),
        "the diff did not wait for the holder: {stderr}"
    );
    assert!(
        out.status.success() && stdout.contains(" 0 mismatches"),
        "{stdout}\n{stderr}"
    );
    assert_eq!(
        machine_state(&state),
        before,
        "the machine was left changed"
    );
    let _ = std::fs::remove_dir_all(&state);
}
