//! The kernel backend on this machine: the whole scenario suite through
//! `hugelab diff`, a run killed with SIGKILL and repaired by `hugelab settings
//! restore`, and, around all of it, the check that every tunable and hugetlb
//! pool is left as it was found.
//!
//! One test, run in order: the kernel backend changes machine-wide settings,
//! so its runs must not overlap. Skipped, with the reason printed, where the
//! machine does not allow it (not root, read-only sysfs).

mod common;

use common::{cannot_run, hugelab, machine_state, read, state_dir, window_disturbed};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Every workload with kernel-derived expectations: scenarios/ and workloads/,
/// but for the model-only workloads among the latter (a first line starting
/// `# Model-only`: they size or fragment the machine, which the kernel
/// backend refuses), which are skipped with the reason printed.
fn scenario_files() -> Vec<String> {
    let mut files = Vec::new();
    for dir in ["../../scenarios", "../../workloads"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        files.extend(
            std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == "hlw"))
                .filter(|p| {
                    let text = std::fs::read_to_string(p).unwrap();
                    let first = text.lines().next().unwrap_or("");
                    let model_only = first.starts_with("# Model-only");
                    if model_only {
                        println!("SKIPPED {}: {first}", p.display());
                    }
                    !model_only
                })
                .map(|p| p.to_str().unwrap().to_string()),
        );
    }
    files.sort();
    files
}

/// No agent of ours is left running.
fn agents_left() -> Vec<String> {
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains("hugelab __agent") || cmd.contains("hugelab\0__agent") {
                left.push(cmd);
            }
        }
    }
    left
}

/// `hugelab diff` over every scenario: zero mismatches, zero failed expectations.
fn diff_every_scenario(state: &Path) {
    let files = scenario_files();
    let mut args = vec!["diff"];
    args.extend(files.iter().map(String::as_str));
    let out = hugelab(&args, state);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // A workload this machine cannot run now (a 1 GiB pool it cannot fill)
    // is neither passed nor failed: say which and why.
    let lines: Vec<&str> = stdout.lines().collect();
    // Scenarios written for a CPU with, or without, protection keys: one of
    // each pair runs here, the other is skipped.
    let mut other_cpu = 0;
    for (i, line) in lines.iter().enumerate() {
        if let Some(reason) = line.strip_prefix("SKIPPED on the kernel: ") {
            let file = i
                .checked_sub(1)
                .map_or("", |j| lines[j].trim_start_matches("# "));
            println!("SKIPPED {file}: {reason}");
            // Only a shortage of the moment may skip: a kernel-run scenario
            // with a statement the kernel backend refuses is a broken one.
            if reason.contains("does not have the shape `machine pkeys=") {
                other_cpu += 1;
                continue;
            }
            assert!(
                reason.contains("cannot run on this machine now"),
                "{file} was refused by the kernel backend: {reason}"
            );
        }
    }
    assert!(
        other_cpu <= 1,
        "both of the protection-key scenarios were skipped:\n{stdout}"
    );
    let summary = stdout.lines().last().unwrap_or("");
    println!("{summary}");
    assert!(
        out.status.success(),
        "hugelab diff failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// With another process faulting all the time, the kernel backend must not
/// report a mismatch: its windows see the neighbour's faults (from
/// HUGELAB_DEBUG_WINDOWS), and what they disturbed is either kept from the
/// agents' own counts or unknown, never a number of the neighbour's.
fn diff_with_a_noisy_neighbour(state: &Path) {
    let mut noisy = Command::new("python3")
        .args([
            "-c",
            "import mmap\nwhile True:\n m = mmap.mmap(-1, 1 << 20)\n m[::4096] = b'x' * 256\n m.close()",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 runs");
    std::thread::sleep(Duration::from_millis(200));
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let file = dir.join("thp-pmd-madvise-hugepage.hlw");
    let out = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(["diff", file.to_str().unwrap()])
        .env("HUGELAB_STATE_DIR", state)
        .env("HUGELAB_DEBUG_WINDOWS", "1")
        .output()
        .expect("the hugelab binary runs");
    noisy.kill().unwrap();
    noisy.wait().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "diff under noise:\n{stdout}");
    let disturbed = stderr.lines().filter(|l| window_disturbed(l)).count();
    assert!(
        disturbed > 0,
        "a neighbour faulting thousands of times a second went unnoticed:\n{stderr}"
    );
    println!("{disturbed} windows saw the neighbour's faults; 0 mismatches");
}

/// A run killed with SIGKILL mid-workload leaves its journal; `settings
/// restore` puts every tunable and the pool back.
fn sigkill_then_restore(state: &Path) {
    let wl = state.join("slow.hlw");
    std::fs::write(
        &wl,
        "set transparent_hugepage/khugepaged/max_ptes_swap 63\n\
         set transparent_hugepage/hugepages-64kB/enabled always\n\
         set hugepages/hugepages-2048kB/nr_hugepages 3\n\
         spawn a\n\
         a mmap buf 8G\n\
         a write buf\n\
         a read buf\n",
    )
    .unwrap();
    let swap = "/sys/kernel/mm/transparent_hugepage/khugepaged/max_ptes_swap";
    let size64 = "/sys/kernel/mm/transparent_hugepage/hugepages-64kB/enabled";
    let pool = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
    let before = (read(swap), read(size64), read(pool));
    assert_ne!(before.0, "63", "max_ptes_swap must not already be 63");
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(["run", "--backend", "kernel", wl.to_str().unwrap()])
        .env("HUGELAB_STATE_DIR", state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while read(pool) != "3" {
        assert!(Instant::now() < deadline, "the run never set the pool");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended too soon"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended before the kill"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(read(swap), "63", "the killed run left its setting in place");
    assert_eq!(read(pool), "3");
    // The agents die with the runner (PR_SET_PDEATHSIG).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !agents_left().is_empty() {
        assert!(
            Instant::now() < deadline,
            "agents left: {:?}",
            agents_left()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = hugelab(&["settings", "restore"], state);
    assert!(out.status.success(), "settings restore: {out:?}");
    assert_eq!((read(swap), read(size64), read(pool)), before);
    // Nothing is left to restore the second time.
    let out = hugelab(&["settings", "restore"], state);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to restore"));
}

#[test]
fn kernel_backend_on_this_machine() {
    if let Some(why) = cannot_run() {
        eprintln!("skipped: the kernel backend cannot run here: {why}");
        return;
    }
    let state = state_dir("kernel");
    let found = machine_state(&state);
    diff_every_scenario(&state);
    diff_with_a_noisy_neighbour(&state);
    sigkill_then_restore(&state);
    assert_eq!(
        machine_state(&state),
        found,
        "the kernel tests left a tunable or a hugetlb pool changed"
    );
    assert!(agents_left().is_empty());
    let _ = std::fs::remove_dir_all(&state);
}
