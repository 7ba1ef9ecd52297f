// Projects against a real shard server: SHARD_TEST_OTHER_PROJECT_KEY, a key
// made for a project that is not SHARD_API_KEY's, cannot see this client's
// sandbox (404), nor name its project (403 wrong_project).

import assert from "node:assert/strict";
import { Shard, ShardError } from "useshards";
import { itest, pythonImage, uniq } from "./integration.js";

itest("projects: a key of another project gets 404 for this project's sandbox", async () => {
  const otherKey = process.env.SHARD_TEST_OTHER_PROJECT_KEY;
  assert.ok(otherKey, "SHARD_INTEGRATION=1 but SHARD_TEST_OTHER_PROJECT_KEY is unset: a key of a project other than SHARD_API_KEY's");
  const shard = new Shard();
  const other = new Shard({ apiKey: otherKey });
  try {
    const sb = await shard.create({ name: `sdkts-proj-${uniq()}`, image: pythonImage("python:3.12-slim"), memoryMiB: 128 });
    try {
      const mine = sb.info.project;
      assert.ok(mine, JSON.stringify(sb.info));
      for (const ref of [sb.id, sb.name]) {
        await assert.rejects(other.get(ref), (e: unknown) => e instanceof ShardError && e.code === "sandbox_not_found" && e.status === 404);
      }
      assert.ok(!(await other.list()).some((s) => s.id === sb.id));
      assert.ok((await shard.list()).some((s) => s.id === sb.id));
      const wrong = new Shard({ apiKey: otherKey, project: mine });
      try {
        await assert.rejects(wrong.list(), (e: unknown) => e instanceof ShardError && e.code === "wrong_project" && e.status === 403);
      } finally {
        wrong.close();
      }
    } finally {
      await sb.remove({ force: true });
    }
  } finally {
    shard.close();
    other.close();
  }
});
