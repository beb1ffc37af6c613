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
use crate::transport::{Reader, Transport};
use bytes::BytesMut;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_util::codec::Decoder;
use tokio_util::sync::CancellationToken;

/// Replies buffered for a client before stockgate stops reading from it.
const MAX_OUTPUT: usize = 4 * 1024 * 1024;
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
/// and dropping what it still sends (see [`crate::transport::discard_input`]).
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// Serves one connection, plain or TLS, until the client leaves, sends
/// QUIT or malformed RESP, or the server drains.
pub async fn serve<T: Transport>(
    stream: T,
    peer: SocketAddr,
    shared: Arc<Shared>,
    drain: CancellationToken,
    login: Option<Arc<crate::auth::Account>>,
) {
    shared.clients.fetch_add(1, Ordering::Relaxed);
    shared.metrics.client_connected();
    let id = shared.next_client_id();
    tracing::debug!(%peer, client = id, "client connected");
    if let Err(err) = run(stream, peer, id, &shared, &drain, login).await {
        // A client vanishing mid-request is routine; its in-flight requests
        // still complete upstream (the script is atomic), only the replies
        // are lost, and a retry with the same request_id gets code 1.
        tracing::debug!(%peer, client = id, %err, "connection ended with an I/O error");
    }
    tracing::debug!(%peer, client = id, "client disconnected");
    shared.metrics.client_disconnected();
    shared.clients.fetch_sub(1, Ordering::Relaxed);
}

