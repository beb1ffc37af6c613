//! The running proxy: listeners, the accept loop, and the graceful drain.
//!
//! [`start`] binds both listeners (only after the config is valid), starts
//! the upstream task, and returns a [`Server`] handle. Tests start one on
//! `127.0.0.1:0`, use it, and drain it; `main` does the same until a signal.

use crate::admin;
use crate::config::Config;
use crate::connection;
use crate::http;
use crate::metrics::Metrics;
use crate::state::Shared;
use crate::tls::ServerTls;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A running stockgate.
pub struct Server {
    /// Where clients connect (RESP).
    pub addr: SocketAddr,
    /// Where /metrics, /healthz and /readyz are served.
    pub admin_addr: SocketAddr,
    /// Where the HTTP/JSON API is served, if enabled.
    pub http_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    /// Stops accepting and tells connections to drain.
    drain: CancellationToken,
    /// Stops the upstream task and the admin server.
    stop: CancellationToken,
    connections: TaskTracker,
    background: TaskTracker,
}

/// Connections the kernel queues for `accept`. tokio's `bind` asks for
/// 128, and a sidecar restarted under load sees every client reconnect at
/// once: with 10,000 clients, 128 made connecting take 11-24 s (SYNs dropped
/// and retransmitted); the kernel caps this at net.core.somaxconn.
const LISTEN_BACKLOG: u32 = 4096;

fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds the listeners and starts serving.
pub async fn start(config: Config) -> io::Result<Server> {
    let listener = listen(config.listen).map_err(|e| {
        io::Error::new(e.kind(), format!("cannot listen on {}: {e}", config.listen))
    })?;
    let admin_listener = TcpListener::bind(config.admin_listen).await.map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot listen on {} (admin): {e}", config.admin_listen),
        )
    })?;
    let http_listener = match config.http_listen {
        Some(http) => Some(TcpListener::bind(http).await.map_err(|e| {
            io::Error::new(e.kind(), format!("cannot listen on {http} (http): {e}"))
        })?),
        None => None,
    };
    let addr = listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;
    let http_addr = match &http_listener {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };

    let tls = match &config.tls {
        Some(files) => Some(Arc::new(
            ServerTls::load(files.clone()).map_err(io::Error::other)?,
        )),
        None => None,
    };
    let shared = Arc::new(Shared::new(config, addr.port()));
    let upstream = shared.upstream.clone();
    let metrics = shared.metrics.clone();

    let drain = CancellationToken::new();
    let stop = CancellationToken::new();
    let connections = TaskTracker::new();
    let background = TaskTracker::new();
    background.spawn(upstream.maintain(stop.clone()));
    background.spawn(admin::serve(admin_listener, shared.clone(), stop.clone()));
    background.spawn(upkeep(metrics, stop.clone()));
    // Always: the passes recover the orders left behind, and sweep the
    // expired holds unless `--sweeper false`.
    {
        let shared = shared.clone();
        let stop = stop.clone();
        background.spawn(async move { crate::stock::sweeper::sweep(&shared.service, stop).await });
    }
    if let Some(tls) = &tls {
        background.spawn(tls.clone().watch(shared.metrics.clone(), stop.clone()));
    }
    if let Some(file) = &shared.config.users {
        background.spawn(reload_users(
            shared.clone(),
            file.path.clone(),
            stop.clone(),
        ));
    }
    if let Some(http_listener) = http_listener {
        // Tracked with the connections: the drain waits for its requests.
        connections.spawn(http::serve(
            crate::net::Bounded::new(http_listener, shared.config.http_max_connections),
            tls.clone(),
            shared.clone(),
            drain.clone(),
        ));
    }
    background.spawn(accept_loop(
        listener,
        tls,
        shared.clone(),
        drain.clone(),
        connections.clone(),
    ));
    tracing::info!(%addr, %admin_addr, http = %http_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()), "stockgate listening");
    Ok(Server {
        addr,
        admin_addr,
        http_addr,
        shared,
        drain,
        stop,
        connections,
        background,
    })
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    shared: Arc<Shared>,
    drain: CancellationToken,
    connections: TaskTracker,
) {
    // One permit per client connection; it goes back when the connection
    // ends. Past --max-clients a client is told so and closed, as Redis does.
    let permits = Arc::new(tokio::sync::Semaphore::new(shared.config.max_clients));
    let refusals = Arc::new(tokio::sync::Semaphore::new(REFUSALS));
    loop {
        let accepted = tokio::select! {
            _ = drain.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                // Replies are small and latency matters more than packet count.
                let _ = stream.set_nodelay(true);
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    // Refusals are bounded too: past REFUSALS at once, the
                    // one too many is closed without a word.
                    if let Ok(refusing) = refusals.clone().try_acquire_owned() {
                        let tls = tls.clone();
                        connections.spawn(async move {
                            refuse(stream, tls.as_deref()).await;
                            drop(refusing);
                        });
                    }
                    continue;
                };
                let shared = shared.clone();
                let drain = drain.clone();
                let tls = tls.clone();
                // The permit is held from the accept, through the TLS
                // handshake, to the close.
                connections.spawn(async move {
                    match tls {
                        None => connection::serve(stream, peer, shared, drain, None).await,
                        Some(tls) => serve_tls(&tls, stream, peer, shared, drain).await,
                    }
                    drop(permit);
                });
            }
            Err(err) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::warn!(%err, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    // Dropping the listener here refuses new connections during the drain.
}

/// Connections past `--max-clients` being told so at once, at most; each
/// takes at most [`REFUSAL_TIME`] (and, with TLS, its handshake).
const REFUSALS: usize = 64;
/// How long a refusal may take: its handshake, the error, the close.
const REFUSAL_TIME: Duration = Duration::from_secs(2);

/// A TLS connection on the RESP port: the handshake (within
/// [`crate::tls::HANDSHAKE_TIMEOUT`]), then the connection loop on the TLS
/// stream itself, logged in as its certificate's user if the certificate
/// names one.
async fn serve_tls(
    tls: &ServerTls,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    drain: CancellationToken,
) {
    let stream = match tls.accept(stream).await {
        Ok(stream) => stream,
        Err(err) => {
            tracing::debug!(%peer, %err, "TLS handshake failed");
            return;
        }
    };
    let login = crate::tls::client_name(&stream).and_then(|name| shared.users.certified(&name));
    connection::serve(stream, peer, shared, drain, login).await
}

/// Tells a client over --max-clients why, and closes: the error (over TLS
/// when the port is TLS, so the client can read it), then a half-close,
/// then whatever the client had already sent is read and dropped, so the
/// close is a FIN and not a reset that could destroy the error before the
/// client reads it. All of it within [`REFUSAL_TIME`].
async fn refuse(stream: tokio::net::TcpStream, tls: Option<&ServerTls>) {
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        match tls {
            None => say_refused(stream).await,
            Some(tls) => {
                if let Ok(stream) = tls.accept(stream).await {
                    say_refused(stream).await;
                }
            }
        }
    })
    .await;
}

async fn say_refused<T: crate::transport::Transport>(mut stream: T) {
    use tokio::io::AsyncWriteExt;
    let (mut reader, mut writer) = stream.split();
    let written = async {
        writer
            .write_all(b"-ERR max number of clients reached\r\n")
            .await?;
        writer.shutdown().await
    }
    .await;
    if written.is_ok() {
        crate::transport::discard_input(&mut reader, Duration::from_secs(1)).await;
    }
}

