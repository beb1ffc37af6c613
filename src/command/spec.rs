//! What a command is and how it is served: its name, arity, flags and
//! documented arguments, and who answers it. Every connection-level
//! command file describes itself with one [`CommandSpec`]; a stock command
//! describes itself with a [`Doc`] ([`crate::doc`], a leaf, so that the
//! stock service imports nothing about dispatch), which [`stock`] pairs
//! with the stock service. [`crate::dispatch::COMMANDS`]
//! lists them all, and lookup, arity checks, `COMMAND`, `COMMAND DOCS` and
//! `HELP` read nothing else.
//!
//! The errors about a request's shape (wrong arity, unknown command or
//! subcommand) live here too, in Redis's own wording, which clients and
//! humans already recognise: `tests/conformance.rs` compares them with a
//! real redis-server's, byte for byte.

use crate::command::Session;
pub use crate::doc::{ArgSpec, Doc, arg, optional, optional_many};
use crate::reply::Reply;
use crate::state::Shared;
use crate::stock::StockCommand;
use bytes::Bytes;

/// The stockgate version every command in the table appeared in: all of
/// them came with 0.1.0, the first. `COMMAND DOCS` reports it as `since`
/// (Redis reports its own version there). A command added in a later
/// version needs its own: give [`CommandSpec`] a `since` field then.
pub const SINCE: &str = "0.1.0";

/// One command: what `COMMAND` and `COMMAND DOCS` say about it, how many
/// arguments it takes, and who answers it.
#[derive(Clone, Copy)]
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

/// A stock command's table entry: its own file's [`Doc`], served by the
/// stock service.
pub const fn stock(command: StockCommand) -> CommandSpec {
    let doc = &command.describe().doc;
    CommandSpec {
        name: doc.name,
        arity: doc.arity,
        max_args: doc.max_args,
        flags: doc.flags,
        group: doc.group,
        summary: doc.summary,
        args: doc.args,
        subcommands: &[],
        serve: Serve::Stock(command),
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
        crate::doc::arity_fits(self.arity, self.max_args, count)
    }

    /// A subcommand's own name: `setname` for `client|setname`.
    pub fn sub_name(&self) -> &'static str {
        self.name.split_once('|').map_or(self.name, |(_, sub)| sub)
    }
}

/// The command a request names, found as Redis's `lookupCommand` finds
/// it: by its first word, case-insensitively, and for a container
/// (`CLIENT`, `COMMAND`) given at least one more word, the subcommand that
/// word names. An unknown command or subcommand is answered in Redis's
/// words, before arity and before the password gate, as Redis does.
pub fn resolve<'t>(table: &'t [CommandSpec], args: &[Bytes]) -> Result<&'t CommandSpec, Reply> {
    let Some(spec) = table
        .iter()
        .find(|c| c.name.as_bytes().eq_ignore_ascii_case(&args[0]))
    else {
        return Err(unknown_command(args));
    };
    let Some(sub_name) = args.get(1).filter(|_| !spec.subcommands.is_empty()) else {
        return Ok(spec);
    };
    spec.subcommands
        .iter()
        .find(|s| s.sub_name().as_bytes().eq_ignore_ascii_case(sub_name))
        .ok_or_else(|| unknown_subcommand(sub_name, &args[0]))
}

/// `-ERR wrong number of arguments for 'x' command`, naming a subcommand
/// `client|setname` as Redis does (its `fullname`).
pub fn wrong_arity(name: &str) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

/// `-ERR unknown command 'x', with args beginning with: 'a' 'b' `, built
/// as Redis's `commandCheckExistence` builds it: the name cut at 128
/// bytes, then arguments quoted while fewer than 128 bytes of them are
/// shown, each cut to what is left of the 128.
pub fn unknown_command(args: &[Bytes]) -> Reply {
    let mut quoted = Vec::new();
    for arg in &args[1..] {
        if quoted.len() >= 128 {
            break;
        }
        let room = 128 - quoted.len();
        quoted.push(b'\'');
        quoted.extend_from_slice(c_str(arg, room));
        quoted.extend_from_slice(b"' ");
    }
    Reply::Error(format!(
        "ERR unknown command '{}', with args beginning with: {}",
        shown(c_str(&args[0], 128)),
        shown(&quoted)
    ))
}

