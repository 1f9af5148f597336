//! Our KV index on Dynamo's own event stream (`DYNWL001`, from the dynamo-anchor harness at
//! `$DYNAMO_ANCHOR`), replayed with the anchor's protocols so the numbers sit in one table with
//! Dynamo's.
//!
//! Every event goes through the path the gateway runs: the per-rank [`Ingestor`] translates the
//! engine's hashes into our sequence hashes (chaining each block's local hash from its parent's
//! own hash), then [`KvIndex::apply`]. Every query gives the request's local hashes, as Dynamo's
//! `find_matches` takes them, to [`KvIndex::find_matches_locals_into`] with a reused buffer: the
//! walk compares them along chains the index holds with their local hashes and chains a
//! sequence hash where it leaves one (the lookup time includes that chaining).
//! `DYNWL_LOOKUP=hashes` runs the gateway's way instead: ingestors that keep no local hashes,
//! and queries whose sequence hashes are chained before the clock starts (in the gateway the
//! tokenizer hashes the prompt once, for everything that needs it), then looked up as the router
//! does ([`KvIndex::find_matches_into`]).
//!
//! Modes (`DYNWL_MODE`):
//! - `serial`: one thread pinned to `DYNWL_QUERY_CPU` (0), strict stream order.
//! - `pipelined`: `DYNWL_EVENT_THREADS` event threads (1), pinned to `DYNWL_EVENT_CPUS` ("1"),
//!   each owning the ranks `worker % threads` with their ingestors and one `left-right` copy pair;
//!   the query thread (pinned to `DYNWL_QUERY_CPU`) hands events over without waiting and, before
//!   each query, waits until every earlier event is applied and published (the anchor's
//!   `pipelined-strict`, exact answers). Lookups read the published copies and never wait behind a
//!   write. The clock stops when the event threads have drained. By default the query thread
//!   translates events with the ingestors and hands over index changes (the gateway's split:
//!   subscriber tasks translate, the writer applies); `DYNWL_TRANSLATE=event` has each event
//!   thread translate its own ranks' events. Events go over in batches of up to 64 (sooner when
//!   a query needs them); waiting threads block rather than spin.
//!
//! Output: one JSON line per run with the anchor's keys (stdout, and appended to
//! `DYNWL_JSON_OUT`), so `EXTRA_CMDS` of `scripts/run_indexer_anchor.sh` interleaves it with
//! Dynamo's runs and `scripts/summarize.py` tabulates both. The workload is
//! `DYNWL_WORKLOAD` (default `/tmp/dynamo-anchor-data/workload.bin.zst`); without it the bench
//! says so and exits. Under `cargo test --benches` it replays the first 20,000 ops once per mode.

#[path = "../support/heap.rs"]
mod heap;
mod workload;

use heap::CountingAlloc;
use left_right::{ReadHandle, WriteHandle};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::Instant;
use switchyard_core::hash::{BlockHasher, LocalBlockHash, SequenceHash};
use switchyard_core::index::{IndexOp, KvIndex, Matches};
use switchyard_core::worker::{Rank, Tier};
use switchyard_gateway::index::IndexCopy;
use switchyard_kv_events::ingest::Ingestor;
use workload::{Op, Workload};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const DEFAULT_WORKLOAD: &str = "/tmp/dynamo-anchor-data/workload.bin.zst";
const SMOKE_OPS: usize = 20_000;
/// An event thread publishes at least this often while it has a backlog.
const MAX_OPS_PER_PUBLISH: u64 = 4096;
/// Events the query thread hands an event thread at once (sooner when a query needs them): one
/// channel message, and one wake-up of a parked event thread, per batch rather than per event.
const HANDOVER_BATCH: usize = 64;
/// Empty polls before an event thread parks on its channel.
const SPIN_BEFORE_PARK: u32 = 200;

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

