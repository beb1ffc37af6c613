//! From a request to what to do with it: the command table, the password
//! gate, arity checks, the user's rights, and dispatch.
//!
//! [`COMMANDS`] is the one place that lists the commands stockgate serves;
//! each command describes itself in its own file, under [`crate::stock`]
//! (a [`crate::doc::Doc`], paired here with the stock service) or
//! [`crate::session`] (a [`CommandSpec`] with who answers it). Names are
//! matched case-insensitively. A request is checked in Redis's order
//! (`processCommand`): the command and subcommand exist, the arity fits,
//! and only then the password and the rights a stock command needs (its
//! own file names them; `-NOPERM` in Redis's words when the user lacks
//! them, and nothing runs), so a malformed request is told what is
//! wrong with it even before AUTH. An unknown command gets Redis's own
//! error and the connection stays open.
//!
//! It sits above both kinds of command, so that neither imports it: what a
//! command is ([`crate::command`]) and who answers it stay below.

use crate::auth::NOAUTH;
use crate::command::Session;
use crate::command::spec::{self, Call, CommandSpec, Serve, resolve, wrong_arity};
use crate::frame::Request;
use crate::reply::Reply;
use crate::session::{basics, client, hello, info, introspection};
use crate::state::Shared;
use crate::stock::StockCommand;
use bytes::Bytes;

/// The connection-level commands, each described in its own file under
/// [`crate::session`].
const SESSION: &[CommandSpec] = &[
    basics::PING,
    basics::ECHO,
    hello::HELLO,
    hello::AUTH,
    client::CLIENT,
    basics::SELECT,
    basics::QUIT,
    basics::RESET,
    info::INFO,
    introspection::COMMAND,
];

/// How many commands stockgate serves.
const SERVED: usize = StockCommand::ALL.len() + SESSION.len();

/// Every command stockgate serves, in the order `COMMAND` lists them: the
/// stock commands in their list's order, each as its own file describes
/// it, then the connection-level ones.
pub static COMMANDS: [CommandSpec; SERVED] = {
    let mut table = [basics::PING; SERVED];
    let mut i = 0;
    while i < StockCommand::ALL.len() {
        table[i] = spec::stock(StockCommand::ALL[i]);
        i += 1;
    }
    let mut j = 0;
    while j < SESSION.len() {
        table[i + j] = SESSION[j];
        j += 1;
    }
    table
};

/// What an unauthenticated client may do: Redis's `no-auth` commands.
/// PING is not one of them (Redis answers it NOAUTH too).
fn allowed_before_auth(name: &str) -> bool {
    matches!(name, "auth" | "hello" | "quit" | "reset")
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
    let spec = match resolve(&COMMANDS, &request.args) {
        Ok(spec) => spec,
        Err(reply) => return Action::Reply(reply),
    };
    if !spec.arity_ok(request.args.len()) {
        return Action::Reply(wrong_arity(spec.name));
    }
    if !session.authenticated && !allowed_before_auth(spec.name) {
        return Action::Reply(Reply::error(NOAUTH));
    }
    // The words that named the command: one, or two for a subcommand.
    let named = if spec.name.contains('|') { 2 } else { 1 };
    match spec.serve {
        Serve::Stock(command) => {
            let mut args = request.args;
            args.drain(..named);
            // Without passwords everyone is `default`, with every right:
            // nothing to look up.
            if let Some(account) = &session.account
                && !shared.users.is_open()
                && let Err(denial) = command.permitted(&account.grant(), &args)
            {
                shared
                    .metrics
                    .command_denied(account.name(), command.name());
                return Action::Reply(Reply::error(denial.reply(account.name(), command.name())));
            }
            Action::Stock(command, args)
        }
        Serve::Session(serve) => Action::Reply(serve(&mut Call {
            spec,
            args: &request.args[named..],
            session,
            shared,
            table: &COMMANDS,
        })),
        Serve::Quit => Action::Close(Reply::Simple("OK")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_listed_once_in_lowercase() {
        let mut names: Vec<&str> = COMMANDS.iter().map(|c| c.name).collect();
        assert!(names.iter().all(|n| *n == n.to_ascii_lowercase()));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), COMMANDS.len());
    }

    #[test]
    fn every_stock_command_is_served_once_under_its_own_name() {
        let served: Vec<StockCommand> = COMMANDS
            .iter()
            .filter_map(|spec| match spec.serve {
                Serve::Stock(command) => {
                    assert_eq!(
                        spec.name,
                        command.name(),
                        "{command:?}'s file describes another"
                    );
                    Some(command)
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            served,
            StockCommand::ALL,
            "the table lists the stock commands in the list's order"
        );
    }
}
