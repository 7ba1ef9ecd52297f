// The SDK's wire types (src/types.ts) against the API's own description,
// internal/api/openapi.json, which Go tests tie to the server's routes and
// types: every interface in types.ts is the copy of one schema, with exactly
// its properties, of its JSON types, optional exactly when the schema does
// not require them. The interfaces are read with the TypeScript compiler,
// the document at test time: nothing is generated.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const root = fileURLToPath(new URL("../", import.meta.url)); // sdk/typescript (this runs from dist-test/)
const openapiFile = fileURLToPath(new URL("../../../internal/api/openapi.json", import.meta.url));
const typesFile = root + "src/types.ts";

/** The interfaces named otherwise than their schema. */
const RENAMED: Record<string, string> = {
  SandboxInfo: "Sandbox",
  EnvironmentInfo: "Environment",
  SecretInfo: "Secret",
  ApiError: "Error",
};

/**
 * Properties of a mirrored schema the SDK's type leaves out, on purpose.
 * Keep this short: each entry is a field the SDK cannot send or read.
 */
const LEFT_OUT: Record<string, string> = {
  // The WebSocket form of exec only; the SDK execs over POST.
  "ExecRequest.interactive": "WebSocket only",
  // count > 1 answers a ForkResponse (a list); ShardApi.forkSandbox makes one fork and answers its Sandbox.
  "ForkRequest.count": "one fork per call",
};

interface Schema {
  $ref?: string;
  type?: string;
  enum?: unknown[];
  properties?: Record<string, Schema>;
  required?: string[];
  items?: Schema;
  allOf?: Schema[];
  oneOf?: Schema[];
}

const doc = JSON.parse(readFileSync(openapiFile, "utf8")) as { components: { schemas: Record<string, Schema> } };
const schemas = doc.components.schemas;

// ES5's library is enough for types.ts (arrays, Record) and quicker to load than ES2022's.
const program = ts.createProgram([typesFile], { strict: true, noEmit: true, lib: ["lib.es5.d.ts"], types: [] });
const checker = program.getTypeChecker();
const source = program.getSourceFile(typesFile)!;

/** Every exported interface of types.ts, by name. */
const interfaces = new Map<string, ts.InterfaceDeclaration>();
for (const st of source.statements) {
  if (ts.isInterfaceDeclaration(st) && st.modifiers?.some((m) => m.kind === ts.SyntaxKind.ExportKeyword)) interfaces.set(st.name.text, st);
}

const schemaName = (iface: string) => RENAMED[iface] ?? iface;

/** Follows $refs (and an allOf of one, OpenAPI 3.0's way to describe one) to the schema; ref is the component named last. */
function resolve(s: Schema): { s: Schema; ref?: string } {
  let ref: string | undefined;
  for (;;) {
    if (s.$ref) {
      ref = s.$ref.replace("#/components/schemas/", "");
      s = schemas[ref] ?? {};
    } else if (s.allOf?.length === 1) s = s.allOf[0]!;
    else return { s, ref };
  }
}

/** What JSON a schema allows: its types ("integer" is a "number" here), the enum, an array's items, an object's component. */
interface Shape {
  kinds: Set<string>;
  literals: Set<string>;
  items: Schema[];
  ref?: string;
}

function schemaShape(s0: Schema): Shape {
  const { s, ref } = resolve(s0);
  const out: Shape = { kinds: new Set(), literals: new Set(), items: [], ref };
  for (const o of s.oneOf ?? []) {
    const sub = schemaShape(o);
    sub.kinds.forEach((k) => out.kinds.add(k));
    out.items.push(...sub.items);
  }
  if (s.type) out.kinds.add(s.type === "integer" ? "number" : s.type);
  else if (s.properties) out.kinds.add("object");
  for (const v of s.enum ?? []) out.literals.add(String(v));
  if (s.items) out.items.push(s.items);
  return out;
}

/** The same for a TypeScript type; objects are the interfaces (or records) it allows. */
function typeShape(t: ts.Type): Shape & { elems: ts.Type[]; objects: ts.Type[] } {
  const out = { kinds: new Set<string>(), literals: new Set<string>(), items: [], elems: [] as ts.Type[], objects: [] as ts.Type[] };
  const add = (t: ts.Type) => {
    if (t.isUnion()) return t.types.forEach(add);
    const f = t.flags;
    if (f & (ts.TypeFlags.Undefined | ts.TypeFlags.Void)) return;
    if (t.isStringLiteral()) {
      out.kinds.add("string");
      out.literals.add(t.value);
    } else if (f & ts.TypeFlags.StringLike) out.kinds.add("string");
    else if (f & ts.TypeFlags.NumberLike) out.kinds.add("number");
    else if (f & ts.TypeFlags.BooleanLike) out.kinds.add("boolean");
    else if (checker.isArrayType(t)) {
      out.kinds.add("array");
      out.elems.push(...checker.getTypeArguments(t as ts.TypeReference));
    } else if (f & ts.TypeFlags.Object) {
      out.kinds.add("object");
      out.objects.push(t);
    } else out.kinds.add(checker.typeToString(t));
  };
  add(t);
  return out;
}

const sorted = (s: Iterable<string>) => [...s].sort();
const same = (a: Set<string>, b: Set<string>) => a.size === b.size && [...a].every((x) => b.has(x));

/**
 * The string literals a declared type names, as written: `SandboxState |
 * string` is only `string` to the checker, which folds the literals into it.
 */
