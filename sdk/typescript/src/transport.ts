// HTTP to a shard server: one keep-alive agent per client, JSON in and out,
// {code, message} errors as ShardError, and the raw response for streams.

import * as http from "node:http";
import * as https from "node:https";
import { ShardError } from "./errors.js";

/**
 * Where the SDK reaches the server when neither options.remote,
 * options.socket nor SHARD_REMOTE says: the Unix socket `shard serve` listens
 * on by default, as the Go client and the Python SDK do.
 */
export const DEFAULT_SOCKET = "/run/shard/shard.sock";

/** How to reach the server. Empty fields come from the environment. */
export interface ConnectionOptions {
  /**
   * Base URL of `shard serve --listen`, e.g. "http://10.0.0.5:7070".
   * Default: $SHARD_REMOTE; with neither, the server's Unix socket
   * (DEFAULT_SOCKET).
   */
  remote?: string;
  /** API key, sent as `Authorization: Bearer KEY`. Default: $SHARD_API_KEY. */
  apiKey?: string;
  /**
   * The project every request acts in, sent as `Shard-Project: NAME`.
   * Default: $SHARD_PROJECT; with neither, no header is sent and the server
   * uses the key's own project (for a key of every project, or the socket,
   * "default"). A key made for one project may name only its own (else 403
   * `wrong_project`), and sees only that project's objects.
   */
  project?: string;
  /**
   * Path of the server's Unix socket (the administrator's way in, root only),
   * used instead of `remote` when given. Not taken from the environment;
   * with neither it nor `remote` nor $SHARD_REMOTE, it is DEFAULT_SOCKET.
   */
  socket?: string;
}

export interface RawResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: http.IncomingMessage;
  /**
   * With `RequestOptions.framed`: the request, its body still open. The
   * caller writes the rest of the body to it while it reads `body`, and
   * ends it (or destroys it).
   */
  request?: http.ClientRequest;
}

/** How to send one request (beyond its method, path and JSON body). */
export interface RequestOptions {
  /** The Accept header. Default "application/json, application/x-ndjson". */
  accept?: string;
  /**
   * A framed body (`Content-Type: application/vnd.shard.stream`, sent
   * chunked): these bytes are its start, written at once, and the body is
   * left open for the caller (`RawResponse.request`) once a 2xx answer's
   * head is in. The JSON body argument is ignored.
   */
  framed?: { contentType: string; first: Buffer };
  /**
   * A raw body instead of JSON: bytes (`data`, sent with Content-Length), or
   * a stream (`stream`, sent chunked as it is read, only as fast as the
   * server takes it). An answer that comes before the body is all sent (an
   * error: the server refused early) stops the sending and wins. A stream
   * that fails aborts the request: it rejects with ShardError
   * `source_failed`. The JSON body argument is ignored.
   */
  upload?: Upload;
}

/** A raw request body: see RequestOptions.upload. */
export type Upload =
  | { contentType: string; data: Uint8Array }
  | { contentType: string; stream: AsyncIterable<Uint8Array | string> | Iterable<Uint8Array | string> };

/** The header that names the project a request acts in. */
export const PROJECT_HEADER = "Shard-Project";

/**
 * Resolves options against the environment: options.socket, else
 * options.remote or $SHARD_REMOTE, else the default socket.
 */
export function resolveConnection(o: ConnectionOptions = {}): { remote: string; apiKey: string; project: string; socket?: string } {
  const env = process.env;
  const remote = (o.remote || env.SHARD_REMOTE || "").trim();
  const apiKey = o.apiKey ?? env.SHARD_API_KEY ?? "";
  const project = (o.project || env.SHARD_PROJECT || "").trim();
  const socket = o.socket || (remote ? undefined : DEFAULT_SOCKET);
  return socket ? { remote, apiKey, project, socket } : { remote, apiKey, project };
}

export class Transport {
  /** scheme://host[:port][/prefix] without a trailing slash. */
  readonly base: string;
  readonly apiKey: string;
  /** The project requests act in ("": none named, the key's own). */
  readonly project: string;
  readonly socket?: string;
  /** No option or SHARD_REMOTE named the server: socket is DEFAULT_SOCKET. */
  private readonly defaultSocket: boolean;
  private readonly url: URL;
  private readonly mod: typeof http | typeof https;
  private readonly agent: http.Agent;
  private closed = false;
  private readonly inflight = new Set<http.ClientRequest>();
  /** Framed requests answered, whose body is still being written. */
  private readonly open = new Set<http.ClientRequest>();

