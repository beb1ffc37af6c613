//! Bulk stock: `stockgate stock import` and `stockgate stock export`.
//!
//! Import reads `sku,qty` rows, checks each with the same rules as the
//! proxy, and writes them with SET in pipelines grouped by cluster slot (a
//! pipeline in a Redis Cluster must stay in one slot), many in flight at
//! once. It streams: rows are read, grouped and written a chunk at a time,
//! so memory stays flat whatever the file's size. Rows within the file are
//! applied in file order (a sku listed twice ends with its last value).
//! A row that fails its checks is reported with its line number and
//! skipped; nothing is dropped silently.
//!
//! Export walks every primary with SCAN (never KEYS, which blocks a node)
//! and writes each stock key's value as `sku,qty`.

use crate::keys::{KeyLayout, slot};
use crate::params::{InvalidParam, Sku, StockLevel};
use crate::upstream::Upstream;
use futures_util::stream::{self, StreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use redis::Value;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// Rows read before a chunk is written.
const CHUNK_ROWS: usize = 50_000;
/// SETs in one pipeline at most.
const PIPELINE_LEN: usize = 500;
/// Attempts per pipeline: SET is idempotent, so a retry is always safe.
const ATTEMPTS: usize = 3;

/// What an import did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ImportReport {
    /// Data rows read (the header excluded).
    pub rows: u64,
    /// Rows written to Redis (0 in a dry run).
    pub written: u64,
    /// Rows that failed their checks and were skipped.
    pub invalid: u64,
    /// Valid rows that could not be written.
    pub failed: u64,
    pub elapsed: Duration,
}

impl ImportReport {
    /// Everything read was written (or, in a dry run, would be).
    pub fn is_clean(&self) -> bool {
        self.invalid == 0 && self.failed == 0
    }
}

/// Progress on stderr: a bar with rate and ETA on a terminal, a plain line
/// every few seconds otherwise (logs, CI).
enum Progress {
    Bar(ProgressBar),
    Lines { last: Instant, total: u64 },
}

impl Progress {
    fn new(total_bytes: u64) -> Progress {
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total_bytes);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:40} {percent:>3}% {msg} [{elapsed_precise}, ETA {eta}]",
                )
                .expect("template is valid"),
            );
            Progress::Bar(bar)
        } else {
            Progress::Lines {
                last: Instant::now(),
                total: total_bytes,
            }
        }
    }

    fn update(&mut self, bytes: u64, rows: u64, started: Instant) {
        let rate = rows as f64 / started.elapsed().as_secs_f64().max(0.001);
        match self {
            Progress::Bar(bar) => {
                bar.set_position(bytes);
                bar.set_message(format!("{rows} rows, {rate:.0} rows/s"));
            }
            Progress::Lines { last, total } => {
                if last.elapsed() >= Duration::from_secs(2) {
                    *last = Instant::now();
                    let percent = bytes as f64 * 100.0 / (*total).max(1) as f64;
                    // "read", not "imported": a dry run imports nothing.
                    eprintln!("{rows} rows read ({percent:.0}% of the file, {rate:.0} rows/s)");
                }
            }
        }
    }

    fn println(&self, line: String) {
        match self {
            Progress::Bar(bar) => bar.println(line),
            Progress::Lines { .. } => eprintln!("{line}"),
        }
    }

    fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// One valid row, ready to write.
struct Row {
    line: u64,
    key: Vec<u8>,
    qty: i64,
}

