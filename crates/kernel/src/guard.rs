//! The settings guard: every kernel tunable hugelab changes is put back, however
//! the run ends.
//!
//! Tunables are machine-wide and outlive the process that wrote them, so a run
//! that dies with `transparent_hugepage/enabled` at `never` or a hugetlb pool
//! grown by a gigabyte silently changes every later measurement on the machine.
//! The guard therefore promises:
//!
//! - **Journal before write.** Before the first write of each file, its old value
//!   is written to a journal on disk (temp file, fsync, rename, fsync of the
//!   directory), and only then is the tunable written. Whatever kills the run,
//!   even SIGKILL or a power cut, the journal names every file that may have
//!   changed and what it held before; `hugelab settings restore`
//!   ([`restore_journal`]) replays it.
//! - **Restore on every ending we can see.** [`SettingsGuard::restore`] on
//!   success; `Drop` on `?` errors and unwinding panics; SIGINT, SIGTERM and
//!   SIGHUP through a handler thread that runs the [cleanup hook](set_cleanup_hook),
//!   restores and exits with 128+signo. Files are restored in reverse order of
//!   first write, read back to check, and hugetlb pools are written again until
//!   they reach their old size (or until all they hold beyond it is surplus
//!   pages still in use, which the kernel frees as they are released). A
//!   restore that fails keeps the failed entries in the journal, so
//!   `hugelab settings restore` can finish the job.
//! - **One run at a time.** An flock on `lock` in [`state_dir`] serialises runs:
//!   a second run journaling the first one's values as "old" would restore the
//!   machine to the first run's settings. The tunables are the machine's, not
//!   the state directory's, so a run also takes [`MACHINE_LOCK`]: runs with
//!   different state directories (tests, a user's `$HUGELAB_STATE_DIR`) never
//!   change the machine under each other's measurements. For the same reason a run refuses to
//!   start over a journal that a killed run left: the journal holds the only
//!   record of the machine's real values.
//!
//! - **DAMON off for the run.** [`SettingsGuard::acquire`] turns every
//!   kdamond whose `state` reads `on` to `off`, journaled like a tunable, so
//!   it is turned `on` again on every ending above (and by `hugelab settings
//!   restore` after a SIGKILL); [`crate::damon`] says why and why always.
//!
//! A journal written before the last reboot is discarded instead of replayed:
//! the reboot already reset the tunables, and replaying would override the
//! boot's own configuration.
//!
//! One guard per process: flock locks are per open file, so a second guard in
//! the same process would wait for itself forever on the machine lock; it is
//! refused instead.

use crate::damon;
use crate::error::{KernelError, Result};
use crate::sysfs;
use hugelab_workload::{Errno, Tunable};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const JOURNAL: &str = "journal.json";
const LOCK: &str = "lock";
/// The machine-wide lock every run takes, whatever its state directory.
pub const MACHINE_LOCK: &str = "/run/hugelab.lock";
const DEFAULT_STATE_DIR: &str = "/var/lib/hugelab";
/// SIGHUP too: a closed terminal or ssh session must not leave the machine changed.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];
/// Writes of a hugetlb pool file before giving up (see [`restore_entry`]).
const POOL_ATTEMPTS: u32 = 10;

/// One journaled file: the word to write back to put it as it was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    /// The file, absolute.
    path: String,
    /// The tunable as workloads name it (`transparent_hugepage/enabled`, `vm.nr_hugepages`).
    tunable: String,
    old: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Journal {
    pid: u32,
    /// Unix seconds.
    started: u64,
    /// /proc/sys/kernel/random/boot_id of the boot that wrote the journal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    boot_id: Option<String>,
    /// In order of first write.
    entries: Vec<Entry>,
}

impl Journal {
    fn new() -> Journal {
        Journal {
            pid: std::process::id(),
            started: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            boot_id: boot_id(),
            entries: Vec::new(),
        }
    }
}

/// A tunable put back by [`restore_journal`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Restored {
    /// The file, absolute.
    pub path: String,
    /// The tunable as workloads name it.
    pub tunable: String,
    /// The value written back.
    pub old: String,
    /// The value the file held before restoring.
    pub found: String,
}

impl fmt::Display for Restored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.found == self.old {
            write!(f, "{} {} (unchanged)", self.tunable, self.old)
        } else {
            write!(f, "{} {} (was {})", self.tunable, self.old, self.found)
        }
    }
}

/// A live guard as the signal thread sees it. The signal thread restores from
/// here, not from the `SettingsGuard`, which belongs to another thread's stack.
struct Live {
    id: u64,
    dir: PathBuf,
    lock: Lock,
    journal: Journal,
}

