//! `--plot FILE.svg`: what a benchmark's tables say, drawn as an SVG file.
//!
//! A [`Figure`] is a grid of [`Panel`]s; a panel has an x axis (numbers,
//! or names for categories), a linear or logarithmic y axis, and
//! [`Series`]: lines with points (one per engine, delivery mode, thread
//! count) and horizontal reference lines (the kernel's columns, which do
//! not depend on the x axis). Every benchmark builds its figure from the
//! same cells as its table; this module only draws it, with the `plotters`
//! crate's SVG backend: text is written as SVG `<text>` (no font files), so
//! the labels of the series are in the file, in the legend of each panel.
//!
//! ```text
//!   ┌ seq: time, seconds ───────┐ ┌ seq: faults ──────────────┐
//!   │ \                         │ │ \                         │
//!   │  \___   faultmap signal   │ │  \                        │
//!   │ ------- kernel-file ----- │ │   \____                   │
//!   └─ fault-around order ──────┘ └───────────────────────────┘
//! ```
//!
//! [`check_target`] runs before any measurement, so that a missing
//! directory is an error at once, not after minutes of benchmark.

use std::path::Path;

use anyhow::{bail, Context, Result};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

/// A figure: panels in a grid of `columns` columns.
#[derive(Debug)]
pub struct Figure {
    /// The panels, row by row.
    pub panels: Vec<Panel>,
    /// Panels per row.
    pub columns: usize,
}

/// One chart.
#[derive(Debug, Default)]
pub struct Panel {
    /// Its caption.
    pub title: String,
    /// What the x axis is.
    pub x_label: String,
    /// Names of the x positions 0, 1, ... (categories), if not numbers.
    pub x_names: Vec<String>,
    /// What the y axis is.
    pub y_label: String,
    /// A logarithmic y axis.
    pub log_y: bool,
    /// The series.
    pub series: Vec<Series>,
}

/// One series of a panel.
#[derive(Debug)]
pub struct Series {
    /// Its name in the legend.
    pub label: String,
    /// Its points; a reference series has one, drawn as a horizontal line.
    pub points: Vec<(f64, f64)>,
    /// A horizontal reference line at its one point's y.
    pub reference: bool,
}

impl Series {
    /// A line through `points`.
    pub fn line(label: String, points: Vec<(f64, f64)>) -> Series {
        Series {
            label,
            points,
            reference: false,
        }
    }

    /// A horizontal reference line at `y`.
    pub fn reference(label: String, y: f64) -> Series {
        Series {
            label,
            points: vec![(0.0, y)],
            reference: true,
        }
    }
}

/// Fails, clearly, if `path` cannot be written: its directory missing.
pub fn check_target(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!(
            "--plot {}: the directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    if path.is_dir() {
        bail!("--plot {}: is a directory", path.display());
    }
    Ok(())
}

/// Draws `figure` into the SVG file `path`.
pub fn write(figure: &Figure, path: &Path) -> Result<()> {
    let columns = figure.columns.max(1);
    let rows = figure.panels.len().div_ceil(columns).max(1);
    let size = (520 * columns as u32, 380 * rows as u32);
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let areas = root.split_evenly((rows, columns));
    for (panel, area) in figure.panels.iter().zip(&areas) {
        let (lo, hi) = y_range(panel);
        let drawn = if panel.log_y {
            draw(area, panel, (lo..hi).log_scale())
        } else {
            draw(area, panel, lo..hi)
        };
        drawn.with_context(|| format!("drawing the panel {:?}", panel.title))?;
    }
    root.present()
        .map_err(draw_error)
        .with_context(|| format!("writing the plot {}", path.display()))
}

/// A drawing error as an `anyhow` error.
fn draw_error<E: std::error::Error + Send + Sync>(err: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}

/// The y range of a panel's points, with a margin; positive for a log axis.
fn y_range(panel: &Panel) -> (f64, f64) {
    let ys = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|y| y.is_finite() && (!panel.log_y || *y > 0.0));
    let (lo, hi) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    match (lo <= hi, panel.log_y) {
        (false, true) => (0.1, 10.0),
        (false, false) => (0.0, 1.0),
        (true, true) => (lo / 1.5, hi * 1.5),
        (true, false) => {
            let pad = ((hi - lo) * 0.1).max(hi.abs() * 0.05).max(1e-9);
            let base = if lo >= 0.0 {
                (lo - pad).max(0.0)
            } else {
                lo - pad
            };
            (base, hi + pad)
        }
    }
}

/// The x range: the points' x, or the categories' positions.
fn x_range(panel: &Panel) -> (f64, f64) {
    if !panel.x_names.is_empty() {
        return (-0.5, panel.x_names.len() as f64 - 0.5);
    }
    let xs = panel
        .series
        .iter()
        .filter(|s| !s.reference)
        .flat_map(|s| s.points.iter().map(|p| p.0));
    let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if lo > hi {
        (0.0, 1.0)
    } else {
        (lo - 0.5, hi + 0.5)
    }
}

/// The colour of series `i`.
fn colour(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    PALETTE[i % PALETTE.len()]
}

/// One panel on `area`, with the y axis `y`.
fn draw<Y>(area: &DrawingArea<SVGBackend<'_>, Shift>, panel: &Panel, y: Y) -> Result<()>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let (x_lo, x_hi) = x_range(panel);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_lo..x_hi, y)
        .map_err(draw_error)?;
    let names = &panel.x_names;
    let x_format = |x: &f64| {
        if names.is_empty() {
            format!("{x}")
        } else {
            let i = x.round();
            let near = (x - i).abs() < 0.01 && i >= 0.0;
            near.then(|| names.get(i as usize).cloned())
                .flatten()
                .unwrap_or_default()
        }
    };
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(panel.x_label.as_str())
        .y_desc(panel.y_label.as_str())
        .x_label_formatter(&x_format);
    if !names.is_empty() {
        mesh.x_labels(names.len() * 4 + 1);
    }
    mesh.draw().map_err(draw_error)?;
    for (i, series) in panel.series.iter().enumerate() {
        let style = ShapeStyle::from(&colour(i)).stroke_width(2);
        let points: Vec<(f64, f64)> = if series.reference {
            let y = series.points.first().map_or(0.0, |p| p.1);
            vec![(x_lo, y), (x_hi, y)]
        } else {
            series.points.clone()
        };
        let drawn = chart
            .draw_series(LineSeries::new(points.clone(), style))
            .map_err(draw_error)?;
        drawn
            .label(series.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
        if !series.reference {
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, style.filled())))
                .map_err(draw_error)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(draw_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_is_refused() {
        assert!(check_target(Path::new("/nonexistent/dir/x.svg")).is_err());
        assert!(check_target(Path::new("/")).is_err());
        assert!(check_target(Path::new("x.svg")).is_ok());
    }

    #[test]
    fn draws_lines_and_references() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.svg");
        let figure = Figure {
            columns: 2,
            panels: vec![
                Panel {
                    title: "t".into(),
                    log_y: true,
                    series: vec![
                        Series::line("faultmap".into(), vec![(0.0, 1.0), (4.0, 0.1)]),
                        Series::reference("kernel-file".into(), 0.2),
                    ],
                    ..Panel::default()
                },
                Panel {
                    x_names: vec!["seq".into(), "rand".into()],
                    series: vec![Series::line("hits".into(), vec![(0.0, 0.5), (1.0, 0.9)])],
                    ..Panel::default()
                },
            ],
        };
        write(&figure, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(
            svg.contains("kernel-file") && svg.contains("faultmap"),
            "{svg}"
        );
        assert!(svg.contains("rand"));
    }
}
