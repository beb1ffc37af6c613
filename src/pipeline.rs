//! The hot path to Redis: one pipelined connection per primary.
//!
//! DEDUCT and REVERT are one EVALSHA each. Sent through the redis crate's
//! cluster client, every call crosses two channels, two tasks and two
//! oneshots, builds a `Cmd` and a `Value` tree, and arms its own timer:
//! about 20 µs of stockgate's CPU per request (measured with perf and
//! benches/side_by_side), against ~1 µs of its own work. Here instead:
//!
//! - a **node pipe** per primary owns one connection. Callers hand it an
//!   encoded request; it writes everything waiting in one write, so many
//!   clients' requests to one node become one upstream pipeline (which also
//!   costs Redis less per command), and matches replies in order;
//! - replies are decoded with redis-protocol, without copying;
//! - one deadline timer per pipe: when the oldest request passes its
//!   deadline it is answered with a timeout, and its reply, if it ever
//!   comes, is dropped;
//! - the slot table maps each of the 16384 slots to its primary's pipe; it
//!   is read without a lock and rebuilt from CLUSTER SLOTS on every health
//!   check and after a redirect.
//!
//! Anything out of the ordinary (MOVED, ASK, TRYAGAIN, CLUSTERDOWN,
//! NOSCRIPT, READONLY, a connection lost mid-request) is not handled here:
//! the request goes again through the redis crate (see
//! [`crate::upstream`]), which owns redirects, retries and reconnection.
//! Sending it again is safe because the scripts are idempotent by
//! request_id: one that already ran answers 1.

use crate::keys::SLOTS;
use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::decode::decode_bytes_mut;
use redis_protocol::resp2::encode::encode_borrowed;
use redis_protocol::resp2::types::{BorrowedFrame, BytesFrame};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Most bytes one write carries; more waits for the next.
const MAX_BATCH: usize = 256 * 1024;

/// How the node pipes log in.
#[derive(Debug, Clone, Default)]
pub struct Login {
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
}

/// Why a call through a pipe got no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipeError {
    /// The deadline passed; the request may or may not have run.
    Timeout,
    /// No connection, or it was lost; the request may or may not have run.
    Lost,
}

struct Call {
    request: Bytes,
    deadline: Instant,
    reply: oneshot::Sender<Result<BytesFrame, PipeError>>,
}

/// One primary's pipelined connection, served by its own task.
pub struct NodePipe {
    addr: String,
    calls: mpsc::UnboundedSender<Call>,
}

impl NodePipe {
    fn start(addr: String, login: Login, connect_timeout: Duration) -> Arc<NodePipe> {
        let (calls, inbox) = mpsc::unbounded_channel();
        tokio::spawn(run(addr.clone(), login, connect_timeout, inbox));
        Arc::new(NodePipe { addr, calls })
    }

    async fn call(&self, request: Bytes, deadline: Instant) -> Result<BytesFrame, PipeError> {
        let (reply, answer) = oneshot::channel();
        let call = Call {
            request,
            deadline,
            reply,
        };
        if self.calls.send(call).is_err() {
            return Err(PipeError::Lost);
        }
        answer.await.unwrap_or(Err(PipeError::Lost))
    }
}

/// Which pipe serves each slot.
struct Routes {
    /// Index into `pipes` per slot; `u16::MAX` where no primary is known.
    owners: Vec<u16>,
    pipes: Vec<Arc<NodePipe>>,
}

/// The pipes and the slot table.
pub struct Pipelines {
    routes: ArcSwap<Routes>,
    login: Login,
    connect_timeout: Duration,
    /// Set when a reply said the slot table is stale.
    stale: AtomicBool,
}

impl Pipelines {
    pub fn new(login: Login, connect_timeout: Duration) -> Pipelines {
        Pipelines {
            routes: ArcSwap::from_pointee(Routes {
                owners: Vec::new(),
                pipes: Vec::new(),
            }),
            login,
            connect_timeout,
            stale: AtomicBool::new(false),
        }
    }

