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
//! With `--journal true`, each row is a STOCK.SET instead (`lua/stock_set.lua`,
//! its op_id `import-<run>-<line>`): the stock and the SKU's journal entry
//! `set` are written in one call, so the import is where the SKU's account
//! starts in the books (docs/books.md). The rows of one slot are then
//! written one after another (each call waits for the one before it, which
//! keeps file order), the slots `--concurrency` at a time.
//!
//! Export walks every primary with SCAN (never KEYS, which blocks a node)
//! and writes each stock key's value as `sku,qty`.

use crate::error::FaultKind;
use crate::keys::{KeyLayout, slot};
use crate::outcome::{Code, StockReply};
use crate::params::{InvalidParam, OpId, Sku, StockLevel};
use crate::script::Scripts;
use crate::stock::journal;
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
    sku: Sku,
    key: Vec<u8>,
    qty: i64,
}

/// How rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writing {
    /// Check every row and write nothing.
    DryRun,
    /// SET, in pipelines: nothing journaled.
    Plain,
    /// STOCK.SET per row, each journaled as a baseline.
    Journaled,
}

/// The op record of a journaled row lives this long (the least STOCK.SET
/// takes): long enough for the row's own resends, which are all an import
/// makes.
const IMPORT_OP_WINDOW_MS: &str = "60000";

/// Loads `file` into Redis.
pub async fn import(
    upstream: &Upstream,
    keys: &KeyLayout,
    file: &Path,
    writing: Writing,
    concurrency: usize,
) -> Result<ImportReport, String> {
    let started = Instant::now();
    let writer = Writer {
        upstream,
        keys,
        scripts: Scripts::new(),
        run: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_millis()),
        writing,
        concurrency,
    };
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
                sku,
                qty: qty.0,
            }),
            Err(invalid) => {
                report.invalid += 1;
                progress.println(format!("line {line}: skipped: {invalid}"));
            }
        }
        if chunk.len() >= CHUNK_ROWS {
            writer.chunk(&mut chunk, &mut report, &progress).await;
            progress.update(reader.bytes, report.rows, started);
        }
    }
    writer.chunk(&mut chunk, &mut report, &progress).await;
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

/// What writes the rows of one import.
struct Writer<'a> {
    upstream: &'a Upstream,
    keys: &'a KeyLayout,
    scripts: Scripts,
    /// The import's start, in Unix milliseconds: its rows' op_ids.
    run: u128,
    writing: Writing,
    concurrency: usize,
}

impl Writer<'_> {
    /// Writes one chunk: a batch per slot (split at PIPELINE_LEN), up to
    /// `concurrency` in flight.
    async fn chunk(&self, chunk: &mut Vec<Row>, report: &mut ImportReport, progress: &Progress) {
        if self.writing == Writing::DryRun {
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
                match self.writing {
                    Writing::Journaled => self.journaled(rows).await,
                    _ => self.pipelined(rows).await,
                }
            })
            .buffer_unordered(self.concurrency.max(1));
        while let Some((written, failed)) = results.next().await {
            report.written += written;
            for (lines, why) in failed {
                report.failed += lines.len() as u64;
                let lines: Vec<String> = lines.iter().map(u64::to_string).collect();
                progress.println(format!("lines {}: not written: {why}", lines.join(",")));
            }
        }
    }

    /// One slot's rows as SETs in one pipeline: how many were written, and
    /// the lines that were not, with why.
    async fn pipelined(&self, rows: Vec<Row>) -> (u64, Vec<(Vec<u64>, String)>) {
        let mut pipe = redis::pipe();
        for row in &rows {
            pipe.cmd("SET").arg(&row.key).arg(row.qty).ignore();
        }
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            match self.upstream.pipeline(&pipe).await {
                Ok(_) => return (rows.len() as u64, vec![]),
                Err(err) => {
                    last = Some(err);
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
            }
        }
        let why = format!(
            "after {ATTEMPTS} attempts: {}",
            last.map(|e| e.reply_text()).unwrap_or_default()
        );
        (0, vec![(rows.iter().map(|r| r.line).collect(), why)])
    }

    /// One slot's rows as STOCK.SETs, one after another: how many were
    /// written, and the lines that were not, with why.
    async fn journaled(&self, rows: Vec<Row>) -> (u64, Vec<(Vec<u64>, String)>) {
        let (mut written, mut failed) = (0, vec![]);
        for row in rows {
            match self.set(&row).await {
                Ok(()) => written += 1,
                Err(why) => failed.push((vec![row.line], why)),
            }
        }
        (written, failed)
    }

    /// One row's STOCK.SET, sent again (with the same nonce, so a resend of
    /// a call that was applied answers 0) after a fault, and after opening
    /// the SKU's journal when it has none.
    async fn set(&self, row: &Row) -> Result<(), String> {
        let op_id = OpId::parse(format!("import-{}-{}", self.run, row.line).into())
            .map_err(|invalid| invalid.0)?;
        let keys = self.keys.op_keys(&row.sku, &op_id);
        let qty = row.qty.to_string();
        let nonce = format!("{:016x}", row.line);
        let args: [&[u8]; 5] = [
            qty.as_bytes(),
            IMPORT_OP_WINDOW_MS.as_bytes(),
            nonce.as_bytes(),
            b"0",
            b"1",
        ];
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            let call = self
                .upstream
                .eval(&self.scripts.stock_set, &keys.all(), &args)
                .await
                .and_then(StockReply::from_script);
            match call {
                Ok(reply) if matches!(reply.code, Code::Ok | Code::Duplicate) => return Ok(()),
                Ok(reply) => {
                    return Err(format!(
                        "code {}: {}",
                        reply.code as u8,
                        String::from_utf8_lossy(reply.reason.as_deref().unwrap_or_default())
                    ));
                }
                Err(fault) if fault.kind == FaultKind::NoJournal => {
                    let deadline = tokio::time::Instant::now() + self.upstream.timeout();
                    if let Err(fault) =
                        journal::open(self.upstream, &self.scripts, self.keys, &row.sku, deadline)
                            .await
                    {
                        last = format!("opening its journal: {}", fault.reply_text());
                    }
                }
                Err(fault) => {
                    last = fault.reply_text();
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
            }
        }
        Err(format!("after {ATTEMPTS} attempts: {last}"))
    }
}

/// What an export wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exported {
    /// Rows written: the SKUs that keep one number.
    pub rows: u64,
    /// SKUs kept by location (docs/locations.md), not written: a row of
    /// `sku,qty` can't say where the units are, and an import of it would
    /// make the SKU keep one number. STOCK.LOCATIONS reads them.
    pub located: u64,
}

/// Writes every sku's stock under the prefix to `out` as CSV.
pub async fn export(
    upstream: &Upstream,
    keys: &KeyLayout,
    out: impl Write,
) -> Result<Exported, String> {
    let mut writer = csv::Writer::from_writer(out);
    writer
        .write_record(["sku", "qty"])
        .map_err(|e| e.to_string())?;
    let pattern = format!("{}:{{*", glob_escape(keys.prefix()));
    let mut rows = 0;
    let mut located = 0;
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
                    Ok(Value::BulkString(qty)) if qty == crate::keys::KEPT_BY_LOCATION => {
                        located += 1
                    }
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
    Ok(Exported { rows, located })
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
