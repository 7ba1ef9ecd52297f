// SandboxClient against a real shard server: fork tags in the ledger,
// checkpoint + resume vs restoreCheckpoint, credentials (and forks), live
// streaming, exit codes, and maxConcurrency slots.

import assert from "node:assert/strict";
import { SandboxClient, ShardError } from "useshards";
import { Collector, itest, pythonImage, uniq } from "./integration.js";

const IMAGE = pythonImage("python:3.12-slim");
const SMALL = { cpu: "1", memory: "256Mi" };

itest("fork(tag): listCheckpoints shows the fork's checkpoint with its tag", async () => {
  const client = new SandboxClient();
  try {
    const sb = await client.sandbox({ image: IMAGE, resources: SMALL, name: `ts-tag-${uniq()}` });
    await sb.exec("echo hello > /root/hello");
    const fork = await sb.fork("after-hello");
    assert.notEqual(fork.id, sb.id);
    assert.equal(fork.info.parent_id, sb.id);
    assert.match(fork.session, /^fork-/);
    assert.equal((await fork.exec("cat /root/hello")).stdout, "hello\n");
    const cps = await sb.listCheckpoints();
    const mine = cps.filter((c) => c.kind === "fork" && c.tag === "after-hello");
    assert.equal(mine.length, 1, JSON.stringify(cps));
    assert.equal(mine[0]!.sandbox_id, sb.id);
    // A change in the fork does not reach the source.
    await fork.exec("echo changed > /root/hello");
    assert.equal((await sb.exec("cat /root/hello")).stdout, "hello\n");
  } finally {
    await client.close({ removeSandboxes: true });
  }
});

itest("checkpoint + resume replays a later exec; restoreCheckpoint does not", async () => {
  const client = new SandboxClient();
  try {
    const sb = await client.sandbox({ image: IMAGE, resources: SMALL, name: `ts-resume-${uniq()}` });
    await sb.exec("echo one > /root/a");
    const ck = await sb.checkpoint("before-b");
    assert.equal(ck.kind, "checkpoint");
    assert.equal(ck.tag, "before-b");
    await sb.exec("echo two > /root/b");
    assert.ok((await sb.listCheckpoints()).some((c) => c.id === ck.id));

    const resumed = await client.resume(sb.session);
    assert.ok(
      resumed.replayed?.some((r) => r.argv.join(" ") === "sh -c echo two > /root/b" && r.exit_code === 0),
      JSON.stringify(resumed.replayed),
    );
    assert.equal((await resumed.exec("cat /root/a /root/b")).stdout, "one\ntwo\n");

    const restored = await client.restoreCheckpoint(ck);
    assert.equal((await restored.exec("cat /root/a")).stdout, "one\n");
    await assert.rejects(restored.exec("test -e /root/b"), (e: unknown) => e instanceof ShardError && e.code === "exit_status" && e.exitCode === 1);

    // resume also takes the handle itself
    const again = await client.resume(sb);
    assert.equal((await again.exec("cat /root/b")).stdout, "two\n");
  } finally {
    await client.close({ removeSandboxes: true });
  }
});

itest("credentials.set: the value is in the sandbox's env, and in a fork's", async () => {
  const client = new SandboxClient();
  const secret = `SDK_TS_TOKEN_${uniq()}`.toUpperCase();
  try {
    const sb = await client.sandbox({ image: IMAGE, resources: SMALL });
    await sb.credentials.set(secret, "s3cr3t-value");
    assert.equal((await sb.exec(`printenv ${secret}`)).stdout, "s3cr3t-value\n");
    assert.ok(!JSON.stringify(sb.info).includes("s3cr3t-value"), "the value never comes back");
    await sb.credentials.set(`${secret}_FILE`, "file-value", { file: "/root/secret.txt" });
    assert.equal((await sb.exec("cat /root/secret.txt")).stdout, "file-value");

    const fork = await sb.fork();
    assert.equal((await fork.exec(`printenv ${secret}`)).stdout, "s3cr3t-value\n");
    assert.equal((await fork.exec("cat /root/secret.txt")).stdout, "file-value");

    await sb.credentials.delete(secret);
    await assert.rejects(sb.exec(`printenv ${secret}`), (e: unknown) => e instanceof ShardError && e.exitCode === 1);
    assert.equal((await fork.exec(`printenv ${secret}`)).stdout, "s3cr3t-value\n", "the fork keeps its own grant");
  } finally {
    await client.close({ removeSandboxes: true });
    const c2 = new SandboxClient();
    await c2.deleteSecret(secret).catch(() => {});
    await c2.deleteSecret(`${secret}_FILE`).catch(() => {});
    await c2.close();
  }
});

