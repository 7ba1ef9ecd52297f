"""useshards: the Python client of a shard server (self-hosted sandboxes).

Standard library only. The server is ``$SHARD_REMOTE`` (an http(s) URL, or
``unix:///path/to/shard.sock``), the API key ``$SHARD_API_KEY``, the
project requests act in ``$SHARD_PROJECT`` (unset: the key's own)::

    from useshards import Shard

    with Shard() as shard:
        base = shard.create("python:3.12-slim", name="base", memory_mib=512)
        base.exec(["pip", "install", "--quiet", "requests"])
        try_a = base.fork(name="try-a")
        print(try_a.exec(["python", "-c", "import requests; print(requests.__version__)"]).stdout)
        try_a.remove(force=True)
"""

from ._client import Credentials, Environment, ExecStream, Sandbox, Shard
from ._errors import ERROR_CODES, ShardError
from ._files import FileReader, Files
from ._types import (
    Change,
    Checkpoint,
    SandboxRemoved,
    Chunk,
    Diff,
    DiffSide,
    EnvironmentInfo,
    ExecResult,
    ExitStatus,
    FileInfo,
    FileList,
    Grant,
    Origin,
    Policy,
    Project,
    ProjectQuota,
    ProjectUse,
    ReplayedExec,
    ReappliedChange,
    ResumeResult,
    SandboxInfo,
    Secret,
    Token,
    TreeNode,
    Whoami,
    WriteResult,
)

__version__ = "0.1.0"

__all__ = [
    "ERROR_CODES",
    "Change",
    "Checkpoint",
    "SandboxRemoved",
    "Chunk",
    "Credentials",
    "Diff",
    "DiffSide",
    "Environment",
    "EnvironmentInfo",
    "ExecResult",
    "ExecStream",
    "ExitStatus",
    "FileInfo",
    "FileList",
    "FileReader",
    "Files",
    "Grant",
    "Origin",
    "Policy",
    "Project",
    "ProjectQuota",
    "ProjectUse",
    "ReplayedExec",
    "ReappliedChange",
    "ResumeResult",
    "Sandbox",
    "SandboxInfo",
    "Secret",
    "Shard",
    "ShardError",
    "Token",
    "TreeNode",
    "Whoami",
    "WriteResult",
    "__version__",
]
