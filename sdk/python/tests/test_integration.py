"""The SDK against a real shard server: the seed 001 example as written,
streaming, fork tags, checkpoint/resume/restore, credentials, environments,
a sandbox's files (FilesTest), and the fork tree, diffs and on-fork hooks
(LineageTest).

Runs only with SHARD_INTEGRATION=1, and then it needs (and fails loudly
without) SHARD_REMOTE, SHARD_API_KEY (scope "*") for an http(s) remote,
SHARD_TEST_PYTHON_IMAGE (an image with python and pip, standing in for
python:3.12-slim) and SHARD_TEST_PIP_INDEX (a PEP 503 index reachable from
inside sandboxes, with requests 2.31.0 and 2.32.3). ProjectTest needs
SHARD_TEST_OTHER_PROJECT_KEY: a key of a project other than SHARD_API_KEY's.
FilesTest and LineageTest need SHARD_REMOTE, SHARD_API_KEY and
SHARD_TEST_PYTHON_IMAGE only.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import secrets
import sys
import tarfile
import tempfile
import time
import unittest
from datetime import datetime, timezone
from typing import Dict, Iterator, List, Optional
from urllib.parse import urlsplit

import fakeserver  # noqa: F401  (puts src/ on sys.path)

from useshards import Environment, Sandbox, Shard, ShardError

INTEGRATION = os.environ.get("SHARD_INTEGRATION") == "1"


def require(name: str) -> str:
    """The variable's value; with SHARD_INTEGRATION=1 a missing one fails the run."""
    v = os.environ.get(name, "")
    if not v:
        raise AssertionError(
            f"SHARD_INTEGRATION=1 but {name} is not set: the integration tests need SHARD_REMOTE, "
            "SHARD_API_KEY, SHARD_TEST_PYTHON_IMAGE and SHARD_TEST_PIP_INDEX"
        )
    return v


def pip_env(index: str) -> Dict[str, str]:
    """Sandbox variables that point the seed's plain `pip install` at the test index."""
    host = urlsplit(index).hostname or ""
    return {
        "PIP_INDEX_URL": index,
        "PIP_TRUSTED_HOST": host,  # a plain-http index is ignored by pip unless trusted
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_ROOT_USER_ACTION": "ignore",
    }


@unittest.skipUnless(INTEGRATION, "set SHARD_INTEGRATION=1 (and SHARD_REMOTE, SHARD_API_KEY, "
                                  "SHARD_TEST_PYTHON_IMAGE, SHARD_TEST_PIP_INDEX) to run against a real server")
