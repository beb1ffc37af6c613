// Runs DEDUCTs and REVERTs through ioredis or node-redis and prints every
// reply, typed, as JSON.
//
// tests/clients.rs starts a Redis Cluster and stockgate, then runs
//
//     NODE_PATH=<env>/node_modules node driver.js LIBRARY PORT MODE < plan.json
//
// where <env> holds one pinned client installed with `npm ci` from
// tests/clients/node/<name>/. LIBRARY is `ioredis` or `redis` (node-redis).
// plan.json is {"commands": [["DEDUCT", "sku", "3", "req-1", "ORD-1"],
// ["REVERT", "sku", "req-1"], ...]}.
// MODE:
//
// - plain:    the library's default client, one command at a time
//             (ioredis `call`, node-redis `sendCommand`).
// - pipeline: every command at once (an ioredis pipeline; node-redis writes
//             the commands issued in one tick together), replies in order.
//
// Output, one JSON object: {"client", "version", "replies": [reply, ...]}
// where a reply is {"int": n}, {"str": s}, {"null": true}, a list of
// replies, or {"error": message, "class": error class}. The test compares
// them with what stockgate must answer; nothing is judged here.
"use strict";

const [library, port, mode] = process.argv.slice(2);

function typed(value) {
  if (value instanceof Error) {
    return { error: value.message, class: value.constructor.name };
  }
  if (typeof value === "number") return { int: value };
  if (typeof value === "string") return { str: value };
  if (Buffer.isBuffer(value)) return { str: value.toString() };
  if (value === null || value === undefined) return { null: true };
  if (Array.isArray(value)) return value.map(typed);
  throw new TypeError(`unexpected reply ${JSON.stringify(value)}`);
}

async function readPlan() {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  return JSON.parse(input).commands;
}

// Each adapter: connect, run one command, run many at once, close.
const adapters = {
  ioredis: async () => {
    const Redis = require("ioredis");
    const client = new Redis({ host: "127.0.0.1", port: Number(port) });
    return {
      version: require("ioredis/package.json").version,
      one: (command) => client.call(...command),
      all: async (commands) => {
        const pipeline = client.pipeline();
        for (const command of commands) pipeline.call(...command);
        return (await pipeline.exec()).map(([err, reply]) => err || reply);
      },
      close: () => client.quit(),
    };
  },
  redis: async () => {
    const { createClient } = require("redis");
    const client = createClient({ url: `redis://127.0.0.1:${port}` });
    client.on("error", (err) => console.error("client error:", err));
    await client.connect();
    return {
      version: require("redis/package.json").version,
      one: (command) => client.sendCommand(command),
      all: async (commands) =>
        (await Promise.allSettled(commands.map((c) => client.sendCommand(c)))).map((r) =>
          r.status === "fulfilled" ? r.value : r.reason,
        ),
      close: () => client.quit(),
    };
  },
};

async function main() {
  const commands = await readPlan();
  const client = await adapters[library]();
  let replies = [];
  if (mode === "plain") {
    for (const command of commands) {
      try {
        replies.push(typed(await client.one(command)));
      } catch (err) {
        replies.push(typed(err));
      }
    }
  } else if (mode === "pipeline") {
    replies = (await client.all(commands)).map(typed);
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
  await client.close();
  console.log(JSON.stringify({ client: library, version: client.version, replies }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
