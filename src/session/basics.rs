//! PING, ECHO, SELECT, QUIT and RESET: what clients send to check a
//! connection, and to start it over.
//!
//! # Format
//!
//! ```text
//! PING [message]
//! ECHO <message>
//! SELECT <index>      only 0: stockgate has one database
//! QUIT
//! RESET               as a new connection: RESP2, no name, and
//!                     unauthenticated again when a password is set
//! ```

use super::redis_integer;
use crate::command::spec::{Call, CommandSpec, Serve, arg, optional, session, wrong_arity};
use crate::reply::{Protocol, Reply};

pub const PING: CommandSpec = session(
    "ping",
    -1,
    "connection",
    "Returns PONG, or the message.",
    &[optional("message", "string")],
    ping,
);

pub const ECHO: CommandSpec = session(
    "echo",
    2,
    "connection",
    "Returns the message.",
    &[arg("message", "string")],
    echo,
);

pub const SELECT: CommandSpec = session(
    "select",
    2,
    "connection",
    "Selects database 0, the only one.",
    &[arg("index", "integer")],
    select,
);

pub const QUIT: CommandSpec = CommandSpec {
    serve: Serve::Quit,
    ..session(
        "quit",
        -1,
        "connection",
        "Closes the connection.",
        &[],
        |_| Reply::Simple("OK"),
    )
};

pub const RESET: CommandSpec = session(
    "reset",
    1,
    "connection",
    "Resets the connection: RESP2, no name, no client flags, and unauthenticated when a password is set.",
    &[],
    reset,
);

/// Redis's arity for PING is -1 and its PING refuses a second argument
/// itself, after the password gate: unauthenticated, `PING a b` is
/// NOAUTH, not a wrong arity.
fn ping(call: &mut Call<'_>) -> Reply {
    match call.args {
        [] => Reply::Simple("PONG"),
        [message] => Reply::Bulk(message.clone()),
        _ => wrong_arity(call.spec.name),
    }
}

fn echo(call: &mut Call<'_>) -> Reply {
    Reply::Bulk(call.args[0].clone())
}

/// Redis's errors, in Redis's order: not an integer (of C's `int`), then
/// a database that doesn't exist, which is any but 0 here.
fn select(call: &mut Call<'_>) -> Reply {
    match redis_integer(&call.args[0]).filter(|i| i32::try_from(*i).is_ok()) {
        None => Reply::error("ERR value is not an integer or out of range"),
        Some(0) => Reply::Simple("OK"),
        Some(_) => Reply::error("ERR DB index is out of range"),
    }
}

/// Redis's `clearClientConnectionState`, for what stockgate keeps: the
/// library name and version stay, as in Redis (they still describe the
/// client behind the connection).
fn reset(call: &mut Call<'_>) -> Reply {
    let session = &mut *call.session;
    session.protocol = Protocol::Resp2;
    session.name = None;
    session.no_evict = false;
    session.no_touch = false;
    session.account = call.shared.users.open_account();
    session.authenticated = session.account.is_some();
    Reply::Simple("RESET")
}
