// ShardApi: one typed method per REST call the SDK makes. Shard and
// SandboxClient are built on it; it is exported for what they do not cover.

import { ShardError } from "./errors.js";
import { FRAME, STREAM_TYPE, encodeFrame } from "./frames.js";
import { Transport, readAll, seg, type ConnectionOptions, type RawResponse, type Upload } from "./transport.js";
import type {
  Checkpoint,
  CheckpointRequest,
  CreateRequest,
  Diff,
  SandboxRemoved,
  EnvironmentInfo,
  EnvironmentRequest,
  ExecRequest,
  FileInfo,
  FileList,
  ForkRequest,
  Grant,
  Policy,
  Project,
  ProjectQuota,
  RestoreRequest,
  ResumeRequest,
  ResumeResponse,
  SandboxInfo,
  SecretInfo,
  Session,
  Token,
  TokenCreated,
  TokenRequest,
  TreeNode,
  Whoami,
  WriteResult,
} from "./types.js";

/** How long calls refused with 409 sandbox_frozen (a fork or checkpoint holds the sandbox) are retried. */
const FROZEN_RETRY_MS = 120_000;

/** The whole body of an answer (a ShardError `unreachable` if it breaks). */
async function readBody(t: Transport, res: RawResponse["body"]): Promise<Buffer> {
  try {
    return await readAll(res);
  } catch (err) {
    throw new ShardError("unreachable", `reading the answer from ${t.base}: ${(err as Error).message}`, 0, { cause: err });
  }
}

function parseJson<T>(buf: Buffer): T {
  try {
    return JSON.parse(buf.toString("utf8")) as T;
  } catch (err) {
    throw new ShardError("bad_response", `the server's answer is not JSON: ${buf.toString("utf8").slice(0, 200)}`, 200, { cause: err });
  }
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Retries fn while the server answers 409 `sandbox_frozen`: the command or
 * fork did not start, and the server asks to run it again once the freeze
 * (another fork or checkpoint of the same sandbox) is over.
 */
export async function retryFrozen<T>(fn: () => Promise<T>): Promise<T> {
  const deadline = Date.now() + FROZEN_RETRY_MS;
  let delay = 25;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (!(err instanceof ShardError) || err.code !== "sandbox_frozen" || Date.now() + delay > deadline) throw err;
      await sleep(delay);
      delay = Math.min(delay * 2, 1000);
    }
  }
}

/** The media type of an archive of a sandbox's files (a tar), both ways. */
export const TAR_TYPE = "application/x-tar";

/** The answer header of a read of files: base64 of the JSON FileInfo of what is read. */
export const FILE_STAT_HEADER = "X-Shard-File-Stat";

/** How a write of one file sets it; unset fields keep the replaced file's (a new one: mode 0o644, root's). */
export interface WriteFileOptions {
  /** Its mode: a number (`0o755`) or octal digits (`"755"`); at most 0o7777. */
  mode?: number | string;
  /** Its owner. */
  uid?: number;
  /** Its group. */
  gid?: number;
  /** Its modification time: a Date or an RFC 3339 string. Default: now. */
  mtime?: Date | string;
  /** Make its missing parent directories (mode 0o755). */
  parents?: boolean;
}

/** A read of a sandbox's files: what is read, and the answer whose body is its bytes. */
export interface FilesRead {
  info: FileInfo;
  response: RawResponse;
}

/** The query string of a files call: path and the parameters that are set. */
export function filesQuery(path: string, params: Record<string, string | undefined> = {}): string {
  if (typeof path !== "string" || path === "") throw new ShardError("invalid_argument", "give the file's absolute path in the sandbox, e.g. /srv/app/main.py");
  const q = new URLSearchParams({ path });
  for (const [k, v] of Object.entries(params)) if (v !== undefined) q.set(k, v);
  return "?" + q.toString();
}

