"""Typed views of what the API answers (the JSON names are in client/types.go).

Every view keeps the answer it was read from in ``raw``, so a field a newer
server adds is reachable before the SDK names it.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Iterator, List, Literal, Mapping, Optional, cast

__all__ = [
    "Change",
    "Chunk",
    "Checkpoint",
    "SandboxRemoved",
    "Diff",
    "DiffSide",
    "EnvironmentInfo",
    "ExecResult",
    "ExitStatus",
    "FileInfo",
    "FileList",
    "Grant",
    "Policy",
    "Project",
    "ProjectQuota",
    "ProjectUse",
    "ReplayedExec",
    "ReappliedChange",
    "ResumeResult",
    "SandboxInfo",
    "Secret",
    "Token",
    "TreeNode",
    "Whoami",
    "WriteResult",
]

StreamName = Literal["stdout", "stderr"]

JSONObject = Dict[str, Any]


def as_object(v: Any) -> Optional[JSONObject]:
    """v when it is a JSON object, else None."""
    return cast(JSONObject, v) if isinstance(v, dict) else None


def as_list(v: Any) -> List[Any]:
    """v when it is a JSON array, else []."""
    return cast(List[Any], v) if isinstance(v, list) else []


def objects(v: Any) -> List[JSONObject]:
    """The JSON objects in the array v."""
    return [cast(JSONObject, x) for x in as_list(v) if isinstance(x, dict)]


def _empty_strs() -> List[str]:
    return []


def _str(d: Mapping[str, Any], key: str) -> str:
    v = d.get(key)
    return v if isinstance(v, str) else ""


def _opt_str(d: Mapping[str, Any], key: str) -> Optional[str]:
    v = d.get(key)
    return v if isinstance(v, str) and v else None


def _opt_b64(d: Mapping[str, Any], key: str) -> Optional[bytes]:
    """Bytes sent as base64 (Go's []byte); None when absent or unreadable."""
    v = d.get(key)
    if not isinstance(v, str) or not v:
        return None
    try:
        return base64.b64decode(v, validate=True)
    except ValueError:
        return None


def _int(d: Mapping[str, Any], key: str) -> int:
    v = d.get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _opt_int(d: Mapping[str, Any], key: str) -> Optional[int]:
    v = d.get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _float(d: Mapping[str, Any], key: str) -> float:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _strs(d: Mapping[str, Any], key: str) -> List[str]:
    return [s for s in as_list(d.get(key)) if isinstance(s, str)]


def _time(d: Mapping[str, Any], key: str) -> Optional[datetime]:
    """Parses an RFC 3339 time as Go writes it; None when absent or unreadable."""
    v = d.get(key)
    if not isinstance(v, str) or not v:
        return None
    s = v[:-1] + "+00:00" if v.endswith("Z") else v
    # Go writes up to 9 digits of fraction; Python before 3.11 takes at most 6.
    head, dot, rest = s.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        s = head + "." + rest[: min(digits, 6)] + rest[digits:]
        if digits == 0:
            s = head + rest
    try:
        return datetime.fromisoformat(s)
    except ValueError:
        return None


@dataclass(frozen=True)
class Grant:
    """A secret given to a sandbox (its name, never its value): as the
    environment variable ``env`` of every exec, or as the file ``file``."""

    secret: str
    env: Optional[str] = None
    file: Optional[str] = None
    at: Optional[datetime] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Grant":
        """Reads a grant from its JSON object."""
        return cls(secret=_str(d, "secret"), env=_opt_str(d, "env"), file=_opt_str(d, "file"), at=_time(d, "at"))


@dataclass(frozen=True)
class Policy:
    """A sandbox's egress network policy (see the server's README)."""

    deny_all: bool = False
    allow: List[str] = field(default_factory=_empty_strs)
    deny: List[str] = field(default_factory=_empty_strs)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Policy":
        """Reads a policy from its JSON object."""
        return cls(deny_all=bool(d.get("deny_all")), allow=_strs(d, "allow"), deny=_strs(d, "deny"))


@dataclass(frozen=True)
class Origin:
    """What a sandbox was made from, named as it was then (it may have been
    removed since)."""

    kind: str
    """image, snapshot, environment, fork, checkpoint (a restore) or session
    (a resume)."""
    name: Optional[str] = None
    """The image, snapshot, environment, forked sandbox or session; a
    checkpoint's tag."""
    id: Optional[str] = None
    """The snapshot's, forked sandbox's or checkpoint's id."""
    checkpoint: Optional[str] = None
    """The checkpoint a fork, an environment's sandbox or a resume started from."""
    raw: JSONObject = field(default_factory=lambda: {}, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Origin":
        """Reads an origin from its JSON object."""
        return cls(
            kind=_str(d, "kind"),
            name=_opt_str(d, "name"),
            id=_opt_str(d, "id"),
            checkpoint=_opt_str(d, "checkpoint"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the server last described it (GET /v0/sandboxes/{id})."""

    id: str
    name: str
    image: str
    image_digest: str
    provider: str
    state: str
    """creating, running, freezing, stopping, stopped, starting, removing or
    failed; in a cluster, unreachable (its node's lease expired)."""
    memory_bytes: int
    memory_mib: int
    cpu: float
    disk_bytes: int
    pids_limit: int
    env: List[str]
    session: str
    """The ledger session the sandbox records its events under."""
    grants: List[Grant]
    project: str = ""
    """The project it belongs to (see :class:`Shard`'s ``project``)."""
    oom_kills: int = 0
    ip: Optional[str] = None
    error: Optional[str] = None
    parent_id: Optional[str] = None
    """The sandbox it was forked or restored from; it may have been removed
    since: ``origin`` names it."""
    origin: Optional[Origin] = None
    """What it was made from; None for a sandbox made by an older server."""
    policy: Optional[Policy] = None
    node: Optional[str] = None
    """In a cluster, the node it runs on."""
    created_at: Optional[datetime] = None
    started_at: Optional[datetime] = None
    stopped_at: Optional[datetime] = None
    raw: JSONObject = field(default_factory=lambda: {}, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SandboxInfo":
        """Reads a sandbox from its JSON object."""
        policy = as_object(d.get("policy"))
        origin = as_object(d.get("origin"))
        return cls(
            id=_str(d, "id"),
            name=_str(d, "name"),
            image=_str(d, "image"),
            image_digest=_str(d, "image_digest"),
            provider=_str(d, "provider"),
            state=_str(d, "state"),
            memory_bytes=_int(d, "memory_bytes"),
            memory_mib=_int(d, "memory_mib"),
            cpu=_float(d, "cpu"),
            disk_bytes=_int(d, "disk_bytes"),
            pids_limit=_int(d, "pids_limit"),
            env=_strs(d, "env"),
            session=_str(d, "session"),
            grants=[Grant.from_json(g) for g in objects(d.get("grants"))],
            project=_str(d, "project"),
            oom_kills=_int(d, "oom_kills"),
            ip=_opt_str(d, "ip"),
            error=_opt_str(d, "error"),
            parent_id=_opt_str(d, "parent_id"),
            origin=Origin.from_json(origin) if origin is not None else None,
            policy=Policy.from_json(policy) if policy is not None else None,
            node=_opt_str(d, "node"),
            created_at=_time(d, "created_at"),
            started_at=_time(d, "started_at"),
            stopped_at=_time(d, "stopped_at"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Checkpoint:
    """A saved instant of a running sandbox: memory, processes and files.

    Made by :meth:`Sandbox.checkpoint` (kind ``checkpoint``), by every
    :meth:`Sandbox.fork` (kind ``fork``) and by building an environment (kind
    ``environment``). :meth:`Shard.restore_checkpoint` starts a sandbox from one.
    """

    id: str
    kind: str
    sandbox_id: str
    sandbox_name: str
    session: str
    seq: int
    image: str
    provider: str
    tag: Optional[str] = None
    image_digest: str = ""
    memory_bytes: int = 0
    cpu: float = 0.0
    disk_bytes: int = 0
    size: int = 0
    freeze_ms: int = 0
    # How its memory reaches a fork or restore: "handoff" (a copy of the
    # memory file, adopted) or "pages" (loaded page by page); memory_note
    # says why "pages".
    memory: Optional[str] = None
    memory_note: Optional[str] = None
    # The server removes it once no sandbox's resume starts from it (a
    # fork's, made without keep_checkpoint); False: kept until removed.
    auto_remove: bool = False
    created_at: Optional[datetime] = None
    raw: JSONObject = field(default_factory=lambda: {}, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Checkpoint":
        """Reads a checkpoint from its JSON object."""
        return cls(
            id=_str(d, "id"),
            kind=_str(d, "kind"),
            sandbox_id=_str(d, "sandbox_id"),
            sandbox_name=_str(d, "sandbox_name"),
            session=_str(d, "session"),
            seq=_int(d, "seq"),
            image=_str(d, "image"),
            provider=_str(d, "provider"),
            tag=_opt_str(d, "tag"),
            image_digest=_str(d, "image_digest"),
            memory_bytes=_int(d, "memory_bytes"),
            cpu=_float(d, "cpu"),
            disk_bytes=_int(d, "disk_bytes"),
            size=_int(d, "size"),
            freeze_ms=_int(d, "freeze_ms"),
            memory=_opt_str(d, "memory"),
            memory_note=_opt_str(d, "memory_note"),
            auto_remove=bool(d.get("auto_remove")),
            created_at=_time(d, "created_at"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class SandboxRemoved:
    """What :meth:`Sandbox.remove` removed: the sandbox, and the
    checkpoints that went with it (its session's, asked with
    ``checkpoints=True``; forks' no sandbox needs any more) and their bytes."""

    removed: str
    checkpoints: List[str] = field(default_factory=_empty_strs)
    freed_bytes: int = 0
    raw: JSONObject = field(default_factory=lambda: {}, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SandboxRemoved":
        """Reads the answer of a remove."""
        return cls(removed=_str(d, "removed"), checkpoints=_strs(d, "checkpoints"), freed_bytes=_int(d, "freed_bytes"), raw=dict(d))


@dataclass(frozen=True)
class EnvironmentInfo:
    """A named environment as the server keeps it (GET /v0/environments/{name})."""

    name: str
    image: str
    provider: str
    fingerprint: str
    checkpoint: str
    image_digest: str = ""
    memory_bytes: int = 0
    cpu: float = 0.0
    disk_bytes: int = 0
    env: List[str] = field(default_factory=_empty_strs)
    setup: List[List[str]] = field(default_factory=lambda: [])
    created_at: Optional[datetime] = None
    origin: Optional[str] = None
    """In a cluster, on a node holding a copy: the node that built it."""
    raw: JSONObject = field(default_factory=lambda: {}, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "EnvironmentInfo":
        """Reads an environment from its JSON object."""
        return cls(
            name=_str(d, "name"),
            image=_str(d, "image"),
            provider=_str(d, "provider"),
            fingerprint=_str(d, "fingerprint"),
            checkpoint=_str(d, "checkpoint"),
            image_digest=_str(d, "image_digest"),
            memory_bytes=_int(d, "memory_bytes"),
            cpu=_float(d, "cpu"),
            disk_bytes=_int(d, "disk_bytes"),
            env=_strs(d, "env"),
            setup=[[a for a in as_list(argv) if isinstance(a, str)] for argv in as_list(d.get("setup"))],
            created_at=_time(d, "created_at"),
            origin=_opt_str(d, "origin"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Secret:
    """A stored secret's record: its name and times, never its value."""

    name: str
    created_at: Optional[datetime] = None
    updated_at: Optional[datetime] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Secret":
        """Reads a secret's record from its JSON object."""
        return cls(name=_str(d, "name"), created_at=_time(d, "created_at"), updated_at=_time(d, "updated_at"))


@dataclass(frozen=True)
class Token:
    """An API key's record (:meth:`Shard.tokens`). ``key`` is the key itself,
    set only in the answer to :meth:`Shard.create_token`: shown that once."""

    id: str
    name: str
    """Unique in its project."""
    project: str
    """The one project the key acts in, or ``"*"`` for every project."""
    scopes: List[str]
    created_at: Optional[datetime] = None
    key: Optional[str] = field(default=None, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Token":
        """Reads a token from its JSON object."""
        return cls(
            id=_str(d, "id"),
            name=_str(d, "name"),
            project=_str(d, "project"),
            scopes=_strs(d, "scopes"),
            created_at=_time(d, "created_at"),
            key=_opt_str(d, "key"),
        )


@dataclass(frozen=True)
class Whoami:
    """The key a client sends, as :meth:`Shard.whoami` tells it (GET
    /v0/whoami; any valid key may ask, whatever its scopes). Over the Unix
    socket it is the administrator: ``admin``, project ``"*"``, scopes
    ``["*"]``."""

    name: str
    project: str
    """The one project the key acts in, or ``"*"`` for every project."""
    scopes: List[str]
    all_projects: bool
    """Whether the key may act in every project (and name one per client)."""
    raw: JSONObject = field(default_factory=lambda: {}, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Whoami":
        """Reads the answer to GET /v0/whoami."""
        return cls(
            name=_str(d, "name"),
            project=_str(d, "project"),
            scopes=_strs(d, "scopes"),
            all_projects=d.get("all_projects") is True,
            raw=dict(d),
        )


@dataclass(frozen=True)
class ProjectQuota:
    """What an administrator bounds one project to (:meth:`Shard.set_project_quota`).
    None (the server leaves it out) or 0 is no bound."""

    max_sandboxes: Optional[int] = None
    """Sandboxes, whatever their state (forks and sandboxes from environments count)."""
    max_memory_bytes: Optional[int] = None
    """The memory bounds of its running sandboxes and its environments' warm spares, summed."""
    max_cpu_millis: Optional[int] = None
    """Their cpu bounds, summed (1000 = one cpu)."""
    max_disk_bytes: Optional[int] = None
    """The disk bounds of its sandboxes, whatever their state, summed."""
    max_saved_bytes: Optional[int] = None
    """What its checkpoints (environments' and forks' among them) and snapshots take on disk."""
    max_ledger_bytes: Optional[int] = None
    """What its ledger's events take in the database; at it, what adds to the
    ledger (exec, create, ...) is refused."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ProjectQuota":
        """Reads a quota from its JSON object."""
        return cls(
            max_sandboxes=_opt_int(d, "max_sandboxes"),
            max_memory_bytes=_opt_int(d, "max_memory_bytes"),
            max_cpu_millis=_opt_int(d, "max_cpu_millis"),
            max_disk_bytes=_opt_int(d, "max_disk_bytes"),
            max_saved_bytes=_opt_int(d, "max_saved_bytes"),
            max_ledger_bytes=_opt_int(d, "max_ledger_bytes"),
        )


@dataclass(frozen=True)
class ProjectUse:
    """What a project holds, in its quota's terms."""

    sandboxes: int
    memory_bytes: int
    """Memory bounds of its running sandboxes and warm spares."""
    cpu_millis: int
    """Their cpu bounds (1000 = one cpu)."""
    disk_bytes: int
    """Disk bounds of its sandboxes."""
    saved_bytes: int
    """What its checkpoints and snapshots take."""
    ledger_bytes: int
    """What its ledger's events take."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ProjectUse":
        """Reads a project's use from its JSON object."""
        return cls(
            sandboxes=_int(d, "sandboxes"),
            memory_bytes=_int(d, "memory_bytes"),
            cpu_millis=_int(d, "cpu_millis"),
            disk_bytes=_int(d, "disk_bytes"),
            saved_bytes=_int(d, "saved_bytes"),
            ledger_bytes=_int(d, "ledger_bytes"),
        )


@dataclass(frozen=True)
class Project:
    """A project (:meth:`Shard.projects`): how many objects of each kind it
    holds, its quota and its use against it."""

    name: str
    sandboxes: int
    """Sandboxes, in every state."""
    sessions: int
    """Ledger sessions."""
    checkpoints: int
    """Checkpoints, forks' and environments' included."""
    snapshots: int
    environments: int
    secrets: int
    tokens: int
    """Keys of this project (not keys of every project)."""
    quota: ProjectQuota
    use: ProjectUse
    raw: JSONObject = field(default_factory=lambda: {}, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Project":
        """Reads a project from its JSON object."""
        return cls(
            name=_str(d, "name"),
            sandboxes=_int(d, "sandboxes"),
            sessions=_int(d, "sessions"),
            checkpoints=_int(d, "checkpoints"),
            snapshots=_int(d, "snapshots"),
            environments=_int(d, "environments"),
            secrets=_int(d, "secrets"),
            tokens=_int(d, "tokens"),
            quota=ProjectQuota.from_json(as_object(d.get("quota")) or {}),
            use=ProjectUse.from_json(as_object(d.get("use")) or {}),
            raw=dict(d),
        )


@dataclass(frozen=True)
class ReplayedExec:
    """One exec that :meth:`Shard.resume` ran again.

    ``recorded_exit_code`` is None when the exec never finished in the
    resumed session (it was started again and left running); ``exit_code``
    is None when it was left running or could not be run (``error``).
    """

    argv: List[str]
    recorded_exit_code: Optional[int] = None
    exit_code: Optional[int] = None
    error: Optional[str] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ReplayedExec":
        """Reads a replayed exec from its JSON object."""
        return cls(
            argv=_strs(d, "argv"),
            recorded_exit_code=_opt_int(d, "recorded_exit_code"),
            exit_code=_opt_int(d, "exit_code"),
            error=_opt_str(d, "error"),
        )


@dataclass(frozen=True)
class ReappliedChange:
    """One grant or policy change that :meth:`Shard.resume` made again.

    ``event`` is ``sandbox.secret_granted``, ``sandbox.secret_ungranted``,
    ``sandbox.policy_set`` or ``sandbox.policy_cleared``; ``error`` says why
    it could not be made (its secret was removed since, say).
    """

    event: str
    secret: Optional[str] = None
    error: Optional[str] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ReappliedChange":
        """Reads a reapplied change from its JSON object."""
        return cls(event=_opt_str(d, "event") or "", secret=_opt_str(d, "secret"), error=_opt_str(d, "error"))


@dataclass(frozen=True)
class ResumeResult:
    """What :meth:`Shard.resume` started from and what it replayed.

    ``checkpoint`` is None when the sandbox was made fresh from the session's
    start (the session had no checkpoint left).
    """

    sandbox: SandboxInfo
    replayed: List[ReplayedExec]
    checkpoint: Optional[str] = None
    reapplied: List[ReappliedChange] = field(default_factory=lambda: [])

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ResumeResult":
        """Reads a resume answer from its JSON object."""
        return cls(
            sandbox=SandboxInfo.from_json(as_object(d.get("sandbox")) or {}),
            replayed=[ReplayedExec.from_json(r) for r in objects(d.get("replayed"))],
            checkpoint=_opt_str(d, "checkpoint"),
            reapplied=[ReappliedChange.from_json(r) for r in objects(d.get("reapplied"))],
        )


@dataclass(frozen=True)
class Chunk:
    """A piece of a running command's output, as it arrived.

    ``stream`` is ``"stdout"`` or ``"stderr"``; the two are never mixed
    within a chunk (with a TTY everything is ``stdout``).
    """

    stream: StreamName
    data: bytes

    @property
    def text(self) -> str:
        """``data`` decoded as UTF-8 (undecodable bytes become U+FFFD).

        A multi-byte character can be split across two chunks; decode the
        joined bytes when that matters.
        """
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ExitStatus:
    """How a command ended.

    ``exit_code`` is 128+signal when a signal ended it (SIGKILL: 137).
    ``timed_out``: the exec's ``timeout`` killed it. ``oom_killed``: it was
    killed for exceeding the sandbox's memory. ``error``: why the server
    ended the command itself, when it did (its sandbox was stopped, removed
    or died while it ran). ``output_cut``: a process the command left behind
    (``sh -c 'server &'``) held its output open at its exit, and what it
    wrote after is not in the output.
    """

    exit_code: int
    signal: Optional[int] = None
    timed_out: bool = False
    oom_killed: bool = False
    error: str = ""
    output_cut: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0


@dataclass(frozen=True)
class ExecResult(ExitStatus):
    """A finished command: its exit status and all of its output.

    A non-zero exit is not an exception: check ``exit_code`` (or ``ok``).
    """

    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""

    @property
    def stdout(self) -> str:
        """Standard output, decoded as UTF-8 (undecodable bytes become U+FFFD)."""
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        """Standard error, decoded as UTF-8 (undecodable bytes become U+FFFD)."""
        return self.stderr_bytes.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class FileInfo:
    """One file of a sandbox: what :meth:`Files.stat` and :meth:`Files.remove`
    answer, what :meth:`Files.list` lists, and a read's ``info``.

    ``type`` is ``file``, ``dir``, ``symlink``, ``fifo``, ``socket``,
    ``char`` or ``block``; ``size`` is a file's bytes (0 for the other
    types); ``mode`` the permission bits with setuid, setgid and sticky
    (``0o644`` is 420: ``oct(info.mode)``); ``link`` a symlink's target, as
    written.
    """

    name: str
    """Its last path element (``/`` for the root)."""
    path: str
    """Its absolute path in the sandbox."""
    type: str
    size: int
    mode: int
    uid: int
    gid: int
    mtime: Optional[datetime]
    link: Optional[str] = None
    raw: JSONObject = field(default_factory=lambda: {}, repr=False, compare=False)

    @property
    def is_dir(self) -> bool:
        """True for a directory."""
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        """True for a regular file."""
        return self.type == "file"

    @property
    def is_symlink(self) -> bool:
        """True for a symbolic link (see ``link``)."""
        return self.type == "symlink"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "FileInfo":
        """Reads a file's description from its JSON object."""
        return cls(
            name=_str(d, "name"),
            path=_str(d, "path"),
            type=_str(d, "type"),
            size=_int(d, "size"),
            mode=_int(d, "mode"),
            uid=_int(d, "uid"),
            gid=_int(d, "gid"),
            mtime=_time(d, "mtime"),
            link=_opt_str(d, "link"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class FileList:
    """A directory's entries, sorted by name (:meth:`Files.list`).
    ``truncated``: there were more than the limit asked for."""

    path: str
    entries: List[FileInfo]
    truncated: bool = False
    raw: JSONObject = field(default_factory=lambda: {}, repr=False, compare=False)

    def __iter__(self) -> Iterator[FileInfo]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def names(self) -> List[str]:
        """The entries' names, in order."""
        return [e.name for e in self.entries]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "FileList":
        """Reads a directory listing from its JSON object."""
        return cls(
            path=_str(d, "path"),
            entries=[FileInfo.from_json(e) for e in objects(d.get("entries"))],
            truncated=bool(d.get("truncated")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class WriteResult:
    """What a write of files did: the path written, the file bytes written,
    the files, directories and links made, and ``notes`` on what was
    sanitised or skipped (a setuid bit removed, a device node left out)."""

    path: str
    bytes: int
    files: int
    notes: List[str] = field(default_factory=_empty_strs)
    raw: JSONObject = field(default_factory=lambda: {}, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "WriteResult":
        """Reads a write's answer from its JSON object."""
        return cls(path=_str(d, "path"), bytes=_int(d, "bytes"), files=_int(d, "files"), notes=_strs(d, "notes"), raw=dict(d))


@dataclass(frozen=True)
class TreeNode:
    """One object of the fork tree (:meth:`Shard.tree`), and what came from it.

    ``kind`` is ``sandbox``, ``checkpoint``, ``snapshot`` or
    ``environment``; ``id`` a sandbox's, checkpoint's or snapshot's id (an
    environment's name); ``name`` a sandbox's or snapshot's name (a removed
    sandbox's as it was), a checkpoint's tag. ``state`` is a sandbox's
    state, or ``removed``; ``kept`` or ``removed`` for the other kinds.
    ``via`` says how it came from its parent: ``fork``, ``restore``,
    ``environment``, ``resume`` or ``snapshot`` for a sandbox, a
    checkpoint's kind for a checkpoint; None on a root. ``children`` is what
    came from it, oldest first. ``removed_sandboxes`` (in a tree asked for
    without ``all``) are the removed sandboxes that came straight from it
    and have nothing that exists below them, left out of ``children``: why
    a kept checkpoint whose forks or restores were all removed is there.
    """

    kind: str
    id: str
    state: str
    removed: bool
    at: Optional[datetime]
    """When it was made; a fork's, when it ran (after its checkpoint)."""
    name: Optional[str] = None
    via: Optional[str] = None
    image: Optional[str] = None
    provider: Optional[str] = None
    children: List["TreeNode"] = field(default_factory=lambda: [])
    removed_sandboxes: List["TreeNode"] = field(default_factory=lambda: [])
    raw: JSONObject = field(default_factory=lambda: {}, repr=False, compare=False)

    def walk(self) -> Iterator["TreeNode"]:
        """This node and every node below it, depth first, each before what
        came from it."""
        stack: List[TreeNode] = [self]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(reversed(n.children))

    def find(self, id_or_name: str) -> Optional["TreeNode"]:
        """The first node (depth first) whose id or name is ``id_or_name``; None if none."""
        return next((n for n in self.walk() if id_or_name in (n.id, n.name)), None)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TreeNode":
        """Reads a node, and those below it, from its JSON object."""
        return cls(
            kind=_str(d, "kind"),
            id=_str(d, "id"),
            state=_str(d, "state"),
            removed=bool(d.get("removed")),
            at=_time(d, "at"),
            name=_opt_str(d, "name"),
            via=_opt_str(d, "via"),
            image=_opt_str(d, "image"),
            provider=_opt_str(d, "provider"),
            children=[TreeNode.from_json(c) for c in objects(d.get("children"))],
            removed_sandboxes=[TreeNode.from_json(c) for c in objects(d.get("removed_sandboxes"))],
            raw=dict(d),
        )


@dataclass(frozen=True)
class DiffSide:
    """One side of a :class:`Diff`: ``kind`` is ``sandbox``, ``checkpoint``,
    ``snapshot`` or ``image``; ``name`` a sandbox's or snapshot's name."""

    kind: str
    id: str
    name: Optional[str] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "DiffSide":
        """Reads a side of a diff from its JSON object."""
        return cls(kind=_str(d, "kind"), id=_str(d, "id"), name=_opt_str(d, "name"))


@dataclass(frozen=True)
class Change:
    """One path that differs between the sides of a :class:`Diff`.

    ``kind`` is ``added``, ``removed`` or ``changed`` (from ``from_`` to
    ``to``); ``type`` what is at the path in ``to`` (in ``from_`` for a
    removal): ``file``, ``dir``, ``symlink``, ``fifo``, ``socket``, ``char``
    or ``block``; ``what``, for a change, what differs (``content``,
    ``type``, ``mode``, ``owner``, ``target``, ``device``; a modification
    time alone is no change); ``size_a`` and ``size_b`` a file's size in
    ``from_`` and ``to`` (0 where none); ``patch``, when asked for, a
    unified diff of a regular file's text; ``not_compared``, what the
    server could not tell (``content``: the diff's read bound came first;
    the file may differ there or not); ``path_bytes``, the path's bytes
    when they are not UTF-8 (``path`` then has U+FFFD for each).
    """

    path: str
    kind: str
    type: str
    size_a: int
    size_b: int
    what: List[str] = field(default_factory=_empty_strs)
    patch: Optional[str] = None
    not_compared: List[str] = field(default_factory=_empty_strs)
    path_bytes: Optional[bytes] = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Change":
        """Reads a change from its JSON object."""
        return cls(
            path=_str(d, "path"),
            kind=_str(d, "kind"),
            type=_str(d, "type"),
            size_a=_int(d, "size_a"),
            size_b=_int(d, "size_b"),
            what=_strs(d, "what"),
            patch=_opt_str(d, "patch"),
            not_compared=_strs(d, "not_compared"),
            path_bytes=_opt_b64(d, "path_bytes"),
        )


@dataclass(frozen=True)
class Diff:
    """What changed in a sandbox's files (:meth:`Sandbox.diff`): from
    ``from_`` (the JSON's ``from``: the sandbox compared with, or what it
    started from) to ``to`` (the sandbox asked about). ``changes`` are in
    path order (iterate the diff for them); ``added``, ``removed``,
    ``changed`` count them; ``truncated``: there were more than 100000 and
    only the first are listed; ``not_compared``: how many of ``changed``
    have ``not_compared`` content."""

    from_: DiffSide
    to: DiffSide
    changes: List[Change]
    added: int
    removed: int
    changed: int
    truncated: bool
    not_compared: int = 0
    raw: JSONObject = field(default_factory=lambda: {}, repr=False, compare=False)

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes)

    def __len__(self) -> int:
        return len(self.changes)

    def get(self, path: str) -> Optional[Change]:
        """The change at ``path``; None when it is the same on both sides."""
        return next((c for c in self.changes if c.path == path), None)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Diff":
        """Reads a diff from its JSON object."""
        return cls(
            from_=DiffSide.from_json(as_object(d.get("from")) or {}),
            to=DiffSide.from_json(as_object(d.get("to")) or {}),
            changes=[Change.from_json(c) for c in objects(d.get("changes"))],
            added=_int(d, "added"),
            removed=_int(d, "removed"),
            changed=_int(d, "changed"),
            truncated=bool(d.get("truncated")),
            not_compared=_int(d, "not_compared"),
            raw=dict(d),
        )
