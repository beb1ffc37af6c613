//! One client connection: requests in, replies out, in order.
//!
//! The connection reads frames, answers the connection-level commands on
//! the spot, hands each stock command to its requests in flight
//! ([`InFlight`], which sends it, keeps the order in which requests take
//! effect, and settles the answers), and writes the replies back in
//! request order. Replies that are ready together leave in one write,
//! never one flush per reply.
//!
//! Bounds: one request is at most `--max-request-bytes`; at most
//! `--max-pipeline` requests are in flight; and once `MAX_OUTPUT` bytes of
//! replies wait for a client that doesn't read, stockgate stops reading
//! from it until it does. Memory per connection stays bounded whatever the
//! client sends.

use crate::command::Session;
use crate::dispatch::{self, Action};
use crate::frame::RequestDecoder;
use crate::reply::Reply;
use crate::state::Shared;
use crate::stock::{Caller, InFlight};
use bytes::BytesMut;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::net::tcp::ReadHalf;
use tokio_util::codec::Decoder;
use tokio_util::sync::CancellationToken;

/// Replies buffered for a client before stockgate stops reading from it.
const MAX_OUTPUT: usize = 4 * 1024 * 1024;
/// Read buffer growth step.
const READ_CHUNK: usize = 4 * 1024;
/// How long a busy connection sits idle (nothing in, nothing owed) before
/// it gives its buffers back. Most of a sidecar's connections sit in a
/// pool doing nothing, and 4 KiB each adds up to tens of MB at 10,000
/// connections (measured); but a busy connection is idle between every
/// request at depth 1, and freeing and allocating its buffers each time
/// cost about a tenth of its instructions per request (callgrind). So a
/// connection whose read came less than this after the one before keeps
/// them this long; any other gives them back as soon as it owes nothing
/// ([`give_back`]).
const IDLE_RELEASE: Duration = Duration::from_millis(500);
/// How far past its deadline an answer may be late before the connection
/// answers the request itself: the pipe answers every request by its
/// deadline, and this only guards against a pipe that can't run.
const ANSWER_GRACE: Duration = Duration::from_millis(500);
/// How long a closing connection waits for the client to close too, reading
/// and dropping what it still sends (see [`crate::net::discard_input`]).
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// Serves one connection until the client leaves, sends QUIT or malformed
/// RESP, or the server drains.
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    drain: CancellationToken,
) {
    shared.clients.fetch_add(1, Ordering::Relaxed);
    shared.metrics.client_connected();
    let id = shared.next_client_id();
    tracing::debug!(%peer, client = id, "client connected");
    if let Err(err) = run(stream, peer, id, &shared, &drain).await {
        // A client vanishing mid-request is routine; its in-flight requests
        // still complete upstream (the script is atomic), only the replies
        // are lost, and a retry with the same request_id gets code 1.
        tracing::debug!(%peer, client = id, %err, "connection ended with an I/O error");
    }
    tracing::debug!(%peer, client = id, "client disconnected");
    shared.metrics.client_disconnected();
    shared.clients.fetch_sub(1, Ordering::Relaxed);
}

