//! Renderings of a [`UtilizationReport`] for `hugelab scan` and
//! `hugelab utilization`: a text table and an SVG chart.
//!
//! The text table ([`render_table`]) has one block per folio size (a row per
//! bucket of subpages in use, then a `partially mapped` row), the deferred
//! split shrinker's predicted give-back with the settings it assumes, and,
//! when the report has any, never-written memory by cause and size.
//!
//! The SVG ([`write_svg`]) compares one or more reports (model and kernel,
//! before and after). From top to bottom:
//!
//! - a header: the figure title, a legend with one colour per report, and
//!   two lines saying what the bars and their labels are;
//! - one panel per folio size found in any report, smallest size first. Each
//!   panel's title is the size (`2048 kB folios`), under it one line per
//!   report in that report's colour with its totals for the size: folios,
//!   partially mapped folios, zero-filled memory;
//! - in each panel the x axis is the report's buckets of subpages in use
//!   (mapped and not zero-filled: `0-50` … `460-512` for 2048 kB folios, one
//!   bucket per count for folios of fewer pages than buckets), the y axis the
//!   number of fully mapped folios in the bucket. Several reports give
//!   grouped bars, one per report in its colour, in legend order. Above each
//!   non-empty bar is the zero-filled memory of that bucket's folios, which
//!   the count alone does not tell.
//!
//! The y axis is logarithmic (ticks 1, 10, 100, …) when a panel's largest bar
//! is at least 20 times its smallest non-empty one: utilization histograms are
//! bimodal, most folios in the first and last buckets, and a linear scale
//! would flatten the middle buckets to nothing. Otherwise it is linear from 0.
//! Partially mapped folios are not bucketed (the content of their unmapped
//! subpages is not visible), so they appear only in the panel title lines.
//! With no large folio in any report, one panel says `no large folios`.

use crate::svg::{self, category, colour, xc, Area, AXIS_DESC_FONT, FONT, LINE_SIZE, TICK_FONT};
use crate::table::plural;
use anyhow::{bail, Result};
use hugelab_workload::units::PAGE_KB;
use hugelab_workload::utilization::{
    Bloat, FolioCause, SizeUtilization, UtilizationReport, HPAGE_PMD_ORDER, MAX_PTES_NONE_OFF,
};
use plotters::coord::combinators::WithKeyPoints;
use plotters::coord::types::RangedCoordi32;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::BTreeMap;
use std::path::Path;

use crate::table;

/// `512 kB`, `12.3 MiB`, `1.25 GiB`: readable sizes for tables and labels.
fn fmt_kb(kb: u64) -> String {
    if kb < 1024 {
        format!("{kb} kB")
    } else if kb < 1024 * 1024 {
        format!("{:.1} MiB", kb as f64 / 1024.0)
    } else {
        format!("{:.2} GiB", kb as f64 / (1024.0 * 1024.0))
    }
}

/// Exact kB, with the readable size too when it says more.
fn kb_exact(kb: u64) -> String {
    if kb < 1024 {
        format!("{kb} kB")
    } else {
        format!("{kb} kB ({})", fmt_kb(kb))
    }
}

fn bucket_label(lo: u32, hi: u32) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

pub fn render_table(report: &UtilizationReport, title: &str) -> String {
    let s = report.settings;
    let mut out = format!(
        "THP utilization: {title}\nsettings: max_ptes_none={}, shrink_underused={}\n",
        s.max_ptes_none,
        u8::from(s.shrink_underused)
    );
    if report.sizes.is_empty() {
        out.push_str("no large folios: nothing to bucket, nothing for the shrinker to split\n");
    } else {
        // The conclusion first: what the shrinker would do, then the
        // histograms it comes from.
        out.push_str(&give_back(report));
        for size in &report.sizes {
            out.push('\n');
            out.push_str(&size_block(size));
        }
    }
    if !report.bloat.is_empty() {
        out.push('\n');
        out.push_str(&bloat_table(&report.bloat));
    }
    out
}

