// Connection, errors, the Shard verbs, SandboxClient's slots, environments
// and credentials, against the fake server.

import { test } from "node:test";
import assert from "node:assert/strict";
import { SandboxClient, Shard, ShardError, DEFAULT_SOCKET, environmentFingerprint, isShardError } from "useshards";
import { sleep, withFake } from "./fake.js";

function withEnv<T>(vars: Record<string, string | undefined>, fn: () => Promise<T> | T): Promise<T> {
  const old: Record<string, string | undefined> = {};
  for (const k of Object.keys(vars)) {
    old[k] = process.env[k];
    if (vars[k] === undefined) delete process.env[k];
    else process.env[k] = vars[k];
  }
  return Promise.resolve()
    .then(fn)
    .finally(() => {
      for (const k of Object.keys(old)) {
        if (old[k] === undefined) delete process.env[k];
        else process.env[k] = old[k];
      }
    });
}

test("SHARD_REMOTE and SHARD_API_KEY are read; Authorization: Bearer is sent", () =>
  withFake((f) =>
    withEnv({ SHARD_REMOTE: f.url, SHARD_API_KEY: "shk_test_123" }, async () => {
      const shard = new Shard();
      try {
        assert.equal(shard.remote, f.url);
        await shard.list();
        assert.equal(f.requests.at(-1)!.headers.authorization, "Bearer shk_test_123");
        assert.equal(f.requests.at(-1)!.path, "/v0/sandboxes");
      } finally {
        shard.close();
      }
      const client = new SandboxClient();
      try {
        const sb = await client.sandbox({ image: "img" });
        assert.equal(f.requests.at(-1)!.headers.authorization, "Bearer shk_test_123");
        await sb.close();
      } finally {
        await client.close();
      }
    }),
  ));

test("options override the environment; no key means no Authorization header", () =>
  withFake((f) =>
    withEnv({ SHARD_REMOTE: "http://127.0.0.1:1", SHARD_API_KEY: "from-env" }, async () => {
      const shard = new Shard({ remote: f.url + "/", apiKey: "from-options" });
      await shard.list();
      assert.equal(f.requests.at(-1)!.headers.authorization, "Bearer from-options");
      shard.close();
      await withEnv({ SHARD_API_KEY: undefined }, async () => {
        const s2 = new Shard({ remote: f.url });
        await s2.list();
        assert.equal(f.requests.at(-1)!.headers.authorization, undefined);
        s2.close();
      });
    }),
  ));

test("projects: Shard-Project (options.project, else SHARD_PROJECT) goes with every request, exec streams too", () =>
  withFake((f) =>
    withEnv({ SHARD_PROJECT: "from-env" }, async () => {
      const shard = new Shard({ remote: f.url });
      const client = new SandboxClient({ remote: f.url, project: "from-options" });
      try {
        assert.equal(shard.project, "from-env");
        const sb = await shard.create({ name: "a", image: "img" });
        assert.equal(sb.info.project, "from-env");
        await sb.exec(["true"]);
        await sb.refresh();
        await sb.remove({ force: true });
        const h = await client.sandbox({ image: "img" });
        await h.exec(["true"]);
        await h.close();
        await client.api.createToken({ name: "ci", scopes: ["sandbox:read"] });
        const seen = f.requests.map((r) => `${r.method} ${r.path} ${r.headers["shard-project"]}`);
        const want = (p: string) => (line: string) => line.endsWith(" " + p);
        assert.ok(seen.length >= 8, seen.join("\n"));
        assert.deepEqual(seen.slice(0, 4).filter(want("from-env")), seen.slice(0, 4), seen.join("\n"));
        assert.deepEqual(seen.slice(4).filter(want("from-options")), seen.slice(4), seen.join("\n"));
        assert.ok(seen.some((l) => l.startsWith("POST /v0/sandboxes/") && l.includes("/exec from-env")), seen.join("\n"));
        assert.ok(seen.some((l) => l.startsWith("POST /v0/sandboxes/") && l.includes("/exec from-options")), seen.join("\n"));
      } finally {
        shard.close();
        await client.close();
      }
      await withEnv({ SHARD_PROJECT: undefined }, async () => {
        const s2 = new Shard({ remote: f.url });
        assert.equal(s2.project, "");
        await s2.list();
        assert.equal(f.requests.at(-1)!.headers["shard-project"], undefined);
        s2.close();
      });
    }),
  ));

