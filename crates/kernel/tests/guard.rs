//! The settings guard on this machine's real tunables: every test changes a
//! harmless khugepaged knob (or a hugetlb pool by one page) and checks it comes
//! back, through restore, Drop, SIGTERM/SIGINT, and SIGKILL + restore_journal.
//!
//! The signal tests re-run this binary as a child (`guard_child`, ignored
//! unless HUGELAB_GUARD_CHILD is set), since the guard ends the process it
//! lives in. Every test skips, saying why, when not root or the file is not
//! writable, and a [`Setup`] puts the original values back whatever happens.
//!
//! Acquiring also turns DAMON's running kdamonds off (journaled like a
//! tunable): the tests that compare what was journaled look at the tunables
//! only ([`ours`]); the `damon_` tests and the signal tests check the kdamonds.

use hugelab_kernel::guard::{self, Restored, SettingsGuard};
use hugelab_kernel::{damon, sysfs, KernelError};
use hugelab_workload::{KhugepagedKnob, Tunable};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The tests share the settings lock, the tunables and HUGELAB_STATE_DIR.
static SERIAL: Mutex<()> = Mutex::new(());

const CHILD: &str = "HUGELAB_GUARD_CHILD";
const READY: &str = "guard child ready";

fn alloc_sleep() -> Tunable {
    Tunable::Khugepaged(KhugepagedKnob::AllocSleepMillisecs)
}

fn max_ptes_swap() -> Tunable {
    Tunable::Khugepaged(KhugepagedKnob::MaxPtesSwap)
}

fn read(t: &Tunable) -> String {
    sysfs::read_tunable(t).unwrap()
}

fn plus_one(t: &Tunable) -> String {
    (read(t).parse::<u64>().unwrap() + 1).to_string()
}

/// What the guard journaled, but the kdamonds acquiring turned off.
fn ours(journaled: Vec<(String, String)>) -> Vec<(String, String)> {
    journaled
        .into_iter()
        .filter(|(t, _)| !t.starts_with("damon/"))
        .collect()
}

/// The journal's entries on disk, but the kdamonds'; none without a journal.
fn journal_entries(s: &Setup) -> Vec<serde_json::Value> {
    let Ok(text) = std::fs::read_to_string(s.journal()) else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| !e["tunable"].as_str().unwrap().starts_with("damon/"))
        .cloned()
        .collect()
}

/// The `state` files of this machine's kdamonds that read `on`.
fn kdamonds_on() -> Vec<PathBuf> {
    damon::running(Path::new(damon::ADMIN))
        .unwrap()
        .iter()
        .map(|k| k.state_file())
        .collect()
}

fn states(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|f| damon::read_state(f).unwrap())
        .collect()
}

/// One test's state dir and the original values of the tunables it touches.
struct Setup {
    dir: PathBuf,
    originals: Vec<(Tunable, String)>,
    /// The kdamonds running when the test began.
    kdamonds: Vec<PathBuf>,
    _serial: MutexGuard<'static, ()>,
}