struct Registry {
    next_id: u64,
    /// In order of acquisition.
    live: Vec<Live>,
    /// The dispositions our handler replaced, put back when the last guard goes.
    saved_actions: Vec<(libc::c_int, libc::sigaction)>,
}

/// Held across every journal update + tunable write and across every restore,
/// so that a signal never restores between a set's journal write and its
/// tunable write (the write would land after the restore and stay).
static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next_id: 0,
    live: Vec::new(),
    saved_actions: Vec::new(),
});

fn registry() -> MutexGuard<'static, Registry> {
    // A panic while holding it left consistent data: every field is updated
    // after the fallible step, so poisoning carries no information here.
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

static CLEANUP_HOOK: Mutex<Option<fn()>> = Mutex::new(None);
static SOFT_INTERRUPT_HOOK: Mutex<Option<fn() -> bool>> = Mutex::new(None);

/// Changes kernel tunables and puts them back; see the module documentation.
pub struct SettingsGuard {
    id: u64,
    /// A copy of the journal entries, kept after restoring for [`Self::journaled`].
    entries: Vec<Entry>,
    restored: bool,
}

impl SettingsGuard {
    /// Checks for root, takes the settings lock (waiting, with one line on
    /// stderr, while another run holds it), refuses to start over a journal
    /// left by an interrupted run, then turns DAMON's running kdamonds off
    /// ([`Self::pause_damon_at`]); a refused write there is an error, with
    /// nothing left changed.
    pub fn acquire() -> Result<SettingsGuard> {
        require_root("the kernel backend changes kernel tunables and needs root; run it as root")?;
        let dir = state_dir();
        refuse_if_held_here(&dir)?;
        let lock = take_lock(&dir)?;
        let journal = dir.join(JOURNAL);
        if journal.exists() {
            let stale = matches!(read_journal(&journal), Ok(Some(j)) if from_earlier_boot(&j));
            let discarded = stale && discard_stale(&journal).is_ok();
            if !discarded {
                release_lock(lock);
                return Err(KernelError::Refused(format!(
                    "a restore journal left by an interrupted run exists at {}; run `hugelab settings restore` first",
                    journal.display()
                )));
            }
        }
        let mut reg = registry();
        let id = reg.next_id;
        reg.next_id += 1;
        if reg.live.is_empty() {
            install_handlers(&mut reg);
        }
        reg.live.push(Live {
            id,
            dir,
            lock,
            journal: Journal::new(),
        });
        drop(reg);
        let mut guard = SettingsGuard {
            id,
            entries: Vec::new(),
            restored: false,
        };
        // On failure the guard drops here and puts back what it turned off.
        guard.pause_damon_at(Path::new(damon::ADMIN))?;
        crate::damon_view::note_run_start();
        Ok(guard)
    }

    /// Turns `off` every kdamond under `admin` whose `state` reads `on`,
    /// journaled like a tunable, so that the guard turns it `on` again however
    /// the run ends ([`crate::damon`] says why, and why a refused write ends
    /// the run). [`Self::acquire`] does it with [`damon::ADMIN`]; tests give a
    /// fake tree. Returns the kdamonds turned off.
    pub fn pause_damon_at(&mut self, admin: &Path) -> Result<Vec<damon::Kdamond>> {
        let running = damon::running(admin)?;
        for k in &running {
            let file = k.state_file();
            let refused = |why: String| damon_refused(&k.describe(), &why);
            let name = damon::tunable_name(&file);
            self.write_file(&file, &name, Some("off"))
                .map_err(|e| refused(e.to_string()))?;
            let now = damon::read_state(&file).map_err(|e| refused(e.to_string()))?;
            if now != "off" {
                return Err(refused(format!(
                    "{} reads {now} after writing off",
                    file.display()
                )));
            }
        }
        Ok(running)
    }

    /// Writes `value` to the tunable's file, journaling the file's old value on
    /// disk first if this guard has not written it before.
    ///
    /// EACCES, EPERM and EROFS become [`KernelError::Refused`] (the machine does
    /// not let us); other errors (EINVAL for a value the kernel rejects) stay
    /// [`KernelError::Io`] with the path and errno. A write that fails without
    /// changing the file leaves no journal entry behind.
    pub fn set(&mut self, t: &Tunable, value: &str) -> Result<()> {
        self.write(t, Some(value))
    }

    /// Journals the tunable's current value without changing it, so that a
    /// later [`Self::set`] of it does nothing but the write (the kernel backend
    /// measures around that write, and journaling faults in memory).
    pub fn journal(&mut self, t: &Tunable) -> Result<()> {
        self.write(t, None)
    }

