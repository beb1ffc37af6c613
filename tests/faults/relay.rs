//! A fault-injecting TCP relay, placed in front of one Redis node (which
//! then announces the relay's port, so every cluster client goes through
//! it). Its modes act like a network does, never like something TCP can't
//! do: bytes are delayed or held, never dropped from the middle of a live
//! stream (that would misalign a pipelined client's replies, a fault no
//! real network produces). A connection is cut whole.
//!
//! - [`Mode::Pass`]: forward both ways.
//! - [`Mode::Delay`]: hold every chunk for a while before forwarding it.
//! - [`Mode::Blackhole`]: forward nothing, either way, and open no new
//!   upstream connection (held bytes flow again on [`Mode::Pass`]), as a
//!   partition that heals before TCP gives up.
//! - [`Mode::Partition`]: clients pass, but a replica's replication link
//!   (a connection that sent REPLCONF or PSYNC) is cut, and cut again each
//!   time the replica reconnects: the primary goes on acknowledging writes
//!   its replica never gets.
//! - [`Mode::Freeze`]: stop reading, either way, as a frozen host or a
//!   node whose receive window is shut does: the sender's socket buffers
//!   fill and its writes block (a black hole reads and holds; this does
//!   not read at all). Reading resumes on [`Mode::Pass`].
//! - [`Mode::LoseReplies`]: requests pass; once a script call (FCALL, EVAL
//!   or EVALSHA) has gone to the node on a connection, the next reply bytes
//!   that come back are thrown away with the connection: the command ran,
//!   its reply was lost. (Other replies pass, so a client's handshake on a
//!   new connection still works and its retry reaches Redis again.)
//! - [`Mode::LoseOneReply`]: [`Mode::LoseReplies`] for one script reply
//!   only, then [`Mode::Pass`]: the connection that carried a command is
//!   cut after the command ran, and the next one gets through.
//! - [`Mode::StickFlows`]: every connection open when it is set stops
//!   reading, either way, **for good**: no later mode resumes it. Those
//!   opened later pass, now and under any later mode but the others'
//!   faults. A black-holed flow, as a dropped conntrack or NAT entry or a
//!   firewall that silently discards makes one: the peers' kernels keep
//!   the connection, nothing on it moves again, and a new connection
//!   works. Only a client that gives the stuck connection up is served
//!   again. (Unlike [`Mode::Freeze`], which stops every connection, new
//!   ones too, and resumes them all on [`Mode::Pass`].)

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Delay(Duration),
    Blackhole,
    Freeze,
    Partition,
    LoseReplies,
    LoseOneReply,
    StickFlows,
}

/// What went through, for checking that clients really use the relay.
#[derive(Debug, Default)]
pub struct Stats {
    pub accepted: AtomicU64,
    pub bytes_to_node: AtomicU64,
    pub bytes_to_client: AtomicU64,
    pub replies_lost: AtomicU64,
    /// Set once [`Mode::LoseOneReply`] has cut its one reply.
    pub one_reply_lost: AtomicBool,
    /// Connections [`Mode::StickFlows`] has stuck for good.
    pub flows_stuck: AtomicU64,
}

pub struct Relay {
    pub port: u16,
    pub stats: Arc<Stats>,
    mode: watch::Sender<Mode>,
    flows: Arc<Flows>,
    stop: CancellationToken,
}

/// Numbers the connections in the order they open, and tells which of
/// them [`Mode::StickFlows`] stuck: every one numbered below `stuck_below`.
#[derive(Default)]
struct Flows {
    opened: AtomicU64,
    stuck_below: AtomicU64,
}

impl Flows {
    fn is_stuck(&self, flow: u64) -> bool {
        flow < self.stuck_below.load(Ordering::SeqCst)
    }
}

impl Relay {
    /// Listens on a free loopback port and relays to `target`.
    pub async fn start(target: SocketAddr) -> Relay {
        Relay::start_with_window(target, None).await
    }

