//! The reports of `hugelab bench`, in the shape of the tables the mTHP
//! series were judged by:
//!
//! - [`metric_tables`]: one mmtests-style table per metric and per THP counter
//!   that moved: rows Amean, Stddev, CoeffVar, Min, Max, a column per setting
//!   (the baseline first), `value (change%)` against the baseline, the change
//!   written `*change%*` when Welch's t-test finds the mean different;
//! - [`summary_table`]: the seed's summary, a row per setting and the change
//!   of the mean of real-time, kern-time, user-time and memory;
//! - [`to_json`]: every run's figures and the statistics behind the tables.
//!
//! A run whose command an OOM kill ended ([`RunRecord::oom_killed`]) counts
//! in `oom-kills` only: its times and memory are those of a run cut short,
//! so every other figure is of the runs that ended normally, and the tables
//! say how many were left out.
//!
//! Changes are signed changes of the value, `100 * (setting - baseline) /
//! |baseline|`, as in the seed's summary table (`-11.9%` kern-time is less
//! kernel time). mmtests flips the sign for smaller-is-better metrics so
//! that `+` is always a gain; here it is not flipped, so that the two tables
//! agree and counters, which are neither better nor worse, read naturally.

use serde_json::{json, Value};

use crate::bench_record::{BenchResult, RunRecord, METRICS, OOM_KILLS};
use crate::bench_stats::{significant, welch, Summary, ALPHA};
use crate::table;

/// A tabulated quantity: one of [`METRICS`] or a THP counter.
struct Quantity {
    key: String,
    title: String,
    unit: &'static str,
    counter: bool,
}

/// [`METRICS`], then the THP counters that any measured run saw move
/// (warm-ups are never tabulated, so a counter that moved only in them
/// would make a table of zeros).
fn quantities(result: &BenchResult) -> Vec<Quantity> {
    let mut out: Vec<Quantity> = METRICS
        .iter()
        .map(|m| Quantity {
            key: m.key.to_string(),
            title: m.title.to_string(),
            unit: m.unit,
            counter: false,
        })
        .collect();
    let mut counters: Vec<&str> = result
        .runs
        .iter()
        .filter(|r| !r.warmup)
        .flat_map(|r| r.counters.iter())
        .filter(|(_, &v)| v != 0)
        .map(|(k, _)| k.as_str())
        .collect();
    counters.sort_by_key(|&c| counter_order(c));
    counters.dedup();
    out.extend(counters.into_iter().map(|c| Quantity {
        key: c.to_string(),
        title: c.to_string(),
        unit: "count",
        counter: true,
    }));
    out
}

/// `vmstat.*` first, then `mthp.<size>kB.*` by size (a string sort would put
/// 1024kB before 16kB), then anything else.
fn counter_order(name: &str) -> (u8, u64, &str) {
    if name.starts_with("vmstat.") {
        return (0, 0, name);
    }
    let mthp = name.strip_prefix("mthp.").and_then(|rest| {
        let (size, stat) = rest.split_once('.')?;
        Some((size.strip_suffix("kB")?.parse().ok()?, stat))
    });
    match mthp {
        Some((kb, stat)) => (1, kb, stat),
        None => (2, 0, name),
    }
}

/// One setting's figures for one quantity.
struct Column<'a> {
    setting: &'a str,
    values: Vec<f64>,
    summary: Option<Summary>,
    /// Differs from the baseline by Welch's test at 95%; false for the
    /// baseline itself.
    significant: bool,
    /// Measured runs of the setting whose record marks the counter noisy.
    noisy: usize,
    /// Measured runs of the setting an OOM kill ended, left out of `values`
    /// (unless the quantity is the OOM kills).
    left_out: usize,
}

fn columns<'a>(result: &'a BenchResult, key: &str) -> Vec<Column<'a>> {
    let samples = result.samples(key);
    let base = samples.first().map(|(_, v)| v.clone()).unwrap_or_default();
    samples
        .into_iter()
        .enumerate()
        .map(|(i, (setting, values))| Column {
            setting,
            summary: Summary::of(&values),
            significant: i > 0 && significant(&values, &base, ALPHA),
            noisy: result
                .runs
                .iter()
                .filter(|r| !r.warmup && r.setting == setting)
                .filter(|r| r.noisy.iter().any(|n| n == key))
                .count(),
            left_out: if key == OOM_KILLS {
                0
            } else {
                oom_killed_runs(result, setting)
            },
            values,
        })
        .collect()
}