/** The query parameters of WriteFileOptions, checked. */
export function writeFileParams(o: WriteFileOptions = {}): Record<string, string | undefined> {
  const p: Record<string, string | undefined> = {};
  if (o.mode !== undefined) {
    const m = typeof o.mode === "number" ? o.mode : /^[0-7]{1,4}$/.test(o.mode) ? parseInt(o.mode, 8) : NaN;
    if (!Number.isInteger(m) || m < 0 || m > 0o7777) {
      throw new ShardError("invalid_argument", `mode ${JSON.stringify(o.mode)}: give a number at most 0o7777 (e.g. 0o755) or octal digits ("755")`);
    }
    p.mode = m.toString(8);
  }
  for (const k of ["uid", "gid"] as const) {
    const v = o[k];
    if (v === undefined) continue;
    if (!Number.isInteger(v) || v < 0) throw new ShardError("invalid_argument", `${k} ${JSON.stringify(v)}: give a non-negative integer`);
    p[k] = String(v);
  }
  if (o.mtime !== undefined) {
    if (o.mtime instanceof Date) {
      if (Number.isNaN(o.mtime.getTime())) throw new ShardError("invalid_argument", "mtime is an invalid Date");
      p.mtime = o.mtime.toISOString();
    } else p.mtime = o.mtime;
  }
  if (o.parents) p.parents = "true";
  return p;
}

/** Reads a read's X-Shard-File-Stat header (base64 of the JSON FileInfo). */
export function fileStatHeader(v: string | string[] | undefined): FileInfo {
  const raw = Array.isArray(v) ? v[0] : v;
  if (raw) {
    try {
      const info = JSON.parse(Buffer.from(raw, "base64").toString("utf8")) as FileInfo;
      if (info && typeof info === "object" && typeof info.path === "string") return info;
    } catch {
      // fall through
    }
  }
  throw new ShardError("bad_response", `the server's read of files has no readable ${FILE_STAT_HEADER} header: ${JSON.stringify(raw ?? null).slice(0, 200)}`, 502);
}

/** The on-fork hook options of a fork (see README "Forks that know they were forked"). */
export interface ForkHookOptions {
  /**
   * How long each hook in /etc/shard/on-fork.d may run: seconds, or a Go
   * duration ("30s", "2m"). Default 30 s, at most 10 min; a hook past it is
   * killed and counts as failed.
   */
  hookTimeout?: number | string;
  /**
   * "fail" (the default): a hook that fails refuses the fork, which rejects
   * with ShardError `fork_hook_failed` (422) and leaves no fork; "ignore":
   * the fork is made, and each hook's run is in its ledger (`sandbox.fork_hook`).
   */
  hookErrors?: "fail" | "ignore";
  /** Run the hooks in the source too (SHARD_FORK_ROLE=source), after the forks'. */
  hooksInSource?: boolean;
}

/** What a fork takes: the fork's name, the tag of its checkpoint, and the hook options. */
export interface ForkOptions extends ForkHookOptions {
  /** The fork's name (unique); default: its id. */
  name?: string;
  /** Stored with the fork's checkpoint in the source's ledger. */
  tag?: string;
  /**
   * Keep the fork's checkpoint until it is removed by hand (so that a
   * resume of a removed fork's session still works); by default the server
   * removes it once no sandbox's resume starts from it.
   */
  keepCheckpoint?: boolean;
}

/** The body of a fork from ForkOptions; a number hookTimeout is seconds. */
export function forkRequest(o: ForkOptions = {}): ForkRequest {
  const req: ForkRequest = {};
  if (o.name) req.name = o.name;
  if (o.tag) req.tag = o.tag;
  if (o.hookTimeout !== undefined) {
    const t = o.hookTimeout;
    if (typeof t === "number") {
      if (!Number.isFinite(t) || t <= 0) throw new ShardError("invalid_argument", `hookTimeout ${t}: give seconds above 0, or a duration such as "30s"`);
      req.hook_timeout = t.toFixed(9).replace(/\.?0+$/, "") + "s"; // never an exponent, which Go's durations lack
    } else req.hook_timeout = t;
  }
  if (o.hookErrors !== undefined) req.hook_errors = o.hookErrors;
  if (o.hooksInSource) req.hooks_in_source = true;
  if (o.keepCheckpoint) req.keep_checkpoint = true;
  return req;
}

