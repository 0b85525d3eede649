//! Memory cgroups for `cgroup <cg> [memory.max=<size>]` and `spawn ...
//! cgroup=<cg>`: cgroup v2 where the unified hierarchy has the memory
//! controller, else v1 (these VMs: /sys/fs/cgroup/memory). Counters use the
//! v2 names on both: `memcg.<cg>.memory.current`, `memory.peak` and
//! `memory.max` (v1: memory.usage_in_bytes, memory.max_usage_in_bytes and
//! memory.limit_in_bytes), `memory.events.<field>` (v2 memory.events; v1
//! has only oom_kill, in memory.oom_control), all in kB whatever the file's
//! unit.
//!
//! What the backend adds to a group, accounted openly: an agent joins its
//! group after its start-up (its own pages stay charged where they were:
//! charges do not move with a task), and the usage it brings with it is
//! measured at the join (`memory.agent`, the sum over the group's agents)
//! and added to the limit, so that the workload's own memory meets
//! `memory.max` where the workload says; `memory.current`, `memory.peak`
//! and `memory.max` are reported as read minus `memory.agent`. The
//! per-cpu charge stock (MEMCG_CHARGE_BATCH pages per CPU) and the kernel
//! memory of the workload's own VMAs and page tables are the workload's
//! and stay in: `diff` compares current and peak with the registry's
//! bound.
//!
//! A group is a directory `hugelab.<runner pid>.<name>`; it is removed when
//! the run ends (after its processes), and `hugelab settings restore` removes
//! those a killed run left behind.
//!
//! **The run's own group** ([`RunMemcg`]): every kernel run's agents run
//! inside `hugelab.<runner pid>` at the hierarchy's root, whose limit is
//! what the workload can need at most (`hugelab_workload::bound`, plus its
//! margin), so a workload that goes wrong OOM-kills only its own agents.
//! The workload's groups are made inside it; agents in none of them are in
//! its leaf `agents` (cgroup v2 lets processes live only in leaves of a
//! group that gives its children the memory controller; v1 gets the same
//! tree). A parent's limit changes nothing below it while the usage stays
//! under it: charges, reclaim and the children's counters are their own.
//! The name carries the runner's pid as the groups above do, so the same
//! paths remove it: [`RunMemcg`]'s drop, the signal path
//! ([`remove_own`]) and `hugelab settings restore` ([`remove_stale`]).

use crate::call::failed;
use crate::error::{KernelError, Result};
use hugelab_workload::stmt::Cgroup;
use hugelab_workload::{BackendError, Stmt};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The `cgroup <cg> [memory.max=]` statement: the group created, by name,
/// inside the run's group if there is one.
pub(crate) fn cgroup(
    cgroups: &mut BTreeMap<String, Memcg>,
    run: Option<&RunMemcg>,
    stmt: &Stmt,
    s: &Cgroup,
) -> std::result::Result<(), BackendError> {
    let limit = s.memory_max.map(|m| m.bytes());
    let cg = match run {
        Some(run) => run.child(&s.cgroup, limit),
        None => Memcg::create(&s.cgroup, limit),
    }
    .map_err(|e| failed(stmt, e))?;
    cgroups.insert(s.cgroup.clone(), cg);
    Ok(())
}

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

/// The runner's own memory cgroup directory: /proc/self/cgroup's
/// `0::<path>` line on v2, its `memory` line on v1, under the hierarchy's
/// root.
fn runner_memcg(version: Version) -> Option<PathBuf> {
    let (root, _) = hierarchy()?;
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    Some(root.join(memcg_in(&text, version)?))
}

/// The memory cgroup of process `pid`, relative to the hierarchy's root
/// (`""` for the root itself); None when the process is gone or the
/// machine has no memory cgroups.
pub fn memcg_of(pid: i32, version: Version) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    memcg_in(&text, version)
}

/// The memory cgroup's path in the text of a /proc/PID/cgroup: the
/// `0::<path>` line on v2, the line naming `memory` on v1; without its
/// leading `/`.
fn memcg_in(text: &str, version: Version) -> Option<String> {
    text.lines().find_map(|line| {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let ours = match version {
            Version::V2 => controllers.is_empty(),
            Version::V1 => controllers.split(',').any(|c| c == "memory"),
        };
        ours.then(|| path.trim_start_matches('/').to_string())
    })
}