impl Setup {
    fn new(name: &str, tunables: &[&Tunable]) -> Option<Setup> {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: the settings guard needs root");
            return None;
        }
        for t in tunables {
            let file = sysfs::tunable_file(t);
            // Opening for write writes nothing, and fails as writing would on a
            // read-only sysfs.
            if let Err(e) = std::fs::OpenOptions::new().write(true).open(&file) {
                eprintln!("skipped: {} is not writable here: {e}", file.display());
                return None;
            }
        }
        let dir = std::env::temp_dir().join(format!("hugelab-guard-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::env::set_var("HUGELAB_STATE_DIR", &dir);
        let originals = tunables.iter().map(|&t| (t.clone(), read(t))).collect();
        Some(Setup {
            dir,
            originals,
            kdamonds: kdamonds_on(),
            _serial: serial,
        })
    }

    fn journal(&self) -> PathBuf {
        self.dir.join("journal.json")
    }
}

/// Whatever a failed assertion left: replay the journal, then put back any
/// value that still differs, so that no test leaves the machine changed.
impl Drop for Setup {
    fn drop(&mut self) {
        if self.journal().exists() {
            if let Err(e) = guard::restore_journal() {
                eprintln!("cleanup: {e}");
            }
        }
        for (t, value) in &self.originals {
            if sysfs::read_tunable(t).ok().as_deref() != Some(value.as_str()) {
                eprintln!("cleanup: putting {t} back to {value}");
                let _ = sysfs::write_value(&sysfs::tunable_file(t), value);
            }
        }
        for f in &self.kdamonds {
            if damon::read_state(f).ok().as_deref() != Some("on") {
                eprintln!("cleanup: turning {} on", f.display());
                let _ = damon::write_state(f, "on");
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A re-run of this binary as `guard_child`; killed if the test ends first.
struct ChildRun {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl ChildRun {
    /// `set`: the tunable and value the child sets after acquiring; without
    /// it the child only acquires. `uid`: run as that user instead (the child
    /// then checks that acquiring is refused).
    fn spawn(dir: &Path, set: Option<(&Tunable, &str)>, uid: Option<u32>) -> std::io::Result<Self> {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "guard_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("HUGELAB_STATE_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if let Some((t, value)) = set {
            cmd.env("HUGELAB_GUARD_TUNABLE", t.path())
                .env("HUGELAB_GUARD_VALUE", value);
        }
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd.spawn()?;
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Ok(ChildRun { child, stdout })
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Blocks until the child has set its tunable (it sleeps a minute at most).
    fn wait_ready(&mut self) {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(
                n > 0,
                "the child ended before it was ready: {}",
                self.stderr()
            );
            if line.contains(READY) {
                return;
            }
        }
    }

    fn signal(&self, signo: i32) {
        // SAFETY: signals the child we spawned and have not reaped yet.
        assert_eq!(unsafe { libc::kill(self.pid(), signo) }, 0);
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }

    fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut text);
        }
        text
    }

    fn stderr_pipe(&mut self) -> ChildStderr {
        self.child.stderr.take().unwrap()
    }
}

impl Drop for ChildRun {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs only as the child of the signal tests: acquires the guard, sets the
/// tunable it was given, says it is ready and waits to be signalled.
#[test]
#[ignore = "the child process of the signal tests"]
fn guard_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        match SettingsGuard::acquire() {
            Err(KernelError::Refused(msg)) => println!("refused: {msg}"),
            other => panic!("acquire as non-root gave {:?}", other.map(|_| ())),
        }
        return;
    }
    guard::set_cleanup_hook(mark_hook_ran);
    let mut g = SettingsGuard::acquire().unwrap();
    if let (Ok(t), Ok(value)) = (
        std::env::var("HUGELAB_GUARD_TUNABLE"),
        std::env::var("HUGELAB_GUARD_VALUE"),
    ) {
        g.set(&t.parse().unwrap(), &value).unwrap();
        println!("{READY}");
        std::io::stdout().flush().unwrap();
        std::thread::sleep(Duration::from_secs(60));
    } else {
        println!("{READY}");
    }
    g.restore().unwrap();
}

fn mark_hook_ran() {
    let dir = std::env::var_os("HUGELAB_STATE_DIR").unwrap();
    std::fs::write(Path::new(&dir).join("hook-ran"), "").unwrap();
}

#[test]
fn set_then_restore() {
    let t = alloc_sleep();
    let Some(s) = Setup::new("restore", &[&t]) else {
        return;
    };
    let old = read(&t);
    let new = plus_one(&t);
    let mut g = SettingsGuard::acquire().unwrap();
    assert!(
        journal_entries(&s).is_empty(),
        "no tunable journaled before the first set"
    );
    g.set(&t, &new).unwrap();
    assert_eq!(read(&t), new);
    assert!(s.journal().exists());
    assert_eq!(ours(g.journaled()), vec![(t.path(), old.clone())]);
    let lock = std::fs::read_to_string(s.dir.join("lock")).unwrap();
    assert_eq!(lock.trim(), std::process::id().to_string());
    g.restore().unwrap();
    assert_eq!(read(&t), old);
    assert!(!s.journal().exists());
    // Restored once: a second restore (and Drop) does nothing, set refuses.
    g.restore().unwrap();
    assert!(matches!(g.set(&t, &new), Err(KernelError::Refused(_))));
    assert_eq!(read(&t), old);
    // The lock is free again.
    drop(SettingsGuard::acquire().unwrap());
}

#[test]
fn drop_restores() {
    let t = alloc_sleep();
    let Some(s) = Setup::new("drop", &[&t]) else {
        return;
    };
    let old = read(&t);
    {
        let mut g = SettingsGuard::acquire().unwrap();
        g.set(&t, &plus_one(&t)).unwrap();
        assert_ne!(read(&t), old);
    }
    assert_eq!(read(&t), old);
    assert!(!s.journal().exists());
}

#[test]
fn panic_restores_while_unwinding() {
    let t = alloc_sleep();
    let Some(s) = Setup::new("panic", &[&t]) else {
        return;
    };
    let old = read(&t);
    let new = plus_one(&t);
    let result = std::panic::catch_unwind(|| {
        let mut g = SettingsGuard::acquire().unwrap();
        g.set(&t, &new).unwrap();
        panic!("a run that panics");
    });
    assert!(result.is_err());
    assert_eq!(read(&t), old);
    assert!(!s.journal().exists());
}

#[test]
fn first_old_value_is_kept_and_files_restore_in_reverse() {
    let (a, b) = (alloc_sleep(), max_ptes_swap());
    let Some(s) = Setup::new("order", &[&a, &b]) else {
        return;
    };
    let (old_a, old_b) = (read(&a), read(&b));
    let mut g = SettingsGuard::acquire().unwrap();
    g.set(&a, &plus_one(&a)).unwrap();
    g.set(&b, &(old_b.parse::<u64>().unwrap() - 1).to_string())
        .unwrap();
    g.set(&a, &plus_one(&a)).unwrap();
    assert_eq!(read(&a), (old_a.parse::<u64>().unwrap() + 2).to_string());
    assert_eq!(
        ours(g.journaled()),
        vec![(a.path(), old_a.clone()), (b.path(), old_b.clone())]
    );
    let on_disk: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s.journal()).unwrap()).unwrap();
    assert_eq!(on_disk["pid"], std::process::id());
    let entries = journal_entries(&s);
    assert_eq!(entries[0]["old"], old_a.as_str());
    assert_eq!(
        entries[1]["path"],
        "/sys/kernel/mm/transparent_hugepage/khugepaged/max_ptes_swap"
    );
    g.restore().unwrap();
    assert_eq!((read(&a), read(&b)), (old_a, old_b));
    assert!(!s.journal().exists());
}

