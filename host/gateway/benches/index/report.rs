//! The bench's table: medians over rounds per mode, then ratios between modes of the same run.

use crate::{MODES, Mode, Run};

/// Medians over rounds of one mode's figures.
struct Summary {
    mode: Mode,
    block_ops_per_s: f64,
    wall_s: f64,
    writer_cpu_s: f64,
    writer_runnable_s: f64,
    reader_waits_s: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    nodes: usize,
    heap_mib: f64,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn summarize(mode: Mode, runs: &[Run], block_ops: usize) -> Summary {
    let of = |f: &dyn Fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let us = |q: f64| of(&|r| r.latency.value_at_quantile(q) as f64 / 1e3);
    Summary {
        mode,
        block_ops_per_s: of(&|r| block_ops as f64 / r.wall.as_secs_f64()),
        wall_s: of(&|r| r.wall.as_secs_f64()),
        writer_cpu_s: of(&|r| r.writer.on_cpu.as_secs_f64()),
        writer_runnable_s: of(&|r| r.writer.runnable.as_secs_f64()),
        reader_waits_s: of(&|r| r.reader_waits.as_secs_f64()),
        p50_us: us(0.5),
        p99_us: us(0.99),
        max_us: of(&|r| r.latency.max() as f64 / 1e3),
        nodes: runs[0].nodes,
        heap_mib: of(&|r| r.heap_bytes as f64 / f64::from(1 << 20)),
    }
}

/// Print the table and the ratios; `runs[i]` holds the rounds of `MODES[i]`.
pub(crate) fn print(runs: &[Vec<Run>], block_ops: usize) {
    let summaries: Vec<Summary> = MODES
        .iter()
        .zip(runs)
        .map(|(mode, mode_runs)| summarize(*mode, mode_runs, block_ops))
        .collect();
    println!(
        "| mode | M block ops/s | wall s | writer CPU s | writer runnable s | reader waits s \
         | lookup p50 us | p99 us | max us | nodes | heap MiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in &summaries {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {} | {:.1} |",
            s.mode.label(),
            s.block_ops_per_s / 1e6,
            s.wall_s,
            s.writer_cpu_s,
            s.writer_runnable_s,
            s.reader_waits_s,
            s.p50_us,
            s.p99_us,
            s.max_us,
            s.nodes,
            s.heap_mib,
        );
    }
    let of = |mode| {
        summaries
            .iter()
            .find(|s| s.mode == mode)
            .expect("every mode ran")
    };
    let (single, lr, rw) = (
        of(Mode::SingleThread),
        of(Mode::LeftRight),
        of(Mode::RwLock),
    );
    let ratios = [
        ("lookup p99, rwlock / left-right", rw.p99_us / lr.p99_us),
        ("lookup max, rwlock / left-right", rw.max_us / lr.max_us),
        (
            "lookup p99, left-right / single-thread",
            lr.p99_us / single.p99_us,
        ),
        (
            "lookup p99, rwlock / single-thread",
            rw.p99_us / single.p99_us,
        ),
        (
            "throughput, left-right / single-thread",
            lr.block_ops_per_s / single.block_ops_per_s,
        ),
        (
            "throughput, rwlock / single-thread",
            rw.block_ops_per_s / single.block_ops_per_s,
        ),
        (
            "writer CPU, left-right / rwlock",
            lr.writer_cpu_s / rw.writer_cpu_s,
        ),
        (
            "heap, left-right / single-thread",
            lr.heap_mib / single.heap_mib,
        ),
    ];
    println!();
    for (name, ratio) in ratios {
        println!("{name:<40} {ratio:.2}x");
    }
}
