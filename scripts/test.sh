#!/usr/bin/env bash
# test.sh: every test, as root, on a machine where install-deps.sh may not
# have run yet (it runs first; a rerun is quick). Integration tests drive
# real runsc and runc, a real local registry, network namespaces and
# nftables: SHARD_INTEGRATION=1 turns them on, and then a missing runtime
# fails instead of skipping.
#
# Usage: scripts/test.sh [go test flags...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="/usr/local/go/bin:$PATH"
cd "$ROOT"

"$ROOT/scripts/install-deps.sh"

echo "== go vet"
CGO_ENABLED=0 go vet ./...
echo "== gofmt"
unformatted=$(gofmt -l cmd client internal test)
if [[ -n $unformatted ]]; then
	echo "not gofmt'ed:" >&2
	echo "$unformatted" >&2
	exit 1
fi

echo "== go test (unit and integration)"
SHARD_INTEGRATION=1 CGO_ENABLED=0 go test -count=1 -timeout 30m "$@" ./...
