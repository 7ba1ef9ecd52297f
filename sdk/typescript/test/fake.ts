// A tiny in-memory stand-in for `shard serve`, made with node:http, for the
// unit tests: sandboxes, fork (with on-fork hooks from its files), the fork
// tree (scripted) and diffs (of its files), checkpoints, environments,
// secrets and grants, and exec whose events a test scripts (with delays):
// the binary exec stream when the client asks for it (or sends a framed
// body), NDJSON otherwise or when `ndjson` is set (an older server). A
// framed request body is read as it comes, while the answer is written: its
// frames after `Q` reach the script as `w.input`. Every answer carries an
// X-Request-Id, as the server's do.

import * as http from "node:http";
import type { AddressInfo } from "node:net";

export interface Recorded {
  method: string;
  path: string;
  headers: http.IncomingHttpHeaders;
  /** The JSON body; for a framed body, its Q frame's JSON. */
  body: any;
  at: number;
  /** A framed body: every frame it had, Q first (filled in as they come). */
  frames?: ClientFrame[];
  /** The X-Request-Id of its answer. */
  requestId: string;
}

export const STREAM = "application/vnd.shard.stream";

/** One frame of a framed request body. */
export interface ClientFrame {
  type: string;
  payload: Buffer;
}

/** Encodes one frame (written here, not taken from the SDK, so the tests check the wire). */
export function frame(type: string, payload: Buffer | string = Buffer.alloc(0)): Buffer {
  const p = typeof payload === "string" ? Buffer.from(payload) : payload;
  const h = Buffer.alloc(5);
  h.write(type, 0, "latin1");
  h.writeUInt32BE(p.length, 1);
  return Buffer.concat([h, p]);
}

/** The frames of a request body, as they arrive. */
async function* readFrames(req: http.IncomingMessage): AsyncGenerator<ClientFrame> {
  let buf = Buffer.alloc(0);
  for await (const c of req) {
    buf = Buffer.concat([buf, c as Buffer]);
    while (buf.length >= 5) {
      const n = buf.readUInt32BE(1);
      if (n > 1 << 20) throw new Error(`client frame of ${n} bytes: more than 1 MiB`);
      if (buf.length < 5 + n) break;
      yield { type: String.fromCharCode(buf[0]!), payload: buf.subarray(5, 5 + n) };
      buf = buf.subarray(5 + n);
    }
  }
  if (buf.length) throw new Error(`the body ended inside a frame (${buf.length} bytes left)`);
}

/** What a scripted exec can do. */
export interface ExecWriter {
  stdout(s: string | Buffer): void;
  stderr(s: string | Buffer): void;
  exit(code: number, extra?: Record<string, unknown>): void;
  error(msg: string): void;
  /** Raw line (NDJSON), for malformed-stream tests. */
  raw(line: string): void;
  /** Raw bytes of the answer (binary stream), for split and unknown frames. */
  bytes(b: Buffer): void;
  /** Whether the answer is the binary stream. */
  binary: boolean;
  /** The framed request body's frames after Q (nothing for a JSON body). */
  input: AsyncIterable<ClientFrame>;
  /** performance.now() when each event type was last written. */
  sentAt: Record<string, number>;
}

export type ExecScript = (argv: string[], w: ExecWriter, sandbox: any, req: any) => Promise<void> | void;

/** One file of a fake sandbox. */
export interface FakeFile {
  type: "file" | "dir" | "symlink";
  data?: Buffer;
  mode: number;
  uid: number;
  gid: number;
  mtime: string;
  link?: string;
}

/** How a PUT of files arrived. */
export interface FakeUpload {
  path: string;
  query: Record<string, string>;
  headers: http.IncomingHttpHeaders;
  /** Each piece of the body as the server read it, with when. */
  pieces: { at: number; size: number }[];
  bytes: number;
  /** The body ended cleanly (false: the connection broke, or the fake answered first). */
  whole: boolean;
}

/** Answers a read of files itself (a test's script), instead of the fake's files. */
export type FilesReadScript = (path: string, req: http.IncomingMessage, res: http.ServerResponse) => Promise<void> | void;

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export { until } from "./wait.js";

let seq = 0;
const newId = () => (0x100000000000 + ++seq * 7919 + Math.floor(Math.random() * 1000)).toString(16).slice(-12);

