//! The connection-level commands: PING, ECHO, SELECT, QUIT, HELLO, AUTH,
//! CLIENT, INFO and COMMAND, answered on the spot from the connection's
//! [`Session`] and the shared state, never sent to Redis.
//!
//! - [`basics`] answers PING, ECHO, SELECT and QUIT;
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
        }
    }
}

/// An argument kept past the request: its own small allocation.
pub(crate) fn keep(arg: &Bytes) -> Bytes {
    Bytes::copy_from_slice(arg)
}
