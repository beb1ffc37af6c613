//! The books' side in Redis, as the sink and reconcile read it: the shard
//! sets that list every SKU with a journal, a SKU's journal (a stream), the
//! replication check before a move, the trim after a commit, and one
//! consistent read of a SKU's state (one number, or each location's) with
//! its journal.

use super::Entry;
use super::fault::JournalFault;
use crate::config::Durability;
use crate::keys::{KEPT_BY_LOCATION, KeyLayout, LocationField};
use crate::params::Sku;
use crate::upstream::Upstream;
use redis::Value;
use std::collections::BTreeMap;

/// A SKU named in a shard set, checked as stockgate checks any sku.
pub fn sku(name: &str) -> Result<Sku, JournalFault> {
    Sku::parse(bytes::Bytes::copy_from_slice(name.as_bytes())).map_err(|e| {
        JournalFault::new(
            crate::metrics::JournalSource::Data,
            false,
            format!("sku {name:?} in a journal set: {e:?}"),
        )
    })
}

/// The SKUs listed in one sweep shard's set of journals.
pub async fn listed(upstream: &Upstream, set_key: &[u8]) -> Result<Vec<String>, JournalFault> {
    let mut cmd = redis::cmd("SMEMBERS");
    cmd.arg(set_key);
    let value = upstream.query(&cmd).await.map_err(JournalFault::redis)?;
    let mut skus: Vec<String> = items(value)?
        .into_iter()
        .map(text)
        .collect::<Result<_, _>>()?;
    skus.sort();
    Ok(skus)
}

/// XLENs in flight at once in [`holding`].
const PROBES_IN_FLIGHT: usize = 64;