/// One size's histogram: a row per bucket, then the partially mapped folios.
fn size_block(size: &SizeUtilization) -> String {
    let zero_total = size.zero_pages();
    let mut heading = format!(
        "{} kB folios: {}, {} partially mapped",
        size.size_kb,
        size.folios(),
        size.partial_folios
    );
    // Only PMD-sized folios can be PMD-mapped; saying 0 for mTHPs is noise.
    if size.order == HPAGE_PMD_ORDER {
        heading.push_str(&format!(
            ", {} of the fully mapped ones PMD-mapped",
            size.pmd_mapped
        ));
    }
    heading.push_str(&format!(
        "; {} zero-filled subpages ({})\n",
        zero_total,
        fmt_kb(zero_total * PAGE_KB)
    ));
    let header: Vec<String> = [
        "used subpages",
        "folios",
        "zero-filled subpages",
        "zero-filled",
        "share of zero-filled",
    ]
    .map(String::from)
    .to_vec();
    let row = |label: String, folios: u64, zero: u64| {
        vec![
            label,
            folios.to_string(),
            zero.to_string(),
            fmt_kb(zero * PAGE_KB),
            share(zero, zero_total),
        ]
    };
    // A run of empty buckets is one row: utilization histograms are
    // bimodal, and eight rows of zeros between the modes say nothing.
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut empty_from: Option<u32> = None;
    for (i, b) in size.buckets.iter().enumerate() {
        if b.folios == 0 {
            empty_from.get_or_insert(b.lo);
            let next_empty = size.buckets.get(i + 1).is_some_and(|n| n.folios == 0);
            if !next_empty {
                let lo = empty_from.take().unwrap_or(b.lo);
                rows.push(row(format!("{} (none)", bucket_label(lo, b.hi)), 0, 0));
            }
        } else {
            rows.push(row(bucket_label(b.lo, b.hi), b.folios, b.zero_pages));
        }
    }
    if size.partial_folios > 0 {
        rows.push(row(
            "partially mapped".into(),
            size.partial_folios,
            size.partial_zero_pages,
        ));
    }
    let mut out = heading + &table::render(&header, &rows);
    if size.partial_folios > 0 {
        out.push_str(&format!(
            "partially mapped folios are not bucketed: {} of their subpages are mapped, and the \
             content of the unmapped ones is not visible.\n",
            size.partial_mapped_pages
        ));
    }
    out
}

/// The deferred split shrinker's verdict: what it would split (partially
/// mapped folios, and THPs its under-used check finds) and give back, and
/// why nothing is split as under-used when the settings rule it out.
fn give_back(report: &UtilizationReport) -> String {
    let s = report.settings;
    let g = &report.give_back;
    let mut out = format!(
        "Deferred split shrinker at max_ptes_none={}, shrink_underused={}: it would give back \
         {} to the machine (and to the memory cgroups' charge), and the Rss of what was scanned \
         would drop by {}.\nOf that, it would split {} as under-used (more than {} zero-filled \
         subpages) and free {} of zero-filled subpages; partially mapped: it would split {} and \
         free {} of subpages no scanned process maps (in no Rss) and {} of zero-filled ones.\n",
        s.max_ptes_none,
        u8::from(s.shrink_underused),
        kb_exact(g.freed_kb()),
        kb_exact(g.rss_kb),
        plural(g.underused_folios, "THP", "THPs"),
        s.max_ptes_none,
        kb_exact(g.underused_kb),
        plural(g.partial_folios, "folio", "folios"),
        kb_exact(g.partial_unmapped_kb),
        kb_exact(g.partial_kb),
    );
    let off = s.max_ptes_none >= MAX_PTES_NONE_OFF;
    let why = match (s.shrink_underused, off) {
        (false, true) => Some(format!(
            "shrink_underused is 0, so no fully mapped THP is queued for the shrinker, and at \
             max_ptes_none={MAX_PTES_NONE_OFF} thp_underused() is always false anyway"
        )),
        (false, false) => Some(
            "shrink_underused is 0, so no fully mapped THP is queued for the shrinker".to_string(),
        ),
        (true, true) => Some(format!(
            "at max_ptes_none={MAX_PTES_NONE_OFF} thp_underused() is always false"
        )),
        (true, false) => None,
    };
    if let Some(why) = why {
        out.push_str(&format!("Nothing is split as under-used: {why}.\n"));
    }
    out.push_str(
        "This assumes every candidate is still on the deferred split queue and none is pinned; \
         only PMD-sized THPs are judged under-used, and locked ones keep their zero-filled \
         subpages.\n",
    );
    out
}

/// Never-written memory as a cause × size table, with totals both ways.
fn bloat_table(bloat: &[Bloat]) -> String {
    let mut sizes: Vec<u64> = bloat.iter().map(|b| b.size_kb).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let causes: Vec<FolioCause> = FolioCause::ALL
        .into_iter()
        .filter(|c| bloat.iter().any(|b| b.cause == *c))
        .collect();
    // (folios, never-written kB) of the entries matching a filter.
    let sum = |keep: &dyn Fn(&Bloat) -> bool| {
        bloat
            .iter()
            .filter(|b| keep(b))
            .fold((0, 0), |(f, kb), b| (f + b.folios, kb + b.never_written_kb))
    };
    let cell = |(folios, kb): (u64, u64)| {
        if folios == 0 {
            "-".to_string()
        } else {
            format!("{} ({folios})", fmt_kb(kb))
        }
    };
    let mut header = vec!["cause".to_string()];
    header.extend(sizes.iter().map(|s| format!("{s} kB")));
    header.push("all sizes".into());
    let mut rows: Vec<Vec<String>> = causes
        .iter()
        .map(|&c| {
            let mut row = vec![c.name().to_string()];
            row.extend(
                sizes
                    .iter()
                    .map(|&s| cell(sum(&|b| b.cause == c && b.size_kb == s))),
            );
            row.push(cell(sum(&|b| b.cause == c)));
            row
        })
        .collect();
    let mut total = vec!["all causes".to_string()];
    total.extend(sizes.iter().map(|&s| cell(sum(&|b| b.size_kb == s))));
    total.push(cell(sum(&|_| true)));
    rows.push(total);
    format!(
        "Never-written memory by cause and size (model only; cells: never-written memory \
         (folios); a write of zero bytes is a write):\n{}",
        table::render(&header, &rows)
    )
}

