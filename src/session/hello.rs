//! HELLO and AUTH: the protocol a connection speaks, its password, its name.
//!
//! # Format
//!
//! ```text
//! HELLO [protover [AUTH username password] [SETNAME clientname]]
//! AUTH [username] password
//! ```
//!
//! A login names a user (`default` when it names none) of
//! [`crate::auth::Users`]. Without `--requirepass` or `--users-file`,
//! stockgate behaves like Redis's default `nopass` user: it accepts any
//! password for the user `default` (and only that user), and answers a
//! one-argument `AUTH` as a passwordless Redis does.
//!
//! HELLO's reply is Redis's map, field for field, and then
//! `stockgate_version`; clients read the fields they know.

use super::client::check_client_name;
use super::{REDIS_COMPAT_VERSION, keep, redis_integer};
use crate::auth::throttle::Throttle;
use crate::auth::{Account, Users, WRONGPASS};
use crate::command::Session;
use crate::command::spec::{Call, CommandSpec, arg, c_str, optional, session, shown};
use crate::metrics::Metrics;
use crate::reply::{Protocol, Reply};
use crate::state::Shared;
use bytes::Bytes;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

pub const HELLO: CommandSpec = session(
    "hello",
    -1,
    "connection",
    "Handshakes: picks RESP2 or RESP3, authenticates, names the connection.",
    &[optional("protover", "integer")],
    |call| hello(call.args, call.session, &Gate::of(call.shared)),
);

pub const AUTH: CommandSpec = session(
    "auth",
    -2,
    "connection",
    "Authenticates the connection.",
    &[optional("username", "string"), arg("password", "string")],
    auth,
);

/// What a login goes through: the users, the failures by peer, the
/// metrics that count them.
pub struct Gate<'a> {
    pub users: &'a Users,
    pub throttle: &'a Throttle,
    pub metrics: &'a Metrics,
}

impl<'a> Gate<'a> {
    pub fn of(shared: &'a Shared) -> Gate<'a> {
        Gate {
            users: &shared.users,
            throttle: &shared.throttle,
            metrics: &shared.metrics,
        }
    }

    /// Logs `session` in as `user` (`default` when none) with `pass`, or
    /// refuses (see [`Gate::check`]). A refusal leaves the session as it
    /// was, logged in or not, as Redis leaves it.
    fn log_in(&self, session: &mut Session, user: Option<&[u8]>, pass: &[u8]) -> Result<(), Reply> {
        match self.check(session.peer.map(|p| p.ip()), user, pass) {
            Ok(account) => {
                session.account = Some(account);
                session.authenticated = true;
                Ok(())
            }
            Err(delay) => {
                if !delay.is_zero() {
                    session.login_delay = Some(delay);
                }
                Err(Reply::error(WRONGPASS))
            }
        }
    }

    /// The account `user` (`default` when none) logs in as with `pass`,
    /// from `peer`; or, refused, how long the refusal waits: counted for
    /// the user it named, and slowed after several failures in a row at
    /// that user from that peer ([`crate::auth::throttle`]). The one login
    /// of both faces, RESP and HTTP.
    pub fn check(
        &self,
        peer: Option<IpAddr>,
        user: Option<&[u8]>,
        pass: &[u8],
    ) -> Result<Arc<Account>, Duration> {
        match self.users.login(user, pass) {
            Ok(account) => {
                if let Some(peer) = peer {
                    self.throttle.succeeded(peer, account.name());
                }
                Ok(account)
            }
            Err(refused) => {
                self.metrics.auth_failed(refused.user.as_deref());
                let delay = peer.map_or(Duration::ZERO, |peer| {
                    self.throttle.failed(peer, refused.user)
                });
                if !delay.is_zero() {
                    self.metrics.auth_delayed();
                }
                Err(delay)
            }
        }
    }
}

/// Answered as Redis 7.2's `helloCommand` answers: the version first,
/// then every option read (and the name checked) before the credentials
/// are, and nothing changed unless all of it succeeds.
fn hello(args: &[Bytes], session: &mut Session, gate: &Gate<'_>) -> Reply {
    let mut protocol = session.protocol;
    let mut rest = args;
    if let Some(version) = args.first() {
        protocol = match redis_integer(version) {
            Some(2) => Protocol::Resp2,
            Some(3) => Protocol::Resp3,
            Some(_) => return Reply::error("NOPROTO unsupported protocol version"),
            None => return Reply::error("ERR Protocol version is not an integer or out of range"),
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
            if let Err(reply) = check_client_name(&rest[1]) {
                return reply;
            }
            setname = Some(&rest[1]);
            rest = &rest[2..];
        } else {
            return Reply::error(format!(
                "ERR Syntax error in HELLO option '{}'",
                shown(c_str(option, usize::MAX))
            ));
        }
    }
    if let Some((user, pass)) = credentials
        && let Err(refused) = gate.log_in(session, Some(user), pass)
    {
        return refused;
    }
    if !session.authenticated {
        return Reply::error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        );
    }
    if let Some(name) = setname {
        session.name = (!name.is_empty()).then(|| keep(name));
    }
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
        // stockgate's own, after every field of Redis's.
        (
            Reply::bulk("stockgate_version"),
            Reply::bulk(env!("CARGO_PKG_VERSION")),
        ),
    ])
}

