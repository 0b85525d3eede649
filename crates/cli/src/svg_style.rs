//! What every SVG of hugelab shares: the categorical palette, one colour
//! per series (report, setting) in legend order.

use plotters::style::RGBColor;

pub const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

pub fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}
