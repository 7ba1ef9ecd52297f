"""A sandbox's files, in and out: ``sandbox.files`` (:class:`Files`) and
the reads it streams (:class:`FileReader`)."""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import stat as _stat
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Union, cast
from urllib.parse import urlencode

from ._errors import ShardError
from ._transport import Response, esc
from ._types import FileInfo, FileList, WriteResult, as_object

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Shard

__all__ = ["Files", "FileReader", "TAR_TYPE", "FILE_STAT_HEADER"]

TAR_TYPE = "application/x-tar"
"""The media type of an archive of a sandbox's files (a tar), both ways."""

FILE_STAT_HEADER = "X-Shard-File-Stat"
"""The header of a read's answer: base64 of the JSON :class:`FileInfo` of what is read."""

CHUNK = 1 << 20
"""How much a stream is read (and sent) at a time."""

Mode = Union[int, str]
"""A file's mode: a number (``0o755``) or octal digits (``"755"``)."""

MTime = Union[datetime, int, float, str]
"""A modification time: a datetime (a naive one is local time), seconds
since the epoch, or an RFC 3339 string."""

Source = Union[bytes, bytearray, memoryview, str, Any, Iterable[Union[bytes, str]]]
"""What a streamed write takes: a file-like object with ``read()``
(``open(path, "rb")``), or an iterable of bytes (or str) chunks; or all
of it as bytes or str."""


def _query(path: str, **params: Optional[str]) -> str:
    if not isinstance(path, str) or not path:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError("give the file's absolute path in the sandbox, e.g. /srv/app/main.py")
    q = [("path", path)] + [(k, v) for k, v in params.items() if v is not None]
    return "?" + urlencode(q)


def _mode(mode: Optional[Mode]) -> Optional[str]:
    if mode is None:
        return None
    if isinstance(mode, str):
        if not (1 <= len(mode) <= 4 and all(c in "01234567" for c in mode)):
            raise ValueError(f"mode {mode!r}: give octal digits, at most 7777 (e.g. '755'), or a number (0o755)")
        return mode
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"mode {mode!r}: give a number at most 0o7777 (e.g. 0o755), or octal digits ('755')")
    return format(mode, "o")


def _id(name: str, v: Optional[int]) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"{name} {v!r}: give a non-negative integer")
    return str(v)


def _mtime(v: Optional[MTime]) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, datetime):
        dt = v.astimezone(timezone.utc)
    elif isinstance(v, (int, float)) and not isinstance(v, bool):  # pyright: ignore[reportUnnecessaryIsInstance]
        dt = datetime.fromtimestamp(v, timezone.utc)
    else:
        raise TypeError(f"mtime {v!r}: give a datetime, seconds since the epoch, or an RFC 3339 string")
    return dt.isoformat().replace("+00:00", "Z")


def _stat_header(resp: Response) -> FileInfo:
    raw = resp.raw.getheader(FILE_STAT_HEADER) or ""
    try:
        doc = as_object(json.loads(base64.b64decode(raw, validate=True).decode("utf-8")))
    except (ValueError, UnicodeDecodeError):
        doc = None
    if doc is None or not isinstance(doc.get("path"), str):
        raise ShardError("bad_response", f"the server's read of files has no readable {FILE_STAT_HEADER} header: {raw[:200]!r}", 502)
    return FileInfo.from_json(doc)


def pieces_of(source: Any, size: int = CHUNK, what: str = "the source") -> Iterator[Any]:
    """The bytes of a streamed write (or of a command's stdin), as the
    source gives them (bytes-like, none empty): a file-like read ``size`` at
    a time, or an iterable's items."""
    read: Any = getattr(source, "read", None)
    if callable(read):
        while True:
            data = read(size)
            if data is None:  # a non-blocking file with nothing yet
                continue
            if not data:
                return
            yield data.encode("utf-8") if isinstance(data, str) else bytes(data)
        return
    for item in source:
        data: Any = item
        if isinstance(data, str):
            data = data.encode("utf-8")
        elif not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"{what} gave a {type(data).__name__}, not bytes or str")
        if data:
            yield data


def _whole(data: Union[bytes, bytearray, memoryview]) -> Iterator[Union[bytes, bytearray, memoryview]]:
    yield data