    fn write(&mut self, t: &Tunable, value: Option<&str>) -> Result<()> {
        self.write_file(&sysfs::tunable_file(t), &t.path(), value)
    }

    /// [`Self::write`] of any file: `tunable` is how the journal names it.
    fn write_file(&mut self, file: &Path, tunable: &str, value: Option<&str>) -> Result<()> {
        let key = file.to_string_lossy().into_owned();
        let mut reg = registry();
        let live = reg
            .live
            .iter_mut()
            .find(|l| l.id == self.id)
            .ok_or_else(|| {
                KernelError::Refused(
                    "this settings guard has already restored its tunables; acquire a new one to change more"
                        .to_string(),
                )
            })?;
        let journal = live.dir.join(JOURNAL);
        let first = !live.journal.entries.iter().any(|e| e.path == key);
        if first {
            let entry = Entry {
                path: key,
                tunable: tunable.to_string(),
                old: read_value(file)?,
            };
            live.journal.entries.push(entry.clone());
            if let Err(e) = write_journal(&journal, &live.journal) {
                live.journal.entries.pop();
                return Err(e);
            }
            self.entries.push(entry);
        }
        let Some(value) = value else {
            return Ok(());
        };
        if let Err(e) = write_value(file, value) {
            let unchanged = first && {
                let old = &live.journal.entries.last().expect("journaled above").old;
                read_value(file).is_ok_and(|now| same(&now, old))
            };
            if unchanged {
                live.journal.entries.pop();
                self.entries.pop();
                // If this fails the entry stays on disk, which is harmless:
                // restoring writes the value the file already has.
                let _ = write_journal(&journal, &live.journal);
            }
            return Err(refusal(e));
        }
        Ok(())
    }

    /// Restores every journaled file to its old value, last written first,
    /// checking each by reading it back; then deletes the journal and releases
    /// the lock. Continues past failures and returns one error listing them all;
    /// the failed entries stay in the journal for `hugelab settings restore`.
    /// Later calls do nothing.
    pub fn restore(&mut self) -> Result<()> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        let mut reg = registry();
        let Some(i) = reg.live.iter().position(|l| l.id == self.id) else {
            return Ok(());
        };
        let live = reg.live.remove(i);
        let result = finish(live).map(|_| ());
        // Only now: a SIGINT during the restore must not kill us half way. One
        // that arrived meanwhile is re-raised by the signal thread once we
        // release the registry.
        if reg.live.is_empty() {
            uninstall_handlers(&mut reg);
        }
        result
    }

    /// The values saved so far: (tunable as workloads name it, old value), in
    /// order of first write. Still available after [`Self::restore`].
    pub fn journaled(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .map(|e| (e.tunable.clone(), e.old.clone()))
            .collect()
    }
}

impl Drop for SettingsGuard {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            eprintln!("hugelab: {e}");
        }
    }
}

/// For `hugelab settings restore`: replays the journal a killed run left, last
/// written first. Takes the settings lock first, so it never races a live run.
/// Returns what it restored; an empty list when there was no journal (or only
/// one from before the last reboot, which it deletes).
pub fn restore_journal() -> Result<Vec<Restored>> {
    require_root("restoring kernel tunables needs root; run `hugelab settings restore` as root")?;
    let dir = state_dir();
    refuse_if_held_here(&dir)?;
    let lock = take_lock(&dir)?;
    let result = replay(&dir.join(JOURNAL));
    release_lock(lock);
    result
}

fn replay(path: &Path) -> Result<Vec<Restored>> {
    let Some(mut journal) = read_journal(path)? else {
        return Ok(Vec::new());
    };
    if from_earlier_boot(&journal) {
        discard_stale(path)?;
        return Ok(Vec::new());
    }
    let (restored, failed) = restore_entries(&journal.entries);
    journal.entries = failed.iter().map(|(e, _)| e.clone()).collect();
    let written = write_journal(path, &journal);
    if !failed.is_empty() {
        return Err(failure(path, &failed));
    }
    written?;
    Ok(restored)
}

/// For `hugelab settings show`: every tunable this machine has, with its value.
pub fn show() -> Result<Vec<(Tunable, String)>> {
    sysfs::known_tunables()
        .into_iter()
        .map(|t| {
            let value = sysfs::read_tunable(&t)?;
            Ok((t, value))
        })
        .collect()
}