export class FakeShard {
  readonly requests: Recorded[] = [];
  readonly sandboxes = new Map<string, any>();
  readonly checkpoints: any[] = [];
  readonly environments = new Map<string, any>();
  readonly secrets = new Map<string, string>();
  /** Answer every request with this error instead (status, code, message). */
  failWith?: { status: number; code?: string; message?: string; raw?: string };
  /** Set: failWith answers only this many more requests, then clears itself (retries counted, not timed). */
  failTimes?: number;
  /** Delay before answering a create or fork, in ms. */
  createDelay = 0;
  /** Answer exec with NDJSON whatever the client asks (an older server). */
  ndjson = false;
  /** Each fake sandbox's files, by path: "/" and "/tmp" are there from the start. */
  readonly files = new Map<string, Map<string, FakeFile>>();
  /** Tars written into a directory, kept as they came (a tar read of it answers them). */
  readonly archives = new Map<string, Buffer>();
  readonly uploads: FakeUpload[] = [];
  /** The checkpoint each fork started from, with the source's files then. */
  readonly startedFrom = new Map<string, { id: string; files: Map<string, FakeFile> }>();
  /** Set: reads of files go to it. */
  onFilesRead?: FilesReadScript;
  /** Answers with 409 sandbox_frozen this many times before a files call goes through. */
  frozenFiles = 0;
  /** What GET /v0/tree answers (the roots); a sandbox's tree is the root it is under. */
  tree: any[] = [];
  /** What GET /v0/whoami answers (by default the socket's administrator). */
  whoami: any = { name: "admin", project: "*", scopes: ["*"], all_projects: true };
  /** Each project's quota, as PUT /v0/projects/{name}/quota set it; creates past max_sandboxes are refused. */
  readonly quotas = new Map<string, any>();
  private requestSeq = 0;
  onExec: ExecScript = (argv, w) => {
    w.stdout(argv.join(" ") + "\n");
    w.exit(0);
  };
  private server!: http.Server;
  url = "";

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  count(method: string, pathPrefix: string): number {
    return this.requests.filter((r) => r.method === method && r.path.startsWith(pathPrefix)).length;
  }

  find(id: string): any {
    return this.sandboxes.get(id) ?? [...this.sandboxes.values()].find((s) => s.name === id);
  }

  private sandbox(fields: any): any {
    const id = newId();
    const sb = {
      id,
      name: fields.name || id,
      project: fields.project ?? "default",
      image: fields.image ?? "img",
      image_digest: "sha256:0",
      provider: "gvisor",
      state: "running",
      memory_bytes: 512 << 20,
      memory_mib: 512,
      cpu: 1,
      disk_bytes: 10 * 2 ** 30, // not 10 << 30: a 32-bit shift, negative
      pids_limit: 4096,
      env: [],
      oom_kills: 0,
      session: fields.session ?? (fields.name || id),
      grants: [] as any[],
      created_at: new Date().toISOString(),
      ...fields.extra,
    };
    this.sandboxes.set(id, sb);
    return sb;
  }

  /** Project name as GET /v0/projects lists it: its sandboxes counted, its quota, its use. */
  private project(name: string): any {
    const sbs = [...this.sandboxes.values()].filter((sb) => sb.project === name);
    const running = sbs.filter((sb) => sb.state === "running");
    const sum = (l: any[], f: (sb: any) => number) => l.reduce((n, sb) => n + f(sb), 0);
    return {
      name,
      sandboxes: sbs.length,
      sessions: sbs.length,
      checkpoints: 0,
      snapshots: 0,
      environments: 0,
      secrets: 0,
      tokens: 0,
      quota: this.quotas.get(name) ?? {},
      use: {
        sandboxes: sbs.length,
        memory_bytes: sum(running, (sb) => sb.memory_bytes),
        cpu_millis: sum(running, (sb) => Math.round(sb.cpu * 1000)),
        disk_bytes: sum(sbs, (sb) => sb.disk_bytes),
        saved_bytes: 0,
        ledger_bytes: 0,
      },
    };
  }