/// Which of `names` (a shard's listed SKUs) have entries: their journals'
/// lengths, asked many at a time. Most journals of an idle shop are empty,
/// and a sink that read each in turn would pay a round trip per listed SKU
/// every round; the multiplexed connection carries these together.
pub async fn holding(
    upstream: &Upstream,
    keys: &KeyLayout,
    names: Vec<String>,
) -> Result<Vec<String>, JournalFault> {
    use futures_util::stream::{self, StreamExt, TryStreamExt};
    let probed: Vec<(String, bool)> = stream::iter(names)
        .map(|name| async move {
            // A name that is no sku is kept: the sink's read of it reports
            // it, and stops that SKU only.
            let Ok(parsed) = sku(&name) else {
                return Ok((name, true));
            };
            let mut cmd = redis::cmd("XLEN");
            cmd.arg(keys.journal_key(&parsed));
            match upstream.query(&cmd).await.map_err(JournalFault::redis)? {
                Value::Int(length) => Ok((name, length > 0)),
                other => Err(JournalFault::bad_reply(format!("XLEN answered {other:?}"))),
            }
        })
        .buffered(PROBES_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(probed
        .into_iter()
        .filter_map(|(name, holds)| holds.then_some(name))
        .collect())
}

/// Every SKU listed in any shard set.
pub async fn all_listed(
    upstream: &Upstream,
    keys: &KeyLayout,
) -> Result<Vec<String>, JournalFault> {
    let mut all = Vec::new();
    for shard in keys.sweep_shards() {
        all.extend(listed(upstream, &shard.journals).await?);
    }
    all.sort();
    all.dedup();
    Ok(all)
}

/// Calls in flight at once in [`mark_listed`].
const MARKS_IN_FLIGHT: usize = 64;

/// Marks every listed SKU's journal (`lua/journal_open.lua`'s `make`, which
/// makes the marker beside the stream, and the stream if an opening was
/// cut between its two steps): a journal an older release opened has no
/// marker, and until it has one a sidecar with `--journal false` does not
/// see it (`lua/common.lua`, `journal_of`). Idempotent. Returns how many.
pub async fn mark_listed(upstream: &Upstream, keys: &KeyLayout) -> Result<usize, JournalFault> {
    use futures_util::stream::{self, StreamExt, TryStreamExt};
    let scripts = crate::script::Scripts::new();
    let names = all_listed(upstream, keys).await?;
    let count = names.len();
    stream::iter(names)
        .map(|name| {
            let scripts = &scripts;
            async move {
                let sku = sku(&name)?;
                let deadline = tokio::time::Instant::now() + upstream.timeout();
                upstream
                    .eval_piped(
                        &scripts.journal_open,
                        &[&keys.journal_key(&sku)],
                        &[b"make"],
                        deadline,
                    )
                    .await
                    .map_err(JournalFault::redis)
            }
        })
        .buffer_unordered(MARKS_IN_FLIGHT)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    Ok(count)
}

/// A read of a SKU's journal: how many entries it holds in all, and up to
/// `count` of them after `after` (from the start when None).
pub struct Read {
    pub length: u64,
    /// The entries read, up to the first one that cannot be read.
    pub entries: Vec<Entry>,
    /// That entry's fault, if any: its SKU stops there.
    pub unreadable: Option<JournalFault>,
}

/// Reads up to `count` entries of `sku`'s journal after `after`, with the
/// journal's length, in one pipeline to its slot.
pub async fn read(
    upstream: &Upstream,
    keys: &KeyLayout,
    sku: &Sku,
    after: Option<(u64, u64)>,
    count: usize,
) -> Result<Read, JournalFault> {
    let key = keys.journal_key(sku);
    let start = match after {
        Some((ms, seq)) => format!("({ms}-{seq}"),
        None => "-".to_owned(),
    };
    let mut pipe = redis::pipe();
    pipe.cmd("XLEN").arg(&key);
    pipe.cmd("XRANGE")
        .arg(&key)
        .arg(start)
        .arg("+")
        .arg("COUNT")
        .arg(count);
    let replies = upstream
        .pipeline(&pipe)
        .await
        .map_err(JournalFault::redis)?;
    let [length, range]: [Value; 2] = replies
        .try_into()
        .map_err(|r| JournalFault::bad_reply(format!("XLEN and XRANGE answered {r:?}")))?;
    let Value::Int(length) = length else {
        return Err(JournalFault::bad_reply(format!("XLEN answered {length:?}")));
    };
    let mut entries = Vec::new();
    let mut unreadable = None;
    for item in items(range)? {
        match entry(item) {
            Ok(entry) => entries.push(entry),
            Err(fault) => {
                unreadable = Some(fault);
                break;
            }
        }
    }
    Ok(Read {
        length: length.max(0) as u64,
        entries,
        unreadable,
    })
}

/// How long a SKU's `:journal:sunk` mark outlives its last write.
const SUNK_MARK_TTL_MS: u64 = 60_000;

/// Whether `durability.replicas` replicas have everything `sku`'s primary
/// had when the sink read up to `last`: a small write in the SKU's slot
/// (the last id read, under `<journal>:sunk`), then WAIT on the same
/// connection. WAIT confirms the replication offset of this connection's
/// last write, which lies after every entry read.
pub async fn replicated(
    upstream: &Upstream,
    keys: &KeyLayout,
    sku: &Sku,
    last: (u64, u64),
    durability: Durability,
) -> Result<bool, JournalFault> {
    let mut pipe = redis::pipe();
    // Nothing reads the mark back: it only gives WAIT an offset to confirm.
    // Its TTL lets an idle SKU's mark go; any write in the slot would do.
    pipe.cmd("SET")
        .arg(keys.journal_sunk_key(sku))
        .arg(format!("{}-{}", last.0, last.1))
        .arg("PX")
        .arg(SUNK_MARK_TTL_MS);
    pipe.cmd("WAIT")
        .arg(durability.replicas)
        .arg(durability.timeout.as_millis() as u64);
    let replies = upstream
        .pipeline(&pipe)
        .await
        .map_err(JournalFault::redis)?;
    match replies.last() {
        Some(Value::Int(acked)) => Ok(*acked >= i64::from(durability.replicas)),
        other => Err(JournalFault::bad_reply(format!("WAIT answered {other:?}"))),
    }
}

/// Drops the entries of `sku`'s journal up to and including `last`, which
/// the database holds (called only after the commit). Entries appended
/// since have larger ids and stay.
pub async fn trim(
    upstream: &Upstream,
    keys: &KeyLayout,
    sku: &Sku,
    last: (u64, u64),
) -> Result<(), JournalFault> {
    let min_kept = match last.1.checked_add(1) {
        Some(seq) => format!("{}-{seq}", last.0),
        None => format!("{}-0", last.0 + 1),
    };
    let mut cmd = redis::cmd("XTRIM");
    cmd.arg(keys.journal_key(sku))
        .arg("MINID")
        .arg("=")
        .arg(min_kept);
    upstream.query(&cmd).await.map_err(JournalFault::redis)?;
    Ok(())
}

/// A SKU's state in Redis, read in one atomic script call: its units
/// (one number, or each location's) and its whole journal, so a change
/// running meanwhile is either all in it or not at all.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub units: Units,
    pub journal: Vec<Entry>,
    /// The last id the journal ever gave (XINFO's last-generated-id),
    /// trimmed entries included; None when there is no journal.
    pub last_given: Option<(u64, u64)>,
}

