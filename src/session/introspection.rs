//! COMMAND and its subcommands: the command table, describing itself.
//!
//! # Format
//!
//! ```text
//! COMMAND
//! COMMAND COUNT
//! COMMAND LIST
//! COMMAND INFO [command-name ...]
//! COMMAND DOCS [command-name ...]
//! COMMAND HELP
//! ```
//!
//! A command name may be a subcommand's, `client|setname`, as in Redis.
//! redis-cli builds its hints and `help DEDUCT` from COMMAND DOCS.

use crate::command::spec::{
    Call, CommandSpec, SINCE, Serve, help_subcommand, optional_many, session,
};
use crate::reply::Reply;

pub const COMMAND: CommandSpec = CommandSpec {
    name: "command",
    arity: -1,
    max_args: None,
    flags: &[],
    group: "server",
    summary: "Describes the commands stockgate serves.",
    args: &[],
    subcommands: &[
        session(
            "command|count",
            2,
            "server",
            "Returns the number of commands.",
            &[],
            |call| Reply::Integer(call.table.len() as i64),
        ),
        session(
            "command|docs",
            -2,
            "server",
            "Returns documentation about commands, or about all of them.",
            &[optional_many("command-name", "string")],
            docs,
        ),
        session(
            "command|info",
            -2,
            "server",
            "Returns information about commands, or about all of them.",
            &[optional_many("command-name", "string")],
            info,
        ),
        session(
            "command|list",
            -2,
            "server",
            "Returns the names of the commands.",
            &[],
            |call| Reply::Array(call.table.iter().map(|c| Reply::bulk(c.name)).collect()),
        ),
        help_subcommand("command|help", "server"),
    ],
    // `COMMAND` alone; with a word more it is one of the subcommands.
    serve: Serve::Session(|call| Reply::Array(call.table.iter().map(command_info).collect())),
};

/// A command by the name COMMAND INFO and DOCS take: `ping`, or a
/// subcommand's full name, `client|setname`; in any case.
fn find<'t>(table: &'t [CommandSpec], name: &[u8]) -> Option<&'t CommandSpec> {
    let (parent, sub) = match name.iter().position(|&b| b == b'|') {
        Some(bar) => (&name[..bar], Some(&name[bar + 1..])),
        None => (name, None),
    };
    let spec = table
        .iter()
        .find(|c| parent.eq_ignore_ascii_case(c.name.as_bytes()))?;
    match sub {
        None => Some(spec),
        Some(sub) => spec
            .subcommands
            .iter()
            .find(|s| sub.eq_ignore_ascii_case(s.sub_name().as_bytes())),
    }
}

/// One entry per name asked for, nil for a name not known; every command
/// when none is named.
fn info(call: &mut Call<'_>) -> Reply {
    if call.args.is_empty() {
        return Reply::Array(call.table.iter().map(command_info).collect());
    }
    Reply::Array(
        call.args
            .iter()
            .map(|name| find(call.table, name).map_or(Reply::Null, command_info))
            .collect(),
    )
}

/// The names asked for that are known, in the order asked; every command
/// when none is named.
fn docs(call: &mut Call<'_>) -> Reply {
    let specs: Vec<&CommandSpec> = if call.args.is_empty() {
        call.table.iter().collect()
    } else {
        call.args
            .iter()
            .filter_map(|name| find(call.table, name))
            .collect()
    };
    Reply::Map(
        specs
            .into_iter()
            .map(|c| (Reply::bulk(c.name), command_docs(c)))
            .collect(),
    )
}

/// One `COMMAND` entry: name, arity, flags, first key, last key, step,
/// ACL categories, tips, key specs, subcommands. DEDUCT names no key
/// arguments: stockgate builds the keys itself.
fn command_info(spec: &CommandSpec) -> Reply {
    let statuses =
        |list: &[&'static str]| Reply::Array(list.iter().map(|s| Reply::Simple(s)).collect());
    Reply::Array(vec![
        Reply::bulk(spec.name),
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
        (Reply::bulk("since"), Reply::bulk(SINCE)),
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
                let flags: Vec<Reply> = [(a.optional, "optional"), (a.multiple, "multiple")]
                    .into_iter()
                    .filter(|(set, _)| *set)
                    .map(|(_, flag)| Reply::Simple(flag))
                    .collect();
                if !flags.is_empty() {
                    arg.push((Reply::bulk("flags"), Reply::Array(flags)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::COMMANDS;

    #[test]
    fn docs_cover_every_command_with_the_types_redis_cli_asserts() {
        let entries: Vec<_> = COMMANDS
            .iter()
            .map(|c| (Reply::bulk(c.name), command_docs(c)))
            .collect();
        assert!(entries.len() >= 10);
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
            // `since` is the stockgate version a command appeared in.
            assert!(fields.contains(&(Reply::bulk("since"), Reply::bulk("0.1.0"))));
        }
    }

    #[test]
    fn subcommands_are_found_by_their_full_name() {
        let sub = find(&COMMANDS, b"CLIENT|SetName").expect("client|setname");
        assert_eq!(sub.name, "client|setname");
        assert!(find(&COMMANDS, b"client|nosuch").is_none());
        assert!(find(&COMMANDS, b"ping|x").is_none());
        assert_eq!(find(&COMMANDS, b"Ping").map(|c| c.name), Some("ping"));
    }
}
