//! The request trace: one `request_end` JSON line per finished request plus the tool events
//! harnesses push, written to size-rolled (gzip) segments without ever making a request wait.
//!
//! [`record`] is the line format (`switchyard.request.trace.v1`) and how a request becomes one,
//! [`sink`] the queue and writer, [`tool_events`] the harness API, [`timeline`] the Perfetto
//! view. [`read_trace`] reads segments back.

pub mod record;
pub mod sink;
pub mod timeline;
pub mod tool_events;

pub use record::{Ending, RequestDraft, RequestFacts, TraceLine, WorkerRef};
pub use sink::{TraceSink, TraceWriter, segment_paths};
pub use timeline::live_timeline;
pub use tool_events::parse_tool_events;

use flate2::read::MultiGzDecoder;
use std::io::{self, Read};
use std::path::Path;

/// Every line of a trace: one segment file (gzip or not), or all segments under a sink's `path`
/// (a directory or file prefix), oldest first. A segment still being written (no gzip trailer
/// yet) is read up to its last flushed line; lines that are not trace lines are skipped.
pub fn read_trace(path: &Path) -> io::Result<Vec<TraceLine>> {
    let files = if path.is_file() {
        vec![path.to_path_buf()]
    } else {
        segment_paths(path)?
    };
    let mut lines = Vec::new();
    let mut skipped = 0usize;
    for file in files {
        let bytes = std::fs::read(&file)?;
        let text = if bytes.starts_with(&[0x1f, 0x8b]) {
            // An unfinished segment has no gzip trailer: its decoder fails at the end, after
            // handing over everything up to the last flush, which `read_to_end` keeps.
            let mut text = Vec::new();
            let _ = MultiGzDecoder::new(bytes.as_slice()).read_to_end(&mut text);
            text
        } else {
            bytes
        };
        read_lines(&text, &mut lines, &mut skipped);
    }
    if skipped > 0 {
        tracing::warn!(skipped, "skipped lines that are not trace lines");
    }
    Ok(lines)
}

/// The trace lines of `text`; a last line without its newline is still being written.
fn read_lines(text: &[u8], lines: &mut Vec<TraceLine>, skipped: &mut usize) {
    let complete = match text.iter().rposition(|&b| b == b'\n') {
        Some(end) => &text[..end],
        None => &[][..],
    };
    for text in complete.split(|&b| b == b'\n') {
        if text.trim_ascii().is_empty() {
            continue;
        }
        match serde_json::from_slice::<TraceLine>(text) {
            Ok(line) if line.schema == record::SCHEMA => lines.push(line),
            _ => *skipped += 1,
        }
    }
}
