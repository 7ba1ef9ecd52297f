"""The SDK's wire types (the dataclasses of _types.py) against the API's own
description, internal/api/openapi.json, which Go tests tie to the server's
routes and types: each dataclass that reads an answer is the copy of one
schema, with exactly its properties (as fields of the same names, a Python
keyword with a trailing underscore), of its JSON types, and able to say
"absent" exactly for what the schema does not require. The document is read
at test time: nothing is generated."""

from __future__ import annotations

import dataclasses
import datetime
import json
import keyword
import os
import typing
import unittest
from typing import Any, Dict, List, Optional, Set, Tuple

import fakeserver  # noqa: F401  (puts src/ on sys.path)

import useshards
from useshards import _types

OPENAPI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "internal", "api", "openapi.json")

# Each dataclass of _types.py that mirrors a schema, and the schema. The SDK
# builds request bodies as dicts in _client.py: it has no request types.
MIRRORS: Dict[type, str] = {
    _types.SandboxInfo: "Sandbox",
    _types.Grant: "Grant",
    _types.Policy: "Policy",
    _types.Origin: "Origin",
    _types.Checkpoint: "Checkpoint",
    _types.SandboxRemoved: "SandboxRemoved",
    _types.EnvironmentInfo: "Environment",
    _types.Secret: "Secret",
    # Token is also what tokens() lists (the schema Token, without key).
    _types.Token: "TokenCreated",
    _types.ReplayedExec: "ReplayedExec",
    _types.ReappliedChange: "ReappliedChange",
    _types.ResumeResult: "ResumeResponse",
    _types.ExitStatus: "ExecExit",
    _types.FileInfo: "FileInfo",
    _types.FileList: "FileList",
    _types.WriteResult: "WriteResult",
    _types.TreeNode: "TreeNode",
    _types.DiffSide: "DiffSide",
    _types.Change: "Change",
    _types.Diff: "Diff",
    _types.Whoami: "Whoami",
    _types.Project: "Project",
    _types.ProjectQuota: "ProjectQuota",
    _types.ProjectUse: "ProjectUse",
}

# Dataclasses of _types.py that are the SDK's own, not copies of a schema.
SDK_ONLY = {
    _types.Chunk,  # a piece of an exec's output
    _types.ExecResult,  # an ExitStatus with all of the output
}

# Fields every mirror has beyond the schema: the answer it was read from.
SDK_FIELDS = {"raw"}


def field_name(prop: str) -> str:
    """The field a property is read into: its own name, or with a trailing
    underscore for a Python keyword (Diff's ``from`` is ``from_``)."""
    return prop + "_" if keyword.iskeyword(prop) else prop

# Properties of a mirrored schema the SDK's type leaves out, on purpose, and
# why. Keep this short.
LEFT_OUT = {
    # The exit frame's byte counts: not surfaced (ExecResult's stdout_bytes
    # and stderr_bytes are the output itself; the ledger has the counts).
    "ExecExit.stdin_bytes",
    "ExecExit.stdout_bytes",
    "ExecExit.stderr_bytes",
}

# Required properties the SDK's type may still hold as None.
MAY_BE_NONE = {
    "TokenCreated.key",  # Token also reads a token record, which has no key
}

def load_schemas() -> Dict[str, Dict[str, Any]]:
    with open(OPENAPI, encoding="utf-8") as f:
        return json.load(f)["components"]["schemas"]


def resolve(schemas: Dict[str, Any], s: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[str]]:
    """Follows $refs (and an allOf of one, OpenAPI 3.0's way to describe one)
    to the schema; the name is the component named last."""
    ref = None
    while True:
        if "$ref" in s:
            ref = s["$ref"].rsplit("/", 1)[-1]
            s = schemas.get(ref, {})
        elif len(s.get("allOf", [])) == 1:
            s = s["allOf"][0]
        else:
            return s, ref


def unwrap_optional(tp: Any) -> Tuple[Any, bool]:
    """Optional[X] -> (X, True); anything else -> (tp, False)."""
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def json_type(tp: Any) -> str:
    """The JSON type an annotation reads."""
    origin = typing.get_origin(tp)
    if origin in (list, List):
        return "array"
    if origin in (dict, Dict) or dataclasses.is_dataclass(tp):
        return "object"
    # bytes: a string of base64 (format byte), as Go sends a []byte.
    return {str: "string", bytes: "string", bool: "boolean", int: "integer", float: "number", datetime.datetime: "string"}.get(tp, repr(tp))


