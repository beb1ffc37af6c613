//! TLS to the books' database: what a `--database` URL asks for, in the
//! database's own words (libpq's `sslmode` for PostgreSQL, the MySQL
//! client's `ssl-mode` for MySQL and MariaDB), and the rustls client
//! configuration that does it.
//!
//! Three things are checked or not, by mode:
//!
//! | mode | encrypted | the server's chain | its name |
//! |---|---|---|---|
//! | disable | no | - | - |
//! | prefer | when the server offers it | no | no |
//! | require | yes | only against roots named for it (libpq) | no |
//! | verify-ca | yes | yes | no |
//! | verify-full | yes | yes | yes |
//!
//! The roots are a PEM file or the system's trust store, never both: a
//! verify-ca that also trusted every public CA would accept any
//! certificate a public CA ever signed, whatever name it bears.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How much of TLS a connection insists on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plaintext.
    Disable,
    /// TLS when the server offers it, plaintext when it does not; the
    /// certificate is not checked.
    Prefer,
    /// TLS or no connection. The certificate is checked against roots
    /// only when roots were named (libpq's meaning of `require`).
    Require,
    /// TLS, the server's certificate chain checked against the roots,
    /// whatever host name it bears.
    VerifyCa,
    /// TLS, the chain checked and the certificate's names matched against
    /// the host connected to.
    VerifyFull,
}

/// What the server's certificate must chain to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roots {
    /// The CA certificates of a PEM file (`sslrootcert=<file>`, `ssl-ca=<file>`).
    File(PathBuf),
    /// The operating system's trust store (`sslrootcert=system`,
    /// `ssl-ca=system`): for a server whose certificate a public CA signed.
    System,
}

/// A client certificate and its key, PEM files, presented when the server
/// asks for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A URL's TLS settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: TlsMode,
    /// None under `require` means: encrypted, not verified.
    pub roots: Option<Roots>,
    pub client: Option<ClientCert>,
}

/// How much of the server's certificate is checked.
#[derive(Debug)]
pub enum Check {
    Nothing,
    Chain(RootCertStore),
    ChainAndName(RootCertStore),
}

impl TlsSettings {
    /// The mode as logs show it.
    pub fn describe(&self) -> String {
        let mode = match self.mode {
            TlsMode::Disable => return "no TLS".into(),
            TlsMode::Prefer => "TLS if offered, unverified",
            TlsMode::Require if self.roots.is_some() => "TLS, the chain verified",
            TlsMode::Require => "TLS, unverified",
            TlsMode::VerifyCa => "TLS, the chain verified",
            TlsMode::VerifyFull => "TLS, the chain and host name verified",
        };
        match &self.client {
            Some(_) => format!("{mode}, with a client certificate"),
            None => mode.into(),
        }
    }

    /// What to check of the server's certificate, its roots read.
    pub fn check(&self) -> Result<Check, String> {
        let roots = || match &self.roots {
            Some(roots) => load_roots(roots),
            None => Err("no roots to verify the server's certificate against".into()),
        };
        Ok(match self.mode {
            TlsMode::Disable | TlsMode::Prefer => Check::Nothing,
            TlsMode::Require if self.roots.is_none() => Check::Nothing,
            TlsMode::Require | TlsMode::VerifyCa => Check::Chain(roots()?),
            TlsMode::VerifyFull => Check::ChainAndName(roots()?),
        })
    }

    /// The client certificate's chain and key, read, when one is set.
    pub fn client_identity(
        &self,
    ) -> Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>, String> {
        let Some(client) = &self.client else {
            return Ok(None);
        };
        let chain = read_certs(&client.cert)?;
        let key = PrivateKeyDer::from_pem_file(&client.key)
            .map_err(|e| format!("client key {}: {e}", client.key.display()))?;
        Ok(Some((chain, key)))
    }

    /// The rustls configuration for these settings (for any mode but
    /// `disable`, which needs none).
    pub fn client_config(&self) -> Result<ClientConfig, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let algorithms = provider.signature_verification_algorithms;
        let verifier: Arc<dyn ServerCertVerifier> = match self.check()? {
            Check::Nothing => Arc::new(Lenient {
                chain: None,
                algorithms,
            }),
            Check::Chain(roots) => Arc::new(Lenient {
                chain: Some(roots),
                algorithms,
            }),
            Check::ChainAndName(roots) => {
                rustls::client::WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider.clone(),
                )
                .build()
                .map_err(|e| e.to_string())?
            }
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        match self.client_identity()? {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("the client certificate and key: {e}")),
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

/// The CA certificates of `roots`, as a store.
pub fn load_roots(roots: &Roots) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(root_certs(roots)?);
    if added == 0 {
        return Err(match roots {
            Roots::File(path) => format!("{}: no usable CA certificate in it", path.display()),
            Roots::System => "no usable CA certificate in the system's trust store".into(),
        });
    }
    Ok(store)
}

/// The CA certificates of `roots`.
pub fn root_certs(roots: &Roots) -> Result<Vec<CertificateDer<'static>>, String> {
    match roots {
        Roots::File(path) => read_certs(path),
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                return Err(format!(
                    "no root certificates in the system's trust store ({}); install the \
                     ca-certificates package, or name the server's CA file",
                    found
                        .errors
                        .first()
                        .map_or("none found".to_owned(), |e| e.to_string())
                ));
            }
            Ok(found.certs)
        }
    }
}

/// Every certificate of a PEM file, at least one.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// The modes that check less than rustls's own verifier, which always
/// matches the name. Without roots (`prefer`, `require` without a root
/// certificate): encrypted against a passive listener, not an active one.
/// With roots (verify-ca): the chain to the roots, validity dates
/// included, and no name. Either way the handshake's signatures are
/// checked (the server holds the key of the certificate it sent).
#[derive(Debug)]
struct Lenient {
    chain: Option<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.chain {
            let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
