//! Who may do what: the users clients log in as (`AUTH`, `HELLO ... AUTH`,
//! HTTP `Authorization`), their passwords, and the rights each holds.
//!
//! - [`Password`]: one password, plain or SHA-256, compared in constant
//!   time and never printed.
//! - [`Right`]: what a command needs; each stock command names its own in
//!   its file (`crate::stock`'s `Command::right`). [`Rights`] is what a
//!   user holds.
//! - [`Users`]: the live table of users, from `--requirepass` (the single
//!   `default` user with every right) and `--users-file` ([`file`]),
//!   replaced whole on a reload. A logged-in connection holds its user's
//!   [`Account`]: a reload changes the account's [`Grant`] in place, so a
//!   right taken away is taken from open connections at once, and a user
//!   removed (or left with no password) has its account closed, which its
//!   connections watch.
//! - [`throttle`]: failed logins from one peer answered later and later.
//!
//! Without `--requirepass` and `--users-file`, stockgate is as a Redis with
//! its `nopass` default user: every connection is `default`, with every
//! right, from the start.

pub mod file;
pub mod throttle;

use arc_swap::{ArcSwap, Guard};
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

pub use file::UserSpec;

/// The user a login names when it names none (`AUTH <password>`), and
/// the one `--requirepass` defines.
pub const DEFAULT_USER: &str = "default";

/// A password. Never printed: `Debug` shows `***`, and nothing else reads
/// it out.
#[derive(Clone)]
pub struct Password(Secret);

#[derive(Clone)]
enum Secret {
    Plain(Vec<u8>),
    /// The SHA-256 of the password, as `sha256:<hex>` gives it in the
    /// users file: the file then holds no password a reader could use.
    Sha256([u8; 32]),
}

impl Password {
    /// A plain password; none when it is empty.
    pub fn new(secret: impl Into<Vec<u8>>) -> Option<Password> {
        let secret = secret.into();
        (!secret.is_empty()).then_some(Password(Secret::Plain(secret)))
    }

    /// A password known by its SHA-256.
    pub fn sha256(digest: [u8; 32]) -> Password {
        Password(Secret::Sha256(digest))
    }

    /// Compares in constant time, so the time a wrong guess takes says
    /// nothing about how much of it was right.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        match &self.0 {
            // ct_eq is constant-time for equal lengths; a length mismatch
            // is rejected too, which reveals only the length.
            Secret::Plain(secret) => {
                secret.len() == candidate.len() && bool::from(secret.ct_eq(candidate))
            }
            Secret::Sha256(digest) => {
                let given: [u8; 32] = Sha256::digest(candidate).into();
                bool::from(digest.ct_eq(&given))
            }
        }
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(***)")
    }
}

/// What a command needs of the user who sends it. Each stock command
/// names its own; the connection-level commands (PING, HELLO, CLIENT,
/// INFO, ...) need none beyond a login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Right {
    /// Reads that change nothing: STOCK.GET, STOCK.STATUS, ORDER.STATUS.
    Reader,
    /// The order flow: DEDUCT, REVERT, HOLD, CONFIRM, ORDER and its
    /// commands.
    Caller,
    /// Changes outside the order flow: STOCK.SET, STOCK.ADD.
    Operator,
}

impl Right {
    pub const ALL: [Right; 3] = [Right::Reader, Right::Caller, Right::Operator];

    /// Its name in the users file.
    pub const fn name(self) -> &'static str {
        match self {
            Right::Reader => "reader",
            Right::Caller => "caller",
            Right::Operator => "operator",
        }
    }

    pub fn parse(name: &str) -> Option<Right> {
        Right::ALL.into_iter().find(|r| r.name() == name)
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }

    /// What holding this right grants: `caller` and `operator` each
    /// include the reads (a caller reads the stock it sells, an operator
    /// the stock it corrects); neither includes the other.
    const fn grants(self) -> u8 {
        match self {
            Right::Reader => Right::Reader.bit(),
            Right::Caller => Right::Caller.bit() | Right::Reader.bit(),
            Right::Operator => Right::Operator.bit() | Right::Reader.bit(),
        }
    }
}