itest("streaming: pipe() gets output while the command runs; pipe(out, err) keeps them apart; exit codes", async () => {
  const client = new SandboxClient();
  try {
    const sb = await client.sandbox({ image: IMAGE, resources: SMALL });
    const w = new Collector();
    const run = sb.exec("for i in 1 2 3; do echo $i; sleep 0.3; done");
    const res = await run.pipe(w);
    const endedAt = performance.now();
    assert.equal(res.stdout, "1\n2\n3\n");
    assert.equal(w.text, "1\n2\n3\n");
    assert.ok(w.chunks.length >= 3, `pieces: ${JSON.stringify(w.chunks)}`);
    assert.equal(w.chunks[0]!.text, "1\n");
    assert.ok(endedAt - w.chunks[0]!.at > 400, `"1" came ${Math.round(endedAt - w.chunks[0]!.at)} ms before the end`);

    const out = new Collector();
    const err = new Collector();
    const r2 = await sb.exec("echo to-out; echo to-err >&2; sleep 0.2; echo more-out").pipe(out, err);
    assert.equal(out.text, "to-out\nmore-out\n");
    assert.equal(err.text, "to-err\n");
    assert.equal(r2.stderr, "to-err\n");

    await assert.rejects(sb.exec("echo oops >&2; exit 3"), (e: unknown) => {
      assert.ok(e instanceof ShardError);
      assert.equal(e.code, "exit_status");
      assert.equal(e.exitCode, 3);
      assert.equal(e.stderr, "oops\n");
      return true;
    });
    const argv = await sb.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "c"]);
    assert.equal(argv.stdout, "['a b', 'c']\n");
  } finally {
    await client.close({ removeSandboxes: true });
  }
});

itest("maxConcurrency 2: a third sandbox waits until one closes", async () => {
  const client = new SandboxClient({ maxConcurrency: 2 });
  const id = uniq();
  try {
    const a = await client.sandbox({ image: IMAGE, resources: SMALL, name: `ts-slot-a-${id}` });
    const b = await client.sandbox({ image: IMAGE, resources: SMALL, name: `ts-slot-b-${id}` });
    let thirdAt = 0;
    const third = client.sandbox({ image: IMAGE, resources: SMALL, name: `ts-slot-c-${id}` }).then((h) => {
      thirdAt = performance.now();
      return h;
    });
    third.catch(() => {}); // if an assertion below fails first, close() rejects it
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal(thirdAt, 0, "the third sandbox waited");
    await assert.rejects(client.api.getSandbox(`ts-slot-c-${id}`), (e: unknown) => e instanceof ShardError && e.code === "sandbox_not_found");
    const closedAt = performance.now();
    await a.close();
    const c = await third;
    assert.ok(thirdAt > closedAt);
    assert.equal((await c.exec("echo up")).stdout, "up\n");
    await assert.rejects(client.api.getSandbox(`ts-slot-a-${id}`), (e: unknown) => e instanceof ShardError && e.code === "sandbox_not_found");
    // a fork takes a slot too: with b and c live, it waits for one to close
    let forkAt = 0;
    const fork = b.fork().then((h) => ((forkAt = performance.now()), h));
    fork.catch(() => {});
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(forkAt, 0, "the fork waited for a slot");
    await c.close();
    const f = await fork;
    assert.equal((await f.exec("echo forked")).stdout, "forked\n");
  } finally {
    await client.close({ removeSandboxes: true });
  }
});
