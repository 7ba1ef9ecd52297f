// ExecRun: one command running in a sandbox, its output streamed from the
// server's NDJSON answer as it comes.

import { ShardError } from "./errors.js";
import type { ShardApi } from "./api.js";
import type { EnvVars, ExecEvent, ExecRequest } from "./types.js";

/** Options of one exec. */
export interface ExecOptions {
  /** Added to the sandbox's environment for this command. */
  env?: EnvVars;
  /** Absolute working directory (it must exist). Default `/`. */
  workdir?: string;
  /** Run as this user (name, uid, name:group or uid:gid). Default root. */
  user?: string;
  /** Kill the command after this long: seconds, or a duration like "30s". */
  timeout?: number | string;
  /** All of the command's stdin (then EOF). Default: empty. At most ~750 KiB. */
  stdin?: string | Uint8Array;
}

/** A finished command. */
export interface ExecResult {
  /** All it wrote to stdout, decoded as UTF-8. */
  stdout: string;
  /** All it wrote to stderr, decoded as UTF-8. */
  stderr: string;
  /** Its exit status; 128+signal when a signal ended it. */
  exitCode: number;
  /** The signal that ended it, if one did. */
  signal?: number;
  /** Whether the exec's `timeout` ended it. */
  timedOut?: boolean;
  /** Whether it was killed for exceeding the sandbox's memory. */
  oomKilled?: boolean;
  /** Why the server ended it, when it did: its sandbox was stopped, removed or died while it ran. */
  error?: string;
}

/** Anything output can be written to: process.stdout, a stream.Writable, ... */
export interface WritableLike {
  write(chunk: Uint8Array): boolean;
  once?(event: "drain" | "close" | "error", listener: (...args: unknown[]) => void): unknown;
  removeListener?(event: "drain" | "close" | "error", listener: (...args: unknown[]) => void): unknown;
}

interface Sink {
  out: WritableLike;
  err: WritableLike;
}

/** Builds the API's exec body. */
export function execRequest(argv: string[], opts: ExecOptions = {}): ExecRequest {
  if (!Array.isArray(argv) || argv.length === 0 || argv.some((a) => typeof a !== "string")) {
    throw new ShardError("invalid_argument", "exec takes a non-empty list of strings (argv)");
  }
  const req: ExecRequest = { argv };
  if (opts.env !== undefined) req.env = opts.env;
  if (opts.workdir !== undefined) req.workdir = opts.workdir;
  if (opts.user !== undefined) req.user = opts.user;
  if (opts.timeout !== undefined) req.timeout = opts.timeout;
  if (opts.stdin !== undefined) {
    req.stdin = (typeof opts.stdin === "string" ? Buffer.from(opts.stdin, "utf8") : Buffer.from(opts.stdin)).toString("base64");
  }
  return req;
}

function tail(s: string, n: number): string {
  s = s.trimEnd();
  return s.length > n ? "…" + s.slice(s.length - n) : s;
}

/**
 * A command running in a sandbox. It starts at once.
 *
 * - `await run` (or `.then`) gives its ExecResult when it ends. A run made
 *   by `SandboxHandle.exec` rejects with a ShardError of code `exit_status`
 *   (with `exitCode`, `stdout`, `stderr`) when the command exits non-zero;
 *   one made by `Sandbox.exec` (the `Shard` API) resolves whatever the code.
 * - `run.pipe(out)` writes stdout and stderr to `out` as they arrive (both
 *   to it; `run.pipe(out, err)` keeps them apart) and returns the same
 *   promise. The writables are not ended. Output already received when pipe
 *   is called is written first.
 */
export class ExecRun implements PromiseLike<ExecResult> {
  /** The command as sent. */
  readonly argv: string[];
  /** Its pid inside the sandbox, once started. */
  pid?: number;

  private readonly label: string;
  private readonly check: boolean;
  private readonly sinks: Sink[] = [];
  private readonly chunks: { fd: 1 | 2; buf: Buffer }[] = [];
  private readonly raw: Promise<ExecResult>;
  private readonly settled: Promise<ExecResult>;

  /** @internal Use `Sandbox.exec` or `SandboxHandle.exec`. */
  constructor(api: ShardApi, sandbox: string, argv: string[], opts: ExecOptions | undefined, check: boolean, label?: string) {
    this.argv = argv;
    this.check = check;
    this.label = label ?? argv.join(" ");
    let req: ExecRequest;
    try {
      req = execRequest(argv, opts);
      this.raw = this.run(api, sandbox, req);
    } catch (err) {
      this.raw = Promise.reject(err);
    }
    this.settled = this.raw.then((r) => this.judge(r));
    this.settled.catch(() => {}); // handled by whoever awaits; never "unhandled" here
  }

  private judge(r: ExecResult): ExecResult {
    if (!this.check || r.exitCode === 0) return r;
    const why = r.timedOut ? " (timed out)" : r.oomKilled ? " (killed: out of memory)" : r.signal ? ` (signal ${r.signal})` : "";
    const out = r.stderr.trim() ? r.stderr : r.stdout;
    const msg = `command ${JSON.stringify(this.label)} exited ${r.exitCode}${why}` + (out.trim() ? `: ${tail(out, 2000)}` : "");
    throw new ShardError("exit_status", msg, 0, { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr });
  }