function literalsOf(node: ts.TypeNode | undefined, into = new Set<string>()): Set<string> {
  if (!node) return into;
  if (ts.isUnionTypeNode(node)) node.types.forEach((n) => literalsOf(n, into));
  else if (ts.isParenthesizedTypeNode(node)) literalsOf(node.type, into);
  else if (!ts.isArrayTypeNode(node)) {
    const t = checker.getTypeFromTypeNode(node);
    for (const m of t.isUnion() ? t.types : [t]) if (m.isStringLiteral()) into.add(m.value);
  }
  return into;
}

/** Differences between a TypeScript type (declared as node) and a schema, each a sentence starting with `at`. */
function compareType(at: string, t: ts.Type, node: ts.TypeNode | undefined, s: Schema, out: string[]): void {
  const want = schemaShape(s);
  const got = typeShape(t);
  literalsOf(node, got.literals);
  if (!same(got.kinds, want.kinds)) {
    out.push(`${at} is ${sorted(want.kinds).join(" or ")} in openapi.json; the SDK's type is ${checker.typeToString(t)} (${sorted(got.kinds).join(" or ")})`);
    return;
  }
  if (got.literals.size > 0 && want.literals.size > 0 && !same(got.literals, want.literals)) {
    out.push(`${at}: openapi.json's enum is ${JSON.stringify(sorted(want.literals))}; the SDK's values are ${JSON.stringify(sorted(got.literals))}`);
  }
  const elemNode = node && ts.isArrayTypeNode(node) ? node.elementType : undefined;
  if (got.elems.length === 1 && want.items.length === 1) compareType(at + "[]", got.elems[0]!, elemNode, want.items[0]!, out);
  const target = want.ref ? schemas[want.ref] : undefined;
  if (target?.properties && got.objects.length === 1) {
    const name = got.objects[0]!.symbol?.name ?? "";
    if (schemaName(name) !== want.ref) out.push(`${at} is a ${want.ref} in openapi.json; the SDK's type is ${name}, the copy of ${schemaName(name)}`);
  }
}

/** Differences between one interface and its schema. */
function compare(iface: string, schemaKey: string): string[] {
  const out: string[] = [];
  const s = schemas[schemaKey]!;
  const props = s.properties ?? {};
  const required = new Set(s.required ?? []);
  const decl = interfaces.get(iface)!;
  const type = checker.getDeclaredTypeOfSymbol(checker.getSymbolAtLocation(decl.name)!);
  const mine = new Map(checker.getPropertiesOfType(type).map((p) => [p.name, p]));
  for (const name of sorted(Object.keys(props))) {
    const at = `schema ${schemaKey}: ${name}`;
    const p = mine.get(name);
    if (!p) {
      if (!((schemaKey + "." + name) in LEFT_OUT)) out.push(`${at} is not a property of the SDK's ${iface}`);
      continue;
    }
    const optional = (p.flags & ts.SymbolFlags.Optional) !== 0;
    if (required.has(name) && optional) out.push(`${at} is required, but optional in the SDK's ${iface}`);
    if (!required.has(name) && !optional) out.push(`${at} is not required (the server may leave it out), but the SDK's ${iface} has it always`);
    const pdecl = p.valueDeclaration;
    const node = pdecl && ts.isPropertySignature(pdecl) ? pdecl.type : undefined;
    compareType(at, checker.getTypeOfSymbolAtLocation(p, decl), node, props[name]!, out);
  }
  for (const name of sorted(mine.keys())) {
    if (!(name in props)) out.push(`schema ${schemaKey}: the SDK's ${iface} has ${name}, which the schema does not`);
  }
  return out;
}

test("ErrorCode is the enum of openapi.json's Error.code: every code the server sends", () => {
  const alias = source.statements.find((st): st is ts.TypeAliasDeclaration => ts.isTypeAliasDeclaration(st) && st.name.text === "ErrorCode");
  assert.ok(alias, `${typesFile} declares no type ErrorCode`);
  const want = schemas.Error?.properties?.code?.enum;
  assert.ok(want?.length, "openapi.json's Error.code has no enum");
  assert.deepEqual(sorted(literalsOf(alias.type)), sorted(want.map(String)));
});

test("every interface of types.ts is the copy of a schema in openapi.json", () => {
  assert.ok(interfaces.size > 10, `found only ${interfaces.size} interfaces in ${typesFile}`);
  const missing = [...interfaces.keys()].filter((i) => !schemas[schemaName(i)]);
  assert.deepEqual(missing, [], "interfaces with no schema of that name (rename them in RENAMED, or keep SDK-only types out of types.ts)");
  for (const key of Object.keys(LEFT_OUT)) {
    const [schema, prop] = key.split(".");
    const iface = [...interfaces.keys()].find((i) => schemaName(i) === schema);
    assert.ok(iface && schemas[schema!]?.properties?.[prop!], `LEFT_OUT names ${key}, which is not a property of a mirrored schema: drop it`);
    const type = checker.getDeclaredTypeOfSymbol(checker.getSymbolAtLocation(interfaces.get(iface)!.name)!);
    assert.ok(!type.getProperty(prop!), `LEFT_OUT names ${key}, which ${iface} has now: drop it`);
  }
});

for (const iface of interfaces.keys()) {
  const key = schemaName(iface);
  if (!schemas[key]) continue; // the test above fails
  test(`types.ts ${iface} matches openapi.json's ${key}`, () => {
    assert.deepEqual(compare(iface, key), []);
  });
}
