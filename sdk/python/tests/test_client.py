"""Unit tests of the SDK against a fake server (no shard needed)."""

from __future__ import annotations

import base64
import os
import socket
import threading
import time
import unittest
from datetime import datetime, timezone
from typing import Any, Dict, List
from unittest import mock

from fakeserver import FakeServer, Handler, Recorded, sandbox_json

from useshards import (
    Checkpoint,
    Chunk,
    ExecResult,
    Project,
    ProjectQuota,
    ProjectUse,
    Sandbox,
    SandboxInfo,
    Shard,
    ShardError,
    Whoami,
)


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


SB = sandbox_json()
PATH = f"/sandboxes/{SB['id']}"


def exec_route(events: List[Dict[str, Any]], delay: float = 0.0) -> Any:
    """An exec answer that writes these events, one line each, delay apart."""

    def fn(h: Handler, rec: Recorded) -> None:
        h.start_stream()
        for i, ev in enumerate(events):
            if i and delay:
                time.sleep(delay)
            h.write_line(ev)
        h.end_stream()

    return fn


class Base(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = FakeServer().start()
        self.addCleanup(self.fake.stop)
        self.fake.route("POST", "/sandboxes", status=201, body=SB)
        self.fake.route("GET", PATH, body=SB)
        self.shard = Shard(self.fake.url, "shk_test_key")
        self.addCleanup(self.shard.close)

    def sandbox(self) -> Sandbox:
        return self.shard.create("python:3.12-slim", name="base", memory_mib=512)


class ExecTest(Base):
    def test_exec_collects_stdout_stderr_and_exit(self) -> None:
        self.fake.route(
            "POST",
            PATH + "/exec",
            exec_route(
                [
                    {"type": "started", "pid": 7},
                    {"type": "stdout", "data": b64("hel")},
                    {"type": "stderr", "data": b64("warn\n")},
                    {"type": "stdout", "data": b64("lo\n")},
                    {"type": "exit", "exit_code": 0},
                ]
            ),
        )
        sb = self.sandbox()
        res = sb.exec(["python", "-c", "print('hello')"])
        self.assertIsInstance(res, ExecResult)
        self.assertEqual(res.stdout, "hello\n")
        self.assertEqual(res.stderr, "warn\n")
        self.assertEqual(res.stdout_bytes, b"hello\n")
        self.assertEqual(res.exit_code, 0)
        self.assertTrue(res.ok)
        self.assertIsNone(res.signal)
        self.assertEqual(self.fake.last("POST", PATH + "/exec").json, {"argv": ["python", "-c", "print('hello')"]})

    def test_nonzero_exit_is_a_result_not_an_exception(self) -> None:
        self.fake.route(
            "POST",
            PATH + "/exec",
            exec_route(
                [
                    {"type": "started", "pid": 7},
                    {"type": "stderr", "data": b64("boom\n")},
                    {"type": "exit", "exit_code": 137, "signal": 9, "timed_out": True},
                ]
            ),
        )
        res = self.sandbox().exec("sleep 100", timeout=0.5)
        self.assertEqual(res.exit_code, 137)
        self.assertEqual(res.signal, 9)
        self.assertTrue(res.timed_out)
        self.assertFalse(res.oom_killed)
        self.assertFalse(res.ok)
        self.assertEqual(res.stderr, "boom\n")
        self.assertEqual(self.fake.last("POST", PATH + "/exec").json, {"argv": ["sh", "-c", "sleep 100"], "timeout": 0.5})

    def test_exec_options_on_the_wire(self) -> None:
        self.fake.route("POST", PATH + "/exec", exec_route([{"type": "exit", "exit_code": 0}]))
        self.sandbox().exec(["cat"], env={"A": "1"}, workdir="/tmp", user="nobody", stdin=b"\x00hi", tty=True)
        self.assertEqual(
            self.fake.last("POST", PATH + "/exec").json,
            {"argv": ["cat"], "env": {"A": "1"}, "workdir": "/tmp", "user": "nobody", "stdin": "AGhp", "tty": True},
        )

    def test_invalid_utf8_is_replaced(self) -> None:
        self.fake.route(
            "POST",
            PATH + "/exec",
            exec_route([{"type": "stdout", "data": base64.b64encode(b"a\xffb").decode()}, {"type": "exit", "exit_code": 0}]),
        )
        res = self.sandbox().exec(["x"])
        self.assertEqual(res.stdout, "a\ufffdb")
        self.assertEqual(res.stdout_bytes, b"a\xffb")

    def test_bad_argv(self) -> None:
        sb = self.sandbox()
        with self.assertRaises(TypeError):
            sb.exec([])
        with self.assertRaises(TypeError):
            sb.exec([1])  # type: ignore[list-item]


class StreamTest(Base):
    def test_first_chunk_arrives_before_the_last_line_is_written(self) -> None:
        go_on = threading.Event()
        wrote_exit = threading.Event()

        def fn(h: Handler, rec: Recorded) -> None:
            h.start_stream()
            h.write_line({"type": "started", "pid": 1})
            h.write_line({"type": "stdout", "data": b64("1\n")})
            go_on.wait(10)
            h.write_line({"type": "stderr", "data": b64("err\n")})
            h.write_line({"type": "stdout", "data": b64("2\n")})
            h.write_line({"type": "exit", "exit_code": 4})
            wrote_exit.set()
            h.end_stream()

        self.fake.route("POST", PATH + "/exec", fn)
        sb = self.sandbox()
        with sb.exec_stream(["sh", "-c", "..."]) as s:
            first = next(s)
            self.assertEqual(first, Chunk("stdout", b"1\n"))
            self.assertFalse(wrote_exit.is_set(), "the first chunk came only after the whole stream")
            self.assertEqual(s.pid, 1)
            self.assertFalse(s.done)
            with self.assertRaises(RuntimeError):
                s.result
            go_on.set()
            rest = list(s)
        self.assertEqual(rest, [Chunk("stderr", b"err\n"), Chunk("stdout", b"2\n")])
        self.assertEqual(rest[0].text, "err\n")
        self.assertEqual(s.result.exit_code, 4)
        self.assertTrue(s.done)

    def test_chunks_come_as_the_server_writes_them(self) -> None:
        events = [{"type": "started", "pid": 1}]
        events += [{"type": "stdout", "data": b64(f"{i}\n")} for i in (1, 2, 3)]
        events += [{"type": "exit", "exit_code": 0}]
        self.fake.route("POST", PATH + "/exec", exec_route(events, delay=0.25))
        sb = self.sandbox()
        t0 = time.monotonic()
        s = sb.exec_stream(["x"])
        times = []
        for c in s:
            times.append(time.monotonic() - t0)
        total = time.monotonic() - t0
        self.assertEqual(len(times), 3)
        self.assertGreater(total, 0.9)
        self.assertLess(times[0], total - 0.5, f"first chunk at {times[0]:.2f}s of {total:.2f}s")
        self.assertEqual(s.wait().exit_code, 0)

    def test_leaving_early_closes_and_the_client_still_works(self) -> None:
        release = threading.Event()

        def fn(h: Handler, rec: Recorded) -> None:
            h.start_stream()
            h.write_line({"type": "stdout", "data": b64("x")})
            release.wait(5)
            try:
                h.write_line({"type": "exit", "exit_code": 0})
                h.end_stream()
            except OSError:
                pass
            h.close_connection = True

        self.fake.route("POST", PATH + "/exec", fn)
        sb = self.sandbox()
        with sb.exec_stream(["x"]) as s:
            self.assertEqual(next(s).data, b"x")
        release.set()
        self.assertEqual(list(s), [])
        with self.assertRaises(RuntimeError):
            s.result
        self.assertEqual(sb.refresh().state, "running")

    def test_error_event_and_early_end(self) -> None:
        self.fake.route(
            "POST",
            PATH + "/exec",
            exec_route([{"type": "stdout", "data": b64("a")}, {"type": "error", "data": b64("agent connection lost")}]),
        )
        sb = self.sandbox()
        with self.assertRaises(ShardError) as cm:
            sb.exec(["x"])
        self.assertEqual((cm.exception.code, cm.exception.status, cm.exception.message), ("sandbox_unreachable", 502, "agent connection lost"))

        self.fake.route("POST", PATH + "/exec", exec_route([{"type": "stdout", "data": b64("a")}]))
        with self.assertRaises(ShardError) as cm:
            sb.exec(["x"])
        self.assertEqual(cm.exception.code, "stream_ended")

    def test_connection_reused_after_a_stream(self) -> None:
        self.fake.route("POST", PATH + "/exec", exec_route([{"type": "exit", "exit_code": 0}]))
        sb = self.sandbox()
        for _ in range(5):
            sb.exec(["true"])
        sb.refresh()
        self.assertEqual(self.fake.connections, 1)


class ErrorTest(Base):
    def test_error_body_becomes_shard_error(self) -> None:
        self.fake.route("GET", "/sandboxes/nope", status=404, body={"code": "sandbox_not_found", "message": "sandbox nope not found"})
        with self.assertRaises(ShardError) as cm:
            self.shard.get("nope")
        e = cm.exception
        self.assertEqual((e.code, e.status, e.message, str(e)), ("sandbox_not_found", 404, "sandbox nope not found", "sandbox nope not found"))

    def test_request_id_of_an_error_answer(self) -> None:
        self.fake.route("GET", "/sandboxes/nope", status=404, body={"code": "sandbox_not_found", "message": "sandbox nope not found"})
        with self.assertRaises(ShardError) as cm:
            self.shard.get("nope")
        rid = self.fake.last("GET", "/sandboxes/nope").request_id
        self.assertRegex(rid, r"^fake-\d+$")
        self.assertEqual(cm.exception.request_id, rid)
        self.assertIn(f"request_id={rid!r}", repr(cm.exception))
        # An answer that is not {code, message}, and one to a stream, carry it too.
        self.fake.route("GET", "/sandboxes", lambda h, r: h.send_raw(502, b"Bad Gateway\n"))
        with self.assertRaises(ShardError) as cm:
            self.shard.list()
        self.assertEqual((cm.exception.code, cm.exception.request_id), ("http_502", self.fake.last("GET", "/sandboxes").request_id))
        self.fake.route("POST", PATH + "/exec", status=409, body={"code": "sandbox_not_running", "message": "sandbox base is stopped"})
        sb = self.sandbox()
        with self.assertRaises(ShardError) as cm:
            sb.exec(["true"])
        self.assertEqual((cm.exception.code, cm.exception.request_id), ("sandbox_not_running", self.fake.last("POST", PATH + "/exec").request_id))

    def test_no_request_id_without_an_answer(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        with Shard(f"http://127.0.0.1:{port}", "k") as shard:
            with self.assertRaises(ShardError) as cm:
                shard.list()
        self.assertEqual((cm.exception.code, cm.exception.request_id), ("unreachable", None))
        self.assertNotIn("request_id", repr(cm.exception))
        self.shard.close()
        with self.assertRaises(ShardError) as cm:
            self.shard.list()
        self.assertEqual((cm.exception.code, cm.exception.request_id), ("closed", None))

    def test_exec_refused_before_start(self) -> None:
        self.fake.route(
            "POST",
            PATH + "/exec",
            status=409,
            body={"code": "sandbox_frozen", "message": "a fork holds the sandbox frozen, and nothing starts in it until that ends: run the command again"},
        )
        sb = self.sandbox()
        with self.assertRaises(ShardError) as cm:
            sb.exec(["true"])
        self.assertEqual((cm.exception.code, cm.exception.status), ("sandbox_frozen", 409))
        self.assertEqual(sb.refresh().id, SB["id"])  # the connection is still good

    def test_non_json_error(self) -> None:
        self.fake.route("GET", "/sandboxes", lambda h, r: h.send_raw(502, b"Bad Gateway\n"))
        with self.assertRaises(ShardError) as cm:
            self.shard.list()
        self.assertEqual((cm.exception.code, cm.exception.status), ("http_502", 502))
        self.assertIn("Bad Gateway", cm.exception.message)

    def test_bad_json_answer(self) -> None:
        self.fake.route("GET", "/sandboxes", lambda h, r: h.send_raw(200, b"{nope", "application/json"))
        with self.assertRaises(ShardError) as cm:
            self.shard.list()
        self.assertEqual(cm.exception.code, "bad_response")

    def test_unreachable(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        with Shard(f"http://127.0.0.1:{port}", "k") as shard:
            with self.assertRaises(ShardError) as cm:
                shard.list()
        self.assertEqual((cm.exception.code, cm.exception.status), ("unreachable", 0))
        self.assertIn(f"127.0.0.1:{port}", cm.exception.message)
        with Shard("unix:///nonexistent/shard.sock") as shard:
            with self.assertRaises(ShardError) as cm:
                shard.list()
        self.assertEqual(cm.exception.code, "unreachable")

    def test_bad_remote(self) -> None:
        for bad in ("ftp://x", "10.0.0.5:7070", "http://", "unix://"):
            with self.assertRaises(ShardError, msg=bad) as cm:
                Shard(bad)
            self.assertEqual(cm.exception.code, "invalid_argument")

    def test_closed_client(self) -> None:
        self.shard.close()
        with self.assertRaises(ShardError) as cm:
            self.shard.list()
        self.assertEqual(cm.exception.code, "closed")


class AuthAndEnvTest(unittest.TestCase):
    def test_bearer_header(self) -> None:
        with FakeServer() as fake:
            fake.route("GET", "/sandboxes", body={"sandboxes": []})
            with Shard(fake.url, "shk_abc") as shard:
                self.assertEqual(shard.list(), [])
            self.assertEqual(fake.last("GET", "/sandboxes").headers.get("Authorization"), "Bearer shk_abc")
            with mock.patch.dict(os.environ, {"SHARD_API_KEY": ""}):
                with Shard(fake.url) as shard:
                    shard.list()
            self.assertNotIn("Authorization", fake.last("GET", "/sandboxes").headers)

    def test_env_vars(self) -> None:
        with FakeServer() as fake:
            fake.route("GET", "/sandboxes", body={"sandboxes": [sandbox_json(), sandbox_json(id="ba9876543210", name="b")]})
            with mock.patch.dict(os.environ, {"SHARD_REMOTE": fake.url + "/", "SHARD_API_KEY": "shk_from_env"}):
                with Shard() as shard:
                    self.assertEqual(shard.remote, fake.url + "/")
                    names = [s.name for s in shard.list()]
            self.assertEqual(names, ["base", "b"])
            rec = fake.last("GET", "/sandboxes")
            self.assertEqual(rec.headers.get("Authorization"), "Bearer shk_from_env")
            self.assertTrue(rec.headers.get("User-Agent", "").startswith("useshards-python"))

    def test_arguments_win_over_env(self) -> None:
        with FakeServer() as fake:
            fake.route("GET", "/sandboxes", body={"sandboxes": []})
            with mock.patch.dict(os.environ, {"SHARD_REMOTE": "http://127.0.0.1:1", "SHARD_API_KEY": "env"}):
                with Shard(fake.url, "arg") as shard:
                    shard.list()
            self.assertEqual(fake.last("GET", "/sandboxes").headers.get("Authorization"), "Bearer arg")

    def test_project_header_on_every_request(self) -> None:
        with FakeServer() as fake:
            fake.route("POST", "/sandboxes", status=201, body=sandbox_json(project="team-a"))
            fake.route("GET", PATH, body=sandbox_json(project="team-a"))
            fake.route("GET", "/sandboxes", body={"sandboxes": []})
            fake.route("POST", PATH + "/exec", exec_route([{"type": "stdout", "data": b64("1\n")}, {"type": "exit", "exit_code": 0}]))
            with mock.patch.dict(os.environ, {"SHARD_PROJECT": "from-env"}):
                with Shard(fake.url, "k", project="team-a") as shard:
                    self.assertEqual(shard.project, "team-a")
                    sb = shard.create("busybox")
                    self.assertEqual(sb.info.project, "team-a")
                    sb.refresh()
                    self.assertEqual(sb.exec(["echo", "1"]).stdout, "1\n")
                    with sb.exec_stream(["echo", "1"]) as st:
                        st.wait()
                    shard.list()
            self.assertEqual(len(fake.requests), 5)
            for rec in fake.requests:
                self.assertEqual(rec.headers.get("Shard-Project"), "team-a", f"{rec.method} {rec.path}")
            with mock.patch.dict(os.environ, {"SHARD_PROJECT": "from-env"}):
                with Shard(fake.url, "k") as shard:
                    self.assertEqual(shard.project, "from-env")
                    shard.list()
            self.assertEqual(fake.last("GET", "/sandboxes").headers.get("Shard-Project"), "from-env")
            with mock.patch.dict(os.environ, {"SHARD_PROJECT": ""}):
                with Shard(fake.url, "k") as shard:
                    self.assertEqual(shard.project, "")
                    shard.list()
            self.assertNotIn("Shard-Project", fake.last("GET", "/sandboxes").headers)

    def test_list_all_projects(self) -> None:
        with FakeServer() as fake:
            fake.route(
                "GET",
                "/sandboxes",
                body={"sandboxes": [sandbox_json(project="team-a"), sandbox_json(id="ba9876543210", name="b", project="team-b")]},
            )
            with Shard(fake.url, "k") as shard:
                sbs = shard.list(all_projects=True)
                self.assertEqual(fake.last("GET", "/sandboxes").query, {"all_projects": ["true"]})
                self.assertEqual([(s.info.project, s.name) for s in sbs], [("team-a", "base"), ("team-b", "b")])
                shard.list()
                self.assertEqual(fake.last("GET", "/sandboxes").query, {})
            fake.route("GET", "/sandboxes", status=403, body={"code": "wrong_project", "message": "token ci belongs to project a"})
            with Shard(fake.url, "k") as shard:
                with self.assertRaises(ShardError) as cm:
                    shard.list(all_projects=True)
            self.assertEqual((cm.exception.code, cm.exception.status), ("wrong_project", 403))

    def test_tokens(self) -> None:
        with FakeServer() as fake:
            tok = {"id": "a1", "name": "agent", "project": "team-a", "scopes": ["sandbox:*"], "created_at": "2025-01-01T00:00:00Z"}
            fake.route("POST", "/tokens", status=201, body=dict(tok, key="shk_a1_x"))
            fake.route("GET", "/tokens", body={"tokens": [tok, dict(tok, id="a2", name="admin", project="*", scopes=["*"])]})
            fake.route("DELETE", "/tokens/a1", body={"revoked": "a1"})
            with Shard(fake.url, "k", project="ops") as shard:
                t = shard.create_token("agent", ["sandbox:*"], project="team-a")
                self.assertEqual(fake.last("POST", "/tokens").json, {"name": "agent", "scopes": ["sandbox:*"], "project": "team-a"})
                self.assertEqual(fake.last("POST", "/tokens").headers.get("Shard-Project"), "ops")
                self.assertEqual((t.project, t.key), ("team-a", "shk_a1_x"))
                shard.create_token("same-project", ["sandbox:read"])
                self.assertEqual(fake.last("POST", "/tokens").json, {"name": "same-project", "scopes": ["sandbox:read"]})
                self.assertEqual([(x.name, x.project, x.key) for x in shard.tokens()], [("agent", "team-a", None), ("admin", "*", None)])
                shard.revoke_token(t)
                self.assertEqual(fake.last("DELETE", "/tokens/a1").method, "DELETE")
                with self.assertRaises(TypeError):
                    shard.create_token("x", "sandbox:read")

    def test_whoami(self) -> None:
        with FakeServer() as fake:
            me = {"name": "ci", "project": "team-a", "scopes": ["sandbox:read", "sandbox:write"], "all_projects": False}
            fake.route("GET", "/whoami", body=me)
            with Shard(fake.url, "shk_ci") as shard:
                w = shard.whoami()
                self.assertEqual(w, Whoami(name="ci", project="team-a", scopes=["sandbox:read", "sandbox:write"], all_projects=False))
                self.assertEqual(w.raw, me)
                self.assertEqual(fake.last("GET", "/whoami").headers.get("Authorization"), "Bearer shk_ci")
                fake.route("GET", "/whoami", body={"name": "admin", "project": "*", "scopes": ["*"], "all_projects": True, "newer": 1})
                w = shard.whoami()
                self.assertEqual((w.name, w.project, w.scopes, w.all_projects, w.raw["newer"]), ("admin", "*", ["*"], True, 1))
                fake.route("GET", "/whoami", status=401, body={"code": "unauthenticated", "message": "this API key is not valid"})
                with self.assertRaises(ShardError) as cm:
                    shard.whoami()
                self.assertEqual((cm.exception.code, cm.exception.status), ("unauthenticated", 401))
                self.assertEqual(cm.exception.request_id, fake.last("GET", "/whoami").request_id)

    def test_default_is_the_admin_socket(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("SHARD_REMOTE", "SHARD_API_KEY")}
        with mock.patch.dict(os.environ, env, clear=True):
            with Shard() as shard:
                self.assertEqual(shard.remote, "unix:///run/shard/shard.sock")

    def test_unix_socket_remote(self) -> None:
        with FakeServer(unix=True) as fake:
            fake.route("POST", "/sandboxes", status=201, body=SB)
            fake.route("POST", PATH + "/exec", exec_route([{"type": "stdout", "data": b64("2\n")}, {"type": "exit", "exit_code": 0}]))
            with mock.patch.dict(os.environ, {"SHARD_REMOTE": fake.url, "SHARD_API_KEY": ""}):
                with Shard() as shard:
                    sb = shard.create("busybox")
                    self.assertEqual(sb.exec(["echo", "2"]).stdout, "2\n")
            rec = fake.last("POST", "/sandboxes")
            self.assertEqual(rec.headers.get("Host"), "shard")
            self.assertNotIn("Authorization", rec.headers)
            self.assertEqual(fake.connections, 1)


def project_json(name: str = "team-a", quota: Any = None, **use: int) -> Dict[str, Any]:
    """A project as GET /v0/projects lists it."""
    u = {"sandboxes": 0, "memory_bytes": 0, "cpu_millis": 0, "disk_bytes": 0, "saved_bytes": 0, "ledger_bytes": 0}
    u.update(use)
    counts = {k: 0 for k in ("sessions", "checkpoints", "snapshots", "environments", "secrets", "tokens")}
    return dict(name=name, sandboxes=u["sandboxes"], quota=quota or {}, use=u, **counts)


class ProjectsTest(Base):
    def test_set_project_quota(self) -> None:
        quota = {"max_sandboxes": 10, "max_memory_bytes": 8 << 30}
        self.fake.route("PUT", "/projects/team-a/quota", body=project_json(quota=quota, sandboxes=2, memory_bytes=1 << 30))
        p = self.shard.set_project_quota("team-a", max_sandboxes=10, max_memory_bytes=8 << 30)
        rec = self.fake.last("PUT", "/projects/team-a/quota")
        self.assertEqual(rec.json, quota)
        self.assertIsInstance(p, Project)
        self.assertEqual(p.name, "team-a")
        self.assertEqual(p.quota, ProjectQuota(max_sandboxes=10, max_memory_bytes=8 << 30))
        self.assertIsNone(p.quota.max_cpu_millis)  # left out: no bound
        self.assertEqual(p.use, ProjectUse(sandboxes=2, memory_bytes=1 << 30, cpu_millis=0, disk_bytes=0, saved_bytes=0, ledger_bytes=0))
        self.assertEqual(p.raw["quota"], quota)
        # A ProjectQuota goes as it is; nothing removes every bound.
        self.shard.set_project_quota("team-a", ProjectQuota(max_cpu_millis=4000, max_ledger_bytes=1 << 20))
        self.assertEqual(self.fake.last("PUT", "/projects/team-a/quota").json, {"max_cpu_millis": 4000, "max_ledger_bytes": 1 << 20})
        self.shard.set_project_quota("team-a")
        self.assertEqual(self.fake.last("PUT", "/projects/team-a/quota").json, {})
        # A name is one path segment.
        self.fake.route("PUT", "/projects/a%2Fb/quota", body=project_json("a/b"))
        self.assertEqual(self.shard.set_project_quota("a/b", max_disk_bytes=1).name, "a/b")
        with self.assertRaises(TypeError):
            self.shard.set_project_quota("team-a", ProjectQuota(max_sandboxes=1), max_sandboxes=2)
        with self.assertRaises(TypeError):
            self.shard.set_project_quota("team-a", max_memory_bytes="8GiB")  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            self.shard.set_project_quota("team-a", {"max_sandboxes": 1})  # type: ignore[arg-type]

    def test_set_project_quota_refused(self) -> None:
        self.fake.route(
            "PUT",
            "/projects/team-b/quota",
            status=403,
            body={"code": "wrong_project", "message": "token agent belongs to project team-a: only a key of every project sets quotas"},
        )
        with self.assertRaises(ShardError) as cm:
            self.shard.set_project_quota("team-b", max_sandboxes=1)
        self.assertEqual((cm.exception.code, cm.exception.status), ("wrong_project", 403))

    def test_projects(self) -> None:
        self.fake.route(
            "GET",
            "/projects",
            body={"projects": [project_json("default", sandboxes=1, disk_bytes=10 << 30), project_json(quota={"max_sandboxes": 1}, sandboxes=1)]},
        )
        ps = self.shard.projects()
        self.assertEqual([(p.name, p.quota.max_sandboxes, p.use.sandboxes) for p in ps], [("default", None, 1), ("team-a", 1, 1)])
        self.assertEqual(ps[0].use.disk_bytes, 10 << 30)
        self.assertEqual(ps[0].quota, ProjectQuota())
        self.fake.route("GET", "/projects", body={"projects": []})
        self.assertEqual(self.shard.projects(), [])

    def test_quota_exceeded_and_insufficient_memory(self) -> None:
        msg = "project default's quota of sandboxes is 1: it holds 1, and sandbox b asks for 1 more; remove or stop what it holds, or have an administrator raise the quota (shard project set default --max-sandboxes)"
        self.fake.route("POST", "/sandboxes", status=403, body={"code": "quota_exceeded", "message": msg})
        with self.assertRaises(ShardError) as cm:
            self.shard.create("busybox", name="b")
        self.assertEqual((cm.exception.code, cm.exception.status, cm.exception.message), ("quota_exceeded", 403, msg))
        self.assertEqual(cm.exception.request_id, self.fake.last("POST", "/sandboxes").request_id)
        self.fake.route("POST", "/sandboxes", status=507, body={"code": "insufficient_memory", "message": "not enough memory for sandbox b"})
        with self.assertRaises(ShardError) as cm:
            self.shard.create("busybox", name="b", memory_mib=65536)
        self.assertEqual((cm.exception.code, cm.exception.status), ("insufficient_memory", 507))


class CallsTest(Base):
    def test_create_payload_and_info(self) -> None:
        sb = self.shard.create("python:3.12-slim", name="base", memory_mib=512, cpu=0.5, env={"PIP_INDEX_URL": "http://x/simple"})
        self.assertEqual(
            self.fake.last("POST", "/sandboxes").json,
            {"image": "python:3.12-slim", "name": "base", "memory_mib": 512, "cpu": 0.5, "env": {"PIP_INDEX_URL": "http://x/simple"}},
        )
        self.assertEqual((sb.id, sb.name, sb.session, sb.state), (SB["id"], "base", "base", "running"))
        self.assertIsInstance(sb.info, SandboxInfo)
        self.assertEqual(sb.info.memory_mib, 512)
        self.assertEqual(sb.info.created_at, datetime(2025, 1, 1, 12, 0, 0, 123456, tzinfo=timezone.utc))
        self.assertIsNone(sb.info.stopped_at)
        self.assertEqual(sb.info.raw["ip"], "10.88.0.2")
        self.assertIn("0123456789ab", repr(sb))

    def test_lifecycle_paths(self) -> None:
        self.fake.route("POST", PATH + "/stop", body=sandbox_json(state="stopped"))
        self.fake.route("POST", PATH + "/start", body=sandbox_json(state="running"))
        self.fake.route("DELETE", PATH, body={"removed": SB["id"]})
        sb = self.sandbox()
        self.assertEqual(sb.stop().state, "stopped")
        self.assertEqual(sb.start().state, "running")
        sb.remove(force=True)
        self.assertEqual(self.fake.last("DELETE", PATH).query, {"force": ["true"]})
        sb.remove()
        self.assertEqual(self.fake.last("DELETE", PATH).query, {"force": ["false"]})

    def test_sandbox_context_manager_removes(self) -> None:
        self.fake.route("DELETE", PATH, body={})
        with self.sandbox() as sb:
            self.assertEqual(sb.name, "base")
        self.assertEqual(self.fake.last("DELETE", PATH).query, {"force": ["true"]})
        self.fake.route("DELETE", PATH, status=404, body={"code": "sandbox_not_found", "message": "gone"})
        with self.sandbox():
            pass  # already gone: no error

    def test_get_escapes_the_name(self) -> None:
        self.fake.route("GET", "/sandboxes/a%2Fb", body=sandbox_json(name="a/b"))
        self.assertEqual(self.shard.get("a/b").name, "a/b")

    def test_fork_checkpoint_resume_restore(self) -> None:
        fork = sandbox_json(id="111111111111", name="try-a", session="fork-base-111111", parent_id=SB["id"])
        ck = {"id": "c0ffee000000", "kind": "fork", "tag": "t1", "sandbox_id": SB["id"], "sandbox_name": "base",
              "session": "base", "seq": 3, "image": "python:3.12-slim", "provider": "gvisor", "freeze_ms": 40,
              "created_at": "2025-01-01T12:00:00Z"}
        self.fake.route("POST", PATH + "/fork", status=201, body=fork)
        self.fake.route("POST", PATH + "/checkpoints", status=201, body=dict(ck, kind="checkpoint", tag="deps"))
        self.fake.route("GET", PATH + "/checkpoints", body={"checkpoints": [ck]})
        self.fake.route("POST", "/ledger/sessions/base/resume", status=201,
                        body={"sandbox": sandbox_json(id="222222222222", name="again"), "checkpoint": "c0ffee000000",
                              "replayed": [{"argv": ["touch", "/f"], "recorded_exit_code": 0, "exit_code": 0},
                                           {"argv": ["server"]}],
                              "reapplied": [{"event": "sandbox.secret_granted", "secret": "KEY"},
                                            {"event": "sandbox.policy_set"}]})
        self.fake.route("POST", "/checkpoints/c0ffee000000/restore", status=201, body=sandbox_json(id="333333333333", name="r"))

        sb = self.sandbox()
        f = sb.fork(name="try-a", tag="t1")
        self.assertEqual((f.id, f.name, f.info.parent_id), ("111111111111", "try-a", SB["id"]))
        self.assertEqual(self.fake.last("POST", PATH + "/fork").json, {"name": "try-a", "tag": "t1"})
        sb.fork()
        self.assertEqual(self.fake.last("POST", PATH + "/fork").json, {})

        c = sb.checkpoint(tag="deps")
        self.assertEqual((c.kind, c.tag), ("checkpoint", "deps"))
        self.assertEqual(self.fake.last("POST", PATH + "/checkpoints").json, {"tag": "deps"})
        cks = sb.list_checkpoints()
        self.assertEqual(len(cks), 1)
        self.assertIsInstance(cks[0], Checkpoint)
        self.assertEqual((cks[0].tag, cks[0].kind, cks[0].seq, cks[0].freeze_ms), ("t1", "fork", 3, 40))

        r = self.shard.resume(sb, name="again")
        self.assertEqual(r.name, "again")
        self.assertEqual(self.fake.last("POST", "/ledger/sessions/base/resume").json, {"name": "again"})
        self.fake.route("DELETE", "/ledger/sessions/base", body={"removed": "base"})
        self.shard.remove_session(sb)
        self.assertEqual(self.fake.last("DELETE", "/ledger/sessions/base").path, "/v0/ledger/sessions/base")
        assert r.resume_result is not None
        self.assertEqual(r.resume_result.checkpoint, "c0ffee000000")
        self.assertEqual([x.exit_code for x in r.resume_result.replayed], [0, None])
        self.assertEqual([(x.event, x.secret, x.error) for x in r.resume_result.reapplied],
                         [("sandbox.secret_granted", "KEY", None), ("sandbox.policy_set", None, None)])
        self.assertEqual(self.shard.resume("base").id, "222222222222")

        rs = self.shard.restore_checkpoint(cks[0], name="r")
        self.assertEqual(rs.id, "333333333333")
        self.assertEqual(self.fake.last("POST", "/checkpoints/c0ffee000000/restore").json, {"name": "r"})
        # restore_snapshot, the product spec's name, is the same call.
        self.shard.restore_snapshot("c0ffee000000")
        self.assertEqual(self.fake.last("POST", "/checkpoints/c0ffee000000/restore").json, {})

    def test_fork_many(self) -> None:
        self.fake.route("POST", PATH + "/fork", status=201,
                        body={"sandboxes": [sandbox_json(id="%012d" % i, name=f"try-{i}") for i in (1, 2, 3)]})
        forks = self.sandbox().fork_many(3, name="try")
        self.assertEqual([f.name for f in forks], ["try-1", "try-2", "try-3"])
        self.assertEqual(self.fake.last("POST", PATH + "/fork").json, {"name": "try", "count": 3})

    def test_credentials(self) -> None:
        granted = sandbox_json(grants=[{"secret": "GH", "env": "GH_TOKEN", "at": "2025-01-01T12:00:00Z"}])
        self.fake.route("PUT", "/secrets/GH", body={"name": "GH", "created_at": "2025-01-01T12:00:00Z", "updated_at": "2025-01-01T12:00:00Z"})
        self.fake.route("POST", PATH + "/grants", body=granted)
        self.fake.route("GET", PATH + "/grants", body={"grants": granted["grants"]})
        self.fake.route("DELETE", PATH + "/grants/GH", body=sandbox_json())
        sb = self.sandbox()
        sb.credentials.set("GH", "s3cret", env="GH_TOKEN")
        self.assertEqual(self.fake.last("PUT", "/secrets/GH").json, {"value": b64("s3cret")})
        self.assertEqual(self.fake.last("POST", PATH + "/grants").json, {"secret": "GH", "env": "GH_TOKEN"})
        self.assertEqual(sb.info.grants[0].env, "GH_TOKEN")
        self.assertEqual([g.secret for g in sb.credentials.list()], ["GH"])
        sb.credentials.set("GH", b"\x00\x01", file="/run/secrets/gh")
        self.assertEqual(self.fake.last("PUT", "/secrets/GH").json, {"value": "AAE="})
        self.assertEqual(self.fake.last("POST", PATH + "/grants").json, {"secret": "GH", "file": "/run/secrets/gh"})
        sb.credentials.set("GH", "v")
        self.assertEqual(self.fake.last("POST", PATH + "/grants").json, {"secret": "GH"})
        with self.assertRaises(ValueError):
            sb.credentials.set("GH", "v", env="A", file="/b")
        sb.credentials.delete("GH")
        self.assertEqual(sb.info.grants, [])


class EnvironmentTest(Base):
    def setUp(self) -> None:
        super().setUp()
        self.envs: Dict[str, Dict[str, Any]] = {}
        self.setup_sandboxes: List[str] = []

        def get_env(h: Handler, rec: Recorded) -> None:
            name = rec.path.rsplit("/", 1)[1]
            if name in self.envs:
                h.send_json(200, self.envs[name])
            else:
                h.send_json(404, {"code": "environment_not_found", "message": f"environment {name} not found"})

        def post_env(h: Handler, rec: Recorded) -> None:
            req = rec.json
            self.envs[req["name"]] = {"name": req["name"], "image": "python:3.12-slim", "provider": "gvisor",
                                      "fingerprint": req["fingerprint"], "checkpoint": "c0ffee000000"}
            h.send_json(201, self.envs[req["name"]])

        def create(h: Handler, rec: Recorded) -> None:
            req = rec.json
            if "environment" in req:
                h.send_json(201, sandbox_json(id="999999999999", name=req.get("name", "999999999999")))
            else:
                self.setup_sandboxes.append(req.get("name", ""))
                h.send_json(201, sandbox_json(id="888888888888", name=req.get("name", "888888888888")))

        self.fake.route("GET", "/environments/py", get_env)
        self.fake.route("POST", "/environments", post_env)
        self.fake.route("POST", "/sandboxes", create)
        self.fake.route("DELETE", "/sandboxes/888888888888", body={})
        self.fake.route("POST", "/sandboxes/888888888888/exec", exec_route([{"type": "exit", "exit_code": 0}]))

    def test_builds_once(self) -> None:
        calls: List[str] = []

        def setup(sb: Sandbox) -> None:
            calls.append(sb.id)
            sb.exec(["sh", "-c", "echo ran >> /setup.log"])

        env = self.shard.environment("py", image="python:3.12-slim", memory_mib=256, setup=setup)
        a = env.sandbox()
        b = env.sandbox(name="job-2")
        self.assertEqual(calls, ["888888888888"])
        self.assertEqual(self.setup_sandboxes, ["env-py"])
        self.assertTrue(env.built)
        self.assertEqual((a.id, b.name), ("999999999999", "job-2"))
        self.assertEqual(self.fake.last("POST", "/environments").json,
                         {"name": "py", "sandbox": "888888888888", "fingerprint": env.fingerprint})
        self.assertEqual(self.fake.last("POST", "/sandboxes").json, {"environment": "py", "name": "job-2"})
        self.fake.last("DELETE", "/sandboxes/888888888888")  # the setup sandbox went

        # The same definition in another client: found unchanged, no setup.
        with Shard(self.fake.url, "k") as other:
            env2 = other.environment("py", image="python:3.12-slim", memory_mib=256, setup=setup)
            env2.sandbox()
            self.assertFalse(env2.built)
        self.assertEqual(calls, ["888888888888"])

        # A changed definition rebuilds.
        env3 = self.shard.environment("py", image="python:3.12-slim", memory_mib=512, setup=setup)
        self.assertNotEqual(env3.fingerprint, env.fingerprint)
        env3.sandbox()
        self.assertEqual(len(calls), 2)

    def test_setup_failure_removes_the_setup_sandbox(self) -> None:
        def setup(sb: Sandbox) -> None:
            raise RuntimeError("setup broke")

        env = self.shard.environment("py", image="python:3.12-slim", setup=setup)
        with self.assertRaises(RuntimeError):
            env.sandbox()
        self.fake.last("DELETE", "/sandboxes/888888888888")
        self.assertNotIn("py", self.envs)

    def test_fingerprint(self) -> None:
        def s1(sb: Sandbox) -> None:
            sb.exec(["a"])

        def s2(sb: Sandbox) -> None:
            sb.exec(["b"])

        fp = lambda **kw: self.shard.environment("py", **kw).fingerprint  # noqa: E731
        base = fp(image="i", memory_mib=256, setup=s1)
        self.assertEqual(base, fp(image="i", memory_mib=256, setup=s1))
        self.assertNotEqual(base, fp(image="i", memory_mib=256, setup=s2))
        self.assertNotEqual(base, fp(image="j", memory_mib=256, setup=s1))
        self.assertNotEqual(base, fp(image="i", memory_mib=512, setup=s1))
        # No source (a builtin): the qualified name stands in.
        self.assertEqual(fp(image="i", setup=print), fp(image="i", setup=print))
        self.assertNotEqual(fp(image="i", setup=print), fp(image="i", setup=repr))

    def test_setup_commands_go_to_the_server(self) -> None:
        env = self.shard.environment("py", image="python:3.12-slim", setup=[["pip", "install", "requests"]])
        env.build()
        req = self.fake.last("POST", "/environments").json
        self.assertEqual(req["setup"], [["pip", "install", "requests"]])
        self.assertEqual(req["image"], "python:3.12-slim")
        self.assertEqual(self.setup_sandboxes, [])


class ConcurrencyTest(Base):
    def test_threads_share_one_client(self) -> None:
        self.fake.route("POST", PATH + "/exec", exec_route([{"type": "stdout", "data": b64("ok")}, {"type": "exit", "exit_code": 0}]))
        sb = self.sandbox()
        errors: List[BaseException] = []

        def work() -> None:
            try:
                for _ in range(10):
                    self.assertEqual(sb.exec(["x"]).stdout, "ok")
                    sb.refresh()
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(errors, [])
        self.assertLessEqual(self.fake.connections, 7)

    def test_server_closing_idle_connections_is_transparent(self) -> None:
        self.fake.close_after_each = True
        sb = self.sandbox()
        for _ in range(3):
            sb.refresh()
        self.assertEqual(self.fake.connections, 4)


if __name__ == "__main__":
    unittest.main()