/** Options of a fork tree. */
export interface TreeOptions {
  /** Keep what was removed and has nothing that exists below it. */
  all?: boolean;
}

/** Options of a diff. */
export interface DiffOptions {
  /**
   * The sandbox (id or name) to compare with: the diff is from it to the
   * sandbox asked about (what that one has that this one has not is
   * "added"). Default: what the sandbox started from (the checkpoint it was
   * forked or restored from, its snapshot, or its image).
   */
  against?: string;
  /** A unified diff of each changed text file (`Change.patch`). */
  patch?: boolean;
}

/** Options of a sandbox list. */
export interface ListOptions {
  /**
   * Every project's sandboxes (each names its `project`), not only the
   * client's project's. Only a key of every project may ask.
   */
  allProjects?: boolean;
}

export class ShardApi {
  readonly transport: Transport;

  constructor(options: ConnectionOptions | Transport = {}) {
    this.transport = options instanceof Transport ? options : new Transport(options);
  }

  /** Closes keep-alive connections. Idempotent. */
  close(): void {
    this.transport.close();
  }

  version(): Promise<{ version: string; [k: string]: unknown }> {
    return this.transport.json("GET", "/version");
  }

  // Sandboxes

  createSandbox(req: CreateRequest): Promise<SandboxInfo> {
    return this.transport.json("POST", "/sandboxes", req);
  }

  /**
   * The sandboxes of the client's project; with `allProjects`, every
   * project's (a key of every project only: else 403 `wrong_project`).
   */
  async listSandboxes(options: ListOptions = {}): Promise<SandboxInfo[]> {
    const q = options.allProjects ? "?all_projects=true" : "";
    const out = await this.transport.json<{ sandboxes: SandboxInfo[] }>("GET", "/sandboxes" + q);
    return out?.sandboxes ?? [];
  }

  getSandbox(idOrName: string): Promise<SandboxInfo> {
    return this.transport.json("GET", `/sandboxes/${seg(idOrName)}`);
  }

  stopSandbox(idOrName: string): Promise<SandboxInfo> {
    return this.transport.json("POST", `/sandboxes/${seg(idOrName)}/stop`);
  }

  startSandbox(idOrName: string): Promise<SandboxInfo> {
    return this.transport.json("POST", `/sandboxes/${seg(idOrName)}/start`);
  }

  /**
   * Removes a sandbox (a running one with force). With checkpoints, the
   * checkpoints of its ledger session go too, or nothing does (ShardError
   * `checkpoint_in_use`, 409) when another sandbox needs one.
   */
  async removeSandbox(idOrName: string, force = false, opts: { checkpoints?: boolean } = {}): Promise<SandboxRemoved> {
    const q = `force=${force ? "true" : "false"}` + (opts.checkpoints ? "&checkpoints=true" : "");
    return (await this.transport.json("DELETE", `/sandboxes/${seg(idOrName)}?${q}`)) as SandboxRemoved;
  }

  /**
   * Starts a command. The answer asks for the binary exec stream
   * (`application/vnd.shard.stream`, see docs/exec-stream.md); an older
   * server answers NDJSON (`application/x-ndjson`): its Content-Type says
   * which. With `framed`, the request body is frames too: its `Q` frame
   * (req, without stdin) is sent, and `RawResponse.request` is the body,
   * left open for the caller's `I`/`K` frames.
   */
  execRaw(idOrName: string, req: ExecRequest, o: { framed?: boolean } = {}): Promise<RawResponse> {
    const path = `/sandboxes/${seg(idOrName)}/exec`;
    if (!o.framed) return retryFrozen(() => this.transport.request("POST", path, req, { accept: STREAM_TYPE }));
    const first = encodeFrame(FRAME.request, JSON.stringify(req));
    return retryFrozen(() => this.transport.request("POST", path, undefined, { accept: STREAM_TYPE, framed: { contentType: STREAM_TYPE, first } }));
  }

