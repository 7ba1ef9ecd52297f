// ExecRun: one command running in a sandbox, its output streamed from the
// server's answer as it comes: the binary exec stream (docs/exec-stream.md),
// or NDJSON from an older server. Stdin given as a stream goes in a framed
// request body, written while the answer is read.

import type * as http from "node:http";
import { ShardError } from "./errors.js";
import type { ShardApi } from "./api.js";
import { FRAME, FrameDecoder, STDIN_CHUNK, STREAM_TYPE, encodeFrame } from "./frames.js";
import type { EnvVars, ExecEvent, ExecExit, ExecRequest } from "./types.js";

/**
 * A command's stdin: all of it as a string (UTF-8) or bytes, or a stream of
 * chunks sent as they come: a Node Readable (`process.stdin`,
 * `fs.createReadStream(...)`), any AsyncIterable of Uint8Array or string, or
 * an Iterable of Uint8Array.
 */
export type StdinSource = string | Uint8Array | AsyncIterable<Uint8Array | string> | Iterable<Uint8Array>;

/**
 * Stdin up to this size (given whole) goes base64 in the JSON request, which
 * any server takes; more, or a stream, goes in a framed request body.
 */
export const INLINE_STDIN_MAX = 256 << 10;

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
  /**
   * The command's stdin (then EOF). Default: empty. A string or bytes is all
   * of it (of any size); a Readable or (Async)Iterable is streamed as it is
   * read, while the output comes back, only as fast as the command reads
   * it; its end closes the command's stdin. With a stream (even an empty
   * one: `[]`), `ExecRun.kill()` can signal the command.
   */
  stdin?: StdinSource;
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
  /** A process it left behind (`sh -c 'server &'`) held its output open at its exit: what that wrote after is not here. */
  outputCut?: boolean;
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

/** Stdin given whole, as bytes; undefined for a stream (or none). */
function wholeStdin(stdin: StdinSource | undefined): Buffer | undefined {
  if (typeof stdin === "string") return Buffer.from(stdin, "utf8");
  if (stdin instanceof Uint8Array) return Buffer.from(stdin.buffer, stdin.byteOffset, stdin.byteLength);
  return undefined;
}

/**
 * Builds the API's exec body. Stdin given whole and at most
 * INLINE_STDIN_MAX bytes is in it (base64); more, or a stream, is not: it
 * goes in the framed request body.
 */
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
    const whole = wholeStdin(opts.stdin);
    if (whole === undefined && !isStream(opts.stdin)) {
      throw new ShardError("invalid_argument", "stdin must be a string, a Uint8Array, a Readable or an (Async)Iterable of Uint8Array");
    }
    if (whole !== undefined && whole.length <= INLINE_STDIN_MAX) req.stdin = whole.toString("base64");
  }
  return req;
}

function isStream(x: unknown): x is AsyncIterable<Uint8Array | string> | Iterable<Uint8Array> {
  return x != null && typeof x === "object" && (Symbol.asyncIterator in x || Symbol.iterator in x);
}

/** What goes in a framed body as stdin: undefined when the JSON body carries it (or there is none). */
function framedStdin(opts: ExecOptions | undefined, req: ExecRequest): Buffer | AsyncIterable<Uint8Array | string> | Iterable<Uint8Array> | undefined {
  const stdin = opts?.stdin;
  if (stdin === undefined || req.stdin !== undefined) return undefined;
  return wholeStdin(stdin) ?? (stdin as AsyncIterable<Uint8Array | string> | Iterable<Uint8Array>);
}

function tail(s: string, n: number): string {
  s = s.trimEnd();
  return s.length > n ? "…" + s.slice(s.length - n) : s;
}

