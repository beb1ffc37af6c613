//! What can stop the sink or reconcile: a fault classified by its source
//! (Redis, the database, an entry nobody can read) and whether trying
//! again is safe. Every step of the sink is idempotent (a re-delivered
//! entry changes nothing, a trim only follows a commit), so a Redis or
//! database fault is retried; a bad entry is not: it waits for a human,
//! and its SKU's journal stays untrimmed.

use crate::error::UpstreamError;
use crate::metrics::JournalSource;

#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {detail}", origin.label())]
pub struct JournalFault {
    pub origin: JournalSource,
    /// Whether the same step may simply run again.
    pub retry_safe: bool,
    pub detail: String,
}

impl JournalFault {
    pub fn new(origin: JournalSource, retry_safe: bool, detail: impl Into<String>) -> Self {
        JournalFault {
            origin,
            retry_safe,
            detail: detail.into(),
        }
    }

    /// A database fault. Every one is retried: a lost connection or a
    /// restart (the transaction rolled back, nothing trimmed), a
    /// serialization failure, and also a refusal (permissions, a full
    /// disk) that an operator fixes while the sink waits.
    pub fn database(err: tokio_postgres::Error) -> Self {
        let detail = match err.as_db_error() {
            Some(db) => format!("{} ({})", db.message(), db.code().code()),
            None => with_causes(&err),
        };
        JournalFault::new(JournalSource::Database, true, detail)
    }

    /// A MySQL or MariaDB fault: retried as PostgreSQL's are (a lost
    /// connection, a deadlock, a key taken by another sink meanwhile).
    pub fn mysql(err: mysql_async::Error) -> Self {
        JournalFault::new(JournalSource::Database, true, with_causes(&err))
    }

    pub fn redis(err: UpstreamError) -> Self {
        JournalFault::new(JournalSource::Redis, true, err.to_string())
    }

    pub fn bad_reply(detail: impl Into<String>) -> Self {
        JournalFault::new(JournalSource::Redis, true, detail)
    }
}

/// An error's text followed by its causes': tokio-postgres says "error
/// performing TLS handshake" and keeps why (the certificate's name, an
/// unknown CA) in its source.
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

impl From<super::BadEntry> for JournalFault {
    fn from(err: super::BadEntry) -> Self {
        JournalFault::new(JournalSource::Data, false, err.to_string())
    }
}
