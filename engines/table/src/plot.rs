//! Charts of table columns with plotters: `bar`, `line`, `scatter` and `hist` to a PNG or
//! SVG file (by extension). Text is drawn with DejaVu Sans (`fonts-dejavu-core`, installed by
//! `make setup`; `XPU_FONT` names another TrueType file), so no fontconfig is needed.

use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::register_font;
use xpu_ir::{Attrs, ColumnData, Table};

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers the font once per process; the error says where it looked.
fn ensure_font() -> Result<(), String> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates: Vec<String> = std::env::var("XPU_FONT")
            .ok()
            .into_iter()
            .chain(FONT_PATHS.iter().map(|s| s.to_string()))
            .collect();
        for path in &candidates {
            if let Ok(bytes) = std::fs::read(path) {
                // plotters keeps fonts for the whole process: leaking once is the intent.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                return register_font("sans-serif", FontStyle::Normal, bytes)
                    .map_err(|_| format!("{path} is not a usable TrueType font"));
            }
        }
        Err(format!(
            "plots need a TrueType font: none found at {} (install fonts-dejavu-core, or set XPU_FONT)",
            candidates.join(", ")
        ))
    })
    .clone()
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// What is drawn, gathered from the table before any backend is opened.
struct Chart {
    kind: String,
    title: String,
    x_label: String,
    /// Category labels (bar) or x values (line, scatter); empty for hist.
    labels: Vec<String>,
    xs: Vec<f64>,
    series: Vec<(String, Vec<f64>)>,
}

fn values(data: &ColumnData) -> Vec<f64> {
    (0..data.len()).map(|i| data.get_f64(i)).collect()
}

fn label(data: &ColumnData, i: usize) -> String {
    match data {
        ColumnData::String(v) => v[i].clone().unwrap_or_else(|| "NaN".into()),
        ColumnData::I64(v) => v[i].map_or_else(|| "NaN".into(), |x| x.to_string()),
        ColumnData::F64(v) => v[i].map_or_else(|| "NaN".into(), |x| format!("{x}")),
        ColumnData::Bool(v) => {
            v[i].map_or_else(|| "NaN".into(), |b| if b { "True".into() } else { "False".into() })
        }
    }
}

/// Draws the chart the attributes describe; returns the number of rows drawn.
pub fn draw(table: &Table, attrs: &Attrs) -> Result<usize, String> {
    let kind = attrs.str("kind", "line").to_string();
    if !matches!(kind.as_str(), "bar" | "line" | "scatter" | "hist") {
        return Err(format!("unknown plot kind `{kind}` (bar, line, scatter or hist)"));
    }
    let path = attrs.str("path", "").to_string();
    let column = |name: &str| {
        table.column(name).ok_or_else(|| format!("plot: the table has no column `{name}`"))
    };
    let x = attrs.str("x", "");
    let mut ys: Vec<String> = attrs.strs("y").unwrap_or(&[]).to_vec();
    if ys.is_empty() {
        // pandas plots every numeric column but x.
        ys = table
            .columns
            .iter()
            .filter(|c| c.name != x && matches!(c.data, ColumnData::I64(_) | ColumnData::F64(_)))
            .map(|c| c.name.clone())
            .collect();
    }
    if ys.is_empty() {
        return Err("plot: no numeric column to draw (name one with y=)".into());
    }
    let rows = table.rows();
    let (labels, xs) = if x.is_empty() {
        ((0..rows).map(|i| i.to_string()).collect(), (0..rows).map(|i| i as f64).collect())
    } else {
        let c = column(x)?;
        ((0..rows).map(|i| label(&c.data, i)).collect(), values(&c.data))
    };
    let series = ys
        .iter()
        .map(|y| Ok((y.clone(), values(&column(y)?.data))))
        .collect::<Result<Vec<_>, String>>()?;
    let chart = Chart {
        kind,
        title: attrs.str("title", "").to_string(),
        x_label: x.to_string(),
        labels,
        xs,
        series,
    };
    ensure_font()?;
    let size = (800, 600);
    let lower = path.to_ascii_lowercase();
    // The two backends have different error types, so each result is rendered to text.
    if lower.ends_with(".svg") {
        render(SVGBackend::new(&path, size).into_drawing_area(), &chart)
            .map_err(|e| format!("plot {path}: {e}"))?;
    } else if lower.ends_with(".png") {
        render(BitMapBackend::new(&path, size).into_drawing_area(), &chart)
            .map_err(|e| format!("plot {path}: {e}"))?;
    } else {
        return Err(format!("plot: `{path}` must end in .png or .svg"));
    }
    Ok(rows)
}

