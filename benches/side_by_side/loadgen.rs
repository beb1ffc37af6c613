//! The load generator: every target gets the same one.
//!
//! Requests are encoded before the clock starts. Each connection keeps
//! `depth` requests in flight: it writes `depth` at once, and after every
//! read sends as many new ones as replies came back, in one write (a closed
//! loop, like a client pool with a pipeline). A request's latency is from
//! the write that carried it to the read that completed its reply.

use bytes::{Buf, BytesMut};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A reply that takes longer than this fails the run: something is stuck.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections opened at once, so a 10,000-client run doesn't overflow the
/// listen backlog and wait out SYN retransmits.
const CONNECT_CONCURRENCY: usize = 256;

/// The requests one connection sends, encoded back to back.
#[derive(Default)]
pub struct Encoded {
    bytes: Vec<u8>,
    /// `ends[i]` is where request `i` ends in `bytes`.
    ends: Vec<usize>,
}

impl Encoded {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Every request, back to back.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Requests `from..to`, as one slice.
    fn range(&self, from: usize, to: usize) -> &[u8] {
        let start = if from == 0 { 0 } else { self.ends[from - 1] };
        &self.bytes[start..self.ends[to - 1]]
    }

    /// Appends one command as a RESP array of bulk strings.
    pub fn push(&mut self, args: &[&[u8]]) {
        let out = &mut self.bytes;
        out.push(b'*');
        out.extend_from_slice(args.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        for arg in args {
            out.push(b'$');
            out.extend_from_slice(arg.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        self.ends.push(out.len());
    }
}

/// One connection's part of a run.
pub struct Conn {
    pub addr: SocketAddr,
    pub requests: Encoded,
}

/// What one connection saw.
pub struct ConnOutcome {
    pub latency: Histogram<u64>,
    /// Replies by code: 0 ok, 1 duplicate, 2 insufficient, 3 invalid.
    pub codes: [u64; 4],
    /// Error replies and replies of an unexpected shape.
    pub errors: u64,
    pub first_error: Option<String>,
    pub finished: Instant,
    /// Kept open until the caller drops it (the memory scenarios measure
    /// a proxy while every client is still connected).
    pub stream: TcpStream,
}

/// What a whole run saw.
pub struct RunOutcome {
    pub latency: Histogram<u64>,
    pub codes: [u64; 4],
    pub errors: u64,
    pub first_error: Option<String>,
    /// From the first request to the last reply.
    pub elapsed: Duration,
    /// Opening every connection, before the clock started.
    pub connecting: Duration,
    pub streams: Vec<TcpStream>,
}

impl RunOutcome {
    pub fn replies(&self) -> u64 {
        self.codes.iter().sum::<u64>() + self.errors
    }

    /// Adds what one connection saw; `last` becomes the later of itself
    /// and the connection's end.
    fn add(&mut self, conn: ConnOutcome, last: &mut Instant) {
        self.latency.add(&conn.latency).expect("same bounds");
        for (total, n) in self.codes.iter_mut().zip(conn.codes) {
            *total += n;
        }
        self.errors += conn.errors;
        if self.first_error.is_none() {
            self.first_error = conn.first_error;
        }
        *last = (*last).max(conn.finished);
        self.streams.push(conn.stream);
    }
}

pub fn histogram() -> Histogram<u64> {
    // Nanoseconds, from 1 µs to 60 s, 3 significant digits.
    Histogram::new_with_bounds(1_000, 60_000_000_000, 3).expect("valid bounds")
}

/// Opens one connection per `addr`, a bounded number at a time.
///
/// Each connection gets its own loopback source address (127.1.x.y, one of
/// 4,000): all clients of a 10,000-connection run, plus the TIME_WAIT
/// sockets of earlier runs, would otherwise share one source address and
/// its ~28,000 ephemeral ports towards one server port, and `connect`
/// slows to seconds hunting for a free port. That would measure the
/// client's kernel, not the proxy.
pub async fn connect_all(addrs: &[SocketAddr]) -> std::io::Result<Vec<TcpStream>> {
    stream::iter(addrs.iter().copied().enumerate())
        .map(|(i, addr)| async move {
            let stream = connect_from(source_ip(i), addr).await.map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot connect to {addr}: {e}"))
            })?;
            stream.set_nodelay(true)?;
            Ok::<_, std::io::Error>(stream)
        })
        .buffered(CONNECT_CONCURRENCY)
        .try_collect()
        .await
}

fn source_ip(i: usize) -> Ipv4Addr {
    let k = i % 4000;
    Ipv4Addr::new(127, 1, (k / 250) as u8, (k % 250 + 1) as u8)
}

async fn connect_from(source: Ipv4Addr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    // Let connect() pick the port for the whole 4-tuple, rather than bind()
    // reserving one for the source address alone.
    let on: libc::c_int = 1;
    // SAFETY: a valid fd and a c_int option of the right size.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    socket.bind(SocketAddr::from((source, 0)))?;
    socket.connect(addr).await
}

/// Runs `conns` with `depth` requests in flight on each. `probe` is called
/// once all connections are open, right before the first request, and
/// once after the last reply; the two results bracket the measured interval.
pub async fn run<P>(
    conns: Vec<Conn>,
    depth: usize,
    mut probe: impl FnMut() -> P,
) -> Result<(RunOutcome, P, P), String> {
    let addrs: Vec<SocketAddr> = conns.iter().map(|c| c.addr).collect();
    let connecting = Instant::now();
    let streams = connect_all(&addrs).await.map_err(|e| e.to_string())?;
    let connecting = connecting.elapsed();
    let before = probe();
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .zip(streams)
        .map(|(conn, stream)| tokio::spawn(drive(stream, conn.requests, depth)))
        .collect();
    let (outcome, failure) = gather(tasks, connecting, started).await;
    let after = probe();
    match failure {
        Some(err) => Err(err),
        None => Ok((outcome, before, after)),
    }
}

/// Waits for every connection's task and sums what they saw; `elapsed` is
/// from `started` to the last reply. The first failure, if any, comes
/// back beside the sum of the others.
async fn gather(
    tasks: Vec<tokio::task::JoinHandle<Result<ConnOutcome, String>>>,
    connecting: Duration,
    started: Instant,
) -> (RunOutcome, Option<String>) {
    let mut outcome = RunOutcome {
        latency: histogram(),
        codes: [0; 4],
        errors: 0,
        first_error: None,
        elapsed: Duration::ZERO,
        connecting,
        streams: Vec::with_capacity(tasks.len()),
    };
    let mut last = started;
    let mut failure = None;
    for task in tasks {
        match task.await.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(conn) => outcome.add(conn, &mut last),
            Err(err) => failure = failure.or(Some(err)),
        }
    }
    outcome.elapsed = last.saturating_duration_since(started);
    (outcome, failure)
}