#[test]
fn rejected_value_is_an_io_error_and_journals_nothing() {
    let t = max_ptes_swap();
    let Some(s) = Setup::new("einval", &[&t]) else {
        return;
    };
    let old = read(&t);
    let mut g = SettingsGuard::acquire().unwrap();
    // khugepaged refuses more than HPAGE_PMD_NR - 1 swap PTEs.
    match g.set(&t, "100000") {
        Err(KernelError::Io { path, err, .. }) => {
            assert_eq!(path, sysfs::tunable_file(&t));
            assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
        }
        other => panic!("expected EINVAL, got {other:?}"),
    }
    assert_eq!(read(&t), old);
    assert!(ours(g.journaled()).is_empty());
    assert!(journal_entries(&s).is_empty());
    g.restore().unwrap();
}

#[test]
fn hugetlb_pool_goes_back_to_its_size() {
    let sizes = sysfs::size_dirs(Path::new("/sys/kernel/mm/hugepages"));
    let Some(&size_kb) = sizes.iter().find(|&&s| s == 2048).or(sizes.first()) else {
        eprintln!("skipped: no hugetlb sizes on this machine");
        return;
    };
    let pool = Tunable::HugetlbNrHugepages { size_kb };
    let over = Tunable::HugetlbNrOvercommit { size_kb };
    let Some(_s) = Setup::new("pool", &[&pool, &over]) else {
        return;
    };
    let (old_pool, old_over) = (read(&pool), read(&over));
    let mut g = SettingsGuard::acquire().unwrap();
    g.set(&over, &plus_one(&over)).unwrap();
    g.set(&pool, &plus_one(&pool)).unwrap();
    if read(&pool) == old_pool {
        eprintln!("note: the kernel found no free {size_kb} kB page to grow the pool");
    }
    g.restore().unwrap();
    assert_eq!((read(&pool), read(&over)), (old_pool, old_over));
}