pub struct Memcg {
    pub name: String,
    dir: PathBuf,
    version: Version,
    /// memory.max as the workload wrote it, in bytes.
    limit: Option<u64>,
    /// What the agents brought with them when they joined, in bytes.
    agent_bytes: u64,
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
        Memcg::create_at(dir, name, version, limit)
    }

    /// Makes the group at `dir` (its parent exists), with a limit if given.
    fn create_at(dir: PathBuf, name: &str, version: Version, limit: Option<u64>) -> Result<Memcg> {
        fs::create_dir(&dir).map_err(|e| KernelError::io(&dir, e))?;
        let cg = Memcg {
            name: name.to_string(),
            dir,
            version,
            limit,
            agent_bytes: 0,
        };
        cg.write_limit()?;
        Ok(cg)
    }

    /// The workload's limit plus what the agents brought (see the module
    /// doc), in whole pages as page_counter_memparse keeps it.
    fn write_limit(&self) -> Result<()> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let page = hugelab_workload::units::PAGE_SIZE;
        let bytes = (limit / page) * page + self.agent_bytes;
        let file = match self.version {
            Version::V2 => "memory.max",
            Version::V1 => "memory.limit_in_bytes",
        };
        self.write(file, &bytes.to_string())
    }

    /// The group's usage now, in bytes.
    fn usage_bytes(&self) -> Result<u64> {
        let file = match self.version {
            Version::V2 => "memory.current",
            Version::V1 => "memory.usage_in_bytes",
        };
        self.read_u64(file)?.ok_or_else(|| {
            KernelError::Refused(format!("{}: missing", self.dir.join(file).display()))
        })
    }

    fn read_u64(&self, file: &str) -> Result<Option<u64>> {
        let path = self.dir.join(file);
        let Ok(text) = fs::read_to_string(&path) else {
            return Ok(None);
        };
        let t = text.trim();
        if t == "max" {
            return Ok(Some(u64::MAX));
        }
        t.parse().map(Some).map_err(|_| {
            KernelError::Refused(format!("{}: unexpected value {t:?}", path.display()))
        })
    }

    /// The OOM kills in the group so far (v2 memory.events oom_kill, v1
    /// memory.oom_control oom_kill).
    pub fn oom_kills(&self) -> Option<u64> {
        oom_kills_at(&self.dir)
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

    /// Moves a process into the group (its later allocations are charged
    /// here); what the group's usage grew by at the join is the agent's,
    /// added to the limit (see the module doc).
    pub fn attach(&mut self, pid: i32) -> Result<()> {
        let before = self.usage_bytes()?;
        self.write("cgroup.procs", &pid.to_string())?;
        let grew = self.usage_bytes()?.saturating_sub(before);
        if grew > 0 {
            self.agent_bytes += grew;
            self.write_limit()?;
        }
        Ok(())
    }

    /// Moves a process out of the group, back to the runner's own memory
    /// cgroup (where agents start): its later allocations are charged
    /// there. For `exec`, whose new image sets itself up outside the group
    /// and then joins it again ([`Memcg::attach`]), as at spawn.
    pub fn detach(&self, pid: i32) -> Result<()> {
        let own = runner_memcg(self.version).ok_or_else(|| {
            KernelError::Refused("cannot find the runner's own memory cgroup".to_string())
        })?;
        let procs = own.join("cgroup.procs");
        fs::write(&procs, pid.to_string()).map_err(|e| KernelError::io(procs, e))
    }

    /// (counter name, kB) of the group now: the registry's unit, whatever
    /// the file's own (bytes).
    /// current, peak and max are read minus what the agents brought
    /// (`memory.agent`, reported too); max only when the workload set one.
    pub fn counters(&self) -> Result<Vec<(String, i64)>> {
        let files = match self.version {
            Version::V2 => [
                ("memory.current", "memory.current"),
                ("memory.peak", "memory.peak"),
                ("memory.max", "memory.max"),
            ],
            Version::V1 => [
                ("memory.current", "memory.usage_in_bytes"),
                ("memory.peak", "memory.max_usage_in_bytes"),
                ("memory.max", "memory.limit_in_bytes"),
            ],
        };
        let agent = self.agent_bytes as i64;
        let mut out = vec![(format!("memcg.{}.memory.agent", self.name), agent / 1024)];
        for (name, file) in files {
            // memory.peak is missing on kernels before 5.19.
            let Some(bytes) = self.read_u64(file)? else {
                continue;
            };
            if name == "memory.max" && self.limit.is_none() {
                continue;
            }
            out.push((
                format!("memcg.{}.{name}", self.name),
                (bytes as i64 - agent) / 1024,
            ));
        }
        let events: &[&str] = match self.version {
            Version::V2 => &["max", "oom", "oom_kill"],
            Version::V1 => &["oom_kill"],
        };
        let file = match self.version {
            Version::V2 => "memory.events",
            Version::V1 => "memory.oom_control",
        };
        for field in events {
            if let Some(n) = keyed(&self.dir.join(file), field) {
                out.push((
                    format!("memcg.{}.memory.events.{field}", self.name),
                    n as i64,
                ));
            }
        }
        Ok(out)
    }
}

