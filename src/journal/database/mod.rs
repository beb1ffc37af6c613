//! The books' database: where it is ([`target`], with its TLS in
//! [`tls`]), and what the sink and reconcile ask of it, whichever it is:
//! PostgreSQL ([`postgres`]), or MySQL and MariaDB ([`mysql`]).
//!
//! Each engine keeps the same promises in its own SQL: the schema applied
//! once however many sinks start together, a batch in one transaction
//! keyed by (sku, entry_ms, entry_seq) so a re-delivery changes nothing,
//! an id come back with other content kept in the conflicts table, the
//! shard locks held by the connection that writes, and each (SKU,
//! location)'s account as of an entry.

pub mod mysql;
pub mod postgres;
pub mod target;
pub mod tls;

use super::Entry;
use super::fault::JournalFault;
use std::collections::{BTreeMap, HashMap};
pub use target::{MysqlTarget, PgTarget, Target};

/// One location's account of a SKU as the database keeps it (a row of
/// the `stockgate_account` view).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Whether it opens at a baseline (`set`) rather than its first entry.
    pub from_baseline: bool,
    pub stock: i64,
    pub held: i64,
    pub entries: i64,
    /// The newest entry of the location the database holds.
    pub last: (u64, u64),
}

/// A SKU's accounts by location: `''` for a SKU that keeps one number.
pub type Accounts = BTreeMap<String, Account>;

/// What a committed batch did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// Entries that were not in the database before.
    pub moved: u64,
    /// Entries already there with the same content (re-deliveries).
    pub already: u64,
    /// Entries already there with other content, now in the conflicts table.
    pub conflicts: u64,
}

/// An entry of one SKU, as a batch carries it.
#[derive(Debug, Clone)]
pub struct SkuEntry {
    pub sku: String,
    pub entry: Entry,
}

/// A connection to the books' database.
pub enum Books {
    Postgres(postgres::PgBooks),
    Mysql(mysql::MysqlBooks),
}

impl Books {
    /// Connects as the target says (TLS by its mode). After any fault the
    /// caller drops it and connects again: the connection is in doubt,
    /// and the shard locks went with it if it broke.
    pub async fn connect(target: &Target) -> Result<Books, JournalFault> {
        let connected = match target {
            Target::Postgres(pg) => postgres::PgBooks::connect(pg).await.map(Books::Postgres),
            Target::Mysql(my) => mysql::MysqlBooks::connect(my).await.map(Books::Mysql),
        };
        connected.map_err(|err| {
            JournalFault::new(
                err.origin,
                err.retry_safe,
                format!(
                    "cannot connect to {} ({}): {}",
                    target.shown(),
                    target.tls().describe(),
                    err.detail
                ),
            )
        })
    }

    /// True once the connection is known to be broken.
    pub fn is_closed(&self) -> bool {
        match self {
            Books::Postgres(db) => db.is_closed(),
            // mysql_async cannot tell before a statement fails; the
            // caller drops the connection after any fault.
            Books::Mysql(_) => false,
        }
    }

    /// The TLS version the session runs over, as the server sees it (None
    /// in plaintext): the sink logs it, so an operator sees what the URL
    /// got.
    pub async fn tls_in_use(&mut self) -> Result<Option<String>, JournalFault> {
        match self {
            Books::Postgres(db) => db.tls_in_use().await,
            Books::Mysql(db) => db.tls_in_use().await,
        }
    }

    /// Applies the migrations not applied yet: idempotent, and safe with
    /// sinks starting at once.
    pub async fn migrate(&mut self) -> Result<(), JournalFault> {
        match self {
            Books::Postgres(db) => db.migrate().await,
            Books::Mysql(db) => db.migrate().await,
        }
    }

    /// Joins the sinks: counted among them for as long as this connection
    /// lives.
    pub async fn join_sinks(&mut self) -> Result<(), JournalFault> {
        match self {
            Books::Postgres(db) => db.join_sinks().await,
            Books::Mysql(db) => db.join_sinks().await,
        }
    }

    /// How many sinks are connected now (this one included).
    pub async fn sinks(&mut self) -> Result<usize, JournalFault> {
        match self {
            Books::Postgres(db) => db.sinks().await,
            Books::Mysql(db) => db.sinks().await,
        }
    }

    /// Takes shard `shard`'s lock if no other sink has it.
    pub async fn claim(&mut self, shard: usize) -> Result<bool, JournalFault> {
        match self {
            Books::Postgres(db) => db.claim(shard).await,
            Books::Mysql(db) => db.claim(shard).await,
        }
    }

    /// Gives shard `shard` back, for another sink to take.
    pub async fn release(&mut self, shard: usize) -> Result<(), JournalFault> {
        match self {
            Books::Postgres(db) => db.release(shard).await,
            Books::Mysql(db) => db.release(shard).await,
        }
    }

    /// Writes `batch` in one transaction: new entries once, a re-delivered
    /// one as nothing, and one whose id is taken by other content into the
    /// conflicts table.
    pub async fn commit(&mut self, batch: &[SkuEntry]) -> Result<Committed, JournalFault> {
        match self {
            Books::Postgres(db) => db.commit(batch).await,
            Books::Mysql(db) => db.commit(batch).await,
        }
    }

    /// Every SKU the database has an account for.
    pub async fn skus(&mut self) -> Result<Vec<String>, JournalFault> {
        match self {
            Books::Postgres(db) => db.skus().await,
            Books::Mysql(db) => db.skus().await,
        }
    }

    /// The accounts of `wanted`, each SKU's as of its entry (all of it
    /// when None), in one query: a SKU with no entry up to there has
    /// none, and a location with none up to there has none.
    pub async fn accounts(
        &mut self,
        wanted: &[(String, Option<(u64, u64)>)],
    ) -> Result<HashMap<String, Accounts>, JournalFault> {
        match self {
            Books::Postgres(db) => db.accounts(wanted).await,
            Books::Mysql(db) => db.accounts(wanted).await,
        }
    }

    /// The entries of `sku` at `location` that don't follow from the one
    /// before them at that location (their stock or held before the
    /// change is not what it left), newest first: where an account's
    /// history broke.
    pub async fn breaks(
        &mut self,
        sku: &str,
        location: &str,
        limit: i64,
    ) -> Result<Vec<Entry>, JournalFault> {
        match self {
            Books::Postgres(db) => db.breaks(sku, location, limit).await,
            Books::Mysql(db) => db.breaks(sku, location, limit).await,
        }
    }
}

/// An entry id as the tables keep it (bigints): as of "everything" when
/// None.
fn up_to_columns(up_to: Option<(u64, u64)>) -> (i64, i64) {
    up_to.map_or((i64::MAX, i64::MAX), |(ms, seq)| {
        (
            i64::try_from(ms).unwrap_or(i64::MAX),
            i64::try_from(seq).unwrap_or(i64::MAX),
        )
    })
}
