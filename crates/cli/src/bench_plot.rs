//! The SVG plot of `hugelab bench` ([`write_plot`]): a header with the
//! command and what the marks are, then one panel per metric of
//! [`METRICS`], two to a row. In each panel the x axis is the settings in
//! order (the baseline first), each in its colour; every measured run is a
//! point, spread horizontally in run order so that equal values stay
//! visible; a black tick across the points is the mean, and a black bar
//! through it the 95% confidence interval of the mean (mean ± t_{0.975,n-1}
//! · s/√n). Tables say whether settings differ; the plot shows why: a
//! bimodal setting or one outlier run is visible here and hidden in a mean.

use crate::svg::{self, category, colour, xc, Area, AXIS_DESC_FONT, TICK_FONT};
use anyhow::{Context, Result};
use plotters::prelude::*;
use std::path::Path;

use crate::bench_record::{BenchResult, METRICS};
use crate::bench_stats::Summary;

const COLUMNS: usize = 2;
const HEADER_PX: u32 = 96;
const TITLE_PX: u32 = 34;
const PANEL_PX: u32 = 340;
/// Room per setting on the x axis, for its name and its points.
const SETTING_PX: u32 = 120;
/// Half the width, in settings, of the points' spread and of the mean tick.
const SPREAD: f64 = 0.2;
const TICK: f64 = 0.3;
const LEVEL: f64 = 0.95;

/// The longest command shown in the title: wider runs off the picture.
const TITLE_CHARS: usize = 90;

/// `text` cut to `max` characters, with `…` where it was cut.
fn ellipsize(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max - 1).collect();
    s.push('…');
    s
}

/// Writes the plot of `result` to `path` as SVG.
pub fn write_plot(result: &BenchResult, path: &Path) -> Result<()> {
    let svg = render_plot(result).with_context(|| format!("plotting {}", path.display()))?;
    svg::write(path, svg)
}

fn render_plot(result: &BenchResult) -> Result<String> {
    let title = format!(
        "hugelab bench: {}",
        ellipsize(&result.command.join(" "), TITLE_CHARS)
    );
    let mut notes = vec![
        "Points: every measured run, in run order left to right. Black tick: the mean; \
         black bar: its 95% confidence interval (Student's t, n-1 df)."
            .to_string(),
    ];
    if result.interrupted {
        notes.push("Interrupted: the runs completed.".into());
    }
    let panels: Vec<Panel> = METRICS
        .iter()
        .map(|m| Panel {
            heading: format!("{} [{}]", m.title, m.unit),
            unit: m.unit,
            samples: result.samples(m.key),
        })
        .collect();
    render_panels(title, &notes, result.settings.len(), &panels)
}

/// One panel of a plot: its heading, the unit of its y axis, and the
/// values of each setting.
pub struct Panel<'a> {
    pub heading: String,
    pub unit: &'a str,
    pub samples: Vec<(&'a str, Vec<f64>)>,
}

/// A plot of `panels` over `settings` settings, two to a row, under a
/// header with `title` and `notes` (bench's plot and predict's).
pub fn render_panels(
    title: String,
    notes: &[String],
    settings: usize,
    panels: &[Panel],
) -> Result<String> {
    let nset = settings.max(1) as u32;
    let width = COLUMNS as u32 * (140 + nset * SETTING_PX).max(520);
    let rows = panels.len().div_ceil(COLUMNS);
    let height = HEADER_PX + rows as u32 * PANEL_PX;
    svg::render(
        (width, height),
        HEADER_PX,
        |head| {
            svg::draw_title(head, title)?;
            svg::draw_notes(head, notes, 44)
        },
        |body| {
            for (area, p) in body.split_evenly((rows, COLUMNS)).iter().zip(panels) {
                draw_samples_panel(area, p.heading.clone(), p.unit, &p.samples)?;
            }
            Ok(())
        },
    )
}

