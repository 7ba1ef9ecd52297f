// Throughput of the exec stream through the TypeScript SDK: 100 MiB of
// stdout (`head -c 104857600 /dev/zero`, collected by Sandbox.exec and
// counted as it comes) and 100 MiB of stdin (streamed from an async
// iterable of 256 KiB chunks into `wc -c`). Prints two lines the Go harness
// reads:
//
//   BENCH ts-sdk-stdout-100MiB seconds S MBps R
//   BENCH ts-sdk-stdin-100MiB seconds S MBps R       (MB = 10^6 bytes)
//
// Run after `npm run build`:  node bench/stream.mjs [--sandbox ID_OR_NAME] [--mib N]
//
// Environment: SHARD_REMOTE, SHARD_API_KEY (the server, as for the SDK);
// SHARD_BENCH_SANDBOX (an existing running sandbox; otherwise one is created
// from SHARD_BENCH_IMAGE, default busybox, and removed afterwards).

import { parseArgs } from "node:util";
import { Shard } from "../dist/index.js";

const { values: args } = parseArgs({ options: { sandbox: { type: "string" }, mib: { type: "string" } } });
const MIB = Number(args.mib || 100);
const BYTES = MIB * 1024 * 1024;
const SANDBOX = args.sandbox || process.env.SHARD_BENCH_SANDBOX;

const shard = new Shard();
let created;
const line = (what, secs) => console.log(`BENCH ts-sdk-${what}-${MIB}MiB seconds ${secs.toFixed(3)} MBps ${(BYTES / 1e6 / secs).toFixed(1)}`);
try {
  let sb;
  if (SANDBOX) sb = await shard.get(SANDBOX);
  else sb = created = await shard.create({ image: process.env.SHARD_BENCH_IMAGE || "busybox", memoryMiB: 256 });
  await sb.exec(["true"]); // warm the connection

  let got = 0;
  const counter = { write: (c) => ((got += c.length), true) };
  let t0 = performance.now();
  const out = await sb.exec(["head", "-c", String(BYTES), "/dev/zero"], { stdout: counter });
  const outSecs = (performance.now() - t0) / 1000;
  if (out.exitCode !== 0 || got !== BYTES) throw new Error(`stdout: exit ${out.exitCode}, ${got} bytes of ${BYTES}: ${out.stderr}`);
  line("stdout", outSecs);

  const chunk = Buffer.alloc(256 << 10);
  async function* zeros() {
    for (let sent = 0; sent < BYTES; sent += chunk.length) yield chunk;
  }
  t0 = performance.now();
  const wc = await sb.exec(["wc", "-c"], { stdin: zeros() });
  const inSecs = (performance.now() - t0) / 1000;
  if (wc.exitCode !== 0 || Number(wc.stdout.trim()) !== BYTES) throw new Error(`stdin: exit ${wc.exitCode}, wc said ${wc.stdout.trim()}: ${wc.stderr}`);
  line("stdin", inSecs);
} finally {
  if (created) await created.remove({ force: true }).catch((e) => console.error("remove:", e.message));
  shard.close();
}
