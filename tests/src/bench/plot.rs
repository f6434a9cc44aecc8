//! The latency plot: one empirical CDF per scenario, latency on a log axis so that the median
//! and the tail are both readable when they are orders of magnitude apart.

use std::path::Path;

use anyhow::{Result, bail};
use plotters::prelude::*;

use super::stats::cdf_points;

/// Points per curve: plenty for a smooth line, few enough for a small SVG.
const POINTS: usize = 2000;

/// Smallest latency drawn (ns): the log axis cannot show 0.
const FLOOR_NS: f64 = 10.0;

/// One curve: its legend and its latencies in ns, ascending.
pub struct Curve<'a> {
    pub name: &'a str,
    pub sorted_ns: &'a [u64],
}

/// The axes of a plot: the latency's unit and what each axis says.
pub struct Axes<'a> {
    /// Nanoseconds per unit of the x axis (1e3 for µs, 1e6 for ms).
    pub ns_per_unit: f64,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
}

/// Writes the CDFs of `curves` (empty ones are left out) as an SVG to `path`.
pub fn latency_cdf(path: &Path, title: &str, axes: &Axes<'_>, curves: &[Curve<'_>]) -> Result<()> {
    let floor = FLOOR_NS / axes.ns_per_unit;
    let lines: Vec<(&str, Vec<(f64, f64)>)> = curves
        .iter()
        .filter(|c| !c.sorted_ns.is_empty())
        .map(|c| {
            let points = cdf_points(c.sorted_ns, POINTS)
                .into_iter()
                .map(|(us, fraction)| ((us * 1e3 / axes.ns_per_unit).max(floor), fraction))
                .collect();
            (c.name, points)
        })
        .collect();
    let Some((lo, hi)) = x_range(&lines) else {
        bail!("no latencies to plot");
    };

    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc(axes.x_desc)
        // `Display` of f64 prints 10 as "10" and 0.5 as "0.5": no needless decimals.
        .x_label_formatter(&|x| format!("{x}"))
        .y_desc(axes.y_desc)
        .draw()?;
    for (i, (name, points)) in lines.into_iter().enumerate() {
        let style = Palette99::pick(i).stroke_width(2);
        chart
            .draw_series(LineSeries::new(points, style))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The x range covering every point, widened a little so no curve touches the frame.
fn x_range(lines: &[(&str, Vec<(f64, f64)>)]) -> Option<(f64, f64)> {
    let xs = lines
        .iter()
        .flat_map(|(_, points)| points.iter().map(|p| p.0));
    let (lo, hi) = xs.fold(None, |range: Option<(f64, f64)>, x| {
        Some(range.map_or((x, x), |(lo, hi)| (lo.min(x), hi.max(x))))
    })?;
    Some((lo / 1.2, hi * 1.2))
}
