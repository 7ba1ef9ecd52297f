#!/usr/bin/env bash
# demo.sh: the main job on a machine prepared by install-deps.sh, as root:
# build shard, start a local registry holding the test images (so the seed's
# python:3.12-slim works offline through a registry mirror), start
# `shard serve` (its Prometheus metrics on 127.0.0.1:9470, without a key),
# and run the walk-through of seed 001 with the CLI.
#
# Usage: scripts/demo.sh         (safe to rerun; leaves shard serve running)
#        scripts/demo.sh stop    stop the sandboxes (kept, stopped) and the
#                                server it started, and undo what the server
#                                set up on the host: its store and mounts
#                                unmounted, its run directory, bridge and
#                                nftables tables removed. The state stays in
#                                the data directory (rm -rf it to reclaim the
#                                disk); a rerun starts the server again on it.
#                                The registry keeps running: scripts/registry.sh
#                                stop /var/lib/shard-demo-registry ends it.
# Environment (stop needs the same values):
#   SHARD_DEMO_METRICS          --metrics-listen (default 127.0.0.1:9470)
#   SHARD_DEMO_DIR, SHARD_DEMO_RUN, SHARD_DEMO_SOCKET
#                               --data-dir, --run-dir, --socket (default
#                               /var/lib/shard, /run/shard, /run/shard/shard.sock)
#   SHARD_DEMO_BRIDGE, SHARD_DEMO_SUBNET  --bridge, --subnet (shard0, 10.88.0.0/16)
#   SHARD_DEMO_STORAGE_SIZE, SHARD_DEMO_DEFAULT_DISK  --storage-size, --default-disk (4GiB, 1GiB)
#   SHARD_BIN                   where shard is built (default /usr/local/bin/shard)
#   SHARD_DEMO_REGISTRY_PORT, SHARD_DEMO_REGISTRY_DIR  the registry's
#
# Offline changes to the seed's walk-through: `python:3.12-slim` is served by
# the local mirror (it holds Debian 12's python3), and instead of pip
# installing from PyPI (unreachable here) each step makes a change that needs
# no internet.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="/usr/local/go/bin:$PATH"
REG_PORT=${SHARD_DEMO_REGISTRY_PORT:-5000}
REG_DIR=${SHARD_DEMO_REGISTRY_DIR:-/var/lib/shard-demo-registry}
LOG=${SHARD_DEMO_LOG:-/var/log/shard-serve.log}
METRICS=${SHARD_DEMO_METRICS:-127.0.0.1:9470}
DATA=${SHARD_DEMO_DIR:-/var/lib/shard}
RUN=${SHARD_DEMO_RUN:-/run/shard}
SOCK=${SHARD_DEMO_SOCKET:-/run/shard/shard.sock}
BRIDGE=${SHARD_DEMO_BRIDGE:-shard0}
SUBNET=${SHARD_DEMO_SUBNET:-10.88.0.0/16}
BIN=${SHARD_BIN:-/usr/local/bin/shard}
STORAGE_SIZE=${SHARD_DEMO_STORAGE_SIZE:-4GiB}
DEFAULT_DISK=${SHARD_DEMO_DEFAULT_DISK:-1GiB}
# The pid of the server this script started (stop ends only that one).
PIDFILE=$DATA.demo.pid

# say, shq, run: show a command (pasteable) and run it.
. "$ROOT/scripts/say.sh"
# clean_host DATA RUN BRIDGE, stop_pid FILE MARK
. "$ROOT/scripts/host-clean.sh"
# shard is the binary this script built, on the demo's socket.
shard() { "$BIN" --socket "$SOCK" "$@"; }

[[ $(id -u) -eq 0 ]] || { echo "demo.sh: run as root" >&2; exit 1; }

stop() {
	if [[ ! -f $PIDFILE ]]; then
		echo "demo.sh stop: no server started by demo.sh ($PIDFILE): stop yours by its pid" >&2
		exit 1
	fi
	local id running
	if shard capabilities >/dev/null 2>&1; then
		for id in $(shard list -q --all-projects); do shard stop "$id" >/dev/null 2>&1 || true; done
		running=$(shard list --all-projects --json | grep -c '"state": "running"' || true)
		if [[ $running != 0 ]]; then
			echo "demo.sh stop: $running sandbox(es) did not stop (shard list), so the host is left as it is" >&2
			exit 1
		fi
	fi
	stop_pid "$PIDFILE" "serve"
	clean_host "$DATA" "$RUN" "$BRIDGE"
	echo "stopped (sandboxes stopped, state kept in $DATA: $(du -sh "$DATA" 2>/dev/null | cut -f1) on disk)"
}
[[ ${1:-} == stop ]] && { stop; exit 0; }

echo "== build shard (static: its agent runs inside any image; stamped with the checkout's version)"
"$ROOT/scripts/build.sh" "$BIN"

echo "== local registry with the test images on 127.0.0.1:$REG_PORT"
"$ROOT/scripts/registry.sh" start "$REG_DIR" "$REG_PORT"
"$ROOT/scripts/test-images.sh" "127.0.0.1:$REG_PORT"

echo "== shard serve"
if ! shard capabilities >/dev/null 2>&1; then
	# Sandboxes that name no disk get 1GiB (the default is 2GiB): the
	# walk-through's three then fit the store's first 4GiB, and the demo
	# leaves the host room for scripts/test.sh after it. Prometheus scrapes
	# TCP, never a Unix socket: --metrics-listen serves GET /metrics on
	# loopback without a key (docs/console-and-metrics.md).
	nohup "$BIN" serve --socket "$SOCK" --data-dir "$DATA" --run-dir "$RUN" --bridge "$BRIDGE" --subnet "$SUBNET" \
		--registry-mirror "http://127.0.0.1:$REG_PORT" --storage-size "$STORAGE_SIZE" --default-disk "$DEFAULT_DISK" \
		--metrics-listen "$METRICS" >>"$LOG" 2>&1 &
	echo $! >"$PIDFILE"
	for _ in $(seq 100); do
		shard capabilities >/dev/null 2>&1 && break
		sleep 0.1
	done
fi
run shard capabilities

echo "== the walk-through of seed 001"
for n in base try-a try-b; do shard remove --force "$n" >/dev/null 2>&1 || true; done
run shard create --name base --memory 512MiB python:3.12-slim
# "pip install requests==V" without PyPI: write the module pip would leave.
pip_install() { run shard exec "$1" sh -c "mkdir -p /usr/local/lib/site && echo '__version__ = \"$2\"' > /usr/local/lib/site/requests.py"; }
check='import sys; sys.path.insert(0, "/usr/local/lib/site"); import requests; print(requests.__version__)'
pip_install base 2.32.3
run shard fork --name try-a base
run shard fork --name try-b base
pip_install try-a 2.31.0
pip_install try-b 2.32.4
run shard exec try-a python -c "$check"
run shard exec try-b python -c "$check"
run shard exec base python -c "$check"
run shard remove --force try-a
run shard list
echo
echo "shard serve keeps running (log: $LOG). Try: shard exec -it base sh"
echo "Its metrics: curl http://$METRICS/metrics"
echo "scripts/demo.sh stop stops it (its sandboxes stopped and kept)."
