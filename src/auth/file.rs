//! The users file (`--users-file`): TOML, one table per user.
//!
//! ```toml
//! [users.checkout]
//! passwords = ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "n3w-pw"]
//! rights = ["caller"]
//! skus = ["shop-a-", "shop-b-"]    # optional: SKU prefixes; absent = every SKU
//!
//! [users.ops]
//! passwords = ["sha256:..."]
//! rights = ["operator"]
//! ```
//!
//! A password is plain, or `sha256:` and the 64 hex digits of its SHA-256.
//! `passwords` may be empty or absent: the user exists (`stockgate check`
//! shows it) but cannot log in, and its open connections close. A
//! mistake is reported with its line, never with the text of the line:
//! it may hold a password.

use super::{Grant, Password, Right, Rights};
use serde::Deserialize;
use std::collections::BTreeMap;
use toml::Spanned;

/// One user as the file defines it.
#[derive(Debug, Clone)]
pub struct UserSpec {
    pub name: String,
    pub passwords: Vec<Password>,
    pub grant: Grant,
    /// Where its table starts in the file (0: not from the file).
    pub line: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBody {
    #[serde(default)]
    users: BTreeMap<String, Spanned<UserBody>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserBody {
    #[serde(default)]
    passwords: Vec<Spanned<String>>,
    rights: Vec<Spanned<String>>,
    skus: Option<Spanned<Vec<Spanned<String>>>>,
}

/// Longest user name, as a sku: names go into metric labels and log lines.
const MAX_NAME: usize = 128;

/// Reads the users file's text. The error names the line at fault.
pub fn parse(text: &str) -> Result<Vec<UserSpec>, String> {
    let line_of = |at: usize| text[..at.min(text.len())].matches('\n').count() + 1;
    let body: FileBody = toml::from_str(text).map_err(|err| {
        let line = err.span().map_or(0, |span| line_of(span.start));
        format!("line {line}: {}", without_values(err.message()))
    })?;
    let mut users = Vec::with_capacity(body.users.len());
    for (name, user) in body.users {
        let line = line_of(user.span().start);
        let fail =
            |at: usize, why: String| Err(format!("line {}: user `{name}`: {why}", line_of(at)));
        if name.is_empty()
            || name.len() > MAX_NAME
            || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
        {
            return Err(format!(
                "line {line}: a user name is 1 to {MAX_NAME} printable ASCII characters, \
                 without spaces or `:`"
            ));
        }
        let user = user.into_inner();
        let mut passwords = Vec::with_capacity(user.passwords.len());
        for password in &user.passwords {
            let at = password.span().start;
            match password_of(password.get_ref()) {
                Ok(p) => passwords.push(p),
                Err(why) => return fail(at, why.to_owned()),
            }
        }
        let mut rights = Rights::none();
        for right in &user.rights {
            match Right::parse(right.get_ref()) {
                Some(r) => rights = rights.with(r),
                None => {
                    return fail(
                        right.span().start,
                        format!(
                            "unknown right `{}`; the rights are {}",
                            right.get_ref(),
                            Right::ALL.map(Right::name).join(", ")
                        ),
                    );
                }
            }
        }
        let skus = match user.skus {
            None => None,
            Some(skus) => {
                if skus.get_ref().is_empty() {
                    return fail(
                        skus.span().start,
                        "`skus` is empty; leave it out to allow every SKU".to_owned(),
                    );
                }
                let mut prefixes = Vec::new();
                for prefix in skus.get_ref() {
                    let p = prefix.get_ref();
                    if p.is_empty() || p.len() > 128 || !p.bytes().all(|b| b.is_ascii_graphic()) {
                        return fail(
                            prefix.span().start,
                            "a SKU prefix is 1 to 128 printable ASCII characters".to_owned(),
                        );
                    }
                    prefixes.push(p.as_bytes().into());
                }
                Some(prefixes)
            }
        };
        users.push(UserSpec {
            name,
            passwords,
            grant: Grant::new(rights, skus),
            line,
        });
    }
    Ok(users)
}

/// A password as the file writes it.
fn password_of(text: &str) -> Result<Password, &'static str> {
    if let Some(hex) = text.strip_prefix("sha256:") {
        let digest = decode_hex(hex)
            .ok_or("a `sha256:` password is followed by the 64 hex digits of its SHA-256")?;
        return Ok(Password::sha256(digest));
    }
    Password::new(text).ok_or("a password is empty")
}

fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let pair = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

/// The TOML reader's message with every quoted value taken out: a value of
/// the wrong type is quoted in it, and that value may be a password.
fn without_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut quoted = false;
    for c in message.chars() {
        if c == '"' {
            if quoted {
                out.push_str("…\"");
            } else {
                out.push('"');
            }
            quoted = !quoted;
        } else if !quoted {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_with_their_passwords_rights_and_prefixes() {
        let users = parse(
            r#"
[users.checkout]
passwords = ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "plain-pw"]
rights = ["caller"]
skus = ["shop-a-"]

[users.ops]
rights = ["operator", "reader"]
"#,
        )
        .unwrap();
        assert_eq!(users.len(), 2);
        let checkout = &users[0];
        assert_eq!((checkout.name.as_str(), checkout.line), ("checkout", 2));
        assert!(checkout.passwords[0].matches(b"test"), "sha256 of `test`");
        assert!(checkout.passwords[1].matches(b"plain-pw"));
        assert!(checkout.grant.rights.allows(Right::Caller));
        assert!(checkout.grant.allows_sku(b"shop-a-1") && !checkout.grant.allows_sku(b"shop-b-1"));
        let ops = &users[1];
        assert!(ops.passwords.is_empty(), "a user without passwords exists");
        assert_eq!(ops.grant.rights.names(), ["reader", "operator"]);
        assert!(ops.grant.every_sku());
    }

    #[test]
    fn a_mistake_names_its_line_and_never_a_password() {
        for (text, want) in [
            (
                "[users.a]\nrights = [\"caler\"]\n",
                "line 2: user `a`: unknown right `caler`",
            ),
            (
                "[users.a]\nrights = []\npasswords = [\"sha256:abc\"]\n",
                "line 3: user `a`: a `sha256:` password",
            ),
            (
                "[users.a]\nrights = []\n\npasswords = [\"\"]\n",
                "line 4: user `a`: a password is empty",
            ),
            (
                "[users.a]\nrights = []\nskus = []\n",
                "line 3: user `a`: `skus` is empty",
            ),
            (
                "[users.a]\nrights = []\nrole = 1\n",
                "line 3: unknown field `role`",
            ),
            (
                "[users.a]\nrights = []\n[users.a]\nrights = []\n",
                "line 3:",
            ),
            ("[users.\"a b\"]\nrights = []\n", "line 1: a user name is"),
            (
                "[users.a]\npasswords = [\"ok\"]\n",
                "line 1: missing field `rights`",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.starts_with(want), "{text:?}: {err}");
        }
        let err = parse("[users.a]\nrights = []\npasswords = \"hunter2-secret\"\n").unwrap_err();
        assert!(err.starts_with("line 3:"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