test("projects: another project's sandbox is not found; list({ allProjects: true }) asks for every project's", () =>
  withFake(async (f) => {
    const a = new Shard({ remote: f.url, project: "team-a" });
    const b = new Shard({ remote: f.url, project: "team-b" });
    try {
      const sa = await a.create({ name: "x", image: "img" });
      await b.create({ name: "y", image: "img" });
      await assert.rejects(b.get(sa.id), (e: unknown) => e instanceof ShardError && e.code === "sandbox_not_found" && e.status === 404);
      assert.deepEqual((await b.list()).map((s) => s.name), ["y"]);
      assert.equal(f.requests.at(-1)!.path, "/v0/sandboxes");
      const all = await b.list({ allProjects: true });
      assert.equal(f.requests.at(-1)!.path, "/v0/sandboxes?all_projects=true");
      assert.deepEqual(all.map((s) => `${s.info.project}/${s.name}`).sort(), ["team-a/x", "team-b/y"]);
      assert.deepEqual(await b.api.listSandboxes({ allProjects: false }).then((l) => l.map((s) => s.name)), ["y"]);
    } finally {
      a.close();
      b.close();
    }
  }));

test("tokens: createToken sends its project; listTokens and revokeToken", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url, apiKey: "k", project: "ops" });
    try {
      const t = await shard.api.createToken({ name: "agent", scopes: ["sandbox:*"], project: "team-a" });
      assert.deepEqual(f.requests.at(-1)!.body, { name: "agent", scopes: ["sandbox:*"], project: "team-a" });
      assert.equal(f.requests.at(-1)!.headers["shard-project"], "ops");
      assert.equal(t.project, "team-a");
      assert.equal(t.key, "shk_a1_x");
      const toks = await shard.api.listTokens();
      assert.deepEqual(toks.map((x) => [x.name, x.project]), [["ci", "*"]]);
      await shard.api.revokeToken("agent");
      assert.equal(f.requests.at(-1)!.method, "DELETE");
      assert.equal(f.requests.at(-1)!.path, "/v0/tokens/agent");
    } finally {
      shard.close();
    }
  }));

test("whoami: Shard, SandboxClient and api.whoami() answer the key's name, project, scopes and all_projects", () =>
  withFake(async (f) => {
    f.whoami = { name: "ci", project: "team-a", scopes: ["sandbox:read", "sandbox:write"], all_projects: false };
    const shard = new Shard({ remote: f.url, apiKey: "shk_ci" });
    const client = new SandboxClient({ remote: f.url, apiKey: "shk_ci" });
    try {
      const me = await shard.whoami();
      assert.deepEqual(me, { name: "ci", project: "team-a", scopes: ["sandbox:read", "sandbox:write"], all_projects: false });
      assert.equal(f.requests.at(-1)!.method, "GET");
      assert.equal(f.requests.at(-1)!.path, "/v0/whoami");
      assert.equal(f.requests.at(-1)!.headers.authorization, "Bearer shk_ci");
      assert.deepEqual(await client.whoami(), me);
      assert.equal(client.slotsInUse, 0);
      f.whoami = { name: "admin", project: "*", scopes: ["*"], all_projects: true };
      const admin = await shard.api.whoami();
      assert.equal(admin.all_projects, true);
      assert.deepEqual([admin.name, admin.project, admin.scopes], ["admin", "*", ["*"]]);
    } finally {
      shard.close();
      await client.close();
    }
  }));

