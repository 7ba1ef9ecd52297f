// The files API (sandbox.files) against the fake server: the wire (query
// parameters, headers, the base64 stat header), error codes, streams both
// ways (chunked, not buffered; an early refusal stops the upload), and a
// read that breaks off is an error, never a short success.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Readable } from "node:stream";
import { SandboxClient, Shard, ShardError, FileReadStream, TAR_TYPE } from "useshards";
import { sleep, until, withFake } from "./fake.js";

const T = { timeout: 15_000 };

const isErr = (code: string, status?: number) => (e: unknown) => {
  assert.ok(e instanceof ShardError, `not a ShardError: ${String(e)}`);
  assert.equal(e.code, code, e.message);
  if (status !== undefined) assert.equal(e.status, status);
  return true;
};

test("files: write then read back; the query carries path, mode (octal), uid, gid, mtime, parents", T, () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      const data = Buffer.from([0, 1, 2, 255, 254, 10, 13, 0]);
      const path = "/srv/my app/dàta+1.bin";
      const res = await sb.files.write(path, data, { mode: 0o755, uid: 1000, gid: 100, mtime: new Date("2026-01-02T03:04:05.678Z"), parents: true });
      assert.deepEqual(res, { path, bytes: data.length, files: 1 });
      const put = f.uploads.at(-1)!;
      assert.deepEqual(put.query, { path, mode: "755", uid: "1000", gid: "100", mtime: "2026-01-02T03:04:05.678Z", parents: "true" });
      assert.equal(put.headers["content-type"], "application/octet-stream");
      assert.equal(put.headers["content-length"], String(data.length), "whole bytes go with their length");
      assert.equal(put.headers["transfer-encoding"], undefined);
      const rec = f.requests.at(-1)!;
      assert.equal(rec.method, "PUT");
      assert.ok(rec.path.startsWith(`/v0/sandboxes/${sb.id}/files?`), rec.path);

      const back = await sb.files.read(path);
      assert.ok(Buffer.isBuffer(back));
      assert.deepEqual(back, data);
      const get = f.requests.at(-1)!;
      assert.equal(get.method, "GET");
      assert.equal(new URL(get.path, "http://x").searchParams.get("path"), path);
      assert.equal(get.headers.accept, "application/octet-stream");

      // A string is UTF-8; a string mode is octal digits; the old mode stays when none is given.
      await sb.files.write("/tmp/t.txt", "héllo\n", { mode: "600" });
      assert.equal(f.uploads.at(-1)!.query.mode, "600");
      assert.equal(await sb.files.readText("/tmp/t.txt"), "héllo\n");
      await sb.files.write("/tmp/t.txt", "again");
      assert.deepEqual(f.uploads.at(-1)!.query, { path: "/tmp/t.txt" });
      assert.equal((await sb.files.stat("/tmp/t.txt")).mode, 0o600);
      // An empty file is a file.
      await sb.files.write("/tmp/empty", "");
      assert.equal(f.uploads.at(-1)!.headers["content-length"], "0");
      assert.equal((await sb.files.read("/tmp/empty")).length, 0);
    } finally {
      shard.close();
    }
  }));

test("files: readStream gives info from the base64 X-Shard-File-Stat header, and the bytes as a Readable", T, () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      const big = Buffer.alloc(3 << 20);
      for (let i = 0; i < big.length; i++) big[i] = (i * 7919) & 0xff;
      await sb.files.write("/tmp/ünï €.bin", big, { mode: 0o640 });
      const s = await sb.files.readStream("/tmp/ünï €.bin");
      assert.ok(s instanceof FileReadStream);
      assert.ok(s instanceof Readable);
      assert.equal(s.info.name, "ünï €.bin");
      assert.equal(s.info.path, "/tmp/ünï €.bin");
      assert.equal(s.info.type, "file");
      assert.equal(s.info.size, big.length);
      assert.equal(s.info.mode, 0o640);
      assert.equal(s.length, big.length);
      const chunks: Buffer[] = [];
      for await (const c of s) chunks.push(c as Buffer);
      assert.ok(chunks.length > 1, "streamed in pieces");
      assert.deepEqual(Buffer.concat(chunks), big);
      assert.equal(s.bytesRead, big.length);

      // Left early: destroying it frees the connection, and the client goes on.
      const s2 = await sb.files.readStream("/tmp/ünï €.bin");
      for await (const _ of s2) break;
      assert.ok(s2.destroyed);
      assert.equal((await sb.files.stat("/tmp/ünï €.bin")).size, big.length);
    } finally {
      shard.close();
    }
  }));

