//! System faults: errors classified by where they came from and what the
//! caller may do next.
//!
//! A fault is never disguised as a business code. Each [`FaultKind`] decides
//! the reply's first word, the metric label, and the advice in the text.
//! Connection-level errors (malformed RESP and the like) are a different
//! type, [`crate::frame::ProtocolError`]: those close the connection, these
//! are replied to.
//!
//! An error reply from Redis is read once, where it arrives, into an
//! [`ErrorReply`]: its [`ErrorCode`] says what it means (a redirect, a
//! lost script, an ACL's refusal, a moving slot, one of the scripts' own
//! codes), and every decision after is made on that code, never on the
//! text again. A fault that came from one keeps it as its source.

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

/// What an error reply from Redis means, read from its first word (and,
/// for the few `ERR` replies stockgate acts on, from its text) by
/// [`ErrorCode::read`], the one place that reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// `MOVED`: the slot is served elsewhere.
    Moved,
    /// `ASK`: the slot is moving; this key is asked for elsewhere.
    Ask,
    /// `TRYAGAIN`: the slot is moving and the keys are split for now.
    TryAgain,
    ClusterDown,
    MasterDown,
    /// `LOADING`: the node is loading its data.
    Loading,
    /// `READONLY`: a replica (a failover moved the primary).
    ReadOnly,
    /// `NOSCRIPT`: the node lacks the script called by its SHA.
    NoScript,
    /// `ERR Function not found`: the node lacks the library (a new
    /// primary, `FUNCTION FLUSH`, a failover to a replica that never had
    /// it). Like NOSCRIPT, it says nothing about the request: the call did
    /// not run. Redis and Valkey word it alike.
    FunctionNotFound,
    /// `ERR Library '...' already exists`: FUNCTION LOAD of a library
    /// another sidecar loaded first.
    LibraryExists,
    /// A script touched a key of a slot its node does not serve at that
    /// moment: Redis says "Script attempted to access a non local key",
    /// Valkey 9.1 "Attempted to access ..." (see
    /// [`UpstreamError::is_non_local_key`]).
    NonLocalKey,
    /// `NOPERM`: an ACL refused the command, or a key.
    NoPerm,
    /// `BUSY`: a long script runs on the node.
    Busy,
    /// `OOM`: no memory for a write; the script did not run.
    OutOfMemory,
    /// `MISCONF`: the node cannot persist, and refuses writes.
    Misconf,
    /// `NOREPLICAS`: fewer good replicas than `min-replicas-to-write`.
    NoReplicas,
    WrongType,
    /// The scripts' own codes (`lua/common.lua`).
    UnknownSku,
    NoJournal,
    BadStock,
    BadRecord,
    Negative,
    BadCall,
    /// A script of a SKU that keeps one number met a SKU kept by location
    /// and changed nothing: stockgate sends the call on to
    /// `lua/allocate.lua` (never shown to a client).
    Located,
    /// A location a record or call needs is missing from the SKU's hash.
    LocGone,
    /// Any other error reply.
    Other,
}

impl ErrorCode {
    /// What an error reply means: `word` is its first word, `detail` the
    /// rest of its text.
    pub fn read(word: &str, detail: &str) -> ErrorCode {
        match word {
            "MOVED" => ErrorCode::Moved,
            "ASK" => ErrorCode::Ask,
            "TRYAGAIN" => ErrorCode::TryAgain,
            "CLUSTERDOWN" => ErrorCode::ClusterDown,
            "MASTERDOWN" => ErrorCode::MasterDown,
            "LOADING" => ErrorCode::Loading,
            "READONLY" => ErrorCode::ReadOnly,
            "NOSCRIPT" => ErrorCode::NoScript,
            "NOPERM" => ErrorCode::NoPerm,
            "BUSY" => ErrorCode::Busy,
            "OOM" => ErrorCode::OutOfMemory,
            "MISCONF" => ErrorCode::Misconf,
            "NOREPLICAS" => ErrorCode::NoReplicas,
            "WRONGTYPE" => ErrorCode::WrongType,
            "UNKNOWNSKU" => ErrorCode::UnknownSku,
            "NOJOURNAL" => ErrorCode::NoJournal,
            "BADSTOCK" => ErrorCode::BadStock,
            "BADRECORD" => ErrorCode::BadRecord,
            "NEGATIVE" => ErrorCode::Negative,
            "BADCALL" => ErrorCode::BadCall,
            "LOCATED" => ErrorCode::Located,
            "LOCGONE" => ErrorCode::LocGone,
            // Redis raises these as plain errors: their text says which.
            _ if detail.contains("non local key") => ErrorCode::NonLocalKey,
            "ERR" if detail.starts_with("Function not found") => ErrorCode::FunctionNotFound,
            "ERR" if detail.contains("already exists") => ErrorCode::LibraryExists,
            _ => ErrorCode::Other,
        }
    }

    /// The code of an error the redis crate read, when it is Redis's
    /// error reply (not a lost connection or a client fault).
    pub fn of_redis(err: &RedisError) -> Option<ErrorCode> {
        ErrorReply::words(err).map(|(word, detail)| ErrorCode::read(word, detail))
    }

