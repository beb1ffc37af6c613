#!/usr/bin/env python3
"""What the Redis commands of an order's intent call cost Redis, in
instructions: the intent as a hash (what lua/order.lua keeps) against one
packed string, and the calls every intent call makes besides.

    python3 benches/intent_shape.py        # needs redis-server, redis-cli, valgrind

Starts redis-server (Debian's, on 127.0.0.1, in a temp dir) under
`valgrind --tool=callgrind` and counts, per call, a script that makes
only the named commands on an intent-shaped key: a begin (the record not
there yet) and an advance (the record there, made before the counters
are zeroed), each as the hash does it today and as a packed string
would; Redis time; the order's filing and taking it out. Each row: 300
calls to warm up, then the counters zeroed, 3,000 calls on fresh keys
pipelined through `redis-cli --pipe`, the counters dumped and divided by
the calls; `return 1` is the call alone. Prints a Markdown table
(docs/performance.md, "Where an order's cost goes").
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
LINES = "sku-a 1 sku-b 1 sku-c 1"
PACKED = "HOLDING T 0 0 - 0123456789abcdef 1700000000000 " + LINES
FIELDS = ["p", "HOLDING", "k", "T", "l", LINES, "e", "0", "c", "0", "s", "",
          "w", "0123456789abcdef", "b", "1700000000000"]

# name -> (the script, what the key holds before it runs: None, "hash" or
# "packed")
SCRIPTS = {
    "return 1 (the call alone)": ("return 1", None),
    "begin, hash: HEXISTS, HSET of 8 fields, PEXPIRE": (
        "local there = redis.call('HEXISTS', KEYS[1], 'p') "
        "redis.call('HSET', KEYS[1], " + ", ".join(f"'{f}'" for f in FIELDS) + ") "
        "redis.call('PEXPIRE', KEYS[1], '302000') return 1", None),
    "begin, packed: SET NX GET PX": (
        f"redis.call('SET', KEYS[1], '{PACKED}', 'NX', 'GET', 'PX', '302000') return 1", None),
    "advance, hash: HMGET of 8 fields, HSET of 2, PTTL": (
        "local r = redis.call('HMGET', KEYS[1], 'p', 'k', 'l', 'e', 'c', 's', 'w', 'b') "
        "redis.call('HSET', KEYS[1], 'p', 'DONE', 'w', '00ff') "
        "local t = redis.call('PTTL', KEYS[1]) return 1", "hash"),
    "advance, packed: GET, SET KEEPTTL": (
        "local r = redis.call('GET', KEYS[1]) "
        f"redis.call('SET', KEYS[1], '{PACKED}', 'KEEPTTL') return 1", "packed"),
    "Redis time: TIME": ("local t = redis.call('TIME') return 1", None),
    "filing: ZADD GT CH": (
        "redis.call('ZADD', 'orders{o}', 'GT', 'CH', '1700000000000', KEYS[1]) return 1", None),
    "taking it out: ZSCORE, ZREM": (
        "local s = redis.call('ZSCORE', 'orders{o}', KEYS[1]) "
        "redis.call('ZREM', 'orders{o}', KEYS[1]) return 1", None),
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
    tmp = tempfile.mkdtemp(prefix="intent-shape-")
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
        for k, (name, (body, before)) in enumerate(SCRIPTS.items()):
            sha = cli("SCRIPT", "LOAD", body)

            def run(tag, n):
                keys = [f"sg:{{order:{tag}{i}}}:intent" for i in range(n)]
                if before == "hash":
                    cli("--pipe", data="".join(
                        resp(["HSET", key, *FIELDS]) + resp(["PEXPIRE", key, "302000"])
                        for key in keys))
                elif before == "packed":
                    cli("--pipe", data="".join(
                        resp(["SET", key, PACKED, "PX", "302000"]) for key in keys))
                if tag.startswith("m"):
                    subprocess.run(["callgrind_control", "--zero", str(server.pid)],
                                   capture_output=True)
                cli("--pipe", data="".join(
                    resp(["EVALSHA", sha, "1", key]) for key in keys))

            run(f"w{k}-", 300)
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
        print("| commands | instructions per call | beyond `return 1` |")
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
