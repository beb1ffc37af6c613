//! System faults: errors classified by where they came from and what the
//! caller may do next.
//!
//! A fault is never disguised as a business code. Each [`FaultKind`] decides
//! the reply's first word, the metric label, and the advice in the text.
//! Connection-level errors (malformed RESP and the like) are a different
//! type, [`crate::frame::ProtocolError`]: those close the connection, these
//! are replied to.

use redis::{ErrorKind, RedisError};
use std::fmt;
use std::time::Duration;

/// What went wrong outside the business rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// No answer within `--timeout`. The script may or may not have run.
    Timeout,
    /// Could not reach a node, or lost the connection mid-request.
    Connection,
    /// The cluster is down, a slot is moving (TRYAGAIN), a primary is
    /// missing, or a node is loading its data.
    ClusterDown,
    /// A long script is running on the node (BUSY).
    Busy,
    /// Redis refused the write for lack of memory; the script did not run.
    OutOfMemory,
    /// Redis refuses writes for now, before the script runs: it cannot
    /// persist to disk (MISCONF, `stop-writes-on-bgsave-error`), or fewer
    /// good replicas are connected than `min-replicas-to-write`
    /// (NOREPLICAS). Nothing ran; it passes once the node recovers.
    WritesRefused,
    /// stockgate has not reached the upstream yet.
    NotReady,
    /// A reply stockgate does not understand: an unexpected shape, or an
    /// unexpected error from Redis.
    BadReply,
    /// A script refused an argument stockgate itself supplies (the window,
    /// the missing-stock mode, the key layout, the nonce): a version
    /// mismatch between stockgate and its scripts, or a bug. Nothing was
    /// changed; never answered as code 3, which is the caller's fault.
    BadCall,
    /// The sku has no stock key (with `--missing-stock error`).
    UnknownSku,
    /// The stored data is not what the script expects (a non-integer stock,
    /// a record of an unknown shape, a key of the wrong type).
    BadData,
    /// A script refused an operator's change (STOCK.ADD below zero).
    Refused,
    /// With `--wait-replicas`, fewer replicas than asked confirmed the
    /// write in time: it happened on the primary but may be lost with it.
    NotReplicated,
    /// The node already has as many requests queued as stockgate holds for
    /// it (it stopped reading, or can't keep up); this one was not sent.
    Overloaded,
    /// With `--journal`, the SKU has no journal yet (NOJOURNAL): the script
    /// changed nothing. stockgate opens the journal and sends the call
    /// again; a caller sees this only when that failed.
    NoJournal,
    /// Redis's ACL refuses stockgate's user a command or key it needs
    /// (NOPERM), and no other way of calling was left (a refused FCALL
    /// is sent again by EVALSHA first): nothing ran, and a retry passes
    /// once the ACL allows it. An operator's fault, never a bad reply.
    NoPermission,
}

/// The three classes of fault, by what they mean for the caller. The RESP
/// error's first word and the HTTP status both follow from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultClass {
    /// Redis couldn't be asked or didn't answer in time; the outcome may be
    /// unknown, a retry with the same request_id is safe and may succeed.
    /// RESP `-UPSTREAM`, HTTP 503.
    Unavailable,
    /// Redis answered something stockgate can't read; outcome may be
    /// unknown. RESP `-BADREPLY`, HTTP 500.
    BadReply,
    /// The data says no (unknown sku, corrupt value, a refused change);
    /// nothing changed and a retry won't help. RESP: the script's own
    /// code, HTTP 500.
    Data,
}

impl FaultKind {
    pub fn class(self) -> FaultClass {
        match self {
            FaultKind::Timeout
            | FaultKind::Connection
            | FaultKind::ClusterDown
            | FaultKind::Busy
            | FaultKind::OutOfMemory
            | FaultKind::WritesRefused
            | FaultKind::NotReady
            | FaultKind::NotReplicated
            | FaultKind::Overloaded
            | FaultKind::NoJournal
            | FaultKind::NoPermission => FaultClass::Unavailable,
            FaultKind::BadReply | FaultKind::BadCall => FaultClass::BadReply,
            FaultKind::UnknownSku | FaultKind::BadData | FaultKind::Refused => FaultClass::Data,
        }
    }

