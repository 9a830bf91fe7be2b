//! SVG charts for experiment results, written by hand so that figures depend on no plotting
//! library and no installed font (text uses the generic `sans-serif` family, and layout
//! estimates text width from the character count).
//!
//! Terms:
//! - a [`Figure`] is a grid of [`Panel`]s with an overall title;
//! - a *bar panel* ([`BarPanel`]) shows *groups* of bars: one group per *category* (an x
//!   position, e.g. a latency) and one bar per *series* (e.g. with and without hints);
//! - a *line panel* ([`LinePanel`]) shows series of (x, y) points joined by lines;
//! - an axis is linear from zero or logarithmic ([`AxisScale`]); ticks are "nice" numbers
//!   (1, 2 or 5 times a power of ten) chosen by [`nice_ticks`].
//!
//! Missing values are `f64::NAN` and are simply not drawn; a log axis also skips values <= 0.
//!
//! A panel with *ranges* ([`Panel::RangedLines`], [`Panel::RangedBars`]) draws an error bar
//! at each value: a vertical line from the low to the high end of the range with short caps,
//! in the colour of its series (for example the minimum and maximum of repeated runs whose
//! mean is the value).

use std::fmt::Write as _;

/// Width of one panel in pixels unless a figure says otherwise.
pub const PANEL_WIDTH_DEFAULT: u32 = 420;
/// Height of one panel in pixels unless a figure says otherwise.
pub const PANEL_HEIGHT_DEFAULT: u32 = 300;
/// Most ticks an axis aims for.
const TICKS_TARGET: usize = 6;
/// Colour-blind-safe palette (Okabe and Ito), used in order by series.
const PALETTE: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
];
/// Font sizes in pixels.
const TITLE_FONT: f64 = 16.0;
const PANEL_TITLE_FONT: f64 = 13.0;
const LABEL_FONT: f64 = 11.0;
const VALUE_FONT: f64 = 9.0;
/// Margins of the plot area inside a panel.
const MARGIN_LEFT: f64 = 62.0;
const MARGIN_RIGHT: f64 = 12.0;
const MARGIN_TOP: f64 = 44.0;
const MARGIN_BOTTOM: f64 = 44.0;
/// Height of the figure title band holding one line of title; each further line of a title
/// too wide for the canvas adds [`TITLE_LINE`].
const TITLE_BAND: f64 = 30.0;
const TITLE_LINE: f64 = 20.0;
/// Space kept clear at each side of a title.
const TITLE_PADDING: f64 = 10.0;
/// Most entries in one column of a legend; more go to further columns.
const LEGEND_ROWS_MAX: usize = 4;
/// Clear space between the highest value and the legend above it.
const LEGEND_GAP: f64 = 6.0;

/// How values map to the vertical (or, for lines, horizontal) axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AxisScale {
    /// From zero to a nice maximum.
    Linear,
    /// Powers of ten around the positive values.
    Log10,
}

/// One named row of values of a bar panel, one value per category.
#[derive(Clone, Debug)]
pub struct BarSeries {
    pub name: String,
    pub values: Vec<f64>,
}

/// Grouped bars; see the module documentation.
#[derive(Clone, Debug)]
pub struct BarPanel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub y_scale: AxisScale,
    pub categories: Vec<String>,
    pub series: Vec<BarSeries>,
    /// Print each value above its bar.
    pub value_labels: bool,
}

/// One named line of a line panel.
#[derive(Clone, Debug)]
pub struct LineSeries {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Lines over a numeric x axis.
#[derive(Clone, Debug)]
pub struct LinePanel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_scale: AxisScale,
    pub y_scale: AxisScale,
    pub series: Vec<LineSeries>,
}

/// The (low, high) error range of every value of a panel: one list per series, aligned with
/// the series' points (lines) or values (bars). A missing list or a NaN end draws no bar.
pub type Ranges = Vec<Vec<(f64, f64)>>;

/// One chart of a figure.
#[derive(Clone, Debug)]
pub enum Panel {
    Bars(BarPanel),
    Lines(LinePanel),
    /// Bars with an error bar on each value.
    RangedBars(BarPanel, Ranges),
    /// Lines with an error bar on each point.
    RangedLines(LinePanel, Ranges),
}

/// Panels in a grid, filled row by row.
#[derive(Clone, Debug)]
pub struct Figure {
    pub title: String,
    pub columns: usize,
    pub panel_width: u32,
    pub panel_height: u32,
    pub panels: Vec<Panel>,
}