fn env_num(key: &str, default: usize) -> usize {
    env(key).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn cpus(key: &str, default: &str) -> Vec<usize> {
    env(key)
        .unwrap_or_else(|| default.to_string())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Serial,
    Pipelined,
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let path = PathBuf::from(env("DYNWL_WORKLOAD").unwrap_or_else(|| DEFAULT_WORKLOAD.into()));
    if !path.exists() {
        eprintln!(
            "dynamo_stream: no workload at {} (set DYNWL_WORKLOAD=/path/to/workload.bin.zst; \
             generate it with $DYNAMO_ANCHOR/scripts/gen_workload.sh); skipping",
            path.display()
        );
        return;
    }
    let loaded = Instant::now();
    let mut wl = match workload::read(&path) {
        Ok(wl) => wl,
        Err(error) => {
            eprintln!("dynamo_stream: {error}");
            std::process::exit(1);
        }
    };
    let limit = env("DYNWL_LIMIT_OPS")
        .and_then(|v| v.parse().ok())
        .or((!bench).then_some(SMOKE_OPS));
    if let Some(limit) = limit {
        wl.ops.truncate(limit);
        wl.totals = workload::totals(&wl.ops);
    }
    eprintln!(
        "loaded {} ops ({} queries, {} block ops) in {:.2}s",
        wl.ops.len(),
        wl.totals.queries,
        wl.totals.block_ops(),
        loaded.elapsed().as_secs_f64()
    );
    let modes = if bench {
        match env("DYNWL_MODE").as_deref() {
            Some("pipelined") => vec![Mode::Pipelined],
            Some("both") => vec![Mode::Serial, Mode::Pipelined],
            _ => vec![Mode::Serial],
        }
    } else {
        vec![Mode::Serial, Mode::Pipelined]
    };
    let threads = env_num("DYNWL_EVENT_THREADS", 1).max(1);
    for _ in 0..env_num("DYNWL_REPS", 1) {
        for &mode in &modes {
            let load = loadavg();
            let cpu = heap::process_cpu_secs();
            let run = match mode {
                Mode::Serial => serial(&wl),
                Mode::Pipelined => pipelined(&wl, threads),
            };
            let cpu = heap::process_cpu_secs() - cpu;
            report(&path, &wl, mode, threads, &run, &load, cpu);
        }
    }
}

/// What one run measured.
#[derive(Debug, Default)]
struct Run {
    wall_secs: f64,
    query_secs: f64,
    event_secs: f64,
    lookup_ns: Vec<u64>,
    checksum: Checksum,
    index_bytes: usize,
    ingest_bytes: usize,
    peak_heap_bytes: usize,
}

/// The anchor's answer checksum.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Checksum {
    score_sum: u64,
    hits: u64,
    fingerprint: u64,
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Checksum {
    fn add(&mut self, query: u64, matches: &Matches) {
        for (rank, overlap) in matches {
            let score = u64::from(overlap.total());
            if score == 0 {
                continue;
            }
            self.score_sum += score;
            self.hits += 1;
            let key = query.wrapping_mul(0x0100_0193)
                ^ (u64::from(rank.worker.0) << 40)
                ^ (u64::from(rank.dp_rank) << 56)
                ^ score;
            self.fingerprint = self.fingerprint.wrapping_add(splitmix64(key));
        }
    }
}

/// How queries are answered (`DYNWL_LOOKUP`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Lookup {
    /// `locals` (the default): the request's local hashes go to the index, as Dynamo's
    /// `find_matches` takes them, and the ingestors keep the chains' local hashes for it.
    Locals,
    /// `hashes`: the request's sequence hashes are chained from its local hashes before the
    /// lookup is timed, and the ingestors run as the gateway runs them (it holds every prompt's
    /// sequence hashes, so it keeps no local hashes).
    Hashes,
}

impl Lookup {
    fn from_env() -> Self {
        match env("DYNWL_LOOKUP").as_deref() {
            None | Some("locals") => Lookup::Locals,
            Some("hashes") => Lookup::Hashes,
            Some(other) => panic!("DYNWL_LOOKUP={other}: locals or hashes"),
        }
    }
}

/// One query's lookups, in every shard: with [`Lookup::Hashes`], the request's sequence hashes
/// are chained once, untimed, for every shard's walk.
struct Lookups {
    lookup: Lookup,
    hasher: BlockHasher,
    seq: Vec<SequenceHash>,
}

