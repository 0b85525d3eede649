//! What DAMON does on this machine, read from its sysfs interface
//! (mm/damon/sysfs.c, mm/damon/sysfs-schemes.c, Linux 6.18) and from the
//! DAMON_RECLAIM and DAMON_LRU_SORT modules' parameters
//! (mm/damon/reclaim.c, mm/damon/lru_sort.c): every kdamond, on or off, with
//! its contexts, targets and schemes. `hugelab settings show` prints it, and
//! [`crate::damon`] takes what a kdamond runs from it for the guard.
//!
//! Units, as the kernel keeps them: a scheme's access pattern counts
//! `nr_accesses` in samples per aggregation interval (a region sampled
//! accessed in every sample of an interval has aggr_us / sample_us) and
//! `age` in aggregation intervals; [`Scheme::pattern`] converts both with
//! the context's `monitoring_attrs/intervals`. A scheme's `stats` are what
//! the kdamond last copied out (the kernel refreshes them when `state` is
//! written `update_schemes_stats`, or every `refresh_ms` when that is set);
//! nothing here writes, so they can be behind.
//!
//! Simplifications: core filters, ops filters, quota goals and the
//! destinations of migrate actions are not read (they narrow what a scheme
//! touches; they never widen it). An unreadable file reads as absent (0 or
//! `?`): this is a description, never a reason to stop.

use serde::Serialize;
use std::fs;
use std::path::{Path, PathBuf};

/// Where the DAMON modules keep their parameters.
pub const MODULES: &str = "/sys/module";
/// The DAMON modules that act on their own (not through the admin tree).
const DAMON_MODULES: [&str; 2] = ["damon_reclaim", "damon_lru_sort"];

/// DAMOS actions that act on huge pages or on the folios a huge page is:
/// `pageout` reclaims (and splits) large folios, `hugepage`/`nohugepage`
/// madvise the region, `collapse` collapses it, `cold` deactivates its
/// folios (what khugepaged's referenced check and reclaim read), and
/// `migrate_hot`/`migrate_cold` migrate them (splitting what cannot move
/// whole). `willneed`, `lru_prio`, `lru_deprio` and `stat` are listed but not
/// flagged.
pub const HUGE_ACTIONS: [&str; 7] = [
    "pageout",
    "hugepage",
    "nohugepage",
    "collapse",
    "cold",
    "migrate_hot",
    "migrate_cold",
];

/// One kdamond as `kdamonds/<index>` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Kdamond {
    pub index: u32,
    /// `on` or `off` (or `?` when unreadable).
    pub state: String,
    /// Its thread's pid while on.
    pub pid: Option<i64>,
    pub contexts: Vec<Context>,
}

/// One monitoring context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Context {
    /// `paddr`, `vaddr` or `fvaddr`.
    pub operations: String,
    /// The target processes (vaddr, fvaddr); empty for paddr.
    pub target_pids: Vec<i64>,
    pub sample_us: u64,
    pub aggr_us: u64,
    pub schemes: Vec<Scheme>,
}

/// One DAMOS scheme, in the kernel's units (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Scheme {
    pub index: u32,
    pub action: String,
    /// Whether the action acts on huge pages ([`HUGE_ACTIONS`]).
    pub acts_on_huge_pages: bool,
    pub sz_min: u64,
    pub sz_max: u64,
    pub nr_accesses_min: u64,
    pub nr_accesses_max: u64,
    pub age_min: u64,
    pub age_max: u64,
    pub quota_ms: u64,
    pub quota_bytes: u64,
    pub quota_reset_interval_ms: u64,
    /// `none`, `free_mem_rate`, …; `high`/`mid`/`low` in its unit (permil).
    pub watermark_metric: String,
    pub watermark_high: u64,
    pub watermark_mid: u64,
    pub watermark_low: u64,
    pub nr_tried: u64,
    pub sz_tried: u64,
    pub nr_applied: u64,
    pub sz_applied: u64,
}

/// A DAMON module (DAMON_RECLAIM, DAMON_LRU_SORT) and its parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Module {
    pub name: String,
    pub enabled: bool,
    /// Every parameter file, by name (`min_age`: microseconds).
    pub parameters: Vec<(String, String)>,
}