/** Linux's signal numbers (the sandbox's), for kill() by name. */
const SIGNALS: Record<string, number> = {
  SIGHUP: 1, SIGINT: 2, SIGQUIT: 3, SIGILL: 4, SIGTRAP: 5, SIGABRT: 6, SIGBUS: 7, SIGFPE: 8, SIGKILL: 9, SIGUSR1: 10,
  SIGSEGV: 11, SIGUSR2: 12, SIGPIPE: 13, SIGALRM: 14, SIGTERM: 15, SIGCHLD: 17, SIGCONT: 18, SIGSTOP: 19, SIGTSTP: 20,
  SIGTTIN: 21, SIGTTOU: 22, SIGURG: 23, SIGXCPU: 24, SIGXFSZ: 25, SIGVTALRM: 26, SIGPROF: 27, SIGWINCH: 28, SIGIO: 29, SIGSYS: 31,
};

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
 * - `run.kill(signal)` signals the command, when its stdin was given as a
 *   stream (the request body is then framed, and open until the end).
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
  /** Whether the request body is framed (stdin streamed). */
  private framed = false;
  /** The framed request body, once the server answered. */
  private body?: http.ClientRequest;
  /** Signals asked for before the body was there. */
  private queued: number[] = [];
  /** The answer ended (or broke): stop sending. */
  private ended = false;
  /** Reading the caller's stdin failed: the run fails with this. */
  private stdinError?: ShardError;

  /** @internal Use `Sandbox.exec` or `SandboxHandle.exec`. */
  constructor(api: ShardApi, sandbox: string, argv: string[], opts: ExecOptions | undefined, check: boolean, label?: string) {
    this.argv = argv;
    this.check = check;
    this.label = label ?? argv.join(" ");
    let req: ExecRequest;
    try {
      req = execRequest(argv, opts);
      const stdin = framedStdin(opts, req);
      this.framed = stdin !== undefined;
      this.raw = this.run(api, sandbox, req, stdin);
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

  /**
   * Sends a signal (a number or a name like "SIGINT"; default SIGTERM) to
   * the command's process group. Only for a run whose stdin was given as a
   * stream (even an empty one, `stdin: []`): the signal travels in its
   * request body (a `K` frame), behind the stdin already sent. Returns false
   * when the command has ended. A signal asked for before the command
   * started is sent when it starts.
   */
  kill(signal: number | string = "SIGTERM"): boolean {
    const n = typeof signal === "number" ? signal : SIGNALS[signal.toUpperCase().startsWith("SIG") ? signal.toUpperCase() : "SIG" + signal.toUpperCase()];
    if (n === undefined || !Number.isInteger(n) || n <= 0 || n > 64) {
      throw new ShardError("invalid_argument", `kill: ${JSON.stringify(signal)} is not a signal`);
    }
    if (!this.framed) {
      throw new ShardError(
        "invalid_argument",
        "kill() signals through the exec's framed request body: start the command with stdin as a stream (a Readable or an (Async)Iterable; [] for none)",
      );
    }
    if (this.ended) return false;
    if (!this.body) {
      this.queued.push(n);
      return true;
    }
    void this.send(FRAME.signal, JSON.stringify({ signal: n }));
    return true;
  }

  private async run(
    api: ShardApi,
    sandbox: string,
    req: ExecRequest,
    stdin: Buffer | AsyncIterable<Uint8Array | string> | Iterable<Uint8Array> | undefined,
  ): Promise<ExecResult> {
    const res = await api.execRaw(sandbox, req, { framed: stdin !== undefined });
    try {
      if (res.request && stdin !== undefined) {
        this.body = res.request;
        for (const n of this.queued) void this.send(FRAME.signal, JSON.stringify({ signal: n }));
        this.queued = [];
        void this.pump(res.request, stdin);
      }
      const ctype = String(res.headers["content-type"] ?? "")
        .split(";")[0]!
        .trim()
        .toLowerCase();
      return ctype === STREAM_TYPE ? await this.readFrames(api, res.body) : await this.readNdjson(api, res.body);
    } finally {
      this.ended = true;
      this.queued = [];
      const body = this.body;
      if (body && !body.destroyed && !body.writableEnded) body.end();
    }
  }

  /** Writes one frame to the request body; false when the body is gone. */
  private async send(type: number, payload: Uint8Array | string): Promise<boolean> {
    const b = this.body;
    if (!b || b.destroyed || b.writableEnded) return false;
    let ok: boolean;
    if (typeof payload !== "string" && payload.length > 64 << 10) {
      // A big payload is not copied: its header, then itself (the server
      // reads a byte stream; HTTP chunks need not match frames).
      const head = Buffer.allocUnsafe(5);
      head[0] = type;
      head.writeUInt32BE(payload.length, 1);
      b.cork();
      b.write(head);
      ok = b.write(payload);
      b.uncork();
    } else ok = b.write(encodeFrame(type, payload));
    if (ok) return true;
    await drained(b);
    return !b.destroyed && !this.ended;
  }

  /** Sends stdin as `I` frames of at most STDIN_CHUNK bytes, then an empty one (EOF). */
  private async pump(body: http.ClientRequest, src: Buffer | AsyncIterable<Uint8Array | string> | Iterable<Uint8Array>): Promise<void> {
    const sendAll = async (buf: Buffer): Promise<boolean> => {
      for (let off = 0; off < buf.length; off += STDIN_CHUNK) {
        if (this.ended || !(await this.send(FRAME.stdin, buf.subarray(off, off + STDIN_CHUNK)))) return false;
      }
      return true;
    };
    if (Buffer.isBuffer(src)) {
      if (await sendAll(src)) await this.send(FRAME.stdin, Buffer.alloc(0));
      return;
    }
    const it: AsyncIterator<unknown> | Iterator<unknown> =
      Symbol.asyncIterator in src ? (src as AsyncIterable<unknown>)[Symbol.asyncIterator]() : (src as Iterable<unknown>)[Symbol.iterator]();
    try {
      for (;;) {
        if (this.ended) break;
        const r = await it.next();
        if (r.done || this.ended) break;
        const v = r.value;
        let buf: Buffer;
        if (typeof v === "string") buf = Buffer.from(v, "utf8");
        else if (v instanceof Uint8Array) buf = Buffer.from(v.buffer, v.byteOffset, v.byteLength);
        else throw new TypeError(`stdin gave a ${typeof v}, not a Uint8Array or a string`);
        if (buf.length === 0) continue; // an empty I frame would close stdin
        if (!(await sendAll(buf))) break;
      }
      if (!this.ended) await this.send(FRAME.stdin, Buffer.alloc(0));
    } catch (err) {
      if (this.ended) return;
      this.stdinError = new ShardError("stdin_failed", `reading the command's stdin: ${(err as Error)?.message ?? String(err)}`, 0, { cause: err });
      body.destroy(this.stdinError); // the exec ends here; the run rejects with stdinError
    } finally {
      if (this.ended) void Promise.resolve(it.return?.()).catch(() => {});
    }
  }

  /** The error for a stream that broke while being read. */
  private broken(api: ShardApi, err: unknown): ShardError {
    if (this.stdinError) return this.stdinError;
    if (err instanceof ShardError && err.code === "bad_response") return err;
    if (api.transport.isClosed) return new ShardError("closed", "the shard client was closed while the command ran", 0, { cause: err });
    return new ShardError("stream_ended", `the exec stream broke before the command ended: ${(err as Error).message}`, 502, { cause: err });
  }

  private exitResult(ev: ExecExit | ExecEvent): ExecResult {
    const r: ExecResult = { stdout: this.text(1), stderr: this.text(2), exitCode: typeof ev.exit_code === "number" ? ev.exit_code : 0 };
    if (ev.signal) r.signal = ev.signal;
    if (ev.timed_out) r.timedOut = true;
    if (ev.oom_killed) r.oomKilled = true;
    if (ev.error) r.error = ev.error;
    if ("output_cut" in ev && ev.output_cut) r.outputCut = true;
    return r;
  }

  /** Reads the binary exec stream (frames) to its end. */
  private async readFrames(api: ShardApi, body: http.IncomingMessage): Promise<ExecResult> {
    const dec = new FrameDecoder();
    let result: ExecResult | undefined;
    let failure: ShardError | undefined;
    const json = (p: Buffer, what: string): any => {
      try {
        return JSON.parse(p.toString("utf8"));
      } catch {
        throw new ShardError("bad_response", `exec stream: the ${what} frame is not JSON: ${p.toString("utf8").slice(0, 200)}`, 502);
      }
    };
    try {
      for await (const chunk of body) {
        if (result || failure) continue; // read to the end, so the connection is kept
        for (const f of dec.push(chunk as Buffer)) {
          switch (f.type) {
            case FRAME.started: {
              const pid = json(f.payload, "started").pid;
              if (typeof pid === "number") this.pid = pid;
              break;
            }
            case FRAME.stdout:
            case FRAME.stderr:
              if (f.payload.length) await this.emit(f.type === FRAME.stdout ? 1 : 2, f.payload);
              break;
            case FRAME.exit:
              result = this.exitResult(json(f.payload, "exit") ?? {});
              break;
            case FRAME.failure: {
              const e = (json(f.payload, "failure") ?? {}) as { code?: unknown; message?: unknown };
              failure = new ShardError(
                typeof e.code === "string" && e.code ? e.code : "sandbox_unreachable",
                typeof e.message === "string" && e.message ? e.message : "the connection to the sandbox was lost",
                502,
              );
              break;
            }
            default:
              break; // a newer server's frame: ignore
          }
          if (result || failure) break;
        }
      }
    } catch (err) {
      if (!result && !failure) failure = this.broken(api, err);
    }
    if (result) return result;
    throw failure ?? this.stdinError ?? new ShardError("stream_ended", "the exec stream ended before the command did", 502);
  }

  /** Reads an older server's NDJSON exec stream to its end. */
  private async readNdjson(api: ShardApi, body: http.IncomingMessage): Promise<ExecResult> {
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
        case "exit":
          result = this.exitResult(ev);
          break;
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
      for await (const chunk of body) {
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
      if (!result && !failure) failure = this.broken(api, err);
    }
    if (result) return result;
    throw failure ?? this.stdinError ?? new ShardError("stream_ended", "the exec stream ended before the command did", 502);
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
