//! Where the books are: the `--database` URL, read and checked before
//! anything connects, so a wrong setting stops the sink at its start
//! instead of in its first round.
//!
//! A URL that asks for TLS never falls back to plaintext, and a URL that
//! says nothing about TLS is taken as libpq takes it (`prefer`) only for a
//! database on this machine: to any other host it is refused, since a
//! silent choice either way (plaintext, or TLS that checks nothing) is one
//! an operator should make on purpose. docs/books.md says so.

use super::tls::{ClientCert, Roots, TlsMode, TlsSettings};
use crate::redact::redact;
use std::net::IpAddr;
use std::path::PathBuf;

/// The longest MySQL database name the sinks' lock names (GET_LOCK's, 64
/// bytes at most: `journal::database::mysql`) have room for.
pub const MOST_DATABASE_NAME: usize = 46;

/// A `--database` URL, checked.
#[derive(Debug, Clone)]
pub enum Target {
    Postgres(PgTarget),
    Mysql(MysqlTarget),
}

/// A PostgreSQL URL: tokio-postgres's configuration without the TLS
/// parameters, which stockgate reads itself (tokio-postgres knows
/// `disable`, `prefer` and `require` only).
#[derive(Debug, Clone)]
pub struct PgTarget {
    pub config: tokio_postgres::Config,
    pub tls: TlsSettings,
    /// `--database-schema`: the tables' schema, and the lock keys'.
    pub schema: Option<String>,
    shown: String,
}

impl Target {
    /// Reads `url`: `postgres://` or `postgresql://`; `mysql://` or
    /// `mariadb://` (the same protocol).
    pub fn parse(url: &str) -> Result<Target, String> {
        crate::redact::check_userinfo(url).map_err(|why| format!("{}: {why}", redact(url)))?;
        let scheme = url.split_once("://").map(|(scheme, _)| scheme);
        match scheme {
            Some("postgres" | "postgresql") => {
                crate::redact::check_single_at(url)
                    .map_err(|why| format!("{}: {why}", redact(url)))?;
                PgTarget::parse(url).map(Target::Postgres)
            }
            Some("mysql" | "mariadb") => MysqlTarget::parse(url).map(Target::Mysql),
            _ => Err(format!(
                "{} is not a database URL stockgate reads: postgres://user[:password]@host[:port]/dbname[?sslmode=...] \
                 or mysql://user[:password]@host[:port]/dbname[?ssl-mode=...] (mariadb:// alike)",
                redact(url)
            )),
        }
    }

    /// The URL with its password masked, for logs and errors.
    pub fn shown(&self) -> &str {
        match self {
            Target::Postgres(pg) => &pg.shown,
            Target::Mysql(my) => &my.shown,
        }
    }

    pub fn tls(&self) -> &TlsSettings {
        match self {
            Target::Postgres(pg) => &pg.tls,
            Target::Mysql(my) => &my.tls,
        }
    }

    /// The books in `schema` (`--database-schema`) instead of where the
    /// URL's session puts them: a schema of their own, so deployments
    /// sharing one database keep apart their tables, their migrations
    /// record and their sinks' locks. MySQL's schema is a database, and
    /// `CREATE SCHEMA` makes one there too.
    pub fn in_schema(mut self, schema: Option<String>) -> Result<Target, String> {
        let Some(schema) = schema else {
            return Ok(self);
        };
        let valid = schema.len() <= MOST_SCHEMA_NAME
            && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && schema
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(format!(
                "--database-schema {schema:?}: 1 to {MOST_SCHEMA_NAME} lowercase letters, digits \
                 or underscores, not starting with a digit"
            ));
        }
        match &mut self {
            Target::Postgres(pg) => pg.schema = Some(schema),
            Target::Mysql(my) => my.schema = Some(schema),
        }
        Ok(self)
    }

    /// The schema the books are in, when named.
    pub fn schema(&self) -> Option<&str> {
        match self {
            Target::Postgres(pg) => pg.schema.as_deref(),
            Target::Mysql(my) => my.schema.as_deref(),
        }
    }
}

