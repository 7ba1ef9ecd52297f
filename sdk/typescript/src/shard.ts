// Shard and Sandbox: the SDK's direct form, one method per API verb
// (seed 001: create, exec with an argv, fork, remove).

import { ShardApi, forkRequest, type DiffOptions, type ForkOptions, type ListOptions, type TreeOptions } from "./api.js";
import { ShardError } from "./errors.js";
import { ExecRun, type ExecOptions, type WritableLike } from "./exec.js";
import { SandboxFiles } from "./files.js";
import { toCpu, toMemory } from "./quantity.js";
import type { ConnectionOptions } from "./transport.js";
import type { Checkpoint, CreateRequest, Diff, EnvVars, Project, ProjectQuota, Provider, ReappliedChange, ReplayedExec, SandboxInfo, TreeNode, Whoami } from "./types.js";

/** Options of `new Shard()`; each falls back to the environment. */
export interface ShardOptions extends ConnectionOptions {}

/** What `shard.create` takes. */
export interface CreateOptions {
  /** The image, e.g. "python:3.12-slim". */
  image: string;
  /** A unique name; default: the sandbox's id. */
  name?: string;
  /** Memory bound in MiB (default 512). */
  memoryMiB?: number;
  /** Memory bound as a quantity instead: "512MiB", "1Gi", or bytes. */
  memory?: string | number;
  /** CPUs: 1, 0.5, "500m". Default 1. */
  cpu?: number | string;
  /** Writable disk: "10GiB", "10Gi", or bytes. Default 10GiB. */
  disk?: string | number;
  /** Most processes at once (default 4096). */
  pids?: number;
  /** Added to the image's environment. */
  env?: EnvVars;
  /** gvisor (default on most servers), runc, ... */
  provider?: Provider | string;
  /** Start from a snapshot's files (id or name) instead of the image's. */
  fromSnapshot?: string;
}

/** Options of `Sandbox.exec` (the Shard form). */
export interface SandboxExecOptions extends ExecOptions {
  /** Also stream stdout here as it arrives. */
  stdout?: WritableLike;
  /** Also stream stderr here as it arrives. */
  stderr?: WritableLike;
}

export function createRequest(o: CreateOptions): CreateRequest {
  const req: CreateRequest = {};
  if (o.image !== undefined) req.image = o.image;
  if (o.name !== undefined) req.name = o.name;
  if (o.memoryMiB !== undefined) req.memory_mib = o.memoryMiB;
  if (o.memory !== undefined) req.memory = toMemory(o.memory);
  if (o.cpu !== undefined) req.cpu = typeof o.cpu === "number" ? o.cpu : toCpu(o.cpu);
  if (o.disk !== undefined) req.disk = toMemory(o.disk, "disk");
  if (o.pids !== undefined) req.pids = o.pids;
  if (o.env !== undefined) req.env = o.env;
  if (o.provider !== undefined) req.provider = o.provider;
  if (o.fromSnapshot !== undefined) req.from_snapshot = o.fromSnapshot;
  return req;
}

/**
 * A client of one shard server, reached at options.remote or $SHARD_REMOTE
 * (default: its Unix socket, /run/shard/shard.sock) with options.apiKey or
 * $SHARD_API_KEY.
 * Call close() when done (idempotent): it closes keep-alive connections.
 */
export class Shard {
  /** The typed REST calls underneath, for what Shard does not cover. */
  readonly api: ShardApi;

  constructor(options: ShardOptions = {}) {
    this.api = new ShardApi(options);
  }

  /** The base URL requests go to. */
  get remote(): string {
    return this.api.transport.base;
  }

  /** The project requests name (options.project or $SHARD_PROJECT); "" when none: the key's own. */
  get project(): string {
    return this.api.transport.project;
  }

  /** Creates and starts a sandbox. */
  async create(options: CreateOptions): Promise<Sandbox> {
    return new Sandbox(this, await this.api.createSandbox(createRequest(options)));
  }

  /** A sandbox by id or name (ShardError `sandbox_not_found`, status 404, if there is none). */
  async get(idOrName: string): Promise<Sandbox> {
    return new Sandbox(this, await this.api.getSandbox(idOrName));
  }