/// What the replies of one connection said, and their latencies.
struct Tally {
    latency: Histogram<u64>,
    codes: [u64; 4],
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency: histogram(),
            codes: [0; 4],
            errors: 0,
            first_error: None,
        }
    }

    /// Counts one reply that took `latency`.
    fn record(&mut self, reply: ParsedReply, latency: Duration) {
        self.latency
            .saturating_record((latency.as_nanos() as u64).max(1_000));
        let error = match reply {
            ParsedReply::Code(code @ 0..=3) => {
                self.codes[code as usize] += 1;
                None
            }
            ParsedReply::Code(other) => Some(format!("unknown code {other}")),
            ParsedReply::Error(text) | ParsedReply::Other(text) => Some(text),
        };
        if let Some(text) = error {
            self.errors += 1;
            self.first_error.get_or_insert(text);
        }
    }

    fn done(self, stream: TcpStream, finished: Instant) -> ConnOutcome {
        ConnOutcome {
            latency: self.latency,
            codes: self.codes,
            errors: self.errors,
            first_error: self.first_error,
            finished,
            stream,
        }
    }
}

/// Reads once, within [`REPLY_TIMEOUT`]; an error if the read fails or the
/// server closed the connection.
async fn read_some(
    stream: &mut TcpStream,
    input: &mut BytesMut,
    answered: usize,
    total: usize,
) -> Result<(), String> {
    let read = tokio::time::timeout(REPLY_TIMEOUT, stream.read_buf(input))
        .await
        .map_err(|_| {
            format!(
                "no reply within {REPLY_TIMEOUT:?} ({answered} of {total} answered on this connection)"
            )
        })?
        .map_err(|e| format!("read: {e}"))?;
    if read == 0 {
        return Err(format!(
            "connection closed by the server after {answered} of {total} replies"
        ));
    }
    Ok(())
}

/// One connection: keeps `depth` requests in flight until all are answered.
async fn drive(
    mut stream: TcpStream,
    requests: Encoded,
    depth: usize,
) -> Result<ConnOutcome, String> {
    let total = requests.len();
    let mut tally = Tally::new();
    let mut sent = 0;
    let mut answered = 0;
    let mut sent_at: VecDeque<Instant> = VecDeque::with_capacity(depth);
    let mut input = BytesMut::with_capacity(64 * 1024);
    while answered < total {
        let room = (depth - sent_at.len()).min(total - sent);
        if room > 0 {
            stream
                .write_all(requests.range(sent, sent + room))
                .await
                .map_err(|e| format!("write: {e}"))?;
            let now = Instant::now();
            sent_at.extend(std::iter::repeat_n(now, room));
            sent += room;
        }
        read_some(&mut stream, &mut input, answered, total).await?;
        let now = Instant::now();
        while let Some((len, reply)) = parse_reply(&input)? {
            input.advance(len);
            let started = sent_at
                .pop_front()
                .ok_or("a reply to a request never sent")?;
            tally.record(reply, now - started);
            answered += 1;
        }
    }
    Ok(tally.done(stream, Instant::now()))
}

