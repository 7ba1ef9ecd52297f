// A small tar writer and reader for the tests (the SDK moves tars as
// bytes; it does not make or read them): ustar headers, plus the PAX and
// GNU long-name records a reader meets in Go's archives.

export interface TarEntry {
  name: string;
  type: "file" | "dir" | "symlink" | "hardlink" | "other";
  data?: Buffer;
  mode?: number;
  uid?: number;
  gid?: number;
  mtime?: number; // seconds
  link?: string;
}

const TYPES: Record<string, TarEntry["type"]> = { "0": "file", "\0": "file", "5": "dir", "2": "symlink", "1": "hardlink" };
const FLAGS: Record<TarEntry["type"], string> = { file: "0", dir: "5", symlink: "2", hardlink: "1", other: "0" };

function octal(buf: Buffer, off: number, len: number, v: number): void {
  buf.write(v.toString(8).padStart(len - 1, "0") + "\0", off, len, "ascii");
}

function header(e: TarEntry): Buffer {
  const h = Buffer.alloc(512);
  const name = e.type === "dir" && !e.name.endsWith("/") ? e.name + "/" : e.name;
  if (Buffer.byteLength(name) > 100) throw new Error(`test tar: name ${name} is longer than 100 bytes`);
  h.write(name, 0, 100, "utf8");
  octal(h, 100, 8, e.mode ?? (e.type === "dir" ? 0o755 : 0o644));
  octal(h, 108, 8, e.uid ?? 0);
  octal(h, 116, 8, e.gid ?? 0);
  octal(h, 124, 12, e.type === "file" ? (e.data?.length ?? 0) : 0);
  octal(h, 136, 12, e.mtime ?? 1_700_000_000);
  h.write("        ", 148, 8, "ascii");
  h.write(FLAGS[e.type], 156, 1, "ascii");
  if (e.link) h.write(e.link, 157, 100, "utf8");
  h.write("ustar\0" + "00", 257, 8, "ascii");
  let sum = 0;
  for (const b of h) sum += b;
  h.write(sum.toString(8).padStart(6, "0") + "\0 ", 148, 8, "ascii");
  return h;
}

/** A tar of the entries (each file's data padded to 512), ended by two zero blocks. */
export function makeTar(entries: TarEntry[]): Buffer {
  const parts: Buffer[] = [];
  for (const e of entries) {
    parts.push(header(e));
    if (e.type === "file" && e.data?.length) {
      parts.push(e.data);
      const pad = (512 - (e.data.length % 512)) % 512;
      if (pad) parts.push(Buffer.alloc(pad));
    }
  }
  parts.push(Buffer.alloc(1024));
  return Buffer.concat(parts);
}

function str(buf: Buffer, off: number, len: number): string {
  const s = buf.subarray(off, off + len);
  const nul = s.indexOf(0);
  return (nul >= 0 ? s.subarray(0, nul) : s).toString("utf8");
}

function num(buf: Buffer, off: number, len: number): number {
  const s = str(buf, off, len).trim();
  return s ? parseInt(s, 8) : 0;
}

/** The entries of a tar; throws if it is cut short or has no end. */
export function readTar(tar: Buffer): TarEntry[] {
  const out: TarEntry[] = [];
  let off = 0;
  let longName: string | undefined;
  let longLink: string | undefined;
  let pax: Record<string, string> = {};
  for (;;) {
    if (off + 512 > tar.length) throw new Error(`test tar: cut at ${off} of ${tar.length}`);
    const h = tar.subarray(off, off + 512);
    off += 512;
    if (h.every((b) => b === 0)) return out;
    const size = num(h, 124, 12);
    const flag = String.fromCharCode(h[156]!);
    if (off + size > tar.length) throw new Error(`test tar: an entry is cut at ${tar.length}`);
    const data = tar.subarray(off, off + size);
    off += Math.ceil(size / 512) * 512;
    if (flag === "x") {
      for (let rest = data.toString("utf8"); rest; ) {
        const sp = rest.indexOf(" ");
        const n = parseInt(rest.slice(0, sp), 10);
        const rec = rest.slice(sp + 1, n - 1);
        const eq = rec.indexOf("=");
        pax[rec.slice(0, eq)] = rec.slice(eq + 1);
        rest = rest.slice(n);
      }
      continue;
    }
    if (flag === "g") continue;
    if (flag === "L") {
      longName = str(data, 0, data.length);
      continue;
    }
    if (flag === "K") {
      longLink = str(data, 0, data.length);
      continue;
    }
    const prefix = str(h, 345, 155);
    let name = pax.path ?? longName ?? (prefix ? prefix + "/" : "") + str(h, 0, 100);
    if (name.endsWith("/") && name.length > 1) name = name.slice(0, -1);
    const e: TarEntry = {
      name,
      type: TYPES[flag] ?? "other",
      mode: num(h, 100, 8),
      uid: pax.uid ? Number(pax.uid) : num(h, 108, 8),
      gid: pax.gid ? Number(pax.gid) : num(h, 116, 8),
      mtime: pax.mtime ? Math.floor(Number(pax.mtime)) : num(h, 136, 12),
    };
    if (e.type === "file") e.data = Buffer.from(data);
    const link = pax.linkpath ?? longLink ?? str(h, 157, 100);
    if (link) e.link = link;
    out.push(e);
    longName = longLink = undefined;
    pax = {};
  }
}