class IntegrationTest(unittest.TestCase):
    shard: Shard
    image: str
    env: Dict[str, str]

    @classmethod
    def setUpClass(cls) -> None:
        remote = require("SHARD_REMOTE")
        if remote.startswith(("http://", "https://")):
            require("SHARD_API_KEY")
        cls.image = require("SHARD_TEST_PYTHON_IMAGE")
        cls.env = pip_env(require("SHARD_TEST_PIP_INDEX"))
        cls.shard = Shard()
        cls.addClassCleanup(cls.shard.close)

    def setUp(self) -> None:
        self.uniq = secrets.token_hex(3)

    # -- helpers -------------------------------------------------------------

    def track(self, sb: Sandbox) -> Sandbox:
        """Removes sb when the test ends."""
        self.addCleanup(self.remove_quietly, sb.id)
        return sb

    def remove_quietly(self, id_or_name: str) -> None:
        try:
            self.shard.get(id_or_name).remove(force=True)
        except ShardError as e:
            if e.code != "sandbox_not_found":
                raise

    def remove_env_quietly(self, env: Environment) -> None:
        try:
            env.remove()
        except ShardError as e:
            if e.status != 404:
                raise

    def drop_checkpoints(self, session: str) -> None:
        """Removes the checkpoints of a session (after its sandboxes went)."""
        for c in self.shard.checkpoints():
            if c.session != session or c.kind == "environment":
                continue
            try:
                self.shard.remove_checkpoint(c)
            except ShardError:
                pass

    def create(self, name: Optional[str] = None, memory_mib: int = 256) -> Sandbox:
        sb = self.shard.create(self.image, name=name, memory_mib=memory_mib, env=self.env)
        self.addCleanup(self.drop_checkpoints, sb.session)
        return self.track(sb)

    # -- the seed ------------------------------------------------------------

    def test_seed_001_fork_two_paths(self) -> None:
        """Seed 001's Python example, as written but for the image and env."""
        names = ("base", "try-a", "try-b")
        for n in names:  # leftovers of an interrupted run
            self.remove_quietly(n)
        for n in names:
            self.addCleanup(self.remove_quietly, n)
        python_image = self.image
        pip = self.env

        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            # ---- seed 001 ----
            with Shard() as shard:
                base = shard.create(python_image, name="base", memory_mib=512, env=pip)
                base.exec(["pip", "install", "--quiet", "requests"])

                try_a = base.fork(name="try-a")
                try_b = base.fork(name="try-b")
                try_a.exec(["pip", "install", "--quiet", "requests==2.31.0"])
                try_b.exec(["pip", "install", "--quiet", "--upgrade", "requests"])

                check = ["python", "-c", "import requests; print(requests.__version__)"]
                print(try_a.exec(check).stdout)
                print(try_b.exec(check).stdout)
                try_a.remove(force=True)
            # ---- end of seed 001 ----
        self.addCleanup(self.drop_checkpoints, base.session)
        sys.stderr.write("seed 001 printed: %r\n" % printed.getvalue())

        lines = [ln for ln in printed.getvalue().splitlines() if ln]
        if lines != ["2.31.0", "2.32.3"]:
            diag = [(n, self.shard.get(n).exec(["sh", "-c", "pip list 2>&1; pip install requests 2>&1 | tail -5"]).stdout)
                    for n in ("base", "try-b")]
            self.fail(f"printed {printed.getvalue()!r}, want 2.31.0 then 2.32.3; {diag}")
        # A fork's change never reaches base.
        self.assertEqual(self.shard.get("base").exec(check).stdout, "2.32.3\n")

        # Clean up base and the remaining fork; then nothing of them is left.
        with self.assertRaises(ShardError) as cm:
            self.shard.get("try-a")
        self.assertEqual((cm.exception.code, cm.exception.status), ("sandbox_not_found", 404))
        self.shard.get("try-b").remove(force=True)
        self.shard.get("base").remove(force=True)
        left = {s.name for s in self.shard.list()} & set(names)
        self.assertEqual(left, set())

    # -- streaming -----------------------------------------------------------

    def test_exec_stream_is_live(self) -> None:
        sb = self.create()
        t0 = time.monotonic()
        first: Optional[float] = None
        out: List[bytes] = []
        err: List[bytes] = []
        with sb.exec_stream(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.3; done; echo err >&2"]) as s:
            for chunk in s:
                if first is None:
                    first = time.monotonic() - t0
                    self.assertEqual(chunk.stream, "stdout")
                    self.assertTrue(chunk.data.startswith(b"1"), chunk)
                (out if chunk.stream == "stdout" else err).append(chunk.data)
        total = time.monotonic() - t0
        self.assertEqual(b"".join(out), b"1\n2\n3\n")
        self.assertEqual(b"".join(err), b"err\n")
        self.assertEqual(s.result.exit_code, 0)
        assert first is not None
        self.assertGreaterEqual(total, 0.9)
        self.assertLess(first, total - 0.5, f"first chunk at {first:.3f}s of {total:.3f}s")

    def test_exec_results_and_errors(self) -> None:
        sb = self.create()
        r = sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("out\n", "err\n", 3))
        r = sb.exec(["cat"], stdin="héllo", env={"X": "1"}, workdir="/tmp")
        self.assertEqual(r.stdout, "héllo")
        r = sb.exec(["sleep", "10"], timeout=0.5)
        self.assertTrue(r.timed_out)
        self.assertEqual(r.exit_code, 137)
        with self.assertRaises(ShardError) as cm:
            sb.exec(["no-such-command-here"])
        self.assertEqual(cm.exception.code, "command_not_found")
        with self.assertRaises(ShardError) as cm:
            self.shard.get("no-such-sandbox-" + self.uniq)
        self.assertEqual((cm.exception.code, cm.exception.status), ("sandbox_not_found", 404))
        self.assertEqual(sb.stop().state, "stopped")
        with self.assertRaises(ShardError) as cm:
            sb.exec(["true"])
        self.assertEqual(cm.exception.code, "sandbox_not_running")
        self.assertEqual(sb.start().state, "running")
        self.assertEqual(sb.exec(["true"]).exit_code, 0)

    def test_bad_key_is_unauthenticated(self) -> None:
        remote = os.environ["SHARD_REMOTE"]
        if not remote.startswith(("http://", "https://")):
            self.skipTest("the Unix socket needs no key")
        with Shard(remote, "shk_not_a_key") as bad:
            with self.assertRaises(ShardError) as cm:
                bad.list()
        self.assertEqual((cm.exception.code, cm.exception.status), ("unauthenticated", 401))

    def test_whoami_and_request_id(self) -> None:
        with self.assertRaises(ShardError) as cm:
            self.shard.get("sdkpy-none-" + self.uniq)
        self.assertEqual((cm.exception.code, cm.exception.status), ("sandbox_not_found", 404))
        self.assertTrue(cm.exception.request_id, repr(cm.exception))
        remote = os.environ["SHARD_REMOTE"]
        if not remote.startswith(("http://", "https://")):
            return  # over the Unix socket every request is the administrator's, whatever its key
        tok = self.shard.create_token("sdkpy-whoami-" + self.uniq, ["sandbox:read"])
        self.addCleanup(self.shard.revoke_token, tok)
        assert tok.key is not None
        with Shard(remote, tok.key) as reader:
            w = reader.whoami()
        self.assertEqual((w.name, w.project, w.scopes, w.all_projects), (tok.name, tok.project, ["sandbox:read"], False))

    # -- fork, checkpoint, resume, restore --------------------------------------

    def test_fork_tag_shows_in_checkpoints(self) -> None:
        sb = self.create()
        tag = "tag-" + self.uniq
        f = self.track(sb.fork(tag=tag))
        self.assertNotEqual(f.id, sb.id)
        self.assertEqual(f.info.parent_id, sb.id)
        cks = sb.list_checkpoints()
        self.assertIn((tag, "fork"), [(c.tag, c.kind) for c in cks])

    def test_checkpoint_resume_vs_restore_checkpoint(self) -> None:
        sb = self.create(name="ck-" + self.uniq)
        self.assertEqual(sb.exec(["sh", "-c", "echo one > /root/one"]).exit_code, 0)
        cp = sb.checkpoint(tag="before-two")
        self.assertEqual((cp.kind, cp.tag, cp.sandbox_id), ("checkpoint", "before-two", sb.id))
        self.assertIn(cp.id, [c.id for c in sb.list_checkpoints()])
        self.assertEqual(sb.exec(["sh", "-c", "echo two > /root/two"]).exit_code, 0)

        resumed = self.track(self.shard.resume(sb.session, name="resumed-" + self.uniq))
        self.addCleanup(self.drop_checkpoints, resumed.session)
        restored = self.track(self.shard.restore_checkpoint(cp.id, name="restored-" + self.uniq))
        self.addCleanup(self.drop_checkpoints, restored.session)

        assert resumed.resume_result is not None
        self.assertEqual(resumed.resume_result.checkpoint, cp.id)
        self.assertEqual([r.argv for r in resumed.resume_result.replayed], [["sh", "-c", "echo two > /root/two"]])
        self.assertEqual(resumed.exec(["cat", "/root/one", "/root/two"]).stdout, "one\ntwo\n")
        # restore_checkpoint replays nothing: the later exec's file is not there.
        self.assertEqual(restored.exec(["cat", "/root/one"]).stdout, "one\n")
        self.assertEqual(restored.exec(["test", "-e", "/root/two"]).exit_code, 1)
        self.assertEqual(len({sb.id, resumed.id, restored.id}), 3)

    # -- credentials -----------------------------------------------------------

    def test_credentials_reach_execs_and_forks(self) -> None:
        name = "SDKPY_SECRET_" + self.uniq.upper()
        value = "v-" + secrets.token_hex(8)
        sb = self.create()
        sb.credentials.set(name, value)
        self.addCleanup(self.shard.remove_secret, name)
        self.assertIn(name, [g.secret for g in sb.info.grants])
        self.assertEqual(sb.exec(["printenv", name]).stdout, value + "\n")
        f = self.track(sb.fork())
        self.assertEqual(f.exec(["printenv", name]).stdout, value + "\n")
        sb.credentials.set(name + "_F", "in a file", file="/run/sdkpy-secret")
        self.addCleanup(self.shard.remove_secret, name + "_F")
        self.assertEqual(sb.exec(["cat", "/run/sdkpy-secret"]).stdout, "in a file")
        sb.credentials.delete(name)
        self.assertEqual(sb.exec(["printenv", name]).exit_code, 1)
        self.assertEqual(f.exec(["printenv", name]).stdout, value + "\n")  # the fork's own copy

    # -- environments ------------------------------------------------------------

    def test_environment_sets_up_once(self) -> None:
        calls: List[str] = []

        def setup(sb: Sandbox) -> None:
            calls.append(sb.id)
            r = sb.exec(["sh", "-c", "echo ran >> /root/setup.log"])
            assert r.exit_code == 0, r

        name = "sdkpy-env-" + self.uniq
        env = self.shard.environment(name, image=self.image, memory_mib=256, setup=setup)
        self.addCleanup(self.remove_env_quietly, env)
        a = self.track(env.sandbox())
        b = self.track(env.sandbox())
        self.assertEqual(len(calls), 1)
        self.assertTrue(env.built)
        for sb in (a, b):
            self.assertEqual(sb.exec(["cat", "/root/setup.log"]).stdout, "ran\n")
        # Another client, the same definition: found unchanged, no setup.
        with Shard() as other:
            env2 = other.environment(name, image=self.image, memory_mib=256, setup=setup)
            c = self.track(env2.sandbox())
            self.assertFalse(env2.built)
            self.assertEqual(c.exec(["cat", "/root/setup.log"]).stdout, "ran\n")
        self.assertEqual(len(calls), 1)
        # The setup sandbox is gone.
        with self.assertRaises(ShardError):
            self.shard.get(calls[0])


