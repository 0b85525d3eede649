//! Every kernel run in its own memory cgroup with a limit: a workload that
//! cannot fit this machine is refused before anything changes, `--dry-run`
//! names the group and its limit, and a run that outgrows its limit
//! OOM-kills only its own agents. The figures expected are arithmetic on
//! the workloads' sizes and /proc/meminfo. The runs on the kernel are
//! skipped, saying why, where the machine does not allow them (not root).

mod common;

use common::{cannot_run, hugelab, machine_state, state_dir, TempWorkload};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// The tests look at machine-wide cgroups and settings: one at a time.
static MACHINE: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    MACHINE.lock().unwrap_or_else(|p| p.into_inner())
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn meminfo_bytes(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// The memory cgroup hierarchy's root: v2 if it has the memory controller,
/// else v1's memory mount.
fn memcg_root() -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    let mut v1 = None;
    for l in mounts.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        let controllers = std::fs::read_to_string(format!("{}/cgroup.controllers", f[1]));
        if f[2] == "cgroup2"
            && controllers.is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
        {
            return Some(f[1].to_string());
        }
        if f[2] == "cgroup" && f[3].split(',').any(|o| o == "memory") {
            v1 = Some(f[1].to_string());
        }
    }
    v1
}

/// hugelab's groups at the hierarchy's root, sorted.
fn hugelab_groups() -> Vec<String> {
    let Some(root) = memcg_root() else {
        return Vec::new();
    };
    let mut v: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("hugelab."))
        .collect();
    v.sort();
    v
}

/// hugelab's machine lock, held: no run changes the machine while the test
/// reads it (or while a refused command runs: refusing takes no lock).
struct MachineLock(std::fs::File);

fn machine_lock() -> MachineLock {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open("/run/hugelab.lock")
        .unwrap();
    // SAFETY: flock on a valid fd we own.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    MachineLock(f)
}

impl Drop for MachineLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: as above.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// What a refused run must leave as it was: every tunable, hugelab's
/// cgroups, the journal; read under the machine lock.
fn machine(state: &Path) -> (String, Vec<String>, bool) {
    let settings = if cannot_run().is_none() {
        machine_state(state)
    } else {
        String::new()
    };
    (
        settings,
        hugelab_groups(),
        state.join("journal.json").exists(),
    )
}

/// 2.00 GiB, 353.00 MiB: the binary units the sentences use.
fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / GIB as f64)
}

#[test]
fn a_workload_that_cannot_fit_is_refused_before_anything_changes() {
    let _one = one_at_a_time();
    let state = state_dir("memcg-refused");
    // Two regions written, together 4 GiB more than the machine's memory
    // (28 GiB on these 24 GiB machines), in whole GiB.
    let half = (meminfo_bytes("MemTotal") / GIB + 5) / 2;
    let regions = 2 * half * GIB;
    let big = TempWorkload::new(&format!(
        "spawn p\np mmap a {half}G\np mmap b {half}G\np write a\np write b\n"
    ));
    // A HugeTLB pool of 100000 2M pages: 195.31 GiB.
    let pool = TempWorkload::new("set hugepages/hugepages-2048kB/nr_hugepages 100000\n");
    // Held throughout: a refused command must not even wait for it.
    let _lock = (cannot_run().is_none()).then(machine_lock);
    let before = machine(&state);
    let cases: [(&[&str], &TempWorkload, String); 4] = [
        (
            &["run", "--backend", "kernel"],
            &big,
            format!("(regions {}, hugetlb pools 0 B,", gib(regions)),
        ),
        (
            &["diff"],
            &big,
            format!("(regions {}, hugetlb pools 0 B,", gib(regions)),
        ),
        (
            &["utilization", "--backend", "kernel"],
            &big,
            format!("(regions {}, hugetlb pools 0 B,", gib(regions)),
        ),
        (
            &["run", "--backend", "kernel"],
            &pool,
            format!("(regions 0 B, hugetlb pools {},", gib(100000 * 2 * MIB)),
        ),
    ];
    for (args, w, figures) in cases {
        let mut all = args.to_vec();
        all.push(w.path());
        let out = hugelab(&all, &state);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(w.path()) && err.contains(" needs up to "),
            "{args:?}: {err}"
        );
        assert!(err.contains(&figures), "{args:?}: {figures} in {err}");
        assert!(
            err.contains("available (MemAvailable ")
                && err.ends_with(": refused (--force runs it anyway)\n"),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(machine(&state), before, "{args:?} changed the machine");
    }
}