class ErrorCodesTest(unittest.TestCase):
    def test_error_codes_are_openapis(self) -> None:
        """ERROR_CODES is the enum of Error.code: every code the server sends."""
        with open(OPENAPI, encoding="utf-8") as f:
            enum = json.load(f)["components"]["schemas"]["Error"]["properties"]["code"].get("enum")
        self.assertTrue(enum, "openapi.json's Error.code has no enum")
        self.assertEqual(sorted(useshards.ERROR_CODES), sorted(enum))
        self.assertEqual(len(enum), len(set(enum)), "openapi.json's enum has a code twice")


class WireTypesTest(unittest.TestCase):
    schemas: Dict[str, Dict[str, Any]]

    @classmethod
    def setUpClass(cls) -> None:
        cls.schemas = load_schemas()

    def test_every_dataclass_is_paired(self) -> None:
        classes = [
            v for v in vars(_types).values() if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == _types.__name__
        ]
        self.assertGreater(len(classes), 5)
        unpaired = sorted(c.__name__ for c in classes if c not in MIRRORS and c not in SDK_ONLY)
        self.assertEqual(unpaired, [], "dataclasses of _types.py that are neither in MIRRORS nor SDK_ONLY")
        missing = sorted(name for name in MIRRORS.values() if name not in self.schemas)
        self.assertEqual(missing, [], "MIRRORS names schemas openapi.json does not have")
        for key in sorted(LEFT_OUT | MAY_BE_NONE):
            schema, prop = key.split(".")
            self.assertIn(prop, self.schemas.get(schema, {}).get("properties", {}), f"{key} is not a property of openapi.json: drop it")
        mirrored = {name: cls for cls, name in MIRRORS.items()}
        for key in sorted(LEFT_OUT):
            schema, prop = key.split(".")
            cls = mirrored.get(schema)
            self.assertIsNotNone(cls, f"LEFT_OUT names {key}, whose schema no dataclass mirrors: drop it")
            self.assertNotIn(field_name(prop), {f.name for f in dataclasses.fields(cls)}, f"LEFT_OUT names {key}, which {cls.__name__} has now: drop it")

    def test_mirrors_match_openapi(self) -> None:
        for cls, name in sorted(MIRRORS.items(), key=lambda kv: kv[1]):
            with self.subTest(schema=name, sdk=cls.__name__):
                diffs = self.differences(cls, name)
                if diffs:
                    self.fail("\n".join(diffs))

    def differences(self, cls: type, name: str) -> List[str]:
        """Every difference between a dataclass and its schema, a sentence each."""
        out: List[str] = []
        schema = self.schemas[name]
        props: Dict[str, Any] = schema.get("properties", {})
        required: Set[str] = set(schema.get("required", []))
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in SDK_FIELDS}
        for prop in sorted(props):
            at = f"schema {name}: {prop}"
            f = fields.get(field_name(prop))
            if f is None:
                if f"{name}.{prop}" not in LEFT_OUT:
                    out.append(f"{at} is not a field of the SDK's {cls.__name__}")
                continue
            tp, optional = unwrap_optional(hints[f.name])
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if prop in required and optional and tp is not datetime.datetime and f"{name}.{prop}" not in MAY_BE_NONE:
                # A time is None also when it cannot be read.
                out.append(f"{at} is required, but the SDK's {cls.__name__}.{f.name} may be None")
            if prop not in required and not (optional or has_default):
                out.append(f"{at} is not required (the server may leave it out), but the SDK's {cls.__name__}.{f.name} has no default")
            self.compare_type(out, at, tp, props[prop])
        wanted = {field_name(p) for p in props}
        for fname in sorted(fields):
            if fname not in wanted:
                out.append(f"schema {name}: the SDK's {cls.__name__} has the field {fname}, which the schema does not")
        return out

    def compare_type(self, out: List[str], at: str, tp: Any, s: Dict[str, Any]) -> None:
        s, ref = resolve(self.schemas, s)
        want = s.get("type") or ("object" if "properties" in s else "")
        got = json_type(tp)
        if got != want:
            out.append(f"{at} is {want or s} in openapi.json; the SDK's type is {tp!r} ({got})")
            return
        if tp is datetime.datetime and s.get("format") != "date-time":
            out.append(f"{at} is a datetime in the SDK, but not a date-time in openapi.json")
        if got == "array" and "items" in s:
            (elem,) = typing.get_args(tp)
            self.compare_type(out, at + "[]", elem, s["items"])
        if dataclasses.is_dataclass(tp) and ref is not None and MIRRORS.get(tp) != ref:
            out.append(f"{at} is a {ref} in openapi.json; the SDK's type is {tp.__name__}, the copy of {MIRRORS.get(tp)}")


if __name__ == "__main__":
    unittest.main()
