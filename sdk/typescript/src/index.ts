// useshards: the TypeScript SDK of shard, the self-hosted sandbox server.
//
//   import { Shard, SandboxClient, ShardError } from "useshards";
//
// Both clients reach the server at options.remote or $SHARD_REMOTE (default:
// its Unix socket, /run/shard/shard.sock) with the API key in
// options.apiKey or $SHARD_API_KEY, sent as `Authorization: Bearer KEY`,
// acting in the project options.project or $SHARD_PROJECT names (header
// `Shard-Project`; none: the key's own project).

export { Shard, Sandbox, createRequest } from "./shard.js";
export type { ShardOptions, CreateOptions, SandboxExecOptions } from "./shard.js";
export { SandboxClient, SandboxHandle, Environment, Credentials, environmentFingerprint } from "./client.js";
export type { SandboxClientOptions, SandboxOptions, EnvironmentOptions, SetupFn, HandleExecOptions } from "./client.js";
export { ExecRun, execRequest, INLINE_STDIN_MAX } from "./exec.js";
export type { ExecOptions, ExecResult, StdinSource, WritableLike } from "./exec.js";
export { FRAME, FrameDecoder, STREAM_TYPE, encodeFrame, MAX_FRAME, MAX_CLIENT_FRAME, STDIN_CHUNK } from "./frames.js";
export type { Frame } from "./frames.js";
export { SandboxFiles, FileReadStream } from "./files.js";
export type { WriteSource } from "./files.js";
export { ShardError, isShardError } from "./errors.js";
export { ShardApi, retryFrozen, forkRequest, TAR_TYPE, FILE_STAT_HEADER, fileStatHeader } from "./api.js";
export type { ListOptions, WriteFileOptions, FilesRead, ForkOptions, ForkHookOptions, TreeOptions, DiffOptions } from "./api.js";
export { walkTree, findNode } from "./lineage.js";
export { Transport, DEFAULT_SOCKET, PROJECT_HEADER, REQUEST_ID_HEADER, resolveConnection, errorFromBody } from "./transport.js";
export type { ConnectionOptions, RawResponse, RequestOptions, Upload } from "./transport.js";
export { toMemory, toCpu, resourcesToRequest } from "./quantity.js";
export type { Resources } from "./quantity.js";
export type * from "./types.js";