/// The run's own memory cgroup (see the module doc): `hugelab.<runner
/// pid>` with the limit, the workload's groups inside it, and the leaf
/// `agents` for the agents in none of them.
pub struct RunMemcg {
    /// Dropped first: a group with children cannot be removed.
    agents: Memcg,
    group: Memcg,
}

/// What the machine keeps beyond a kernel run's memory: MemAvailable less
/// this is the most a run's group may allow, and the most a HugeTLB pool
/// `hugetlb measure` grows may take.
pub const RESERVE_BYTES: u64 = 1 << 30;

/// The limit of a run whose workload has no bound (read from a pipe):
/// MemAvailable less [`RESERVE_BYTES`], at least 256 MiB.
pub fn default_limit() -> Result<u64> {
    let (available, _) = crate::hugetlb::mem_available()?;
    Ok(available.saturating_sub(RESERVE_BYTES).max(256 << 20))
}

/// Where a run's group goes and the file its limit is written to, on
/// this machine (for `--dry-run`); None without a memory controller.
pub fn run_group_path() -> Option<(PathBuf, &'static str)> {
    let (root, version) = hierarchy()?;
    let file = match version {
        Version::V2 => "memory.max",
        Version::V1 => "memory.limit_in_bytes",
    };
    Some((root.join(format!("hugelab.{}", std::process::id())), file))
}

impl RunMemcg {
    /// Makes the run's group with `limit` bytes, and its leaf.
    pub fn create(limit: u64) -> Result<RunMemcg> {
        let (root, version) = hierarchy().ok_or_else(|| {
            KernelError::Refused(
                "this machine has no memory cgroup controller (neither v2 nor v1 is mounted): a kernel run needs one to keep the workload inside a limit"
                    .to_string(),
            )
        })?;
        let dir = root.join(format!("hugelab.{}", std::process::id()));
        let group = Memcg::create_at(dir, "run", version, Some(limit))?;
        if version == Version::V2 {
            group.write("cgroup.subtree_control", "+memory")?;
        }
        let agents = Memcg::create_at(group.dir.join("agents"), "agents", version, None)?;
        Ok(RunMemcg { agents, group })
    }

    /// A workload's group `name` inside the run's group.
    pub(crate) fn child(&self, name: &str, limit: Option<u64>) -> Result<Memcg> {
        let dir = self
            .group
            .dir
            .join(format!("hugelab.{}.{name}", std::process::id()));
        Memcg::create_at(dir, name, self.group.version, limit)
    }

    /// The run's group.
    pub fn dir(&self) -> &Path {
        &self.group.dir
    }

    /// The leaf the agents in none of the workload's groups are in.
    pub fn agents_dir(&self) -> &Path {
        &self.agents.dir
    }

    /// The run's limit, bytes.
    pub fn limit(&self) -> u64 {
        self.group.limit.unwrap_or(u64::MAX)
    }

