// Files round trips through the TypeScript SDK, for test/integration's
// TestFilesRoundTrips: one job a line on stdin (JSON), one answer a line on
// stdout. The server is $SHARD_REMOTE with $SHARD_API_KEY; the SDK is the
// checkout's build (argv[2], sdk/typescript/dist/index.js).
//
//   {"op": "write", "sandbox", "path", "src", "how", "seed", "max_chunk"}
//       how: file    writeStream(fs.createReadStream(src) with a random highWaterMark)
//            chunks  writeStream(an async generator of random-sized Buffers)
//            reuse   writeStream(a generator handing out one Buffer it refills)
//            bytes   write(all of it)
//   {"op": "read", "sandbox", "path", "dst", "how", "seed", "max_chunk"}
//       how: pipe    pipeline(readStream(...), fs.createWriteStream(dst))
//            iterate for await of readStream(...)
//            whole   read(...)
//   answer: {"ok": true, "bytes": N} or {"ok": false, "error": "..."}

import fs from "node:fs";
import { pipeline } from "node:stream/promises";
import readline from "node:readline";
import { pathToFileURL } from "node:url";

const { Shard } = await import(pathToFileURL(process.argv[2]).href);

// A seeded generator (mulberry32): the same job makes the same pieces.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function* sizes(seed, most) {
  const r = rng(seed);
  for (;;) {
    const top = r() < 0.2 ? most : Math.max(1, Math.floor(most / 64));
    yield 1 + Math.floor(r() * top);
  }
}

// The file's bytes in random-sized pieces: each a new Buffer, or (reused)
// the same one refilled.
async function* pieces(job, reused) {
  const fd = fs.openSync(job.src, "r");
  try {
    for (const n of sizes(job.seed, job.max_chunk)) {
      const b = reused ?? Buffer.alloc(n);
      const k = fs.readSync(fd, b, 0, n, null);
      if (k === 0) return;
      yield b.subarray(0, k);
    }
  } finally {
    fs.closeSync(fd);
  }
}

async function write(shard, job) {
  const f = shard.files(job.sandbox);
  switch (job.how) {
    case "file": {
      const hwm = 1 + Math.floor(rng(job.seed)() * job.max_chunk);
      return (await f.writeStream(job.path, fs.createReadStream(job.src, { highWaterMark: hwm }))).bytes;
    }
    case "bytes":
      return (await f.write(job.path, fs.readFileSync(job.src))).bytes;
    case "chunks":
      return (await f.writeStream(job.path, pieces(job, null))).bytes;
    case "reuse":
      // One buffer for every piece: the SDK must be done with a piece
      // before it asks for the next.
      return (await f.writeStream(job.path, pieces(job, Buffer.alloc(job.max_chunk)))).bytes;
  }
  throw new Error(`write how ${job.how}`);
}

async function read(shard, job) {
  const f = shard.files(job.sandbox);
  switch (job.how) {
    case "whole": {
      const b = await f.read(job.path);
      fs.writeFileSync(job.dst, b);
      return b.length;
    }
    case "pipe": {
      const s = await f.readStream(job.path);
      await pipeline(s, fs.createWriteStream(job.dst));
      return s.bytesRead;
    }
    case "iterate": {
      const s = await f.readStream(job.path);
      const fd = fs.openSync(job.dst, "w");
      let n = 0;
      try {
        for await (const c of s) {
          fs.writeSync(fd, c);
          n += c.length;
        }
      } finally {
        fs.closeSync(fd);
      }
      return n;
    }
  }
  throw new Error(`read how ${job.how}`);
}

const shard = new Shard();
const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (!line.trim()) continue;
  const job = JSON.parse(line);
  let ans;
  try {
    ans = { ok: true, bytes: job.op === "write" ? await write(shard, job) : await read(shard, job) };
  } catch (err) {
    ans = { ok: false, error: `${err?.code ?? ""} ${err?.stack ?? String(err)}` };
  }
  process.stdout.write(JSON.stringify(ans) + "\n");
}
shard.close();
