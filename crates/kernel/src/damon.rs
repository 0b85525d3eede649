//! DAMON's kdamonds as /sys/kernel/mm/damon/admin shows them (mm/damon/sysfs.c,
//! Linux 6.18): which are running, what they do, and their `state` files,
//! which the settings guard ([`crate::guard`]) turns `off` for a run and `on`
//! again after it.
//!
//! Why: a kdamond with a `paddr` context works on the whole machine behind the
//! workload's back. Its `pageout` scheme (damon_pa_pageout → reclaim_pages →
//! shrink_folio_list) drops the page cache and shmem/memfd folios it finds
//! idle, so a later read faults again and RSS, the page cache and the
//! pgsteal/pgscan-like vmstat counters move; the folios it cannot drop are
//! put back active (pgactivate). On a test VM with a paddr `pageout` scheme
//! (regions idle 12 × 5 s, anonymous folios filtered out) a workload file's
//! 64 MiB of page cache left unmapped for 240 s lost 732 of its 16384 pages
//! (zero-filled shmem folios, never dirtied, are dropped like clean page
//! cache), so mapping and reading it again took 732 more faults than the
//! model's fault-around; with kdamond off, none. Even without a scheme its
//! access sampling (damon_pa_prepare_access_checks → damon_folio_mkold)
//! clears the accessed bits of mapped pages, anonymous ones included, every
//! sample interval.
//!
//! Every run, not only workloads with page cache or shmem: without swap a
//! paddr `pageout` cannot free an anonymous folio, but it still isolates it
//! from the LRU and sends it through shrink_folio_list, which activates it
//! again (pgactivate, the LRU lists' sizes move), and it clears the folio's
//! referenced flag and its PTEs' young bits first. Those young bits are what
//! khugepaged's scan counts as referenced (a PMD range with too few is not
//! collapsed: SCAN_LACK_REFERENCED_PAGE) and what a `reclaim` statement's
//! folio_referenced reads, so anonymous-only workloads are moved too. A
//! scheme's ops filters (this machine's rejects anonymous folios) narrow what
//! `pageout` touches but not the sampling. Stopping kdamond for a run costs
//! nothing the run needs.
//!
//! A write of `off` that the machine refuses ends the run before its first
//! statement, with the path and errno, instead of running and marking
//! counters unknown: what DAMON moves is machine-wide (vmstat) and
//! per-process (RSS, faults) at times nobody sees, and its scheme stats are
//! sums over the whole machine, so no reading could tell which counters of
//! which statement it moved; a run whose every counter is suspect measures
//! nothing. Root can write `state` wherever it can write the tunables a run
//! sets, so the refusal is a misconfigured machine, said as such.
//!
//! `on` again rebuilds the context from the sysfs tree
//! (damon_sysfs_turn_damon_on → damon_sysfs_build_ctx), which nothing here
//! writes: the kdamond restarts with the same parameters. What it had learnt
//! starts from zero (region ages, the scheme's stats and quota charge), and
//! its pid is new.
//!
//! `state` is read and written under a trylock of damon_sysfs_lock (`-EBUSY`
//! while another reader or writer holds it), so both are retried, for about
//! a second, on EBUSY.

use crate::damon_view::numbered;
use crate::error::{KernelError, Result};
use hugelab_workload::tunables::SYS_MM;
use serde::Serialize;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where DAMON's sysfs interface lives.
pub const ADMIN: &str = "/sys/kernel/mm/damon/admin";
/// Writes of a `state` file that fail with EBUSY before giving up.
const BUSY_ATTEMPTS: u32 = 20;
const BUSY_PAUSE: Duration = Duration::from_millis(50);

/// A kdamond whose `state` reads `on`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kdamond {
    /// `<admin>/kdamonds/<index>`.
    pub dir: PathBuf,
    pub index: u32,
    /// Each context: its operations set and its schemes' actions.
    pub contexts: Vec<(String, Vec<String>)>,
}

