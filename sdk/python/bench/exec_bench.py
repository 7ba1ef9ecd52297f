#!/usr/bin/python3
"""Exec round trip through the Python SDK: N execs of ["true"] in one sandbox.

Prints one line, ``BENCH py-sdk-exec p50 X p90 Y`` (milliseconds), to stdout.
Needs SHARD_REMOTE (and SHARD_API_KEY over TCP). The image is
SHARD_BENCH_IMAGE, else SHARD_TEST_PYTHON_IMAGE, else busybox.

    /usr/bin/python3 bench/exec_bench.py [-n 50]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from useshards import Shard  # noqa: E402


def percentile(sorted_ms: List[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    return sorted_ms[max(0, math.ceil(p / 100 * len(sorted_ms)) - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description="Exec round trip through the Python SDK.")
    ap.add_argument("-n", type=int, default=50, help="number of execs timed (default 50)")
    ap.add_argument("--image", default=os.environ.get("SHARD_BENCH_IMAGE") or os.environ.get("SHARD_TEST_PYTHON_IMAGE") or "busybox")
    ap.add_argument("--sandbox", default=os.environ.get("SHARD_BENCH_SANDBOX"),
                    help="an existing running sandbox (id or name) to use instead of a new one")
    args = ap.parse_args()

    def run(sb: "object") -> List[float]:
        for _ in range(3):  # warm the connection and the sandbox
            sb.exec(["true"])  # type: ignore[attr-defined]
        ms: List[float] = []
        for _ in range(args.n):
            t0 = time.perf_counter()
            r = sb.exec(["true"])  # type: ignore[attr-defined]
            ms.append((time.perf_counter() - t0) * 1000)
            if r.exit_code != 0:
                raise SystemExit(f"true exited {r.exit_code}: {r.stderr}")
        return ms

    with Shard() as shard:
        if args.sandbox:
            ms = run(shard.get(args.sandbox))
        else:
            with shard.create(args.image, memory_mib=256) as sb:
                ms = run(sb)
    ms.sort()
    print(f"BENCH py-sdk-exec p50 {statistics.median(ms):.2f} p90 {percentile(ms, 90):.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
