//! What a command is and what it runs with: [`spec`] describes a command
//! (name, arity, flags, arguments, who answers it) and holds the errors
//! about a request's shape; [`Session`] is the connection state that the
//! connection-level commands read and change.
//!
//! The table of every command, and the dispatch that reads it, sit above
//! in [`crate::dispatch`], so that the command files under
//! [`crate::session`] and [`crate::stock`] describe themselves with what
//! is here without importing the table that names them.

pub mod spec;

use crate::auth::Account;
use crate::reply::Protocol;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Instant;

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
    /// The user it is logged in as ([`Account`]): what it may do, and
    /// whether it is still a user.
    pub account: Option<Arc<Account>>,
    /// How long the connection waits before its next reply: a failed
    /// login from a peer that failed many ([`crate::auth::throttle`]).
    pub login_delay: Option<std::time::Duration>,
    /// `CLIENT NO-EVICT on`, `CLIENT NO-TOUCH on`: accepted and shown in
    /// CLIENT INFO's flags, as Redis shows them; they change nothing here
    /// (stockgate evicts no clients and has no keys to touch).
    pub no_evict: bool,
    pub no_touch: bool,
    /// When the connection was accepted (CLIENT INFO's `age`).
    pub connected: Instant,
}

impl Session {
    /// A connection that starts logged in as `account`, or not logged in.
    pub fn new(id: u64, account: Option<Arc<Account>>) -> Session {
        Session {
            id,
            peer: None,
            protocol: Protocol::Resp2,
            name: None,
            lib_name: None,
            lib_version: None,
            authenticated: account.is_some(),
            account,
            login_delay: None,
            no_evict: false,
            no_touch: false,
            connected: Instant::now(),
        }
    }
}
