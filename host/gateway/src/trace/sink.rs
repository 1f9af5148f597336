//! The sink: a bounded queue that never makes a request wait, and one writer thread that
//! serialises lines into segments rolled by size.

use super::record::{TraceLine, unix_ms};
use crate::config::TraceConfig;
use flate2::Compression;
use flate2::write::GzEncoder;
use prometheus_client::metrics::counter::Counter;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// Lines written between flushes at most: bounds how far a segment overshoots its size and how
/// much a crash loses.
const BATCH: usize = 256;
/// How often an idle writer looks at the stop token.
const IDLE_POLL: Duration = Duration::from_millis(200);

/// Where request handlers put trace lines. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TraceSink {
    tx: SyncSender<TraceLine>,
    dropped: Counter,
    include_content: bool,
}

impl TraceSink {
    /// Open the first segment (so a bad path fails at start) and return the sink and the writer
    /// to run on a blocking thread.
    pub fn open(config: &TraceConfig, dropped: Counter) -> io::Result<(TraceSink, TraceWriter)> {
        let (tx, rx) = sync_channel(config.buffer);
        let mut segments = Segments::new(config)?;
        segments.open()?;
        let writer = TraceWriter {
            rx,
            segments,
            dropped: dropped.clone(),
        };
        let sink = TraceSink {
            tx,
            dropped,
            include_content: config.include_content,
        };
        Ok((sink, writer))
    }

    /// Queue a line; when the writer is behind (or gone) the line is dropped and counted.
    pub fn record(&self, line: TraceLine) -> bool {
        match self.tx.try_send(line) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.inc();
                false
            }
        }
    }

    /// Whether request bodies and completions go into the trace.
    pub fn include_content(&self) -> bool {
        self.include_content
    }
}

/// The writer side; [`TraceWriter::run`] blocks until stopped.
#[derive(Debug)]
pub struct TraceWriter {
    rx: Receiver<TraceLine>,
    segments: Segments,
    dropped: Counter,
}

impl TraceWriter {
    /// Write lines until `stop` is cancelled (then drain what is queued) or every sink is gone;
    /// the last segment is finished either way.
    pub fn run(mut self, stop: CancellationToken) {
        loop {
            let first = match self.rx.recv_timeout(IDLE_POLL) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) if !stop.is_cancelled() => continue,
                Err(_) => break,
            };
            let batch = std::iter::once(first).chain(self.rx.try_iter().take(BATCH - 1));
            let batch: Vec<TraceLine> = batch.collect();
            self.write(&batch);
        }
        let rest: Vec<TraceLine> = self.rx.try_iter().collect();
        self.write(&rest);
        if let Err(e) = self.segments.close() {
            tracing::warn!(error = %e, "cannot finish the last trace segment");
        }
    }

    fn write(&mut self, batch: &[TraceLine]) {
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.segments.write_batch(batch) {
            tracing::warn!(error = %e, lines = batch.len(), "trace lines lost");
            self.dropped.inc_by(batch.len() as u64);
        }
    }
}

/// The segment files of one sink.
#[derive(Debug)]
struct Segments {
    dir: PathBuf,
    prefix: String,
    gzip: bool,
    limit: u64,
    next: u64,
    current: Option<Segment>,
}

impl Segments {
    fn new(config: &TraceConfig) -> io::Result<Self> {
        let (dir, prefix) = dir_and_prefix(&config.path);
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            dir,
            prefix,
            gzip: config.gzip,
            limit: config.segment_bytes,
            next: 0,
            current: None,
        })
    }

    fn open(&mut self) -> io::Result<&mut Segment> {
        let segment = match self.current.take() {
            Some(segment) => segment,
            None => {
                let ext = if self.gzip { "jsonl.gz" } else { "jsonl" };
                let name = format!(
                    "{}-{}-{}.{ext}",
                    self.prefix,
                    unix_ms(SystemTime::now()),
                    self.next
                );
                self.next += 1;
                Segment::new(File::create_new(self.dir.join(name))?, self.gzip)
            }
        };
        Ok(self.current.insert(segment))
    }

    /// Write, flush so readers (and a crash) see whole lines, roll when the segment is full.
    fn write_batch(&mut self, batch: &[TraceLine]) -> io::Result<()> {
        let result = self.try_write_batch(batch);
        if result.is_err() {
            // Start afresh next time rather than append to a file in an unknown state.
            self.current = None;
        }
        result
    }

    fn try_write_batch(&mut self, batch: &[TraceLine]) -> io::Result<()> {
        let limit = self.limit;
        for line in batch {
            let segment = self.open()?;
            serde_json::to_writer(&mut segment.out, line)?;
            segment.out.write_all(b"\n")?;
            if segment.bytes() >= limit {
                self.close()?;
            }
        }
        if let Some(segment) = &mut self.current {
            segment.out.flush()?;
            if segment.bytes() >= limit {
                self.close()?;
            }
        }
        Ok(())
    }

    fn close(&mut self) -> io::Result<()> {
        match self.current.take() {
            Some(segment) => segment.finish(),
            None => Ok(()),
        }
    }
}

