//! SKUs kept by location (docs/locations.md) under faults: a primary
//! killed mid-allocation, and the SKU's own slot moving under its
//! allocations, then moving back with an expired hold's record left
//! behind. Each against Redis 7.0, Redis 8.2, Valkey 8.0 and Valkey 9.1
//! (`matrix!`): a failover and a slot move are where the servers differ
//! (a promoted replica's scripts, a script's keys met mid-migration).
//!
//! Its own small load ([`Allocations`]): clients allocate over three
//! locations with floors (DEDUCT.AT, HOLD.AT, SPLIT and WHOLE), then
//! REVERT, HOLD.SHRINK and CONFIRM, each step sent again with the same
//! ids on an error until it gets a business code, as the README tells
//! callers to. The audit ([`audit`]) reads Redis directly once the fault
//! healed, and holds each location to its books: initial = available +
//! held there + the units of the DEDUCTED and CONFIRMED records that name
//! it; its held units are the HELD records'; none below its floor; the
//! SKU's held counter and holds set are its HELD records; and each
//! request's record says what its last answers said (state, qty,
//! allocation). The journal (every stockgate here runs `--journal`) is
//! audited as the checker's conservation audit does a SKU that keeps one
//! number (`checker::audit`, `journal_books`), per location: every entry
//! is format 2 and names one of the SKU's locations, each location's
//! entries run from its initial units, each moving the account by its
//! changes to what it says it left, to exactly the units and held units
//! the location has; and each request's entries at a location add up to
//! what its record keeps there (a DEDUCTED or CONFIRMED record its units
//! out, a HELD one out and held, any other nothing), so an entry written
//! twice or lost is caught.

use crate::harness::*;
use redis::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use stockgate::dev::LocalCluster;
use stockgate::journal::{Entry, Event, FORMAT_AT_LOCATION};
use stockgate::record::{Record, State};

/// Each SKU's locations: (name, units, floor).
/// Enough that the load rarely runs short; w3 small, so that it reaches
/// its floor early and allocations naming it first split.
const PLACES: [(&str, i64, i64); 3] = [("w1", 3000, 20), ("w2", 2000, 40), ("w3", 60, 5)];

/// How long a step may go on getting errors before the test calls it a
/// hang: well past a failover's or a slot move's end.
const SETTLE: Duration = Duration::from_secs(30);

/// Makes each of `skus` one kept by location, directly in Redis: its
/// journal opened as [`seed`] opens it, the stock key `loc`, and its
/// locations hash ([`PLACES`]).
fn seed_located(cluster: &LocalCluster, skus: &[String]) {
    seed(cluster, skus, 0);
    let mut conn = cluster.cluster_connection().expect("cluster connection");
    for sku in skus {
        let stock_key = crate::support::stock_key(sku);
        let mut hash = redis::cmd("HSET");
        hash.arg([stock_key.as_slice(), b":loc"].concat());
        for (name, units, floor) in PLACES {
            hash.arg(name)
                .arg(units)
                .arg(format!("{name}:floor"))
                .arg(floor);
        }
        hash.query::<()>(&mut conn).expect("the locations");
        redis::cmd("SET")
            .arg(&stock_key)
            .arg("loc")
            .query::<()>(&mut conn)
            .expect("a sku kept by location");
    }
}

/// One request of the load, as its answers tell it.
#[derive(Debug, Clone, Default)]
struct Chain {
    sku: String,
    id: String,
    hold: bool,
    /// A hold that may run out within the load (1 to 2.5 s).
    short: bool,
    qty: i64,
    /// The allocation a 0 or 1 named; None when the last answer was 2.
    taken: Option<Vec<(String, i64)>>,
    /// Units a HOLD.SHRINK answered 0 or 1 gave back.
    shrunk: i64,
    confirmed: bool,
    /// REVERT's answer, if one was sent.
    reverted: Option<i64>,
    /// A CONFIRM or HOLD.SHRINK answered 5: the hold ran out first.
    ran_out: bool,
    /// Errors met on the way, each followed by the same request again.
    errors: u32,
}

impl Chain {
    /// What the request keeps from each location: the allocation, less
    /// what a shrink gave back from its last location first.
    fn kept(&self) -> Vec<(String, i64)> {
        let mut kept = self.taken.clone().unwrap_or_default();
        let mut left = self.shrunk;
        for (_, units) in kept.iter_mut().rev() {
            let given = (*units).min(left);
            *units -= given;
            left -= given;
        }
        kept.retain(|(_, units)| *units > 0);
        kept
    }