const HEADER_PX: u32 = 116;
/// One line of the shrinker's verdict in the header.
const VERDICT_PX: u32 = 18;
const CHART_PX: u32 = 300;
const TITLE_PX: u32 = 32;
const LINE_PX: u32 = 20;
/// Room per bar so the zero-filled labels above neighbouring bars stay apart.
const BAR_PX: u32 = 54;
/// A largest/smallest bar ratio from which the y axis is logarithmic.
const LOG_RATIO: u64 = 20;
/// The top of the y axis in bar-height units: room for the bar labels.
const Y_TOP: f64 = 1.15;
/// Chart units per full bar height.
const Y_UNIT: f64 = 10000.0;

/// A chart y (bar heights) in fixed point: plotters formats labels of bound
/// key points for integer axes only (x, the buckets, is `svg::xc`'s).
fn yc(y: f64) -> i32 {
    (y * Y_UNIT).round() as i32
}

/// A panel's chart: fixed-point coordinates with key points on both axes.
type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<WithKeyPoints<RangedCoordi32>, WithKeyPoints<RangedCoordi32>>,
>;

/// One folio size: the buckets and, per report, its histogram if it has one.
struct Panel<'a> {
    order: u8,
    size_kb: u64,
    bounds: Vec<(u32, u32)>,
    per_report: Vec<Option<&'a SizeUtilization>>,
}

/// The panels of every size in any report; grouped bars need the same
/// buckets in every report, so differing ones are an error.
fn panels<'a>(reports: &[(&str, &'a UtilizationReport)]) -> Result<Vec<Panel<'a>>> {
    let mut by_order: BTreeMap<u8, Panel<'a>> = BTreeMap::new();
    let mut first_name: BTreeMap<u8, &str> = BTreeMap::new();
    for (r, (name, report)) in reports.iter().enumerate() {
        for size in &report.sizes {
            let bounds: Vec<(u32, u32)> = size.buckets.iter().map(|b| (b.lo, b.hi)).collect();
            let panel = by_order.entry(size.order).or_insert_with(|| Panel {
                order: size.order,
                size_kb: size.size_kb,
                bounds: bounds.clone(),
                per_report: vec![None; reports.len()],
            });
            let first = *first_name.entry(size.order).or_insert(name);
            if panel.bounds != bounds {
                bail!(
                    "{name} and {first} bucket {} kB folios differently ({} and {} buckets), \
                     so their bars cannot be grouped",
                    size.size_kb,
                    bounds.len(),
                    panel.bounds.len()
                );
            }
            panel.per_report[r] = Some(size);
        }
    }
    Ok(by_order.into_values().collect())
}

/// Folio counts to bar heights in `0..=1`, and the y axis ticks.
enum YScale {
    Linear {
        top: u64,
    },
    /// Bars start at 0.5 so that a bucket of one folio is still visible.
    Log {
        top: u64,
    },
}

impl YScale {
    fn new(counts: impl Iterator<Item = u64> + Clone) -> YScale {
        let max = counts.clone().max().unwrap_or(0);
        let min = counts.filter(|&n| n > 0).min().unwrap_or(0);
        if min > 0 && max >= min * LOG_RATIO {
            // The smallest power of ten not below the largest bar.
            let e = max.ilog10();
            YScale::Log {
                top: if 10u64.pow(e) == max {
                    max
                } else {
                    10u64.pow(e + 1)
                },
            }
        } else {
            YScale::Linear {
                top: Self::linear_ticks(max).last().copied().unwrap_or(1),
            }
        }
    }

    /// 0 and multiples of a 1, 2 or 5 × 10^k step up to at least `max`.
    fn linear_ticks(max: u64) -> Vec<u64> {
        let max = max.max(1);
        let raw = max.div_ceil(5);
        let mag = 10u64.pow(raw.ilog10());
        let step = [1, 2, 5, 10]
            .into_iter()
            .map(|m| m * mag)
            .find(|&s| s >= raw)
            .unwrap_or(10 * mag);
        (0..=max.div_ceil(step)).map(|k| k * step).collect()
    }