#[test]
fn dry_run_names_the_group_and_its_limit_and_changes_nothing() {
    let _one = one_at_a_time();
    if memcg_root().is_none() {
        eprintln!("skipped: no memory cgroup controller");
        return;
    }
    let state = state_dir("memcg-dry-run");
    // 256 MiB of regions in one process: margin 64 MiB + 32 MiB per process
    // + 1/256 of the regions (1 MiB) = 97 MiB; 353 MiB in all.
    let w = TempWorkload::new("spawn p\np mmap a 192M\np mmap b 64M\np write a\n");
    let _lock = (cannot_run().is_none()).then(machine_lock);
    let before = machine(&state);
    let out = hugelab(
        &["run", "--backend", "kernel", "--dry-run", w.path()],
        &state,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(
            "needs up to 353.00 MiB (regions 256.00 MiB, hugetlb pools 0 B, margin 97.00 MiB)"
        ),
        "{text}"
    );
    let limit = 353 * MIB;
    assert!(text.contains(&format!("({limit} bytes)")), "{text}");
    let group = format!("{}/hugelab.", memcg_root().unwrap());
    assert!(
        text.contains(&format!("would run in memory cgroup {group}")),
        "{text}"
    );
    // An explicit limit replaces the bound's.
    let out = hugelab(
        &[
            "run",
            "--backend",
            "kernel",
            "--dry-run",
            "--memory-limit",
            "64M",
            w.path(),
        ],
        &state,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("({} bytes)", 64 * MIB)), "{text}");
    assert_eq!(machine(&state), before, "a dry run changed the machine");
}

#[test]
fn a_run_that_outgrows_its_limit_oom_kills_only_its_own_agents() {
    let _one = one_at_a_time();
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    if memcg_root().is_none() {
        eprintln!("skipped: no memory cgroup controller");
        return;
    }
    let state = state_dir("memcg-oom");
    // A sentinel outside the run: it must live through it.
    let mut sentinel = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    // 256 MiB written in a group limited to 64 MiB: the group's OOM killer
    // must kill the agent, and the workload goes on to its end.
    let w =
        TempWorkload::new("spawn p\np mmap a 256M\np write a\nspawn q\nq mmap b 1M\nq write b\n");
    let before = machine(&state);
    let out = hugelab(
        &[
            "run",
            "--backend",
            "kernel",
            "--memory-limit",
            "64M",
            w.path(),
        ],
        &state,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        text.contains("line 3: p write a: p was killed by SIGKILL")
            && text.contains("the OOM killer of its memory cgroup chose it"),
        "{text}\n{err}"
    );
    // The run went on after the kill: q ran.
    let kills = text
        .lines()
        .filter(|l| l.starts_with("line ") && l.contains("was killed"))
        .count();
    assert_eq!(kills, 1, "{text}");
    assert!(
        sentinel.try_wait().unwrap().is_none(),
        "the sentinel outside the run was killed"
    );
    sentinel.kill().unwrap();
    sentinel.wait().unwrap();
    let _lock = machine_lock();
    assert_eq!(machine(&state), before, "the run left the machine changed");
}

#[test]
fn a_workload_from_a_pipe_is_limited_by_mem_available_and_says_so() {
    if memcg_root().is_none() {
        eprintln!("skipped: no memory cgroup controller");
        return;
    }
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(["run", "--backend", "kernel", "--dry-run", "/dev/stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A hugelab that ends before reading (an error) closes the pipe: what
    // it said is checked below, not the write.
    let wrote = child
        .stdin
        .take()
        .unwrap()
        .write_all(b"spawn p\np mmap a 1G\np write a\n");
    let out = child.wait_with_output().unwrap();
    if let Err(e) = wrote {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{err}");
    assert!(
        text.contains("/dev/stdin: cannot be read twice (no bound)"),
        "{text}"
    );
    assert!(
        err.contains("cannot be read twice, so what it needs is not known before it runs")
            && err.contains("MemAvailable less 1.00 GiB"),
        "{err}"
    );
}