fn finite_range(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = vals
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        (0.0, 1.0)
    } else if lo == hi {
        (lo - 0.5, hi + 0.5)
    } else {
        let pad = (hi - lo) * 0.05;
        (lo - pad, hi + pad)
    }
}

fn render<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    c: &Chart,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20).x_label_area_size(50).y_label_area_size(70);
    if !c.title.is_empty() {
        builder.caption(&c.title, ("sans-serif", 28));
    }
    match c.kind.as_str() {
        "hist" => {
            let vals: Vec<f64> = c.series[0].1.iter().copied().filter(|v| v.is_finite()).collect();
            let (lo, hi) = finite_range(vals.iter().copied());
            // pandas' default: ten equal-width bins over the data's range.
            let bins = 10usize;
            let width = (hi - lo) / bins as f64;
            let mut counts = vec![0u64; bins];
            for v in &vals {
                let b = (((v - lo) / width) as usize).min(bins - 1);
                counts[b] += 1;
            }
            let top = counts.iter().copied().max().unwrap_or(1).max(1) as f64 * 1.05;
            let mut chart = builder.build_cartesian_2d(lo..hi, 0.0..top)?;
            chart.configure_mesh().x_desc(&c.series[0].0).y_desc("count").draw()?;
            chart.draw_series(counts.iter().enumerate().map(|(i, &n)| {
                let x0 = lo + i as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width, n as f64)], COLORS[0].filled())
            }))?;
        }
        "bar" => {
            let n = c.labels.len();
            let (_, hi) = finite_range(c.series.iter().flat_map(|(_, v)| v.iter().copied()));
            let lo = c
                .series
                .iter()
                .flat_map(|(_, v)| v.iter().copied())
                .filter(|v| v.is_finite())
                .fold(0.0f64, f64::min);
            let mut chart = builder.build_cartesian_2d(-0.5..(n as f64 - 0.5), lo..hi.max(0.0))?;
            let labels = c.labels.clone();
            chart
                .configure_mesh()
                .x_labels(n.min(30))
                .x_label_formatter(&move |v: &f64| {
                    let i = v.round();
                    if (v - i).abs() < 1e-9 && i >= 0.0 && (i as usize) < labels.len() {
                        labels[i as usize].clone()
                    } else {
                        String::new()
                    }
                })
                .x_desc(&c.x_label)
                .draw()?;
            let k = c.series.len() as f64;
            for (s, (name, vals)) in c.series.iter().enumerate() {
                let color = COLORS[s % COLORS.len()];
                let w = 0.8 / k;
                chart
                    .draw_series(vals.iter().enumerate().filter(|(_, v)| v.is_finite()).map(
                        move |(i, &v)| {
                            let x0 = i as f64 - 0.4 + s as f64 * w;
                            Rectangle::new([(x0, 0.0), (x0 + w, v)], color.filled())
                        },
                    ))?
                    .label(name)
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                    });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
        kind => {
            let (x0, x1) = finite_range(c.xs.iter().copied());
            let (y0, y1) = finite_range(c.series.iter().flat_map(|(_, v)| v.iter().copied()));
            let mut chart = builder.build_cartesian_2d(x0..x1, y0..y1)?;
            chart.configure_mesh().x_desc(&c.x_label).draw()?;
            for (s, (name, vals)) in c.series.iter().enumerate() {
                let color = COLORS[s % COLORS.len()];
                let points: Vec<(f64, f64)> =
                    c.xs.iter()
                        .zip(vals)
                        .filter(|(x, y)| x.is_finite() && y.is_finite())
                        .map(|(x, y)| (*x, *y))
                        .collect();
                let drawn = if kind == "line" {
                    chart.draw_series(LineSeries::new(points, color.stroke_width(2)))?
                } else {
                    chart.draw_series(
                        points.into_iter().map(|p| Circle::new(p, 3, color.filled())),
                    )?
                };
                drawn.label(name).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
    }
    root.present()
}
