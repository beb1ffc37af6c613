#!/usr/bin/env python3
"""What `stockgate_account_at` costs PostgreSQL: the account per (sku,
location) of migrations/postgres/0003_location.sql beside the one-number
function it replaced (0001_journal.sql, as `stockgate_account_old`).

    flock /work/bench.lock python3 benches/account_at.py   # needs PostgreSQL 15's initdb, pg_ctl, psql

Starts a throwaway PostgreSQL (on 127.0.0.1, in a temp dir; as the
`postgres` user when run as root), applies 0001 and 0002, loads 20,000
small SKUs of 5 entries, `big` (400,000 entries, its last baseline its
last row) and `big2` (400,000, one baseline at the 100,000th), keeps
0001's function, its search_path pinned as 0002 pins it, under the name
`stockgate_account_old`, applies 0003, and
checks the two agree on every SKU as of several ids. Then each query,
old and new alternately, 6 times: prints the best and the median in ms
(wall clock: compare the two columns of one run, not runs).
"""
import os
import pathlib
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIGRATIONS = ROOT / "migrations" / "postgres"
RUNS = 6


def bin_dir():
    for candidate in sorted(pathlib.Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    if found:
        return pathlib.Path(found).parent
    sys.exit("no initdb: apt-get install postgresql")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    pg = bin_dir()
    psql = shutil.which("psql") or str(pg / "psql")
    tmp = tempfile.mkdtemp(prefix="account-at-")
    as_owner = []
    if os.geteuid() == 0:
        shutil.chown(tmp, "postgres")
        as_owner = ["runuser", "-u", "postgres", "--"]
    data, port = os.path.join(tmp, "data"), free_port()
    subprocess.run(as_owner + [str(pg / "initdb"), "-D", data, "-U", "bench", "-A", "trust"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(as_owner + [str(pg / "pg_ctl"), "-D", data, "-w", "-l", os.path.join(tmp, "log"),
                               "-o", f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1", "start"],
                   check=True, stdout=subprocess.DEVNULL)
    try:
        def sql(text):
            out = subprocess.run([psql, "-h", "127.0.0.1", "-p", str(port), "-U", "bench",
                                  "-d", "postgres", "-qAtX", "-v", "ON_ERROR_STOP=1"],
                                 input=text, capture_output=True, text=True, check=True)
            return out.stdout

        first = (MIGRATIONS / "0001_journal.sql").read_text()
        sql(first)
        sql((MIGRATIONS / "0002_account_search_path.sql").read_text())
        old = re.search(r"CREATE OR REPLACE FUNCTION stockgate_account_at\(.*?\n\$\$;", first, re.S)
        sql(old.group(0).replace("stockgate_account_at(", "stockgate_account_old(", 1))
        # Pinned as 0002 pinned it in every deployment: a function with a
        # SET is never inlined into its caller's query.
        sql("ALTER FUNCTION stockgate_account_old(text, bigint, bigint) SET search_path = public")
        sql("""
INSERT INTO stockgate_journal (sku, entry_ms, entry_seq, format, event, request_id, order_no,
                               stock_change, held_change, stock_after, held_after)
SELECT 'sku-' || (i % 20000), 1000 + i, 0, 1, 'deduct', 'r' || i, '', -1, 0, 1000 - i, 0
  FROM generate_series(1, 100000) i
UNION ALL
SELECT 'big', 1000 + i, 0, 1, CASE WHEN i % 50000 = 0 THEN 'set' ELSE 'deduct' END, 'r' || i, '',
       -1, 0, 1000000 - i, 0
  FROM generate_series(1, 400000) i
UNION ALL
SELECT 'big2', 1000 + i, i % 3, 1,
       CASE WHEN i = 100000 THEN 'set' WHEN i % 7 = 0 THEN 'hold' ELSE 'deduct' END, 'r' || i, '',
       -1, CASE WHEN i % 7 = 0 THEN 1 ELSE 0 END, 1000000 - i, i / 7
  FROM generate_series(1, 400000) i;
""")
        sql("BEGIN;\n" + (MIGRATIONS / "0003_location.sql").read_text() + "\nCOMMIT;\nANALYZE;")
        compared, differing = sql("""
SELECT count(*), count(*) FILTER (WHERE o IS DISTINCT FROM n)
  FROM (SELECT (SELECT ROW(o.*)::text FROM stockgate_account_old(s.sku, c.ms, c.seq) o) o,
               (SELECT ROW(n.sku, n.from_baseline, n.opening_ms, n.opening_seq, n.stock, n.held,
                           n.entries, n.last_ms, n.last_seq)::text
                  FROM stockgate_account_at(s.sku, c.ms, c.seq) n) n
          FROM (SELECT DISTINCT sku FROM stockgate_journal
                 WHERE sku LIKE 'sku-1%' OR sku IN ('big', 'big2')) s,
               (VALUES (1500::bigint, 0::bigint), (51000, 0), (101000, 0), (101000, 1),
                       (101001, 0), (250000, 2), (9223372036854775807, 9223372036854775807))
                 c(ms, seq)) x;
""").strip().split("|")
        if differing != "0":
            sys.exit(f"the functions differ on {differing} of {compared} (sku, id) pairs")
        print(f"the same rows on {compared} (sku, id) pairs\n")
        queries = {
            "big (400k rows, baseline last)": "SELECT * FROM {f}('big')",
            "big2 (300k rows after its baseline)": "SELECT * FROM {f}('big2')",
            "64 small SKUs, as reconcile asks": (
                "SELECT count(*) FROM (SELECT 'sku-' || g AS sku FROM generate_series(100, 163) g) w,"
                " LATERAL {f}(w.sku) a"),
            "every SKU (the view's query)": (
                "SELECT count(*) FROM (SELECT DISTINCT sku FROM stockgate_journal) s,"
                " LATERAL {f}(s.sku) a"),
        }
        print("| query | one number (0001), ms best / median | per location (0003), ms best / median |")
        print("|---|---|---|")
        for name, query in queries.items():
            script = "\\timing on\n" + "".join(
                f"{query.format(f='stockgate_account_old')};\n{query.format(f='stockgate_account_at')};\n"
                for _ in range(RUNS))
            times = [float(t) for t in re.findall(r"Time: ([0-9.]+) ms", sql(script))]
            old_ms, new_ms = times[0::2], times[1::2]
            cell = lambda ms: f"{min(ms):.1f} / {statistics.median(ms):.1f}"
            print(f"| {name} | {cell(old_ms)} | {cell(new_ms)} |")
    finally:
        subprocess.run(as_owner + [str(pg / "pg_ctl"), "-D", data, "-m", "fast", "stop"],
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