test("files: a read that breaks off before Content-Length is stream_ended, never a short success", T, () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      const stat = (size: number) => Buffer.from(JSON.stringify({ name: "f", path: "/f", type: "file", size, mode: 420, uid: 0, gid: 0, mtime: "2025-01-01T00:00:00Z" })).toString("base64");
      f.onFilesRead = async (_p, req, res) => {
        res.writeHead(200, { "Content-Type": "application/octet-stream", "Content-Length": 1000, "X-Shard-File-Stat": stat(1000) });
        res.write(Buffer.alloc(100, 1));
        await sleep(50);
        req.socket.destroy(); // as the server does: panic(http.ErrAbortHandler)
      };
      await assert.rejects(sb.files.read("/f"), (e: unknown) => {
        isErr("stream_ended", 502)(e);
        assert.match((e as Error).message, /after 100 of 1000 bytes/);
        return true;
      });
      const s = await sb.files.readStream("/f");
      let got = 0;
      await assert.rejects(
        (async () => {
          for await (const c of s) got += (c as Buffer).length;
        })(),
        isErr("stream_ended"),
      );
      assert.equal(got, 100);

      // An archive has no length: a cut chunked body is the error.
      f.onFilesRead = async (_p, req, res) => {
        res.writeHead(200, { "Content-Type": TAR_TYPE, "X-Shard-File-Stat": stat(0) });
        res.write(Buffer.alloc(1536, 2));
        await sleep(50);
        req.socket.destroy();
      };
      const a = await sb.files.readArchive("/d");
      assert.equal(a.length, undefined);
      await assert.rejects(
        (async () => {
          for await (const _ of a);
        })(),
        isErr("stream_ended"),
      );

      // No stat header, or one that is not base64 JSON: bad_response.
      for (const header of [undefined, "not base64 json!"]) {
        f.onFilesRead = (_p, _req, res) => {
          res.writeHead(200, { "Content-Type": "application/octet-stream", "Content-Length": 2, ...(header ? { "X-Shard-File-Stat": header } : {}) });
          res.end("hi");
        };
        await assert.rejects(sb.files.read("/f"), isErr("bad_response"));
      }
      f.onFilesRead = undefined;
      assert.equal(await sb.files.readText("/tmp").catch((e: ShardError) => e.code), "is_a_directory");
    } finally {
      shard.close();
    }
  }));

test("files: the API's errors are ShardErrors with its code and status", T, () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      await assert.rejects(sb.files.read("/nope"), isErr("file_not_found", 404));
      await assert.rejects(sb.files.stat("/nope"), isErr("file_not_found", 404));
      await assert.rejects(sb.files.read("/tmp"), isErr("is_a_directory", 400));
      await assert.rejects(sb.files.list("/nope"), isErr("file_not_found", 404));
      await assert.rejects(sb.files.stat("relative"), isErr("invalid_path", 400));
      await sb.files.write("/tmp/d/x", "x", { parents: true });
      await assert.rejects(sb.files.remove("/tmp/d"), isErr("directory_not_empty", 409));
      await assert.rejects(shard.files("no-such-box").stat("/"), isErr("sandbox_not_found", 404));
      f.failWith = { status: 507, code: "disk_full", message: "sandbox box's disk is full (its bound is 256MiB)" };
      await assert.rejects(sb.files.write("/tmp/big", Buffer.alloc(10)), isErr("disk_full", 507));
      f.failWith = { status: 502, raw: "bad gateway" };
      await assert.rejects(sb.files.stat("/"), isErr("http_502", 502));
      f.failWith = undefined;
      // Refused by the SDK before sending.
      await assert.rejects(sb.files.write("/tmp/x", "x", { mode: "999" }), isErr("invalid_argument"));
      await assert.rejects(sb.files.write("/tmp/x", "x", { mode: 0o10000 }), isErr("invalid_argument"));
      await assert.rejects(sb.files.write("/tmp/x", "x", { uid: -1 }), isErr("invalid_argument"));
      await assert.rejects(sb.files.stat(""), isErr("invalid_argument"));
      await assert.rejects(sb.files.write("/tmp/x", 42 as unknown as string), isErr("invalid_argument"));
    } finally {
      shard.close();
    }
  }));