async fn run<T: Transport>(
    mut stream: T,
    peer: SocketAddr,
    id: u64,
    shared: &Shared,
    drain: &CancellationToken,
    login: Option<Arc<crate::auth::Account>>,
) -> std::io::Result<()> {
    let (mut reader, mut writer) = stream.split();
    let config = &shared.config;
    let mut decoder = RequestDecoder::new(config.max_request_bytes);
    // Logged in from the start: by a client certificate (`login`), or
    // because nothing asks a password.
    let mut session = Session::new(id, login.or_else(|| shared.users.open_account()));
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
    // A write left bytes inside the transport (TLS) that a flush sends.
    let mut unflushed = false;
    let idle_timeout = config.idle_timeout;
    let mut last_read = tokio::time::Instant::now();
    // Whether a read has come yet, and whether the last one came less than
    // IDLE_RELEASE after the one before (then the connection keeps its
    // buffers while it is idle, until the janitor finds it quiet).
    let mut read_once = false;
    let mut busy = false;
    // The janitor's timer (see `Janitor`).
    let janitor = tokio::time::sleep(IDLE_RELEASE);
    tokio::pin!(janitor);
    let mut janitor_armed = false;
    // Taking requests from the buffer: stops after QUIT or a protocol error.
    let mut accepting = true;
    // Enlisted once in the drain's waiter list, so that an idle connection
    // wakes when the drain starts; each wake then reads the drain's flag,
    // an atomic, instead of polling the token (a lock) every time round.
    let drained = drain.cancelled();
    tokio::pin!(drained);
    enlist(drained.as_mut()).await;
    // The user this connection is logged in as, watched as the drain is:
    // enlisted once per login, its flag read at each wake. A user removed
    // from the users file (or left without a password) closes its
    // connections once their requests in flight are answered.
    let mut watched: Option<(
        Arc<crate::auth::Account>,
        std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    )> = None;

    loop {
        if reading && !draining && shared.draining.load(Ordering::Relaxed) {
            draining = true;
        }
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
            // Requests read together arrived together: one clock read for
            // them all.
            let arrived = last_read.into_std();
            let action = dispatch::execute(request, &mut session, shared);
            if let Some(delay) = session.login_delay.take() {
                // A failed login from a peer that failed many: this
                // connection waits before it answers or reads on.
                tokio::time::sleep(delay).await;
            }
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
                        user: session.account.clone(),
                    };
                    let user = session.account.clone();
                    in_flight.push(command, args, arrived, caller, user, protocol);
                }
            }
        }

        // Without passwords the one account is never closed: not watched.
        if let Some(account) = session.account.as_ref().filter(|_| !shared.users.is_open()) {
            if watched
                .as_ref()
                .is_none_or(|(w, _)| !Arc::ptr_eq(w, account))
            {
                let mut closed = Box::pin(account.closed().clone().cancelled_owned());
                enlist(closed.as_mut()).await;
                watched = Some((account.clone(), closed));
            }
            if reading && account.is_gone() {
                tracing::info!(
                    client = id,
                    user = account.name(),
                    "the user is gone; closing its connection"
                );
                accepting = false;
                reading = false;
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
        // The janitor: every half second while the connection holds
        // buffers or is owed answers, or an --idle-timeout may run out. Its
        // timer is armed when it is first wanted and again each time it
        // fires, never moved in between (a quiet connection's time is
        // checked when it fires), and enlisted once each time it is armed:
        // a wake, whatever its cause, looks whether it has fired.
        let owes = !in_flight.is_empty() || !output.is_empty();
        let janitor_wanted = holding || in_flight.with_pipes() || (idle_timeout.is_some() && !owes);
        if janitor_armed && janitor.is_elapsed() {
            janitor_armed = false;
            let now = tokio::time::Instant::now();
            if idle && now - last_read >= IDLE_RELEASE {
                busy = false;
                give_back(&mut input, &mut output, &mut in_flight);
            }
            in_flight.answer_overdue(now - ANSWER_GRACE);
            if idle_timeout.is_some_and(|limit| !owes && now - last_read >= limit) {
                tracing::debug!(client = id, "idle timeout; closing");
                break;
            }
            continue;
        }
        if janitor_wanted && !janitor_armed {
            let now = tokio::time::Instant::now();
            let mut at = now + IDLE_RELEASE;
            if let Some(limit) = idle_timeout.filter(|_| !owes) {
                at = at.min((last_read + limit).max(now));
            }
            janitor.as_mut().reset(at);
            janitor_armed = true;
            enlist(janitor.as_mut()).await;
        }

        let can_read =
            reading && in_flight.len() < config.max_pipeline && output.len() < MAX_OUTPUT;
        if draining && can_read {
            // Draining: take in what the client sent before the signal (it
            // is in the socket buffer now), without waiting for more. Every
            // request read is answered; then the connection closes.
            match reader.fill_now(&mut input) {
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
        // (callgrind). The drain and the janitor wake the task without a
        // branch of their own (see above).
        tokio::select! {
            biased;
            // The replies waiting; then, once none are, what a TLS session
            // kept back from the last write.
            written = std::future::poll_fn(|cx| {
                if output.is_empty() {
                    std::pin::Pin::new(&mut writer).poll_flush(cx).map_ok(|()| None)
                } else {
                    tokio_util::io::poll_write_buf(std::pin::Pin::new(&mut writer), cx, &mut output)
                        .map_ok(Some)
                }
            }), if !output.is_empty() || unflushed => {
                match written? {
                    Some(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                    Some(_) => unflushed = T::BUFFERS_WRITES,
                    None => unflushed = false,
                }
            }
            // Answers from the pipes and the futures; the top of the loop
            // settles them.
            () = in_flight.arrival(), if in_flight.awaits() => {}
            // Room for the bytes is taken once they are there.
            read = std::future::poll_fn(|cx| reader.poll_fill(cx, &mut input)),
                if can_read && !draining => {
                match read {
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
                    Err(err) => return Err(err),
                }
            }
            // The janitor's timer fired, or the drain started: both woke the
            // task (see above), which only has to look.
            () = std::future::poll_fn(|_| {
                let fired = janitor_armed && janitor.is_elapsed();
                let drain = reading && !draining && shared.draining.load(Ordering::Relaxed);
                let gone = reading
                    && session.account.as_ref().is_some_and(|a| a.is_gone());
                if fired || drain || gone {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            }), if janitor_armed || (reading && !draining) => {}
            else => break,
        }
    }
    // Every reply is written: a FIN after the last one. Then, unless the
    // client has closed already, drop what it still sends until it does,
    // so the close stays a FIN (see transport::discard_input).
    writer.shutdown().await?;
    if !closed_by_client {
        crate::transport::discard_input(&mut reader, CLOSE_LINGER).await;
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

/// Polls `future` once, with this task's waker, and goes on: it wakes the
/// task when it is ready, whether or not it is polled again (a timer, a
/// cancellation token's waiter). The task then looks at what woke it.
async fn enlist<F: Future>(future: std::pin::Pin<&mut F>) {
    let mut future = future;
    std::future::poll_fn(|cx| {
        let _ = future.as_mut().poll(cx);
        std::task::Poll::Ready(())
    })
    .await
}