/// A pool shrunk back while pages of it are in use: the kernel keeps them as
/// surplus pages above the size written and frees each when it is unmapped.
/// That is a restored pool (a retry could not do more): the restore
/// succeeds at once, leaves no journal, and the pool drains to its old size.
#[test]
fn pool_with_pages_in_use_is_restored_and_drains() {
    const HPAGE: usize = 2 << 20;
    let pool = Tunable::HugetlbNrHugepages { size_kb: 2048 };
    let dir = Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB");
    if !dir.exists() {
        eprintln!("skipped: no 2 MiB hugetlb pages on this machine");
        return;
    }
    let Some(s) = Setup::new("pool-in-use", &[&pool]) else {
        return;
    };
    let count = |f: &str| -> usize { sysfs::read_value(&dir.join(f)).unwrap().parse().unwrap() };
    let old = count("nr_hugepages");
    let old_surplus = count("surplus_hugepages");
    let mut g = SettingsGuard::acquire().unwrap();
    g.set(&pool, &(old + 2).to_string()).unwrap();
    if count("nr_hugepages") != old + 2 {
        eprintln!("skipped: the kernel found no two free 2 MiB pages to grow the pool");
        return;
    }
    // Every free page of the pool in use, so that shrinking it to `old`
    // leaves two in use beyond it.
    let len = count("free_hugepages") * HPAGE;
    // SAFETY: a fresh private mapping; nothing else refers to it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_HUGE_2MB,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    for off in (0..len).step_by(HPAGE) {
        // SAFETY: within the mapping just made.
        unsafe { p.cast::<u8>().add(off).write_volatile(1) };
    }
    let started = std::time::Instant::now();
    let restored = g.restore();
    let took = started.elapsed();
    let (nr, surplus) = (count("nr_hugepages"), count("surplus_hugepages"));
    // SAFETY: the mapping made above, no longer used.
    unsafe { libc::munmap(p, len) };
    restored.unwrap();
    assert!(!s.journal().exists(), "a restored pool left its journal");
    assert!(
        took < Duration::from_secs(1),
        "restore retried for {took:?}"
    );
    assert_eq!((nr, surplus), (old + 2, old_surplus + 2));
    assert_eq!(
        count("nr_hugepages"),
        old,
        "the surplus pages drain once unmapped"
    );
}

#[test]
fn sigkill_leaves_a_journal_that_restore_journal_replays() {
    let t = alloc_sleep();
    let Some(s) = Setup::new("sigkill", &[&t]) else {
        return;
    };
    let old = read(&t);
    let new = plus_one(&t);
    let mut child = ChildRun::spawn(&s.dir, Some((&t, &new)), None).unwrap();
    child.wait_ready();
    assert_eq!(read(&t), new);
    child.signal(libc::SIGKILL);
    assert_eq!(child.wait().signal(), Some(libc::SIGKILL));
    assert_eq!(read(&t), new, "SIGKILL cannot be caught");
    let off = vec!["off".to_string(); s.kdamonds.len()];
    assert_eq!(
        states(&s.kdamonds),
        off,
        "the killed run's kdamonds stay off"
    );
    assert!(s.journal().exists());
    assert!(!s.dir.join("hook-ran").exists());

    let restored = guard::restore_journal().unwrap();
    // Last written first: the tunable, then the kdamonds acquire turned off.
    let mut expected = vec![Restored {
        path: sysfs::tunable_file(&t).display().to_string(),
        tunable: t.path(),
        old: old.clone(),
        found: new,
    }];
    expected.extend(s.kdamonds.iter().rev().map(|f| Restored {
        path: f.display().to_string(),
        tunable: damon::tunable_name(f),
        old: "on".to_string(),
        found: "off".to_string(),
    }));
    assert_eq!(restored, expected);
    assert_eq!(read(&t), old);
    let on = vec!["on".to_string(); s.kdamonds.len()];
    assert_eq!(states(&s.kdamonds), on, "restore_journal turns them on");
    assert!(!s.journal().exists());
    assert!(guard::restore_journal().unwrap().is_empty(), "nothing left");
}

fn interrupted_child_restores(name: &str, signo: i32) {
    let t = alloc_sleep();
    let Some(s) = Setup::new(name, &[&t]) else {
        return;
    };
    let old = read(&t);
    let new = plus_one(&t);
    let mut child = ChildRun::spawn(&s.dir, Some((&t, &new)), None).unwrap();
    child.wait_ready();
    assert_eq!(read(&t), new);
    assert!(s.journal().exists());
    child.signal(signo);
    let status = child.wait();
    let stderr = child.stderr();
    assert_eq!(status.code(), Some(128 + signo), "{stderr}");
    assert!(
        stderr.contains("hugelab: interrupted; tunables restored"),
        "{stderr}"
    );
    assert!(s.dir.join("hook-ran").exists(), "the cleanup hook ran");
    assert_eq!(read(&t), old);
    let on = vec!["on".to_string(); s.kdamonds.len()];
    assert_eq!(states(&s.kdamonds), on, "the kdamonds are on again");
    assert!(!s.journal().exists());
}

