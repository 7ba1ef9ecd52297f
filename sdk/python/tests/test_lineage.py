"""The fork tree, diffs and a fork's on-fork hook options against the fake
server: the paths and query parameters sent, the types decoded, and
fork_hook_failed."""

from __future__ import annotations

import unittest
from datetime import datetime, timezone
from typing import Any, Dict

from fakeserver import FakeServer, Handler, Recorded, sandbox_json

from useshards import Change, Diff, DiffSide, Shard, ShardError, TreeNode

SB = sandbox_json()
PATH = f"/sandboxes/{SB['id']}"
FORK = sandbox_json(id="111111111111", name="try-a", session="fork-base-111111", parent_id=SB["id"])

AT = "2026-12-02T11:03:38Z"


def node(kind: str, id: str, **kw: Any) -> Dict[str, Any]:
    d: Dict[str, Any] = {"kind": kind, "id": id, "state": "running" if kind == "sandbox" else "kept", "removed": False, "at": AT}
    d.update(kw)
    return d


# base → fork checkpoint (tag t) → try-a, and try-b that was removed.
LINEAGE = node(
    "sandbox", SB["id"], name="base", image="python:3.12-slim", provider="gvisor",
    children=[
        node("checkpoint", "c0ffee000001", name="t", via="fork", children=[
            node("sandbox", FORK["id"], name="try-a", via="fork", image="python:3.12-slim", provider="gvisor"),
            node("sandbox", "222222222222", name="try-b", via="fork", state="removed", removed=True),
        ]),
    ],
)

DIFF = {
    "from": {"kind": "sandbox", "id": "222222222222", "name": "try-b"},
    "to": {"kind": "sandbox", "id": FORK["id"], "name": "try-a"},
    "changes": [
        {"path": "/app/main.py", "kind": "changed", "type": "file", "what": ["content", "mode"], "size_a": 9, "size_b": 9,
         "patch": "--- a/app/main.py\n+++ b/app/main.py\n@@ -1 +1 @@\n-print(2)\n+print(1)\n"},
        {"path": "/app/only-a.txt", "kind": "added", "type": "file", "size_a": 0, "size_b": 13},
        {"path": "/srv", "kind": "removed", "type": "dir", "size_a": 0, "size_b": 0},
    ],
    "added": 1,
    "removed": 1,
    "changed": 1,
    "truncated": False,
}