impl Kdamond {
    /// The file the guard writes.
    pub fn state_file(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// `kdamond 0 (paddr: pageout)`.
    pub fn describe(&self) -> String {
        let runs = self.runs();
        if runs.is_empty() {
            format!("kdamond {}", self.index)
        } else {
            format!("kdamond {} ({runs})", self.index)
        }
    }

    /// Each context's operations and scheme actions: `paddr: pageout`.
    pub fn runs(&self) -> String {
        let contexts: Vec<String> = self
            .contexts
            .iter()
            .map(|(ops, actions)| {
                if actions.is_empty() {
                    format!("{ops}: no scheme")
                } else {
                    format!("{ops}: {}", actions.join(", "))
                }
            })
            .collect();
        contexts.join("; ")
    }
}

/// What a run would change for one kdamond, as the commands' `--dry-run`
/// print it (`--json`: this object).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Planned {
    pub kdamond: u32,
    /// The `state` file, as the journal names it.
    pub tunable: String,
    /// What the kdamond runs (`paddr: pageout`).
    pub runs: String,
    pub now: String,
    pub value: String,
}

impl Planned {
    /// `damon/admin/kdamonds/0/state = off (now on): kdamond 0 (paddr:
    /// pageout) stops for the run`.
    pub fn line(&self) -> String {
        format!(
            "{} = {} (now {}): kdamond {} ({}) stops for the run",
            self.tunable, self.value, self.now, self.kdamond, self.runs
        )
    }
}

/// What [`crate::guard::SettingsGuard::acquire`] would turn off on this
/// machine now.
pub fn planned() -> Result<Vec<Planned>> {
    Ok(running(Path::new(ADMIN))?
        .iter()
        .map(|k| Planned {
            kdamond: k.index,
            tunable: tunable_name(&k.state_file()),
            runs: k.runs(),
            now: "on".to_string(),
            value: "off".to_string(),
        })
        .collect())
}

/// The kdamonds under `admin` whose `state` reads `on`, by index. None when
/// the kernel has no DAMON sysfs interface (`admin` or its `kdamonds` is
/// missing) or no kdamond; a `state` that cannot be read is an error.
pub fn running(admin: &Path) -> Result<Vec<Kdamond>> {
    let mut out = Vec::new();
    for (index, dir) in numbered(&admin.join("kdamonds")) {
        if read_state(&dir.join("state"))? == "on" {
            let contexts = contexts(&dir);
            out.push(Kdamond {
                dir,
                index,
                contexts,
            });
        }
    }
    Ok(out)
}

/// What a kdamond runs, for the dry run and messages: each context's
/// operations and its schemes' actions, from [`crate::damon_view`]'s reader.
fn contexts(kdamond: &Path) -> Vec<(String, Vec<String>)> {
    crate::damon_view::contexts(kdamond)
        .into_iter()
        .map(|c| {
            let actions = c.schemes.into_iter().map(|s| s.action).collect();
            (c.operations, actions)
        })
        .collect()
}

/// How the journal names a `state` file: its path under /sys/kernel/mm
/// (`damon/admin/kdamonds/0/state`), like the tunables; the whole path for
/// one elsewhere (a test's fake tree).
pub fn tunable_name(state: &Path) -> String {
    match state.strip_prefix(SYS_MM) {
        Ok(rel) => rel.display().to_string(),
        Err(_) => state.display().to_string(),
    }
}

/// Whether `file` is a kdamond's `state` file (`…/kdamonds/<n>/state`).
pub fn is_state_file(file: &Path) -> bool {
    let parent = file.parent();
    file.file_name().is_some_and(|n| n == "state")
        && parent
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.parse::<u32>().is_ok())
        && parent
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .is_some_and(|n| n == "kdamonds")
}