#[test]
fn sigterm_restores_and_exits_143() {
    interrupted_child_restores("sigterm", libc::SIGTERM);
}

#[test]
fn sigint_restores_and_exits_130() {
    interrupted_child_restores("sigint", libc::SIGINT);
}

#[test]
fn a_second_run_waits_for_the_lock_whatever_its_state_dir() {
    let t = alloc_sleep();
    let Some(s) = Setup::new("wait", &[&t]) else {
        return;
    };
    let old = read(&t);
    let mut first = ChildRun::spawn(&s.dir, Some((&t, &plus_one(&t))), None).unwrap();
    first.wait_ready();
    // Another state directory: the tunables are the machine's all the same.
    let other = s.dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let mut second = ChildRun::spawn(&other, None, None).unwrap();
    let mut waiting = String::new();
    BufReader::new(second.stderr_pipe())
        .read_line(&mut waiting)
        .unwrap();
    assert_eq!(
        waiting.trim_end(),
        format!(
            "hugelab: waiting for the settings lock held by pid {} ({})",
            first.pid(),
            guard::MACHINE_LOCK
        )
    );
    first.signal(libc::SIGTERM);
    assert_eq!(first.wait().code(), Some(143));
    // The second run gets the lock once the first restored and exited.
    second.wait_ready();
    assert!(second.wait().success());
    assert_eq!(read(&t), old);
}

#[test]
fn acquire_refuses_over_a_leftover_journal() {
    let t = alloc_sleep();
    let Some(s) = Setup::new("leftover", &[&t]) else {
        return;
    };
    let current = read(&t);
    // As a killed run leaves it; its "old" value is the current one, so the
    // replay below changes nothing on the machine.
    let journal = serde_json::json!({
        "pid": 1,
        "started": 0,
        "entries": [{"path": sysfs::tunable_file(&t), "tunable": t.path(), "old": current}],
    });
    std::fs::write(s.journal(), journal.to_string()).unwrap();
    match SettingsGuard::acquire() {
        Err(KernelError::Refused(msg)) => assert_eq!(
            msg,
            format!(
                "a restore journal left by an interrupted run exists at {}; run `hugelab settings restore` first",
                s.journal().display()
            )
        ),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    assert!(s.journal().exists(), "the refusal keeps the journal");
    let restored = guard::restore_journal().unwrap();
    assert_eq!(restored.len(), 1);
    assert_eq!(
        (restored[0].found.as_str(), restored[0].old.as_str()),
        (current.as_str(), current.as_str())
    );
    assert!(!s.journal().exists());
    assert_eq!(read(&t), current);
    drop(SettingsGuard::acquire().unwrap());
}

#[test]
fn a_journal_from_an_earlier_boot_is_discarded_not_replayed() {
    let t = alloc_sleep();
    let Some(s) = Setup::new("reboot", &[&t]) else {
        return;
    };
    let current = read(&t);
    let journal = serde_json::json!({
        "pid": 1,
        "started": 0,
        "boot_id": "00000000-0000-0000-0000-000000000000",
        "entries": [{"path": sysfs::tunable_file(&t), "tunable": t.path(), "old": plus_one(&t)}],
    });
    std::fs::write(s.journal(), journal.to_string()).unwrap();
    assert!(guard::restore_journal().unwrap().is_empty());
    assert!(!s.journal().exists());
    assert_eq!(read(&t), current);

    std::fs::write(s.journal(), journal.to_string()).unwrap();
    drop(SettingsGuard::acquire().unwrap());
    assert!(!s.journal().exists());
    assert_eq!(read(&t), current);
}

#[test]
fn not_root_is_refused_with_one_sentence() {
    let Some(s) = Setup::new("nonroot", &[]) else {
        return;
    };
    let nobody = 65534;
    let mut child = match ChildRun::spawn(&s.dir, None, Some(nobody)) {
        Ok(child) => child,
        Err(e) => {
            eprintln!("skipped: cannot run this test binary as uid {nobody}: {e}");
            return;
        }
    };
    let mut out = String::new();
    child.stdout.read_to_string(&mut out).unwrap();
    let status = child.wait();
    if !status.success() && out.is_empty() {
        eprintln!(
            "skipped: the test binary did not run as uid {nobody}: {}",
            child.stderr()
        );
        return;
    }
    assert!(status.success(), "{out}{}", child.stderr());
    assert!(
        out.contains(&format!(
            "refused: the kernel backend changes kernel tunables and needs root; run it as root (this is uid {nobody})"
        )),
        "{out}"
    );
}

#[test]
fn show_lists_known_tunables() {
    let shown = guard::show().unwrap();
    assert!(shown.iter().any(|(t, _)| *t == alloc_sleep()));
    for (t, value) in &shown {
        assert!(
            !value.contains('['),
            "{t} reads as the selected word: {value}"
        );
    }
}

/// Every file of a kdamond's tree that says how it runs: not what it
/// measured (stats, tried regions, the quota's effective size) nor its pid.
fn kdamond_parameters(state: &Path) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if ["stats", "tried_regions", "effective_bytes", "pid", "state"]
                .contains(&name.as_str())
            {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else if let Ok(text) = std::fs::read_to_string(&path) {
                out.push((path, text));
            }
        }
    }
    let mut out = Vec::new();
    walk(state.parent().unwrap(), &mut out);
    out
}

