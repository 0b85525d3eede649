//! Output into a pipe whose reader has gone (`hugelab compare | head -1`):
//! every command ends quietly, killed by SIGPIPE as a Unix filter is, and a
//! kernel run has put the machine back first.

mod common;
use common::{cannot_run, machine_state, state_dir};

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};

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
fn other_panics_are_still_reported() {
    // Bad input is still an error message and exit 2, not a silent end.
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

#[test]
fn a_kernel_run_restores_the_machine_before_ending_on_a_closed_stdout() {
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
