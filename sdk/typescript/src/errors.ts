import type { ErrorCode } from "./types.js";

/**
 * The one error type of the SDK.
 *
 * - API errors carry the server's `{code, message}` and the HTTP `status`
 *   (`name_taken`, `sandbox_not_running`, `missing_scope`, ...: an
 *   `ErrorCode`, every code the server sends).
 * - `unreachable` (status 0): the server could not be reached at all.
 * - `closed` (status 0): the client was closed before or during the call.
 * - `exit_status` (status 0): a command run through `SandboxHandle.exec`
 *   exited non-zero; `exitCode`, `stdout` and `stderr` tell how.
 * - `stdin_failed` (status 0): the stream given as an exec's stdin failed;
 *   the exec was let go (the command runs on in the sandbox).
 * - `sandbox_unreachable` / `stream_ended` (status 502): the exec stream
 *   was lost before the command's exit arrived; its fate is unknown.
 *
 * An error answer's `requestId` is its `X-Request-Id`: give it to whoever
 * runs the server, who finds the request in its access log by it.
 */
export class ShardError extends Error {
  /** Machine-readable code: the API's `code` (an `ErrorCode`), or one of the SDK's own. */
  readonly code: ErrorCode | string;
  /** HTTP status of the answer; 0 when no answer was involved. */
  readonly status: number;
  /** `exit_status` only: the command's exit code. */
  readonly exitCode?: number;
  /** `exit_status` only: all the command wrote to stdout. */
  readonly stdout?: string;
  /** `exit_status` only: all the command wrote to stderr. */
  readonly stderr?: string;
  /**
   * The error answer's `X-Request-Id`: the request's id in the server's
   * access log. Undefined when no server answered (`unreachable`, `closed`,
   * ...) and on errors the SDK makes itself.
   */
  readonly requestId?: string;

  constructor(
    code: ErrorCode | string,
    message: string,
    status = 0,
    extra?: { exitCode?: number; stdout?: string; stderr?: string; requestId?: string; cause?: unknown },
  ) {
    super(message, extra?.cause !== undefined ? { cause: extra.cause } : undefined);
    this.name = "ShardError";
    this.code = code;
    this.status = status;
    if (extra?.exitCode !== undefined) this.exitCode = extra.exitCode;
    if (extra?.stdout !== undefined) this.stdout = extra.stdout;
    if (extra?.stderr !== undefined) this.stderr = extra.stderr;
    if (extra?.requestId) this.requestId = extra.requestId;
  }
}

/** Whether err is a ShardError with the given code (or any code when omitted). */
export function isShardError(err: unknown, code?: ErrorCode | string): err is ShardError {
  return err instanceof ShardError && (code === undefined || err.code === code);
}
