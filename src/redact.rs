//! Secrets kept out of what stockgate prints: logs, errors, INFO,
//! `/readyz` and `stockgate check`.
//!
//! A URL that may hold a password (`--upstream`, `--database`) is kept as
//! a [`SecretUrl`]: its `Display` and `Debug` are [`redact`]'s, so it
//! cannot be printed whole by accident, and only a driver is handed
//! [`SecretUrl::expose`]. Anything else that prints a URL goes through
//! [`redact`] too.

use std::fmt;

/// What a password is printed as.
const MASK: &str = "***";

/// `url` as it may be printed: its password replaced by `***`, and so is
/// the value of the first password-like query parameter (`password`,
/// `sslpassword`, ...) with everything after it.
///
/// The `url` crate reads it, as the redis and MySQL drivers do. A
/// password's raw `/`, `?` or `#` ends the authority early, and a parser
/// then reads the rest of the password as a port, path, query or fragment
/// (`redis://u:12/x@h:6379` is host `u`, port 12, path `/x@h:6379`): a `@`
/// after the authority shows it. Then, and when the URL does not parse,
/// everything from `://` to the last `@` may be password, and all of it is
/// masked. Otherwise the URL prints as the parser reads it, which for a
/// well-formed URL without a password is its own text.
pub fn redact(url: &str) -> String {
    // The query's password first: a raw `@` in it would otherwise read as
    // the end of a user part below, and what follows it as the host.
    let url = &parameters_masked(url);
    match url::Url::parse(url) {
        Ok(mut parsed) if !parsed[url::Position::BeforePath..].contains('@') => {
            match parsed.password() {
                None => parsed.to_string(),
                Some(_) => match parsed.set_password(Some(MASK)) {
                    Ok(()) => parsed.to_string(),
                    Err(()) => userinfo_masked(url),
                },
            }
        }
        _ => userinfo_masked(url),
    }
}

/// Refuses a URL with a `@` after its authority (which ends at the first
/// `/`, `?` or `#` after `://`): a password holding a raw `/`, `?` or `#`
/// puts its own `@` there, and each driver then reads part of the password
/// as a host, port, path or parameter, and may repeat it in an error. The
/// drivers read a percent-encoded one right.
pub fn check_userinfo(url: &str) -> Result<(), &'static str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    match rest.find(['/', '?', '#']) {
        Some(end) if rest[end..].contains('@') => Err(
            "a `@` after the host, where a driver reads part of the password as the host, port \
             or path: percent-encode a password's `/`, `?` and `#` (%2F, %3F, %23), and a `@` \
             after the host (%40)",
        ),
        _ => Ok(()),
    }
}

/// Refuses a URL whose authority (from `://` to the first `/`, `?` or `#`)
/// holds more than one `@`: a raw `@` in its password. tokio-postgres
/// ends the user part at the first `@` and reads the rest of the password
/// as the host, where the other drivers (the `url` crate's reading) end it
/// at the last; percent-encoded (%40), every driver reads it right.
pub fn check_single_at(url: &str) -> Result<(), &'static str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if authority.matches('@').count() > 1 {
        return Err(
            "a `@` in the password, where the PostgreSQL driver ends the user part and reads the              rest as the host: percent-encode it (%40)",
        );
    }
    Ok(())
}

/// `url` with everything from `://` (from its start when it has no
/// scheme) to its last `@` masked.
fn userinfo_masked(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        // No user part, however the URL is read.
        return url.to_owned();
    };
    let start = match url[..at].split_once("://") {
        Some((scheme, _)) if is_scheme(scheme) => scheme.len() + "://".len(),
        _ => 0,
    };
    format!("{}{MASK}{}", &url[..start], &url[at..])
}

/// A URL scheme: a letter, then letters, digits, `+`, `-` or `.`.
fn is_scheme(text: &str) -> bool {
    text.starts_with(|c: char| c.is_ascii_alphabetic())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// `url` with everything from the first password-like query parameter's
/// value on masked: a raw `&` in that password would otherwise end it
/// early, and what follows (`password=abc&def`: the `def`) could be the
/// rest of it as well as a parameter of its own. The parameters before it
/// are printed. The query runs from the first `?` to the end, fragment
/// included: a raw `#` in a password would otherwise start a fragment
/// printed as it is.
fn parameters_masked(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let mut shown = Vec::new();
    for pair in query.split('&') {
        let key = pair.split_once('=').map_or(pair, |(key, _)| key);
        if is_secret_parameter(key) {
            shown.push(format!("{key}={MASK}"));
            break;
        }
        shown.push(pair.to_owned());
    }
    format!("{base}?{}", shown.join("&"))
}

/// A query parameter whose value is a secret: its name (percent-decoded,
/// in any case) says pass, pwd, secret or token (libpq's `password` and
/// `sslpassword`, and the like of other drivers).
fn is_secret_parameter(raw: &str) -> bool {
    let name = url::form_urlencoded::parse(raw.as_bytes())
        .next()
        .map(|(name, _)| name.to_lowercase())
        .unwrap_or_default();
    ["pass", "pwd", "secret", "token"]
        .iter()
        .any(|word| name.contains(word))
}

/// A URL that may hold a password. It prints (`Display`, `Debug`) as
/// [`redact`] shows it; a driver reads [`SecretUrl::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// The URL as given, password and all: for a driver to read, never to
    /// print.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for SecretUrl {
    fn from(url: String) -> SecretUrl {
        SecretUrl(url)
    }
}

