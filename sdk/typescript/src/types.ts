// Wire types of the shard REST API (/v0), as the server sends them: field
// names are the API's own (snake_case). See GET /v0/openapi.json: every
// interface here is the copy of one of its schemas, and test/wire.test.ts
// checks it against internal/api/openapi.json.

export type Provider = "gvisor" | "runc" | "firecracker" | "vz" | "sysbox";

export type SandboxState =
  | "creating"
  | "running"
  | "freezing"
  | "stopping"
  | "stopped"
  | "starting"
  | "removing"
  | "failed"
  /** In a cluster: its node's lease expired (listed, not removed). */
  | "unreachable";

/** Environment variables: `{"K": "V"}` or `["K=V"]`. */
export type EnvVars = Record<string, string> | string[];

/** A secret given to a sandbox (its name, never its value). */
export interface Grant {
  secret: string;
  env?: string;
  file?: string;
  at?: string;
}

/** A sandbox's egress network policy. */
export interface Policy {
  deny_all?: boolean;
  allow?: string[];
  deny?: string[];
}

/** What a sandbox was made from, named as it was then (it may have been removed since). */
export interface Origin {
  kind: "image" | "snapshot" | "environment" | "fork" | "checkpoint" | "session" | string;
  /** The image, snapshot, environment, forked sandbox or session; a checkpoint's tag. */
  name?: string;
  /** The snapshot's, forked sandbox's or checkpoint's id. */
  id?: string;
  /** The checkpoint a fork, an environment's sandbox or a resume started from. */
  checkpoint?: string;
}

/** A sandbox as the API shows it. */
export interface SandboxInfo {
  id: string;
  /** Unique in its project. */
  name: string;
  /** The project it belongs to (see ConnectionOptions.project). */
  project: string;
  image: string;
  image_digest: string;
  provider: Provider | string;
  state: SandboxState | string;
  memory_bytes: number;
  memory_mib: number;
  cpu: number;
  disk_bytes: number;
  pids_limit: number;
  env: string[];
  ip?: string;
  oom_kills: number;
  error?: string;
  /** The ledger session its events are recorded under (what resume takes). */
  session: string;
  /** The sandbox it was forked or restored from; it may have been removed since: `origin` names it. */
  parent_id?: string;
  /** What it was made from; absent for a sandbox made by an older server. */
  origin?: Origin;
  grants: Grant[];
  policy?: Policy;
  /** In a cluster, the node it runs on. */
  node?: string;
  created_at: string;
  started_at?: string;
  stopped_at?: string;
}

/** The body of POST /v0/sandboxes. */
export interface CreateRequest {
  image?: string;
  name?: string;
  memory?: string | number;
  memory_mib?: number;
  cpu?: string | number;
  disk?: string | number;
  pids?: number;
  env?: EnvVars;
  provider?: Provider | string;
  from_snapshot?: string;
  environment?: string;
  /** In a cluster, the node to make it on (default: placement's choice). */
  node?: string;
}

/** The body of POST /v0/sandboxes/{id}/exec. */
export interface ExecRequest {
  argv: string[];
  env?: EnvVars;
  workdir?: string;
  user?: string;
  /** Seconds, or a Go duration such as "30s". */
  timeout?: number | string;
  /** base64 of all of stdin. */
  stdin?: string;
  /** A terminal; its size is rows × cols (resize frames change it). */
  tty?: boolean;
  rows?: number;
  cols?: number;
}

/** One line of the exec NDJSON stream. */
export interface ExecEvent {
  type: "started" | "stdout" | "stderr" | "exit" | "error" | string;
  pid?: number;
  data?: string;
  exit_code?: number;
  signal?: number;
  timed_out?: boolean;
  oom_killed?: boolean;
  /** On an exit: why the server ended the command (its sandbox stopped, was removed or died). */
  error?: string;
  /** On an exit: a process the command left behind held its output open; what it writes later is not sent. */
  output_cut?: boolean;
  /** On an error: what ended the stream (sandbox_unreachable, server_stopping). */
  code?: ErrorCode | string;
}

