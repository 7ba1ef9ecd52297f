// The fork tree, diffs and the on-fork hook options of a fork, against the
// fake server: the paths and query parameters sent, the types decoded, and
// fork_hook_failed.

import { test } from "node:test";
import assert from "node:assert/strict";
import { SandboxClient, Shard, ShardError, findNode, walkTree, type TreeNode } from "useshards";
import { withFake } from "./fake.js";

const at = "2026-12-02T11:03:38Z";

/** base → fork checkpoint (tag t) → try-a, and try-b that was removed. */
function lineage(base: { id: string }, a: { id: string }, b: { id: string }, ck: string): TreeNode[] {
  const sb = (x: { id: string }, name: string, extra: Partial<TreeNode> = {}): TreeNode => ({
    kind: "sandbox",
    id: x.id,
    name,
    state: "running",
    removed: false,
    at,
    image: "img",
    provider: "gvisor",
    ...extra,
  });
  return [
    sb(base, "base", {
      children: [
        {
          kind: "checkpoint",
          id: ck,
          name: "t",
          state: "kept",
          removed: false,
          at,
          via: "fork",
          children: [sb(a, "try-a", { via: "fork" }), sb(b, "try-b", { via: "fork", state: "removed", removed: true })],
        },
      ],
    }),
    sb({ id: "0000000000ff" }, "alone"),
  ];
}

test("tree: GET /v0/tree (all=true when asked), a sandbox's tree by id or name; TreeNode decoded; walkTree", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const base = await shard.create({ name: "base", image: "img" });
      const a = await base.fork({ name: "try-a", tag: "t" });
      const b = await base.fork({ name: "try-b" });
      f.tree = lineage(base, a, b, "c0ffee000001");

      const roots = await shard.tree();
      assert.equal(f.requests.at(-1)!.path, "/v0/tree");
      assert.deepEqual(roots.map((r) => r.name), ["base", "alone"]);
      const names = [...walkTree(roots)].map((n) => `${n.kind}:${n.name}`);
      assert.deepEqual(names, ["sandbox:base", "checkpoint:t", "sandbox:try-a", "sandbox:alone"], "without all, a removed leaf is left out");

      const all = await shard.tree(undefined, { all: true });
      assert.equal(f.requests.at(-1)!.path, "/v0/tree?all=true");
      const gone = findNode(all, "try-b")!;
      assert.equal(gone.removed, true);
      assert.equal(gone.state, "removed");
      assert.equal(gone.via, "fork");

      const byName = await shard.tree("try-a");
      assert.equal(f.requests.at(-1)!.path, "/v0/sandboxes/try-a/tree");
      assert.equal(byName.length, 1);
      assert.equal(byName[0]!.id, base.id);

      // sandbox.tree(): the one root of its lineage, whole.
      const root = await a.tree({ all: true });
      assert.equal(f.requests.at(-1)!.path, `/v0/sandboxes/${a.id}/tree?all=true`);
      assert.equal(root.id, base.id);
      assert.equal(root.kind, "sandbox");
      assert.equal(root.via, undefined);
      assert.equal(Date.parse(root.at), Date.parse(at));
      const ck = root.children![0]!;
      assert.deepEqual([ck.kind, ck.via, ck.name, ck.state], ["checkpoint", "fork", "t", "kept"]);
      assert.deepEqual(ck.children!.map((c) => c.id), [a.id, b.id]);
      assert.equal((await shard.tree(a)).length, 1);
      assert.equal(f.requests.at(-1)!.path, `/v0/sandboxes/${a.id}/tree`);

      // walkTree and findNode take one node too; each node comes before its children.
      assert.deepEqual([...walkTree(root)].map((n) => n.id), [base.id, "c0ffee000001", a.id, b.id]);
      assert.equal(findNode(root, a.id)?.name, "try-a");
      assert.equal(findNode(roots, "try-b"), undefined);

      f.tree = [];
      await assert.rejects(a.tree(), (e: unknown) => e instanceof ShardError && e.code === "sandbox_not_found" && e.status === 404);
      await assert.rejects(shard.tree("nope"), (e: unknown) => e instanceof ShardError && e.code === "sandbox_not_found");
      assert.deepEqual(await shard.tree(), []);
    } finally {
      shard.close();
    }
  }));