/// The rights a user holds, as the users file lists them.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Rights {
    /// As listed.
    listed: u8,
    /// What they grant ([`Right::grants`]).
    granted: u8,
}

impl Rights {
    /// Every right: `--requirepass`'s `default` user, and the `nopass`
    /// default user of a stockgate without passwords.
    pub const ALL: Rights = Rights::none()
        .with(Right::Reader)
        .with(Right::Caller)
        .with(Right::Operator);

    pub const fn none() -> Rights {
        Rights {
            listed: 0,
            granted: 0,
        }
    }

    pub const fn with(self, right: Right) -> Rights {
        Rights {
            listed: self.listed | right.bit(),
            granted: self.granted | right.grants(),
        }
    }

    /// Whether a command that needs `needed` may run.
    pub fn allows(self, needed: Right) -> bool {
        self.granted & needed.bit() != 0
    }

    /// The rights as listed, by name.
    pub fn names(self) -> Vec<&'static str> {
        Right::ALL
            .into_iter()
            .filter(|r| self.listed & r.bit() != 0)
            .map(Right::name)
            .collect()
    }
}

impl fmt::Debug for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// What a user may do now: its rights, and the SKUs it may touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub rights: Rights,
    /// SKU prefixes; `None` is every SKU.
    skus: Option<Box<[Box<[u8]>]>>,
}

impl Grant {
    pub fn new(rights: Rights, skus: Option<Vec<Box<[u8]>>>) -> Grant {
        Grant {
            rights,
            skus: skus.map(Vec::into_boxed_slice),
        }
    }

    /// Every right on every SKU.
    pub fn everything() -> Grant {
        Grant::new(Rights::ALL, None)
    }

    /// Whether it may touch every SKU (no prefixes).
    pub fn every_sku(&self) -> bool {
        self.skus.is_none()
    }

    /// Whether it may touch `sku`.
    pub fn allows_sku(&self, sku: &[u8]) -> bool {
        self.skus
            .as_ref()
            .is_none_or(|prefixes| prefixes.iter().any(|p| sku.starts_with(p)))
    }

    /// The SKU prefixes, when it has some.
    pub fn sku_prefixes(&self) -> Option<impl Iterator<Item = &[u8]>> {
        self.skus.as_ref().map(|p| p.iter().map(|p| &p[..]))
    }
}

/// A user as its logged-in connections hold it.
pub struct Account {
    name: Arc<str>,
    grant: ArcSwap<Grant>,
    /// Set when the user is removed, or left without a password: its
    /// connections close. Read at every wake of a connection, so an
    /// atomic (the token's own flag is behind a mutex).
    gone: AtomicBool,
    /// Cancelled with `gone`: wakes the connections that wait.
    closed: CancellationToken,
}

impl Account {
    fn new(name: &str, grant: Grant) -> Arc<Account> {
        Arc::new(Account {
            name: name.into(),
            grant: ArcSwap::from_pointee(grant),
            gone: AtomicBool::new(false),
            closed: CancellationToken::new(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// What it may do now.
    pub fn grant(&self) -> Guard<Arc<Grant>> {
        self.grant.load()
    }

    /// Cancelled once the user is gone: a connection waits on it.
    pub fn closed(&self) -> &CancellationToken {
        &self.closed
    }

    /// Whether the user is gone.
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    fn close(&self) {
        self.gone.store(true, Ordering::Release);
        self.closed.cancel();
    }
}

impl fmt::Debug for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Account")
            .field("name", &self.name)
            .field("grant", &**self.grant.load())
            .finish()
    }
}

/// Why a command was refused, worded as Redis 7.2 words its ACL's refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// The user lacks the command's right.
    Command,
    /// The request touches a SKU outside the user's prefixes, or one it
    /// does not name (an order by its id alone).
    Key,
}

impl Denial {
    /// The error reply, without its leading `-`.
    pub fn reply(self, user: &str, command: &str) -> String {
        match self {
            Denial::Command => {
                format!("NOPERM User {user} has no permissions to run the '{command}' command")
            }
            Denial::Key => "NOPERM No permissions to access a key".to_owned(),
        }
    }
}

/// One user of the table: its account and its passwords.
struct Entry {
    account: Arc<Account>,
    passwords: Box<[Password]>,
}

/// The users as one version of the file (and `--requirepass`) made them.
struct Table {
    entries: Vec<Entry>,
}

impl Table {
    fn find(&self, name: &[u8]) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| e.account.name.as_bytes() == name)
    }
}