def _regular_file_left(source: Any) -> Optional[int]:
    """For a regular file opened for reading, the bytes left to read in it
    (then the server checks that exactly as many arrived); else None."""
    fileno: Any = getattr(source, "fileno", None)
    tell: Any = getattr(source, "tell", None)
    if not callable(fileno) or not callable(tell) or isinstance(source, io.TextIOBase):
        return None
    try:
        st = os.fstat(cast(int, fileno()))
        if not _stat.S_ISREG(st.st_mode):
            return None
        return max(st.st_size - cast(int, tell()), 0)
    except (OSError, ValueError, io.UnsupportedOperation):
        return None


class FileReader(io.RawIOBase):
    """A read of a sandbox's files as it arrives: a file's bytes, or a tar.

    A binary file-like object (``read``, ``readinto``; for
    ``shutil.copyfileobj`` or ``tarfile.open(fileobj=r, mode="r|")``);
    iterating it gives the bytes in chunks as they come (not lines).
    :attr:`info` describes what is read. A read that breaks off before its
    end (fewer bytes than the file's length, an archive cut short) raises
    ShardError ``stream_ended``: it never ends as if the file were whole.
    Use it as a context manager, or :meth:`close` it; one left before its
    end drops its connection.
    """

    info: FileInfo
    """What is read (for an archive: the path archived)."""
    length: Optional[int]
    """The bytes the server sends: a file's length; None for an archive."""

    def __init__(self, response: Response, info: FileInfo, what: str) -> None:
        super().__init__()
        self._resp: Optional[Response] = response
        self.info = info
        self._what = what
        cl = response.raw.getheader("Content-Length")
        self.length = int(cl) if cl is not None and cl.strip().isdigit() else None
        self._got = 0
        self._done = False

    @property
    def bytes_read(self) -> int:
        """Bytes read so far."""
        return self._got

    def readable(self) -> bool:
        return True

    def _broken(self, why: str) -> ShardError:
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.close()
        of = f" of {self.length}" if self.length is not None else ""
        return ShardError("stream_ended", f"{self._what} broke off after {self._got}{of} bytes ({why}): what was read is not whole", 502)

    def _end(self) -> None:
        """The body ended: whole, or broken off."""
        if self.length is not None and self._got < self.length:
            raise self._broken("the connection ended")
        self._done = True
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.release()

    def readinto(self, b: Any) -> int:  # type: ignore[override]
        if self.closed:
            raise ValueError("read from a closed FileReader")
        resp = self._resp
        if resp is None:
            if self._done:
                return 0
            raise ShardError("stream_ended", f"{self._what} broke off: nothing more can be read", 502)
        view = memoryview(b).cast("B")
        if not view:
            return 0
        try:
            n = resp.raw.readinto(view)
        except http.client.IncompleteRead as e:
            raise self._broken(f"incomplete: {e!r}") from None
        except (OSError, http.client.HTTPException) as e:
            raise self._broken(str(e) or type(e).__name__) from None
        if not n:
            self._end()
            return 0
        self._got += n
        if self.length is not None and self._got >= self.length:
            self._end()  # all of it: the connection goes back at once
        return n

    def read(self, size: Optional[int] = -1) -> bytes:  # type: ignore[override]
        if size is None or size < 0:
            return self.readall()
        buf = bytearray(size)
        n = self.readinto(buf)
        del buf[n:]
        return bytes(buf)

    def readall(self) -> bytes:
        parts: List[bytes] = []
        while True:
            data = self.read(CHUNK)
            if not data:
                return b"".join(parts)
            parts.append(data)

    def chunks(self, size: int = CHUNK) -> Iterator[bytes]:
        """The bytes, at most ``size`` at a time, as they arrive."""
        while True:
            data = self.read(size)
            if not data:
                return
            yield data

    def __iter__(self) -> Iterator[bytes]:  # type: ignore[override]
        return self.chunks()

    def __next__(self) -> bytes:  # type: ignore[override]
        data = self.read(CHUNK)
        if not data:
            raise StopIteration
        return data

    def close(self) -> None:
        """Stops reading: the connection is dropped unless the read reached its end."""
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.close()
        super().close()

    def __enter__(self) -> "FileReader":
        return self