/// The measured runs of `setting` that an OOM kill ended.
fn oom_killed_runs(result: &BenchResult, setting: &str) -> usize {
    result
        .runs
        .iter()
        .filter(|r| !r.warmup && r.setting == setting)
        .filter(|r| RunRecord::oom_killed(r))
        .count()
}

/// The line saying which settings' runs an OOM kill ended, left out of the
/// figures; empty when none.
fn left_out_line(cols: &[Column]) -> String {
    let each: Vec<String> = cols
        .iter()
        .filter(|c| c.left_out > 0)
        .map(|c| {
            format!(
                "{} {} of {}",
                c.setting,
                c.left_out,
                c.left_out + c.values.len()
            )
        })
        .collect();
    if each.is_empty() {
        return String::new();
    }
    format!(
        "left out: the runs an OOM kill ended ({}); see oom-kills\n",
        each.join(", ")
    )
}

/// The signed change of `v` against `base`, in %; None when the baseline is
/// 0 and `v` is not (no finite change).
fn change(v: f64, base: f64) -> Option<f64> {
    if base == 0.0 {
        (v == 0.0).then_some(0.0)
    } else {
        Some(100.0 * (v - base) / base.abs())
    }
}

/// Decimals for a table's values: mmtests' 2, and for seconds about 4
/// significant digits of the largest mean, so that a command of 12 ms does
/// not show as 0.01 s. kB and counts are whole numbers: 2 is plenty.
fn decimals(unit: &str, cols: &[Column]) -> usize {
    if unit != "s" {
        return 2;
    }
    let top = cols
        .iter()
        .filter_map(|c| c.summary.map(|s| s.mean.abs()))
        .fold(0.0, f64::max);
    if top > 0.0 && top.is_finite() {
        (3 - top.log10().floor() as i32).clamp(2, 6) as usize
    } else {
        2
    }
}

fn num(v: f64, dec: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.dec$}")
    }
}

/// `value (change%)`, or `value *change%*` when significant: mmtests'
/// cell.
fn with_change(v: f64, base: Option<f64>, sig: bool, dec: usize) -> String {
    let c = match base.and_then(|b| change(v, b)) {
        Some(c) => format!("{c:>7.2}%"),
        None => format!("{:>8}", "n/a"),
    };
    if sig {
        format!("{} *{c}*", num(v, dec))
    } else {
        format!("{} ({c})", num(v, dec))
    }
}

/// The per-setting run counts: `3 runs per setting`, or each when an
/// interrupted bench left them uneven.
fn runs_line(cols: &[Column]) -> String {
    let n: Vec<usize> = cols.iter().map(|c| c.values.len()).collect();
    if n.windows(2).all(|w| w[0] == w[1]) {
        let n = n.first().copied().unwrap_or(0);
        format!("{n} run{} per setting", if n == 1 { "" } else { "s" })
    } else {
        let each: Vec<String> = cols
            .iter()
            .map(|c| format!("{} {}", c.setting, c.values.len()))
            .collect();
        format!("runs: {}", each.join(", "))
    }
}