/** The exit frame's payload (binary exec stream): how the command ended. */
export interface ExecExit {
  /** 128+signal when a signal ended it. */
  exit_code: number;
  signal?: number;
  timed_out?: boolean;
  oom_killed?: boolean;
  /** Why the server ended the command, when it did (its sandbox stopped, was removed or died). */
  error?: string;
  /** What went through the command's stdin, stdout and stderr by its exit, as the sandbox counted it. */
  stdin_bytes?: number;
  stdout_bytes?: number;
  stderr_bytes?: number;
  /** A process the command left behind held its output open at its exit: what it wrote after is not sent. */
  output_cut?: boolean;
}

/** The body of POST /v0/sandboxes/{id}/fork. */
export interface ForkRequest {
  name?: string;
  tag?: string;
  /** How long each on-fork hook (/etc/shard/on-fork.d) may run: a Go duration ("30s", the default; at most "10m"). */
  hook_timeout?: string;
  /** "fail" (the default): a failing hook refuses the fork (422 fork_hook_failed); "ignore": the fork is made, the failure is in its ledger. */
  hook_errors?: "fail" | "ignore";
  /** Run the hooks in the source too (SHARD_FORK_ROLE=source), after the forks'. */
  hooks_in_source?: boolean;
  /** Keep the fork's checkpoint until removed by hand; by default it goes once no sandbox's resume starts from it. */
  keep_checkpoint?: boolean;
}

/** A saved instant of a running sandbox: memory, processes and files. */
export interface Checkpoint {
  id: string;
  kind: "checkpoint" | "fork" | "environment" | string;
  tag?: string;
  sandbox_id: string;
  sandbox_name: string;
  session: string;
  seq: number;
  image: string;
  image_digest: string;
  provider: string;
  memory_bytes: number;
  cpu: number;
  disk_bytes: number;
  size: number;
  freeze_ms: number;
  /** How its memory reaches a fork or restore: a copy of the memory file, adopted ("handoff"), or loaded page by page ("pages"). */
  memory?: "handoff" | "pages";
  /** Why "pages", when it is. */
  memory_note?: string;
  /** Removed by the server once no sandbox's resume starts from it (a fork's, made without keep_checkpoint); false: kept until removed by hand. */
  auto_remove: boolean;
  created_at: string;
}

/** The answer to DELETE /v0/sandboxes/{id}. */
export interface SandboxRemoved {
  removed: string;
  /** Checkpoints removed with it: its session's (checkpoints=true), and forks' no sandbox needs any more. */
  checkpoints?: string[];
  /** Their bytes on disk, given back. */
  freed_bytes?: number;
}

/** The body of POST /v0/sandboxes/{id}/checkpoints. */
export interface CheckpointRequest {
  tag?: string;
}

/** The body of POST /v0/checkpoints/{id}/restore. */
export interface RestoreRequest {
  /** The new sandbox's name; default: its id. */
  name?: string;
}

/** The body of POST /v0/ledger/sessions/{name}/resume. */
export interface ResumeRequest {
  /** The new sandbox's name; default: its id. */
  name?: string;
}

/** One exec that resume ran again. */
export interface ReplayedExec {
  argv: string[];
  recorded_exit_code?: number;
  exit_code?: number;
  error?: string;
}

/** One grant or policy change that resume made again. */
export interface ReappliedChange {
  event: "sandbox.secret_granted" | "sandbox.secret_ungranted" | "sandbox.policy_set" | "sandbox.policy_cleared";
  secret?: string;
  /** Why it could not be made again (its secret was removed since, say). */
  error?: string;
}

/** The answer of POST /v0/ledger/sessions/{name}/resume. */
export interface ResumeResponse {
  sandbox: SandboxInfo;
  checkpoint?: string;
  replayed: ReplayedExec[];
  /** Grant and policy changes made again, in ledger order; absent when none. */
  reapplied?: ReappliedChange[];
}

