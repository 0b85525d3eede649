//! The Grafana dashboard of the repository (`contrib/grafana/hugelab.json`)
//! against the exporter: every PromQL expression of its panels and variables
//! names only metrics the endpoint exposes, with labels those metrics carry,
//! and the dashboard has the fields Grafana's dashboard schema requires.
//!
//! The metric list is built as the endpoint builds its answer
//! ([`render`](super::metrics::render)): every huge-page counter of the
//! registry as the kernel crate's reader names it, and a complete scan with
//! one cgroup.

use super::figures::{CgroupFigures, Cost, Pass, Predictions};
use super::metrics::{render, ScanState};
use hugelab_workload::counters;
use hugelab_workload::utilization::{Bucket, ShrinkerSettings};
use hugelab_workload::Counters;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Instant, SystemTime};

const DASHBOARD: &str = include_str!("../../../../contrib/grafana/hugelab.json");

/// Every metric of the exposition and the label names its samples carry.
fn exposed() -> BTreeMap<String, BTreeSet<String>> {
    let mut read = Counters::new();
    for family in counters::FAMILIES {
        for field in family.fields {
            let mut name = family.pattern.replace("<size>", "2048kB");
            for placeholder in ["<field>", "<stat>", "<file>"] {
                name = name.replace(placeholder, field.name);
            }
            if counters::lookup(&name).is_some() {
                read.insert(name, 1);
            }
        }
    }
    let figures = CgroupFigures {
        processes: 1,
        large_kb: [(64, 64), (2048, 2048)].into(),
        histogram: [(
            2048,
            vec![Bucket {
                lo: 0,
                hi: 50,
                folios: 1,
                zero_pages: 500,
            }],
        )]
        .into(),
        ..CgroupFigures::default()
    };
    let pass = Pass {
        finished: SystemTime::now(),
        finished_at: Instant::now(),
        predictions: Predictions::new(ShrinkerSettings {
            max_ptes_none: 511,
            shrink_underused: true,
        }),
        cgroups: [("/system.slice".to_string(), figures)].into(),
        cost: Cost::default(),
    };
    let state = ScanState {
        passes: 1,
        running: false,
    };
    let text = render(&read, Some(&pass), state, 0.02);
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let end = line.find(['{', ' ']).unwrap();
        let labels = out.entry(line[..end].to_string()).or_default();
        if let Some(inner) = line[end..].strip_prefix('{') {
            let inner = &inner[..inner.find('}').unwrap()];
            for pair in inner.split("\",") {
                labels.insert(pair.split('=').next().unwrap().to_string());
            }
        }
    }
    out
}

/// What an expression names: metrics with the labels matched on each, and
/// the labels it groups by.
#[derive(Debug, Default, PartialEq)]
struct Names {
    metrics: Vec<(String, Vec<String>)>,
    grouping: Vec<String>,
}

