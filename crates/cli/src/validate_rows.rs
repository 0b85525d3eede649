//! `hugelab validate`'s comparison: each figure `predict` gives beside what
//! `bench` measured for it, run by run, with the error and whether the
//! prediction meets the goal (docs/predict.md): within ±5 % of the measured
//! mean, or inside the measured min–max, whichever is wider.

use crate::bench_record::{BenchResult, OOM_KILLS};
use crate::bench_stats::Summary;
use crate::predict_report::{PerSize, Prediction, Spread};
use crate::table;
use hugelab_compare::setting::per_kb;
use serde::Serialize;
use std::collections::BTreeSet;

/// How far from the measured mean a prediction may be, as a fraction.
pub const GOAL_FRACTION: f64 = 0.05;

/// One figure of one setting: predicted and measured.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub setting: String,
    pub figure: String,
    pub unit: &'static str,
    /// The prediction: over several address layouts (`--layouts`), their
    /// mean.
    pub predicted: f64,
    /// Over several address layouts: the least and most predicted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_range: Option<(i64, i64)>,
    /// The measured runs' statistics (the runs an OOM kill ended left out,
    /// but for the OOM kills themselves); None when no run measured it.
    pub measured: Option<Summary>,
    /// 100 * (predicted - mean) / mean; None when the mean is 0.
    pub error_pct: Option<f64>,
    /// The goal met; None when nothing was measured.
    pub within_goal: Option<bool>,
    /// A measured run's delta of this system-wide counter was more than
    /// the command explains (another process was busy).
    pub noisy: bool,
}

/// What each figure is called, its bench metric or counter, and its
/// predicted value.
struct Figure {
    name: String,
    unit: &'static str,
    key: String,
    predicted: f64,
    /// Over the address layouts, when there were several.
    spread: Option<Spread>,
}

/// The figures compared for one setting: page faults, peak anonymous memory
/// (the cgroup's, as bench samples it), AnonHugePages, OOM kills,
/// khugepaged's collapses and the fallbacks of every size either side saw.
fn figures(p: &Prediction, bench: &BenchResult) -> Vec<Figure> {
    let f = &p.figures;
    let mut out = vec![
        Figure {
            name: "page faults".into(),
            unit: "count",
            key: "minflt".into(),
            predicted: f.page_faults as f64,
            spread: p.layouts.as_ref().map(|l| l.page_faults),
        },
        Figure {
            name: "peak anon (cgroup)".into(),
            unit: "kB",
            key: "anon-peak".into(),
            predicted: f.peak_charged.anon_kb as f64,
            spread: p.layouts.as_ref().map(|l| l.cgroup_anon_kb),
        },
        Figure {
            name: "AnonHugePages at peak".into(),
            unit: "kB",
            key: "anon-thp-peak".into(),
            predicted: f.peak_mapped.anon_huge_kb as f64,
            spread: p.layouts.as_ref().map(|l| l.anon_huge_kb),
        },
        Figure {
            name: "OOM kills".into(),
            unit: "count",
            key: OOM_KILLS.into(),
            predicted: f.oom_kills as f64,
            spread: None,
        },
        Figure {
            name: "khugepaged collapses".into(),
            unit: "count",
            key: "vmstat.thp_collapse_alloc".into(),
            predicted: f.collapses as f64,
            spread: None,
        },
    ];
    for size in fallback_sizes(&f.fallbacks, bench, &p.setting) {
        let predicted = f
            .fallbacks
            .iter()
            .find(|s| s.size == size)
            .map_or(0.0, |s| s.value as f64);
        out.push(Figure {
            name: format!("fallbacks {size}"),
            unit: "count",
            key: fallback_key(&size),
            predicted,
            spread: None,
        });
    }
    out
}

fn fallback_key(size: &str) -> String {
    format!("mthp.{size}.anon_fault_fallback")
}

/// The sizes that fell back in the prediction or in a measured run of
/// `setting`, smallest first.
fn fallback_sizes(predicted: &[PerSize], bench: &BenchResult, setting: &str) -> Vec<String> {
    let mut sizes: BTreeSet<(u64, String)> = predicted
        .iter()
        .map(|s| (per_kb(&s.size), s.size.clone()))
        .collect();
    for run in bench.runs.iter().filter(|r| r.setting == setting) {
        for (name, v) in &run.counters {
            let size = name
                .strip_prefix("mthp.")
                .and_then(|rest| rest.strip_suffix(".anon_fault_fallback"));
            if let (Some(size), true) = (size, *v != 0) {
                sizes.insert((per_kb(size), size.to_string()));
            }
        }
    }
    sizes.into_iter().map(|(_, s)| s).collect()
}

