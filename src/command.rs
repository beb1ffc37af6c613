//! From a request to what to do with it: the command table, arity checks,
//! and the connection-level commands (PING, HELLO, CLIENT, INFO, ...).
//!
//! The table below is the one place that lists the commands stockgate
//! serves; arity checks, `COMMAND` and `COMMAND DOCS` all read it. Command
//! names are matched case-insensitively. An unknown command gets Redis's
//! own error and the connection stays open.

use crate::auth::{NOAUTH, Password, WRONGPASS};
use crate::frame::Request;
use crate::metrics::Metrics;
use crate::reply::{Protocol, Reply};
use crate::service::StockCommand;
use crate::state::Shared;
use bytes::Bytes;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

/// The Redis version stockgate answers as (in HELLO and INFO): the protocol
/// level it implements. Clients use it to pick features; stockgate's own
/// version is reported beside it.
pub const REDIS_COMPAT_VERSION: &str = "7.2.0";

/// One argument, as `COMMAND DOCS` describes it.
pub struct ArgSpec {
    pub name: &'static str,
    /// `string`, `integer` or `key`, as in Redis's docs.
    pub kind: &'static str,
    pub optional: bool,
}

/// One command: what `COMMAND` and `COMMAND DOCS` say about it, and how
/// many arguments it takes.
pub struct CommandSpec {
    pub name: &'static str,
    /// Redis arity: the name included; negative means "at least".
    pub arity: i64,
    /// Most arguments, the name included (Redis arity can't say "4 or 5").
    pub max_args: Option<usize>,
    pub flags: &'static [&'static str],
    pub group: &'static str,
    pub summary: &'static str,
    pub args: &'static [ArgSpec],
    pub subcommands: &'static [CommandSpec],
}

const fn arg(name: &'static str, kind: &'static str) -> ArgSpec {
    ArgSpec {
        name,
        kind,
        optional: false,
    }
}

const fn optional(name: &'static str, kind: &'static str) -> ArgSpec {
    ArgSpec {
        name,
        kind,
        optional: true,
    }
}

const fn spec(
    name: &'static str,
    arity: i64,
    group: &'static str,
    summary: &'static str,
    args: &'static [ArgSpec],
) -> CommandSpec {
    CommandSpec {
        name,
        arity,
        max_args: None,
        flags: &["fast"],
        group,
        summary,
        args,
        subcommands: &[],
    }
}

