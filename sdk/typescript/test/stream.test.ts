// The binary exec stream (docs/exec-stream.md) against the fake server:
// frames cut anywhere, unknown frames, the F frame, the NDJSON fallback, and
// stdin streamed in a framed request body, full duplex.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Readable } from "node:stream";
import { Shard, ShardError, FrameDecoder, encodeFrame } from "useshards";
import { Collector, STREAM, frame, sleep, until, withFake, type ClientFrame } from "./fake.js";

const T = { timeout: 15_000 }; // a client that deadlocks fails, not hangs

test("frames: a header and a payload split over reads, many frames in one read, unknown types ignored", T, () =>
  withFake(async (f) => {
    f.onExec = async (_argv, w) => {
      assert.ok(w.binary);
      const euro = Buffer.from("€");
      const all = Buffer.concat([
        frame("O", "hello "),
        frame("Z", "a frame type of a newer server"),
        frame("O", euro.subarray(0, 2)), // UTF-8 split across frames is kept whole
        frame("O", euro.subarray(2)),
        frame("E", "warn\n"),
        frame("X", JSON.stringify({ exit_code: 3, signal: 9, oom_killed: true })),
      ]);
      // Cut it at every awkward place: inside the first header (2 bytes in),
      // after a header, inside a payload, and the rest in one piece.
      for (const [a, b] of [
        [0, 2],
        [2, 5],
        [5, 8],
        [8, 14],
        [14, all.length],
      ] as const) {
        w.bytes(all.subarray(a, b));
        await sleep(30);
      }
    };
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      const run = sb.exec(["x"]);
      const r = await run;
      assert.deepEqual(r, { stdout: "hello €", stderr: "warn\n", exitCode: 3, signal: 9, oomKilled: true });
      assert.equal(run.pid, 42);
      const ex = f.requests.find((q) => q.path.endsWith("/exec"))!;
      assert.equal(ex.headers.accept, STREAM);
      assert.deepEqual(ex.body, { argv: ["x"] }); // a JSON body: no stdin stream
    } finally {
      shard.close();
    }
  }));

test("frames: FrameDecoder takes frames one byte at a time", () => {
  const wire = Buffer.concat([encodeFrame(0x53, '{"pid":1}'), encodeFrame(0x4f, Buffer.alloc(70_000, 7)), encodeFrame(0x4f), encodeFrame(0x58, "{}")]);
  const dec = new FrameDecoder();
  const got: { type: number; len: number }[] = [];
  for (let i = 0; i < wire.length; i++) for (const fr of dec.push(wire.subarray(i, i + 1))) got.push({ type: fr.type, len: fr.payload.length });
  assert.deepEqual(got, [
    { type: 0x53, len: 9 },
    { type: 0x4f, len: 70_000 },
    { type: 0x4f, len: 0 },
    { type: 0x58, len: 2 },
  ]);
  assert.equal(dec.pending, 0);
  assert.throws(() => new FrameDecoder().push(Buffer.from([0x4f, 0xff, 0, 0, 0])), (e: unknown) => e instanceof ShardError && e.code === "bad_response");
});

test("frames: F is sandbox_unreachable (502) with its message; a cut frame or no X is stream_ended; a too-big frame is bad_response", T, () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      f.onExec = (_a, w) => {
        w.stdout("partial");
        w.error("lost the connection to the sandbox: EOF");
      };
      await assert.rejects(
        sb.exec(["x"]),
        (e: unknown) => e instanceof ShardError && e.code === "sandbox_unreachable" && e.status === 502 && e.message === "lost the connection to the sandbox: EOF",
      );
      f.onExec = (_a, w) => w.bytes(frame("F", "{}"));
      await assert.rejects(sb.exec(["x"]), (e: unknown) => e instanceof ShardError && e.code === "sandbox_unreachable" && /lost/.test(e.message));
      f.onExec = (_a, w) => w.bytes(frame("O", "abcdef").subarray(0, 7));
      await assert.rejects(sb.exec(["x"]), (e: unknown) => e instanceof ShardError && e.code === "stream_ended");
      f.onExec = (_a, w) => w.stdout("x");
      await assert.rejects(sb.exec(["x"]), (e: unknown) => e instanceof ShardError && e.code === "stream_ended");
      f.onExec = (_a, w) => w.bytes(Buffer.from([0x4f, 0x7f, 0, 0, 0]));
      await assert.rejects(sb.exec(["x"]), (e: unknown) => e instanceof ShardError && e.code === "bad_response");
      f.onExec = (_a, w) => w.bytes(frame("X", "not json"));
      await assert.rejects(sb.exec(["x"]), (e: unknown) => e instanceof ShardError && e.code === "bad_response");
      // The client is fine after all that.
      f.onExec = (_a, w) => w.exit(0);
      assert.equal((await sb.exec(["x"])).exitCode, 0);
    } finally {
      shard.close();
    }
  }));

