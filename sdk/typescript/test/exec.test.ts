// Exec against the fake server: the binary exec stream by default, NDJSON
// where the fake plays an older server (f.ndjson). More on the binary
// stream and streamed stdin in stream.test.ts.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { SandboxClient, Shard, ShardError } from "useshards";
import { Collector, sleep, until, withFake } from "./fake.js";

test("exec NDJSON (an older server): stdout and stderr collected apart, base64 decoded, UTF-8 kept whole", () =>
  withFake(async (f) => {
    f.ndjson = true;
    f.onExec = (argv, w) => {
      const euro = Buffer.from("€"); // 3 bytes, split across two events
      w.stdout("a\n");
      w.raw(JSON.stringify({ type: "stdout", data: euro.subarray(0, 1).toString("base64") }));
      w.raw(JSON.stringify({ type: "stdout", data: euro.subarray(1).toString("base64") }));
      w.stderr("warn\n");
      w.raw(""); // blank lines are skipped
      w.raw(JSON.stringify({ type: "something_new" }));
      w.exit(0);
    };
    const shard = new Shard({ remote: f.url, apiKey: "k" });
    try {
      const sb = await shard.create({ name: "base", image: "python:3.12-slim", memoryMiB: 512 });
      const r = await sb.exec(["python", "-c", "print(1)"]);
      assert.deepEqual(r, { stdout: "a\n€", stderr: "warn\n", exitCode: 0 });
      const ex = f.requests.find((q) => q.path.endsWith("/exec"))!;
      assert.deepEqual(ex.body, { argv: ["python", "-c", "print(1)"] });
      assert.equal(ex.path, `/v0/sandboxes/${sb.id}/exec`);
      assert.equal(ex.headers.accept, "application/vnd.shard.stream"); // asked for, and NDJSON came
      assert.equal(ex.headers["content-type"], "application/json");
    } finally {
      shard.close();
    }
  }));

test("exec streams: pipe() gets output before the exit line is even sent", () =>
  withFake(async (f) => {
    const out = new Collector();
    let atExit = "";
    let late: unknown;
    f.onExec = async (_argv, w) => {
      // Each piece goes only once the one before reached the pipe, and the
      // exit once all did: proven by ordering, not by a clock. A client that
      // held output back until the exit fails the wait (and the test).
      try {
        for (const i of [1, 2, 3]) {
          w.stdout(`${i}\n`);
          await until(() => out.text.endsWith(`${i}\n`), `"${i}" at the pipe before the exit is sent`);
        }
        w.stderr("done\n");
        await until(() => out.text.endsWith("done\n"), `"done" at the pipe before the exit is sent`);
      } catch (e) {
        late = e;
      }
      atExit = out.text;
      w.exit(0);
    };
    const client = new SandboxClient({ remote: f.url });
    try {
      const sb = await client.sandbox({ image: "node:22", resources: { cpu: "1", memory: "512Mi" }, name: "my-job" });
      const r = await sb.exec("for i in 1 2 3; do echo $i; sleep 0.15; done").pipe(out);
      assert.ifError(late);
      assert.equal(atExit, "1\n2\n3\ndone\n", "all the output was at the pipe before the exit was sent");
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout, "1\n2\n3\n");
      assert.equal(r.stderr, "done\n");
      assert.equal(out.text, "1\n2\n3\ndone\n"); // stdout and stderr both to one writable
      assert.deepEqual(
        out.chunks.map((c) => c.text),
        ["1\n", "2\n", "3\n", "done\n"],
      );
      const ex = f.requests.find((q) => q.path.endsWith("/exec"))!;
      assert.deepEqual(ex.body.argv, ["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.15; done"]);
      await sb.close();
    } finally {
      await client.close();
    }
  }));

test("exec pipe(out, err) keeps stderr apart; a stream.Writable works as the sink", () =>
  withFake(async (f) => {
    f.onExec = async (_argv, w) => {
      w.stdout("o1\n");
      w.stderr("e1\n");
      await sleep(20);
      w.stdout("o2\n");
      w.exit(0);
    };
    const client = new SandboxClient({ remote: f.url });
    try {
      const sb = await client.sandbox({ image: "img" });
      const out = new Collector();
      const errChunks: string[] = [];
      const err = new Writable({
        write(chunk, _enc, cb) {
          errChunks.push(String(chunk));
          cb();
        },
      });
      await sb.exec("x").pipe(out, err);
      assert.equal(out.text, "o1\no2\n");
      assert.deepEqual(errChunks, ["e1\n"]);
    } finally {
      await client.close({ removeSandboxes: true });
    }
  }));

