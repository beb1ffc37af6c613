//! The connection-level commands: PING, ECHO, SELECT, QUIT, RESET, HELLO,
//! AUTH, CLIENT, INFO and COMMAND, answered on the spot from the
//! connection's [`Session`](crate::command::Session) and the shared state,
//! never sent to Redis.
//!
//! - [`basics`] answers PING, ECHO, SELECT, QUIT and RESET;
//! - [`hello`] HELLO and AUTH: the protocol, the password, the name;
//! - [`client`] CLIENT and its subcommands;
//! - [`info`] INFO;
//! - [`introspection`] COMMAND and its subcommands, from the table.

pub mod basics;
pub mod client;
pub mod hello;
pub mod info;
pub mod introspection;

use bytes::Bytes;

/// The Redis version stockgate answers as (in HELLO and INFO): the protocol
/// level it implements. Clients use it to pick features; stockgate's own
/// version is reported beside it.
pub const REDIS_COMPAT_VERSION: &str = "7.2.0";

/// An integer as Redis reads one (`string2ll`): decimal digits, an
/// optional `-`, no `+`, no leading zeros, no spaces, within 64 bits.
pub(crate) fn redis_integer(arg: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(arg).ok()?;
    let value = text.parse::<i64>().ok()?;
    // The canonical spelling is the only one: `03`, `+3` and `-0` are not
    // integers to Redis.
    (itoa::Buffer::new().format(value) == text).then_some(value)
}

/// An argument kept past the request: its own small allocation.
pub(crate) fn keep(arg: &Bytes) -> Bytes {
    Bytes::copy_from_slice(arg)
}

#[cfg(test)]
mod tests {
    use super::redis_integer;

    #[test]
    fn integers_are_read_as_redis_reads_them() {
        for (text, value) in [
            ("0", Some(0)),
            ("3", Some(3)),
            ("-3", Some(-3)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("03", None),
            ("+3", None),
            ("-0", None),
            (" 3", None),
            ("", None),
            ("9223372036854775808", None),
        ] {
            assert_eq!(redis_integer(text.as_bytes()), value, "{text:?}");
        }
    }
}