    fn ticks(&self) -> Vec<u64> {
        match *self {
            YScale::Linear { top } => Self::linear_ticks(top),
            YScale::Log { top } => (0..=top.ilog10()).map(|e| 10u64.pow(e)).collect(),
        }
    }

    fn pos(&self, n: u64) -> f64 {
        match *self {
            YScale::Linear { top } => n as f64 / top as f64,
            YScale::Log { top } if n > 0 => (n as f64 / 0.5).ln() / (top as f64 / 0.5).ln(),
            YScale::Log { .. } => 0.0,
        }
    }

    fn desc(&self) -> &'static str {
        match self {
            YScale::Linear { .. } => "folios",
            YScale::Log { .. } => "folios (log scale)",
        }
    }
}

/// Draws `reports` into the SVG file at `path`; `title` says what was
/// scanned (the processes or cgroup, or the workload and snapshot).
pub fn write_svg(title: &str, reports: &[(&str, &UtilizationReport)], path: &Path) -> Result<()> {
    let svg = render_svg(title, reports)?;
    svg::write(path, svg)
}

fn render_svg(title: &str, reports: &[(&str, &UtilizationReport)]) -> Result<String> {
    let panels = panels(reports)?;
    let nrep = reports.len().max(1) as u32;
    let nbuckets = panels.iter().map(|p| p.bounds.len()).max().unwrap_or(1) as u32;
    let width = (130 + nbuckets * nrep * BAR_PX).max(960);
    let verdicts = verdict_lines(reports, width);
    let header_px = HEADER_PX + VERDICT_PX * verdicts.len() as u32;
    let panel_px = TITLE_PX + LINE_PX * nrep + CHART_PX;
    // "No large folios" needs only its title lines.
    let height = if panels.is_empty() {
        header_px + TITLE_PX + LINE_PX * nrep + 16
    } else {
        header_px + panel_px * panels.len() as u32
    };
    svg::render(
        (width, height),
        header_px,
        |head| draw_header(head, title, reports, &verdicts),
        |body| {
            if panels.is_empty() {
                return draw_empty(body, reports);
            }
            for (area, panel) in body.split_evenly((panels.len(), 1)).iter().zip(&panels) {
                draw_panel(area, panel, reports)?;
            }
            Ok(())
        },
    )
}

/// The shrinker's verdict of every report that has large folios (the text
/// report's own words, [`give_back`]), wrapped to the chart's width: each
/// line with the index of its report, for its colour.
fn verdict_lines(reports: &[(&str, &UtilizationReport)], width: u32) -> Vec<(usize, String)> {
    // Without a font library text widths are unknown: ~7.5 px a character.
    let max_chars = (width as usize - 24) * 2 / 15;
    let mut out = Vec::new();
    for (i, (name, report)) in reports.iter().enumerate() {
        if report.sizes.is_empty() {
            continue;
        }
        let mut text = give_back(report);
        if reports.len() > 1 {
            text = format!("{name}: {text}");
        }
        for para in text.lines() {
            out.extend(
                table::wrap(para, max_chars, max_chars)
                    .into_iter()
                    .map(|line| (i, line)),
            );
        }
    }
    out
}

fn draw_header(
    area: &Area,
    title: &str,
    reports: &[(&str, &UtilizationReport)],
    verdicts: &[(usize, String)],
) -> Result<()> {
    svg::draw_title(area, format!("THP utilization: {title}"))?;
    let mut x = 12;
    for (i, (name, _)) in reports.iter().enumerate() {
        area.draw(&Rectangle::new([(x, 42), (x + 15, 57)], colour(i).filled()))?;
        area.draw(&Text::new(name.to_string(), (x + 21, 42), (FONT, 17)))?;
        // Without a font library text widths are unknown: ~9 px a character.
        x += 21 + 9 * name.chars().count() as i32 + 28;
    }
    // The conclusion before the histograms: what the shrinker would do.
    svg::draw_coloured_lines(
        area,
        verdicts.iter().map(|(i, line)| (*i, line.as_str())),
        (12, 68),
        VERDICT_PX as i32,
        LINE_SIZE,
    )?;
    let notes_y = 68 + (VERDICT_PX * verdicts.len() as u32) as i32 + 4;
    let notes = [
        "Bars: fully mapped folios per bucket of subpages in use (mapped and not zero-filled). Dashed line: the under-used threshold.",
        "Bar labels: their zero-filled memory. Partially mapped folios: counted under each title, not bucketed.",
    ];
    svg::draw_notes(area, &notes, notes_y)
}