/// Re-reads `--users-file` on SIGHUP, and whenever its content changes:
/// it is read every second and compared whole, because a Kubernetes
/// Secret update swaps a symlink in the mounted directory, which the
/// file's path reads through while the file's own mtime need not change.
/// A file with a mistake (or that can't be read) is refused: the users
/// before it stay, it is logged (without a line of its text) and counted.
async fn reload_users(shared: Arc<Shared>, path: PathBuf, stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = signal(SignalKind::hangup())
        .map_err(|err| tracing::warn!(%err, "no SIGHUP handler: the users file reloads only when it changes"))
        .ok();
    // What the last reload read; at start, what the file holds now (the
    // users in place were read from it a moment ago).
    let mut seen = tokio::fs::read(&path).await.ok();
    loop {
        let hup = async {
            match &mut hangup {
                Some(hangup) => hangup.recv().await,
                None => std::future::pending().await,
            }
        };
        let forced = tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => false,
            Some(()) = hup => true,
        };
        let read = tokio::fs::read(&path).await;
        let unchanged = match (&read, &seen) {
            (Ok(now), Some(before)) => now == before,
            (Err(_), None) => true,
            _ => false,
        };
        if unchanged && !forced {
            continue;
        }
        seen = read.as_ref().ok().cloned();
        let applied = read
            .map_err(|err| err.to_string())
            .and_then(|bytes| {
                String::from_utf8(bytes).map_err(|_| "the file is not UTF-8".to_owned())
            })
            .and_then(|text| crate::auth::file::parse(&text))
            .and_then(|users| shared.users.replace(users));
        match applied {
            Ok(reloaded) => {
                shared.metrics.users_reloaded(true);
                let users = shared.users.list();
                shared
                    .metrics
                    .know_users(users.iter().map(|(name, _, _)| name.as_str()));
                tracing::info!(
                    file = %path.display(),
                    users = reloaded.users,
                    closed = ?reloaded.closed,
                    "users file reloaded"
                );
            }
            Err(error) => {
                shared.metrics.users_reloaded(false);
                tracing::warn!(
                    file = %path.display(),
                    %error,
                    "users file refused; the users before it stay"
                );
            }
        }
    }
}

/// Every few seconds: folds histogram samples into buckets, and, once
/// clients have left, hands the memory they freed back to the system.
async fn upkeep(metrics: Arc<Metrics>, stop: CancellationToken) {
    let mut trimmed_after = metrics.disconnects();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {
                metrics.run_upkeep();
                // What a trim returns is what departed clients' buffers
                // freed; while the same clients stay connected there is
                // nothing new to hand back, so no trim runs at all.
                let disconnects = metrics.disconnects();
                if disconnects != trimmed_after {
                    trimmed_after = disconnects;
                    // On a blocking-pool thread, never the runtime's: the
                    // runtime thread goes on serving meanwhile.
                    if let Ok(took) = tokio::task::spawn_blocking(release_free_memory).await {
                        tracing::debug!(
                            target: "stockgate::upkeep",
                            took_us = took.as_micros() as u64,
                            "returned freed memory to the system (malloc_trim)"
                        );
                    }
                }
            }
        }
    }
}

/// glibc keeps memory a burst of clients freed (measured: RSS stayed at
/// 63-67 MiB after 10,000 clients left, against an 8 MiB baseline);
/// malloc_trim returns it. It walks every arena, each under its lock, so
/// an allocation on the runtime thread can still wait for the trim of its
/// own arena, but the walk and the madvise calls run on this thread. How
/// long it took is returned, and logged at debug (`stockgate::upkeep`).
fn release_free_memory() -> Duration {
    let started = Instant::now();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it only walks the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
    started.elapsed()
}

impl Server {
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub fn is_ready(&self) -> bool {
        self.shared.is_ready()
    }

    /// Waits until the upstream is ready, or `within` passes.
    pub async fn wait_ready(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.is_ready() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.is_ready()
    }

    /// The fast stop: readiness off, listeners and connections dropped now,
    /// in-flight requests abandoned (their scripts still run or not, as
    /// Redis decides; callers retry with the same request_id).
    pub fn stop_now(self) {
        self.shared.draining.store(true, Ordering::Relaxed);
        self.drain.cancel();
        self.stop.cancel();
    }

    /// The graceful drain: readiness turns false, new connections are
    /// refused, every request already read is answered, then connections
    /// close. Returns false if `grace` ran out first (the rest are dropped).
    pub async fn drain(self, grace: Duration) -> bool {
        self.shared.draining.store(true, Ordering::Relaxed);
        self.drain.cancel();
        self.connections.close();
        let finished = tokio::time::timeout(grace, self.connections.wait())
            .await
            .is_ok();
        if !finished {
            tracing::warn!(
                open = self.shared.clients.load(Ordering::Relaxed),
                "shutdown grace ran out; closing the remaining connections"
            );
        }
        self.stop.cancel();
        self.background.close();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.background.wait()).await;
        finished
    }
}
