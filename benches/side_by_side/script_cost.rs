//! The `script-cost` mode: what each script call costs Redis itself, in
//! instructions counted by callgrind on `redis-server`, by EVALSHA and by
//! FCALL of stockgate's function library, before the scripts were
//! reshaped for FCALL and now, beside the design note's bare script.
//!
//! ```sh
//! cargo bench --bench side_by_side -- script-cost
//! STOCKGATE_SCRIPT_COST_SERVERS=redis-7.0 cargo bench --bench side_by_side -- script-cost
//! ```
//!
//! For each server (Redis 7.0, Debian's, and Redis 8.2, from
//! `deploy/install-servers.sh`; `STOCKGATE_SCRIPT_COST_SERVERS` names
//! fewer, comma-separated) a standalone `redis-server` runs under
//! `valgrind --tool=callgrind`. Two sets of scripts are loaded into it,
//! each with SCRIPT LOAD and as a function library: the ones stockgate
//! embeds now, and the ones before (`before/`: 270f2e5's, called with
//! their own keys and arguments). For each row the counters are zeroed,
//! the calls run (pipelined 16 at a time, with the arguments stockgate
//! sends with its defaults, each a fresh request_id), and the dump's total
//! is divided by the calls (or, coalesced, by the deductions). The rows
//! always run in the same order on a fresh server, so each meets the same
//! keyspace. The order rows make each call of a 3-line ORDER, and of an
//! ORDER.HOLD then its ORDER.CONFIRM, as stockgate's saga makes them (the
//! intent's keys and arguments, each line's call of the line id), step by
//! step over all the orders, and sum an order's steps; their baselines
//! are the DEDUCT, HOLD and CONFIRM rows.
//!
//! The server's timer (`serverCron`) is left out of every figure: it runs
//! ten times a second of wall time whatever the load, and under callgrind,
//! which runs Redis about fifty times slower, it would add to each call
//! what it never costs one at full speed (about 1k instructions on 7.0 and
//! 9.5k on 8.2, whose timer reads the allocator's statistics). stderr
//! shows each row's figure with and without it. (The Valkey 9.1 build is
//! libc malloc's: not measured.)

use crate::instructions::{callgrind, control};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stockgate::dev::ServerKind;
use stockgate::script::{Calling, Library, Scripts, body_of};

/// Both ways of calling, in the order the columns show them.
const CALLINGS: [Calling; 2] = [Calling::Eval, Calling::Function];

/// The servers measured: Redis 7.0 and 8.2, or those named in
/// `STOCKGATE_SCRIPT_COST_SERVERS` (`redis-7.0,redis-8.2`).
fn servers() -> Vec<ServerKind> {
    let all = [ServerKind::Redis7, ServerKind::Redis8];
    match std::env::var("STOCKGATE_SCRIPT_COST_SERVERS") {
        Ok(names) if !names.trim().is_empty() => names
            .split(',')
            .map(|name| {
                *all.iter()
                    .find(|kind| kind.to_string() == name.trim())
                    .unwrap_or_else(|| {
                        panic!("{name}: script-cost measures redis-7.0 or redis-8.2")
                    })
            })
            .collect(),
        _ => all.to_vec(),
    }
}

/// Script arguments as stockgate sends them (its defaults).
const WINDOW: &str = "86400000";
const MAX_QTY: &str = "1000000";
const MAX_HOLD: &str = "3600000";
/// How long after its command an order counts as left behind, as its
/// filing among the orders in flight rides along with an intent call
/// (`lua/order.lua`, ARGV[10]; its value costs a call nothing).
const FILED_AFTER: &str = "20000";
/// An ORDER.HOLD's ttl, and how long its line holds last: the ttl and
/// `stock::order::LINE_MARGIN_MS`.
const ORDER_HOLD_TTL: &str = "600000";
const ORDER_LINE_TTL: &str = "602000";
/// Calls per row (a quarter more run first, unmeasured), and members of
/// the coalesced rows.
const CALLS: usize = 3000;
const HOLDS: usize = 1500;
const ORDERS: usize = 400;
const COALESCED: [(usize, usize); 3] = [(8, 300), (32, 100), (64, 50)];

/// The design note's script: the record, then the stock, read; DECRBY;
/// the record written with its TTL. Nothing else.
const BARE: &str = "local stock_key, record_key = KEYS[1], KEYS[2]
local qty = tonumber(ARGV[1])
if not qty or qty <= 0 then return {3, -1, ''} end
local done = redis.call('GET', record_key)
if done then return {1, tonumber(redis.call('GET', stock_key)), done} end
local stock = tonumber(redis.call('GET', stock_key))
if not stock or stock < qty then return {2, stock or -1, ''} end
local remain = redis.call('DECRBY', stock_key, qty)
redis.call('SET', record_key, ARGV[2], 'PX', ARGV[3])
return {0, remain, ARGV[2]}
";

/// Which scripts a row calls: those before the reshaping or those now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Era {
    Before,
    Now,
}

impl Era {
    fn name(self) -> &'static str {
        match self {
            Era::Before => "before",
            Era::Now => "now",
        }
    }
}

/// One era's scripts as loaded: each one's SHA and function, by name.
struct Set {
    era: Era,
    scripts: Vec<(&'static str, String, String)>,
}

impl Set {
    fn named(&self, name: &str, calling: Calling) -> (&'static str, &str) {
        let (_, sha, function) = self
            .scripts
            .iter()
            .find(|(n, ..)| *n == name)
            .unwrap_or_else(|| panic!("no {name} script"));
        match calling {
            Calling::Function => ("FCALL", function),
            Calling::Eval => ("EVALSHA", sha),
        }
    }