  /**
   * Every sandbox of the client's project; `list({ allProjects: true })`:
   * every project's (a key of every project only, else 403 `wrong_project`).
   */
  async list(options: ListOptions = {}): Promise<Sandbox[]> {
    return (await this.api.listSandboxes(options)).map((info) => new Sandbox(this, info));
  }

  /** A new sandbox from a checkpoint (id or object), with a clean exec history: nothing is replayed. */
  async restoreCheckpoint(checkpoint: string | Checkpoint, options: { name?: string } = {}): Promise<Sandbox> {
    const id = typeof checkpoint === "string" ? checkpoint : checkpoint.id;
    return new Sandbox(this, await this.api.restoreCheckpoint(id, options.name ? { name: options.name } : {}));
  }

  /** restoreCheckpoint by the CLI verb's name (`shard restore`): the same call. */
  restore(checkpoint: string | Checkpoint, options: { name?: string } = {}): Promise<Sandbox> {
    return this.restoreCheckpoint(checkpoint, options);
  }

  /** restoreCheckpoint by the product spec's name: the same call. */
  restoreSnapshot(checkpoint: string | Checkpoint, options: { name?: string } = {}): Promise<Sandbox> {
    return this.restoreCheckpoint(checkpoint, options);
  }

  /** Recreates a sandbox from a ledger session, replaying the execs after its latest checkpoint. */
  async resume(session: string | Sandbox, options: { name?: string } = {}): Promise<Sandbox> {
    const name = typeof session === "string" ? session : session.session;
    const out = await this.api.resumeSession(name, options.name ? { name: options.name } : {});
    const sb = new Sandbox(this, out.sandbox);
    sb.replayed = out.replayed ?? [];
    sb.reapplied = out.reapplied ?? [];
    return sb;
  }

  /**
   * The files of a sandbox by id or name, without looking it up first
   * (`sandbox.files` is the same for a Sandbox in hand).
   */
  files(idOrName: string): SandboxFiles {
    return new SandboxFiles(this.api, idOrName);
  }

  /**
   * The fork tree: every lineage of the project, oldest first; with a
   * sandbox (id, name or Sandbox), the one lineage it is in (one root). Each
   * node is a sandbox, a checkpoint its forks and restores came from, a
   * snapshot or an environment, with what came from it in `children`; a
   * removed sandbox stays while something that exists came from it (with
   * `all`, always).
   */
  tree(sandbox?: string | Sandbox, options: TreeOptions = {}): Promise<TreeNode[]> {
    return this.api.tree(typeof sandbox === "string" ? sandbox : sandbox?.id, options);
  }

  /**
   * What changed in a sandbox's files (id or name): from options.against (a
   * sandbox of its image) to it, or, without, since it started. `sandbox.diff`
   * is the same for a Sandbox in hand.
   */
  diff(idOrName: string, options: DiffOptions = {}): Promise<Diff> {
    return this.api.diff(idOrName, options);
  }

  /**
   * Who the client's key is: its name, project, scopes and whether it is of
   * every project (`all_projects`). Any valid key may ask, whatever its
   * scopes; over the Unix socket it is "admin", of every project, with "*".
   */
  whoami(): Promise<Whoami> {
    return this.api.whoami();
  }

  /**
   * The projects the client's key may see (every project for a key of every
   * project, else its own), each with its counts, its `quota` and its `use`
   * against it. The same as `shard.api.listProjects()`.
   */
  projects(): Promise<Project[]> {
    return this.api.listProjects();
  }

  /**
   * Replaces a project's quota: `{ max_sandboxes: 10, max_memory_bytes: 8 * 2 ** 30 }`
   * (a field left out, or 0, has no bound; `{}` removes every bound), and
   * answers the project with its new quota and its use. Only a key of every
   * project with the scope `*` (or the socket) may. Past a bound, what would
   * pass it (a create, fork, restore, resume or start; a checkpoint, snapshot
   * or environment for saved bytes; anything that adds to the ledger for
   * ledger bytes) rejects with ShardError `quota_exceeded` (403).
   */
  setProjectQuota(name: string, quota: ProjectQuota): Promise<Project> {
    return this.api.setProjectQuota(name, quota);
  }

  /** Closes keep-alive connections. Idempotent; later calls fail with `closed`. */
  close(): void {
    this.api.close();
  }