class Files:
    """The files of one sandbox, running or stopped: ``sandbox.files``, or
    ``shard.files("name")`` for a sandbox not looked up.

    Paths are absolute, resolved inside the sandbox's own root (a ``..`` or
    a symlink never leads out of it). Errors are :class:`ShardError` with
    the API's codes: ``file_not_found`` (404), ``is_a_directory``,
    ``not_a_directory``, ``not_a_regular_file``, ``invalid_path``,
    ``unsafe_archive``, ``short_body`` (400), ``directory_not_empty``,
    ``permission_denied``, ``sandbox_busy``, ``sandbox_frozen`` (409),
    ``disk_full`` (507), ...
    """

    def __init__(self, shard: "Shard", sandbox: Union[str, Callable[[], str]]) -> None:
        self._shard = shard
        self._sandbox = sandbox

    @property
    def sandbox(self) -> str:
        """The sandbox (id or name) these are the files of."""
        return self._sandbox if isinstance(self._sandbox, str) else self._sandbox()

    def __repr__(self) -> str:
        return f"Files(sandbox={self.sandbox!r})"

    def _url(self, op: str, path: str, **params: Optional[str]) -> str:
        return f"/sandboxes/{esc(self.sandbox)}/files{op}{_query(path, **params)}"

    # -- reads ---------------------------------------------------------------

    def _open(self, path: str, accept: str, follow_link: bool, what: str) -> FileReader:
        t = self._shard._t
        resp = t.stream("GET", self._url("", path, follow_link="true" if follow_link else None), None, accept=accept)
        try:
            info = _stat_header(resp)
        except BaseException:
            resp.close()
            raise
        return FileReader(resp, info, what)

    def read_stream(self, path: str) -> FileReader:
        """The bytes of the file at ``path`` (a symlink is followed), as a
        :class:`FileReader` streamed as the sandbox reads them. Errors such
        as ``file_not_found`` are raised here; ``reader.info`` describes
        the file.

        >>> with sandbox.files.read_stream("/var/log/big.log") as r, open("big.log", "wb") as out:
        ...     shutil.copyfileobj(r, out)
        """
        return self._open(path, "application/octet-stream", False, f"the read of {path} in sandbox {self.sandbox}")

    def read(self, path: str) -> bytes:
        """All the bytes of the file at ``path`` (held in memory: see
        :meth:`read_stream` for big files)."""
        with self.read_stream(path) as r:
            return r.readall()

    def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        """The file at ``path``, decoded (UTF-8 unless ``encoding`` says)."""
        return self.read(path).decode(encoding, errors)

    def read_archive(self, path: str, *, follow_link: bool = False) -> FileReader:
        """A tar of ``path``, streamed: a directory with all it holds (or one
        file), its entries named from ``path``'s last element; symlinks as
        symlinks (``follow_link``: a symlink at ``path`` is archived as what
        it names), numeric owners.

        >>> with sandbox.files.read_archive("/srv/app") as r, tarfile.open(fileobj=r, mode="r|") as tar:
        ...     tar.extractall("app-copy")
        """
        return self._open(path, TAR_TYPE, follow_link, f"the archive of {path} in sandbox {self.sandbox}")

    # -- writes --------------------------------------------------------------

    def _write(self, path: str, pieces: Iterable[Any], length: Optional[int], content_type: str, **params: Optional[str]) -> WriteResult:
        doc = self._shard._t.upload("PUT", self._url("", path, **params), content_type, pieces, length)
        obj = as_object(doc)
        if obj is None:
            raise ShardError("bad_response", "the server's answer to a write of files is not a JSON object")
        return WriteResult.from_json(obj)

    def write(
        self,
        path: str,
        data: Union[bytes, bytearray, memoryview, str],
        *,
        mode: Optional[Mode] = None,
        uid: Optional[int] = None,
        gid: Optional[int] = None,
        mtime: Optional[MTime] = None,
        parents: bool = False,
    ) -> WriteResult:
        """Writes ``data`` (bytes, or str as UTF-8) as the file at ``path``,
        replacing it whole: a reader never sees half of it. The replaced
        file's mode and owner stay unless ``mode`` (``0o755`` or ``"755"``),
        ``uid``, ``gid`` say otherwise (a new file: 0o644, root's);
        ``mtime`` sets its modification time (default: now). Its parent
        directory must exist, unless ``parents``."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, (bytes, bytearray, memoryview)):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError("write takes bytes or str: use write_stream for a file object or an iterable")
        n = memoryview(data).nbytes
        return self._write(path, _whole(data), n, "application/octet-stream", **self._file_params(mode, uid, gid, mtime, parents))

    @staticmethod
    def _file_params(mode: Optional[Mode], uid: Optional[int], gid: Optional[int], mtime: Optional[MTime], parents: bool) -> Dict[str, Optional[str]]:
        return {
            "mode": _mode(mode),
            "uid": _id("uid", uid),
            "gid": _id("gid", gid),
            "mtime": _mtime(mtime),
            "parents": "true" if parents else None,
        }

    def write_stream(
        self,
        path: str,
        source: Source,
        *,
        mode: Optional[Mode] = None,
        uid: Optional[int] = None,
        gid: Optional[int] = None,
        mtime: Optional[MTime] = None,
        parents: bool = False,
    ) -> WriteResult:
        """Writes what ``source`` gives as the file at ``path``: a file-like
        object with ``read()`` (``open(path, "rb")``; a regular file goes
        with its length), or an iterable of bytes (or str) chunks, sent
        chunked as it is read, never held whole in memory. Nothing is
        written unless all of it arrives: a source that raises (ShardError
        ``source_failed``, its exception the ``__cause__``) or a connection
        that breaks leaves the file as it was. Options as :meth:`write`'s."""
        params = self._file_params(mode, uid, gid, mtime, parents)
        if isinstance(source, (bytes, bytearray, memoryview, str)):
            return self.write(path, cast(Any, source), mode=mode, uid=uid, gid=gid, mtime=mtime, parents=parents)
        self._check_source(source, "write_stream")
        return self._write(path, pieces_of(source), _regular_file_left(source), "application/octet-stream", **params)

    def write_archive(self, directory: str, source: Source) -> WriteResult:
        """Unpacks a tar into the directory ``directory`` (made, with its
        parents, if missing): bytes, a file-like object or an iterable of
        chunks, as :meth:`write_stream` takes. Entries keep their owner, mode
        and times; one that would land outside is refused
        (``unsafe_archive``; the entries before it stay); device nodes are
        skipped and setuid bits removed, each said in the result's
        ``notes``.

        >>> buf = io.BytesIO()
        >>> with tarfile.open(fileobj=buf, mode="w") as tar:
        ...     tar.add("app", arcname="app")
        >>> sandbox.files.write_archive("/srv", buf.getvalue())
        """
        if isinstance(source, str):
            raise TypeError("write_archive takes a tar's bytes, a file object or an iterable of bytes, not a str")
        if isinstance(source, (bytes, bytearray, memoryview)):
            whole: Any = source
            return self._write(directory, _whole(whole), memoryview(whole).nbytes, TAR_TYPE)
        self._check_source(source, "write_archive")
        return self._write(directory, pieces_of(source), _regular_file_left(source), TAR_TYPE)

    @staticmethod
    def _check_source(source: Any, what: str) -> None:
        if not callable(getattr(source, "read", None)) and not hasattr(source, "__iter__"):
            raise TypeError(f"{what} takes bytes, a file-like object with read(), or an iterable of bytes")

    # -- the rest ------------------------------------------------------------

    def list(self, path: str, *, limit: Optional[int] = None) -> FileList:
        """The entries of the directory ``path`` (a symlink to one is
        followed), sorted by name: at most ``limit`` (the server's bound:
        10000), ``truncated`` when there were more."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError("limit must be a positive integer")
        doc = self._shard._t.request("GET", self._url("/list", path, limit=None if limit is None else str(limit)))
        obj = as_object(doc)
        if obj is None:
            raise ShardError("bad_response", "the server's answer for a list of files is not a JSON object")
        return FileList.from_json(obj)

    def stat(self, path: str, *, follow_link: bool = False) -> FileInfo:
        """Describes ``path``: a symlink itself, or with ``follow_link``
        what it names."""
        doc = self._shard._t.request("GET", self._url("/stat", path, follow_link="true" if follow_link else None))
        obj = as_object(doc)
        if obj is None:
            raise ShardError("bad_response", "the server's answer for a stat of a file is not a JSON object")
        return FileInfo.from_json(obj)

    def exists(self, path: str) -> bool:
        """Whether anything is at ``path`` (a dangling symlink counts)."""
        try:
            self.stat(path)
            return True
        except ShardError as e:
            if e.code in ("file_not_found", "not_a_directory"):
                return False
            raise

    def remove(self, path: str, *, recursive: bool = False) -> FileInfo:
        """Removes ``path`` (a symlink itself, not what it names); a
        directory that holds anything only with ``recursive``. Returns what
        was removed."""
        doc = self._shard._t.request("DELETE", self._url("", path, recursive="true" if recursive else None))
        obj = as_object(doc)
        if obj is None:
            raise ShardError("bad_response", "the server's answer to a removal of a file is not a JSON object")
        return FileInfo.from_json(obj)