/// `-ERR unknown subcommand 'x'. Try CLIENT HELP.`: the container as the
/// client spelled it, in capitals, as Redis writes it.
pub fn unknown_subcommand(sub: &[u8], command: &[u8]) -> Reply {
    Reply::error(format!(
        "ERR unknown subcommand '{}'. Try {} HELP.",
        shown(c_str(sub, 128)),
        shown(command).to_ascii_uppercase()
    ))
}

/// An argument as Redis's `%.Ns` prints it into an error: up to its first
/// NUL byte (Redis's strings end there when formatted), at most `max`
/// bytes. CR and LF become spaces when the reply is written
/// ([`crate::reply`]), as Redis maps them too.
pub fn c_str(arg: &[u8], max: usize) -> &[u8] {
    let end = arg.iter().position(|&b| b == 0).unwrap_or(arg.len());
    &arg[..end.min(max)]
}

/// Bytes quoted in an error reply, which is text: bytes that are not
/// UTF-8 show as U+FFFD, where Redis would echo them raw.
pub fn shown(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `CLIENT HELP`, `COMMAND HELP`: every subcommand of the container with
/// its usage and summary, as Redis's `addReplyHelp` lays them out: a
/// header, a usage line and an indented description per subcommand, and
/// HELP itself last.
pub fn help(call: &mut Call<'_>) -> Reply {
    let parent = call
        .spec
        .name
        .split_once('|')
        .map_or(call.spec.name, |(p, _)| p);
    let Some(container) = call.table.iter().find(|c| c.name == parent) else {
        return Reply::error("ERR no help for this command");
    };
    let upper = parent.to_ascii_uppercase();
    let mut lines = vec![Reply::Status(format!(
        "{upper} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"
    ))];
    for sub in container
        .subcommands
        .iter()
        .filter(|s| s.sub_name() != "help")
    {
        let mut usage = sub.sub_name().to_ascii_uppercase();
        for arg in sub.args {
            let mut shown = format!("<{}>", arg.name);
            if arg.multiple {
                shown.push_str(" ...");
            }
            if arg.optional {
                shown = format!("[{shown}]");
            }
            usage.push(' ');
            usage.push_str(&shown);
        }
        lines.push(Reply::Status(usage));
        lines.push(Reply::Status(format!("    {}", sub.summary)));
    }
    lines.push(Reply::Simple("HELP"));
    lines.push(Reply::Simple("    Print this help."));
    Reply::Array(lines)
}

/// The `HELP` subcommand of a container: `client|help`, `command|help`.
pub const fn help_subcommand(name: &'static str, group: &'static str) -> CommandSpec {
    session(
        name,
        2,
        group,
        "Returns helpful text about the different subcommands.",
        &[],
        help,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::Protocol;

    fn wire(reply: &Reply) -> String {
        let mut out = bytes::BytesMut::new();
        reply.encode(Protocol::Resp2, &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn unknown_commands_quote_their_arguments_like_redis() {
        let args = vec![
            Bytes::from_static(b"FOO"),
            Bytes::from_static(b"a\t"),
            Bytes::from_static(b"b\r\nc"),
        ];
        // Tabs stay; CR and LF become spaces on the wire.
        assert_eq!(
            wire(&unknown_command(&args)),
            "-ERR unknown command 'FOO', with args beginning with: 'a\t' 'b  c' \r\n"
        );
        // Measured on redis-server 7.0.15: arguments are shown while fewer
        // than 128 bytes of them are, each cut to what is left.
        let long = vec![
            Bytes::from_static(b"NOSUCH"),
            Bytes::from(vec![b'a'; 100]),
            Bytes::from(vec![b'b'; 100]),
            Bytes::from_static(b"c"),
        ];
        assert_eq!(
            unknown_command(&long),
            Reply::Error(format!(
                "ERR unknown command 'NOSUCH', with args beginning with: '{}' '{}' ",
                "a".repeat(100),
                "b".repeat(25)
            ))
        );
        // Redis's strings end at a NUL byte when it formats them.
        let nul = vec![
            Bytes::from_static(b"NO\0SUCH"),
            Bytes::from_static(b"x\0yz"),
        ];
        assert_eq!(
            unknown_command(&nul),
            Reply::error("ERR unknown command 'NO', with args beginning with: 'x' ")
        );
        assert_eq!(
            wrong_arity("client|setname"),
            Reply::error("ERR wrong number of arguments for 'client|setname' command")
        );
        assert_eq!(
            unknown_subcommand(b"kill", b"client"),
            Reply::error("ERR unknown subcommand 'kill'. Try CLIENT HELP.")
        );
    }
}
