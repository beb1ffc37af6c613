#!/usr/bin/env python3
"""Writes the seed corpus of the `resp` fuzz target into seeds/resp/.

Each seed is 4 control bytes (see `case_from_bytes` in harness.rs: flags,
max_request, read seed) and then what a client sends. Every stream is
written in a few variants: the open server or the locked-down one, read
whole or split. Run it from anywhere; it rewrites seeds/resp/, keeping the found-* files
(inputs the fuzzer found, kept as regression seeds).
"""
import hashlib
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "seeds" / "resp"


def mb(*args):
    """A multibulk request of bulk strings."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else a.encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


ULID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"  # 2016: stale for --reject-stale-ids
UUID7 = "017f22e2-79b0-7cc3-98c4-dc0c0c07398f"

# Real requests.
VALID = {
    "deduct": mb("DEDUCT", "sku-1", "2", "req-1"),
    "deduct_order": mb("DEDUCT", "sku-1", "2", "req-1", "ORD 2026/11 #7"),
    "deduct_ulid": mb("deduct", "sku-1", "1", ULID, "ORD-1"),
    "deduct_uuid7": mb("Deduct", "sku-1", "999", UUID7),
    "deduct_inline": b"DEDUCT sku-1 2 req-1 ORD-1\r\n",
    "deduct_bad_args": mb("DEDUCT", "s{k}u", "0", "req 1")
    + mb("DEDUCT", "sku", "01", "r")
    + mb("DEDUCT", "sku", "-1", "r")
    + mb("DEDUCT", "sku", "1001", "r", "x" * 129)
    + mb("DEDUCT", "sku", "1", "r", "line\nbreak"),
    "deduct_arity": mb("DEDUCT", "sku", "1") + mb("DEDUCT", "a", "1", "r", "o", "extra"),
    "revert": mb("REVERT", "sku-1", "req-1"),
    "revert_inline": b"REVERT sku-1 req-1\n",
    "revert_stale": mb("REVERT", "sku-1", ULID) + mb("REVERT", "sku}", "r"),
    "hello3": mb("HELLO", "3") + mb("DEDUCT", "sku-1", "2", "req-1") + mb("PING"),
    "hello3_auth": mb("HELLO", "3", "AUTH", "default", "fuzz-secret", "SETNAME", "app")
    + mb("REVERT", "sku-1", "req-1")
    + mb("CLIENT", "GETNAME"),
    "hello_bad": mb("HELLO", "4") + mb("HELLO", "x") + mb("HELLO", "2", "SETNAME", "a b")
    + mb("HELLO", "3", "AUTH", "default", "wrong") + mb("HELLO", "2", "FOO"),
    "auth": mb("AUTH", "fuzz-secret") + mb("DEDUCT", "sku-1", "1", "r"),
    "auth_user": mb("AUTH", "default", "fuzz-secret") + mb("INFO"),
    "auth_wrong": mb("AUTH", "nope") + mb("AUTH", "bob", "fuzz-secret") + mb("AUTH", "a", "b", "c")
    + mb("STOCK.GET", "sku"),
    "ping_echo": b"PING\r\n" + mb("PING", "hi") + mb("ECHO", "x\r\ny") + mb("ECHO"),
    "select": mb("SELECT", "0") + mb("SELECT", "1"),
    "client": mb("CLIENT", "SETNAME", "app-1") + mb("CLIENT", "GETNAME") + mb("CLIENT", "ID")
    + mb("CLIENT", "SETINFO", "LIB-NAME", "redis-py") + mb("CLIENT", "SETINFO", "LIB-VER", "5.0")
    + mb("CLIENT", "SETINFO", "x", "y") + mb("CLIENT", "KILL") + mb("CLIENT", "SETNAME", "")
    + mb("CLIENT", "SETNAME", "bad name"),
    "info": mb("INFO") + mb("INFO", "server", "stats") + mb("INFO", "everything") + b"INFO stockgate\r\n",
    "command": mb("COMMAND") + mb("COMMAND", "COUNT") + mb("COMMAND", "COUNT", "x")
    + mb("COMMAND", "DOCS") + mb("COMMAND", "DOCS", "deduct", "client")
    + mb("COMMAND", "INFO", "deduct", "nope") + mb("COMMAND", "LIST") + mb("COMMAND", "HELP"),
    "stock_admin": mb("STOCK.GET", "sku-1") + mb("STOCK.SET", "sku-1", "10")
    + mb("STOCK.SET", "sku-1", "9007199254740992") + mb("STOCK.ADD", "sku-1", "-5")
    + mb("STOCK.ADD", "sku-1", "-0") + mb("STOCK.STATUS", "sku-1", "req-1")
    + mb("stock.status", "sku-1", "bad id"),
    "unknown": mb("GET", "foo") + mb("SET", "k", "\x00\x01\x7f" * 50) + b"FLUSHALL\r\n",
    "quit": mb("PING") + mb("QUIT") + mb("DEDUCT", "sku-1", "1", "after-quit"),
    "pipeline": b"".join(mb("DEDUCT", "sku-%d" % i, str(i + 1), "req-%d" % i) for i in range(40))
    + b"".join(b"REVERT sku-%d req-%d\r\n" % (i, i) for i in range(40)),
    "empty_and_skips": b"\r\n\n  \r\n*0\r\n*-1\r\n" + mb("") + mb("PING") + b" \t PING \t \r\n",
    "binary_args": mb("ECHO", b"\x00\r\n\xff" * 20) + mb(b"\xff\xfe", b"\x00"),
    # Inline quoting, as Redis's sdssplitargs reads it.
    "inline_quoted": b'ECHO "two words"\r\n'
    + b"ECHO 'a\\'b' \"\\x41\\x4g\\n\\\"\" a\"b c\"\r\n"
    + b'"" ""\r\nDEDUCT "sku-1" \'2\' "req 1"\r\n\x0b\x0c\r\n',
    "reset_help": mb("CLIENT", "NO-EVICT", "on") + mb("CLIENT", "NO-TOUCH", "OFF")
    + mb("CLIENT", "INFO") + mb("CLIENT", "HELP") + mb("RESET") + mb("PING")
    + mb("COMMAND", "INFO", "client|setname") + mb("COMMAND", "DOCS", "CLIENT|help"),
}

# Redis's own protocol tests (tests/unit/protocol.tcl) and then some.
MALFORMED = {
    "mb_too_long": b"*3000000000\r\n",
    "mb_negative": b"*-10\r\n" + mb("PING"),
    "bulk_negative": b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$-10\r\n",
    "bulk_huge": b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$2000000000\r\n",
    "bulk_nonnumber": b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$blabla\r\n",
    "bulk_wrong_header": b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n",
    "mb_no_bulk": b"*1\r\nfoo\r\n",
    "nested": b"*1\r\n*1\r\n$1\r\na\r\n",
    "nested_deep": b"*1\r\n" * 1000,
    "integer_arg": b"*1\r\n:1\r\n",
    "bulk_too_long_payload": b"*1\r\n$1\r\nabc\r\n",
    "plus_count": b"*+1\r\n$1\r\na\r\n",
    "trailing_junk": b"*1x\r\n",
    "lf_only_header": b"*1\n$4\nPING\n",
    "cr_no_lf": b"*1\r$4\r\nPING\r\n",
    "long_header": b"*" + b"1" * 40 + b"\r\n",
    "bulk_desync": b"*1\r\n$100000000\r\n" + b"x" * 100,
    "nul_flood": b"\x00" * 4096,
    "nul_inline": b"PING\x00\x00\r\n" + b"\x00" * 100 + b"\r\n",
    "inline_too_long": b"DEDUCT " + b"a" * 3000,
    "inline_quotes": b'set """test-key""" test-value\r\n',
    "inline_unbalanced": b'ECHO "ab\r\n',
    "inline_quote_then_letter": b"PING\r\nECHO 'a'b\r\n",
    "top_level_bulk": b"$4\r\nPING\r\n",
    "resp3_types": b"%1\r\n+a\r\n:1\r\n~1\r\n",
    "bulk_near_limit": mb("ECHO", "y" * 480),
    "header_past_limit": b"*3\r\n$4\r\nECHO\r\n$490\r\n" + b"z" * 490 + b"\r\n$1",
    "many_args": b"*1025\r\n" + b"$1\r\na\r\n" * 1025,
    "many_inline_args": b"a " * 1100 + b"\r\n",
    # What the fuzzer found: a header whose CR is its 32nd byte was awaited
    # for ever, buffering without bound; a frame that could only end past
    # max_request was awaited too.
    "header_cr_at_32": b"*" + b"1" * 30 + b"\r\n" + b"x" * 700,
    "bulk_header_cr_at_32": b"*2\r\n$" + b"1" * 30 + b"\r\n" + b"x" * 700,
    "frame_ends_at_limit": b"*3\r\n$4\r\nECHO\r\n$490\r\n" + b"z" * 490 + b"\r\n$1",
}


def write(name, stream, variants):
    for flags, size, seed in variants:
        data = bytes([flags, size, seed & 0xFF, seed >> 8]) + stream
        digest = hashlib.sha1(data).hexdigest()[:10]
        (OUT / f"{name}-{flags}-{size}-{digest}").write_bytes(data)


def main():
    # Inputs the fuzzer found (found-*) are kept as they are.
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        if not old.name.startswith("found-"):
            old.unlink()
    for name, stream in VALID.items():
        # Open and locked, whole; split byte by byte; in random reads.
        write(name, stream, [(0, 0, 0), (1, 0, 0), (2, 0, 0), (5, 0, 7), (7, 0, 1234)])
    for name, stream in MALFORMED.items():
        write(name, stream, [(0, 0, 0), (3, 0, 0), (4, 0, 99)])
    # A larger request limit for the big ones.
    for name in ("bulk_near_limit", "header_past_limit", "many_args", "inline_too_long"):
        write(name, MALFORMED[name], [(0, 255, 0), (2, 128, 0)])


if __name__ == "__main__":
    main()