impl Module {
    /// A parameter's value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.parameters
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Whether an action acts on huge pages.
pub fn acts_on_huge_pages(action: &str) -> bool {
    HUGE_ACTIONS.contains(&action)
}

impl Scheme {
    /// Its access pattern in time: `size 0–max, accessed in 0–1 of 10
    /// samples, idle for 1m0s–max` (nr_accesses per aggregation interval of
    /// `aggr_us / sample_us` samples; age × aggr_us).
    pub fn pattern(&self, ctx: &Context) -> String {
        let samples = ctx.aggr_us.checked_div(ctx.sample_us).unwrap_or(0);
        let size = |b: u64| {
            if b == u64::MAX {
                "max".to_string()
            } else {
                hugelab_workload::Size(b).to_string()
            }
        };
        // The kernel's age is an unsigned int: its largest value is "any".
        let age = |a: u64| {
            if a >= u64::from(u32::MAX) {
                "max".to_string()
            } else {
                duration(a.saturating_mul(ctx.aggr_us))
            }
        };
        format!(
            "size {}–{}, accessed in {}–{} of {samples} samples per {}, unchanged for {}–{}",
            size(self.sz_min),
            size(self.sz_max),
            self.nr_accesses_min,
            self.nr_accesses_max,
            duration(ctx.aggr_us),
            age(self.age_min),
            age(self.age_max),
        )
    }

    /// The shortest time a region must keep its pattern before the scheme
    /// acts on it, microseconds.
    pub fn min_age_us(&self, ctx: &Context) -> u64 {
        self.age_min.saturating_mul(ctx.aggr_us)
    }

    /// `50 ms and 128M per 1 s` (0: no limit).
    pub fn quota(&self) -> String {
        if self.quota_ms == 0 && self.quota_bytes == 0 {
            return "none".to_string();
        }
        let mut parts = Vec::new();
        if self.quota_ms > 0 {
            parts.push(format!("{} ms", self.quota_ms));
        }
        if self.quota_bytes > 0 {
            parts.push(hugelab_workload::Size(self.quota_bytes).to_string());
        }
        format!(
            "{} per {}",
            parts.join(" and "),
            duration(self.quota_reset_interval_ms * 1000)
        )
    }

    /// `none`, or `free_mem_rate high 500 mid 400 low 200 (permil)`.
    pub fn watermarks(&self) -> String {
        if self.watermark_metric == "none" {
            return "none".to_string();
        }
        format!(
            "{} high {} mid {} low {}",
            self.watermark_metric, self.watermark_high, self.watermark_mid, self.watermark_low
        )
    }
}

/// `500 ms`, `5 s`, `1m0s`, `2h0m`.
pub fn duration(us: u64) -> String {
    let s = us / 1_000_000;
    match us {
        0..=999_999 if us.is_multiple_of(1000) => format!("{} ms", us / 1000),
        0..=999_999 => format!("{us} us"),
        _ if s < 60 => format!("{} s", us as f64 / 1e6),
        _ if s < 3600 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, s % 3600 / 60),
    }
}

/// Every kdamond under `admin`, on or off, by index; none without DAMON.
pub fn kdamonds(admin: &Path) -> Vec<Kdamond> {
    numbered(&admin.join("kdamonds"))
        .into_iter()
        .map(|(index, dir)| Kdamond {
            index,
            state: read_word(&dir.join("state")).unwrap_or_else(|| "?".to_string()),
            pid: read_word(&dir.join("pid"))
                .and_then(|p| p.parse().ok())
                .filter(|&p: &i64| p > 0),
            contexts: contexts(&dir),
        })
        .collect()
}

/// A kdamond's contexts.
pub fn contexts(kdamond: &Path) -> Vec<Context> {
    numbered(&kdamond.join("contexts"))
        .into_iter()
        .map(|(_, ctx)| {
            let intervals = ctx.join("monitoring_attrs/intervals");
            let target_pids = numbered(&ctx.join("targets"))
                .into_iter()
                .filter_map(|(_, t)| read_word(&t.join("pid_target"))?.parse().ok())
                .collect();
            let operations = read_word(&ctx.join("operations")).unwrap_or_else(|| "?".into());
            Context {
                target_pids: if operations == "paddr" {
                    Vec::new()
                } else {
                    target_pids
                },
                operations,
                sample_us: number(&intervals.join("sample_us")),
                aggr_us: number(&intervals.join("aggr_us")),
                schemes: numbered(&ctx.join("schemes"))
                    .into_iter()
                    .map(|(index, s)| scheme(index, &s))
                    .collect(),
            }
        })
        .collect()
}

