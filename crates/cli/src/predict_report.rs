//! What `hugelab predict` prints: the figures of each setting read from the
//! model after the run ([`Figures::read`]), the summary in the shape of
//! `bench`'s (a row per setting, `value (change%)` against the first), the
//! memory in each folio size at the peak, the fallbacks per size, the notes
//! on what a recording cannot carry, `--json` and `--plot`.

use crate::bench_plot::{render_panels, Panel};
use crate::predict_why::WhyFold;
use crate::table;
use anyhow::Result;
use hugelab_compare::setting::{change_pct, per_size, short_size};
use hugelab_model::mm_types::PAGE_SIZE;
use hugelab_model::Model;
use hugelab_workload::prelude::SettingEffect;
use hugelab_workload::recorded::RecordingHeader;
use hugelab_workload::Observation;
use serde::Serialize;
use serde_json::{json, Value};
use std::path::Path;

const PAGE_KB: i64 = (PAGE_SIZE >> 10) as i64;

/// kB in folios of one size, or a count per size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PerSize {
    /// The folio size as sysfs names it (`4kB`, `64kB`, `2048kB`).
    pub size: String,
    pub value: i64,
}

/// Anonymous memory at its peak as the processes map it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeakMapped {
    /// The peak over the run of the sum over processes of RssAnon, kB.
    pub rss_anon_kb: i64,
    /// AnonHugePages (NR_ANON_THPS) at that moment, kB.
    pub anon_huge_kb: i64,
    /// AnonPages (NR_ANON_MAPPED) at that moment, kB: each page once.
    pub anon_kb: i64,
    /// kB in anonymous folios of each size at that moment, smallest first:
    /// each large size's folios whole (`nr_anon` × size), and `4kB` the
    /// rest of AnonPages. Sizes without memory are left out.
    pub by_size: Vec<PerSize>,
}

/// Anonymous memory as the memory cgroup holds it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeakCharged {
    /// The most anonymous memory charged to the cgroup at once, kB: a
    /// folio counts whole while charged, also a THP partly unmapped that
    /// waits on the deferred split queue.
    pub anon_kb: i64,
    /// memory.peak: anonymous memory and page tables, kB.
    pub peak_kb: i64,
}

/// Every figure of one setting.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Figures {
    /// vmstat.pgfault.
    pub page_faults: i64,
    /// memory.events oom_kill of the cgroup.
    pub oom_kills: i64,
    /// vmstat.thp_collapse_alloc: THPs khugepaged and MADV_COLLAPSE made.
    pub collapses: i64,
    /// vmstat.thp_collapse_alloc_failed.
    pub collapse_failed: i64,
    /// mthp.<size>.anon_fault_fallback per size (the PMD size's is
    /// vmstat.thp_fault_fallback); sizes that never fell back left out.
    pub fallbacks: Vec<PerSize>,
    /// mthp.<size>.anon_fault_fallback_charge: of those, the ones the
    /// cgroup's charge refused.
    pub fallbacks_charge: Vec<PerSize>,
    pub peak_mapped: PeakMapped,
    pub peak_charged: PeakCharged,
}

impl Figures {
    /// The figures of a finished run: events from the end reading, the
    /// peaks from the model's watermarks, the cgroup's from `cgroup`.
    pub fn read(obs: &Observation, model: &Model, cgroup: &str) -> Figures {
        let end = obs.snapshots.last().map(|s| &s.counters);
        let get = |name: &str| end.and_then(|c| c.get(name)).copied().unwrap_or(0);
        let sizes = |stat: &str| -> Vec<PerSize> {
            end.map_or(Vec::new(), |c| per_size(c, stat))
                .into_iter()
                .filter(|(_, v)| *v != 0)
                .map(|(kb, value)| PerSize {
                    size: format!("{kb}kB"),
                    value,
                })
                .collect()
        };
        let m = &model.machine;
        let group = m.memcg.by_name(cgroup).map(|g| &m.memcg.groups[g]);
        let kb = |pages: u64| pages as i64 * PAGE_KB;
        Figures {
            page_faults: get("vmstat.pgfault"),
            oom_kills: group.map_or(0, |g| g.events.oom_kill as i64),
            collapses: get("vmstat.thp_collapse_alloc"),
            collapse_failed: get("vmstat.thp_collapse_alloc_failed"),
            fallbacks: sizes("anon_fault_fallback"),
            fallbacks_charge: sizes("anon_fault_fallback_charge"),
            peak_mapped: peak_mapped(&m.stat.anon_peak),
            peak_charged: PeakCharged {
                anon_kb: group.map_or(0, |g| kb(g.anon_peak)),
                peak_kb: group.map_or(0, |g| kb(g.memory.watermark)),
            },
        }
    }
}

