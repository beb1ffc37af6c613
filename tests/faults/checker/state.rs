//! What Redis holds at the end, for the load's skus: read directly from
//! every primary (SCAN, then one MULTI per sku), not through stockgate,
//! with the intent records of the load's orders read through the cluster.

use redis::Value;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use stockgate::dev::LocalCluster;

use super::history::History;
use super::load::Workload;
use super::orders::orders_in_flight_key;

/// What Redis holds at the end, for the load's skus.
pub(super) struct FinalState {
    pub(super) stock: HashMap<String, i64>,
    /// (sku, request_id) -> the record
    pub(super) records: HashMap<(String, String), FinalRecord>,
    /// sku -> its `:holds` set, request_id -> expiry (ms of Redis time)
    pub(super) holds: HashMap<String, HashMap<String, i64>>,
    /// sku -> its `:held` counter (absent: 0, as the scripts delete it at 0)
    pub(super) held: HashMap<String, i64>,
    /// sku -> its journal's entries (`--journal`, issue 26), oldest first.
    pub(super) journals: HashMap<String, Vec<stockgate::journal::Entry>>,
    /// Redis time (ms) when the reading began: holds whose expiry is before
    /// it ran out, released or not.
    pub(super) now_ms: i64,
    /// request_id -> its order's intent record (fields p, k, l, e, c, ...),
    /// for the orders of the load.
    pub(super) intents: HashMap<String, HashMap<String, String>>,
    /// The orders left after an error that are still filed among the
    /// orders in flight (`lua/order_due.lua`), so that recovery would
    /// look at them again.
    pub(super) filed: std::collections::HashSet<String>,
    /// How long the audit waited for recovery before reading.
    pub(super) recovery_waited: Duration,
    pub(super) violations: Vec<String>,
}

/// One record as the audit reads it.
pub(super) struct FinalRecord {
    pub(super) state: RecordState,
    /// `<state>:<qty>:<order_no>`, without the nonce of the call that
    /// wrote it.
    pub(super) summary: String,
    pub(super) qty: u64,
    /// A hold's expiry (HELD, CONFIRMED, EXPIRED).
    pub(super) expires: Option<i64>,
    pub(super) pttl: i64,
}

pub(super) use stockgate::record::State as RecordState;

impl FinalRecord {
    /// A HELD record has no TTL (its units are in it, so it lasts until
    /// its hold ends); every other record has one.
    pub(super) fn ttl_violation(&self) -> Option<String> {
        match (self.state == RecordState::Held, self.pttl) {
            (true, -1) => None,
            (true, pttl) => Some(format!("HELD record with a TTL (PTTL {pttl})")),
            (false, pttl) if pttl > 0 => None,
            (false, pttl) => Some(format!("record without a TTL (PTTL {pttl})")),
        }
    }
}

/// What a key of the load's is, by its name.
enum KeyKind {
    Stock,
    Record,
    Holds,
    Held,
    Journal,
    /// The sink's mark of the last id it read (`--wait-replicas`).
    Sunk,
    /// The journal's marker, which the calls read to learn the SKU has a
    /// journal (`lua/journal_open.lua`).
    JournalMarker,
}

/// A journal's XRANGE, its entries read as the sink reads them.
fn read_journal(value: &Value) -> Result<Vec<stockgate::journal::Entry>, String> {
    stockgate::journal::stream::entries(value.clone()).map_err(|e| e.to_string())
}