/// Where the journal and the lock live: `$HUGELAB_STATE_DIR`, else
/// `$XDG_STATE_HOME/hugelab`, else /var/lib/hugelab. Created if missing.
pub fn state_dir() -> PathBuf {
    let dir = resolve_state_dir(|name| std::env::var_os(name));
    // A failure shows up, with its path, when the lock file is opened.
    let _ = fs::create_dir_all(&dir);
    dir
}

fn resolve_state_dir(var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let set = |name| var(name).filter(|v| !v.is_empty());
    if let Some(dir) = set("HUGELAB_STATE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = set("XDG_STATE_HOME") {
        return PathBuf::from(dir).join("hugelab");
    }
    PathBuf::from(DEFAULT_STATE_DIR)
}

/// The restore journal in [`state_dir`] (present only while a run has changed
/// something, or after one was killed).
pub fn journal_path() -> PathBuf {
    state_dir().join(JOURNAL)
}

/// Registers the function the signal path runs before restoring. The kernel
/// backend kills its agents there, so that their hugetlb pages are freed
/// before the pools shrink. It runs on the signal thread; it must not use a
/// [`SettingsGuard`]. Replaces any earlier hook.
pub fn set_cleanup_hook(f: fn()) {
    *CLEANUP_HOOK.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
}

/// Registers the function the signal path asks first: when it returns
/// true, the program takes the signal as a request to finish early (it ends
/// and restores on its own, as on success), and the path does nothing more;
/// when false (a second Ctrl-C), the path goes on as usual. It runs on the
/// signal thread. `hugelab record` writes what it has when interrupted.
pub fn set_soft_interrupt_hook(f: fn() -> bool) {
    *SOFT_INTERRUPT_HOOK
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some(f);
}

pub fn require_root(refusal: &str) -> Result<()> {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        Ok(())
    } else {
        Err(KernelError::Refused(format!(
            "{refusal} (this is uid {uid})"
        )))
    }
}

fn refuse_if_held_here(dir: &Path) -> Result<()> {
    if let Some(l) = registry().live.first() {
        let also = if l.dir == dir {
            String::new()
        } else {
            format!(" (for {}, asked for {})", l.dir.display(), dir.display())
        };
        return Err(KernelError::Refused(format!(
            "this process already holds the settings lock in {}{also}; restore its guard first",
            l.dir.display()
        )));
    }
    Ok(())
}

/// A write error as the user should see it: a machine that forbids the write
/// is a refusal, anything else an I/O error with its errno.
pub(crate) fn refusal(e: KernelError) -> KernelError {
    let KernelError::Io { path, err, .. } = &e else {
        return e;
    };
    let reason = match err.raw_os_error() {
        Some(libc::EROFS) => "read-only",
        Some(libc::EACCES) => "permission denied",
        Some(libc::EPERM) => "operation not permitted",
        _ => return e,
    };
    let errno = Errno(err.raw_os_error().unwrap_or(0));
    KernelError::Refused(format!(
        "cannot write {}: {reason} ({errno})",
        path.display()
    ))
}

// ---- the lock ----

/// The two locks a run holds: the machine's, then its state directory's.
struct Lock {
    machine: File,
    dir: File,
}

fn take_lock(dir: &Path) -> Result<Lock> {
    let machine = lock_file(Path::new(MACHINE_LOCK))?;
    let dir = match lock_file(&dir.join(LOCK)) {
        Ok(f) => f,
        Err(e) => {
            unlock_file(machine);
            return Err(e);
        }
    };
    Ok(Lock { machine, dir })
}

fn release_lock(lock: Lock) {
    unlock_file(lock.dir);
    unlock_file(lock.machine);
}

/// Takes an exclusive flock on `path`, waiting (with one line on stderr)
/// while another run holds it, and writes our pid into it.
fn lock_file(path: &Path) -> Result<File> {
    let err = |e| KernelError::io(path, e);
    // Not truncated on open: until we hold the lock the pid in it is the holder's.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)
        .map_err(err)?;
    match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
            let holder = fs::read_to_string(path).unwrap_or_default();
            match holder.trim() {
                "" => eprintln!(
                    "hugelab: waiting for the settings lock held by another run ({})",
                    path.display()
                ),
                pid => eprintln!(
                    "hugelab: waiting for the settings lock held by pid {pid} ({})",
                    path.display()
                ),
            }
            flock(&file, libc::LOCK_EX).map_err(err)?;
        }
        Err(e) => return Err(err(e)),
    }
    file.set_len(0).map_err(err)?;
    file.write_all_at(format!("{}\n", std::process::id()).as_bytes(), 0)
        .map_err(err)?;
    Ok(file)
}