fn quantity_table(q: &Quantity, cols: &[Column]) -> String {
    let dec = decimals(q.unit, cols);
    let base = cols.first().and_then(|c| c.summary);
    let mut header = vec![q.key.clone()];
    header.extend(cols.iter().map(|c| c.setting.to_string()));
    let rows: Vec<Vec<String>> = ["Amean", "Stddev", "CoeffVar", "Min", "Max"]
        .iter()
        .map(|&row| {
            let mut cells = vec![row.to_string()];
            cells.extend(cols.iter().map(|c| {
                let cell = match c.summary {
                    None => "-".to_string(),
                    Some(s) => match row {
                        "Amean" => with_change(s.mean, base.map(|b| b.mean), c.significant, dec),
                        "Stddev" => num(s.stddev, dec),
                        "CoeffVar" if s.coeff_var.is_nan() => "-".into(),
                        "CoeffVar" => format!("{:.2}%", s.coeff_var),
                        "Min" => with_change(s.min, base.map(|b| b.min), false, dec),
                        _ => with_change(s.max, base.map(|b| b.max), false, dec),
                    },
                };
                if c.noisy > 0 {
                    format!("{cell} ~")
                } else {
                    cell
                }
            }));
            cells
        })
        .collect();
    let mut out = format!("{} [{}], {}\n", q.title, q.unit, runs_line(cols));
    out.push_str(&table::render(&header, &rows));
    out.push_str(
        "cells: value (change vs baseline); *change*: the mean differs from the baseline's \
         (Welch's t-test, two-sided, p < 0.05)\n",
    );
    let cells = rows.iter().flat_map(|r| &r[1..]);
    if cells.clone().any(|c| c.contains("n/a")) {
        out.push_str("n/a: the baseline is 0, a change from it has no percentage\n");
    }
    if cells.clone().any(|c| c.trim_end_matches(" ~") == "-") {
        out.push_str("-: not estimable from fewer than two runs (or a mean of 0)\n");
    }
    let noisy: Vec<String> = cols
        .iter()
        .filter(|c| c.noisy > 0)
        .map(|c| format!("{} in {} of {} runs", c.setting, c.noisy, c.values.len()))
        .collect();
    if !noisy.is_empty() {
        out.push_str(&format!(
            "~: the counter moved more than the command can explain (another process was \
             busy): {}; those deltas are not the command's alone\n",
            noisy.join(", ")
        ));
    }
    out.push_str(&left_out_line(cols));
    out
}

/// A table per metric of [`METRICS`], then per THP counter that moved in a
/// measured run, separated by blank lines.
pub fn metric_tables(result: &BenchResult) -> String {
    let mut parts = Vec::new();
    if result.interrupted {
        parts.push("interrupted: the tables are of the runs completed\n".to_string());
    }
    for q in quantities(result) {
        parts.push(quantity_table(&q, &columns(result, &q.key)));
    }
    parts.join("\n")
}

/// The seed's summary: a row per setting, the change of the mean of
/// real-time, kern-time, user-time and memory against the baseline, `*`
/// when Welch's test finds it significant.
pub fn summary_table(result: &BenchResult) -> String {
    const KEYS: [&str; 4] = ["real-time", "kern-time", "user-time", "memory"];
    let per_key: Vec<Vec<Column>> = KEYS.iter().map(|k| columns(result, k)).collect();
    let mut header = vec!["setting".to_string()];
    header.extend(KEYS.iter().map(|k| k.to_string()));
    let rows: Vec<Vec<String>> = result
        .settings
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut row = vec![s.name.clone()];
            row.extend(per_key.iter().map(|cols| {
                let mean = |c: &Column| c.summary.map(|s| s.mean);
                let c = mean(&cols[0])
                    .zip(mean(&cols[i]))
                    .and_then(|(b, v)| change(v, b));
                match c {
                    // -0.04 would print as -0.0%.
                    Some(c) if format!("{c:.1}") == "-0.0" => "0.0%".to_string(),
                    Some(c) => format!("{c:.1}%{}", if cols[i].significant { "*" } else { "" }),
                    None => "n/a".into(),
                }
            }));
            row
        })
        .collect();
    let n = per_key.first().map_or(String::new(), |c| runs_line(c));
    format!(
        "change of the mean vs {} (smaller is better), {n}\n{}*: the mean differs from the \
         baseline's (Welch's t-test, two-sided, p < 0.05)\n{}",
        result.settings.first().map_or("baseline", |s| &s.name),
        table::render(&header, &rows),
        per_key.first().map_or(String::new(), |c| left_out_line(c))
    )
}

