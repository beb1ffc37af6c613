#!/usr/bin/env python3
"""What the idempotency record's shape costs Redis, in instructions.

    python3 benches/record_shape.py        # needs redis-server, redis-cli, valgrind

Starts redis-server (Debian's, on 127.0.0.1, in a temp dir) under
`valgrind --tool=callgrind` and counts, per call, a script that reads a
record and writes it back with its TTL in each candidate shape: one packed
string (what stockgate keeps, `lua/common.lua`) by GET and SET ... PX or
SET then PEXPIRE, and a hash of four fields by HMGET or HGET, HSET and
PEXPIRE. Each shape: 300 calls to warm up, then the counters zeroed, 3,000
calls on fresh keys pipelined through `redis-cli --pipe`, the counters
dumped and divided by the calls; `return 1` is the call alone. The
server's timer is included (about 1k a call under callgrind on 7.0), alike
for every row. Prints a Markdown table (docs/performance.md).
"""
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

CALLS = 3000
SCRIPTS = {
    "return 1 (the call alone)": "return 1",
    "packed string: GET, SET PX": (
        "local r = redis.call('GET', KEYS[1]) "
        "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1"
    ),
    "packed string: GET, SET, PEXPIRE": (
        "local r = redis.call('GET', KEYS[1]) redis.call('SET', KEYS[1], ARGV[1]) "
        "redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1"
    ),
    "hash: HMGET of 4 fields, HSET of 4, PEXPIRE": (
        "local r = redis.call('HMGET', KEYS[1], 's', 'q', 'n', 'o') "
        "redis.call('HSET', KEYS[1], 's', 'D', 'q', ARGV[3], 'n', ARGV[4], 'o', ARGV[5]) "
        "redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1"
    ),
    "hash: HGET of 1 field, HSET of 4, PEXPIRE": (
        "local r = redis.call('HGET', KEYS[1], 's') "
        "redis.call('HSET', KEYS[1], 's', 'D', 'q', ARGV[3], 'n', ARGV[4], 'o', ARGV[5]) "
        "redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1"
    ),
}


def need(tool, package):
    if shutil.which(tool) is None:
        sys.exit(f"{tool} is missing: apt-get install {package}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resp(args):
    out = [f"*{len(args)}\r\n"]
    for a in args:
        out.append(f"${len(a.encode())}\r\n{a}\r\n")
    return "".join(out)


def main():
    need("redis-server", "redis-server")
    need("redis-cli", "redis-tools")
    need("valgrind", "valgrind")
    port = str(free_port())
    tmp = tempfile.mkdtemp(prefix="record-shape-")
    out = os.path.join(tmp, "cg.out")
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
         "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", tmp],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def cli(*args, data=None):
        return subprocess.run(["redis-cli", "-p", port, *args], input=data,
                              capture_output=True, text=True).stdout.strip()

    try:
        for _ in range(300):
            if cli("PING") == "PONG":
                break
            time.sleep(0.1)
        else:
            sys.exit("redis-server under valgrind did not answer")
        costs = {}
        for k, (name, body) in enumerate(SCRIPTS.items()):
            sha = cli("SCRIPT", "LOAD", body)

            def run(tag, n):
                data = "".join(resp(["EVALSHA", sha, "1", f"req:{{s}}:{tag}{i}",
                                     "3:D:2:00ff::o-1", "86400000", "2", "00ff", "o-1"])
                               for i in range(n))
                cli("--pipe", data=data)

            run(f"w{k}-", 300)
            subprocess.run(["callgrind_control", "--zero", str(server.pid)],
                           capture_output=True)
            run(f"m{k}-", CALLS)
            for f in glob.glob(out + ".*"):
                os.remove(f)
            subprocess.run(["callgrind_control", "--dump", str(server.pid)],
                           capture_output=True)
            dumps = []
            for _ in range(100):
                dumps = glob.glob(out + ".*")
                if dumps:
                    break
                time.sleep(0.1)
            time.sleep(0.5)
            total = None
            for line in open(max(dumps, key=os.path.getmtime)):
                if line.startswith(("summary:", "totals:")):
                    total = int(line.split()[1])
            costs[name] = total / CALLS
            print(f"{name}: {costs[name]:.0f}", file=sys.stderr)
        base = costs["return 1 (the call alone)"]
        print("| record shape | instructions per call | beyond `return 1` |")
        print("|---|---:|---:|")
        for name, cost in costs.items():
            print(f"| {name} | {cost:,.0f} | {cost - base:,.0f} |")
    finally:
        cli("SHUTDOWN", "NOSAVE")
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
