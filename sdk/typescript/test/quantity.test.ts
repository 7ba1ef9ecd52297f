import { test } from "node:test";
import assert from "node:assert/strict";
import { toMemory, toCpu, resourcesToRequest, ShardError } from "useshards";

test("memory quantities: Kubernetes forms become the API's", () => {
  assert.equal(toMemory("512Mi"), "512MiB");
  assert.equal(toMemory("1Gi"), "1GiB");
  assert.equal(toMemory("1.5Gi"), "1.5GiB");
  assert.equal(toMemory("64Ki"), "64KiB");
  assert.equal(toMemory("2Ti"), "2TiB");
  assert.equal(toMemory("1G"), "1GB"); // Kubernetes G is 10^9
  assert.equal(toMemory("500M"), "500MB");
  assert.equal(toMemory("100k"), "100kB");
  assert.equal(toMemory("128974848"), 128974848);
  assert.equal(toMemory("129e6"), 129000000);
  assert.equal(toMemory(536870912), 536870912);
  assert.equal(toMemory("1Pi"), 2 ** 50);
  assert.equal(toMemory(" 256Mi "), "256MiB");
});

test("memory quantities: the API's own spellings pass through", () => {
  assert.equal(toMemory("512MiB"), "512MiB");
  assert.equal(toMemory("2GiB"), "2GiB");
  assert.equal(toMemory("2GB"), "2GB");
});

test("memory quantities: bad ones throw ShardError invalid_argument", () => {
  for (const q of ["", "abc", "512m", "-1Gi", "0", "1.5", "12Xi", "1e3Mi"]) {
    assert.throws(
      () => toMemory(q),
      (e: unknown) => e instanceof ShardError && e.code === "invalid_argument",
      `"${q}" should be refused`,
    );
  }
  assert.throws(() => toMemory(1.5), ShardError);
  assert.throws(() => toMemory(0), ShardError);
});

test("cpu quantities", () => {
  assert.equal(toCpu("1"), "1");
  assert.equal(toCpu("2"), "2");
  assert.equal(toCpu("0.5"), "0.5");
  assert.equal(toCpu(".5"), "0.5");
  assert.equal(toCpu("500m"), "500m");
  assert.equal(toCpu("0500m"), "500m");
  assert.equal(toCpu(2), "2");
  assert.equal(toCpu(0.25), "0.25");
  for (const q of ["", "x", "1.5m", "-1", "0", "1 cpu"]) assert.throws(() => toCpu(q), ShardError, `"${q}"`);
});

test("resources to the create request", () => {
  assert.deepEqual(resourcesToRequest({ cpu: "1", memory: "512Mi" }), { cpu: "1", memory: "512MiB" });
  assert.deepEqual(resourcesToRequest({ cpu: "500m", memory: "1Gi", disk: "10Gi" }), { cpu: "500m", memory: "1GiB", disk: "10GiB" });
  assert.deepEqual(resourcesToRequest(undefined), {});
});
