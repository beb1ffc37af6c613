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
use crate::net::{Bounded, Counted};
use crate::transport::{READ_CHUNK, Reader, Transport, make_room};
use arc_swap::ArcSwap;
use bytes::BytesMut;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{ReadBuf, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// How long a client has to finish its handshake; its connection counts
/// against `--max-clients` meanwhile.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
    handshaken: tokio::sync::mpsc::Receiver<(Counted<TlsStream<TcpStream>>, std::net::SocketAddr)>,
    local: std::net::SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener` until `stop`, handing on each connection
    /// whose handshake succeeds. A connection keeps its place among the
    /// listener's from its accept, its handshake included.
    pub fn new(
        listener: Bounded,
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
                let (stream, place) = stream.into_parts();
                tokio::spawn(async move {
                    match tls.accept(stream).await {
                        Ok(stream) => {
                            let _ = done.send((Counted::new(stream, place), peer)).await;
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
    type Io = Counted<TlsStream<TcpStream>>;
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

/// A TLS connection on the RESP port is served by the connection loop
/// itself, over the one socket the client connected (see
/// [`crate::transport`]).
impl Transport for TlsStream<TcpStream> {
    type Reader<'a> = ReadHalf<&'a mut TlsStream<TcpStream>>;
    type Writer<'a> = WriteHalf<&'a mut TlsStream<TcpStream>>;
    // rustls keeps what the socket could not take yet until a flush.
    const BUFFERS_WRITES: bool = true;

    fn split(&mut self) -> (Self::Reader<'_>, Self::Writer<'_>) {
        tokio::io::split(self)
    }
}

impl Reader for ReadHalf<&mut TlsStream<TcpStream>> {
    fn poll_fill(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        use tokio::io::AsyncRead;
        if buf.capacity() - buf.len() >= READ_CHUNK / 4 {
            return tokio_util::io::poll_read_buf(Pin::new(self), cx, buf);
        }
        // No room yet: decrypt onto the stack, and take room in `buf` only
        // once something came, so an idle connection holds no buffer.
        let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); READ_CHUNK];
        let mut read = ReadBuf::uninit(&mut chunk);
        ready!(Pin::new(self).poll_read(cx, &mut read))?;
        let read = read.filled();
        if !read.is_empty() {
            make_room(buf);
            buf.extend_from_slice(read);
        }
        Poll::Ready(Ok(read.len()))
    }

    /// What rustls holds decrypted, and what the socket's readiness says is
    /// there. (Unlike a plain socket's, this read goes through tokio's
    /// readiness: bytes that arrived in the instant before the reactor saw
    /// them are left for the client to send again, with the same
    /// request_id, after the drain closes its connection.)
    fn fill_now(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self.poll_fill(&mut cx, buf) {
            Poll::Ready(read) => read,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}
