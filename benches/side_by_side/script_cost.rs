//! The `script-cost` mode: what a deduction costs Redis itself, in
//! instructions counted by callgrind on `redis-server` (issue 16), called
//! with EVALSHA and with FCALL of stockgate's function library (issue 27).
//!
//! ```sh
//! cargo bench --bench side_by_side -- script-cost
//! STOCKGATE_SCRIPT_COST_SERVERS=redis-7.0 cargo bench --bench side_by_side -- script-cost
//! ```
//!
//! For each server (Redis 7.0, Debian's, and Redis 8.2, from
//! `deploy/install-servers.sh`; `STOCKGATE_SCRIPT_COST_SERVERS` names
//! fewer, comma-separated) a standalone `redis-server` runs under
//! `valgrind --tool=callgrind`; the scripts stockgate embeds are loaded
//! into it, with SCRIPT LOAD and as one library with FUNCTION LOAD; for
//! each row its counters are zeroed, `calls` calls run (pipelined 16 at a
//! time, each deduction a fresh request_id on one sku with plenty of
//! stock), and the dump's total is divided by the deductions. The rows
//! are the plain DEDUCT script, one deduction per call, and the coalesced
//! one (`lua/deduct_many.lua`) at several group sizes, each by EVALSHA and
//! by FCALL: where a hot SKU's deduction costs its primary what it costs,
//! with no other process's noise in the figure. Then a 3-line ORDER's
//! steps, by each. (The Valkey 9.1 build is libc malloc's: not measured.)

use crate::instructions::{callgrind, control, dump_total};
use std::fmt::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stockgate::dev::ServerKind;
use stockgate::script::{Calling, Library, LuaScript, Scripts};

/// Both ways of calling, in the order the rows show them.
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
/// Rows: deductions per call (1: `lua/deduct.lua`) and calls.
const ROWS: [(usize, usize); 4] = [(1, 4000), (8, 500), (32, 150), (64, 75)];

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
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("redis-server under valgrind never answered: {e}"),
        }
    }
}

/// Starts a call of `script` in `pipe`, as `calling` says; its keys and
/// arguments follow with `.arg`.
fn script_call<'a>(
    pipe: &'a mut redis::Pipeline,
    script: &LuaScript,
    calling: Calling,
) -> &'a mut redis::Pipeline {
    let (verb, name) = script.named(calling);
    pipe.cmd(verb).arg(name)
}

/// `calls` calls of `members` fresh deductions each (1: lua/deduct.lua),
/// each journaled when `journal` (issue 26: the SKU's journal must exist).
fn deduct(
    conn: &mut redis::Connection,
    scripts: &Scripts,
    calling: Calling,
    tag: &str,
    members: usize,
    calls: usize,
    journal: bool,
) {
    let flag = if journal { "1" } else { "0" };
    let stock = "stock:{hot}";
    let mut sent = 0;
    while sent < calls {
        let mut pipe = redis::pipe();
        for call in sent..(sent + 16).min(calls) {
            let id = |m: usize| format!("{stock}:req:{tag}-{call}-{m}");
            let nonce = format!("{:x}", call + 1);
            let script: &LuaScript = if members == 1 {
                &scripts.deduct
            } else {
                &scripts.deduct_many
            };
            let cmd = script_call(&mut pipe, script, calling);
            if members == 1 {
                cmd.arg(4)
                    .arg(stock)
                    .arg(id(0))
                    .arg(format!("{stock}:holds"))
                    .arg(format!("{stock}:held"))
                    .arg("1")
                    .arg("")
                    .arg(WINDOW)
                    .arg(MAX_QTY)
                    .arg("error")
                    .arg(&nonce)
                    .arg("0")
                    .arg(flag);
            } else {
                cmd.arg(3 + members)
                    .arg(stock)
                    .arg(format!("{stock}:holds"))
                    .arg(format!("{stock}:held"));
                for m in 0..members {
                    cmd.arg(id(m));
                }
                cmd.arg(WINDOW).arg(MAX_QTY).arg("error").arg("0").arg(flag);
                for _ in 0..members {
                    cmd.arg("1").arg("").arg(&nonce);
                }
            }
            cmd.ignore();
        }
        pipe.query::<()>(conn).expect("the deductions run");
        sent = (sent + 16).min(calls);
    }
}