impl Figure {
    /// A figure with default panel sizes.
    pub fn new(title: impl Into<String>, columns: usize) -> Figure {
        Figure {
            title: title.into(),
            columns,
            panel_width: PANEL_WIDTH_DEFAULT,
            panel_height: PANEL_HEIGHT_DEFAULT,
            panels: Vec::new(),
        }
    }

    /// The figure as a standalone SVG document. A title wider than the canvas is wrapped at
    /// spaces onto as many lines as it needs, so no text leaves the canvas.
    pub fn to_svg(&self) -> String {
        assert!(self.columns > 0, "a figure needs at least one column");
        let rows = self.panels.len().div_ceil(self.columns).max(1);
        let width = self.panel_width as f64 * self.columns as f64;
        let title_lines = wrap_text(&self.title, width - 2.0 * TITLE_PADDING, TITLE_FONT, true);
        let title_band = TITLE_BAND + TITLE_LINE * (title_lines.len() as f64 - 1.0);
        let height = title_band + self.panel_height as f64 * rows as f64;
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">"#
        );
        let _ = writeln!(
            svg,
            r#"<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>"#
        );
        for (line, content) in title_lines.iter().enumerate() {
            text(
                &mut svg,
                width / 2.0,
                20.0 + TITLE_LINE * line as f64,
                TITLE_FONT,
                "middle",
                "bold",
                content,
            );
        }
        for (index, panel) in self.panels.iter().enumerate() {
            let frame = Frame {
                left: (index % self.columns) as f64 * self.panel_width as f64,
                top: title_band + (index / self.columns) as f64 * self.panel_height as f64,
                width: self.panel_width as f64,
                height: self.panel_height as f64,
            };
            match panel {
                Panel::Bars(bars) => draw_bars(&mut svg, &frame, bars, &[]),
                Panel::Lines(lines) => draw_lines(&mut svg, &frame, lines, &[]),
                Panel::RangedBars(bars, ranges) => draw_bars(&mut svg, &frame, bars, ranges),
                Panel::RangedLines(lines, ranges) => draw_lines(&mut svg, &frame, lines, ranges),
            }
        }
        svg.push_str("</svg>\n");
        svg
    }
}

/// Where a panel sits in the figure.
struct Frame {
    left: f64,
    top: f64,
    width: f64,
    height: f64,
}

impl Frame {
    fn plot_left(&self) -> f64 {
        self.left + MARGIN_LEFT
    }
    fn plot_right(&self) -> f64 {
        self.left + self.width - MARGIN_RIGHT
    }
    fn plot_top(&self) -> f64 {
        self.top + MARGIN_TOP
    }
    fn plot_bottom(&self) -> f64 {
        self.top + self.height - MARGIN_BOTTOM
    }
}

/// A value axis: its range, scale and ticks.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    pub scale: AxisScale,
    pub minimum: f64,
    pub maximum: f64,
    pub ticks: Vec<f64>,
}

impl Axis {
    /// An axis covering `values` (NaN, and for a log axis values <= 0, are ignored).
    pub fn covering(scale: AxisScale, values: impl IntoIterator<Item = f64>) -> Axis {
        let usable: Vec<f64> = values
            .into_iter()
            .filter(|value| value.is_finite() && (scale == AxisScale::Linear || *value > 0.0))
            .collect();
        match scale {
            AxisScale::Linear => {
                let high = usable.iter().copied().fold(0.0f64, f64::max);
                let low = usable.iter().copied().fold(0.0f64, f64::min);
                let ticks = nice_ticks(low, if high > low { high } else { low + 1.0 });
                Axis {
                    scale,
                    minimum: ticks[0],
                    maximum: *ticks.last().expect("nice_ticks returns two or more"),
                    ticks,
                }
            }
            AxisScale::Log10 => {
                let low = usable.iter().copied().fold(f64::INFINITY, f64::min);
                let high = usable.iter().copied().fold(0.0f64, f64::max);
                let (low_power, high_power) = if usable.is_empty() {
                    (0, 1)
                } else {
                    let low_power = low.log10().floor() as i32;
                    let high_power = (high.log10().ceil() as i32).max(low_power + 1);
                    (low_power, high_power)
                };
                let ticks = (low_power..=high_power)
                    .map(|power| 10f64.powi(power))
                    .collect();
                Axis {
                    scale,
                    minimum: 10f64.powi(low_power),
                    maximum: 10f64.powi(high_power),
                    ticks,
                }
            }
        }
    }