fn unlock_file(file: File) {
    let _ = file.set_len(0);
    // Explicitly, not by closing: a child forked without exec shares the open
    // file and would otherwise keep the lock after we are gone.
    let _ = flock(&file, libc::LOCK_UN);
}

fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: a valid fd owned by `file`.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

// ---- the journal ----

/// Atomically: a reader (or a crash) sees the old journal or the new one,
/// never half of one. An empty journal is no journal.
fn write_journal(path: &Path, journal: &Journal) -> Result<()> {
    if journal.entries.is_empty() {
        return remove_journal(path);
    }
    let tmp = path.with_extension("json.tmp");
    let err = |e| KernelError::io(&tmp, e);
    let mut text = serde_json::to_string_pretty(journal).expect("a journal always serializes");
    text.push('\n');
    let mut file = File::create(&tmp).map_err(err)?;
    file.write_all(text.as_bytes()).map_err(err)?;
    file.sync_all().map_err(err)?;
    fs::rename(&tmp, path).map_err(|e| KernelError::io(path, e))?;
    sync_dir(path)
}

fn remove_journal(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => sync_dir(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(KernelError::io(path, e)),
    }
}

/// Makes a rename or removal in the journal's directory durable.
fn sync_dir(file_in_dir: &Path) -> Result<()> {
    let dir = file_in_dir.parent().unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| KernelError::io(dir, e))
}

fn read_journal(path: &Path) -> Result<Option<Journal>> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(KernelError::io(path, e)),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        let msg = format!("not a hugelab restore journal ({e}); inspect it and remove it");
        KernelError::io(path, io::Error::new(io::ErrorKind::InvalidData, msg))
    })
}

fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

fn from_earlier_boot(journal: &Journal) -> bool {
    match (&journal.boot_id, boot_id()) {
        (Some(then), Some(now)) => *then != now,
        _ => false,
    }
}

fn discard_stale(path: &Path) -> Result<()> {
    remove_journal(path)?;
    eprintln!(
        "hugelab: removed the restore journal at {} written before the last reboot; the reboot already reset those tunables",
        path.display()
    );
    Ok(())
}

// ---- restoring ----

/// Restores a live guard's files and lets go of its journal and lock.
fn finish(live: Live) -> Result<Vec<Restored>> {
    let path = live.dir.join(JOURNAL);
    let mut journal = live.journal;
    let (restored, failed) = restore_entries(&journal.entries);
    journal.entries = failed.iter().map(|(e, _)| e.clone()).collect();
    let written = write_journal(&path, &journal);
    release_lock(live.lock);
    if !failed.is_empty() {
        return Err(failure(&path, &failed));
    }
    written?;
    Ok(restored)
}

/// Last written first: a later write may depend on an earlier one (a per-size
/// `enabled` of `inherit` reads the global one), so undo in reverse.
fn restore_entries(entries: &[Entry]) -> (Vec<Restored>, Vec<(Entry, String)>) {
    let mut restored = Vec::new();
    let mut failed = Vec::new();
    for e in entries.iter().rev() {
        match restore_entry(e) {
            Ok(r) => restored.push(r),
            Err(msg) => failed.push((e.clone(), msg)),
        }
    }
    (restored, failed)
}

fn restore_entry(e: &Entry) -> std::result::Result<Restored, String> {
    let file = Path::new(&e.path);
    let found = read_value(file).map_err(|err| err.to_string())?;
    let done = |found: String| Restored {
        path: e.path.clone(),
        tunable: e.tunable.clone(),
        old: e.old.clone(),
        found,
    };
    // Not rewritten when already right: writing a khugepaged knob wakes
    // khugepaged, and writing a pool file makes hugetlb rebalance it.
    if same(&found, &e.old) {
        return Ok(done(found));
    }
    // A pool can fall short of its old size for a while: pages of an agent the
    // cleanup hook just killed are freed only once its mm is torn down, freeing
    // with hugetlb_optimize_vmemmap needs memory for the vmemmap, and growing
    // a pool back needs free contiguous memory. Writing again after a pause
    // usually completes it.
    let attempts = if is_pool(file) { POOL_ATTEMPTS } else { 1 };
    let mut now = found.clone();
    for attempt in 0..attempts {
        if attempt > 0 {
            std::thread::sleep(backoff(attempt));
        }
        write_value(file, &e.old).map_err(|err| err.to_string())?;
        now = read_value(file).map_err(|err| err.to_string())?;
        if same(&now, &e.old) {
            return Ok(done(found));
        }
        // Pages in use cannot be freed: the kernel keeps them as surplus
        // pages above the persistent size just written and frees each one
        // when its last user lets go. Nothing a retry (or `hugelab settings
        // restore`) could add: the pool is restored, it only drains later.
        if let Some(surplus) = surplus_pages(file) {
            if drains_to(&e.old, &now, surplus) {
                eprintln!(
                    "hugelab: {} restored to {}; {surplus} of its pages are still in use and stay as surplus pages until they are freed",
                    e.tunable, e.old
                );
                return Ok(done(found));
            }
        }
    }
    Err(format!(
        "{}: wrote {} but it reads back {}",
        e.path, e.old, now
    ))
}