    /// The code of an error reply the redis crate left in a pipeline's
    /// replies (`Value::ServerError`).
    pub fn of_server_error(err: &redis::ServerError) -> ErrorCode {
        ErrorCode::read(err.code(), err.details().unwrap_or(""))
    }

    /// Whether it only means "ask again elsewhere or later" (a redirect, a
    /// moving slot, a failover, a lost script): the redis crate's cluster
    /// client knows how to follow these.
    pub fn is_redirect(self) -> bool {
        matches!(
            self,
            ErrorCode::Moved
                | ErrorCode::Ask
                | ErrorCode::TryAgain
                | ErrorCode::ClusterDown
                | ErrorCode::MasterDown
                | ErrorCode::Loading
                | ErrorCode::ReadOnly
                | ErrorCode::NoScript
        )
    }
}

/// An error reply from Redis, read: its code, and its words as Redis sent
/// them (for the fault's text, and whoever asks for the source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    pub code: ErrorCode,
    /// Its first word.
    pub word: String,
    /// The rest of its text.
    pub detail: String,
}

impl ErrorReply {
    pub fn new(word: &str, detail: &str) -> ErrorReply {
        ErrorReply {
            code: ErrorCode::read(word, detail),
            word: word.to_owned(),
            detail: detail.to_owned(),
        }
    }

    /// An error reply's text (after its `-`), split at its first space.
    pub fn parse(text: &str) -> ErrorReply {
        let (word, detail) = text.split_once(' ').unwrap_or((text, ""));
        ErrorReply::new(word, detail)
    }

    /// The reply of an error the redis crate read, when it is one.
    pub fn of_redis(err: &RedisError) -> Option<ErrorReply> {
        ErrorReply::words(err).map(|(word, detail)| ErrorReply::new(word, detail))
    }

    /// `err`'s first word and the rest, when it is Redis's error reply.
    fn words(err: &RedisError) -> Option<(&str, &str)> {
        match err.kind() {
            ErrorKind::Server(_) | ErrorKind::Extension => Some((
                err.code().unwrap_or_default(),
                err.detail().unwrap_or_default(),
            )),
            _ => None,
        }
    }
}

impl fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.word, self.detail)
    }
}

impl std::error::Error for ErrorReply {}

/// A system fault on the way to or from Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamError {
    pub kind: FaultKind,
    /// The error text without its first word.
    pub detail: String,
    /// The error reply it came from, when Redis answered one (its
    /// [`std::error::Error::source`]); boxed, as a call's result carries
    /// room for a fault.
    reply: Option<Box<ErrorReply>>,
}

impl UpstreamError {
    pub fn new(kind: FaultKind, detail: impl Into<String>) -> Self {
        UpstreamError {
            kind,
            detail: detail.into(),
            reply: None,
        }
    }

    /// The error reply it came from, if any.
    pub fn reply(&self) -> Option<&ErrorReply> {
        self.reply.as_deref()
    }

    /// The code of the error reply it came from, if any.
    pub fn code(&self) -> Option<ErrorCode> {
        self.reply().map(|reply| reply.code)
    }