fn scheme(index: u32, dir: &Path) -> Scheme {
    let n = |rel: &str| number(&dir.join(rel));
    let action = read_word(&dir.join("action")).unwrap_or_else(|| "?".into());
    Scheme {
        index,
        acts_on_huge_pages: acts_on_huge_pages(&action),
        action,
        sz_min: n("access_pattern/sz/min"),
        sz_max: n("access_pattern/sz/max"),
        nr_accesses_min: n("access_pattern/nr_accesses/min"),
        nr_accesses_max: n("access_pattern/nr_accesses/max"),
        age_min: n("access_pattern/age/min"),
        age_max: n("access_pattern/age/max"),
        quota_ms: n("quotas/ms"),
        quota_bytes: n("quotas/bytes"),
        quota_reset_interval_ms: n("quotas/reset_interval_ms"),
        watermark_metric: read_word(&dir.join("watermarks/metric")).unwrap_or_else(|| "?".into()),
        watermark_high: n("watermarks/high"),
        watermark_mid: n("watermarks/mid"),
        watermark_low: n("watermarks/low"),
        nr_tried: n("stats/nr_tried"),
        sz_tried: n("stats/sz_tried"),
        nr_applied: n("stats/nr_applied"),
        sz_applied: n("stats/sz_applied"),
    }
}

/// DAMON_RECLAIM and DAMON_LRU_SORT under `modules` (/sys/module), those
/// the kernel has.
pub fn modules(modules: &Path) -> Vec<Module> {
    DAMON_MODULES
        .iter()
        .filter_map(|name| {
            let dir = modules.join(name).join("parameters");
            let mut parameters: Vec<(String, String)> = fs::read_dir(&dir)
                .ok()?
                .flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_str()?.to_string();
                    Some((n, read_word(&e.path()).unwrap_or_else(|| "?".into())))
                })
                .collect();
            parameters.sort();
            let enabled = parameters
                .iter()
                .any(|(n, v)| n == "enabled" && (v == "Y" || v == "1"));
            Some(Module {
                name: name.to_string(),
                enabled,
                parameters,
            })
        })
        .collect()
}

/// The one stderr line of a kernel run's start about DAMON (None: nothing
/// to say): the enabled DAMON modules, which nothing pauses and which can
/// act on the agents once their memory has been idle for `min_age`. The
/// kdamonds the guard turned off for the run cannot act on it, so they are
/// not mentioned here: `--dry-run` lists them and `settings show` says a
/// run paused them.
pub fn run_note(modules: &[Module]) -> Option<String> {
    let mut parts = Vec::new();
    for m in modules.iter().filter(|m| m.enabled) {
        let age = m
            .get("min_age")
            .and_then(|a| a.parse().ok())
            .map_or("?".to_string(), duration);
        parts.push(format!(
            "{} is enabled and not paused: it can act on the agents' memory once unchanged for {age}",
            m.name.to_uppercase()
        ));
    }
    if parts.is_empty() {
        None
    } else {
        Some(format!("note: {}", parts.join("; ")))
    }
}

/// Prints [`run_note`] to stderr, once per process (a `diff` of many
/// workloads says it once).
pub fn note_run_start() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        if let Some(line) = run_note(&modules(Path::new(MODULES))) {
            // A closed stderr must not stop the run.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{line}");
        }
    });
}

/// The numbered subdirectories of `dir`, ascending; none when it is missing.
pub(crate) fn numbered(dir: &Path) -> Vec<(u32, PathBuf)> {
    let mut out: Vec<(u32, PathBuf)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    out.sort();
    out
}

pub(crate) fn read_word(file: &Path) -> Option<String> {
    fs::read_to_string(file).ok().map(|s| s.trim().to_string())
}

