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

echo "== go test -race (unit)"
# The race detector needs cgo. The shard binary the integration tests build
# is a plain go build (with cgo here: cmd/shard/static.go links it
# statically, as the agent it carries must be).
CGO_ENABLED=1 go test -race -count=1 -timeout 15m "$@" ./internal/... ./client/... ./cmd/...

# Each SDK's hand-written copy of the API's wire types against
# internal/api/openapi.json, which the Go tests above tie to the server
# (go test ./client checks the Go client's copy): no server needed. The
# SDKs' whole suites run in the integration tests below
# (test/integration/sdk_test.go), these tests among them.
echo "== SDK wire types (TypeScript, Python) against openapi.json"
(cd sdk/typescript && npm ci --no-audit --no-fund && npm run pretest && node --test dist-test/wire.test.js)
(cd sdk/python && /usr/bin/python3 -m unittest discover -s tests -p test_wire.py -v)

echo "== go test (unit and integration)"
SHARD_INTEGRATION=1 CGO_ENABLED=0 go test -count=1 -timeout 45m "$@" ./...

# A short run of each fuzz target of the decoders of untrusted input (seed
# corpora in each package's testdata/fuzz/), after the tests: nothing may
# panic, and a bad request must be a 4xx. Each package's test binary is
# built once. SHARD_FUZZTIME is the time per target (default 5s; 0 skips).
fuzztime=${SHARD_FUZZTIME:-5s}
if [[ $fuzztime != 0 && $fuzztime != 0s ]]; then
	echo "== go fuzz ($fuzztime per target)"
	fuzz_targets=(
		"internal/units FuzzParseSize FuzzParseCPU"
		"internal/names FuzzNames"
		"internal/api FuzzCreateRequest FuzzForkRequest FuzzExecRequest FuzzEnvironmentRequest FuzzGrantRequest FuzzPolicyRequest FuzzTokenRequest FuzzSecretRequest"
		"internal/image FuzzUnpackLayer FuzzImportArchive FuzzImportOCILayout FuzzImportDockerArchive FuzzImageConfig FuzzIndexManifest"
	)
	module=$(go list -m)
	fuzzbin=$(mktemp -d)
	for line in "${fuzz_targets[@]}"; do
		read -r pkg targets <<<"$line"
		CGO_ENABLED=0 go test -c -fuzz=. -o "$fuzzbin/fuzz.test" "./$pkg"
		for name in $targets; do
			echo "-- $pkg $name"
			# From the package's directory, as go test runs it: a failing
			# input is written to its testdata/fuzz/$name. Go's fuzzing
			# coordinator can fail a target with a bare "context deadline
			# exceeded" when -fuzztime ends while a starved worker is
			# mid-input (a race of its own, golang/go internal/fuzz): no
			# input is written then. Such a run is tried once more; a
			# written input, or a second failure, fails the suite.
			for try in 1 2; do
				before=$(ls "$pkg/testdata/fuzz/$name" 2>/dev/null | wc -l)
				if out=$(cd "$pkg" && "$fuzzbin/fuzz.test" -test.run='^$' -test.fuzz="^${name}\$" -test.fuzztime="$fuzztime" \
					-test.fuzzcachedir="$(go env GOCACHE)/fuzz/$module/$pkg" 2>&1); then
					echo "$out"
					break
				fi
				echo "$out"
				after=$(ls "$pkg/testdata/fuzz/$name" 2>/dev/null | wc -l)
				if [[ $try == 1 && $after == "$before" && $out == *"context deadline exceeded"* ]]; then
					echo "-- $pkg $name: the fuzzing coordinator's deadline race, no input written: once more"
					continue
				fi
				exit 1
			done
		done
	done
	rm -rf "$fuzzbin"
fi