test("NDJSON fallback: an older server's stream is read, its error event too, and stdin streams still work", T, () =>
  withFake(async (f) => {
    f.ndjson = true;
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      f.onExec = (_a, w) => {
        assert.equal(w.binary, false);
        w.stdout("o");
        w.raw(JSON.stringify({ type: "newer_event" }));
        w.stderr("e");
        w.exit(1);
      };
      assert.deepEqual(await sb.exec(["x"]), { stdout: "o", stderr: "e", exitCode: 1 });
      f.onExec = (_a, w) => w.error("agent connection lost");
      await assert.rejects(sb.exec(["x"]), (e: unknown) => e instanceof ShardError && e.code === "sandbox_unreachable" && e.status === 502 && /agent connection lost/.test(e.message));
    } finally {
      shard.close();
    }
  }));

/** The payloads of I frames, and whether the last one was the empty (closing) one. */
function stdinOf(frames: ClientFrame[]): { data: Buffer; sizes: number[]; closed: boolean } {
  const is = frames.filter((x) => x.type === "I");
  const last = is[is.length - 1];
  return { data: Buffer.concat(is.map((x) => x.payload)), sizes: is.map((x) => x.payload.length), closed: last !== undefined && last.payload.length === 0 };
}

test("stdin bytes over 256 KiB go in a framed body: Q without stdin, I frames of 256 KiB, an empty I", T, () =>
  withFake(async (f) => {
    let got = 0;
    f.onExec = async (_a, w) => {
      for await (const fr of w.input) {
        if (fr.type === "I" && fr.payload.length === 0) break;
        got += fr.payload.length;
      }
      w.stdout(`${got}\n`);
      w.exit(0);
    };
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      const big = Buffer.alloc(1_000_000);
      for (let i = 0; i < big.length; i++) big[i] = i % 251;
      const r = await sb.exec(["wc", "-c"], { stdin: big, env: { A: "1" } });
      assert.equal(r.stdout, "1000000\n");
      const ex = f.requests.find((q) => q.path.endsWith("/exec"))!;
      assert.equal(ex.headers["content-type"], STREAM);
      assert.equal(ex.headers["transfer-encoding"], "chunked");
      assert.equal(ex.headers.accept, STREAM);
      assert.deepEqual(ex.body, { argv: ["wc", "-c"], env: { A: "1" } }); // the Q frame: no stdin in it
      assert.equal(ex.frames![0]!.type, "Q");
      const s = stdinOf(ex.frames!);
      assert.ok(s.closed, "stdin closed with an empty I frame");
      assert.deepEqual(s.sizes, [262144, 262144, 262144, 1_000_000 - 3 * 262144, 0]);
      assert.ok(s.data.equals(big));
      // Small stdin still goes base64 in the JSON body, which any server takes.
      await sb.exec(["cat"], { stdin: "hi" });
      const small = f.requests.filter((q) => q.path.endsWith("/exec"))[1]!;
      assert.equal(small.headers["content-type"], "application/json");
      assert.equal(small.body.stdin, Buffer.from("hi").toString("base64"));
    } finally {
      shard.close();
    }
  }));

test("stdin streamed full duplex: each chunk is sent only after the echo of the one before came back", T, () =>
  withFake(async (f) => {
    // The fake echoes each I frame as an O frame as it arrives. The stdin
    // source gives its next chunk only once the last one's echo was read:
    // a client that read the answer only after the whole body was sent
    // would wait forever here.
    f.onExec = async (_a, w) => {
      for await (const fr of w.input) {
        if (fr.type !== "I") continue;
        if (fr.payload.length === 0) break;
        w.stdout(fr.payload);
      }
      w.exit(0);
    };
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      const out = new Collector();
      const waitFor = (text: string) => until(() => out.text.endsWith(text), `the echo of ${JSON.stringify(text)} (half duplex?)`);
      async function* stdin() {
        for (let i = 0; i < 5; i++) {
          yield Buffer.from(`line ${i}\n`);
          await waitFor(`line ${i}\n`);
        }
        yield ""; // an empty chunk is skipped (an empty I frame would close stdin)
        yield "end\n"; // strings are UTF-8
      }
      const r = await sb.exec(["cat"], { stdin: stdin(), stdout: out });
      const want = [0, 1, 2, 3, 4].map((i) => `line ${i}\n`).join("") + "end\n";
      assert.equal(r.stdout, want);
      assert.equal(out.text, want);
      const ex = f.requests.find((q) => q.path.endsWith("/exec"))!;
      assert.equal(ex.headers["content-type"], STREAM);
      assert.deepEqual(stdinOf(ex.frames!).sizes, [7, 7, 7, 7, 7, 4, 0]);
    } finally {
      shard.close();
    }
  }));

