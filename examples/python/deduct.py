"""DEDUCT and REVERT from Python with redis-py, handling every outcome.

Run it against deploy/dev.sh (which seeds demo-1 with 100 units):

    python3 -m venv target/python-example && target/python-example/bin/pip install -r examples/python/requirements.txt
    target/python-example/bin/python examples/python/deduct.py demo-1 2 order-4002 ORD-4002
    target/python-example/bin/python examples/python/deduct.py --revert demo-1 order-4002

The first takes 2 units for order line order-4002; run it twice and the
second run is a retry of the same request_id: "already deducted", nothing
taken again. The second gives them back, as the order service does when the
payment fails or the order is cancelled; it is safe to repeat, and safe even
when the DEDUCT's outcome is unknown. tests/clients.rs runs this file in CI
for every outcome below.
"""

import argparse
import sys
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

ATTEMPTS = 3

RETRY = "retry"  # the outcome is unknown: try again with the SAME request_id


def fault(err):
    """What an error means, for DEDUCT and REVERT alike: (RETRY, why),
    ("fix the request", why) or ("alert", why)."""
    if isinstance(err, (redis.TimeoutError, redis.ConnectionError)):
        # The request may or may not have reached stockgate and Redis.
        # Retrying with the SAME request_id is safe: if the first attempt was
        # applied, the retry answers code 1 and changes nothing.
        return RETRY, "timed out" if isinstance(err, redis.TimeoutError) else str(err)
    kind = str(err).split(" ", 1)[0]
    if kind in ("UPSTREAM", "BADREPLY"):
        # stockgate could not get a clear answer from Redis; same as a timeout.
        return RETRY, str(err)
    if kind in ("UNKNOWNSKU", "BADSTOCK", "BADRECORD", "WRONGTYPE"):
        # The stock was never loaded, or the data is corrupt: nothing
        # changed, retrying won't help, a human must look.
        return "alert", str(err)
    # ERR ... (redis-py drops the "ERR" word): wrong arity or the like, a bug
    # in this caller.
    return "fix the request", str(err)


def deduct_once(client, sku, qty, request_id, order_no):
    """One DEDUCT: take stock for an order line. Returns (what next, why)."""
    try:
        reply = client.execute_command("DEDUCT", sku, qty, request_id, order_no)
    except redis.RedisError as err:
        action, why = fault(err)
        return ("fail the order and alert" if action == "alert" else action), why

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
    if code == 4:
        # A REVERT of this request_id came first: the order was cancelled.
        # Nothing was deducted, and this id never will be.
        return "stop", (
            f"this request_id was reverted or revoked ({remain} left); nothing was "
            "deducted. If the order must go ahead after all, use a new request_id"
        )
    return "fail the order and alert", f"unknown code {code}: upgrade this client"


def revert_once(client, sku, request_id):
    """One REVERT: give back what request_id deducted, because the payment
    failed or the order was cancelled. Returns (what next, why)."""
    try:
        reply = client.execute_command("REVERT", sku, request_id)
    except redis.RedisError as err:
        # On "alert" the compensation is not done: keep it pending.
        return fault(err)

    code, remain, order = reply[0], reply[1], reply[2].decode()
    if code == 0:
        # The qty came from stockgate's record of the DEDUCT, not from us.
        return "compensated", f'given back, {remain} in stock, order_no "{order}"'
    if code == 1:
        # An earlier REVERT of this id (a retried or timed-out call) did it.
        return "compensated", f'already done by an earlier attempt, {remain} in stock, order_no "{order}"'
    if code == 4:
        # The DEDUCT never happened (it failed, or never arrived). The id is
        # now revoked, so if that DEDUCT arrives late it takes nothing.
        return "compensated", "nothing had been deducted; the request_id is revoked, so a late DEDUCT of it takes nothing"
    if code == 3:
        return "fix the request", reply[4].decode()
    return "alert", f"unknown code {code}: upgrade this client"


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        usage="%(prog)s [options] SKU QTY REQUEST_ID [ORDER_NO]\n"
        "       %(prog)s [options] --revert SKU REQUEST_ID",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6390)
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for one reply")
    parser.add_argument("--revert", action="store_true", help="give back what REQUEST_ID deducted")
    parser.add_argument("words", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not (len(args.words) == 2 if args.revert else len(args.words) in (3, 4)):
        parser.error("wrong number of arguments")

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
    if args.revert:
        sku, request_id = args.words
        once, done = lambda: revert_once(client, sku, request_id), "compensated"
        later = "keep the compensation pending and retry REVERT later with the same request_id"
    else:
        sku, qty, request_id, order_no = (args.words + [""])[:4]
        once, done = lambda: deduct_once(client, sku, qty, request_id, order_no), "proceed"
        later = "park the order and retry later with the same request_id"

    for attempt in range(1, ATTEMPTS + 1):
        action, why = once()
        if action != RETRY:
            print(f"{action}: {why}")
            sys.exit(0 if action == done else 1)
        print(f"attempt {attempt} of {ATTEMPTS}: {why}; retrying with the same request_id")
        time.sleep(0.1 * attempt)
    # Still unknown. Keep it and retry later with the same request_id (within
    # stockgate's --retry-window, 24h by default). To cancel an order whose
    # DEDUCT stays unknown, REVERT it: that settles it either way.
    print(f"unknown: no answer after {ATTEMPTS} attempts; {later}")
    sys.exit(1)


if __name__ == "__main__":
    main()