    /// Where `value` falls between 0 (minimum) and 1 (maximum); `None` if it cannot be drawn.
    pub fn fraction(&self, value: f64) -> Option<f64> {
        if !value.is_finite() {
            return None;
        }
        match self.scale {
            AxisScale::Linear => Some((value - self.minimum) / (self.maximum - self.minimum)),
            AxisScale::Log10 if value > 0.0 => Some(
                (value.log10() - self.minimum.log10())
                    / (self.maximum.log10() - self.minimum.log10()),
            ),
            AxisScale::Log10 => None,
        }
    }
}

/// Nice tick values (multiples of 1, 2 or 5 times a power of ten) from at most `low` to at
/// least `high`, about [`TICKS_TARGET`] of them. Requires `low < high`, both finite.
pub fn nice_ticks(low: f64, high: f64) -> Vec<f64> {
    assert!(
        low.is_finite() && high.is_finite(),
        "ticks of a finite range"
    );
    assert!(low < high, "ticks of an empty range {low}..{high}");
    let raw_step = (high - low) / (TICKS_TARGET - 1) as f64;
    let power = 10f64.powf(raw_step.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|factor| factor * power)
        .find(|step| *step >= raw_step)
        .expect("10 x power >= raw_step");
    let first = (low / step).floor() as i64;
    let last = (high / step).ceil() as i64;
    let ticks: Vec<f64> = (first..=last).map(|index| index as f64 * step).collect();
    assert!(ticks.len() >= 2);
    ticks
}

/// A short label for a tick or value: at most three significant digits, with k, M or G for
/// large values (`1500` -> `1.5k`) and plain decimals for small ones.
pub fn format_value(value: f64) -> String {
    if !value.is_finite() {
        return String::new();
    }
    let magnitude = value.abs();
    let (scaled, suffix) = if magnitude >= 1e9 {
        (value / 1e9, "G")
    } else if magnitude >= 1e6 {
        (value / 1e6, "M")
    } else if magnitude >= 1e3 {
        (value / 1e3, "k")
    } else {
        (value, "")
    };
    let digits = if scaled.abs() >= 100.0 || scaled == scaled.trunc() {
        0
    } else if scaled.abs() >= 10.0 {
        1
    } else if scaled.abs() >= 0.01 {
        2
    } else {
        return format!("{value:.1e}");
    };
    let mut text = format!("{scaled:.digits$}");
    if text.contains('.') {
        text = text.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    text + suffix
}

/// Escapes the characters XML gives meaning to.
pub fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            other => escaped.push(other),
        }
    }
    escaped
}

/// Estimated width in pixels of `content` at font size `size`: no font is embedded, so this
/// takes a generous average character width of the generic sans-serif family.
fn text_width(content: &str, size: f64, bold: bool) -> f64 {
    let average = if bold { 0.64 } else { 0.58 };
    content.chars().count() as f64 * size * average
}