/// Without a password configured it answers as a Redis without one does.
fn auth(call: &mut Call<'_>) -> Reply {
    let (user, pass) = match call.args {
        [pass] => (None, pass),
        [user, pass] => (Some(&user[..]), pass),
        _ => return Reply::error("ERR syntax error"),
    };
    if call.shared.users.is_open() && user.is_none() {
        return Reply::error(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        );
    }
    match Gate::of(call.shared).log_in(call.session, user, pass) {
        Ok(()) => Reply::Simple("OK"),
        Err(refused) => refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Password;

    /// The users of `--requirepass <password>`, or of none.
    struct Parts(Users, Throttle, Metrics);

    impl Parts {
        fn new(password: Option<&str>) -> Parts {
            Parts(
                Users::new(password.and_then(Password::new), None).unwrap(),
                Throttle::default(),
                Metrics::new::<crate::stock::StockCommand>(),
            )
        }

        fn gate(&self) -> Gate<'_> {
            Gate {
                users: &self.0,
                throttle: &self.1,
                metrics: &self.2,
            }
        }
    }

    #[test]
    fn hello_switches_protocol_and_names_the_connection() {
        let mut session = Session::new(7, Parts::new(None).0.open_account());
        let open = Parts::new(None);
        let reply = hello(
            &[
                Bytes::from_static(b"3"),
                Bytes::from_static(b"setname"),
                Bytes::from_static(b"app"),
            ],
            &mut session,
            &open.gate(),
        );
        assert_eq!(session.protocol, Protocol::Resp3);
        assert_eq!(session.name.as_deref(), Some(&b"app"[..]));
        let Reply::Map(fields) = reply else {
            panic!("HELLO replies with a map")
        };
        assert!(fields.contains(&(Reply::bulk("proto"), Reply::Integer(3))));
        assert!(fields.contains(&(Reply::bulk("id"), Reply::Integer(7))));
        assert_eq!(
            hello(&[Bytes::from_static(b"4")], &mut session, &open.gate(),),
            Reply::error("NOPROTO unsupported protocol version")
        );
        assert_eq!(
            session.protocol,
            Protocol::Resp3,
            "a refused HELLO changes nothing"
        );
        let (last, _) = fields.last().expect("fields");
        assert_eq!(
            last,
            &Reply::bulk("stockgate_version"),
            "stockgate's own field comes after Redis's"
        );
    }

    #[test]
    fn hello_reads_every_option_before_the_password_as_redis_7_2() {
        let guarded = Parts::new(Some("pw"));
        let open = Parts::new(None);
        let args = |words: &[&'static str]| -> Vec<Bytes> {
            words
                .iter()
                .map(|w| Bytes::from_static(w.as_bytes()))
                .collect()
        };
        let mut session = Session::new(1, None);
        assert_eq!(
            hello(
                &args(&["3", "AUTH", "default", "wrong", "SETNAME", "a b"]),
                &mut session,
                &guarded.gate(),
            ),
            Reply::error("ERR Client names cannot contain spaces, newlines or special characters.")
        );
        assert_eq!(
            hello(
                &args(&["3", "AUTH", "default", "pw", "SETNAME", "a b"]),
                &mut session,
                &guarded.gate(),
            ),
            Reply::error("ERR Client names cannot contain spaces, newlines or special characters.")
        );
        assert!(
            !session.authenticated,
            "a refused HELLO authenticates nobody"
        );
        for version in ["03", "+3", "three"] {
            assert_eq!(
                hello(&args(&[version]), &mut session, &open.gate(),),
                Reply::error("ERR Protocol version is not an integer or out of range"),
                "{version}"
            );
        }
        // Without a password, only the default user exists.
        let mut passwordless = Session::new(2, open.0.open_account());
        assert!(matches!(
            hello(
                &args(&["3", "AUTH", "default", "any"]),
                &mut passwordless,
                &open.gate(),
            ),
            Reply::Map(_)
        ));
        assert_eq!(
            hello(
                &args(&["3", "AUTH", "nobody", "any"]),
                &mut passwordless,
                &open.gate(),
            ),
            Reply::error(WRONGPASS)
        );
    }

    #[test]
    fn a_name_is_a_copy_that_does_not_pin_the_read_buffer() {
        // A 4 KiB read buffer, as a connection has, holding the request.
        let buffer = Bytes::from(vec![b'n'; 4096]);
        let name = buffer.slice(100..110);
        let mut session = Session::new(1, Parts::new(None).0.open_account());
        hello(
            &[
                Bytes::from_static(b"3"),
                Bytes::from_static(b"SETNAME"),
                name,
            ],
            &mut session,
            &Parts::new(None).gate(),
        );
        let kept = session.name.expect("named");
        assert_eq!(&kept[..], &[b'n'; 10][..]);
        // A slice would share the 4 KiB allocation with `buffer`, still
        // alive here; a copy owns exactly its bytes.
        assert!(kept.is_unique(), "the name is a copy, not a slice");
        drop(buffer);
    }
}
