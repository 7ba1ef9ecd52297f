#!/usr/bin/python3
"""Throughput of the exec stream through the Python SDK: 100 MiB of stdout
(``head -c 104857600 /dev/zero``, read from exec_stream and counted) and
100 MiB of stdin (streamed from an iterable of 256 KiB chunks into
``wc -c``). Prints two lines (MB = 10^6 bytes):

    BENCH py-sdk-stdout-100MiB seconds S MBps R
    BENCH py-sdk-stdin-100MiB seconds S MBps R

Needs SHARD_REMOTE (and SHARD_API_KEY over TCP). Uses SHARD_BENCH_SANDBOX
(or --sandbox), else creates a sandbox of SHARD_BENCH_IMAGE (default busybox).

    /usr/bin/python3 bench/stream_bench.py [--sandbox ID] [--mib 100]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Iterator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from useshards import Sandbox, Shard  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description="Exec stream throughput through the Python SDK.")
    ap.add_argument("--mib", type=int, default=100, help="MiB each way (default 100)")
    ap.add_argument("--image", default=os.environ.get("SHARD_BENCH_IMAGE") or "busybox")
    ap.add_argument("--sandbox", default=os.environ.get("SHARD_BENCH_SANDBOX"),
                    help="an existing running sandbox (id or name) to use instead of a new one")
    args = ap.parse_args()
    n = args.mib << 20

    def line(what: str, secs: float) -> None:
        print(f"BENCH py-sdk-{what}-{args.mib}MiB seconds {secs:.3f} MBps {n / 1e6 / secs:.1f}", flush=True)

    def run(sb: Sandbox) -> None:
        sb.exec(["true"])  # warm the connection
        t0 = time.perf_counter()
        got = 0
        with sb.exec_stream(["head", "-c", str(n), "/dev/zero"]) as s:
            for c in s:
                got += len(c.data)
        secs = time.perf_counter() - t0
        if s.result.exit_code != 0 or got != n:
            raise SystemExit(f"stdout: exit {s.result.exit_code}, {got} bytes of {n}")
        line("stdout", secs)

        chunk = bytes(256 << 10)

        def zeros() -> Iterator[bytes]:
            for _ in range(n // len(chunk)):
                yield chunk

        t0 = time.perf_counter()
        r = sb.exec(["wc", "-c"], stdin=zeros())
        secs = time.perf_counter() - t0
        if r.exit_code != 0 or r.stdout.strip() != str(n):
            raise SystemExit(f"stdin: exit {r.exit_code}, wc said {r.stdout.strip()!r}: {r.stderr}")
        line("stdin", secs)

    with Shard() as shard:
        if args.sandbox:
            run(shard.get(args.sandbox))
        else:
            with shard.create(args.image, memory_mib=256) as sb:
                run(sb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