test("projects: setProjectQuota PUTs the quota and answers the project; projects() lists quota and use; past it, quota_exceeded", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url, apiKey: "k", project: "team-a" });
    try {
      const set = await shard.setProjectQuota("team-a", { max_sandboxes: 1, max_memory_bytes: 8 * 2 ** 30 });
      const req = f.requests.at(-1)!;
      assert.deepEqual([req.method, req.path, req.body], ["PUT", "/v0/projects/team-a/quota", { max_sandboxes: 1, max_memory_bytes: 8 * 2 ** 30 }]);
      assert.equal(set.name, "team-a");
      assert.deepEqual(set.quota, { max_sandboxes: 1, max_memory_bytes: 8 * 2 ** 30 });
      assert.equal(set.use.sandboxes, 0);

      await shard.create({ name: "one", image: "img" });
      const [p] = await shard.projects();
      assert.equal(f.requests.at(-1)!.path, "/v0/projects");
      assert.equal(p!.name, "team-a");
      assert.deepEqual(p!.use, { sandboxes: 1, memory_bytes: 512 * 2 ** 20, cpu_millis: 1000, disk_bytes: 10 * 2 ** 30, saved_bytes: 0, ledger_bytes: 0 });
      assert.deepEqual(await shard.api.listProjects(), [p]);

      await assert.rejects(shard.create({ name: "two", image: "img" }), (e: unknown) => {
        assert.ok(e instanceof ShardError);
        assert.deepEqual([e.code, e.status], ["quota_exceeded", 403]);
        assert.match(e.message, /quota of sandboxes is 1: it holds 1/);
        assert.equal(e.requestId, f.requests.at(-1)!.requestId);
        return true;
      });
      // {} removes every bound; a name is one path segment.
      assert.deepEqual((await shard.api.setProjectQuota("team-a", {})).quota, {});
      await shard.create({ name: "two", image: "img" });
      await shard.setProjectQuota("a/b", { max_cpu_millis: 2000 });
      assert.equal(f.requests.at(-1)!.path, "/v0/projects/a%2Fb/quota");

      // Only a key of every project sets quotas; a project's key sees its own project.
      f.whoami = { name: "agent", project: "team-a", scopes: ["*"], all_projects: false };
      await assert.rejects(shard.setProjectQuota("team-a", { max_sandboxes: 5 }), (e: unknown) => isShardError(e, "wrong_project") && e.status === 403);
      assert.deepEqual((await shard.projects()).map((x) => x.name), ["team-a"]);
    } finally {
      shard.close();
    }
  }));

test("insufficient_memory: a create the host's memory cannot admit rejects with ShardError 507", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      f.failWith = { status: 507, code: "insufficient_memory", message: "not enough memory for sandbox big: it asks for 64GiB" };
      await assert.rejects(shard.create({ name: "big", image: "img", memory: "64GiB" }), (e: unknown) => {
        assert.ok(isShardError(e, "insufficient_memory"));
        assert.equal(e.status, 507);
        assert.match(e.message, /not enough memory/);
        return true;
      });
    } finally {
      shard.close();
    }
  }));

test("an error answer's X-Request-Id is the ShardError's requestId; without an answer there is none", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      await assert.rejects(shard.get("nope"), (e: unknown) => {
        assert.ok(e instanceof ShardError);
        assert.equal(e.code, "sandbox_not_found");
        assert.equal(e.requestId, f.requests.at(-1)!.requestId);
        assert.match(e.requestId!, /^fake-\d+$/);
        return true;
      });
      // An answer that is not {code, message} keeps it too.
      f.failWith = { status: 502, raw: "<html>bad gateway</html>" };
      await assert.rejects(shard.list(), (e: unknown) => e instanceof ShardError && e.code === "http_502" && e.requestId === f.requests.at(-1)!.requestId);
    } finally {
      shard.close();
    }
    const gone = new Shard({ remote: "http://127.0.0.1:1" });
    await assert.rejects(gone.list(), (e: unknown) => e instanceof ShardError && e.code === "unreachable" && e.requestId === undefined);
    gone.close();
    await assert.rejects(gone.list(), (e: unknown) => e instanceof ShardError && e.code === "closed" && e.requestId === undefined);
  }));

test("without remote, socket or SHARD_REMOTE the server is its Unix socket, as for the Go client and the Python SDK", () =>
  withEnv({ SHARD_REMOTE: undefined }, () => {
    assert.equal(DEFAULT_SOCKET, "/run/shard/shard.sock");
    const shard = new Shard();
    assert.equal(shard.api.transport.socket, "/run/shard/shard.sock");
    assert.equal(shard.remote, "unix:/run/shard/shard.sock");
    shard.close();
    const tcp = new SandboxClient({ remote: "http://10.0.0.5:7070" });
    assert.equal(tcp.api.transport.socket, undefined);
    assert.equal(tcp.api.transport.base, "http://10.0.0.5:7070");
    void tcp.close();
    const other = new Shard({ socket: "/tmp/other.sock" });
    assert.equal(other.remote, "unix:/tmp/other.sock");
    other.close();
    assert.throws(() => new Shard({ remote: "ftp://x" }), (e: unknown) => e instanceof ShardError && e.code === "invalid_argument");
  }));

