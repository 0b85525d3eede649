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
    /// The memory limit of each run's cgroup (`memory.max=`), bytes.
    #[serde(default)]
    pub memory_max: Option<u64>,
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
    /// Minor and major page faults of the process tree (minor: less
    /// `pre_exec_minflt`, the command's own as a recording counts them).
    pub minflt: u64,
    pub majflt: u64,
    /// Minor faults hugelab's child took between its fork and the exec of
    /// the command (in the tree's rusage, not the command's).
    #[serde(default)]
    pub pre_exec_minflt: u64,
    /// OOM kills in the run's cgroup (v2 memory.events, v1
    /// memory.oom_control: `oom_kill`).
    #[serde(default)]
    pub oom_kills: u64,
    /// Peak anonymous memory of the run's cgroup (v2 memory.stat `anon`, v1
    /// `rss`, THPs included) and of its THPs (`anon_thp`, `rss_huge`), kB,
    /// the largest of `anon_samples` samples; one sample took
    /// `anon_sample_us` microseconds on average.
    #[serde(default)]
    pub anon_peak_kb: u64,
    #[serde(default)]
    pub anon_thp_peak_kb: u64,
    #[serde(default)]
    pub anon_samples: u64,
    #[serde(default)]
    pub anon_sample_us: f64,
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
    /// Who the command ran as (`user nobody (uid 65534, gid 65534)`, `root
    /// (--as-root)`); empty in a bench saved before hugelab said.
    #[serde(default)]
    pub run_as: String,
    pub settings: Vec<SettingSpec>,
    pub warmup: u32,
    pub runs_per_setting: u32,
    /// The period of the anonymous memory samples, ms.
    #[serde(default)]
    pub anon_sample_period_ms: f64,
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
/// (real-time, kern-time, user-time, memory), then the peaks of anonymous
/// memory, the faults and the OOM kills.
pub const METRICS: [Metric; 9] = [
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
        key: "anon-peak",
        title: "anon-peak (cgroup anon, sampled)",
        unit: "kB",
    },
    Metric {
        key: "anon-thp-peak",
        title: "anon-thp-peak (cgroup anon THPs, sampled)",
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
    Metric {
        key: OOM_KILLS,
        title: "oom-kills",
        unit: "count",
    },
];

/// The one metric whose figures come from every measured run, the
/// OOM-killed ones included: every other metric's are of the runs that
/// ended normally ([`RunRecord::oom_killed`]).
pub const OOM_KILLS: &str = "oom-kills";

impl RunRecord {
    /// The command ended non-zero (killed, or a parent whose child was
    /// killed gave up) after an OOM kill in its group: an outcome of the
    /// setting, whose times and memory are those of a run cut short.
    pub fn oom_killed(&self) -> bool {
        self.exit_code != 0 && self.oom_kills > 0
    }

    /// The value of metric `key` (one of [`METRICS`], or a counter name).
    pub fn metric(&self, key: &str) -> Option<f64> {
        Some(match key {
            "real-time" => self.wall_s,
            "kern-time" => self.sys_s,
            "user-time" => self.user_s,
            "memory" => self.peak_kb as f64,
            "minflt" => self.minflt as f64,
            "majflt" => self.majflt as f64,
            "anon-peak" => self.anon_peak_kb as f64,
            "anon-thp-peak" => self.anon_thp_peak_kb as f64,
            OOM_KILLS => self.oom_kills as f64,
            counter => *self.counters.get(counter)? as f64,
        })
    }
}

impl BenchResult {
    /// The measured values of `key` per setting, in setting order: of the
    /// runs that ended normally, or of every run for [`OOM_KILLS`].
    pub fn samples(&self, key: &str) -> Vec<(&str, Vec<f64>)> {
        self.settings
            .iter()
            .map(|s| {
                let v = self
                    .runs
                    .iter()
                    .filter(|r| !r.warmup && r.setting == s.name)
                    .filter(|r| key == OOM_KILLS || !r.oom_killed())
                    .filter_map(|r| r.metric(key))
                    .collect();
                (s.name.as_str(), v)
            })
            .collect()
    }
}

