//! Client authentication: the password a client must present (`AUTH`,
//! `HELLO ... AUTH`, or `Authorization: Bearer` over HTTP) before anything
//! but PING and QUIT is served.

use std::fmt;
use subtle::ConstantTimeEq;

/// A password. Never printed: `Debug` shows `***`, and nothing else reads
/// it out.
#[derive(Clone)]
pub struct Password(Vec<u8>);

impl Password {
    pub fn new(secret: impl Into<Vec<u8>>) -> Option<Password> {
        let secret = secret.into();
        (!secret.is_empty()).then_some(Password(secret))
    }

    /// Compares in constant time, so the time a wrong guess takes says
    /// nothing about how much of it was right.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        // ct_eq is constant-time for equal lengths; a length mismatch is
        // rejected too, which reveals only the length.
        self.0.len() == candidate.len() && bool::from(self.0.ct_eq(candidate))
    }

    /// Checks Redis-style credentials: `AUTH <password>` or
    /// `AUTH default <password>` (stockgate has one user, `default`).
    pub fn accepts(&self, username: Option<&[u8]>, password: &[u8]) -> bool {
        let user_ok = username.is_none_or(|u| u == b"default");
        // Always compare, so a wrong username takes as long as a wrong password.
        self.matches(password) && user_ok
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(***)")
    }
}

/// The reply to a wrong password, in Redis's words.
pub const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
/// The reply to a command before authentication, in Redis's words.
pub const NOAUTH: &str = "NOAUTH Authentication required.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_match_only_exactly_and_never_print() {
        let pw = Password::new("s3cret").unwrap();
        assert!(pw.matches(b"s3cret"));
        assert!(!pw.matches(b"s3cre"));
        assert!(!pw.matches(b"s3cret!"));
        assert!(!pw.matches(b""));
        assert!(pw.accepts(Some(b"default"), b"s3cret"));
        assert!(!pw.accepts(Some(b"admin"), b"s3cret"));
        assert!(Password::new("").is_none(), "an empty password means none");
        assert_eq!(format!("{pw:?}"), "Password(***)");
    }
}