  /** The files of sandbox sb, made on first use. */
  fs(sb: any): Map<string, FakeFile> {
    let m = this.files.get(sb.id);
    if (!m) {
      m = imageFiles();
      this.files.set(sb.id, m);
    }
    return m;
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    res.setHeader("X-Request-Id", `fake-${++this.requestSeq}`);
    const early = new URL(req.url ?? "/", "http://x");
    const fp = /^\/v0\/sandboxes\/([^/]+)\/files(\/stat|\/list)?$/.exec(early.pathname);
    if (fp && !this.failWith) return this.filesCall(req, res, decodeURIComponent(fp[1]!), fp[2] ?? "", early);
    let body: any;
    let frames: AsyncGenerator<ClientFrame> | undefined;
    const rec: Recorded = { method: req.method ?? "", path: "", headers: req.headers, body: undefined, at: performance.now(), requestId: String(res.getHeader("X-Request-Id")) };
    if ((req.headers["content-type"] ?? "").split(";")[0] === STREAM) {
      // A framed body: the Q frame now, the rest while the answer goes out.
      rec.frames = [];
      const all = readFrames(req);
      const first = await all.next();
      if (first.done || first.value.type !== "Q") {
        res.writeHead(400, { "Content-Type": "application/json" });
        return void res.end(JSON.stringify({ code: "invalid_argument", message: "the first frame must be Q" }));
      }
      rec.frames.push(first.value);
      body = JSON.parse(first.value.payload.toString("utf8"));
      frames = (async function* () {
        for await (const f of all) {
          rec.frames!.push(f);
          yield f;
        }
      })();
    } else {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      const text = Buffer.concat(chunks).toString("utf8");
      try {
        body = text ? JSON.parse(text) : undefined;
      } catch {
        body = text;
      }
    }
    const url = new URL(req.url ?? "/", "http://x");
    const path = url.pathname;
    rec.path = path + url.search;
    rec.body = body;
    this.requests.push(rec);
    const json = (status: number, v: unknown) => {
      const b = Buffer.from(JSON.stringify(v));
      res.writeHead(status, { "Content-Type": "application/json", "Content-Length": b.length });
      res.end(b);
    };
    const err = (status: number, code: string, message: string) => json(status, { code, message });
    if (this.failWith) {
      const fail = this.failWith;
      if (this.failTimes !== undefined && --this.failTimes <= 0) this.failWith = this.failTimes = undefined;
      if (fail.raw !== undefined) {
        res.writeHead(fail.status, { "Content-Type": "text/plain" });
        return void res.end(fail.raw);
      }
      return err(fail.status, fail.code ?? "x", fail.message ?? "x");
    }
    const m = req.method;
    let p: RegExpExecArray | null;
    // Projects as the server has them: a request acts in the one its
    // Shard-Project header names ("default" without), and sees only its objects.
    const project = (req.headers["shard-project"] as string | undefined) || "default";
    if (m === "GET" && path === "/v0/version") return json(200, { version: "fake" });
    if (m === "POST" && path === "/v0/sandboxes") {
      if (this.createDelay) await sleep(this.createDelay);
      const max = this.quotas.get(project)?.max_sandboxes ?? 0;
      const has = [...this.sandboxes.values()].filter((sb) => sb.project === project).length;
      if (max > 0 && has + 1 > max) {
        return err(403, "quota_exceeded", `project ${project}'s quota of sandboxes is ${max}: it holds ${has}, and sandbox ${body.name || "new"} asks for 1 more; remove or stop what it holds, or have an administrator raise the quota (shard project set ${project} --max-sandboxes)`);
      }
      if (body.name && this.find(body.name)) return err(409, "name_taken", `name ${body.name} is taken`);
      if (body.environment) {
        const env = this.environments.get(body.environment);
        if (!env) return err(404, "environment_not_found", `environment ${body.environment} not found`);
        return json(201, this.sandbox({ name: body.name, image: env.image, project, extra: { parent_id: env.checkpoint } }));
      }
      return json(201, this.sandbox({ name: body.name, image: body.image, project }));
    }
    if (m === "GET" && path === "/v0/sandboxes") {
      const all = url.searchParams.get("all_projects") === "true";
      return json(200, { sandboxes: [...this.sandboxes.values()].filter((sb) => all || sb.project === project) });
    }
    if (m === "POST" && path === "/v0/tokens") {
      return json(201, { id: "a1", name: body.name, project: body.project || project, scopes: body.scopes, created_at: "2025-01-01T00:00:00Z", key: "shk_a1_x" });
    }
    if (m === "GET" && path === "/v0/tokens") {
      return json(200, { tokens: [{ id: "a1", name: "ci", project: "*", scopes: ["*"], created_at: "2025-01-01T00:00:00Z" }] });
    }
    if (m === "DELETE" && (p = /^\/v0\/tokens\/([^/]+)$/.exec(path))) return json(200, { revoked: decodeURIComponent(p[1]!) });
    if (m === "GET" && path === "/v0/whoami") return json(200, this.whoami);
    if (m === "GET" && path === "/v0/projects") {
      const names = new Set<string>([...this.sandboxes.values()].map((sb) => sb.project));
      for (const n of this.quotas.keys()) names.add(n);
      const all = this.whoami.all_projects === true;
      return json(200, { projects: [...names].filter((n) => all || n === project).sort().map((n) => this.project(n)) });
    }
    if (m === "PUT" && (p = /^\/v0\/projects\/([^/]+)\/quota$/.exec(path))) {
      if (!this.whoami.all_projects) return err(403, "wrong_project", `token ${this.whoami.name} belongs to project ${this.whoami.project}: only a key of every project sets quotas`);
      for (const [k, v] of Object.entries(body ?? {})) {
        if (!/^max_(sandboxes|memory_bytes|cpu_millis|disk_bytes|saved_bytes|ledger_bytes)$/.test(k)) return err(400, "invalid_argument", `unknown field ${k}`);
        if (typeof v !== "number" || v < 0) return err(400, "invalid_argument", `${k} is ${v}: give 0 (no bound) or more`);
      }
      const name = decodeURIComponent(p[1]!);
      this.quotas.set(name, Object.fromEntries(Object.entries(body ?? {}).filter(([, v]) => v !== 0)));
      return json(200, this.project(name));
    }
    if ((p = /^\/v0\/sandboxes\/([^/]+)$/.exec(path))) {
      const sb = this.find(decodeURIComponent(p[1]!));
      if (!sb || sb.project !== project) return err(404, "sandbox_not_found", `sandbox ${p[1]} not found`);
      if (m === "GET") return json(200, sb);
      if (m === "DELETE") {
        if (sb.state === "running" && url.searchParams.get("force") !== "true") return err(409, "sandbox_running", "running: use force");
        this.sandboxes.delete(sb.id);
        return json(200, { removed: p[1] });
      }
    }
    if (m === "GET" && ((p = /^\/v0\/sandboxes\/([^/]+)\/tree$/.exec(path)) || path === "/v0/tree")) {
      const all = url.searchParams.get("all") === "true";
      const roots = all ? this.tree : prune(this.tree);
      if (!p) return json(200, { roots });
      const sb = this.find(decodeURIComponent(p[1]!));
      if (!sb || sb.project !== project) return err(404, "sandbox_not_found", `sandbox ${p[1]} not found`);
      const root = roots.find((r) => has(r, sb.id));
      if (!root) return err(404, "sandbox_not_found", `sandbox ${sb.name} is in no lineage the ledger knows`);
      return json(200, { roots: [root] });
    }
    if (m === "GET" && (p = /^\/v0\/sandboxes\/([^/]+)\/diff$/.exec(path))) {
      const sb = this.find(decodeURIComponent(p[1]!));
      if (!sb || sb.project !== project) return err(404, "sandbox_not_found", `sandbox ${p[1]} not found`);
      const against = url.searchParams.get("against");
      const patch = url.searchParams.get("patch") === "true";
      let from: any;
      let base: Map<string, FakeFile>;
      if (against) {
        const o = this.find(against);
        if (!o || o.project !== project) return err(404, "sandbox_not_found", `sandbox ${against} not found`);
        if (o.image !== sb.image) return err(400, "different_images", `sandbox ${o.name} is of image ${o.image} and ${sb.name} of ${sb.image}: a diff compares sandboxes of one image (a lineage)`);
        from = { kind: "sandbox", id: o.id, name: o.name };
        base = this.fs(o);
      } else if (this.startedFrom.has(sb.id)) {
        const ck = this.startedFrom.get(sb.id)!;
        from = { kind: "checkpoint", id: ck.id };
        base = ck.files;
      } else {
        from = { kind: "image", id: sb.image };
        base = imageFiles();
      }
      return json(200, { from, to: { kind: "sandbox", id: sb.id, name: sb.name }, ...fileDiff(base, this.fs(sb), patch) });
    }
    if ((p = /^\/v0\/sandboxes\/([^/]+)\/(stop|start|fork|exec|checkpoints|grants)(?:\/([^/]+))?$/.exec(path))) {
      const sb = this.find(decodeURIComponent(p[1]!));
      if (!sb) return err(404, "sandbox_not_found", `sandbox ${p[1]} not found`);
      const verb = p[2];
      if (verb === "stop" && m === "POST") return json(200, Object.assign(sb, { state: "stopped" }));
      if (verb === "start" && m === "POST") return json(200, Object.assign(sb, { state: "running" }));
      if (verb === "fork" && m === "POST") {
        if (this.createDelay) await sleep(this.createDelay);
        const he = body?.hook_errors;
        if (he !== undefined && he !== "fail" && he !== "ignore") return err(400, "invalid_argument", `hook_errors ${JSON.stringify(he)}: fail (the default: a failing hook refuses the fork) or ignore`);
        // On-fork hooks, as the fake's files have them: one "fails" when it exits non-zero.
        const files = this.fs(sb);
        const hooks = [...files.keys()].filter((k) => k.startsWith("/etc/shard/on-fork.d/") && files.get(k)!.type === "file" && files.get(k)!.mode & 0o111).sort();
        const failed = hooks.find((k) => /exit [1-9]/.test(files.get(k)!.data?.toString("utf8") ?? ""));
        const name = body?.name || "fork";
        if (failed && he !== "ignore") {
          const hook = failed.slice(failed.lastIndexOf("/") + 1);
          return err(422, "fork_hook_failed", `fork of ${sb.name}: on-fork hook ${hook} failed in fork ${name} (exit code 3): no lease; the fork was not made (--hook-errors=ignore keeps forks whose hooks fail)`);
        }
        const ck = this.checkpoint(sb, "fork", body?.tag);
        const fork = this.sandbox({ name: body?.name, image: sb.image, session: `fork-${sb.name}-${ck.id.slice(0, 6)}`, extra: { parent_id: sb.id, grants: [...sb.grants] } });
        this.files.set(fork.id, new Map(files));
        this.startedFrom.set(fork.id, { id: ck.id, files: new Map(files) });
        return json(201, fork);
      }
      if (verb === "checkpoints" && m === "POST") return json(201, this.checkpoint(sb, "checkpoint", body?.tag));
      if (verb === "checkpoints" && m === "GET") return json(200, { checkpoints: this.checkpoints.filter((c) => c.session === sb.session) });
      if (verb === "grants" && m === "POST") {
        if (!this.secrets.has(body.secret)) return err(404, "secret_not_found", `secret ${body.secret} not found`);
        sb.grants = sb.grants.filter((g: any) => g.secret !== body.secret).concat([body]);
        return json(200, sb);
      }
      if (verb === "grants" && m === "GET") return json(200, { grants: sb.grants });
      if (verb === "grants" && m === "DELETE") {
        sb.grants = sb.grants.filter((g: any) => g.secret !== decodeURIComponent(p![3]!));
        return json(200, sb);
      }
      if (verb === "exec" && m === "POST") return this.exec(sb, body, req, res, frames);
    }
    if ((p = /^\/v0\/checkpoints\/([^/]+)\/restore$/.exec(path)) && m === "POST") {
      const ck = this.checkpoints.find((c) => c.id === p![1]);
      if (!ck) return err(404, "checkpoint_not_found", "checkpoint not found");
      return json(201, this.sandbox({ name: body?.name, image: ck.image }));
    }
    if ((p = /^\/v0\/ledger\/sessions\/([^/]+)\/resume$/.exec(path)) && m === "POST") {
      return json(201, { sandbox: this.sandbox({ name: body?.name }), checkpoint: "", replayed: [{ argv: ["true"], recorded_exit_code: 0, exit_code: 0 }], reapplied: [{ event: "sandbox.secret_granted", secret: "KEY" }] });
    }
    if ((p = /^\/v0\/ledger\/sessions\/([^/]+)$/.exec(path)) && m === "DELETE") {
      return json(200, { removed: decodeURIComponent(p[1]!) });
    }
    if ((p = /^\/v0\/environments\/([^/]+)$/.exec(path))) {
      const env = this.environments.get(decodeURIComponent(p[1]!));
      if (!env) return err(404, "environment_not_found", `environment ${p[1]} not found`);
      if (m === "GET") return json(200, env);
      if (m === "DELETE") {
        this.environments.delete(env.name);
        return json(200, { removed: env.name });
      }
    }
    if (m === "POST" && path === "/v0/environments") {
      const old = this.environments.get(body.name);
      if (old && old.fingerprint === body.fingerprint) return json(200, old);
      const src = body.sandbox ? this.find(body.sandbox) : undefined;
      if (body.sandbox && !src) return err(404, "sandbox_not_found", "sandbox not found");
      const ck = src ? this.checkpoint(src, "environment") : { id: newId() };
      const env = { name: body.name, image: src?.image ?? body.image, fingerprint: body.fingerprint ?? "server", checkpoint: ck.id, created_at: new Date().toISOString() };
      this.environments.set(body.name, env);
      return json(201, env);
    }
    if ((p = /^\/v0\/secrets\/([^/]+)$/.exec(path))) {
      const name = decodeURIComponent(p[1]!);
      if (m === "PUT") {
        this.secrets.set(name, Buffer.from(body.value, "base64").toString("utf8"));
        return json(200, { name, created_at: "", updated_at: "" });
      }
      if (m === "DELETE") {
        this.secrets.delete(name);
        return json(200, { removed: name });
      }
    }
    return err(404, "not_found", `no route ${m} ${path}`);
  }