/// Writes `value` to a `state` file, again while the kernel answers EBUSY.
pub fn write_state(file: &Path, value: &str) -> Result<()> {
    write_retrying(file, value, BUSY_ATTEMPTS)
}

/// A `state` file's word (`on`, `off`), read again while the kernel answers
/// EBUSY (reading takes damon_sysfs_lock too; an `update_schemes_stats`
/// holds it for up to an aggregation interval).
pub fn read_state(file: &Path) -> Result<String> {
    let mut last = None;
    for attempt in 0..BUSY_ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(BUSY_PAUSE);
        }
        match fs::read_to_string(file) {
            Ok(text) => return Ok(text.trim().to_string()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = Some(e),
            Err(e) => return Err(KernelError::io(file, e)),
        }
    }
    Err(KernelError::io(file, last.expect("every attempt failed")))
}

fn write_retrying(file: &Path, value: &str, attempts: u32) -> Result<()> {
    let mut last = None;
    for attempt in 0..attempts.max(1) {
        if attempt > 0 {
            std::thread::sleep(BUSY_PAUSE);
        }
        match fs::write(file, format!("{value}\n")) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = Some(e),
            Err(e) => return Err(KernelError::io(file, e)),
        }
    }
    Err(KernelError::io(
        file,
        last.expect("at least one attempt failed"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(name: &str) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("hugelab-damon-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        root
    }

    fn put(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn no_damon_is_nothing_to_do() {
        let root = tree("none");
        assert_eq!(running(&root).unwrap(), vec![]);
        fs::create_dir_all(root.join("kdamonds")).unwrap();
        put(&root.join("kdamonds/nr_kdamonds"), "0\n");
        assert_eq!(running(&root).unwrap(), vec![]);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn only_kdamonds_that_read_on_are_running() {
        let root = tree("some");
        let k = root.join("kdamonds");
        put(&k.join("nr_kdamonds"), "3\n");
        put(&k.join("0/state"), "off\n");
        put(&k.join("1/state"), "on\n");
        put(&k.join("1/contexts/0/operations"), "paddr\n");
        put(&k.join("1/contexts/0/schemes/0/action"), "pageout\n");
        put(&k.join("1/contexts/0/schemes/1/action"), "stat\n");
        put(&k.join("10/state"), "on\n");
        let found = running(&root).unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].index, 1);
        assert_eq!(found[0].state_file(), k.join("1/state"));
        assert_eq!(found[0].describe(), "kdamond 1 (paddr: pageout, stat)");
        assert_eq!(
            found[1].describe(),
            "kdamond 10",
            "numeric order, not 1 < 10 < 2"
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_unreadable_state_is_an_error_naming_it() {
        let root = tree("unreadable");
        // A directory where the file should be: reading it fails (EISDIR).
        fs::create_dir_all(root.join("kdamonds/0/state")).unwrap();
        let e = running(&root).unwrap_err().to_string();
        assert!(e.contains("kdamonds/0/state"), "{e}");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn state_files_and_their_names() {
        let real = Path::new(ADMIN).join("kdamonds/0/state");
        assert!(is_state_file(&real));
        assert_eq!(tunable_name(&real), "damon/admin/kdamonds/0/state");
        assert!(!is_state_file(Path::new(
            "/sys/kernel/mm/transparent_hugepage/enabled"
        )));
        assert!(!is_state_file(Path::new("/x/kdamonds/nr_kdamonds")));
        assert!(!is_state_file(Path::new("/x/contexts/0/state")));
        assert_eq!(
            tunable_name(Path::new("/tmp/t/kdamonds/0/state")),
            "/tmp/t/kdamonds/0/state"
        );
    }

    #[test]
    fn a_write_error_names_the_file() {
        let e = write_retrying(Path::new("/nonexistent-dir/kdamonds/0/state"), "off", 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent-dir/kdamonds/0/state"), "{e}");
        assert!(e.contains("ENOENT"), "{e}");
    }
}
