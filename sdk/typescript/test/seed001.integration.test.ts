// Seed 001, "How to fork a sandbox to try two paths?", its TypeScript example
// against a real shard server. The example is verbatim but for:
//   - the image: SHARD_TEST_PYTHON_IMAGE instead of python:3.12-slim (when set),
//   - `env: PY_ENV` on create, so pip reaches SHARD_TEST_PIP_INDEX,
//   - `new Shard()` reads SHARD_REMOTE and SHARD_API_KEY, as the seed says.
// console.log is observed (and still prints) to check what the forks print.

import assert from "node:assert/strict";
import { Shard } from "useshards";
import { itest, pythonImage, PY_ENV, PIP_INDEX, removeLeftovers } from "./integration.js";

itest(
  "seed 001: fork a sandbox to try two paths (TypeScript example)",
  async (t) => {
    await removeLeftovers(["try-a", "try-b", "base"]);
    const printed: string[] = [];
    const log = console.log.bind(console);
    t.mock.method(console, "log", (...args: unknown[]) => {
      printed.push(args.map(String).join(" "));
      log(...args);
    });
    try {
      // ---- seed 001 ----
      const shard = new Shard();
      try {
        const base = await shard.create({ name: "base", image: pythonImage("python:3.12-slim"), memoryMiB: 512, env: PY_ENV });
        await base.exec(["pip", "install", "--quiet", "requests"]);

        const tryA = await base.fork({ name: "try-a" });
        const tryB = await base.fork({ name: "try-b" });
        await tryA.exec(["pip", "install", "--quiet", "requests==2.31.0"]);
        await tryB.exec(["pip", "install", "--quiet", "--upgrade", "requests"]);

        const check = ["python", "-c", "import requests; print(requests.__version__)"];
        console.log((await tryA.exec(check)).stdout);
        console.log((await tryB.exec(check)).stdout);
        await tryA.remove({ force: true });
      } finally {
        shard.close();
      }
      // ---- end of seed 001 ----
    } finally {
      t.mock.restoreAll();
      await removeLeftovers(["try-a", "try-b", "base"]);
    }
    const versions = printed.map((s) => s.trim());
    assert.equal(versions.length, 2, `printed: ${JSON.stringify(printed)}`);
    assert.equal(versions[0], "2.31.0", `try-a printed ${JSON.stringify(printed[0])}`);
    if (PIP_INDEX) assert.equal(versions[1], "2.32.3", `try-b printed ${JSON.stringify(printed[1])}`);
    else assert.match(versions[1]!, /^2\.(3[2-9]|[4-9]\d)\.\d+$/, `try-b printed ${JSON.stringify(printed[1])}`);

  },
  10 * 60_000,
);
