// SandboxClient against a real shard server: fork tags in the ledger,
// checkpoint + resume vs restoreCheckpoint, credentials (and forks), live
// streaming, exit codes, maxConcurrency slots, and the fork tree, diffs and
// on-fork hooks.

import assert from "node:assert/strict";
import { SandboxClient, Shard, ShardError, findNode } from "useshards";
import { Collector, itest, pythonImage, uniq } from "./integration.js";
import { until } from "./wait.js";

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
    // The command goes on past "1" only once the test saw "1" at the pipe
    // and wrote /tmp/go: ordering proves the output streamed while the
    // command ran, not a clock. (Its wait is bounded, so a client that held
    // "1" back fails the until below rather than hanging.)
    const run = sb.exec("echo 1; i=0; while [ ! -e /tmp/go ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done; [ -e /tmp/go ] && echo 2 || echo no-go; echo 3");
    const piped = run.pipe(w);
    piped.catch(() => {}); // if the wait below fails first
    await until(() => w.text === "1\n", `"1" at the pipe while the command runs`, 60_000);
    await sb.files.write("/tmp/go", "");
    const res = await piped;
    assert.equal(res.stdout, "1\n2\n3\n");
    assert.equal(w.text, "1\n2\n3\n");
    assert.equal(w.chunks[0]!.text, "1\n");

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

itest("tree, diff and on-fork hooks: a base and two forks; a file one fork wrote is added against the other and its fork point", async () => {
  const client = new SandboxClient();
  const shard = new Shard();
  const id = uniq();
  try {
    const base = await client.sandbox({ image: IMAGE, resources: SMALL, name: `ts-tree-${id}` });
    await base.exec("mkdir -p /app && echo base > /app/notes");
    const a = await base.fork({ name: `ts-tree-a-${id}`, tag: "tree-a" });
    const b = await base.fork({ name: `ts-tree-b-${id}` });

    // The tree of a fork is its lineage: the base as root, a fork checkpoint per fork, the forks under them.
    const root = await a.tree();
    assert.deepEqual([root.kind, root.id, root.name, root.state, root.removed, root.via], ["sandbox", base.id, base.name, "running", false, undefined]);
    assert.ok(!Number.isNaN(Date.parse(root.at)), root.at);
    const cks = (root.children ?? []).filter((c) => c.kind === "checkpoint");
    assert.ok(cks.length === 2 && cks.every((c) => c.via === "fork" && c.state === "kept"), JSON.stringify(root, null, 1));
    assert.ok(cks.some((c) => c.name === "tree-a"), "a checkpoint's name is its tag");
    const forks = cks.flatMap((c) => c.children ?? []);
    assert.deepEqual(forks.map((n) => n.id).sort(), [a.id, b.id].sort());
    for (const n of forks) assert.deepEqual([n.kind, n.via, n.state, n.removed, n.image], ["sandbox", "fork", "running", false, base.info.image]);
    // The project's tree has the lineage too; a tree by name is the same root.
    assert.equal(findNode(await client.tree(), b.id)?.via, "fork");
    assert.equal((await shard.tree(b.name))[0]!.id, base.id);

    // A file written in fork a: added from b to a, and since a's fork point.
    await a.files.write("/app/only-in-a.txt", "hello from a\n");
    const d = await a.diff({ against: b, patch: true });
    assert.deepEqual([d.from.kind, d.from.id, d.from.name, d.to.kind, d.to.id, d.to.name], ["sandbox", b.id, b.name, "sandbox", a.id, a.name]);
    const added = d.changes.find((c) => c.path === "/app/only-in-a.txt");
    assert.ok(added, JSON.stringify(d.changes.map((c) => `${c.kind} ${c.path}`)));
    assert.deepEqual([added.kind, added.type, added.size_a, added.size_b], ["added", "file", 0, 13]);
    assert.match(added.patch ?? "", /^\+hello from a$/m);
    assert.ok(d.added >= 1 && d.truncated === false);
    assert.ok(!d.changes.some((c) => c.path.startsWith("/run/shard") || c.path === "/etc/hostname"), "what the server puts in every sandbox is left out");
    const own = await a.diff();
    assert.equal(own.from.kind, "checkpoint");
    assert.equal(own.to.id, a.id);
    assert.equal(own.changes.find((c) => c.path === "/app/only-in-a.txt")?.kind, "added");
    assert.equal(own.changes.find((c) => c.path === "/app/notes"), undefined, "what a had from its source is no change since its fork");
    const back = await shard.diff(b.name, { against: a.name });
    assert.equal(back.changes.find((c) => c.path === "/app/only-in-a.txt")?.kind, "removed");

    // On-fork hooks: one that fails refuses a fork (nothing is left), unless its errors are ignored.
    await base.files.write("/etc/shard/on-fork.d/50-lease", "#!/bin/sh\necho cannot get a lease >&2\nexit 3\n", { mode: 0o755, parents: true });
    const kept = await base.fork({ name: `ts-tree-kept-${id}`, hookErrors: "ignore", hookTimeout: 20 });
    assert.equal((await kept.exec("echo up")).stdout, "up\n");
    const page = await client.api.transport.json<{ events: { type: string; data?: Record<string, unknown> }[] }>(
      "GET",
      `/ledger/sessions/${encodeURIComponent(kept.session)}/events`,
    );
    const runs = page.events.filter((e) => e.type === "sandbox.fork_hook");
    assert.ok(runs.some((e) => e.data?.hook === "50-lease" && e.data?.exit_code === 3), JSON.stringify(runs));
    await assert.rejects(base.fork({ name: `ts-tree-refused-${id}` }), (e: unknown) => {
      assert.ok(e instanceof ShardError);
      assert.deepEqual([e.code, e.status], ["fork_hook_failed", 422]);
      assert.match(e.message, /50-lease/);
      return true;
    });
    await assert.rejects(client.api.getSandbox(`ts-tree-refused-${id}`), (e: unknown) => e instanceof ShardError && e.code === "sandbox_not_found");
    assert.equal((await base.exec("echo still")).stdout, "still\n", "the source runs on");
  } finally {
    shard.close();
    await client.close({ removeSandboxes: true });
  }
});