/// `content` split at spaces into lines no wider than `width` (by [`text_width`]); a single
/// word wider than `width` gets a line of its own.
fn wrap_text(content: &str, width: f64, size: f64, bold: bool) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in content.split(' ') {
        match lines.last_mut() {
            Some(line) if text_width(&format!("{line} {word}"), size, bold) <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    if lines.is_empty() {
        lines.push(String::new());
    }
    lines
}

fn text(svg: &mut String, x: f64, y: f64, size: f64, anchor: &str, weight: &str, content: &str) {
    let _ = writeln!(
        svg,
        r#"<text x="{x:.1}" y="{y:.1}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}">{}</text>"#,
        escape(content)
    );
}

/// Title, axis labels, horizontal grid lines with tick labels, and the frame of a panel.
fn draw_frame(
    svg: &mut String,
    frame: &Frame,
    title: &str,
    x_label: &str,
    y_label: &str,
    axis: &Axis,
) {
    let (left, right) = (frame.plot_left(), frame.plot_right());
    let (top, bottom) = (frame.plot_top(), frame.plot_bottom());
    // A panel title too wide for its panel is set smaller, so that it stays inside it.
    let room = frame.width - 2.0 * TITLE_PADDING;
    let title_font =
        PANEL_TITLE_FONT.min(PANEL_TITLE_FONT * room / text_width(title, PANEL_TITLE_FONT, true));
    text(
        svg,
        frame.left + frame.width / 2.0,
        frame.top + 18.0,
        title_font,
        "middle",
        "bold",
        title,
    );
    text(
        svg,
        (left + right) / 2.0,
        frame.top + frame.height - 8.0,
        LABEL_FONT,
        "middle",
        "normal",
        x_label,
    );
    let label_x = frame.left + 14.0;
    let label_y = (top + bottom) / 2.0;
    let _ = writeln!(
        svg,
        r#"<text x="{label_x:.1}" y="{label_y:.1}" font-size="{LABEL_FONT}" text-anchor="middle" transform="rotate(-90 {label_x:.1} {label_y:.1})">{}</text>"#,
        escape(y_label)
    );
    for tick in &axis.ticks {
        let Some(fraction) = axis.fraction(*tick) else {
            continue;
        };
        let y = bottom - fraction * (bottom - top);
        let _ = writeln!(
            svg,
            r##"<line x1="{left:.1}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="#dddddd" stroke-width="1"/>"##
        );
        text(
            svg,
            left - 5.0,
            y + 4.0,
            LABEL_FONT,
            "end",
            "normal",
            &format_value(*tick),
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{left:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#333333" stroke-width="1"/>"##,
        right - left,
        bottom - top
    );
}

/// How a legend is laid out: entries fill columns of at most [`LEGEND_ROWS_MAX`] rows, left to
/// right.
struct LegendLayout {
    columns: usize,
    rows: usize,
    column_width: f64,
}

impl LegendLayout {
    fn new(names: &[&str]) -> LegendLayout {
        let longest = names
            .iter()
            .map(|name| text_width(name, LABEL_FONT, false))
            .fold(0.0, f64::max);
        let columns = names.len().div_ceil(LEGEND_ROWS_MAX).max(1);
        LegendLayout {
            columns,
            rows: names.len().div_ceil(columns),
            column_width: 26.0 + longest,
        }
    }

    fn row_height() -> f64 {
        LABEL_FONT + 4.0
    }

    fn width(&self) -> f64 {
        self.column_width * self.columns as f64
    }

    /// Height of the legend box, and so of the room kept for it above the data.
    fn height(&self) -> f64 {
        Self::row_height() * self.rows as f64 + 4.0
    }
}

/// A legend in the top-right corner of the plot area, one entry per series name.
fn draw_legend(svg: &mut String, frame: &Frame, names: &[&str], lines: bool) {
    if names.is_empty() {
        return;
    }
    let layout = LegendLayout::new(names);
    let row = LegendLayout::row_height();
    let x = frame.plot_right() - layout.width() - 4.0;
    let y = frame.plot_top() + 4.0;
    let _ = writeln!(
        svg,
        r##"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="white" fill-opacity="0.85" stroke="#999999"/>"##,
        layout.width(),
        layout.height()
    );
    for (index, name) in names.iter().enumerate() {
        let colour = PALETTE[index % PALETTE.len()];
        let entry_x = x + layout.column_width * (index / layout.rows) as f64;
        let row_y = y + 2.0 + row * (index % layout.rows) as f64;
        if lines {
            let _ = writeln!(
                svg,
                r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="2"/>"#,
                entry_x + 4.0,
                row_y + row / 2.0,
                entry_x + 18.0,
                row_y + row / 2.0
            );
        } else {
            let _ = writeln!(
                svg,
                r#"<rect x="{:.1}" y="{:.1}" width="12" height="{:.1}" fill="{colour}"/>"#,
                entry_x + 5.0,
                row_y + 2.0,
                row - 4.0
            );
        }
        text(
            svg,
            entry_x + 22.0,
            row_y + row - 3.0,
            LABEL_FONT,
            "start",
            "normal",
            name,
        );
    }
}

/// The axis extended by whole tick steps (powers of ten on a log axis) until the highest of
/// `values` lies below a legend of `names` in the top of a plot `plot_height` pixels tall,
/// so that the legend covers no data. At least one step is added.
fn with_legend_room(
    mut axis: Axis,
    values: impl IntoIterator<Item = f64>,
    names: &[&str],
    plot_height: f64,
) -> Axis {
    let highest = values
        .into_iter()
        .filter(|value| value.is_finite() && (axis.scale == AxisScale::Linear || *value > 0.0))
        .fold(f64::NEG_INFINITY, f64::max);
    let legend = if names.is_empty() {
        0.0
    } else {
        LegendLayout::new(names).height() + LEGEND_GAP
    };
    // A legend taller than most of the plot would squeeze the data flat; past that point it
    // may cover some, which the values' tooltips still show.
    let free = (1.0 - legend / plot_height).max(0.25);
    let step = axis.ticks[1] - axis.ticks[0];
    loop {
        match axis.scale {
            AxisScale::Linear => axis.maximum += step,
            AxisScale::Log10 => axis.maximum *= 10.0,
        }
        axis.ticks.push(axis.maximum);
        let fits = axis
            .fraction(highest)
            .is_none_or(|fraction| fraction <= free);
        if fits || axis.ticks.len() > 64 {
            return axis;
        }
    }
}

/// The high ends of `ranges`, so that an axis covers the error bars as well as the values.
fn range_highs(ranges: &[Vec<(f64, f64)>]) -> impl Iterator<Item = f64> + '_ {
    ranges.iter().flatten().map(|range| range.1)
}

/// The range of value `index` of series `series`, if it has one that can be drawn.
fn range_of(ranges: &[Vec<(f64, f64)>], series: usize, index: usize) -> Option<(f64, f64)> {
    let &(low, high) = ranges.get(series)?.get(index)?;
    (low.is_finite() && high.is_finite()).then_some((low, high))
}

/// An error bar at `x` from `low` to `high` on `axis` (ends the axis cannot show are clamped
/// to the plot area).
fn draw_error_bar(
    svg: &mut String,
    frame: &Frame,
    axis: &Axis,
    x: f64,
    (low, high): (f64, f64),
    colour: &str,
) {
    let (top, bottom) = (frame.plot_top(), frame.plot_bottom());
    let place = |value: f64| {
        let fraction = axis.fraction(value).unwrap_or(0.0).clamp(0.0, 1.0);
        bottom - fraction * (bottom - top)
    };
    let (y_low, y_high) = (place(low), place(high));
    let cap = 3.0;
    let _ = writeln!(
        svg,
        r#"<path class="error-bar" d="M{x:.1},{y_low:.1}V{y_high:.1}M{:.1},{y_low:.1}H{:.1}M{:.1},{y_high:.1}H{:.1}" stroke="{colour}" stroke-width="1" fill="none"><title>{} to {}</title></path>"#,
        x - cap,
        x + cap,
        x - cap,
        x + cap,
        escape(&format_value(low)),
        escape(&format_value(high))
    );
}

fn draw_bars(svg: &mut String, frame: &Frame, panel: &BarPanel, ranges: &[Vec<(f64, f64)>]) {
    for series in &panel.series {
        assert_eq!(
            series.values.len(),
            panel.categories.len(),
            "series {} needs one value per category",
            series.name
        );
    }
    // Room above the tallest bar for the legend.
    let values = || {
        panel
            .series
            .iter()
            .flat_map(|series| series.values.iter().copied())
            .chain(range_highs(ranges))
    };
    let names: Vec<&str> = panel
        .series
        .iter()
        .map(|series| series.name.as_str())
        .collect();
    let axis = with_legend_room(
        Axis::covering(panel.y_scale, values()),
        values(),
        &names,
        frame.plot_bottom() - frame.plot_top(),
    );
    draw_frame(
        svg,
        frame,
        &panel.title,
        &panel.x_label,
        &panel.y_label,
        &axis,
    );
    let (left, right) = (frame.plot_left(), frame.plot_right());
    let (top, bottom) = (frame.plot_top(), frame.plot_bottom());
    let groups = panel.categories.len().max(1) as f64;
    let group_width = (right - left) / groups;
    let bar_width = group_width * 0.8 / panel.series.len().max(1) as f64;
    for (category_index, category) in panel.categories.iter().enumerate() {
        let group_left = left + group_width * category_index as f64;
        text(
            svg,
            group_left + group_width / 2.0,
            bottom + 15.0,
            LABEL_FONT,
            "middle",
            "normal",
            category,
        );
        for (series_index, series) in panel.series.iter().enumerate() {
            let value = series.values[category_index];
            let Some(fraction) = axis.fraction(value) else {
                continue;
            };
            let fraction = fraction.clamp(0.0, 1.0);
            let x = group_left + group_width * 0.1 + bar_width * series_index as f64;
            let bar_top = bottom - fraction * (bottom - top);
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{bar_top:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                bar_width * 0.95,
                bottom - bar_top,
                PALETTE[series_index % PALETTE.len()],
                escape(&series.name),
                escape(&format_value(value))
            );
            let mut label_top = bar_top;
            if let Some(range) = range_of(ranges, series_index, category_index) {
                draw_error_bar(svg, frame, &axis, x + bar_width * 0.475, range, "#333333");
                label_top = label_top.min(
                    bottom - axis.fraction(range.1).unwrap_or(0.0).clamp(0.0, 1.0) * (bottom - top),
                );
            }
            if panel.value_labels {
                text(
                    svg,
                    x + bar_width * 0.475,
                    label_top - 3.0,
                    VALUE_FONT,
                    "middle",
                    "normal",
                    &format_value(value),
                );
            }
        }
    }
    draw_legend(svg, frame, &names, false);
}

fn draw_lines(svg: &mut String, frame: &Frame, panel: &LinePanel, ranges: &[Vec<(f64, f64)>]) {
    let points = || panel.series.iter().flat_map(|series| series.points.iter());
    let x_axis = Axis::covering(panel.x_scale, points().map(|point| point.0));
    let names: Vec<&str> = panel
        .series
        .iter()
        .map(|series| series.name.as_str())
        .collect();
    let y_values = || points().map(|point| point.1).chain(range_highs(ranges));
    let y_axis = with_legend_room(
        Axis::covering(panel.y_scale, y_values()),
        y_values(),
        &names,
        frame.plot_bottom() - frame.plot_top(),
    );
    draw_frame(
        svg,
        frame,
        &panel.title,
        &panel.x_label,
        &panel.y_label,
        &y_axis,
    );
    let (left, right) = (frame.plot_left(), frame.plot_right());
    let (top, bottom) = (frame.plot_top(), frame.plot_bottom());
    for tick in &x_axis.ticks {
        if let Some(fraction) = x_axis.fraction(*tick) {
            let x = left + fraction * (right - left);
            let _ = writeln!(
                svg,
                r##"<line x1="{x:.1}" y1="{bottom:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333333"/>"##,
                bottom + 4.0
            );
            text(
                svg,
                x,
                bottom + 15.0,
                LABEL_FONT,
                "middle",
                "normal",
                &format_value(*tick),
            );
        }
    }
    for (index, series) in panel.series.iter().enumerate() {
        let colour = PALETTE[index % PALETTE.len()];
        let placed: Vec<(f64, f64)> = series
            .points
            .iter()
            .filter_map(|(x, y)| {
                Some((
                    left + x_axis.fraction(*x)? * (right - left),
                    bottom - y_axis.fraction(*y)? * (bottom - top),
                ))
            })
            .collect();
        let path: Vec<String> = placed
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for (x, y) in &placed {
            let _ = writeln!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{colour}"/>"#
            );
        }
        for (point_index, (x, _)) in series.points.iter().enumerate() {
            let (Some(range), Some(fraction)) =
                (range_of(ranges, index, point_index), x_axis.fraction(*x))
            else {
                continue;
            };
            draw_error_bar(
                svg,
                frame,
                &y_axis,
                left + fraction * (right - left),
                range,
                colour,
            );
        }
    }
    draw_legend(svg, frame, &names, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: ticks are nice numbers covering the range; method: check steps of several ranges.
    #[test]
    fn ticks_are_nice_and_cover_the_range() {
        for (low, high) in [
            (0.0, 1.0),
            (0.0, 7.3),
            (0.0, 1234.0),
            (-3.0, 45.0),
            (0.0, 0.07),
        ] {
            let ticks = nice_ticks(low, high);
            assert!(
                ticks[0] <= low && *ticks.last().unwrap() >= high,
                "{ticks:?}"
            );
            assert!(ticks.len() <= TICKS_TARGET + 2, "{ticks:?}");
            let step = ticks[1] - ticks[0];
            let mantissa = step / 10f64.powf(step.log10().floor());
            assert!(
                [1.0, 2.0, 5.0]
                    .iter()
                    .any(|nice| (mantissa - nice).abs() < 1e-9),
                "step {step} of {ticks:?}"
            );
        }
        assert_eq!(nice_ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
    }

    /// Goal: a log axis spans whole powers of ten around the positive values and ignores
    /// zeros and NaN; method: cover mixed values and read fractions back.
    #[test]
    fn log_axis_spans_powers_of_ten() {
        let axis = Axis::covering(AxisScale::Log10, [0.0, f64::NAN, 3.0, 4500.0]);
        assert_eq!(axis.minimum, 1.0);
        assert_eq!(axis.maximum, 10_000.0);
        assert_eq!(axis.ticks, vec![1.0, 10.0, 100.0, 1000.0, 10_000.0]);
        assert_eq!(axis.fraction(100.0), Some(0.5));
        assert_eq!(axis.fraction(0.0), None);
        let empty = Axis::covering(AxisScale::Log10, []);
        assert!(empty.minimum < empty.maximum);
    }

    /// Goal: value labels are short and exact enough; method: known inputs.
    #[test]
    fn values_format_compactly() {
        assert_eq!(format_value(0.0), "0");
        assert_eq!(format_value(1500.0), "1.5k");
        assert_eq!(format_value(2_000_000.0), "2M");
        assert_eq!(format_value(12.345), "12.3");
        assert_eq!(format_value(1.46), "1.46");
        assert_eq!(format_value(0.25), "0.25");
        assert_eq!(format_value(123.0), "123");
        assert_eq!(format_value(0.001), "1.0e-3");
        assert_eq!(format_value(f64::NAN), "");
    }

    fn sample_figure() -> Figure {
        let mut figure = Figure::new("Sample <&> figure", 2);
        figure.panels.push(Panel::Bars(BarPanel {
            title: "LRU".into(),
            x_label: "latency".into(),
            y_label: "ops/s".into(),
            y_scale: AxisScale::Log10,
            categories: vec!["10us".into(), "1ms".into(), "10ms".into()],
            series: vec![
                BarSeries {
                    name: "without hints".into(),
                    values: vec![1000.0, 200.0, f64::NAN],
                },
                BarSeries {
                    name: "with hints".into(),
                    values: vec![1100.0, 900.0, 850.0],
                },
            ],
            value_labels: true,
        }));
        figure.panels.push(Panel::Lines(LinePanel {
            title: "hits".into(),
            x_label: "cache pages".into(),
            y_label: "hits".into(),
            x_scale: AxisScale::Log10,
            y_scale: AxisScale::Linear,
            series: vec![LineSeries {
                name: "ARC".into(),
                points: vec![(64.0, 10.0), (256.0, 40.0), (1024.0, 90.0)],
            }],
        }));
        figure
    }

    /// Goal: ranged panels draw one error bar per value with a range, from its low to its high
    /// end, and the axis reaches the highest end. Method: a ranged line panel (one range
    /// missing, one NaN) and a ranged bar panel; count the bars and read one's ends back.
    #[test]
    fn ranged_panels_draw_error_bars() {
        let Panel::Lines(lines) = sample_figure().panels[1].clone() else {
            panic!("the second panel has lines");
        };
        let Panel::Bars(bars) = sample_figure().panels[0].clone() else {
            panic!("the first panel has bars");
        };
        let mut figure = Figure::new("ranges", 2);
        figure.panels.push(Panel::RangedLines(
            lines,
            vec![vec![(5.0, 15.0), (f64::NAN, 50.0)]],
        ));
        figure.panels.push(Panel::RangedBars(
            bars,
            vec![
                vec![(900.0, 1200.0)],
                vec![(1000.0, 2500.0), (800.0, 950.0)],
            ],
        ));
        let svg = figure.to_svg();
        assert_eq!(svg.matches(r#"class="error-bar""#).count(), 4, "{svg}");
        assert!(svg.contains("<title>5 to 15</title>"));
        assert!(svg.contains("<title>1k to 2.5k</title>"));
        assert!(!svg.contains("NaN"));
        // The log axis of the bars reaches past 2,500 (its top tick is 10k).
        assert!(svg.contains(">10k<"), "{svg}");
        let plain = sample_figure().to_svg();
        assert!(!plain.contains("error-bar"));
    }

    /// Goal: the SVG has one rectangle per drawable bar, one polyline per line series, escaped
    /// text and no NaN; method: count elements of a small figure.
    #[test]
    fn figure_renders_every_drawable_element() {
        let svg = sample_figure().to_svg();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        // Five drawable bars (one value is missing).
        assert_eq!(svg.matches("<title>").count(), 5);
        assert_eq!(svg.matches("<polyline").count(), 1);
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains("Sample &lt;&amp;&gt; figure"));
        assert!(!svg.contains("NaN"));
        assert!(svg.contains(">1.1k<"));
        // Tags balance: every opened text element is closed.
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    }

    /// Goal: panels are laid out row by row inside the canvas; method: a 3-panel figure in two
    /// columns is two panels tall.
    #[test]
    fn grid_layout_sizes_the_canvas() {
        let mut figure = sample_figure();
        figure.panels.push(figure.panels[0].clone());
        let svg = figure.to_svg();
        let expected_height = TITLE_BAND + 2.0 * PANEL_HEIGHT_DEFAULT as f64;
        assert!(svg.contains(&format!(
            r#"width="{}" height="{expected_height}""#,
            2 * PANEL_WIDTH_DEFAULT
        )));
    }

    /// The numbers of attribute `name` in the elements of `svg` that start with `start`.
    fn attribute_values(svg: &str, start: &str, name: &str) -> Vec<f64> {
        svg.lines()
            .filter(|line| line.starts_with(start))
            .map(|line| {
                let at = line.find(&format!(" {name}=\"")).expect("attribute") + name.len() + 3;
                let end = at + line[at..].find('"').expect("closing quote");
                line[at..end].parse().expect("a number")
            })
            .collect()
    }

    /// Goal: a figure title wider than its canvas is wrapped onto lines that each fit, and
    /// the panels move down to make room, so no title is cut off at either side. Method: a
    /// one-panel figure with a title of about twice the panel's width.
    #[test]
    fn long_titles_wrap_inside_the_canvas() {
        let mut figure = sample_figure();
        figure.columns = 1;
        figure.panels.truncate(1);
        figure.title = "Fig. 7: reverse deduplication throughput of every week, SG1 (MB/s)".into();
        let svg = figure.to_svg();
        let title_lines: Vec<&str> = svg
            .lines()
            .filter(|line| line.contains(&format!(r#"font-size="{TITLE_FONT}""#)))
            .collect();
        assert!(title_lines.len() >= 2, "{title_lines:?}");
        for line in &title_lines {
            let content = &line[line.find('>').unwrap() + 1..line.rfind("</text>").unwrap()];
            let width = text_width(content, TITLE_FONT, true);
            assert!(
                width <= PANEL_WIDTH_DEFAULT as f64 - 2.0 * TITLE_PADDING,
                "{content:?} is {width} px wide"
            );
        }
        let expected_height =
            TITLE_BAND + TITLE_LINE * (title_lines.len() - 1) as f64 + PANEL_HEIGHT_DEFAULT as f64;
        assert!(svg.contains(&format!(r#"height="{expected_height}""#)));
    }

    /// Goal: the legend of a bar panel covers no bar, however many series it lists. Method:
    /// seven series of nearly equal values (the storage-saving figure's shape); every bar top
    /// lies below the legend box.
    #[test]
    fn legends_cover_no_bars() {
        let series = (0..7)
            .map(|index| BarSeries {
                name: format!("rev-{index}M +reverse"),
                values: vec![92.0, 90.0 + index as f64, -2.0],
            })
            .collect();
        let mut figure = Figure::new("saving", 1);
        figure.panel_width = 900;
        figure.panels.push(Panel::Bars(BarPanel {
            title: "saving after the last backup".into(),
            x_label: "dataset".into(),
            y_label: "saving (%)".into(),
            y_scale: AxisScale::Linear,
            categories: vec!["sg1".into(), "sg2".into(), "gp".into()],
            series,
            value_labels: false,
        }));
        let svg = figure.to_svg();
        let legend_top = attribute_values(&svg, r#"<rect"#, "y")
            .into_iter()
            .zip(attribute_values(&svg, r#"<rect"#, "height"))
            .zip(svg.lines().filter(|line| line.starts_with("<rect")))
            .find(|(_, line)| line.contains("#999999"))
            .map(|((y, height), _)| y + height)
            .expect("a legend box");
        let bar_tops: Vec<f64> = svg
            .lines()
            .filter(|line| line.starts_with("<rect") && line.contains("<title>"))
            .map(|line| attribute_values(line, "<rect", "y")[0])
            .collect();
        assert_eq!(bar_tops.len(), 21);
        for top in bar_tops {
            assert!(
                top > legend_top,
                "a bar top at {top} is under the legend (to {legend_top})"
            );
        }
    }
}