fn peak_mapped(p: &hugelab_model::vmstat::AnonPeak) -> PeakMapped {
    let mut by_size: Vec<PerSize> = Vec::new();
    let mut large = 0;
    for (order, &n) in p.nr_anon.iter().enumerate().filter(|(_, n)| **n != 0) {
        let size_kb = PAGE_KB << order;
        large += n * size_kb;
        by_size.push(PerSize {
            size: format!("{size_kb}kB"),
            value: n * size_kb,
        });
    }
    let anon_kb = p.anon_mapped * PAGE_KB;
    let small = (anon_kb - large).max(0);
    if small > 0 {
        by_size.insert(
            0,
            PerSize {
                size: format!("{PAGE_KB}kB"),
                value: small,
            },
        );
    }
    PeakMapped {
        rss_anon_kb: p.rss_anon as i64 * PAGE_KB,
        anon_huge_kb: p.anon_thps * PAGE_KB,
        anon_kb,
        by_size,
    }
}

/// One setting's prediction.
#[derive(Serialize)]
pub struct Prediction {
    pub setting: String,
    /// `TUNABLE=VALUE`, as given.
    pub sets: Vec<String>,
    /// The cgroup's memory.max, as given; none: no limit.
    pub memory_max: Option<String>,
    pub figures: Figures,
    /// Which of the workload's prelude lines the setting overrode.
    #[serde(skip)]
    pub effect: SettingEffect,
    /// The workload's `sleep`s added up, ms: the recording's clock.
    pub slept_ms: u64,
    /// Whether khugepaged ran (the PMD size enabled) while the clock moved
    /// past its scan_sleep_millisecs.
    pub khugepaged_clock: bool,
    /// The OOM kills, as the run reports them.
    pub kills: Vec<String>,
    #[serde(skip)]
    pub why: Option<WhyFold>,
    /// Over every address layout replayed (`--layouts N`, N > 1); the
    /// other figures are the recording's layout's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layouts: Option<LayoutSpread>,
}

/// One figure over the address layouts: its mean and range.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub mean: f64,
    pub min: i64,
    pub max: i64,
}

impl Spread {
    fn of(values: &[i64]) -> Spread {
        Spread {
            mean: values.iter().sum::<i64>() as f64 / values.len().max(1) as f64,
            min: values.iter().copied().min().unwrap_or(0),
            max: values.iter().copied().max().unwrap_or(0),
        }
    }
}

/// The figures that depend on where VMAs start, over the layouts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayoutSpread {
    pub layouts: usize,
    pub page_faults: Spread,
    pub rss_anon_kb: Spread,
    pub anon_huge_kb: Spread,
    pub cgroup_anon_kb: Spread,
}

impl LayoutSpread {
    pub fn of<'a>(figures: impl Iterator<Item = &'a Figures>) -> LayoutSpread {
        let figures: Vec<&Figures> = figures.collect();
        let over =
            |f: fn(&Figures) -> i64| Spread::of(&figures.iter().map(|x| f(x)).collect::<Vec<_>>());
        LayoutSpread {
            layouts: figures.len(),
            page_faults: over(|f| f.page_faults),
            rss_anon_kb: over(|f| f.peak_mapped.rss_anon_kb),
            anon_huge_kb: over(|f| f.peak_mapped.anon_huge_kb),
            cgroup_anon_kb: over(|f| f.peak_charged.anon_kb),
        }
    }
}