    /// The record states its answers allow.
    fn states(&self) -> Vec<State> {
        match (self.hold, self.reverted) {
            (_, Some(0)) => vec![State::Reverted],
            // A REVERT of a hold that ran out answers 1 too.
            (true, Some(1)) if self.short && !self.confirmed => {
                vec![State::Reverted, State::Expired]
            }
            (_, Some(_)) => vec![State::Reverted],
            (false, None) => vec![State::Deducted],
            (true, None) if self.confirmed => vec![State::Confirmed],
            (true, None) if self.ran_out => vec![State::Expired],
            (true, None) if self.short => vec![State::Held, State::Expired],
            (true, None) => vec![State::Held],
        }
    }
}

/// A small xorshift generator: a client's choices, replayed from its seed.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The code and, for DEDUCT.AT and HOLD.AT, the allocation of a reply.
fn answer_of(value: &Value) -> (i64, Vec<(String, i64)>) {
    let Value::Array(items) = value else {
        panic!("not a stock reply: {value:?}")
    };
    let Some(Value::Int(code)) = items.first() else {
        panic!("no code: {items:?}")
    };
    let taken = match items.get(6) {
        Some(Value::Array(flat)) => flat
            .chunks(2)
            .map(|pair| match pair {
                [Value::BulkString(name), Value::Int(units)] => {
                    (String::from_utf8_lossy(name).into_owned(), *units)
                }
                other => panic!("not an allocation: {other:?}"),
            })
            .collect(),
        _ => Vec::new(),
    };
    (*code, taken)
}

