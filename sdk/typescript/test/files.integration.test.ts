// sandbox.files against a real shard server: a few MiB of binary written
// and read back (whole and streamed), options, list, stat, remove, a tar
// written and read back, the API's error codes, and a stopped sandbox.

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { Readable } from "node:stream";
import { SandboxClient, Shard, ShardError, type Sandbox } from "useshards";
import { itest, pythonImage, uniq } from "./integration.js";
import { makeTar, readTar } from "./tar.js";

const IMAGE = pythonImage("python:3.12-slim");

const sha256 = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

const code = (c: string, status?: number) => (e: unknown) => {
  assert.ok(e instanceof ShardError, String(e));
  assert.equal(e.code, c, e.message);
  if (status !== undefined) assert.equal(e.status, status, e.message);
  return true;
};

async function withSandbox(fn: (sb: Sandbox, shard: Shard) => Promise<void>): Promise<void> {
  const shard = new Shard();
  let sb: Sandbox | undefined;
  try {
    sb = await shard.create({ image: IMAGE, memory: "256MiB", name: `ts-files-${uniq()}` });
    await fn(sb, shard);
  } finally {
    await sb?.remove({ force: true }).catch(() => {});
    shard.close();
  }
}

itest("files: a 5 MiB binary file written and read back, whole and streamed", () =>
  withSandbox(async (sb) => {
    const data = randomBytes(5 << 20);
    const res = await sb.files.write("/root/blob.bin", data);
    assert.deepEqual(res, { path: "/root/blob.bin", bytes: data.length, files: 1 });
    // The sandbox sees the same bytes.
    assert.equal((await sb.exec(["sha256sum", "/root/blob.bin"])).stdout.split(" ")[0], sha256(data));
    const back = await sb.files.read("/root/blob.bin");
    assert.equal(back.length, data.length);
    assert.ok(back.equals(data), "read back what was written");

    // Streamed both ways: 12 MiB made on the fly, hashed as it comes back.
    const want = createHash("sha256");
    async function* gen() {
      for (let i = 0; i < 12; i++) {
        const c = randomBytes(1 << 20);
        want.update(c);
        yield c;
      }
    }
    const wr = await sb.files.writeStream("/root/stream.bin", gen(), { mode: 0o600 });
    assert.equal(wr.bytes, 12 << 20);
    // Checked inside too, so a mismatch says which way went wrong.
    const wantHex = want.digest("hex");
    assert.equal((await sb.exec(["sha256sum", "/root/stream.bin"])).stdout.split(" ")[0], wantHex, "written");
    const s = await sb.files.readStream("/root/stream.bin");
    assert.equal(s.info.size, 12 << 20);
    assert.equal(s.info.mode, 0o600);
    const got = createHash("sha256");
    let n = 0;
    for await (const c of s) {
      got.update(c as Buffer);
      n++;
    }
    assert.ok(n > 1, "came in pieces");
    assert.equal(got.digest("hex"), wantHex, "read back");
    // A Node Readable as the source.
    await sb.files.writeStream("/root/r.txt", Readable.from(["line 1\n", "line 2\n"]));
    assert.equal(await sb.files.readText("/root/r.txt"), "line 1\nline 2\n");
  }));

itest("files: mode, owner, mtime and parents; stat, list, remove; error codes", () =>
  withSandbox(async (sb) => {
    const mtime = new Date("2024-05-06T07:08:09Z");
    await sb.files.write("/srv/app/bin/run.sh", "#!/bin/sh\necho ran\n", { mode: 0o755, uid: 1000, gid: 1000, mtime, parents: true });
    assert.equal((await sb.exec(["/srv/app/bin/run.sh"])).stdout, "ran\n");
    const st = await sb.files.stat("/srv/app/bin/run.sh");
    assert.deepEqual(
      { name: st.name, path: st.path, type: st.type, size: st.size, mode: st.mode, uid: st.uid, gid: st.gid },
      { name: "run.sh", path: "/srv/app/bin/run.sh", type: "file", size: 19, mode: 0o755, uid: 1000, gid: 1000 },
    );
    assert.equal(new Date(st.mtime).getTime(), mtime.getTime());
    await sb.exec(["ln", "-s", "bin/run.sh", "/srv/app/run"]);
    const link = await sb.files.stat("/srv/app/run");
    assert.deepEqual([link.type, link.link], ["symlink", "bin/run.sh"]);
    assert.equal((await sb.files.stat("/srv/app/run", { followLink: true })).type, "file");
    assert.equal(await sb.files.readText("/srv/app/run"), "#!/bin/sh\necho ran\n", "a read follows a symlink");

    for (const n of ["c", "a", "b"]) await sb.files.write(`/srv/app/${n}.txt`, n);
    const ls = await sb.files.list("/srv/app");
    assert.equal(ls.path, "/srv/app");
    assert.deepEqual(ls.entries.map((e) => `${e.name}:${e.type}`), ["a.txt:file", "b.txt:file", "bin:dir", "c.txt:file", "run:symlink"]);
    assert.equal(ls.truncated, false);
    const some = await sb.files.list("/srv/app", { limit: 2 });
    assert.equal(some.entries.length, 2);
    assert.equal(some.truncated, true);

    const gone = await sb.files.remove("/srv/app/a.txt");
    assert.deepEqual([gone.path, gone.type, gone.size], ["/srv/app/a.txt", "file", 1]);
    assert.equal(await sb.files.exists("/srv/app/a.txt"), false);

    await assert.rejects(sb.files.read("/srv/app/a.txt"), code("file_not_found", 404));
    await assert.rejects(sb.files.stat("/no/such/file"), code("file_not_found", 404));
    await assert.rejects(sb.files.read("/srv/app"), code("is_a_directory", 400));
    await assert.rejects(sb.files.list("/srv/app/b.txt"), code("not_a_directory", 400));
    await assert.rejects(sb.files.write("/no/such/dir/f", "x"), code("file_not_found", 404));
    await assert.rejects(sb.files.stat("relative/path"), code("invalid_path", 400));
    await assert.rejects(sb.files.remove("/srv/app"), code("directory_not_empty", 409));
    await sb.files.remove("/srv/app", { recursive: true });
    assert.equal(await sb.files.exists("/srv"), true);
    assert.equal(await sb.files.exists("/srv/app"), false);
    // A stream refused before its body is sent: the error, not a broken connection.
    async function* big() {
      for (let i = 0; i < 64; i++) yield randomBytes(1 << 20);
    }
    await assert.rejects(sb.files.writeStream("/no/such/dir/big", big()), code("file_not_found", 404));
  }));