test("files: stat, list and remove send follow_link, limit and recursive", T, () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      const q = () => Object.fromEntries(new URL(f.requests.at(-1)!.path, "http://x").searchParams);
      for (const n of ["b", "a", "c"]) await sb.files.write(`/tmp/${n}`, n);
      f.fs(sb.info).set("/tmp/link", { type: "symlink", link: "a", mode: 0o777, uid: 0, gid: 0, mtime: "2025-01-01T00:00:00Z" });

      const link = await sb.files.stat("/tmp/link");
      assert.equal(f.requests.at(-1)!.path.split("?")[0], `/v0/sandboxes/${sb.id}/files/stat`);
      assert.deepEqual(q(), { path: "/tmp/link" });
      assert.deepEqual([link.type, link.link], ["symlink", "a"]);
      const target = await sb.files.stat("/tmp/link", { followLink: true });
      assert.deepEqual(q(), { path: "/tmp/link", follow_link: "true" });
      assert.deepEqual([target.type, target.path, target.size], ["file", "/tmp/a", 1]);

      const all = await sb.files.list("/tmp");
      assert.equal(f.requests.at(-1)!.path.split("?")[0], `/v0/sandboxes/${sb.id}/files/list`);
      assert.deepEqual(q(), { path: "/tmp" });
      assert.deepEqual(all.entries.map((e) => e.name), ["a", "b", "c", "link"]);
      assert.equal(all.truncated, false);
      const two = await sb.files.list("/tmp", { limit: 2 });
      assert.deepEqual(q(), { path: "/tmp", limit: "2" });
      assert.deepEqual([two.entries.length, two.truncated], [2, true]);

      const gone = await sb.files.remove("/tmp/a");
      assert.equal(f.requests.at(-1)!.method, "DELETE");
      assert.deepEqual(q(), { path: "/tmp/a" });
      assert.deepEqual([gone.path, gone.type], ["/tmp/a", "file"]);
      assert.equal(await sb.files.exists("/tmp/a"), false);
      assert.equal(await sb.files.exists("/tmp/b"), true);
      await sb.files.remove("/tmp", { recursive: true });
      assert.deepEqual(q(), { path: "/tmp", recursive: "true" });
      assert.equal(await sb.files.exists("/tmp/b"), false);
    } finally {
      shard.close();
    }
  }));

test("files: writeStream sends chunked as the source gives, not buffered", T, () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      const piece = 64 << 10;
      const upload = () => f.uploads.find((u) => u.path === "/tmp/s.bin");
      let reachedBeforeNext = 0;
      async function* slow() {
        for (let i = 0; i < 4; i++) {
          yield Buffer.alloc(piece, i);
          // The next chunk is made only once this one reached the server
          // (ordering, not a clock): a client that buffered the body until
          // the source ended fails this wait, and so the upload.
          await until(() => (upload()?.bytes ?? 0) >= (i + 1) * piece, `chunk ${i} at the server before chunk ${i + 1} is made`);
          reachedBeforeNext++;
        }
        yield "tail";
      }
      const res = await sb.files.writeStream("/tmp/s.bin", slow(), { mode: 0o600 });
      assert.equal(res.bytes, 4 * piece + 4);
      assert.equal(reachedBeforeNext, 4, "each chunk reached the server while the source was still making the rest");
      const up = upload()!;
      assert.equal(up.headers["transfer-encoding"], "chunked");
      assert.equal(up.headers["content-length"], undefined);
      assert.equal(up.query.mode, "600");
      assert.ok(up.whole);
      const back = await sb.files.read("/tmp/s.bin");
      assert.equal(back.subarray(-4).toString(), "tail");
      assert.equal(back[3 * (64 << 10)], 3);

      // A source that reuses its buffer: each chunk is sent before the next is asked for.
      async function* reusing() {
        const buf = Buffer.alloc(64 << 10);
        for (let i = 0; i < 20; i++) {
          buf.fill(i);
          yield buf;
        }
      }
      await sb.files.writeStream("/tmp/reused.bin", reusing());
      const reused = await sb.files.read("/tmp/reused.bin");
      assert.equal(reused.length, 20 * (64 << 10));
      for (let i = 0; i < 20; i++) assert.ok(reused.subarray(i * (64 << 10), (i + 1) * (64 << 10)).every((b) => b === i), `block ${i}`);

      // A Node Readable, and a web ReadableStream.
      await sb.files.writeStream("/tmp/r.txt", Readable.from([Buffer.from("from "), Buffer.from("a Readable")]));
      assert.equal(await sb.files.readText("/tmp/r.txt"), "from a Readable");
      const web = new ReadableStream<Uint8Array>({
        start(c) {
          c.enqueue(new TextEncoder().encode("web "));
          c.enqueue(new TextEncoder().encode("stream"));
          c.close();
        },
      });
      await sb.files.writeStream("/tmp/w.txt", web);
      assert.equal(await sb.files.readText("/tmp/w.txt"), "web stream");
    } finally {
      shard.close();
    }
  }));

