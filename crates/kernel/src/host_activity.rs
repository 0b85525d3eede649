//! What else on this machine acts on huge pages, as `hugelab settings show`
//! lists it: DAMON ([`crate::damon_view`]), khugepaged's activity since boot
//! (mm/khugepaged.c, Linux 6.18: `khugepaged/full_scans`,
//! `pages_collapsed`, and /proc/vmstat's `thp_collapse_alloc`) and the
//! memory cgroups that have a limit (mm/memcontrol.c; v1
//! `memory.limit_in_bytes` below the unlimited value, v2 `memory.max` other
//! than `max`).
//!
//! khugepaged's figures are counts since boot, and their rate is per hour
//! of uptime (/proc/uptime): nothing is sampled, so `settings show` returns
//! at once; a machine whose collapses come in bursts shows their average.
//!
//! Detected, never assumed: without DAMON's sysfs interface, khugepaged's
//! directory or a memory cgroup hierarchy, the part says so.

use crate::damon_view::{self, Kdamond, Module};
use crate::memcg::{self, Version};
use crate::meminit::Uninitialised;
use serde::Serialize;
use std::fs;
use std::path::{Path, PathBuf};

/// khugepaged's sysfs directory.
pub const KHUGEPAGED: &str = "/sys/kernel/mm/transparent_hugepage/khugepaged";
/// v1's "no limit": PAGE_COUNTER_MAX pages, rounded down to a page
/// (mem_cgroup_read_u64 of a page_counter's max), or more.
const V1_UNLIMITED: u64 = 0x7FFF_FFFF_FFFF_F000;

/// Everything `settings show` lists after the tunables.
#[derive(Clone, Debug, Serialize)]
pub struct Activity {
    /// None: the kernel has no DAMON sysfs interface.
    pub damon: Option<Vec<Kdamond>>,
    /// The kdamonds a hugelab run has turned off (in the restore journal
    /// of the default state directory), and that run's pid.
    pub damon_paused_by_run: Vec<(u32, i64)>,
    pub damon_modules: Vec<Module>,
    /// None: no khugepaged directory (no THP).
    pub khugepaged: Option<Khugepaged>,
    /// None: no memory cgroup hierarchy is mounted.
    pub cgroups: Option<Cgroups>,
    /// Memory the kernel has not initialised yet ([`crate::meminit`]);
    /// None: /proc/kpageflags or the memory blocks cannot be read (not
    /// root).
    pub uninitialised: Option<Uninitialised>,
}

/// khugepaged since boot.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Khugepaged {
    pub pages_to_scan: u64,
    pub scan_sleep_millisecs: u64,
    pub full_scans: u64,
    pub pages_collapsed: u64,
    /// /proc/vmstat `thp_collapse_alloc`.
    pub thp_collapse_alloc: u64,
    pub uptime_s: f64,
}

impl Khugepaged {
    /// A count since boot per hour of uptime.
    pub fn per_hour(&self, n: u64) -> f64 {
        if self.uptime_s > 0.0 {
            n as f64 * 3600.0 / self.uptime_s
        } else {
            0.0
        }
    }
}

/// The memory cgroup hierarchy and its limited groups.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cgroups {
    pub root: PathBuf,
    /// `v1` or `v2`.
    pub version: String,
    pub limited: Vec<Limited>,
}

/// A memory cgroup with a limit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Limited {
    /// Its path under the hierarchy's root (`/user.slice/x`).
    pub path: String,
    pub limit_bytes: u64,
    pub usage_bytes: u64,
    /// The THP-relevant per-group settings the kernel has: v1
    /// `memory.swappiness` and `memory.use_hierarchy`; v2 `memory.high`
    /// and `memory.swap.max`.
    pub settings: Vec<(String, String)>,
}

/// This machine's activity now.
pub fn read() -> Activity {
    let admin = Path::new(crate::damon::ADMIN);
    Activity {
        damon: admin.is_dir().then(|| damon_view::kdamonds(admin)),
        damon_paused_by_run: paused_by_run(&crate::guard::journal_path()),
        damon_modules: damon_view::modules(Path::new(damon_view::MODULES)),
        khugepaged: khugepaged(Path::new(KHUGEPAGED)),
        cgroups: memcg::hierarchy().map(|(root, v)| cgroups(&root, v)),
        uninitialised: crate::meminit::uninitialised().ok(),
    }
}

/// The kdamonds whose `state` the journal at `journal` holds (a run turned
/// them off), with the run's pid; none without a readable journal.
pub fn paused_by_run(journal: &Path) -> Vec<(u32, i64)> {
    let Some(j) = fs::read_to_string(journal)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
    else {
        return Vec::new();
    };
    let pid = j["pid"].as_i64().unwrap_or(0);
    j["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let path = Path::new(e["path"].as_str()?);
            if !crate::damon::is_state_file(path) {
                return None;
            }
            let index = path.parent()?.file_name()?.to_str()?.parse().ok()?;
            Some((index, pid))
        })
        .collect()
}