/// One open segment file.
#[derive(Debug)]
struct Segment {
    out: SegmentOut,
}

#[derive(Debug)]
enum SegmentOut {
    Gzip(Box<GzEncoder<Counting>>),
    Plain(Counting),
}

impl Segment {
    fn new(file: File, gzip: bool) -> Self {
        let file = Counting {
            inner: BufWriter::new(file),
            bytes: 0,
        };
        let out = if gzip {
            SegmentOut::Gzip(Box::new(GzEncoder::new(file, Compression::default())))
        } else {
            SegmentOut::Plain(file)
        };
        Self { out }
    }

    /// Bytes that reached the file (compressed output lags until a flush).
    fn bytes(&self) -> u64 {
        match &self.out {
            SegmentOut::Gzip(gz) => gz.get_ref().bytes,
            SegmentOut::Plain(file) => file.bytes,
        }
    }

    fn finish(self) -> io::Result<()> {
        let mut file = match self.out {
            SegmentOut::Gzip(gz) => gz.finish()?,
            SegmentOut::Plain(file) => file,
        };
        file.flush()
    }
}

impl Write for SegmentOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            SegmentOut::Gzip(gz) => gz.write(buf),
            SegmentOut::Plain(file) => file.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            SegmentOut::Gzip(gz) => gz.flush(),
            SegmentOut::Plain(file) => file.flush(),
        }
    }
}

/// Counts the bytes written through it.
#[derive(Debug)]
struct Counting {
    inner: BufWriter<File>,
    bytes: u64,
}

