//! Certificates for the TLS tests, made with the `openssl` command in a
//! temp dir: a CA, a second CA nobody trusts, a server certificate signed
//! by the first (for `localhost` only by default, so that `127.0.0.1` is
//! "another host name" to the books' tests), and a client certificate for
//! the user `certuser`; [`Certs::client`] makes more client certificates.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The user whose client certificate this makes (its CN).
pub const CLIENT_USER: &str = "certuser";

pub struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    pub fn make() -> Certs {
        Certs::for_server("DNS:localhost")
    }

    /// The same, the server certificate for `name` (a subjectAltName:
    /// `DNS:<host>` or `IP:<address>`).
    pub fn for_server(name: &str) -> Certs {
        let dir = tempfile::Builder::new()
            .prefix("stockgate-certs-")
            .tempdir()
            .expect("a temp dir");
        let openssl = |args: &[&str]| openssl(dir.path(), args);
        for ca in ["ca", "other-ca"] {
            openssl(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.crt"),
                "-days",
                "2",
                "-subj",
                &format!("/CN=stockgate test {ca}"),
            ]);
        }
        // v3 extensions on both: rustls refuses X.509 v1 certificates.
        std::fs::write(
            dir.path().join("server.cnf"),
            format!("subjectAltName={name}\nextendedKeyUsage=serverAuth\n"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("client.cnf"),
            "extendedKeyUsage=clientAuth\n",
        )
        .unwrap();
        for (name, cn) in [("server", "localhost"), ("client", CLIENT_USER)] {
            sign(dir.path(), name, cn);
        }
        Certs { dir }
    }

    /// One more client certificate the CA signs, `<name>.crt` and
    /// `<name>.key`, with `cn` as its subject's common name and `dns` as
    /// its one subject alternative name.
    pub fn client(&self, name: &str, cn: &str, dns: &str) {
        std::fs::write(
            self.path(&format!("{name}.cnf")),
            format!("subjectAltName=DNS:{dns}\nextendedKeyUsage=clientAuth\n"),
        )
        .unwrap();
        sign(self.dir(), name, cn);
    }

    /// The CA as a Java truststore (`truststore.p12`, made by keytool) and
    /// the `client` certificate with its key as a keystore
    /// (`client.p12`, by openssl), both PKCS12 under `password`.
    pub fn java_stores(&self, password: &str) -> (PathBuf, PathBuf) {
        let out = Command::new("keytool")
            .args([
                "-importcert",
                "-noprompt",
                "-alias",
                "stockgate-test-ca",
                "-file",
                "ca.crt",
                "-storetype",
                "PKCS12",
                "-keystore",
                "truststore.p12",
                "-storepass",
                password,
            ])
            .current_dir(self.dir())
            .output()
            .unwrap_or_else(|e| {
                panic!("keytool is needed ({e}): install a JDK 17+ (Debian: apt-get install -y openjdk-17-jdk-headless)")
            });
        assert!(
            out.status.success(),
            "keytool: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        openssl(
            self.dir(),
            &[
                "pkcs12",
                "-export",
                "-in",
                "client.crt",
                "-inkey",
                "client.key",
                "-out",
                "client.p12",
                "-passout",
                &format!("pass:{password}"),
            ],
        );
        (self.path("truststore.p12"), self.path("client.p12"))
    }

    /// A file of it: `ca.crt`, `other-ca.crt`, `server.crt`, `server.key`,
    /// `client.crt`, `client.key`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A file's path as a URL parameter's value.
    pub fn param(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }

    /// A rustls client that trusts this CA and presents the client
    /// certificate `<client>.crt` (`client` is the one made for
    /// [`CLIENT_USER`]).
    pub fn tls_client(&self, client: &str) -> tokio_rustls::TlsConnector {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(self.path("ca.crt")).unwrap())
            .unwrap();
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_file(self.path(&format!("{client}.crt"))).unwrap()],
            PrivateKeyDer::from_pem_file(self.path(&format!("{client}.key"))).unwrap(),
        )
        .unwrap();
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
    }
}

/// A TLS connection to a server on 127.0.0.1:`port` whose certificate is
/// for `IP:127.0.0.1` ([`Certs::for_server`]).
pub async fn connect_tls(
    tls: &tokio_rustls::TlsConnector,
    port: u16,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name = rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    tls.connect(name, tcp).await
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "openssl is needed ({e}): deploy/install-deps.sh test (Debian: apt-get install -y openssl)"
            )
        });
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A key and a certificate `<name>.crt` for `cn`, signed by `ca.crt`, with
/// the extensions in `<name>.cnf`.
fn sign(dir: &Path, name: &str, cn: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.cnf"),
        ],
    )
}
