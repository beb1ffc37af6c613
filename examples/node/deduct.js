// DEDUCT from Node.js with ioredis, handling every outcome.
//
// Run it against deploy/dev.sh (which seeds demo-1 with 100 units):
//
//     cd examples/node && npm ci
//     node deduct.js demo-1 2 order-1001 ORD-1001
//
// Run it twice: the second run is a retry of the same request_id and
// answers "already deducted" without taking stock again. tests/clients.rs
// runs this file in CI for every outcome below.
"use strict";

const { parseArgs } = require("node:util");
const Redis = require("ioredis");

const ATTEMPTS = 3;
const RETRY = "retry"; // the outcome is unknown: try again with the SAME request_id

// One DEDUCT. Resolves to [what to do next, why].
async function deductOnce(redis, sku, qty, requestId, orderNo) {
  let reply;
  try {
    reply = await redis.call("DEDUCT", sku, qty, requestId, orderNo);
  } catch (err) {
    if (err.message === "Command timed out") {
      // The request may or may not have reached stockgate and Redis.
      // Retrying with the SAME request_id is safe: if the first attempt
      // deducted, the retry answers code 1 and takes nothing. The
      // connection may be stuck, so open a fresh one. (ioredis may also
      // resend the timed-out command on it: same request_id, so safe.)
      redis.disconnect(true);
      return [RETRY, "timed out"];
    }
    // Server error replies (ReplyError) start with their class.
    const kind = err.message.split(" ", 1)[0];
    if (kind === "UPSTREAM" || kind === "BADREPLY") {
      // stockgate could not get a clear answer from Redis; same as a timeout.
      return [RETRY, err.message];
    }
    if (kind === "UNKNOWNSKU") {
      // The sku's stock was never loaded: nothing changed, but a human must look.
      return ["fail the order and alert", err.message];
    }
    if (kind === "BADSTOCK" || kind === "BADRECORD" || kind === "WRONGTYPE") {
      // Corrupt data in Redis: nothing changed; retrying won't help.
      return ["fail the order and alert an operator", err.message];
    }
    if (err.name !== "ReplyError") {
      // Not an answer from stockgate (connection closed, ...): unknown outcome.
      return [RETRY, err.message];
    }
    // ERR ...: wrong arity or the like, a bug in this caller.
    return ["fix the request", err.message];
  }

  // Only the first four elements are fixed; later versions may add more.
  const [code, remain, order] = reply;
  switch (code) {
    case 0:
      return ["proceed", `deducted, ${remain} left, order_no "${order}"`];
    case 1:
      // This request_id was applied before (by a retried or timed-out
      // call): the order goes on with the order_no the first call stored.
      return ["proceed", `already deducted by an earlier attempt, ${remain} left, order_no "${order}"`];
    case 2:
      return ["fail the order", `insufficient stock (${remain} left); nothing was deducted`];
    case 3:
      // Retrying the same request gives 3 again: fix the caller.
      return ["fix the request", reply[4]];
    default:
      return ["fail the order and alert", `unknown code ${code}: upgrade this client`];
  }
}

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      host: { type: "string", default: "127.0.0.1" },
      port: { type: "string", default: "6390" },
      timeout: { type: "string", default: "2" }, // seconds to wait for one reply
    },
  });
  const [sku, qty, requestId, orderNo = ""] = positionals;
  if (!requestId) {
    console.error("usage: node deduct.js [--host H] [--port P] [--timeout S] SKU QTY REQUEST_ID [ORDER_NO]");
    process.exit(2);
  }

  const redis = new Redis({
    host: values.host,
    port: Number(values.port),
    // Longer than stockgate's own --timeout (1s), so stockgate's UPSTREAM
    // answer normally arrives before the client gives up.
    commandTimeout: Number(values.timeout) * 1000,
  });
  // ioredis reconnects by itself; log connection errors instead of crashing.
  redis.on("error", (err) => console.error(`redis connection: ${err.message}`));
  let exitCode = 1;
  try {
    for (let attempt = 1; attempt <= ATTEMPTS; attempt++) {
      const [action, why] = await deductOnce(redis, sku, qty, requestId, orderNo);
      if (action !== RETRY) {
        console.log(`${action}: ${why}`);
        exitCode = action === "proceed" ? 0 : 1;
        return;
      }
      console.log(`attempt ${attempt} of ${ATTEMPTS}: ${why}; retrying with the same request_id`);
      await new Promise((resolve) => setTimeout(resolve, 100 * attempt));
    }
    // Still unknown: keep the order pending and retry later with the same
    // request_id (within stockgate's --retry-window, 24h by default).
    console.log(
      `unknown: no answer after ${ATTEMPTS} attempts; park the order and retry later with the same request_id`,
    );
  } finally {
    redis.disconnect();
    process.exitCode = exitCode;
  }
}

main();
