//! One client connection: requests in, replies out, in order.
//!
//! Pipelined requests run concurrently: every DEDUCT read from the socket
//! goes upstream at once, without waiting for the one before, and the
//! replies are written back in request order. Replies that are ready
//! together leave in one write, never one flush per reply.
//!
//! Bounds: one request is at most `--max-request-bytes`; at most
//! `--max-pipeline` requests are in flight; and once `MAX_OUTPUT` bytes of
//! replies wait for a client that doesn't read, stockgate stops reading
//! from it until it does. Memory per connection stays bounded whatever the
//! client sends.

use crate::command::{self, Action};
use crate::frame::RequestDecoder;
use crate::reply::{Protocol, Reply};
use crate::session::Session;
use crate::state::Shared;
use crate::stock::{Caller, StockCommand};
use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesOrdered, StreamExt};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
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
/// How long a connection sits idle (nothing in, nothing owed) before it
/// gives its buffers back. Most of a sidecar's connections sit in a pool
/// doing nothing, and 4 KiB each adds up to tens of MB at 10,000
/// connections (measured); but a busy connection is idle between every
/// request at depth 1, and freeing and allocating its buffers each time
/// cost about a tenth of its instructions per request (callgrind).
const IDLE_RELEASE: Duration = Duration::from_millis(500);
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
    let mut in_flight: FuturesOrdered<Queued<'_>> = FuturesOrdered::new();
    // Reading from the socket: stops at EOF, and once a drain has taken in
    // what the client had already sent.
    let mut reading = true;
    // The client closed its side (a read returned 0).
    let mut closed_by_client = false;
    let mut draining = false;
    let idle_timeout = config.idle_timeout;
    let mut last_read = tokio::time::Instant::now();
    let mut janitor =
        tokio::time::interval_at(tokio::time::Instant::now() + IDLE_RELEASE, IDLE_RELEASE);
    janitor.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Taking requests from the buffer: stops after QUIT or a protocol error.
    let mut accepting = true;

    loop {
        // Turn buffered bytes into requests while the pipeline has room.
        while accepting && in_flight.len() < config.max_pipeline {
            let request = match decoder.decode(&mut input) {
                Ok(Some(request)) => request,
                Ok(None) => break,
                Err(err) => {
                    tracing::debug!(client = id, %err, "malformed request; closing");
                    in_flight.push_back(Queued::ready(
                        Reply::Error(format!("ERR {err}")),
                        session.protocol,
                    ));
                    accepting = false;
                    reading = false;
                    break;
                }
            };
            let arrived = Instant::now();
            let queued = match command::execute(request, &mut session, shared) {
                Action::Reply(reply) => Queued::ready(reply, session.protocol),
                Action::Close(reply) => {
                    accepting = false;
                    reading = false;
                    Queued::ready(reply, session.protocol)
                }
                Action::Stock(command, args) => {
                    // Only operators' changes log who sent them.
                    let caller = match command {
                        StockCommand::Set | StockCommand::Add => Caller {
                            client_id: Some(session.id),
                            addr: session.peer,
                            name: session.name.clone(),
                        },
                        _ => Caller::default(),
                    };
                    Queued::stock(shared, command, args, caller, arrived, session.protocol)
                }
            };
            in_flight.push_back(queued);
        }

        // Collect every reply that is ready now, in order, without waiting.
        while let Some(Some((reply, protocol))) = in_flight.next().now_or_never() {
            reply.encode(protocol, &mut output);
        }

        // Done when nothing more can arrive and everything is answered. (An
        // incomplete request left in the buffer can't be answered.)
        if !reading && in_flight.is_empty() && output.is_empty() {
            break;
        }
        let idle = in_flight.is_empty() && input.is_empty() && output.is_empty();
        let holding = input.capacity() > 0 || output.capacity() > 0;

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
        tokio::select! {
            written = writer.write_buf(&mut output), if !output.is_empty() => {
                if written? == 0 {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
            }
            Some((reply, protocol)) = in_flight.next(), if !in_flight.is_empty() => {
                reply.encode(protocol, &mut output);
            }
            // Wait for bytes before allocating a buffer for them.
            ready = reader.readable(), if can_read && !draining => {
                ready?;
                match read_available(&reader, &mut input) {
                    Ok(0) => {
                        reading = false;
                        closed_by_client = true;
                    }
                    Ok(_) => last_read = tokio::time::Instant::now(),
                    Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(err) => return Err(err),
                }
            }
            // Idle long enough: give the buffers back (the next read
            // allocates again). One timer for the connection's life, polled
            // only while buffers are held.
            _ = janitor.tick(), if holding => {
                if idle && last_read.elapsed() >= IDLE_RELEASE {
                    input = BytesMut::new();
                    output = BytesMut::new();
                }
            }
            _ = drain.cancelled(), if reading && !draining => {
                draining = true;
            }
            // --idle-timeout: nothing sent and nothing owed for that long.
            _ = tokio::time::sleep_until(last_read + idle_timeout.unwrap_or_default()),
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

/// Reads what the socket has now, growing the buffer first if needed.
fn read_available(reader: &ReadHalf<'_>, input: &mut BytesMut) -> std::io::Result<usize> {
    if input.capacity() - input.len() < READ_CHUNK / 4 {
        input.reserve(READ_CHUNK);
    }
    crate::net::try_read(reader.as_ref(), input)
}

/// One request's place in the reply order, and the protocol its reply is
/// encoded in (fixed when the request was read: a later HELLO doesn't
/// change it).
struct Queued<'a> {
    reply: Pending<'a>,
    protocol: Protocol,
}

enum Pending<'a> {
    Ready(Option<Reply>),
    Running(BoxFuture<'a, Reply>),
}

impl<'a> Queued<'a> {
    fn ready(reply: Reply, protocol: Protocol) -> Self {
        Queued {
            reply: Pending::Ready(Some(reply)),
            protocol,
        }
    }

    fn stock(
        shared: &'a Shared,
        command: StockCommand,
        args: Vec<Bytes>,
        caller: Caller,
        arrived: Instant,
        protocol: Protocol,
    ) -> Self {
        let call = async move { shared.service.serve(command, &args, arrived, &caller).await };
        Queued {
            reply: Pending::Running(call.boxed()),
            protocol,
        }
    }
}

impl Future for Queued<'_> {
    type Output = (Reply, Protocol);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let reply = match &mut this.reply {
            Pending::Ready(reply) => reply.take().expect("a queued reply is taken once"),
            Pending::Running(call) => match call.as_mut().poll(cx) {
                Poll::Ready(reply) => reply,
                Poll::Pending => return Poll::Pending,
            },
        };
        Poll::Ready((reply, this.protocol))
    }
}