/// The lines under the table: what a recording cannot carry, and what the
/// settings overrode.
pub fn notes(header: Option<&RecordingHeader>, predictions: &[Prediction]) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(h) = header {
        let under = if h.thp_off { "THP off" } else { "its settings" };
        for (proc, path) in &h.thp_reads {
            notes.push(format!(
                "{proc} read {path} while recorded: a program that adapts to the setting it \
                 sees behaves here as it did under the recording's ({under})"
            ));
        }
    }
    let clocked: Vec<&str> = predictions
        .iter()
        .filter(|p| p.khugepaged_clock)
        .map(|p| p.setting.as_str())
        .collect();
    if !clocked.is_empty() {
        notes.push(format!(
            "khugepaged's collapses follow the recording's clock ({} ms of sleeps) under {}: \
             a program that runs faster or slower gives khugepaged less or more time",
            predictions[0].slept_ms,
            clocked.join(", ")
        ));
    }
    for p in predictions {
        for o in &p.effect.overridden {
            notes.push(format!(
                "setting {} overrides line {}: {}",
                p.setting, o.line, o.statement
            ));
        }
        for u in &p.effect.unreached {
            notes.push(format!(
                "setting {} sets transparent_hugepage/enabled, which a THP size follows only \
                 when set to inherit, so not at line {}: {}",
                p.setting, u.line, u.statement
            ));
        }
    }
    notes
}

/// `value (+x.x%)` against the baseline's value; the baseline's alone.
fn cell(base: i64, v: i64, first: bool) -> String {
    if first {
        return v.to_string();
    }
    match change_pct(base, v) {
        Some(p) if format!("{p:.1}") == "0.0" || format!("{p:.1}") == "-0.0" => {
            format!("{v} (0.0%)")
        }
        Some(p) => format!("{v} ({p:+.1}%)"),
        None => format!("{v} (n/a)"),
    }
}

/// A column of the summary: its header and its figure.
type Column = (&'static str, fn(&Figures) -> i64);

/// The summary's columns.
const SUMMARY: [Column; 8] = [
    ("page faults", |f| f.page_faults),
    ("peak RssAnon kB", |f| f.peak_mapped.rss_anon_kb),
    ("AnonHugePages kB", |f| f.peak_mapped.anon_huge_kb),
    ("cgroup anon peak kB", |f| f.peak_charged.anon_kb),
    ("memory.peak kB", |f| f.peak_charged.peak_kb),
    ("fallbacks", |f| f.fallbacks.iter().map(|s| s.value).sum()),
    ("collapses", |f| f.collapses),
    ("OOM kills", |f| f.oom_kills),
];

/// A row per setting, the figures' changes against the first.
fn summary_table(predictions: &[Prediction]) -> String {
    let mut header = vec!["setting".to_string()];
    header.extend(SUMMARY.iter().map(|(h, _)| h.to_string()));
    let base = &predictions[0].figures;
    let rows: Vec<Vec<String>> = predictions
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut row = vec![p.setting.clone()];
            row.extend(
                SUMMARY
                    .iter()
                    .map(|(_, f)| cell(f(base), f(&p.figures), i == 0)),
            );
            row
        })
        .collect();
    table::render(&header, &rows)
}

/// A row per setting: the layout-dependent figures' mean (min–max).
fn layout_table(predictions: &[Prediction]) -> Option<String> {
    let header: Vec<String> = [
        "setting",
        "page faults",
        "peak RssAnon kB",
        "AnonHugePages kB",
        "cgroup anon peak kB",
    ]
    .map(String::from)
    .to_vec();
    let cell = |s: &Spread| format!("{:.0} ({}-{})", s.mean, s.min, s.max);
    let rows: Vec<Vec<String>> = predictions
        .iter()
        .filter_map(|p| {
            let l = p.layouts.as_ref()?;
            Some(vec![
                p.setting.clone(),
                cell(&l.page_faults),
                cell(&l.rss_anon_kb),
                cell(&l.anon_huge_kb),
                cell(&l.cgroup_anon_kb),
            ])
        })
        .collect();
    (!rows.is_empty()).then(|| table::render(&header, &rows))
}