/** A named, set-up-once sandbox state that creates start from warm. */
export interface EnvironmentInfo {
  name: string;
  image: string;
  image_digest: string;
  provider: string;
  memory_bytes: number;
  cpu: number;
  disk_bytes: number;
  env?: string[];
  setup?: string[][];
  fingerprint: string;
  checkpoint: string;
  created_at: string;
  /** In a cluster, on a node holding a copy: the node that built it. */
  origin?: string;
}

/** The body of POST /v0/environments. */
export interface EnvironmentRequest {
  name: string;
  image?: string;
  memory?: string | number;
  memory_mib?: number;
  cpu?: string | number;
  disk?: string | number;
  env?: EnvVars;
  provider?: string;
  setup?: string[][];
  sandbox?: string;
  fingerprint?: string;
}

/** A stored secret's record (never its value). */
export interface SecretInfo {
  name: string;
  created_at: string;
  updated_at: string;
}

/** An API key's record (GET /v0/tokens); never the key itself. */
export interface Token {
  id: string;
  /** Unique in its project. */
  name: string;
  /** The one project the key acts in, or "*" for every project. */
  project: string;
  scopes: string[];
  created_at: string;
}

/** The body of POST /v0/tokens. */
export interface TokenRequest {
  name: string;
  /** At least one, e.g. "sandbox:read", "sandbox:*", "*"; no more than the caller's own. */
  scopes: string[];
  /**
   * The one project the key may act in (default: the project of the request
   * that makes it); "*" makes a key of every project, which only such a key
   * may make (else 403 `wrong_project`).
   */
  project?: string;
}

/** The answer to POST /v0/tokens: `key` is shown this once. */
export interface TokenCreated extends Token {
  key: string;
}

/**
 * The answer to GET /v0/whoami: the key that asked. Any valid key may ask,
 * whatever its scopes; the Unix socket's administrator is "admin", of every
 * project, with "*".
 */
export interface Whoami {
  name: string;
  /** The one project the key acts in, or "*" for every project. */
  project: string;
  /** e.g. "sandbox:read", "sandbox:*", "*". */
  scopes: string[];
  /** Whether the key may act in every project (and name one per client: ConnectionOptions.project). */
  all_projects: boolean;
}

/**
 * What an administrator bounds one project to (PUT
 * /v0/projects/{name}/quota). A field left out, or 0, has no bound.
 */
export interface ProjectQuota {
  /** Sandboxes, whatever their state (forks and sandboxes from environments count). */
  max_sandboxes?: number;
  /** The memory bounds of its running sandboxes and its environments' warm spares, summed. */
  max_memory_bytes?: number;
  /** Their cpu bounds, summed (1000 = one cpu). */
  max_cpu_millis?: number;
  /** The disk bounds of its sandboxes, whatever their state, summed. */
  max_disk_bytes?: number;
  /** What its checkpoints (environments' and forks' among them) and snapshots take on disk. */
  max_saved_bytes?: number;
  /** What its ledger's events take in the database; at it, what adds to the ledger (exec, create, ...) is refused. */
  max_ledger_bytes?: number;
}

/** What a project holds, in its quota's terms. */
export interface ProjectUse {
  sandboxes: number;
  /** Memory bounds of its running sandboxes and warm spares. */
  memory_bytes: number;
  /** Their cpu bounds (1000 = one cpu). */
  cpu_millis: number;
  /** Disk bounds of its sandboxes. */
  disk_bytes: number;
  /** What its checkpoints and snapshots take. */
  saved_bytes: number;
  /** What its ledger's events take. */
  ledger_bytes: number;
}

/** A project (GET /v0/projects): how many objects of each kind it holds, its quota and its use against it. */
export interface Project {
  name: string;
  /** Sandboxes, in every state. */
  sandboxes: number;
  /** Ledger sessions. */
  sessions: number;
  /** Checkpoints, forks' and environments' included. */
  checkpoints: number;
  snapshots: number;
  environments: number;
  secrets: number;
  /** Keys of this project (not keys of every project). */
  tokens: number;
  quota: ProjectQuota;
  use: ProjectUse;
}

