//! Plots of a report: the TTFT distribution of every run, and KV utilization over time. When the
//! runs sweep concurrency, instead four metrics against concurrency (requests per second,
//! prefix-hit ratio, agent steps per minute, recomputed tokens), one line per policy (routing +
//! admission + speed-up); with KV tiers below the device, TTFT mean, output tokens per second,
//! prefix-hit ratio and recomputed tokens, one line per policy and tier set; with KV hints,
//! requests per second, the device's prefix-hit ratio, agent steps per minute and recomputed
//! tokens, one line per hint policy.
//!
//! SVG or PNG by the file's extension. Text is laid out with a TrueType font found on the system
//! (DejaVu Sans or Liberation Sans) or named by `SWITCHYARD_PLOT_FONT`.

use crate::report::{Report, RunReport};
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
    if concurrencies(report).len() < 2 {
        ttft_cdf(&top, report)?;
        return kv_utilization(&bottom, report);
    }
    let (top_left, top_right) = top.split_horizontally(SIZE.0 / 2);
    let (bottom_left, bottom_right) = bottom.split_horizontally(SIZE.0 / 2);
    let low = SeriesLabelPosition::LowerLeft;
    let high = SeriesLabelPosition::UpperLeft;
    if report.runs.iter().any(|r| r.kv_hints.is_some()) {
        sweep(&top_left, report, "Requests per second", low.clone(), |r| {
            r.requests_per_s
        })?;
        sweep(
            &top_right,
            report,
            "Prefix-hit ratio on the device",
            low.clone(),
            |r| r.tiers.map_or(r.prefix_hit_ratio, |t| t.device_hit_ratio),
        )?;
        sweep(&bottom_left, report, "Agent steps per minute", low, |r| {
            r.agent_steps_per_min.unwrap_or(0.0)
        })?;
        return sweep(
            &bottom_right,
            report,
            "Recomputed prompt Mtokens",
            high,
            |r| r.recomputed_tokens as f64 / 1e6,
        );
    }
    if report.runs.iter().any(|r| r.tiers.is_some()) {
        sweep(&top_left, report, "TTFT mean (ms)", high.clone(), |r| {
            r.ttft_ms.mean
        })?;
        sweep(
            &top_right,
            report,
            "Output tokens per second",
            low.clone(),
            |r| r.output_tokens_per_s,
        )?;
        sweep(
            &bottom_left,
            report,
            "Prefix-hit ratio (all tiers)",
            low,
            |r| r.prefix_hit_ratio,
        )?;
        return sweep(
            &bottom_right,
            report,
            "Recomputed prompt Mtokens",
            high,
            |r| r.recomputed_tokens as f64 / 1e6,
        );
    }
    sweep(&top_left, report, "Requests per second", low.clone(), |r| {
        r.requests_per_s
    })?;
    sweep(&top_right, report, "Prefix-hit ratio", low.clone(), |r| {
        r.prefix_hit_ratio
    })?;
    sweep(&bottom_left, report, "Agent steps per minute", low, |r| {
        r.agent_steps_per_min.unwrap_or(0.0)
    })?;
    sweep(
        &bottom_right,
        report,
        "Recomputed prompt Mtokens",
        high,
        |r| r.recomputed_tokens as f64 / 1e6,
    )
}

/// The concurrency levels of the runs, ascending, unlimited last.
fn concurrencies(report: &Report) -> Vec<Option<usize>> {
    let mut levels: Vec<Option<usize>> = report.runs.iter().map(|r| r.concurrency).collect();
    levels.sort_by_key(|c| c.unwrap_or(usize::MAX));
    levels.dedup();
    levels
}

/// The run's label without its concurrency: one line of a sweep.
fn series(run: &RunReport) -> String {
    let label = run.label();
    match label.split_once('@') {
        Some((policy, rest)) => match rest.split_once(' ') {
            Some((_, speed)) => format!("{policy} {speed}"),
            None => policy.to_owned(),
        },
        None => label,
    }
}

