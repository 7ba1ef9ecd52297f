"""sandbox.files against the fake server: the wire (query parameters,
headers, the base64 stat header), error codes, streams both ways (chunked,
not buffered; an early refusal stops the upload), and a read that breaks
off is an error, never a short success."""

from __future__ import annotations

import base64
import io
import itertools
import json
import os
import shutil
import tarfile
import tempfile
import threading
import time
import unittest
from datetime import datetime, timezone
from typing import Any, Dict, Iterator, List, Optional

from fakeserver import FakeServer, Handler, Recorded, sandbox_json

from useshards import FileInfo, FileList, FileReader, Shard, ShardError, WriteResult

SB = sandbox_json()
FILES = f"/sandboxes/{SB['id']}/files"


def q(rec: Recorded) -> Dict[str, str]:
    """A request's query, one value a key."""
    return {k: v[0] for k, v in rec.query.items()}


def stat_header(info: Dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(info).encode()).decode()


class FakeFiles:
    """The files API of one fake sandbox: a dict of paths."""

    def __init__(self, fake: FakeServer) -> None:
        self.files: Dict[str, Dict[str, Any]] = {
            "/": {"type": "dir", "mode": 0o755},
            "/tmp": {"type": "dir", "mode": 0o1777},
        }
        self.archives: Dict[str, bytes] = {}
        self.lock = threading.Lock()
        fake.route("GET", FILES, self.get)
        fake.route("PUT", FILES, self.put)
        fake.route("DELETE", FILES, self.delete)
        fake.route("GET", FILES + "/stat", self.stat)
        fake.route("GET", FILES + "/list", self.list)

    def info(self, path: str) -> Dict[str, Any]:
        f = self.files[path]
        d = {
            "name": "/" if path == "/" else path.rsplit("/", 1)[1],
            "path": path,
            "type": f["type"],
            "size": len(f.get("data", b"")),
            "mode": f["mode"],
            "uid": f.get("uid", 0),
            "gid": f.get("gid", 0),
            "mtime": f.get("mtime", "2025-01-01T00:00:00.123456789Z"),
        }
        if "link" in f:
            d["link"] = f["link"]
        return d

    @staticmethod
    def parent(path: str) -> str:
        return path.rsplit("/", 1)[0] or "/"

    def missing(self, h: Handler, path: str) -> None:
        h.send_json(404, {"code": "file_not_found", "message": f"sandbox base: {path}: no such file or directory"})

    def get(self, h: Handler, rec: Recorded) -> None:
        p = q(rec)["path"]
        tar = "application/x-tar" in (rec.headers.get("Accept") or "")
        if p not in self.files:
            return self.missing(h, p)
        f = self.files[p]
        if tar:
            data = self.archives.get(p, b"\0" * 1024)
            h.send_response(200)
            h.send_header("Content-Type", "application/x-tar")
            h.send_header("X-Shard-File-Stat", stat_header(self.info(p)))
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            try:
                for i in range(0, len(data), 4096):
                    h.write_bytes(data[i : i + 4096])
                h.end_stream()
            except OSError:  # the client left early
                h.close_connection = True
            return
        if f["type"] == "dir":
            return h.send_json(400, {"code": "is_a_directory", "message": f"sandbox base: {p} is a directory"})
        data = f["data"]
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(len(data)))
        h.send_header("X-Shard-File-Stat", stat_header(self.info(p)))
        h.end_headers()
        try:
            h.wfile.write(data)
        except OSError:  # the client left early
            h.close_connection = True

    def put(self, h: Handler, rec: Recorded) -> None:
        qs = q(rec)
        p = qs["path"]
        tar = (rec.headers.get("Content-Type") or "").startswith("application/x-tar")
        d = p if tar else self.parent(p)
        if not tar and qs.get("parents") != "true" and self.files.get(d, {}).get("type") != "dir":
            # Refused before the body is read, as the server does.
            return h.send_json(404, {"code": "file_not_found", "message": f"sandbox base: directory {d} does not exist"})
        try:
            data = b"".join(h.body_pieces())
        except (OSError, ValueError):
            h.close_connection = True
            return  # broke off: nothing is written
        with self.lock:
            if tar:
                self.files[p] = {"type": "dir", "mode": 0o755}
                self.archives[p] = data
                return h.send_json(200, {"path": p, "bytes": len(data), "files": 2, "notes": ["dev/null: a device node: skipped"]})
            while qs.get("parents") == "true" and d not in self.files:
                self.files[d] = {"type": "dir", "mode": 0o755}
                d = self.parent(d)
            old = self.files.get(p, {})
            self.files[p] = {
                "type": "file",
                "data": data,
                "mode": int(qs["mode"], 8) if "mode" in qs else old.get("mode", 0o644),
                "uid": int(qs.get("uid", old.get("uid", 0))),
                "gid": int(qs.get("gid", old.get("gid", 0))),
                "mtime": qs.get("mtime", "2025-06-01T00:00:00Z"),
            }
        h.send_json(200, {"path": p, "bytes": len(data), "files": 1})

    def delete(self, h: Handler, rec: Recorded) -> None:
        qs = q(rec)
        p = qs["path"]
        if p not in self.files:
            return self.missing(h, p)
        under = [k for k in self.files if k.startswith(p + "/")]
        if under and qs.get("recursive") != "true":
            return h.send_json(409, {"code": "directory_not_empty", "message": f"sandbox base: {p} is a directory that is not empty"})
        info = self.info(p)
        for k in under + [p]:
            del self.files[k]
        h.send_json(200, info)

    def stat(self, h: Handler, rec: Recorded) -> None:
        qs = q(rec)
        p = qs["path"]
        if qs.get("follow_link") == "true" and self.files.get(p, {}).get("type") == "symlink":
            p = self.parent(p) + "/" + self.files[p]["link"]
        if p not in self.files:
            return self.missing(h, p)
        h.send_json(200, self.info(p))

    def list(self, h: Handler, rec: Recorded) -> None:
        qs = q(rec)
        p = qs["path"]
        if p not in self.files:
            return self.missing(h, p)
        names = sorted(k for k in self.files if k != p and self.parent(k) == p)
        limit = int(qs.get("limit", "10000"))
        h.send_json(200, {"path": p, "entries": [self.info(k) for k in names[:limit]], "truncated": len(names) > limit})


