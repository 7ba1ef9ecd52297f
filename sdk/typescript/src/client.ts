// SandboxClient: the handle-based form (seed 000): sandboxes with
// Kubernetes-style resources, shell-string execs that reject on failure and
// pipe live output, fork/checkpoint/resume/restoreCheckpoint, warm
// environments built by a setup callback, credentials, and a bound on how
// many sandboxes are live at once.

import { createHash } from "node:crypto";
import { ShardApi, forkRequest, type DiffOptions, type ForkOptions, type TreeOptions } from "./api.js";
import { ShardError } from "./errors.js";
import { ExecRun, type ExecOptions } from "./exec.js";
import { SandboxFiles } from "./files.js";
import { resourcesToRequest, type Resources } from "./quantity.js";
import type { ConnectionOptions } from "./transport.js";
import type { Checkpoint, CreateRequest, Diff, EnvironmentInfo, EnvVars, Grant, Provider, ReappliedChange, ReplayedExec, ResumeResponse, SandboxInfo, TreeNode, Whoami } from "./types.js";

/** Options of `new SandboxClient()`. */
export interface SandboxClientOptions extends ConnectionOptions {
  /**
   * Most sandboxes this client keeps live at once (forks, resumes and
   * restores count too; each holds one slot until its close()). A call that
   * would make one more waits, first come first served, until a slot is
   * free. Unset (or 0): no bound.
   */
  maxConcurrency?: number;
}

/** What `client.sandbox()` takes. */
export interface SandboxOptions {
  /** The image, e.g. "node:22". */
  image: string;
  /** cpu ("1", "500m"), memory ("512Mi", "1Gi"), disk ("10Gi"). Server defaults: 1 cpu, 512MiB, 10GiB. */
  resources?: Resources;
  /** A unique name; default: the sandbox's id. */
  name?: string;
  /** Environment variables every command in it gets, e.g. { PIP_INDEX_URL: "..." }. */
  env?: EnvVars;
  /** gvisor, runc, ...; default: the server's. */
  provider?: Provider | string;
  /** Most processes at once. */
  pids?: number;
  /** Start from a snapshot's files (id or name) instead of the image's. */
  fromSnapshot?: string;
}

/** How an environment is set up. */
export type SetupFn = (sb: SandboxHandle) => unknown | Promise<unknown>;

/** What `client.environment()` takes. */
export interface EnvironmentOptions {
  image: string;
  resources?: Resources;
  /** Environment variables of the setup sandbox; sandboxes from the environment keep them. */
  env?: EnvVars;
  provider?: Provider | string;
  /**
   * The setup: a callback that gets a fresh sandbox of image/resources and
   * prepares it (`await sb.exec("pip install -q numpy")`); or a list of
   * commands (shell strings or argv lists) the server runs itself.
   */
  setup?: SetupFn | Array<string | string[]>;
}

/** Options of `SandboxHandle.exec`. */
export interface HandleExecOptions extends ExecOptions {}

/** A bound on live sandboxes: FIFO waiters. */
class Slots {
  private used = 0;
  private readonly waiters: { resolve: () => void; reject: (e: unknown) => void }[] = [];
  private closed = false;

  constructor(readonly max: number) {}

  get inUse(): number {
    return this.used;
  }

  get waiting(): number {
    return this.waiters.length;
  }

  /** Resolves with a release function once a slot is free. */
  async acquire(): Promise<() => void> {
    if (this.closed) throw new ShardError("closed", "the sandbox client was closed");
    if (this.max > 0 && (this.used >= this.max || this.waiters.length > 0)) {
      await new Promise<void>((resolve, reject) => this.waiters.push({ resolve, reject }));
    } else {
      this.used++;
    }
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.release();
    };
  }

  private release(): void {
    const next = this.waiters.shift();
    if (next) next.resolve(); // the slot passes straight to the next waiter
    else this.used--;
  }

  close(): void {
    this.closed = true;
    for (const w of this.waiters.splice(0)) w.reject(new ShardError("closed", "the sandbox client was closed while waiting for a slot"));
  }
}

/**
 * The handle-based client. Reaches the server at options.remote or
 * $SHARD_REMOTE (default: its Unix socket, /run/shard/shard.sock) with
 * options.apiKey or $SHARD_API_KEY.
 */
export class SandboxClient {
  /** The typed REST calls underneath. */
  readonly api: ShardApi;
  private readonly slots: Slots;
  private readonly live = new Set<SandboxHandle>();

