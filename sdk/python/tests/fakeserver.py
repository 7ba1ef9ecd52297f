"""A fake shard server for the unit tests: http.server in a thread, on TCP or
a Unix socket, answering routes the test declares and recording every
request. A framed request body (Content-Type application/vnd.shard.stream,
chunked) is read as it comes: its Q frame before the route runs, the rest
through ``Handler.client_frames()`` while the route writes its answer.
Every answer carries an ``X-Request-Id``, as the server's do."""

from __future__ import annotations

import json
import os
import socket
import socketserver
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

# The tests use the source tree, installed or not.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))


@dataclass
class Recorded:
    """One request the fake got."""

    method: str
    path: str
    query: Dict[str, List[str]]
    headers: Dict[str, str]
    body: bytes  # for a framed body: its Q frame's payload
    conn: int  # which connection it came on
    frames: List[Tuple[bytes, bytes]] = field(default_factory=list)  # a framed body's, Q first, as they come
    body_ended: bool = False  # a chunked body's final chunk came
    pieces: List[Tuple[float, int]] = field(default_factory=list)  # a chunked body's chunks (time.monotonic(), size), as they came
    request_id: str = ""  # the X-Request-Id of its answer

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


Route = Callable[["Handler", Recorded], None]

STREAM = "application/vnd.shard.stream"


def frame(typ: bytes, payload: bytes = b"") -> bytes:
    """One frame, encoded here (not by the SDK) so the tests check the wire."""
    return typ + len(payload).to_bytes(4, "big") + payload


