// Keys against a real shard server: whoami with a key the test makes (its
// name, project and scopes), and the request id an error answer carries.

import assert from "node:assert/strict";
import { Shard, ShardError } from "useshards";
import { itest, uniq } from "./integration.js";

itest("whoami: a key made by the test is its name, project and scopes; a 404 carries its request id", async () => {
  const shard = new Shard();
  try {
    const made = await shard.api.createToken({ name: `sdkts-whoami-${uniq()}`, scopes: ["sandbox:read"] });
    try {
      const reader = new Shard({ apiKey: made.key });
      try {
        assert.deepEqual(await reader.whoami(), { name: made.name, project: made.project, scopes: ["sandbox:read"], all_projects: false });
      } finally {
        reader.close();
      }
    } finally {
      await shard.api.revokeToken(made.id);
    }
    await assert.rejects(shard.get(`sdkts-none-${uniq()}`), (e: unknown) => {
      assert.ok(e instanceof ShardError && e.code === "sandbox_not_found" && e.status === 404, String(e));
      assert.ok(typeof e.requestId === "string" && e.requestId !== "", `no request id on ${e.code}`);
      return true;
    });
  } finally {
    shard.close();
  }
});
