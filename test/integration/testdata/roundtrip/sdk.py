"""Files round trips through the Python SDK, for test/integration's
TestFilesRoundTrips: one job a line on stdin (JSON), one answer a line on
stdout. The server is $SHARD_REMOTE with $SHARD_API_KEY; the SDK is
imported from the checkout (argv[1], sdk/python/src).

  {"op": "write", "sandbox": ID, "path": P, "src": LOCAL, "how": H, "seed": N, "max_chunk": M}
      how: file    write_stream(open(src, "rb")), the file's length sent
           chunks  write_stream(a generator of random-sized bytes)
           reuse   write_stream(a generator of memoryviews of one buffer it refills)
           bytes   write(all of it)
  {"op": "read", "sandbox": ID, "path": P, "dst": LOCAL, "how": H, "seed": N, "max_chunk": M}
      how: copy    shutil.copyfileobj(read_stream(...), out)
           chunks  read_stream(...).read(random sizes)
           into    read_stream(...).readinto(one reused buffer, random sizes)
           whole   read(...)
  answer: {"ok": true, "bytes": N} or {"ok": false, "error": "..."}
"""

import json
import random
import shutil
import sys
import traceback

sys.path.insert(0, sys.argv[1])

from useshards import Shard  # noqa: E402


def sizes(seed: int, most: int):
    rng = random.Random(seed)
    while True:
        # Mostly small pieces, now and then a big one.
        yield rng.randint(1, most if rng.random() < 0.2 else max(1, most // 64))


def write(shard: Shard, job: dict) -> int:
    f = shard.files(job["sandbox"])
    how, src = job["how"], job["src"]
    if how == "file":
        with open(src, "rb") as inp:
            return f.write_stream(job["path"], inp).bytes
    if how == "bytes":
        with open(src, "rb") as inp:
            return f.write(job["path"], inp.read()).bytes
    if how == "chunks":
        def gen():
            with open(src, "rb") as inp:
                for n in sizes(job["seed"], job["max_chunk"]):
                    data = inp.read(n)
                    if not data:
                        return
                    yield data
        return f.write_stream(job["path"], gen()).bytes
    if how == "reuse":
        def gen_reused():
            buf = bytearray(job["max_chunk"])
            with open(src, "rb") as inp:
                for n in sizes(job["seed"], job["max_chunk"]):
                    k = inp.readinto(memoryview(buf)[:n])
                    if not k:
                        return
                    yield memoryview(buf)[:k]
        return f.write_stream(job["path"], gen_reused()).bytes
    raise ValueError(f"write how {how!r}")


def read(shard: Shard, job: dict) -> int:
    f = shard.files(job["sandbox"])
    how, dst = job["how"], job["dst"]
    with open(dst, "wb") as out:
        if how == "whole":
            data = f.read(job["path"])
            out.write(data)
            return len(data)
        with f.read_stream(job["path"]) as r:
            if how == "copy":
                shutil.copyfileobj(r, out)
            elif how == "chunks":
                for n in sizes(job["seed"], job["max_chunk"]):
                    data = r.read(n)
                    if not data:
                        break
                    out.write(data)
            elif how == "into":
                buf = bytearray(job["max_chunk"])
                for n in sizes(job["seed"], job["max_chunk"]):
                    k = r.readinto(memoryview(buf)[:n])
                    if not k:
                        break
                    out.write(memoryview(buf)[:k])
            else:
                raise ValueError(f"read how {how!r}")
            return r.bytes_read


def main() -> None:
    with Shard() as shard:
        for line in sys.stdin:
            job = json.loads(line)
            try:
                n = write(shard, job) if job["op"] == "write" else read(shard, job)
                ans = {"ok": True, "bytes": n}
            except Exception as e:  # every failure is an answer: the harness counts it
                ans = {"ok": False, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"}
            sys.stdout.write(json.dumps(ans) + "\n")
            sys.stdout.flush()


main()