impl FinalState {
    /// SCANs every primary for the load's keys and reads each, checking
    /// that each key lives on the primary that owns its slot.
    pub(super) fn read(cluster: &LocalCluster, workload: &Workload) -> FinalState {
        let mut state = FinalState {
            stock: HashMap::new(),
            records: HashMap::new(),
            holds: HashMap::new(),
            held: HashMap::new(),
            journals: HashMap::new(),
            now_ms: 0,
            intents: HashMap::new(),
            filed: Default::default(),
            recovery_waited: Duration::ZERO,
            violations: Vec::new(),
        };
        let pattern = format!("stock:{{{}-*", workload.name);
        for node in cluster.nodes.iter().filter(|n| n.is_running()) {
            if !crate::harness::is_primary(node) {
                continue;
            }
            let owned = crate::harness::own_slots(node);
            let mut conn = node.connection().expect("primary");
            if state.now_ms == 0 {
                let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
                state.now_ms = secs * 1000 + micros / 1000;
            }
            let mut keys: Vec<Vec<u8>> = Vec::new();
            let mut cursor = 0u64;
            loop {
                let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query(&mut conn)
                    .expect("SCAN");
                keys.extend(batch);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
            // One sku's keys share its hash tag, so one MULTI reads them
            // all at one instant: the sweeper may still be releasing
            // holds (a record turning EXPIRED, the set and the counter
            // shrinking with it), and a read spread over batches would see
            // half a release. The sku's own three keys are always read,
            // found by the SCAN or not.
            let mut by_sku: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
            for key in keys {
                let text = String::from_utf8_lossy(&key).into_owned();
                let sku = text
                    .strip_prefix("stock:{")
                    .and_then(|rest| rest.split_once('}'))
                    .map_or(String::new(), |(sku, _)| sku.to_owned());
                by_sku.entry(sku).or_default().push(key);
            }
            for (sku, mut keys) in by_sku {
                if !sku.is_empty() {
                    let stock = format!("stock:{{{sku}}}").into_bytes();
                    for own in [
                        stock.clone(),
                        [&stock[..], b":holds"].concat(),
                        [&stock[..], b":held"].concat(),
                    ] {
                        if !keys.contains(&own) {
                            keys.push(own);
                        }
                    }
                }
                let mut pipe = redis::pipe();
                pipe.atomic();
                for key in &keys {
                    // A holds set is read as one: GET of it would fail
                    // the whole transaction with WRONGTYPE.
                    if key.ends_with(b"}:holds") {
                        pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES");
                    } else if key.ends_with(b"}:journal") {
                        pipe.cmd("XRANGE").arg(key).arg("-").arg("+");
                    } else {
                        pipe.cmd("GET").arg(key);
                    }
                    pipe.cmd("PTTL").arg(key);
                }
                let values: Vec<Value> = pipe.query(&mut conn).expect("MULTI GET/PTTL");
                for (key, pair) in keys.iter().zip(values.chunks(2)) {
                    let slot = stockgate::keys::slot(key);
                    let key_text = String::from_utf8_lossy(key).into_owned();
                    // Absent (a sku of another primary, or a counter at 0):
                    // nothing to read.
                    if pair[0] == Value::Nil
                        || ((key.ends_with(b"}:holds") || key.ends_with(b"}:journal"))
                            && pair[0] == Value::Array(Vec::new()))
                    {
                        continue;
                    }
                    if !owned.iter().any(|(lo, hi)| (*lo..=*hi).contains(&slot)) {
                        state.violations.push(format!(
                            "stray key {key_text} on port {} which does not own its slot",
                            node.port
                        ));
                        continue;
                    }
                    let pttl = match pair[1] {
                        Value::Int(t) => t,
                        _ => -3,
                    };
                    state.add(&key_text, &pair[0], pttl);
                }
            }
        }
        state
    }

    /// Reads the intent record of every order the load sent, through the
    /// cluster (each lives in its own slot, `{order:<id>}`).
    pub(super) fn read_intents(&mut self, cluster: &LocalCluster, history: &History) {
        let mut ids: Vec<&str> = history
            .attempts
            .iter()
            .filter(|a| a.op.is_order())
            .map(|a| &*a.id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return;
        }
        let mut conn = cluster.cluster_connection().expect("cluster connection");
        for id in ids {
            let key = format!("stock:{{order:{id}}}:intent");
            let fields: HashMap<String, String> = redis::cmd("HGETALL")
                .arg(&key)
                .query(&mut conn)
                .expect("HGETALL an intent");
            if !fields.is_empty() {
                let pttl: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query(&mut conn)
                    .expect("PTTL an intent");
                if pttl <= 0 {
                    self.violations
                        .push(format!("order {id}: intent without a TTL (PTTL {pttl})"));
                }
                self.intents.insert(id.to_owned(), fields);
            }
        }
        for left in &history.left {
            let filed: Option<f64> = redis::cmd("ZSCORE")
                .arg(orders_in_flight_key(&left.id))
                .arg(&*left.id)
                .query(&mut conn)
                .expect("ZSCORE an order in flight");
            if filed.is_some() {
                self.filed.insert(left.id.to_string());
            }
        }
    }

    fn add(&mut self, key: &str, value: &Value, pttl: i64) {
        let text = || match value {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        };
        let Some((sku, kind, id)) = key
            .strip_prefix("stock:{")
            .and_then(|rest| rest.split_once('}'))
            .and_then(|(sku, tail)| {
                let (kind, id) = match tail {
                    "" => (KeyKind::Stock, ""),
                    ":holds" => (KeyKind::Holds, ""),
                    ":held" => (KeyKind::Held, ""),
                    ":journal" => (KeyKind::Journal, ""),
                    ":journal:sunk" => (KeyKind::Sunk, ""),
                    ":journal:on" => (KeyKind::JournalMarker, ""),
                    _ => (KeyKind::Record, tail.strip_prefix(":req:")?),
                };
                Some((sku, kind, id))
            })
        else {
            self.violations.push(format!("unexpected key {key}"));
            return;
        };
        match kind {
            KeyKind::JournalMarker => {
                if text() != "1" || pttl != -1 {
                    self.violations.push(format!(
                        "{key} is not a lasting \"1\": {:?}, PTTL {pttl}",
                        text()
                    ));
                }
            }
            KeyKind::Sunk => {
                let id = text();
                let parsed = id.split_once('-').and_then(|(ms, seq)| {
                    Some((ms.parse::<u64>().ok()?, seq.parse::<u64>().ok()?))
                });
                if parsed.is_none() {
                    self.violations
                        .push(format!("{key} is not a stream id: {id:?}"));
                }
            }
            KeyKind::Journal => match read_journal(value) {
                Ok(entries) => {
                    self.journals.insert(sku.to_owned(), entries);
                }
                Err(bad) => self.violations.push(format!("{key}: {bad}")),
            },
            KeyKind::Stock => match text().parse() {
                Ok(stock) => {
                    self.stock.insert(sku.to_owned(), stock);
                }
                Err(_) => self
                    .violations
                    .push(format!("stock of {sku} is not an integer: {:?}", text())),
            },
            KeyKind::Held => match text().parse() {
                Ok(held) => {
                    self.held.insert(sku.to_owned(), held);
                }
                Err(_) => self
                    .violations
                    .push(format!("{key} is not an integer: {:?}", text())),
            },
            KeyKind::Holds => {
                let Value::Array(items) = value else {
                    self.violations
                        .push(format!("{key} is not a sorted set: {value:?}"));
                    return;
                };
                let set = self.holds.entry(sku.to_owned()).or_default();
                for pair in items.chunks(2) {
                    let member = match &pair[0] {
                        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                        other => format!("{other:?}"),
                    };
                    let score = match pair.get(1) {
                        Some(Value::BulkString(b)) => {
                            String::from_utf8_lossy(b).parse::<f64>().ok()
                        }
                        Some(Value::Double(d)) => Some(*d),
                        _ => None,
                    };
                    set.insert(member, score.map_or(-1, |s| s as i64));
                }
            }
            KeyKind::Record => {
                // Audited without the nonce of the call that wrote it.
                match stockgate::record::Record::parse(&text()) {
                    Some(record) => {
                        self.records.insert(
                            (sku.to_owned(), id.to_owned()),
                            FinalRecord {
                                state: record.state,
                                summary: record.summary(),
                                qty: record.qty,
                                expires: record.hold.map(|(expires, _)| expires as i64),
                                pttl,
                            },
                        );
                    }
                    None => self
                        .violations
                        .push(format!("record {key} has an unknown shape: {:?}", text())),
                }
            }
        }
    }
}
