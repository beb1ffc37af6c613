//! The load generator: every target gets the same one.
//!
//! Requests are encoded before the clock starts. [`run`]: each connection
//! keeps `depth` requests in flight: it writes `depth` at once, and after
//! every read sends as many new ones as replies came back, in one write (a
//! closed loop, like a client pool with a pipeline). A request's latency is
//! from the write that carried it to the read that completed its reply.
//! [`run_grouped`] and [`run_staged`] are the same loop over requests of
//! several commands: written together, or in stages, each stage once the
//! one before it is answered (a caller's HOLDs, then its CONFIRMs).
//!
//! [`open_loop`]: requests go out at a fixed rate on a schedule, whatever
//! the replies do, and a request's latency is from when it was due to be
//! sent to its reply.

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
    /// Every stage of every request, in order (a request of
    /// [`Encoded::push`] or [`Encoded::push_group`] is one stage).
    stages: Vec<Stage>,
    /// `staged[i]` is the index in `stages` past request `i`'s last stage.
    staged: Vec<usize>,
}

/// Commands of one request written together: where they end in the
/// encoded bytes, and how many they are (hence replies).
#[derive(Debug, Clone, Copy)]
struct Stage {
    end: usize,
    commands: usize,
}

impl Encoded {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Every request, back to back.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Where the first `count` requests end in [`Encoded::as_bytes`].
    fn end_of(&self, count: usize) -> usize {
        if count == 0 { 0 } else { self.ends[count - 1] }
    }

    /// Requests `from..to`, as one slice.
    fn range(&self, from: usize, to: usize) -> &[u8] {
        let start = if from == 0 { 0 } else { self.ends[from - 1] };
        &self.bytes[start..self.ends[to - 1]]
    }

    /// The first and the last stage of request `i`, as indices of
    /// [`Encoded::stage`].
    fn stages_of(&self, i: usize) -> (usize, usize) {
        let first = if i == 0 { 0 } else { self.staged[i - 1] };
        (first, self.staged[i] - 1)
    }

    /// Stage `s`'s commands, as one slice, and how many they are.
    fn stage(&self, s: usize) -> (&[u8], usize) {
        let start = if s == 0 { 0 } else { self.stages[s - 1].end };
        let Stage { end, commands } = self.stages[s];
        (&self.bytes[start..end], commands)
    }

    /// Appends one command as a RESP array of bulk strings.
    pub fn push(&mut self, args: &[&[u8]]) {
        self.push_group(&[args]);
    }

    /// Appends several commands as one request: they go out in one write
    /// and the request is answered by their last reply (see
    /// [`run_grouped`]).
    pub fn push_group(&mut self, commands: &[&[&[u8]]]) {
        self.push_staged(&[commands]);
    }

    /// Appends a request made of stages, each of several commands: a
    /// stage's commands go out in one write once every reply of the stage
    /// before it is in, and the request is answered by its last stage's
    /// last reply (see [`run_staged`]).
    pub fn push_staged(&mut self, stages: &[&[&[&[u8]]]]) {
        for commands in stages {
            assert!(!commands.is_empty(), "a stage of no command");
            for args in *commands {
                self.encode(args);
            }
            self.stages.push(Stage {
                end: self.bytes.len(),
                commands: commands.len(),
            });
        }
        self.ends.push(self.bytes.len());
        self.staged.push(self.stages.len());
    }