/// The whole result (every run's raw figures) and, per tabulated quantity
/// and setting, its summary, change of the mean, and Welch's test against
/// the baseline. Figures that do not exist (a stddev of one run, a change
/// from 0) are null.
pub fn to_json(result: &BenchResult) -> Value {
    let metrics: Vec<Value> = quantities(result)
        .iter()
        .map(|q| {
            let cols = columns(result, &q.key);
            let base = cols.first().map(|c| (c.values.clone(), c.summary));
            let settings: Vec<Value> = cols
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let (bv, bs) = base.clone().unwrap_or_default();
                    json!({
                        "setting": c.setting,
                        "summary": c.summary,
                        "change_pct": bs.zip(c.summary).and_then(|(b, s)| change(s.mean, b.mean)),
                        "welch_vs_baseline": if i == 0 { None } else { welch(&c.values, &bv) },
                        "significant": c.significant,
                        "noisy_runs": c.noisy,
                        "oom_killed_runs_left_out": c.left_out,
                    })
                })
                .collect();
            json!({
                "key": q.key,
                "title": q.title,
                "unit": q.unit,
                "counter": q.counter,
                "settings": settings,
            })
        })
        .collect();
    let mut out = serde_json::to_value(result).expect("a BenchResult is plain data");
    out["alpha"] = json!(ALPHA);
    out["metrics"] = Value::Array(metrics);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_record::{test_run, RunRecord, SettingSpec};
    use std::collections::BTreeMap;

    /// Three runs of `4K` (the baseline) and three of `64K`: real-time and
    /// the THP counters differ significantly, kern-time and minflt do not,
    /// user-time and majflt are the same constants, memory is a different
    /// constant. The second 64K run has a noisy mTHP counter.
    fn result() -> BenchResult {
        #[allow(clippy::too_many_arguments)]
        fn run(
            setting: &str,
            run: u32,
            wall_s: f64,
            sys_s: f64,
            peak_kb: u64,
            minflt: u64,
            thp: i64,
            mthp: i64,
            noisy: bool,
        ) -> RunRecord {
            RunRecord {
                sys_s,
                peak_kb,
                minflt,
                counters: BTreeMap::from([
                    ("vmstat.thp_fault_alloc".to_string(), thp),
                    ("vmstat.thp_split_page".to_string(), 0),
                    ("mthp.64kB.anon_fault_alloc".to_string(), mthp),
                    ("mthp.2048kB.anon_fault_alloc".to_string(), 1),
                ]),
                noisy: if noisy {
                    vec!["mthp.64kB.anon_fault_alloc".into()]
                } else {
                    vec![]
                },
                ..test_run(setting, run, wall_s)
            }
        }
        let spec = |n: &str| SettingSpec {
            name: n.into(),
            tunables: vec![],
            memory_max: None,
        };
        let mut warm = run("64K", 0, 99.0, 99.0, 1, 1, 0, 0, false);
        warm.warmup = true;
        warm.counters.insert("vmstat.thp_collapse_alloc".into(), 7);
        BenchResult {
            command: vec!["make".into(), "-j8".into()],
            run_as: String::new(),
            settings: vec![spec("4K"), spec("64K")],
            warmup: 1,
            runs_per_setting: 3,
            anon_sample_period_ms: 1.0,
            // Interleaved, as the runner does.
            runs: vec![
                warm,
                run("4K", 0, 10.0, 1.0, 102400, 1000, 0, 100, false),
                run("64K", 0, 8.0, 1.5, 110592, 990, 10, 300, false),
                run("4K", 1, 10.2, 2.0, 102400, 1010, 0, 100, false),
                run("64K", 1, 8.1, 2.5, 110592, 1020, 12, 340, true),
                run("4K", 2, 9.8, 3.0, 102400, 990, 0, 100, false),
                run("64K", 2, 7.9, 3.5, 110592, 1000, 11, 320, false),
            ],
            interrupted: false,
        }
    }

    /// The table under the title line starting with `title`.
    fn table_of<'a>(all: &'a str, title: &str) -> &'a str {
        let start = all
            .find(&format!("\n{title} ["))
            .map(|i| i + 1)
            .or_else(|| all.starts_with(title).then_some(0))
            .unwrap_or_else(|| panic!("no {title} table in\n{all}"));
        let rest = &all[start..];
        &rest[..rest.find("\n\n").map_or(rest.len(), |i| i + 1)]
    }

    use crate::table::row_cells as cells;

    /// The table's cells with a `*`, as (row, column).
    fn starred(table: &str) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        for l in table.lines().filter(|l| l.starts_with('|')) {
            let c: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            for (i, cell) in c.iter().enumerate().skip(1) {
                if cell.contains('*') {
                    out.push((c[0].to_string(), i));
                }
            }
        }
        out
    }

    #[test]
    fn real_time_is_significant() {
        // 4K: 10.0, 10.2, 9.8: mean 10, deviations² 0, .04, .04, variance
        // .08/2 = .04, stddev .2, CoeffVar 2%. 64K: 8.0, 8.1, 7.9: mean 8,
        // variance .02/2 = .01, stddev .1, CoeffVar 1.25%. Change
        // 100 * (8 - 10) / 10 = -20%; Min 7.9 vs 9.8: -19.39%; Max 8.1 vs
        // 10.2: -20.59%.
        // Welch: se² = .04/3 + .01/3 = .0166667, t = -2 / .1290994 =
        // -15.49; df = .0166667² / ((.04/3)²/2 + (.01/3)²/2) = 2.94; p =
        // 0.00065 (scipy ttest_ind(..., equal_var=False)) < 0.05: `*`.
        let all = metric_tables(&result());
        let t = table_of(&all, "real-time");
        assert!(t.starts_with("real-time [s], 3 runs per setting\n"), "{t}");
        assert_eq!(cells(t, "real-time"), ["real-time", "4K", "64K"]);
        assert_eq!(
            cells(t, "Amean"),
            ["Amean", "10.00 (   0.00%)", "8.00 * -20.00%*"]
        );
        assert_eq!(cells(t, "Stddev"), ["Stddev", "0.20", "0.10"]);
        assert_eq!(cells(t, "CoeffVar"), ["CoeffVar", "2.00%", "1.25%"]);
        assert_eq!(
            cells(t, "Min"),
            ["Min", "9.80 (   0.00%)", "7.90 ( -19.39%)"]
        );
        assert_eq!(
            cells(t, "Max"),
            ["Max", "10.20 (   0.00%)", "8.10 ( -20.59%)"]
        );
        assert_eq!(starred(t), [("Amean".to_string(), 2)]);
        assert!(t.contains("*change*: the mean differs from the baseline's"));
    }

    #[test]
    fn kern_time_is_not_significant() {
        // 4K: 1, 2, 3: mean 2, variance 1. 64K: 1.5, 2.5, 3.5: mean 2.5,
        // variance 1. Change +25%. Welch: se² = 2/3, t = .5 / .8165 =
        // .612, df = (2/3)² / (2 * (1/3)²/2) = 4, p = 0.573 (scipy): no `*`.
        let all = metric_tables(&result());
        let t = table_of(&all, "kern-time");
        assert_eq!(
            cells(t, "Amean"),
            ["Amean", "2.000 (   0.00%)", "2.500 (  25.00%)"]
        );
        assert_eq!(cells(t, "CoeffVar"), ["CoeffVar", "50.00%", "40.00%"]);
        assert!(starred(t).is_empty(), "{t}");
        // minflt: 1000, 1010, 990 vs 990, 1020, 1000: +0.33%, t = .316,
        // p = 0.77 (scipy).
        let t = table_of(&all, "minor faults");
        assert_eq!(
            cells(t, "Amean"),
            ["Amean", "1000.00 (   0.00%)", "1003.33 (   0.33%)"]
        );
        assert!(starred(t).is_empty(), "{t}");
    }

    #[test]
    fn constants() {
        let all = metric_tables(&result());
        // Equal constants (user-time 4 s, no major fault): no test, no `*`,
        // no stddev-based figure but 0.
        let t = table_of(&all, "user-time");
        assert_eq!(
            cells(t, "Amean"),
            ["Amean", "4.000 (   0.00%)", "4.000 (   0.00%)"]
        );
        assert!(starred(t).is_empty(), "{t}");
        let t = table_of(&all, "major faults");
        assert_eq!(
            cells(t, "Amean"),
            ["Amean", "0.00 (   0.00%)", "0.00 (   0.00%)"]
        );
        assert_eq!(cells(t, "CoeffVar"), ["CoeffVar", "-", "-"]);
        assert!(t.contains("-: not estimable"), "{t}");
        assert!(starred(t).is_empty(), "{t}");
        // Different constants (memory 102400 vs 110592 kB in every run):
        // significant by `significant`'s rule; 8192/102400 = +8%.
        let t = table_of(&all, "memory (cgroup peak)");
        assert!(t.starts_with("memory (cgroup peak) [kB], 3 runs"), "{t}");
        assert_eq!(
            cells(t, "Amean"),
            ["Amean", "102400.00 (   0.00%)", "110592.00 *   8.00%*"]
        );
        assert_eq!(starred(t), [("Amean".to_string(), 2)]);
    }

    #[test]
    fn counter_tables() {
        let all = metric_tables(&result());
        // Only counters that moved in a measured run, vmstat first, mTHP by
        // size; not thp_split_page (0) nor thp_collapse_alloc (warm-up only).
        let titles: Vec<&str> = all
            .lines()
            .filter(|l| l.contains(" [count], "))
            .map(|l| l.split(" [").next().unwrap())
            .collect();
        assert_eq!(
            titles,
            [
                "minor faults",
                "major faults",
                "oom-kills",
                "vmstat.thp_fault_alloc",
                "mthp.64kB.anon_fault_alloc",
                "mthp.2048kB.anon_fault_alloc",
            ]
        );
        // thp_fault_alloc: 0, 0, 0 vs 10, 12, 11: mean 11, variance 1;
        // t = 11 / sqrt(1/3) = 19.05, df 2, p = 0.0027 (scipy): `*`, but a
        // change from 0 has no percentage.
        let t = table_of(&all, "vmstat.thp_fault_alloc");
        assert_eq!(
            cells(t, "Amean"),
            ["Amean", "0.00 (   0.00%)", "11.00 *     n/a*"]
        );
        assert!(t.contains("n/a: the baseline is 0"), "{t}");
        assert_eq!(starred(t), [("Amean".to_string(), 2)]);
        // mthp.64kB: 100 (constant) vs 300, 340, 320: +220%, the same t and
        // p; the noisy 64K run marks its column.
        let t = table_of(&all, "mthp.64kB.anon_fault_alloc");
        assert_eq!(
            cells(t, "Amean"),
            ["Amean", "100.00 (   0.00%)", "320.00 * 220.00%* ~"]
        );
        assert_eq!(cells(t, "Stddev"), ["Stddev", "0.00", "20.00 ~"]);
        assert_eq!(
            cells(t, "Max"),
            ["Max", "100.00 (   0.00%)", "340.00 ( 240.00%) ~"]
        );
        assert!(t.contains("busy): 64K in 1 of 3 runs;"), "{t}");
        // Not noisy elsewhere.
        assert!(!table_of(&all, "vmstat.thp_fault_alloc").contains('~'));
    }

    #[test]
    fn summary_has_the_seed_shape() {
        let s = summary_table(&result());
        assert!(s.starts_with("change of the mean vs 4K (smaller is better), 3 runs"));
        assert_eq!(
            cells(&s, "setting"),
            ["setting", "real-time", "kern-time", "user-time", "memory"]
        );
        assert_eq!(cells(&s, "4K"), ["4K", "0.0%", "0.0%", "0.0%", "0.0%"]);
        assert_eq!(
            cells(&s, "64K"),
            ["64K", "-20.0%*", "25.0%", "0.0%", "8.0%*"]
        );
        assert!(s.contains("|:--------|----------:|"), "{s}");
    }

    #[test]
    fn json_has_runs_and_statistics() {
        let r = result();
        let j = to_json(&r);
        assert_eq!(j["runs"].as_array().unwrap().len(), 7);
        assert_eq!(j["runs"][2]["wall_s"], 8.0);
        assert_eq!(j["alpha"], 0.05);
        let m = &j["metrics"][0];
        assert_eq!(
            (m["key"].as_str(), m["unit"].as_str()),
            (Some("real-time"), Some("s"))
        );
        let base = &m["settings"][0];
        assert_eq!(base["summary"]["n"], 3);
        assert!(base["welch_vs_baseline"].is_null());
        let s = &m["settings"][1];
        assert_eq!(s["setting"], "64K");
        let close = |v: &Value, want: f64, tol: f64| {
            let x = v.as_f64().unwrap();
            assert!((x - want).abs() < tol, "{x} is not {want}");
        };
        close(&s["summary"]["mean"], 8.0, 1e-12);
        close(&s["change_pct"], -20.0, 1e-9);
        // The real-time figures of real_time_is_significant, from scipy.
        close(&s["welch_vs_baseline"]["t"], -15.491933384829723, 1e-6);
        close(&s["welch_vs_baseline"]["df"], 2.9411764705882346, 1e-6);
        close(&s["welch_vs_baseline"]["p"], 0.0006514534283745284, 1e-6);
        assert_eq!(s["significant"], true);
        // One run's stddev is NaN: null in JSON.
        let mut one = r.clone();
        one.runs.retain(|x| x.warmup || x.run == 0);
        let j1 = to_json(&one);
        assert!(j1["metrics"][0]["settings"][0]["summary"]["stddev"].is_null());
        assert!(j1["metrics"][0]["settings"][1]["welch_vs_baseline"].is_null());
        // Counters follow the metrics.
        assert_eq!(j["metrics"][9]["key"], "vmstat.thp_fault_alloc");
        assert_eq!(j["metrics"][10]["key"], "mthp.64kB.anon_fault_alloc");
        assert_eq!(j["metrics"][10]["settings"][1]["noisy_runs"], 1);
        assert_eq!(j["metrics"][10]["settings"][0]["noisy_runs"], 0);
        assert_eq!(j["metrics"][4]["key"], "anon-peak");
        assert_eq!(j["metrics"][8]["key"], "oom-kills");
    }

    #[test]
    fn uneven_runs_are_said() {
        let mut r = result();
        r.runs.pop();
        r.interrupted = true;
        let all = metric_tables(&r);
        assert!(all.starts_with("interrupted:"), "{all}");
        assert!(all.contains("real-time [s], runs: 4K 3, 64K 2\n"), "{all}");
    }

    #[test]
    fn oom_killed_runs_are_counted_and_left_out() {
        // The 64K setting's second run was OOM-killed (exit 137, 1 kill):
        // 64K's real-time is then of its runs 0 and 2 (8.0, 7.9: mean
        // 7.95), its oom-kills of all three (0, 1, 0: mean 1/3).
        let mut r = result();
        r.runs[4].exit_code = 137;
        r.runs[4].oom_kills = 1;
        let all = metric_tables(&r);
        let t = table_of(&all, "real-time");
        assert!(t.contains("runs: 4K 3, 64K 2\n"), "{t}");
        assert_eq!(cells(t, "Amean")[2], "7.95 * -20.50%*");
        assert!(
            t.contains("left out: the runs an OOM kill ended (64K 1 of 3); see oom-kills\n"),
            "{t}"
        );
        let t = table_of(&all, "oom-kills");
        assert!(
            t.starts_with("oom-kills [count], 3 runs per setting\n"),
            "{t}"
        );
        assert_eq!(
            cells(t, "Max"),
            ["Max", "0.00 (   0.00%)", "1.00 (     n/a)"]
        );
        assert!(!t.contains("left out"), "{t}");
        assert!(summary_table(&r).contains("left out: the runs an OOM kill ended (64K 1 of 3)"));
        let j = to_json(&r);
        assert_eq!(j["runs"][4]["oom_kills"], 1);
        assert_eq!(
            j["metrics"][0]["settings"][1]["oom_killed_runs_left_out"],
            1
        );
        assert_eq!(
            j["metrics"][8]["settings"][1]["oom_killed_runs_left_out"],
            0
        );
        let mean = j["metrics"][8]["settings"][1]["summary"]["mean"]
            .as_f64()
            .unwrap();
        assert!((mean - 1.0 / 3.0).abs() < 1e-12, "{mean}");
    }
}