/// Every command stockgate serves.
pub static COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "deduct",
        arity: -4,
        max_args: Some(5),
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Deducts qty units of a sku's stock once per request_id. Replies [code, remain, order_no, version]: 0 ok, 1 duplicate, 2 insufficient stock, 3 invalid parameters, 4 revoked.",
        args: &[
            arg("sku", "string"),
            arg("qty", "integer"),
            arg("request_id", "string"),
            optional("order_no", "string"),
        ],
        subcommands: &[],
    },
    CommandSpec {
        name: "revert",
        arity: 3,
        max_args: None,
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Gives back what one request_id deducted, once. Replies like DEDUCT: 0 given back, 1 already reverted, 3 invalid, 4 nothing was deducted (the id is revoked).",
        args: &[arg("sku", "string"), arg("request_id", "string")],
        subcommands: &[],
    },
    spec(
        "stock.get",
        2,
        "stockgate",
        "Returns a sku's stock, or nil when it has none.",
        &[arg("sku", "string")],
    ),
    CommandSpec {
        name: "stock.set",
        arity: 3,
        max_args: None,
        flags: &["write", "admin"],
        group: "stockgate",
        summary: "Sets a sku's stock (needs --admin-commands).",
        args: &[arg("sku", "string"), arg("qty", "integer")],
        subcommands: &[],
    },
    CommandSpec {
        name: "stock.add",
        arity: 3,
        max_args: None,
        flags: &["write", "admin"],
        group: "stockgate",
        summary: "Adds a signed delta to a sku's stock, never below 0 (needs --admin-commands).",
        args: &[arg("sku", "string"), arg("delta", "integer")],
        subcommands: &[],
    },
    spec(
        "stock.status",
        3,
        "stockgate",
        "Returns one request's state (none, DEDUCTED, REVERTED, REVOKED), qty, order_no and remaining TTL.",
        &[arg("sku", "string"), arg("request_id", "string")],
    ),
    spec(
        "ping",
        -1,
        "connection",
        "Returns PONG, or the message.",
        &[optional("message", "string")],
    ),
    spec(
        "echo",
        2,
        "connection",
        "Returns the message.",
        &[arg("message", "string")],
    ),
    spec(
        "hello",
        -1,
        "connection",
        "Handshakes: picks RESP2 or RESP3, authenticates, names the connection.",
        &[optional("protover", "integer")],
    ),
    spec(
        "auth",
        -2,
        "connection",
        "Authenticates the connection.",
        &[optional("username", "string"), arg("password", "string")],
    ),
    CommandSpec {
        name: "client",
        arity: -2,
        max_args: None,
        flags: &[],
        group: "connection",
        summary: "A container for connection commands.",
        args: &[],
        subcommands: &[
            spec(
                "client|setname",
                3,
                "connection",
                "Names the connection.",
                &[arg("connection-name", "string")],
            ),
            spec(
                "client|getname",
                2,
                "connection",
                "Returns the connection's name.",
                &[],
            ),
            spec(
                "client|setinfo",
                4,
                "connection",
                "Records the client library's name or version.",
                &[arg("attr", "string"), arg("value", "string")],
            ),
            spec(
                "client|id",
                2,
                "connection",
                "Returns the connection's id.",
                &[],
            ),
        ],
    },
    spec(
        "select",
        2,
        "connection",
        "Selects database 0, the only one.",
        &[arg("index", "integer")],
    ),
    spec("quit", -1, "connection", "Closes the connection.", &[]),
    spec(
        "info",
        -1,
        "server",
        "Returns stockgate's figures in INFO sections.",
        &[optional("section", "string")],
    ),
    CommandSpec {
        name: "command",
        arity: -1,
        max_args: None,
        flags: &[],
        group: "server",
        summary: "Describes the commands stockgate serves.",
        args: &[],
        subcommands: &[
            spec(
                "command|count",
                2,
                "server",
                "Returns the number of commands.",
                &[],
            ),
            spec(
                "command|docs",
                -2,
                "server",
                "Returns documentation about commands.",
                &[optional("command-name", "string")],
            ),
            spec(
                "command|info",
                -2,
                "server",
                "Returns information about commands.",
                &[optional("command-name", "string")],
            ),
            spec(
                "command|list",
                -2,
                "server",
                "Returns the names of the commands.",
                &[],
            ),
        ],
    },
];

/// Per-connection state that commands read and change.
#[derive(Debug)]
pub struct Session {
    pub id: u64,
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
            protocol: Protocol::Resp2,
            name: None,
            lib_name: None,
            lib_version: None,
            authenticated,
        }
    }
}

/// What an unauthenticated client may do, as in Redis.
fn allowed_before_auth(name: &str) -> bool {
    matches!(name, "auth" | "hello" | "ping" | "quit")
}

/// What the connection does with one request.
pub enum Action {
    /// Reply now (in order with the others).
    Reply(Reply),
    /// Run a stock command against Redis; the arguments after the name.
    Stock(StockCommand, Vec<Bytes>),
    /// Reply, then close the connection (QUIT).
    Close(Reply),
}

