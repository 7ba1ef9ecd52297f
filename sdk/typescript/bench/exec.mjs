// Exec round trip through the TypeScript SDK: N execs of ["true"] via
// Sandbox.exec (the Shard form), one after another on one sandbox, after a
// warm-up. Prints one line the Go harness reads:
//
//   BENCH ts-sdk-exec p50 X p90 Y        (milliseconds)
//
// Run after `npm run build`:  node bench/exec.mjs [-n N] [--sandbox ID_OR_NAME]
//
// Environment:
//   SHARD_REMOTE, SHARD_API_KEY   the server (as for the SDK)
//   SHARD_BENCH_SANDBOX           an existing running sandbox (id or name) to use;
//                                 otherwise one is created and removed afterwards from
//   SHARD_BENCH_IMAGE             its image (default: SHARD_TEST_PYTHON_IMAGE, else busybox)
//   SHARD_BENCH_PROVIDER          its provider (default: the server's)
//   SHARD_BENCH_N                 how many execs (default 50; -n wins)

import { parseArgs } from "node:util";
import { Shard } from "../dist/index.js";

const { values: args } = parseArgs({
  options: { n: { type: "string", short: "n" }, sandbox: { type: "string" } },
});
const N = Number(args.n || process.env.SHARD_BENCH_N || 50);
if (!Number.isInteger(N) || N < 1) {
  console.error(`bench: -n wants a whole number ≥ 1, not ${args.n ?? process.env.SHARD_BENCH_N}`);
  process.exit(2);
}
const SANDBOX = args.sandbox || process.env.SHARD_BENCH_SANDBOX;
const WARMUP = 5;

function quantile(sorted, q) {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i];
}

const shard = new Shard();
let created;
try {
  let sb;
  if (SANDBOX) {
    sb = await shard.get(SANDBOX);
  } else {
    const image = process.env.SHARD_BENCH_IMAGE || process.env.SHARD_TEST_PYTHON_IMAGE || "busybox";
    const opts = { image, memoryMiB: 256 };
    if (process.env.SHARD_BENCH_PROVIDER) opts.provider = process.env.SHARD_BENCH_PROVIDER;
    sb = created = await shard.create(opts);
  }
  for (let i = 0; i < WARMUP; i++) {
    const r = await sb.exec(["true"]);
    if (r.exitCode !== 0) throw new Error(`warm-up: true exited ${r.exitCode}: ${r.stderr}`);
  }
  const ms = [];
  for (let i = 0; i < N; i++) {
    const t0 = performance.now();
    const r = await sb.exec(["true"]);
    ms.push(performance.now() - t0);
    if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}: ${r.stderr}`);
  }
  ms.sort((a, b) => a - b);
  const fmt = (x) => x.toFixed(2);
  console.log(`BENCH ts-sdk-exec p50 ${fmt(quantile(ms, 0.5))} p90 ${fmt(quantile(ms, 0.9))}`);
  console.error(`ts-sdk-exec: n=${N} provider=${sb.info.provider} min=${fmt(ms[0])} max=${fmt(ms[ms.length - 1])} ms`);
} finally {
  if (created) await created.remove({ force: true }).catch((e) => console.error("remove:", e.message));
  shard.close();
}