    fn encode(&mut self, args: &[&[u8]]) {
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

/// Send lags: nanoseconds, from 1 ns (most sends are on time) to 60 s.
pub fn lag_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
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
    probe: impl FnMut() -> P,
) -> Result<(RunOutcome, P, P), String> {
    run_grouped(conns, depth, 1, probe).await
}

/// [`run`], where every request is `group` commands (written with
/// [`Encoded::push_group`]): `depth` requests in flight is `depth × group`
/// commands, and a request's latency runs from its write to the last of
/// its `group` replies. Every reply's code is counted.
pub async fn run_grouped<P>(
    conns: Vec<Conn>,
    depth: usize,
    group: usize,
    probe: impl FnMut() -> P,
) -> Result<(RunOutcome, P, P), String> {
    assert!(group >= 1);
    run_each(conns, probe, |stream, requests| {
        tokio::spawn(drive(stream, requests, depth, group))
    })
    .await
}

/// [`run`], where every request is made of stages (written with
/// [`Encoded::push_staged`]): a request's first stage goes out when there
/// is room, each next stage once every reply of the one before it is in,
/// and `depth` counts requests in flight, whatever stage they are at. A
/// request's latency runs from the write of its first stage to the last
/// reply of its last. Every reply's code is counted.
pub async fn run_staged<P>(
    conns: Vec<Conn>,
    depth: usize,
    probe: impl FnMut() -> P,
) -> Result<(RunOutcome, P, P), String> {
    run_each(conns, probe, |stream, requests| {
        tokio::spawn(drive_staged(stream, requests, depth))
    })
    .await
}

/// Opens the connections, calls `probe`, runs `spawn`'s task on each
/// connection with its requests, waits for them all, and calls `probe`
/// again.
async fn run_each<P>(
    conns: Vec<Conn>,
    mut probe: impl FnMut() -> P,
    spawn: impl Fn(TcpStream, Encoded) -> tokio::task::JoinHandle<Result<ConnOutcome, String>>,
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
        .map(|(conn, stream)| spawn(stream, conn.requests))
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
    /// When the last reply was read.
    last_reply: Option<Instant>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency: histogram(),
            codes: [0; 4],
            errors: 0,
            first_error: None,
            last_reply: None,
        }
    }

    /// Counts one reply that took `latency`.
    fn record(&mut self, reply: ParsedReply, latency: Duration) {
        self.latency
            .saturating_record((latency.as_nanos() as u64).max(1_000));
        self.count(reply);
    }

    /// Counts one reply's code, no latency.
    fn count(&mut self, reply: ParsedReply) {
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

/// One connection: keeps `depth` requests (of `group` commands each) in
/// flight until all are answered.
async fn drive(
    mut stream: TcpStream,
    requests: Encoded,
    depth: usize,
    group: usize,
) -> Result<ConnOutcome, String> {
    let total = requests.len();
    let mut tally = Tally::new();
    let mut sent = 0;
    let mut answered = 0;
    // Replies read of the oldest request in flight.
    let mut partial = 0;
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
            partial += 1;
            if partial < group {
                tally.count(reply);
                continue;
            }
            partial = 0;
            let started = sent_at
                .pop_front()
                .ok_or("a reply to a request never sent")?;
            tally.record(reply, now - started);
            answered += 1;
        }
    }
    Ok(tally.done(stream, Instant::now()))
}

/// The replies a connection waits for from one stage it wrote: of which
/// request stage, how many are still to come, and when the request's
/// first stage was written.
struct Awaited {
    stage: usize,
    /// The request's last stage.
    last: usize,
    left: usize,
    started: Instant,
}

/// One connection of [`run_staged`]: keeps `depth` requests in flight,
/// each stage written once the stage before it is answered, until all
/// are answered. Replies on one connection come back in the order their
/// commands were written, so the stages awaited are a queue.
async fn drive_staged(
    mut stream: TcpStream,
    requests: Encoded,
    depth: usize,
) -> Result<ConnOutcome, String> {
    let total = requests.len();
    let mut tally = Tally::new();
    // Requests whose first stage is written, and of those the answered.
    let mut begun = 0;
    let mut answered = 0;
    let mut awaited: VecDeque<Awaited> = VecDeque::with_capacity(depth);
    // Stages due because the one before was answered: (stage, last
    // stage, the request's start).
    let mut due: Vec<(usize, usize, Instant)> = Vec::with_capacity(depth);
    let mut out = Vec::with_capacity(64 * 1024);
    let mut input = BytesMut::with_capacity(64 * 1024);
    while answered < total {
        out.clear();
        for (stage, last, started) in due.drain(..) {
            let (bytes, commands) = requests.stage(stage);
            out.extend_from_slice(bytes);
            awaited.push_back(Awaited {
                stage,
                last,
                left: commands,
                started,
            });
        }
        let fresh = awaited.len();
        while begun - answered < depth && begun < total {
            let (first, last) = requests.stages_of(begun);
            let (bytes, commands) = requests.stage(first);
            out.extend_from_slice(bytes);
            awaited.push_back(Awaited {
                stage: first,
                last,
                left: commands,
                // Set once the write is done, below.
                started: Instant::now(),
            });
            begun += 1;
        }
        if !out.is_empty() {
            stream
                .write_all(&out)
                .await
                .map_err(|e| format!("write: {e}"))?;
            let now = Instant::now();
            for first in awaited.iter_mut().skip(fresh) {
                first.started = now;
            }
        }
        read_some(&mut stream, &mut input, answered, total).await?;
        let now = Instant::now();
        while let Some((len, reply)) = parse_reply(&input)? {
            input.advance(len);
            let oldest = awaited
                .front_mut()
                .ok_or("a reply to a command never sent")?;
            oldest.left -= 1;
            if oldest.left > 0 {
                tally.count(reply);
                continue;
            }
            let Awaited {
                stage,
                last,
                started,
                ..
            } = awaited.pop_front().expect("the stage just read");
            if stage < last {
                tally.count(reply);
                due.push((stage + 1, last, started));
            } else {
                tally.record(reply, now - started);
                answered += 1;
            }
        }
    }
    Ok(tally.done(stream, Instant::now()))
}

