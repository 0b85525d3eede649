//! Output into a pipe whose reader has gone (`hugelab compare | head -1`):
//! every command ends quietly, killed by SIGPIPE as a Unix filter is; a
//! kernel run leaves nothing behind; and a bench interrupted while its
//! settings guard holds changed tunables restores them, its interrupt
//! report failing to print without being taken for a failed cleanup.

mod common;
use common::{cannot_run, machine_state, state_dir};

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The tests that change machine-wide settings and look at them: one at a
/// time.
static MACHINE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    MACHINE.lock().unwrap_or_else(|p| p.into_inner())
}

const SCENARIO: &str = "../../scenarios/cow-fork-base-page.hlw";

/// A pipe whose read end is already closed: every write to it fails with EPIPE.
fn closed_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe(2) returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors are ours, each owned once.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    write
}

/// `hugelab ARGS` with stdout a pipe nobody reads.
fn into_closed_pipe(args: &[&str], state: Option<&std::path::Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hugelab"));
    cmd.args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::from(closed_pipe()));
    if let Some(state) = state {
        cmd.env("HUGELAB_STATE_DIR", state);
    }
    cmd.output().expect("the hugelab binary runs")
}

/// Ended by SIGPIPE, nothing on stderr about it.
fn assert_quiet_sigpipe(args: &[&str], out: &Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("panicked") && !err.contains("backtrace") && !err.contains("Broken pipe"),
        "{args:?} into a closed pipe: {err}"
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{args:?} into a closed pipe must end as a Unix filter does (killed by SIGPIPE): {:?}, {err}",
        out.status
    );
}

#[test]
fn model_commands_end_quietly_on_a_closed_stdout() {
    for args in [
        &["compare", SCENARIO][..],
        &["run", SCENARIO],
        &["run", "--json", SCENARIO],
        &["explain", SCENARIO],
        &["counters"],
        &["hugetlb", "plan", "64G"],
        &["settings", "show"],
    ] {
        let out = into_closed_pipe(args, None);
        assert_quiet_sigpipe(args, &out);
    }
}

#[test]
fn bad_input_is_still_an_error_on_a_closed_stdout() {
    // An error message on stderr and exit 2, not a silent end.
    let out = into_closed_pipe(&["run", "/nonexistent/w.hlw"], None);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/w.hlw"));
}

/// The agents of the run whose runner had pid `runner` (`hugelab __agent FD RUNNER`).
fn agents_of(runner: u32) -> Vec<String> {
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let args: Vec<String> = cmd
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if args.get(1).map(String::as_str) == Some("__agent")
                && args.get(3) == Some(&runner.to_string())
            {
                left.push(args.join(" "));
            }
        }
    }
    left
}

/// `run` prints only after the kernel backend has finished (tunables
/// restored, agents reaped): what this checks is that the quiet end keeps
/// it so, with no journal, tunable or agent left. A print that fails while
/// a guard holds changed tunables is the bench test below.
#[test]
fn a_kernel_run_into_a_closed_stdout_ends_quietly_and_leaves_nothing_behind() {
    let _one = one_at_a_time();
    if let Some(why) = cannot_run() {
        eprintln!("skipped: the kernel backend cannot run here: {why}");
        return;
    }
    let state = state_dir("closed-stdout");
    let found = machine_state(&state);
    let enabled = common::read("/sys/kernel/mm/transparent_hugepage/enabled");
    let other = if enabled == "always" {
        "madvise"
    } else {
        "always"
    };
    let wl = state.join("w.hlw");
    std::fs::write(
        &wl,
        format!(
            "set transparent_hugepage/enabled {other}\n\
             set hugepages/hugepages-2048kB/nr_hugepages 2\n\
             spawn a\n\
             a mmap buf 4M\n\
             a write buf\n\
             snapshot written\n\
             a exit\n"
        ),
    )
    .unwrap();
    let wl = wl.to_str().unwrap();
    for args in [
        &["run", "--backend", "kernel", wl][..],
        &["run", "--json", "--backend", "kernel", wl],
    ] {
        let child = Command::new(env!("CARGO_BIN_EXE_hugelab"))
            .args(args)
            .env("HUGELAB_STATE_DIR", &state)
            .stdin(Stdio::null())
            .stdout(Stdio::from(closed_pipe()))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        assert_quiet_sigpipe(args, &out);
        assert!(
            !state.join("journal.json").exists(),
            "{args:?}: the journal is still there"
        );
        assert_eq!(
            machine_state(&state),
            found,
            "{args:?} left a tunable or a hugetlb pool changed"
        );
        assert_eq!(
            agents_of(pid),
            Vec::<String>::new(),
            "{args:?}: agents left"
        );
    }
    let _ = std::fs::remove_dir_all(&state);
}

/// hugelab's memory cgroups of the process `pid` (`hugelab.<pid>.<name>`
/// under the v1 or v2 root).
fn groups_of(pid: u32) -> Vec<String> {
    let prefix = format!("hugelab.{pid}.");
    let mut out = Vec::new();
    for root in ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"] {
        for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(&prefix) {
                out.push(format!("{root}/{n}"));
            }
        }
    }
    out
}

/// Ctrl-C while a bench's guard holds a changed tunable and stdout's reader
/// is gone: the interrupt hook (on the guard's signal thread) kills the run
/// and fails to print the runs so far; the guard then restores the tunable,
/// removes its journal and ends with 130, and says nothing of a panicked
/// hook.
#[test]
fn an_interrupted_bench_restores_the_machine_while_its_stdout_is_closed() {
    let _one = one_at_a_time();
    if let Some(why) = cannot_run() {
        eprintln!("skipped: the kernel backend cannot run here: {why}");
        return;
    }
    if !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        && !std::path::Path::new("/sys/fs/cgroup/memory").exists()
    {
        eprintln!("skipped: no memory cgroup controller");
        return;
    }
    const ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
    let state = state_dir("closed-stdout-bench");
    let found = machine_state(&state);
    let before = common::read(ENABLED);
    let other = if before == "always" {
        "madvise"
    } else {
        "always"
    };
    let setting = format!("A:transparent_hugepage/enabled={other}");
    let child = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(["bench", "--runs", "100", "--warmup", "0", "--setting"])
        .args([setting.as_str(), "--", "sleep", "0.3"])
        .env("HUGELAB_STATE_DIR", &state)
        .stdin(Stdio::null())
        .stdout(Stdio::from(closed_pipe()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // The setting applied, a run in flight, and one finished before it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while common::read(ENABLED) != other || groups_of(pid).is_empty() {
        assert!(Instant::now() < deadline, "timed out waiting for a run");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(700));
    assert!(state.join("journal.json").exists(), "the guard journals");
    // SAFETY: signals our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("interrupted; tunables restored"), "{err}");
    assert_eq!(common::read(ENABLED), before);
    assert_eq!(machine_state(&state), found, "a tunable left changed");
    assert!(!state.join("journal.json").exists(), "the journal is left");
    assert_eq!(groups_of(pid), Vec::<String>::new(), "cgroups left");
    let _ = std::fs::remove_dir_all(&state);
}