itest("files: a tar written into a directory, then read back as a tar", () =>
  withSandbox(async (sb) => {
    const blob = randomBytes(300_000);
    const tar = makeTar([
      { name: "proj", type: "dir", mode: 0o750 },
      { name: "proj/README", type: "file", data: Buffer.from("hello tar\n"), mode: 0o644, uid: 1000, gid: 1000 },
      { name: "proj/data", type: "dir" },
      { name: "proj/data/blob.bin", type: "file", data: blob, mode: 0o600 },
      { name: "proj/link", type: "symlink", link: "README" },
    ]);
    const res = await sb.files.writeArchive("/work", Readable.from([tar.subarray(0, 1000), tar.subarray(1000)]));
    assert.equal(res.path, "/work");
    assert.equal(res.bytes, 10 + blob.length);
    assert.ok(res.files >= 5, JSON.stringify(res));
    assert.equal((await sb.exec(["cat", "/work/proj/link"])).stdout, "hello tar\n");
    assert.equal((await sb.exec(["stat", "-c", "%a %u", "/work/proj/README"])).stdout, "644 1000\n");

    const s = await sb.files.readArchive("/work/proj");
    assert.equal(s.info.type, "dir");
    const chunks: Buffer[] = [];
    for await (const c of s) chunks.push(c as Buffer);
    const entries = readTar(Buffer.concat(chunks));
    const byName = new Map(entries.map((e) => [e.name, e]));
    assert.deepEqual([...byName.keys()].sort(), ["proj", "proj/README", "proj/data", "proj/data/blob.bin", "proj/link"]);
    assert.equal(byName.get("proj/README")!.data!.toString(), "hello tar\n");
    assert.equal(byName.get("proj/README")!.uid, 1000);
    assert.ok(byName.get("proj/data/blob.bin")!.data!.equals(blob));
    assert.equal(byName.get("proj/data/blob.bin")!.mode! & 0o7777, 0o600);
    assert.deepEqual([byName.get("proj/link")!.type, byName.get("proj/link")!.link], ["symlink", "README"]);
    assert.equal(byName.get("proj")!.mode! & 0o7777, 0o750);

    // Whole bytes work too, and an entry that leads out is refused.
    await sb.files.writeArchive("/work2", makeTar([{ name: "one.txt", type: "file", data: Buffer.from("1") }]));
    assert.equal(await sb.files.readText("/work2/one.txt"), "1");
    await assert.rejects(sb.files.writeArchive("/work3", makeTar([{ name: "../escape.txt", type: "file", data: Buffer.from("x") }])), code("unsafe_archive", 400));
    assert.equal(await sb.files.exists("/escape.txt"), false);
  }));

itest("files: a stopped sandbox's files, through a SandboxClient handle and client.files(name)", async () => {
  const client = new SandboxClient();
  try {
    const sb = await client.sandbox({ image: IMAGE, resources: { memory: "256Mi" }, name: `ts-files-stopped-${uniq()}` });
    await sb.files.write("/root/before.txt", "before stop\n");
    await client.api.stopSandbox(sb.id);
    const files = client.files(sb.name);
    assert.equal(await files.readText("/root/before.txt"), "before stop\n");
    await files.write("/root/while-stopped.txt", "written while stopped\n", { mode: 0o640 });
    assert.equal((await files.stat("/root/while-stopped.txt")).mode, 0o640);
    await client.api.startSandbox(sb.id);
    assert.equal((await sb.exec("cat /root/while-stopped.txt")).stdout, "written while stopped\n");
  } finally {
    await client.close({ removeSandboxes: true });
  }
});