#[test]
fn damon_is_off_while_the_guard_is_held_and_on_again_with_its_parameters() {
    let Some(s) = Setup::new("damon", &[]) else {
        return;
    };
    if s.kdamonds.is_empty() {
        eprintln!("skipped: no kdamond is running on this machine");
        return;
    }
    let before: Vec<_> = s.kdamonds.iter().map(|f| kdamond_parameters(f)).collect();
    let mut g = SettingsGuard::acquire().unwrap();
    let off = vec!["off".to_string(); s.kdamonds.len()];
    assert_eq!(states(&s.kdamonds), off);
    let journaled: Vec<(String, String)> = s
        .kdamonds
        .iter()
        .map(|f| (damon::tunable_name(f), "on".to_string()))
        .collect();
    assert_eq!(g.journaled(), journaled);
    assert!(s.journal().exists(), "journaled on disk before the write");
    g.restore().unwrap();
    let on = vec!["on".to_string(); s.kdamonds.len()];
    assert_eq!(states(&s.kdamonds), on);
    assert!(!s.journal().exists());
    let after: Vec<_> = s.kdamonds.iter().map(|f| kdamond_parameters(f)).collect();
    assert_eq!(after, before, "`on` again runs the same parameters");
}

#[test]
fn damon_in_a_fake_tree_is_journaled_and_restored() {
    let Some(s) = Setup::new("damonfake", &[]) else {
        return;
    };
    let admin = s.dir.join("admin");
    let k = admin.join("kdamonds");
    for (i, state) in [(0, "on"), (1, "off"), (2, "on")] {
        std::fs::create_dir_all(k.join(format!("{i}/contexts/0/schemes/0"))).unwrap();
        std::fs::write(k.join(format!("{i}/state")), format!("{state}\n")).unwrap();
        std::fs::write(k.join(format!("{i}/contexts/0/operations")), "paddr\n").unwrap();
        std::fs::write(
            k.join(format!("{i}/contexts/0/schemes/0/action")),
            "pageout\n",
        )
        .unwrap();
    }
    let fake = |i: u32| sysfs::read_value(&k.join(format!("{i}/state"))).unwrap();
    let mut g = SettingsGuard::acquire().unwrap();
    let paused = g.pause_damon_at(&admin).unwrap();
    let described: Vec<String> = paused.iter().map(|k| k.describe()).collect();
    assert_eq!(
        described,
        ["kdamond 0 (paddr: pageout)", "kdamond 2 (paddr: pageout)"]
    );
    assert_eq!(
        (fake(0), fake(1), fake(2)),
        ("off".into(), "off".into(), "off".into())
    );
    let entries = journal_entries(&s);
    let fake_entries: Vec<_> = entries
        .iter()
        .filter(|e| {
            e["path"]
                .as_str()
                .unwrap()
                .starts_with(admin.to_str().unwrap())
        })
        .collect();
    assert_eq!(fake_entries.len(), 2, "{entries:?}");
    assert_eq!(
        fake_entries[0],
        &serde_json::json!({
            "path": k.join("0/state"),
            "tunable": k.join("0/state"),
            "old": "on",
        })
    );
    // A second call finds nothing on: the kdamonds it turned off stay journaled once.
    assert!(g.pause_damon_at(&admin).unwrap().is_empty());
    g.restore().unwrap();
    assert_eq!(
        (fake(0), fake(1), fake(2)),
        ("on".into(), "off".into(), "on".into())
    );
    assert!(!s.journal().exists());
}