/// A login refused: which known user it named, if any (for the metric:
/// an unknown name is never a label).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub user: Option<Arc<str>>,
}

/// What a reload changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Users in the table now.
    pub users: usize,
    /// Users whose open connections were closed: removed, or left without
    /// a password.
    pub closed: Vec<String>,
}

/// The users clients log in as. Without any password (`open`), the
/// `default` user logs in with any password, as Redis's `nopass` default
/// user does, and every connection starts logged in as it.
pub struct Users {
    open: Option<Arc<Account>>,
    requirepass: Option<Password>,
    table: ArcSwap<Table>,
}

/// A hash to compare an unknown user's password against, so that a
/// login naming no known user takes as long as one with a wrong password.
const NOBODY: [u8; 32] = [0; 32];

impl Users {
    /// The users from `--requirepass` (the `default` user with every
    /// right) and the users file. Refused when both define `default`.
    pub fn new(
        requirepass: Option<Password>,
        file: Option<Vec<UserSpec>>,
    ) -> Result<Users, String> {
        let open = (requirepass.is_none() && file.is_none())
            .then(|| Account::new(DEFAULT_USER, Grant::everything()));
        let users = Users {
            open,
            requirepass,
            table: ArcSwap::from_pointee(Table {
                entries: Vec::new(),
            }),
        };
        users.replace(file.unwrap_or_default())?;
        Ok(users)
    }

    /// Whether connections start logged in (no password anywhere).
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// The account every connection starts as, when nothing needs a
    /// password.
    pub fn open_account(&self) -> Option<Arc<Account>> {
        self.open.clone()
    }

    /// Logs `user` (`default` when none is named) in with `password`.
    pub fn login(&self, user: Option<&[u8]>, password: &[u8]) -> Result<Arc<Account>, Refused> {
        let name = user.unwrap_or(DEFAULT_USER.as_bytes());
        if let Some(open) = &self.open {
            return if name == DEFAULT_USER.as_bytes() {
                Ok(open.clone())
            } else {
                Err(Refused { user: None })
            };
        }
        let table = self.table.load();
        let Some(entry) = table.find(name) else {
            let _ = Password::sha256(NOBODY).matches(password);
            return Err(Refused { user: None });
        };
        // Every password is compared, so which one matched (or that none
        // did) takes the same time.
        let matched = entry
            .passwords
            .iter()
            .fold(false, |any, p| p.matches(password) | any);
        if matched {
            Ok(entry.account.clone())
        } else {
            Err(Refused {
                user: Some(entry.account.name.clone()),
            })
        }
    }

    /// The account of user `name`, for a client certificate of that name:
    /// only a user who can log in (it has a password, and it was not
    /// removed).
    pub fn certified(&self, name: &str) -> Option<Arc<Account>> {
        let table = self.table.load();
        let entry = table.find(name.as_bytes())?;
        (!entry.passwords.is_empty() && !entry.account.is_gone()).then(|| entry.account.clone())
    }

    /// Whether `name` is a user now (HTTP's bearer token reads a
    /// `user:` prefix only when it names one).
    pub fn knows(&self, name: &[u8]) -> bool {
        self.table.load().find(name).is_some()
    }

