//! What a command is: its name, arity, flags and documented arguments, and
//! how it is served. Every command file describes itself with one
//! [`CommandSpec`]; [`crate::command::COMMANDS`] lists them all, and arity
//! checks, `COMMAND`, `COMMAND DOCS` and `HELP` read nothing else.
//!
//! The errors about a request's shape (wrong arity, unknown command or
//! subcommand) live here too, in Redis's own wording, which clients and
//! humans already recognise.

use crate::reply::Reply;
use crate::session::Session;
use crate::state::Shared;
use crate::stock::StockCommand;
use bytes::Bytes;
use std::fmt::Write as _;

/// One argument, as `COMMAND DOCS` describes it.
pub struct ArgSpec {
    pub name: &'static str,
    /// `string`, `integer` or `key`, as in Redis's docs.
    pub kind: &'static str,
    pub optional: bool,
}

/// One command: what `COMMAND` and `COMMAND DOCS` say about it, how many
/// arguments it takes, and who answers it.
pub struct CommandSpec {
    /// Lowercase, as Redis lists commands; a subcommand is `parent|sub`.
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
    pub serve: Serve,
}

/// Who answers a command.
#[derive(Clone, Copy)]
pub enum Serve {
    /// The stock service, against Redis.
    Stock(StockCommand),
    /// The connection itself, on the spot, from its session and the
    /// shared state.
    Session(fn(&mut Call<'_>) -> Reply),
    /// `+OK`, then the connection closes.
    Quit,
}

/// One connection-level command being answered.
pub struct Call<'a> {
    pub spec: &'static CommandSpec,
    /// The arguments after the command's name (after the subcommand's,
    /// for a subcommand).
    pub args: &'a [Bytes],
    pub session: &'a mut Session,
    pub shared: &'a Shared,
    /// Every command, for the ones that describe the others.
    pub table: &'static [CommandSpec],
}

pub const fn arg(name: &'static str, kind: &'static str) -> ArgSpec {
    ArgSpec {
        name,
        kind,
        optional: false,
    }
}

pub const fn optional(name: &'static str, kind: &'static str) -> ArgSpec {
    ArgSpec {
        name,
        kind,
        optional: true,
    }
}

/// A fast connection-level command without subcommands.
pub const fn session(
    name: &'static str,
    arity: i64,
    group: &'static str,
    summary: &'static str,
    args: &'static [ArgSpec],
    serve: fn(&mut Call<'_>) -> Reply,
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
        serve: Serve::Session(serve),
    }
}

impl CommandSpec {
    /// Whether `count` words (the name included) fit this command.
    pub fn arity_ok(&self, count: usize) -> bool {
        let count = count as i64;
        let arity_ok = if self.arity >= 0 {
            count == self.arity
        } else {
            count >= -self.arity
        };
        arity_ok && self.max_args.is_none_or(|max| count <= max as i64)
    }

    /// The name as a user types it: `client setname`, not `client|setname`.
    pub fn display_name(&self) -> String {
        self.name.replace('|', " ")
    }
}

/// Answers a container command (`CLIENT`, `COMMAND`) by its subcommand,
/// the first argument: found in `call.spec.subcommands`, arity-checked,
/// and served with the arguments after it.
pub fn serve_subcommand(call: &mut Call<'_>) -> Reply {
    let parent = call.spec;
    let Some(sub_name) = call.args.first() else {
        return wrong_arity(parent.name);
    };
    let Some(sub) = parent.subcommands.iter().find(|s| {
        s.name
            .split_once('|')
            .is_some_and(|(_, n)| n.as_bytes().eq_ignore_ascii_case(sub_name))
    }) else {
        return unknown_subcommand(sub_name, parent.name);
    };
    if !sub.arity_ok(call.args.len() + 1) {
        return wrong_arity(sub.name);
    }
    let Serve::Session(serve) = sub.serve else {
        unreachable!("{} is a subcommand served on the connection", sub.name)
    };
    let args = &call.args[1..];
    serve(&mut Call {
        spec: sub,
        args,
        session: call.session,
        shared: call.shared,
        table: call.table,
    })
}

/// `-ERR wrong number of arguments for 'x' command`.
pub fn wrong_arity(name: &str) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{}' command",
        name.replace('|', " ")
    ))
}

/// `-ERR unknown command 'x', with args beginning with: 'a' 'b' `.
pub fn unknown_command(args: &[Bytes]) -> Reply {
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

/// `-ERR unknown subcommand 'x'. Try CLIENT HELP.`
pub fn unknown_subcommand(sub: &[u8], command: &str) -> Reply {
    Reply::error(format!(
        "ERR unknown subcommand '{}'. Try {} HELP.",
        sanitize(sub, 128),
        command.to_ascii_uppercase()
    ))
}

/// An argument made safe to quote in a one-line error.
pub fn sanitize(arg: &[u8], max: usize) -> String {
    let shown = &arg[..arg.len().min(max)];
    String::from_utf8_lossy(shown)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            wrong_arity("client|setname"),
            Reply::error("ERR wrong number of arguments for 'client setname' command")
        );
    }
}