/** A ledger session: the durable event log of one sandbox. */
export interface Session {
  name: string;
  sandbox_id: string;
  sandbox_name?: string;
  events: number;
  last_event?: string;
  last_at?: string;
  created_at: string;
}

/**
 * Every code of the server's errors (the enum of `Error.code` in
 * openapi.json; test/wire.test.ts keeps them equal). Codes may be added:
 * a code this list does not have is still a string, to be treated by its
 * HTTP status.
 */
export type ErrorCode =
  | "ambiguous_name"
  | "bad_archive"
  | "bad_node_signature"
  | "body_too_large"
  | "canceled"
  | "checkpoint_exists"
  | "checkpoint_gone"
  | "checkpoint_in_use"
  | "checkpoint_not_found"
  | "cluster_full"
  | "cluster_unavailable"
  | "command_not_found"
  | "conflict"
  | "different_images"
  | "directory_not_empty"
  | "disk_full"
  | "environment_copy"
  | "environment_exists"
  | "environment_not_found"
  | "exec_failed"
  | "failed"
  | "file_not_found"
  | "files_helper_failed"
  | "forbidden"
  | "fork_hook_failed"
  | "freeze_timeout"
  | "grant_failed"
  | "grant_not_found"
  | "image_copy_mismatch"
  | "image_in_use"
  | "image_not_exportable"
  | "image_not_found"
  | "image_shared"
  | "image_too_large"
  | "insufficient_memory"
  | "insufficient_storage"
  | "internal"
  | "invalid_argument"
  | "invalid_image"
  | "invalid_path"
  | "invalid_state"
  | "io_error"
  | "is_a_directory"
  | "missing_scope"
  | "name_taken"
  | "no_addresses"
  | "no_node"
  | "no_project"
  | "node_full"
  | "node_not_found"
  | "node_unreachable"
  | "nodes_only"
  | "not_a_directory"
  | "not_a_regular_file"
  | "not_clustered"
  | "not_found"
  | "path_exists"
  | "path_unsafe"
  | "permission_denied"
  | "policy_failed"
  | "policy_refused"
  | "port_unreachable"
  | "provider_unavailable"
  | "quota_exceeded"
  | "read_only"
  | "registry_denied"
  | "registry_not_allowed"
  | "registry_timeout"
  | "registry_unreachable"
  | "sandbox_busy"
  | "sandbox_frozen"
  | "sandbox_limit"
  | "sandbox_not_found"
  | "sandbox_not_running"
  | "sandbox_running"
  | "sandbox_unreachable"
  | "secret_not_found"
  | "server_stopping"
  | "session_has_checkpoints"
  | "session_in_use"
  | "session_not_found"
  | "session_unusable"
  | "setup_failed"
  | "short_body"
  | "snapshot_gone"
  | "snapshot_not_found"
  | "timeout"
  | "token_not_found"
  | "too_large"
  | "too_many_connections"
  | "too_many_requests"
  | "unauthenticated"
  | "unavailable"
  | "unsafe_archive"
  | "unsupported"
  | "upstream"
  | "wrong_node"
  | "wrong_project";

/** The body of every error answer. */
export interface ApiError {
  code: ErrorCode | string;
  message: string;
}

/** What a file of a sandbox is. */
export type FileType = "file" | "dir" | "symlink" | "fifo" | "socket" | "char" | "block";

/** One file of a sandbox (files API: stat, list, remove, and a read's X-Shard-File-Stat header). */
export interface FileInfo {
  /** Its last path element ("/" for the root). */
  name: string;
  /** Its absolute path in the sandbox. */
  path: string;
  type: FileType | string;
  /** Bytes, for a file (0 for the other types). */
  size: number;
  /** Permission bits with setuid (0o4000), setgid (0o2000) and sticky (0o1000): 420 is 0o644. */
  mode: number;
  uid: number;
  gid: number;
  /** RFC 3339. */
  mtime: string;
  /** A symlink's target, as written. */
  link?: string;
}

