//! Why the gateway keeps the KV index twice with `left-right`: a replay of the Mooncake
//! conversation trace through the index, three ways.
//!
//! 1. `single-thread`: one plain `KvIndex`, lookups and events interleaved in trace order.
//! 2. `left-right`: a writer thread appends events and publishes every `PUBLISH_EVERY` of them
//!    (the gateway's `IndexCopy`); a reader thread does the lookups at the same time.
//! 3. `rwlock`: the same two threads over one `KvIndex` behind `std::sync::RwLock`, the writer
//!    taking the lock per event: the design left-right must beat.
//!
//! Throughput counts block operations: hashes per lookup plus blocks per event. The machine is
//! shared, so the modes run back to back in each round and the report is ratios between them.
//!
//! Environment: `MOONCAKE_TRACE` (trace path), `INDEX_BENCH_ROWS` (first rows only, for a quick
//! run), `INDEX_BENCH_ROUNDS` (rounds of the three modes; medians are reported, default 3).

#[path = "../support/heap.rs"]
#[allow(
    dead_code,
    reason = "shared with the dynamo_stream bench, which uses all of it"
)]
mod heap;
mod report;
mod workload;

use hdrhistogram::Histogram;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, RwLock};
use std::time::{Duration, Instant};
use switchyard_core::hash::SequenceHash;
use switchyard_core::index::{IndexOp, KvIndex};
use switchyard_gateway::index::IndexCopy;
use workload::{CACHE_BLOCKS, WORKERS, Workload};

#[global_allocator]
static ALLOC: heap::CountingAlloc = heap::CountingAlloc;

/// Events per left-right publish: the writer always has a backlog here, and the gateway publishes
/// after each burst it finds on its channel, so a small fixed batch stands in for a burst.
const PUBLISH_EVERY: usize = 32;
/// Rows replayed by `cargo test --benches`, which only checks that the bench runs.
const SMOKE_TEST_ROWS: usize = 300;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    SingleThread,
    LeftRight,
    RwLock,
}

pub(crate) const MODES: [Mode; 3] = [Mode::SingleThread, Mode::LeftRight, Mode::RwLock];

impl Mode {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Mode::SingleThread => "single-thread",
            Mode::LeftRight => "left-right 2 threads",
            Mode::RwLock => "rwlock 2 threads",
        }
    }
}

/// What one replay measured.
pub(crate) struct Run {
    pub(crate) wall: Duration,
    /// Time the lookup thread spent waiting for the writer to keep up.
    pub(crate) reader_waits: Duration,
    /// The thread applying events: time on a CPU, and runnable but waiting for one.
    pub(crate) writer: Sched,
    /// Lookup latency in nanoseconds.
    pub(crate) latency: Histogram<u64>,
    pub(crate) nodes: usize,
    pub(crate) heap_bytes: usize,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// Run `lookup` and record how long it took.
fn timed<R>(latency: &mut Histogram<u64>, lookup: impl FnOnce() -> R) -> R {
    let start = Instant::now();
    let result = lookup();
    latency.saturating_record(start.elapsed().as_nanos() as u64);
    result
}

/// A thread's scheduler figures from `/proc/thread-self/schedstat` (zero where there is none):
/// on a shared machine they tell work from waiting for a CPU.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sched {
    pub(crate) on_cpu: Duration,
    pub(crate) runnable: Duration,
}

impl Sched {
    fn now() -> Self {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
        let mut fields = text.split_whitespace().map(|f| f.parse().unwrap_or(0));
        let mut next = || Duration::from_nanos(fields.next().unwrap_or(0));
        Self {
            on_cpu: next(),
            runnable: next(),
        }
    }

    fn since(self, earlier: Sched) -> Sched {
        Sched {
            on_cpu: self.on_cpu.saturating_sub(earlier.on_cpu),
            runnable: self.runnable.saturating_sub(earlier.runnable),
        }
    }
}