test("stdin from a Readable, kill() sends a K frame, and a run without a stream refuses kill()", T, () =>
  withFake(async (f) => {
    f.onExec = async (_a, w) => {
      for await (const fr of w.input) {
        if (fr.type === "I" && fr.payload.length) w.stdout(fr.payload);
        if (fr.type === "K") return w.exit(128 + JSON.parse(fr.payload.toString()).signal, { signal: JSON.parse(fr.payload.toString()).signal });
      }
      w.exit(0);
    };
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      const out = new Collector();
      const run = sb.exec(["sleep", "100"], { stdin: Readable.from([Buffer.from("ab"), Buffer.from("cd")]), stdout: out });
      await until(() => out.text === "abcd", "the echo of stdin");
      assert.equal(run.kill("SIGINT"), true); // after stdin's end: the body stays open for signals
      const r = await run;
      assert.deepEqual(r, { stdout: "abcd", stderr: "", exitCode: 130, signal: 2 });
      assert.equal(run.kill(), false); // it ended
      const ex = f.requests.find((q) => q.path.endsWith("/exec"))!;
      const sent = ex.frames!.filter((x) => !(x.type === "I" && x.payload.length === 0)); // the closing I may come before or after K
      assert.deepEqual(
        sent.map((x) => x.type),
        ["Q", "I", "I", "K"],
      );
      assert.deepEqual(JSON.parse(sent[3]!.payload.toString()), { signal: 2 });

      // [] is no stdin, and still a framed body that kill() can use; a
      // signal asked for before the start goes once it started.
      const run2 = sb.exec(["sleep", "100"], { stdin: [] });
      run2.kill(15);
      assert.equal((await run2).signal, 15);
      assert.throws(() => sb.exec(["x"]).kill(), (e: unknown) => e instanceof ShardError && e.code === "invalid_argument");
      assert.throws(() => run2.kill("SIGNOPE"), (e: unknown) => e instanceof ShardError && e.code === "invalid_argument");
    } finally {
      shard.close();
    }
  }));

test("streamed stdin: an error before the start is the server's JSON error; sandbox_frozen is retried without losing stdin", T, () =>
  withFake(async (f) => {
    f.onExec = async (_a, w) => {
      for await (const fr of w.input) {
        if (fr.type === "I" && !fr.payload.length) break; // cat ends at EOF
        if (fr.type === "I") w.stdout(fr.payload);
      }
      w.exit(0);
    };
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      f.failWith = { status: 409, code: "sandbox_frozen", message: "frozen: run the command again" };
      f.failTimes = 2;
      const r = await sb.exec(["cat"], { stdin: Readable.from(["one ", "two"]) });
      assert.equal(r.stdout, "one two"); // nothing of stdin was spent on the refused tries
      assert.equal(f.count("POST", `/v0/sandboxes/${sb.id}/exec`), 3, "two refused, then the one that ran");
      await sb.stop();
      await assert.rejects(
        sb.exec(["cat"], { stdin: Readable.from(["x"]) }),
        (e: unknown) => e instanceof ShardError && e.code === "sandbox_not_running" && e.status === 409,
      );
    } finally {
      shard.close();
    }
  }));

test("streamed stdin: a source that fails ends the exec with stdin_failed", T, () =>
  withFake(async (f) => {
    f.onExec = async (_a, w) => {
      try {
        for await (const fr of w.input) if (fr.type === "I" && fr.payload.length) w.stdout(fr.payload);
      } catch {
        // the client went away
      }
    };
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      async function* bad() {
        yield Buffer.from("ok");
        await sleep(20);
        throw new Error("disk on fire");
      }
      await assert.rejects(sb.exec(["cat"], { stdin: bad() }), (e: unknown) => e instanceof ShardError && e.code === "stdin_failed" && /disk on fire/.test(e.message));
      await assert.rejects(async () => sb.exec(["cat"], { stdin: 42 as any }), (e: unknown) => e instanceof ShardError && e.code === "invalid_argument");
    } finally {
      shard.close();
    }
  }));