/// Decides what one request does. Connection-level commands run here, on
/// the spot; stock commands are handed back to run against Redis.
pub fn execute(request: Request, session: &mut Session, shared: &Shared) -> Action {
    let name = request.name();
    let Some(spec) = COMMANDS
        .iter()
        .find(|c| c.name.as_bytes().eq_ignore_ascii_case(name))
    else {
        return Action::Reply(unknown_command(&request.args));
    };
    if !session.authenticated && !allowed_before_auth(spec.name) {
        return Action::Reply(Reply::error(NOAUTH));
    }
    if !arity_ok(spec, request.args.len()) {
        return Action::Reply(wrong_arity(spec.name));
    }
    let args = &request.args[1..];
    let password = shared.config.password.as_ref();
    let stock = match spec.name {
        "deduct" => Some(StockCommand::Deduct),
        "revert" => Some(StockCommand::Revert),
        "stock.get" => Some(StockCommand::Get),
        "stock.set" => Some(StockCommand::Set),
        "stock.add" => Some(StockCommand::Add),
        "stock.status" => Some(StockCommand::Status),
        _ => None,
    };
    if let Some(command) = stock {
        let mut args = request.args;
        args.remove(0);
        return Action::Stock(command, args);
    }
    let reply = match spec.name {
        "quit" => return Action::Close(Reply::Simple("OK")),
        "ping" => match args.first() {
            Some(message) => Reply::Bulk(message.clone()),
            None => Reply::Simple("PONG"),
        },
        "echo" => Reply::Bulk(args[0].clone()),
        "hello" => hello(args, session, password, &shared.metrics),
        "auth" => auth(args, session, password, &shared.metrics),
        "select" => match &args[0][..] {
            b"0" => Reply::Simple("OK"),
            _ => Reply::error("ERR DB index is out of range"),
        },
        "client" => client(args, spec, session),
        "info" => Reply::Bulk(info(shared, args).into()),
        "command" => command(args),
        other => unreachable!("command {other} is in the table but not dispatched"),
    };
    Action::Reply(reply)
}

fn arity_ok(spec: &CommandSpec, count: usize) -> bool {
    let count = count as i64;
    let arity_ok = if spec.arity >= 0 {
        count == spec.arity
    } else {
        count >= -spec.arity
    };
    arity_ok && spec.max_args.is_none_or(|max| count <= max as i64)
}

/// Redis's wording, which clients and humans already recognise.
pub fn wrong_arity(name: &str) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{}' command",
        name.replace('|', " ")
    ))
}

fn unknown_command(args: &[Bytes]) -> Reply {
    let mut text = format!(
        "ERR unknown command '{}', with args beginning with: ",
        sanitize(&args[0], 128)
    );
    for arg in args.iter().skip(1) {
        if text.len() > 256 {
            break;
        }
        let _ = write!(text, "'{}' ", sanitize(arg, 128));
    }
    Reply::Error(text)
}

fn unknown_subcommand(sub: &[u8], command: &str) -> Reply {
    Reply::error(format!(
        "ERR unknown subcommand '{}'. Try {} HELP.",
        sanitize(sub, 128),
        command.to_ascii_uppercase()
    ))
}