fn single_thread(workload: &Workload) -> Run {
    let mut latency = histogram();
    let before = heap::live_bytes();
    let mut index = KvIndex::new();
    let start = Instant::now();
    let sched = Sched::now();
    for (hashes, ops) in workload.lookups.iter().zip(&workload.events) {
        black_box(timed(&mut latency, || index.find_matches(hashes)));
        for op in ops {
            index.apply(op);
        }
    }
    let writer = Sched::now().since(sched);
    let wall = start.elapsed();
    Run {
        wall,
        reader_waits: Duration::ZERO,
        writer,
        latency,
        nodes: index.node_count(),
        heap_bytes: heap::live_bytes().saturating_sub(before),
    }
}

/// Keeps the two threads in trace order with bounded skew, as in the gateway: a request's events
/// arrive after its lookup, while the next few requests are being looked up. The reader never
/// waits for a publish: under left-right it reads whatever copy was last published.
#[derive(Default)]
struct Pace {
    /// Requests looked up so far.
    looked_up: AtomicUsize,
    /// Requests whose events the writer has handed to the index (applied under the lock, or
    /// appended to left-right's log and visible at the next publish).
    handed: AtomicUsize,
}

/// Requests looked up before the events of an earlier one become visible (requests arriving
/// during its prefill). Lookup `i` waits until the writer has handed over the events of the
/// requests before `i - EVENT_LAG`.
const EVENT_LAG: usize = 8;

/// Wait until `counter` reaches `target`; returns the time spent waiting.
fn wait_until(counter: &AtomicUsize, target: usize) -> Duration {
    if counter.load(Ordering::Acquire) >= target {
        return Duration::ZERO;
    }
    let start = Instant::now();
    while counter.load(Ordering::Acquire) < target {
        std::thread::yield_now();
    }
    start.elapsed()
}

/// The reader thread: every lookup in trace order, each timed. Returns the latencies and the
/// time spent waiting for the writer.
fn read_all<R>(
    workload: &Workload,
    pace: &Pace,
    mut latency: Histogram<u64>,
    mut lookup: impl FnMut(&[SequenceHash]) -> R,
) -> (Histogram<u64>, Duration) {
    let mut waited = Duration::ZERO;
    for (i, hashes) in workload.lookups.iter().enumerate() {
        waited += wait_until(&pace.handed, i.saturating_sub(EVENT_LAG));
        black_box(timed(&mut latency, || lookup(hashes)));
        pace.looked_up.store(i + 1, Ordering::Release);
    }
    (latency, waited)
}

/// Run `reader` and `writer` on two threads started together; returns the reader's result, the
/// writer's scheduling figures and the wall time.
fn two_threads<R: Send>(
    reader: impl FnOnce() -> R + Send,
    writer: impl FnOnce() + Send,
) -> (R, Sched, Duration) {
    let barrier = Barrier::new(3);
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            barrier.wait();
            reader()
        });
        let writer = scope.spawn(|| {
            barrier.wait();
            let sched = Sched::now();
            writer();
            Sched::now().since(sched)
        });
        barrier.wait();
        let start = Instant::now();
        let reader = reader.join().expect("reader thread");
        let writer = writer.join().expect("writer thread");
        (reader, writer, start.elapsed())
    })
}

fn left_right(workload: &Workload) -> Run {
    let latency = histogram();
    let pace = Pace::default();
    let before = heap::live_bytes();
    let (mut write, read) = left_right::new_from_empty::<IndexCopy, IndexOp>(IndexCopy::default());
    let ((latency, reader_waits), writer, wall) = two_threads(
        // A `ReadHandle` is not `Sync`: the reader thread takes it.
        || {
            read_all(workload, &pace, latency, move |hashes| {
                let guard = read.enter().expect("the writer outlives the reader");
                guard.0.find_matches(hashes)
            })
        },
        || {
            let mut pending = 0;
            for (i, ops) in workload.events.iter().enumerate() {
                if pace.looked_up.load(Ordering::Acquire) <= i {
                    // No events to take: publish what we have, as the gateway does whenever its
                    // channel runs dry, then wait for the lookup that causes the next events.
                    write.publish();
                    pending = 0;
                    wait_until(&pace.looked_up, i + 1);
                }
                for op in ops {
                    // The gateway's writer receives owned ops from a channel; the clone stands in.
                    write.append(op.clone());
                    pending += 1;
                }
                pace.handed.store(i + 1, Ordering::Release);
                if pending >= PUBLISH_EVERY {
                    write.publish();
                    pending = 0;
                }
            }
            write.publish();
        },
    );
    // A second publish brings the other copy up to date and empties the op log, so the heap
    // figure is two full copies and nothing else.
    write.publish();
    let nodes = write.enter().map_or(0, |index| index.0.node_count());
    Run {
        wall,
        reader_waits,
        writer,
        latency,
        nodes,
        heap_bytes: heap::live_bytes().saturating_sub(before),
    }
}