  constructor(o: ConnectionOptions = {}) {
    const r = resolveConnection(o);
    this.defaultSocket = !o.socket && !r.remote;
    this.apiKey = r.apiKey;
    this.project = r.project;
    if (r.socket) {
      this.socket = r.socket;
      this.url = new URL("http://shard");
      this.mod = http;
    } else {
      let u: URL;
      try {
        u = new URL(r.remote);
      } catch {
        throw new ShardError("invalid_argument", `SHARD_REMOTE / remote ${JSON.stringify(r.remote)} is not a URL (want e.g. http://127.0.0.1:7070)`);
      }
      if (u.protocol !== "http:" && u.protocol !== "https:") {
        throw new ShardError("invalid_argument", `remote ${JSON.stringify(r.remote)}: only http:// and https:// are supported`);
      }
      this.url = u;
      this.mod = u.protocol === "https:" ? https : http;
    }
    this.base = this.socket ? `unix:${this.socket}` : `${this.url.protocol}//${this.url.host}${this.url.pathname.replace(/\/+$/, "")}`;
    const agentOpts: http.AgentOptions = { keepAlive: true, maxSockets: 64, maxFreeSockets: 16, scheduling: "lifo" };
    this.agent = this.mod === https ? new https.Agent(agentOpts) : new http.Agent(agentOpts);
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Closes the keep-alive connections and aborts requests in flight. Idempotent. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const req of this.inflight) req.destroy(new ShardError("closed", "the shard client was closed"));
    this.inflight.clear();
    // Their answer came: it breaks (and its reader says the client was
    // closed); an error on the request itself would reach no one.
    for (const req of this.open) req.destroy();
    this.open.clear();
    this.agent.destroy();
  }

  /**
   * The headers that say who asks and in which project: Authorization and
   * Shard-Project, as every request sends them (for a WebSocket or proxied
   * request made outside this transport).
   */
  authHeaders(): Record<string, string> {
    const h: Record<string, string> = {};
    if (this.apiKey) h.Authorization = `Bearer ${this.apiKey}`;
    if (this.project) h[PROJECT_HEADER] = this.project;
    return h;
  }

  /** What to try when the default socket cannot be reached. */
  private hint(): string {
    return this.defaultSocket ? " (is `shard serve` running here, and may this process open its socket? Or set SHARD_REMOTE to its URL)" : "";
  }

  private where(): string {
    return this.socket ? `the socket ${this.socket}` : this.base;
  }

  /**
   * Sends a request; resolves with the response once its status line and
   * headers are in, when it is 2xx. Any other answer becomes a ShardError
   * from the body's {code, message}.
   */
  async request(method: string, path: string, body?: unknown, o: RequestOptions = {}): Promise<RawResponse> {
    if (this.closed) throw new ShardError("closed", "the shard client was closed");
    const framed = o.framed;
    const upload = o.upload;
    const payload = framed || upload || body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const prefix = this.socket ? "" : this.url.pathname.replace(/\/+$/, "");
    const headers: http.OutgoingHttpHeaders = { Accept: o.accept ?? "application/json, application/x-ndjson", ...this.authHeaders() };
    if (framed) {
      // No Content-Length: node sends the body chunked, as it is written.
      headers["Content-Type"] = framed.contentType;
    } else if (upload) {
      headers["Content-Type"] = upload.contentType;
      if ("data" in upload) headers["Content-Length"] = upload.data.byteLength;
      // A stream: no Content-Length, so node sends it chunked.
    } else if (payload) {
      headers["Content-Type"] = "application/json";
      headers["Content-Length"] = payload.length;
    } else if (method !== "GET" && method !== "HEAD") {
      headers["Content-Length"] = 0;
    }
    const opts: http.RequestOptions = {
      method,
      path: prefix + "/v0" + path,
      headers,
      agent: this.agent,
    };
    if (this.socket) opts.socketPath = this.socket;
    else {
      opts.hostname = this.url.hostname.replace(/^\[|\]$/g, "");
      opts.port = this.url.port || (this.url.protocol === "https:" ? 443 : 80);
      opts.protocol = this.url.protocol;
    }
    let req!: http.ClientRequest;
    /** The answer's head is in: an upload still being sent stops. */
    let answered = false;
    const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
      req = this.mod.request(opts, (res) => {
        answered = true;
        this.inflight.delete(req);
        // A framed body is still being written: close() ends it too.
        if (framed && !req.destroyed) this.open.add(req);
        resolve(res);
      });
      this.inflight.add(req);
      if (framed) req.on("close", () => this.open.delete(req));
      req.on("error", (err: Error & { code?: string }) => {
        this.inflight.delete(req);
        if (err instanceof ShardError) return reject(err);
        reject(
          new ShardError("unreachable", `cannot reach the shard server at ${this.where()}: ${err.message || err.code || String(err)}${this.hint()}`, 0, {
            cause: err,
          }),
        );
      });
      if (framed) {
        req.setNoDelay(true);
        req.write(framed.first);
      } else if (upload && "stream" in upload) {
        void sendStream(req, upload.stream, () => answered);
      } else if (upload) {
        req.end(upload.data);
      } else req.end(payload);
    });
    const status = res.statusCode ?? 0;
    if (status < 200 || status >= 300) {
      const text = await readAll(res).then(
        (b) => b.toString("utf8"),
        () => "",
      );
      // A body never finished (framed, or an upload the server refused
      // early): the connection is not reused.
      if (framed || (upload && !req.writableFinished)) req.destroy();
      throw errorFromBody(status, res.statusMessage ?? "", text, requestIdOf(res.headers));
    }
    return framed ? { status, headers: res.headers, body: res, request: req } : { status, headers: res.headers, body: res };
  }

  /** A request whose 2xx answer is JSON (or nothing). */
  async json<T>(method: string, path: string, body?: unknown): Promise<T> {
    return (await this.jsonWithStatus<T>(method, path, body)).value;
  }

  /** Like json, and also says the HTTP status (201 built vs 200 unchanged). */
  async jsonWithStatus<T>(method: string, path: string, body?: unknown): Promise<{ status: number; value: T }> {
    const { status, body: res } = await this.request(method, path, body);
    const buf = await readAll(res).catch((err: Error) => {
      throw new ShardError("unreachable", `reading the answer from ${this.where()}: ${err.message}`, 0, { cause: err });
    });
    if (buf.length === 0) return { status, value: undefined as T };
    try {
      return { status, value: JSON.parse(buf.toString("utf8")) as T };
    } catch (err) {
      throw new ShardError("bad_response", `the server's answer is not JSON: ${buf.toString("utf8").slice(0, 200)}`, status, { cause: err });
    }
  }
}