/// The part of a reply the harness looks at.
#[derive(Debug, PartialEq, Eq)]
pub enum ParsedReply {
    /// An array whose first element is an integer: a DEDUCT reply's code.
    Code(i64),
    /// An error reply, its text.
    Error(String),
    /// Anything else, described.
    Other(String),
}

/// Parses one complete RESP2 reply at the start of `buf`: its length and
/// what it says, or `None` when it isn't complete yet.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(usize, ParsedReply)>, String> {
    let Some(&kind) = buf.first() else {
        return Ok(None);
    };
    match kind {
        b'*' => {
            let Some((count, mut at)) = line(buf, 0)? else {
                return Ok(None);
            };
            let count: i64 = number(count)?;
            let mut code = None;
            for i in 0..count.max(0) {
                if i == 0 && buf.get(at) == Some(&b':') {
                    let Some((text, _)) = line(buf, at)? else {
                        return Ok(None);
                    };
                    code = Some(number(text)?);
                }
                match skip(buf, at)? {
                    Some(next) => at = next,
                    None => return Ok(None),
                }
            }
            let reply = match code {
                Some(code) => ParsedReply::Code(code),
                None => {
                    ParsedReply::Other(format!("an array of {count} without a leading integer"))
                }
            };
            Ok(Some((at, reply)))
        }
        b'-' => Ok(line(buf, 0)?.map(|(text, end)| {
            (
                end,
                ParsedReply::Error(String::from_utf8_lossy(text).into_owned()),
            )
        })),
        _ => Ok(skip(buf, 0)?.map(|end| {
            let shown = String::from_utf8_lossy(&buf[..end.min(80)]).into_owned();
            (
                end,
                ParsedReply::Other(format!("unexpected reply {shown:?}")),
            )
        })),
    }
}

/// The text of the line that starts at `at` (after its type byte) and the
/// offset after its CRLF.
fn line(buf: &[u8], at: usize) -> Result<Option<(&[u8], usize)>, String> {
    let rest = &buf[at..];
    match rest.windows(2).position(|w| w == b"\r\n") {
        Some(cr) => Ok(Some((&rest[1..cr], at + cr + 2))),
        None if rest.len() > 64 * 1024 => Err("reply line without CRLF".into()),
        None => Ok(None),
    }
}

fn number(text: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not a number: {:?}", String::from_utf8_lossy(text)))
}

/// The offset after the complete value at `at`, or `None` if incomplete.
fn skip(buf: &[u8], at: usize) -> Result<Option<usize>, String> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some((text, after)) = line(buf, at)? else {
        return Ok(None);
    };
    match kind {
        b'+' | b'-' | b':' => Ok(Some(after)),
        b'$' => {
            let len = number(text)?;
            if len < 0 {
                return Ok(Some(after));
            }
            let end = after + len as usize + 2;
            Ok((buf.len() >= end).then_some(end))
        }
        b'*' => {
            let mut at = after;
            for _ in 0..number(text)?.max(0) {
                match skip(buf, at)? {
                    Some(next) => at = next,
                    None => return Ok(None),
                }
            }
            Ok(Some(at))
        }
        other => Err(format!("unknown RESP2 type byte {:?}", other as char)),
    }
}

/// Checks the reply parser on known bytes; run once at start, since a
/// `harness = false` bench has no test runner.
pub fn self_check() {
    let ok = b"*4\r\n:0\r\n:99\r\n$3\r\nORD\r\n:1\r\n";
    assert_eq!(parse_reply(ok), Ok(Some((ok.len(), ParsedReply::Code(0)))));
    for cut in 0..ok.len() {
        assert_eq!(parse_reply(&ok[..cut]), Ok(None), "cut at {cut}");
    }
    let err = b"-UPSTREAM timed out\r\n";
    assert_eq!(
        parse_reply(err),
        Ok(Some((
            err.len(),
            ParsedReply::Error("UPSTREAM timed out".into())
        )))
    );
    assert_eq!(
        parse_reply(b"+PONG\r\n").map(|r| r.map(|r| r.0)),
        Ok(Some(7))
    );
}
