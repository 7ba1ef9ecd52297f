// The binary exec stream (docs/exec-stream.md): a frame is one type byte, a
// 4-byte big-endian payload length, then the payload. The server answers an
// exec with frames when asked (Accept: application/vnd.shard.stream), and
// takes a framed request body (stdin streamed, signals) with that
// Content-Type.

import { ShardError } from "./errors.js";

/** The media type of the binary exec stream, both ways. */
export const STREAM_TYPE = "application/vnd.shard.stream";

/** The largest payload of a server frame. */
export const MAX_FRAME = 4 << 20;

/** The largest payload of a client frame (a bigger one ends the stream). */
export const MAX_CLIENT_FRAME = 1 << 20;

/** How much stdin one `I` frame carries. */
export const STDIN_CHUNK = 256 << 10;

/** Frame types. */
export const FRAME = {
  /** client: the JSON ExecRequest, without stdin; the first frame */
  request: 0x51, // 'Q'
  /** client: stdin bytes; an empty payload closes stdin */
  stdin: 0x49, // 'I'
  /** client: JSON {"signal": N} */
  signal: 0x4b, // 'K'
  /** client: JSON {"rows": N, "cols": N} */
  resize: 0x52, // 'R'
  /** server: JSON {"pid": N}; the first frame */
  started: 0x53, // 'S'
  /** server: stdout bytes */
  stdout: 0x4f, // 'O'
  /** server: stderr bytes */
  stderr: 0x45, // 'E'
  /** server: JSON exit; the last frame */
  exit: 0x58, // 'X'
  /** server: JSON {code, message}: the stream lost the sandbox; the last frame */
  failure: 0x46, // 'F'
} as const;

/** One frame: its type byte and payload. */
export interface Frame {
  type: number;
  payload: Buffer;
}

/** Encodes one frame. */
export function encodeFrame(type: number, payload: Uint8Array | string = Buffer.alloc(0)): Buffer {
  const p = typeof payload === "string" ? Buffer.from(payload, "utf8") : payload;
  const out = Buffer.allocUnsafe(5 + p.length);
  out[0] = type;
  out.writeUInt32BE(p.length, 1);
  out.set(p, 5);
  return out;
}

/**
 * Cuts a byte stream into frames, whatever the chunks it comes in: a frame
 * (or its 5-byte header) may be split over any number of chunks, and one
 * chunk may hold many frames.
 */
export class FrameDecoder {
  private bufs: Buffer[] = [];
  private len = 0;

  constructor(private readonly max = MAX_FRAME) {}

  /** Bytes held that do not make a whole frame yet. */
  get pending(): number {
    return this.len;
  }

  /** Adds a chunk; returns the frames it completes, in order. */
  push(chunk: Buffer): Frame[] {
    if (chunk.length) {
      this.bufs.push(chunk);
      this.len += chunk.length;
    }
    const out: Frame[] = [];
    while (this.len >= 5) {
      const head = this.peek5();
      const n = head.readUInt32BE(1);
      if (n > this.max) {
        throw new ShardError("bad_response", `exec stream: a frame of ${n} bytes (type 0x${head[0]!.toString(16)}), more than the ${this.max} allowed`, 502);
      }
      if (this.len < 5 + n) break;
      const all = this.take(5 + n);
      out.push({ type: all[0]!, payload: all.subarray(5) });
    }
    return out;
  }

  private peek5(): Buffer {
    const first = this.bufs[0]!;
    if (first.length >= 5) return first;
    // The header is split over chunks: join just enough of them.
    const parts: Buffer[] = [];
    let have = 0;
    for (const b of this.bufs) {
      parts.push(b);
      have += b.length;
      if (have >= 5) break;
    }
    const joined = Buffer.concat(parts);
    this.bufs.splice(0, parts.length, joined);
    return joined;
  }

  private take(n: number): Buffer {
    this.len -= n;
    const first = this.bufs[0]!;
    if (first.length >= n) {
      if (first.length === n) this.bufs.shift();
      else this.bufs[0] = first.subarray(n);
      return first.subarray(0, n);
    }
    const out = Buffer.allocUnsafe(n);
    let off = 0;
    while (off < n) {
      const b = this.bufs[0]!;
      const k = Math.min(b.length, n - off);
      b.copy(out, off, 0, k);
      off += k;
      if (k === b.length) this.bufs.shift();
      else this.bufs[0] = b.subarray(k);
    }
    return out;
  }
}