test("API errors become ShardError with the server's code, message and status", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      await shard.create({ name: "base", image: "img" });
      await assert.rejects(shard.create({ name: "base", image: "img" }), (e: unknown) => {
        assert.ok(e instanceof ShardError);
        assert.ok(e instanceof Error);
        assert.equal(e.name, "ShardError");
        assert.equal(e.code, "name_taken");
        assert.equal(e.status, 409);
        assert.equal(e.message, "name base is taken");
        return true;
      });
      await assert.rejects(shard.get("nope"), (e: unknown) => e instanceof ShardError && e.code === "sandbox_not_found" && e.status === 404);
      f.failWith = { status: 403, code: "missing_scope", message: "this API key lacks the scope sandbox:write" };
      await assert.rejects(shard.list(), (e: unknown) => e instanceof ShardError && e.code === "missing_scope" && e.status === 403);
      f.failWith = { status: 502, raw: "<html>bad gateway</html>" };
      await assert.rejects(shard.list(), (e: unknown) => e instanceof ShardError && e.code === "http_502" && e.status === 502 && /bad gateway/.test(e.message));
    } finally {
      shard.close();
    }
  }));

test("an unreachable server is ShardError unreachable; a closed client is closed", async () => {
  const shard = new Shard({ remote: "http://127.0.0.1:1" });
  await assert.rejects(shard.list(), (e: unknown) => e instanceof ShardError && e.code === "unreachable" && e.status === 0 && /127\.0\.0\.1:1/.test(e.message));
  shard.close();
  shard.close(); // idempotent
  await assert.rejects(shard.list(), (e: unknown) => e instanceof ShardError && e.code === "closed");
});

test("Shard verbs: create (memoryMiB), get, list, fork, stop, start, refresh, remove", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const base = await shard.create({ name: "base", image: "python:3.12-slim", memoryMiB: 512, cpu: "500m", disk: "1Gi", env: { A: "1" } });
      assert.deepEqual(f.requests.at(-1)!.body, { image: "python:3.12-slim", name: "base", memory_mib: 512, cpu: "500m", disk: "1GiB", env: { A: "1" } });
      assert.equal(base.name, "base");
      assert.equal(base.info.image, "python:3.12-slim");
      const tryA = await base.fork({ name: "try-a" });
      assert.deepEqual(f.requests.at(-1)!.body, { name: "try-a" });
      assert.equal(f.requests.at(-1)!.path, `/v0/sandboxes/${base.id}/fork`);
      assert.equal(tryA.name, "try-a");
      assert.equal(tryA.info.parent_id, base.id);
      assert.equal((await shard.get("try-a")).id, tryA.id);
      assert.equal((await shard.list()).length, 2);
      await base.stop();
      assert.equal(base.state, "stopped");
      await base.start();
      assert.equal((await base.refresh()).state, "running");
      await tryA.remove({ force: true });
      assert.equal(f.requests.at(-1)!.path, `/v0/sandboxes/${tryA.id}?force=true`);
      await assert.rejects(base.remove(), (e: unknown) => e instanceof ShardError && e.code === "sandbox_running");
      await base.remove({ force: true });
      assert.equal(f.sandboxes.size, 0);
    } finally {
      shard.close();
    }
  }));

test("SandboxClient.sandbox: Kubernetes resources become the API's forms", () =>
  withFake(async (f) => {
    const client = new SandboxClient({ remote: f.url });
    try {
      const sb = await client.sandbox({ image: "node:22", resources: { cpu: "1", memory: "512Mi" }, name: "my-job", env: { K: "V" } });
      assert.deepEqual(f.requests.at(-1)!.body, { image: "node:22", cpu: "1", memory: "512MiB", name: "my-job", env: { K: "V" } });
      assert.equal(sb.name, "my-job");
      assert.equal(sb.session, "my-job");
      await sb.close();
      await sb.close(); // idempotent
      assert.equal(f.count("DELETE", `/v0/sandboxes/${sb.id}`), 1);
      assert.ok(sb.closed);
      assert.equal(f.requests.at(-1)!.path, `/v0/sandboxes/${sb.id}?force=true`);
      const gone = await client.sandbox({ image: "img" });
      await client.api.removeSandbox(gone.id, true); // removed behind the handle's back
      await gone.close(); // a 404 is fine: it is gone either way
      assert.equal(client.slotsInUse, 0);
      await assert.rejects(client.sandbox({ image: "x", resources: { memory: "lots" } }), (e: unknown) => e instanceof ShardError && e.code === "invalid_argument");
    } finally {
      await client.close();
    }
  }));