    /// A call of `name` with `keys` and `args`.
    fn call(&self, name: &str, calling: Calling, keys: &[String], args: &[String]) -> redis::Cmd {
        let (verb, named) = self.named(name, calling);
        let mut cmd = redis::cmd(verb);
        cmd.arg(named).arg(keys.len()).arg(keys).arg(args);
        cmd
    }

    /// The keys and arguments of a call on one request: `caller`'s, then
    /// the `settings` (and the replicate and `journal` flags), then the
    /// nonce, in this era's shape.
    #[allow(clippy::too_many_arguments)] // the call's parts, as they come
    fn request(
        &self,
        name: &str,
        calling: Calling,
        [stock, record]: [&str; 2],
        caller: &[&str],
        settings: &[&str],
        journal: bool,
        nonce: &str,
    ) -> redis::Cmd {
        let journal = if journal { "1" } else { "0" };
        let mut args: Vec<String> = caller.iter().map(|a| a.to_string()).collect();
        match self.era {
            Era::Before => {
                let keys = [
                    stock.to_owned(),
                    record.to_owned(),
                    format!("{stock}:holds"),
                    format!("{stock}:held"),
                ];
                args.extend(settings.iter().map(|s| s.to_string()));
                args.extend([nonce.to_owned(), "0".to_owned(), journal.to_owned()]);
                self.call(name, calling, &keys, &args)
            }
            Era::Now => {
                let mut keys = vec![
                    stock.to_owned(),
                    record.to_owned(),
                    format!("{stock}:holds"),
                    format!("{stock}:held"),
                    format!("{stock}:journal:on"),
                    format!("{stock}:journal"),
                ];
                // REVERT and CONFIRM serve a SKU of either kind, and declare
                // its locations hash (stock::single::Keys::Located).
                if matches!(name, "revert" | "confirm") {
                    keys.push(format!("{stock}:loc"));
                }
                args.push(format!("{} 0{journal}", settings.join(" ")));
                args.push(nonce.to_owned());
                self.call(name, calling, &keys, &args)
            }
        }
    }
}

struct Server {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(kind: ServerKind) -> Server {
    let dir = tempfile::tempdir().expect("a temp dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut command = callgrind(dir.path(), "redis");
    command.push(kind.binary().display().to_string());
    command.extend(
        [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
        ]
        .map(str::to_owned),
    );
    command.push(dir.path().display().to_string());
    let child = Command::new(&command[0])
        .args(&command[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {} under valgrind ({e}): apt-get install valgrind redis-server; deploy/install-servers.sh for Redis 8.2",
                kind.binary().display()
            )
        });
    Server { child, port, dir }
}

fn connect(port: u16) -> redis::Connection {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let attempt = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .and_then(|c| c.get_connection())
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c).map(|_| c));
        match attempt {
            Ok(conn) => return conn,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => panic!("redis-server under valgrind never answered: {e}"),
        }
    }
}

/// The scripts of `era`, loaded both ways: SCRIPT LOAD of each body, and
/// one function library.
fn load(conn: &mut redis::Connection, era: Era) -> Set {
    let names = [
        "deduct",
        "deduct_many",
        "hold",
        "confirm",
        "revert",
        "order",
    ];
    let mut scripts = Vec::new();
    let library = match era {
        Era::Now => {
            let all = Scripts::new();
            let library = Library::of(&all.all()).expect("stockgate has scripts");
            for script in all.all() {
                // An allocation (DEDUCT.AT) has no script before.
                if names.contains(&script.name) || script.name == "allocate" {
                    scripts.push((script.name, script.body.clone(), script.function.clone()));
                }
            }
            library.code
        }
        Era::Before => {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/side_by_side/before");
            let read = |name: &str| {
                std::fs::read_to_string(dir.join(format!("{name}.lua")))
                    .unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
            };
            let common = read("common");
            // As the library was written then: the helpers at its top,
            // each script's code as a function's body.
            let mut code = format!("#!lua name=stockgate_before\n{common}");
            for name in names {
                let source = read(name);
                let own = source.split_once("--@common\n").expect("--@common").1;
                let flags = if name == "order" {
                    "'allow-cross-slot-keys'"
                } else {
                    ""
                };
                let function = format!("stockgate_before_{name}");
                let _ = write!(
                    code,
                    "\nlocal function script_{name}(KEYS, ARGV)\n{own}\nend\n\
                     redis.register_function{{function_name='{function}', callback=script_{name}, flags={{{flags}}}}}\n"
                );
                scripts.push((name, body_of(&common, &source), function));
            }
            code
        }
    };
    let scripts = scripts
        .into_iter()
        .map(|(name, body, function)| {
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(&body)
                .query(conn)
                .unwrap_or_else(|e| panic!("{} {name} loads: {e}", era.name()));
            (name, sha, function)
        })
        .collect();
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&library)
        .query::<String>(conn)
        .unwrap_or_else(|e| panic!("the {} library loads: {e}", era.name()));
    Set { era, scripts }
}