/// A measured run for the tests of the report and the plot: exit 0, 4 s of
/// user time, 1 s of system time, 100 MiB peak, 64 MiB of it anonymous (32
/// MiB in THPs), 1000 minor faults, no OOM kill, no counters; they change
/// what they compare.
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
        pre_exec_minflt: 0,
        oom_kills: 0,
        anon_peak_kb: 65536,
        anon_thp_peak_kb: 32768,
        anon_samples: 100,
        anon_sample_us: 20.0,
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
            pre_exec_minflt: 0,
            oom_kills: 0,
            anon_peak_kb: 0,
            anon_thp_peak_kb: 0,
            anon_samples: 0,
            anon_sample_us: 0.0,
            counters: BTreeMap::from([("vmstat.thp_fault_alloc".to_string(), 3)]),
            noisy: Vec::new(),
        };
        let spec = |n: &str| SettingSpec {
            name: n.into(),
            tunables: Vec::new(),
            memory_max: None,
        };
        let b = BenchResult {
            command: vec!["true".into()],
            run_as: String::new(),
            settings: vec![spec("4K"), spec("64K")],
            warmup: 1,
            runs_per_setting: 2,
            anon_sample_period_ms: 1.0,
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

    #[test]
    fn oom_killed_runs_count_only_as_oom_kills() {
        let spec = |n: &str| SettingSpec {
            name: n.into(),
            tunables: Vec::new(),
            memory_max: Some(20 << 20),
        };
        let killed = RunRecord {
            exit_code: 137,
            oom_kills: 1,
            ..test_run("LIM", 1, 0.5)
        };
        // An OOM kill the command survived (exit 0) is a normal run; a
        // non-zero exit without one is not an OOM outcome.
        let survived = RunRecord {
            oom_kills: 2,
            ..test_run("LIM", 2, 3.0)
        };
        let failed = RunRecord {
            exit_code: 1,
            ..test_run("LIM", 3, 4.0)
        };
        assert!(killed.oom_killed());
        assert!(!survived.oom_killed() && !failed.oom_killed());
        let b = BenchResult {
            command: vec!["true".into()],
            run_as: String::new(),
            settings: vec![spec("4K"), spec("LIM")],
            warmup: 0,
            runs_per_setting: 4,
            anon_sample_period_ms: 1.0,
            runs: vec![
                test_run("4K", 0, 1.0),
                test_run("LIM", 0, 2.0),
                killed,
                survived,
                failed,
            ],
            interrupted: false,
        };
        assert_eq!(
            b.samples("real-time"),
            [("4K", vec![1.0]), ("LIM", vec![2.0, 3.0, 4.0])]
        );
        assert_eq!(
            b.samples(OOM_KILLS),
            [("4K", vec![0.0]), ("LIM", vec![0.0, 1.0, 2.0, 0.0])]
        );
        assert_eq!(b.samples("anon-peak")[0], ("4K", vec![65536.0]));
        assert_eq!(b.samples("anon-thp-peak")[0], ("4K", vec![32768.0]));
    }

    /// A bench saved by an earlier hugelab (no limits, OOM kills nor anon
    /// peaks) still reads, for `--from`.
    #[test]
    fn a_bench_saved_before_the_memory_figures_reads() {
        let old = r#"{"command":["true"],"settings":[{"name":"4K","tunables":[]}],
            "warmup":0,"runs_per_setting":1,"interrupted":false,
            "runs":[{"setting":"4K","run":0,"warmup":false,"exit_code":0,"wall_s":1.0,
            "user_s":0.5,"sys_s":0.1,"peak_kb":100,"minflt":10,"majflt":0,
            "counters":{},"noisy":[]}]}"#;
        let b: BenchResult = serde_json::from_str(old).unwrap();
        assert_eq!(b.settings[0].memory_max, None);
        assert_eq!((b.runs[0].oom_kills, b.runs[0].anon_peak_kb), (0, 0));
        assert_eq!(b.samples(OOM_KILLS), [("4K", vec![0.0])]);
    }
}
