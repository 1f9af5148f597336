//! Files: gzip by extension, JSON lines, and format detection.

use super::{Format, WorkloadError};
use flate2::Compression;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use serde::Serialize;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;

pub(super) fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> WorkloadError + '_ {
    move |source| WorkloadError::Io {
        path: path.to_owned(),
        source,
    }
}

pub(super) fn parse_error(path: &Path, line: usize, message: impl ToString) -> WorkloadError {
    WorkloadError::Parse {
        path: path.to_owned(),
        line,
        message: message.to_string(),
    }
}

fn is_gzip(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}

/// A buffered reader of the file, decompressed if it ends in `.gz`.
pub(super) fn reader(path: &Path) -> Result<Box<dyn BufRead>, WorkloadError> {
    let file = File::open(path).map_err(io_error(path))?;
    let inner: Box<dyn Read> = if is_gzip(path) {
        Box::new(MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    Ok(Box::new(BufReader::new(inner)))
}

/// Non-empty lines parsed as JSON, with their 1-based line numbers.
pub(super) fn json_lines<T: serde::de::DeserializeOwned>(
    path: &Path,
    mut each: impl FnMut(usize, T) -> Result<(), WorkloadError>,
) -> Result<(), WorkloadError> {
    for (i, line) in reader(path)?.lines().enumerate() {
        let line = line.map_err(io_error(path))?;
        if line.trim().is_empty() {
            continue;
        }
        let value = serde_json::from_str(&line).map_err(|e| parse_error(path, i + 1, e))?;
        each(i + 1, value)?;
    }
    Ok(())
}

/// Write one JSON value per line, gzip if the path ends in `.gz`.
pub(super) fn write_json_lines<T: Serialize>(
    path: &Path,
    rows: impl IntoIterator<Item = T>,
) -> Result<(), WorkloadError> {
    let file = File::create(path).map_err(io_error(path))?;
    let mut out: Box<dyn Write> = if is_gzip(path) {
        Box::new(GzEncoder::new(BufWriter::new(file), Compression::default()))
    } else {
        Box::new(BufWriter::new(file))
    };
    for row in rows {
        serde_json::to_writer(&mut out, &row)
            .map_err(|e| io_error(path)(std::io::Error::other(e)))?;
        out.write_all(b"\n").map_err(io_error(path))?;
    }
    out.flush().map_err(io_error(path))
}

/// Guess the format: a directory or a `.json` file is Claude Code; otherwise the first JSON line
/// decides (`schema` -> request trace, `session_id` -> Mooncake-delta, `hash_ids` -> Mooncake).
pub(super) fn detect(path: &Path) -> Result<Format, WorkloadError> {
    if path.is_dir() || path.extension().is_some_and(|e| e == "json") {
        return Ok(Format::ClaudeCode);
    }
    let mut first = None;
    for line in reader(path)?.lines() {
        let line = line.map_err(io_error(path))?;
        if !line.trim().is_empty() {
            first = Some(line);
            break;
        }
    }
    let undetected = || WorkloadError::Undetected(path.to_owned());
    let value: serde_json::Value = first
        .and_then(|line| serde_json::from_str(&line).ok())
        .ok_or_else(undetected)?;
    let has = |key: &str| value.get(key).is_some();
    if value
        .get("schema")
        .and_then(|s| s.as_str())
        .is_some_and(|s| s.contains("request.trace"))
    {
        Ok(Format::RequestTrace)
    } else if has("session_id") {
        Ok(Format::MooncakeDelta)
    } else if has("hash_ids") || has("input_length") {
        Ok(Format::Mooncake)
    } else if has("requests") {
        Ok(Format::ClaudeCode)
    } else {
        Err(undetected())
    }
}