async fn run(
    mut stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    shared: &Shared,
    drain: &CancellationToken,
) -> std::io::Result<()> {
    let (reader, mut writer) = stream.split();
    let config = &shared.config;
    let mut decoder = RequestDecoder::new(config.max_request_bytes);
    let mut session = Session::new(id, shared.config.password.is_none());
    session.peer = Some(peer);
    let mut input = BytesMut::new();
    let mut output = BytesMut::new();
    let mut in_flight = InFlight::new(&shared.service);
    // Reading from the socket: stops at EOF, and once a drain has taken in
    // what the client had already sent.
    let mut reading = true;
    // The client closed its side (a read returned 0).
    let mut closed_by_client = false;
    let mut draining = false;
    let idle_timeout = config.idle_timeout;
    let mut last_read = tokio::time::Instant::now();
    // Whether a read has come yet, and whether the last one came less than
    // IDLE_RELEASE after the one before (then the connection keeps its
    // buffers while it is idle, until the janitor finds it quiet).
    let mut read_once = false;
    let mut busy = false;
    let mut janitor =
        tokio::time::interval_at(tokio::time::Instant::now() + IDLE_RELEASE, IDLE_RELEASE);
    janitor.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Taking requests from the buffer: stops after QUIT or a protocol error.
    let mut accepting = true;
    // One future for the connection's life: made afresh each time round
    // the loop, it enlisted in the token's waiter list every time.
    let drained = drain.cancelled();
    tokio::pin!(drained);

    loop {
        // Turn buffered bytes into requests while the pipeline has room.
        while accepting && in_flight.len() < config.max_pipeline {
            let request = match decoder.decode(&mut input) {
                Ok(Some(request)) => request,
                Ok(None) => break,
                Err(err) => {
                    tracing::debug!(client = id, %err, "malformed request; closing");
                    in_flight.push_reply(Reply::Error(format!("ERR {err}")), session.protocol);
                    accepting = false;
                    reading = false;
                    break;
                }
            };
            let arrived = Instant::now();
            let action = dispatch::execute(request, &mut session, shared);
            // After the command ran: HELLO's own reply is in the protocol
            // it chose.
            let protocol = session.protocol;
            match action {
                Action::Reply(reply) => in_flight.push_reply(reply, protocol),
                Action::Close(reply) => {
                    accepting = false;
                    reading = false;
                    in_flight.push_reply(reply, protocol);
                }
                Action::Stock(command, args) => {
                    let caller = || Caller {
                        client_id: Some(session.id),
                        addr: session.peer,
                        name: session.name.clone(),
                    };
                    in_flight.push(command, args, arrived, caller, protocol);
                }
            }
        }

        // Settle every answer that is in, and every future that is done,
        // without waiting; then write out the replies that are next in order.
        in_flight.progress();
        in_flight.write_ready(&mut output);

        // Done when nothing more can arrive and everything is answered. (An
        // incomplete request left in the buffer can't be answered.)
        if !reading && in_flight.is_empty() && output.is_empty() {
            break;
        }
        let idle = in_flight.is_empty() && input.is_empty() && output.is_empty();
        if idle && !busy {
            give_back(&mut input, &mut output, &mut in_flight);
        }
        let holding = input.capacity() > 0 || output.capacity() > 0 || in_flight.holds_memory();

        let can_read =
            reading && in_flight.len() < config.max_pipeline && output.len() < MAX_OUTPUT;
        if draining && can_read {
            // Draining: take in what the client sent before the signal (it
            // is in the socket buffer now), without waiting for more. Every
            // request read is answered; then the connection closes.
            if input.capacity() - input.len() < READ_CHUNK / 4 {
                input.reserve(READ_CHUNK);
            }
            match crate::net::read_now(reader.as_ref(), &mut input) {
                Ok(0) => {
                    reading = false;
                    closed_by_client = true;
                }
                Ok(_) => {}
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => reading = false,
                Err(err) => return Err(err),
            }
            continue;
        }
        // Biased: the branches are polled in this order instead of from a
        // random start, which cost a thread-local RNG call per select
        // (callgrind). The ones before the read run out of work, and the
        // read stops at --max-pipeline; what comes after it only matters
        // when the client is quiet.
        tokio::select! {
            biased;
            written = writer.write_buf(&mut output), if !output.is_empty() => {
                if written? == 0 {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
            }
            // Answers from the pipes and the futures; the top of the loop
            // settles them.
            () = in_flight.arrival(), if in_flight.awaits() => {}
            // Before the read: a client that never stops sending must not
            // keep the drain from starting.
            () = &mut drained, if reading && !draining => {
                draining = true;
            }
            // Wait for bytes before allocating a buffer for them.
            ready = reader.readable(), if can_read && !draining => {
                ready?;
                match read_available(&reader, &mut input) {
                    Ok(0) => {
                        reading = false;
                        closed_by_client = true;
                    }
                    Ok(_) => {
                        let now = tokio::time::Instant::now();
                        busy = read_once && now - last_read < IDLE_RELEASE;
                        read_once = true;
                        last_read = now;
                    }
                    Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(err) => return Err(err),
                }
            }
            // Every half second while it holds buffers or is owed answers:
            // a busy connection that has gone quiet gives its buffers back
            // (the next read allocates again), and a request whose answer
            // is overdue past its deadline is answered here (a pipe that
            // can't run).
            _ = janitor.tick(), if holding || in_flight.with_pipes() => {
                if idle && last_read.elapsed() >= IDLE_RELEASE {
                    busy = false;
                    give_back(&mut input, &mut output, &mut in_flight);
                }
                in_flight.answer_overdue(tokio::time::Instant::now() - ANSWER_GRACE);
            }
            // --idle-timeout: nothing sent and nothing owed for that long.
            // (select! builds every branch's future each time round, so the
            // timer is made only inside, when the branch is polled.)
            _ = async { tokio::time::sleep_until(last_read + idle_timeout.unwrap_or_default()).await },
                if idle_timeout.is_some() && in_flight.is_empty() && output.is_empty() => {
                tracing::debug!(client = id, "idle timeout; closing");
                break;
            }
            else => break,
        }
    }
    // Every reply is written: a FIN after the last one. Then, unless the
    // client has closed already, drop what it still sends until it does,
    // so the close stays a FIN (see net::discard_input).
    writer.shutdown().await?;
    if !closed_by_client {
        crate::net::discard_input(reader.as_ref(), CLOSE_LINGER).await;
    }
    Ok(())
}

/// Gives back what an idle connection holds besides its task: the read and
/// write buffers, and what its requests in flight kept room for. The next
/// request allocates again.
fn give_back(input: &mut BytesMut, output: &mut BytesMut, in_flight: &mut InFlight<'_>) {
    if input.capacity() > 0 {
        *input = BytesMut::new();
    }
    if output.capacity() > 0 {
        *output = BytesMut::new();
    }
    in_flight.give_back();
}

/// Reads what the socket has now, growing the buffer first if needed.
fn read_available(reader: &ReadHalf<'_>, input: &mut BytesMut) -> std::io::Result<usize> {
    if input.capacity() - input.len() < READ_CHUNK / 4 {
        input.reserve(READ_CHUNK);
    }
    crate::net::try_read(reader.as_ref(), input)
}