/// Loads `file` into Redis.
pub async fn import(
    upstream: &Upstream,
    keys: &KeyLayout,
    file: &Path,
    dry_run: bool,
    concurrency: usize,
) -> Result<ImportReport, String> {
    let started = Instant::now();
    let total = std::fs::metadata(file)
        .map_err(|e| format!("{}: {e}", file.display()))?
        .len();
    let mut reader = CsvLines::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut progress = Progress::new(total);
    let mut report = ImportReport::default();
    let mut chunk: Vec<Row> = Vec::with_capacity(CHUNK_ROWS);
    let mut record = csv::ByteRecord::new();
    let mut first = true;
    loop {
        let line = match reader.next_record(&mut record) {
            Ok(Some(line)) => line,
            Ok(None) => break,
            // A file that can't be read on can't be imported on either.
            Err(err) => {
                progress.finish();
                return Err(format!(
                    "{}: line {}: {err}",
                    file.display(),
                    reader.line + 1
                ));
            }
        };
        let is_header = first
            && record.len() == 2
            && record[0].eq_ignore_ascii_case(b"sku")
            && record[1].eq_ignore_ascii_case(b"qty");
        first = false;
        if is_header {
            continue;
        }
        report.rows += 1;
        match parse_row(&record) {
            Ok((sku, qty)) => chunk.push(Row {
                line,
                key: keys.stock_key(&sku),
                qty: qty.0,
            }),
            Err(invalid) => {
                report.invalid += 1;
                progress.println(format!("line {line}: skipped: {invalid}"));
            }
        }
        if chunk.len() >= CHUNK_ROWS {
            write_chunk(
                upstream,
                &mut chunk,
                dry_run,
                concurrency,
                &mut report,
                &progress,
            )
            .await;
            progress.update(reader.bytes, report.rows, started);
        }
    }
    write_chunk(
        upstream,
        &mut chunk,
        dry_run,
        concurrency,
        &mut report,
        &progress,
    )
    .await;
    progress.update(total, report.rows, started);
    progress.finish();
    report.elapsed = started.elapsed();
    Ok(report)
}

/// A CSV file read a physical line at a time, so every record knows the
/// line it is on. csv's own reader can't say that: the position of a record
/// it reports is where the previous one ended, and the line counter lags
/// the record by one for every CRLF terminator (it stops at the `\r` and
/// takes the `\n` with the next record) and for every blank line skipped
/// before it. Spreadsheets on Windows write CRLF, so a report would name
/// the wrong rows. A record here can't span lines, which costs nothing: a
/// quoted newline is never part of a valid sku or qty, so such a row is
/// refused either way.
struct CsvLines {
    input: std::io::BufReader<std::fs::File>,
    /// The line read last (1-based); 0 before the first.
    line: u64,
    /// Bytes read so far, for the progress display.
    bytes: u64,
    /// The last read, up to and including its `\n`. A lone `\r` ends a
    /// line too (old Mac files), so it may hold several lines: `next` is
    /// where the first not handed out yet starts, `end` where they stop
    /// (before the terminator).
    buf: Vec<u8>,
    next: usize,
    end: usize,
    /// Quotes, doubled quotes and a leading UTF-8 byte-order mark, which
    /// Excel's "CSV UTF-8" writes, are csv-core's.
    core: csv_core::Reader,
    fields: Vec<u8>,
    ends: Vec<usize>,
}

impl CsvLines {
    fn open(path: &Path) -> std::io::Result<CsvLines> {
        Ok(CsvLines {
            input: std::io::BufReader::with_capacity(64 * 1024, std::fs::File::open(path)?),
            line: 0,
            bytes: 0,
            buf: Vec::new(),
            // Nothing read yet: past the (empty) end.
            next: 1,
            end: 0,
            core: csv_core::Reader::new(),
            fields: Vec::new(),
            ends: Vec::new(),
        })
    }

    /// The next record, with surrounding whitespace trimmed from each
    /// field, and the line it is on; empty lines are skipped, as csv does.
    fn next_record(&mut self, record: &mut csv::ByteRecord) -> std::io::Result<Option<u64>> {
        use std::io::BufRead;
        loop {
            if self.next > self.end {
                self.buf.clear();
                let read = self.input.read_until(b'\n', &mut self.buf)?;
                if read == 0 {
                    return Ok(None);
                }
                self.bytes += read as u64;
                let text = self.buf.strip_suffix(b"\n").unwrap_or(&self.buf);
                let text = text.strip_suffix(b"\r").unwrap_or(text);
                (self.next, self.end) = (0, text.len());
            }
            let rest = &self.buf[self.next..self.end];
            let len = rest.iter().position(|b| *b == b'\r').unwrap_or(rest.len());
            let (start, stop) = (self.next, self.next + len);
            // Past `end` once the last line of this read is taken.
            self.next = stop + 1;
            self.line += 1;
            if start == stop {
                continue;
            }
            let text = std::mem::take(&mut self.buf);
            self.split(&text[start..stop], record);
            self.buf = text;
            return Ok(Some(self.line));
        }
    }