// ---------------------------------------------------------------- open loop

/// How long after the probe the schedule starts: time for the thread to
/// start and raise its priority, so the first requests are not late for
/// reasons of the harness's own.
const LEAD: Duration = Duration::from_millis(20);

/// When each request of an open-loop run is due: request `i`, counted
/// over all connections, at `t0 + i / rate`, on connection
/// `i % connections`. Computed from `i` every time, so no error adds up
/// over the run, and a late send never moves the sends after it.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    t0: Instant,
    rate: u64,
    conns: usize,
}

impl Schedule {
    /// The intended send time of request `i`.
    fn due(&self, i: usize) -> Instant {
        self.t0 + Duration::from_nanos((i as u128 * 1_000_000_000 / self.rate as u128) as u64)
    }

    /// The index over all connections of request `k` of connection `c`.
    fn index(&self, c: usize, k: usize) -> usize {
        c + k * self.conns
    }
}

/// How well the load generator kept to its schedule.
pub struct Pacing {
    /// Per request, when its write began minus when it was due, in ns.
    pub lag: Histogram<u64>,
    /// The requests over the time from the first one due to the last
    /// write, plus one interval: the rate asked for when on schedule,
    /// lower when the load generator fell behind and never caught up.
    pub achieved: f64,
    /// What the load generator's thread ran at.
    pub priority: Priority,
}

/// What the open-loop thread asks the scheduler for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Like every other process.
    Normal,
    /// nice -20: a larger share, and an earlier turn on wake-up, still
    /// under the fair scheduler.
    Nice,
    /// `SCHED_FIFO` priority 1: runs the moment it wakes.
    Fifo,
}

impl Priority {
    pub fn name(self) -> &'static str {
        match self {
            Priority::Normal => "normal",
            Priority::Nice => "nice",
            Priority::Fifo => "fifo",
        }
    }

    /// Asks for it for the calling thread; what it got (`Normal` when not
    /// permitted: no `CAP_SYS_NICE`, no `RLIMIT_RTPRIO` or `RLIMIT_NICE`).
    fn apply(self) -> Priority {
        let ok = match self {
            Priority::Normal => true,
            // SAFETY: setpriority on the calling thread (a tid is a
            // process id to it, on Linux).
            Priority::Nice => unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, -20) == 0
            },
            // SAFETY: pid 0 is the calling thread; a valid sched_param.
            Priority::Fifo => unsafe {
                let param = libc::sched_param { sched_priority: 1 };
                libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0
            },
        };
        if ok { self } else { Priority::Normal }
    }
}