/// The steps of one 3-line ORDER as the saga runs them (issue 25's
/// profile), each a script call or one per line: what it costs Redis. The
/// filing among the orders in flight rides along with the intent calls
/// (`lua/order.lua`), as it does whenever the shard's orders key is on the
/// intent's node.
const ORDER_STEPS: [(&str, usize); 3] = [
    ("order.lua begin (HOLDING, kind T), filing the order", 1),
    ("deduct.lua, one per line (the lines taken)", 3),
    ("order.lua advance HOLDING -> DONE, taking it out", 1),
];

/// Orders run through [`ORDER_STEPS`], step by step over all of them.
const ORDERS: usize = 600;

/// Step `step` of `orders` 3-line orders named `<tag>-<n>`, pipelined 16
/// orders at a time, with the arguments stockgate sends (its defaults).
/// `filed_at`: each order's score among the orders in flight, as its begin
/// answered it, for the advance that takes it out.
#[allow(clippy::too_many_arguments)]
fn order_step(
    conn: &mut redis::Connection,
    scripts: &Scripts,
    calling: Calling,
    tag: &str,
    step: usize,
    orders: usize,
    filed_at: &mut Vec<i64>,
) {
    use stockgate::keys::KeyLayout;
    use stockgate::params::{RequestId, Sku};
    let keys = KeyLayout::new("stock").expect("the default prefix");
    let skus: Vec<Sku> = ["line-a", "line-b", "line-c"]
        .iter()
        .map(|s| Sku::parse(s.as_bytes().to_vec().into()).expect("a sku"))
        .collect();
    let lines: &[u8] = b"line-a 1 line-b 1 line-c 1";
    for first in (0..orders).step_by(16) {
        let mut pipe = redis::pipe();
        for n in first..(first + 16).min(orders) {
            let name = format!("{tag}-{n}");
            let id = RequestId::parse(name.clone().into_bytes().into()).expect("an id");
            let line_id = KeyLayout::order_line_id(&id).expect("a line id");
            let nonce = format!("{:x}", n + 1);
            let intent = keys.order_key(&id);
            let filed = &keys.sweep_shards()[keys.order_shard_index(&id)].orders;
            let score = filed_at.get(n).map(|s| s.to_string()).unwrap_or_default();
            let order = |pipe: &mut redis::Pipeline, args: &[&[u8]]| {
                let cmd = script_call(pipe, &scripts.order, calling)
                    .arg(1)
                    .arg(&intent);
                cmd.arg(args[0]).arg(WINDOW).arg(&nonce);
                for arg in &args[1..] {
                    cmd.arg(*arg);
                }
            };
            match step {
                0 => order(
                    &mut pipe,
                    &[
                        b"begin", b"T", lines, b"0", b"8000", b"file", filed, b"20000",
                    ],
                ),
                2 => order(
                    &mut pipe,
                    &[
                        b"advance",
                        b"HOLDING",
                        b"DONE",
                        b"",
                        b"",
                        b"unfile",
                        filed,
                        score.as_bytes(),
                    ],
                ),
                _ => {
                    for sku in &skus {
                        let request = keys.request_keys(sku, &line_id);
                        let cmd = script_call(&mut pipe, &scripts.deduct, calling)
                            .arg(4)
                            .arg(&request.all()[..]);
                        cmd.arg("1").arg("").arg(WINDOW).arg(MAX_QTY).arg("error");
                        cmd.arg(&nonce).arg("0");
                    }
                }
            }
        }
        let replies: Vec<redis::Value> = pipe.query(conn).expect("the order steps run");
        for reply in replies {
            match (step, reply) {
                (0, redis::Value::Array(items)) => match items.get(9) {
                    Some(redis::Value::Int(score)) => filed_at.push(*score),
                    other => panic!("a begin answers its filing: {other:?}"),
                },
                (2, redis::Value::Array(items)) => {
                    assert_eq!(items.get(9), Some(&redis::Value::Int(1)), "taken out")
                }
                (_, redis::Value::Array(_)) => {}
                (_, other) => panic!("an order step answered {other:?}"),
            }
        }
    }
}