    /// Replaces the slot table. `ranges` are `(first, last, "host:port")`
    /// of each primary's slots; a standalone Redis is one range over all
    /// slots. Pipes to nodes that stay are kept, connection and all.
    pub fn set_routes(&self, ranges: &[(u16, u16, String)]) {
        let current = self.routes.load();
        let mut by_addr: HashMap<&str, usize> = HashMap::new();
        let mut pipes: Vec<Arc<NodePipe>> = Vec::new();
        let mut owners = vec![u16::MAX; SLOTS as usize];
        for (first, last, addr) in ranges {
            let index = *by_addr.entry(addr.as_str()).or_insert_with(|| {
                let pipe = current
                    .pipes
                    .iter()
                    .find(|p| p.addr == *addr)
                    .cloned()
                    .unwrap_or_else(|| {
                        NodePipe::start(addr.clone(), self.login.clone(), self.connect_timeout)
                    });
                pipes.push(pipe);
                pipes.len() - 1
            });
            for slot in *first..=(*last).min(SLOTS - 1) {
                owners[slot as usize] = index as u16;
            }
        }
        self.routes.store(Arc::new(Routes { owners, pipes }));
        self.stale.store(false, Ordering::Relaxed);
    }

    /// Marks the slot table stale (a MOVED said so); the next health check
    /// rebuilds it, or the caller does now.
    pub fn mark_stale(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }

    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed)
    }

    /// Sends `request` to the primary of `slot` and waits for its reply, at
    /// most until `deadline`. `Err(Lost)` when no pipe serves the slot yet.
    pub async fn call(
        &self,
        slot: u16,
        request: Bytes,
        deadline: Instant,
    ) -> Result<BytesFrame, PipeError> {
        let pipe = {
            let routes = self.routes.load();
            match routes.owners.get(slot as usize) {
                Some(&index) if index != u16::MAX => routes.pipes[index as usize].clone(),
                _ => return Err(PipeError::Lost),
            }
        };
        pipe.call(request, deadline).await
    }
}

/// Encodes a command of bulk strings (EVALSHA and its arguments).
pub fn encode_command(args: &[&[u8]]) -> Bytes {
    let mut frames: [BorrowedFrame<'_>; 12] = std::array::from_fn(|_| BorrowedFrame::Null);
    for (frame, arg) in frames.iter_mut().zip(args) {
        *frame = BorrowedFrame::BulkString(arg);
    }
    let command = BorrowedFrame::Array(&frames[..args.len().min(12)]);
    let mut buf = BytesMut::zeroed(command.encode_len(false));
    // Bulk strings in an array always encode; the buffer has the exact size.
    let written = encode_borrowed(&mut buf, &command, false).unwrap_or(0);
    buf.truncate(written);
    buf.freeze()
}

/// A request written but not yet answered.
struct InFlight {
    /// `None` once answered with a timeout: its late reply is dropped.
    reply: Option<oneshot::Sender<Result<BytesFrame, PipeError>>>,
    deadline: Instant,
}

/// A pipe's task: connect when there is work, serve until the connection
/// fails, fail what was in flight, and start over.
async fn run(
    addr: String,
    login: Login,
    connect_timeout: Duration,
    mut inbox: mpsc::UnboundedReceiver<Call>,
) {
    while let Some(first) = inbox.recv().await {
        let stream = match tokio::time::timeout(connect_timeout, connect(&addr, &login)).await {
            Ok(Ok(stream)) => stream,
            outcome => {
                tracing::debug!(%addr, ?outcome, "node pipe cannot connect");
                // Everything waiting now fails over to the slow path.
                let _ = first.reply.send(Err(PipeError::Lost));
                while let Ok(call) = inbox.try_recv() {
                    let _ = call.reply.send(Err(PipeError::Lost));
                }
                continue;
            }
        };
        if let Err(err) = serve(stream, first, &mut inbox).await {
            tracing::debug!(%addr, %err, "node pipe connection ended");
        }
    }
}

async fn connect(addr: &str, login: &Login) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let mut hello: Vec<Bytes> = Vec::new();
    if let Some(password) = &login.password {
        hello.push(match &login.username {
            Some(user) => encode_command(&[b"AUTH", user.as_bytes(), password.as_bytes()]),
            None => encode_command(&[b"AUTH", password.as_bytes()]),
        });
    }
    if login.db != 0 {
        hello.push(encode_command(&[
            b"SELECT",
            login.db.to_string().as_bytes(),
        ]));
    }
    if hello.is_empty() {
        return Ok(stream);
    }
    for command in &hello {
        stream.write_all(command).await?;
    }
    let mut buf = BytesMut::with_capacity(256);
    let mut answered = 0;
    while answered < hello.len() {
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        while let Some((frame, _, _)) = decode_bytes_mut(&mut buf).map_err(std::io::Error::other)? {
            if matches!(frame, BytesFrame::Error(_)) {
                return Err(std::io::Error::other("AUTH or SELECT refused"));
            }
            answered += 1;
        }
    }
    Ok(stream)
}