  /** The files API, as the server has it (bodies streamed, never JSON-parsed). */
  private async filesCall(req: http.IncomingMessage, res: http.ServerResponse, id: string, op: string, url: URL): Promise<void> {
    const m = req.method ?? "";
    const rec: Recorded = { method: m, path: url.pathname + url.search, headers: req.headers, body: undefined, at: performance.now(), requestId: String(res.getHeader("X-Request-Id")) };
    this.requests.push(rec);
    const json = (status: number, v: unknown) => {
      const b = Buffer.from(JSON.stringify(v));
      res.writeHead(status, { "Content-Type": "application/json", "Content-Length": b.length });
      res.end(b);
    };
    const err = (status: number, code: string, message: string) => json(status, { code, message });
    const sb = this.find(id);
    if (!sb) return err(404, "sandbox_not_found", `sandbox ${id} not found`);
    if (this.frozenFiles > 0) {
      this.frozenFiles--;
      return err(409, "sandbox_frozen", `sandbox ${sb.name} is frozen by a fork: try again`);
    }
    const q = Object.fromEntries(url.searchParams);
    const p = q.path ?? "";
    if (!p) return err(400, "invalid_path", "give the file's path in the sandbox: ?path=/ABSOLUTE/PATH");
    if (!p.startsWith("/")) return err(400, "invalid_path", `path ${JSON.stringify(p)} must be absolute (start with /)`);
    const fs = this.fs(sb);
    const info = (path: string, f: FakeFile) => {
      const i: any = { name: path === "/" ? "/" : path.slice(path.lastIndexOf("/") + 1), path, type: f.type, size: f.data?.length ?? 0, mode: f.mode, uid: f.uid, gid: f.gid, mtime: f.mtime };
      if (f.link) i.link = f.link;
      return i;
    };
    const parent = (path: string) => path.slice(0, path.lastIndexOf("/")) || "/";
    const follow = (path: string) => {
      let f = fs.get(path);
      for (let i = 0; f?.type === "symlink" && i < 40; i++) {
        path = f.link!.startsWith("/") ? f.link! : parent(path) + "/" + f.link;
        f = fs.get(path);
      }
      return { path, f };
    };
    if (m === "GET" && op === "/stat") {
      const { path, f } = q.follow_link === "true" ? follow(p) : { path: p, f: fs.get(p) };
      if (!f) return err(404, "file_not_found", `sandbox ${sb.name}: ${p}: no such file or directory`);
      return json(200, info(path, f));
    }
    if (m === "GET" && op === "/list") {
      const { path, f } = follow(p);
      if (!f) return err(404, "file_not_found", `sandbox ${sb.name}: ${p}: no such file or directory`);
      if (f.type !== "dir") return err(400, "not_a_directory", `sandbox ${sb.name}: ${p} is not a directory`);
      const limit = q.limit ? Number(q.limit) : 10000;
      const names = [...fs.keys()].filter((k) => k !== path && parent(k) === path).sort();
      return json(200, { path, entries: names.slice(0, limit).map((k) => info(k, fs.get(k)!)), truncated: names.length > limit });
    }
    if (m === "DELETE" && op === "") {
      const f = fs.get(p);
      if (!f) return err(404, "file_not_found", `sandbox ${sb.name}: ${p}: no such file or directory`);
      const under = [...fs.keys()].filter((k) => k.startsWith(p + "/"));
      if (under.length && q.recursive !== "true") return err(409, "directory_not_empty", `sandbox ${sb.name}: ${p} is a directory that is not empty`);
      for (const k of under) fs.delete(k);
      fs.delete(p);
      return json(200, info(p, f));
    }
    if (m === "GET" && op === "") {
      if (this.onFilesRead) return this.onFilesRead(p, req, res);
      const tar = (req.headers.accept ?? "").includes("application/x-tar");
      const { path, f } = q.follow_link === "true" || !tar ? follow(p) : { path: p, f: fs.get(p) };
      if (!f) return err(404, "file_not_found", `sandbox ${sb.name}: ${p}: no such file or directory`);
      const stat = Buffer.from(JSON.stringify(info(path, f))).toString("base64");
      if (tar) {
        res.writeHead(200, { "Content-Type": "application/x-tar", "X-Shard-File-Stat": stat });
        return void res.end(this.archives.get(path) ?? Buffer.alloc(1024));
      }
      if (f.type === "dir") return err(400, "is_a_directory", `sandbox ${sb.name}: ${p} is a directory`);
      res.writeHead(200, { "Content-Type": "application/octet-stream", "Content-Length": f.data!.length, "X-Shard-File-Stat": stat });
      return void res.end(f.data);
    }
    if (m === "PUT" && op === "") {
      const up: FakeUpload = { path: p, query: q, headers: req.headers, pieces: [], bytes: 0, whole: false };
      this.uploads.push(up);
      const tar = (req.headers["content-type"] ?? "").split(";")[0] === "application/x-tar";
      const target = tar ? p : follow(p).path;
      const dir = tar ? p : parent(target);
      // Refused before the body is read, as the server does: the answer
      // comes while the client is still sending.
      if (!tar && q.parents !== "true" && fs.get(dir)?.type !== "dir") {
        return err(404, "file_not_found", `sandbox ${sb.name}: directory ${dir} does not exist (make it first, or ask for its parents: parents=true in the API, shard write --parents)`);
      }
      if (!tar && fs.get(target)?.type === "dir") return err(400, "is_a_directory", `sandbox ${sb.name}: ${p} is a directory`);
      const chunks: Buffer[] = [];
      try {
        for await (const c of req) {
          up.pieces.push({ at: performance.now(), size: (c as Buffer).length });
          up.bytes += (c as Buffer).length;
          chunks.push(c as Buffer);
        }
        up.whole = true;
      } catch {
        return; // the upload broke off: nothing is written
      }
      const data = Buffer.concat(chunks);
      const cl = req.headers["content-length"];
      if (cl !== undefined && Number(cl) !== data.length) return err(400, "short_body", "the body is shorter than its Content-Length");
      const now = new Date().toISOString();
      if (tar) {
        fs.set(p, { type: "dir", mode: 0o755, uid: 0, gid: 0, mtime: now });
        this.archives.set(p, data);
        return json(200, { path: p, bytes: data.length, files: 1, notes: ["x/dev: a device node: skipped"] });
      }
      for (let d = dir; q.parents === "true" && !fs.has(d); d = parent(d)) fs.set(d, { type: "dir", mode: 0o755, uid: 0, gid: 0, mtime: now });
      const old = fs.get(target);
      fs.set(target, {
        type: "file",
        data,
        mode: q.mode !== undefined ? parseInt(q.mode, 8) : (old?.mode ?? 0o644),
        uid: q.uid !== undefined ? Number(q.uid) : (old?.uid ?? 0),
        gid: q.gid !== undefined ? Number(q.gid) : (old?.gid ?? 0),
        mtime: q.mtime ?? now,
      });
      return json(200, { path: p, bytes: data.length, files: 1 });
    }
    return err(404, "not_found", `no route ${m} ${url.pathname}`);
  }

