"""HTTP/1.1 to the shard server over TCP (http, https) or its Unix socket,
with a small pool of keep-alive connections shared by every thread."""

from __future__ import annotations

import http.client
import json
import select
import socket
import ssl
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple
from urllib.parse import quote, urlsplit

from ._errors import ShardError, unreachable

__all__ = ["Transport", "Response", "FramedBody", "DEFAULT_SOCKET", "PROJECT_HEADER", "REQUEST_ID_HEADER", "STREAM_TYPE", "esc"]

DEFAULT_SOCKET = "/run/shard/shard.sock"
"""Where ``shard serve`` listens by default: the administrator's way in."""

USER_AGENT = "useshards-python"

PROJECT_HEADER = "Shard-Project"
"""The header that names the project a request acts in."""

REQUEST_ID_HEADER = "X-Request-Id"
"""The header on every answer that gives the request's id in the server's
access log (:attr:`ShardError.request_id` of an error answer)."""

STREAM_TYPE = "application/vnd.shard.stream"
"""The binary exec stream's media type (docs/exec-stream.md), both ways."""

_Conn = http.client.HTTPConnection

# Errors that mean a reused keep-alive connection had been closed by the
# server before it read the request: safe to send again on a fresh one.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


UPLOAD_PIECE = 1 << 20
"""The most of an upload sent in one go (and so between two looks for an
early answer)."""


def esc(s: str) -> str:
    """Escapes one path segment (an id, a name)."""
    return quote(s, safe="")