    /// Every user now: name, what it may do, how many passwords it has.
    pub fn list(&self) -> Vec<(String, Grant, usize)> {
        if let Some(open) = &self.open {
            return vec![(open.name.to_string(), Grant::everything(), 0)];
        }
        self.table
            .load()
            .entries
            .iter()
            .map(|e| {
                (
                    e.account.name.to_string(),
                    (**e.account.grant()).clone(),
                    e.passwords.len(),
                )
            })
            .collect()
    }

    /// Puts the users `file` lists (and `--requirepass`'s `default`) in
    /// place of the ones before. A user that stays keeps its account, so
    /// its open connections go on with the new grant; a user removed, or
    /// left without a password, has its connections closed.
    pub fn replace(&self, file: Vec<UserSpec>) -> Result<Reloaded, String> {
        if self.open.is_some() {
            return Ok(Reloaded::default());
        }
        let old = self.table.load_full();
        let mut specs = file;
        if let Some(password) = &self.requirepass {
            if specs.iter().any(|s| s.name == DEFAULT_USER) {
                return Err(format!(
                    "the users file defines the user `{DEFAULT_USER}`, which --requirepass defines too; \
                     drop one of them"
                ));
            }
            specs.push(UserSpec {
                name: DEFAULT_USER.to_owned(),
                passwords: vec![password.clone()],
                grant: Grant::everything(),
                line: 0,
            });
        }
        let mut reloaded = Reloaded {
            users: specs.len(),
            closed: Vec::new(),
        };
        let entries = specs
            .into_iter()
            .map(|spec| {
                let kept = old
                    .find(spec.name.as_bytes())
                    .filter(|e| !e.account.is_gone())
                    .map(|e| e.account.clone());
                let account = match kept {
                    Some(account) => {
                        account.grant.store(Arc::new(spec.grant));
                        account
                    }
                    None => Account::new(&spec.name, spec.grant),
                };
                Entry {
                    account,
                    passwords: spec.passwords.into_boxed_slice(),
                }
            })
            .collect::<Vec<_>>();
        let table = Table { entries };
        for before in &old.entries {
            let now = table.find(before.account.name.as_bytes());
            if now.is_none_or(|e| e.passwords.is_empty()) && !before.account.is_gone() {
                before.account.close();
                reloaded.closed.push(before.account.name.to_string());
            }
        }
        self.table.store(Arc::new(table));
        Ok(reloaded)
    }
}