/// What each step of a 3-line ORDER costs Redis, and the ORDER against
/// three DEDUCTs (`deduct`: instructions per plain DEDUCT, from the rows
/// above).
fn order_profile(
    conn: &mut redis::Connection,
    scripts: &Scripts,
    calling: Calling,
    pid: u32,
    dir: &std::path::Path,
    deduct: f64,
    out: &mut String,
) {
    for sku in ["line-a", "line-b", "line-c"] {
        redis::cmd("SET")
            .arg(format!("stock:{{{sku}}}"))
            .arg(1_000_000_000_000u64)
            .query::<()>(conn)
            .expect("seed the line skus");
    }
    let verb = calling.verb();
    let mut warm = Vec::new();
    for step in 0..ORDER_STEPS.len() {
        order_step(
            conn,
            scripts,
            calling,
            &format!("{verb}-warm"),
            step,
            ORDERS / 4,
            &mut warm,
        );
    }
    let mut filed_at = Vec::new();
    let _ = writeln!(
        out,
        "\n**A 3-line ORDER in Redis, step by step, by {verb}** ({ORDERS} orders, each step over all of them; \
         the lines on one server here, as on three primaries they cost the same):\n\n\
         | step | calls | instructions / call | per ORDER | share |\n|---|---:|---:|---:|---:|"
    );
    let mut steps = Vec::new();
    for (step, (name, calls)) in ORDER_STEPS.iter().enumerate() {
        control(&["--zero"], pid);
        order_step(
            conn,
            scripts,
            calling,
            &format!("{verb}-o"),
            step,
            ORDERS,
            &mut filed_at,
        );
        let total = dump_total(dir, "redis", pid) as f64;
        steps.push((
            name,
            *calls,
            total / (ORDERS * calls) as f64,
            total / ORDERS as f64,
        ));
        eprintln!(
            "script-cost: {name} by {verb}: {:.0} instructions per call",
            total / (ORDERS * calls) as f64
        );
    }
    let order: f64 = steps.iter().map(|s| s.3).sum();
    for (name, calls, per_call, per_order) in &steps {
        let _ = writeln!(
            out,
            "| {name} | {calls} | {per_call:.0} | {per_order:.0} | {:.0}% |",
            100.0 * per_order / order
        );
    }
    let _ = writeln!(
        out,
        "| **the ORDER** | {} | | **{order:.0}** | |\n| three DEDUCTs | 3 | {deduct:.0} | {:.0} | |\n\n\
         ORDER / three DEDUCTs in Redis: **{:.2}×** (the target: at most 1.5×).",
        ORDER_STEPS.iter().map(|s| s.1).sum::<usize>(),
        3.0 * deduct,
        order / (3.0 * deduct)
    );
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
    let pid = server.child.id();
    let scripts = Scripts::new();
    for script in [
        &scripts.deduct,
        &scripts.deduct_many,
        &scripts.order,
        &scripts.order_due,
        &scripts.hold,
        &scripts.confirm,
    ] {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&script.body)
            .query::<String>(&mut conn)
            .expect("the script loads");
    }
    let library = Library::of(&scripts.all()).expect("stockgate has scripts");
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&library.code)
        .query::<String>(&mut conn)
        .expect("the library loads");
    let version: String = redis::cmd("INFO")
        .arg("server")
        .query::<String>(&mut conn)
        .expect("INFO")
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    redis::cmd("SET")
        .arg("stock:{hot}")
        .arg(1_000_000_000_000u64)
        .query::<()>(&mut conn)
        .expect("seed the sku");
    let _ = write!(
        out,
        "\n## Redis {version}\n\n**Script cost in Redis** (redis-server under callgrind; fresh request_ids on one sku):\n\n\
         | script | called by | deductions per call | calls | instructions / deduction | vs one per call by EVALSHA |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    let mut single = Vec::new();
    for (members, calls) in ROWS {
        for calling in CALLINGS {
            let tag = format!("{}-m{members}", calling.verb());
            // Warm-up: the script cache, the allocator, the keyspace's growth.
            deduct(
                &mut conn,
                &scripts,
                calling,
                &format!("w{tag}"),
                members,
                calls / 4 + 1,
                false,
            );
            control(&["--zero"], pid);
            deduct(&mut conn, &scripts, calling, &tag, members, calls, false);
            let total = dump_total(server.dir.path(), "redis", pid);
            let per = total as f64 / (members * calls) as f64;
            if members == 1 {
                single.push((calling, per));
            }
            let base = single[0].1;
            let _ = writeln!(
                out,
                "| {} | {} | {members} | {calls} | {per:.0} | {:.2}x |",
                if members == 1 {
                    "lua/deduct.lua"
                } else {
                    "lua/deduct_many.lua"
                },
                calling.verb(),
                per / base,
            );
            eprintln!(
                "script-cost: redis {version}, {members} per call by {}, {per:.0} instructions per deduction",
                calling.verb()
            );
        }
    }
    let records: u64 = redis::cmd("DBSIZE").query(&mut conn).expect("DBSIZE");
    let expected: usize = CALLINGS.len()
        * ROWS
            .iter()
            .map(|(members, calls)| members * (calls + calls / 4 + 1))
            .sum::<usize>()
        + 1;
    assert_eq!(
        records as usize, expected,
        "every deduction wrote its record (and only that)"
    );
    let _ = writeln!(
        out,
        "\nOne DEDUCT by FCALL / by EVALSHA: **{:.3}×**.",
        single[1].1 / single[0].1
    );
    journal_rows(&mut conn, &scripts, pid, server.dir.path(), out);
    for (calling, deduct) in single {
        order_profile(
            &mut conn,
            &scripts,
            calling,
            pid,
            server.dir.path(),
            deduct,
            out,
        );
    }
}