class FilesBase(unittest.TestCase):
    unix = False

    def setUp(self) -> None:
        self.fake = FakeServer(unix=self.unix).start()
        self.addCleanup(self.fake.stop)
        self.fake.route("GET", f"/sandboxes/{SB['id']}", body=SB)
        self.fs = FakeFiles(self.fake)
        self.shard = Shard(self.fake.url, "shk_test_key")
        self.addCleanup(self.shard.close)
        self.sb = self.shard.get(SB["id"])

    def last(self, method: str, op: str = "") -> Recorded:
        return self.fake.last(method, FILES + op)


class FilesTest(FilesBase):
    def test_write_then_read_back_with_options_in_the_query(self) -> None:
        data = bytes([0, 1, 2, 255, 254, 10, 13, 0])
        path = "/srv/my app/dàta+1.bin"
        res = self.sb.files.write(
            path, data, mode=0o755, uid=1000, gid=100, mtime=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc), parents=True
        )
        self.assertIsInstance(res, WriteResult)
        self.assertEqual((res.path, res.bytes, res.files, res.notes), (path, len(data), 1, []))
        put = self.last("PUT")
        self.assertEqual(q(put), {"path": path, "mode": "755", "uid": "1000", "gid": "100", "mtime": "2026-01-02T03:04:05.678000Z", "parents": "true"})
        self.assertEqual(put.headers["Content-Type"], "application/octet-stream")
        self.assertEqual(put.headers["Content-Length"], str(len(data)), "whole bytes go with their length")
        self.assertNotIn("Transfer-Encoding", put.headers)
        self.assertEqual(put.headers["Authorization"], "Bearer shk_test_key")

        self.assertEqual(self.sb.files.read(path), data)
        get = self.last("GET")
        self.assertEqual(q(get), {"path": path})
        self.assertEqual(get.headers["Accept"], "application/octet-stream")

        # str is UTF-8; a str mode is octal digits; without options the old mode stays.
        self.sb.files.write("/tmp/t.txt", "héllo\n", mode="600")
        self.assertEqual(q(self.last("PUT"))["mode"], "600")
        self.assertEqual(self.sb.files.read_text("/tmp/t.txt"), "héllo\n")
        self.sb.files.write("/tmp/t.txt", b"again")
        self.assertEqual(q(self.last("PUT")), {"path": "/tmp/t.txt"})
        self.assertEqual(self.sb.files.stat("/tmp/t.txt").mode, 0o600)
        # Seconds since the epoch, and an empty file.
        self.sb.files.write("/tmp/empty", b"", mtime=0)
        self.assertEqual(q(self.last("PUT"))["mtime"], "1970-01-01T00:00:00Z")
        self.assertEqual(self.last("PUT").headers["Content-Length"], "0")
        self.assertEqual(self.sb.files.read("/tmp/empty"), b"")

    def test_read_stream_info_from_the_base64_header_and_chunks(self) -> None:
        big = bytes(i * 7919 % 251 for i in range(3 << 20))
        self.sb.files.write("/tmp/ünï €.bin", big, mode=0o640)
        with self.sb.files.read_stream("/tmp/ünï €.bin") as r:
            self.assertIsInstance(r, FileReader)
            self.assertIsInstance(r, io.RawIOBase)
            self.assertIsInstance(r.info, FileInfo)
            self.assertEqual((r.info.name, r.info.path, r.info.type, r.info.size, r.info.mode), ("ünï €.bin", "/tmp/ünï €.bin", "file", len(big), 0o640))
            self.assertTrue(r.info.is_file)
            self.assertEqual(r.info.mtime, datetime(2025, 6, 1, tzinfo=timezone.utc))
            self.assertEqual(r.length, len(big))
            chunks = list(r)
        self.assertGreater(len(chunks), 1)
        self.assertEqual(b"".join(chunks), big)
        self.assertEqual(r.bytes_read, len(big))
        # A file-like object: shutil, and reads of any size.
        out = io.BytesIO()
        with self.sb.files.read_stream("/tmp/ünï €.bin") as r:
            self.assertEqual(r.read(5), big[:5])
            shutil.copyfileobj(r, out)
        self.assertEqual(out.getvalue(), big[5:])
        # Left early: the connection goes, and the client goes on.
        with self.sb.files.read_stream("/tmp/ünï €.bin") as r:
            next(iter(r))
        self.assertTrue(r.closed)
        self.assertEqual(self.sb.files.stat("/tmp/ünï €.bin").size, len(big))

    def test_a_read_that_breaks_off_is_stream_ended(self) -> None:
        info = {"name": "f", "path": "/f", "type": "file", "size": 1000, "mode": 420, "uid": 0, "gid": 0, "mtime": "2025-01-01T00:00:00Z"}

        def cut(h: Handler, rec: Recorded) -> None:
            h.send_response(200)
            h.send_header("Content-Type", "application/octet-stream")
            h.send_header("Content-Length", "1000")
            h.send_header("X-Shard-File-Stat", stat_header(info))
            h.end_headers()
            h.wfile.write(b"x" * 100)
            h.wfile.flush()
            time.sleep(0.05)
            h.close_connection = True  # as the server does: panic(http.ErrAbortHandler)

        self.fake.route("GET", FILES, cut)
        with self.assertRaises(ShardError) as cm:
            self.sb.files.read("/f")
        self.assertEqual((cm.exception.code, cm.exception.status), ("stream_ended", 502))
        self.assertIn("after 100 of 1000 bytes", cm.exception.message)
        got = 0
        with self.assertRaises(ShardError) as cm:
            with self.sb.files.read_stream("/f") as r:
                for c in r:
                    got += len(c)
        self.assertEqual(cm.exception.code, "stream_ended")
        self.assertEqual(got, 100)

        # An archive has no length: a chunked body without its end is the error.
        def cut_tar(h: Handler, rec: Recorded) -> None:
            h.send_response(200)
            h.send_header("Content-Type", "application/x-tar")
            h.send_header("X-Shard-File-Stat", stat_header(dict(info, type="dir", size=0)))
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            h.write_bytes(b"\1" * 1536)
            time.sleep(0.05)
            h.close_connection = True

        self.fake.route("GET", FILES, cut_tar)
        with self.sb.files.read_archive("/d") as r:
            self.assertIsNone(r.length)
            with self.assertRaises(ShardError) as cm:
                r.read()
        self.assertEqual(cm.exception.code, "stream_ended")

        # No stat header, or one that is not base64 JSON: bad_response.
        for header in (None, "not base64 json!"):
            def plain(h: Handler, rec: Recorded, header: Optional[str] = header) -> None:
                h.send_response(200)
                h.send_header("Content-Type", "application/octet-stream")
                h.send_header("Content-Length", "2")
                if header:
                    h.send_header("X-Shard-File-Stat", header)
                h.end_headers()
                h.wfile.write(b"hi")

            self.fake.route("GET", FILES, plain)
            with self.assertRaises(ShardError) as cm:
                self.sb.files.read("/f")
            self.assertEqual(cm.exception.code, "bad_response")
        self.assertEqual(self.sb.refresh().id, SB["id"])  # the client goes on

    def test_errors_carry_the_apis_code_and_status(self) -> None:
        def code(fn: Any) -> Any:
            with self.assertRaises(ShardError) as cm:
                fn()
            return (cm.exception.code, cm.exception.status)

        f = self.sb.files
        self.assertEqual(code(lambda: f.read("/nope")), ("file_not_found", 404))
        self.assertEqual(code(lambda: f.stat("/nope")), ("file_not_found", 404))
        self.assertEqual(code(lambda: f.read("/tmp")), ("is_a_directory", 400))
        self.assertEqual(code(lambda: f.list("/nope")), ("file_not_found", 404))
        f.write("/tmp/d/x", b"x", parents=True)
        self.assertEqual(code(lambda: f.remove("/tmp/d")), ("directory_not_empty", 409))
        self.assertEqual(code(lambda: self.shard.files("no-such-box").stat("/")), ("not_found", 404))
        self.fake.route("PUT", FILES, status=507, body={"code": "disk_full", "message": "sandbox base's disk is full (its bound is 256MiB)"})
        self.assertEqual(code(lambda: f.write("/tmp/big", b"x" * 10)), ("disk_full", 507))
        self.assertEqual(code(lambda: f.write_stream("/tmp/big", iter([b"x" * 10]))), ("disk_full", 507))
        self.fake.route("GET", FILES + "/stat", lambda h, rec: h.send_raw(502, b"bad gateway"))
        self.assertEqual(code(lambda: f.stat("/")), ("http_502", 502))
        # Refused before sending.
        for bad in (lambda: f.write("/tmp/x", b"x", mode="999"), lambda: f.write("/tmp/x", b"x", mode=0o10000),
                    lambda: f.write("/tmp/x", b"x", uid=-1), lambda: f.stat(""), lambda: f.list("/", limit=0)):
            with self.assertRaises(ValueError):
                bad()
        with self.assertRaises(TypeError):
            f.write("/tmp/x", 42)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            f.write_stream("/tmp/x", 42)

    def test_stat_list_remove_send_follow_link_limit_recursive(self) -> None:
        f = self.sb.files
        for n in ("b", "a", "c"):
            f.write(f"/tmp/{n}", n)
        self.fs.files["/tmp/link"] = {"type": "symlink", "mode": 0o777, "link": "a"}

        link = f.stat("/tmp/link")
        self.assertEqual(q(self.last("GET", "/stat")), {"path": "/tmp/link"})
        self.assertEqual((link.type, link.link, link.is_symlink), ("symlink", "a", True))
        target = f.stat("/tmp/link", follow_link=True)
        self.assertEqual(q(self.last("GET", "/stat")), {"path": "/tmp/link", "follow_link": "true"})
        self.assertEqual((target.type, target.path, target.size), ("file", "/tmp/a", 1))

        ls = f.list("/tmp")
        self.assertIsInstance(ls, FileList)
        self.assertEqual(q(self.last("GET", "/list")), {"path": "/tmp"})
        self.assertEqual(ls.names, ["a", "b", "c", "link"])
        self.assertEqual([e.name for e in ls], ls.names)
        self.assertFalse(ls.truncated)
        two = f.list("/tmp", limit=2)
        self.assertEqual(q(self.last("GET", "/list")), {"path": "/tmp", "limit": "2"})
        self.assertEqual((len(two), two.truncated), (2, True))

        gone = f.remove("/tmp/a")
        self.assertEqual(q(self.last("DELETE")), {"path": "/tmp/a"})
        self.assertEqual((gone.path, gone.type), ("/tmp/a", "file"))
        self.assertFalse(f.exists("/tmp/a"))
        self.assertTrue(f.exists("/tmp/b"))
        f.remove("/tmp", recursive=True)
        self.assertEqual(q(self.last("DELETE")), {"path": "/tmp", "recursive": "true"})
        self.assertFalse(f.exists("/tmp/b"))

    def test_write_stream_is_chunked_as_the_source_gives(self) -> None:
        made: List[float] = []

        def slow() -> Iterator[bytes]:
            for i in range(4):
                made.append(time.monotonic())
                yield bytes([i]) * (64 << 10)
                time.sleep(0.15)
            yield b"tail"

        res = self.sb.files.write_stream("/tmp/s.bin", slow(), mode=0o600)
        self.assertEqual(res.bytes, 4 * (64 << 10) + 4)
        put = self.last("PUT")
        self.assertEqual(put.headers["Transfer-Encoding"], "chunked")
        self.assertNotIn("Content-Length", put.headers)
        self.assertEqual(q(put)["mode"], "600")
        self.assertTrue(put.body_ended)
        # The first chunk reached the server while the source was still making the rest.
        self.assertLess(put.pieces[0][0], made[3])
        back = self.sb.files.read("/tmp/s.bin")
        self.assertEqual(back[-4:], b"tail")
        self.assertEqual(back[3 * (64 << 10)], 3)

        # A source that reuses its buffer.
        def reusing() -> Iterator[bytearray]:
            buf = bytearray(64 << 10)
            for i in range(20):
                buf[:] = bytes([i]) * len(buf)
                yield buf

        self.sb.files.write_stream("/tmp/reused.bin", reusing())
        reused = self.sb.files.read("/tmp/reused.bin")
        self.assertEqual(reused, b"".join(bytes([i]) * (64 << 10) for i in range(20)))

        # A file object: a regular file goes with its length (what is left of it).
        with tempfile.NamedTemporaryFile() as tmp:
            tmp.write(b"skip:" + b"y" * 100_000)
            tmp.flush()
            with open(tmp.name, "rb") as src:
                src.read(5)
                self.sb.files.write_stream("/tmp/file.bin", src)
        put = self.last("PUT")
        self.assertEqual(put.headers["Content-Length"], "100000")
        self.assertEqual(self.sb.files.read("/tmp/file.bin"), b"y" * 100_000)
        # Any file-like object with read(), and str chunks.
        self.sb.files.write_stream("/tmp/b.txt", io.BytesIO(b"from BytesIO"))
        self.assertEqual(self.last("PUT").headers["Transfer-Encoding"], "chunked")
        self.assertEqual(self.sb.files.read_text("/tmp/b.txt"), "from BytesIO")
        self.sb.files.write_stream("/tmp/s.txt", ["str ", "chunks"])
        self.assertEqual(self.sb.files.read_text("/tmp/s.txt"), "str chunks")

    def test_an_early_refusal_stops_the_upload_and_a_failing_source_writes_nothing(self) -> None:
        pulled = itertools.count()

        def endless() -> Iterator[bytes]:
            while True:
                next(pulled)
                yield b"\0" * (256 << 10)

        t0 = time.monotonic()
        with self.assertRaises(ShardError) as cm:
            self.sb.files.write_stream("/no/such/dir/f", endless())
        self.assertEqual((cm.exception.code, cm.exception.status), ("file_not_found", 404))
        self.assertLess(time.monotonic() - t0, 5)
        self.assertLess(next(pulled), 1000, "the source is not read to its end")

        def failing() -> Iterator[bytes]:
            yield b"half of it"
            time.sleep(0.05)
            raise OSError("disk read error")

        with self.assertRaises(ShardError) as cm:
            self.sb.files.write_stream("/tmp/half", failing())
        self.assertEqual(cm.exception.code, "source_failed")
        self.assertIsInstance(cm.exception.__cause__, OSError)
        self.assertIn("disk read error", cm.exception.message)
        time.sleep(0.1)
        self.assertFalse(self.last("PUT").body_ended, "the body was cut, not ended")
        self.assertFalse(self.sb.files.exists("/tmp/half"))
        self.sb.files.write("/tmp/ok", b"ok")  # the client goes on

    def test_archives_both_ways(self) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in (("app/a.txt", b"A"), ("app/sub/b.txt", b"B" * 5000)):
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
        raw = buf.getvalue()
        res = self.sb.files.write_archive("/srv", raw)
        self.assertEqual(res.notes, ["dev/null: a device node: skipped"])
        put = self.last("PUT")
        self.assertEqual(put.headers["Content-Type"], "application/x-tar")
        self.assertEqual(put.headers["Content-Length"], str(len(raw)))
        self.assertEqual(q(put), {"path": "/srv"})
        self.sb.files.write_archive("/srv2", io.BytesIO(raw))
        self.assertEqual(self.last("PUT").headers["Transfer-Encoding"], "chunked")

        with self.sb.files.read_archive("/srv") as r:
            get = self.last("GET")
            self.assertEqual(get.headers["Accept"], "application/x-tar")
            self.assertEqual(q(get), {"path": "/srv"})
            self.assertTrue(r.info.is_dir)
            with tarfile.open(fileobj=r, mode="r|") as tar:
                got = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
        self.assertEqual(got, {"app/a.txt": b"A", "app/sub/b.txt": b"B" * 5000})
        self.sb.files.read_archive("/srv", follow_link=True).close()
        self.assertEqual(q(self.last("GET"))["follow_link"], "true")
        with self.assertRaises(TypeError):
            self.sb.files.write_archive("/srv", "not bytes")

    def test_shard_files_by_name(self) -> None:
        self.fake.route("GET", "/sandboxes/box%20one/files/stat", body={"name": "/", "path": "/", "type": "dir", "size": 0, "mode": 493, "uid": 0, "gid": 0, "mtime": "2025-01-01T00:00:00Z"})
        files = self.shard.files("box one")
        self.assertEqual(files.sandbox, "box one")
        self.assertTrue(files.stat("/").is_dir)
        self.assertEqual(self.sb.files.sandbox, SB["id"])


class UnixSocketFilesTest(FilesBase):
    """The same upload over the server's Unix socket."""

    unix = True

    def test_write_stream_and_early_refusal_over_a_unix_socket(self) -> None:
        res = self.sb.files.write_stream("/tmp/u.bin", (bytes([i]) * 70_000 for i in range(5)))
        self.assertEqual(res.bytes, 350_000)
        self.assertEqual(len(self.sb.files.read("/tmp/u.bin")), 350_000)
        with self.assertRaises(ShardError) as cm:
            self.sb.files.write_stream("/no/dir/f", itertools.repeat(b"\0" * (1 << 20)))
        self.assertEqual(cm.exception.code, "file_not_found")


if __name__ == "__main__":
    unittest.main()