@unittest.skipUnless(INTEGRATION, "set SHARD_INTEGRATION=1 (and SHARD_REMOTE, SHARD_API_KEY, SHARD_TEST_PYTHON_IMAGE, "
                                  "SHARD_TEST_OTHER_PROJECT_KEY) to run against a real server")
class ProjectTest(unittest.TestCase):
    """Projects: SHARD_TEST_OTHER_PROJECT_KEY, a key made for a project that
    is not SHARD_API_KEY's, cannot see this client's sandboxes."""

    def test_another_projects_key_cannot_see_the_sandbox(self) -> None:
        require("SHARD_REMOTE")
        other_key = require("SHARD_TEST_OTHER_PROJECT_KEY")
        image = require("SHARD_TEST_PYTHON_IMAGE")
        with Shard() as shard, Shard(api_key=other_key) as other:
            sb = shard.create(image, name="sdkpy-proj-" + secrets.token_hex(3), memory_mib=128)
            try:
                mine = sb.info.project
                self.assertTrue(mine, sb.info.raw)
                for ref in (sb.id, sb.name):
                    with self.assertRaises(ShardError) as cm:
                        other.get(ref)
                    self.assertEqual((cm.exception.code, cm.exception.status), ("sandbox_not_found", 404))
                self.assertNotIn(sb.id, [s.id for s in other.list()])
                self.assertIn(sb.id, [s.id for s in shard.list()])
                # Naming this client's project with the other key is refused.
                with Shard(api_key=other_key, project=mine) as wrong:
                    with self.assertRaises(ShardError) as cm:
                        wrong.list()
                    self.assertEqual((cm.exception.code, cm.exception.status), ("wrong_project", 403))
            finally:
                sb.remove(force=True)