impl Lookups {
    fn new(block_size: u32) -> Self {
        Self {
            lookup: Lookup::from_env(),
            hasher: BlockHasher::new(block_size as usize),
            seq: Vec::with_capacity(1 << 14),
        }
    }

    /// A new request, before its lookups are timed: with [`Lookup::Hashes`], chain its hashes.
    fn start(&mut self, locals: &[LocalBlockHash]) {
        if self.lookup == Lookup::Hashes {
            self.seq.clear();
            for &local in locals {
                let hash = self.hasher.chain(self.seq.last().copied(), local);
                self.seq.push(hash);
            }
        }
    }

    /// Answer the request [`start`](Self::start)ed with `locals` from `index` into `out`.
    fn find(&self, index: &KvIndex, locals: &[LocalBlockHash], out: &mut Matches) {
        match self.lookup {
            Lookup::Locals => index.find_matches_locals_into(locals, &self.hasher, out),
            Lookup::Hashes => index.find_matches_into(&self.seq, out),
        }
    }
}

/// One ingestor per worker, created on first sight.
struct Ingestors {
    block_size: u32,
    by_worker: Vec<Option<Ingestor>>,
}

impl Ingestors {
    fn new(block_size: u32, workers: u32) -> Self {
        Self {
            block_size,
            by_worker: (0..workers).map(|_| None).collect(),
        }
    }

    fn get(&mut self, worker: u32) -> &mut Ingestor {
        let w = worker as usize;
        if w >= self.by_worker.len() {
            self.by_worker.resize_with(w + 1, || None);
        }
        let block_size = self.block_size;
        self.by_worker[w].get_or_insert_with(|| {
            let ingestor = Ingestor::new(Rank::new(worker, 0), block_size);
            match Lookup::from_env() {
                Lookup::Locals => ingestor.local_hashes(),
                Lookup::Hashes => ingestor,
            }
        })
    }

    /// The engine event as index changes in our hash space (`None`: nothing changed).
    fn translate(&mut self, op: &Op) -> Option<IndexOp> {
        match op {
            Op::Query(_) => None,
            Op::Stored {
                worker,
                parent,
                blocks,
            } => self
                .get(*worker)
                .store_locals(*parent, blocks, Tier::Device),
            Op::Removed { worker, blocks } => self.get(*worker).remove_blocks(blocks, Tier::Device),
            Op::Cleared { worker } => Some(self.get(*worker).clear_all()),
        }
    }
}

fn serial(wl: &Workload) -> Run {
    heap::pin(&cpus("DYNWL_QUERY_CPU", "0"));
    let mut run = Run {
        lookup_ns: Vec::with_capacity(wl.totals.queries as usize),
        ..Run::default()
    };
    let mut lookups = Lookups::new(wl.block_size);
    heap::reset_peak();
    let base = heap::live_bytes();
    let mut ingestors = Ingestors::new(wl.block_size, wl.workers);
    let mut index = KvIndex::new();
    let mut query = 0u64;
    let mut matches: Matches = Vec::new();
    let mut event_ns = 0u128;
    let mut events_since: Option<Instant> = None;
    let start = Instant::now();
    for op in &wl.ops {
        let Op::Query(locals) = op else {
            events_since.get_or_insert_with(Instant::now);
            if let Some(change) = ingestors.translate(op) {
                index.apply(&change);
            }
            continue;
        };
        if let Some(since) = events_since.take() {
            event_ns += since.elapsed().as_nanos();
        }
        lookups.start(locals);
        let t = Instant::now();
        lookups.find(&index, locals, &mut matches);
        let ns = t.elapsed().as_nanos() as u64;
        run.lookup_ns.push(ns);
        run.checksum.add(query, &matches);
        query += 1;
    }
    if let Some(since) = events_since.take() {
        event_ns += since.elapsed().as_nanos();
    }
    run.wall_secs = start.elapsed().as_secs_f64();
    run.event_secs = event_ns as f64 / 1e9;
    run.query_secs = run.lookup_ns.iter().sum::<u64>() as f64 / 1e9;
    run.peak_heap_bytes = heap::peak_bytes().saturating_sub(base);
    let live = heap::live_bytes();
    drop(index);
    run.index_bytes = live.saturating_sub(heap::live_bytes());
    let live = heap::live_bytes();
    drop(ingestors);
    run.ingest_bytes = live.saturating_sub(heap::live_bytes());
    run
}