class Handler(BaseHTTPRequestHandler):
    """Serves one connection of the fake; HTTP/1.1 with keep-alive."""

    protocol_version = "HTTP/1.1"
    server: Any

    def setup(self) -> None:
        super().setup()
        if self.connection.family != socket.AF_UNIX:  # as Go servers do: no Nagle delay on small writes
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        fake: FakeServer = self.server.fake
        with fake.lock:
            fake.connections += 1
            self.conn_no = fake.connections

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass

    def do_GET(self) -> None:
        self._serve()

    do_POST = do_PUT = do_DELETE = do_GET

    def send_response(self, code: int, message: Optional[str] = None) -> None:
        super().send_response(code, message)
        rid = getattr(self, "_request_id", "")
        if rid:
            self.send_header("X-Request-Id", rid)

    def _serve(self) -> None:
        fake: FakeServer = self.server.fake
        u = urlsplit(self.path)
        self._request_id = fake.new_request_id()
        self._frames: Optional[Iterator[Tuple[bytes, bytes]]] = None
        self._pieces: Optional[Iterator[bytes]] = None
        if (self.headers.get("Content-Type") or "").split(";")[0] == STREAM:
            rec = Recorded(self.command, u.path, parse_qs(u.query), {k: v for k, v in self.headers.items()}, b"", self.conn_no)
            self._rec = rec
            self._frames = self._read_frames()
            typ, body = next(self._frames, (b"", b""))
            if typ != b"Q":
                self.send_json(400, {"code": "invalid_argument", "message": "the first frame must be Q"})
                self.close_connection = True
                return
            rec.body = body
        elif (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            # Read by the route as it comes (body_pieces), or drained after it.
            rec = Recorded(self.command, u.path, parse_qs(u.query), {k: v for k, v in self.headers.items()}, b"", self.conn_no)
            self._rec = rec
            self._pieces = self._chunks()
        else:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            rec = Recorded(self.command, u.path, parse_qs(u.query), {k: v for k, v in self.headers.items()}, body, self.conn_no)
            self._rec = rec
        rec.request_id = self._request_id
        with fake.lock:
            fake.requests.append(rec)
            route = fake.routes.get((self.command, u.path))
        if route is None:
            self.send_json(404, {"code": "not_found", "message": f"no such endpoint: {self.command} {u.path}"})
            return
        route(self, rec)
        rest = self._frames if self._frames is not None else self._pieces
        if rest is not None:
            # Read the body to its end (as a server that keeps the
            # connection must), unless the route already did.
            self.connection.settimeout(2)
            try:
                for _ in rest:
                    pass
            except (OSError, ValueError):
                self.close_connection = True
        if fake.close_after_each:
            self.close_connection = True

    # -- a framed request body -------------------------------------------------

    def _chunks(self) -> Iterator[bytes]:
        """The chunks of a chunked request body, as they come."""
        while True:
            line = self.rfile.readline()
            if not line:
                raise OSError("the body ended without its final chunk")
            n = int(line.split(b";")[0].strip(), 16)
            if n == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                self._rec.body_ended = True
                return
            data = self.rfile.read(n)
            self.rfile.read(2)
            yield data

    def _read_frames(self) -> Iterator[Tuple[bytes, bytes]]:
        buf = b""
        for c in self._chunks():
            buf += c
            while len(buf) >= 5:
                n = int.from_bytes(buf[1:5], "big")
                if n > 1 << 20:
                    raise OSError(f"a client frame of {n} bytes: more than 1 MiB")
                if len(buf) < 5 + n:
                    break
                f = (buf[0:1], buf[5 : 5 + n])
                buf = buf[5 + n :]
                self._rec.frames.append(f)
                yield f
        if buf:
            raise OSError(f"the body ended inside a frame ({len(buf)} bytes left)")

    def body_pieces(self) -> Iterator[bytes]:
        """A chunked body's chunks, as they arrive (recorded in rec.pieces
        and rec.body); a body with a Content-Length, read already, in one."""
        if self._pieces is None:
            if self._rec.body:
                yield self._rec.body
            return
        for c in self._pieces:
            self._rec.pieces.append((time.monotonic(), len(c)))
            self._rec.body += c
            yield c

    def client_frames(self) -> Iterator[Tuple[bytes, bytes]]:
        """The framed body's frames after Q, as they arrive (nothing for a JSON body)."""
        if self._frames is None:
            return iter(())
        return self._frames

    # -- the binary exec stream ------------------------------------------------

    def start_frames(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", STREAM)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def write_bytes(self, data: bytes) -> None:
        """Raw bytes of the answer's body, as one HTTP chunk."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def write_frame(self, typ: bytes, payload: bytes = b"") -> None:
        self.write_bytes(frame(typ, payload))

    # -- answers -------------------------------------------------------------

    def send_json(self, status: int, doc: Any) -> None:
        data = json.dumps(doc).encode()
        self.send_raw(status, data, "application/json")

    def send_raw(self, status: int, data: bytes, ctype: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def write_line(self, doc: Any) -> None:
        data = (json.dumps(doc) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class FakeServer:
    """Start with ``with FakeServer() as fake:``; ``fake.url`` is its remote."""

    def __init__(self, unix: bool = False) -> None:
        self.lock = threading.Lock()
        self.requests: List[Recorded] = []
        self.routes: Dict[Tuple[str, str], Route] = {}
        self.connections = 0
        self.close_after_each = False
        self._answers = 0
        self._unix = unix
        self._dir: Optional[str] = None
        self._srv: Any = None
        self._thread: Optional[threading.Thread] = None

    def route(self, method: str, path: str, fn: Optional[Route] = None, *, status: int = 200, body: Any = None) -> None:
        """Answers METHOD /v0PATH with fn, or with status and the JSON body."""
        def reply(h: Handler, rec: Recorded) -> None:
            h.send_json(status, body if body is not None else {})

        self.routes[(method, "/v0" + path)] = fn if fn is not None else reply

    def new_request_id(self) -> str:
        """The X-Request-Id of the next answer."""
        with self.lock:
            self._answers += 1
            return f"fake-{self._answers}"

    def start(self) -> "FakeServer":
        if self._unix:
            self._dir = tempfile.mkdtemp(prefix="shard-fake-")
            path = os.path.join(self._dir, "shard.sock")
            self._srv = _UnixServer(path, Handler)
            self.url = "unix://" + path
        else:
            self._srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            self._srv.daemon_threads = True
            self.url = "http://127.0.0.1:%d" % self._srv.server_address[1]
        self._srv.fake = self
        self._thread = threading.Thread(target=self._srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
        if self._dir:
            try:
                os.unlink(os.path.join(self._dir, "shard.sock"))
                os.rmdir(self._dir)
            except OSError:
                pass

    def __enter__(self) -> "FakeServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def last(self, method: str, path: str) -> Recorded:
        """The last request to METHOD /v0PATH."""
        with self.lock:
            for r in reversed(self.requests):
                if r.method == method and r.path == "/v0" + path:
                    return r
        raise AssertionError(f"no {method} /v0{path} among {[(r.method, r.path) for r in self.requests]}")


def sandbox_json(id: str = "0123456789ab", name: str = "base", **kw: Any) -> Dict[str, Any]:
    """A sandbox as the server shows it."""
    d: Dict[str, Any] = {
        "id": id,
        "name": name,
        "project": "default",
        "image": "python:3.12-slim",
        "image_digest": "sha256:00",
        "provider": "gvisor",
        "state": "running",
        "memory_bytes": 536870912,
        "memory_mib": 512,
        "cpu": 1,
        "disk_bytes": 10737418240,
        "pids_limit": 4096,
        "env": ["PATH=/usr/bin"],
        "ip": "10.88.0.2",
        "oom_kills": 0,
        "session": name,
        "grants": [],
        "created_at": "2025-01-01T12:00:00.123456789Z",
        "started_at": "2025-01-01T12:00:01Z",
    }
    d.update(kw)
    return d
