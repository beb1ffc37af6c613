//! Bulk stock: `stockgate stock import` and `stockgate stock export`.
//!
//! # Format
//!
//! ```text
//! sku,qty                        a SKU that keeps one number
//! sku,qty,location[,floor]       one location of a SKU kept by location
//! ```
//!
//! A SKU kept by location (docs/locations.md) is a row per location: its
//! available units there, the location, and its floor when it has one. An
//! optional header names the columns (`sku,qty` or
//! `sku,qty,location,floor`); empty trailing fields, which spreadsheets pad
//! short rows with, are absent ones.
//!
//! Import reads the rows, checks each with the same rules as the proxy,
//! and writes them in calls grouped by cluster slot (a call in a Redis
//! Cluster stays in one slot), many slots at once. It streams: rows are
//! read, grouped and written a chunk at a time, so memory stays flat
//! whatever the file's size. A slot's rows are written one call after
//! another, in file order (a sku listed twice ends with its last value). A
//! row that fails its checks is reported with its line number and skipped;
//! a row the SKU's kind refuses is reported as not written; nothing is
//! dropped silently.
//!
//! A row of a SKU that keeps one number is written by `lua/import_stock.lua`
//! with the other such rows of its slot (a SET each, no op record, no
//! journal entry), which refuses a SKU kept by location; with `--journal
//! true` it is a STOCK.SET instead (`lua/stock_set.lua`, its op_id
//! `import-<run>-<line>`): the stock and the SKU's journal entry `set` are
//! written in one call, so the import is where the SKU's account starts in
//! the books (docs/books.md). A row that names a location is always a
//! `STOCK.SET <sku> <qty> <op_id> AT <location> [FLOOR <floor>]`
//! (`lua/allocate.lua` "set", the same op_id), which refuses a SKU that
//! keeps one number above 0.
//!
//! Export walks every primary with SCAN (never KEYS, which blocks a node)
//! and writes each stock key's value as `sku,qty`, or each location of a
//! SKU kept by location as `sku,qty,location[,floor]`.

use crate::error::FaultKind;
use crate::keys::{KEPT_BY_LOCATION, KeyLayout, LocationField, slot};
use crate::outcome::{Code, StockReply};
use crate::params::{InvalidParam, Location, OpId, Sku, StockLevel};
use crate::script::{LuaScript, Scripts};
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
/// Rows in one call of `lua/import_stock.lua` at most: Redis runs a call
/// whole, so it is kept short.
const BATCH_ROWS: usize = 500;
/// Attempts per call: each is idempotent (a SET of the same values, or an
/// op_id's call sent again with its nonce), so a retry is always safe.
const ATTEMPTS: usize = 3;
/// The columns, as a header names them.
const COLUMNS: [&[u8]; 4] = [b"sku", b"qty", b"location", b"floor"];

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
    qty: StockLevel,
    /// Where its units are, for a SKU kept by location.
    place: Option<Place>,
}

/// A row's location and floor: `STOCK.SET ... AT <location> [FLOOR
/// <floor>]` (no floor: the location keeps the one it has).
struct Place {
    location: Location,
    floor: Option<StockLevel>,
}

/// How rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writing {
    /// Check every row and write nothing.
    DryRun,
    /// A slot's rows of one-number SKUs in one call, a SET each: nothing
    /// journaled.
    Plain,
    /// STOCK.SET per row, each journaled as a baseline.
    Journaled,
}