async fn serve(
    mut stream: TcpStream,
    first: Call,
    inbox: &mut mpsc::UnboundedReceiver<Call>,
) -> std::io::Result<()> {
    let (mut reader, mut writer) = stream.split();
    let mut in_flight: VecDeque<InFlight> = VecDeque::new();
    let mut output = BytesMut::new();
    let mut input = BytesMut::with_capacity(16 * 1024);
    let queue = |call: Call, output: &mut BytesMut, in_flight: &mut VecDeque<InFlight>| {
        output.extend_from_slice(&call.request);
        in_flight.push_back(InFlight {
            reply: Some(call.reply),
            deadline: call.deadline,
        });
    };
    queue(first, &mut output, &mut in_flight);
    // The inbox closes when the pipe leaves the slot table; what is in
    // flight is still answered.
    let mut closed = false;
    let result = loop {
        // Everything that arrived meanwhile goes out in this one write.
        while output.len() < MAX_BATCH {
            match inbox.try_recv() {
                Ok(call) => queue(call, &mut output, &mut in_flight),
                Err(_) => break,
            }
        }
        if !output.is_empty() {
            if let Err(err) = writer.write_all(&output).await {
                break Err(err);
            }
            output.clear();
        }
        if closed && in_flight.is_empty() {
            break Ok(());
        }
        let oldest = in_flight
            .iter()
            .find(|f| f.reply.is_some())
            .map(|f| f.deadline);
        tokio::select! {
            call = inbox.recv(), if !closed => match call {
                Some(call) => queue(call, &mut output, &mut in_flight),
                None => closed = true,
            },
            read = reader.read_buf(&mut input), if !in_flight.is_empty() => {
                match read {
                    Ok(0) => break Err(std::io::ErrorKind::UnexpectedEof.into()),
                    Ok(_) => {}
                    Err(err) => break Err(err),
                }
                if input.capacity() - input.len() < 4096 {
                    input.reserve(16 * 1024);
                }
                loop {
                    let frame = match decode_bytes_mut(&mut input) {
                        Ok(Some((frame, _, _))) => frame,
                        Ok(None) => break,
                        Err(err) => return fail(in_flight, Err(std::io::Error::other(err.to_string()))),
                    };
                    match in_flight.pop_front() {
                        Some(InFlight { reply: Some(reply), .. }) => {
                            let _ = reply.send(Ok(frame));
                        }
                        Some(InFlight { reply: None, .. }) => {}
                        None => return fail(in_flight, Err(std::io::Error::other("reply with no request"))),
                    }
                }
            }
            _ = tokio::time::sleep_until(oldest.unwrap_or_else(Instant::now)), if oldest.is_some() => {
                let now = Instant::now();
                for late in in_flight.iter_mut().filter(|f| f.deadline <= now) {
                    if let Some(reply) = late.reply.take() {
                        let _ = reply.send(Err(PipeError::Timeout));
                    }
                }
                // A node that answers nothing for a whole extra deadline is
                // gone (black-holed, stuck): start a fresh connection.
                let stuck = in_flight
                    .front()
                    .is_some_and(|f| now.duration_since(f.deadline) > Duration::from_secs(1));
                if stuck {
                    break Err(std::io::ErrorKind::TimedOut.into());
                }
            }
        }
    };
    fail(in_flight, result)
}

/// Answers everything still in flight: its outcome is unknown.
fn fail(in_flight: VecDeque<InFlight>, result: std::io::Result<()>) -> std::io::Result<()> {
    for waiting in in_flight {
        if let Some(reply) = waiting.reply {
            let _ = reply.send(Err(PipeError::Lost));
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_encode_as_arrays_of_bulk_strings() {
        let bytes = encode_command(&[b"EVALSHA", b"abc", b"2", b"k1", b"k2"]);
        assert_eq!(
            &bytes[..],
            b"*5\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n2\r\n$2\r\nk1\r\n$2\r\nk2\r\n"
        );
    }
}