  private async run(api: ShardApi, sandbox: string, req: ExecRequest): Promise<ExecResult> {
    const res = await api.execRaw(sandbox, req);
    let pending: Buffer = Buffer.alloc(0);
    let result: ExecResult | undefined;
    let failure: ShardError | undefined;
    const handle = async (line: Buffer) => {
      const text = line.toString("utf8").trim();
      if (!text || result || failure) return;
      let ev: ExecEvent;
      try {
        ev = JSON.parse(text) as ExecEvent;
      } catch {
        failure = new ShardError("bad_response", `exec stream: not JSON: ${text.slice(0, 200)}`, 502);
        return;
      }
      switch (ev.type) {
        case "started":
          this.pid = ev.pid;
          break;
        case "stdout":
        case "stderr": {
          const buf = Buffer.from(ev.data ?? "", "base64");
          if (buf.length) await this.emit(ev.type === "stdout" ? 1 : 2, buf);
          break;
        }
        case "exit": {
          const r: ExecResult = { stdout: this.text(1), stderr: this.text(2), exitCode: ev.exit_code ?? 0 };
          if (ev.signal) r.signal = ev.signal;
          if (ev.timed_out) r.timedOut = true;
          if (ev.oom_killed) r.oomKilled = true;
          if (ev.error) r.error = ev.error;
          result = r;
          break;
        }
        case "error":
          failure = new ShardError(
            "sandbox_unreachable",
            Buffer.from(ev.data ?? "", "base64").toString("utf8") || "the connection to the sandbox was lost",
            502,
          );
          break;
        default:
          break; // a newer server's event: ignore
      }
    };
    try {
      for await (const chunk of res.body) {
        pending = pending.length ? Buffer.concat([pending, chunk as Buffer]) : (chunk as Buffer);
        let nl: number;
        while ((nl = pending.indexOf(10)) >= 0) {
          const line = pending.subarray(0, nl);
          pending = pending.subarray(nl + 1);
          await handle(line);
        }
      }
      if (pending.length) await handle(pending);
    } catch (err) {
      if (!result && !failure) {
        if (api.transport.isClosed) failure = new ShardError("closed", "the shard client was closed while the command ran", 0, { cause: err });
        else
          failure = new ShardError("stream_ended", `the exec stream broke before the command ended: ${(err as Error).message}`, 502, {
            cause: err,
          });
      }
    }
    if (result) return result;
    throw failure ?? new ShardError("stream_ended", "the exec stream ended before the command did", 502);
  }

  private text(fd: 1 | 2): string {
    return Buffer.concat(this.chunks.filter((c) => c.fd === fd).map((c) => c.buf)).toString("utf8");
  }

  private async emit(fd: 1 | 2, buf: Buffer): Promise<void> {
    this.chunks.push({ fd, buf });
    const waits: Promise<void>[] = [];
    for (const s of this.sinks) {
      const w = fd === 1 ? s.out : s.err;
      if (!write(w, buf)) waits.push(drained(w));
    }
    if (waits.length) await Promise.all(waits);
  }

  /**
   * Streams the command's output into out (stdout and stderr both, unless
   * err is given for stderr) as it arrives; resolves like the run itself.
   */
  pipe(out: WritableLike, err?: WritableLike): Promise<ExecResult> {
    const sink: Sink = { out, err: err ?? out };
    for (const c of this.chunks) write(c.fd === 1 ? sink.out : sink.err, c.buf);
    this.sinks.push(sink);
    return this.settled;
  }

  then<A = ExecResult, B = never>(
    onfulfilled?: ((value: ExecResult) => A | PromiseLike<A>) | null,
    onrejected?: ((reason: any) => B | PromiseLike<B>) | null,
  ): Promise<A | B> {
    return this.settled.then(onfulfilled, onrejected);
  }

  catch<B = never>(onrejected?: ((reason: any) => B | PromiseLike<B>) | null): Promise<ExecResult | B> {
    return this.settled.catch(onrejected);
  }

  finally(onfinally?: (() => void) | null): Promise<ExecResult> {
    return this.settled.finally(onfinally);
  }

  /** The run as a plain Promise. */
  get result(): Promise<ExecResult> {
    return this.settled;
  }

  get [Symbol.toStringTag](): string {
    return "ExecRun";
  }
}

function write(w: WritableLike, buf: Buffer): boolean {
  try {
    return w.write(buf) !== false;
  } catch {
    return true; // a broken sink must not break the run
  }
}

function drained(w: WritableLike): Promise<void> {
  if (!w.once) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const done = () => {
      w.removeListener?.("drain", done);
      w.removeListener?.("close", done);
      w.removeListener?.("error", done);
      resolve();
    };
    w.once!("drain", done);
    w.once!("close", done);
    w.once!("error", done);
  });
}