/// The op record of a row written by STOCK.SET lives this long (the least
/// STOCK.SET takes): long enough for the row's own resends, which are all
/// an import makes.
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
        located_settings: format!(
            "1000 {IMPORT_OP_WINDOW_MS} 1 error 0{}",
            u8::from(writing == Writing::Journaled)
        ),
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
        let is_header = first && is_header(&record);
        first = false;
        if is_header {
            continue;
        }
        report.rows += 1;
        match parse_row(&record) {
            Ok((sku, qty, place)) => chunk.push(Row {
                line,
                key: keys.stock_key(&sku),
                sku,
                qty,
                place,
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

/// A header: the columns' names in order, `sku,qty` at least (any case);
/// the names after those two may be empty, as a spreadsheet pads them.
fn is_header(record: &csv::ByteRecord) -> bool {
    (2..=COLUMNS.len()).contains(&record.len())
        && record
            .iter()
            .zip(COLUMNS)
            .enumerate()
            .all(|(i, (field, name))| {
                field.eq_ignore_ascii_case(name) || (i >= 2 && field.is_empty())
            })
}

fn parse_row(record: &csv::ByteRecord) -> Result<(Sku, StockLevel, Option<Place>), InvalidParam> {
    // A spreadsheet pads a short row with empty fields: they are absent.
    let fields = record
        .iter()
        .rposition(|field| !field.is_empty())
        .map_or(0, |last| last + 1);
    if !(2..=COLUMNS.len()).contains(&fields) {
        return Err(InvalidParam(format!(
            "expected 2 to 4 fields (sku,qty[,location[,floor]]), found {fields}"
        )));
    }
    let sku = Sku::parse(bytes::Bytes::copy_from_slice(&record[0]))?;
    let qty = StockLevel::parse(&record[1])?;
    let place = match fields {
        2 => None,
        _ => Some(Place {
            location: Location::parse(bytes::Bytes::copy_from_slice(&record[2]))?,
            floor: match fields {
                4 => Some(StockLevel::parse_floor(&record[3])?),
                _ => None,
            },
        }),
    };
    Ok((sku, qty, place))
}

/// What writes the rows of one import.
struct Writer<'a> {
    upstream: &'a Upstream,
    keys: &'a KeyLayout,
    scripts: Scripts,
    /// The import's start, in Unix milliseconds: its rows' op_ids.
    run: u128,
    writing: Writing,
    /// The settings of a `lua/allocate.lua` call, HOLD's: a "set" reads
    /// only the retry window (its op record's TTL) and the journal flag;
    /// the max hold and max qty are the least it takes.
    located_settings: String,
    concurrency: usize,
}

/// Rows not written: their lines, and why.
type NotWritten = Vec<(Vec<u64>, String)>;

impl Writer<'_> {
    /// Writes one chunk: each slot's rows in file order, one call after
    /// another, up to `concurrency` slots at once.
    async fn chunk(&self, chunk: &mut Vec<Row>, report: &mut ImportReport, progress: &Progress) {
        if self.writing == Writing::DryRun {
            chunk.clear();
            return;
        }
        let mut by_slot: BTreeMap<u16, Vec<Row>> = BTreeMap::new();
        for row in chunk.drain(..) {
            by_slot.entry(slot(&row.key)).or_default().push(row);
        }
        let mut results = stream::iter(by_slot.into_values())
            .map(|rows| self.slot(rows))
            .buffer_unordered(self.concurrency.max(1));
        while let Some((written, failed)) = results.next().await {
            report.written += written;
            for (lines, why) in failed {
                report.failed += lines.len() as u64;
                let lines: Vec<String> = lines.iter().map(u64::to_string).collect();
                let named = if lines.len() == 1 { "line" } else { "lines" };
                progress.println(format!("{named} {}: not written: {why}", lines.join(",")));
            }
        }
    }

    /// One slot's rows, in file order: runs of plain rows of one-number
    /// SKUs in calls of `lua/import_stock.lua`, every other row on its own
    /// (a STOCK.SET). How many were written, and the lines that were not.
    async fn slot(&self, rows: Vec<Row>) -> (u64, NotWritten) {
        let mut done = (0, vec![]);
        let mut plain: Vec<Row> = Vec::new();
        for row in rows {
            if row.place.is_none() && self.writing == Writing::Plain {
                plain.push(row);
                if plain.len() == BATCH_ROWS {
                    add(&mut done, self.plain(std::mem::take(&mut plain)).await);
                }
                continue;
            }
            // The rows before it first: file order.
            add(&mut done, self.plain(std::mem::take(&mut plain)).await);
            match self.set(&row).await {
                Ok(()) => done.0 += 1,
                Err(why) => done.1.push((vec![row.line], why)),
            }
        }
        add(&mut done, self.plain(plain).await);
        done
    }

    /// Plain rows of one slot in one call of `lua/import_stock.lua`, which
    /// refuses a SKU kept by location: how many were written, and the
    /// lines that were not, with why.
    async fn plain(&self, rows: Vec<Row>) -> (u64, NotWritten) {
        if rows.is_empty() {
            return (0, vec![]);
        }
        let qtys: Vec<String> = rows.iter().map(|row| row.qty.0.to_string()).collect();
        let keys: Vec<&[u8]> = rows.iter().map(|row| &row.key[..]).collect();
        let qtys: Vec<&[u8]> = qtys.iter().map(String::as_bytes).collect();
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            match self
                .upstream
                .eval(&self.scripts.import_stock, &keys, &qtys)
                .await
            {
                Ok(reply) => return refused_rows(&rows, reply),
                Err(fault) => {
                    last = fault.reply_text();
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
            }
        }
        let why = format!("after {ATTEMPTS} attempts: {last}");
        (0, vec![(rows.iter().map(|r| r.line).collect(), why)])
    }

    /// One row's STOCK.SET (`... AT <location> [FLOOR <floor>]` for a row
    /// that names one), sent again (with the same nonce, so a resend of a
    /// call that was applied answers 0) after a fault, and after opening
    /// the SKU's journal when it has none.
    async fn set(&self, row: &Row) -> Result<(), String> {
        let op_id = OpId::parse(format!("import-{}-{}", self.run, row.line).into())
            .map_err(|invalid| invalid.0)?;
        let op_keys = self.keys.op_keys(&row.sku, &op_id);
        let loc_key = self.keys.locations_key(&row.sku);
        let qty = row.qty.0.to_string();
        let nonce = format!("{:016x}", row.line);
        let floor = row
            .place
            .as_ref()
            .and_then(|place| place.floor)
            .map(|floor| floor.0.to_string())
            .unwrap_or_default();
        let (script, keys, args): (&LuaScript, Vec<&[u8]>, Vec<&[u8]>) = match &row.place {
            None => (
                &self.scripts.stock_set,
                op_keys.all().to_vec(),
                vec![
                    qty.as_bytes(),
                    IMPORT_OP_WINDOW_MS.as_bytes(),
                    nonce.as_bytes(),
                    b"0",
                    b"1",
                ],
            ),
            Some(place) => (
                &self.scripts.allocate,
                [&op_keys.all()[..], &[&loc_key[..]]].concat(),
                vec![
                    b"set",
                    self.located_settings.as_bytes(),
                    nonce.as_bytes(),
                    qty.as_bytes(),
                    place.location.as_bytes(),
                    floor.as_bytes(),
                ],
            ),
        };
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            let call = self
                .upstream
                .eval(script, &keys, &args)
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

fn add(done: &mut (u64, NotWritten), (written, not): (u64, NotWritten)) {
    done.0 += written;
    done.1.extend(not);
}

/// `lua/import_stock.lua`'s reply for `rows`: `{position, reason, ...}`
/// of the rows it refused. How many were written, and the refused lines
/// with the code 3 a STOCK.SET answers them.
fn refused_rows(rows: &[Row], reply: Value) -> (u64, NotWritten) {
    let unread = || {
        let lines = rows.iter().map(|r| r.line).collect();
        (0, vec![(lines, format!("import_stock answered {reply:?}"))])
    };
    let Value::Array(items) = &reply else {
        return unread();
    };
    let mut refused = Vec::with_capacity(items.len() / 2);
    for pair in items.chunks(2) {
        match pair {
            [Value::Int(at), Value::BulkString(why)] if (1..=rows.len() as i64).contains(at) => {
                let line = rows[*at as usize - 1].line;
                refused.push((
                    vec![line],
                    format!("code 3: {}", String::from_utf8_lossy(why)),
                ));
            }
            _ => return unread(),
        }
    }
    ((rows.len() - refused.len()) as u64, refused)
}

/// What an export wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exported {
    /// SKUs that keep one number: a row each.
    pub rows: u64,
    /// SKUs kept by location (docs/locations.md)...
    pub located: u64,
    /// ... and their rows, one a location.
    pub located_rows: u64,
}

/// What an export read of one SKU.
enum Found {
    /// Its stock value, as stored.
    One(Vec<u8>),
    /// Kept by location: each location's available units, and its floor
    /// when it has one above 0, as stored, by name.
    Located(BTreeMap<String, (String, Option<String>)>),
    /// Deleted between SCAN and GET: nothing to export.
    Gone,
}

/// Writes every sku's stock under the prefix to `out` as CSV: a SKU that
/// keeps one number as `sku,qty`, a SKU kept by location as a row per
/// location, `sku,qty,location[,floor]` (the module's `# Format`).
pub async fn export(
    upstream: &Upstream,
    keys: &KeyLayout,
    out: impl Write,
) -> Result<Exported, String> {
    // Rows of two lengths in one file.
    let mut writer = csv::WriterBuilder::new().flexible(true).from_writer(out);
    writer
        .write_record(["sku", "qty"])
        .map_err(|e| e.to_string())?;
    let pattern = format!("{}:{{*", glob_escape(keys.prefix()));
    let mut exported = Exported {
        rows: 0,
        located: 0,
        located_rows: 0,
    };
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
            let skus: Vec<(Vec<u8>, Sku)> = found
                .into_iter()
                .filter_map(|key| sku_of(keys, &key).map(|sku| (key, sku)))
                .collect();
            let values: Vec<_> = stream::iter(skus)
                .map(|(key, sku)| async move {
                    let found = read_sku(upstream, keys, &key, &sku).await;
                    (sku, found)
                })
                .buffered(64)
                .collect()
                .await;
            for (sku, found) in values {
                let sku = sku.as_bytes();
                match found? {
                    Found::One(qty) => {
                        writer
                            .write_record([sku, &qty[..]])
                            .map_err(|e| e.to_string())?;
                        exported.rows += 1;
                    }
                    Found::Located(locations) => {
                        for (location, (units, floor)) in &locations {
                            let mut row = vec![sku, units.as_bytes(), location.as_bytes()];
                            row.extend(floor.as_ref().map(String::as_bytes));
                            writer.write_record(row).map_err(|e| e.to_string())?;
                        }
                        exported.located += 1;
                        exported.located_rows += locations.len() as u64;
                    }
                    Found::Gone => {}
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    writer.flush().map_err(|e| e.to_string())?;
    Ok(exported)
}

/// One SKU's stock, from its stock key `key`, and its locations hash when
/// it is kept by location.
async fn read_sku(
    upstream: &Upstream,
    keys: &KeyLayout,
    key: &[u8],
    sku: &Sku,
) -> Result<Found, String> {
    let mut get = redis::cmd("GET");
    get.arg(key);
    let qty = match upstream.query(&get).await.map_err(|e| e.reply_text())? {
        Value::BulkString(qty) => qty,
        Value::Nil => return Ok(Found::Gone),
        other => return Err(format!("GET answered {other:?}")),
    };
    if qty != KEPT_BY_LOCATION {
        return Ok(Found::One(qty));
    }
    let mut hgetall = redis::cmd("HGETALL");
    hgetall.arg(keys.locations_key(sku));
    let hash: BTreeMap<String, String> = match upstream.query(&hgetall).await {
        Ok(hash) => redis::from_redis_value(hash).map_err(|e| e.to_string())?,
        Err(err) => return Err(err.reply_text()),
    };
    let located = locations_of(&hash).map_err(|why| {
        format!(
            "the locations of sku {}: {why}",
            String::from_utf8_lossy(sku.as_bytes())
        )
    })?;
    Ok(Found::Located(located))
}

/// A locations hash (HGETALL's pairs) as rows: each location's available
/// units and its floor above 0, as stored. Its units on hold are no row's:
/// a hold is a request's, not stock to load. A field of no known shape, or
/// none at all (the hash deleted behind stockgate's back: LOCGONE), is an
/// error, never a location left out.
fn locations_of(
    hash: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, (String, Option<String>)>, String> {
    let mut units = BTreeMap::new();
    let mut floors = BTreeMap::new();
    for (field, value) in hash {
        match LocationField::parse(field) {
            Some(LocationField::Available(location)) => {
                units.insert(location.to_owned(), value.clone());
            }
            Some(LocationField::Floor(location)) if value != "0" => {
                floors.insert(location.to_owned(), value.clone());
            }
            Some(LocationField::Floor(_) | LocationField::Held(_)) => {}
            None => return Err(format!("a field {field:?} of no known shape")),
        }
    }
    if units.is_empty() {
        return Err("it keeps its stock by location, and has none (LOCGONE)".into());
    }
    Ok(units
        .into_iter()
        .map(|(location, available)| {
            let floor = floors.remove(&location);
            (location, (available, floor))
        })
        .collect())
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
fn sku_of(keys: &KeyLayout, key: &[u8]) -> Option<Sku> {
    let rest = key
        .strip_prefix(keys.prefix().as_bytes())?
        .strip_prefix(b":{")?;
    let sku = rest.strip_suffix(b"}")?;
    Sku::parse(bytes::Bytes::copy_from_slice(sku)).ok()
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
        assert_eq!(
            sku_of(&keys, b"stock:{sku-1}").map(|sku| sku.to_bytes()),
            Some(bytes::Bytes::from_static(b"sku-1"))
        );
        assert_eq!(sku_of(&keys, b"stock:{sku-1}:req:r1"), None);
        assert_eq!(sku_of(&keys, b"stocks:{x}"), None);
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