class Base(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = FakeServer().start()
        self.addCleanup(self.fake.stop)
        self.fake.route("POST", "/sandboxes", status=201, body=SB)
        self.fake.route("GET", PATH, body=SB)
        self.shard = Shard(self.fake.url, "shk_test_key")
        self.addCleanup(self.shard.close)
        self.sb = self.shard.create("python:3.12-slim", name="base")


class TreeTest(Base):
    def test_paths_and_all(self) -> None:
        self.fake.route("GET", "/tree", body={"roots": [LINEAGE, node("sandbox", "0000000000ff", name="alone")]})
        self.fake.route("GET", PATH + "/tree", body={"roots": [LINEAGE]})
        self.fake.route("GET", "/sandboxes/try%20a/tree", body={"roots": [LINEAGE]})

        roots = self.shard.tree()
        rec = self.fake.last("GET", "/tree")
        self.assertEqual(rec.query, {})
        self.assertEqual([r.name for r in roots], ["base", "alone"])
        self.shard.tree(all=True)
        self.assertEqual(self.fake.last("GET", "/tree").query, {"all": ["true"]})

        self.assertEqual(self.shard.tree("try a")[0].id, SB["id"])
        self.assertEqual(self.fake.last("GET", "/sandboxes/try%20a/tree").query, {})
        self.assertEqual(len(self.shard.tree(self.sb, all=True)), 1)
        self.assertEqual(self.fake.last("GET", PATH + "/tree").query, {"all": ["true"]})
        root = self.sb.tree()
        self.assertEqual(self.fake.last("GET", PATH + "/tree").query, {})
        self.assertIsInstance(root, TreeNode)
        self.sb.tree(all=True)
        self.assertEqual(self.fake.last("GET", PATH + "/tree").query, {"all": ["true"]})

    def test_nodes_decoded(self) -> None:
        self.fake.route("GET", PATH + "/tree", body={"roots": [LINEAGE]})
        root = self.sb.tree()
        self.assertEqual((root.kind, root.id, root.name, root.state, root.removed, root.via), ("sandbox", SB["id"], "base", "running", False, None))
        self.assertEqual(root.at, datetime(2026, 12, 2, 11, 3, 38, tzinfo=timezone.utc))
        self.assertEqual((root.image, root.provider), ("python:3.12-slim", "gvisor"))
        (ck,) = root.children
        self.assertEqual((ck.kind, ck.via, ck.name, ck.state, ck.image), ("checkpoint", "fork", "t", "kept", None))
        self.assertEqual([(c.name, c.removed, c.state) for c in ck.children], [("try-a", False, "running"), ("try-b", True, "removed")])
        self.assertEqual(ck.children[0].children, [])
        self.assertEqual(root.raw["children"][0]["id"], "c0ffee000001")
        # walk: each node before what came from it, in the server's order.
        self.assertEqual([n.id for n in root.walk()], [SB["id"], "c0ffee000001", FORK["id"], "222222222222"])
        found = root.find("try-b")
        assert found is not None
        self.assertTrue(found.removed)
        self.assertIs(root.find(FORK["id"]), ck.children[0])
        self.assertIsNone(root.find("nope"))

    def test_removed_sandboxes_decoded(self) -> None:
        # Without all, a kept checkpoint names the removed forks left out below it.
        gone = node("sandbox", "333333333333", name="try-c", via="fork", state="removed", removed=True)
        lone = node("sandbox", SB["id"], name="base", children=[node("checkpoint", "c0ffee000002", via="fork", removed_sandboxes=[gone])])
        self.fake.route("GET", PATH + "/tree", body={"roots": [lone]})
        (ck,) = self.sb.tree().children
        self.assertEqual(ck.children, [])
        self.assertEqual([(g.name, g.via, g.removed) for g in ck.removed_sandboxes], [("try-c", "fork", True)])
        self.assertEqual(self.sb.tree().removed_sandboxes, [])

    def test_errors(self) -> None:
        self.fake.route("GET", "/sandboxes/nope/tree", status=404, body={"code": "sandbox_not_found", "message": "sandbox nope not found"})
        with self.assertRaises(ShardError) as cm:
            self.shard.tree("nope")
        self.assertEqual((cm.exception.code, cm.exception.status), ("sandbox_not_found", 404))
        self.fake.route("GET", PATH + "/tree", body={"roots": []})
        with self.assertRaises(ShardError) as cm:
            self.sb.tree()
        self.assertEqual(cm.exception.code, "bad_response")
        self.fake.route("GET", "/tree", body={"roots": None})
        with self.assertRaises(ShardError) as cm:
            self.shard.tree()
        self.assertEqual(cm.exception.code, "bad_response")


class DiffTest(Base):
    def setUp(self) -> None:
        super().setUp()
        self.fake.route("GET", PATH + "/diff", body=DIFF)
        self.fake.route("GET", "/sandboxes/try-a/diff", body=DIFF)

    def test_query(self) -> None:
        self.sb.diff()
        self.assertEqual(self.fake.last("GET", PATH + "/diff").query, {})
        self.sb.diff("try-b")
        self.assertEqual(self.fake.last("GET", PATH + "/diff").query, {"against": ["try-b"]})
        other = self.shard.create("python:3.12-slim")
        self.sb.diff(other, patch=True)
        self.assertEqual(self.fake.last("GET", PATH + "/diff").query, {"against": [SB["id"]], "patch": ["true"]})
        self.sb.diff(patch=True)
        self.assertEqual(self.fake.last("GET", PATH + "/diff").query, {"patch": ["true"]})
        self.shard.diff("try-a", "a b&c")
        self.assertEqual(self.fake.last("GET", "/sandboxes/try-a/diff").query, {"against": ["a b&c"]})
        self.shard.diff("try-a", self.sb)
        self.assertEqual(self.fake.last("GET", "/sandboxes/try-a/diff").query, {"against": [SB["id"]]})

    def test_decoded(self) -> None:
        d = self.shard.diff("try-a", "try-b", patch=True)
        self.assertIsInstance(d, Diff)
        self.assertEqual(d.from_, DiffSide(kind="sandbox", id="222222222222", name="try-b"))
        self.assertEqual(d.to, DiffSide(kind="sandbox", id=FORK["id"], name="try-a"))
        self.assertEqual((d.added, d.removed, d.changed, d.truncated, len(d)), (1, 1, 1, False, 3))
        self.assertEqual([(c.kind, c.path) for c in d], [("changed", "/app/main.py"), ("added", "/app/only-a.txt"), ("removed", "/srv")])
        main = d.get("/app/main.py")
        assert main is not None
        self.assertEqual((main.type, main.what, main.size_a, main.size_b), ("file", ["content", "mode"], 9, 9))
        self.assertIn("+print(1)", main.patch or "")
        self.assertEqual(d.get("/app/only-a.txt"), Change(path="/app/only-a.txt", kind="added", type="file", size_a=0, size_b=13))
        self.assertIsNone(d.get("/etc/hostname"))
        self.assertEqual(d.raw["from"]["name"], "try-b")

    def test_errors(self) -> None:
        self.fake.route("GET", PATH + "/diff", status=400, body={"code": "different_images", "message": "a diff compares sandboxes of one image"})
        with self.assertRaises(ShardError) as cm:
            self.sb.diff("other")
        self.assertEqual((cm.exception.code, cm.exception.status), ("different_images", 400))
        self.fake.route("GET", PATH + "/diff", status=409, body={"code": "checkpoint_gone", "message": "compare it with another sandbox"})
        with self.assertRaises(ShardError) as cm:
            self.sb.diff()
        self.assertEqual((cm.exception.code, cm.exception.status), ("checkpoint_gone", 409))


class ForkHooksTest(Base):
    def setUp(self) -> None:
        super().setUp()

        def fork(h: Handler, rec: Recorded) -> None:
            body = rec.json or {}
            if body.get("hook_errors") not in (None, "fail", "ignore"):
                h.send_json(400, {"code": "invalid_argument", "message": "hook_errors: fail or ignore"})
            elif body.get("hook_errors") != "ignore":
                h.send_json(422, {"code": "fork_hook_failed", "message": "fork of base: on-fork hook 50-lease failed in fork try-a (exit code 3): no lease"})
            elif body.get("count"):
                h.send_json(201, {"sandboxes": [sandbox_json(id="%012d" % i, name=f"try-{i}") for i in range(1, body["count"] + 1)]})
            else:
                h.send_json(201, FORK)

        self.fake.route("POST", PATH + "/fork", fork)

    def test_a_failing_hook_refuses_the_fork(self) -> None:
        with self.assertRaises(ShardError) as cm:
            self.sb.fork(name="try-a")
        self.assertEqual((cm.exception.code, cm.exception.status), ("fork_hook_failed", 422))
        self.assertIn("50-lease", cm.exception.message)
        self.assertEqual(self.fake.last("POST", PATH + "/fork").json, {"name": "try-a"})
        with self.assertRaises(ShardError) as cm:
            self.sb.fork(hook_errors="maybe")
        self.assertEqual((cm.exception.code, cm.exception.status), ("invalid_argument", 400))

    def test_options_on_the_wire(self) -> None:
        f = self.sb.fork(name="try-a", tag="t", hook_errors="ignore", hook_timeout=1.5, hooks_in_source=True)
        self.assertEqual(f.id, FORK["id"])
        self.assertEqual(self.fake.last("POST", PATH + "/fork").json,
                         {"name": "try-a", "tag": "t", "hook_timeout": "1.5s", "hook_errors": "ignore", "hooks_in_source": True})
        for given, sent in ((30, "30s"), (0.25, "0.25s"), (600.0, "600s"), ("2m", "2m")):
            self.sb.fork(hook_errors="ignore", hook_timeout=given)
            self.assertEqual(self.fake.last("POST", PATH + "/fork").json, {"hook_timeout": sent, "hook_errors": "ignore"})
        forks = self.sb.fork_many(2, name="try", hook_errors="ignore", hook_timeout="45s")
        self.assertEqual([x.name for x in forks], ["try-1", "try-2"])
        self.assertEqual(self.fake.last("POST", PATH + "/fork").json, {"name": "try", "count": 2, "hook_timeout": "45s", "hook_errors": "ignore"})
        self.sb.fork_many(1, hook_errors="ignore", hooks_in_source=True)
        self.assertEqual(self.fake.last("POST", PATH + "/fork").json, {"hook_errors": "ignore", "hooks_in_source": True})

    def test_bad_timeout_is_refused_before_sending(self) -> None:
        n = len(self.fake.requests)
        for bad in (0, -1, float("nan"), float("inf"), True):
            with self.assertRaises(ValueError):
                self.sb.fork(hook_timeout=bad)  # type: ignore[arg-type]
        self.assertEqual(len(self.fake.requests), n)


if __name__ == "__main__":
    unittest.main()