    /// [`Relay::start`], with the receive buffer of the relay's client side
    /// set to `window` bytes: a small window fills in a fraction of a
    /// second once the relay stops reading, as a slow or frozen node's
    /// does, instead of the megabytes loopback's autotuning grows to.
    pub async fn start_with_window(target: SocketAddr, window: Option<u32>) -> Relay {
        let socket = tokio::net::TcpSocket::new_v4().expect("relay socket");
        if let Some(window) = window {
            socket.set_recv_buffer_size(window).expect("SO_RCVBUF");
        }
        socket
            .bind("127.0.0.1:0".parse().unwrap())
            .expect("bind relay");
        let listener = socket.listen(1024).expect("listen");
        let port = listener.local_addr().expect("addr").port();
        let (mode, _) = watch::channel(Mode::Pass);
        let stats = Arc::new(Stats::default());
        let flows = Arc::new(Flows::default());
        let stop = CancellationToken::new();
        let relay = Relay {
            port,
            stats: stats.clone(),
            mode: mode.clone(),
            flows: flows.clone(),
            stop: stop.clone(),
        };
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = stop.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((client, _)) = accepted else { continue };
                stats.accepted.fetch_add(1, Ordering::Relaxed);
                let flow = flows.opened.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(relay_one(
                    client,
                    target,
                    mode.subscribe(),
                    stats.clone(),
                    (flows.clone(), flow),
                    stop.child_token(),
                ));
            }
        });
        relay
    }

    pub fn set(&self, mode: Mode) {
        if mode == Mode::StickFlows {
            // Before the mode changes, so each flow open now finds itself
            // stuck when the change wakes it.
            let opened = self.flows.opened.load(Ordering::SeqCst);
            self.flows.stuck_below.fetch_max(opened, Ordering::SeqCst);
        }
        self.mode.send_replace(mode);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn relay_one(
    client: TcpStream,
    target: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    stats: Arc<Stats>,
    flow: (Arc<Flows>, u64),
    cut: CancellationToken,
) {
    // A blackhole answers no SYN: hold the client until it heals.
    if mode.wait_for(|m| *m != Mode::Blackhole).await.is_err() {
        return;
    }
    let Ok(node) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = node.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (node_read, node_write) = node.into_split();
    let script_sent = Arc::new(AtomicBool::new(false));
    let replication = Arc::new(AtomicBool::new(false));
    let up = pump(
        client_read,
        node_write,
        mode.clone(),
        stats.clone(),
        (cut.clone(), script_sent.clone(), replication.clone()),
        flow.clone(),
        Direction::ToNode,
    );
    let down = pump(
        node_read,
        client_write,
        mode,
        stats,
        (cut.clone(), script_sent, replication),
        flow,
        Direction::ToClient,
    );
    // Either side ending (or a cut) ends the connection: dropping both
    // halves closes both sockets.
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut.cancelled() => {}
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToNode,
    ToClient,
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    stats: Arc<Stats>,
    (cut, script_sent, replication): (CancellationToken, Arc<AtomicBool>, Arc<AtomicBool>),
    (flows, flow): (Arc<Flows>, u64),
    direction: Direction,
) {
    // The reader stamps each chunk with when it may leave; the writer sends
    // it then. So Delay adds latency without limiting throughput, and order
    // is kept.
    let (queue, mut queued) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let counter = stats.clone();
    let writer = async move {
        while let Some((due, chunk)) = queued.recv().await {
            tokio::time::sleep_until(due.into()).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
            let bytes = match direction {
                Direction::ToNode => &counter.bytes_to_node,
                Direction::ToClient => &counter.bytes_to_client,
            };
            bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let partitioned = |m: &Mode| *m == Mode::Partition && replication.load(Ordering::SeqCst);
        loop {
            // Stuck: no read ever again (the relay's end of the flow stays
            // open until the relay is dropped).
            if flows.is_stuck(flow) {
                if direction == Direction::ToNode {
                    stats.flows_stuck.fetch_add(1, Ordering::Relaxed);
                }
                std::future::pending::<()>().await;
            }
            // Frozen: no read at all, so the peer's window closes.
            if *mode.borrow() == Mode::Freeze
                && mode.wait_for(|m| *m != Mode::Freeze).await.is_err()
            {
                return;
            }
            let n = tokio::select! {
                read = from.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                changed = mode.changed() => {
                    if changed.is_err() || partitioned(&mode.borrow_and_update()) {
                        cut.cancel();
                        return;
                    }
                    continue;
                }
            };
            if direction == Direction::ToNode
                && [&b"REPLCONF"[..], b"PSYNC"].iter().any(|word| {
                    buf[..n]
                        .windows(word.len())
                        .any(|w| w.eq_ignore_ascii_case(word))
                })
            {
                replication.store(true, Ordering::SeqCst);
            }
            // Hold the bytes while the hole lasts; they flow again on Pass.
            let current = match mode.wait_for(|m| *m != Mode::Blackhole).await {
                Ok(m) => *m,
                Err(_) => return,
            };
            if partitioned(&current) {
                cut.cancel();
                return;
            }
            let losing = match current {
                Mode::LoseReplies => true,
                Mode::LoseOneReply => !stats.one_reply_lost.load(Ordering::SeqCst),
                _ => false,
            };
            let due = match current {
                _ if losing
                    && direction == Direction::ToClient
                    && script_sent.load(Ordering::SeqCst) =>
                {
                    if current == Mode::LoseOneReply
                        && stats.one_reply_lost.swap(true, Ordering::SeqCst)
                    {
                        // Another connection took the one loss first.
                        Instant::now()
                    } else {
                        stats.replies_lost.fetch_add(1, Ordering::Relaxed);
                        cut.cancel();
                        return;
                    }
                }
                _ if losing
                    && direction == Direction::ToNode
                    && (buf[..n].windows(4).any(|w| w.eq_ignore_ascii_case(b"EVAL"))
                        || buf[..n]
                            .windows(5)
                            .any(|w| w.eq_ignore_ascii_case(b"FCALL"))) =>
                {
                    script_sent.store(true, Ordering::SeqCst);
                    Instant::now()
                }
                Mode::Delay(d) => Instant::now() + d,
                _ => Instant::now(),
            };
            if queue.send((due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    // The writer ends when the reader (and so the queue) is gone and the
    // queue is drained.
    tokio::join!(reader, writer);
}