fn khugepaged(dir: &Path) -> Option<Khugepaged> {
    if !dir.is_dir() {
        return None;
    }
    let n = |f: &str| {
        fs::read_to_string(dir.join(f))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let vmstat = fs::read_to_string("/proc/vmstat").unwrap_or_default();
    let thp_collapse_alloc = vmstat
        .lines()
        .find_map(|l| l.strip_prefix("thp_collapse_alloc "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let uptime_s = fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    Some(Khugepaged {
        pages_to_scan: n("pages_to_scan"),
        scan_sleep_millisecs: n("scan_sleep_millisecs"),
        full_scans: n("full_scans"),
        pages_collapsed: n("pages_collapsed"),
        thp_collapse_alloc,
        uptime_s,
    })
}

/// The groups under `root` (the root itself has no limit to list) with a
/// limit, depth first in name order.
pub fn cgroups(root: &Path, version: Version) -> Cgroups {
    let mut limited = Vec::new();
    walk(root, root, version, &mut limited);
    Cgroups {
        root: root.to_path_buf(),
        version: match version {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
        .to_string(),
        limited,
    }
}

fn walk(root: &Path, dir: &Path, version: Version, out: &mut Vec<Limited>) {
    let mut subdirs: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    subdirs.sort();
    for sub in subdirs {
        if let Some(group) = limited(root, &sub, version) {
            out.push(group);
        }
        walk(root, &sub, version, out);
    }
}

fn limited(root: &Path, dir: &Path, version: Version) -> Option<Limited> {
    let word = |f: &str| damon_view::read_word(&dir.join(f));
    let (limit, usage, names): (&str, &str, [&str; 2]) = match version {
        Version::V1 => (
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            ["memory.swappiness", "memory.use_hierarchy"],
        ),
        Version::V2 => (
            "memory.max",
            "memory.current",
            ["memory.high", "memory.swap.max"],
        ),
    };
    let limit_bytes: u64 = word(limit)?.parse().ok()?;
    if version == Version::V1 && limit_bytes >= V1_UNLIMITED {
        return None;
    }
    Some(Limited {
        path: format!("/{}", dir.strip_prefix(root).ok()?.display()),
        limit_bytes,
        usage_bytes: word(usage).and_then(|u| u.parse().ok()).unwrap_or(0),
        settings: names
            .iter()
            .filter_map(|n| Some((n.to_string(), word(n)?)))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn only_limited_groups_are_listed() {
        let root = std::env::temp_dir().join(format!("hugelab-host-cg-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let unlimited = "9223372036854771712\n";
        put(&root.join("memory.limit_in_bytes"), unlimited);
        put(&root.join("a/memory.limit_in_bytes"), unlimited);
        put(&root.join("a/b/memory.limit_in_bytes"), "1073741824\n");
        put(&root.join("a/b/memory.usage_in_bytes"), "4096\n");
        put(&root.join("a/b/memory.swappiness"), "60\n");
        put(&root.join("a/b/memory.use_hierarchy"), "1\n");
        put(&root.join("c/memory.limit_in_bytes"), unlimited);
        let found = cgroups(&root, Version::V1);
        assert_eq!(found.version, "v1");
        assert_eq!(
            found.limited,
            vec![Limited {
                path: "/a/b".into(),
                limit_bytes: 1 << 30,
                usage_bytes: 4096,
                settings: vec![
                    ("memory.swappiness".into(), "60".into()),
                    ("memory.use_hierarchy".into(), "1".into())
                ],
            }]
        );
        // v2: `max` is no limit.
        put(&root.join("v2/x/memory.max"), "max\n");
        put(&root.join("v2/y/memory.max"), "2097152\n");
        put(&root.join("v2/y/memory.current"), "8192\n");
        let v2 = cgroups(&root.join("v2"), Version::V2);
        assert_eq!(v2.limited.len(), 1);
        assert_eq!(
            (v2.limited[0].path.as_str(), v2.limited[0].limit_bytes),
            ("/y", 2 << 20)
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn kdamonds_a_run_paused_are_read_from_its_journal() {
        let j = std::env::temp_dir().join(format!("hugelab-host-j-{}.json", std::process::id()));
        fs::write(
            &j,
            r#"{"pid": 1964, "entries": [
              {"path": "/sys/kernel/mm/damon/admin/kdamonds/0/state", "old": "on"},
              {"path": "/sys/kernel/mm/transparent_hugepage/enabled", "old": "madvise"}]}"#,
        )
        .unwrap();
        assert_eq!(paused_by_run(&j), vec![(0, 1964)]);
        fs::remove_file(&j).unwrap();
        assert!(paused_by_run(&j).is_empty());
    }

    #[test]
    fn khugepaged_rates_are_per_hour_of_uptime() {
        let k = Khugepaged {
            pages_to_scan: 4096,
            scan_sleep_millisecs: 10000,
            full_scans: 10,
            pages_collapsed: 30,
            thp_collapse_alloc: 30,
            uptime_s: 7200.0,
        };
        assert_eq!(k.per_hour(k.pages_collapsed), 15.0);
        assert!(khugepaged(Path::new("/nonexistent")).is_none());
    }
}