/// A SKU's units as Redis keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Units {
    /// A SKU that keeps one number: its stock key (None when missing) and
    /// its held units.
    One { stock: Option<i64>, held: i64 },
    /// A SKU kept by location (its stock key holds
    /// [`KEPT_BY_LOCATION`]): each location of its locations hash, by
    /// name, with its available and held units, and the SKU's own held
    /// units (its `:held`, which the scripts keep as the locations' held
    /// units summed).
    ByLocation {
        locations: BTreeMap<String, LocationUnits>,
        held: i64,
    },
}

/// One location's units: its available units (None when the hash has a
/// location's held units or floor but not the location itself) and its
/// units on hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LocationUnits {
    pub available: Option<i64>,
    pub held: i64,
}

/// Reads nothing but these four keys, all in the SKU's slot; `no-writes`
/// lets a replica-routed read and an out-of-memory primary run it. The
/// locations hash is read only for a SKU kept by location (ARGV[1], the
/// stock key's text then).
const SNAPSHOT: &str = "#!lua flags=no-writes
local last = false
if redis.call('EXISTS', KEYS[3]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[3])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last = info[i + 1] end
  end
end
local stock = redis.call('GET', KEYS[1])
local locations = {}
if stock == ARGV[1] then locations = redis.call('HGETALL', KEYS[4]) end
return {stock, redis.call('GET', KEYS[2]), redis.call('XRANGE', KEYS[3], '-', '+'), last, locations}";

pub async fn snapshot(
    upstream: &Upstream,
    keys: &KeyLayout,
    sku: &Sku,
) -> Result<Snapshot, JournalFault> {
    let held_key = keys.sku_keys(sku).held;
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(SNAPSHOT)
        .arg(4)
        .arg(keys.stock_key(sku))
        .arg(held_key)
        .arg(keys.journal_key(sku))
        .arg(keys.locations_key(sku))
        .arg(KEPT_BY_LOCATION);
    let value = upstream.query(&cmd).await.map_err(JournalFault::redis)?;
    let items = items(value)?;
    let [stock, held, journal, last_given, locations]: [Value; 5] = items
        .try_into()
        .map_err(|v| JournalFault::bad_reply(format!("the snapshot answered {v:?}")))?;
    let not_integer = |what: &str| {
        JournalFault::new(
            crate::metrics::JournalSource::Data,
            false,
            format!("{what} of {sku:?} is not an integer"),
        )
    };
    let number = |value: Value, what: &str| -> Result<Option<i64>, JournalFault> {
        match value {
            Value::Nil => Ok(None),
            other => text(other)?
                .parse()
                .map(Some)
                .map_err(|_| not_integer(what)),
        }
    };
    let held = number(held, "the held units")?.unwrap_or(0);
    let units = match stock {
        Value::BulkString(ref text) if text.as_slice() == KEPT_BY_LOCATION => Units::ByLocation {
            locations: location_units(sku, locations)?,
            held,
        },
        stock => Units::One {
            stock: number(stock, "the stock")?,
            held,
        },
    };
    Ok(Snapshot {
        units,
        journal: entries(journal)?,
        last_given: match last_given {
            Value::Nil => None,
            other => Some(stream_id(&text(other)?)?),
        },
    })
}

