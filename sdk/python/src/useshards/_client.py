"""Shard (the client), Sandbox, ExecStream, Credentials and Environment."""

from __future__ import annotations

import base64
import binascii
import hashlib
import inspect
import json
import os
import ssl
import threading
from types import TracebackType
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Type, Union, cast
from urllib.parse import urlencode

from ._errors import ShardError
from ._files import Files, pieces_of
from ._transport import DEFAULT_SOCKET, STREAM_TYPE, FramedBody, Response, Transport, esc
from ._types import (
    Checkpoint,
    SandboxRemoved,
    Chunk,
    Diff,
    EnvironmentInfo,
    ExecResult,
    ExitStatus,
    Grant,
    Project,
    ProjectQuota,
    ResumeResult,
    JSONObject,
    SandboxInfo,
    Secret,
    Token,
    TreeNode,
    Whoami,
    as_object,
    objects,
)

__all__ = ["Shard", "Sandbox", "ExecStream", "Credentials", "Environment"]

Argv = Union[str, Sequence[str]]
"""A command: a list of strings (no shell), or one string run by ``sh -c``."""

EnvVars = Union[Mapping[str, str], Sequence[str]]
"""Environment variables: ``{"K": "V"}`` or ``["K=V"]``."""

Size = Union[int, str]
"""A size: a number of bytes, or a string with a unit such as ``"2GiB"``."""

Duration = Union[int, float, str]
"""A duration: seconds, or a Go duration string such as ``"30s"`` or ``"2m"``."""

SetupFn = Callable[["Sandbox"], Any]
"""An environment's setup: called once with a fresh sandbox to prepare."""

Stdin = Union[str, bytes, bytearray, memoryview, Any, Iterable[Union[bytes, str]], None]
"""A command's stdin: all of it (bytes, or str sent as UTF-8), or a stream:
a file-like object with ``read()`` (``open(path, "rb")``,
``sys.stdin.buffer``) or an iterable of bytes (or str), sent as it is read."""

INLINE_STDIN_MAX = 256 << 10
"""Stdin given whole up to this size goes base64 in the JSON request (which
any server takes); more, or a stream, goes in a framed request body."""

STDIN_CHUNK = 256 << 10
"""The most stdin one I frame carries (the server takes at most 1 MiB)."""

MAX_FRAME = 4 << 20
"""The largest payload of a server frame."""

_SIGNALS = {"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGKILL": 9, "SIGUSR1": 10, "SIGUSR2": 12, "SIGTERM": 15, "SIGCONT": 18, "SIGSTOP": 19}


def _frame(typ: bytes, payload: bytes) -> bytes:
    return typ + len(payload).to_bytes(4, "big") + payload


def _chunks(source: Any) -> Iterator[bytes]:
    """The bytes of a stdin stream, as it gives them (none empty), each its
    own copy (a source may reuse its buffer while the pump still sends)."""
    for data in pieces_of(source, STDIN_CHUNK, "stdin"):
        yield bytes(data)


