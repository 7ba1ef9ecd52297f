#!/usr/bin/env bash
# bench-compare.sh: the integration benchmarks of this checkout against the
# shard binary of an earlier revision, in one run: the two alternate (before,
# after, before, after), each on a server of its own made by the harness, and
# the p50 of each figure is printed side by side with its ratio.
#
#   scripts/bench-compare.sh REV [BENCH_REGEX] [BENCHTIME]
#
# e.g. scripts/bench-compare.sh main 'ExecTrue|Fork/256MiB$|ClusterExec' 20x
# Root, with what scripts/test.sh needs (scripts/install-deps.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REV=${1:?usage: bench-compare.sh REV [BENCH_REGEX] [BENCHTIME]}
PATTERN=${2:-'ExecTrue|Fork/256MiB$|ClusterExec'}
BENCHTIME=${3:-20x}
ROUNDS=${ROUNDS:-2}
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
	export PATH=/usr/local/go/bin:$PATH
fi

work=$(mktemp -d)
out=${OUT:-$work/out} # the runs' output (kept when OUT is given)
mkdir -p "$out"
trap 'git -C "$ROOT" worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$ROOT" worktree add --detach "$work/src" "$REV" >/dev/null
(cd "$work/src" && CGO_ENABLED=0 go build -o "$work/before" ./cmd/shard)
echo "== before: $REV ($(git -C "$work/src" rev-parse --short HEAD)); after: this checkout ($(git -C "$ROOT" rev-parse --short HEAD))"

cd "$ROOT"
for round in $(seq "$ROUNDS"); do
	for which in before after; do
		echo "== round $round: $which"
		bin=""
		[[ $which == before ]] && bin="$work/before"
		SHARD_IT_BIN="$bin" SHARD_INTEGRATION=1 CGO_ENABLED=0 \
			go test -count=1 -timeout 60m -run '^$' -bench "$PATTERN" -benchtime "$BENCHTIME" ./test/integration \
			>"$out/$which-$round.txt" 2>"$out/$which-$round.log" || true
		grep -h '^BENCH' "$out/$which-$round.txt" "$out/$which-$round.log" || true
	done
done

# Each benchmark line holds "value unit" pairs; the p50 figures are the
# units ending in p50-ms. Their median over the rounds, before and after.
echo
echo "== p50 (ms): before, after, after/before"
for which in before after; do
	# A result line may be broken by the benchmark's own BENCH lines (both
	# go to the test binary's output): its figures then follow on a line of
	# their own, after the name.
	cat "$out/$which"-*.txt | awk -v w="$which" '
		/^Benchmark/ { name = $1; sub(/-[0-9]+$/, "", name) }
		/p50-ms/ { for (i = 1; i < NF; i++) if ($(i+1) ~ /p50-ms$/) print name "/" $(i+1), $i, w }
	'
done | sort | awk '
	{ k=$1; v=$2; w=$3; vals[k, w] = vals[k, w] " " v; keys[k] = 1 }
	function median(s,   a, n, i, j, t) {
		n = split(s, a, " ")
		for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	END {
		for (k in keys) {
			b = median(vals[k, "before"]); a = median(vals[k, "after"])
			printf "%-60s %9.1f %9.1f   %.2fx\n", k, b, a, (b > 0 ? a / b : 0)
		}
	}' | sort