  /** `using shard = new Shard()` support. */
  [Symbol.dispose](): void {
    this.close();
  }
}

/** One sandbox, as `Shard` hands it out. */
export class Sandbox {
  /** The API's view of it, as of the last call that returned it (see refresh). */
  info: SandboxInfo;
  /** For a sandbox made by resume: the execs that were replayed. */
  replayed?: ReplayedExec[];
  /** For a sandbox made by resume: the grant and policy changes made again. */
  reapplied?: ReappliedChange[];
  /** Its files: read, write (whole or streamed), archives, list, stat, remove. */
  readonly files: SandboxFiles;
  private readonly shard: Shard;

  constructor(shard: Shard, info: SandboxInfo) {
    this.shard = shard;
    this.info = info;
    this.files = new SandboxFiles(shard.api, info.id);
  }

  get id(): string {
    return this.info.id;
  }

  get name(): string {
    return this.info.name;
  }

  /** Its ledger session (what resume takes). */
  get session(): string {
    return this.info.session;
  }

  get state(): string {
    return this.info.state;
  }

  /**
   * Runs argv (no shell: use ["sh", "-c", "..."] for one). Await it for
   * `{ stdout, stderr, exitCode }`; a non-zero exit code does not reject.
   * `.pipe(out[, err])` streams the output as it comes.
   */
  exec(argv: string[], options: SandboxExecOptions = {}): ExecRun {
    const { stdout, stderr, ...opts } = options;
    const run = new ExecRun(this.shard.api, this.id, argv, opts, false);
    if (stdout || stderr) run.pipe(stdout ?? devNull, stderr ?? devNull);
    return run;
  }

  /**
   * Copies this running sandbox (files, memory, processes) into a new one.
   * The executables in its /etc/shard/on-fork.d run in the fork before it is
   * answered: a failing one rejects with ShardError `fork_hook_failed`
   * (422, and no fork is left) unless `hookErrors: "ignore"`.
   */
  async fork(options: ForkOptions = {}): Promise<Sandbox> {
    const req = forkRequest(options);
    return new Sandbox(this.shard, await this.shard.api.forkSandbox(this.id, req));
  }

  /** The fork tree it is in: its lineage's root, with everything that came from it. */
  async tree(options: TreeOptions = {}): Promise<TreeNode> {
    const roots = await this.shard.api.tree(this.id, options);
    if (roots.length !== 1) throw new ShardError("bad_response", `the server answered ${roots.length} roots for the tree of sandbox ${this.name}, not one`);
    return roots[0]!;
  }

  /**
   * What changed in its files: since it started (the checkpoint it was
   * forked or restored from, its snapshot, or its image), or from
   * options.against (another sandbox of its image) to it: what it has that
   * the other has not is "added".
   */
  diff(options: { against?: string | Sandbox; patch?: boolean } = {}): Promise<Diff> {
    const o: DiffOptions = {};
    if (options.against !== undefined) o.against = typeof options.against === "string" ? options.against : options.against.id;
    if (options.patch) o.patch = true;
    return this.shard.api.diff(this.id, o);
  }

  /** Saves its memory, processes and files without stopping it. */
  checkpoint(options: { tag?: string } = {}): Promise<Checkpoint> {
    return this.shard.api.checkpoint(this.id, options.tag);
  }

  /** The checkpoints in its ledger session (its own and its forks'), oldest first. */
  checkpoints(): Promise<Checkpoint[]> {
    return this.shard.api.listCheckpoints(this.id);
  }

  /** Removes it; a running one needs { force: true }. */
  async remove(options: { force?: boolean } = {}): Promise<void> {
    await this.shard.api.removeSandbox(this.id, options.force ?? false);
  }

  /** Stops its processes; its files stay. */
  async stop(): Promise<Sandbox> {
    this.info = await this.shard.api.stopSandbox(this.id);
    return this;
  }

  /** Boots it again after a stop. */
  async start(): Promise<Sandbox> {
    this.info = await this.shard.api.startSandbox(this.id);
    return this;
  }

  /** Reloads info from the server. */
  async refresh(): Promise<Sandbox> {
    this.info = await this.shard.api.getSandbox(this.id);
    return this;
  }
}

const devNull: WritableLike = { write: () => true };
