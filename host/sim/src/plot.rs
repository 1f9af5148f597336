//! Plots of a report: the TTFT distribution of every run, and KV utilization over time.
//!
//! SVG or PNG by the file's extension. Text is laid out with a TrueType font found on the system
//! (DejaVu Sans or Liberation Sans) or named by `SWITCHYARD_PLOT_FONT`.

use crate::report::Report;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use std::path::Path;
use std::sync::OnceLock;

const SIZE: (u32, u32) = (1200, 900);

/// Why a plot could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// Neither `.svg` nor `.png`.
    #[error("plot file must end in .svg or .png: {0}")]
    Extension(String),
    /// No usable font.
    #[error("no TrueType font found for plot text; set SWITCHYARD_PLOT_FONT to a .ttf file")]
    NoFont,
    /// Drawing or writing failed.
    #[error("drawing the plot failed: {0}")]
    Draw(String),
}

const FONT_CANDIDATES: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial Unicode.ttf",
];

/// Register a system font under "sans-serif", once per process.
fn ensure_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = REGISTERED.get_or_init(|| {
        let from_env = std::env::var("SWITCHYARD_PLOT_FONT").ok();
        from_env
            .iter()
            .map(String::as_str)
            .chain(FONT_CANDIDATES)
            .filter_map(|path| std::fs::read(path).ok())
            .any(|bytes| {
                // The font lives as long as the process, as plotters' registry requires.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
            })
    });
    if *ok { Ok(()) } else { Err(PlotError::NoFont) }
}

/// Draw `report` into `path` (`.svg` or `.png`).
pub fn plot(report: &Report, path: &Path) -> Result<(), PlotError> {
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let draw_error = |e: &dyn std::fmt::Display| PlotError::Draw(e.to_string());
    match extension {
        "svg" => {
            ensure_font()?;
            let root = SVGBackend::new(path, SIZE).into_drawing_area();
            draw(&root, report).map_err(|e| draw_error(&e))?;
            root.present().map_err(|e| draw_error(&e))
        }
        "png" => {
            ensure_font()?;
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            draw(&root, report).map_err(|e| draw_error(&e))?;
            root.present().map_err(|e| draw_error(&e))
        }
        _ => Err(PlotError::Extension(path.display().to_string())),
    }
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, report: &Report) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(SIZE.1 / 2);
    ttft_cdf(&top, report)?;
    kv_utilization(&bottom, report)
}

/// TTFT CDF of every run, cut at the largest p99 so the body of the distribution stays readable.
fn ttft_cdf<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report) -> DrawResult<DB> {
    let x_max = report
        .runs
        .iter()
        .map(|r| r.ttft_ms.p99)
        .fold(1.0, f64::max)
        * 1.05;
    let mut chart = ChartBuilder::on(area)
        .caption("Time to first token (CDF, up to p99)", ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("TTFT (ms)")
        .y_desc("fraction of requests")
        .draw()?;
    for (i, run) in report.runs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points = run.ttft_cdf.iter().copied().filter(|(ms, _)| *ms <= x_max);
        let label = format!(
            "{}  mean {:.0} ms  p50 {:.0}  p99 {:.0}",
            run.label(),
            run.ttft_ms.mean,
            run.ttft_ms.p50,
            run.ttft_ms.p99
        );
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
}

/// Mean KV utilization over the workers, per run, over virtual time.
fn kv_utilization<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    report: &Report,
) -> DrawResult<DB> {
    let x_max = report
        .runs
        .iter()
        .map(|r| {
            r.kv_utilization.workers.first().map_or(0, Vec::len) as f64
                * r.kv_utilization.interval_s
        })
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "KV cache utilization (mean over workers)",
            ("sans-serif", 24),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("virtual time (s)")
        .y_desc("blocks in use / blocks")
        .draw()?;
    for (i, run) in report.runs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let interval = run.kv_utilization.interval_s;
        let points = run
            .kv_utilization
            .mean()
            .into_iter()
            .enumerate()
            .map(move |(k, u)| (k as f64 * interval, u));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(1)))?
            .label(run.label())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
}