/// A SKU's locations hash (HGETALL's reply), by location. A field of
/// another shape is a fault, not a field skipped: a hash this stockgate
/// can't read whole could hide units.
fn location_units(sku: &Sku, hash: Value) -> Result<BTreeMap<String, LocationUnits>, JournalFault> {
    let bad = |what: String| {
        JournalFault::new(
            crate::metrics::JournalSource::Data,
            false,
            format!("the locations of {sku:?}: {what}"),
        )
    };
    let mut units: BTreeMap<String, LocationUnits> = BTreeMap::new();
    for (field, value) in &pairs(hash)? {
        let number = || {
            value
                .parse::<i64>()
                .map_err(|_| bad(format!("{field} is {value:?}, not an integer")))
        };
        match LocationField::parse(field) {
            Some(LocationField::Available(location)) => {
                units.entry(location.to_owned()).or_default().available = Some(number()?);
            }
            Some(LocationField::Held(location)) => {
                units.entry(location.to_owned()).or_default().held = number()?;
            }
            Some(LocationField::Floor(_)) => {}
            None => return Err(bad(format!("a field {field:?} of no known shape"))),
        }
    }
    Ok(units)
}

/// XRANGE's reply: `[[id, [field, value, ...]], ...]`, every entry read
/// (the audits of the tests read journals this way too).
pub fn entries(value: Value) -> Result<Vec<Entry>, JournalFault> {
    items(value)?.into_iter().map(entry).collect()
}

/// One entry of XRANGE's reply: `[id, [field, value, ...]]`.
fn entry(item: Value) -> Result<Entry, JournalFault> {
    let [id, fields]: [Value; 2] = items(item)?
        .try_into()
        .map_err(|v| JournalFault::bad_reply(format!("a stream entry {v:?}")))?;
    let id = text(id)?;
    Ok(Entry::parse(&id, &pairs(fields)?)?)
}

/// Field/value pairs as RESP3 (a map) or RESP2 (a flat array) gives them
/// (a stream entry's fields, HGETALL's reply).
fn pairs(value: Value) -> Result<Vec<(String, String)>, JournalFault> {
    match value {
        Value::Map(pairs) => pairs
            .into_iter()
            .map(|(k, v)| Ok((text(k)?, text(v)?)))
            .collect(),
        other => {
            let flat: Vec<String> = items(other)?
                .into_iter()
                .map(text)
                .collect::<Result<_, _>>()?;
            Ok(flat
                .chunks(2)
                .map(|pair| (pair[0].clone(), pair.get(1).cloned().unwrap_or_default()))
                .collect())
        }
    }
}

fn stream_id(id: &str) -> Result<(u64, u64), JournalFault> {
    id.split_once('-')
        .and_then(|(ms, seq)| Some((ms.parse().ok()?, seq.parse().ok()?)))
        .ok_or_else(|| JournalFault::bad_reply(format!("stream id {id:?}")))
}

fn items(value: Value) -> Result<Vec<Value>, JournalFault> {
    match value {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => Err(JournalFault::bad_reply(format!(
            "expected an array, got {other:?}"
        ))),
    }
}

fn text(value: Value) -> Result<String, JournalFault> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes)
            .map_err(|_| JournalFault::bad_reply("a journal string is not UTF-8")),
        Value::SimpleString(s) => Ok(s),
        Value::Int(n) => Ok(n.to_string()),
        other => Err(JournalFault::bad_reply(format!(
            "expected a string, got {other:?}"
        ))),
    }
}