/**
 * Writes a stream as a request's body, then ends it; stops as soon as the
 * server answered (it refused early) or the request is gone. Each chunk is
 * handed to the connection before the next is asked for: a source may
 * reuse its buffer, and it is read only as fast as the server takes it. A
 * source that fails destroys the request with ShardError `source_failed`.
 */
async function sendStream(
  req: http.ClientRequest,
  src: AsyncIterable<Uint8Array | string> | Iterable<Uint8Array | string>,
  answered: () => boolean,
): Promise<void> {
  const stop = () => answered() || req.destroyed;
  const it: AsyncIterator<unknown> | Iterator<unknown> =
    Symbol.asyncIterator in src ? (src as AsyncIterable<unknown>)[Symbol.asyncIterator]() : (src as Iterable<unknown>)[Symbol.iterator]();
  let done = false;
  try {
    for (;;) {
      const r = await it.next();
      if (r.done) {
        done = true;
        break;
      }
      if (stop()) break;
      const v = r.value;
      let buf: Buffer;
      if (typeof v === "string") buf = Buffer.from(v, "utf8");
      else if (v instanceof Uint8Array) buf = Buffer.from(v.buffer, v.byteOffset, v.byteLength);
      else throw new TypeError(`the stream gave a ${typeof v}, not a Uint8Array or a string`);
      if (buf.length === 0) continue;
      await written(req, buf);
      if (stop()) break;
    }
    if (done && !stop()) req.end();
  } catch (err) {
    if (stop()) return;
    req.destroy(new ShardError("source_failed", `reading the data to send: ${(err as Error)?.message ?? String(err)}`, 0, { cause: err }));
  } finally {
    if (!done) void Promise.resolve(it.return?.()).catch(() => {});
  }
}

/** Writes buf to req; resolves once the connection has it, or the request is answered or gone. */
function written(req: http.ClientRequest, buf: Buffer): Promise<void> {
  return new Promise<void>((resolve) => {
    let settled = false;
    const done = () => {
      if (settled) return;
      settled = true;
      req.removeListener("close", done);
      req.removeListener("response", done);
      resolve();
    };
    req.once("close", done);
    // The answer came while the body was being sent: stop waiting (sendStream then stops).
    req.once("response", done);
    req.write(buf, () => done());
  });
}

/** The header that carries a request's id in the server's access log, on every answer. */
export const REQUEST_ID_HEADER = "X-Request-Id";

/** An answer's X-Request-Id; undefined when it has none. */
function requestIdOf(headers: http.IncomingHttpHeaders): string | undefined {
  const v = headers[REQUEST_ID_HEADER.toLowerCase()];
  return typeof v === "string" && v !== "" ? v : undefined;
}

/** The ShardError for a non-2xx answer; requestId is its X-Request-Id. */
export function errorFromBody(status: number, statusText: string, text: string, requestId?: string): ShardError {
  const extra = requestId ? { requestId } : undefined;
  try {
    const e = JSON.parse(text) as { code?: unknown; message?: unknown };
    if (e && typeof e.message === "string" && e.message !== "") {
      return new ShardError(typeof e.code === "string" && e.code ? e.code : `http_${status}`, e.message, status, extra);
    }
  } catch {
    // not JSON: fall through
  }
  return new ShardError(`http_${status}`, `server answered ${status} ${statusText}: ${text.trim().slice(0, 500)}`, status, extra);
}

export async function readAll(stream: NodeJS.ReadableStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of stream) chunks.push(typeof c === "string" ? Buffer.from(c) : (c as Buffer));
  return Buffer.concat(chunks);
}

/** Encodes one path segment (an id, a name). */
export function seg(s: string): string {
  return encodeURIComponent(s);
}
