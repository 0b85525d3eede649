//! What every SVG of hugelab shares (`bench_plot.rs`, `utilization_view.rs`):
//! the drawing (a white page, a header band above the charts), the fonts and
//! styles, the header's title and its lines of text (verdicts, notes on what
//! the marks are), the title lines of a panel, the chart margins, the
//! fixed-point axis of categories and the categorical palette.

use anyhow::{Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// The drawing area of an SVG being written.
pub type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// The font of every text.
pub const FONT: &str = "sans-serif";
/// Tick labels of the axes.
pub const TICK_FONT: (&str, u32) = (FONT, 15);
/// The description of an axis.
pub const AXIS_DESC_FONT: (&str, u32) = (FONT, 16);
/// The size of the header's lines of text (verdicts, notes).
pub const LINE_SIZE: u32 = 15;
/// The left edge of every line of text in the header.
const LEFT_PX: i32 = 12;
/// From one note line to the next.
const NOTE_PX: i32 = 20;

pub const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// One colour per series (report, setting) in legend order.
pub fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

/// An SVG of `size` pixels on white: the top `header_px` drawn by
/// `header`, the rest by `body`.
pub fn render(
    size: (u32, u32),
    header_px: u32,
    header: impl FnOnce(&Area) -> Result<()>,
    body: impl FnOnce(&Area) -> Result<()>,
) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)?;
        let (head, rest) = root.split_vertically(header_px);
        header(&head)?;
        body(&rest)?;
        root.present()?;
    }
    Ok(svg)
}

/// Writes `svg` to `path`, the error naming the path.
pub fn write(path: &Path, svg: String) -> Result<()> {
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))
}

/// The figure's title, top left of the header.
pub fn draw_title(area: &Area, title: String) -> Result<()> {
    area.draw(&Text::new(
        title,
        (LEFT_PX, 10),
        (FONT, 22, FontStyle::Bold),
    ))?;
    Ok(())
}

/// Lines one under the other from `at`, `step` apart, each in the colour
/// of its series (the index beside it): the verdicts of a header, the
/// per-series lines under a panel's heading.
pub fn draw_coloured_lines<'s>(
    area: &Area,
    lines: impl IntoIterator<Item = (usize, &'s str)>,
    at: (i32, i32),
    step: i32,
    size: u32,
) -> Result<()> {
    for (k, (i, line)) in lines.into_iter().enumerate() {
        area.draw(&Text::new(
            line,
            (at.0, at.1 + step * k as i32),
            (FONT, size).into_font().color(&colour(i)),
        ))?;
    }
    Ok(())
}

/// The notes on what the marks are, in grey, from `y` down.
pub fn draw_notes<S: AsRef<str>>(area: &Area, notes: &[S], y: i32) -> Result<()> {
    for (i, note) in notes.iter().enumerate() {
        area.draw(&Text::new(
            note.as_ref(),
            (LEFT_PX, y + NOTE_PX * i as i32),
            (FONT, LINE_SIZE).into_font().color(&BLACK.mix(0.7)),
        ))?;
    }
    Ok(())
}

/// A panel's heading, bold, at `pos` in the panel.
pub fn draw_heading(area: &Area, heading: String, pos: (i32, i32), size: u32) -> Result<()> {
    area.draw(&Text::new(heading, pos, (FONT, size, FontStyle::Bold)))?;
    Ok(())
}

/// The chart of a panel, with every panel's margins and room for the axes'
/// labels.
pub fn chart<'a, 'b, 'c>(
    area: &'a Area<'b>,
    x_label_px: u32,
    y_label_px: u32,
) -> ChartBuilder<'a, 'c, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(area);
    builder
        .margin_left(12)
        .margin_right(24)
        .margin_bottom(8)
        .x_label_area_size(x_label_px)
        .y_label_area_size(y_label_px);
    builder
}

/// Chart units per category (setting, bucket) on an x axis of categories:
/// plotters labels the key points of integer axes only, so such an axis is
/// fixed point, `0..xc(n)`, its key points the categories' centres.
pub const X_UNIT: f64 = 1000.0;

/// A chart x, in categories, in fixed point.
pub fn xc(x: f64) -> i32 {
    (x * X_UNIT).round() as i32
}

/// The category under a fixed-point x, for its label.
pub fn category(x: i32) -> usize {
    (x as f64 / X_UNIT).floor() as usize
}
