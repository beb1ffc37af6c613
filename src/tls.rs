//! TLS on stockgate's own listeners (RESP and HTTP): `--tls-cert` and
//! `--tls-key`, and with `--tls-client-ca` client certificates (mTLS).
//!
//! TLS 1.2 and 1.3 only (rustls's safe defaults, over ring). The
//! certificate, key and client CA are read again whenever one of the files'
//! content changes (read every second and compared whole, as the users
//! file is: cert-manager and a Kubernetes Secret update replace them by a
//! symlink swap). A new connection gets the newest configuration; one open
//! already keeps the session it has. A set of files that does not load
//! (a key that is not the certificate's, a half-written file) leaves the
//! last good one in place, logged and counted.
//!
//! With `--tls-client-ca`, a client must present a certificate that CA
//! signed. Its name (the first DNS name of its subject alternative names,
//! else its subject's common name), when it names a user of
//! `--users-file`, logs the connection in as that user, without AUTH.

use crate::config::ListenerTls;
use crate::metrics::Metrics;
use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// How long a client has to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The listeners' TLS configuration, replaced when its files change.
pub struct ServerTls {
    files: ListenerTls,
    current: ArcSwap<ServerConfig>,
}

/// The files' contents, as last read.
type Contents = Vec<Vec<u8>>;

impl ServerTls {
    /// Reads the files; refused with the reason (never a key's bytes).
    pub fn load(files: ListenerTls) -> Result<ServerTls, String> {
        let (config, _) = build(&files)?;
        Ok(ServerTls {
            files,
            current: ArcSwap::from(config),
        })
    }

    /// The handshake of one accepted connection, with the newest
    /// configuration, within [`HANDSHAKE_TIMEOUT`].
    pub async fn accept(&self, stream: TcpStream) -> io::Result<TlsStream<TcpStream>> {
        let acceptor = TlsAcceptor::from(self.current.load_full());
        tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))?
    }

    /// Reads the files every second; when their content changed, loads
    /// them in place of the configuration before.
    pub async fn watch(self: Arc<Self>, metrics: Arc<Metrics>, stop: CancellationToken) {
        let mut seen = read_all(&self.files).ok();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            let read = read_all(&self.files);
            let unchanged = match (&read, &seen) {
                (Ok(now), Some(before)) => now == before,
                (Err(_), None) => true,
                _ => false,
            };
            if unchanged {
                continue;
            }
            seen = read.as_ref().ok().cloned();
            match read.and_then(|contents| config_of(&self.files, &contents)) {
                Ok(config) => {
                    self.current.store(config);
                    metrics.tls_reloaded(true);
                    tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                }
                Err(error) => {
                    metrics.tls_reloaded(false);
                    tracing::warn!(%error, "TLS files refused; the certificate before them stays");
                }
            }
        }
    }
}

fn read_all(files: &ListenerTls) -> Result<Contents, String> {
    files
        .paths()
        .map(|path| std::fs::read(path).map_err(|e| format!("{}: {e}", path.display())))
        .collect()
}

fn build(files: &ListenerTls) -> Result<(Arc<ServerConfig>, Contents), String> {
    let contents = read_all(files)?;
    Ok((config_of(files, &contents)?, contents))
}