/// The longest `--database-schema`: a plain identifier in both SQLs, and
/// room in GET_LOCK's 64-character names.
pub const MOST_SCHEMA_NAME: usize = 40;

/// A MySQL or MariaDB URL: `mysql://user[:password]@host[:port]/database`
/// with the MySQL client's TLS options as parameters (`ssl-mode`,
/// `ssl-ca`, `ssl-cert`, `ssl-key`), and nothing else.
#[derive(Debug, Clone)]
pub struct MysqlTarget {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    /// The database the URL names, connected to.
    pub database: String,
    /// `--database-schema`: where the tables are (MySQL's schema is a
    /// database); the URL's database when None.
    pub schema: Option<String>,
    pub tls: TlsSettings,
    shown: String,
}

impl MysqlTarget {
    fn parse(text: &str) -> Result<MysqlTarget, String> {
        let shown = redact(text);
        let url = url::Url::parse(text).map_err(|e| format!("{shown}: {e}"))?;
        let decode = |part: &str| {
            url::form_urlencoded::parse(format!("x={part}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        let host = url
            .host_str()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| format!("{shown}: no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let database = decode(url.path().trim_start_matches('/'));
        if database.is_empty() || database.contains('/') {
            return Err(format!(
                "{shown}: name the database after the host (mysql://user@host:3306/orders)"
            ));
        }
        if database.len() > MOST_DATABASE_NAME {
            return Err(format!(
                "{shown}: the database name is longer than {} bytes, which the sinks' lock names \
                 (GET_LOCK's, 64 at most) cannot hold",
                MOST_DATABASE_NAME
            ));
        }
        let mut ssl = std::collections::HashMap::new();
        for (key, value) in url.query_pairs() {
            match &*key {
                "ssl-mode" | "ssl-ca" | "ssl-cert" | "ssl-key" => {
                    if ssl
                        .insert(key.clone().into_owned(), value.into_owned())
                        .is_some()
                    {
                        return Err(format!("{shown}: {key} is given twice"));
                    }
                }
                other => {
                    return Err(format!(
                        "{shown}: {other} is not a parameter stockgate reads (ssl-mode, ssl-ca, \
                         ssl-cert, ssl-key)"
                    ));
                }
            }
        }
        let tls = mysql_tls(&ssl, is_loopback(&host)).map_err(|e| format!("{shown}: {e}"))?;
        if tls.mode != TlsMode::Disable {
            tls.client_config().map_err(|e| format!("{shown}: {e}"))?;
        }
        Ok(MysqlTarget {
            port: url.port().unwrap_or(3306),
            user: decode(url.username()),
            password: url.password().map(decode),
            host,
            database,
            schema: None,
            tls,
            shown,
        })
    }
}

/// The MySQL client's TLS options, with its meanings: `ssl-mode` is
/// `DISABLED`, `PREFERRED`, `REQUIRED` (encrypted, no certificate
/// checked), `VERIFY_CA` or `VERIFY_IDENTITY`; `ssl-ca` is a file (or
/// `system`, as libpq's `sslrootcert=system`), needed by the two verify
/// modes and refused by the others, where it would check nothing.
fn mysql_tls(
    ssl: &std::collections::HashMap<String, String>,
    local: bool,
) -> Result<TlsSettings, String> {
    let mode = match ssl
        .get("ssl-mode")
        .map(|m| m.to_ascii_uppercase())
        .as_deref()
    {
        Some("DISABLED") => TlsMode::Disable,
        Some("PREFERRED") => TlsMode::Prefer,
        Some("REQUIRED") => TlsMode::Require,
        Some("VERIFY_CA") => TlsMode::VerifyCa,
        Some("VERIFY_IDENTITY") => TlsMode::VerifyFull,
        Some(_) => {
            return Err(format!(
                "ssl-mode={} is none of DISABLED, PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY",
                ssl["ssl-mode"]
            ));
        }
        None if local => TlsMode::Prefer,
        None => {
            return Err(
                "no ssl-mode, and the host is not on this machine: add ssl-mode=VERIFY_IDENTITY \
                 (with ssl-ca=<the server's CA file>, or ssl-ca=system for a publicly signed \
                 server) to encrypt and check the server, or ssl-mode=DISABLED to send the \
                 books in plaintext on purpose"
                    .into(),
            );
        }
    };
    let client = match (ssl.get("ssl-cert"), ssl.get("ssl-key")) {
        (Some(cert), Some(key)) if mode != TlsMode::Disable => Some(ClientCert {
            cert: cert.into(),
            key: key.into(),
        }),
        (None, None) => None,
        (Some(_), Some(_)) => return Err("ssl-cert and ssl-key need TLS, not DISABLED".into()),
        _ => return Err("ssl-cert and ssl-key go together".into()),
    };
    let roots = ssl.get("ssl-ca").map(|ca| match ca.as_str() {
        "system" => Roots::System,
        file => Roots::File(PathBuf::from(file)),
    });
    let roots = match mode {
        TlsMode::VerifyCa | TlsMode::VerifyFull => Some(roots.ok_or(
            "VERIFY_CA and VERIFY_IDENTITY need the CA to check the server against: \
             ssl-ca=<file> or ssl-ca=system",
        )?),
        _ if roots.is_some() => {
            return Err(
                "ssl-ca is used only by VERIFY_CA and VERIFY_IDENTITY: REQUIRED and PREFERRED \
                 check no certificate, so say which check you mean"
                    .into(),
            );
        }
        _ => None,
    };
    Ok(TlsSettings {
        mode,
        roots,
        client,
    })
}

impl PgTarget {
    fn parse(url: &str) -> Result<PgTarget, String> {
        let shown = redact(url);
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut ssl = std::collections::HashMap::new();
        let mut kept = url::form_urlencoded::Serializer::new(String::new());
        let mut any_kept = false;
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            match &*key {
                "sslmode" | "sslrootcert" | "sslcert" | "sslkey" => {
                    if ssl
                        .insert(key.clone().into_owned(), value.into_owned())
                        .is_some()
                    {
                        return Err(format!("{shown}: {key} is given twice"));
                    }
                }
                _ => {
                    kept.append_pair(&key, &value);
                    any_kept = true;
                }
            }
        }
        let rest = if any_kept {
            format!("{base}?{}", kept.finish())
        } else {
            base.to_owned()
        };
        // tokio-postgres's errors name the option, never the URL's text.
        let config: tokio_postgres::Config = rest.parse().map_err(|e| format!("{shown}: {e}"))?;
        if config.get_hosts().is_empty() {
            return Err(format!("{shown}: no host"));
        }
        let local = config.get_hosts().iter().all(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => is_loopback(name),
            tokio_postgres::config::Host::Unix(_) => true,
        }) && config.get_hostaddrs().iter().all(IpAddr::is_loopback);
        let tls = pg_tls(&ssl, local).map_err(|e| format!("{shown}: {e}"))?;
        if tls.mode != TlsMode::Disable {
            // Reads the roots and the client certificate now: a missing
            // file is the operator's to see at start.
            tls.client_config().map_err(|e| format!("{shown}: {e}"))?;
        }
        Ok(PgTarget {
            config,
            tls,
            schema: None,
            shown,
        })
    }
}

/// libpq's TLS parameters: `sslmode`, `sslrootcert` (a file, or `system`),
/// `sslcert` and `sslkey`, with libpq's defaults for the files
/// (`~/.postgresql/root.crt`, `postgresql.crt`, `postgresql.key`).
fn pg_tls(
    ssl: &std::collections::HashMap<String, String>,
    local: bool,
) -> Result<TlsSettings, String> {
    let mode = match ssl.get("sslmode").map(String::as_str) {
        Some("disable") => TlsMode::Disable,
        Some("prefer") => TlsMode::Prefer,
        Some("require") => TlsMode::Require,
        Some("verify-ca") => TlsMode::VerifyCa,
        Some("verify-full") => TlsMode::VerifyFull,
        Some("allow") => {
            return Err(
                "sslmode=allow (plaintext first) is not supported: use prefer, require or verify-full"
                    .into(),
            );
        }
        Some(other) => {
            return Err(format!(
                "sslmode={other} is none of disable, prefer, require, verify-ca, verify-full"
            ));
        }
        None if local => TlsMode::Prefer,
        None => {
            return Err(
                "no sslmode, and the host is not on this machine: add sslmode=verify-full \
                 (with sslrootcert=<the server's CA file>, or sslrootcert=system for a \
                 publicly signed server) to encrypt and check the server, or sslmode=disable \
                 to send the books in plaintext on purpose"
                    .into(),
            );
        }
    };
    let home = |file: &str| {
        std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".postgresql").join(file))
            .filter(|path| path.is_file())
    };
    let explicit_roots = ssl.get("sslrootcert").map(|root| match root.as_str() {
        "system" => Roots::System,
        file => Roots::File(PathBuf::from(file)),
    });
    let client = match (ssl.get("sslcert"), ssl.get("sslkey")) {
        (Some(cert), Some(key)) => Some(ClientCert {
            cert: cert.into(),
            key: key.into(),
        }),
        (None, None) => match (home("postgresql.crt"), home("postgresql.key")) {
            (Some(cert), Some(key)) if mode != TlsMode::Disable => Some(ClientCert { cert, key }),
            _ => None,
        },
        _ => return Err("sslcert and sslkey go together".into()),
    };
    let roots = match mode {
        TlsMode::Disable | TlsMode::Prefer => {
            if explicit_roots.is_some() || ssl.contains_key("sslcert") {
                return Err(format!(
                    "sslrootcert and sslcert are used only by sslmode=require, verify-ca or \
                     verify-full, not {}",
                    ssl.get("sslmode")
                        .map_or("the default prefer", String::as_str)
                ));
            }
            None
        }
        TlsMode::Require => explicit_roots.or_else(|| home("root.crt").map(Roots::File)),
        TlsMode::VerifyCa | TlsMode::VerifyFull => Some(
            explicit_roots
                .or_else(|| home("root.crt").map(Roots::File))
                .ok_or(
                    "verify-ca and verify-full need the CA to check the server against: \
                     sslrootcert=<file>, sslrootcert=system, or ~/.postgresql/root.crt",
                )?,
        ),
    };
    Ok(TlsSettings {
        mode,
        roots,
        client,
    })
}