test("diff: against and patch as query parameters; from is against, to the sandbox; Change decoded; different_images", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const base = await shard.create({ name: "base", image: "img" });
      await base.files.write("/app/main.py", "print(1)\n", { parents: true });
      const a = await base.fork({ name: "try-a" });
      const b = await base.fork({ name: "try-b" });
      await a.files.write("/app/only-a.txt", "hello from a\n");
      await b.files.write("/app/main.py", "print(2)\n");

      const d = await a.diff({ against: b });
      assert.equal(f.requests.at(-1)!.path, `/v0/sandboxes/${a.id}/diff?against=${b.id}`);
      assert.deepEqual(d.from, { kind: "sandbox", id: b.id, name: "try-b" });
      assert.deepEqual(d.to, { kind: "sandbox", id: a.id, name: "try-a" });
      assert.deepEqual(
        d.changes.map((c) => [c.path, c.kind, c.type, c.size_a, c.size_b, c.what ?? null, c.patch ?? null]),
        [
          ["/app/main.py", "changed", "file", 9, 9, ["content"], null],
          ["/app/only-a.txt", "added", "file", 0, 13, null, null],
        ],
      );
      assert.deepEqual([d.added, d.removed, d.changed, d.truncated], [1, 0, 1, false]);

      // The other way round, by name, with patches.
      const back = await shard.diff("try-b", { against: "try-a", patch: true });
      assert.equal(f.requests.at(-1)!.path, "/v0/sandboxes/try-b/diff?against=try-a&patch=true");
      const gone = back.changes.find((c) => c.path === "/app/only-a.txt")!;
      assert.equal(gone.kind, "removed");
      assert.match(gone.patch!, /^-hello from a$/m);

      // Without against: since it started (its fork's checkpoint).
      const own = await a.diff();
      assert.equal(f.requests.at(-1)!.path, `/v0/sandboxes/${a.id}/diff`);
      assert.equal(own.from.kind, "checkpoint");
      assert.deepEqual(own.changes.map((c) => `${c.kind} ${c.path}`), ["added /app/only-a.txt"]);
      await a.diff({ patch: true });
      assert.equal(f.requests.at(-1)!.path, `/v0/sandboxes/${a.id}/diff?patch=true`);

      const other = await shard.create({ name: "other", image: "busybox" });
      await assert.rejects(other.diff({ against: "try-a" }), (e: unknown) => e instanceof ShardError && e.code === "different_images" && e.status === 400);
      await assert.rejects(shard.diff("nope"), (e: unknown) => e instanceof ShardError && e.code === "sandbox_not_found" && e.status === 404);
    } finally {
      shard.close();
    }
  }));