/// Every figure of every setting, predicted beside measured.
pub fn rows(predictions: &[Prediction], bench: &BenchResult) -> Vec<Row> {
    let mut rows = Vec::new();
    for p in predictions {
        for fig in figures(p, bench) {
            let samples = bench
                .samples(&fig.key)
                .into_iter()
                .find(|(name, _)| *name == p.setting)
                .map(|(_, v)| v)
                .unwrap_or_default();
            let measured = Summary::of(&samples);
            let noisy = bench
                .runs
                .iter()
                .any(|r| r.setting == p.setting && !r.warmup && r.noisy.contains(&fig.key));
            let predicted = fig.spread.map_or(fig.predicted, |s| s.mean);
            rows.push(Row {
                setting: p.setting.clone(),
                figure: fig.name,
                unit: fig.unit,
                predicted,
                predicted_range: fig.spread.map(|s| (s.min, s.max)),
                error_pct: measured.and_then(|m| error_pct(predicted, m.mean)),
                within_goal: measured.map(|m| within_goal(predicted, &m)),
                measured,
                noisy,
            });
        }
    }
    rows
}

/// 100 * (predicted - mean) / mean; None for a mean of 0.
pub fn error_pct(predicted: f64, mean: f64) -> Option<f64> {
    (mean != 0.0).then(|| 100.0 * (predicted - mean) / mean)
}

/// Within ±5 % of the mean, or inside min–max: whichever is wider.
pub fn within_goal(predicted: f64, m: &Summary) -> bool {
    (predicted - m.mean).abs() <= GOAL_FRACTION * m.mean.abs()
        || (m.min..=m.max).contains(&predicted)
}

fn number(v: f64) -> String {
    if v.fract() == 0.0 || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The table: a row per setting and figure.
pub fn render(rows: &[Row]) -> String {
    let header: Vec<String> = [
        "setting",
        "figure",
        "predicted",
        "measured mean",
        "stddev",
        "min-max",
        "error",
        "goal",
    ]
    .map(String::from)
    .to_vec();
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let (mean, sd, range) = match &r.measured {
                Some(m) => (
                    number(m.mean),
                    if m.stddev.is_nan() {
                        "-".into()
                    } else {
                        number(m.stddev)
                    },
                    format!("{}-{}", number(m.min), number(m.max)),
                ),
                None => ("not measured".into(), "-".into(), "-".into()),
            };
            let goal = match r.within_goal {
                Some(true) => "ok",
                Some(false) => "MISS",
                None => "-",
            };
            vec![
                r.setting.clone(),
                format!("{} ({})", r.figure, r.unit),
                match r.predicted_range {
                    Some((lo, hi)) => format!("{} ({lo}-{hi})", number(r.predicted)),
                    None => number(r.predicted),
                },
                mean,
                sd,
                range,
                r.error_pct.map_or("n/a".into(), |e| format!("{e:+.1}%")),
                format!("{goal}{}", if r.noisy { " (noisy)" } else { "" }),
            ]
        })
        .collect();
    table::render_aligned(&header, &body, 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(xs: &[f64]) -> Summary {
        Summary::of(xs).expect("values")
    }

    #[test]
    fn the_goal_is_the_wider_of_five_percent_and_the_range() {
        // Tight runs: 5 % of the mean is wider than min–max.
        let m = summary(&[1000.0, 1001.0, 1002.0]);
        assert!(within_goal(1050.0, &m));
        assert!(!within_goal(1060.0, &m));
        // Spread runs: min–max is wider than 5 %.
        let m = summary(&[800.0, 1000.0, 1200.0]);
        assert!(within_goal(1190.0, &m));
        assert!(!within_goal(1210.0, &m));
        // Zero measured, zero predicted.
        let m = summary(&[0.0, 0.0]);
        assert!(within_goal(0.0, &m));
        assert!(!within_goal(1.0, &m));
    }

    #[test]
    fn the_error_is_against_the_mean() {
        assert_eq!(error_pct(110.0, 100.0), Some(10.0));
        assert_eq!(error_pct(90.0, 100.0), Some(-10.0));
        assert_eq!(error_pct(5.0, 0.0), None);
    }
}
