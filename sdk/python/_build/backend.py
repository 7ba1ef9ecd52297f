"""In-tree PEP 517 / PEP 660 build backend of useshards (standard library only).

pyproject.toml names it (``build-backend = "backend"``, ``backend-path =
["_build"]``) with ``requires = []``, so ``pip install sdk/python`` builds in
pip's isolated environment without downloading anything: no setuptools.

What it builds, from pyproject.toml's [project] table:

* a wheel (py3-none-any, purelib) holding the packages and modules under
  ``src/`` (every file but caches, py.typed included) and a dist-info with
  METADATA, WHEEL and RECORD (sha256, urlsafe base64);
* an sdist with PKG-INFO, pyproject.toml, the readme, this backend, src/ and
  tests/;
* an editable wheel (PEP 660): a .pth file putting ``src/`` on sys.path.

The version is ``[project] version``, or, when ``dynamic = ["version"]``, the
``__version__ = "..."`` literal of the package's ``__init__.py``: one place.
pyproject.toml is read with tomllib (3.11+), else with a small TOML-subset
parser below (Python 3.8-3.10). [project] fields it does not know are an
error, not silently dropped.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from typing import Any, Dict, Iterator, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = "src"
GENERATOR = "useshards-in-tree-backend"
# Files and directories never packaged.
_SKIP_DIRS = {"__pycache__", ".git", ".mypy_cache", ".pytest_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".egg-info")
# Top-level items of the sdist besides PKG-INFO, the readme and license files.
_SDIST_ITEMS = ("pyproject.toml", "_build", "src", "tests")
_KNOWN_FIELDS = {
    "name", "version", "dynamic", "description", "readme", "requires-python",
    "license", "classifiers", "dependencies", "optional-dependencies",
    "keywords", "urls", "authors", "maintainers",
}


# --------------------------------------------------------------- PEP 517 hooks


def get_requires_for_build_wheel(config_settings: Any = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Any = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Any = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Any = None) -> str:
    project = Project.load()
    dist_info = os.path.join(metadata_directory, project.dist_info)
    os.makedirs(dist_info, exist_ok=True)
    for name, data in project.dist_info_files():
        path = os.path.join(dist_info, *name.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return project.dist_info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: Any = None, metadata_directory: Optional[str] = None) -> str:
    project = Project.load()
    return _write_wheel(wheel_directory, project, list(project.package_files()))


def build_editable(wheel_directory: str, config_settings: Any = None, metadata_directory: Optional[str] = None) -> str:
    project = Project.load()
    pth = (os.path.join(ROOT, SRC) + "\n").encode()
    return _write_wheel(wheel_directory, project, [("__editable__.%s.pth" % project.dist_name, pth)])


def build_sdist(sdist_directory: str, config_settings: Any = None) -> str:
    project = Project.load()
    base = "%s-%s" % (project.dist_name, project.version)
    members: List[Tuple[str, bytes, int]] = [("PKG-INFO", project.metadata(), 0o644)]
    items = list(_SDIST_ITEMS) + [project.readme_file] + project.license_files
    seen = set()
    for item in items:
        if not item or item in seen or not os.path.exists(os.path.join(ROOT, item)):
            continue
        seen.add(item)
        for rel in _walk(item):
            path = os.path.join(ROOT, *rel.split("/"))
            mode = 0o755 if os.stat(path).st_mode & 0o111 else 0o644
            members.append((rel, _read(path), mode))
    os.makedirs(sdist_directory, exist_ok=True)
    filename = base + ".tar.gz"
    mtime = _epoch()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, data, mode in sorted(members):
            info = tarfile.TarInfo(base + "/" + rel)
            info.size, info.mode, info.mtime = len(data), mode, mtime
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    with open(os.path.join(sdist_directory, filename), "wb") as out:
        with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=mtime) as gz:
            gz.write(raw.getvalue())
    return filename


# --------------------------------------------------------------------- project


class Project:
    """pyproject.toml's [project] table, checked, plus what is derived from it."""

    def __init__(self, table: Dict[str, Any]) -> None:
        unknown = sorted(set(table) - _KNOWN_FIELDS)
        if unknown:
            raise ValueError("pyproject.toml [project]: the in-tree backend does not handle %s" % ", ".join(unknown))
        self.table = table
        self.name: str = table["name"]
        self.dist_name = re.sub(r"[-_.]+", "_", self.name).lower()
        dynamic = table.get("dynamic", [])
        if set(dynamic) - {"version"}:
            raise ValueError("pyproject.toml [project]: only the version may be dynamic")
        if "version" in dynamic:
            if "version" in table:
                raise ValueError("pyproject.toml [project]: version is both given and dynamic")
            self.version = _version_from_init(self.dist_name)
        else:
            self.version = table["version"]
        if not re.match(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$", self.version):
            raise ValueError("version %r is not a normalized PEP 440 version" % self.version)
        self.dist_info = "%s-%s.dist-info" % (self.dist_name, self.version)
        readme = table.get("readme")
        self.readme_file = readme if isinstance(readme, str) else (readme or {}).get("file", "")
        lic = table.get("license")
        self.license_files: List[str] = [lic["file"]] if isinstance(lic, dict) and "file" in lic else []

    @classmethod
    def load(cls) -> "Project":
        with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
            data = load_toml(f.read().decode("utf-8"))
        return cls(data["project"])

    def metadata(self) -> bytes:
        t = self.table
        meta_version = "2.4" if isinstance(t.get("license"), str) else "2.1"
        lines = ["Metadata-Version: " + meta_version, "Name: " + self.name, "Version: " + self.version]
        if "description" in t:
            lines.append("Summary: " + " ".join(t["description"].split()))
        if t.get("keywords"):
            lines.append("Keywords: " + ",".join(t["keywords"]))
        for field, header in (("authors", "Author"), ("maintainers", "Maintainer")):
            names = [p["name"] for p in t.get(field, []) if "name" in p and "email" not in p]
            emails = [
                ('"%s" <%s>' % (p["name"], p["email"])) if "name" in p else p["email"]
                for p in t.get(field, []) if "email" in p
            ]
            if names:
                lines.append("%s: %s" % (header, ", ".join(names)))
            if emails:
                lines.append("%s-email: %s" % (header, ", ".join(emails)))
        lic = t.get("license")
        if isinstance(lic, str):
            lines.append("License-Expression: " + lic)
        elif isinstance(lic, dict) and "text" in lic:
            lines.append("License: " + lic["text"].strip().replace("\n", "\n        "))
        elif isinstance(lic, dict) and "file" in lic:
            lines.append("License: " + _read(os.path.join(ROOT, lic["file"])).decode().strip().replace("\n", "\n        "))
        for c in t.get("classifiers", []):
            lines.append("Classifier: " + c)
        for label, url in t.get("urls", {}).items():
            lines.append("Project-URL: %s, %s" % (label, url))
        if "requires-python" in t:
            lines.append("Requires-Python: " + t["requires-python"])
        for dep in t.get("dependencies", []):
            lines.append("Requires-Dist: " + dep)
        for extra, deps in t.get("optional-dependencies", {}).items():
            lines.append("Provides-Extra: " + extra)
            for dep in deps:
                req, _, marker = dep.partition(";")
                extra_marker = 'extra == "%s"' % extra
                marker = "(%s) and %s" % (marker.strip(), extra_marker) if marker.strip() else extra_marker
                lines.append("Requires-Dist: %s; %s" % (req.strip(), marker))
        body = ""
        readme = t.get("readme")
        if readme is not None:
            if isinstance(readme, str):
                readme = {"file": readme}
            text = readme.get("text")
            if text is None:
                text = _read(os.path.join(ROOT, readme["file"])).decode("utf-8")
            ctype = readme.get("content-type") or _readme_type(readme.get("file", ""))
            lines.append("Description-Content-Type: " + ctype)
            body = "\n" + text
        return ("\n".join(lines) + "\n" + body).encode("utf-8")

    def dist_info_files(self) -> List[Tuple[str, bytes]]:
        wheel = "Wheel-Version: 1.0\nGenerator: %s\nRoot-Is-Purelib: true\nTag: py3-none-any\n" % GENERATOR
        files = [("METADATA", self.metadata()), ("WHEEL", wheel.encode())]
        for lf in self.license_files:
            files.append(("licenses/" + lf, _read(os.path.join(ROOT, lf))))
        return files

    def package_files(self) -> Iterator[Tuple[str, bytes]]:
        """(path in the wheel, content) of every package and module under src/."""
        src = os.path.join(ROOT, SRC)
        found = False
        for entry in sorted(os.listdir(src)):
            full = os.path.join(src, entry)
            if os.path.isdir(full) and os.path.isfile(os.path.join(full, "__init__.py")):
                pass
            elif not (os.path.isfile(full) and entry.endswith(".py")):
                continue
            found = True
            for rel in _walk(SRC + "/" + entry):
                yield rel[len(SRC) + 1:], _read(os.path.join(ROOT, *rel.split("/")))
        if not found:
            raise ValueError("no package or module under %s" % src)


def _write_wheel(wheel_directory: str, project: Project, files: List[Tuple[str, bytes]]) -> str:
    filename = "%s-%s-py3-none-any.whl" % (project.dist_name, project.version)
    files = files + [(project.dist_info + "/" + n, d) for n, d in project.dist_info_files()]
    record_name = project.dist_info + "/RECORD"
    record = []
    for name, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (_csv(name), digest, len(data)))
    record.append(record_name + ",,")
    files.append((record_name, ("\n".join(record) + "\n").encode()))
    os.makedirs(wheel_directory, exist_ok=True)
    date_time = time.gmtime(_epoch())[:6]
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o100644 << 16
            zf.writestr(info, data)
    return filename


