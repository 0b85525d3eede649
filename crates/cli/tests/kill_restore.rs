//! SIGKILL at random points of `run --backend kernel`, `bench`, `hugetlb
//! measure` and `utilization --backend kernel`, then `hugelab settings
//! restore`: the machine is as it was before each run. Compared: every
//! readable file under /sys/kernel/mm/transparent_hugepage (but khugepaged's
//! and the sizes' event counters), the HugeTLB pools and HVO, the kdamonds'
//! states, hugelab's memory cgroups (bench's and a workload's `cgroup`), and
//! processes of this hugelab binary (none may be left).
//!
//! The points: each command is run once to measure its length, then killed
//! after [`POINTS`] delays drawn from a seeded generator over that length
//! (the seed is printed; `HUGELAB_KILL_SEED` and `HUGELAB_KILL_POINTS`
//! change them). Snapshots are taken holding the machine lock, so a kernel
//! run of another test on the machine is never caught half way.

mod common;

use common::{cannot_run, hugelab, state_dir};
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Kills per command.
const POINTS: u64 = 20;

/// A small workload that changes a tunable, a size's setting, a HugeTLB pool,
/// makes a memory cgroup and forks: every kind of change a run journals.
const WORKLOAD: &str = "\
set transparent_hugepage/khugepaged/max_ptes_swap 63
set transparent_hugepage/hugepages-64kB/enabled always
set hugepages/hugepages-2048kB/nr_hugepages 2
cgroup killtest memory.max=64M
spawn a cgroup=killtest
a mmap buf 16M align=2M
a madvise buf HUGEPAGE
a write buf
a fork b
b write buf step=64K
sleep 100ms
b exit
a madvise buf DONTNEED
a write buf step=8K
sleep 100ms
snapshot done
a exit
";

/// The machine as the test compares it: path -> content (or a marker).
type Snapshot = BTreeMap<String, String>;

fn files_under(dir: &Path, out: &mut Snapshot) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            // Event counters move with any process's activity.
            if name != "stats" {
                files_under(&path, out);
            }
        } else if kind.is_file() && !matches!(name.as_str(), "full_scans" | "pages_collapsed") {
            if let Ok(text) = std::fs::read_to_string(&path) {
                out.insert(path.display().to_string(), text);
            }
        }
    }
}

/// hugelab's cgroups (its runs' `hugelab.*`, the workload's `killtest`), v1
/// and v2, two levels deep.
fn cgroups(out: &mut Snapshot) {
    for root in ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"] {
        let Ok(top) = std::fs::read_dir(root) else {
            continue;
        };
        for e in top.flatten().filter(|e| e.path().is_dir()) {
            let mut dirs = vec![e.path()];
            if let Ok(sub) = std::fs::read_dir(e.path()) {
                dirs.extend(sub.flatten().map(|s| s.path()).filter(|p| p.is_dir()));
            }
            for d in dirs {
                let p = d.display().to_string();
                if p.contains("hugelab") || p.contains("killtest") {
                    out.insert(p, "cgroup".into());
                }
            }
        }
    }
}

/// Processes running this test's hugelab binary (runners and agents).
fn hugelab_processes() -> Vec<String> {
    let bin = std::fs::canonicalize(env!("CARGO_BIN_EXE_hugelab")).unwrap();
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if std::fs::read_link(e.path().join("exe")).is_ok_and(|exe| exe == bin) {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            left.push(format!(
                "{}: {}",
                e.file_name().to_string_lossy(),
                String::from_utf8_lossy(&cmd).replace('\0', " ")
            ));
        }
    }
    left
}

/// The machine, read holding the machine lock (no kernel run in flight).
fn snapshot() -> Snapshot {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(hugelab_kernel::guard::MACHINE_LOCK)
        .expect("the machine lock opens");
    // SAFETY: flock on an open descriptor; released when `lock` closes.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let mut s = Snapshot::new();
    files_under(Path::new("/sys/kernel/mm/transparent_hugepage"), &mut s);
    for pool in std::fs::read_dir("/sys/kernel/mm/hugepages")
        .unwrap()
        .flatten()
    {
        for f in [
            "nr_hugepages",
            "nr_overcommit_hugepages",
            "surplus_hugepages",
            "resv_hugepages",
        ] {
            let p = pool.path().join(f);
            s.insert(
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap_or_default(),
            );
        }
    }
    for f in [
        "/proc/sys/vm/hugetlb_optimize_vmemmap",
        "/proc/sys/vm/nr_overcommit_hugepages",
    ] {
        if let Ok(v) = std::fs::read_to_string(f) {
            s.insert(f.into(), v);
        }
    }
    if let Ok(kd) = std::fs::read_dir("/sys/kernel/mm/damon/admin/kdamonds") {
        for d in kd.flatten().filter(|d| d.path().is_dir()) {
            let p = d.path().join("state");
            s.insert(
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap_or_default(),
            );
        }
    }
    cgroups(&mut s);
    for p in hugelab_processes() {
        s.insert(format!("process {p}"), "running".into());
    }
    drop(lock);
    s
}

