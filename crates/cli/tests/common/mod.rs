//! Helpers of the `hugelab` binary's tests (most of them for the tests that
//! run on this machine's kernel as root).
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// `hugelab ARGS` for a command that leaves the machine alone (no state
/// directory of its own).
pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(args)
        .output()
        .expect("the hugelab binary runs")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn hugelab(args: &[&str], state: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(args)
        .env("HUGELAB_STATE_DIR", state)
        .output()
        .expect("the hugelab binary runs")
}

/// Why the kernel backend cannot run here, if it cannot.
pub fn cannot_run() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    let f = "/sys/kernel/mm/transparent_hugepage/enabled";
    let c = std::ffi::CString::new(f).unwrap();
    // SAFETY: access on a NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
        return Some(format!("{f} is not writable"));
    }
    None
}

/// Every tunable hugelab knows, with its value (`settings show`), but
/// vm.min_free_kbytes: the kernel itself recomputes it whenever khugepaged
/// starts (start_stop_khugepaged -> set_recommended_min_free_kbytes, from
/// the zones' managed pages, which these VMs change as memory is handed back
/// and forth), so a run that turns THP on and off moves it without writing
/// it. The scenarios never set it.
pub fn machine_state(state: &Path) -> String {
    let out = hugelab(&["settings", "show"], state);
    assert!(out.status.success(), "settings show: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        // The tunables: what follows the first blank line is the machine's
        // activity (DAMON's stats, khugepaged's counts), which moves.
        .take_while(|l| !l.is_empty())
        .filter(|l| !l.starts_with("vm.min_free_kbytes "))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// A test's own hugelab state directory (`HUGELAB_STATE_DIR`), removed
/// when the test lets go of it, whether it passes or fails.
pub struct StateDir(PathBuf);

impl std::ops::Deref for StateDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for StateDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for StateDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn state_dir(name: &str) -> StateDir {
    let dir = std::env::temp_dir().join(format!("hugelab-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    StateDir(dir)
}

pub fn read(path: &str) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    match (text.find('['), text.find(']')) {
        (Some(a), Some(b)) => text[a + 1..b].to_string(),
        _ => text.trim().to_string(),
    }
}

/// Runs hugelab as user nobody (uid 65534) with `args` and checks the
/// refusal: one sentence saying root is needed, exit 2. Does nothing where
/// that cannot be arranged (no setpriv, not root).
pub fn assert_refused_as_nobody(args: &[&str]) {
    let Some(out) = hugelab_as_nobody(args) else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.contains("needs root") && err.contains("uid 65534"),
        "{args:?}: {err}"
    );
}

/// Runs hugelab as user nobody (uid 65534) through setpriv, or None where
/// that is impossible (no setpriv, not root).
fn hugelab_as_nobody(args: &[&str]) -> Option<Output> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/usr/bin/setpriv").exists() {
        return None;
    }
    Command::new("/usr/bin/setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_hugelab"))
        .args(args)
        .output()
        .ok()
}

/// `source` compiled with `cc -O1 -pthread` into a temporary directory of
/// the test (`hugelab-<test>-<pid>/<name>`); Err (why) without a compiler or
/// when it fails.
pub fn compile_c(test: &str, name: &str, source: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("hugelab-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.c"));
    let bin = dir.join(name);
    std::fs::write(&src, source).unwrap();
    let out = Command::new("cc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .map_err(|e| format!("no C compiler (cc: {e})"))?;
    if !out.status.success() {
        return Err(format!(
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(bin)
}

/// A workload file in the temporary directory, removed when dropped.
pub struct TempWorkload(PathBuf);

impl TempWorkload {
    pub fn new(text: &str) -> TempWorkload {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("hugelab-test-{}-{n}.hlw", std::process::id()));
        std::fs::write(&path, text).expect("write the workload file");
        TempWorkload(path)
    }

    pub fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for TempWorkload {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The settings the live-scan tests start from, as workload text: THP by
/// MADV_HUGEPAGE, PMD-sized only (every smaller size `never`), the
/// under-used check on at max_ptes_none 409. A literal, for `concat!`.
#[macro_export]
macro_rules! pmd_thp_at_409 {
    () => {
        "set transparent_hugepage/enabled madvise
set transparent_hugepage/shrink_underused 1
set transparent_hugepage/hugepages-16kB/enabled never
set transparent_hugepage/hugepages-32kB/enabled never
set transparent_hugepage/hugepages-64kB/enabled never
set transparent_hugepage/hugepages-128kB/enabled never
set transparent_hugepage/hugepages-256kB/enabled never
set transparent_hugepage/hugepages-512kB/enabled never
set transparent_hugepage/hugepages-1024kB/enabled never
set transparent_hugepage/hugepages-2048kB/enabled inherit
set transparent_hugepage/khugepaged/max_ptes_none 409
"
    };
}

/// Installs the Debian `package` the test needs with the project's own
/// script (scripts/install-test-packages: apt-get when missing, nothing when
/// installed), once per test binary at a time; Err says why it could not be
/// (the test then skips and prints it).
pub fn test_package(package: &str) -> Result<(), String> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install-test-packages");
    let out = Command::new(&script)
        .arg(package)
        .output()
        .map_err(|e| format!("{} did not run: {e}", script.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "the Debian package {package} is not installed and could not be: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The row of `counter` at snapshot `snapshot` of the only workload of a
/// `diff --json` document.
pub fn diff_row<'a>(
    doc: &'a serde_json::Value,
    snapshot: &str,
    counter: &str,
) -> &'a serde_json::Value {
    doc["workloads"][0]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["snapshot"] == snapshot && r["counter"] == counter)
        .unwrap_or_else(|| panic!("no row {snapshot} {counter}: {doc:#}"))
}

/// Whether a HUGELAB_DEBUG_WINDOWS line ("window line N: pgfault +S agents
/// +A runner +R ...") is line `line`'s window and shows faults beyond the
/// agents' own: another process faulted in it.
pub fn window_saw_others(text: &str, line: u32) -> bool {
    text.starts_with(&format!("window line {line}: ")) && window_disturbed(text)
}

/// Whether a HUGELAB_DEBUG_WINDOWS window line, any line's, shows faults
/// beyond the agents' own.
pub fn window_disturbed(text: &str) -> bool {
    let Some(rest) = text.strip_prefix("window line ") else {
        return false;
    };
    let field = |name: &str| -> Option<i64> {
        let after = rest.split(&format!("{name} +")).nth(1)?;
        after.split_whitespace().next()?.parse().ok()
    };
    matches!((field("pgfault"), field("agents")), (Some(s), Some(a)) if s > a)
}
