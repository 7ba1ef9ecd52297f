// Shared by the *.integration.test files, which drive a REAL shard server.
//
// They run only with SHARD_INTEGRATION=1, and then they FAIL (never skip)
// when SHARD_REMOTE is unset. Environment:
//
//   SHARD_INTEGRATION=1       run them
//   SHARD_REMOTE              the server's base URL (shard serve --listen)
//   SHARD_API_KEY             an API key with scope "*"
//   SHARD_TEST_PYTHON_IMAGE   image with python3 and pip (default: the seeds' python:3.12-slim / python:3.11-slim)
//   SHARD_TEST_NODE_IMAGE     image with node and npm, reaching the npm registry (default: node:22)
//   SHARD_TEST_OTHER_PROJECT_KEY  a key of a project other than SHARD_API_KEY's (projects test)
//   SHARD_TEST_PIP_INDEX      a PEP 503 index reachable from sandboxes (fake requests 2.31.0/2.32.3,
//                             numpy 1.26.4, pandas 2.2.2, torch 2.3.0); unset: pip's default index

import { readFileSync } from "node:fs";
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { Shard, ShardError } from "useshards";

export const INTEGRATION = process.env.SHARD_INTEGRATION === "1";

export const PIP_INDEX = process.env.SHARD_TEST_PIP_INDEX || "";

/** The image to use where a seed names a python image. */
export function pythonImage(seedImage: string): string {
  return process.env.SHARD_TEST_PYTHON_IMAGE || seedImage;
}

/** The image to use where a seed names node:22. */
export const NODE_IMAGE = process.env.SHARD_TEST_NODE_IMAGE || "node:22";

/**
 * Environment of the python sandboxes (not in the seeds): pip finds its
 * packages through PIP_INDEX_URL, so the seeds' `pip install` lines run
 * verbatim (trusting its host: it may be plain HTTP); the rest keeps pip
 * quiet and lets it install as root into a distribution's python (PEP 668).
 */
export const PY_ENV: Record<string, string> = {
  ...(PIP_INDEX ? { PIP_INDEX_URL: PIP_INDEX, PIP_TRUSTED_HOST: new URL(PIP_INDEX).hostname } : {}),
  PIP_BREAK_SYSTEM_PACKAGES: "1",
  PIP_DISABLE_PIP_VERSION_CHECK: "1",
  PIP_ROOT_USER_ACTION: "ignore",
};

/**
 * The CA bundle npm on this machine trusts (its `cafile`, which `npm test`
 * exports as npm_config_cafile; or NODE_EXTRA_CA_CERTS), if it has one. A
 * machine whose egress goes through a TLS-inspecting proxy needs it, and so
 * does npm inside a sandbox behind the same egress: the node tests copy it
 * in (NODE_CA_FILE) unless the image trusts that CA already.
 */
export const HOST_NPM_CA: string | undefined = (() => {
  for (const f of [process.env.npm_config_cafile, process.env.NODE_EXTRA_CA_CERTS]) {
    if (!f) continue;
    try {
      const pem = readFileSync(f, "utf8");
      if (pem.includes("BEGIN CERTIFICATE") && pem.length < 700_000) return pem;
    } catch {
      // not readable: try the next
    }
  }
  return undefined;
})();

/** Where the node sandboxes get HOST_NPM_CA. */
export const NODE_CA_FILE = "/root/.shard-test-ca.crt";

/** Environment of the node sandboxes (not in the seeds): npm trusts HOST_NPM_CA. */
export const NODE_ENV: Record<string, string> = HOST_NPM_CA ? { NPM_CONFIG_CAFILE: NODE_CA_FILE } : {};

/**
 * Registers an integration test: skipped without SHARD_INTEGRATION=1; with
 * it, a missing SHARD_REMOTE fails the test.
 */
export function itest(name: string, fn: (t: TestContext) => Promise<void>, timeoutMs = 5 * 60_000): void {
  if (!INTEGRATION) {
    test(name, { skip: "set SHARD_INTEGRATION=1 (with SHARD_REMOTE and SHARD_API_KEY) to run it against a real shard server" }, () => {});
    return;
  }
  test(name, { timeout: timeoutMs }, async (t) => {
    assert.ok(
      process.env.SHARD_REMOTE,
      "SHARD_INTEGRATION=1 but SHARD_REMOTE is unset: set it to the URL of a shard server (shard serve --listen), with SHARD_API_KEY",
    );
    const before = await checkpointIds();
    try {
      await fn(t);
    } finally {
      await removeNewCheckpoints(before);
    }
  });
}

async function checkpointIds(): Promise<Set<string>> {
  const shard = new Shard();
  try {
    return new Set((await shard.api.allCheckpoints()).map((c) => c.id));
  } finally {
    shard.close();
  }
}

/**
 * Checkpoints outlive their sandboxes (every fork leaves one): remove those
 * of kind fork or checkpoint that the test made, i.e. that were not there
 * before it. Environments' checkpoints go with the environment.
 */
async function removeNewCheckpoints(before: Set<string>): Promise<void> {
  const shard = new Shard();
  try {
    for (const c of await shard.api.allCheckpoints()) {
      if (before.has(c.id) || (c.kind !== "fork" && c.kind !== "checkpoint")) continue;
      await shard.api.removeCheckpoint(c.id).catch(() => {});
    }
  } finally {
    shard.close();
  }
}

/** Removes sandboxes of these names if a crashed earlier run left them. */
export async function removeLeftovers(names: string[]): Promise<void> {
  const shard = new Shard();
  try {
    for (const n of names) {
      await shard.api.removeSandbox(n, true).catch((e: unknown) => {
        if (!(e instanceof ShardError && e.status === 404)) throw e;
      });
    }
  } finally {
    shard.close();
  }
}

/** A unique suffix for names in one run. */
export function uniq(): string {
  return `${process.pid.toString(36)}${Date.now().toString(36).slice(-4)}`;
}

/** A writable that keeps what it gets, with when it got it. */
export class Collector {
  readonly chunks: { at: number; text: string }[] = [];
  write(chunk: Uint8Array): boolean {
    this.chunks.push({ at: performance.now(), text: Buffer.from(chunk).toString("utf8") });
    return true;
  }
  get text(): string {
    return this.chunks.map((c) => c.text).join("");
  }
}