test("fork hook options on the wire (hookTimeout seconds or a duration); a failing hook is fork_hook_failed (422) unless ignored", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const base = await shard.create({ name: "base", image: "img" });
      await base.files.write("/etc/shard/on-fork.d/50-lease", "#!/bin/sh\necho no lease >&2\nexit 3\n", { mode: 0o755, parents: true });
      await assert.rejects(base.fork({ name: "refused" }), (e: unknown) => {
        assert.ok(e instanceof ShardError);
        assert.equal(e.code, "fork_hook_failed");
        assert.equal(e.status, 422);
        assert.match(e.message, /50-lease/);
        return true;
      });
      assert.deepEqual(f.requests.at(-1)!.body, { name: "refused" });
      await assert.rejects(shard.get("refused"), (e: unknown) => e instanceof ShardError && e.code === "sandbox_not_found");

      const kept = await base.fork({ name: "kept", hookErrors: "ignore", hookTimeout: 1.5, hooksInSource: true });
      assert.equal(kept.name, "kept");
      assert.deepEqual(f.requests.at(-1)!.body, { name: "kept", hook_timeout: "1.5s", hook_errors: "ignore", hooks_in_source: true });
      await base.fork({ name: "k2", hookErrors: "ignore", hookTimeout: "2m", hooksInSource: false });
      assert.deepEqual(f.requests.at(-1)!.body, { name: "k2", hook_timeout: "2m", hook_errors: "ignore" });

      // A bad timeout fails before anything is sent; a bad hookErrors is the server's 400.
      const sent = f.requests.length;
      await assert.rejects(base.fork({ hookTimeout: 0 }), (e: unknown) => e instanceof ShardError && e.code === "invalid_argument");
      assert.equal(f.requests.length, sent);
      await assert.rejects(base.fork({ hookErrors: "maybe" as "fail" }), (e: unknown) => e instanceof ShardError && e.code === "invalid_argument" && e.status === 400);

      // SandboxClient: the same options, and a refused fork gives its slot back.
      const client = new SandboxClient({ remote: f.url, maxConcurrency: 2 });
      try {
        const h = await client.attach("base");
        await assert.rejects(h.fork({ name: "refused-2" }), (e: unknown) => e instanceof ShardError && e.code === "fork_hook_failed");
        assert.equal(client.slotsInUse, 1);
        const hk = await h.fork({ tag: "t", name: "kept-2", hookErrors: "ignore", hookTimeout: 30 });
        assert.deepEqual(f.requests.at(-1)!.body, { name: "kept-2", tag: "t", hook_timeout: "30s", hook_errors: "ignore", keep_checkpoint: true });
        assert.equal(client.slotsInUse, 2);
        await hk.close();
        await h.files.remove("/etc/shard/on-fork.d/50-lease");
        await h.fork("just-a-tag").then((x) => x.close());
        assert.deepEqual(f.requests.filter((r) => r.method === "POST" && r.path.endsWith("/fork")).at(-1)!.body, { tag: "just-a-tag", keep_checkpoint: true });
      } finally {
        await client.close();
      }
    } finally {
      shard.close();
    }
  }));

test("SandboxClient: client.tree, client.diff, handle.tree and handle.diff take no slot", () =>
  withFake(async (f) => {
    const client = new SandboxClient({ remote: f.url, maxConcurrency: 2 });
    try {
      const base = await client.sandbox({ image: "img", name: "base" });
      const fork = await base.fork({ name: "try-a" });
      assert.equal(client.slotsInUse, 2);
      f.tree = lineage(base, fork, { id: "0000000000bb" }, "c0ffee000002");
      const roots = await client.tree();
      assert.equal(f.requests.at(-1)!.path, "/v0/tree");
      assert.equal(roots.length, 2);
      assert.equal((await client.tree(fork, { all: true }))[0]!.id, base.id);
      assert.equal(f.requests.at(-1)!.path, `/v0/sandboxes/${fork.id}/tree?all=true`);
      assert.equal((await fork.tree()).id, base.id);
      await fork.files.write("/tmp/x", "x");
      const d = await fork.diff({ against: base, patch: true });
      assert.equal(f.requests.at(-1)!.path, `/v0/sandboxes/${fork.id}/diff?against=${base.id}&patch=true`);
      assert.deepEqual(d.changes.map((c) => `${c.kind} ${c.path}`), ["added /tmp/x"]);
      assert.equal((await client.diff("try-a")).from.kind, "checkpoint");
      assert.equal(f.requests.at(-1)!.path, "/v0/sandboxes/try-a/diff");
      assert.equal(client.slotsInUse, 2);
    } finally {
      await client.close({ removeSandboxes: true });
    }
  }));