    /// One line's fields into `record`.
    fn split(&mut self, text: &[u8], record: &mut csv::ByteRecord) {
        use csv_core::ReadRecordResult;
        // No field is longer than the line, and no line has more fields
        // than bytes plus one, so csv-core never runs out of room.
        self.fields.resize(text.len() + 1, 0);
        self.ends.resize(text.len() + 2, 0);
        self.core.reset();
        let (mut input, mut out, mut ends) = (text, 0, 0);
        loop {
            let (result, nin, nout, nend) =
                self.core
                    .read_record(input, &mut self.fields[out..], &mut self.ends[ends..]);
            input = &input[nin..];
            out += nout;
            ends += nend;
            match result {
                // The end of the line is the end of the record: say so
                // with an empty input.
                ReadRecordResult::InputEmpty => {}
                ReadRecordResult::Record | ReadRecordResult::End => break,
                ReadRecordResult::OutputFull | ReadRecordResult::OutputEndsFull => {
                    unreachable!("buffers are sized for the whole line")
                }
            }
        }
        record.clear();
        let mut start = 0;
        for &end in &self.ends[..ends] {
            record.push_field(&self.fields[start..end]);
            start = end;
        }
        record.trim();
    }
}

fn parse_row(record: &csv::ByteRecord) -> Result<(Sku, StockLevel), InvalidParam> {
    if record.len() != 2 {
        return Err(InvalidParam(format!(
            "expected 2 fields (sku,qty), found {}",
            record.len()
        )));
    }
    let sku = Sku::parse(bytes::Bytes::copy_from_slice(&record[0]))?;
    let qty = StockLevel::parse(&record[1])?;
    Ok((sku, qty))
}

/// Writes one chunk: a pipeline per slot (split at PIPELINE_LEN), up to
/// `concurrency` in flight.
async fn write_chunk(
    upstream: &Upstream,
    chunk: &mut Vec<Row>,
    dry_run: bool,
    concurrency: usize,
    report: &mut ImportReport,
    progress: &Progress,
) {
    if dry_run {
        chunk.clear();
        return;
    }
    let mut by_slot: BTreeMap<u16, Vec<Row>> = BTreeMap::new();
    for row in chunk.drain(..) {
        by_slot.entry(slot(&row.key)).or_default().push(row);
    }
    let batches = by_slot
        .into_values()
        .flat_map(|rows| {
            let mut rows = rows.into_iter().peekable();
            std::iter::from_fn(move || {
                rows.peek()?;
                Some(rows.by_ref().take(PIPELINE_LEN).collect::<Vec<Row>>())
            })
        })
        .collect::<Vec<_>>();
    let mut results = stream::iter(batches)
        .map(|rows| async move {
            let mut pipe = redis::pipe();
            for row in &rows {
                pipe.cmd("SET").arg(&row.key).arg(row.qty).ignore();
            }
            let mut last = None;
            for attempt in 0..ATTEMPTS {
                match upstream.pipeline(&pipe).await {
                    Ok(_) => return (rows, None),
                    Err(err) => {
                        last = Some(err);
                        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                    }
                }
            }
            (rows, last)
        })
        .buffer_unordered(concurrency.max(1));
    while let Some((rows, error)) = results.next().await {
        match error {
            None => report.written += rows.len() as u64,
            Some(err) => {
                report.failed += rows.len() as u64;
                let lines: Vec<String> = rows.iter().map(|r| r.line.to_string()).collect();
                progress.println(format!(
                    "lines {}: not written after {ATTEMPTS} attempts: {}",
                    lines.join(","),
                    err.reply_text()
                ));
            }
        }
    }
}