test("maxConcurrency 2: a third sandbox() waits until one handle closes", () =>
  withFake(async (f) => {
    const client = new SandboxClient({ remote: f.url, maxConcurrency: 2 });
    try {
      const a = await client.sandbox({ image: "img", name: "a" });
      const b = await client.sandbox({ image: "img", name: "b" });
      let thirdAt = 0;
      const third = client.sandbox({ image: "img", name: "c" }).then((h) => {
        thirdAt = performance.now();
        return h;
      });
      await sleep(200);
      assert.equal(thirdAt, 0, "the third sandbox must wait");
      assert.equal(f.count("POST", "/v0/sandboxes"), 2, "no third create was sent");
      assert.equal(client.slotsWaiting, 1);
      const closedAt = performance.now();
      await a.close();
      const c = await third;
      assert.ok(thirdAt >= closedAt, "the third came after the close");
      const del = f.requests.findIndex((r) => r.method === "DELETE");
      const create3 = f.requests.findIndex((r) => r.method === "POST" && r.body?.name === "c");
      assert.ok(del >= 0 && create3 > del, "the server saw the delete before the third create");
      assert.equal(client.slotsInUse, 2);
      await Promise.all([b.close(), c.close()]);
      assert.equal(client.slotsInUse, 0);
    } finally {
      await client.close();
    }
  }));

test("maxConcurrency: forks take slots (N forks need N+1), waiters are served first come first served", () =>
  withFake(async (f) => {
    const client = new SandboxClient({ remote: f.url, maxConcurrency: 2 });
    try {
      const sb = await client.sandbox({ image: "img" });
      const f1 = await sb.fork("one");
      const order: string[] = [];
      const f2 = sb.fork("two").then((h) => (order.push("two"), h));
      const s3 = client.sandbox({ image: "img", name: "s3" }).then((h) => (order.push("s3"), h));
      await sleep(150);
      assert.deepEqual(order, []);
      assert.equal(f.count("POST", `/v0/sandboxes/${sb.id}/fork`), 1);
      await f1.close();
      const h2 = await f2;
      await sleep(50);
      assert.deepEqual(order, ["two"], "s3 still waits: the slot went to the first waiter");
      await h2.close();
      const h3 = await s3;
      assert.deepEqual(order, ["two", "s3"]);
      await h3.close();
      await sb.close();
    } finally {
      await client.close();
    }
  }));

test("maxConcurrency: a failed create gives its slot back; close() fails the waiters", () =>
  withFake(async (f) => {
    const client = new SandboxClient({ remote: f.url, maxConcurrency: 1 });
    const other = new Shard({ remote: f.url });
    await other.create({ image: "img", name: "taken" }); // made outside this client
    other.close();
    await assert.rejects(client.sandbox({ image: "img", name: "taken" }), (e: unknown) => e instanceof ShardError && e.code === "name_taken");
    assert.equal(client.slotsInUse, 0, "the failed create gave its slot back");
    const held = await client.sandbox({ image: "img" });
    assert.equal(client.slotsInUse, 1);
    const waiting = client.sandbox({ image: "img" });
    await sleep(50);
    assert.equal(client.slotsWaiting, 1);
    await client.close();
    await assert.rejects(waiting, (e: unknown) => e instanceof ShardError && e.code === "closed");
    assert.equal(f.count("POST", "/v0/sandboxes"), 3);
    void held;
  }));

test("Shard.restoreCheckpoint, and restore and restoreSnapshot, the same call by other names", () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img", name: "src" });
      const ck = await sb.checkpoint({ tag: "t" });
      const a = await shard.restoreCheckpoint(ck, { name: "a" });
      const b = await shard.restore(ck.id, { name: "b" });
      const c = await shard.restoreSnapshot(ck, { name: "c" });
      assert.deepEqual([a.name, b.name, c.name], ["a", "b", "c"]);
      assert.equal(f.count("POST", `/v0/checkpoints/${ck.id}/restore`), 3);
    } finally {
      shard.close();
    }
  }));