/// The inclusive cost of every call of `function` in a callgrind dump.
fn inclusive_calls_of(dump: &str, function: &str) -> u64 {
    let mut ids = std::collections::HashSet::new();
    for line in dump.lines() {
        let Some(rest) = line
            .strip_prefix("fn=")
            .or_else(|| line.strip_prefix("cfn="))
        else {
            continue;
        };
        if let Some((id, name)) = rest.split_once(' ')
            && name.trim() == function
        {
            ids.insert(id.to_owned());
        }
    }
    let mut total = 0;
    let mut callee = None;
    let mut lines = dump.lines();
    while let Some(line) = lines.next() {
        if let Some(rest) = line.strip_prefix("cfn=") {
            callee = Some(rest.split(' ').next().unwrap_or("").to_owned());
        } else if line.starts_with("calls=") && callee.as_ref().is_some_and(|c| ids.contains(c)) {
            total += lines
                .next()
                .and_then(|cost| cost.split_whitespace().nth(1))
                .and_then(|cost| cost.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    total
}

/// The instructions counted since the last zeroing, from a fresh dump:
/// with and without the server's timer.
fn counted(dir: &Path, pid: u32) -> (u64, u64) {
    let dumps = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("redis.callgrind"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = dumps(dir);
    control(&["--dump"], pid);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(new) = dumps(dir).iter().find(|p| !before.contains(p))
            && let Ok(text) = std::fs::read_to_string(new)
            && let Some(total) = text
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("totals:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        {
            return (total, total - inclusive_calls_of(&text, "serverCron"));
        }
        assert!(Instant::now() < deadline, "no callgrind dump appeared");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One measured server: its connection and where its dumps go.
struct Meter {
    conn: redis::Connection,
    pid: u32,
    dir: PathBuf,
    version: String,
}

impl Meter {
    /// Runs `calls` (the first quarter unmeasured), pipelined 16 at a
    /// time, each answering without an error; returns the instructions
    /// per `each` (a call, or a deduction) and the replies measured.
    fn run(
        &mut self,
        label: &str,
        calls: Vec<redis::Cmd>,
        each: usize,
    ) -> (f64, Vec<redis::Value>) {
        let warm = calls.len() / 5;
        self.send(&calls[..warm]);
        control(&["--zero"], self.pid);
        let replies = self.send(&calls[warm..]);
        let (with_timer, total) = counted(&self.dir, self.pid);
        let n = ((calls.len() - warm) * each) as f64;
        eprintln!(
            "script-cost: redis {} {label}: {:.0} instructions ({:.0} with the timer)",
            self.version,
            total as f64 / n,
            with_timer as f64 / n
        );
        (total as f64 / n, replies)
    }

    fn send(&mut self, calls: &[redis::Cmd]) -> Vec<redis::Value> {
        let mut replies = Vec::with_capacity(calls.len());
        for chunk in calls.chunks(16) {
            let mut pipe = redis::pipe();
            for cmd in chunk {
                pipe.add_command(cmd.clone());
            }
            let got: Vec<redis::Value> = pipe.query(&mut self.conn).expect("the calls run");
            for reply in got {
                if let redis::Value::ServerError(err) = &reply {
                    panic!("a call answered an error: {err:?}");
                }
                replies.push(reply);
            }
        }
        replies
    }

    fn set(&mut self, key: &str, value: impl redis::ToRedisArgs) {
        redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query::<()>(&mut self.conn)
            .expect("SET");
    }
}

/// Runs intent calls that file their order (a begin, a confirm) as
/// [`Meter::run`] does, each answering `phase`: their cost, and the score
/// each order was filed at, for the call that takes it out. The
/// unmeasured first calls are sent again for theirs (the intent as it
/// is, filed again).
fn filed_run(m: &mut Meter, label: &str, calls: Vec<redis::Cmd>, phase: &str) -> (f64, Vec<i64>) {
    let warm = calls.len() / 5;
    let (cost, measured) = m.run(label, calls.clone(), 1);
    let warmed = m.send(&calls[..warm]);
    let scores = warmed
        .iter()
        .chain(&measured)
        .map(|reply| {
            assert_eq!(
                item(reply, 1),
                &redis::Value::BulkString(phase.as_bytes().to_vec()),
                "{label}: the order is {phase}"
            );
            match item(reply, 9) {
                redis::Value::Int(score) => *score,
                other => panic!("{label}: the filing's score, not {other:?}"),
            }
        })
        .collect();
    (cost, scores)
}

/// Item `i` of an array reply.
fn item(reply: &redis::Value, i: usize) -> &redis::Value {
    match reply {
        redis::Value::Array(items) => items
            .get(i)
            .unwrap_or_else(|| panic!("a reply of {} items, no item {i}", items.len())),
        other => panic!("an array reply, not {other:?}"),
    }
}

/// Every reply of a line's call answered 0.
fn assert_codes_0(what: &str, replies: &[redis::Value]) {
    for reply in replies {
        assert_eq!(item(reply, 0), &redis::Value::Int(0), "{what} answered 0");
    }
}

/// Every advance moved its order to `phase` and took it out of the orders
/// in flight.
fn assert_rests(phase: &str, replies: &[redis::Value]) {
    for reply in replies {
        assert_eq!(
            item(reply, 1),
            &redis::Value::BulkString(phase.as_bytes().to_vec()),
            "the order is {phase}"
        );
        assert_eq!(item(reply, 9), &redis::Value::Int(1), "taken out");
    }
}

/// A table's cell: instructions, or nothing.
fn cell(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
}

pub fn run() {
    let mut out = String::new();
    for kind in servers() {
        measure(kind, &mut out);
    }
    println!("{out}");
}

/// Every row on one server of `kind`, appended to `out`.
fn measure(kind: ServerKind, out: &mut String) {
    let server = start(kind);
    let mut conn = connect(server.port);
    let version: String = redis::cmd("INFO")
        .arg("server")
        .query::<String>(&mut conn)
        .expect("INFO")
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let sets = [load(&mut conn, Era::Before), load(&mut conn, Era::Now)];
    let bare_sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(BARE)
        .query(&mut conn)
        .expect("the bare script loads");
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(format!(
            "#!lua name=bare\nredis.register_function('bare', function(KEYS, ARGV)\n{BARE}\nend)\n"
        ))
        .query::<String>(&mut conn)
        .expect("the bare function loads");
    let mut m = Meter {
        conn,
        pid: server.child.id(),
        dir: server.dir.path().to_path_buf(),
        version: version.clone(),
    };
    // Stock enough for every row; a journal where the rows want one.
    for sku in [
        "hot", "jhot", "hold-a", "hold-b", "hold-c", "hold-d", "line-a", "line-b", "line-c",
        "hline-a", "hline-b", "hline-c",
    ] {
        m.set(&format!("stock:{{{sku}}}"), 1_000_000_000_000u64);
    }
    redis::cmd("XADD")
        .arg("stock:{jhot}:journal")
        .arg("MAXLEN")
        .arg("0")
        .arg("*")
        .arg("v")
        .arg("1")
        .query::<String>(&mut m.conn)
        .expect("make the journal");
    // Its marker, as lua/journal_open.lua makes it (the scripts before
    // never read it).
    m.set("stock:{jhot}:journal:on", "1");
    let mut fresh = 0u64;
    let mut id = move || {
        fresh += 1;
        fresh
    };

    // The bare script.
    let mut bare = [None; 2];
    for (c, calling) in CALLINGS.iter().enumerate() {
        let calls = (0..CALLS + CALLS / 4)
            .map(|_| {
                let record = format!("stock:{{hot}}:req:b{}", id());
                let mut cmd = match calling {
                    Calling::Function => redis::cmd("FCALL").arg("bare").to_owned(),
                    Calling::Eval => redis::cmd("EVALSHA").arg(&bare_sha).to_owned(),
                };
                cmd.arg(2)
                    .arg("stock:{hot}")
                    .arg(record)
                    .arg(&["1", "ORD-1", WINDOW][..]);
                cmd
            })
            .collect();
        bare[c] = Some(
            m.run(&format!("bare script by {}", calling.verb()), calls, 1)
                .0,
        );
    }

    // [era][calling]: DEDUCT, and with its journal.
    let mut deduct = [[0.0; 2]; 2];
    let mut deduct_journal = [[0.0; 2]; 2];
    let deducts = |set: &Set,
                   calling: Calling,
                   sku: &str,
                   journal: bool,
                   n: usize,
                   id: &mut dyn FnMut() -> u64|
     -> Vec<redis::Cmd> {
        (0..n)
            .map(|_| {
                let i = id();
                let stock = format!("stock:{{{sku}}}");
                let record = format!("{stock}:req:d{i}");
                set.request(
                    "deduct",
                    calling,
                    [&stock, &record],
                    &["1", "ORD-1"],
                    &[WINDOW, MAX_QTY, "error"],
                    journal,
                    &format!("{i:x}"),
                )
            })
            .collect()
    };
    for (e, set) in sets.iter().enumerate() {
        for (c, calling) in CALLINGS.iter().copied().enumerate() {
            let label = format!("DEDUCT {} by {}", set.era.name(), calling.verb());
            deduct[e][c] = m
                .run(
                    &label,
                    deducts(set, calling, "hot", false, CALLS + CALLS / 4, &mut id),
                    1,
                )
                .0;
            deduct_journal[e][c] = m
                .run(
                    &format!("{label}, journal on"),
                    deducts(set, calling, "jhot", true, CALLS + CALLS / 4, &mut id),
                    1,
                )
                .0;
        }
    }

    // DEDUCT.AT now, by each calling, over 2 and 3 locations: a SKU kept
    // by location whose locations all have stock, named all (SPLIT), the
    // first giving the unit.
    let mut allocation = [[0.0; 2]; 2];
    for (l, locations) in [2usize, 3].into_iter().enumerate() {
        let sku = format!("loc{locations}");
        let stock = format!("stock:{{{sku}}}");
        m.set(&stock, "loc");
        for w in 1..=locations {
            redis::cmd("HSET")
                .arg(format!("{stock}:loc"))
                .arg(format!("w{w}"))
                .arg(1_000_000_000_000u64)
                .query::<()>(&mut m.conn)
                .expect("HSET a location");
        }
        for (c, calling) in CALLINGS.iter().copied().enumerate() {
            let calls = (0..CALLS + CALLS / 4)
                .map(|_| {
                    let i = id();
                    let keys: Vec<String> = vec![
                        stock.clone(),
                        format!("{stock}:req:a{i}"),
                        format!("{stock}:holds"),
                        format!("{stock}:held"),
                        format!("{stock}:journal:on"),
                        format!("{stock}:journal"),
                        format!("{stock}:loc"),
                    ];
                    let mut args: Vec<String> = vec![
                        "deduct".into(),
                        format!("{MAX_HOLD} {WINDOW} {MAX_QTY} error 00"),
                        format!("{i:x}"),
                        "1".into(),
                        "SPLIT".into(),
                    ];
                    args.extend((1..=locations).map(|w| format!("w{w}")));
                    sets[1].call("allocate", calling, &keys, &args)
                })
                .collect();
            let label = format!("DEDUCT.AT over {locations} locations by {}", calling.verb());
            let (cost, replies) = m.run(&label, calls, 1);
            allocation[l][c] = cost;
            for reply in replies {
                let redis::Value::Array(items) = reply else {
                    panic!("DEDUCT.AT answers an array")
                };
                assert_eq!(items.first(), Some(&redis::Value::Int(0)), "took a unit");
            }
        }
    }

    // Coalesced: [era][calling] at 32, journal off and on; and now by
    // FCALL at each size.
    let manys = |set: &Set,
                 calling: Calling,
                 sku: &str,
                 journal: bool,
                 members: usize,
                 n: usize,
                 id: &mut dyn FnMut() -> u64|
     -> Vec<redis::Cmd> {
        (0..n)
            .map(|_| {
                let stock = format!("stock:{{{sku}}}");
                let mut keys = vec![
                    stock.clone(),
                    format!("{stock}:holds"),
                    format!("{stock}:held"),
                ];
                if set.era == Era::Now {
                    keys.push(format!("{stock}:journal:on"));
                    keys.push(format!("{stock}:journal"));
                }
                let mut args: Vec<String> = [
                    WINDOW,
                    MAX_QTY,
                    "error",
                    "0",
                    if journal { "1" } else { "0" },
                ]
                .map(str::to_owned)
                .into();
                for _ in 0..members {
                    let i = id();
                    keys.push(format!("{stock}:req:m{i}"));
                    args.extend(["1".to_owned(), "ORD-1".to_owned(), format!("{i:x}")]);
                }
                set.call("deduct_many", calling, &keys, &args)
            })
            .collect()
    };
    let mut many = [[0.0; 2]; 2];
    let mut many_journal = [[0.0; 2]; 2];
    for (e, set) in sets.iter().enumerate() {
        for (c, calling) in CALLINGS.iter().copied().enumerate() {
            let label = format!("32 coalesced {} by {}", set.era.name(), calling.verb());
            many[e][c] = m
                .run(
                    &label,
                    manys(set, calling, "hot", false, 32, 125, &mut id),
                    32,
                )
                .0;
            many_journal[e][c] = m
                .run(
                    &format!("{label}, journal on"),
                    manys(set, calling, "jhot", true, 32, 125, &mut id),
                    32,
                )
                .0;
        }
    }
    let mut sizes = Vec::new();
    for (members, calls) in COALESCED {
        let per = m
            .run(
                &format!("{members} coalesced now by FCALL"),
                manys(
                    &sets[1],
                    Calling::Function,
                    "hot",
                    false,
                    members,
                    calls + calls / 4,
                    &mut id,
                ),
                members,
            )
            .0;
        sizes.push((members, per));
    }

    // HOLD, then CONFIRM of those holds; REVERT of DEDUCTs made first.
    let mut hold = [[0.0; 2]; 2];
    let mut confirm = [[0.0; 2]; 2];
    let mut revert = [[0.0; 2]; 2];
    let skus = ["hold-a", "hold-b", "hold-c", "hold-d"];
    for (e, set) in sets.iter().enumerate() {
        for (c, calling) in CALLINGS.iter().copied().enumerate() {
            let stock = format!("stock:{{{}}}", skus[2 * e + c]);
            let label = |what: &str| format!("{what} {} by {}", set.era.name(), calling.verb());
            let ids: Vec<u64> = (0..HOLDS + HOLDS / 4).map(|_| id()).collect();
            let record = |i: u64| format!("{stock}:req:h{i}");
            let holds = ids
                .iter()
                .map(|&i| {
                    set.request(
                        "hold",
                        calling,
                        [&stock, &record(i)],
                        &["1", "ORD-1", "600000"],
                        &[MAX_HOLD, WINDOW, MAX_QTY, "error"],
                        false,
                        &format!("{i:x}"),
                    )
                })
                .collect();
            hold[e][c] = m.run(&label("HOLD"), holds, 1).0;
            let confirms = ids
                .iter()
                .map(|&i| {
                    set.request(
                        "confirm",
                        calling,
                        [&stock, &record(i)],
                        &[],
                        &[WINDOW, "error"],
                        false,
                        &format!("c{i:x}"),
                    )
                })
                .collect();
            confirm[e][c] = m.run(&label("CONFIRM"), confirms, 1).0;
            let deducted: Vec<u64> = (0..HOLDS + HOLDS / 4).map(|_| id()).collect();
            let made = deducted
                .iter()
                .map(|&i| {
                    set.request(
                        "deduct",
                        calling,
                        [&stock, &format!("{stock}:req:d{i}")],
                        &["1", "ORD-1"],
                        &[WINDOW, MAX_QTY, "error"],
                        false,
                        &format!("{i:x}"),
                    )
                })
                .collect::<Vec<_>>();
            m.send(&made);
            let reverts = deducted
                .iter()
                .map(|&i| {
                    set.request(
                        "revert",
                        calling,
                        [&stock, &format!("{stock}:req:d{i}")],
                        &[],
                        &[WINDOW, "error"],
                        false,
                        &format!("e{i:x}"),
                    )
                })
                .collect();
            revert[e][c] = m.run(&label("REVERT"), reverts, 1).0;
        }
    }

    // A 3-line ORDER as the saga runs it: begin (filing the order), one
    // DEDUCT per line, advance HOLDING -> DONE (taking it out).
    let mut order = [[[0.0; 3]; 2]; 2];
    for (e, set) in sets.iter().enumerate() {
        for (c, calling) in CALLINGS.iter().copied().enumerate() {
            let label =
                |what: &str| format!("ORDER {what} {} by {}", set.era.name(), calling.verb());
            let orders: Vec<u64> = (0..ORDERS + ORDERS / 4).map(|_| id()).collect();
            let intent = |o: u64| vec![format!("stock:{{order:o{o}}}:intent")];
            let filed = "stock:{sweep-0-16}:orders";
            let begins: Vec<redis::Cmd> = orders
                .iter()
                .map(|&o| {
                    let args: Vec<String> = [
                        "begin",
                        WINDOW,
                        &format!("{o:x}"),
                        "T",
                        "line-a 1 line-b 1 line-c 1",
                        "0",
                        "8000",
                        "file",
                        filed,
                        FILED_AFTER,
                    ]
                    .map(str::to_owned)
                    .into();
                    set.call("order", calling, &intent(o), &args)
                })
                .collect();
            let warm = begins.len() / 5;
            let (cost, measured) = m.run(&label("begin"), begins.clone(), 1);
            order[e][c][0] = cost;
            // The scores the orders were filed at, for their advance.
            let warmed = m.send(&begins[..warm]);
            let scores: Vec<i64> = warmed
                .iter()
                .chain(&measured)
                .map(|reply| match reply {
                    redis::Value::Array(items) => match items.get(9) {
                        Some(redis::Value::Int(score)) => *score,
                        other => panic!("a begin answers its filing: {other:?}"),
                    },
                    other => panic!("a begin answers an array: {other:?}"),
                })
                .collect();
            let lines: Vec<redis::Cmd> = orders
                .iter()
                .flat_map(|&o| {
                    ["line-a", "line-b", "line-c"].map(|sku| {
                        let stock = format!("stock:{{{sku}}}");
                        set.request(
                            "deduct",
                            calling,
                            [&stock, &format!("{stock}:req:~ord:o{o}")],
                            &["1", ""],
                            &[WINDOW, MAX_QTY, "error"],
                            false,
                            &format!("{o:x}"),
                        )
                    })
                })
                .collect();
            order[e][c][1] = m.run(&label("lines (DEDUCT each)"), lines, 1).0;
            let advances: Vec<redis::Cmd> = orders
                .iter()
                .zip(&scores)
                .map(|(&o, score)| {
                    let args: Vec<String> = [
                        "advance",
                        WINDOW,
                        &format!("{o:x}"),
                        "HOLDING",
                        "DONE",
                        "",
                        "",
                        "unfile",
                        filed,
                        &score.to_string(),
                    ]
                    .map(str::to_owned)
                    .into();
                    set.call("order", calling, &intent(o), &args)
                })
                .collect();
            let (cost, replies) = m.run(&label("advance"), advances, 1);
            order[e][c][2] = cost;
            for reply in replies {
                let redis::Value::Array(items) = reply else {
                    panic!("an advance answers an array")
                };
                assert_eq!(items.get(9), Some(&redis::Value::Int(1)), "taken out");
            }
        }
    }

    // ORDER.HOLD, then ORDER.CONFIRM, of 3 lines as the saga runs them.
    // ORDER.HOLD: begin (kind H, filing the order), one HOLD per line of
    // the line id, advance HOLDING -> HELD (taking it out). ORDER.CONFIRM,
    // an attempt of its own: confirm HELD -> CONFIRMING (filing it again),
    // one CONFIRM per line (missing stock as zero, as an order's line
    // ends), advance CONFIRMING -> DONE (taking it out).
    let mut held_order = [[[0.0; 6]; 2]; 2];
    let hline_skus = ["hline-a", "hline-b", "hline-c"];
    for (e, set) in sets.iter().enumerate() {
        for (c, calling) in CALLINGS.iter().copied().enumerate() {
            let label = |what: &str| {
                format!(
                    "ORDER.HOLD + ORDER.CONFIRM {what} {} by {}",
                    set.era.name(),
                    calling.verb()
                )
            };
            let orders: Vec<u64> = (0..ORDERS + ORDERS / 4).map(|_| id()).collect();
            let intent = |o: u64| vec![format!("stock:{{order:o{o}}}:intent")];
            let filed = "stock:{sweep-0-16}:orders";
            // An intent call: the op, its own arguments (four, "" when
            // unused), then the filing that rides along.
            let intent_call = |o: u64, nonce: &str, op: [&str; 5], filing: (&str, &str)| {
                let mut args: Vec<String> =
                    vec![op[0].to_owned(), WINDOW.to_owned(), nonce.to_owned()];
                args.extend(op[1..].iter().map(|a| a.to_string()));
                args.extend([filing.0.to_owned(), filed.to_owned(), filing.1.to_owned()]);
                set.call("order", calling, &intent(o), &args)
            };
            let line_calls = |script: &str,
                              caller: &[&str],
                              settings: &[&str],
                              nonce: &dyn Fn(u64) -> String|
             -> Vec<redis::Cmd> {
                orders
                    .iter()
                    .flat_map(|&o| {
                        hline_skus.map(|sku| {
                            let stock = format!("stock:{{{sku}}}");
                            set.request(
                                script,
                                calling,
                                [&stock, &format!("{stock}:req:~ord:o{o}")],
                                caller,
                                settings,
                                false,
                                &nonce(o),
                            )
                        })
                    })
                    .collect()
            };
            let lines = hline_skus.map(|sku| format!("{sku} 1")).join(" ");
            let begins: Vec<redis::Cmd> = orders
                .iter()
                .map(|&o| {
                    intent_call(
                        o,
                        &format!("{o:x}"),
                        ["begin", "H", &lines, ORDER_HOLD_TTL, ORDER_LINE_TTL],
                        ("file", FILED_AFTER),
                    )
                })
                .collect();
            let (cost, held_scores) = filed_run(&mut m, &label("begin"), begins, "HOLDING");
            held_order[e][c][0] = cost;
            let holds = line_calls(
                "hold",
                &["1", "", ORDER_LINE_TTL],
                &[MAX_HOLD, WINDOW, MAX_QTY, "error"],
                &|o| format!("{o:x}"),
            );
            let (cost, replies) = m.run(&label("lines (HOLD each)"), holds, 1);
            held_order[e][c][1] = cost;
            assert_codes_0("a line's HOLD", &replies);
            let advances: Vec<redis::Cmd> = orders
                .iter()
                .zip(&held_scores)
                .map(|(&o, score)| {
                    intent_call(
                        o,
                        &format!("{o:x}"),
                        ["advance", "HOLDING", "HELD", "", ""],
                        ("unfile", &score.to_string()),
                    )
                })
                .collect();
            let (cost, replies) = m.run(&label("advance to HELD"), advances, 1);
            held_order[e][c][2] = cost;
            assert_rests("HELD", &replies);
            let confirms: Vec<redis::Cmd> = orders
                .iter()
                .map(|&o| {
                    intent_call(
                        o,
                        &format!("c{o:x}"),
                        // Naming the order's lines, as the bench's checkout
                        // does (`-- orders`).
                        ["confirm", &lines, "", "", ""],
                        ("file", FILED_AFTER),
                    )
                })
                .collect();
            let (cost, confirm_scores) =
                filed_run(&mut m, &label("confirm"), confirms, "CONFIRMING");
            held_order[e][c][3] = cost;
            let line_confirms =
                line_calls("confirm", &[], &[WINDOW, "zero"], &|o| format!("c{o:x}"));
            let (cost, replies) = m.run(&label("lines (CONFIRM each)"), line_confirms, 1);
            held_order[e][c][4] = cost;
            assert_codes_0("a line's CONFIRM", &replies);
            let advances: Vec<redis::Cmd> = orders
                .iter()
                .zip(&confirm_scores)
                .map(|(&o, score)| {
                    intent_call(
                        o,
                        &format!("c{o:x}"),
                        ["advance", "CONFIRMING", "DONE", "", ""],
                        ("unfile", &score.to_string()),
                    )
                })
                .collect();
            let (cost, replies) = m.run(&label("advance to DONE"), advances, 1);
            held_order[e][c][5] = cost;
            assert_rests("DONE", &replies);
        }
    }

    // The tables.
    let pct = |on: f64, off: f64| format!("{:+.0}%", 100.0 * (on / off - 1.0));
    let row = |out: &mut String, what: &str, cells: [[f64; 2]; 2], note: &str| {
        let _ = writeln!(
            out,
            "| {what} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2}× | {note} |",
            cells[0][0],
            cells[0][1],
            cells[1][0],
            cells[1][1],
            cells[1][1] / cells[0][1],
        );
    };
    let _ = writeln!(
        out,
        "\n## Redis {version}\n\nInstructions per call in Redis (per deduction for the coalesced rows; \
         redis-server under callgrind, the server's timer left out):\n\n\
         | call | before, EVALSHA | before, FCALL | now, EVALSHA | now, FCALL | FCALL now / before | |\n\
         |---|---:|---:|---:|---:|---:|---|\n\
         | the design note's bare script (GET, GET, DECRBY, SET PX) | | | {} | {} | | |",
        cell(bare[0]),
        cell(bare[1])
    );
    row(out, "DEDUCT", deduct, "");
    let journal_note = |on: [[f64; 2]; 2], off: [[f64; 2]; 2]| {
        format!(
            "vs journal off: before {} / {}, now {} / {}",
            pct(on[0][0], off[0][0]),
            pct(on[0][1], off[0][1]),
            pct(on[1][0], off[1][0]),
            pct(on[1][1], off[1][1])
        )
    };
    row(
        out,
        "DEDUCT, journal on",
        deduct_journal,
        &journal_note(deduct_journal, deduct),
    );
    for (l, locations) in [2, 3].into_iter().enumerate() {
        let _ = writeln!(
            out,
            "| DEDUCT.AT over {locations} locations (SPLIT, the first gives) | | | {:.0} | {:.0} | | {:.2}× DEDUCT now by FCALL |",
            allocation[l][0],
            allocation[l][1],
            allocation[l][1] / deduct[1][1],
        );
    }
    row(out, "a coalesced deduction (32 a call)", many, "");
    row(
        out,
        "a coalesced deduction, journal on",
        many_journal,
        &journal_note(many_journal, many),
    );
    row(out, "HOLD", hold, "");
    row(out, "CONFIRM", confirm, "");
    row(out, "REVERT", revert, "");
    let steps = [
        "ORDER: begin, filing the order",
        "ORDER: a line's DEDUCT",
        "ORDER: advance HOLDING -> DONE, taking it out",
    ];
    for (s, step) in steps.iter().enumerate() {
        row(
            out,
            step,
            [
                [order[0][0][s], order[0][1][s]],
                [order[1][0][s], order[1][1][s]],
            ],
            "",
        );
    }
    let whole = |e: usize, c: usize| order[e][c][0] + 3.0 * order[e][c][1] + order[e][c][2];
    row(
        out,
        "a 3-line ORDER (begin, 3 lines, advance)",
        [[whole(0, 0), whole(0, 1)], [whole(1, 0), whole(1, 1)]],
        "",
    );
    let ratio = |e: usize, c: usize| whole(e, c) / (3.0 * deduct[e][c]);
    let _ = writeln!(
        out,
        "| ORDER / three DEDUCTs | {:.2}× | {:.2}× | {:.2}× | {:.2}× | | |",
        ratio(0, 0),
        ratio(0, 1),
        ratio(1, 0),
        ratio(1, 1)
    );
    let held_steps = [
        "ORDER.HOLD: begin (kind H), filing the order",
        "ORDER.HOLD: a line's HOLD",
        "ORDER.HOLD: advance HOLDING -> HELD, taking it out",
        "ORDER.CONFIRM: confirm HELD -> CONFIRMING, filing the order",
        "ORDER.CONFIRM: a line's CONFIRM",
        "ORDER.CONFIRM: advance CONFIRMING -> DONE, taking it out",
    ];
    for (s, step) in held_steps.iter().enumerate() {
        row(
            out,
            step,
            [
                [held_order[0][0][s], held_order[0][1][s]],
                [held_order[1][0][s], held_order[1][1][s]],
            ],
            "",
        );
    }
    let held_whole = |e: usize, c: usize| {
        let steps = &held_order[e][c];
        steps[0] + 3.0 * steps[1] + steps[2] + steps[3] + 3.0 * steps[4] + steps[5]
    };
    let each = |f: &dyn Fn(usize, usize) -> f64| [[f(0, 0), f(0, 1)], [f(1, 0), f(1, 1)]];
    row(
        out,
        "ORDER.HOLD + ORDER.CONFIRM of 3 lines (begin, 3 HOLDs, advance; confirm, 3 CONFIRMs, advance)",
        each(&held_whole),
        "",
    );
    let by_hand = |e: usize, c: usize| 3.0 * (hold[e][c] + confirm[e][c]);
    row(
        out,
        "3 HOLDs + 3 CONFIRMs (the rows above)",
        each(&by_hand),
        "",
    );
    let held_ratio = |e: usize, c: usize| held_whole(e, c) / by_hand(e, c);
    let _ = writeln!(
        out,
        "| ORDER.HOLD + ORDER.CONFIRM / (3 HOLDs + 3 CONFIRMs) | {:.2}× | {:.2}× | {:.2}× | {:.2}× | | |",
        held_ratio(0, 0),
        held_ratio(0, 1),
        held_ratio(1, 0),
        held_ratio(1, 1)
    );
    let _ = writeln!(
        out,
        "\nCoalesced, now, by FCALL: {}.",
        sizes
            .iter()
            .map(|(members, per)| format!("{members} a call {per:.0} per deduction"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let met = |ok: bool| if ok { "met" } else { "**not met**" };
    let f = 1;
    let _ = writeln!(
        out,
        "\nThe targets, by FCALL:\n\n| target | now | |\n|---|---:|---|\n\
         | DEDUCT ≤ 65,000 | {:.0} | {} |\n\
         | DEDUCT with the journal ≤ +20% | {} | {} |\n\
         | a coalesced deduction (32) ≤ 25,000 | {:.0} | {} |\n\
         | a coalesced deduction with the journal ≤ +20% | {} | {} |\n\
         | ORDER ≤ 1.5 × three DEDUCTs | {:.2}× | {} |\n\
         | ORDER.HOLD + ORDER.CONFIRM ≤ 1.4 × (3 HOLDs + 3 CONFIRMs) | {:.2}× | {} |\n\
         | HOLD ≤ 75% of before | {:.0}% | {} |\n\
         | CONFIRM ≤ 75% of before | {:.0}% | {} |\n\
         | REVERT ≤ 75% of before | {:.0}% | {} |",
        deduct[1][f],
        met(deduct[1][f] <= 65_000.0),
        pct(deduct_journal[1][f], deduct[1][f]),
        met(deduct_journal[1][f] <= 1.2 * deduct[1][f]),
        many[1][f],
        met(many[1][f] <= 25_000.0),
        pct(many_journal[1][f], many[1][f]),
        met(many_journal[1][f] <= 1.2 * many[1][f]),
        ratio(1, f),
        met(ratio(1, f) <= 1.5),
        held_ratio(1, f),
        met(held_ratio(1, f) <= 1.4),
        100.0 * hold[1][f] / hold[0][f],
        met(hold[1][f] <= 0.75 * hold[0][f]),
        100.0 * confirm[1][f] / confirm[0][f],
        met(confirm[1][f] <= 0.75 * confirm[0][f]),
        100.0 * revert[1][f] / revert[0][f],
        met(revert[1][f] <= 0.75 * revert[0][f]),
    );
}