    /// Every kind, for creating the metric series at zero.
    pub const ALL: [FaultKind; 16] = [
        FaultKind::Timeout,
        FaultKind::Connection,
        FaultKind::ClusterDown,
        FaultKind::Busy,
        FaultKind::OutOfMemory,
        FaultKind::WritesRefused,
        FaultKind::NotReady,
        FaultKind::BadReply,
        FaultKind::BadCall,
        FaultKind::UnknownSku,
        FaultKind::BadData,
        FaultKind::Refused,
        FaultKind::NotReplicated,
        FaultKind::Overloaded,
        FaultKind::NoJournal,
        FaultKind::NoPermission,
    ];

    /// The `kind` label of `stockgate_upstream_errors_total`.
    pub fn label(self) -> &'static str {
        match self {
            FaultKind::Timeout => "timeout",
            FaultKind::Connection => "connection",
            FaultKind::ClusterDown => "cluster_down",
            FaultKind::Busy => "busy",
            FaultKind::OutOfMemory => "oom",
            FaultKind::WritesRefused => "writes_refused",
            FaultKind::NotReady => "not_ready",
            FaultKind::BadReply => "bad_reply",
            FaultKind::BadCall => "bad_call",
            FaultKind::UnknownSku => "unknown_sku",
            FaultKind::BadData => "bad_data",
            FaultKind::Refused => "refused",
            FaultKind::NotReplicated => "not_replicated",
            FaultKind::Overloaded => "overloaded",
            FaultKind::NoJournal => "no_journal",
            FaultKind::NoPermission => "no_permission",
        }
    }

    /// Whether the same request, retried with the same request_id, may
    /// succeed later. Retrying is always *safe* (the script is idempotent);
    /// this says whether it is *useful*.
    pub fn retry_may_help(self) -> bool {
        self.class() != FaultClass::Data
    }
}

/// A system fault on the way to or from Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamError {
    pub kind: FaultKind,
    /// The error text without its first word.
    pub detail: String,
}

impl UpstreamError {
    pub fn new(kind: FaultKind, detail: impl Into<String>) -> Self {
        UpstreamError {
            kind,
            detail: detail.into(),
        }
    }

    pub fn timeout(deadline: Duration) -> Self {
        UpstreamError::new(
            FaultKind::Timeout,
            format!("no reply from redis within {} ms", deadline.as_millis()),
        )
    }

    /// Classifies an error from the redis crate.
    pub fn from_redis(err: &RedisError) -> Self {
        if err.is_timeout() {
            return UpstreamError::new(FaultKind::Timeout, format!("redis timed out: {err}"));
        }
        match err.kind() {
            ErrorKind::Server(_) | ErrorKind::Extension => UpstreamError::from_server_error(
                err.code().unwrap_or_default(),
                err.detail().unwrap_or_default(),
            ),
            ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => {
                UpstreamError::new(FaultKind::Connection, format!("redis unreachable: {err}"))
            }
            _ => UpstreamError::new(FaultKind::BadReply, format!("redis client error: {err}")),
        }
    }

    /// A script touched a key of a slot its node does not serve (or is
    /// migrating away), and Redis refused it at that access. Flagged
    /// `allow-cross-slot-keys` (`lua/order.lua`'s filing), it reads such a
    /// key before it writes anything, so the call can be made another way.
    /// Any other script touches its own slot only, and keys it does not
    /// declare (the SKU's journal, the records of its expired holds): in a
    /// slot that is migrating, one already moved is refused so, where a
    /// declared one would have been ASK or TRYAGAIN. That means "the slot
    /// is moving", and the call goes again as for TRYAGAIN
    /// ([`non_local_key`]).
    pub fn is_non_local_key(&self) -> bool {
        self.kind == FaultKind::BadReply && non_local_key(&self.detail)
    }