@unittest.skipUnless(INTEGRATION, "set SHARD_INTEGRATION=1 (and SHARD_REMOTE, SHARD_API_KEY, SHARD_TEST_PYTHON_IMAGE) "
                                  "to run against a real server")
class FilesTest(unittest.TestCase):
    """sandbox.files: a few MiB of binary written and read back (whole and
    streamed), options, list, stat, remove, a tar written and read back,
    the API's error codes, and a stopped sandbox's files."""

    shard: Shard
    sb: Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        remote = require("SHARD_REMOTE")
        if remote.startswith(("http://", "https://")):
            require("SHARD_API_KEY")
        image = require("SHARD_TEST_PYTHON_IMAGE")
        cls.shard = Shard()
        cls.addClassCleanup(cls.shard.close)
        cls.sb = cls.shard.create(image, name="sdkpy-files-" + secrets.token_hex(3), memory_mib=256)
        cls.addClassCleanup(cls.sb.remove, force=True)

    def code(self, fn: "object") -> "tuple[str, int]":
        with self.assertRaises(ShardError) as cm:
            fn()  # type: ignore[operator]
        return (cm.exception.code, cm.exception.status)

    def test_binary_round_trip_whole_and_streamed(self) -> None:
        f = self.sb.files
        data = os.urandom(5 << 20)
        res = f.write("/root/blob.bin", data)
        self.assertEqual((res.path, res.bytes, res.files), ("/root/blob.bin", len(data), 1))
        self.assertEqual(self.sb.exec(["sha256sum", "/root/blob.bin"]).stdout.split()[0], hashlib.sha256(data).hexdigest())
        self.assertEqual(f.read("/root/blob.bin"), data)

        # Streamed both ways: 12 MiB made on the fly, hashed as it comes back.
        want = hashlib.sha256()

        def gen() -> Iterator[bytes]:
            for _ in range(12):
                c = os.urandom(1 << 20)
                want.update(c)
                yield c

        self.assertEqual(f.write_stream("/root/stream.bin", gen(), mode=0o600).bytes, 12 << 20)
        # Checked inside too, so a mismatch says which way went wrong.
        self.assertEqual(self.sb.exec(["sha256sum", "/root/stream.bin"]).stdout.split()[0], want.hexdigest(), "written")
        got = hashlib.sha256()
        n = 0
        with f.read_stream("/root/stream.bin") as r:
            self.assertEqual((r.info.size, r.info.mode), (12 << 20, 0o600))
            for chunk in r:
                got.update(chunk)
                n += 1
        self.assertGreater(n, 1)
        self.assertEqual(got.hexdigest(), want.hexdigest(), "read back")

        # A real file goes with its length; read back into one.
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "src.bin")
            with open(src, "wb") as out:
                out.write(data[: 3 << 20])
            with open(src, "rb") as inp:
                f.write_stream("/root/from-file.bin", inp)
            self.assertEqual(
                self.sb.exec(["sha256sum", "/root/from-file.bin"]).stdout.split()[0],
                hashlib.sha256(data[: 3 << 20]).hexdigest(),
                "written",
            )
            dst = os.path.join(d, "dst.bin")
            with f.read_stream("/root/from-file.bin") as r, open(dst, "wb") as out:
                import shutil

                shutil.copyfileobj(r, out)
            with open(dst, "rb") as back:
                self.assertEqual(back.read(), data[: 3 << 20])

    def test_options_stat_list_remove_and_error_codes(self) -> None:
        f = self.sb.files
        mtime = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
        f.write("/srv/app/bin/run.sh", "#!/bin/sh\necho ran\n", mode=0o755, uid=1000, gid=1000, mtime=mtime, parents=True)
        self.assertEqual(self.sb.exec(["/srv/app/bin/run.sh"]).stdout, "ran\n")
        st = f.stat("/srv/app/bin/run.sh")
        self.assertEqual((st.name, st.path, st.type, st.size, st.mode, st.uid, st.gid, st.mtime),
                         ("run.sh", "/srv/app/bin/run.sh", "file", 19, 0o755, 1000, 1000, mtime))
        self.sb.exec(["ln", "-s", "bin/run.sh", "/srv/app/run"])
        link = f.stat("/srv/app/run")
        self.assertEqual((link.type, link.link), ("symlink", "bin/run.sh"))
        self.assertEqual(f.stat("/srv/app/run", follow_link=True).type, "file")
        self.assertEqual(f.read_text("/srv/app/run"), "#!/bin/sh\necho ran\n")  # a read follows a symlink

        for n in ("c", "a", "b"):
            f.write(f"/srv/app/{n}.txt", n)
        ls = f.list("/srv/app")
        self.assertEqual([f"{e.name}:{e.type}" for e in ls], ["a.txt:file", "b.txt:file", "bin:dir", "c.txt:file", "run:symlink"])
        self.assertFalse(ls.truncated)
        some = f.list("/srv/app", limit=2)
        self.assertEqual((len(some), some.truncated), (2, True))

        gone = f.remove("/srv/app/a.txt")
        self.assertEqual((gone.path, gone.type, gone.size), ("/srv/app/a.txt", "file", 1))
        self.assertFalse(f.exists("/srv/app/a.txt"))

        self.assertEqual(self.code(lambda: f.read("/srv/app/a.txt")), ("file_not_found", 404))
        self.assertEqual(self.code(lambda: f.stat("/no/such/file")), ("file_not_found", 404))
        self.assertEqual(self.code(lambda: f.read("/srv/app")), ("is_a_directory", 400))
        self.assertEqual(self.code(lambda: f.list("/srv/app/b.txt")), ("not_a_directory", 400))
        self.assertEqual(self.code(lambda: f.write("/no/such/dir/f", b"x")), ("file_not_found", 404))
        self.assertEqual(self.code(lambda: f.stat("relative/path")), ("invalid_path", 400))
        self.assertEqual(self.code(lambda: f.remove("/srv/app")), ("directory_not_empty", 409))
        # A stream refused before its body is sent: the error, not a broken connection.
        big = (os.urandom(1 << 20) for _ in range(64))
        self.assertEqual(self.code(lambda: f.write_stream("/no/such/dir/big", big)), ("file_not_found", 404))
        f.remove("/srv/app", recursive=True)
        self.assertTrue(f.exists("/srv"))
        self.assertFalse(f.exists("/srv/app"))

    def test_tar_written_then_read_back(self) -> None:
        f = self.sb.files
        blob = os.urandom(300_000)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            def add(name: str, data: Optional[bytes] = None, mode: int = 0o644, kind: bytes = tarfile.REGTYPE, link: str = "", uid: int = 0) -> None:
                ti = tarfile.TarInfo(name)
                ti.type, ti.mode, ti.linkname, ti.uid, ti.gid, ti.mtime = kind, mode, link, uid, uid, 1_700_000_000
                ti.size = len(data) if data is not None else 0
                tar.addfile(ti, io.BytesIO(data) if data is not None else None)

            add("proj", mode=0o750, kind=tarfile.DIRTYPE)
            add("proj/README", b"hello tar\n", uid=1000)
            add("proj/data", mode=0o755, kind=tarfile.DIRTYPE)
            add("proj/data/blob.bin", blob, mode=0o600)
            add("proj/link", kind=tarfile.SYMTYPE, link="README")
        buf.seek(0)
        res = f.write_archive("/work", buf)  # a file object: streamed
        self.assertEqual((res.path, res.bytes), ("/work", 10 + len(blob)))
        self.assertGreaterEqual(res.files, 5)
        self.assertEqual(self.sb.exec(["cat", "/work/proj/link"]).stdout, "hello tar\n")
        self.assertEqual(self.sb.exec(["stat", "-c", "%a %u", "/work/proj/README"]).stdout, "644 1000\n")

        with f.read_archive("/work/proj") as r, tarfile.open(fileobj=r, mode="r|") as tar:
            self.assertTrue(r.info.is_dir)
            got = {}
            for m in tar:
                ex = tar.extractfile(m) if m.isfile() else None
                got[m.name] = (m.type, m.mode & 0o7777, m.uid, m.linkname, ex.read() if ex else None)
        self.assertEqual(sorted(got), ["proj", "proj/README", "proj/data", "proj/data/blob.bin", "proj/link"])
        self.assertEqual(got["proj/README"], (tarfile.REGTYPE, 0o644, 1000, "", b"hello tar\n"))
        self.assertEqual(got["proj/data/blob.bin"][1:], (0o600, 0, "", blob))
        self.assertEqual((got["proj/link"][0], got["proj/link"][3]), (tarfile.SYMTYPE, "README"))
        self.assertEqual(got["proj"][1], 0o750)

        # Whole bytes work too; an entry that leads out is refused.
        one = io.BytesIO()
        with tarfile.open(fileobj=one, mode="w") as tar:
            ti = tarfile.TarInfo("one.txt")
            ti.size = 1
            tar.addfile(ti, io.BytesIO(b"1"))
        f.write_archive("/work2", one.getvalue())
        self.assertEqual(f.read_text("/work2/one.txt"), "1")
        bad = io.BytesIO()
        with tarfile.open(fileobj=bad, mode="w") as tar:
            ti = tarfile.TarInfo("../escape.txt")
            ti.size = 1
            tar.addfile(ti, io.BytesIO(b"x"))
        self.assertEqual(self.code(lambda: f.write_archive("/work3", bad.getvalue())), ("unsafe_archive", 400))
        self.assertFalse(f.exists("/escape.txt"))

    def test_stopped_sandbox_files_by_name(self) -> None:
        sb = self.shard.create(require("SHARD_TEST_PYTHON_IMAGE"), name="sdkpy-files-stop-" + secrets.token_hex(3), memory_mib=256)
        try:
            sb.files.write("/root/before.txt", "before stop\n")
            sb.stop()
            files = self.shard.files(sb.name)
            self.assertEqual(files.read_text("/root/before.txt"), "before stop\n")
            files.write("/root/while-stopped.txt", "written while stopped\n", mode=0o640)
            self.assertEqual(files.stat("/root/while-stopped.txt").mode, 0o640)
            sb.start()
            self.assertEqual(sb.exec(["cat", "/root/while-stopped.txt"]).stdout, "written while stopped\n")
        finally:
            sb.remove(force=True)