/// Sends `args` until a business code comes back, the same request each
/// time, 50 ms apart; the answer. Counts the errors in `errors`.
async fn answered(
    conn: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
    errors: &mut u32,
) -> (i64, Vec<(String, i64)>) {
    let by = Instant::now() + SETTLE;
    loop {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        match cmd.query_async::<Value>(conn).await {
            Ok(value) => return answer_of(&value),
            Err(err) => {
                *errors += 1;
                assert!(
                    Instant::now() < by,
                    "{args:?} got no answer in {SETTLE:?}: {err}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The load: `clients` clients, each sending one chain after another on
/// a random sku until stopped.
struct Allocations {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Chain>>>,
}

impl Allocations {
    /// Starts it through the stockgate at `addr`; with `short_holds`,
    /// a third of the holds last 1 to 2.5 s.
    async fn start(
        addr: std::net::SocketAddr,
        name: &str,
        skus: &[String],
        clients: u64,
        short_holds: bool,
    ) -> Allocations {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for client in 0..clients {
            let mut conn = crate::support::client_at(addr, false).await;
            let (stop, skus, name) = (stop.clone(), skus.to_vec(), name.to_owned());
            tasks.push(tokio::spawn(async move {
                let mut dice = Dice(0x10c ^ (client + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let mut chains = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let id = format!("{name}-{client}-{n}");
                    let sku = skus[dice.below(skus.len() as u64) as usize].clone();
                    chains.push(chain(&mut conn, &mut dice, sku, id, short_holds).await);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                chains
            }));
        }
        Allocations { stop, tasks }
    }

    /// Stops it; each client ends the chain it is in. Every chain.
    async fn stop(self) -> Vec<Chain> {
        self.stop.store(true, Ordering::Relaxed);
        let mut chains = Vec::new();
        for task in self.tasks {
            chains.extend(task.await.expect("a client of the load"));
        }
        chains
    }
}

/// One request: DEDUCT.AT or HOLD.AT of 1 to 5 units over a random order
/// of a random subset of the locations, SPLIT or WHOLE; then, if it
/// took, perhaps a REVERT, or for a hold a HOLD.SHRINK, a CONFIRM (perhaps
/// refunded) or a REVERT.
async fn chain(
    conn: &mut redis::aio::MultiplexedConnection,
    dice: &mut Dice,
    sku: String,
    id: String,
    short_holds: bool,
) -> Chain {
    let hold = dice.below(2) == 0;
    let short = hold && short_holds && dice.below(3) == 0;
    let mut chain = Chain {
        sku,
        id,
        hold,
        short,
        qty: 1 + dice.below(5) as i64,
        ..Chain::default()
    };
    let mut names: Vec<&str> = PLACES.iter().map(|p| p.0).collect();
    for i in (1..names.len()).rev() {
        names.swap(i, dice.below(i as u64 + 1) as usize);
    }
    names.truncate(1 + dice.below(3) as usize);
    let qty = chain.qty.to_string();
    let ttl = if short {
        (1000 + dice.below(1500)).to_string()
    } else {
        "600000".to_owned()
    };
    let policy = if dice.below(3) == 0 { "WHOLE" } else { "SPLIT" };
    let (sku, id) = (chain.sku.clone(), chain.id.clone());
    let mut args = vec![if hold { "HOLD.AT" } else { "DEDUCT.AT" }, &sku, &qty, &id];
    if hold {
        args.push(&ttl);
    }
    args.push(policy);
    args.extend(&names);
    let (code, taken) = answered(conn, &args, &mut chain.errors).await;
    match code {
        0 | 1 => chain.taken = Some(taken),
        2 => return chain,
        // A 5: a short hold whose first attempt took it, met an error,
        // and ran out before its retry.
        // (Its record is EXPIRED: it keeps nothing, whatever it took.)
        5 if short => {
            chain.ran_out = true;
            chain.taken = Some(Vec::new());
            return chain;
        }
        other => panic!("{args:?}: code {other}"),
    }
    if hold && chain.qty > 1 && dice.below(4) == 0 {
        let change = format!("k-{id}");
        let shrink = ["HOLD.SHRINK", &sku, &id, &change, "1"];
        match answered(conn, &shrink, &mut chain.errors).await.0 {
            0 | 1 => chain.shrunk = 1,
            5 if short => {
                chain.ran_out = true;
                return chain;
            }
            other => panic!("{shrink:?}: code {other}"),
        }
    }
    if hold && dice.below(2) == 0 {
        let confirm = ["CONFIRM", &sku, &id];
        match answered(conn, &confirm, &mut chain.errors).await.0 {
            0 | 1 => chain.confirmed = true,
            5 if short => {
                chain.ran_out = true;
                return chain;
            }
            other => panic!("{confirm:?}: code {other}"),
        }
    }
    // A DEDUCT given back, a hold cancelled, or a confirmed one refunded.
    if dice.below(4) == 0 {
        let revert = ["REVERT", &sku, &id];
        let code = answered(conn, &revert, &mut chain.errors).await.0;
        assert!(matches!(code, 0 | 1), "{revert:?}: code {code}");
        chain.reverted = Some(code);
    }
    chain
}

/// What one sku's locations hold, read directly.
struct Books {
    /// name -> (available, held, floor)
    places: BTreeMap<String, (i64, i64, i64)>,
    held: i64,
    holds: HashSet<String>,
    /// Its journal, oldest first.
    journal: Vec<Entry>,
}

/// One sku's locations, units held, holds, journal and the records of
/// `ids`, read in one script call: an atomic snapshot, so that a release
/// by the sweeper (a short hold running out) can't fall between the books
/// and the records and entry it changes.
fn snapshot(
    conn: &mut redis::cluster::ClusterConnection,
    sku: &str,
    ids: &[&str],
) -> (Books, Vec<Option<String>>) {
    const READ: &str = "local out = {redis.call('HGETALL', KEYS[1]), redis.call('GET', KEYS[2]) or false, \
        redis.call('ZRANGE', KEYS[3], 0, -1), redis.call('XRANGE', KEYS[4], '-', '+')} \
        for i = 5, #KEYS do out[#out + 1] = redis.call('GET', KEYS[i]) or false end \
        return out";
    let stock_key = crate::support::stock_key(sku);
    let mut read = redis::cmd("EVAL");
    read.arg(READ)
        .arg(4 + ids.len())
        .arg([stock_key.as_slice(), b":loc"].concat())
        .arg([stock_key.as_slice(), b":held"].concat())
        .arg([stock_key.as_slice(), b":holds"].concat())
        .arg([stock_key.as_slice(), b":journal"].concat());
    for id in ids {
        read.arg(crate::support::record_key(sku, id));
    }
    let mut got: Vec<redis::Value> = read.query(conn).expect("the snapshot");
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    let records = got.split_off(4).iter().map(text).collect();
    let journal = stockgate::journal::stream::entries(got.pop().expect("the journal"))
        .expect("every entry of the journal reads");
    let list = |v: &redis::Value| match v {
        redis::Value::Array(items) => items.iter().filter_map(text).collect::<Vec<String>>(),
        _ => Vec::new(),
    };
    let flat = list(&got[0]);
    let hash: HashMap<String, i64> = flat
        .chunks(2)
        .map(|pair| (pair[0].clone(), pair[1].parse().unwrap_or(0)))
        .collect();
    let field = |f: &str| hash.get(f).copied().unwrap_or(0);
    let places = PLACES
        .iter()
        .map(|(name, _, _)| {
            let fields = (
                field(name),
                field(&format!("{name}:held")),
                field(&format!("{name}:floor")),
            );
            ((*name).to_owned(), fields)
        })
        .collect();
    let books = Books {
        places,
        held: text(&got[1]).and_then(|h| h.parse().ok()).unwrap_or(0),
        holds: list(&got[2]).into_iter().collect(),
        journal,
    };
    (books, records)
}

/// The audit: each sku's locations against its records, and each record
/// against its chain's answers (module docs). Returns the violations.
fn audit(cluster: &LocalCluster, skus: &[String], chains: &[Chain]) -> Vec<String> {
    wait_stable(cluster);
    let mut conn = cluster.cluster_connection().expect("cluster connection");
    let mut violations = Vec::new();
    for sku in skus {
        let mine: Vec<&Chain> = chains.iter().filter(|c| &c.sku == sku).collect();
        let ids: Vec<&str> = mine.iter().map(|c| c.id.as_str()).collect();
        let (books, records) = snapshot(&mut conn, sku, &ids);
        // name -> units the records keep out for good, and on hold
        let (mut taken, mut on_hold) = (HashMap::<String, i64>::new(), HashMap::new());
        let (mut held_qty, mut held_ids) = (0, HashSet::new());
        // (request, location) -> the (stock, held) change its record keeps
        let mut kept: HashMap<(String, String), (i64, i64)> = HashMap::new();
        for (chain, raw) in mine.into_iter().zip(records) {
            let Some(raw) = raw else {
                if chain.taken.is_some() && !chain.ran_out {
                    violations.push(format!("{sku} {}: no record for {chain:?}", chain.id));
                }
                continue;
            };
            let Some(record) = Record::parse(&raw) else {
                violations.push(format!(
                    "{sku} {}: a record of no known shape: {raw}",
                    chain.id
                ));
                continue;
            };
            let allocation: Vec<(String, i64)> = record
                .allocation
                .as_deref()
                .unwrap_or_default()
                .split(',')
                .filter(|part| !part.is_empty())
                .filter_map(|part| {
                    let (name, units) = part.split_once('=')?;
                    Some((name.to_owned(), units.parse().ok()?))
                })
                .collect();
            if chain.taken.is_none() {
                violations.push(format!(
                    "{sku} {}: answered 2, yet a record {raw}",
                    chain.id
                ));
            } else if !chain.states().contains(&record.state)
                || (!chain.ran_out && allocation != chain.kept())
            {
                violations.push(format!(
                    "{sku} {}: the record {raw} disagrees with {chain:?}",
                    chain.id
                ));
            }
            let (into, held) = match record.state {
                State::Deducted | State::Confirmed => (&mut taken, false),
                State::Held => {
                    held_qty += record.qty as i64;
                    held_ids.insert(chain.id.clone());
                    (&mut on_hold, true)
                }
                _ => continue,
            };
            for (name, units) in allocation {
                *into.entry(name.clone()).or_default() += units;
                kept.insert(
                    (chain.id.clone(), name),
                    (-units, if held { units } else { 0 }),
                );
            }
        }
        for (name, initial, floor) in PLACES {
            let (available, held, kept_floor) = books.places[name];
            let (out, holding) = (
                taken.get(name).copied().unwrap_or(0),
                on_hold.get(name).copied().unwrap_or(0),
            );
            if available + held + out != initial {
                violations.push(format!(
                    "{sku} {name}: {available} available + {held} held + {out} taken for good is not the {initial} it started with"
                ));
            }
            if held != holding {
                violations.push(format!(
                    "{sku} {name}: {held} held, its HELD records name {holding}"
                ));
            }
            if available < floor || kept_floor != floor {
                violations.push(format!(
                    "{sku} {name}: {available} available, floor {kept_floor} (set {floor})"
                ));
            }
        }
        if books.held != held_qty || books.holds != held_ids {
            violations.push(format!(
                "{sku}: {} held in {} holds, its HELD records are {held_qty} units in {held_ids:?}",
                books.held,
                books.holds.len()
            ));
        }
        violations.extend(journal_books(sku, &books, &kept));
    }
    violations
}

/// The journal's side of one sku's books (module docs): each location's
/// account from its initial units through every entry of it to what the
/// location has, and each request's entries at each location adding up
/// to what its record keeps there (`kept`; absent: nothing).
fn journal_books(
    sku: &str,
    books: &Books,
    kept: &HashMap<(String, String), (i64, i64)>,
) -> Vec<String> {
    let mut violations = Vec::new();
    let mut accounts: HashMap<&str, (i64, i64)> = PLACES
        .iter()
        .map(|(name, initial, _)| (*name, (*initial, 0)))
        .collect();
    let mut moved: HashMap<(String, String), (i64, i64)> = HashMap::new();
    for entry in &books.journal {
        let Some(account) = accounts.get_mut(entry.location.as_str()) else {
            violations.push(format!(
                "{sku}: journal entry {} names no location of the sku: {entry:?}",
                entry.stream_id()
            ));
            continue;
        };
        if entry.format != FORMAT_AT_LOCATION || entry.event == Event::Set {
            violations.push(format!(
                "{sku}: journal entry {} is not an allocation's: {entry:?}",
                entry.stream_id()
            ));
        }
        let after = (
            account.0 + entry.stock_change,
            account.1 + entry.held_change,
        );
        if after != (entry.stock, entry.held) {
            violations.push(format!(
                "{sku} {}: journal entry {} ({:?} {}) says stock {} held {}, the account before it moves to {after:?}",
                entry.location,
                entry.stream_id(),
                entry.event,
                entry.id,
                entry.stock,
                entry.held
            ));
        }
        *account = (entry.stock, entry.held);
        let net = moved
            .entry((entry.id.clone(), entry.location.clone()))
            .or_default();
        net.0 += entry.stock_change;
        net.1 += entry.held_change;
    }
    for (name, _, _) in PLACES {
        let (available, held, _) = books.places[name];
        if accounts[name] != (available, held) {
            violations.push(format!(
                "{sku} {name}: the journal's account ends at {:?}, the location has {available} available and {held} held",
                accounts[name]
            ));
        }
    }
    let requests: BTreeSet<&(String, String)> = moved.keys().chain(kept.keys()).collect();
    for key in requests {
        let (id, location) = key;
        let journaled = moved.get(key).copied().unwrap_or_default();
        let recorded = kept.get(key).copied().unwrap_or_default();
        if journaled != recorded {
            violations.push(format!(
                "{sku} {id} at {location}: its journal entries move stock and held by {journaled:?}, its record keeps {recorded:?}"
            ));
        }
    }
    violations
}

/// What a load came to, for the report: requests by their last
/// allocation answer, errors met, allocations split.
fn summary(chains: &[Chain]) -> String {
    let took = chains.iter().filter(|c| c.taken.is_some()).count();
    let split = chains
        .iter()
        .filter(|c| c.taken.as_ref().is_some_and(|t| t.len() > 1))
        .count();
    let errors: u32 = chains.iter().map(|c| c.errors).sum();
    let erred = chains.iter().filter(|c| c.errors > 0).count();
    format!(
        "{} requests, {took} allocated ({split} split over locations), {errors} errors on {erred} of them, each sent again until answered",
        chains.len()
    )
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_primary_killed_mid_allocation_keeps_each_location_exact }
/// A primary killed while 8 clients allocate SKUs kept by location on it,
/// through a stockgate with `--wait-replicas 1` (so no acknowledged
/// change may be lost, and the audit is strict): once its replica took
/// over and it rejoined, every location of every SKU adds up, and every
/// record agrees with the answers its request got, and the journal with
/// both.
async fn a_primary_killed_mid_allocation_keeps_each_location_exact(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = &format!("loc-kill-{kind}");
    let mut cluster = cluster_of(kind, 1000, &[]);
    let victim = 0;
    let skus = skus_where(&cluster, name, 3, |o| o == victim);
    seed_located(&cluster, &skus);
    let server = stockgate_with(cluster.seeds(), TIMEOUT, Some(WAIT_ONE)).await;
    let load = Allocations::start(server.addr, name, &skus, 8, false).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let replica = replica_of(&cluster, victim);
    let killed = Instant::now();
    cluster.nodes[victim].kill();
    let promoted = wait_promoted(&cluster.nodes[replica], Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Writes on the shard wait for a replica again from here.
    let rejoined = rejoin(&mut cluster, victim, replica);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let chains = load.stop().await;
    eprintln!(
        "[{name}] promoted {} after the kill, rejoined {} later; {}",
        ms(promoted - killed),
        ms(rejoined - promoted),
        summary(&chains)
    );
    let violations = audit(&cluster, &skus, &chains);
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(
        chains.iter().any(|c| c.errors > 0),
        "the kill met no request: nothing was tested"
    );
    server.stop_now();

    // The audit holds each location to its own books: a unit moved from
    // one location to another, the SKU's total unchanged, is caught by
    // the records and by the journal, at both.
    plant_a_moved_unit(&cluster, &skus[0], 1);
    let planted = audit(&cluster, &skus, &chains);
    assert_eq!(planted.len(), 4, "{planted:#?}");
    assert_eq!(
        planted
            .iter()
            .filter(|v| v.contains("the journal's account ends"))
            .count(),
        2,
        "{planted:#?}"
    );
    // And a journal entry written twice: its location's account breaks
    // there, and its request's entries no longer add up to its record.
    plant_a_moved_unit(&cluster, &skus[0], -1);
    plant_an_entry_again(&cluster, &skus[0]);
    let planted = audit(&cluster, &skus, &chains);
    assert_eq!(planted.len(), 2, "{planted:#?}");
    assert!(
        planted
            .iter()
            .any(|v| v.contains("its journal entries move")),
        "{planted:#?}"
    );
}

/// Moves `units` of `sku` from w1 to w2 behind stockgate's back.
fn plant_a_moved_unit(cluster: &LocalCluster, sku: &str, units: i64) {
    let mut conn = cluster.cluster_connection().expect("cluster connection");
    let loc_key = [crate::support::stock_key(sku).as_slice(), b":loc"].concat();
    for (name, by) in [("w1", -units), ("w2", units)] {
        redis::cmd("HINCRBY")
            .arg(&loc_key)
            .arg(name)
            .arg(by)
            .query::<i64>(&mut conn)
            .expect("HINCRBY");
    }
}

/// Appends the last entry of `sku`'s journal to it again, as a change
/// journaled twice would.
fn plant_an_entry_again(cluster: &LocalCluster, sku: &str) {
    let mut conn = cluster.cluster_connection().expect("cluster connection");
    let journal = [crate::support::stock_key(sku).as_slice(), b":journal"].concat();
    let last: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
        .arg(&journal)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query(&mut conn)
        .expect("the journal's last entry");
    let (_, fields) = last.first().expect("a journal with entries");
    let mut again = redis::cmd("XADD");
    again.arg(&journal).arg("*");
    for (field, value) in fields {
        again.arg(field).arg(value);
    }
    again.query::<String>(&mut conn).expect("XADD");
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_located_sku_s_slot_moving_mid_allocation_keeps_each_location_exact }
/// A SKU kept by location whose own slot moves to another primary, a few
/// keys at a time, while 8 clients allocate it (holds of a second or two
/// among them, running out meanwhile): its calls meet ASK and TRYAGAIN,
/// and each location adds up once the move ended. Then the slot moves
/// back with every key but an expired hold's record first, and a CONFIRM
/// of another hold runs meanwhile on the node that has the SKU's keys
/// (which gives the SKU's expired holds back first, reading their
/// records, the one key no call declares): the expired hold must stay
/// filed until its record arrives, then go back to its locations once.
async fn a_located_sku_s_slot_moving_mid_allocation_keeps_each_location_exact(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = &format!("loc-move-{kind}");
    let cluster = cluster_of(kind, 2000, &[]);
    let (source, target) = (0, 1);
    let skus = skus_where(&cluster, name, 1, |o| o == source);
    let sku = skus[0].clone();
    let slot = sku_slot(&sku);
    seed_located(&cluster, &skus);
    let server = stockgate(cluster.seeds(), TIMEOUT).await;
    let load = Allocations::start(server.addr, name, &skus, 8, true).await;
    tokio::time::sleep(Duration::from_millis(400)).await;

    let redirects = || {
        [source, target]
            .iter()
            .map(|&n| {
                error_stat(&cluster.nodes[n], "ASK") + error_stat(&cluster.nodes[n], "TRYAGAIN")
            })
            .sum::<u64>()
    };
    let redirects_before = redirects();
    let (took, keys) = migrate_slot(
        &cluster,
        slot,
        source,
        target,
        20,
        Duration::from_millis(20),
        Duration::ZERO,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut chains = load.stop().await;
    let met = redirects() - redirects_before;
    eprintln!(
        "[{name}] slot {slot}: {keys} keys moved in {}, {met} ASK and TRYAGAIN answered meanwhile; {}",
        ms(took),
        summary(&chains)
    );
    assert_eq!(owner(&cluster, slot), target, "slot {slot} moved");
    assert!(met > 0, "the load never met the move");
    let violations = audit(&cluster, &skus, &chains);
    assert!(violations.is_empty(), "{violations:#?}");

    // Back, an expired hold's record last.
    let mut conn = crate::support::client(&server, false).await;
    let mut errors = 0;
    let hold = |id: &'static str, qty: &'static str, ttl: &'static str| {
        let (sku, mut conn) = (sku.clone(), conn.clone());
        async move {
            let args = ["HOLD.AT", &sku, qty, id, ttl, "SPLIT", "w3", "w1"];
            let (code, taken) = answered(&mut conn, &args, &mut 0).await;
            assert_eq!(code, 0, "{args:?}");
            taken
        }
    };
    let short_taken = hold("back-short", "3", "1000").await;
    let long_taken = hold("back-long", "2", "600000").await;
    let (mut old, mut new) = begin_migration(&cluster, slot, target, source);
    let stock_key = crate::support::stock_key(&sku);
    let short_record = crate::support::record_key(&sku, "back-short");
    let all: Vec<Vec<u8>> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1_000_000)
        .query(&mut old)
        .expect("GETKEYSINSLOT");
    let first: Vec<Vec<u8>> = all.into_iter().filter(|k| *k != short_record).collect();
    for batch in first.chunks(500) {
        redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(cluster.nodes[source].port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(batch)
            .query::<()>(&mut old)
            .expect("MIGRATE");
    }
    // Until the short hold is due by Redis's clock.
    let (due,): (f64,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("ZSCORE")
        .arg([stock_key.as_slice(), b":holds"].concat())
        .arg("back-short")
        .query(&mut new)
        .expect("the short hold's expiry, where the holds set moved");
    loop {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut old).expect("TIME");
        if (secs * 1000 + micros / 1000) as f64 > due {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let confirm = ["CONFIRM", &sku, "back-long"];
    let confirmed = tokio::time::timeout(
        Duration::from_secs(10),
        answered(&mut conn, &confirm, &mut errors),
    )
    .await
    .expect("the CONFIRM answered while the record was away");
    assert_eq!(confirmed.0, 0, "back-long confirmed");
    let short_state: String = redis::cmd("GET")
        .arg(&short_record)
        .query(&mut old)
        .expect("the short hold's record, not moved yet");
    migrate_slot(
        &cluster,
        slot,
        target,
        source,
        500,
        Duration::ZERO,
        Duration::ZERO,
    );
    assert_eq!(owner(&cluster, slot), source, "slot {slot} moved back");
    // A read gives back what ran out, as every call on the SKU does.
    redis::cmd("STOCK.GET")
        .arg(&sku)
        .query_async::<Value>(&mut conn)
        .await
        .expect("STOCK.GET");
    eprintln!(
        "[{name}] moved back with back-short's record last ({short_state} while away); CONFIRM back-long answered {confirmed:?} after {errors} errors"
    );
    let mut check = cluster.cluster_connection().expect("cluster connection");
    let record: String = redis::cmd("GET")
        .arg(&short_record)
        .query(&mut check)
        .expect("back-short's record");
    let record = Record::parse(&record).expect("a record");
    assert_eq!(
        record.state,
        State::Expired,
        "back-short ran out: {record:?}"
    );
    for (id, taken, short, confirmed) in [
        ("back-short", short_taken, true, false),
        ("back-long", long_taken, false, true),
    ] {
        chains.push(Chain {
            sku: sku.clone(),
            id: id.to_owned(),
            hold: true,
            short,
            qty: taken.iter().map(|t| t.1).sum(),
            taken: Some(taken),
            confirmed,
            ..Chain::default()
        });
    }
    let violations = audit(&cluster, &skus, &chains);
    assert!(violations.is_empty(), "{violations:#?}");
    server.stop_now();
}