    /// Classifies an error reply from Redis by its first word, `code`.
    pub fn from_server_error(code: &str, detail: &str) -> Self {
        match code {
            "UNKNOWNSKU" => UpstreamError::new(FaultKind::UnknownSku, detail),
            "NOJOURNAL" => UpstreamError::new(
                FaultKind::NoJournal,
                format!("the sku's journal could not be opened: {detail}"),
            ),
            "BADSTOCK" | "BADRECORD" | "WRONGTYPE" => {
                UpstreamError::new(FaultKind::BadData, format!("{code} {detail}"))
            }
            "NEGATIVE" => UpstreamError::new(FaultKind::Refused, format!("NEGATIVE {detail}")),
            "BADCALL" => UpstreamError::new(
                FaultKind::BadCall,
                format!("a script refused an argument stockgate supplies: {detail}"),
            ),
            "OOM" => UpstreamError::new(
                FaultKind::OutOfMemory,
                format!("redis is out of memory and refused the script: {detail}"),
            ),
            // Both are refused before a script runs (a `#!lua` script
            // without the no-writes flag counts as a write), so nothing
            // changed and a retry passes once the node recovers: unavailable,
            // never a bad reply.
            "MISCONF" => UpstreamError::new(
                FaultKind::WritesRefused,
                format!("redis refuses writes (MISCONF: it cannot persist to disk): {detail}"),
            ),
            "NOREPLICAS" => UpstreamError::new(
                FaultKind::WritesRefused,
                format!(
                    "redis refuses writes (NOREPLICAS: too few replicas are connected): {detail}"
                ),
            ),
            "NOPERM" => UpstreamError::new(
                FaultKind::NoPermission,
                format!("redis's ACL refuses stockgate's user (NOPERM {detail})"),
            ),
            "BUSY" => UpstreamError::new(
                FaultKind::Busy,
                format!("redis is busy running another script: {detail}"),
            ),
            "CLUSTERDOWN" | "MASTERDOWN" | "TRYAGAIN" | "LOADING" | "MOVED" | "ASK"
            | "READONLY" => UpstreamError::new(
                FaultKind::ClusterDown,
                format!("redis answered {code} {detail}"),
            ),
            _ => UpstreamError::new(
                FaultKind::BadReply,
                format!("redis answered {code} {detail}"),
            ),
        }
    }

    /// Whether an error reply only means "ask again elsewhere or later"
    /// (a redirect, a moving slot, a failover, a lost script): the redis
    /// crate's cluster client knows how to follow these.
    pub fn is_redirect(code: &str) -> bool {
        matches!(
            code,
            "MOVED"
                | "ASK"
                | "TRYAGAIN"
                | "CLUSTERDOWN"
                | "MASTERDOWN"
                | "LOADING"
                | "READONLY"
                | "NOSCRIPT"
        )
    }

    /// The RESP error text (without the leading `-`). Its first word says
    /// the class; the rest says whether the outcome is known and what a
    /// retry does.
    pub fn reply_text(&self) -> String {
        let one_line = self.detail.replace(['\r', '\n'], " ");
        match (self.kind.class(), self.kind) {
            (FaultClass::Data, FaultKind::UnknownSku) => format!("UNKNOWNSKU {one_line}"),
            // The first word of the detail is the script's own code
            // (BADSTOCK, BADRECORD, WRONGTYPE, NEGATIVE).
            (FaultClass::Data, _) => one_line,
            (FaultClass::BadReply, _) => format!(
                "BADREPLY {one_line}; the outcome may be unknown, retrying with the same request_id is safe"
            ),
            (FaultClass::Unavailable, _) => format!(
                "UPSTREAM {one_line}; the outcome may be unknown, retrying with the same request_id is safe"
            ),
        }
    }
}