impl From<&str> for SecretUrl {
    fn from(url: &str) -> SecretUrl {
        SecretUrl(url.to_owned())
    }
}

/// For clap: any text is taken, and checked where it is used (an error
/// from here would print the URL whole).
impl std::str::FromStr for SecretUrl {
    type Err = std::convert::Infallible;

    fn from_str(url: &str) -> Result<SecretUrl, Self::Err> {
        Ok(SecretUrl::from(url))
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.0))
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redact(&self.0), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis://default:s3cret@10.0.0.1:6379/0"),
            "redis://default:***@10.0.0.1:6379/0"
        );
        assert_eq!(redact("rediss://:p@ss@h:1"), "rediss://:***@h:1");
        assert_eq!(redact("postgres://u@h:1/db"), "postgres://u@h:1/db");
        // The parser reads a host and port where the password's `/`,
        // `?` or `#` ends the authority: everything up to the last `@` goes.
        for (url, shown) in [
            (
                "postgres://books:S3cr/tPW@db.example.com:5432/books?sslmode=disable",
                "postgres://***@db.example.com:5432/books?sslmode=disable",
            ),
            ("redis://u:12/x@h:6379", "redis://***@h:6379"),
            ("redis://u:12?x@h:6379", "redis://***@h:6379"),
            ("rediss://u:12#x@h:6379", "rediss://***@h:6379"),
            (
                "redis://default:Up/str3am@127.0.0.1:6379",
                "redis://***@127.0.0.1:6379",
            ),
            (
                "mysql://books:S3cr/tPW@db:3306/books",
                "mysql://***@db:3306/books",
            ),
            // Not a URL a parser reads: still masked to the last `@`.
            (
                "postgres://u:pw@h1:5432,h2:5433/db",
                "postgres://***@h1:5432,h2:5433/db",
            ),
            ("b@h:6379", "***@h:6379"),
            ("u:a://b@h", "***@h"),
            // No `@`: nothing is a user part, however it is read.
            ("redis://h:99999", "redis://h:99999"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }

    #[test]
    fn password_parameters_are_masked() {
        assert_eq!(
            redact("postgres://u@h/db?sslmode=disable&password=hunter2&sslpassword=k3y"),
            "postgres://u@h/db?sslmode=disable&password=***"
        );
        assert_eq!(
            redact("postgres://u:pw@h/db?PassWord=a#b&x=1"),
            "postgres://u:***@h/db?PassWord=***"
        );
        // A raw `&` or `@` in a parameter's password: nothing after it is
        // printed.
        assert_eq!(
            redact("postgres://u@h/db?password=abc&defg"),
            "postgres://u@h/db?password=***"
        );
        assert_eq!(
            redact("postgres://h/db?password=ab@cdef"),
            "postgres://h/db?password=***"
        );
        assert_eq!(
            redact("postgres://u@h/db?pass%77ord=hunter2"),
            "postgres://u@h/db?pass%77ord=***"
        );
        assert_eq!(
            redact("postgres://u:a/b@h/db?password=hunter2"),
            "postgres://***@h/db?password=***"
        );
    }

    #[test]
    fn a_misplaced_at_is_refused() {
        for bad in [
            "redis://default:Up/str3am@127.0.0.1:6379",
            "redis://u:12?x@h",
            "postgres://u:a#b@h/db",
            "postgres://u@h/db?application_name=a@b",
        ] {
            assert!(check_userinfo(bad).is_err(), "{bad}");
        }
        for good in [
            "redis://default:Up%2Fstr3am@127.0.0.1:6379",
            "redis://u:p@ss:w%rd@h",
            "postgres://u:pw@h1:5432,h2:5433/db?sslmode=disable",
            "redis://127.0.0.1:6379",
        ] {
            assert!(check_userinfo(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn a_raw_at_in_a_password_is_found() {
        for bad in [
            "postgres://books:Mb2@zR8t@127.0.0.1:5432/books",
            "postgresql://u:a@b@c@h/db",
            "u:p@ss@h",
        ] {
            assert!(check_single_at(bad).is_err(), "{bad}");
        }
        for good in [
            "postgres://books:Mb2%40zR8t@127.0.0.1:5432/books",
            "postgres://u@h/db?application_name=a@b",
            "postgres://h/db?password=a@b",
            "postgres://u:pw@h1:5432,h2:5433/db",
            "postgres://h/db",
        ] {
            assert!(check_single_at(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn a_secret_url_prints_redacted() {
        let url = SecretUrl::from("redis://default:s3cret@h:6379");
        assert_eq!(url.to_string(), "redis://default:***@h:6379");
        assert_eq!(format!("{url:?}"), "\"redis://default:***@h:6379\"");
        assert_eq!(url.expose(), "redis://default:s3cret@h:6379");
    }

    /// Every character a password may hold: printable ASCII (the space
    /// and each delimiter included) and some beyond. Tabs and newlines
    /// are not: a URL parser drops them wherever they are.
    fn password() -> impl Strategy<Value = String> {
        let char = prop_oneof![
            8 => prop::char::range(' ', '~'),
            1 => prop::sample::select(vec!['é', 'ß', 'Ω', '密', '码', '🔑', '\u{a0}']),
        ];
        prop::collection::vec(char, 4..=20).prop_map(|chars| chars.into_iter().collect())
    }

    /// `text` with every byte but the unreserved ones as `%XX`: a password
    /// as an operator writes it to be read right.
    fn percent_encoded(text: &str) -> String {
        text.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    char::from(b).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    }

    /// What of `password` is in `shown`: the password, its
    /// percent-encoding, or any 4 characters of it in a row.
    fn leaked(shown: &str, password: &str) -> Option<String> {
        let chars: Vec<char> = password.chars().collect();
        chars
            .windows(4)
            .map(|run| run.iter().collect::<String>())
            .chain([password.to_owned(), percent_encoded(password)])
            .find(|piece| shown.contains(piece.as_str()))
    }

    /// The parts of a URL other than its password, each already in the
    /// form a URL parser prints it.
    #[derive(Debug, Clone)]
    struct Around {
        scheme: &'static str,
        user: String,
        host: &'static str,
        port: Option<u16>,
        path: &'static str,
        query: &'static str,
    }

    impl Around {
        fn url(&self, userinfo: Option<&str>) -> String {
            let Around {
                scheme,
                host,
                path,
                query,
                ..
            } = self;
            let port = self.port.map(|p| format!(":{p}")).unwrap_or_default();
            let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
            format!("{scheme}://{userinfo}{host}{port}{path}{query}")
        }
    }

    fn around() -> impl Strategy<Value = Around> {
        (
            prop::sample::select(vec!["redis", "rediss", "postgres", "postgresql", "mysql"]),
            "([a-z][a-z0-9_.-]{0,7})?",
            prop::sample::select(vec![
                "127.0.0.1",
                "db.example.com",
                "redis-0.redis",
                "[::1]",
                "h",
            ]),
            prop::option::of(1..=u16::MAX),
            prop::sample::select(vec!["", "/", "/0", "/books", "/orders_eu"]),
            prop::sample::select(vec![
                "",
                "?sslmode=disable",
                "?protocol=resp3",
                "?application_name=sink&sslmode=require",
                "?ssl-mode=DISABLED",
            ]),
        )
            .prop_map(|(scheme, user, host, port, path, query)| Around {
                scheme,
                user,
                host,
                port,
                path,
                query,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// A password raw or percent-encoded, in any URL: none of it is
        /// printed. Raw, a `/`, `?` or `#` in it hides the user too;
        /// otherwise only the password goes.
        #[test]
        fn no_part_of_a_password_is_printed(
            around in around(),
            password in password(),
            encoded in any::<bool>(),
        ) {
            let written = if encoded { percent_encoded(&password) } else { password.clone() };
            let url = around.url(Some(&format!("{}:{written}", around.user)));
            let expected = if !encoded && password.contains(['/', '?', '#']) {
                around.url(Some(MASK))
            } else {
                around.url(Some(&format!("{}:{MASK}", around.user)))
            };
            // Only when what is printed anyway holds none of it, by chance
            // (the host `redis-0.redis` holds a password `is-0`).
            prop_assume!(leaked(&expected, &password).is_none());
            prop_assume!(leaked(&expected, &written).is_none());
            let shown = redact(&url);
            prop_assert_eq!(leaked(&shown, &password), None, "{} printed as {}", url, shown);
            prop_assert_eq!(leaked(&shown, &written), None, "{} printed as {}", url, shown);
            prop_assert_eq!(shown, expected);
        }

        /// A password in a query parameter, raw or percent-encoded and
        /// whatever it holds (a raw `&` or `#` among them), is masked:
        /// its value and everything after it.
        #[test]
        fn no_password_parameter_is_printed(
            around in around(),
            password in password(),
            encoded in any::<bool>(),
            name in prop::sample::select(vec!["password", "sslpassword", "Password"]),
        ) {
            let written = if encoded { percent_encoded(&password) } else { password.clone() };
            let query = if around.query.is_empty() { "?" } else { "&" };
            let url = format!("{}{query}{name}={written}", around.url(None));
            let expected = format!("{}{query}{name}={MASK}", around.url(None));
            prop_assume!(leaked(&expected, &password).is_none());
            let shown = redact(&url);
            prop_assert_eq!(leaked(&shown, &password), None, "{} printed as {}", url, shown);
            prop_assert_eq!(shown, expected);
        }

        /// A URL without a password prints as it is.
        #[test]
        fn a_url_without_a_password_is_unchanged(around in around(), with_user in any::<bool>()) {
            let url = around.url(with_user.then_some(around.user.as_str()).filter(|u| !u.is_empty()));
            prop_assert_eq!(redact(&url), url);
        }
    }
}