/// The same deductions journaled (issue 26's target: at most +20% per
/// DEDUCT), on the SKU's journal made as stockgate makes it, each against
/// its run with the journal off right before; by EVALSHA and by FCALL.
fn journal_rows(
    conn: &mut redis::Connection,
    scripts: &Scripts,
    pid: u32,
    dir: &std::path::Path,
    out: &mut String,
) {
    redis::cmd("XADD")
        .arg("stock:{hot}:journal")
        .arg("MAXLEN")
        .arg("0")
        .arg("*")
        .arg("v")
        .arg("1")
        .query::<String>(conn)
        .expect("make the journal");
    let _ = writeln!(
        out,
        "\n**With the journal** (`--journal`: each deduction also appends its entry to the \
         SKU's stream; the target: at most +20% per DEDUCT):\n\n\
         | script | called by | deductions per call | calls | instructions / deduction | vs journal off |\n\
         |---|---|---:|---:|---:|---:|"
    );
    for (members, calls) in [(1, 4000), (32, 150)] {
        for calling in CALLINGS {
            let tag = format!("j{}-{members}", calling.verb());
            let run = |conn: &mut redis::Connection, name: &str, journal: bool| {
                control(&["--zero"], pid);
                deduct(conn, scripts, calling, name, members, calls, journal);
                dump_total(dir, "redis", pid) as f64 / (members * calls) as f64
            };
            deduct(
                conn,
                scripts,
                calling,
                &format!("w{tag}"),
                members,
                calls / 4 + 1,
                true,
            );
            let off = run(conn, &format!("off{tag}"), false);
            let on = run(conn, &tag, true);
            let _ = writeln!(
                out,
                "| {} | {} | {members} | {calls} | {on:.0} | {:+.1}% |",
                if members == 1 {
                    "lua/deduct.lua"
                } else {
                    "lua/deduct_many.lua"
                },
                calling.verb(),
                100.0 * (on / off - 1.0),
            );
            eprintln!(
                "script-cost: journal on, {members} per call by {}: {on:.0} vs {off:.0} off",
                calling.verb()
            );
        }
    }
}