/// Why a run stops when a kdamond cannot be turned off, in one sentence.
fn damon_refused(kdamond: &str, why: &str) -> KernelError {
    KernelError::Refused(format!(
        "cannot turn DAMON's {kdamond} off for the run: {why}; hugelab stops kdamonds during runs because their pageout and access sampling move the counters it measures"
    ))
}

/// A journaled file's value: a kdamond's `state` is read again while DAMON
/// answers EBUSY.
fn read_value(file: &Path) -> Result<String> {
    if damon::is_state_file(file) {
        damon::read_state(file)
    } else {
        sysfs::read_value(file)
    }
}

/// A journaled file's write: a kdamond's `state` is retried while DAMON
/// answers EBUSY.
fn write_value(file: &Path, value: &str) -> Result<()> {
    if damon::is_state_file(file) {
        damon::write_state(file, value)
    } else {
        sysfs::write_value(file, value)
    }
}

fn is_pool(file: &Path) -> bool {
    matches!(
        file.file_name().and_then(|n| n.to_str()),
        Some("nr_hugepages" | "nr_overcommit_hugepages")
    )
}

/// The surplus pages of the pool `file` (an `nr_hugepages` file) holds:
/// `surplus_hugepages` beside a per-size file, HugePages_Surp of
/// /proc/meminfo for the default size's /proc/sys/vm/nr_hugepages. None for
/// other files, or when it cannot be read.
fn surplus_pages(file: &Path) -> Option<u64> {
    if file.file_name()? != "nr_hugepages" {
        return None;
    }
    if file == Path::new(sysfs::PROC_VM).join("nr_hugepages") {
        let v = crate::vmstat::read_fields(&[], &["HugePages_Surp"]).ok()?;
        return u64::try_from(v[0]).ok();
    }
    sysfs::read_value(&file.with_file_name("surplus_hugepages"))
        .ok()?
        .parse()
        .ok()
}

/// Whether a pool that reads `now` after `old` was written to it is at
/// `old` but for `surplus` pages in use: the persistent pool
/// (nr_hugepages − surplus_hugepages, as set_max_huge_pages counts it) is
/// `old`, and the kernel frees the surplus pages as they are released.
fn drains_to(old: &str, now: &str, surplus: u64) -> bool {
    match (old.trim().parse::<u64>(), now.trim().parse::<u64>()) {
        (Ok(old), Ok(now)) => surplus > 0 && now > old && now - surplus == old,
        _ => false,
    }
}

/// 50 ms doubling to 500 ms: about 3 s over all attempts.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((50u64 << (attempt - 1).min(4)).min(500))
}

/// Values compare as words: multi-value sysctls read back tab-separated.
fn same(a: &str, b: &str) -> bool {
    a.split_whitespace().eq(b.split_whitespace())
}

fn failure(path: &Path, failed: &[(Entry, String)]) -> KernelError {
    let list: Vec<&str> = failed.iter().map(|(_, msg)| msg.as_str()).collect();
    let (what, them) = match failed.len() {
        1 => ("a tunable".to_string(), "it"),
        n => (format!("{n} tunables"), "them"),
    };
    KernelError::Refused(format!(
        "could not restore {what}: {}; the journal at {} keeps {them}, run `hugelab settings restore` to retry",
        list.join("; "),
        path.display()
    ))
}

// ---- signals ----

/// The write end of the self-pipe the handler writes signal numbers to.
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);
static SIGNAL_THREAD: Once = Once::new();

extern "C" fn on_signal(signo: libc::c_int) {
    // Only async-signal-safe calls here; the restore runs on the signal thread.
    // SAFETY: errno is thread-local; write(2) on a non-blocking pipe never blocks.
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
        if fd >= 0 {
            let byte = signo as u8;
            libc::write(fd, (&byte as *const u8).cast(), 1);
        }
        *errno = saved;
    }
}

