// Kubernetes-style resource quantities ("512Mi", "1Gi", "500m") turned into
// the forms the shard API takes ("512MiB", "1GiB", "500m").

import { ShardError } from "./errors.js";

/** Resources of a sandbox, Kubernetes style. */
export interface Resources {
  /** CPUs: "1", "0.5", "500m" (millicpus), or a number. */
  cpu?: string | number;
  /** Memory: "512Mi", "1Gi", "1G" (10^9 bytes), "512MiB", or a number of bytes. */
  memory?: string | number;
  /** Writable disk: same forms as memory, e.g. "10Gi". */
  disk?: string | number;
}

const binary: Record<string, string> = { ki: "KiB", mi: "MiB", gi: "GiB", ti: "TiB" };
const decimal: Record<string, string> = { k: "kB", m: "MB", g: "GB", t: "TB" };
const bigBinary: Record<string, bigint> = { pi: 1n << 50n, ei: 1n << 60n };
const bigDecimal: Record<string, bigint> = { p: 10n ** 15n, e: 10n ** 18n };

function bad(what: string, q: unknown, why: string): ShardError {
  return new ShardError("invalid_argument", `invalid ${what} quantity ${JSON.stringify(q)}: ${why}`, 0);
}

/**
 * Converts a memory or disk quantity to the API's form:
 * "512Mi" → "512MiB", "1Gi" → "1GiB", "1.5Gi" → "1.5GiB", "1G" → "1GB",
 * "500M" → "500MB", "128974848" → 128974848 (bytes), "129e6" → 129000000.
 * API forms ("512MiB", "2GB") pass through unchanged; a number is bytes.
 */
export function toMemory(q: string | number, what = "memory"): string | number {
  if (typeof q === "number") {
    if (!Number.isFinite(q) || q <= 0 || !Number.isInteger(q)) throw bad(what, q, "a number is a whole count of bytes, above 0");
    return q;
  }
  const s = String(q).trim();
  const m = /^([0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([a-zA-Z]*)$/.exec(s);
  if (!m) throw bad(what, q, 'expected a number with an optional unit, like "512Mi" or "1Gi"');
  const [, num, exp, unitRaw] = m as unknown as [string, string, string | undefined, string];
  if (Number(num) <= 0) throw bad(what, q, "must be above 0");
  if (exp !== undefined) {
    if (unitRaw) throw bad(what, q, "an exponent takes no unit");
    const v = Number(num) * 10 ** Number(exp);
    if (!Number.isFinite(v) || v < 1) throw bad(what, q, "out of range");
    return Math.round(v);
  }
  const unit = unitRaw.toLowerCase();
  if (unit === "") {
    if (!/^[0-9]+$/.test(num)) throw bad(what, q, "a bare number is bytes and must be whole");
    return Number(num);
  }
  if (unitRaw === "m") throw bad(what, q, '"m" (milli) makes no sense for bytes: did you mean "Mi" or "M"?');
  if (binary[unit]) return num + binary[unit];
  if (decimal[unit]) return num + decimal[unit];
  // The API's own spellings (KiB, MiB, ..., kB, MB, ...) and bytes.
  if (/^[kmgt]ib$/.test(unit) || /^[kmgt]b$/.test(unit)) return num + unitRaw;
  if (unit === "b") return /^[0-9]+$/.test(num) ? Number(num) : Math.round(Number(num));
  const big = bigBinary[unit] ?? bigDecimal[unit];
  if (big !== undefined) {
    // Past TiB the API has no unit: give it bytes.
    const [int, frac = ""] = num.split(".");
    const scale = 10n ** BigInt(frac.length);
    const bytes = (BigInt(int + frac) * big) / scale;
    if (bytes > BigInt(Number.MAX_SAFE_INTEGER)) throw bad(what, q, "too large");
    return Number(bytes);
  }
  throw bad(what, q, `unknown unit "${unitRaw}" (use Ki, Mi, Gi, Ti or k, M, G, T)`);
}

/**
 * Converts a CPU quantity to the API's form: "1" → "1", "0.5" → "0.5",
 * "500m" → "500m", 2 → "2".
 */
export function toCpu(q: string | number): string {
  if (typeof q === "number") {
    if (!Number.isFinite(q) || q <= 0) throw bad("cpu", q, "must be above 0");
    return String(q);
  }
  const s = String(q).trim();
  const m = /^([0-9]+(?:\.[0-9]+)?|\.[0-9]+)(m?)$/.exec(s);
  if (!m) throw bad("cpu", q, 'expected "1", "0.5" or "500m"');
  if (Number(m[1]) <= 0) throw bad("cpu", q, "must be above 0");
  if (m[2] === "m") {
    if (!/^[0-9]+$/.test(m[1]!)) throw bad("cpu", q, "millicpus are whole");
    return `${Number(m[1])}m`;
  }
  return m[1]!.startsWith(".") ? "0" + m[1] : m[1]!;
}

/** The API's create fields for a Resources object. */
export function resourcesToRequest(r: Resources | undefined): { cpu?: string; memory?: string | number; disk?: string | number } {
  const out: { cpu?: string; memory?: string | number; disk?: string | number } = {};
  if (!r) return out;
  if (r.cpu !== undefined && r.cpu !== null) out.cpu = toCpu(r.cpu);
  if (r.memory !== undefined && r.memory !== null) out.memory = toMemory(r.memory, "memory");
  if (r.disk !== undefined && r.disk !== null) out.disk = toMemory(r.disk, "disk");
  return out;
}