  constructor(options: SandboxClientOptions = {}) {
    const { maxConcurrency, ...conn } = options;
    if (maxConcurrency !== undefined && (!Number.isInteger(maxConcurrency) || maxConcurrency < 0)) {
      throw new ShardError("invalid_argument", `maxConcurrency must be a whole number ≥ 0, not ${maxConcurrency}`);
    }
    this.api = new ShardApi(conn);
    this.slots = new Slots(maxConcurrency ?? 0);
  }

  /** The bound on live sandboxes (0: none). */
  get maxConcurrency(): number {
    return this.slots.max;
  }

  /** Slots held by live sandboxes of this client (and ones being made). */
  get slotsInUse(): number {
    return this.slots.inUse;
  }

  /** Calls waiting for a slot. */
  get slotsWaiting(): number {
    return this.slots.waiting;
  }

  /** The live handles this client made and has not closed. */
  get sandboxes(): SandboxHandle[] {
    return [...this.live];
  }

  /** @internal Runs make() holding a new slot; the slot passes to the handle it returns. */
  async withSlot(make: (release: () => void) => Promise<SandboxHandle>): Promise<SandboxHandle> {
    const release = await this.slots.acquire();
    try {
      return await make(release);
    } catch (err) {
      release();
      throw err;
    }
  }

  /** @internal */
  adopt(info: SandboxInfo, release: () => void, resumed?: ResumeResponse): SandboxHandle {
    const h = new SandboxHandle(this, info, release, resumed);
    this.live.add(h);
    return h;
  }

  /** @internal */
  forget(h: SandboxHandle): void {
    this.live.delete(h);
  }

  /** Creates and starts a sandbox (waits for a slot under maxConcurrency). */
  async sandbox(options: SandboxOptions): Promise<SandboxHandle> {
    const req = sandboxRequest(options); // bad quantities fail before a slot is taken
    return this.withSlot(async (release) => this.adopt(await this.api.createSandbox(req), release));
  }

  /** A handle on an existing sandbox (id or name); it takes a slot, and its close() removes it. */
  async attach(idOrName: string): Promise<SandboxHandle> {
    return this.withSlot(async (release) => this.adopt(await this.api.getSandbox(idOrName), release));
  }

  /**
   * Recreates a sandbox from a ledger session (a handle's `session`, or the
   * handle itself): from the session's latest checkpoint, then replays the
   * execs recorded after it (`handle.replayed` says how they exited).
   */
  async resume(session: string | SandboxHandle, options: { name?: string } = {}): Promise<SandboxHandle> {
    const name = typeof session === "string" ? session : session.session;
    return this.withSlot(async (release) => {
      const out = await this.api.resumeSession(name, options.name ? { name: options.name } : {});
      return this.adopt(out.sandbox, release, out);
    });
  }

  /** A new sandbox from a checkpoint (id or object), with a clean exec history: nothing is replayed. */
  async restoreCheckpoint(checkpoint: string | Checkpoint, options: { name?: string } = {}): Promise<SandboxHandle> {
    const id = typeof checkpoint === "string" ? checkpoint : checkpoint.id;
    return this.withSlot(async (release) =>
      this.adopt(await this.api.restoreCheckpoint(id, options.name ? { name: options.name } : {}), release),
    );
  }

  /** restoreCheckpoint by the product spec's name: the same call. */
  restoreSnapshot(checkpoint: string | Checkpoint, options: { name?: string } = {}): Promise<SandboxHandle> {
    return this.restoreCheckpoint(checkpoint, options);
  }

  /**
   * A named environment: set up once, then every `env.sandbox()` starts warm
   * from its checkpoint. Nothing happens on the server until the first
   * `env.sandbox()` (or `env.ensure()`).
   */
  environment(name: string, options: EnvironmentOptions): Environment {
    return new Environment(this, name, options);
  }

  /**
   * The files of a sandbox by id or name, without a handle (no slot is
   * taken): `handle.files` is the same for a handle in hand.
   */
  files(idOrName: string): SandboxFiles {
    return new SandboxFiles(this.api, idOrName);
  }

  /**
   * The fork tree: every lineage of the project, oldest first; with a
   * sandbox (id, name or handle), the one lineage it is in (one root). No
   * slot is taken.
   */
  tree(sandbox?: string | SandboxHandle, options: TreeOptions = {}): Promise<TreeNode[]> {
    return this.api.tree(typeof sandbox === "string" ? sandbox : sandbox?.id, options);
  }