/// What differs between two snapshots, one line per path.
fn differences(before: &Snapshot, after: &Snapshot) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in before {
        match after.get(k) {
            Some(w) if w == v => {}
            Some(w) => out.push(format!("{k}: {:?} -> {:?}", v.trim(), w.trim())),
            None => out.push(format!("{k}: gone (was {:?})", v.trim())),
        }
    }
    for (k, w) in after {
        if !before.contains_key(k) {
            out.push(format!("{k}: new ({:?})", w.trim()));
        }
    }
    out
}

/// SplitMix64: the delays from the printed seed.
fn next(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Waits up to 10 s for the killed runner's agents to die (they follow it,
/// PR_SET_PDEATHSIG); what is left then is a leak.
fn wait_for_no_processes() -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = hugelab_processes();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long `args` takes: the shortest of up to three runs, stopping at the
/// first that did not wait for the machine lock (another test's kernel run
/// would make the delays fall in the wait).
fn typical_length(what: &str, args: &[&str], state: &Path) -> Duration {
    let mut shortest = Duration::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let out = hugelab(args, state);
        shortest = shortest.min(t.elapsed());
        let err = common::stderr(&out);
        assert!(out.status.success(), "{what}: {err}");
        if !err.contains("waiting for the settings lock") {
            break;
        }
    }
    shortest
}

/// Runs `args` once to time it, then kills it at `points` seeded delays
/// within that time, restoring after each: every difference from the
/// machine before, with the delay it followed.
fn kill_at_random_points(what: &str, args: &[&str], seed: u64, points: u64) -> Vec<String> {
    let state = state_dir(&format!("kill-{}", what.replace(' ', "-")));
    let before = snapshot();
    let length = typical_length(what, args, &state);
    let mut leaks = differences(&before, &snapshot());
    assert!(
        leaks.is_empty(),
        "{what} left changes when not killed: {leaks:#?}"
    );
    let mut rng = seed;
    // Kills that left a journal to restore: the run had changed the machine.
    let mut mid_run = 0;
    for i in 0..points {
        let delay = Duration::from_nanos(next(&mut rng) % length.as_nanos().max(1) as u64);
        let mut child = Command::new(env!("CARGO_BIN_EXE_hugelab"))
            .args(args)
            .env("HUGELAB_STATE_DIR", &state)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Until the delay, or the run's end (a run that waited less for the
        // machine lock than the timed one may end before).
        let t = Instant::now();
        while t.elapsed() < delay && child.try_wait().unwrap().is_none() {
            std::thread::sleep((delay - t.elapsed().min(delay)).min(Duration::from_millis(2)));
        }
        child.kill().unwrap(); // SIGKILL (a run that already ended is reaped)
        child.wait().unwrap();
        let left = wait_for_no_processes();
        let restore = hugelab(&["settings", "restore"], &state);
        if !String::from_utf8_lossy(&restore.stdout).contains("nothing to restore") {
            mid_run += 1;
        }
        let mut diff = differences(&before, &snapshot());
        if !restore.status.success() {
            diff.push(format!(
                "settings restore failed: {}",
                common::stderr(&restore)
            ));
        }
        diff.extend(
            left.iter()
                .map(|p| format!("still running after the kill: {p}")),
        );
        if !diff.is_empty() {
            leaks.push(format!("{what}, kill {i} after {delay:?}: {diff:#?}"));
        }
    }
    println!(
        "{what}: one run took {length:?}; killed {points} times in it, \
         {mid_run} of them with changes to restore"
    );
    if points >= 10 {
        assert!(
            mid_run > 0,
            "{what}: no kill came while the run had changed anything"
        );
    }
    let _ = std::fs::remove_dir_all(&state);
    leaks
}

#[test]
fn sigkill_at_random_points_then_restore_leaves_the_machine_as_it_was() {
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    if !Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB").exists() {
        eprintln!("skipped: this kernel has no 2M HugeTLB pool");
        return;
    }
    let seed = env_u64("HUGELAB_KILL_SEED", 0x6b69_6c6c);
    let points = env_u64("HUGELAB_KILL_POINTS", POINTS);
    println!("seed {seed:#x}, {points} kills per command");
    let wl = common::TempWorkload::new(WORKLOAD);
    let commands: [(&str, Vec<&str>); 4] = [
        ("run", vec!["run", "--backend", "kernel", wl.path()]),
        (
            "bench",
            vec![
                "bench",
                "--runs",
                "2",
                "--warmup",
                "0",
                "--setting",
                "4K:transparent_hugepage/enabled=never,memory.max=64M",
                "--setting",
                "THP:transparent_hugepage/enabled=always",
                "--",
                "sleep",
                "0.1",
            ],
        ),
        (
            "hugetlb measure",
            vec![
                "hugetlb", "measure", "--size", "2M", "--pages", "16", "--repeat", "1",
            ],
        ),
        (
            "utilization",
            vec!["utilization", wl.path(), "--backend", "kernel"],
        ),
    ];
    let mut leaks = Vec::new();
    for (i, (what, args)) in commands.iter().enumerate() {
        leaks.extend(kill_at_random_points(
            what,
            args,
            seed.wrapping_add(i as u64),
            points,
        ));
    }
    assert!(
        leaks.is_empty(),
        "{} kills left the machine changed:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
}