/// Whether a host name or address is this machine's loopback.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(url: &str) -> Result<TlsSettings, String> {
        Target::parse(url).map(|t| t.tls().clone())
    }

    #[test]
    fn sslmode_keeps_libpq_meanings_and_a_remote_host_must_name_one() {
        let local = tls("postgres://u@127.0.0.1:5432/db").unwrap();
        assert_eq!((local.mode, local.roots), (TlsMode::Prefer, None));
        let local = tls("postgres://u@localhost/db").unwrap();
        assert_eq!(local.mode, TlsMode::Prefer);
        let err = tls("postgres://u:pw@db.internal:5432/db").unwrap_err();
        assert!(err.contains("sslmode=verify-full"), "{err}");
        assert!(!err.contains("pw@"), "{err}");
        let plain = tls("postgres://u@db.internal/db?sslmode=disable").unwrap();
        assert_eq!(plain.mode, TlsMode::Disable);
        let require = tls("postgres://u@db.internal/db?sslmode=require").unwrap();
        assert_eq!((require.mode, require.roots), (TlsMode::Require, None));
        let full = tls("postgres://u@db.internal/db?sslmode=verify-full&sslrootcert=system");
        // A machine without a trust store says so instead.
        if let Ok(full) = full {
            assert_eq!(full.roots, Some(Roots::System));
        }
        for bad in [
            "postgres://u@h/db?sslmode=allow",
            "postgres://u@h/db?sslmode=verify_full",
            "postgres://u@h/db?sslmode=require&sslmode=disable",
            "postgres://u@h/db?sslmode=require&sslcert=/c.pem",
            "postgres://u@h/db?sslmode=disable&sslrootcert=/ca.pem",
            "postgres://u@localhost/db?sslrootcert=/ca.pem",
            "postgres://u@h/db?sslmode=verify-ca&sslrootcert=/no/such/ca.pem",
            "postgres://u@h/db?sslmode=disable&sslmod=require",
            "mysql-ish://u@h/db",
        ] {
            assert!(tls(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ssl_mode_keeps_the_mysql_clients_meanings() {
        let my = |url: &str| match Target::parse(url) {
            Ok(Target::Mysql(my)) => Ok(my),
            Ok(other) => panic!("{url}: {other:?}"),
            Err(err) => Err(err),
        };
        let local = my("mysql://stockgate:p%40ss@127.0.0.1:3307/orders").unwrap();
        assert_eq!(
            (
                local.host.as_str(),
                local.port,
                local.user.as_str(),
                local.password.as_deref(),
                local.database.as_str(),
                local.tls.mode
            ),
            (
                "127.0.0.1",
                3307,
                "stockgate",
                Some("p@ss"),
                "orders",
                TlsMode::Prefer
            )
        );
        let maria = my("mariadb://u@db.internal/orders?ssl-mode=disabled").unwrap();
        assert_eq!((maria.port, maria.tls.mode), (3306, TlsMode::Disable));
        let required = my("mysql://u@db.internal/orders?ssl-mode=REQUIRED").unwrap();
        assert_eq!(
            (required.tls.mode, required.tls.roots),
            (TlsMode::Require, None)
        );
        let err = my("mysql://u:pw@db.internal/orders").unwrap_err();
        assert!(
            err.contains("ssl-mode=VERIFY_IDENTITY") && !err.contains("pw@"),
            "{err}"
        );
        for bad in [
            "mysql://u@h/orders?ssl-mode=VERIFY_CA",
            "mysql://u@h/orders?ssl-mode=REQUIRED&ssl-ca=/ca.pem",
            "mysql://u@h/orders?ssl-mode=VERIFY_FULL&ssl-ca=/ca.pem",
            "mysql://u@h/orders?ssl-mode=VERIFY_IDENTITY&ssl-ca=/no/such/ca.pem",
            "mysql://u@h/orders?ssl-mode=DISABLED&ssl-cert=/c&ssl-key=/k",
            "mysql://u@h/orders?ssl-mode=REQUIRED&ssl-cert=/c",
            "mysql://u@h/orders?ssl-mode=DISABLED&sslmode=require",
            "mysql://u@h/?ssl-mode=DISABLED",
            "mysql://u@h?ssl-mode=DISABLED",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_schema_is_a_plain_name() {
        let pg = Target::parse("postgres://u@127.0.0.1/db").unwrap();
        assert_eq!(
            pg.clone()
                .in_schema(Some("shop_eu2".into()))
                .unwrap()
                .schema(),
            Some("shop_eu2")
        );
        assert_eq!(pg.clone().in_schema(None).unwrap().schema(), None);
        for bad in ["", "Shop", "2shop", "shop-eu", "a\"b", &"s".repeat(41)] {
            assert!(pg.clone().in_schema(Some(bad.into())).is_err(), "{bad}");
        }
    }

    #[test]
    fn passwords_never_show() {
        for url in [
            "postgres://stockgate:hunter2@db:5432/orders?sslmode=disable",
            "postgres://stockgate@db:5432/orders?password=hunter2&sslmode=disable",
            "postgres://stockgate:hunter2@db:5432/orders?sslmode=nonsense",
            "postgres://stockgate:hunter2@db:5432/orders?bogus=1&sslmode=disable",
            "mysql://stockgate:hunter2@db:3306/orders?ssl-mode=nonsense",
            "mysql://stockgate:hunter2@db:3306/orders?bogus=1",
            "mariadb://stockgate:hunter2@db:3306/orders",
        ] {
            assert!(!redact(url).contains("hunter2"), "{}", redact(url));
            match Target::parse(url) {
                Ok(target) => assert!(!target.shown().contains("hunter2")),
                Err(err) => assert!(!err.contains("hunter2"), "{err}"),
            }
        }
    }
}
