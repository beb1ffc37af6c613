"""Runs DEDUCTs and REVERTs through redis-py and prints every reply, typed, as JSON.

tests/clients.rs starts a Redis Cluster and stockgate, then runs

    python driver.py PORT MODE < plan.json

with the python of a venv holding one pinned redis-py. plan.json is
{"commands": [["DEDUCT", "sku", "3", "req-1", "ORD-1"],
["REVERT", "sku", "req-1"], ...]}. MODE:

- plain:    redis.Redis(host, port), all defaults; one command at a time.
- pool:     an explicit ConnectionPool with health_check_interval, so the
            pool PINGs a connection that sat idle past the interval before
            reusing it; one command at a time.
- pipeline: every command in one non-transactional pipeline, replies
            collected in order with raise_on_error=False.

With STOCKGATE_TEST_USER and STOCKGATE_TEST_PASSWORD set, the client logs in
as that user (redis-py's username= and password=) in every mode.

Output, one JSON object: {"client", "version", "replies": [reply, ...]}
where a reply is {"int": n}, {"str": s}, {"null": true}, a list of
replies, or {"error": message, "class": exception class}. The test compares
them with what stockgate must answer; nothing is judged here.
"""

import json
import os
import sys
import time

import redis

# Short, so the pool's health check fires between the driver's commands
# without making the test slow.
HEALTH_CHECK_INTERVAL = 0.02


def typed(value):
    if isinstance(value, BaseException):
        return {"error": str(value), "class": type(value).__name__}
    if isinstance(value, bool):
        # redis-py turns some status replies into True; DEDUCT and REVERT never should.
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, bytes):
        return {"str": value.decode()}
    if isinstance(value, str):
        return {"str": value}
    if value is None:
        return {"null": True}
    if isinstance(value, (list, tuple)):
        return [typed(v) for v in value]
    raise TypeError(f"unexpected reply type {type(value).__name__}: {value!r}")


def one_by_one(client, commands, pause=0.0):
    replies = []
    for command in commands:
        if pause:
            time.sleep(pause)
        try:
            replies.append(typed(client.execute_command(*command)))
        except redis.ResponseError as err:
            replies.append(typed(err))
    return replies


def main():
    port, mode = int(sys.argv[1]), sys.argv[2]
    commands = json.load(sys.stdin)["commands"]
    login = {
        "username": os.environ.get("STOCKGATE_TEST_USER"),
        "password": os.environ.get("STOCKGATE_TEST_PASSWORD"),
    }
    if mode == "plain":
        client = redis.Redis(host="127.0.0.1", port=port, **login)
        replies = one_by_one(client, commands)
    elif mode == "pool":
        pool = redis.ConnectionPool(
            host="127.0.0.1", port=port, health_check_interval=HEALTH_CHECK_INTERVAL, **login
        )
        client = redis.Redis(connection_pool=pool)
        replies = one_by_one(client, commands, pause=2 * HEALTH_CHECK_INTERVAL)
    elif mode == "pipeline":
        client = redis.Redis(host="127.0.0.1", port=port, **login)
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        replies = [typed(r) for r in pipe.execute(raise_on_error=False)]
    else:
        raise SystemExit(f"unknown mode {mode}")
    client.close()
    print(json.dumps({"client": "redis-py", "version": redis.__version__, "replies": replies}))


if __name__ == "__main__":
    main()