/// `metric` of every run against concurrency (evenly spaced levels), a line per series.
fn sweep<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    report: &Report,
    title: &str,
    legend: SeriesLabelPosition,
    metric: fn(&RunReport) -> f64,
) -> DrawResult<DB> {
    let levels = concurrencies(report);
    let y_max = report.runs.iter().map(metric).fold(0.0, f64::max).max(1e-9) * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{title} by concurrency"), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.25..(levels.len() as f64 - 0.75), 0.0..y_max)?;
    let level_name = |x: &f64| {
        let i = x.round();
        if (x - i).abs() > 1e-6 || i < 0.0 {
            return String::new();
        }
        match levels.get(i as usize) {
            Some(Some(c)) => c.to_string(),
            Some(None) => "unlimited".to_owned(),
            None => String::new(),
        }
    };
    chart
        .configure_mesh()
        .x_labels(levels.len())
        .x_label_formatter(&level_name)
        .x_desc("root sessions in flight")
        .y_desc(title)
        .draw()?;
    let mut names: Vec<String> = report.runs.iter().map(series).collect();
    names.dedup();
    let mut seen = Vec::new();
    for name in names {
        if seen.contains(&name) {
            continue;
        }
        let color = Palette99::pick(seen.len()).to_rgba();
        seen.push(name.clone());
        let mut points: Vec<(f64, f64)> = report
            .runs
            .iter()
            .filter(|r| series(r) == name)
            .filter_map(|r| {
                let x = levels.iter().position(|c| *c == r.concurrency)?;
                Some((x as f64, metric(r)))
            })
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{AdmissionStats, KvUtilization, LatencyStats, REPORT_SCHEMA};

    fn run(admission: &str, concurrency: Option<usize>, requests_per_s: f64) -> RunReport {
        let latency = LatencyStats {
            count: 1,
            mean: 1.0,
            p50: 1.0,
            p90: 1.0,
            p99: 1.0,
            max: 1.0,
        };
        RunReport {
            policy: "kv-cost".into(),
            admission: admission.into(),
            admission_stats: AdmissionStats::default(),
            concurrency,
            workers: 2,
            replicas: 1,
            replica_affinity: "session".into(),
            index: "events".into(),
            speedup: 1.0,
            block_size: 16,
            requests: 10,
            failed_requests: 0,
            duration_s: 10.0,
            ttft_ms: latency,
            itl_ms: latency,
            e2e_ms: latency,
            output_tokens_per_s: 1.0,
            requests_per_s,
            agent_steps_per_min: Some(1.0),
            prefix_hit_ratio: 0.5,
            prompt_tokens: 100,
            cached_tokens: 50,
            recomputed_tokens: 1_000,
            whole_answers: 0,
            ttft_cdf: vec![(1.0, 1.0)],
            kv_utilization: KvUtilization {
                interval_s: 1.0,
                workers: vec![vec![0.5]],
            },
            tiers: None,
            kv_hints: None,
        }
    }

    #[test]
    fn a_concurrency_sweep_plots_one_line_per_policy() {
        let report = Report {
            schema: REPORT_SCHEMA.into(),
            trace: "t".into(),
            runs: vec![
                run("none", Some(8), 1.0),
                run("thunder-agent", Some(8), 1.0),
                run("none", None, 1.0),
                run("thunder-agent", None, 1.5),
            ],
        };
        assert_eq!(concurrencies(&report), [Some(8), None]);
        assert_eq!(series(&report.runs[1]), "kv-cost+thunder-agent");
        let dir = std::env::temp_dir().join(format!("switchyard-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sweep.svg");
        match plot(&report, &path) {
            // No system font here: nothing to draw text with.
            Err(PlotError::NoFont) => return,
            other => other.unwrap(),
        }
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("Requests per second by concurrency"));
        assert!(svg.contains("kv-cost+thunder-agent"));
        assert!(svg.contains("unlimited"));
        let hinted = |name: &str, concurrency| RunReport {
            kv_hints: Some(crate::report::KvHintsReport {
                policy: name.into(),
                ..Default::default()
            }),
            ..run("thunder-agent", concurrency, 1.0)
        };
        let hints = Report {
            runs: vec![
                hinted("no-hints", Some(8)),
                hinted("demote-on-tool-call", Some(8)),
                hinted("no-hints", Some(16)),
                hinted("demote-on-tool-call", Some(16)),
            ],
            ..report
        };
        assert_eq!(
            series(&hints.runs[1]),
            "kv-cost+thunder-agent hints:demote-on-tool-call"
        );
        plot(&hints, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("Prefix-hit ratio on the device by concurrency"));
        assert!(svg.contains("hints:demote-on-tool-call"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