  forkSandbox(idOrName: string, req: ForkRequest = {}): Promise<SandboxInfo> {
    return retryFrozen(() => this.transport.json("POST", `/sandboxes/${seg(idOrName)}/fork`, req));
  }

  // Lineage: the fork tree and diffs

  /**
   * The fork tree: every lineage of the project (oldest first), or with
   * sandbox (id or name) the one it is in: one root, its lineage's first
   * sandbox (or snapshot, or environment).
   */
  async tree(sandbox?: string, o: TreeOptions = {}): Promise<TreeNode[]> {
    const path = sandbox ? `/sandboxes/${seg(sandbox)}/tree` : "/tree";
    const out = await this.transport.json<{ roots: TreeNode[] }>("GET", path + (o.all ? "?all=true" : ""));
    return out?.roots ?? [];
  }

  /**
   * What changed in a sandbox's files (id or name): from o.against (another
   * sandbox of its image) to it, or since it started.
   */
  async diff(sandbox: string, o: DiffOptions = {}): Promise<Diff> {
    const q = new URLSearchParams();
    if (o.against) q.set("against", o.against);
    if (o.patch) q.set("patch", "true");
    const qs = q.toString();
    const d = await this.transport.json<Diff>("GET", `/sandboxes/${seg(sandbox)}/diff` + (qs ? "?" + qs : ""));
    if (d && !Array.isArray(d.changes)) d.changes = [];
    return d;
  }

  // Checkpoints, restore, resume

  checkpoint(idOrName: string, tag?: string): Promise<Checkpoint> {
    const req: CheckpointRequest = tag ? { tag } : {};
    return retryFrozen(() => this.transport.json("POST", `/sandboxes/${seg(idOrName)}/checkpoints`, req));
  }

  /** Checkpoints of one sandbox (id or name) or ledger session (name), oldest first. */
  async listCheckpoints(sandboxOrSession: string): Promise<Checkpoint[]> {
    const out = await this.transport.json<{ checkpoints: Checkpoint[] }>("GET", `/sandboxes/${seg(sandboxOrSession)}/checkpoints`);
    return out?.checkpoints ?? [];
  }

  async allCheckpoints(): Promise<Checkpoint[]> {
    const out = await this.transport.json<{ checkpoints: Checkpoint[] }>("GET", "/checkpoints");
    return out?.checkpoints ?? [];
  }

  getCheckpoint(id: string): Promise<Checkpoint> {
    return this.transport.json("GET", `/checkpoints/${seg(id)}`);
  }

  async removeCheckpoint(id: string): Promise<void> {
    await this.transport.json("DELETE", `/checkpoints/${seg(id)}`);
  }

  /** A new sandbox from a checkpoint, nothing replayed (the product spec's restoreSnapshot). */
  restoreCheckpoint(id: string, req: RestoreRequest = {}): Promise<SandboxInfo> {
    return this.transport.json("POST", `/checkpoints/${seg(id)}/restore`, req);
  }

  /** A new sandbox from a ledger session, replaying its later execs. */
  resumeSession(session: string, req: ResumeRequest = {}): Promise<ResumeResponse> {
    return this.transport.json("POST", `/ledger/sessions/${seg(session)}/resume`, req);
  }

  /** Deletes a ledger session and its events: refused (409) while its
   * sandbox exists (session_in_use) or it has checkpoints
   * (session_has_checkpoints). */
  async removeSession(session: string): Promise<void> {
    await this.transport.json("DELETE", `/ledger/sessions/${seg(session)}`);
  }

  async listSessions(): Promise<Session[]> {
    const out = await this.transport.json<{ sessions: Session[] }>("GET", "/ledger/sessions");
    return out?.sessions ?? [];
  }

  // Environments

  getEnvironment(name: string): Promise<EnvironmentInfo> {
    return this.transport.json("GET", `/environments/${seg(name)}`);
  }

  async listEnvironments(): Promise<EnvironmentInfo[]> {
    const out = await this.transport.json<{ environments: EnvironmentInfo[] }>("GET", "/environments");
    return out?.environments ?? [];
  }