/// What the query thread hands an event thread: an engine event to translate there, or a change
/// it already translated (`DYNWL_TRANSLATE=caller`, the gateway's split: subscriber tasks
/// translate, the index writer applies).
enum Work<'a> {
    Event(&'a Op),
    Change(IndexOp),
}

/// An event thread's share: its ranks' ingestors and the write side of its shard.
struct Shard {
    ingestors: Ingestors,
    write: WriteHandle<IndexCopy, IndexOp>,
}

fn pipelined<'a>(wl: &'a Workload, threads: usize) -> Run {
    let query_cpus = cpus("DYNWL_QUERY_CPU", "0");
    let translate_here = env("DYNWL_TRANSLATE").as_deref() != Some("event");
    let mut caller_ingestors = Ingestors::new(wl.block_size, wl.workers);
    let event_cpus = cpus("DYNWL_EVENT_CPUS", "1");
    let mut run = Run {
        lookup_ns: Vec::with_capacity(wl.totals.queries as usize),
        ..Run::default()
    };
    let mut lookups = Lookups::new(wl.block_size);
    heap::reset_peak();
    let base = heap::live_bytes();
    let done: Arc<Vec<Progress>> = Arc::new((0..threads).map(|_| Progress::default()).collect());
    let mut senders = Vec::new();
    let mut readers: Vec<ReadHandle<IndexCopy>> = Vec::new();
    let shards: Vec<Shard> = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for s in 0..threads {
            let (tx, rx) = mpsc::channel::<Vec<Work<'a>>>();
            let (write, read) = left_right::new::<IndexCopy, IndexOp>();
            senders.push(tx);
            readers.push(read);
            let done = Arc::clone(&done);
            let event_cpus = event_cpus.clone();
            let mut shard = Shard {
                ingestors: Ingestors::new(wl.block_size, wl.workers),
                write,
            };
            handles.push(scope.spawn(move || {
                heap::pin(&event_cpus);
                let mut applied = 0u64;
                let mut unpublished = 0u64;
                while let Some(batch) = receive(&rx) {
                    let mut next = Some(batch);
                    while let Some(batch) = next {
                        for work in batch {
                            let change = match work {
                                Work::Event(op) => shard.ingestors.translate(op),
                                Work::Change(change) => Some(change),
                            };
                            if let Some(change) = change {
                                shard.write.append(change);
                            }
                            applied += 1;
                            unpublished += 1;
                        }
                        if unpublished >= MAX_OPS_PER_PUBLISH {
                            shard.write.publish();
                            done[s].publish(applied);
                            unpublished = 0;
                        }
                        next = rx.try_recv().ok();
                    }
                    shard.write.publish();
                    done[s].publish(applied);
                    unpublished = 0;
                    // The channel is empty: bring the other copy up to date now, which left-right
                    // would do at the next publish, while the query thread waits for it.
                    shard.write.publish();
                }
                shard
            }));
        }
        heap::pin(&query_cpus);
        let mut sent = vec![0u64; threads];
        let mut pending: Vec<Vec<Work<'a>>> = (0..threads).map(|_| Vec::new()).collect();
        let wait = |sent: &[u64]| {
            for (s, &n) in sent.iter().enumerate() {
                done[s].wait_for(n);
            }
        };
        let hand_over = |pending: &mut Vec<Vec<Work<'a>>>| {
            for (tx, batch) in senders.iter().zip(pending.iter_mut()) {
                if !batch.is_empty() {
                    let full = std::mem::replace(batch, Vec::with_capacity(HANDOVER_BATCH));
                    tx.send(full).expect("event threads outlive the sender");
                }
            }
        };
        let mut query = 0u64;
        let mut matches: Matches = Vec::new();
        let mut shard_matches: Matches = Vec::new();
        let start = Instant::now();
        for op in &wl.ops {
            let worker = match op {
                Op::Query(_) => None,
                Op::Stored { worker, .. } | Op::Removed { worker, .. } | Op::Cleared { worker } => {
                    Some(*worker as usize)
                }
            };
            if let Some(worker) = worker {
                let s = worker % threads;
                if translate_here {
                    let Some(change) = caller_ingestors.translate(op) else {
                        continue;
                    };
                    pending[s].push(Work::Change(change));
                } else {
                    pending[s].push(Work::Event(op));
                }
                sent[s] += 1;
                if pending[s].len() == HANDOVER_BATCH {
                    let full =
                        std::mem::replace(&mut pending[s], Vec::with_capacity(HANDOVER_BATCH));
                    senders[s]
                        .send(full)
                        .expect("event threads outlive the sender");
                }
                continue;
            }
            let Op::Query(locals) = op else {
                continue;
            };
            hand_over(&mut pending);
            wait(&sent);
            lookups.start(locals);
            let t = Instant::now();
            matches.clear();
            for read in &readers {
                if let Some(copy) = read.enter() {
                    lookups.find(&copy.0, locals, &mut shard_matches);
                    matches.extend_from_slice(&shard_matches);
                }
            }
            let ns = t.elapsed().as_nanos() as u64;
            run.lookup_ns.push(ns);
            run.checksum.add(query, &matches);
            query += 1;
        }
        hand_over(&mut pending);
        wait(&sent);
        run.wall_secs = start.elapsed().as_secs_f64();
        run.query_secs = run.lookup_ns.iter().sum::<u64>() as f64 / 1e9;
        senders.clear();
        handles
            .into_iter()
            .map(|h| h.join().expect("event thread panicked"))
            .collect()
    });
    run.peak_heap_bytes = heap::peak_bytes().saturating_sub(base);
    drop(readers);
    let mut ingestors = vec![caller_ingestors];
    let live = heap::live_bytes();
    for shard in shards {
        ingestors.push(shard.ingestors);
        drop(shard.write);
    }
    run.index_bytes = live.saturating_sub(heap::live_bytes());
    let live = heap::live_bytes();
    drop(ingestors);
    run.ingest_bytes = live.saturating_sub(heap::live_bytes());
    run
}