  /**
   * What changed in a sandbox's files (id or name): from options.against (a
   * sandbox of its image) to it, or since it started. No slot is taken.
   */
  diff(idOrName: string, options: DiffOptions = {}): Promise<Diff> {
    return this.api.diff(idOrName, options);
  }

  /** Deletes a stored secret (see `SandboxHandle.credentials`); grants of it then give nothing. */
  deleteSecret(name: string): Promise<void> {
    return this.api.removeSecret(name);
  }

  /**
   * Who the client's key is: its name, project, scopes and whether it is of
   * every project (`all_projects`). Any valid key may ask; no slot is taken.
   */
  whoami(): Promise<Whoami> {
    return this.api.whoami();
  }

  /**
   * Closes the client's connections; calls waiting for a slot fail with
   * `closed`. Live sandboxes stay on the server unless removeSandboxes is
   * set, which closes (removes) every handle this client still has open.
   */
  async close(options: { removeSandboxes?: boolean } = {}): Promise<void> {
    this.slots.close();
    if (options.removeSandboxes) await Promise.allSettled([...this.live].map((h) => h.close()));
    this.api.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

function sandboxRequest(o: SandboxOptions): CreateRequest {
  if (!o || typeof o.image !== "string" || !o.image) throw new ShardError("invalid_argument", "sandbox() needs an image");
  const req: CreateRequest = { image: o.image, ...resourcesToRequest(o.resources) };
  if (o.name !== undefined) req.name = o.name;
  if (o.env !== undefined) req.env = o.env;
  if (o.provider !== undefined) req.provider = o.provider;
  if (o.pids !== undefined) req.pids = o.pids;
  if (o.fromSnapshot !== undefined) req.from_snapshot = o.fromSnapshot;
  return req;
}

/** Secrets given to one sandbox, as environment variables or files. */
export class Credentials {
  constructor(private readonly handle: SandboxHandle) {}

  /**
   * Stores value as the server's secret `name` (one per project: it replaces
   * any value stored under that name in the client's project) and grants it to this sandbox: as the
   * environment variable options.env (default: name) of every later exec,
   * or, with options.file, as that file (mode 0400). Forks made afterwards
   * carry the grant.
   */
  async set(name: string, value: string | Uint8Array, options: { env?: string; file?: string } = {}): Promise<void> {
    if (options.env && options.file) {
      throw new ShardError("invalid_argument", "a credential is given as env or as file, not both: call set twice with two names");
    }
    const api = this.handle.client.api;
    await api.setSecret(name, value);
    const g: Grant = { secret: name };
    if (options.file) g.file = options.file;
    else g.env = options.env ?? name;
    this.handle.info = await api.grant(this.handle.id, g);
  }

  /** Takes the secret away from this sandbox (the stored secret and forks' grants stay). */
  async delete(name: string): Promise<void> {
    this.handle.info = await this.handle.client.api.ungrant(this.handle.id, name);
  }

  /** The grants this sandbox has (names, never values). */
  list(): Promise<Grant[]> {
    return this.handle.client.api.listGrants(this.handle.id);
  }
}

/** A live sandbox from a SandboxClient; close() removes it and frees its slot. */
export class SandboxHandle {
  /** The API's view of the sandbox, as of the last call that returned it. */
  info: SandboxInfo;
  /** For a handle made by resume(): the execs that were replayed and how they exited. */
  readonly replayed?: ReplayedExec[];
  /** For a handle made by resume(): the grant and policy changes made again. */
  readonly reapplied?: ReappliedChange[];
  /** Secrets given to this sandbox. */
  readonly credentials: Credentials;
  /** The sandbox's files: read, write (whole or streamed), archives, list, stat, remove. */
  readonly files: SandboxFiles;
  /** @internal */
  readonly client: SandboxClient;
  private readonly release: () => void;
  private closing?: Promise<void>;

  /** @internal Made by SandboxClient. */
  /** resumed: the answer of the resume that made it, if one did. */
  constructor(client: SandboxClient, info: SandboxInfo, release: () => void, resumed?: ResumeResponse) {
    this.client = client;
    this.info = info;
    this.release = release;
    if (resumed) {
      this.replayed = resumed.replayed ?? [];
      this.reapplied = resumed.reapplied ?? [];
    }
    this.credentials = new Credentials(this);
    this.files = new SandboxFiles(client.api, info.id);
  }

  get id(): string {
    return this.info.id;
  }

  get name(): string {
    return this.info.name;
  }

  /** The ledger session of the sandbox: what client.resume() takes. */
  get session(): string {
    return this.info.session;
  }

  /** The sandbox's id. */
  get sandboxId(): string {
    return this.info.id;
  }

  /** Whether close() was called. */
  get closed(): boolean {
    return this.closing !== undefined;
  }

  /**
   * Runs a command: a string goes through `sh -c`, a list is the argv. The
   * returned ExecRun is awaitable (rejects with ShardError `exit_status` on
   * a non-zero exit) and `.pipe(out[, err])` streams output as it comes.
   */
  exec(command: string | string[], options: HandleExecOptions = {}): ExecRun {
    const argv = typeof command === "string" ? ["sh", "-c", command] : command;
    return new ExecRun(this.client.api, this.id, argv, options, true, typeof command === "string" ? command : undefined);
  }

  /**
   * Copies this running sandbox (files, memory, processes) into a new one
   * and returns its handle; this one keeps running. The tag is stored with
   * the fork's checkpoint in this sandbox's ledger (see listCheckpoints).
   * The executables in its /etc/shard/on-fork.d run in the fork before it is
   * answered: a failing one rejects with ShardError `fork_hook_failed` (422;
   * no fork is left) unless `hookErrors: "ignore"`. Takes a slot under
   * maxConcurrency.
   *
   * As seed 000 has it, fork is a checkpoint then a restore: the checkpoint
   * stays listed (and resumable) after the fork and this sandbox are
   * closed, until removed by hand. `keepCheckpoint: false` lets the server
   * remove it once no sandbox resumes from it.
   */
  async fork(tag?: string | ForkOptions): Promise<SandboxHandle> {
    const o = typeof tag === "string" ? { tag } : (tag ?? {});
    const req = forkRequest({ ...o, keepCheckpoint: o.keepCheckpoint ?? true }); // bad options fail before a slot is taken
    return this.client.withSlot(async (release: () => void) =>
      this.client.adopt(await this.client.api.forkSandbox(this.id, req), release),
    );
  }

  /** The fork tree this sandbox is in: its lineage's root, with everything that came from it. */
  async tree(options: TreeOptions = {}): Promise<TreeNode> {
    const roots = await this.client.api.tree(this.id, options);
    if (roots.length !== 1) throw new ShardError("bad_response", `the server answered ${roots.length} roots for the tree of sandbox ${this.name}, not one`);
    return roots[0]!;
  }

  /**
   * What changed in this sandbox's files: since it started (the checkpoint
   * it was forked or restored from, its snapshot, or its image), or from
   * options.against (another sandbox of its image) to this one: what this
   * one has that the other has not is "added".
   */
  diff(options: { against?: string | SandboxHandle; patch?: boolean } = {}): Promise<Diff> {
    const o: DiffOptions = {};
    if (options.against !== undefined) o.against = typeof options.against === "string" ? options.against : options.against.id;
    if (options.patch) o.patch = true;
    return this.client.api.diff(this.id, o);
  }

  /** Saves the sandbox's memory, processes and files (it keeps running). */
  checkpoint(tag?: string): Promise<Checkpoint> {
    return this.client.api.checkpoint(this.id, tag);
  }

  /** The checkpoints in this sandbox's ledger session (its own and its forks'), oldest first. */
  listCheckpoints(): Promise<Checkpoint[]> {
    return this.client.api.listCheckpoints(this.id);
  }

  /** Reloads info from the server. */
  async refresh(): Promise<SandboxHandle> {
    this.info = await this.client.api.getSandbox(this.id);
    return this;
  }

  /** Removes the sandbox (running or not) and frees its slot. Idempotent. */
  close(): Promise<void> {
    if (!this.closing) {
      this.closing = (async () => {
        try {
          await this.client.api.removeSandbox(this.id, true);
        } catch (err) {
          if (!(err instanceof ShardError && err.status === 404)) throw err;
        } finally {
          this.client.forget(this);
          this.release();
        }
      })();
    }
    return this.closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** A named environment of a SandboxClient. */
export class Environment {
  readonly name: string;
  /**
   * Identifies this definition: sha256 of the JSON of image, resources, env,
   * provider and the setup (the callback's source text). A server
   * environment of the same name with another fingerprint is rebuilt.
   */
  readonly fingerprint: string;
  /** The server's record, once ensure() ran. */
  info?: EnvironmentInfo;
  /** Whether the last ensure() built it (false: it was there, unchanged). */
  built?: boolean;
  private readonly client: SandboxClient;
  private readonly options: EnvironmentOptions;
  private ready?: Promise<EnvironmentInfo>;

  constructor(client: SandboxClient, name: string, options: EnvironmentOptions) {
    if (!options || !options.image) throw new ShardError("invalid_argument", `environment ${name} needs an image`);
    this.client = client;
    this.name = name;
    this.options = options;
    this.fingerprint = environmentFingerprint(options);
  }

  /** Builds the environment unless the server has it with the same fingerprint. Runs once per Environment. */
  ensure(): Promise<EnvironmentInfo> {
    if (!this.ready) {
      this.ready = this.build();
      this.ready.catch(() => {
        this.ready = undefined; // let a later call try again
      });
    }
    return this.ready;
  }

  private async build(): Promise<EnvironmentInfo> {
    const api = this.client.api;
    const o = this.options;
    if (Array.isArray(o.setup) || o.setup === undefined) {
      // The server runs the commands itself; it fingerprints them too.
      const setup = (o.setup ?? []).map((c) => (typeof c === "string" ? ["sh", "-c", c] : c));
      const req = { name: this.name, image: o.image, ...resourcesToRequest(o.resources), setup } as Parameters<ShardApi["createEnvironment"]>[0];
      if (o.env !== undefined) req.env = o.env;
      if (o.provider !== undefined) req.provider = o.provider;
      if (setup.length === 0) delete req.setup;
      const { environment, built } = await api.createEnvironment(req);
      this.info = environment;
      this.built = built;
      return environment;
    }
    try {
      const have = await api.getEnvironment(this.name);
      if (have.fingerprint === this.fingerprint) {
        this.info = have;
        this.built = false;
        return have;
      }
    } catch (err) {
      if (!(err instanceof ShardError && err.status === 404)) throw err;
    }
    const sb = await this.client.sandbox({
      image: o.image,
      ...(o.resources ? { resources: o.resources } : {}),
      ...(o.env !== undefined ? { env: o.env } : {}),
      ...(o.provider !== undefined ? { provider: o.provider } : {}),
    });
    try {
      await o.setup(sb);
      const { environment, built } = await api.createEnvironment({ name: this.name, sandbox: sb.id, fingerprint: this.fingerprint });
      this.info = environment;
      this.built = built;
      return environment;
    } finally {
      await sb.close().catch(() => {});
    }
  }

  /**
   * A new sandbox started warm from the environment (built first if need
   * be): memory, processes and files as the setup left them, with the
   * environment's image and bounds. Takes a slot under maxConcurrency.
   */
  async sandbox(options: { name?: string } = {}): Promise<SandboxHandle> {
    await this.ensure();
    const req: CreateRequest = { environment: this.name };
    if (options.name) req.name = options.name;
    try {
      return await this.client.withSlot(async (release: () => void) => this.client.adopt(await this.client.api.createSandbox(req), release));
    } catch (err) {
      // Removed on the server since ensure(): build it again, once.
      if (!(err instanceof ShardError && err.code === "environment_not_found")) throw err;
      this.ready = undefined;
      await this.ensure();
      return this.client.withSlot(async (release: () => void) => this.client.adopt(await this.client.api.createSandbox(req), release));
    }
  }

  /** Deletes the environment on the server (sandboxes started from it keep running). */
  async remove(): Promise<void> {
    this.ready = undefined;
    this.info = undefined;
    try {
      await this.client.api.removeEnvironment(this.name);
    } catch (err) {
      if (!(err instanceof ShardError && err.status === 404)) throw err;
    }
  }
}

/** The fingerprint of an environment definition (see Environment.fingerprint). */
export function environmentFingerprint(o: EnvironmentOptions): string {
  const r = resourcesToRequest(o.resources);
  const def = {
    image: o.image,
    resources: { cpu: r.cpu ?? null, memory: r.memory ?? null, disk: r.disk ?? null },
    env: o.env === undefined ? null : Array.isArray(o.env) ? [...o.env] : Object.entries(o.env).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)),
    provider: o.provider ?? null,
    setup: typeof o.setup === "function" ? o.setup.toString() : (o.setup ?? null),
  };
  return createHash("sha256").update(JSON.stringify(def)).digest("hex");
}