/// Writes every sku's stock under the prefix to `out` as CSV; returns the
/// number of rows.
pub async fn export(upstream: &Upstream, keys: &KeyLayout, out: impl Write) -> Result<u64, String> {
    let mut writer = csv::Writer::from_writer(out);
    writer
        .write_record(["sku", "qty"])
        .map_err(|e| e.to_string())?;
    let pattern = format!("{}:{{*", glob_escape(keys.prefix()));
    let mut rows = 0;
    for node in upstream.primaries().await.map_err(|e| e.reply_text())? {
        let mut cursor = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let reply = upstream
                .query_node(&scan, &node)
                .await
                .map_err(|e| format!("SCAN on {}:{}: {}", node.host, node.port, e.reply_text()))?;
            let (next, found) = scan_page(reply)?;
            let skus: Vec<(Vec<u8>, Vec<u8>)> = found
                .into_iter()
                .filter_map(|key| sku_of(keys, &key).map(|sku| (key, sku)))
                .collect();
            let values: Vec<_> = stream::iter(skus)
                .map(|(key, sku)| async move {
                    let mut get = redis::cmd("GET");
                    get.arg(&key);
                    (sku, upstream.query(&get).await)
                })
                .buffered(64)
                .collect()
                .await;
            for (sku, value) in values {
                match value {
                    Ok(Value::BulkString(qty)) => {
                        writer
                            .write_record([&sku[..], &qty[..]])
                            .map_err(|e| e.to_string())?;
                        rows += 1;
                    }
                    // Deleted between SCAN and GET: nothing to export.
                    Ok(Value::Nil) => {}
                    Ok(other) => return Err(format!("GET answered {other:?}")),
                    Err(err) => return Err(err.reply_text()),
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    writer.flush().map_err(|e| e.to_string())?;
    Ok(rows)
}

fn scan_page(reply: Value) -> Result<(u64, Vec<Vec<u8>>), String> {
    let Value::Array(mut parts) = reply else {
        return Err(format!("SCAN answered {reply:?}"));
    };
    if parts.len() != 2 {
        return Err("SCAN answered an unexpected shape".into());
    }
    let keys = match parts.pop() {
        Some(Value::Array(keys)) => keys
            .into_iter()
            .filter_map(|k| match k {
                Value::BulkString(k) => Some(k),
                _ => None,
            })
            .collect(),
        _ => return Err("SCAN answered an unexpected shape".into()),
    };
    let cursor = match parts.pop() {
        Some(Value::BulkString(c)) => std::str::from_utf8(&c)
            .ok()
            .and_then(|c| c.parse().ok())
            .ok_or("SCAN answered a bad cursor")?,
        _ => return Err("SCAN answered a bad cursor".into()),
    };
    Ok((cursor, keys))
}

/// The sku of a stock key (`<prefix>:{<sku>}`), or None for any other key
/// under the prefix (idempotency records end in `:req:<id>`).
fn sku_of(keys: &KeyLayout, key: &[u8]) -> Option<Vec<u8>> {
    let rest = key
        .strip_prefix(keys.prefix().as_bytes())?
        .strip_prefix(b":{")?;
    let sku = rest.strip_suffix(b"}")?;
    Sku::parse(bytes::Bytes::copy_from_slice(sku)).ok()?;
    Some(sku.to_vec())
}

/// A prefix as a literal in a SCAN MATCH pattern.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_stock_keys_are_exported() {
        let keys = KeyLayout::new("stock").unwrap();
        assert_eq!(sku_of(&keys, b"stock:{sku-1}"), Some(b"sku-1".to_vec()));
        assert_eq!(sku_of(&keys, b"stock:{sku-1}:req:r1"), None);
        assert_eq!(sku_of(&keys, b"stocks:{x}"), None);
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
