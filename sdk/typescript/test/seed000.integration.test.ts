// Seed 000, "Forking sandboxes": its "Basic usage" and "Branching
// experiments" examples against a real shard server, as close to verbatim
// as they can run here. What differs, and why:
//   - `client` is `new SandboxClient()` (SHARD_REMOTE, SHARD_API_KEY).
//   - node:22 → SHARD_TEST_NODE_IMAGE, python:3.11-slim → SHARD_TEST_PYTHON_IMAGE (when set).
//   - The node sandbox gets `env: NODE_ENV` and, when npm here has a CA bundle
//     configured (a TLS-inspecting egress), a copy of it, so npm in it trusts
//     the same registry certificate (see HOST_NPM_CA).
//   - Basic usage: the seed runs `npm ci` in a project it already has; here a
//     tiny project is written to /root/app first (not in the seed), and each
//     exec string is prefixed with `cd /root/app && `.
//   - `process.stdout` → `out`, a writable that collects, so the output can be
//     checked (assertion messages show it).
//   - Branching: the environment gets `env: PY_ENV` (PIP_INDEX_URL), and torch
//     comes from `--index-url ${SHARD_TEST_PIP_INDEX}` instead of
//     https://download.pytorch.org/whl/cpu when that index is given.

import assert from "node:assert/strict";
import { SandboxClient } from "useshards";
import { Collector, HOST_NPM_CA, itest, NODE_CA_FILE, NODE_ENV, NODE_IMAGE, pythonImage, PY_ENV, PIP_INDEX, removeLeftovers } from "./integration.js";

const PACKAGE_JSON = JSON.stringify(
  {
    name: "app",
    version: "1.0.0",
    private: true,
    scripts: {
      test: `node -e "console.log('tests ok')"`,
      build: `node -e "console.log('built')"`,
    },
    dependencies: { ms: "2.1.3" },
  },
  null,
  2,
);

// Written by the test (no registry host in it: npm ci resolves ms@2.1.3 from
// the sandbox's configured registry and checks this integrity).
const PACKAGE_LOCK = JSON.stringify(
  {
    name: "app",
    version: "1.0.0",
    lockfileVersion: 3,
    requires: true,
    packages: {
      "": { name: "app", version: "1.0.0", dependencies: { ms: "2.1.3" } },
      "node_modules/ms": {
        version: "2.1.3",
        integrity: "sha512-6FlzubTLZG3J2a/NVCAleEhjzq5oxgHyaCU9yYXvcLsvoVaHJq/s5xXI6/XXP6tz7R9xAOtHnSO/tXtF3WRTlA==",
        license: "MIT",
      },
    },
  },
  null,
  2,
);

itest(
  "seed 000: basic usage (fork after npm ci, npm test and npm run build in parallel)",
  async () => {
    await removeLeftovers(["my-job"]);
    const client = new SandboxClient();
    const out = new Collector();
    try {
      // ---- seed 000, Basic usage ----
      const sb = await client.sandbox({
        image: NODE_IMAGE,
        resources: { cpu: "1", memory: "512Mi" },
        name: "my-job",
        env: NODE_ENV, // not in the seed: npm's CA bundle, see HOST_NPM_CA
      });

      try {
        // Not in the seed: the project it works on (and this machine's CA bundle for npm).
        if (HOST_NPM_CA) await sb.exec(`cat > ${NODE_CA_FILE}`, { stdin: HOST_NPM_CA });
        await sb.exec("mkdir -p /root/app && cat > /root/app/package.json", { stdin: PACKAGE_JSON });
        await sb.exec("cat > /root/app/package-lock.json", { stdin: PACKAGE_LOCK });

        await sb.exec("cd /root/app && npm ci");

        const fork = await sb.fork("after-install");
        try {
          // Run different workloads in parallel on the same base state
          await Promise.all([
            sb.exec("cd /root/app && npm test").pipe(out),
            fork.exec("cd /root/app && npm run build").pipe(out),
          ]);
        } finally {
          await fork.close();
        }
      } finally {
        await sb.close();
      }
      // ---- end of Basic usage ----
    } finally {
      await client.close({ removeSandboxes: true });
    }
    assert.match(out.text, /tests ok/, out.text);
    assert.match(out.text, /built/, out.text);
    assert.match(out.text, /> app@1\.0\.0 test/, out.text);
    assert.match(out.text, /> app@1\.0\.0 build/, out.text);
  },
  10 * 60_000,
);

itest(
  "seed 000: branching experiments (environment, two tagged forks, pandas and torch)",
  async () => {
    const client = new SandboxClient();
    const out = new Collector();
    // Where torch comes from: the local test index when given (instead of
    // https://download.pytorch.org/whl/cpu, which a test machine may not reach).
    const torchIndex = PIP_INDEX || "https://download.pytorch.org/whl/cpu";
    // ---- seed 000, Branching experiments ----
    const env = client.environment("python-base", {
      image: pythonImage("python:3.11-slim"),
      resources: { cpu: "1", memory: "1Gi" },
      env: PY_ENV, // not in the seed: pip's index
      setup: async (sb) => {
        await sb.exec("pip install -q numpy");
      },
    });

    try {
      const sb = await env.sandbox();
      try {
        // Fork into two independent experiment tracks
        const [forkA, forkB] = await Promise.all([sb.fork("track-a"), sb.fork("track-b")]);

        await Promise.all([
          forkA
            .exec("pip install -q pandas")
            .then(() => forkA.exec("python3 -c 'import pandas; print(pandas.__version__)'").pipe(out))
            .finally(() => forkA.close()),

          forkB
            .exec(`pip install -q torch --index-url ${torchIndex}`)
            .then(() => forkB.exec("python3 -c 'import torch; print(torch.__version__)'").pipe(out))
            .finally(() => forkB.close()),
        ]);

        // Not in the seed: numpy from the setup is in the warm sandbox, and the
        // fork's checkpoints carry their tags.
        assert.match((await sb.exec("python3 -c 'import numpy; print(numpy.__version__)'")).stdout, PIP_INDEX ? /^1\.26\.4\s*$/ : /^\d+\.\d+/);
        const tags = (await sb.listCheckpoints()).filter((c) => c.kind === "fork").map((c) => c.tag);
        assert.deepEqual(tags.sort(), ["track-a", "track-b"]);
      } finally {
        await sb.close();
      }
      // ---- end of Branching experiments ----
    } finally {
      await env.remove().catch(() => {});
      await client.close({ removeSandboxes: true });
    }
    assert.equal(client.sandboxes.length, 0);
    if (PIP_INDEX) {
      assert.match(out.text, /^2\.2\.2$/m, out.text);
      assert.match(out.text, /^2\.3\.0$/m, out.text);
    } else {
      assert.match(out.text, /^\d+\.\d+\.\d+$/m, out.text);
    }
  },
  15 * 60_000,
);