test("files: an upload refused early stops reading the source; a failing source is source_failed and writes nothing", T, () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      let pulled = 0;
      let closed = false;
      async function* endless() {
        try {
          for (;;) {
            yield Buffer.alloc(256 << 10);
            await sleep(5);
            pulled++;
          }
        } finally {
          closed = true;
        }
      }
      await assert.rejects(sb.files.writeStream("/no/such/dir/f", endless()), isErr("file_not_found", 404));
      const atAnswer = pulled;
      // Closed, a generator is never read again: so once it is, what it gave is all it will.
      await until(() => closed, "the source closed after the answer");
      assert.ok(pulled <= atAnswer + 1, `the source is not read after the answer (only a pull in flight may end): ${pulled - atAnswer} more`);

      async function* failing() {
        yield Buffer.from("half of it");
        await sleep(50);
        throw new Error("disk read error");
      }
      await assert.rejects(sb.files.writeStream("/tmp/half", failing()), (e: unknown) => {
        isErr("source_failed")(e);
        assert.match((e as Error).message, /disk read error/);
        return true;
      });
      await sleep(50);
      assert.equal(f.uploads.at(-1)!.whole, false, "the body was cut, not ended");
      assert.equal(await sb.files.exists("/tmp/half"), false);
      // The client still works.
      await sb.files.write("/tmp/ok", "ok");
    } finally {
      shard.close();
    }
  }));

test("files: archives are application/x-tar both ways; follow_link; file options are refused", T, () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      const tar = Buffer.alloc(3 * 512, 7);
      const res = await sb.files.writeArchive("/srv/app", tar);
      assert.deepEqual(res.notes, ["x/dev: a device node: skipped"]);
      let up = f.uploads.at(-1)!;
      assert.equal(up.headers["content-type"], TAR_TYPE);
      assert.deepEqual(up.query, { path: "/srv/app" });
      assert.equal(up.headers["content-length"], String(tar.length));
      await sb.files.writeArchive("/srv/app2", Readable.from([tar.subarray(0, 512), tar.subarray(512)]));
      up = f.uploads.at(-1)!;
      assert.equal(up.headers["transfer-encoding"], "chunked");

      const s = await sb.files.readArchive("/srv/app");
      assert.equal(f.requests.at(-1)!.headers.accept, TAR_TYPE);
      assert.deepEqual(Object.fromEntries(new URL(f.requests.at(-1)!.path, "http://x").searchParams), { path: "/srv/app" });
      assert.equal(s.info.type, "dir");
      const chunks: Buffer[] = [];
      for await (const c of s) chunks.push(c as Buffer);
      assert.deepEqual(Buffer.concat(chunks), tar);
      (await sb.files.readArchive("/srv/app", { followLink: true })).destroy();
      assert.equal(new URL(f.requests.at(-1)!.path, "http://x").searchParams.get("follow_link"), "true");

      await assert.rejects(shard.api.writeFiles(sb.id, "/d", tar, { archive: true, mode: 0o644 }), isErr("invalid_argument"));
    } finally {
      shard.close();
    }
  }));

test("files: sandbox_frozen is retried for calls that can be sent again", T, () =>
  withFake(async (f) => {
    const shard = new Shard({ remote: f.url });
    try {
      const sb = await shard.create({ image: "img" });
      f.frozenFiles = 2;
      await sb.files.write("/tmp/x", "x");
      f.frozenFiles = 1;
      assert.equal((await sb.files.stat("/tmp/x")).size, 1);
      f.frozenFiles = 1;
      assert.equal(await sb.files.readText("/tmp/x"), "x");
      // A stream cannot be sent twice: the error is the caller's.
      f.frozenFiles = 1;
      await assert.rejects(sb.files.writeStream("/tmp/y", Readable.from(["y"])), isErr("sandbox_frozen", 409));
    } finally {
      shard.close();
    }
  }));

test("files: SandboxClient handles and client.files(name) reach the same calls", T, () =>
  withFake(async (f) => {
    const client = new SandboxClient({ remote: f.url });
    try {
      const h = await client.sandbox({ image: "img", name: "box one" });
      await h.files.write("/tmp/h", "handle");
      assert.equal(await client.files("box one").readText("/tmp/h"), "handle");
      assert.ok(f.requests.at(-1)!.path.startsWith("/v0/sandboxes/box%20one/files?"), f.requests.at(-1)!.path);
      assert.equal(client.files("box one").sandbox, "box one");
      assert.equal(h.files.sandbox, h.id);
    } finally {
      await client.close({ removeSandboxes: true });
    }
  }));