# --------------------------------------------------------------------- helpers


def _walk(rel_top: str) -> Iterator[str]:
    """Paths ("/"-separated, relative to ROOT) of the files at or under rel_top, sorted, caches skipped."""
    top = os.path.join(ROOT, *rel_top.split("/"))
    if os.path.isfile(top):
        yield rel_top
        return
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(_SKIP_SUFFIXES))
        for fn in sorted(filenames):
            if fn.endswith(_SKIP_SUFFIXES):
                continue
            yield os.path.relpath(os.path.join(dirpath, fn), ROOT).replace(os.sep, "/")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _csv(name: str) -> str:
    return '"%s"' % name.replace('"', '""') if any(c in name for c in ',"\n') else name


def _epoch() -> int:
    """SOURCE_DATE_EPOCH, else 1980-01-01 (the earliest zip date): reproducible archives."""
    return max(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")), 315532800)


def _readme_type(filename: str) -> str:
    ext = os.path.splitext(filename)[1].lower()
    return {".md": "text/markdown", ".markdown": "text/markdown", ".rst": "text/x-rst"}.get(ext, "text/plain")


def _version_from_init(package: str) -> str:
    path = os.path.join(ROOT, SRC, package, "__init__.py")
    m = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", _read(path).decode("utf-8"), re.M)
    if not m:
        raise ValueError("no __version__ = \"...\" line in %s" % path)
    return m.group(1)


# ----------------------------------------------------------------------- TOML


def load_toml(text: str) -> Dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        return parse_toml_subset(text)
    return tomllib.loads(text)


def parse_toml_subset(text: str) -> Dict[str, Any]:
    """A small TOML parser for Python < 3.11: tables, arrays of tables, dotted
    and quoted keys, strings (basic, literal, multi-line), arrays, inline
    tables, booleans, integers and floats. Dates and times are an error."""
    return _TomlParser(text).parse()


class _TomlParser:
    _ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}
    _BARE = re.compile(r"[A-Za-z0-9_-]+")
    _NUMBER = re.compile(r"[+-]?(?:0x[0-9A-Fa-f_]+|0o[0-7_]+|0b[01_]+|[0-9_]+(?:\.[0-9_]+)?(?:[eE][+-]?[0-9_]+)?|inf|nan)")

    def __init__(self, text: str) -> None:
        self.s = text.replace("\r\n", "\n")
        self.i = 0

    def error(self, msg: str) -> ValueError:
        line = self.s.count("\n", 0, self.i) + 1
        return ValueError("pyproject.toml line %d: %s" % (line, msg))

    def peek(self, n: int = 1) -> str:
        return self.s[self.i:self.i + n]

    def skip_ws(self, newlines: bool = False) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t" or (newlines and c == "\n"):
                self.i += 1
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            else:
                break

    def expect(self, c: str) -> None:
        if self.peek() != c:
            raise self.error("expected %r" % c)
        self.i += 1

    def end_of_line(self) -> None:
        self.skip_ws()
        if self.i < len(self.s) and self.s[self.i] != "\n":
            raise self.error("unexpected %r" % self.s[self.i])

    def parse(self) -> Dict[str, Any]:
        root: Dict[str, Any] = {}
        current = root
        while True:
            self.skip_ws(newlines=True)
            if self.i >= len(self.s):
                return root
            if self.peek(2) == "[[":
                self.i += 2
                path = self.key()
                self.expect("]")
                self.expect("]")
                parent = self.table_at(root, path[:-1])
                arr = parent.setdefault(path[-1], [])
                if not isinstance(arr, list):
                    raise self.error("%s is not an array of tables" % ".".join(path))
                current = {}
                arr.append(current)
            elif self.peek() == "[":
                self.i += 1
                current = self.table_at(root, self.key())
                self.expect("]")
            else:
                self.key_value(current)
            self.end_of_line()

    def table_at(self, root: Dict[str, Any], path: List[str]) -> Dict[str, Any]:
        t = root
        for k in path:
            t = t.setdefault(k, {})
            if isinstance(t, list):
                t = t[-1]
            if not isinstance(t, dict):
                raise self.error("%s is not a table" % ".".join(path))
        return t

    def key(self) -> List[str]:
        parts = []
        while True:
            self.skip_ws()
            c = self.peek()
            if c == '"':
                parts.append(self.basic_string())
            elif c == "'":
                parts.append(self.literal_string())
            else:
                m = self._BARE.match(self.s, self.i)
                if not m:
                    raise self.error("expected a key")
                parts.append(m.group())
                self.i = m.end()
            self.skip_ws()
            if self.peek() != ".":
                return parts
            self.i += 1

    def key_value(self, table: Dict[str, Any]) -> None:
        path = self.key()
        self.expect("=")
        self.skip_ws()
        value = self.value()
        target = self.table_at(table, path[:-1])
        if path[-1] in target:
            raise self.error("duplicate key %s" % ".".join(path))
        target[path[-1]] = value

    def value(self) -> Any:
        c = self.peek()
        if self.peek(3) in ('"""', "'''"):
            return self.multiline_string()
        if c == '"':
            return self.basic_string()
        if c == "'":
            return self.literal_string()
        if c == "[":
            return self.array()
        if c == "{":
            return self.inline_table()
        for word, val in (("true", True), ("false", False)):
            if self.s.startswith(word, self.i):
                self.i += len(word)
                return val
        m = self._NUMBER.match(self.s, self.i)
        if m and not re.match(r"[0-9]{4}-|[0-9]{2}:", self.s[self.i:self.i + 5]):
            self.i = m.end()
            tok = m.group().replace("_", "")
            if tok.lstrip("+-")[:2] in ("0x", "0o", "0b"):
                return int(tok, 0)
            if any(ch in tok for ch in ".eEn") or tok.lstrip("+-") in ("inf", "nan"):
                return float(tok)
            return int(tok)
        raise self.error("unsupported value")

    def basic_string(self) -> str:
        self.expect('"')
        out = []
        while True:
            if self.i >= len(self.s) or self.s[self.i] == "\n":
                raise self.error("unterminated string")
            c = self.s[self.i]
            self.i += 1
            if c == '"':
                return "".join(out)
            if c == "\\":
                out.append(self.escape())
            else:
                out.append(c)

    def escape(self) -> str:
        c = self.peek()
        self.i += 1
        if not c:
            raise self.error("unterminated string")
        if c in self._ESCAPES:
            return self._ESCAPES[c]
        if c in "uU":
            n = 4 if c == "u" else 8
            digits = self.s[self.i:self.i + n]
            self.i += n
            return chr(int(digits, 16))
        raise self.error("bad escape \\%s" % c)

    def literal_string(self) -> str:
        self.expect("'")
        end = self.s.find("'", self.i)
        if end < 0 or "\n" in self.s[self.i:end]:
            raise self.error("unterminated string")
        out = self.s[self.i:end]
        self.i = end + 1
        return out

    def multiline_string(self) -> str:
        quote = self.peek(3)
        self.i += 3
        if self.peek() == "\n":
            self.i += 1
        out = []
        while True:
            if self.i >= len(self.s):
                raise self.error("unterminated string")
            if self.s.startswith(quote, self.i):
                self.i += 3
                return "".join(out)
            c = self.s[self.i]
            self.i += 1
            if c == "\\" and quote == '"""':
                if self.peek() and self.peek() in " \t\n":  # line-ending backslash: trim whitespace
                    while self.peek() in (" ", "\t", "\n"):
                        self.i += 1
                else:
                    out.append(self.escape())
            else:
                out.append(c)

    def array(self) -> List[Any]:
        self.expect("[")
        out = []
        while True:
            self.skip_ws(newlines=True)
            if self.peek() == "]":
                self.i += 1
                return out
            out.append(self.value())
            self.skip_ws(newlines=True)
            if self.peek() == ",":
                self.i += 1
            elif self.peek() != "]":
                raise self.error("expected ',' or ']'")

    def inline_table(self) -> Dict[str, Any]:
        self.expect("{")
        out: Dict[str, Any] = {}
        self.skip_ws()
        if self.peek() == "}":
            self.i += 1
            return out
        while True:
            self.key_value(out)
            self.skip_ws()
            if self.peek() == "}":
                self.i += 1
                return out
            self.expect(",")