/// Starts the thread that turns signals into restores, once per process.
fn start_signal_thread() -> bool {
    SIGNAL_THREAD.call_once(|| {
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return;
        }
        // A full pipe must drop the byte, not block the interrupted thread:
        // one pending byte is enough to restore and exit.
        // SAFETY: fds[1] is the pipe we just created.
        unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) };
        let reader = fds[0];
        let spawned = std::thread::Builder::new()
            .name("hugelab-signals".to_string())
            .spawn(move || signal_thread(reader));
        if spawned.is_ok() {
            SIGNAL_PIPE.store(fds[1], Ordering::SeqCst);
        } else {
            // SAFETY: closing the pipe nobody else knows about.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
        }
    });
    SIGNAL_PIPE.load(Ordering::SeqCst) >= 0
}

fn install_handlers(reg: &mut Registry) {
    if !start_signal_thread() {
        eprintln!(
            "hugelab: cannot watch for signals; if this run is interrupted, run `hugelab settings restore`"
        );
        return;
    }
    for signo in SIGNALS {
        // SAFETY: plain sigaction calls with zero-initialised structs.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signo, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            // Ignored (nohup, a background job): it cannot end the run, so
            // there is nothing to restore on it, and the user asked for it.
            if old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            new.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut new.sa_mask);
            if libc::sigaction(signo, &new, std::ptr::null_mut()) == 0 {
                reg.saved_actions.push((signo, old));
            }
        }
    }
}

fn uninstall_handlers(reg: &mut Registry) {
    for (signo, old) in reg.saved_actions.drain(..) {
        // SAFETY: puts back the disposition sigaction gave us.
        unsafe { libc::sigaction(signo, &old, std::ptr::null_mut()) };
    }
}