/// The next batch: poll briefly (a query usually follows its events within microseconds), then
/// park.
fn receive<T>(rx: &mpsc::Receiver<T>) -> Option<T> {
    for _ in 0..SPIN_BEFORE_PARK {
        match rx.try_recv() {
            Ok(batch) => return Some(batch),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
        }
    }
    rx.recv().ok()
}

/// Events an event thread has applied and published, for the query thread to block on: a
/// blocked thread leaves the CPU to the thread it waits for, and the scheduler wakes it promptly
/// (spinning or yielding on a shared machine loses whole time slices).
#[derive(Debug, Default)]
struct Progress {
    applied: Mutex<u64>,
    changed: Condvar,
}

impl Progress {
    fn publish(&self, applied: u64) {
        *self.applied.lock().expect("no thread panicked holding it") = applied;
        self.changed.notify_one();
    }

    fn wait_for(&self, n: u64) {
        let mut applied = self.applied.lock().expect("no thread panicked holding it");
        while *applied < n {
            applied = self
                .changed
                .wait(applied)
                .expect("no thread panicked holding it");
        }
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Nearest-rank percentile in µs (the anchor's `summarize_ns`).
fn percentile_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx] as f64 / 1e3
}

fn report(
    path: &std::path::Path,
    wl: &Workload,
    mode: Mode,
    threads: usize,
    run: &Run,
    load: &str,
    cpu: f64,
) {
    let mut lat = run.lookup_ns.clone();
    lat.sort_unstable();
    let mean = lat.iter().sum::<u64>() as f64 / lat.len().max(1) as f64 / 1e3;
    let t = &wl.totals;
    let block_ops = t.block_ops();
    let (backend, event_threads, default_label) = match mode {
        Mode::Serial => ("switchyard-index", 0, "serial".to_string()),
        Mode::Pipelined if env("DYNWL_TRANSLATE").as_deref() == Some("event") => (
            "switchyard-index-lr-translate-on-event-thread",
            threads,
            format!("pipelined-strict-{threads}ev"),
        ),
        Mode::Pipelined => (
            "switchyard-index-lr",
            threads,
            match threads {
                1 => "pipelined-strict".to_string(),
                n => format!("pipelined-strict-{n}ev"),
            },
        ),
    };
    let label = env("DYNWL_LABEL").unwrap_or(default_label);
    let per = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let c = run.checksum;
    eprintln!(
        "{label} {backend} ({event_threads} event thr): {:.3}s wall, {:.2} M block ops/s, \
         lookup p50 {:.2} us p99 {:.2} us max {:.1} us, score_sum={} hits={} fp={:016x}, \
         index {:.1} MiB + ingest {:.1} MiB (peak heap {:.1} MiB)",
        run.wall_secs,
        per(block_ops, run.wall_secs) / 1e6,
        percentile_us(&lat, 0.5),
        percentile_us(&lat, 0.99),
        percentile_us(&lat, 1.0),
        c.score_sum,
        c.hits,
        c.fingerprint,
        mib(run.index_bytes),
        mib(run.ingest_bytes),
        mib(run.peak_heap_bytes),
    );
    let line = format!(
        "{{\"label\":\"{label}\",\"backend\":\"{backend}\",\"mode\":\"{mode}\",\
         \"event_threads\":{event_threads},\"max_lag_events\":0,\"workload\":\"{workload}\",\
         \"workload_block_size\":{bs},\"workload_workers\":{workers},\"totals\":{totals},\
         \"block_ops\":{block_ops},\"logical_ops\":{logical},\"wall_secs\":{wall},\
         \"block_ops_per_sec\":{bops},\"logical_ops_per_sec\":{lops},\
         \"query_secs\":{qs},\"query_blocks_per_query_sec\":{qbps},\"event_secs\":{es},\
         \"event_blocks_per_event_sec\":{ebps},\"lookup_us\":{{\"count\":{n},\"mean\":{mean},\
         \"p50\":{p50},\"p90\":{p90},\"p99\":{p99},\"p999\":{p999},\"max\":{max}}},\
         \"loop_cpu_secs\":{cpu},\"block_ops_per_cpu_sec\":{bpc},\
         \"checksum\":{{\"score_sum\":{ss},\"hits\":{hits},\"fingerprint\":{fp}}},\
         \"loadavg_before\":\"{load}\",\"loadavg_after\":\"{load_after}\",\
         \"index_heap_mib\":{ih},\"ingest_heap_mib\":{ig},\"peak_heap_mib\":{ph},\
         \"peak_rss_mib\":{rss}}}",
        mode = if mode == Mode::Serial {
            "serial"
        } else {
            "pipelined"
        },
        workload = path.display(),
        bs = wl.block_size,
        workers = wl.workers,
        totals = t.json(),
        logical = t.logical_ops(),
        wall = run.wall_secs,
        bops = per(block_ops, run.wall_secs),
        lops = per(t.logical_ops(), run.wall_secs),
        qs = run.query_secs,
        qbps = per(t.query_blocks, run.query_secs),
        es = run.event_secs,
        ebps = per(t.stored_blocks + t.removed_blocks, run.event_secs),
        n = lat.len(),
        p50 = percentile_us(&lat, 0.5),
        p90 = percentile_us(&lat, 0.9),
        p99 = percentile_us(&lat, 0.99),
        p999 = percentile_us(&lat, 0.999),
        max = percentile_us(&lat, 1.0),
        bpc = per(block_ops, cpu),
        ss = c.score_sum,
        hits = c.hits,
        fp = c.fingerprint,
        load_after = loadavg(),
        ih = mib(run.index_bytes),
        ig = mib(run.ingest_bytes),
        ph = mib(run.peak_heap_bytes),
        rss = heap::peak_rss_mib(),
    );
    println!("{line}");
    if let Some(out) = env("DYNWL_JSON_OUT") {
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&out)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(error) = appended {
            eprintln!("dynamo_stream: append to {out}: {error}");
        }
    }
}