impl Write for Counting {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The segment files under a sink's `path`, oldest first.
pub fn segment_paths(path: &Path) -> io::Result<Vec<PathBuf>> {
    let (dir, prefix) = dir_and_prefix(path);
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(rest) = name.strip_prefix(&prefix).and_then(|r| r.strip_prefix('-')) else {
            continue;
        };
        let stem = rest
            .strip_suffix(".jsonl.gz")
            .or_else(|| rest.strip_suffix(".jsonl"));
        let order = stem.and_then(|s| {
            let (ms, n) = s.split_once('-')?;
            Some((ms.parse::<u64>().ok()?, n.parse::<u64>().ok()?))
        });
        if let Some(order) = order {
            found.push((order, path));
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

/// A directory (existing, or spelled with a trailing `/`) holds `trace-*` segments; any other
/// path is a directory and a file-name prefix.
fn dir_and_prefix(path: &Path) -> (PathBuf, String) {
    if path.is_dir() || path.as_os_str().to_string_lossy().ends_with('/') {
        return (path.to_path_buf(), "trace".into());
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let prefix = path
        .file_name()
        .map_or_else(|| "trace".into(), |n| n.to_string_lossy().into_owned());
    (dir, prefix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::AgentContext;
    use crate::trace::read_trace;
    use crate::trace::record::{EventType, SCHEMA, ToolFields};
    use std::io::{Seek, SeekFrom};

    fn line(i: u64) -> TraceLine {
        TraceLine {
            schema: SCHEMA.into(),
            event_type: EventType::ToolStart,
            event_time_unix_ms: i,
            agent_context: AgentContext {
                session_id: Some(format!("session-{i}")),
                ..AgentContext::default()
            },
            request: None,
            tool: Some(ToolFields {
                call_id: format!("call-{i}"),
                name: "bash".into(),
                duration_ms: None,
                error: None,
            }),
            content: None,
        }
    }

    fn config(path: &Path, gzip: bool, segment_bytes: u64, buffer: usize) -> TraceConfig {
        TraceConfig {
            path: path.to_path_buf(),
            segment_bytes,
            gzip,
            include_content: false,
            buffer,
        }
    }

    #[test]
    fn rolls_gzip_segments_by_size_and_reads_them_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (sink, writer) =
            TraceSink::open(&config(dir.path(), true, 1_000, 1_000), Counter::default()).unwrap();
        let stop = CancellationToken::new();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || writer.run(stop)
        });
        for i in 0..300 {
            assert!(sink.record(line(i)));
        }
        stop.cancel();
        thread.join().unwrap();
        let segments = segment_paths(dir.path()).unwrap();
        assert!(segments.len() >= 2, "{segments:?}");
        // Rolled only once full.
        for path in &segments[..segments.len() - 1] {
            assert!(std::fs::metadata(path).unwrap().len() >= 1_000, "{path:?}");
        }
        for path in &segments {
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(
                name.starts_with("trace-") && name.ends_with(".jsonl.gz"),
                "{name}"
            );
            // Every segment is a finished gzip member: decodes to the end without error.
            let mut text = String::new();
            let mut gz = flate2::read::GzDecoder::new(File::open(path).unwrap());
            std::io::Read::read_to_string(&mut gz, &mut text).unwrap();
        }
        let times: Vec<u64> = read_trace(dir.path())
            .unwrap()
            .iter()
            .map(|l| l.event_time_unix_ms)
            .collect();
        assert_eq!(times, (0..300).collect::<Vec<_>>());
    }

    #[test]
    fn drops_and_counts_when_the_writer_is_behind() {
        let dir = tempfile::tempdir().unwrap();
        let dropped = Counter::default();
        let (sink, writer) =
            TraceSink::open(&config(dir.path(), true, 1 << 20, 2), dropped.clone()).unwrap();
        let accepted: Vec<bool> = (0..5).map(|i| sink.record(line(i))).collect();
        assert_eq!(accepted, [true, true, false, false, false]);
        assert_eq!(dropped.get(), 3);
        drop(writer); // the writer is gone: nothing can be queued any more
        assert!(!sink.record(line(9)));
        assert_eq!(dropped.get(), 4);
    }

    #[test]
    fn a_running_plain_segment_with_a_file_prefix_is_readable() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("gw");
        let (sink, writer) =
            TraceSink::open(&config(&prefix, false, 1 << 20, 100), Counter::default()).unwrap();
        let stop = CancellationToken::new();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || writer.run(stop)
        });
        sink.record(line(1));
        sink.record(line(2));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while read_trace(&prefix).unwrap().len() < 2 {
            assert!(std::time::Instant::now() < deadline, "never flushed");
            std::thread::sleep(Duration::from_millis(10));
        }
        let segments = segment_paths(&prefix).unwrap();
        let name = segments[0].file_name().unwrap().to_str().unwrap();
        assert!(
            name.starts_with("gw-") && name.ends_with("-0.jsonl"),
            "{name}"
        );
        stop.cancel();
        thread.join().unwrap();
    }

    /// Every line is readable as soon as its batch is written, however large (agent request
    /// bodies run to hundreds of KB): a flush that stops short of its sync point hides a request
    /// from readers until the next one arrives (miniz_oxide did, about once in 400 such lines).
    #[test]
    fn every_large_line_is_readable_right_after_its_batch() {
        let dir = tempfile::tempdir().unwrap();
        let mut segments = Segments::new(&config(dir.path(), true, 1 << 40, 1)).unwrap();
        // A reader that follows the file as it grows.
        let mut reader = flate2::write::GzDecoder::new(Vec::new());
        let (mut read, mut lines) = (0, 0);
        let mut state = 0x9e37_79b9_7f4a_7c16_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for i in 0..400 {
            let mut big = line(i);
            let size = 1_000 + (next() % 150_000) as usize;
            let text = (0..size).map(|_| char::from(b'a' + (next() % 26) as u8));
            big.tool.as_mut().unwrap().name = text.collect();
            segments.write_batch(&[big]).unwrap();
            let mut file = File::open(&segment_paths(dir.path()).unwrap()[0]).unwrap();
            file.seek(SeekFrom::Start(read)).unwrap();
            read += io::copy(&mut file, &mut reader).unwrap();
            reader.flush().unwrap();
            lines += reader.get_ref().iter().filter(|&&b| b == b'\n').count() as u64;
            reader.get_mut().clear();
            assert_eq!(lines, i + 1, "line {i} of {size} bytes");
        }
    }

    #[test]
    fn an_unfinished_gzip_segment_reads_up_to_its_last_flush() {
        let dir = tempfile::tempdir().unwrap();
        let (sink, writer) =
            TraceSink::open(&config(dir.path(), true, 1 << 20, 100), Counter::default()).unwrap();
        let stop = CancellationToken::new();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || writer.run(stop)
        });
        for i in 0..3 {
            sink.record(line(i));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while read_trace(dir.path()).unwrap().len() < 3 {
            assert!(std::time::Instant::now() < deadline, "never flushed");
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.cancel();
        thread.join().unwrap();
    }
}