const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The names in a PromQL expression: an identifier before `(` is a
/// function or a grouping keyword (whose list is of labels), one before
/// `by` or `without` an aggregation, one in braces
/// a label matched, in brackets or quotes nothing; any other is a metric.
fn names(expr: &str) -> Names {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Names::default();
    let mut i = 0;
    let ident = |i: &mut usize| {
        let start = *i;
        while *i < chars.len() && (chars[*i].is_ascii_alphanumeric() || "_:".contains(chars[*i])) {
            *i += 1;
        }
        chars[start..*i].iter().collect::<String>()
    };
    let skip_to = |i: &mut usize, close: char| {
        while *i < chars.len() && chars[*i] != close {
            if chars[*i] == '"' && close != '"' {
                *i += 1;
                while *i < chars.len() && chars[*i] != '"' {
                    *i += 1 + usize::from(chars[*i] == '\\');
                }
            }
            *i += 1;
        }
        *i += 1;
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '[' {
            i += 1;
            skip_to(&mut i, if c == '"' { '"' } else { ']' });
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let word = ident(&mut i);
            let mut next = i;
            while next < chars.len() && chars[next] == ' ' {
                next += 1;
            }
            // `sum by (l) (...)`: an aggregation, its grouping first.
            let rest: String = chars[next..].iter().take(8).collect();
            let aggregation = rest.starts_with("by") || rest.starts_with("without");
            let open = chars.get(next) == Some(&'(') || aggregation;
            if open && GROUPING.contains(&word.as_str()) {
                let close = next + chars[next..].iter().position(|&c| c == ')').unwrap();
                let list: String = chars[next + 1..close].iter().collect();
                names
                    .grouping
                    .extend(list.split(',').map(|l| l.trim().to_string()));
                i = close + 1;
            } else if !open && !["bool", "offset"].contains(&word.as_str()) {
                let mut matched = Vec::new();
                if chars.get(i) == Some(&'{') {
                    i += 1;
                    while i < chars.len() && chars[i] != '}' {
                        if chars[i] == '"' {
                            i += 1;
                            skip_to(&mut i, '"');
                        } else if chars[i].is_ascii_alphabetic() || chars[i] == '_' {
                            matched.push(ident(&mut i));
                        } else {
                            i += 1;
                        }
                    }
                }
                names.metrics.push((word, matched));
            }
        } else if c.is_ascii_digit() {
            // A number (4096, 1e3) or a duration: no name in it.
            while i < chars.len() && chars[i].is_ascii_alphanumeric() {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn promql_names_are_told_apart() {
    let n = names(
        "sum by (size) (rate(a_total{size=~\"$s\", x!=\"}\"}[$__rate_interval])) / on(size) b * 4096",
    );
    assert_eq!(
        n,
        Names {
            metrics: vec![
                ("a_total".into(), vec!["size".into(), "x".into()]),
                ("b".into(), vec![])
            ],
            grouping: vec!["size".into(), "size".into()],
        }
    );
}

/// Why an expression does not fit the exposition, if it does not.
fn check_expr(expr: &str, exposed: &BTreeMap<String, BTreeSet<String>>) -> Result<(), String> {
    let n = names(expr);
    if n.metrics.is_empty() {
        return Err("names no metric".into());
    }
    let mut labels = BTreeSet::new();
    for (metric, matched) in &n.metrics {
        let has = exposed
            .get(metric)
            .ok_or_else(|| format!("{metric} is not exposed"))?;
        if let Some(l) = matched.iter().find(|l| !has.contains(*l)) {
            return Err(format!("{metric} has no label {l}"));
        }
        labels.extend(has);
    }
    match n.grouping.iter().find(|l| !labels.contains(*l)) {
        Some(l) => Err(format!("groups by {l}, a label of none of its metrics")),
        None => Ok(()),
    }
}

/// The field `key` of `v`, which must be of the kind `is` tells.
fn field<'a>(v: &'a Value, key: &str, is: fn(&Value) -> bool, at: &str) -> &'a Value {
    let f = &v[key];
    assert!(is(f), "{at}: `{key}` is missing or of the wrong type: {f}");
    f
}

#[test]
fn the_dashboard_queries_only_what_the_exporter_exposes() {
    let d: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let exposed = exposed();
    field(&d, "title", Value::is_string, "dashboard");
    field(&d, "uid", Value::is_string, "dashboard");
    field(&d, "schemaVersion", Value::is_u64, "dashboard");
    let panels = field(&d, "panels", Value::is_array, "dashboard");
    assert!(!panels.as_array().unwrap().is_empty());
    let mut exprs = Vec::new();
    for (n, p) in panels.as_array().unwrap().iter().enumerate() {
        let at = format!("panel {n}");
        field(p, "type", Value::is_string, &at);
        field(p, "title", Value::is_string, &at);
        let grid = field(p, "gridPos", Value::is_object, &at);
        for k in ["h", "w", "x", "y"] {
            field(grid, k, Value::is_u64, &format!("{at} gridPos"));
        }
        assert!(grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24);
        let targets = field(p, "targets", Value::is_array, &at)
            .as_array()
            .unwrap();
        assert!(!targets.is_empty(), "{at}: no targets");
        for t in targets {
            field(t, "refId", Value::is_string, &at);
            exprs.push((at.clone(), field(t, "expr", Value::is_string, &at)));
        }
    }
    // The variables' label_values(metric, label).
    for v in d["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            let inner = q
                .strip_prefix("label_values(")
                .unwrap()
                .trim_end_matches(')');
            let (metric, label) = inner.split_once(',').unwrap();
            let has = &exposed[metric.trim()];
            assert!(has.contains(label.trim()), "{q}: no label {label}");
        }
    }
    for (at, expr) in exprs {
        let expr = expr.as_str().unwrap();
        if let Err(why) = check_expr(expr, &exposed) {
            panic!("{at}: {expr}: {why}");
        }
    }
    // The checks can fail.
    assert!(check_expr("hugelab_no_such_metric", &exposed).is_err());
    assert!(check_expr("hugelab_cgroup_processes{size=\"2M\"}", &exposed).is_err());
    assert!(check_expr("sum by (size) (hugelab_cgroup_processes)", &exposed).is_err());
}
