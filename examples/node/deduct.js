// DEDUCT and REVERT from Node.js with ioredis, handling every outcome.
//
// Run it against deploy/dev.sh (which seeds demo-1 with 100 units):
//
//     cd examples/node && npm ci
//     node deduct.js demo-1 2 order-4003 ORD-4003
//     node deduct.js --revert demo-1 order-4003
//
// The first takes 2 units for order line order-4003; run it twice and the
// second run is a retry of the same request_id: "already deducted", nothing
// taken again. The second gives them back, as the order service does when
// the payment fails or the order is cancelled; it is safe to repeat, and
// safe even when the DEDUCT's outcome is unknown. tests/clients.rs runs
// this file in CI for every outcome below.
"use strict";

const { parseArgs } = require("node:util");
const Redis = require("ioredis");

const ATTEMPTS = 3;
const RETRY = "retry"; // the outcome is unknown: try again with the SAME request_id

// What an error means, for DEDUCT and REVERT alike: [RETRY, why],
// ["fix the request", why] or ["alert", why].
function fault(redis, err) {
  if (err.message === "Command timed out") {
    // The request may or may not have reached stockgate and Redis.
    // Retrying with the SAME request_id is safe: if the first attempt was
    // applied, the retry answers code 1 and changes nothing. The connection
    // may be stuck, so open a fresh one. (ioredis may also resend the
    // timed-out command on it: same request_id, so safe.)
    redis.disconnect(true);
    return [RETRY, "timed out"];
  }
  // Server error replies (ReplyError) start with their class.
  const kind = err.message.split(" ", 1)[0];
  if (kind === "UPSTREAM" || kind === "BADREPLY") {
    // stockgate could not get a clear answer from Redis; same as a timeout.
    return [RETRY, err.message];
  }
  if (["UNKNOWNSKU", "BADSTOCK", "BADRECORD", "WRONGTYPE"].includes(kind)) {
    // The stock was never loaded, or the data is corrupt: nothing changed,
    // retrying won't help, a human must look.
    return ["alert", err.message];
  }
  if (err.name !== "ReplyError") {
    // Not an answer from stockgate (connection closed, ...): unknown outcome.
    return [RETRY, err.message];
  }
  // ERR ...: wrong arity or the like, a bug in this caller.
  return ["fix the request", err.message];
}

// One DEDUCT: take stock for an order line. Resolves to [what next, why].
async function deductOnce(redis, sku, qty, requestId, orderNo) {
  let reply;
  try {
    reply = await redis.call("DEDUCT", sku, qty, requestId, orderNo);
  } catch (err) {
    const [action, why] = fault(redis, err);
    return [action === "alert" ? "fail the order and alert" : action, why];
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
    case 4:
      // A REVERT of this request_id came first: the order was cancelled.
      // Nothing was deducted, and this id never will be.
      return [
        "stop",
        `this request_id was reverted or revoked (${remain} left); nothing was deducted. ` +
          "If the order must go ahead after all, use a new request_id",
      ];
    default:
      return ["fail the order and alert", `unknown code ${code}: upgrade this client`];
  }
}

// One REVERT: give back what requestId deducted, because the payment failed
// or the order was cancelled. Resolves to [what next, why].
async function revertOnce(redis, sku, requestId) {
  let reply;
  try {
    reply = await redis.call("REVERT", sku, requestId);
  } catch (err) {
    // On "alert" the compensation is not done: keep it pending.
    return fault(redis, err);
  }

  const [code, remain, order] = reply;
  switch (code) {
    case 0:
      // The qty came from stockgate's record of the DEDUCT, not from us.
      return ["compensated", `given back, ${remain} in stock, order_no "${order}"`];
    case 1:
      // An earlier REVERT of this id (a retried or timed-out call) did it.
      return ["compensated", `already done by an earlier attempt, ${remain} in stock, order_no "${order}"`];
    case 4:
      // The DEDUCT never happened (it failed, or never arrived). The id is
      // now revoked, so if that DEDUCT arrives late it takes nothing.
      return [
        "compensated",
        "nothing had been deducted; the request_id is revoked, so a late DEDUCT of it takes nothing",
      ];
    case 3:
      return ["fix the request", reply[4]];
    default:
      return ["alert", `unknown code ${code}: upgrade this client`];
  }
}

async function main() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      host: { type: "string", default: "127.0.0.1" },
      port: { type: "string", default: "6390" },
      timeout: { type: "string", default: "2" }, // seconds to wait for one reply
      revert: { type: "boolean", default: false }, // give back what REQUEST_ID deducted
    },
  });
  const count = positionals.length;
  if (values.revert ? count !== 2 : count < 3 || count > 4) {
    console.error(
      "usage: node deduct.js [--host H] [--port P] [--timeout S] SKU QTY REQUEST_ID [ORDER_NO]\n" +
        "       node deduct.js [--host H] [--port P] [--timeout S] --revert SKU REQUEST_ID",
    );
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

  let once, done, later;
  if (values.revert) {
    const [sku, requestId] = positionals;
    once = () => revertOnce(redis, sku, requestId);
    done = "compensated";
    later = "keep the compensation pending and retry REVERT later with the same request_id";
  } else {
    const [sku, qty, requestId, orderNo = ""] = positionals;
    once = () => deductOnce(redis, sku, qty, requestId, orderNo);
    done = "proceed";
    later = "park the order and retry later with the same request_id";
  }

  let exitCode = 1;
  try {
    for (let attempt = 1; attempt <= ATTEMPTS; attempt++) {
      const [action, why] = await once();
      if (action !== RETRY) {
        console.log(`${action}: ${why}`);
        exitCode = action === done ? 0 : 1;
        return;
      }
      console.log(`attempt ${attempt} of ${ATTEMPTS}: ${why}; retrying with the same request_id`);
      await new Promise((resolve) => setTimeout(resolve, 100 * attempt));
    }
    // Still unknown. Keep it and retry later with the same request_id (within
    // stockgate's --retry-window, 24h by default). To cancel an order whose
    // DEDUCT stays unknown, REVERT it: that settles it either way.
    console.log(`unknown: no answer after ${ATTEMPTS} attempts; ${later}`);
  } finally {
    redis.disconnect();
    process.exitCode = exitCode;
  }
}

main();