class _StdinPump:
    """Sends a command's stdin as I frames of at most STDIN_CHUNK bytes, then
    an empty one (EOF), from its own thread, while the answer is read."""

    def __init__(self, body: FramedBody, source: Any, on_fail: Callable[[], None]) -> None:
        self._body = body
        self._source = source
        self._on_fail = on_fail
        self.error: Optional[ShardError] = None
        self.closed_stdin = threading.Event()
        # Set before the empty I frame is sent: the answer may end as soon
        # as the server reads it, before this thread says it was sent.
        self.closing_stdin = False
        self._thread = threading.Thread(target=self._run, name="useshards-stdin", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        body = self._body
        chunks = iter([self._source]) if isinstance(self._source, bytes) else _chunks(self._source)
        try:
            while True:
                try:
                    data = next(chunks, None)
                except Exception as e:  # reading the caller's source failed
                    if not body.ended:
                        self.error = ShardError("stdin_failed", f"reading the command's stdin: {e}")
                        self._on_fail()
                    return
                if data is None:
                    break
                view = memoryview(data)
                for off in range(0, len(view), STDIN_CHUNK):
                    if not body.send(b"I", view[off : off + STDIN_CHUNK]):  # type: ignore[arg-type]
                        return
            self.closing_stdin = True
            if body.send(b"I", b""):
                self.closed_stdin.set()
        except OSError:
            return  # the connection is gone: the reader says so

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _argv(argv: Argv) -> List[str]:
    if isinstance(argv, str):
        return ["sh", "-c", argv]
    out = list(argv)
    if not out or not all(isinstance(a, str) for a in cast(List[Any], out)):
        raise TypeError("argv must be a non-empty sequence of strings (or one string, run by sh -c)")
    return out


def _env(env: Optional[EnvVars]) -> Union[Dict[str, str], List[str], None]:
    if env is None:
        return None
    if isinstance(env, Mapping):
        return {str(k): str(v) for k, v in env.items()}
    if isinstance(env, str):
        raise TypeError('env must be a mapping {"K": "V"} or a list of "K=V" strings')
    return [str(e) for e in env]


def _drop_none(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _duration(name: str, v: Optional[Duration]) -> Optional[str]:
    """A duration as the API takes it: a Go duration string (seconds become ``"Ns"``)."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v == float("inf"):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f'{name} {v!r}: give seconds above 0, or a duration such as "30s"')
    return ("%.9f" % v).rstrip("0").rstrip(".") + "s"  # never an exponent, which Go's durations lack


def _fork_body(
    name: Optional[str],
    tag: Optional[str],
    count: Optional[int],
    hook_timeout: Optional[Duration],
    hook_errors: Optional[str],
    hooks_in_source: bool,
    keep_checkpoint: bool = False,
) -> Dict[str, Any]:
    return _drop_none(
        {
            "name": name,
            "tag": tag,
            "count": count,
            "hook_timeout": _duration("hook_timeout", hook_timeout),
            "hook_errors": hook_errors,
            "hooks_in_source": True if hooks_in_source else None,
            "keep_checkpoint": True if keep_checkpoint else None,
        }
    )


def _tree_path(sandbox: Optional[str], all: bool) -> str:  # noqa: A002 - the API's name
    p = f"/sandboxes/{esc(sandbox)}/tree" if sandbox else "/tree"
    return p + "?all=true" if all else p


def _diff_path(sandbox: str, against: Optional[str], patch: bool) -> str:
    q = urlencode(_drop_none({"against": against or None, "patch": "true" if patch else None}))
    return f"/sandboxes/{esc(sandbox)}/diff" + ("?" + q if q else "")


def _mapping(doc: Any, what: str) -> JSONObject:
    obj = as_object(doc)
    if obj is None:
        raise ShardError("bad_response", f"the server's answer for {what} is not a JSON object")
    return obj


def _items(doc: Any, key: str) -> List[JSONObject]:
    obj = as_object(doc)
    if obj is None or not isinstance(obj.get(key, []), list):
        raise ShardError("bad_response", f"the server's answer has no list {key!r}")
    return objects(obj.get(key))


class ExecStream(Iterator[Chunk]):
    """A running command's output, as it arrives.

    Iterate it for :class:`Chunk` objects (``stream`` is ``"stdout"`` or
    ``"stderr"``, ``data`` the bytes), each yielded as soon as the server
    sends it. When iteration ends, :attr:`result` says how the command
    ended. Use it as a context manager to leave early: the connection is
    closed, and the command keeps running in the sandbox to its end (or its
    ``timeout``), its output dropped.

    >>> with sandbox.exec_stream(["make"]) as s:
    ...     for chunk in s:
    ...         print(chunk.stream, chunk.text, end="")
    ... print(s.result.exit_code)

    The output comes as the binary exec stream (docs/exec-stream.md), or
    NDJSON from an older server. When stdin was given as a stream, it is
    sent from a thread while the output is read, and :meth:`send_signal`
    (:meth:`terminate`, :meth:`kill`) can signal the command.

    Raises :class:`ShardError` while iterating if the server loses the
    sandbox (``sandbox_unreachable``), the stream breaks (``unreachable``,
    ``stream_ended``) or reading the stdin given failed (``stdin_failed``).
    """

    pid: Optional[int]
    """The command's pid inside the sandbox, once the server said it started."""

    def __init__(self, response: Response, body: Optional[FramedBody] = None, stdin: Any = None) -> None:
        self._resp = response
        self._result: Optional[ExitStatus] = None
        self._closed = False
        self._binary = response.content_type == STREAM_TYPE
        self._body = body
        self._pump: Optional[_StdinPump] = None
        self.pid = None
        if body is not None and stdin is not None:
            self._pump = _StdinPump(body, stdin, self._stdin_failed)

    def _stdin_failed(self) -> None:
        if self._body is not None:
            self._body.abandon()
        self._resp.shutdown()  # the reader wakes, closes and raises the pump's error

    def __iter__(self) -> "ExecStream":
        return self

    def __next__(self) -> Chunk:
        try:
            return self._next_frame() if self._binary else self._next_line()
        except ShardError as e:
            if self._pump is not None and self._pump.error is not None and e.code in ("unreachable", "stream_ended"):
                raise self._pump.error from None
            raise

    def _ended(self) -> None:
        """The command's end was read: gives the connection back when the
        request body could be ended cleanly too."""
        self._closed = True
        body = self._body
        if body is None:
            self._resp.release()
            return
        # A pump sending the empty I frame is given a moment to finish: the
        # server may have read it and ended its answer before the pump's
        # thread ran again, and the connection can then be kept.
        if self._pump is not None and self._pump.closing_stdin:
            self._pump.join(timeout=1.0)
        # A body whose stdin is still being sent (the command ended before
        # reading it all) cannot be ended here: the connection goes.
        if self._pump is not None and not self._pump.closed_stdin.is_set():
            body.abandon()
            self._resp.close()
        elif body.finish(timeout=1.0):
            self._resp.release()
        else:
            self._resp.close()

    def _fail(self, err: ShardError) -> ShardError:
        self.close()
        return err

    def _next_frame(self) -> Chunk:
        while not self._closed:
            head = self._resp.read(5)
            if len(head) < 5:
                raise self._fail(ShardError("stream_ended", "the exec stream ended before the command did", 502))
            typ = head[0:1]
            n = int.from_bytes(head[1:5], "big")
            if n > MAX_FRAME:
                raise self._fail(ShardError("bad_response", f"exec stream: a frame of {n} bytes, more than the {MAX_FRAME} allowed", 502))
            payload = self._resp.read(n) if n else b""
            if len(payload) < n:
                raise self._fail(ShardError("stream_ended", "the exec stream ended inside a frame, before the command did", 502))
            if typ == b"O" or typ == b"E":
                if payload:
                    return Chunk(stream="stdout" if typ == b"O" else "stderr", data=payload)
            elif typ == b"S":
                pid = as_object(self._json(payload, "started") or {})
                p = pid.get("pid") if pid is not None else None
                self.pid = p if isinstance(p, int) else None
            elif typ == b"X":
                self._result = self._exit(as_object(self._json(payload, "exit")) or {})
                self._ended()
            elif typ == b"F":
                e = as_object(self._json(payload, "failure")) or {}
                code = e.get("code")
                msg = e.get("message")
                raise self._fail(
                    ShardError(
                        code if isinstance(code, str) and code else "sandbox_unreachable",
                        msg if isinstance(msg, str) and msg else "the connection to the sandbox was lost",
                        502,
                    )
                )
            # Other types are newer than this SDK: skip them.
        raise StopIteration

    def _json(self, payload: bytes, what: str) -> Any:
        try:
            return json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise self._fail(ShardError("bad_response", f"exec stream: the {what} frame is not JSON: {e}", 502)) from None

    @staticmethod
    def _exit(ev: JSONObject) -> ExitStatus:
        code = ev.get("exit_code", 0)
        sig = ev.get("signal")
        return ExitStatus(
            exit_code=code if isinstance(code, int) else -1,
            signal=sig if isinstance(sig, int) and sig else None,
            timed_out=bool(ev.get("timed_out")),
            oom_killed=bool(ev.get("oom_killed")),
            error=str(ev.get("error") or ""),
            output_cut=bool(ev.get("output_cut")),
        )

    def _next_line(self) -> Chunk:
        while not self._closed:
            line = self._resp.readline()
            if not line:
                raise self._fail(ShardError("stream_ended", "the exec stream ended before the command did", 502))
            line = line.strip()
            if not line:
                continue
            try:
                ev = as_object(json.loads(line.decode("utf-8")))
            except (UnicodeDecodeError, ValueError) as e:
                self.close()
                raise ShardError("bad_response", f"exec stream: a line is not JSON: {e}") from None
            if ev is None:
                continue
            kind = ev.get("type")
            if kind == "stdout" or kind == "stderr":
                data = self._data(ev)
                if data:
                    return Chunk(stream="stdout" if kind == "stdout" else "stderr", data=data)
            elif kind == "started":
                pid = ev.get("pid")
                self.pid = pid if isinstance(pid, int) else None
            elif kind == "exit":
                code = ev.get("exit_code")
                self._result = self._exit(dict(ev, exit_code=code if isinstance(code, int) else -1))
                self._ended()
            elif kind == "error":
                msg = self._data(ev).decode("utf-8", errors="replace") or "the connection to the sandbox was lost"
                self.close()
                raise ShardError("sandbox_unreachable", msg, 502)
            # Other types are newer than this SDK: skip them.
        raise StopIteration

    def send_signal(self, sig: Union[int, str] = 15, timeout: Optional[float] = 30.0) -> bool:
        """Sends signal ``sig`` (a number, or a name like ``"SIGINT"``) to the
        command's process group, as a K frame of the request body. Only for
        a command whose stdin was given as a stream (``stdin=[]`` for none).
        The signal goes behind the stdin already sent: it waits up to
        ``timeout`` seconds for the body (a command that does not read its
        stdin holds it up; then ShardError ``stdin_blocked``). Returns False
        when the command has ended."""
        if isinstance(sig, str):
            name = sig.upper() if sig.upper().startswith("SIG") else "SIG" + sig.upper()
            if name not in _SIGNALS:
                raise ValueError(f"unknown signal {sig!r}: give its number")
            sig = _SIGNALS[name]
        if not isinstance(sig, int) or not 0 < sig <= 64:
            raise ValueError(f"{sig!r} is not a signal number")
        if self._body is None:
            raise ShardError(
                "invalid_argument",
                "signals travel in the exec's framed request body: start the command with stdin as a stream (a file or an iterable; [] for none)",
            )
        if self._closed:
            return False
        try:
            sent = self._body.send(b"K", json.dumps({"signal": sig}).encode(), timeout=timeout)
        except OSError:
            return False
        if not sent and not self._body.ended:
            raise ShardError("stdin_blocked", f"signal {sig} not sent in {timeout} s: the command is not reading the stdin sent before it")
        return sent

    def terminate(self) -> bool:
        """Sends SIGTERM (see :meth:`send_signal`)."""
        return self.send_signal(15)

    def kill(self) -> bool:
        """Sends SIGKILL (see :meth:`send_signal`)."""
        return self.send_signal(9)

    def _data(self, ev: JSONObject) -> bytes:
        d = ev.get("data")
        if not isinstance(d, str) or not d:
            return b""
        try:
            return base64.b64decode(d, validate=True)
        except (binascii.Error, ValueError) as e:
            self.close()
            raise ShardError("bad_response", f"exec stream: data is not base64: {e}") from None

    @property
    def done(self) -> bool:
        """True once the command's exit was read."""
        return self._result is not None

    @property
    def result(self) -> ExitStatus:
        """How the command ended (exit code, signal, timed_out, oom_killed).

        Raises RuntimeError before the stream was read to its end (see
        :meth:`wait`) or after it was closed early.
        """
        if self._result is None:
            raise RuntimeError("the command's exit is not known yet: iterate the stream to its end, or call wait()")
        return self._result

    def wait(self) -> ExitStatus:
        """Reads (and drops) the rest of the output, and returns how the command ended."""
        for _ in self:
            pass
        return self.result

    def close(self) -> None:
        """Stops reading: closes the connection unless the stream ended. The
        command itself keeps running in the sandbox."""
        if not self._closed:
            self._closed = True
            if self._body is not None:
                self._body.abandon()
            self._resp.close()

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.close()


class Credentials:
    """A sandbox's secrets: ``sandbox.credentials``.

    A secret is stored on the server by name, encrypted, and never shown
    again; a grant gives it to a sandbox as an environment variable of every
    later exec (read at each exec) or as a file. Forks get copies of their
    source's grants. Secret names are per project: setting ``"API_KEY"`` here
    changes the value every sandbox of the project granted ``"API_KEY"``
    sees at its next exec.
    """

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    def set(self, name: str, value: Union[str, bytes], *, env: Optional[str] = None, file: Optional[str] = None) -> None:
        """Stores ``value`` as the secret ``name`` (replacing any value it
        had), then grants it to this sandbox: as the environment variable
        ``env`` (default: ``name``), or, with ``file``, as that file (an
        absolute path, mode 0400; the sandbox must be running).

        Needs the ``secret:write`` scope.
        """
        if env is not None and file is not None:
            raise ValueError("give env or file, not both")
        sb = self._sandbox
        sb._shard.set_secret(name, value)
        doc = sb._shard._t.request(
            "POST", f"/sandboxes/{esc(sb.id)}/grants", _drop_none({"secret": name, "env": env, "file": file})
        )
        sb._set(SandboxInfo.from_json(_mapping(doc, "a grant")))

    def delete(self, name: str) -> None:
        """Takes the secret ``name`` away from this sandbox: later execs no
        longer get its variable, and a granted file is removed (the sandbox
        must then be running). The secret itself stays on the server (see
        :meth:`Shard.remove_secret`), and so do forks' copies of the grant.
        """
        sb = self._sandbox
        doc = sb._shard._t.request("DELETE", f"/sandboxes/{esc(sb.id)}/grants/{esc(name)}")
        obj = as_object(doc)
        if obj is not None and obj.get("id"):
            sb._set(SandboxInfo.from_json(obj))

    def list(self) -> List[Grant]:
        """The sandbox's grants: secret names and where they go, never values."""
        sb = self._sandbox
        doc = sb._shard._t.request("GET", f"/sandboxes/{esc(sb.id)}/grants")
        return [Grant.from_json(g) for g in _items(doc, "grants")]


class Sandbox:
    """A handle on one sandbox. Methods act on the server at once; ``info``
    is the sandbox as last seen (:meth:`refresh` reads it again).

    As a context manager it removes the sandbox (with force) on exit.
    """

    resume_result: Optional[ResumeResult]
    """For a sandbox made by :meth:`Shard.resume`: what was replayed."""

    def __init__(self, shard: "Shard", info: SandboxInfo, resume_result: Optional[ResumeResult] = None) -> None:
        self._shard = shard
        self._info = info
        self._lock = threading.Lock()
        self.resume_result = resume_result
        self.credentials = Credentials(self)
        """This sandbox's secrets: :class:`Credentials`."""
        self.files = Files(shard, lambda: self.id)
        """This sandbox's files, running or stopped: :class:`Files` (read,
        write, streams both ways, tars, list, stat, remove)."""

    def _set(self, info: SandboxInfo) -> None:
        with self._lock:
            self._info = info

    @property
    def info(self) -> SandboxInfo:
        """The sandbox as the server last described it."""
        with self._lock:
            return self._info

    @property
    def id(self) -> str:
        """The sandbox's id: 12 hex digits."""
        return self.info.id

    @property
    def name(self) -> str:
        """The sandbox's name (its id when it was given none)."""
        return self.info.name

    @property
    def session(self) -> str:
        """The ledger session it records its events under (see :meth:`Shard.resume`)."""
        return self.info.session

    @property
    def state(self) -> str:
        """Its state when last seen: running, stopped, failed, ..."""
        return self.info.state

    def __repr__(self) -> str:
        i = self.info
        return f"Sandbox(id={i.id!r}, name={i.name!r}, state={i.state!r})"

    def refresh(self) -> "Sandbox":
        """Reads the sandbox from the server again; returns self."""
        doc = self._shard._t.request("GET", f"/sandboxes/{esc(self.id)}")
        self._set(SandboxInfo.from_json(_mapping(doc, "a sandbox")))
        return self

    # -- commands ------------------------------------------------------------

    def exec(
        self,
        argv: Argv,
        *,
        env: Optional[EnvVars] = None,
        workdir: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Stdin = None,
        tty: bool = False,
    ) -> ExecResult:
        """Runs a command and waits for it; returns its exit status and output.

        ``argv`` is a list (no shell; the program is looked up in PATH) or a
        string, which runs as ``sh -c STRING``. ``env`` adds variables for
        this command; ``workdir`` (absolute) and ``user`` (name, uid,
        name:group) say where and as whom; ``timeout`` (seconds) kills it
        with SIGKILL after that long; ``stdin`` is its input (then EOF): all
        of it as bytes or str (any size), or a stream, sent as the command
        reads it: a file-like object with ``read()`` or an iterable of bytes;
        ``tty`` runs it in a terminal (all output is then stdout).

        A non-zero exit is not an exception: check ``exit_code``. Errors
        before the command starts (not running, command not found, ...)
        raise :class:`ShardError`.
        """
        out: List[bytes] = []
        err: List[bytes] = []
        with self.exec_stream(argv, env=env, workdir=workdir, user=user, timeout=timeout, stdin=stdin, tty=tty) as s:
            for chunk in s:
                (out if chunk.stream == "stdout" else err).append(chunk.data)
            st = s.result
        return ExecResult(
            exit_code=st.exit_code,
            signal=st.signal,
            timed_out=st.timed_out,
            oom_killed=st.oom_killed,
            error=st.error,
            output_cut=st.output_cut,
            stdout_bytes=b"".join(out),
            stderr_bytes=b"".join(err),
        )

    def exec_stream(
        self,
        argv: Argv,
        *,
        env: Optional[EnvVars] = None,
        workdir: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Stdin = None,
        tty: bool = False,
    ) -> ExecStream:
        """Starts a command and returns its output as an :class:`ExecStream`
        of chunks, yielded as they arrive; the arguments are :meth:`exec`'s.

        The request is sent (and errors before the start raised) here, not
        at the first iteration. Stdin given as a stream (or more than 256
        KiB of bytes) goes in a framed request body, from a thread, while
        the output is read; then the stream's :meth:`ExecStream.send_signal`
        works too (``stdin=[]``: no stdin, and signals).
        """
        payload: Dict[str, Any] = {"argv": _argv(argv)}
        e = _env(env)
        if e:
            payload["env"] = e
        if workdir:
            payload["workdir"] = workdir
        if user:
            payload["user"] = user
        if timeout is not None:
            if timeout <= 0:
                raise ValueError("timeout must be positive")
            payload["timeout"] = timeout
        source: Any = None
        if isinstance(stdin, (str, bytes, bytearray, memoryview)):
            raw = stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin)
            if len(raw) <= INLINE_STDIN_MAX:
                payload["stdin"] = base64.b64encode(raw).decode("ascii")
            else:
                source = raw
        elif stdin is not None:
            if not callable(getattr(stdin, "read", None)) and not hasattr(stdin, "__iter__"):
                raise TypeError("stdin must be bytes, str, a file-like object with read(), or an iterable of bytes")
            source = stdin
        if tty:
            payload["tty"] = True
        path = f"/sandboxes/{esc(self.id)}/exec"
        t = self._shard._t
        if source is None:
            return ExecStream(t.stream("POST", path, payload, accept=STREAM_TYPE))
        first = _frame(b"Q", json.dumps(payload, separators=(",", ":")).encode("utf-8"))
        resp, body = t.stream_framed("POST", path, first)
        return ExecStream(resp, body, source)

    # -- lifecycle -----------------------------------------------------------

    def stop(self) -> "Sandbox":
        """Stops the sandbox: its processes end, its files stay. Returns self."""
        doc = self._shard._t.request("POST", f"/sandboxes/{esc(self.id)}/stop")
        self._set(SandboxInfo.from_json(_mapping(doc, "a stop")))
        return self

    def start(self) -> "Sandbox":
        """Boots the stopped sandbox again, with its files. Returns self."""
        doc = self._shard._t.request("POST", f"/sandboxes/{esc(self.id)}/start")
        self._set(SandboxInfo.from_json(_mapping(doc, "a start")))
        return self

    def remove(self, force: bool = False, *, checkpoints: bool = False) -> SandboxRemoved:
        """Removes the sandbox and its files; ``force`` is needed for a
        running one. Its ledger session stays, and so do its checkpoints,
        but forks' checkpoints no sandbox needs any more; with
        ``checkpoints`` those of its session go too, or nothing does
        (ShardError ``checkpoint_in_use``, 409) when another sandbox needs
        one."""
        q = f"force={'true' if force else 'false'}" + ("&checkpoints=true" if checkpoints else "")
        doc = self._shard._t.request("DELETE", f"/sandboxes/{esc(self.id)}?{q}")
        return SandboxRemoved.from_json(_mapping(doc, "a remove"))

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        try:
            self.remove(force=True)
        except ShardError as e:
            # Gone already is fine; and a failed clean-up must not hide the
            # exception that ended the with block.
            if e.code == "sandbox_not_found" or exc_type is not None:
                return
            raise

    # -- fork and checkpoints ------------------------------------------------

    def fork(
        self,
        name: Optional[str] = None,
        tag: Optional[str] = None,
        *,
        hook_timeout: Optional[Duration] = None,
        hook_errors: Optional[str] = None,
        hooks_in_source: bool = False,
        keep_checkpoint: bool = False,
    ) -> "Sandbox":
        """Copies this running sandbox (files, memory, processes) into a new
        running sandbox with its own id, name and address; this one freezes
        for a moment and carries on. ``tag`` is stored with the fork's
        checkpoint (see :meth:`list_checkpoints`).

        The executables in the sandbox's ``/etc/shard/on-fork.d`` run in the
        fork before it is answered, each within ``hook_timeout`` (seconds or
        ``"30s"``; default 30 s, at most 10 min). One that fails refuses the
        fork: ShardError ``fork_hook_failed`` (422), and no fork is left;
        unless ``hook_errors="ignore"``, which makes the fork and leaves the
        failure in its ledger (``sandbox.fork_hook``). ``hooks_in_source``
        runs them in this sandbox too, after the fork's.

        The fork's checkpoint is removed by the server once no sandbox's
        resume starts from it; ``keep_checkpoint`` keeps it until removed
        by hand (so a resume of the fork's session works after it is
        removed)."""
        body = _fork_body(name, tag, None, hook_timeout, hook_errors, hooks_in_source, keep_checkpoint)
        doc = self._shard._t.request("POST", f"/sandboxes/{esc(self.id)}/fork", body)
        return Sandbox(self._shard, SandboxInfo.from_json(_mapping(doc, "a fork")))

    def fork_many(
        self,
        count: int,
        name: Optional[str] = None,
        tag: Optional[str] = None,
        *,
        hook_timeout: Optional[Duration] = None,
        hook_errors: Optional[str] = None,
        hooks_in_source: bool = False,
        keep_checkpoint: bool = False,
    ) -> List["Sandbox"]:
        """Makes ``count`` forks from one freeze; with ``name``, they are
        named NAME-1, NAME-2, ... The hook options are :meth:`fork`'s: a
        hook that fails in any fork refuses them all."""
        if count < 1:
            raise ValueError("count must be at least 1")
        hooks: Dict[str, Any] = dict(
            hook_timeout=hook_timeout, hook_errors=hook_errors, hooks_in_source=hooks_in_source, keep_checkpoint=keep_checkpoint
        )
        if count == 1:
            return [self.fork(name=name, tag=tag, **hooks)]
        body = _fork_body(name, tag, count, **hooks)
        doc = self._shard._t.request("POST", f"/sandboxes/{esc(self.id)}/fork", body)
        return [Sandbox(self._shard, SandboxInfo.from_json(d)) for d in _items(doc, "sandboxes")]

    # -- lineage -------------------------------------------------------------

    def tree(self, *, all: bool = False) -> TreeNode:  # noqa: A002 - the API's name
        """The fork tree this sandbox is in: its lineage's root (its first
        sandbox, snapshot or environment), with all that came from it
        (:meth:`TreeNode.walk`, :meth:`TreeNode.find`). A removed sandbox
        stays while something that exists came from it; with ``all``,
        always."""
        roots = self._shard.tree(self.id, all=all)
        if len(roots) != 1:
            raise ShardError("bad_response", f"the server answered {len(roots)} roots for the tree of sandbox {self.name}, not one")
        return roots[0]

    def diff(self, against: Union[str, "Sandbox", None] = None, *, patch: bool = False) -> Diff:
        """What changed in this sandbox's files: since it started (the
        checkpoint it was forked or restored from, its snapshot, or its
        image), or from ``against`` (another sandbox of its image: id, name
        or :class:`Sandbox`) to this one, so what this one has and the other
        has not is ``added``. ``patch`` adds a unified diff of each changed
        text file."""
        return self._shard.diff(self.id, against, patch=patch)

    def checkpoint(self, tag: Optional[str] = None) -> Checkpoint:
        """Saves this running sandbox's memory, processes and files without
        stopping it (it freezes for a moment); the ledger records it, so
        :meth:`Shard.resume` starts from here. :meth:`Shard.restore_checkpoint`
        starts a new sandbox from it."""
        doc = self._shard._t.request("POST", f"/sandboxes/{esc(self.id)}/checkpoints", _drop_none({"tag": tag}))
        return Checkpoint.from_json(_mapping(doc, "a checkpoint"))

    def list_checkpoints(self) -> List[Checkpoint]:
        """This sandbox's checkpoints, those its forks made included."""
        doc = self._shard._t.request("GET", f"/sandboxes/{esc(self.id)}/checkpoints")
        return [Checkpoint.from_json(c) for c in _items(doc, "checkpoints")]


class Environment:
    """A named sandbox state, set up once and started from warm: made by
    :meth:`Shard.environment`.

    The first :meth:`sandbox` (or :meth:`build`) looks the environment up on
    the server; when it is missing or its fingerprint differs (the
    definition changed), it is built: a sandbox is created, ``setup`` is
    called with it, the server checkpoints it as the environment, and the
    setup sandbox is removed. Every :meth:`sandbox` then starts from that
    checkpoint: memory, processes and files as the setup left them.
    """

    def __init__(
        self,
        shard: "Shard",
        name: str,
        *,
        image: str,
        memory_mib: Optional[int] = None,
        cpu: Union[float, str, None] = None,
        disk: Optional[Size] = None,
        env: Optional[EnvVars] = None,
        provider: Optional[str] = None,
        setup: Union[SetupFn, Sequence[Sequence[str]], None] = None,
    ) -> None:
        self._shard = shard
        self.name = name
        """The environment's name."""
        self.image = image
        self.memory_mib = memory_mib
        self.cpu = cpu
        self.disk = disk
        self.env = _env(env)
        self.provider = provider
        self.setup = setup
        self._info: Optional[EnvironmentInfo] = None  # guarded by _lock
        self._built: Optional[bool] = None  # guarded by _lock
        self._lock = threading.Lock()

    @property
    def fingerprint(self) -> str:
        """Identifies the definition: a SHA-256 of the image, the bounds,
        the variables, the provider and the setup (a callable's source via
        ``inspect.getsource``, else its qualified name; or the commands)."""
        setup: Any
        if self.setup is None:
            setup = None
        elif callable(self.setup):
            setup = _source_of(self.setup)
        else:
            setup = [list(a) for a in self.setup]
        doc = ["useshards-python/1", self.image, self.memory_mib, self.cpu, self.disk, self.env, self.provider, setup]
        return "py-" + hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode("utf-8")).hexdigest()

    @property
    def built(self) -> Optional[bool]:
        """After :meth:`build`: True when it built the environment, False
        when the server already had it unchanged; None before."""
        with self._lock:
            return self._built

    def build(self) -> EnvironmentInfo:
        """Makes sure the environment exists with this definition (building
        it if needed, once per :class:`Environment` object) and returns it."""
        with self._lock:
            if self._info is not None:
                return self._info
            fp = self.fingerprint
            t = self._shard._t
            if self.setup is not None and not callable(self.setup):
                # Commands: the server runs them, and decides itself.
                status, doc = t.request("POST", "/environments", self._definition(fp, [list(a) for a in self.setup]), want_status=True)
                self._info, self._built = EnvironmentInfo.from_json(_mapping(doc, "an environment")), status == 201
                return self._info
            try:
                cur = EnvironmentInfo.from_json(_mapping(t.request("GET", f"/environments/{esc(self.name)}"), "an environment"))
            except ShardError as e:
                if e.status != 404:
                    raise
            else:
                if cur.fingerprint == fp:
                    self._info, self._built = cur, False
                    return cur
            if self.setup is None:
                status, doc = t.request("POST", "/environments", self._definition(fp, None), want_status=True)
                self._info, self._built = EnvironmentInfo.from_json(_mapping(doc, "an environment")), status == 201
                return self._info
            self._info = self._build_with(self.setup, fp)
            self._built = True
            return self._info

    def _definition(self, fp: str, setup: Optional[List[List[str]]]) -> Dict[str, Any]:
        return _drop_none(
            {
                "name": self.name,
                "image": self.image,
                "memory_mib": self.memory_mib,
                "cpu": self.cpu,
                "disk": self.disk,
                "env": self.env,
                "provider": self.provider,
                "setup": setup,
                "fingerprint": fp,
            }
        )

    def _build_with(self, setup: SetupFn, fp: str) -> EnvironmentInfo:
        sh = self._shard
        kw: Dict[str, Any] = dict(
            memory_mib=self.memory_mib, cpu=self.cpu, disk=self.disk, env=self.env, provider=self.provider
        )
        setup_name = "env-" + self.name
        try:
            sb = sh.create(self.image, name=setup_name if len(setup_name) <= 63 else None, **kw)
        except ShardError as e:
            if e.code != "name_taken":
                raise
            sb = sh.create(self.image, **kw)
        try:
            setup(sb)
            doc = sh._t.request("POST", "/environments", {"name": self.name, "sandbox": sb.id, "fingerprint": fp})
            return EnvironmentInfo.from_json(_mapping(doc, "an environment"))
        finally:
            try:
                sb.remove(force=True)
            except ShardError:
                pass

    def sandbox(self, name: Optional[str] = None) -> Sandbox:
        """A new running sandbox started warm from the environment (built
        first if needed), named ``name`` (default: its id)."""
        self.build()
        doc = self._shard._t.request("POST", "/sandboxes", _drop_none({"environment": self.name, "name": name}))
        return Sandbox(self._shard, SandboxInfo.from_json(_mapping(doc, "a sandbox")))

    def remove(self) -> None:
        """Deletes the environment and its checkpoint; sandboxes started from
        it keep running."""
        with self._lock:
            self._info, self._built = None, None
        self._shard._t.request("DELETE", f"/environments/{esc(self.name)}")