/// Whether an error reply's text is Redis refusing a script's access to a
/// key of a slot its node does not serve at that moment
/// ([`UpstreamError::is_non_local_key`]). Redis says "Script attempted to
/// access a non local key", Valkey 9.1 "Attempted to access ...".
pub fn non_local_key(text: &str) -> bool {
    text.contains("non local key")
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.label(), self.detail)
    }
}

impl std::error::Error for UpstreamError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_replies_say_a_retry_is_safe_and_never_look_like_codes() {
        let unavailable = FaultKind::ALL
            .into_iter()
            .filter(|k| k.class() == FaultClass::Unavailable);
        for kind in unavailable {
            let text = UpstreamError::new(kind, "x").reply_text();
            assert!(text.starts_with("UPSTREAM "), "{text}");
            assert!(text.contains("retrying with the same request_id is safe"));
        }
        let text = UpstreamError::new(FaultKind::BadReply, "x").reply_text();
        assert!(text.starts_with("BADREPLY "));
        assert!(text.contains("outcome may be unknown"));
    }

    #[test]
    fn script_errors_are_classified_by_their_code() {
        let unknown = redis::make_extension_error(
            "UNKNOWNSKU".into(),
            Some("no stock is recorded for this sku; nothing was changed".into()),
        );
        let e = UpstreamError::from_redis(&unknown);
        assert_eq!(e.kind, FaultKind::UnknownSku);
        assert_eq!(
            e.reply_text(),
            "UNKNOWNSKU no stock is recorded for this sku; nothing was changed"
        );
        let bad = redis::make_extension_error("BADSTOCK".into(), Some("not an int".into()));
        let e = UpstreamError::from_redis(&bad);
        assert_eq!(e.kind, FaultKind::BadData);
        assert!(e.reply_text().starts_with("BADSTOCK not an int"));
        assert!(!FaultKind::BadData.retry_may_help());
    }

    #[test]
    fn refused_writes_are_unavailable_because_nothing_ran() {
        // Redis refuses these before a script runs: a retry is safe and
        // passes once the node persists again or its replicas are back, so
        // they are UPSTREAM (HTTP 503), not BADREPLY (HTTP 500).
        for (code, detail, says) in [
            (
                "MISCONF",
                "Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
                "cannot persist to disk",
            ),
            (
                "NOREPLICAS",
                "Not enough good replicas to write.",
                "too few replicas",
            ),
        ] {
            let err = redis::make_extension_error(code.into(), Some(detail.into()));
            let e = UpstreamError::from_redis(&err);
            assert_eq!(e.kind, FaultKind::WritesRefused, "{code}");
            assert_eq!(e.kind.class(), FaultClass::Unavailable, "{code}");
            assert!(e.kind.retry_may_help());
            let text = e.reply_text();
            assert!(text.starts_with("UPSTREAM redis refuses writes"), "{text}");
            assert!(text.contains(says) && text.contains(detail), "{text}");
            assert!(text.contains(&format!("({code}: ")), "{text}");
        }
        // An ACL's refusal is the operator's to fix, never a bad reply:
        // nothing ran, and a retry passes once the ACL allows it.
        let refused = redis::make_extension_error(
            "NOPERM".into(),
            Some("this user has no permissions to run the 'fcall' command".into()),
        );
        let e = UpstreamError::from_redis(&refused);
        assert_eq!(e.kind, FaultKind::NoPermission);
        assert!(e.kind.retry_may_help());
        assert_eq!(
            e.reply_text(),
            "UPSTREAM redis's ACL refuses stockgate's user (NOPERM this user has no permissions \
             to run the 'fcall' command); the outcome may be unknown, retrying with the same \
             request_id is safe"
        );
        // An error Redis may send that stockgate does not know stays a bad
        // reply: nothing says whether it ran.
        let e = UpstreamError::from_server_error("WHATEVER", "x");
        assert_eq!(e.kind.class(), FaultClass::BadReply);
    }
}