class _UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTPConnection to a Unix socket; the Host header is ``shard``."""

    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("shard", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


class Response:
    """A 2xx answer whose body has not been read yet (a stream), holding its
    connection until :meth:`close` or :meth:`release`."""

    def __init__(self, transport: "Transport", conn: _Conn, resp: http.client.HTTPResponse) -> None:
        self._transport = transport
        self._conn: Optional[_Conn] = conn
        self.raw = resp
        self.status = resp.status

    @property
    def content_type(self) -> str:
        """The answer's media type, lower case, without parameters."""
        return (self.raw.getheader("Content-Type") or "").split(";")[0].strip().lower()

    def readline(self) -> bytes:
        """One line of the body, with its newline; b"" at the end."""
        try:
            return self.raw.readline()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise unreachable(self._transport.where, e) from None

    def read(self, n: int) -> bytes:
        """n bytes of the body, fewer only at its end."""
        try:
            data = self.raw.read(n)
            if len(data) == n or not data:
                return data
            parts = [data]
            got = len(data)
            while got < n:
                more = self.raw.read(n - got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            return b"".join(parts)
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise unreachable(self._transport.where, e) from None

    def release(self) -> None:
        """Reads what is left of the body and gives the connection back to
        the pool (for a stream that reached its end)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            self.raw.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            return
        self._transport._put(conn, self.raw)

    def shutdown(self) -> None:
        """Shuts the connection's socket down, from any thread: a read or a
        send blocked on it returns (the reader then closes the stream)."""
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Drops the connection (for a stream left before its end)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            sock = conn.sock
            if sock is not None:
                try:  # wakes a thread blocked sending the request body
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            conn.close()


class FramedBody:
    """The open body of a request sent with ``Content-Type:
    application/vnd.shard.stream`` and ``Transfer-Encoding: chunked``: each
    frame goes as one chunk, from any thread, while the answer is read."""

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.ended = False  # guarded by _lock: the final chunk was sent (or the body was given up)

    def send(self, typ: bytes, payload: bytes, timeout: Optional[float] = None) -> bool:
        """Sends one frame; False if the body has ended or could not take it
        within timeout (None: waits). Raises OSError if the connection broke."""
        frame = typ + len(payload).to_bytes(4, "big")
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        try:
            if self.ended:
                return False
            sock = self._conn.sock
            if sock is None:
                self.ended = True
                return False
            n = 5 + len(payload)
            if n <= 65536:
                sock.sendall(b"%x\r\n%s%s\r\n" % (n, frame, payload))
            else:  # no copy of a big payload
                sock.sendall(b"%x\r\n%s" % (n, frame))
                sock.sendall(payload)
                sock.sendall(b"\r\n")
            return True
        except OSError:
            self.ended = True
            raise
        finally:
            self._lock.release()

    def finish(self, timeout: float) -> bool:
        """Sends the final chunk, unless a frame is still being sent after
        timeout seconds; says whether the body ended cleanly."""
        if not self._lock.acquire(timeout=timeout):
            return False
        try:
            if self.ended:
                return False
            self.ended = True
            sock = self._conn.sock
            if sock is None:
                return False
            sock.sendall(b"0\r\n\r\n")
            return True
        except OSError:
            return False
        finally:
            self._lock.release()

    def abandon(self) -> None:
        """Marks the body given up (its connection is being closed)."""
        self.ended = True


class Transport:
    """Sends requests to one server. Thread-safe: connections are taken from
    and given back to a pool under a lock; each is used by one request at a
    time.

    ``remote`` is ``http://host:port``, ``https://host:port`` or
    ``unix:///path/to.sock``. ``timeout`` bounds each wait for the server on
    ordinary calls (None: as long as it takes); ``connect_timeout`` bounds
    making a connection.
    """

    def __init__(
        self,
        remote: str,
        api_key: Optional[str],
        timeout: Optional[float],
        connect_timeout: Optional[float] = 10.0,
        ssl_context: Optional[ssl.SSLContext] = None,
        max_idle: int = 8,
        project: Optional[str] = None,
    ) -> None:
        u = urlsplit(remote.strip())
        scheme = u.scheme.lower()
        self._socket_path: Optional[str] = None
        self._host = ""
        self._port: Optional[int] = None
        if scheme == "unix":
            path = (u.netloc + u.path) if u.netloc else u.path
            if not path:
                raise ShardError("invalid_argument", f"remote {remote!r}: a unix:// remote needs a path, like unix:///run/shard/shard.sock")
            self._socket_path = path
            self.where = f"unix://{path}"
        elif scheme in ("http", "https"):
            if not u.hostname:
                raise ShardError("invalid_argument", f"remote {remote!r} has no host: use e.g. http://10.0.0.5:7070")
            self._host = u.hostname
            try:
                self._port = u.port
            except ValueError:
                raise ShardError("invalid_argument", f"remote {remote!r} has a bad port") from None
            self.where = f"{scheme}://{u.netloc}"
        else:
            raise ShardError(
                "invalid_argument",
                f"remote {remote!r} is not an http(s):// URL or a unix:// socket path",
            )
        self._scheme = scheme
        self._ssl = ssl_context if ssl_context is not None else (ssl.create_default_context() if scheme == "https" else None)
        self._api_key = api_key or None
        self._project = project or None
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._max_idle = max_idle
        self._idle: List[_Conn] = []  # guarded by _lock
        self._lock = threading.Lock()
        self._closed = False  # guarded by _lock

    # -- connections ---------------------------------------------------------

    def _new_conn(self) -> _Conn:
        if self._socket_path is not None:
            return _UnixHTTPConnection(self._socket_path, self.connect_timeout)
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.connect_timeout, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.connect_timeout)

    def _get(self) -> Tuple[_Conn, bool]:
        """A connection, and whether it was reused from the pool."""
        with self._lock:
            if self._closed:
                raise ShardError("closed", "this Shard client is closed")
            while self._idle:
                conn = self._idle.pop()
                if _alive(conn):
                    return conn, True
                conn.close()
        return self._new_conn(), False

    def _put(self, conn: _Conn, resp: http.client.HTTPResponse) -> None:
        """Gives a connection whose answer was read to the end back to the pool."""
        if resp.will_close or conn.sock is None:
            conn.close()
            return
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Closes every idle connection; later requests fail. Streams still
        open keep their connection until they end."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    # -- requests ------------------------------------------------------------

    def _headers(self, has_body: bool, accept: str, content_type: str = "application/json") -> Dict[str, str]:
        h = {"User-Agent": USER_AGENT, "Accept": accept}
        if has_body:
            h["Content-Type"] = content_type
        if self._api_key:
            h["Authorization"] = "Bearer " + self._api_key
        if self._project:
            h[PROJECT_HEADER] = self._project
        return h

    def _send(
        self, method: str, path: str, body: Optional[bytes], accept: str, read_timeout: Optional[float]
    ) -> Tuple[_Conn, http.client.HTTPResponse]:
        """Sends one request and reads the answer's head."""
        headers = self._headers(body is not None, accept)
        url = "/v0" + path
        return self._exchange(lambda conn: conn.request(method, url, body=body, headers=headers), read_timeout)

    def _exchange(
        self, write: Callable[[_Conn], None], read_timeout: Optional[float]
    ) -> Tuple[_Conn, http.client.HTTPResponse]:
        """Sends a request with ``write`` on a pooled connection and reads the
        answer's head. A reused connection the server had closed is replaced
        once, transparently."""
        for attempt in (0, 1):
            conn, reused = self._get()
            try:
                if conn.sock is None:
                    conn.connect()
                assert conn.sock is not None
                conn.sock.settimeout(read_timeout)
                write(conn)
                return conn, conn.getresponse()
            except _STALE as e:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise unreachable(self.where, e) from None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise unreachable(self.where, e) from None
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def request(
        self, method: str, path: str, payload: Any = None, want_status: bool = False
    ) -> Any:
        """Sends a JSON request and returns the decoded JSON answer (None for
        an empty body); with ``want_status``, a (status, answer) pair. A
        non-2xx answer raises :class:`ShardError`."""
        body = None if payload is None else json.dumps(payload, separators=(",", ":")).encode("utf-8")
        conn, resp = self._send(method, path, body, "application/json", self.timeout)
        try:
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise unreachable(self.where, e) from None
        self._put(conn, resp)
        if resp.status >= 300:
            raise ShardError.from_response(resp.status, resp.reason, data, resp.getheader(REQUEST_ID_HEADER))
        out: Any = None
        if data.strip():
            try:
                out = json.loads(data.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise ShardError("bad_response", f"the server's answer to {method} {path} is not JSON: {e}", resp.status) from None
        return (resp.status, out) if want_status else out

    def stream(self, method: str, path: str, payload: Any, accept: str = "application/x-ndjson") -> Response:
        """Sends a JSON request (no body for a None payload) whose answer is
        a stream (NDJSON, the binary exec stream, a file's bytes); no read
        timeout applies. A non-2xx answer raises :class:`ShardError`."""
        body = None if payload is None else json.dumps(payload, separators=(",", ":")).encode("utf-8")
        conn, resp = self._send(method, path, body, accept, None)
        return self._streamed(conn, resp)

    def stream_framed(self, method: str, path: str, first: bytes, accept: str = STREAM_TYPE) -> Tuple[Response, FramedBody]:
        """Sends a request whose body is frames (``Content-Type:
        application/vnd.shard.stream``, chunked): its head and ``first`` (the
        Q frame) now, the rest through the returned :class:`FramedBody`,
        from another thread while the answer's body is read (full duplex).
        Waits for the answer's head; a non-2xx answer raises
        :class:`ShardError` (and the connection, its body unfinished, is
        dropped)."""
        headers = self._headers(True, accept, STREAM_TYPE)
        headers["Transfer-Encoding"] = "chunked"
        url = "/v0" + path

        def write(conn: _Conn) -> None:
            conn.putrequest(method, url, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders()
            conn.send(b"%x\r\n%s\r\n" % (len(first), first))

        conn, resp = self._exchange(write, None)
        if resp.status >= 300:
            try:
                data = resp.read()
            except (OSError, http.client.HTTPException):
                data = b""
            conn.close()
            raise ShardError.from_response(resp.status, resp.reason, data, resp.getheader(REQUEST_ID_HEADER))
        return Response(self, conn, resp), FramedBody(conn)

    def upload(
        self,
        method: str,
        path: str,
        content_type: str,
        pieces: Iterable[Any],
        length: Optional[int] = None,
    ) -> Any:
        """Sends a request whose body is ``pieces`` (bytes-like, sent as
        they come; ``length`` known: with Content-Length, else chunked) and
        returns the decoded JSON answer. The body is never held whole.

        An answer that comes before the body is all sent (the server
        refused early) stops the sending and is what counts: its error is
        raised. An exception from ``pieces`` drops the connection (a
        chunked body without its end, or one shorter than its length,
        writes nothing) and is raised as ShardError ``source_failed``, the
        exception its ``__cause__``.
        """
        headers = self._headers(True, "application/json", content_type)
        if length is not None:
            headers["Content-Length"] = str(length)
        else:
            headers["Transfer-Encoding"] = "chunked"
        url = "/v0" + path
        for attempt in (0, 1):
            conn, reused = self._get()
            try:
                if conn.sock is None:
                    conn.connect()
                assert conn.sock is not None
                conn.sock.settimeout(self.timeout)
                conn.putrequest(method, url, skip_accept_encoding=True)
                for k, v in headers.items():
                    conn.putheader(k, v)
                conn.endheaders()
                break
            except _STALE as e:
                conn.close()
                if reused and attempt == 0:
                    continue  # nothing of the body was taken yet: a fresh connection
                raise unreachable(self.where, e) from None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise unreachable(self.where, e) from None
            except BaseException:
                conn.close()
                raise
        else:  # pragma: no cover
            raise AssertionError("unreachable")
        sock = conn.sock
        assert sock is not None
        # Looking for an early answer needs the raw socket: a TLS one is
        # readable for records that are no answer (session tickets).
        watch = not isinstance(sock, ssl.SSLSocket)
        whole = False  # the body was sent to its end
        try:
            whole = self._send_body(sock, pieces, length is None, watch)
        except OSError:
            pass  # the server stopped reading: its answer may say why
        except BaseException:
            conn.close()
            raise
        try:
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise unreachable(self.where, e) from None
        if whole:
            self._put(conn, resp)
        else:
            conn.close()  # the body was left unfinished: the connection cannot be reused
        if resp.status >= 300:
            raise ShardError.from_response(resp.status, resp.reason, data, resp.getheader(REQUEST_ID_HEADER))
        try:
            return json.loads(data.decode("utf-8")) if data.strip() else None
        except (UnicodeDecodeError, ValueError) as e:
            raise ShardError("bad_response", f"the server's answer to {method} {path} is not JSON: {e}", resp.status) from None

    def _send_body(self, sock: socket.socket, pieces: Iterable[Any], chunked: bool, watch: bool) -> bool:
        """Sends the pieces (chunked or not); False when the server answered
        before the end (then nothing more is sent). Raises ShardError
        ``source_failed`` when pieces fails, OSError when the connection
        does."""
        it = iter(pieces)
        while True:
            try:
                piece = next(it, None)
            except Exception as e:
                raise ShardError("source_failed", f"reading the data to send failed: {e!r}; nothing of it was written") from e
            if piece is None:
                break
            view = memoryview(piece).cast("B")
            if not view:
                continue
            for off in range(0, len(view), UPLOAD_PIECE):
                part = view[off : off + UPLOAD_PIECE]
                if chunked and len(part) <= 65536:
                    ok = self._send_part(sock, b"%x\r\n%s\r\n" % (len(part), part), watch)
                elif chunked:  # no copy of a big piece
                    ok = self._send_part(sock, b"%x\r\n" % len(part), watch) and self._send_part(sock, part, watch) and self._send_part(sock, b"\r\n", watch)
                else:
                    ok = self._send_part(sock, part, watch)
                if not ok:
                    return False
        if chunked and not self._send_part(sock, b"0\r\n\r\n", watch):
            return False
        return True

    def _send_part(self, sock: socket.socket, data: Any, watch: bool) -> bool:
        """Sends all of data, unless an answer arrives first (False)."""
        view = memoryview(data)
        if not watch:
            sock.sendall(view)
            return True
        while view:
            r, w, _ = select.select([sock], [sock], [], self.timeout)
            if r:
                return False
            if not w:
                raise socket.timeout("timed out sending the request body")
            n = sock.send(view)
            view = view[n:]
        return True

    def _streamed(self, conn: _Conn, resp: http.client.HTTPResponse) -> Response:
        if resp.status >= 300:
            try:
                data = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                data = b""
            else:
                self._put(conn, resp)
            raise ShardError.from_response(resp.status, resp.reason, data, resp.getheader(REQUEST_ID_HEADER))
        return Response(self, conn, resp)


def _alive(conn: _Conn) -> bool:
    """False when an idle connection was closed by the server (readable
    with nothing to read means EOF; anything else unasked-for is junk)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        r, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not r