test("fork(tag), checkpoint, listCheckpoints, restoreCheckpoint (and its alias restoreSnapshot) and resume", () =>
  withFake(async (f) => {
    const client = new SandboxClient({ remote: f.url });
    try {
      const sb = await client.sandbox({ image: "img", name: "job" });
      const fork = await sb.fork("after-install");
      assert.deepEqual(f.requests.at(-1)!.body, { tag: "after-install", keep_checkpoint: true });
      assert.notEqual(fork.id, sb.id);
      const ck = await sb.checkpoint("t1");
      assert.deepEqual(f.requests.at(-1)!.body, { tag: "t1" });
      const cps = await sb.listCheckpoints();
      assert.deepEqual(
        cps.map((c) => [c.kind, c.tag]),
        [
          ["fork", "after-install"],
          ["checkpoint", "t1"],
        ],
      );
      const restored = await client.restoreCheckpoint(ck, { name: "r" });
      assert.equal(f.requests.at(-1)!.path, `/v0/checkpoints/${ck.id}/restore`);
      assert.deepEqual(f.requests.at(-1)!.body, { name: "r" });
      assert.equal(restored.name, "r");
      const aliased = await client.restoreSnapshot(ck.id, { name: "r2" });
      assert.equal(f.requests.at(-1)!.path, `/v0/checkpoints/${ck.id}/restore`);
      assert.equal(aliased.name, "r2");
      const resumed = await client.resume(sb, { name: "again" });
      assert.equal(f.requests.at(-1)!.path, "/v0/ledger/sessions/job/resume");
      assert.deepEqual(f.requests.at(-1)!.body, { name: "again" });
      assert.equal(resumed.replayed?.length, 1);
      assert.deepEqual(resumed.reapplied, [{ event: "sandbox.secret_granted", secret: "KEY" }]);
      await client.api.removeSession("job");
      assert.equal(f.requests.at(-1)!.method, "DELETE");
      assert.equal(f.requests.at(-1)!.path, "/v0/ledger/sessions/job");
      const byName = await client.resume("job");
      assert.equal(client.sandboxes.length, 6);
      await Promise.all(client.sandboxes.map((h) => h.close()));
      assert.equal(f.sandboxes.size, 0);
      void byName;
    } finally {
      await client.close();
    }
  }));

test("environment: the first sandbox() builds it with the setup callback, later ones start warm", () =>
  withFake(async (f) => {
    const client = new SandboxClient({ remote: f.url, maxConcurrency: 2 });
    try {
      const setupRan: string[] = [];
      const def = {
        image: "python:3.11-slim",
        resources: { cpu: "1", memory: "1Gi" },
        setup: async (sb: import("useshards").SandboxHandle) => {
          setupRan.push(sb.id);
          await sb.exec("pip install -q numpy");
        },
      };
      const env = client.environment("python-base", def);
      assert.equal(env.fingerprint, environmentFingerprint(def));
      assert.match(env.fingerprint, /^[0-9a-f]{64}$/);
      const [sb, sb2] = await Promise.all([env.sandbox(), env.sandbox({ name: "second" })]);
      assert.equal(setupRan.length, 1, "built once");
      const setupCreate = f.requests.find((r) => r.method === "POST" && r.path === "/v0/sandboxes")!;
      assert.deepEqual(setupCreate.body, { image: "python:3.11-slim", cpu: "1", memory: "1GiB" });
      const envPost = f.requests.find((r) => r.path === "/v0/environments")!;
      assert.deepEqual(envPost.body, { name: "python-base", sandbox: setupRan[0], fingerprint: env.fingerprint });
      assert.ok(!f.sandboxes.has(setupRan[0]!), "the setup sandbox was removed");
      const warm = f.requests.filter((r) => r.method === "POST" && r.path === "/v0/sandboxes" && r.body.environment);
      assert.equal(warm.length, 2);
      assert.deepEqual(warm.map((r) => r.body).sort((a, b) => (a.name ?? "").localeCompare(b.name ?? "")), [{ environment: "python-base" }, { environment: "python-base", name: "second" }]);
      assert.equal(env.built, true);
      await Promise.all([sb.close(), sb2.close()]);

      // Same definition, new Environment object: found by fingerprint, not rebuilt.
      const again = client.environment("python-base", def);
      const sb3 = await again.sandbox();
      assert.equal(again.built, false);
      assert.equal(setupRan.length, 1);
      await sb3.close();

      // A changed setup rebuilds.
      const changed = client.environment("python-base", { ...def, setup: async (s: import("useshards").SandboxHandle) => void (await s.exec("pip install -q numpy pandas")) });
      assert.notEqual(changed.fingerprint, env.fingerprint);
      const sb4 = await changed.sandbox();
      assert.equal(changed.built, true);
      await sb4.close();
      await changed.remove();
      assert.equal(f.environments.size, 0);
      assert.equal(client.slotsInUse, 0);
    } finally {
      await client.close();
    }
  }));

