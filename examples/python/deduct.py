"""DEDUCT from Python with redis-py, handling every outcome.

Run it against deploy/dev.sh (which seeds demo-1 with 100 units):

    python3 -m venv .venv && .venv/bin/pip install -r examples/python/requirements.txt
    .venv/bin/python examples/python/deduct.py demo-1 2 order-1001 ORD-1001

Run it twice: the second run is a retry of the same request_id and answers
"already deducted" without taking stock again. tests/clients.rs runs this
file in CI for every outcome below.
"""

import argparse
import sys
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

ATTEMPTS = 3


RETRY = "retry"  # the outcome is unknown: try again with the SAME request_id


def deduct_once(client, sku, qty, request_id, order_no):
    """One DEDUCT. Returns (what to do next, why)."""
    try:
        reply = client.execute_command("DEDUCT", sku, qty, request_id, order_no)
    except (redis.TimeoutError, redis.ConnectionError) as err:
        # The request may or may not have reached stockgate and Redis.
        # Retrying with the SAME request_id is safe: if the first attempt
        # deducted, the retry answers code 1 and takes nothing.
        return RETRY, "timed out" if isinstance(err, redis.TimeoutError) else str(err)
    except redis.ResponseError as err:
        kind = str(err).split(" ", 1)[0]
        if kind in ("UPSTREAM", "BADREPLY"):
            # stockgate could not get a clear answer from Redis; same as a timeout.
            return RETRY, str(err)
        if kind == "UNKNOWNSKU":
            # The sku's stock was never loaded: nothing changed, but a human must look.
            return "fail the order and alert", str(err)
        if kind in ("BADSTOCK", "BADRECORD", "WRONGTYPE"):
            # Corrupt data in Redis: nothing changed; retrying won't help.
            return "fail the order and alert an operator", str(err)
        # ERR ...: wrong arity or the like, a bug in this caller.
        return "fix the request", str(err)

    # Only the first four elements are fixed; later versions may add more.
    code, remain, order = reply[0], reply[1], reply[2].decode()
    if code == 0:
        return "proceed", f'deducted, {remain} left, order_no "{order}"'
    if code == 1:
        # This request_id was applied before (by a retried or timed-out call):
        # the order goes on with the order_no the first call stored.
        return "proceed", f'already deducted by an earlier attempt, {remain} left, order_no "{order}"'
    if code == 2:
        return "fail the order", f"insufficient stock ({remain} left); nothing was deducted"
    if code == 3:
        # Retrying the same request gives 3 again: fix the caller.
        return "fix the request", reply[4].decode()
    return "fail the order and alert", f"unknown code {code}: upgrade this client"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6390)
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for one reply")
    parser.add_argument("sku")
    parser.add_argument("qty")
    parser.add_argument("request_id", help="one per order line, reused by every retry")
    parser.add_argument("order_no", nargs="?", default="")
    args = parser.parse_args()

    client = redis.Redis(
        host=args.host,
        port=args.port,
        # Longer than stockgate's own --timeout (1s), so stockgate's
        # UPSTREAM answer normally arrives before the client gives up.
        socket_timeout=args.timeout,
        # The loop below owns retries, so each one is visible and bounded.
        # redis-py's own retries would be safe too: they resend the same
        # request_id.
        retry=Retry(NoBackoff(), 0),
    )
    for attempt in range(1, ATTEMPTS + 1):
        action, why = deduct_once(client, args.sku, args.qty, args.request_id, args.order_no)
        if action != RETRY:
            print(f"{action}: {why}")
            sys.exit(0 if action == "proceed" else 1)
        print(f"attempt {attempt} of {ATTEMPTS}: {why}; retrying with the same request_id")
        time.sleep(0.1 * attempt)
    # Still unknown: keep the order pending and retry later with the same
    # request_id (within stockgate's --retry-window, 24h by default).
    print(f"unknown: no answer after {ATTEMPTS} attempts; park the order and retry later with the same request_id")
    sys.exit(1)


if __name__ == "__main__":
    main()