  /** Builds an environment; `built` is false when it was there unchanged (200). */
  async createEnvironment(req: EnvironmentRequest): Promise<{ environment: EnvironmentInfo; built: boolean }> {
    const { status, value } = await this.transport.jsonWithStatus<EnvironmentInfo>("POST", "/environments", req);
    return { environment: value, built: status === 201 };
  }

  async removeEnvironment(name: string): Promise<void> {
    await this.transport.json("DELETE", `/environments/${seg(name)}`);
  }

  // Secrets and grants

  setSecret(name: string, value: string | Uint8Array): Promise<SecretInfo> {
    const b = typeof value === "string" ? Buffer.from(value, "utf8") : Buffer.from(value);
    return this.transport.json("PUT", `/secrets/${seg(name)}`, { value: b.toString("base64") });
  }

  async listSecrets(): Promise<SecretInfo[]> {
    const out = await this.transport.json<{ secrets: SecretInfo[] }>("GET", "/secrets");
    return out?.secrets ?? [];
  }

  async removeSecret(name: string): Promise<void> {
    await this.transport.json("DELETE", `/secrets/${seg(name)}`);
  }

  grant(sandbox: string, g: Grant): Promise<SandboxInfo> {
    return this.transport.json("POST", `/sandboxes/${seg(sandbox)}/grants`, g);
  }

  async listGrants(sandbox: string): Promise<Grant[]> {
    const out = await this.transport.json<{ grants: Grant[] }>("GET", `/sandboxes/${seg(sandbox)}/grants`);
    return out?.grants ?? [];
  }

  ungrant(sandbox: string, secret: string): Promise<SandboxInfo> {
    return this.transport.json("DELETE", `/sandboxes/${seg(sandbox)}/grants/${seg(secret)}`);
  }

  // Network policy

  setPolicy(sandbox: string, p: Policy): Promise<Policy> {
    return this.transport.json("PUT", `/sandboxes/${seg(sandbox)}/policy`, p);
  }

  getPolicy(sandbox: string): Promise<Policy> {
    return this.transport.json("GET", `/sandboxes/${seg(sandbox)}/policy`);
  }

  async clearPolicy(sandbox: string): Promise<void> {
    await this.transport.json("DELETE", `/sandboxes/${seg(sandbox)}/policy`);
  }

  // Files

  /** Describes path in a sandbox (running or stopped); with followLink, what a symlink there names. */
  async statFile(sandbox: string, path: string, o: { followLink?: boolean } = {}): Promise<FileInfo> {
    const q = filesQuery(path, { follow_link: o.followLink ? "true" : undefined });
    return retryFrozen(() => this.transport.json("GET", `/sandboxes/${seg(sandbox)}/files/stat${q}`));
  }

  /** The entries of the directory path in a sandbox, sorted by name (at most limit; `truncated` says there were more). */
  async listFiles(sandbox: string, path: string, o: { limit?: number } = {}): Promise<FileList> {
    const q = filesQuery(path, { limit: o.limit === undefined ? undefined : String(o.limit) });
    return retryFrozen(() => this.transport.json("GET", `/sandboxes/${seg(sandbox)}/files/list${q}`));
  }

  /** Removes path in a sandbox (a directory that holds anything only with recursive); answers what was removed. */
  async removeFile(sandbox: string, path: string, o: { recursive?: boolean } = {}): Promise<FileInfo> {
    const q = filesQuery(path, { recursive: o.recursive ? "true" : undefined });
    return retryFrozen(() => this.transport.json("DELETE", `/sandboxes/${seg(sandbox)}/files${q}`));
  }