test("environment: a failing setup removes its sandbox and rejects; the next call tries again", () =>
  withFake(async (f) => {
    f.onExec = (_a, w) => w.exit(1);
    const client = new SandboxClient({ remote: f.url });
    try {
      const env = client.environment("broken", { image: "img", setup: async (sb) => void (await sb.exec("false")) });
      await assert.rejects(env.sandbox(), (e: unknown) => e instanceof ShardError && e.code === "exit_status");
      assert.equal(f.sandboxes.size, 0);
      f.onExec = (_a, w) => w.exit(0);
      const sb = await env.sandbox();
      await sb.close();
    } finally {
      await client.close();
    }
  }));

test("environment with setup commands: the server runs them", () =>
  withFake(async (f) => {
    const client = new SandboxClient({ remote: f.url });
    try {
      const env = client.environment("py-deps", { image: "img", resources: { memory: "1Gi" }, setup: ["pip install -q requests", ["true"]] });
      const sb = await env.sandbox();
      assert.deepEqual(f.requests.find((r) => r.path === "/v0/environments")!.body, {
        name: "py-deps",
        image: "img",
        memory: "1GiB",
        setup: [["sh", "-c", "pip install -q requests"], ["true"]],
      });
      await sb.close();
    } finally {
      await client.close();
    }
  }));

test("credentials: set stores the secret (base64) and grants it; forks carry it; delete ungrants", () =>
  withFake(async (f) => {
    const client = new SandboxClient({ remote: f.url });
    try {
      const sb = await client.sandbox({ image: "img" });
      await sb.credentials.set("OPENAI_API_KEY", "sk-123");
      const put = f.requests.find((r) => r.method === "PUT")!;
      assert.equal(put.path, "/v0/secrets/OPENAI_API_KEY");
      assert.deepEqual(put.body, { value: Buffer.from("sk-123").toString("base64") });
      assert.deepEqual(f.requests.at(-1)!.body, { secret: "OPENAI_API_KEY", env: "OPENAI_API_KEY" });
      await sb.credentials.set("gh-token", "ghp", { env: "GH_TOKEN" });
      assert.deepEqual(f.requests.at(-1)!.body, { secret: "gh-token", env: "GH_TOKEN" });
      await sb.credentials.set("tls.key", new Uint8Array([1, 2, 3]), { file: "/etc/app/tls.key" });
      assert.deepEqual(f.requests.at(-1)!.body, { secret: "tls.key", file: "/etc/app/tls.key" });
      assert.equal(f.secrets.get("gh-token"), "ghp");
      assert.deepEqual(sb.info.grants.map((g) => g.secret), ["OPENAI_API_KEY", "gh-token", "tls.key"]);
      const fork = await sb.fork();
      assert.equal((await fork.credentials.list()).length, 3);
      await sb.credentials.delete("gh-token");
      assert.equal(f.requests.at(-1)!.path, `/v0/sandboxes/${sb.id}/grants/gh-token`);
      assert.deepEqual((await sb.credentials.list()).map((g) => g.secret), ["OPENAI_API_KEY", "tls.key"]);
      assert.equal((await fork.credentials.list()).length, 3);
      await client.deleteSecret("gh-token");
      assert.equal(f.secrets.has("gh-token"), false);
      await assert.rejects(sb.credentials.set("x", "y", { env: "X", file: "/x" }), (e: unknown) => e instanceof ShardError && e.code === "invalid_argument");
    } finally {
      await client.close({ removeSandboxes: true });
    }
    assert.equal(f.sandboxes.size, 0);
  }));