    /// The same fault, its source `reply` kept.
    pub fn with_reply(mut self, reply: ErrorReply) -> Self {
        self.reply = Some(Box::new(reply));
        self
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
        if let Some(reply) = ErrorReply::of_redis(err) {
            return UpstreamError::from_reply(reply);
        }
        match err.kind() {
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
    /// ([`ErrorCode::NonLocalKey`]).
    pub fn is_non_local_key(&self) -> bool {
        self.kind == FaultKind::BadReply && self.code() == Some(ErrorCode::NonLocalKey)
    }

    /// A script of a SKU that keeps one number met a SKU kept by location
    /// ([`ErrorCode::Located`]): nothing changed, and the call goes on by
    /// location ([`crate::stock::location`]).
    pub fn is_located(&self) -> bool {
        self.code() == Some(ErrorCode::Located)
    }

    /// Classifies an error reply from Redis by its first word, `code`.
    pub fn from_server_error(code: &str, detail: &str) -> Self {
        UpstreamError::from_reply(ErrorReply::new(code, detail))
    }

    /// Classifies an error reply from Redis by its code, and keeps it.
    pub fn from_reply(reply: ErrorReply) -> Self {
        let (code, detail) = (reply.word.as_str(), reply.detail.as_str());
        let fault = match reply.code {
            ErrorCode::UnknownSku => UpstreamError::new(FaultKind::UnknownSku, detail),
            ErrorCode::NoJournal => UpstreamError::new(
                FaultKind::NoJournal,
                format!("the sku's journal could not be opened: {detail}"),
            ),
            ErrorCode::BadStock
            | ErrorCode::BadRecord
            | ErrorCode::WrongType
            | ErrorCode::LocGone => {
                UpstreamError::new(FaultKind::BadData, format!("{code} {detail}"))
            }
            ErrorCode::Negative => {
                UpstreamError::new(FaultKind::Refused, format!("NEGATIVE {detail}"))
            }
            ErrorCode::BadCall => UpstreamError::new(
                FaultKind::BadCall,
                format!("a script refused an argument stockgate supplies: {detail}"),
            ),
            // Never a client's to see: stockgate sends the call on by
            // location; one that reaches a client (a bug) says so.
            ErrorCode::Located => UpstreamError::new(
                FaultKind::BadCall,
                format!("a script met a sku kept by location: {detail}"),
            ),
            ErrorCode::OutOfMemory => UpstreamError::new(
                FaultKind::OutOfMemory,
                format!("redis is out of memory and refused the script: {detail}"),
            ),
            // Both are refused before a script runs (a `#!lua` script
            // without the no-writes flag counts as a write), so nothing
            // changed and a retry passes once the node recovers: unavailable,
            // never a bad reply.
            ErrorCode::Misconf => UpstreamError::new(
                FaultKind::WritesRefused,
                format!("redis refuses writes (MISCONF: it cannot persist to disk): {detail}"),
            ),
            ErrorCode::NoReplicas => UpstreamError::new(
                FaultKind::WritesRefused,
                format!(
                    "redis refuses writes (NOREPLICAS: too few replicas are connected): {detail}"
                ),
            ),
            ErrorCode::NoPerm => UpstreamError::new(
                FaultKind::NoPermission,
                format!("redis's ACL refuses stockgate's user (NOPERM {detail})"),
            ),
            ErrorCode::Busy => UpstreamError::new(
                FaultKind::Busy,
                format!("redis is busy running another script: {detail}"),
            ),
            ErrorCode::ClusterDown
            | ErrorCode::MasterDown
            | ErrorCode::TryAgain
            | ErrorCode::Loading
            | ErrorCode::Moved
            | ErrorCode::Ask
            | ErrorCode::ReadOnly => UpstreamError::new(
                FaultKind::ClusterDown,
                format!("redis answered {code} {detail}"),
            ),
            ErrorCode::NoScript
            | ErrorCode::FunctionNotFound
            | ErrorCode::LibraryExists
            | ErrorCode::NonLocalKey
            | ErrorCode::Other => UpstreamError::new(
                FaultKind::BadReply,
                format!("redis answered {code} {detail}"),
            ),
        };
        fault.with_reply(reply)
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

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.label(), self.detail)
    }
}

impl std::error::Error for UpstreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.reply
            .as_deref()
            .map(|reply| reply as &(dyn std::error::Error + 'static))
    }
}

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
    fn an_error_reply_is_read_once_into_its_code_and_kept_as_the_source() {
        // The texts stockgate acts on, as the servers send them.
        for (text, code) in [
            ("MOVED 3999 127.0.0.1:7001", ErrorCode::Moved),
            ("ASK 3999 127.0.0.1:7002", ErrorCode::Ask),
            (
                "TRYAGAIN Multiple keys request during rehashing of slot",
                ErrorCode::TryAgain,
            ),
            ("NOSCRIPT No matching script.", ErrorCode::NoScript),
            ("ERR Function not found", ErrorCode::FunctionNotFound),
            (
                "ERR Library 'stockgate_v4_0123456789' already exists",
                ErrorCode::LibraryExists,
            ),
            (
                "ERR Script attempted to access a non local key in a cluster node script",
                ErrorCode::NonLocalKey,
            ),
            (
                "ERR Attempted to access a non local key in a cluster node script",
                ErrorCode::NonLocalKey,
            ),
            (
                "NOPERM User gate has no permissions to run the 'fcall' command",
                ErrorCode::NoPerm,
            ),
            ("BUSY Redis is busy running a script.", ErrorCode::Busy),
            ("NOJOURNAL the journal is not listed", ErrorCode::NoJournal),
            ("ERR unknown command 'X'", ErrorCode::Other),
            ("WHATEVER", ErrorCode::Other),
        ] {
            assert_eq!(ErrorReply::parse(text).code, code, "{text}");
        }

        // The same from the redis crate's error, with its words and text kept.
        let refused = redis::make_extension_error(
            "ERR".into(),
            Some("Script attempted to access a non local key in a cluster node script".into()),
        );
        assert_eq!(ErrorCode::of_redis(&refused), Some(ErrorCode::NonLocalKey));
        let fault = UpstreamError::from_redis(&refused);
        assert!(fault.is_non_local_key());
        assert_eq!(
            fault.reply_text(),
            "BADREPLY redis answered ERR Script attempted to access a non local key in a cluster \
             node script; the outcome may be unknown, retrying with the same request_id is safe"
        );
        let source = std::error::Error::source(&fault).expect("the reply is its source");
        assert_eq!(
            source.to_string(),
            "ERR Script attempted to access a non local key in a cluster node script"
        );
        // A fault of its own (no reply) has no code, and is no moving slot
        // whatever its text says.
        let own = UpstreamError::new(FaultKind::BadReply, "non local key");
        assert_eq!(own.code(), None);
        assert!(!own.is_non_local_key());
        assert!(std::error::Error::source(&own).is_none());
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