  private checkpoint(sb: any, kind: string, tag?: string): any {
    const ck = { id: newId(), kind, tag, sandbox_id: sb.id, sandbox_name: sb.name, session: sb.session, seq: this.checkpoints.length + 1, image: sb.image };
    if (!tag) delete (ck as any).tag;
    this.checkpoints.push(ck);
    return ck;
  }

  private async exec(sb: any, body: any, req: http.IncomingMessage, res: http.ServerResponse, input?: AsyncGenerator<ClientFrame>): Promise<void> {
    if (sb.state !== "running") {
      const b = JSON.stringify({ code: "sandbox_not_running", message: `sandbox ${sb.name} is not running` });
      res.writeHead(409, { "Content-Type": "application/json" });
      return void res.end(b);
    }
    const binary = !this.ndjson && (input !== undefined || (req.headers.accept ?? "").includes(STREAM));
    res.writeHead(200, { "Content-Type": binary ? STREAM : "application/x-ndjson" });
    res.flushHeaders();
    const sentAt: Record<string, number> = {};
    let ended = false;
    const names: Record<string, string> = { S: "started", O: "stdout", E: "stderr", X: "exit", F: "error" };
    const line = (o: object) => {
      if (ended) return;
      res.write(JSON.stringify(o) + "\n");
      sentAt[(o as any).type] = performance.now();
    };
    const fr = (t: string, p: Buffer | string) => {
      if (ended) return;
      res.write(frame(t, p));
      sentAt[names[t] ?? t] = performance.now();
    };
    const w: ExecWriter = binary
      ? {
          stdout: (s) => fr("O", Buffer.from(s)),
          stderr: (s) => fr("E", Buffer.from(s)),
          exit: (code, extra) => fr("X", JSON.stringify({ exit_code: code, ...extra })),
          error: (msg) => fr("F", JSON.stringify({ code: "sandbox_unreachable", message: msg })),
          raw: (l) => res.write(l + "\n"),
          bytes: (b) => res.write(b),
          binary,
          input: input ?? (async function* () {})(),
          sentAt,
        }
      : {
          stdout: (s) => line({ type: "stdout", data: Buffer.from(s).toString("base64") }),
          stderr: (s) => line({ type: "stderr", data: Buffer.from(s).toString("base64") }),
          exit: (code, extra) => line({ type: "exit", exit_code: code, ...extra }),
          error: (msg) => line({ type: "error", data: Buffer.from(msg).toString("base64") }),
          raw: (l) => {
            res.write(l + "\n");
          },
          bytes: (b) => res.write(b),
          binary,
          input: input ?? (async function* () {})(),
          sentAt,
        };
    if (binary) fr("S", JSON.stringify({ pid: 42 }));
    else line({ type: "started", pid: 42 });
    try {
      await this.onExec(body.argv, w, sb, body);
    } finally {
      ended = true;
      res.end();
    }
  }
}