/// An argument made safe to quote in a one-line error.
fn sanitize(arg: &[u8], max: usize) -> String {
    let shown = &arg[..arg.len().min(max)];
    String::from_utf8_lossy(shown)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `HELLO [protover [AUTH username password] [SETNAME clientname]]`
fn hello(
    args: &[Bytes],
    session: &mut Session,
    password: Option<&Password>,
    metrics: &Metrics,
) -> Reply {
    let mut protocol = session.protocol;
    let mut rest = args;
    if let Some(version) = args.first() {
        protocol = match &version[..] {
            b"2" => Protocol::Resp2,
            b"3" => Protocol::Resp3,
            _ if std::str::from_utf8(version).is_ok_and(|v| v.parse::<i64>().is_ok()) => {
                return Reply::error("NOPROTO unsupported protocol version");
            }
            _ => return Reply::error("ERR Protocol version is not an integer or out of range"),
        };
        rest = &args[1..];
    }
    let mut setname = None;
    let mut credentials = None;
    while let Some(option) = rest.first() {
        if option.eq_ignore_ascii_case(b"AUTH") && rest.len() >= 3 {
            credentials = Some((&rest[1], &rest[2]));
            rest = &rest[3..];
        } else if option.eq_ignore_ascii_case(b"SETNAME") && rest.len() >= 2 {
            setname = Some(rest[1].clone());
            rest = &rest[2..];
        } else {
            return Reply::error(format!(
                "ERR Syntax error in HELLO option '{}'",
                sanitize(option, 64)
            ));
        }
    }
    // Without a password configured, any credentials are accepted, as
    // Redis's default `nopass` user does.
    if let Some(password) = password {
        match credentials {
            Some((user, pass)) if password.accepts(Some(user), pass) => {}
            Some(_) => {
                metrics.auth_failed();
                return Reply::error(WRONGPASS);
            }
            None if !session.authenticated => {
                return Reply::error(
                    "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
                );
            }
            None => {}
        }
    }
    if let Some(name) = setname {
        if let Err(reply) = check_client_name(&name) {
            return reply;
        }
        session.name = (!name.is_empty()).then_some(name);
    }
    session.authenticated = true;
    session.protocol = protocol;
    Reply::Map(vec![
        (Reply::bulk("server"), Reply::bulk("stockgate")),
        (Reply::bulk("version"), Reply::bulk(REDIS_COMPAT_VERSION)),
        (
            Reply::bulk("proto"),
            Reply::Integer(if protocol == Protocol::Resp3 { 3 } else { 2 }),
        ),
        (Reply::bulk("id"), Reply::Integer(session.id as i64)),
        (Reply::bulk("mode"), Reply::bulk("standalone")),
        (Reply::bulk("role"), Reply::bulk("master")),
        (Reply::bulk("modules"), Reply::Array(vec![])),
    ])
}

/// `AUTH [username] password`. Without a password configured it answers
/// as a Redis without one does.
fn auth(
    args: &[Bytes],
    session: &mut Session,
    password: Option<&Password>,
    metrics: &Metrics,
) -> Reply {
    let (user, pass) = match args {
        [pass] => (None, pass),
        [user, pass] => (Some(&user[..]), pass),
        _ => return Reply::error("ERR syntax error"),
    };
    let Some(password) = password else {
        return match user {
            None => Reply::error(
                "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            ),
            Some(_) => Reply::Simple("OK"),
        };
    };
    if password.accepts(user, pass) {
        session.authenticated = true;
        Reply::Simple("OK")
    } else {
        metrics.auth_failed();
        Reply::error(WRONGPASS)
    }
}

fn check_client_name(name: &[u8]) -> Result<(), Reply> {
    if name.iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
        return Err(Reply::error(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(())
}

fn client(args: &[Bytes], spec: &CommandSpec, session: &mut Session) -> Reply {
    let Some(sub) = spec.subcommands.iter().find(|s| {
        s.name
            .split_once('|')
            .is_some_and(|(_, n)| n.as_bytes().eq_ignore_ascii_case(&args[0]))
    }) else {
        return unknown_subcommand(&args[0], spec.name);
    };
    if !arity_ok(sub, args.len() + 1) {
        return wrong_arity(sub.name);
    }
    match sub.name {
        "client|setname" => match check_client_name(&args[1]) {
            Ok(()) => {
                session.name = (!args[1].is_empty()).then(|| args[1].clone());
                Reply::Simple("OK")
            }
            Err(reply) => reply,
        },
        "client|getname" => session.name.clone().map_or(Reply::Null, Reply::Bulk),
        "client|setinfo" => {
            let value = args[2].clone();
            if args[1].eq_ignore_ascii_case(b"LIB-NAME") {
                session.lib_name = Some(value);
            } else if args[1].eq_ignore_ascii_case(b"LIB-VER") {
                session.lib_version = Some(value);
            } else {
                return Reply::error(format!(
                    "ERR Unrecognized option '{}'",
                    sanitize(&args[1], 64)
                ));
            }
            Reply::Simple("OK")
        }
        "client|id" => Reply::Integer(session.id as i64),
        other => unreachable!("subcommand {other} is in the table but not dispatched"),
    }
}

/// `COMMAND`, `COMMAND COUNT|DOCS|INFO|LIST`.
fn command(args: &[Bytes]) -> Reply {
    let Some(sub) = args.first() else {
        return Reply::Array(COMMANDS.iter().map(command_info).collect());
    };
    let wanted = |spec: &&CommandSpec| {
        args.len() < 2
            || args[1..]
                .iter()
                .any(|n| n.eq_ignore_ascii_case(spec.name.as_bytes()))
    };
    match sub.to_ascii_uppercase().as_slice() {
        b"COUNT" if args.len() == 1 => Reply::Integer(COMMANDS.len() as i64),
        b"LIST" => Reply::Array(COMMANDS.iter().map(|c| Reply::bulk(c.name)).collect()),
        b"INFO" => Reply::Array(
            args[1..]
                .iter()
                .map(|n| {
                    COMMANDS
                        .iter()
                        .find(|c| n.eq_ignore_ascii_case(c.name.as_bytes()))
                        .map_or(Reply::Null, command_info)
                })
                .collect(),
        ),
        b"DOCS" => Reply::Map(
            COMMANDS
                .iter()
                .filter(wanted)
                .map(|c| (Reply::bulk(c.name), command_docs(c)))
                .collect(),
        ),
        b"COUNT" => wrong_arity("command|count"),
        _ => unknown_subcommand(sub, "command"),
    }
}

/// One `COMMAND` entry: name, arity, flags, first key, last key, step,
/// ACL categories, tips, key specs, subcommands. DEDUCT names no key
/// arguments: stockgate builds the keys itself.
fn command_info(spec: &CommandSpec) -> Reply {
    let statuses =
        |list: &[&'static str]| Reply::Array(list.iter().map(|s| Reply::Simple(s)).collect());
    Reply::Array(vec![
        Reply::bulk(spec.name.replace('|', " ")),
        Reply::Integer(spec.arity),
        statuses(spec.flags),
        Reply::Integer(0),
        Reply::Integer(0),
        Reply::Integer(0),
        Reply::Array(vec![]),
        Reply::Array(vec![]),
        Reply::Array(vec![]),
        Reply::Array(spec.subcommands.iter().map(command_info).collect()),
    ])
}

/// One `COMMAND DOCS` entry. redis-cli builds its hints from these and
/// asserts on their types: every field a bulk string, argument flags status
/// strings, every argument with a `type`.
fn command_docs(spec: &CommandSpec) -> Reply {
    let mut fields = vec![
        (Reply::bulk("summary"), Reply::bulk(spec.summary)),
        (Reply::bulk("since"), Reply::bulk("1.0.0")),
        (Reply::bulk("group"), Reply::bulk(spec.group)),
        (Reply::bulk("complexity"), Reply::bulk("O(1)")),
    ];
    if !spec.args.is_empty() {
        let args = spec
            .args
            .iter()
            .map(|a| {
                let mut arg = vec![
                    (Reply::bulk("name"), Reply::bulk(a.name)),
                    (Reply::bulk("type"), Reply::bulk(a.kind)),
                ];
                if a.optional {
                    arg.push((
                        Reply::bulk("flags"),
                        Reply::Array(vec![Reply::Simple("optional")]),
                    ));
                }
                Reply::Map(arg)
            })
            .collect();
        fields.push((Reply::bulk("arguments"), Reply::Array(args)));
    }
    if !spec.subcommands.is_empty() {
        let subs = spec
            .subcommands
            .iter()
            .map(|s| (Reply::bulk(s.name), command_docs(s)))
            .collect();
        fields.push((Reply::bulk("subcommands"), Reply::Map(subs)));
    }
    Reply::Map(fields)
}

/// `INFO [section ...]`: Redis's `# Section` and `key:value` lines.
/// ioredis's ready check reads `loading:0`; clients read `redis_version`.
fn info(shared: &Shared, args: &[Bytes]) -> String {
    let wanted = |section: &str| {
        args.is_empty()
            || args.iter().any(|a| {
                a.eq_ignore_ascii_case(section.as_bytes())
                    || a.eq_ignore_ascii_case(b"all")
                    || a.eq_ignore_ascii_case(b"everything")
                    || a.eq_ignore_ascii_case(b"default")
            })
    };
    let mut out = String::new();
    let upstream = &shared.upstream;
    if wanted("server") {
        let _ = write!(
            out,
            "# Server\r\nredis_version:{REDIS_COMPAT_VERSION}\r\nstockgate_version:{}\r\nredis_mode:standalone\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            shared.local_port,
            shared.started.elapsed().as_secs(),
        );
    }
    if wanted("clients") {
        let _ = write!(
            out,
            "# Clients\r\nconnected_clients:{}\r\n\r\n",
            shared.clients.load(Ordering::Relaxed)
        );
    }
    if wanted("persistence") {
        out.push_str("# Persistence\r\nloading:0\r\n\r\n");
    }
    if wanted("replication") {
        out.push_str("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\r\n");
    }
    if wanted("stats") {
        out.push_str("# Stats\r\n");
        for (command, result, count) in shared.metrics.request_totals() {
            let _ = write!(out, "{command}_{result}:{count}\r\n");
        }
        for (kind, count) in shared.metrics.upstream_error_totals() {
            let _ = write!(out, "upstream_errors_{kind}:{count}\r\n");
        }
        out.push_str("\r\n");
    }
    if wanted("stockgate") {
        let _ = write!(
            out,
            "# Stockgate\r\nscript_version:{}\r\nscript_sha:{}\r\nrevert_script_sha:{}\r\nupstream_mode:{}\r\nupstream_ready:{}\r\nupstream_seeds:{}\r\nupstream_primaries:{}\r\nkey_prefix:{}\r\nretry_window_seconds:{}\r\n\r\n",
            crate::outcome::SCRIPT_VERSION,
            shared.service.scripts().deduct.sha,
            shared.service.scripts().revert.sha,
            upstream.mode().map_or("unknown", |m| m.as_str()),
            u8::from(upstream.is_ready()),
            upstream.seeds().join(","),
            upstream
                .nodes()
                .iter()
                .map(|n| format!("{}:{}", n.host, n.port))
                .collect::<Vec<_>>()
                .join(","),
            shared.config.keys.prefix(),
            shared.config.retry_window.as_secs(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arity_follows_the_table() {
        let deduct = COMMANDS.iter().find(|c| c.name == "deduct").unwrap();
        assert!(!arity_ok(deduct, 3));
        assert!(arity_ok(deduct, 4));
        assert!(arity_ok(deduct, 5));
        assert!(!arity_ok(deduct, 6));
        assert_eq!(
            wrong_arity("deduct"),
            Reply::error("ERR wrong number of arguments for 'deduct' command")
        );
    }

    #[test]
    fn unknown_commands_quote_their_arguments_like_redis() {
        let args = vec![
            Bytes::from_static(b"FOO"),
            Bytes::from_static(b"a"),
            Bytes::from_static(b"b\r\nc"),
        ];
        assert_eq!(
            unknown_command(&args),
            Reply::error("ERR unknown command 'FOO', with args beginning with: 'a' 'b  c' ")
        );
    }

    #[test]
    fn hello_switches_protocol_and_names_the_connection() {
        let mut session = Session::new(7, true);
        let metrics = Metrics::new();
        let reply = hello(
            &[
                Bytes::from_static(b"3"),
                Bytes::from_static(b"setname"),
                Bytes::from_static(b"app"),
            ],
            &mut session,
            None,
            &metrics,
        );
        assert_eq!(session.protocol, Protocol::Resp3);
        assert_eq!(session.name.as_deref(), Some(&b"app"[..]));
        let Reply::Map(fields) = reply else {
            panic!("HELLO replies with a map")
        };
        assert!(fields.contains(&(Reply::bulk("proto"), Reply::Integer(3))));
        assert!(fields.contains(&(Reply::bulk("id"), Reply::Integer(7))));
        assert_eq!(
            hello(&[Bytes::from_static(b"4")], &mut session, None, &metrics),
            Reply::error("NOPROTO unsupported protocol version")
        );
        assert_eq!(
            session.protocol,
            Protocol::Resp3,
            "a refused HELLO changes nothing"
        );
    }

    #[test]
    fn docs_cover_every_command_with_the_types_redis_cli_asserts() {
        let Reply::Map(entries) = command(&[Bytes::from_static(b"DOCS")]) else {
            panic!("COMMAND DOCS replies with a map")
        };
        assert_eq!(entries.len(), COMMANDS.len());
        for (name, doc) in entries {
            assert!(matches!(name, Reply::Bulk(_)));
            let Reply::Map(fields) = doc else {
                panic!("each doc is a map")
            };
            for key in ["summary", "since", "group"] {
                assert!(
                    fields
                        .iter()
                        .any(|(k, v)| *k == Reply::bulk(key) && matches!(v, Reply::Bulk(_))),
                    "{key}"
                );
            }
        }
    }
}