  /**
   * Starts a read of path in a sandbox: the file's bytes, or with `archive`
   * a tar of it (a directory with what it holds). Resolves once the answer's
   * head is in; its body is the bytes, streamed (a read that breaks off
   * breaks the connection).
   */
  async readFiles(sandbox: string, path: string, o: { archive?: boolean; followLink?: boolean } = {}): Promise<FilesRead> {
    const q = filesQuery(path, { follow_link: o.followLink ? "true" : undefined });
    const response = await retryFrozen(() =>
      this.transport.request("GET", `/sandboxes/${seg(sandbox)}/files${q}`, undefined, { accept: o.archive ? TAR_TYPE : "application/octet-stream" }),
    );
    try {
      return { info: fileStatHeader(response.headers[FILE_STAT_HEADER.toLowerCase()]), response };
    } catch (err) {
      response.body.destroy();
      throw err;
    }
  }

  /**
   * Writes body at path in a sandbox: one file's bytes, replaced whole
   * (nothing is written unless all of it arrives), or with `archive` a tar
   * unpacked into the directory path. Bytes go with Content-Length, a stream
   * chunked as it is read. Whole bytes are sent again while the sandbox is
   * frozen by a fork; a stream cannot be, and fails with `sandbox_frozen`.
   */
  async writeFiles(
    sandbox: string,
    path: string,
    body: Uint8Array | AsyncIterable<Uint8Array | string> | Iterable<Uint8Array | string>,
    o: WriteFileOptions & { archive?: boolean } = {},
  ): Promise<WriteResult> {
    const { archive, ...file } = o;
    const params = writeFileParams(file);
    if (archive && Object.keys(params).some((k) => k !== "parents")) {
      throw new ShardError("invalid_argument", "mode, uid, gid and mtime are a file's: a tar's entries carry their own");
    }
    if (archive) delete params.parents; // an archive's directory is made with its parents anyway
    const url = `/sandboxes/${seg(sandbox)}/files${filesQuery(path, params)}`;
    const contentType = archive ? TAR_TYPE : "application/octet-stream";
    const send = async (upload: Upload) => {
      const { body: res } = await this.transport.request("PUT", url, undefined, { upload, accept: "application/json" });
      return parseJson<WriteResult>(await readBody(this.transport, res));
    };
    if (body instanceof Uint8Array) return retryFrozen(() => send({ contentType, data: body }));
    return send({ contentType, stream: body });
  }

  // API keys

  /**
   * Makes an API key (`token:write`); its `key` is shown this once. It acts
   * in `req.project` (default: the client's project); `"*"` makes a key of
   * every project, which only such a key (or the socket) may make.
   */
  createToken(req: TokenRequest): Promise<TokenCreated> {
    return this.transport.json("POST", "/tokens", req);
  }

  /** The API keys the client's key may see (`token:read`): its project's, or all for a key of every project. */
  async listTokens(): Promise<Token[]> {
    const out = await this.transport.json<{ tokens: Token[] }>("GET", "/tokens");
    return out?.tokens ?? [];
  }

  /** Revokes an API key by id or name (`token:write`). */
  async revokeToken(idOrName: string): Promise<void> {
    await this.transport.json("DELETE", `/tokens/${seg(idOrName)}`);
  }

  /** The key this client sends: its name, project and scopes (any valid key may ask). */
  whoami(): Promise<Whoami> {
    return this.transport.json("GET", "/whoami");
  }

  // Projects and their quotas

  /**
   * The projects that hold anything, by name, each with its counts, its
   * quota and its use against it (`sandbox:read`): every project for a key
   * of every project (or the socket), the key's own for a project's key.
   */
  async listProjects(): Promise<Project[]> {
    const out = await this.transport.json<{ projects: Project[] }>("GET", "/projects");
    return out?.projects ?? [];
  }

  /**
   * Replaces project `name`'s quota (a field left out, or 0, has no bound;
   * `{}` removes every bound) and answers the project with its quota and
   * use. Only a key of every project with the scope `*` (or the socket) may:
   * else 403 `missing_scope` or `wrong_project`. What the project already
   * holds past a lowered bound stays; what would pass it is refused from
   * then on with 403 `quota_exceeded`.
   */
  setProjectQuota(name: string, quota: ProjectQuota): Promise<Project> {
    return this.transport.json("PUT", `/projects/${seg(name)}/quota`, quota ?? {});
  }
}