@unittest.skipUnless(INTEGRATION, "set SHARD_INTEGRATION=1 (and SHARD_REMOTE, SHARD_API_KEY, SHARD_TEST_PYTHON_IMAGE) "
                                  "to run against a real server")
class LineageTest(unittest.TestCase):
    """The fork tree, diffs and on-fork hooks: a base sandbox and two forks;
    the tree of one; a file written in one fork, against the other and
    against its fork point; a hook that fails, ignored and not."""

    shard: Shard

    @classmethod
    def setUpClass(cls) -> None:
        remote = require("SHARD_REMOTE")
        if remote.startswith(("http://", "https://")):
            require("SHARD_API_KEY")
        cls.shard = Shard()
        cls.addClassCleanup(cls.shard.close)

    def drop_checkpoints(self, session: str) -> None:
        for c in self.shard.checkpoints():
            if c.session == session and c.kind != "environment":
                try:
                    self.shard.remove_checkpoint(c)
                except ShardError:
                    pass

    def remove_quietly(self, sb: Sandbox) -> None:
        try:
            sb.remove(force=True)
        except ShardError as e:
            if e.code != "sandbox_not_found":
                raise

    def test_tree_diff_and_fork_hooks(self) -> None:
        u = secrets.token_hex(3)
        base = self.shard.create(require("SHARD_TEST_PYTHON_IMAGE"), name=f"sdkpy-tree-{u}", memory_mib=256)
        self.addCleanup(self.drop_checkpoints, base.session)  # the forks' checkpoints are in the source's session
        self.addCleanup(self.remove_quietly, base)
        self.assertEqual(base.exec(["sh", "-c", "mkdir -p /app && echo base > /app/notes"]).exit_code, 0)
        a = base.fork(name=f"sdkpy-tree-a-{u}", tag="tree-a")
        self.addCleanup(self.remove_quietly, a)
        b = base.fork(name=f"sdkpy-tree-b-{u}")
        self.addCleanup(self.remove_quietly, b)

        # The tree of a fork: the base as root, a fork checkpoint per fork, the forks under them.
        root = a.tree()
        self.assertEqual((root.kind, root.id, root.name, root.state, root.removed, root.via),
                         ("sandbox", base.id, base.name, "running", False, None))
        self.assertIsNotNone(root.at)
        cks = [c for c in root.children if c.kind == "checkpoint"]
        self.assertEqual([(c.via, c.state) for c in cks], [("fork", "kept")] * 2, root)
        self.assertIn("tree-a", [c.name for c in cks])  # a checkpoint's name is its tag
        forks = [n for c in cks for n in c.children]
        self.assertEqual(sorted(n.id for n in forks), sorted([a.id, b.id]))
        for n in forks:
            self.assertEqual((n.kind, n.via, n.state, n.removed, n.image), ("sandbox", "fork", "running", False, base.info.image))
        # The project's tree has the lineage; a tree by name is the same root.
        self.assertTrue(any(r.find(b.id) for r in self.shard.tree()))
        self.assertEqual([r.id for r in self.shard.tree(b.name)], [base.id])

        # A file written in fork a: added from b to a, and since a's fork point.
        a.files.write("/app/only-in-a.txt", "hello from a\n")
        d = a.diff(b, patch=True)
        self.assertEqual((d.from_.kind, d.from_.id, d.from_.name), ("sandbox", b.id, b.name))
        self.assertEqual((d.to.kind, d.to.id, d.to.name), ("sandbox", a.id, a.name))
        added = d.get("/app/only-in-a.txt")
        assert added is not None, [(c.kind, c.path) for c in d]
        self.assertEqual((added.kind, added.type, added.size_a, added.size_b), ("added", "file", 0, 13))
        self.assertIn("+hello from a", added.patch or "")
        self.assertGreaterEqual(d.added, 1)
        self.assertFalse(d.truncated)
        self.assertFalse([c.path for c in d if c.path.startswith("/run/shard") or c.path == "/etc/hostname"])
        own = a.diff()
        self.assertEqual((own.from_.kind, own.to.id), ("checkpoint", a.id))
        self.assertEqual(getattr(own.get("/app/only-in-a.txt"), "kind", None), "added")
        self.assertIsNone(own.get("/app/notes"))  # a had it from its source: no change since the fork
        back = self.shard.diff(b.name, a.name)
        self.assertEqual(getattr(back.get("/app/only-in-a.txt"), "kind", None), "removed")

        # On-fork hooks: one that fails refuses a fork (nothing is left), unless its errors are ignored.
        base.files.write("/etc/shard/on-fork.d/50-lease", "#!/bin/sh\necho cannot get a lease >&2\nexit 3\n", mode=0o755, parents=True)
        kept = base.fork(name=f"sdkpy-tree-kept-{u}", hook_errors="ignore", hook_timeout=20)
        self.addCleanup(self.remove_quietly, kept)
        self.assertEqual(kept.exec(["echo", "up"]).stdout, "up\n")
        page = self.shard._t.request("GET", f"/ledger/sessions/{kept.session}/events")
        runs = [e.get("data") or {} for e in page["events"] if e["type"] == "sandbox.fork_hook"]
        self.assertIn(("50-lease", 3), [(r.get("hook"), r.get("exit_code")) for r in runs], runs)
        with self.assertRaises(ShardError) as cm:
            base.fork(name=f"sdkpy-tree-refused-{u}")
        self.assertEqual((cm.exception.code, cm.exception.status), ("fork_hook_failed", 422))
        self.assertIn("50-lease", cm.exception.message)
        with self.assertRaises(ShardError) as cm:
            self.shard.get(f"sdkpy-tree-refused-{u}")
        self.assertEqual(cm.exception.code, "sandbox_not_found")
        self.assertEqual(base.exec(["echo", "still"]).stdout, "still\n")  # the source runs on


if __name__ == "__main__":
    unittest.main()
