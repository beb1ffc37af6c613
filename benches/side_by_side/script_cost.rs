//! The `script-cost` mode: what a deduction costs Redis itself, in
//! instructions counted by callgrind on `redis-server` (issue 16).
//!
//! ```sh
//! cargo bench --bench side_by_side -- script-cost
//! ```
//!
//! A standalone `redis-server` runs under `valgrind --tool=callgrind`; the
//! scripts stockgate embeds are loaded into it; for each row its counters
//! are zeroed, `calls` EVALSHAs run (pipelined 16 at a time, each
//! deduction a fresh request_id on one sku with plenty of stock), and the
//! dump's total is divided by the deductions. The rows are the plain
//! DEDUCT script, one deduction per call, and the coalesced one
//! (`lua/deduct_many.lua`) at several group sizes: where a hot SKU's
//! deduction costs its primary what it costs, with no other process's
//! noise in the figure.

use crate::instructions::{callgrind, control, dump_total};
use std::fmt::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stockgate::script::{LuaScript, Scripts};

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

fn start() -> Server {
    let dir = tempfile::tempdir().expect("a temp dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut command = callgrind(dir.path(), "redis");
    command.extend(
        [
            "redis-server",
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
            panic!("cannot start redis-server under valgrind ({e}): apt-get install valgrind redis-server")
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

/// `calls` calls of `members` fresh deductions each (1: lua/deduct.lua).
fn deduct(
    conn: &mut redis::Connection,
    scripts: &Scripts,
    tag: &str,
    members: usize,
    calls: usize,
) {
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
            let cmd = pipe.cmd("EVALSHA").arg(&script.sha);
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
                    .arg("0");
            } else {
                cmd.arg(3 + members)
                    .arg(stock)
                    .arg(format!("{stock}:holds"))
                    .arg(format!("{stock}:held"));
                for m in 0..members {
                    cmd.arg(id(m));
                }
                cmd.arg(WINDOW).arg(MAX_QTY).arg("error").arg("0");
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

pub fn run() {
    let server = start();
    let mut conn = connect(server.port);
    let pid = server.child.id();
    let scripts = Scripts::new();
    for script in [&scripts.deduct, &scripts.deduct_many] {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&script.body)
            .query::<String>(&mut conn)
            .expect("the script loads");
    }
    redis::cmd("SET")
        .arg("stock:{hot}")
        .arg(1_000_000_000_000u64)
        .query::<()>(&mut conn)
        .expect("seed the sku");
    let mut out = String::from(
        "**Script cost in Redis** (redis-server under callgrind; fresh request_ids on one sku):\n\n\
         | script | deductions per call | calls | instructions / deduction | vs one per call |\n\
         |---|---:|---:|---:|---:|\n",
    );
    let mut single = None;
    for (members, calls) in ROWS {
        let tag = format!("m{members}");
        // Warm-up: the script cache, the allocator, the keyspace's growth.
        deduct(
            &mut conn,
            &scripts,
            &format!("w{tag}"),
            members,
            calls / 4 + 1,
        );
        control(&["--zero"], pid);
        deduct(&mut conn, &scripts, &tag, members, calls);
        let total = dump_total(server.dir.path(), "redis", pid);
        let per = total as f64 / (members * calls) as f64;
        let single_cost = *single.get_or_insert(per);
        let _ = writeln!(
            out,
            "| {} | {members} | {calls} | {per:.0} | {:.2}x |",
            if members == 1 {
                "lua/deduct.lua"
            } else {
                "lua/deduct_many.lua"
            },
            per / single_cost,
        );
        eprintln!("script-cost: {members} per call, {per:.0} instructions per deduction");
    }
    let records: u64 = redis::cmd("DBSIZE").query(&mut conn).expect("DBSIZE");
    let expected: usize = ROWS
        .iter()
        .map(|(members, calls)| members * (calls + calls / 4 + 1))
        .sum::<usize>()
        + 1;
    assert_eq!(
        records as usize, expected,
        "every deduction wrote its record (and only that)"
    );
    println!("{out}");
}
