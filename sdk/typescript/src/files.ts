// SandboxFiles: a sandbox's files, in and out (`sandbox.files`): whole
// files as bytes or text, streams both ways (never held whole in memory),
// tars of directories, stat, list and remove. Running and stopped
// sandboxes alike (GET/PUT/DELETE /v0/sandboxes/{id}/files...).

import type * as http from "node:http";
import { Readable } from "node:stream";
import { ShardError } from "./errors.js";
import type { ShardApi, WriteFileOptions } from "./api.js";
import type { FileInfo, FileList, WriteResult } from "./types.js";

/**
 * What a streamed write takes: a Node Readable (`fs.createReadStream(...)`),
 * a web ReadableStream, or any AsyncIterable or Iterable of Uint8Array (or
 * string, sent as UTF-8) chunks. It is sent as it is read, chunked.
 */
export type WriteSource = Readable | AsyncIterable<Uint8Array | string> | Iterable<Uint8Array | string>;

/**
 * A read of a sandbox's files, as it arrives: a Node Readable of Buffers
 * (pipe it, `for await` it, or `Readable.toWeb(stream)` for a web
 * ReadableStream). `info` describes what is read. A read that breaks off
 * before its end — fewer bytes than the file's length, or an archive cut
 * short — ends in an 'error' (ShardError `stream_ended`, or `closed`),
 * never in a clean end. Destroy it to stop early.
 */
export class FileReadStream extends Readable {
  /** What is read (for an archive: the path archived). */
  readonly info: FileInfo;
  /** The bytes the server sends: a file's length; undefined for an archive (a tar has none). */
  readonly length?: number;
  private got = 0;
  private readonly body: http.IncomingMessage;
  private readonly it: AsyncIterator<Buffer>;
  private readonly what: string;
  private readonly isClosed: () => boolean;
  private ended = false;

  /** @internal Made by SandboxFiles. */
  constructor(info: FileInfo, body: http.IncomingMessage, what: string, isClosed: () => boolean) {
    super({ highWaterMark: 1 << 20 });
    this.info = info;
    this.body = body;
    this.what = what;
    this.isClosed = isClosed;
    const len = body.headers["content-length"];
    if (len !== undefined && /^\d+$/.test(len)) this.length = Number(len);
    this.it = body[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  }

  /** Bytes read so far. */
  get bytesRead(): number {
    return this.got;
  }

  override _read(): void {
    this.it.next().then(
      (r) => {
        if (r.done) {
          if (this.length !== undefined && this.got < this.length) {
            this.destroy(this.broken(new Error("the connection ended")));
            return;
          }
          this.ended = true;
          this.push(null);
          return;
        }
        const chunk = typeof r.value === "string" ? Buffer.from(r.value) : r.value;
        this.got += chunk.length;
        this.push(chunk);
      },
      (err: unknown) => this.destroy(this.broken(err)),
    );
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    // Left before its end: the connection goes (it cannot be reused).
    if (!this.ended && !this.body.complete) this.body.destroy();
    cb(err);
  }

  private broken(err: unknown): ShardError {
    if (err instanceof ShardError) return err;
    const of = this.length !== undefined ? ` of ${this.length}` : "";
    const why = (err as Error)?.message ?? String(err);
    if (this.isClosed()) return new ShardError("closed", `the shard client was closed while ${this.what} was read (${this.got}${of} bytes)`, 0, { cause: err });
    return new ShardError("stream_ended", `${this.what} broke off after ${this.got}${of} bytes (${why}): what was read is not whole`, 502, { cause: err });
  }
}

/** Reads a FileReadStream to its end, into one Buffer. */
async function collect(s: FileReadStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of s) chunks.push(c as Buffer);
  return chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
}

function isStream(x: unknown): x is WriteSource {
  return x != null && typeof x === "object" && (Symbol.asyncIterator in x || Symbol.iterator in x);
}

/**
 * The files of one sandbox (`sandbox.files`, `handle.files`, or
 * `shard.files(idOrName)`): running or stopped, the paths resolved inside
 * the sandbox's own root. Errors are ShardErrors with the API's codes:
 * `file_not_found` (404), `is_a_directory`, `not_a_directory`,
 * `not_a_regular_file`, `invalid_path`, `unsafe_archive`, `short_body`
 * (400), `directory_not_empty`, `permission_denied`, `sandbox_busy` (409),
 * `disk_full` (507), ...
 */
export class SandboxFiles {
  private readonly api: ShardApi;
  /** The sandbox (id or name) these files are of. */
  readonly sandbox: string;

  /** @internal Use `sandbox.files` or `shard.files(idOrName)`. */
  constructor(api: ShardApi, sandbox: string) {
    this.api = api;
    this.sandbox = sandbox;
  }

