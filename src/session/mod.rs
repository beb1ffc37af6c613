//! The connection-level commands: PING, ECHO, SELECT, QUIT, RESET, HELLO,
//! AUTH, CLIENT, INFO and COMMAND, answered on the spot from the
//! connection's [`Session`] and the shared state, never sent to Redis.
//!
//! - [`basics`] answers PING, ECHO, SELECT, QUIT and RESET;
//! - [`hello`] HELLO and AUTH: the protocol, the password, the name;
//! - [`client`] CLIENT and its subcommands;
//! - [`info`] INFO;
//! - [`introspection`] COMMAND and its subcommands, from the table.

pub mod basics;
pub mod client;
pub mod hello;
pub mod info;
pub mod introspection;

use crate::reply::Protocol;
use bytes::Bytes;
use std::time::Instant;

/// The Redis version stockgate answers as (in HELLO and INFO): the protocol
/// level it implements. Clients use it to pick features; stockgate's own
/// version is reported beside it.
pub const REDIS_COMPAT_VERSION: &str = "7.2.0";

/// Per-connection state that commands read and change.
///
/// Names and library details are copies, never slices of the read buffer:
/// a slice would keep the whole buffer it came from alive for as long as
/// the connection idles, which is most of a pooled connection's life.
#[derive(Debug)]
pub struct Session {
    pub id: u64,
    /// The client's address, when the connection has one.
    pub peer: Option<std::net::SocketAddr>,
    pub protocol: Protocol,
    pub name: Option<Bytes>,
    pub lib_name: Option<Bytes>,
    pub lib_version: Option<Bytes>,
    /// True once the client gave the password, or from the start when
    /// stockgate asks none.
    pub authenticated: bool,
    /// `CLIENT NO-EVICT on`, `CLIENT NO-TOUCH on`: accepted and shown in
    /// CLIENT INFO's flags, as Redis shows them; they change nothing here
    /// (stockgate evicts no clients and has no keys to touch).
    pub no_evict: bool,
    pub no_touch: bool,
    /// When the connection was accepted (CLIENT INFO's `age`).
    pub connected: Instant,
}

impl Session {
    pub fn new(id: u64, authenticated: bool) -> Session {
        Session {
            id,
            peer: None,
            protocol: Protocol::Resp2,
            name: None,
            lib_name: None,
            lib_version: None,
            authenticated,
            no_evict: false,
            no_touch: false,
            connected: Instant::now(),
        }
    }
}

/// An integer as Redis reads one (`string2ll`): decimal digits, an
/// optional `-`, no `+`, no leading zeros, no spaces, within 64 bits.
pub(crate) fn redis_integer(arg: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(arg).ok()?;
    let value = text.parse::<i64>().ok()?;
    // The canonical spelling is the only one: `03`, `+3` and `-0` are not
    // integers to Redis.
    (itoa::Buffer::new().format(value) == text).then_some(value)
}

/// An argument kept past the request: its own small allocation.
pub(crate) fn keep(arg: &Bytes) -> Bytes {
    Bytes::copy_from_slice(arg)
}

#[cfg(test)]
mod tests {
    use super::redis_integer;

    #[test]
    fn integers_are_read_as_redis_reads_them() {
        for (text, value) in [
            ("0", Some(0)),
            ("3", Some(3)),
            ("-3", Some(-3)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("03", None),
            ("+3", None),
            ("-0", None),
            (" 3", None),
            ("", None),
            ("9223372036854775808", None),
        ] {
            assert_eq!(redis_integer(text.as_bytes()), value, "{text:?}");
        }
    }
}