/// A row per setting, a column per size that any setting has: `per` of it.
fn size_table(predictions: &[Prediction], per: impl Fn(&Figures) -> &[PerSize]) -> String {
    let mut sizes: Vec<u64> = predictions
        .iter()
        .flat_map(|p| per(&p.figures))
        .map(|s| s.size.trim_end_matches("kB").parse().unwrap_or(0))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut header = vec!["setting".to_string()];
    header.extend(sizes.iter().map(|kb| short_size(&format!("{kb}kB"))));
    let rows: Vec<Vec<String>> = predictions
        .iter()
        .map(|p| {
            let mut row = vec![p.setting.clone()];
            row.extend(sizes.iter().map(|kb| {
                let name = format!("{kb}kB");
                let v = per(&p.figures).iter().find(|s| s.size == name);
                v.map_or(0, |s| s.value).to_string()
            }));
            row
        })
        .collect();
    table::render(&header, &rows)
}

/// The tables and notes people read.
pub fn render(file: &str, predictions: &[Prediction], notes: &[String]) -> String {
    let base = &predictions[0];
    let mut s = format!(
        "# {file}: predicted by the model (Linux {}) under {} settings, against {}\n",
        hugelab_model::LINUX_VERSION,
        predictions.len(),
        base.setting
    );
    for p in predictions.iter().filter(|p| p.memory_max.is_some()) {
        let max = p.memory_max.as_deref().unwrap_or_default();
        s.push_str(&format!(
            "setting {}: the program's cgroup has memory.max={max}\n",
            p.setting
        ));
    }
    s.push_str(&format!(
        "Summary: page faults; peak anonymous memory as the processes map it (the sum of \
         RssAnon) with AnonHugePages then, and as the cgroup holds it (anon, and memory.peak \
         with page tables); fallbacks to a smaller folio; khugepaged collapses; OOM kills. \
         Changes against {}.\n{}\n",
        base.setting,
        summary_table(predictions)
    ));
    s.push_str(&format!(
        "Anonymous memory in each folio size at the peak of RssAnon, kB (large folios whole, \
         4K the rest of AnonPages):\n{}\n",
        size_table(predictions, |f| &f.peak_mapped.by_size)
    ));
    if let Some(t) = layout_table(predictions) {
        let n = predictions[0].layouts.as_ref().map_or(0, |l| l.layouts);
        s.push_str(&format!(
            "Over {n} address layouts (the recording's and {} as address-space randomisation \
             places other runs): mean (min-max); the tables above are the recording's layout's.\n{t}\n",
            n - 1
        ));
    }
    if predictions.iter().any(|p| !p.figures.fallbacks.is_empty()) {
        s.push_str(&format!(
            "Fallbacks per size (anon_fault_fallback: a fault that wanted a folio of this size \
             and took a smaller one):\n{}\n",
            size_table(predictions, |f| &f.fallbacks)
        ));
    }
    for p in predictions {
        for k in &p.kills {
            s.push_str(&format!("setting {}: OOM kill at {k}\n", p.setting));
        }
    }
    for note in notes {
        s.push_str(&format!("note: {note}\n"));
    }
    s
}

/// `--json`: every figure per setting, and the notes.
pub fn to_json(
    file: &str,
    header: Option<&RecordingHeader>,
    predictions: &[Prediction],
    notes: &[String],
) -> Value {
    json!({
        "workload": file,
        "model": format!("Linux {}", hugelab_model::LINUX_VERSION),
        "recorded": header.map(|h| json!({
            "date": h.date,
            "kernel": h.kernel,
            "command": h.command,
            "thp_reads": h.thp_reads.iter().map(|(p, f)| json!({"process": p, "path": f})).collect::<Vec<_>>(),
        })),
        "baseline": predictions[0].setting,
        "settings": predictions,
        "notes": notes,
    })
}

/// `--plot`: a panel per summary figure, a point per setting.
pub fn write_plot(file: &str, predictions: &[Prediction], path: &Path) -> Result<()> {
    let panels: Vec<Panel> = SUMMARY
        .iter()
        .map(|(heading, f)| Panel {
            heading: heading.to_string(),
            unit: if heading.ends_with("kB") {
                "kB"
            } else {
                "count"
            },
            samples: predictions
                .iter()
                .map(|p| (p.setting.as_str(), vec![f(&p.figures) as f64]))
                .collect(),
        })
        .collect();
    let title = format!("hugelab predict: {file}");
    let notes = [format!(
        "Points: the model's prediction for each setting (Linux {}), one run each.",
        hugelab_model::LINUX_VERSION
    )];
    let svg = render_panels(title, &notes, predictions.len(), &panels)?;
    crate::svg::write(path, svg)
}
