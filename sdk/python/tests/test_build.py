"""The in-tree build backend (_build/backend.py): wheel, sdist, editable wheel."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import sys
import tarfile
import tempfile
import unittest
import zipfile
from email.parser import Parser

import fakeserver  # noqa: F401  (puts src/ on sys.path)

import useshards

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(HERE, "_build"))

import backend  # noqa: E402


class BuildTest(unittest.TestCase):
    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.out = tmp.name

    def test_hooks_need_nothing(self) -> None:
        self.assertEqual(backend.get_requires_for_build_wheel(), [])
        self.assertEqual(backend.get_requires_for_build_sdist(), [])
        self.assertEqual(backend.get_requires_for_build_editable(), [])

    def test_wheel(self) -> None:
        name = backend.build_wheel(self.out)
        version = useshards.__version__
        self.assertEqual(name, "useshards-%s-py3-none-any.whl" % version)
        dist_info = "useshards-%s.dist-info" % version
        with zipfile.ZipFile(os.path.join(self.out, name)) as zf:
            names = zf.namelist()
            files = {n: zf.read(n) for n in names}

        for module in ("__init__.py", "_client.py", "_errors.py", "_transport.py", "_types.py", "py.typed"):
            self.assertIn("useshards/" + module, names)
        self.assertFalse([n for n in names if "__pycache__" in n or n.endswith(".pyc")])
        self.assertEqual(files["useshards/__init__.py"], _read(os.path.join(HERE, "src", "useshards", "__init__.py")))

        meta = Parser().parsestr(files[dist_info + "/METADATA"].decode("utf-8"))
        self.assertEqual(meta["Name"], "useshards")
        self.assertEqual(meta["Version"], version)
        self.assertEqual(meta["Requires-Python"], ">=3.8")
        self.assertIn("Typing :: Typed", meta.get_all("Classifier"))
        self.assertTrue(meta["Summary"].startswith("Python client of shard"))
        self.assertEqual(meta["Description-Content-Type"], "text/markdown")
        self.assertEqual(meta.get_payload(), _read(os.path.join(HERE, "README.md")).decode("utf-8"))

        wheel = Parser().parsestr(files[dist_info + "/WHEEL"].decode())
        self.assertEqual(wheel["Root-Is-Purelib"], "true")
        self.assertEqual(wheel.get_all("Tag"), ["py3-none-any"])

        rows = list(csv.reader(io.StringIO(files[dist_info + "/RECORD"].decode())))
        self.assertEqual(sorted(r[0] for r in rows), sorted(names))
        for path, digest, size in rows:
            if path == dist_info + "/RECORD":
                self.assertEqual((digest, size), ("", ""))
                continue
            want = base64.urlsafe_b64encode(hashlib.sha256(files[path]).digest()).rstrip(b"=").decode()
            self.assertEqual(digest, "sha256=" + want, path)
            self.assertEqual(int(size), len(files[path]), path)

    def test_wheel_is_reproducible(self) -> None:
        a = os.path.join(self.out, "a")
        b = os.path.join(self.out, "b")
        name = backend.build_wheel(a)
        backend.build_wheel(b)
        self.assertEqual(_read(os.path.join(a, name)), _read(os.path.join(b, name)))

    def test_prepare_metadata(self) -> None:
        d = backend.prepare_metadata_for_build_wheel(self.out)
        self.assertEqual(d, "useshards-%s.dist-info" % useshards.__version__)
        self.assertTrue(os.path.isfile(os.path.join(self.out, d, "METADATA")))
        self.assertTrue(os.path.isfile(os.path.join(self.out, d, "WHEEL")))

    def test_sdist(self) -> None:
        name = backend.build_sdist(self.out)
        base = "useshards-%s" % useshards.__version__
        self.assertEqual(name, base + ".tar.gz")
        with tarfile.open(os.path.join(self.out, name)) as tar:
            names = tar.getnames()
        for rel in ("PKG-INFO", "pyproject.toml", "README.md", "_build/backend.py",
                    "src/useshards/__init__.py", "src/useshards/py.typed", "tests/test_build.py"):
            self.assertIn(base + "/" + rel, names)
        self.assertFalse([n for n in names if "__pycache__" in n])

    def test_editable(self) -> None:
        name = backend.build_editable(self.out)
        with zipfile.ZipFile(os.path.join(self.out, name)) as zf:
            pth = zf.read("__editable__.useshards.pth").decode()
            self.assertFalse([n for n in zf.namelist() if n.startswith("useshards/")])
        self.assertEqual(pth.strip(), os.path.join(HERE, "src"))


class TomlSubsetTest(unittest.TestCase):
    """The parser used on Python 3.8-3.10, where tomllib is missing."""

    def test_pyproject_as_tomllib_reads_it(self) -> None:
        text = _read(os.path.join(HERE, "pyproject.toml")).decode("utf-8")
        got = backend.parse_toml_subset(text)
        self.assertEqual(got["project"]["name"], "useshards")
        self.assertEqual(got["build-system"]["requires"], [])
        try:
            import tomllib  # type: ignore[import-not-found]
        except ImportError:
            return
        self.assertEqual(got, tomllib.loads(text))

    def test_values(self) -> None:
        text = (
            '# comment\n'
            'a = "x\\"y\\u00e9" # trailing\n'
            "b = 'C:\\\\raw'\n"
            'c = [\n  "one",  # note\n  "two",\n]\n'
            'd = { file = "LICENSE", n = 3 }\n'
            'e.f = true\n'
            '[t."q k"]\n'
            'g = """\nline1\nline2"""\n'
            'h = 1.5\n'
            '[[arr]]\nx = 1\n[[arr]]\nx = 2\n'
        )
        self.assertEqual(backend.parse_toml_subset(text), {
            "a": 'x"y\u00e9', "b": "C:\\\\raw", "c": ["one", "two"],
            "d": {"file": "LICENSE", "n": 3}, "e": {"f": True},
            "t": {"q k": {"g": "line1\nline2", "h": 1.5}},
            "arr": [{"x": 1}, {"x": 2}],
        })

    def test_errors(self) -> None:
        for bad in ('a = "open\n', "a = 1979-05-27\n", "a = 1\na = 2\n", "a = [1 2]\n"):
            with self.assertRaises(ValueError, msg=bad):
                backend.parse_toml_subset(bad)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


if __name__ == "__main__":
    unittest.main()