/// The rustls configuration of the files' `contents` (cert, key, then
/// the client CA if any, as [`ListenerTls::paths`] lists them).
fn config_of(files: &ListenerTls, contents: &Contents) -> Result<Arc<ServerConfig>, String> {
    let chain = CertificateDer::pem_slice_iter(&contents[0])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--tls-cert {}: {e}", files.cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--tls-cert {}: no PEM certificate in it",
            files.cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&contents[1])
        .map_err(|e| format!("--tls-key {}: {e}", files.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&contents[2]) {
                let cert = cert.map_err(|e| format!("--tls-client-ca {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("--tls-client-ca {}: {e}", path.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| format!("--tls-client-ca {}: {e}", path.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("--tls-cert and --tls-key: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The name a verified client certificate gives: its first DNS name among
/// the subject alternative names, else its subject's common name.
pub fn client_name(stream: &TlsStream<TcpStream>) -> Option<String> {
    let cert = stream.get_ref().1.peer_certificates()?.first()?;
    name_of(cert)
}

fn name_of(cert: &CertificateDer<'_>) -> Option<String> {
    use x509_cert::der::Decode;
    use x509_cert::ext::pkix::SubjectAltName;
    use x509_cert::ext::pkix::name::GeneralName;
    let cert = x509_cert::Certificate::from_der(cert).ok()?;
    if let Ok(Some((_, san))) = cert.tbs_certificate.get::<SubjectAltName>() {
        let dns = san.0.iter().find_map(|name| match name {
            GeneralName::DnsName(dns) => Some(dns.as_str().to_owned()),
            _ => None,
        });
        if dns.is_some() {
            return dns;
        }
    }
    let common_name = x509_cert::der::oid::db::rfc4519::CN;
    cert.tbs_certificate
        .subject
        .0
        .iter()
        .flat_map(|rdn| rdn.0.iter())
        .find(|atv| atv.oid == common_name)
        .and_then(|atv| {
            atv.value
                .decode_as::<x509_cert::der::asn1::Utf8StringRef<'_>>()
                .map(|s| s.as_str().to_owned())
                .or_else(|_| {
                    atv.value
                        .decode_as::<x509_cert::der::asn1::PrintableStringRef<'_>>()
                        .map(|s| s.as_str().to_owned())
                })
                .ok()
        })
}

/// A listener whose connections are TLS, for the HTTP face (axum's
/// [`axum::serve::Listener`]). Each handshake runs in a task of its own, so
/// a slow client never holds up the others' accepts.
pub struct TlsListener {
    handshaken: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, std::net::SocketAddr)>,
    local: std::net::SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener` until `stop`, handing on each connection
    /// whose handshake succeeds.
    pub fn new(
        listener: tokio::net::TcpListener,
        tls: Arc<ServerTls>,
        stop: CancellationToken,
    ) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (done, handshaken) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    _ = stop.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(err) => {
                            tracing::warn!(%err, "accept failed (http)");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let (tls, done) = (tls.clone(), done.clone());
                tokio::spawn(async move {
                    match tls.accept(stream).await {
                        Ok(stream) => {
                            let _ = done.send((stream, peer)).await;
                        }
                        Err(err) => tracing::debug!(%peer, %err, "TLS handshake failed (http)"),
                    }
                });
            }
        });
        Ok(TlsListener { handshaken, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(accepted) => accepted,
            // The accept task stopped: no connection will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// A TLS connection on the RESP port, handed to the connection loop as
/// a plain loopback TCP stream: the loop reads its socket directly (its
/// own readiness and `recv`), so the decrypted bytes are relayed to it
/// through a loopback pair made for this connection alone, with the
/// client's own address and certificate name kept beside.
pub async fn relay(stream: TlsStream<TcpStream>) -> io::Result<TcpStream> {
    use tokio::io::AsyncWriteExt;
    let pair = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let near = TcpStream::connect(pair.local_addr()?).await?;
    let (far, _) = pair.accept().await?;
    drop(pair);
    let _ = near.set_nodelay(true);
    let _ = far.set_nodelay(true);
    tokio::spawn(async move {
        let (mut client_reads, mut client_writes) = tokio::io::split(stream);
        let (mut loop_reads, mut loop_writes) = near.into_split();
        let requests = async {
            let _ = tokio::io::copy(&mut client_reads, &mut loop_writes).await;
            let _ = loop_writes.shutdown().await;
        };
        let replies = async {
            let _ = tokio::io::copy(&mut loop_reads, &mut client_writes).await;
            let _ = client_writes.shutdown().await;
        };
        tokio::pin!(requests);
        tokio::pin!(replies);
        tokio::select! {
            // The client is done sending: the replies still go out, until
            // the connection loop closes.
            () = &mut requests => replies.await,
            // The connection loop closed (QUIT, a user removed, the
            // drain): what the client still sends is read for a moment,
            // as the loop itself lingers, then the connection is dropped.
            () = &mut replies => {
                let _ = tokio::time::timeout(RELAY_LINGER, requests).await;
            }
        }
    });
    Ok(far)
}

/// How long a relay whose connection loop has closed keeps reading what
/// the client still sends before it drops the connection.
const RELAY_LINGER: Duration = Duration::from_secs(1);
