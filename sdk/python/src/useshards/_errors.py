"""The one exception the SDK raises for anything the server or the network did."""

from __future__ import annotations

from typing import Any, Dict, Optional, cast

__all__ = ["ShardError", "unreachable"]


class ShardError(Exception):
    """An error from the shard server, or from reaching it.

    Attributes:
        code: a stable, machine-readable code: the server's own
            (``sandbox_not_found``, ``name_taken``, ``sandbox_not_running``,
            ``missing_scope``, ``unauthenticated``, ...), or one of the SDK's:
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