  /** The bytes of the file at path (a symlink is followed, inside the sandbox). Buffers it whole: readStream does not. */
  async read(path: string): Promise<Buffer> {
    return collect(await this.readStream(path));
  }

  /** The file at path, decoded as UTF-8. */
  async readText(path: string): Promise<string> {
    return (await this.read(path)).toString("utf8");
  }

  /**
   * The bytes of the file at path, streamed as the sandbox reads them.
   * Resolves once the server has found the file (errors such as
   * `file_not_found` reject here); the stream's `info` describes it.
   */
  async readStream(path: string): Promise<FileReadStream> {
    const { info, response } = await this.api.readFiles(this.sandbox, path);
    return new FileReadStream(info, response.body, `the read of ${path} in sandbox ${this.sandbox}`, () => this.api.transport.isClosed);
  }

  /**
   * A tar of path, streamed: a directory with all it holds (or one file),
   * its entries named from path's last element; symlinks as symlinks
   * (`followLink`: a symlink at path is archived as what it names),
   * numeric owners. The tar ends cleanly only when it is whole.
   */
  async readArchive(path: string, options: { followLink?: boolean } = {}): Promise<FileReadStream> {
    const { info, response } = await this.api.readFiles(this.sandbox, path, { archive: true, followLink: options.followLink ?? false });
    return new FileReadStream(info, response.body, `the archive of ${path} in sandbox ${this.sandbox}`, () => this.api.transport.isClosed);
  }

  /**
   * Writes data (a string, as UTF-8, or bytes) as the file at path,
   * replacing it whole: a reader never sees half of it. The replaced file's
   * mode and owner stay unless options say otherwise (a new file: 0o644,
   * root's); its parent directory must exist unless `parents`.
   */
  write(path: string, data: string | Uint8Array, options: WriteFileOptions = {}): Promise<WriteResult> {
    if (typeof data === "string") data = Buffer.from(data, "utf8");
    if (!(data instanceof Uint8Array)) {
      return Promise.reject(new ShardError("invalid_argument", "write takes a string or a Uint8Array: use writeStream for a stream"));
    }
    return this.api.writeFiles(this.sandbox, path, data, options);
  }

  /**
   * Writes what source gives as the file at path, sent as it is read
   * (chunked; never held whole in memory), replacing it whole once all of
   * it arrived: a source that fails (ShardError `source_failed`) or a
   * connection that breaks writes nothing. Options as write's.
   */
  writeStream(path: string, source: WriteSource, options: WriteFileOptions = {}): Promise<WriteResult> {
    if (typeof source === "string" || source instanceof Uint8Array) return this.write(path, source, options);
    if (!isStream(source)) {
      return Promise.reject(new ShardError("invalid_argument", "writeStream takes a Readable, a ReadableStream or an (Async)Iterable of Uint8Array"));
    }
    return this.api.writeFiles(this.sandbox, path, source, options);
  }

  /**
   * Unpacks a tar (bytes, or a stream as writeStream takes) into the
   * directory dir (made, with its parents, if missing). Entries keep their
   * owner, mode and times; one that would land outside dir is refused
   * (`unsafe_archive`, the entries before it stay); device nodes are
   * skipped and setuid bits removed, each said in the result's `notes`.
   */
  writeArchive(dir: string, source: Uint8Array | WriteSource): Promise<WriteResult> {
    if (!(source instanceof Uint8Array) && !isStream(source)) {
      return Promise.reject(new ShardError("invalid_argument", "writeArchive takes a Uint8Array, a Readable, a ReadableStream or an (Async)Iterable of Uint8Array"));
    }
    return this.api.writeFiles(this.sandbox, dir, source, { archive: true });
  }

  /** The entries of the directory path (a symlink to one is followed), sorted by name: at most `limit`, `truncated` when there were more. */
  list(path: string, options: { limit?: number } = {}): Promise<FileList> {
    return this.api.listFiles(this.sandbox, path, options);
  }

  /** Describes path: a symlink itself, or with `followLink` what it names. */
  stat(path: string, options: { followLink?: boolean } = {}): Promise<FileInfo> {
    return this.api.statFile(this.sandbox, path, options);
  }

  /** Whether anything is at path (a dangling symlink counts). */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (err) {
      if (err instanceof ShardError && (err.code === "file_not_found" || err.code === "not_a_directory")) return false;
      throw err;
    }
  }

  /** Removes path (a symlink itself, not what it names); a directory that holds anything only with `recursive`. Resolves with what was removed. */
  remove(path: string, options: { recursive?: boolean } = {}): Promise<FileInfo> {
    return this.api.removeFile(this.sandbox, path, options);
  }
}