fn rwlock(workload: &Workload) -> Run {
    let latency = histogram();
    let pace = Pace::default();
    let before = heap::live_bytes();
    let index = RwLock::new(KvIndex::new());
    let ((latency, reader_waits), writer, wall) = two_threads(
        || {
            read_all(workload, &pace, latency, |hashes| {
                let guard = index.read().expect("no writer panicked");
                guard.find_matches(hashes)
            })
        },
        || {
            for (i, ops) in workload.events.iter().enumerate() {
                wait_until(&pace.looked_up, i + 1);
                for op in ops {
                    // One event per lock hold: the shortest a writer can keep readers out.
                    index.write().expect("no reader panicked").apply(op);
                }
                pace.handed.store(i + 1, Ordering::Release);
            }
        },
    );
    let nodes = index.read().expect("no thread panicked").node_count();
    Run {
        wall,
        reader_waits,
        writer,
        latency,
        nodes,
        heap_bytes: heap::live_bytes().saturating_sub(before),
    }
}

fn env_usize(name: &str) -> Option<usize> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value}: not a number")),
    )
}

fn main() {
    // `cargo bench` passes `--bench`; without it (`cargo test --benches`) only smoke-test.
    let full = std::env::args().any(|arg| arg == "--bench");
    // The repository's fixture unless told otherwise; the published figures use the whole
    // conversation trace (12,031 rows), which the repository does not carry.
    let trace = std::env::var_os("MOONCAKE_TRACE").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../examples/traces/mooncake/conversation_500.jsonl")
        },
        PathBuf::from,
    );
    let default_rows = if full { usize::MAX } else { SMOKE_TEST_ROWS };
    let rows = env_usize("INDEX_BENCH_ROWS").unwrap_or(default_rows);
    let rounds = env_usize("INDEX_BENCH_ROUNDS")
        .unwrap_or(if full { 3 } else { 1 })
        .max(1);
    assert!(
        trace.exists(),
        "no trace at {} (MOONCAKE_TRACE names a Mooncake trace file)",
        trace.display()
    );

    let start = Instant::now();
    let workload = Workload::from_trace(&trace, rows).expect("readable Mooncake trace");
    let (lookup_blocks, event_blocks) = (workload.lookup_blocks(), workload.event_blocks());
    println!(
        "{}: {} requests -> {} lookup hashes + {} event blocks ({} events); {} workers x {} \
         blocks, prefix hit ratio {:.3}, prepared in {:.1} s",
        trace.display(),
        workload.lookups.len(),
        lookup_blocks,
        event_blocks,
        workload.ops().count(),
        WORKERS,
        CACHE_BLOCKS,
        workload.hit_ratio,
        start.elapsed().as_secs_f64(),
    );

    let mut runs: Vec<Vec<Run>> = MODES.iter().map(|_| Vec::new()).collect();
    for round in 1..=rounds {
        for (mode, mode_runs) in MODES.iter().zip(&mut runs) {
            let run = match mode {
                Mode::SingleThread => single_thread(&workload),
                Mode::LeftRight => left_right(&workload),
                Mode::RwLock => rwlock(&workload),
            };
            // Every mode applies the same events, so every final index must be the same size.
            assert_eq!(
                run.nodes,
                workload.final_nodes,
                "{} final index",
                mode.label()
            );
            println!(
                "round {round} {:<22} {:>6.2} s, lookup p99 {:>8.1} us",
                mode.label(),
                run.wall.as_secs_f64(),
                run.latency.value_at_quantile(0.99) as f64 / 1e3,
            );
            mode_runs.push(run);
        }
    }
    println!("\nmedians over {rounds} round(s):\n");
    let block_ops = lookup_blocks + event_blocks;
    report::print(&runs, block_ops);
}