/// The reply to a wrong password, in Redis's words.
pub const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
/// The reply to a command before authentication, in Redis's words.
pub const NOAUTH: &str = "NOAUTH Authentication required.";

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, passwords: &[&str], rights: &[Right], skus: Option<&[&str]>) -> UserSpec {
        UserSpec {
            name: name.to_owned(),
            passwords: passwords
                .iter()
                .map(|p| Password::new(*p).unwrap())
                .collect(),
            grant: Grant::new(
                rights.iter().fold(Rights::none(), |r, &x| r.with(x)),
                skus.map(|s| s.iter().map(|p| p.as_bytes().into()).collect()),
            ),
            line: 1,
        }
    }

    #[test]
    fn passwords_match_only_exactly_and_never_print() {
        let pw = Password::new("s3cret").unwrap();
        assert!(pw.matches(b"s3cret"));
        assert!(!pw.matches(b"s3cre"));
        assert!(!pw.matches(b"s3cret!"));
        assert!(!pw.matches(b""));
        assert!(Password::new("").is_none(), "an empty password means none");
        assert_eq!(format!("{pw:?}"), "Password(***)");
        let hashed = Password::sha256(Sha256::digest(b"s3cret").into());
        assert!(hashed.matches(b"s3cret"));
        assert!(!hashed.matches(b"s3cret "));
        assert_eq!(format!("{hashed:?}"), "Password(***)");
    }

    #[test]
    fn caller_and_operator_include_the_reads_and_not_each_other() {
        let caller = Rights::none().with(Right::Caller);
        assert!(caller.allows(Right::Caller) && caller.allows(Right::Reader));
        assert!(!caller.allows(Right::Operator));
        let operator = Rights::none().with(Right::Operator);
        assert!(operator.allows(Right::Operator) && operator.allows(Right::Reader));
        assert!(!operator.allows(Right::Caller));
        let reader = Rights::none().with(Right::Reader);
        assert!(reader.allows(Right::Reader));
        assert!(!reader.allows(Right::Caller) && !reader.allows(Right::Operator));
        assert_eq!(caller.names(), ["caller"]);
        assert!(Right::ALL.iter().all(|&r| Rights::ALL.allows(r)));
    }

    #[test]
    fn a_login_names_a_user_and_one_of_its_passwords() {
        let users = Users::new(
            Some(Password::new("root").unwrap()),
            Some(vec![spec("app", &["old", "new"], &[Right::Caller], None)]),
        )
        .unwrap();
        assert!(!users.is_open());
        assert_eq!(users.login(None, b"root").unwrap().name(), "default");
        assert_eq!(users.login(Some(b"app"), b"old").unwrap().name(), "app");
        assert_eq!(users.login(Some(b"app"), b"new").unwrap().name(), "app");
        assert_eq!(
            users
                .login(Some(b"app"), b"root")
                .unwrap_err()
                .user
                .as_deref(),
            Some("app")
        );
        assert_eq!(users.login(Some(b"nobody"), b"old").unwrap_err().user, None);
        assert!(users.login(None, b"old").is_err());
        // Both defining `default` is refused.
        assert!(
            Users::new(
                Some(Password::new("root").unwrap()),
                Some(vec![spec("default", &["x"], &[Right::Reader], None)])
            )
            .is_err()
        );
    }

    #[test]
    fn without_passwords_everyone_is_the_nopass_default_user() {
        let users = Users::new(None, None).unwrap();
        assert!(users.is_open());
        assert_eq!(users.login(None, b"anything").unwrap().name(), "default");
        assert!(users.login(Some(b"app"), b"anything").is_err());
        assert!(
            users
                .open_account()
                .unwrap()
                .grant()
                .rights
                .allows(Right::Operator)
        );
    }

    #[test]
    fn a_reload_keeps_accounts_changes_grants_in_place_and_closes_the_removed() {
        let users = Users::new(
            None,
            Some(vec![
                spec("app", &["a"], &[Right::Caller], None),
                spec("ops", &["o"], &[Right::Operator], None),
                spec("web", &["w"], &[Right::Reader], None),
            ]),
        )
        .unwrap();
        let app = users.login(Some(b"app"), b"a").unwrap();
        let ops = users.login(Some(b"ops"), b"o").unwrap();
        let web = users.login(Some(b"web"), b"w").unwrap();
        let reloaded = users
            .replace(vec![
                spec("app", &["a2"], &[Right::Reader], Some(&["shop-"])),
                spec("web", &[], &[Right::Reader], None),
            ])
            .unwrap();
        assert_eq!(reloaded.users, 2);
        assert_eq!(reloaded.closed, ["ops", "web"]);
        assert!(ops.is_gone() && web.is_gone());
        assert!(!app.is_gone(), "app stays, with its new grant");
        let grant = app.grant();
        assert!(!grant.rights.allows(Right::Caller));
        assert!(grant.allows_sku(b"shop-1") && !grant.allows_sku(b"other"));
        assert!(
            users.login(Some(b"app"), b"a").is_err(),
            "the old password is gone"
        );
        assert!(Arc::ptr_eq(
            &users.login(Some(b"app"), b"a2").unwrap(),
            &app
        ));
        // A user that comes back is a new account.
        users
            .replace(vec![spec("ops", &["o"], &[Right::Operator], None)])
            .unwrap();
        let again = users.login(Some(b"ops"), b"o").unwrap();
        assert!(!again.is_gone());
        assert!(app.is_gone());
    }

    #[test]
    fn refusals_are_worded_as_redis_7_2_words_them() {
        assert_eq!(
            Denial::Command.reply("app", "stock.set"),
            "NOPERM User app has no permissions to run the 'stock.set' command"
        );
        assert_eq!(
            Denial::Key.reply("app", "deduct"),
            "NOPERM No permissions to access a key"
        );
    }
}
