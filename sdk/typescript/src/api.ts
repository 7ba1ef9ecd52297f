// ShardApi: one typed method per REST call the SDK makes. Shard and
// SandboxClient are built on it; it is exported for what they do not cover.

import { ShardError } from "./errors.js";
import { FRAME, STREAM_TYPE, encodeFrame } from "./frames.js";
import { Transport, seg, type ConnectionOptions, type RawResponse } from "./transport.js";
import type {
  Checkpoint,
  CheckpointRequest,
  CreateRequest,
  EnvironmentInfo,
  EnvironmentRequest,
  ExecRequest,
  ForkRequest,
  Grant,
  Policy,
  RestoreRequest,
  ResumeRequest,
  ResumeResponse,
  SandboxInfo,
  SecretInfo,
  Session,
  Token,
  TokenCreated,
  TokenRequest,
} from "./types.js";

/** How long calls refused with 409 sandbox_frozen (a fork or checkpoint holds the sandbox) are retried. */
const FROZEN_RETRY_MS = 120_000;

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

  async removeSandbox(idOrName: string, force = false): Promise<void> {
    await this.transport.json("DELETE", `/sandboxes/${seg(idOrName)}?force=${force ? "true" : "false"}`);
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
}