/** A new sandbox's files: its image's ("/" and "/tmp"). */
function imageFiles(): Map<string, FakeFile> {
  const t = "2025-01-01T00:00:00Z";
  return new Map<string, FakeFile>([
    ["/", { type: "dir", mode: 0o755, uid: 0, gid: 0, mtime: t }],
    ["/tmp", { type: "dir", mode: 0o1777, uid: 0, gid: 0, mtime: t }],
  ]);
}

/** Whether a node of the fork tree is id, or has it below. */
function has(n: any, id: string): boolean {
  return n.id === id || (n.children ?? []).some((c: any) => has(c, id));
}

/** The tree without what was removed and has nothing that exists below it (what the server leaves out without all). */
function prune(ns: any[]): any[] {
  const out: any[] = [];
  for (const n of ns) {
    const children = prune(n.children ?? []);
    if (n.removed && children.length === 0) continue;
    const c = { ...n, children };
    if (!children.length) delete c.children;
    out.push(c);
  }
  return out;
}

/** What changed from files a to files b, as the server's diff lists it (content only; no modes). */
function fileDiff(a: Map<string, FakeFile>, b: Map<string, FakeFile>, patch: boolean): any {
  const changes: any[] = [];
  const size = (f?: FakeFile) => f?.data?.length ?? 0;
  for (const path of [...new Set([...a.keys(), ...b.keys()])].sort()) {
    const x = a.get(path);
    const y = b.get(path);
    let c: any;
    if (!x) c = { path, kind: "added", type: y!.type, size_a: 0, size_b: size(y) };
    else if (!y) c = { path, kind: "removed", type: x.type, size_a: size(x), size_b: 0 };
    else if (x.type === "file" && y.type === "file" && !x.data!.equals(y.data!)) c = { path, kind: "changed", type: "file", what: ["content"], size_a: size(x), size_b: size(y) };
    else continue;
    if (patch && c.type === "file") {
      const lines = (f: FakeFile | undefined, sign: string) => (f?.data?.toString("utf8") ?? "").split("\n").filter(Boolean).map((l) => sign + l + "\n").join("");
      c.patch = `--- a${path}\n+++ b${path}\n` + lines(x, "-") + lines(y, "+");
    }
    changes.push(c);
  }
  const count = (k: string) => changes.filter((c) => c.kind === k).length;
  return { changes, added: count("added"), removed: count("removed"), changed: count("changed"), truncated: false };
}

export async function withFake<T>(fn: (f: FakeShard) => Promise<T>): Promise<T> {
  const f = await new FakeShard().start();
  try {
    return await fn(f);
  } finally {
    await f.stop();
  }
}

/** A Writable-like that records each chunk and when it came. */
export class Collector {
  readonly chunks: { at: number; text: string }[] = [];
  write(chunk: Uint8Array): boolean {
    this.chunks.push({ at: performance.now(), text: Buffer.from(chunk).toString("utf8") });
    return true;
  }
  get text(): string {
    return this.chunks.map((c) => c.text).join("");
  }
}
