//! Memory cgroups for `cgroup <cg> [memory.max=<size>]` and `spawn ...
//! cgroup=<cg>`: cgroup v2 where the unified hierarchy has the memory
//! controller, else v1 (these VMs: /sys/fs/cgroup/memory). Counters use the
//! v2 names on both: `memcg.<cg>.memory.current` and `memory.peak` (v1:
//! memory.usage_in_bytes and memory.max_usage_in_bytes).
//!
//! A group is a directory `hugelab.<runner pid>.<name>`; it is removed when
//! the run ends (after its processes), and `hugelab settings restore` removes
//! those a killed run left behind.

use crate::error::{KernelError, Result};
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// Where memory cgroups live on this machine, and which interface they have.
pub fn hierarchy() -> Option<(PathBuf, Version)> {
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    let mut v1 = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        let dir = PathBuf::from(f[1]);
        if f[2] == "cgroup2" {
            let controllers =
                fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
            if controllers.split_whitespace().any(|c| c == "memory") {
                return Some((dir, Version::V2));
            }
        } else if f[2] == "cgroup" && f[3].split(',').any(|o| o == "memory") {
            v1 = Some((dir, Version::V1));
        }
    }
    v1
}

pub struct Memcg {
    pub name: String,
    dir: PathBuf,
    version: Version,
}

impl Memcg {
    /// Creates the group, with a memory limit if given.
    pub fn create(name: &str, limit: Option<u64>) -> Result<Memcg> {
        let (root, version) = hierarchy().ok_or_else(|| {
            KernelError::Refused(
                "this machine has no memory cgroup controller (neither v2 nor v1 is mounted)"
                    .to_string(),
            )
        })?;
        let dir = root.join(format!("hugelab.{}.{name}", std::process::id()));
        fs::create_dir(&dir).map_err(|e| KernelError::io(&dir, e))?;
        let cg = Memcg {
            name: name.to_string(),
            dir,
            version,
        };
        if let Some(limit) = limit {
            let file = match version {
                Version::V2 => "memory.max",
                Version::V1 => "memory.limit_in_bytes",
            };
            cg.write(file, &limit.to_string())?;
        }
        Ok(cg)
    }

    /// The group's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The group's peak memory in kB (v2 memory.peak, v1
    /// memory.max_usage_in_bytes), None where the kernel has no peak file.
    pub fn peak_kb(&self) -> Result<Option<u64>> {
        Ok(self
            .counters()?
            .into_iter()
            .find(|(n, _)| n.ends_with(".memory.peak"))
            .map(|(_, kb)| kb as u64))
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.dir.join(file);
        fs::write(&path, value).map_err(|e| KernelError::io(path, e))
    }

    /// Moves a process into the group (its later allocations are charged here).
    pub fn attach(&self, pid: i32) -> Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// (counter name, kB) of the group now: the registry's unit, whatever
    /// the file's own (bytes).
    pub fn counters(&self) -> Result<Vec<(String, i64)>> {
        let files = match self.version {
            Version::V2 => [
                ("memory.current", "memory.current"),
                ("memory.peak", "memory.peak"),
            ],
            Version::V1 => [
                ("memory.current", "memory.usage_in_bytes"),
                ("memory.peak", "memory.max_usage_in_bytes"),
            ],
        };
        let mut out = Vec::new();
        for (name, file) in files {
            let path = self.dir.join(file);
            let Ok(text) = fs::read_to_string(&path) else {
                continue; // memory.peak is missing on kernels before 5.19
            };
            let bytes: i64 = text.trim().parse().map_err(|_| {
                KernelError::Refused(format!(
                    "{}: unexpected value {:?}",
                    path.display(),
                    text.trim()
                ))
            })?;
            out.push((format!("memcg.{}.{name}", self.name), bytes / 1024));
        }
        Ok(out)
    }
}

impl Drop for Memcg {
    /// Removing fails while a process is still in the group: the backend
    /// drops its agents first.
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.dir);
    }
}

/// SIGKILLs every process of the group at `dir` and waits (up to 5 s) for
/// the group to be empty; true if it is. Safe to call from the signal
/// thread: it only reads the group's task list and sends signals.
pub fn kill_all(dir: &Path) -> bool {
    let procs = dir.join("cgroup.procs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let Ok(text) = fs::read_to_string(&procs) else {
            return true; // the group is gone
        };
        let pids: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.is_empty() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        for pid in pids {
            // SAFETY: kill has no memory effects; the pid is a member of a
            // group only this run created.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Removes the groups of runs that are no longer alive; returns them.
pub fn remove_stale() -> Vec<PathBuf> {
    let Some((root, _)) = hierarchy() else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in fs::read_dir(&root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("hugelab.")
            .and_then(|r| r.split('.').next())
        else {
            continue;
        };
        let alive = pid
            .parse::<i32>()
            .is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
        // What a killed run left in its groups (a benchmarked command) dies
        // with it: a group with tasks cannot be removed.
        if !alive && kill_all(&entry.path()) && fs::remove_dir(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed
}
