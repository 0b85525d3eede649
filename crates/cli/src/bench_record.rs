//! What `hugelab bench` measures: one record per run of the command, and the
//! metrics its tables and plot are made of. The runner fills the records
//! (`bench.rs`), the statistics and reports read them (`bench_stats.rs`,
//! `bench_report.rs`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One setting: its name (the first is the baseline) and its tunables as
/// `(path as written, value)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SettingSpec {
    pub name: String,
    pub tunables: Vec<(String, String)>,
}

/// One run of the command under one setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub setting: String,
    /// 0-based among this setting's runs of the same kind (warm-up or measured).
    pub run: u32,
    /// A warm-up run: recorded, never tabulated.
    pub warmup: bool,
    /// The command's exit status (128 + signal if killed by one).
    pub exit_code: i32,
    /// Wall clock of the run, seconds.
    pub wall_s: f64,
    /// User and system CPU time of the whole process tree (wait4 rusage of
    /// the command, which includes every descendant it waited for), seconds.
    pub user_s: f64,
    pub sys_s: f64,
    /// Peak memory of the run's cgroup (v2 memory.peak, v1
    /// memory.max_usage_in_bytes), kB.
    pub peak_kb: u64,
    /// Minor and major page faults of the process tree.
    pub minflt: u64,
    pub majflt: u64,
    /// Deltas over the run of the system-wide THP counters (`vmstat.thp_*`,
    /// `mthp.<size>.<stat>`), by registry name.
    pub counters: BTreeMap<String, i64>,
    /// Counters that moved by more than the command can explain (another
    /// process was busy): their deltas here are not the command's alone.
    pub noisy: Vec<String>,
}

/// A whole bench: what ran, under which settings, and every run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub command: Vec<String>,
    pub settings: Vec<SettingSpec>,
    pub warmup: u32,
    pub runs_per_setting: u32,
    pub runs: Vec<RunRecord>,
    /// Set when the bench was interrupted (Ctrl-C): the runs so far.
    pub interrupted: bool,
}

/// A tabulated metric: its key, the seed's name for it, its unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metric {
    pub key: &'static str,
    pub title: &'static str,
    pub unit: &'static str,
}

/// The metrics of every bench, in the order of the seed's summary table
/// (real-time, kern-time, user-time, memory) then the faults.
pub const METRICS: [Metric; 6] = [
    Metric {
        key: "real-time",
        title: "real-time",
        unit: "s",
    },
    Metric {
        key: "kern-time",
        title: "kern-time",
        unit: "s",
    },
    Metric {
        key: "user-time",
        title: "user-time",
        unit: "s",
    },
    Metric {
        key: "memory",
        title: "memory (cgroup peak)",
        unit: "kB",
    },
    Metric {
        key: "minflt",
        title: "minor faults",
        unit: "count",
    },
    Metric {
        key: "majflt",
        title: "major faults",
        unit: "count",
    },
];

impl RunRecord {
    /// The value of metric `key` (one of [`METRICS`], or a counter name).
    pub fn metric(&self, key: &str) -> Option<f64> {
        Some(match key {
            "real-time" => self.wall_s,
            "kern-time" => self.sys_s,
            "user-time" => self.user_s,
            "memory" => self.peak_kb as f64,
            "minflt" => self.minflt as f64,
            "majflt" => self.majflt as f64,
            counter => *self.counters.get(counter)? as f64,
        })
    }
}

impl BenchResult {
    /// The measured values of `key` per setting, in setting order.
    pub fn samples(&self, key: &str) -> Vec<(&str, Vec<f64>)> {
        self.settings
            .iter()
            .map(|s| {
                let v = self
                    .runs
                    .iter()
                    .filter(|r| !r.warmup && r.setting == s.name)
                    .filter_map(|r| r.metric(key))
                    .collect();
                (s.name.as_str(), v)
            })
            .collect()
    }
}

/// A measured run for the tests of the report and the plot: exit 0, 4 s of
/// user time, 1 s of system time, 100 MiB peak, 1000 minor faults, no
/// counters; they change what they compare.
#[cfg(test)]
pub(crate) fn test_run(setting: &str, run: u32, wall_s: f64) -> RunRecord {
    RunRecord {
        setting: setting.into(),
        run,
        warmup: false,
        exit_code: 0,
        wall_s,
        user_s: 4.0,
        sys_s: 1.0,
        peak_kb: 102400,
        minflt: 1000,
        majflt: 0,
        counters: Default::default(),
        noisy: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_skip_warmups_and_keep_setting_order() {
        let run = |setting: &str, warmup: bool, wall_s: f64| RunRecord {
            setting: setting.into(),
            run: 0,
            warmup,
            exit_code: 0,
            wall_s,
            user_s: 0.0,
            sys_s: 0.0,
            peak_kb: 0,
            minflt: 0,
            majflt: 0,
            counters: BTreeMap::from([("vmstat.thp_fault_alloc".to_string(), 3)]),
            noisy: Vec::new(),
        };
        let spec = |n: &str| SettingSpec {
            name: n.into(),
            tunables: Vec::new(),
        };
        let b = BenchResult {
            command: vec!["true".into()],
            settings: vec![spec("4K"), spec("64K")],
            warmup: 1,
            runs_per_setting: 2,
            runs: vec![
                run("64K", true, 9.0),
                run("4K", false, 1.0),
                run("64K", false, 2.0),
                run("4K", false, 3.0),
            ],
            interrupted: false,
        };
        assert_eq!(
            b.samples("real-time"),
            [("4K", vec![1.0, 3.0]), ("64K", vec![2.0])]
        );
        assert_eq!(b.runs[1].metric("vmstat.thp_fault_alloc"), Some(3.0));
        assert_eq!(b.runs[1].metric("vmstat.nope"), None);
    }
}