fn signal_thread(reader: libc::c_int) {
    loop {
        let mut byte = 0u8;
        // SAFETY: reads one byte into a local.
        let n = unsafe { libc::read(reader, (&mut byte as *mut u8).cast(), 1) };
        if n == 1 {
            on_interrupt(libc::c_int::from(byte));
        } else if n == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

fn on_interrupt(signo: libc::c_int) {
    {
        let mut reg = registry();
        if reg.live.is_empty() {
            // The last guard restored while this signal was in flight: act as
            // if we had never caught it.
            uninstall_handlers(&mut reg);
            drop(reg);
            // SAFETY: re-sends the signal to ourselves with its old disposition.
            unsafe { libc::raise(signo) };
            return;
        }
    }
    let soft = *SOFT_INTERRUPT_HOOK
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if soft.is_some_and(|f| f()) {
        return;
    }
    // Before taking the registry, so a hook that waits on the main thread
    // cannot deadlock with it; a set that runs meanwhile is journaled and is
    // restored below like any other.
    let hook = *CLEANUP_HOOK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(hook) = hook {
        if std::panic::catch_unwind(hook).is_err() {
            eprintln!("hugelab: the cleanup hook panicked; restoring anyway");
        }
    }
    // Kept locked until exit: no thread may write a tunable after this restore.
    let mut reg = registry();
    let mut failures = Vec::new();
    while let Some(live) = reg.live.pop() {
        if let Err(e) = finish(live) {
            failures.push(e.to_string());
        }
    }
    if failures.is_empty() {
        eprintln!("hugelab: interrupted; tunables restored");
    } else {
        eprintln!("hugelab: interrupted; {}", failures.join("; "));
    }
    std::process::exit(128 + signo);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn state_dir_precedence() {
        let both = [
            ("HUGELAB_STATE_DIR", "/tmp/a"),
            ("XDG_STATE_HOME", "/tmp/x"),
        ];
        assert_eq!(resolve_state_dir(env(&both)), Path::new("/tmp/a"));
        let xdg = [("XDG_STATE_HOME", "/tmp/x")];
        assert_eq!(resolve_state_dir(env(&xdg)), Path::new("/tmp/x/hugelab"));
        // An empty variable is an unset one, not the current directory.
        let empty = [("HUGELAB_STATE_DIR", ""), ("XDG_STATE_HOME", "")];
        assert_eq!(resolve_state_dir(env(&empty)), Path::new(DEFAULT_STATE_DIR));
        assert_eq!(resolve_state_dir(env(&[])), Path::new(DEFAULT_STATE_DIR));
    }

    #[test]
    fn journal_format() {
        let j = Journal {
            pid: 123,
            started: 1700000000,
            boot_id: None,
            entries: vec![Entry {
                path: "/sys/kernel/mm/transparent_hugepage/enabled".into(),
                tunable: "transparent_hugepage/enabled".into(),
                old: "madvise".into(),
            }],
        };
        let v: serde_json::Value = serde_json::to_value(&j).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"pid": 123, "started": 1700000000, "entries": [{
                "path": "/sys/kernel/mm/transparent_hugepage/enabled",
                "tunable": "transparent_hugepage/enabled",
                "old": "madvise"}]})
        );
        let back: Journal = serde_json::from_value(v).unwrap();
        assert_eq!(back.entries, j.entries);
        assert!(!from_earlier_boot(&back), "no boot id: assume this boot");
        let earlier = Journal {
            boot_id: Some("not-this-boot".into()),
            ..back
        };
        assert_eq!(from_earlier_boot(&earlier), boot_id().is_some());
    }

    #[test]
    fn refused_writes_name_path_and_errno() {
        let e = |errno| KernelError::io("/sys/x", io::Error::from_raw_os_error(errno));
        assert_eq!(
            refusal(e(libc::EROFS)).to_string(),
            "cannot write /sys/x: read-only (EROFS)"
        );
        assert!(
            matches!(refusal(e(libc::EACCES)), KernelError::Refused(m) if m.ends_with("(EACCES)"))
        );
        assert!(
            matches!(refusal(e(libc::EPERM)), KernelError::Refused(m) if m.ends_with("(EPERM)"))
        );
        let einval = refusal(e(libc::EINVAL));
        assert!(matches!(einval, KernelError::Io { .. }));
        assert_eq!(einval.to_string(), "/sys/x: Invalid argument (EINVAL)");
    }

    #[test]
    fn a_kdamond_that_cannot_be_stopped_stops_the_run_naming_path_and_errno() {
        let file = "/sys/kernel/mm/damon/admin/kdamonds/0/state";
        let e = KernelError::io(file, io::Error::from_raw_os_error(libc::EACCES));
        let msg = damon_refused("kdamond 0 (paddr: pageout)", &refusal(e).to_string()).to_string();
        assert_eq!(
            msg,
            "cannot turn DAMON's kdamond 0 (paddr: pageout) off for the run: \
             cannot write /sys/kernel/mm/damon/admin/kdamonds/0/state: permission denied (EACCES); \
             hugelab stops kdamonds during runs because their pageout and access sampling move the counters it measures"
        );
    }

    #[test]
    fn values_compare_as_words() {
        assert!(same("4096\t4096\n", "4096 4096"));
        assert!(!same("1", "10"));
    }

    #[test]
    fn pools_are_retried_for_a_bounded_time() {
        assert!(is_pool(Path::new(
            "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
        )));
        assert!(is_pool(Path::new("/proc/sys/vm/nr_overcommit_hugepages")));
        assert!(!is_pool(Path::new("/proc/sys/vm/nr_hugepages_mempolicy")));
        let total: Duration = (1..POOL_ATTEMPTS).map(backoff).sum();
        assert!(total >= Duration::from_secs(2) && total <= Duration::from_secs(5));
    }

    #[test]
    fn a_pool_whose_excess_is_surplus_in_use_is_restored() {
        // 0 written, 3 read back, 3 of them surplus: the persistent pool is 0.
        assert!(drains_to("0", "3", 3));
        assert!(drains_to("5", "7", 2));
        // Persistent pages above the old size: vmemmap could not be
        // allocated to free them (HVO) and they went back to the pool; a
        // retry may free them.
        assert!(!drains_to("0", "3", 1));
        assert!(!drains_to("0", "3", 0));
        // Short of the old size (growing back failed): not restored.
        assert!(!drains_to("5", "3", 0));
        assert!(!drains_to("5", "5", 0), "equal is handled before");
        assert!(!drains_to("x", "3", 3));
    }

    #[test]
    fn failures_are_listed_together() {
        let entry = Entry {
            path: "/a".into(),
            tunable: "a".into(),
            old: "1".into(),
        };
        let failed = vec![
            (entry.clone(), "/a: wrote 1 but it reads back 2".to_string()),
            (entry, "/b: Invalid argument (EINVAL)".to_string()),
        ];
        let msg = failure(Path::new("/state/journal.json"), &failed).to_string();
        assert_eq!(
            msg,
            "could not restore 2 tunables: /a: wrote 1 but it reads back 2; /b: Invalid argument (EINVAL); \
             the journal at /state/journal.json keeps them, run `hugelab settings restore` to retry"
        );
    }

    #[test]
    fn restored_display() {
        let r = Restored {
            path: "/sys/kernel/mm/transparent_hugepage/enabled".into(),
            tunable: "transparent_hugepage/enabled".into(),
            old: "madvise".into(),
            found: "never".into(),
        };
        assert_eq!(
            r.to_string(),
            "transparent_hugepage/enabled madvise (was never)"
        );
    }
}
