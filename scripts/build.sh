#!/usr/bin/env bash
# build.sh: build shard as the demos install it: static (CGO_ENABLED=0: the
# agent it carries runs inside any image) and stamped with the checkout's
# version (git describe), which `shard --version` and GET /v0/version
# report. scripts/demo.sh and scripts/demo-cluster.sh both build with it,
# so the CLI and the servers they start say the same version.
#
# Usage: scripts/build.sh [OUT]      (default OUT: /usr/local/bin/shard)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="/usr/local/go/bin:$PATH"
OUT=${1:-/usr/local/bin/shard}
version=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo dev)
cd "$ROOT"
CGO_ENABLED=0 go build -ldflags "-X main.version=$version" -o "$OUT" ./cmd/shard