/// The title lines of a panel: the heading, then one line per report.
fn draw_titles(area: &Area, heading: &str, lines: &[String]) -> Result<()> {
    svg::draw_heading(area, heading.to_string(), (12, 6), 20)?;
    svg::draw_coloured_lines(
        area,
        lines.iter().map(String::as_str).enumerate(),
        (24, TITLE_PX as i32),
        LINE_PX as i32,
        16,
    )
}

fn draw_empty(area: &Area, reports: &[(&str, &UtilizationReport)]) -> Result<()> {
    let lines: Vec<String> = reports
        .iter()
        .map(|(name, _)| format!("{name}: no large folios"))
        .collect();
    draw_titles(area, "no large folios", &lines)
}

fn draw_panel(area: &Area, panel: &Panel, reports: &[(&str, &UtilizationReport)]) -> Result<()> {
    let nrep = reports.len().max(1);
    let lines: Vec<String> = reports
        .iter()
        .zip(&panel.per_report)
        .map(|((name, _), size)| match size {
            Some(s) => format!(
                "{name}: {} folios, {} partially mapped; {} zero-filled",
                s.folios(),
                s.partial_folios,
                fmt_kb(s.zero_pages() * PAGE_KB)
            ),
            None => format!("{name}: no {} kB folios", panel.size_kb),
        })
        .collect();
    let (titles, chart_area) = area.split_vertically(TITLE_PX + LINE_PX * nrep as u32);
    draw_titles(&titles, &format!("{} kB folios", panel.size_kb), &lines)?;

    let counts = panel
        .per_report
        .iter()
        .flatten()
        .flat_map(|s| s.buckets.iter().map(|b| b.folios));
    let scale = YScale::new(counts);
    let ticks = scale.ticks();
    // A hand-built report may have no buckets: one empty one keeps the axis.
    let nb = panel.bounds.len().max(1);
    let centres: Vec<i32> = (0..nb).map(|i| xc(i as f64 + 0.5)).collect();
    let mut chart = svg::chart(&chart_area, 44, 72).build_cartesian_2d(
        (0..xc(nb as f64)).with_key_points(centres),
        (0..yc(Y_TOP)).with_key_points(ticks.iter().map(|&t| yc(scale.pos(t))).collect()),
    )?;
    let x_label = |x: &i32| {
        panel
            .bounds
            .get(category(*x))
            .map_or(String::new(), |&(lo, hi)| bucket_label(lo, hi))
    };
    // Key points are tick positions: label each with its folio count.
    let y_label = |y: &i32| {
        ticks
            .iter()
            .min_by_key(|&&t| (yc(scale.pos(t)) - y).abs())
            .map_or(String::new(), u64::to_string)
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("subpages in use")
        .y_desc(scale.desc())
        .x_label_formatter(&x_label)
        .y_label_formatter(&y_label)
        .label_style(TICK_FONT)
        .axis_desc_style(AXIS_DESC_FONT)
        .draw()?;

    // A bucket's group takes 80% of its width, split evenly between reports.
    let bar_w = 0.8 / nrep as f64;
    let label_style = TextStyle::from((FONT, 13).into_font())
        .pos(Pos::new(HPos::Center, VPos::Bottom))
        .color(&BLACK);
    for (r, size) in panel.per_report.iter().enumerate() {
        let Some(size) = size else { continue };
        let left = |i: usize| i as f64 + 0.1 + r as f64 * bar_w;
        let bars = size
            .buckets
            .iter()
            .enumerate()
            .filter(|(_, b)| b.folios > 0);
        chart.draw_series(bars.clone().map(|(i, b)| {
            Rectangle::new(
                [
                    (xc(left(i) + bar_w * 0.05), 0),
                    (xc(left(i) + bar_w * 0.95), yc(scale.pos(b.folios))),
                ],
                colour(r).filled(),
            )
        }))?;
        chart.draw_series(bars.map(|(i, b)| {
            EmptyElement::at((xc(left(i) + bar_w / 2.0), yc(scale.pos(b.folios))))
                + Text::new(fmt_kb(b.zero_pages * PAGE_KB), (0, -3), label_style.clone())
        }))?;
    }

    if panel.order == HPAGE_PMD_ORDER {
        draw_threshold(&mut chart, panel, reports)?;
    }
    Ok(())
}

/// The under-used threshold: only PMD-sized THPs are judged, and a fully
/// mapped one is under-used when more than max_ptes_none of its subpages
/// are zero-filled (thp_underused), i.e. fewer than nr - max_ptes_none
/// are in use. One dashed line per distinct setting, annotated with what
/// the shrinker gives back from the THPs left of it.
fn draw_threshold(
    chart: &mut Chart,
    panel: &Panel,
    reports: &[(&str, &UtilizationReport)],
) -> Result<()> {
    let nrep = reports.len().max(1);
    let nb = panel.bounds.len().max(1);
    let nr = 1u32 << panel.order;
    let mut drawn: Vec<u32> = Vec::new();
    let mut k = 0;
    for (r, (name, report)) in reports.iter().enumerate() {
        let s = report.settings;
        if !s.shrink_underused || s.max_ptes_none >= MAX_PTES_NONE_OFF {
            continue;
        }
        let x = threshold_x(&panel.bounds, nr - s.max_ptes_none);
        let right_half = x > nb as f64 / 2.0;
        let hpos = if right_half { HPos::Right } else { HPos::Left };
        let dx = if right_half { -6 } else { 6 };
        let c = colour(r);
        let text_at = |k: usize| {
            let style = TextStyle::from((FONT, 14).into_font())
                .pos(Pos::new(hpos, VPos::Top))
                .color(&c);
            (style, (dx, 4 + 17 * k as i32))
        };
        if !drawn.contains(&s.max_ptes_none) {
            drawn.push(s.max_ptes_none);
            // Dashes of 1/30 of the height, as many gaps.
            let dash = yc(Y_TOP) / 60;
            chart.draw_series((0..30).map(|d| {
                PathElement::new(
                    vec![(xc(x), 2 * d * dash), (xc(x), (2 * d + 1) * dash)],
                    BLACK.stroke_width(2),
                )
            }))?;
        }
        let g = &report.give_back;
        let (style, offset) = text_at(k);
        let who = if nrep > 1 {
            format!("{name}: ")
        } else {
            String::new()
        };
        chart.draw_series(std::iter::once(
            EmptyElement::at((xc(x), yc(Y_TOP)))
                + Text::new(
                    format!(
                        "{who}max_ptes_none={}: under-used below {} subpages in use",
                        s.max_ptes_none,
                        nr - s.max_ptes_none
                    ),
                    offset,
                    style,
                ),
        ))?;
        let (style, offset) = text_at(k + 1);
        k += 2;
        chart.draw_series(std::iter::once(
            EmptyElement::at((xc(x), yc(Y_TOP)))
                + Text::new(
                    format!(
                        "the shrinker splits {} and gives back {}",
                        plural(g.underused_folios, "THP", "THPs"),
                        fmt_kb(g.underused_kb)
                    ),
                    offset,
                    style,
                ),
        ))?;
    }
    Ok(())
}

/// The x of the boundary before `used` subpages in use on an axis of
/// `bounds` buckets (one unit each): inside a bucket, in proportion.
fn threshold_x(bounds: &[(u32, u32)], used: u32) -> f64 {
    let i = bounds.partition_point(|&(_, hi)| hi < used);
    match bounds.get(i) {
        Some(&(lo, hi)) => i as f64 + f64::from(used.saturating_sub(lo)) / f64::from(hi - lo + 1),
        None => bounds.len() as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hugelab_workload::utilization::{
        bucket_bounds, Bucket, GiveBack, ShrinkerSettings, DEFAULT_BUCKETS,
    };

    fn size(order: u8, folios: &[u64], partial: u64) -> SizeUtilization {
        let nr = 1u32 << order;
        SizeUtilization {
            order,
            size_kb: PAGE_KB << order,
            buckets: bucket_bounds(nr, DEFAULT_BUCKETS)
                .into_iter()
                .enumerate()
                .map(|(i, (lo, hi))| {
                    let n = folios.get(i).copied().unwrap_or(0);
                    Bucket {
                        lo,
                        hi,
                        folios: n,
                        // Every folio of the bucket at its fewest used pages.
                        zero_pages: n * u64::from(nr - lo),
                    }
                })
                .collect(),
            partial_folios: partial,
            partial_mapped_pages: partial * u64::from(nr / 2),
            partial_zero_pages: partial * 3,
            pmd_mapped: folios.iter().sum(),
        }
    }

    fn report_at(max_ptes_none: u32, shrink_underused: bool) -> UtilizationReport {
        UtilizationReport {
            settings: ShrinkerSettings {
                max_ptes_none,
                shrink_underused,
            },
            buckets: DEFAULT_BUCKETS,
            sizes: vec![
                size(4, &[3, 0, 0, 0, 0, 0, 0, 0, 0, 5], 2),
                size(9, &[1200, 7, 0, 0, 3, 0, 0, 0, 0, 5400], 12),
            ],
            give_back: GiveBack {
                underused_folios: 1207,
                underused_kb: 2_459_000,
                partial_folios: 14,
                partial_kb: 168,
                partial_unmapped_kb: 40,
                rss_kb: 2_459_168,
            },
            bloat: vec![
                Bloat {
                    cause: FolioCause::Fault,
                    size_kb: 64,
                    folios: 8,
                    never_written_kb: 192,
                },
                Bloat {
                    cause: FolioCause::Fault,
                    size_kb: 2048,
                    folios: 6000,
                    never_written_kb: 2_400_000,
                },
                Bloat {
                    cause: FolioCause::Khugepaged,
                    size_kb: 2048,
                    folios: 600,
                    never_written_kb: 70_000,
                },
            ],
        }
    }

    fn empty() -> UtilizationReport {
        UtilizationReport {
            sizes: vec![],
            give_back: GiveBack::default(),
            bloat: vec![],
            ..report_at(409, true)
        }
    }

    use crate::table::row_cells as cells;

    #[test]
    fn table_has_seed_buckets_and_numbers() {
        let t = render_table(&report_at(409, true), "test");
        // Non-empty buckets have their row, runs of empty ones one row.
        for range in [
            "0-50",
            "51-101",
            "102-203 (none)",
            "204-255",
            "256-459 (none)",
            "460-512",
        ] {
            assert!(t.contains(&format!("| {range} ")), "no {range} row:\n{t}");
        }
        for range in ["102-152", "153-203", "256-306", "409-459"] {
            assert!(!t.contains(&format!("| {range} ")), "{range} row:\n{t}");
        }
        // The first 2048 kB bucket: 1200 folios, 1200 * 512 zero-filled pages.
        assert_eq!(
            cells(&t, "0-50"),
            ["0-50", "1200", "614400", "2.34 GiB", "68.3%"]
        );
        assert_eq!(cells(&t, "460-512")[1], "5400");
        assert_eq!(
            cells(&t, "partially mapped"),
            ["partially mapped", "2", "6", "24 kB", "9.4%"]
        );
        assert!(
            t.contains("2048 kB folios: 6622, 12 partially mapped"),
            "{t}"
        );
        assert!(t.contains("64 kB folios: 10, 2 partially mapped;"), "{t}");
        assert!(t.contains("max_ptes_none=409, shrink_underused=1: it would give back"));
        assert!(t.contains("it would split 1207 THPs as under-used"), "{t}");
        assert!(t.contains("free 2459000 kB (2.35 GiB)"), "{t}");
        assert!(
            t.contains(
                "it would split 14 folios and free 40 kB of subpages no scanned process maps \
                 (in no Rss) and 168 kB of zero-filled ones"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "it would give back 2459208 kB (2.35 GiB) to the machine (and to the memory \
                 cgroups' charge), and the Rss of what was scanned would drop by 2459168 kB"
            ),
            "{t}"
        );
        assert!(!t.contains("Nothing is split as under-used"), "{t}");
        // Never-written memory: by cause and size, totals both ways.
        assert!(t.contains("Never-written memory by cause and size"), "{t}");
        assert_eq!(
            cells(&t, "khugepaged"),
            ["khugepaged", "-", "68.4 MiB (600)", "68.4 MiB (600)"]
        );
        assert_eq!(
            cells(&t, "all causes"),
            [
                "all causes",
                "192 kB (8)",
                "2.36 GiB (6600)",
                "2.36 GiB (6608)"
            ]
        );
    }

    #[test]
    fn table_gives_the_verdict_before_the_histograms() {
        let t = render_table(&report_at(409, true), "test");
        let verdict = t.find("it would split 1207 THPs").expect("a verdict");
        let histogram = t.find("kB folios:").expect("a histogram");
        assert!(verdict < histogram, "{t}");
        // No partially mapped folio of a size: no row for them.
        let mut r = report_at(409, true);
        r.sizes[0].partial_folios = 0;
        r.sizes[1].partial_folios = 0;
        let t = render_table(&r, "test");
        assert!(!t.contains("| partially mapped"), "{t}");
    }

    #[test]
    fn svg_draws_the_threshold_the_give_back_and_its_title() {
        let path = temp_svg("threshold");
        write_svg(
            "process 42 (cat)",
            &[("scan", &report_at(409, true))],
            &path,
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let texts = check_tags(&svg);
        let has = |t: &str| texts.iter().any(|x| x.contains(t));
        assert!(has("THP utilization: process 42 (cat)"), "{texts:?}");
        assert!(
            has("max_ptes_none=409: under-used below 103 subpages in use"),
            "{texts:?}"
        );
        assert!(
            has("the shrinker splits 1207 THPs and gives back 2.35 GiB"),
            "{texts:?}"
        );
        assert!(has("it would split 1207 THPs"), "{texts:?}");
        // The line: 103 in use is 1/51 into bucket 102-152 (index 2).
        assert_eq!(threshold_x(&bucket_bounds(512, 10), 103), 2.0 + 1.0 / 51.0);
        // At 511 nothing is under-used: no line, no annotation.
        let path = temp_svg("off");
        write_svg("off", &[("scan", &report_at(511, true))], &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(!svg.contains("under-used below"), "{svg}");
    }

    #[test]
    fn table_says_why_nothing_is_split_as_underused() {
        let t = render_table(&report_at(511, true), "off");
        assert!(t.contains("Nothing is split as under-used: at max_ptes_none=511"));
        let t = render_table(&report_at(409, false), "disabled");
        assert!(t.contains("Nothing is split as under-used: shrink_underused is 0"));
    }

    #[test]
    fn table_of_no_large_folios() {
        let t = render_table(&empty(), "empty");
        assert!(t.contains("no large folios"), "{t}");
        assert!(!t.contains("Never-written"), "{t}");
    }

    #[test]
    fn y_scale() {
        assert_eq!(YScale::linear_ticks(7), [0, 2, 4, 6, 8]);
        assert_eq!(YScale::linear_ticks(0), [0, 1]);
        let log = YScale::new([1200u64, 7, 0, 5400].into_iter());
        assert!(matches!(log, YScale::Log { top: 10000 }));
        assert_eq!(log.ticks(), [1, 10, 100, 1000, 10000]);
        assert!(log.pos(1) > 0.0 && (log.pos(10000) - 1.0).abs() < 1e-9);
        assert!(matches!(
            YScale::new([3u64, 5].into_iter()),
            YScale::Linear { top: 5 }
        ));
    }

    /// The text of the `<text>` elements, checking on the way that the SVG
    /// is one `<svg>` element whose tags open and close in order.
    fn check_tags(svg: &str) -> Vec<String> {
        let mut open: Vec<&str> = Vec::new();
        let mut texts = Vec::new();
        let mut rest = svg;
        while let Some(start) = rest.find('<') {
            if open.last() == Some(&"text") {
                texts.push(rest[..start].trim().to_string());
            }
            let end = rest[start..].find('>').expect("unclosed tag") + start;
            let tag = &rest[start + 1..end];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name.trim()), "misnested </{name}>");
                if open.is_empty() {
                    assert!(rest[end + 1..].trim().is_empty(), "content after </svg>");
                }
            } else {
                let name = tag.split_whitespace().next().unwrap_or("");
                let name = name.trim_end_matches('/');
                assert!(open.is_empty() == (name == "svg"), "<{name}> out of <svg>");
                if !tag.ends_with('/') {
                    open.push(name);
                }
            }
            rest = &rest[end + 1..];
        }
        assert!(open.is_empty(), "unclosed {open:?}");
        texts
    }

    fn temp_svg(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!(
            "hugelab-utilization-view-{name}-{}.svg",
            std::process::id()
        ))
    }

    #[test]
    fn svg_has_a_panel_per_size_and_a_legend() {
        let before = report_at(409, true);
        let mut after = report_at(409, true);
        after.sizes.truncate(1);
        let path = temp_svg("two");
        write_svg("test", &[("before", &before), ("after", &after)], &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        let texts = check_tags(&svg);
        let has = |t: &str| texts.iter().any(|x| x == t);
        // One title per size, the legend, one totals line per report.
        assert!(has("64 kB folios") && has("2048 kB folios"), "{texts:?}");
        assert!(has("before") && has("after"), "{texts:?}");
        assert!(has("after: no 2048 kB folios"), "{texts:?}");
        assert!(has(
            "before: 6622 folios, 12 partially mapped; 3.43 GiB zero-filled"
        ));
        assert!(has("460-512") && has("subpages in use") && has("folios (log scale)"));
        // A zero-filled label: 1200 folios of bucket 0-50, 512 zero pages each.
        assert!(has("2.34 GiB"), "{texts:?}");
    }

    #[test]
    fn svg_of_no_large_folios() {
        let path = temp_svg("empty");
        write_svg("test", &[("model", &empty())], &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let texts = check_tags(&svg);
        assert!(texts.iter().any(|t| t == "no large folios"), "{texts:?}");
        assert!(texts.iter().any(|t| t == "model"), "{texts:?}");
        assert!(!svg.contains("kB folios"));
    }

    #[test]
    fn svg_write_error_names_the_path() {
        let path = Path::new("/nonexistent-dir/utilization.svg");
        let err = write_svg("test", &[("model", &empty())], path).unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent-dir/utilization.svg"));
    }

    #[test]
    fn svg_refuses_different_buckets() {
        let a = report_at(409, true);
        let mut b = report_at(409, true);
        b.sizes[1].buckets.truncate(5);
        let err = render_svg("test", &[("a", &a), ("b", &b)]).unwrap_err();
        assert!(err
            .to_string()
            .contains("bucket 2048 kB folios differently"));
    }
}