/// Runs `conns` open loop: requests go out at `rate` per second in all,
/// each at its intended time whatever the replies are doing (a connection
/// whose earlier replies are still out pipelines the next request behind
/// them), and a request's latency runs from its intended send time to its
/// reply. A server (or load generator) that stalls then shows in the
/// latencies of every request that should have gone out meanwhile, rather
/// than in one slow reply and a pause in sending, which is what a closed
/// loop records (coordinated omission).
///
/// One thread of its own sends and reads, on the connections as std
/// sockets, waiting in `epoll_pwait2` (a nanosecond timeout, with the
/// thread's timer slack at 1 ns) until the next request is due or a reply
/// arrives; so a send never waits for the tokio runtime, and a reply's
/// time is taken by the thread that was waiting for it. It asks the
/// scheduler for `priority` (without the privilege it stays at normal
/// priority, and [`Pacing::priority`] says so). It never spins: with two
/// cores, a spinning load generator would take one from the Redis and
/// proxy it measures.
///
/// Every connection must hold the same number of requests. `probe` as in
/// [`run`].
pub async fn open_loop<P>(
    conns: Vec<Conn>,
    rate: u64,
    priority: Priority,
    mut probe: impl FnMut() -> P,
) -> Result<(RunOutcome, Pacing, P, P), String> {
    assert!(rate > 0, "a rate of 0");
    let per_conn = conns.first().map_or(0, |c| c.requests.len());
    assert!(
        conns.iter().all(|c| c.requests.len() == per_conn),
        "open loop: every connection needs the same number of requests"
    );
    let addrs: Vec<SocketAddr> = conns.iter().map(|c| c.addr).collect();
    let connecting = Instant::now();
    let streams = connect_all(&addrs).await.map_err(|e| e.to_string())?;
    let connecting = connecting.elapsed();
    let streams = streams
        .into_iter()
        .map(|s| s.into_std().map_err(|e| format!("into_std: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let requests: Vec<Encoded> = conns.into_iter().map(|c| c.requests).collect();
    let before = probe();
    let schedule = Schedule {
        t0: Instant::now() + LEAD,
        rate,
        conns: streams.len(),
    };
    let thread = std::thread::Builder::new()
        .name("open-loop".into())
        .spawn(move || {
            let priority = priority.apply();
            let result = open_loop_thread(schedule, &streams, &requests);
            (
                result.map(|(tallies, lag, last_write)| (tallies, lag, last_write, priority)),
                streams,
            )
        })
        .map_err(|e| format!("cannot start the load generator's thread: {e}"))?;
    let (result, streams) = tokio::task::spawn_blocking(move || thread.join())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|_| "the load generator's thread panicked".to_owned())?;
    let after = probe();
    let (tallies, lag, last_write, priority) = result?;
    let mut outcome = RunOutcome {
        latency: histogram(),
        codes: [0; 4],
        errors: 0,
        first_error: None,
        elapsed: Duration::ZERO,
        connecting,
        streams: Vec::with_capacity(streams.len()),
    };
    let mut last = schedule.t0;
    for (tally, stream) in tallies.into_iter().zip(streams) {
        let finished = tally.last_reply.unwrap_or(schedule.t0);
        let stream = TcpStream::from_std(stream).map_err(|e| format!("from_std: {e}"))?;
        outcome.add(tally.done(stream, finished), &mut last);
    }
    outcome.elapsed = last.saturating_duration_since(schedule.t0);
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let span = last_write.saturating_duration_since(schedule.t0) + interval;
    let pacing = Pacing {
        lag,
        achieved: (per_conn * schedule.conns) as f64 / span.as_secs_f64(),
        priority,
    };
    Ok((outcome, pacing, before, after))
}

/// Per connection of an open-loop run: what it has written and read.
struct Lane {
    /// Requests due so far (the ones below the schedule's `next`).
    due: usize,
    /// Of those, requests whose write has begun (their lag is recorded).
    started: usize,
    /// Bytes of its requests written.
    written: usize,
    /// Replies read.
    answered: usize,
    input: BytesMut,
    tally: Tally,
    /// On the list of lanes with bytes due and not yet written.
    dirty: bool,
}

/// The open-loop thread: writes each request when due, reads replies as
/// they come. Returns each connection's tally, the send lags, and when the
/// last write began.
fn open_loop_thread(
    schedule: Schedule,
    streams: &[std::net::TcpStream],
    requests: &[Encoded],
) -> Result<(Vec<Tally>, Histogram<u64>, Instant), String> {
    // The default timer slack lets the kernel wake a sleeper up to 50 µs
    // late, to batch wake-ups; this thread's timeouts are its schedule.
    // SAFETY: prctl on the calling thread, with a plain integer.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
    let conns = streams.len();
    let per_conn = requests.first().map_or(0, Encoded::len);
    let total = conns * per_conn;
    let mut epoll = Epoll::new(streams)?;
    let mut lanes: Vec<Lane> = (0..conns)
        .map(|_| Lane {
            due: 0,
            started: 0,
            written: 0,
            answered: 0,
            input: BytesMut::with_capacity(64 * 1024),
            tally: Tally::new(),
            dirty: false,
        })
        .collect();
    let mut dirty: Vec<usize> = Vec::with_capacity(conns);
    let mut lag = lag_histogram();
    let mut scratch = vec![0u8; 64 * 1024];
    let mut next = 0;
    let mut answered = 0;
    let mut last_write = schedule.t0;
    let mut last_progress = Instant::now();
    while answered < total {
        // Everything due by now goes out, one write per connection (a
        // connection's due requests are consecutive in its buffer).
        let now = Instant::now();
        while next < total && schedule.due(next) <= now {
            let lane = &mut lanes[next % conns];
            lane.due += 1;
            if !lane.dirty {
                lane.dirty = true;
                dirty.push(next % conns);
            }
            next += 1;
        }
        let mut blocked = false;
        let mut failure = None;
        dirty.retain(|&c| {
            if failure.is_some() {
                return true;
            }
            let lane = &mut lanes[c];
            let at = Instant::now();
            for k in lane.started..lane.due {
                let due = schedule.due(schedule.index(c, k));
                lag.saturating_record(at.saturating_duration_since(due).as_nanos() as u64);
                last_write = at;
            }
            lane.started = lane.due;
            let end = requests[c].end_of(lane.due);
            match write_some(&streams[c], &requests[c].as_bytes()[lane.written..end]) {
                Ok(n) => lane.written += n,
                Err(e) => {
                    failure = Some(e);
                    return true;
                }
            }
            // A full socket buffer: the rest goes on a later turn.
            lane.dirty = lane.written < end;
            blocked |= lane.dirty;
            lane.dirty
        });
        if let Some(failed) = failure {
            return Err(failed);
        }
        // Wait for a reply, or until the next request is due (sooner when
        // a write is still pending).
        let mut wait = if next < total {
            schedule.due(next).saturating_duration_since(Instant::now())
        } else {
            REPLY_TIMEOUT
        };
        if blocked {
            wait = wait.min(Duration::from_micros(200));
        }
        for event in epoll.wait(wait)? {
            let c = event.u64 as usize;
            let lane = &mut lanes[c];
            read_lane(&streams[c], lane, &mut scratch, per_conn)?;
            let now = Instant::now();
            while let Some((len, reply)) = parse_reply(&lane.input)? {
                lane.input.advance(len);
                if lane.answered == per_conn {
                    return Err("more replies than requests".into());
                }
                let due = schedule.due(schedule.index(c, lane.answered));
                lane.tally.record(reply, now.saturating_duration_since(due));
                lane.tally.last_reply = Some(now);
                lane.answered += 1;
                answered += 1;
                last_progress = now;
            }
        }
        if answered < next && last_progress.elapsed() > REPLY_TIMEOUT {
            return Err(format!(
                "no reply within {REPLY_TIMEOUT:?} ({answered} of {next} sent answered)"
            ));
        }
    }
    Ok((
        lanes.into_iter().map(|l| l.tally).collect(),
        lag,
        last_write,
    ))
}

/// Reads what has arrived on a connection into its lane, until a short
/// read (the rest, if any, is for the next readiness).
fn read_lane(
    mut stream: &std::net::TcpStream,
    lane: &mut Lane,
    scratch: &mut [u8],
    total: usize,
) -> Result<(), String> {
    loop {
        match std::io::Read::read(&mut stream, scratch) {
            Ok(0) => {
                return Err(format!(
                    "connection closed by the server after {} of {total} replies",
                    lane.answered
                ));
            }
            Ok(n) => {
                lane.input.extend_from_slice(&scratch[..n]);
                if n < scratch.len() {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

/// Writes what a non-blocking socket takes of `bytes`.
fn write_some(mut stream: &std::net::TcpStream, bytes: &[u8]) -> Result<usize, String> {
    let mut written = 0;
    while written < bytes.len() {
        match std::io::Write::write(&mut stream, &bytes[written..]) {
            Ok(0) => return Err("write: the connection took no bytes".into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("write: {e}")),
        }
    }
    Ok(written)
}

/// An epoll set of the connections, each reported by its index;
/// level-triggered, so a connection not fully read is reported again.
struct Epoll {
    fd: std::os::fd::OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl Epoll {
    fn new(streams: &[std::net::TcpStream]) -> Result<Epoll, String> {
        use std::os::fd::FromRawFd;
        // SAFETY: a plain syscall.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(format!(
                "epoll_create1: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: a fresh fd that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        for (i, stream) in streams.iter().enumerate() {
            let mut event = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: i as u64,
            };
            // SAFETY: valid fds and a valid event.
            let rc = unsafe {
                libc::epoll_ctl(
                    fd.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    stream.as_raw_fd(),
                    &mut event,
                )
            };
            if rc != 0 {
                return Err(format!("epoll_ctl: {}", std::io::Error::last_os_error()));
            }
        }
        let events = vec![libc::epoll_event { events: 0, u64: 0 }; streams.len().max(1)];
        Ok(Epoll { fd, events })
    }

    /// The events of the connections ready within `timeout` (none when it
    /// passes first).
    fn wait(&mut self, timeout: Duration) -> Result<&[libc::epoll_event], String> {
        let timeout = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a valid epoll fd, a buffer of `len` events, a valid
        // timespec, and no signal mask.
        let n = unsafe {
            libc::epoll_pwait2(
                self.fd.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as libc::c_int,
                &timeout,
                std::ptr::null(),
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(format!("epoll_pwait2 (Linux 5.11+): {err}"));
            }
            return Ok(&[]);
        }
        Ok(&self.events[..n as usize])
    }
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
