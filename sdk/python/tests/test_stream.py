"""The binary exec stream (docs/exec-stream.md) against the fake server:
frames cut anywhere, unknown frames, the F frame, the NDJSON fallback, and
stdin streamed in a framed request body, full duplex."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
import unittest
from typing import Any, Iterator, List, Tuple
from unittest import mock

from fakeserver import STREAM, FakeServer, Handler, Recorded, frame, sandbox_json

from useshards import Chunk, Shard, ShardError
from useshards._transport import FramedBody

SB = sandbox_json()
PATH = f"/sandboxes/{SB['id']}"


def stdin_of(frames: List[Tuple[bytes, bytes]]) -> Tuple[bytes, List[int]]:
    """All stdin the I frames carried, and their sizes."""
    i = [p for t, p in frames if t == b"I"]
    return b"".join(i), [len(p) for p in i]


class Base(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = FakeServer().start()
        self.addCleanup(self.fake.stop)
        self.fake.route("POST", "/sandboxes", status=201, body=SB)
        self.fake.route("GET", PATH, body=SB)
        self.shard = Shard(self.fake.url, "shk_test_key")
        self.addCleanup(self.shard.close)
        self.sb = self.shard.create("python:3.12-slim", name="base")

    def route(self, fn: Any) -> None:
        self.fake.route("POST", PATH + "/exec", fn)

    def last(self) -> Recorded:
        return self.fake.last("POST", PATH + "/exec")


def echo(h: Handler, rec: Recorded) -> None:
    """cat: echoes each I frame as an O frame as it arrives; ends at EOF."""
    h.start_frames()
    h.write_frame(b"S", b'{"pid": 7}')
    for typ, p in h.client_frames():
        if typ == b"I" and not p:
            break
        if typ == b"I":
            h.write_frame(b"O", p)
    h.write_frame(b"X", b"{}")
    h.end_stream()


class FramesTest(Base):
    def test_frames_split_across_reads_and_unknown_types(self) -> None:
        euro = "€".encode()
        wire = b"".join(
            [
                frame(b"S", b'{"pid": 9}'),
                frame(b"O", b"hello "),
                frame(b"Z", b"a frame type of a newer server"),
                frame(b"O", euro[:2]),
                frame(b"O", euro[2:]),
                frame(b"E", b"warn\n"),
                frame(b"X", b'{"signal": 9, "oom_killed": true}'),  # exit_code 0 is left out
            ]
        )

        def fn(h: Handler, rec: Recorded) -> None:
            h.start_frames()
            # Cut inside the first header (2 bytes in), after a header,
            # inside a payload, then the rest.
            for a, b in ((0, 2), (2, 5), (5, 8), (8, 20), (20, len(wire))):
                h.write_bytes(wire[a:b])
                time.sleep(0.03)
            h.end_stream()

        self.route(fn)
        res = self.sb.exec(["x"])
        self.assertEqual((res.stdout, res.stderr, res.exit_code, res.signal, res.oom_killed), ("hello €", "warn\n", 0, 9, True))
        rec = self.last()
        self.assertEqual(rec.headers["Accept"], STREAM)
        self.assertEqual(rec.headers["Content-Type"], "application/json")
        self.assertEqual(rec.json, {"argv": ["x"]})

        self.route(fn)
        with self.sb.exec_stream(["x"]) as s:
            chunks = list(s)
        self.assertEqual(s.pid, 9)
        self.assertEqual(chunks[0], Chunk("stdout", b"hello "))
        self.assertEqual(chunks[-1], Chunk("stderr", b"warn\n"))
        self.assertEqual(s.result.signal, 9)
        self.sb.refresh()
        self.assertEqual(self.fake.connections, 1, "the connection is kept across streams")

    def test_f_frame_and_broken_streams(self) -> None:
        def answer(*frames: bytes) -> Any:
            def fn(h: Handler, rec: Recorded) -> None:
                h.start_frames()
                for f in frames:
                    h.write_bytes(f)
                h.end_stream()

            return fn

        cases = [
            (answer(frame(b"O", b"a"), frame(b"F", b'{"code":"sandbox_unreachable","message":"lost the connection to the sandbox: EOF"}')),
             ("sandbox_unreachable", 502, "lost the connection to the sandbox: EOF")),
            (answer(frame(b"F", b"{}")), ("sandbox_unreachable", 502, "the connection to the sandbox was lost")),
            (answer(frame(b"O", b"abcdef")[:7]), ("stream_ended", 502, None)),
            (answer(frame(b"O", b"x")), ("stream_ended", 502, None)),
            (answer(b"O\x7f\x00\x00\x00"), ("bad_response", 502, None)),
            (answer(frame(b"X", b"not json")), ("bad_response", 502, None)),
        ]
        for fn, (code, status, msg) in cases:
            self.route(fn)
            with self.assertRaises(ShardError) as cm:
                self.sb.exec(["x"])
            self.assertEqual((cm.exception.code, cm.exception.status), (code, status))
            if msg is not None:
                self.assertEqual(cm.exception.message, msg)
        self.route(answer(frame(b"X", b'{"exit_code": 2}')))
        self.assertEqual(self.sb.exec(["x"]).exit_code, 2)

    def test_ndjson_fallback(self) -> None:
        def fn(h: Handler, rec: Recorded) -> None:
            h.start_stream()  # an older server: NDJSON whatever was asked
            h.write_line({"type": "started", "pid": 3})
            h.write_line({"type": "stdout", "data": base64.b64encode(b"o").decode()})
            h.write_line({"type": "newer_event"})
            h.write_line({"type": "exit", "exit_code": 1})
            h.end_stream()

        self.route(fn)
        res = self.sb.exec(["x"])
        self.assertEqual((res.stdout, res.exit_code), ("o", 1))
        self.assertEqual(self.last().headers["Accept"], STREAM)
        # A framed body still works with it (the answer's Content-Type decides).
        self.route(fn)
        self.assertEqual(self.sb.exec(["x"], stdin=iter([b"in"])).stdout, "o")


class FramedStdinTest(Base):
    def test_big_bytes_go_in_frames(self) -> None:
        self.route(echo)
        big = bytes(i % 251 for i in range(1_000_000))
        res = self.sb.exec(["cat"], stdin=big, env={"A": "1"})
        self.assertEqual(res.stdout_bytes, big)
        rec = self.last()
        self.assertEqual(rec.headers["Content-Type"], STREAM)
        self.assertEqual(rec.headers["Transfer-Encoding"], "chunked")
        self.assertEqual(rec.headers["Accept"], STREAM)
        self.assertEqual(rec.json, {"argv": ["cat"], "env": {"A": "1"}})  # the Q frame, without stdin
        self.assertEqual(rec.frames[0][0], b"Q")
        data, sizes = stdin_of(rec.frames)
        self.assertEqual(data, big)
        self.assertEqual(sizes, [262144, 262144, 262144, 1_000_000 - 3 * 262144, 0])
        # The connection is kept, and small stdin still goes in the JSON body.
        self.sb.exec(["cat"], stdin="hi")
        self.assertEqual(self.last().json["stdin"], base64.b64encode(b"hi").decode())
        self.assertEqual(self.fake.connections, 1)
        # The fake reads the body's final chunk after its answer's end; the
        # next request on that connection was read after it.
        self.assertTrue(rec.body_ended, "the body ended with its final chunk")

    def test_connection_kept_when_the_answer_ends_before_the_pump_says_stdin_closed(self) -> None:
        # The server answers X as soon as it reads the empty I frame, which
        # can be before the pump's thread runs again (a busy CPU): the
        # client must still end the body and keep the connection.
        send = FramedBody.send

        def slow_after_eof(body: FramedBody, typ: bytes, payload: bytes, timeout: Any = None) -> bool:
            ok = send(body, typ, payload, timeout)
            if typ == b"I" and not payload:
                time.sleep(0.2)
            return ok

        self.route(echo)
        with mock.patch.object(FramedBody, "send", slow_after_eof):
            res = self.sb.exec(["cat"], stdin=iter([b"abc"]))
        self.assertEqual(res.stdout, "abc")
        rec = self.last()
        self.sb.refresh()
        self.assertEqual(self.fake.connections, 1, "the connection is kept")
        self.assertTrue(rec.body_ended, "the body ended with its final chunk")

    def test_file_like_stdin(self) -> None:
        self.route(echo)
        data = b"x" * (600 << 10)
        res = self.sb.exec(["cat"], stdin=io.BytesIO(data))
        self.assertEqual(res.stdout_bytes, data)
        self.assertEqual(stdin_of(self.last().frames)[1], [262144, 262144, 88 << 10, 0])
        self.route(echo)
        self.assertEqual(self.sb.exec(["cat"], stdin=io.StringIO("text €")).stdout, "text €")

    def test_full_duplex(self) -> None:
        # The fake echoes each I frame as it arrives; the stdin iterable
        # gives its next chunk only after the last one's echo was read. A
        # client that reads the answer only after sending the whole body
        # would wait forever: here the iterable gives up after 5 s and the
        # exec fails.
        self.route(echo)
        seen: List[bytes] = []
        cond = threading.Condition()

        def stdin() -> Iterator[bytes]:
            for i in range(5):
                line = b"line %d\n" % i
                yield line
                with cond:
                    if not cond.wait_for(lambda: b"".join(seen).endswith(line), timeout=5):
                        raise RuntimeError(f"no echo of {line!r}: half duplex?")
            yield b""  # skipped: an empty I frame would close stdin
            yield "end\n"

        with self.sb.exec_stream(["cat"], stdin=stdin()) as s:
            for c in s:
                with cond:
                    seen.append(c.data)
                    cond.notify_all()
        want = b"".join(b"line %d\n" % i for i in range(5)) + b"end\n"
        self.assertEqual(b"".join(seen), want)
        self.assertEqual(s.result.exit_code, 0)
        self.assertEqual(stdin_of(self.last().frames)[1], [7, 7, 7, 7, 7, 4, 0])

    def test_signals(self) -> None:
        def fn(h: Handler, rec: Recorded) -> None:
            h.start_frames()
            for typ, p in h.client_frames():
                if typ == b"I" and p:
                    h.write_frame(b"O", p)
                if typ == b"K":
                    sig = json.loads(p)["signal"]
                    h.write_frame(b"X", json.dumps({"exit_code": 128 + sig, "signal": sig}).encode())
                    break
            h.end_stream()

        self.route(fn)
        with self.sb.exec_stream(["sleep", "100"], stdin=[b"ab"]) as s:
            self.assertEqual(next(s).data, b"ab")
            self.assertTrue(s.send_signal("SIGINT"))
            self.assertEqual(list(s), [])
        self.assertEqual((s.result.exit_code, s.result.signal), (130, 2))
        self.assertFalse(s.kill())  # it ended
        # The pump's closing empty I may come before or after the K frame.
        frames = [(t, p) for t, p in self.last().frames if (t, p) != (b"I", b"")]
        self.assertEqual(frames, [(b"Q", b'{"argv":["sleep","100"]}'), (b"I", b"ab"), (b"K", b'{"signal": 2}')])

        self.route(fn)
        with self.sb.exec_stream(["sleep", "100"], stdin=[]) as s:
            s.terminate()
            s.wait()
        self.assertEqual(s.result.signal, 15)

        self.fake.route("POST", PATH + "/exec", echo)
        with self.sb.exec_stream(["true"]) as s:
            with self.assertRaises(ShardError) as cm:
                s.kill()
            self.assertEqual(cm.exception.code, "invalid_argument")
            with self.assertRaises(ValueError):
                s.send_signal("SIGNOPE")

    def test_error_before_start_and_failing_source(self) -> None:
        self.fake.route("POST", PATH + "/exec", status=409, body={"code": "sandbox_not_running", "message": "sandbox base is not running"})
        with self.assertRaises(ShardError) as cm:
            self.sb.exec(["cat"], stdin=iter([b"x"]))
        self.assertEqual((cm.exception.code, cm.exception.status, cm.exception.message), ("sandbox_not_running", 409, "sandbox base is not running"))
        self.assertEqual(self.sb.refresh().id, SB["id"])  # the client still works

        def bad() -> Iterator[bytes]:
            yield b"ok"
            time.sleep(0.05)
            raise OSError("disk on fire")

        def hold(h: Handler, rec: Recorded) -> None:
            h.start_frames()
            try:
                for typ, p in h.client_frames():
                    if typ == b"I" and p:
                        h.write_frame(b"O", p)
            except OSError:
                pass
            h.close_connection = True

        self.route(hold)
        with self.assertRaises(ShardError) as cm:
            self.sb.exec(["cat"], stdin=bad())
        self.assertEqual(cm.exception.code, "stdin_failed")
        self.assertIn("disk on fire", cm.exception.message)
        with self.assertRaises(TypeError):
            self.sb.exec(["cat"], stdin=42)  # type: ignore[arg-type]


if __name__ == "__main__":
    unittest.main()
