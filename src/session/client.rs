//! CLIENT and its subcommands: the connection's name, id, library and
//! flags.
//!
//! # Format
//!
//! ```text
//! CLIENT SETNAME <connection-name>
//! CLIENT GETNAME
//! CLIENT SETINFO <LIB-NAME|LIB-VER> <value>
//! CLIENT ID
//! CLIENT INFO
//! CLIENT NO-EVICT <ON|OFF>
//! CLIENT NO-TOUCH <ON|OFF>
//! CLIENT HELP
//! ```
//!
//! NO-EVICT and NO-TOUCH are accepted, as clients send them at connect,
//! and shown in CLIENT INFO's flags; they change nothing in a proxy, which
//! evicts no clients and touches no keys of its own. Other subcommands of
//! Redis's (LIST, KILL, TRACKING, ...) are about a server's other clients
//! and keyspace, which stockgate doesn't share: they are unknown here, and
//! CLIENT HELP lists what there is.

use super::keep;
use crate::command::spec::{Call, CommandSpec, Serve, arg, c_str, help_subcommand, session, shown};
use crate::reply::{Protocol, Reply};
use bytes::Bytes;
use std::io::Write as _;

pub const CLIENT: CommandSpec = CommandSpec {
    name: "client",
    arity: -2,
    max_args: None,
    flags: &[],
    group: "connection",
    summary: "A container for connection commands.",
    args: &[],
    subcommands: &[
        session(
            "client|setname",
            3,
            "connection",
            "Names the connection.",
            &[arg("connection-name", "string")],
            setname,
        ),
        session(
            "client|getname",
            2,
            "connection",
            "Returns the connection's name.",
            &[],
            |call| call.session.name.clone().map_or(Reply::Null, Reply::Bulk),
        ),
        session(
            "client|setinfo",
            4,
            "connection",
            "Records the client library's name or version.",
            &[arg("attr", "string"), arg("value", "string")],
            setinfo,
        ),
        session(
            "client|id",
            2,
            "connection",
            "Returns the connection's id.",
            &[],
            |call| Reply::Integer(call.session.id as i64),
        ),
        session(
            "client|info",
            2,
            "connection",
            "Returns what stockgate knows of the connection, in Redis's CLIENT INFO format.",
            &[],
            info,
        ),
        session(
            "client|no-evict",
            3,
            "connection",
            "Accepted for clients that ask it; stockgate evicts no clients.",
            &[arg("enabled", "string")],
            |call| switch(call, |session, on| session.no_evict = on),
        ),
        session(
            "client|no-touch",
            3,
            "connection",
            "Accepted for clients that ask it; stockgate touches no keys of its own.",
            &[arg("enabled", "string")],
            |call| switch(call, |session, on| session.no_touch = on),
        ),
        help_subcommand("client|help", "connection"),
    ],
    // Never reached: a request that names CLIENT has a subcommand (or
    // fails CLIENT's arity first), and the subcommand is served instead.
    serve: Serve::Session(|call| crate::command::spec::wrong_arity(call.spec.name)),
};

/// Redis's rule for connection names and library details: no spaces or
/// control characters.
fn printable(value: &[u8]) -> bool {
    value.iter().all(|b| (b'!'..=b'~').contains(b))
}

pub fn check_client_name(name: &[u8]) -> Result<(), Reply> {
    if !printable(name) {
        return Err(Reply::error(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(())
}

fn setname(call: &mut Call<'_>) -> Reply {
    let name = &call.args[0];
    match check_client_name(name) {
        Ok(()) => {
            call.session.name = (!name.is_empty()).then(|| keep(name));
            Reply::Simple("OK")
        }
        Err(reply) => reply,
    }
}

/// As Redis 7.2's `clientSetinfoCommand`: the attribute, then the value's
/// characters; an empty value forgets it.
fn setinfo(call: &mut Call<'_>) -> Reply {
    let (attr, value) = (&call.args[0], &call.args[1]);
    let slot = if attr.eq_ignore_ascii_case(b"LIB-NAME") {
        &mut call.session.lib_name
    } else if attr.eq_ignore_ascii_case(b"LIB-VER") {
        &mut call.session.lib_version
    } else {
        return Reply::error(format!(
            "ERR Unrecognized option '{}'",
            shown(c_str(attr, usize::MAX))
        ));
    };
    if !printable(value) {
        return Reply::error(format!(
            "ERR {} cannot contain spaces, newlines or special characters.",
            shown(attr)
        ));
    }
    *slot = (!value.is_empty()).then(|| keep(value));
    Reply::Simple("OK")
}

/// `ON` or `OFF`, in any case, as Redis reads them.
fn switch(call: &mut Call<'_>, set: fn(&mut crate::command::Session, bool)) -> Reply {
    let value = &call.args[0];
    let on = if value.eq_ignore_ascii_case(b"on") {
        true
    } else if value.eq_ignore_ascii_case(b"off") {
        false
    } else {
        return Reply::error("ERR syntax error");
    };
    set(call.session, on);
    Reply::Simple("OK")
}

/// One line of Redis's `key=value` fields, in Redis's order, for the
/// fields stockgate knows. Those that describe a Redis server's own
/// socket and buffers (addr, laddr, fd, qbuf, omem, ...) are left out
/// rather than made up; clients that parse the line take what is there.
fn info(call: &mut Call<'_>) -> Reply {
    let session = &*call.session;
    let mut flags = String::new();
    if session.no_evict {
        flags.push('e');
    }
    if session.no_touch {
        flags.push('T');
    }
    if flags.is_empty() {
        flags.push('N');
    }
    let text = |value: &Option<Bytes>| value.clone().unwrap_or_default();
    let mut line = Vec::with_capacity(192);
    let _ = write!(line, "id={} name=", session.id);
    line.extend_from_slice(&text(&session.name));
    let _ = write!(
        line,
        " age={} idle=0 flags={flags} db=0 sub=0 psub=0 ssub=0 multi=-1 cmd=client|info user={} redir=-1 resp={} lib-name=",
        session.connected.elapsed().as_secs(),
        session.account.as_ref().map_or("default", |a| a.name()),
        if session.protocol == Protocol::Resp3 {
            3
        } else {
            2
        },
    );
    line.extend_from_slice(&text(&session.lib_name));
    line.extend_from_slice(b" lib-ver=");
    line.extend_from_slice(&text(&session.lib_version));
    line.push(b'\n');
    Reply::Verbatim(line.into())
}