/** A directory's entries, sorted by name. */
export interface FileList {
  path: string;
  entries: FileInfo[];
  /** There were more entries than the limit: only that many are listed. */
  truncated: boolean;
}

/** What a write of files did. */
export interface WriteResult {
  /** The path written (cleaned). */
  path: string;
  /** File bytes written. */
  bytes: number;
  /** Files, directories and links made. */
  files: number;
  /** What was sanitised or skipped: a setuid bit removed, a device node left out, ... */
  notes?: string[];
}

/** What a node of the fork tree is. */
export type TreeNodeKind = "sandbox" | "checkpoint" | "snapshot" | "environment";

/** One object of the fork tree (GET /v0/tree), and what came from it. */
export interface TreeNode {
  kind: TreeNodeKind | string;
  /** A sandbox's, checkpoint's or snapshot's id; an environment's name. */
  id: string;
  /** A sandbox's or snapshot's name (a removed sandbox's as it was); a checkpoint's tag. */
  name?: string;
  /** A sandbox's state, or "removed"; "kept" or "removed" for the other kinds. */
  state: SandboxState | "kept" | "removed" | string;
  removed: boolean;
  /** When it was made (RFC 3339); a fork's, when it ran (after its checkpoint). */
  at: string;
  /**
   * How it came from its parent: "fork", "restore", "environment", "resume"
   * or "snapshot" for a sandbox; a checkpoint's kind ("fork", "checkpoint",
   * "environment"). Absent on a root.
   */
  via?: string;
  image?: string;
  provider?: string;
  /** What came from it, oldest first; absent when nothing did. */
  children?: TreeNode[];
  /**
   * Without `all`: the removed sandboxes that came straight from it and have
   * nothing that exists below them, left out of `children` (each without
   * what was below it). Why a kept checkpoint whose forks or restores were
   * all removed is there.
   */
  removed_sandboxes?: TreeNode[];
}

/** The answer of GET /v0/tree and GET /v0/sandboxes/{id}/tree. */
export interface Tree {
  /** Every lineage, oldest first; a sandbox's tree has one root, its lineage's. */
  roots: TreeNode[];
}

/** One side of a diff. */
export interface DiffSide {
  kind: "sandbox" | "checkpoint" | "snapshot" | "image" | string;
  id: string;
  name?: string;
}

/** What differs in a changed path. */
export type ChangeWhat = "content" | "type" | "mode" | "owner" | "target" | "device";

/** One path that differs between the two sides of a diff. */
export interface Change {
  path: string;
  kind: "added" | "removed" | "changed";
  /** What is at the path in `to` (in `from` for a removal). */
  type: FileType | string;
  /** For "changed": what differs (a modification time alone is no change). */
  what?: (ChangeWhat | string)[];
  /** A file's size in `from` (0 if none). */
  size_a: number;
  /** A file's size in `to` (0 if none). */
  size_b: number;
  /** With patch: a unified diff of a regular file's text (or "Binary files ... differ"). */
  patch?: string;
  /** What the server could not tell ("content": the diff's read bound came first); the file may differ there or not. */
  not_compared?: ("content" | string)[];
  /** The path's bytes, base64, when they are not UTF-8 (`path` then has U+FFFD for each byte that is not). */
  path_bytes?: string;
}

/** What changed in a sandbox's files (GET /v0/sandboxes/{id}/diff): from `from` to `to`, the sandbox asked about. */
export interface Diff {
  from: DiffSide;
  to: DiffSide;
  /** In path order; a directory added or removed is followed by what it holds. */
  changes: Change[];
  added: number;
  removed: number;
  changed: number;
  /** More than 100000 changes: only the first are listed. */
  truncated: boolean;
  /** How many of `changed` have `not_compared` content: the diff's read bound came first. */
  not_compared?: number;
}