test("exec: a pipe attached late first gets what already came", () =>
  withFake(async (f) => {
    let attached!: () => void;
    const pipeAttached = new Promise<void>((r) => (attached = r));
    f.onExec = async (_argv, w) => {
      w.stdout("early\n");
      await pipeAttached; // "late" only once the late pipe is there
      w.stdout("late\n");
      w.exit(0);
    };
    const client = new SandboxClient({ remote: f.url });
    try {
      const sb = await client.sandbox({ image: "img" });
      const first = new Collector(); // a pipe from the start shows when "early" came
      const run = sb.exec("x");
      void run.pipe(first);
      await until(() => first.text === "early\n", `"early" at the client`);
      const out = new Collector();
      const piped = run.pipe(out);
      attached();
      await piped;
      assert.equal(out.text, "early\nlate\n");
      assert.equal(first.text, "early\nlate\n");
    } finally {
      await client.close({ removeSandboxes: true });
    }
  }));

test("exec: a non-zero exit rejects with exit_status, exitCode, stdout and stderr (SandboxHandle)", () =>
  withFake(async (f) => {
    f.onExec = (_argv, w) => {
      w.stdout("partial\n");
      w.stderr("npm ERR! boom\n");
      w.exit(3);
    };
    const client = new SandboxClient({ remote: f.url });
    try {
      const sb = await client.sandbox({ image: "img" });
      await assert.rejects(sb.exec("npm ci"), (e: unknown) => {
        assert.ok(e instanceof ShardError);
        assert.equal(e.code, "exit_status");
        assert.equal(e.exitCode, 3);
        assert.equal(e.stdout, "partial\n");
        assert.equal(e.stderr, "npm ERR! boom\n");
        assert.match(e.message, /npm ci.*exited 3.*boom/);
        return true;
      });
      const out = new Collector();
      await assert.rejects(sb.exec("npm ci").pipe(out), (e: unknown) => e instanceof ShardError && e.exitCode === 3);
      assert.equal(out.text, "partial\nnpm ERR! boom\n");
      // .then/.catch/.finally chain like a promise
      const code = await sb.exec("npm ci").then(
        () => 0,
        (e: ShardError) => e.exitCode,
      );
      assert.equal(code, 3);
      let fin = false;
      await sb
        .exec("npm ci")
        .finally(() => (fin = true))
        .catch(() => {});
      assert.ok(fin);
    } finally {
      await client.close({ removeSandboxes: true });
    }
  }));

test("exec: Shard's form resolves whatever the exit code; signal and timeout are reported", () =>
  withFake(async (f) => {
    f.onExec = (_argv, w) => w.exit(137, { signal: 9, timed_out: true });
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      const r = await sb.exec(["sleep", "100"], { timeout: 1 });
      assert.deepEqual(r, { stdout: "", stderr: "", exitCode: 137, signal: 9, timedOut: true });
      assert.equal(f.requests.find((q) => q.path.endsWith("/exec"))!.body.timeout, 1);
    } finally {
      shard.close();
    }
  }));

test("exec options reach the request: env, workdir, user, stdin as base64", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      await sb.exec(["cat"], { env: { A: "1" }, workdir: "/tmp", user: "nobody", stdin: "hello\n", timeout: "30s" });
      assert.deepEqual(f.requests.find((q) => q.path.endsWith("/exec"))!.body, {
        argv: ["cat"],
        env: { A: "1" },
        workdir: "/tmp",
        user: "nobody",
        timeout: "30s",
        stdin: Buffer.from("hello\n").toString("base64"),
      });
    } finally {
      shard.close();
    }
  }));

test("exec: an error event, a stream cut short, and an error answer", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      f.onExec = (_a, w) => w.error("agent connection lost");
      await assert.rejects(sb.exec(["x"]), (e: unknown) => e instanceof ShardError && e.code === "sandbox_unreachable" && e.status === 502 && /agent connection lost/.test(e.message));
      f.onExec = (_a, w) => w.stdout("x");
      await assert.rejects(sb.exec(["x"]), (e: unknown) => e instanceof ShardError && e.code === "stream_ended");
      await sb.stop();
      await assert.rejects(sb.exec(["x"]), (e: unknown) => e instanceof ShardError && e.code === "sandbox_not_running" && e.status === 409);
      await assert.rejects(
        async () => sb.exec([]),
        (e: unknown) => e instanceof ShardError && e.code === "invalid_argument",
      );
    } finally {
      shard.close();
    }
  }));

test("exec: 409 sandbox_frozen (a fork holds the sandbox) is retried", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      f.failWith = { status: 409, code: "sandbox_frozen", message: "a fork holds the sandbox frozen, and nothing starts in it until that ends: run the command again" };
      f.failTimes = 2;
      const r = await sb.exec(["echo", "hi"]);
      assert.equal(r.stdout, "echo hi\n");
      assert.equal(f.count("POST", `/v0/sandboxes/${sb.id}/exec`), 3, "two refused, then the one that ran");
    } finally {
      shard.close();
    }
  }));