def _source_of(fn: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        mod = getattr(fn, "__module__", None) or ""
        qual = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        return f"{mod}.{qual}"


class Shard:
    """A client of one shard server.

    ``remote`` is the server: ``http://HOST:PORT`` or ``https://...`` (with
    an API key), or ``unix:///path/to/shard.sock`` (the local administrator
    socket; no key needed). Left out, it is ``$SHARD_REMOTE``, else the
    default socket ``unix:///run/shard/shard.sock``. ``api_key`` defaults to
    ``$SHARD_API_KEY`` and is sent as ``Authorization: Bearer KEY``.

    ``project`` is the project every request acts in, sent as
    ``Shard-Project: NAME`` (exec streams too); default ``$SHARD_PROJECT``.
    With neither, no project is named and the server uses the key's own
    (``"default"`` for a key of every project, or the socket). A key made
    for one project may name only its own (else 403 ``wrong_project``) and
    sees only that project's sandboxes: another project's are 404 to it.

    ``timeout`` bounds each wait for the server's answer on ordinary calls,
    in seconds (None, the default: as long as the server works, as creates
    that pull an image or resumes that replay long commands may need);
    exec streams have no read timeout (give :meth:`Sandbox.exec` a
    ``timeout`` instead). ``connect_timeout`` bounds making a connection.

    Thread-safe: one client may serve many threads; it keeps a few
    keep-alive connections. Use it as a context manager, or call
    :meth:`close`.

    >>> with Shard() as shard:
    ...     sb = shard.create("python:3.12-slim", name="base", memory_mib=512)
    ...     print(sb.exec(["python", "-c", "print(1+1)"]).stdout)
    """

    def __init__(
        self,
        remote: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
        connect_timeout: Optional[float] = 10.0,
        ssl_context: Optional[ssl.SSLContext] = None,
        project: Optional[str] = None,
    ) -> None:
        if remote is None:
            remote = os.environ.get("SHARD_REMOTE") or ("unix://" + DEFAULT_SOCKET)
        if api_key is None:
            api_key = os.environ.get("SHARD_API_KEY") or None
        if not project:
            project = os.environ.get("SHARD_PROJECT", "").strip()
        self.remote = remote
        """The server this client talks to."""
        self.project = project
        """The project requests name (``""``: none, the key's own)."""
        self._t = Transport(
            remote, api_key, timeout, connect_timeout=connect_timeout, ssl_context=ssl_context, project=project
        )

    def __repr__(self) -> str:
        if self.project:
            return f"Shard(remote={self.remote!r}, project={self.project!r})"
        return f"Shard(remote={self.remote!r})"

    def close(self) -> None:
        """Closes the client's idle connections; it cannot be used after."""
        self._t.close()

    def __enter__(self) -> "Shard":
        return self

    def __exit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.close()

    # -- sandboxes -----------------------------------------------------------

    def create(
        self,
        image: Optional[str] = None,
        *,
        name: Optional[str] = None,
        memory_mib: Optional[int] = None,
        cpu: Union[float, str, None] = None,
        disk: Optional[Size] = None,
        env: Optional[EnvVars] = None,
        provider: Optional[str] = None,
        pids: Optional[int] = None,
        from_snapshot: Optional[str] = None,
    ) -> Sandbox:
        """Creates and starts a sandbox from ``image`` (pulled if not cached)
        and returns it running.

        ``name`` must be unique (default: the id). Bounds: ``memory_mib``
        (default 512), ``cpu`` (1, 0.5 or "500m"; default 1), ``disk`` (bytes
        or "10GiB"; default 10GiB), ``pids`` (default 4096). ``env`` adds to
        the image's variables. ``provider``: gvisor (the usual default) or
        runc. ``from_snapshot`` starts from a snapshot's files (then
        ``image`` may be left out).
        """
        if image is None and from_snapshot is None:
            raise ValueError("give an image (or from_snapshot)")
        payload = _drop_none(
            {
                "image": image,
                "name": name,
                "memory_mib": memory_mib,
                "cpu": cpu,
                "disk": disk,
                "pids": pids,
                "env": _env(env),
                "provider": provider,
                "from_snapshot": from_snapshot,
            }
        )
        doc = self._t.request("POST", "/sandboxes", payload)
        return Sandbox(self, SandboxInfo.from_json(_mapping(doc, "a create")))

    def get(self, id_or_name: str) -> Sandbox:
        """The sandbox with this id or name (ShardError ``sandbox_not_found`` if none)."""
        doc = self._t.request("GET", f"/sandboxes/{esc(id_or_name)}")
        return Sandbox(self, SandboxInfo.from_json(_mapping(doc, "a sandbox")))

    def list(self, *, all_projects: bool = False) -> List[Sandbox]:
        """Every sandbox of the client's project; with ``all_projects``,
        every project's (each ``info.project`` says whose). Only a key of
        every project (or the socket) may ask for all: else ShardError
        ``wrong_project`` (403)."""
        doc = self._t.request("GET", "/sandboxes?all_projects=true" if all_projects else "/sandboxes")
        return [Sandbox(self, SandboxInfo.from_json(d)) for d in _items(doc, "sandboxes")]

    def files(self, id_or_name: str) -> Files:
        """The files of the sandbox with this id or name, without looking
        it up first (:attr:`Sandbox.files` is the same for a sandbox in
        hand)."""
        return Files(self, id_or_name)

    # -- lineage -------------------------------------------------------------

    def tree(self, sandbox: Union[str, Sandbox, None] = None, *, all: bool = False) -> List[TreeNode]:  # noqa: A002 - the API's name
        """The fork tree: every lineage of the project, oldest first; with
        ``sandbox`` (id, name or :class:`Sandbox`), the one lineage it is in
        (one root). Each node is a sandbox, a checkpoint forks and restores
        came from, a snapshot or an environment, with what came from it in
        ``children``. A removed sandbox stays while something that exists
        came from it; with ``all``, always."""
        sid = sandbox.id if isinstance(sandbox, Sandbox) else sandbox
        doc = self._t.request("GET", _tree_path(sid, all))
        return [TreeNode.from_json(n) for n in _items(doc, "roots")]

    def diff(self, id_or_name: str, against: Union[str, Sandbox, None] = None, *, patch: bool = False) -> Diff:
        """What changed in a sandbox's files (:meth:`Sandbox.diff` for one
        in hand): from ``against`` (a sandbox of its image) to it, or,
        without, since it started."""
        other = against.id if isinstance(against, Sandbox) else against
        doc = self._t.request("GET", _diff_path(id_or_name, other, patch))
        return Diff.from_json(_mapping(doc, "a diff"))

    # -- checkpoints, resume, environments ----------------------------------

    def resume(self, session: Union[str, Sandbox], name: Optional[str] = None) -> Sandbox:
        """Recreates a sandbox from a ledger session (a name, or a
        :class:`Sandbox` for its session), also a removed sandbox's: from the
        session's latest checkpoint (or fresh), it replays the execs the
        ledger recorded after it. The new sandbox has a new id; its
        ``resume_result`` tells what was replayed."""
        s = session.session if isinstance(session, Sandbox) else session
        doc = self._t.request("POST", f"/ledger/sessions/{esc(s)}/resume", _drop_none({"name": name}))
        res = ResumeResult.from_json(_mapping(doc, "a resume"))
        return Sandbox(self, res.sandbox, resume_result=res)

    def remove_session(self, session: Union[str, Sandbox]) -> None:
        """Deletes a ledger session and its events, for good. Refused
        (ShardError 409 ``session_in_use``) while its sandbox exists, and
        (``session_has_checkpoints``) while it has checkpoints."""
        s = session.session if isinstance(session, Sandbox) else session
        self._t.request("DELETE", f"/ledger/sessions/{esc(s)}")

    def restore_checkpoint(self, checkpoint: Union[str, Checkpoint], name: Optional[str] = None) -> Sandbox:
        """Starts a new sandbox from a checkpoint (its id, or a
        :class:`Checkpoint`): memory, processes and files as they were, and a
        clean exec history; nothing is replayed (compare :meth:`resume`)."""
        cid = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        doc = self._t.request("POST", f"/checkpoints/{esc(cid)}/restore", _drop_none({"name": name}))
        return Sandbox(self, SandboxInfo.from_json(_mapping(doc, "a restore")))

    def restore_snapshot(self, checkpoint: Union[str, Checkpoint], name: Optional[str] = None) -> Sandbox:
        """:meth:`restore_checkpoint` by the product spec's name: the same call."""
        return self.restore_checkpoint(checkpoint, name)

    def checkpoints(self) -> List[Checkpoint]:
        """Every checkpoint on the server (taken by hand, by forks, and the environments')."""
        doc = self._t.request("GET", "/checkpoints")
        return [Checkpoint.from_json(c) for c in _items(doc, "checkpoints")]

    def remove_checkpoint(self, checkpoint: Union[str, Checkpoint]) -> None:
        """Deletes a checkpoint and its files (one an environment uses is
        refused: ``checkpoint_in_use``)."""
        cid = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        self._t.request("DELETE", f"/checkpoints/{esc(cid)}")

    def environment(
        self,
        name: str,
        *,
        image: str,
        memory_mib: Optional[int] = None,
        cpu: Union[float, str, None] = None,
        disk: Optional[Size] = None,
        env: Optional[EnvVars] = None,
        provider: Optional[str] = None,
        setup: Union[SetupFn, Sequence[Sequence[str]], None] = None,
    ) -> Environment:
        """Defines the environment ``name`` (nothing is sent yet): sandboxes
        from ``image`` with these bounds, prepared once by ``setup`` — a
        callable given the setup sandbox, or a list of commands (argv lists)
        the server runs. ``environment(...).sandbox()`` builds it when it is
        missing or its definition changed, then starts a sandbox from it."""
        return Environment(
            self, name, image=image, memory_mib=memory_mib, cpu=cpu, disk=disk, env=env, provider=provider, setup=setup
        )

    # -- secrets ---------------------------------------------------------------

    def set_secret(self, name: str, value: Union[str, bytes]) -> Secret:
        """Stores ``value`` (str as UTF-8, or bytes, taken as is) under
        ``name``, encrypted, replacing any value it had; the server never
        returns it. :attr:`Sandbox.credentials` grants it to sandboxes."""
        raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        doc = self._t.request("PUT", f"/secrets/{esc(name)}", {"value": base64.b64encode(raw).decode("ascii")})
        return Secret.from_json(_mapping(doc, "a secret"))

    def remove_secret(self, name: str) -> None:
        """Deletes a secret: env grants of it give nothing to later execs."""
        self._t.request("DELETE", f"/secrets/{esc(name)}")

    # -- API keys --------------------------------------------------------------

    def create_token(self, name: str, scopes: Sequence[str], *, project: Optional[str] = None) -> Token:
        """Makes an API key named ``name`` with ``scopes`` (no more than the
        caller's own; needs ``token:write``); its ``key`` is in the answer,
        shown this once. It acts in ``project`` (default: the client's
        project); ``"*"`` makes a key of every project, which only such a key
        (or the socket) may make: else ShardError ``wrong_project`` (403)."""
        if isinstance(scopes, str):
            raise TypeError('scopes must be a list of strings, e.g. ["sandbox:read"]')
        doc = self._t.request("POST", "/tokens", _drop_none({"name": name, "scopes": list(scopes), "project": project or None}))
        return Token.from_json(_mapping(doc, "a token"))

    def tokens(self) -> List[Token]:
        """The API keys this client's key may see (``token:read``): its
        project's, or every project's for a key of every project."""
        return [Token.from_json(t) for t in _items(self._t.request("GET", "/tokens"), "tokens")]

    def revoke_token(self, id_or_name: Union[str, Token]) -> None:
        """Revokes an API key by id, name or :class:`Token` (``token:write``)."""
        ref = id_or_name.id if isinstance(id_or_name, Token) else id_or_name
        self._t.request("DELETE", f"/tokens/{esc(ref)}")

    def whoami(self) -> Whoami:
        """Who this client's key is: its name, project, scopes and whether it
        is of every project. Any valid key may ask, whatever its scopes; over
        the Unix socket it is ``admin``, of every project, with ``*``."""
        return Whoami.from_json(_mapping(self._t.request("GET", "/whoami"), "whoami"))

    # -- projects and their quotas ---------------------------------------------

    def projects(self) -> List[Project]:
        """The projects this client's key may see (every project for a key of
        every project, or the socket; else its own), by name, each with its
        counts, its ``quota`` and its ``use`` against it (``sandbox:read``)."""
        return [Project.from_json(p) for p in _items(self._t.request("GET", "/projects"), "projects")]

    def set_project_quota(
        self,
        name: str,
        quota: Optional[ProjectQuota] = None,
        *,
        max_sandboxes: Optional[int] = None,
        max_memory_bytes: Optional[int] = None,
        max_cpu_millis: Optional[int] = None,
        max_disk_bytes: Optional[int] = None,
        max_saved_bytes: Optional[int] = None,
        max_ledger_bytes: Optional[int] = None,
    ) -> Project:
        """Replaces project ``name``'s quota and returns the project with its
        quota and use. The bounds are the keywords (sizes in bytes; cpu in
        thousandths: 1000 is one cpu), or a :class:`ProjectQuota` (another
        project's ``quota``, say), not both; one left out (None) or 0 has no
        bound, and none at all removes every bound. Only a key of every
        project with the scope ``*`` (or the socket) may: else ShardError
        ``missing_scope`` or ``wrong_project`` (403). From then on what would
        pass a bound is refused with ShardError ``quota_exceeded`` (403);
        what the project already holds past a lowered bound stays."""
        bounds = {
            "max_sandboxes": max_sandboxes,
            "max_memory_bytes": max_memory_bytes,
            "max_cpu_millis": max_cpu_millis,
            "max_disk_bytes": max_disk_bytes,
            "max_saved_bytes": max_saved_bytes,
            "max_ledger_bytes": max_ledger_bytes,
        }
        if quota is not None:
            if not isinstance(quota, ProjectQuota):
                raise TypeError("quota must be a ProjectQuota; give the bounds as keywords, e.g. max_sandboxes=10")
            if any(v is not None for v in bounds.values()):
                raise TypeError("give the bounds as a ProjectQuota or as keywords, not both")
            bounds = {k: getattr(quota, k) for k in bounds}
        for k, v in bounds.items():
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise TypeError(f"{k} must be an int (bytes, sandboxes or thousandths of a cpu), not {v!r}")
        doc = self._t.request("PUT", f"/projects/{esc(name)}/quota", _drop_none(bounds))
        return Project.from_json(_mapping(doc, "a project"))

    # -- the server ------------------------------------------------------------

    def version(self) -> Dict[str, Any]:
        """The server's version document (GET /v0/version; no key needed)."""
        return dict(_mapping(self._t.request("GET", "/version"), "the version"))

    def capabilities(self) -> List[Dict[str, Any]]:
        """Every provider: whether it runs here (or why not), and whether it
        can fork, snapshot and checkpoint."""
        return [dict(p) for p in _items(self._t.request("GET", "/capabilities"), "providers")]