    /// Moves an agent into the leaf (see [`Memcg::attach`]).
    pub fn attach(&mut self, pid: i32) -> Result<()> {
        self.agents.attach(pid)
    }

    /// Moves an agent out of the leaf (see [`Memcg::detach`]).
    pub fn detach(&self, pid: i32) -> Result<()> {
        self.agents.detach(pid)
    }
}

/// The OOM kills in the group at `dir` so far: v2 memory.events, else v1
/// memory.oom_control (`oom_kill` in both).
pub fn oom_kills_at(dir: &Path) -> Option<u64> {
    keyed(&dir.join("memory.events"), "oom_kill")
        .or_else(|| keyed(&dir.join("memory.oom_control"), "oom_kill"))
}

/// The anonymous memory charged to a group, from the text of its
/// memory.stat: (anon, of which in THPs) in bytes. v2 names them `anon` and
/// `anon_thp`; v1 `rss` (THPs included) and `rss_huge`. None when neither
/// is there.
pub fn anon_of_stat(text: &str) -> Option<(u64, u64)> {
    let get = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse::<u64>().ok()).flatten()
        })
    };
    match get("anon") {
        Some(anon) => Some((anon, get("anon_thp").unwrap_or(0))),
        None => Some((get("rss")?, get("rss_huge").unwrap_or(0))),
    }
}

/// The value of `key` in a flat keyed file (`key value` lines).
fn keyed(path: &Path, key: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
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
/// The groups below it are searched too (the run's group holds the
/// workload's).
pub fn kill_all(dir: &Path) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        if !dir.exists() {
            return true; // the group is gone
        }
        let pids = tasks_below(dir);
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

/// The pids in the group at `dir` and in every group below it.
fn tasks_below(dir: &Path) -> Vec<i32> {
    let text = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    let mut pids: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    for sub in subgroups(dir) {
        pids.extend(tasks_below(&sub));
    }
    pids
}

/// The groups directly below the group at `dir`.
fn subgroups(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Removes the group at `dir` and the groups below it, deepest first (a
/// group with children cannot be removed); true when it is gone.
fn remove_tree(dir: &Path) -> bool {
    for sub in subgroups(dir) {
        remove_tree(&sub);
    }
    fs::remove_dir(dir).is_ok() || !dir.exists()
}

/// The signal path's cleanup: kills what is left in this process's groups
/// (and those below them) and removes them. Safe on the signal thread.
pub fn remove_own() {
    let Some((root, _)) = hierarchy() else {
        return;
    };
    let own = format!("hugelab.{}", std::process::id());
    for entry in fs::read_dir(&root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == own || name.starts_with(&format!("{own}.")) {
            kill_all(&entry.path());
            remove_tree(&entry.path());
        }
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
        if !alive && kill_all(&entry.path()) && remove_tree(&entry.path()) {
            removed.push(entry.path());
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_cgroup_of_either_hierarchy() {
        let text = "12:pids:/user.slice\n4:cpu,memory:/hugelab.7/g\n0::/init.scope\n";
        assert_eq!(memcg_in(text, Version::V1).as_deref(), Some("hugelab.7/g"));
        assert_eq!(memcg_in(text, Version::V2).as_deref(), Some("init.scope"));
        assert_eq!(memcg_in("0::/\n", Version::V2).as_deref(), Some(""));
        assert_eq!(memcg_in("0::/\n", Version::V1), None);
    }

    #[test]
    fn anon_of_either_memory_stat() {
        // v1 (6.18's memcg1_stat_format): rss includes rss_huge; total_rss
        // (the hierarchy's) must not be taken for rss.
        let v1 = "cache 8192\nrss 6291456\nrss_huge 4194304\nshmem 0\n\
                  total_cache 8192\ntotal_rss 7340032\ntotal_rss_huge 4194304\n";
        assert_eq!(anon_of_stat(v1), Some((6291456, 4194304)));
        // v2 (memory_stat_format): anon includes anon_thp.
        let v2 = "anon 6291456\nfile 8192\nkernel 4096\nanon_thp 2097152\nfile_thp 0\n";
        assert_eq!(anon_of_stat(v2), Some((6291456, 2097152)));
        assert_eq!(anon_of_stat("cache 1\n"), None);
    }
}