/// The y range of a panel: every point and interval end, with a margin.
fn y_range(values: &[f64]) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !(lo.is_finite() && hi.is_finite()) {
        return (0.0, 1.0);
    }
    // All values equal (no major fault anywhere): a range around them.
    let pad = if hi > lo {
        (hi - lo) * 0.08
    } else {
        (lo.abs() * 0.05).max(1.0)
    };
    // Times, kB and counts are not negative: no negative axis under them,
    // only a sliver so that points at 0 clear the axis line.
    let y0 = if lo >= 0.0 {
        (lo - pad).max(-0.03 * (hi + pad - lo))
    } else {
        lo - pad
    };
    (y0, hi + pad)
}

/// Decimals for y tick labels over `span`: enough to tell ticks about a
/// tenth of the span apart, none for kB and counts in the thousands
/// (plotters' default writes `150000.0`).
fn tick_decimals(span: f64) -> usize {
    if span > 0.0 && span.is_finite() {
        (-(span / 10.0).log10()).ceil().clamp(0.0, 6.0) as usize
    } else {
        0
    }
}

/// A panel of `heading` over the settings in order, each in its colour:
/// its values as points (one value: one point, no interval), their mean as
/// a tick and its 95% confidence interval as a bar (`hugelab predict`'s
/// plot draws its one value per setting with it).
pub fn draw_samples_panel(
    area: &Area,
    heading: String,
    unit: &str,
    samples: &[(&str, Vec<f64>)],
) -> Result<()> {
    let (title, chart_area) = area.split_vertically(TITLE_PX);
    svg::draw_heading(&title, heading, (12, 8), 18)?;
    // (summary, confidence half-width) per setting.
    let stats: Vec<(Option<Summary>, Option<f64>)> = samples
        .iter()
        .map(|(_, v)| {
            let s = Summary::of(v);
            (s, s.and_then(|s| s.confidence_half_width(LEVEL)))
        })
        .collect();
    let mut extent: Vec<f64> = samples.iter().flat_map(|(_, v)| v.clone()).collect();
    for (s, hw) in &stats {
        if let (Some(s), Some(hw)) = (s, hw) {
            extent.extend([s.mean - hw, s.mean + hw]);
        }
    }
    let (y0, y1) = y_range(&extent);

    // x is fixed point (svg::X_UNIT), its key points the settings.
    let k = samples.len().max(1);
    let centre = |i: usize| i as f64 + 0.5;
    let mut chart = svg::chart(&chart_area, 36, 80).build_cartesian_2d(
        (0..xc(k as f64)).with_key_points((0..k).map(|i| xc(centre(i))).collect()),
        y0..y1,
    )?;
    let x_label = |x: &i32| {
        samples
            .get(category(*x))
            .map_or(String::new(), |(name, _)| name.to_string())
    };
    let dec = tick_decimals(y1 - y0);
    let y_label = |y: &f64| format!("{y:.dec$}");
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&x_label)
        .y_label_formatter(&y_label)
        .y_desc(unit)
        .label_style(TICK_FONT)
        .axis_desc_style(AXIS_DESC_FONT)
        .draw()?;

    let black = BLACK.stroke_width(2);
    for (i, ((_, values), (summary, hw))) in samples.iter().zip(&stats).enumerate() {
        // The interval first, so that the points stay on top of it.
        if let (Some(s), Some(hw)) = (summary, hw) {
            let x = centre(i);
            let (lo, hi) = (s.mean - hw, s.mean + hw);
            chart.draw_series([
                PathElement::new(vec![(xc(x), lo), (xc(x), hi)], black),
                PathElement::new(vec![(xc(x - 0.05), lo), (xc(x + 0.05), lo)], black),
                PathElement::new(vec![(xc(x - 0.05), hi), (xc(x + 0.05), hi)], black),
            ])?;
        }
        // Spread evenly in run order: deterministic, unlike random jitter,
        // so the same bench plots the same.
        let n = values.len();
        let dx = |j: usize| {
            if n > 1 {
                -SPREAD + 2.0 * SPREAD * j as f64 / (n - 1) as f64
            } else {
                0.0
            }
        };
        chart.draw_series(values.iter().enumerate().map(|(j, &v)| {
            Circle::new((xc(centre(i) + dx(j)), v), 4, colour(i).mix(0.75).filled())
        }))?;
        if let Some(s) = summary {
            let x = centre(i);
            chart.draw_series([PathElement::new(
                vec![(xc(x - TICK), s.mean), (xc(x + TICK), s.mean)],
                BLACK.stroke_width(3),
            )])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_record::{test_run, RunRecord, SettingSpec};

    fn result(runs: u32) -> BenchResult {
        let run = |setting: &str, run: u32, wall_s: f64| RunRecord {
            sys_s: 1.0 + run as f64,
            minflt: 1000 + u64::from(run),
            ..test_run(setting, run, wall_s)
        };
        let spec = |n: &str| SettingSpec {
            name: n.into(),
            tunables: vec![],
            memory_max: None,
        };
        BenchResult {
            command: vec!["make".into(), "-j8".into()],
            run_as: String::new(),
            settings: vec![spec("4K"), spec("64K & 2M")],
            warmup: 0,
            runs_per_setting: runs,
            anon_sample_period_ms: 1.0,
            runs: (0..runs)
                .flat_map(|r| [run("4K", r, 10.0 + r as f64), run("64K & 2M", r, 8.0)])
                .collect(),
            interrupted: false,
        }
    }

    fn temp_svg(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!(
            "hugelab-bench-plot-{name}-{}.svg",
            std::process::id()
        ))
    }

    /// The text of every `<text>` element of the SVG, which must parse as
    /// XML with an `<svg>` root.
    fn texts(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).expect("well-formed SVG");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| n.text().unwrap_or("").trim().to_string())
            .collect()
    }

    #[test]
    fn a_panel_per_metric() {
        let path = temp_svg("three");
        write_plot(&result(3), &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let texts = texts(&svg);
        for m in METRICS {
            let title = format!("{} [{}]", m.title, m.unit);
            let n = texts.iter().filter(|t| **t == title).count();
            assert_eq!(n, 1, "{title} {n} times in {texts:?}");
        }
        // The settings label every panel's x axis; the name is escaped.
        let n = texts.iter().filter(|t| *t == "64K & 2M").count();
        assert_eq!(n, METRICS.len(), "{texts:?}");
        assert!(texts.iter().any(|t| t == "hugelab bench: make -j8"));
        // 6 points per panel, all in the settings' colours.
        let points = svg.matches("<circle").count();
        assert_eq!(points, 6 * METRICS.len(), "{svg}");
    }

    #[test]
    fn one_run_and_no_run_still_plot() {
        // One run: no interval; no run: an empty panel.
        for runs in [1, 0] {
            let path = temp_svg(&format!("runs{runs}"));
            write_plot(&result(runs), &path).unwrap();
            let svg = std::fs::read_to_string(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            let texts = texts(&svg);
            assert!(texts.iter().any(|t| t == "real-time [s]"), "{texts:?}");
            assert_eq!(
                svg.matches("<circle").count(),
                2 * runs as usize * METRICS.len()
            );
        }
    }

    #[test]
    fn y_range_pads() {
        assert_eq!(y_range(&[]), (0.0, 1.0));
        // Zeros: 0 to 1, a sliver of 0.03 below.
        let (lo, hi) = y_range(&[0.0, 0.0]);
        assert!((lo + 0.03).abs() < 1e-12 && hi == 1.0, "{lo} {hi}");
        // 10 to 20: 8% of the span either side.
        let (lo, hi) = y_range(&[10.0, 20.0]);
        assert!((lo - 9.2).abs() < 1e-12 && (hi - 20.8).abs() < 1e-12);
        // A negative value keeps its margin.
        assert_eq!(y_range(&[-5.0, 5.0]), (-5.8, 5.8));
    }

    #[test]
    fn tick_labels() {
        // Ticks about span/10 apart: 5000 kB, 0.1 s, 0.002 s.
        assert_eq!(tick_decimals(50000.0), 0);
        assert_eq!(tick_decimals(1.0), 1);
        assert_eq!(tick_decimals(0.02), 3);
        assert_eq!(tick_decimals(0.0), 0);
    }

    #[test]
    fn write_error_names_the_path() {
        let path = Path::new("/nonexistent-dir/bench.svg");
        let err = write_plot(&result(2), path).unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent-dir/bench.svg"));
    }
}
