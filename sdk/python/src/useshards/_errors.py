"""The one exception the SDK raises for anything the server or the network did."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Optional, cast

__all__ = ["ERROR_CODES", "ShardError", "unreachable"]

# Every code of the server's errors: the enum of ``Error.code`` in its
# OpenAPI document (tests/test_wire.py keeps them equal). A newer server may
# add codes: treat a code not here by its HTTP status.
ERROR_CODES: FrozenSet[str] = frozenset(
    {
        "ambiguous_name",
        "bad_archive",
        "bad_node_signature",
        "body_too_large",
        "canceled",
        "checkpoint_exists",
        "checkpoint_gone",
        "checkpoint_in_use",
        "checkpoint_not_found",
        "cluster_full",
        "cluster_unavailable",
        "command_not_found",
        "conflict",
        "different_images",
        "directory_not_empty",
        "disk_full",
        "environment_copy",
        "environment_exists",
        "environment_not_found",
        "exec_failed",
        "failed",
        "file_not_found",
        "files_helper_failed",
        "forbidden",
        "fork_hook_failed",
        "freeze_timeout",
        "grant_failed",
        "grant_not_found",
        "image_copy_mismatch",
        "image_in_use",
        "image_not_exportable",
        "image_not_found",
        "image_shared",
        "image_too_large",
        "insufficient_memory",
        "insufficient_storage",
        "internal",
        "invalid_argument",
        "invalid_image",
        "invalid_path",
        "invalid_state",
        "io_error",
        "is_a_directory",
        "missing_scope",
        "name_taken",
        "no_addresses",
        "no_node",
        "no_project",
        "node_full",
        "node_not_found",
        "node_unreachable",
        "nodes_only",
        "not_a_directory",
        "not_a_regular_file",
        "not_clustered",
        "not_found",
        "path_exists",
        "path_unsafe",
        "permission_denied",
        "policy_failed",
        "policy_refused",
        "port_unreachable",
        "provider_unavailable",
        "quota_exceeded",
        "read_only",
        "registry_denied",
        "registry_not_allowed",
        "registry_timeout",
        "registry_unreachable",
        "sandbox_busy",
        "sandbox_frozen",
        "sandbox_limit",
        "sandbox_not_found",
        "sandbox_not_running",
        "sandbox_running",
        "sandbox_unreachable",
        "secret_not_found",
        "server_stopping",
        "session_has_checkpoints",
        "session_in_use",
        "session_not_found",
        "session_unusable",
        "setup_failed",
        "short_body",
        "snapshot_gone",
        "snapshot_not_found",
        "timeout",
        "token_not_found",
        "too_large",
        "too_many_connections",
        "too_many_requests",
        "unauthenticated",
        "unavailable",
        "unsafe_archive",
        "unsupported",
        "upstream",
        "wrong_node",
        "wrong_project",
    }
)


class ShardError(Exception):
    """An error from the shard server, or from reaching it.

    Attributes:
        code: a stable, machine-readable code: the server's own, one of
            ERROR_CODES (``sandbox_not_found``, ``name_taken``,
            ``sandbox_not_running``, ``missing_scope``, ``unauthenticated``,
            ...), or one of the SDK's:
            ``unreachable`` (no connection to the server, or it broke),
            ``bad_response`` (an answer the SDK could not read),
            ``stream_ended`` (an exec stream ended before its exit line),
            ``sandbox_unreachable`` (the server lost the sandbox's agent
            mid-exec), ``http_<status>`` (an error answer without a JSON body).
        status: the HTTP status of the answer; 0 when there was none.
        message: for people: what went wrong and, usually, what to do.
        request_id: the error answer's ``X-Request-Id``, the request's id in
            the server's access log (give it to whoever runs the server);
            None when no server answered (``unreachable``, ``closed``, ...)
            and on errors the SDK makes itself.
    """

    code: str
    status: int
    message: str
    request_id: Optional[str]

    def __init__(self, code: str, message: str, status: int = 0, request_id: Optional[str] = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message
        self.request_id = request_id or None

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        rid = f", request_id={self.request_id!r}" if self.request_id else ""
        return f"ShardError(code={self.code!r}, status={self.status}, message={self.message!r}{rid})"

    @classmethod
    def from_response(cls, status: int, reason: str, body: bytes, request_id: Optional[str] = None) -> "ShardError":
        """Builds the error for a non-2xx answer: its ``{code, message}`` body,
        or ``http_<status>`` with the raw text when the body is not that;
        ``request_id`` is the answer's ``X-Request-Id``."""
        import json

        doc: Optional[Dict[str, Any]] = None
        try:
            parsed: Any = json.loads(body.decode("utf-8"))
            if isinstance(parsed, dict):
                doc = cast(Dict[str, Any], parsed)
        except (UnicodeDecodeError, ValueError):
            pass
        if doc is not None:
            message = doc.get("message")
            code = doc.get("code")
            if isinstance(message, str) and message:
                return cls(code if isinstance(code, str) and code else f"http_{status}", message, status, request_id)
        text = body.decode("utf-8", errors="replace").strip()
        return cls(f"http_{status}", f"server answered {status} {reason}: {text}".rstrip(": "), status, request_id)


def unreachable(where: str, err: Optional[BaseException]) -> ShardError:
    """The error for a server that cannot be reached (or a connection that broke)."""
    detail = f": {err}" if err is not None else ""
    return ShardError("unreachable", f"cannot reach the shard server at {where}{detail}")
