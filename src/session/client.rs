//! CLIENT and its subcommands: the connection's name, id and library.
//!
//! # Format
//!
//! ```text
//! CLIENT SETNAME <connection-name>
//! CLIENT GETNAME
//! CLIENT SETINFO <LIB-NAME|LIB-VER> <value>
//! CLIENT ID
//! ```

use super::keep;
use crate::command::spec::{Call, CommandSpec, Serve, arg, c_str, session, shown};
use crate::reply::Reply;

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
    ],
    // Never reached: a request that names CLIENT has a subcommand (or
    // fails CLIENT's arity first), and the subcommand is served instead.
    serve: Serve::Session(|call| crate::command::spec::wrong_arity(call.spec.name)),
};

/// Redis's rule for connection names: no spaces or control characters.
pub fn check_client_name(name: &[u8]) -> Result<(), Reply> {
    if name.iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
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

fn setinfo(call: &mut Call<'_>) -> Reply {
    let (attr, value) = (&call.args[0], keep(&call.args[1]));
    if attr.eq_ignore_ascii_case(b"LIB-NAME") {
        call.session.lib_name = Some(value);
    } else if attr.eq_ignore_ascii_case(b"LIB-VER") {
        call.session.lib_version = Some(value);
    } else {
        return Reply::error(format!(
            "ERR Unrecognized option '{}'",
            shown(c_str(attr, usize::MAX))
        ));
    }
    Reply::Simple("OK")
}