fn number(file: &Path) -> u64 {
    read_word(file).and_then(|s| s.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    /// A fake admin tree laid out like this VM's kdamond 0 (paddr pageout,
    /// regions idle 12 aggregation intervals of 5 s, 128 MiB per second),
    /// and an off vaddr kdamond with a `stat` and a `hugepage` scheme.
    fn fake(root: &Path) {
        let k = root.join("kdamonds");
        put(&k.join("nr_kdamonds"), "2\n");
        put(&k.join("0/state"), "on\n");
        put(&k.join("0/pid"), "812\n");
        let c = k.join("0/contexts/0");
        put(&c.join("operations"), "paddr\n");
        put(&c.join("targets/0/pid_target"), "0\n");
        put(&c.join("monitoring_attrs/intervals/sample_us"), "500000\n");
        put(&c.join("monitoring_attrs/intervals/aggr_us"), "5000000\n");
        let s = c.join("schemes/0");
        put(&s.join("action"), "pageout\n");
        put(&s.join("access_pattern/sz/min"), "0\n");
        put(&s.join("access_pattern/sz/max"), &format!("{}\n", u64::MAX));
        put(&s.join("access_pattern/nr_accesses/min"), "0\n");
        put(&s.join("access_pattern/nr_accesses/max"), "1\n");
        put(&s.join("access_pattern/age/min"), "12\n");
        put(&s.join("access_pattern/age/max"), "4294967295\n");
        put(&s.join("quotas/ms"), "50\n");
        put(&s.join("quotas/bytes"), "134217728\n");
        put(&s.join("quotas/reset_interval_ms"), "1000\n");
        put(&s.join("watermarks/metric"), "none\n");
        put(&s.join("stats/nr_tried"), "253\n");
        put(&s.join("stats/sz_applied"), "507772928\n");
        put(&k.join("1/state"), "off\n");
        put(&k.join("1/pid"), "-1\n");
        let c = k.join("1/contexts/0");
        put(&c.join("operations"), "vaddr\n");
        put(&c.join("targets/0/pid_target"), "4242\n");
        put(&c.join("monitoring_attrs/intervals/sample_us"), "5000\n");
        put(&c.join("monitoring_attrs/intervals/aggr_us"), "100000\n");
        put(&c.join("schemes/0/action"), "stat\n");
        put(&c.join("schemes/1/action"), "hugepage\n");
        put(&c.join("schemes/1/access_pattern/age/min"), "3\n");
        put(&c.join("schemes/1/watermarks/metric"), "free_mem_rate\n");
        put(&c.join("schemes/1/watermarks/high"), "500\n");
        put(&c.join("schemes/1/watermarks/mid"), "400\n");
        put(&c.join("schemes/1/watermarks/low"), "200\n");
    }

    #[test]
    fn every_kdamond_its_schemes_and_their_units() {
        let root = std::env::temp_dir().join(format!("hugelab-damon-view-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fake(&root);
        let ks = kdamonds(&root);
        assert_eq!(ks.len(), 2);
        let (k0, k1) = (&ks[0], &ks[1]);
        assert_eq!((k0.state.as_str(), k0.pid), ("on", Some(812)));
        assert_eq!((k1.state.as_str(), k1.pid), ("off", None));
        let c = &k0.contexts[0];
        assert_eq!(c.operations, "paddr");
        assert!(c.target_pids.is_empty(), "paddr has no target process");
        let s = &c.schemes[0];
        assert!(s.acts_on_huge_pages);
        // 12 aggregation intervals of 5 s; 5 s / 0.5 s = 10 samples each.
        assert_eq!(s.min_age_us(c), 60_000_000);
        assert_eq!(
            s.pattern(c),
            "size 0–max, accessed in 0–1 of 10 samples per 5 s, unchanged for 1m0s–max"
        );
        assert_eq!(s.quota(), "50 ms and 128M per 1 s");
        assert_eq!(s.watermarks(), "none");
        assert_eq!((s.nr_tried, s.sz_applied), (253, 507772928));
        let c1 = &k1.contexts[0];
        assert_eq!(c1.target_pids, vec![4242]);
        let actions: Vec<(&str, bool)> = c1
            .schemes
            .iter()
            .map(|s| (s.action.as_str(), s.acts_on_huge_pages))
            .collect();
        assert_eq!(actions, vec![("stat", false), ("hugepage", true)]);
        assert_eq!(
            c1.schemes[1].watermarks(),
            "free_mem_rate high 500 mid 400 low 200"
        );
        // The guard's view of the same tree: only kdamond 0 runs.
        let running = crate::damon::running(&root).unwrap();
        assert_eq!(running.len(), 1);
        assert_eq!(running[0].describe(), "kdamond 0 (paddr: pageout)");

        // A kdamond the run pauses cannot act on it: no line for it.
        assert_eq!(run_note(&[]), None);

        // DAMON_RECLAIM: listed when present, in the line when enabled.
        let m = root.join("module");
        put(&m.join("damon_reclaim/parameters/enabled"), "Y\n");
        put(&m.join("damon_reclaim/parameters/min_age"), "120000000\n");
        put(&m.join("damon_lru_sort/parameters/enabled"), "N\n");
        let mods = modules(&m);
        assert_eq!(mods.len(), 2);
        assert!(mods[0].enabled && !mods[1].enabled);
        assert_eq!(mods[0].get("min_age"), Some("120000000"));
        let note = run_note(&mods).unwrap();
        assert_eq!(
            note,
            "note: DAMON_RECLAIM is enabled and not paused: it can act on the agents' memory once unchanged for 2m0s"
        );
        assert!(modules(&root.join("none")).is_empty());
        assert!(kdamonds(&root.join("none")).is_empty());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn durations() {
        assert_eq!(duration(500_000), "500 ms");
        assert_eq!(duration(5_000_000), "5 s");
        assert_eq!(duration(2_500_000), "2.5 s");
        assert_eq!(duration(60_000_000), "1m0s");
        assert_eq!(duration(7_260_000_000), "2h1m");
        assert_eq!(duration(1500), "1500 us");
    }
}
