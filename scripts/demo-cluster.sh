#!/usr/bin/env bash
# demo-cluster.sh: two shard serve nodes on this host acting as one server,
# their shared state in a one-member etcd (Debian's etcd-server), as root on
# a machine prepared by install-deps.sh. Each node has its own data and run
# directories, socket, bridge, subnet and port; both use the demo registry.
#
# Usage: scripts/demo-cluster.sh          start etcd and the nodes, walk through
#        scripts/demo-cluster.sh stop     stop the nodes (sandboxes removed) and etcd
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="/usr/local/go/bin:$PATH"
DIR=${SHARD_CLUSTER_DIR:-/var/lib/shard-demo-cluster}
REG_PORT=${SHARD_DEMO_REGISTRY_PORT:-5000}
ETCD=http://127.0.0.1:${SHARD_CLUSTER_ETCD_PORT:-2379}
NODES=(a b)
declare -A PORT=([a]=7081 [b]=7082) SUBNET=([a]=10.84.0.0/16 [b]=10.85.0.0/16)

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { say "$*"; "$@"; }
on() { local n=$1; shift; shard --socket "$DIR/$n/shard.sock" "$@"; }
[[ $(id -u) -eq 0 ]] || { echo "demo-cluster.sh: run as root" >&2; exit 1; }

stop() {
	for n in "${NODES[@]}"; do
		if [[ -f $DIR/$n/pid ]] && kill -0 "$(cat "$DIR/$n/pid")" 2>/dev/null; then
			for id in $(on "$n" list -q 2>/dev/null); do on "$n" remove --force "$id" >/dev/null 2>&1 || true; done
			kill "$(cat "$DIR/$n/pid")"
			while kill -0 "$(cat "$DIR/$n/pid")" 2>/dev/null; do sleep 0.1; done
		fi
	done
	[[ -f $DIR/etcd.pid ]] && kill "$(cat "$DIR/etcd.pid")" 2>/dev/null || true
	echo "stopped (state kept in $DIR)"
}
[[ ${1:-} == stop ]] && { stop; exit 0; }

echo "== build shard"
(cd "$ROOT" && CGO_ENABLED=0 go build -o /usr/local/bin/shard ./cmd/shard)
"$ROOT/scripts/registry.sh" start "${SHARD_DEMO_REGISTRY_DIR:-/var/lib/shard-demo-registry}" "$REG_PORT"
"$ROOT/scripts/test-images.sh" "127.0.0.1:$REG_PORT"
mkdir -p "$DIR"
chmod 700 "$DIR"

echo "== etcd (one member) on $ETCD"
if ! etcdctl --endpoints "$ETCD" endpoint health >/dev/null 2>&1; then
	etcd --name demo --data-dir "$DIR/etcd" --listen-client-urls "$ETCD" --advertise-client-urls "$ETCD" \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster demo=http://127.0.0.1:2380 >>"$DIR/etcd.log" 2>&1 &
	echo $! >"$DIR/etcd.pid"
	for _ in $(seq 100); do etcdctl --endpoints "$ETCD" endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
fi

echo "== the cluster key every node holds (never written to etcd)"
[[ -f $DIR/cluster.key ]] || (umask 077 && head -c 32 /dev/urandom >"$DIR/cluster.key")

for n in "${NODES[@]}"; do
	echo "== node $n on 127.0.0.1:${PORT[$n]}"
	mkdir -p "$DIR/$n"
	if ! on "$n" capabilities >/dev/null 2>&1; then
		nohup shard serve --socket "$DIR/$n/shard.sock" --data-dir "$DIR/$n/data" --run-dir "/run/shard-demo-$n" \
			--bridge "shardc$n" --subnet "${SUBNET[$n]}" --storage-size 4GiB --default-disk 512MiB \
			--registry-mirror "http://127.0.0.1:$REG_PORT" --listen "127.0.0.1:${PORT[$n]}" \
			--cluster-etcd "$ETCD" --node "$n" --advertise "http://127.0.0.1:${PORT[$n]}" --cluster-key "$DIR/cluster.key" \
			>>"$DIR/$n/serve.log" 2>&1 &
		echo $! >"$DIR/$n/pid"
		for _ in $(seq 200); do on "$n" capabilities >/dev/null 2>&1 && break; sleep 0.1; done
	fi
done

echo "== walk-through"
run shard --socket "$DIR/a/shard.sock" node ls
on a token revoke demo >/dev/null 2>&1 || true
say "export SHARD_API_KEY=\$(shard --socket $DIR/a/shard.sock token create --name demo --scope '*')   # made on a"
SHARD_API_KEY=$(on a token create --name demo --scope '*' 2>/dev/null)
export SHARD_API_KEY
for s in base try-a; do on a remove --force "$s" >/dev/null 2>&1 || true; done
# Through b's TCP API with a key made on a: b places the sandbox.
export SHARD_REMOTE=http://127.0.0.1:${PORT[b]}
run shard create --name base --memory 512MiB python:3.12-slim
run shard exec base sh -c 'echo 2.32.3 > /tmp/version; echo "hello from $(hostname)"'
# Through a: the call about base goes to the node that runs it.
export SHARD_REMOTE=http://127.0.0.1:${PORT[a]}
run shard fork --name try-a base
run shard exec try-a cat /tmp/version
run shard list
run shard node ls
echo
echo "both nodes keep running (logs in $DIR/*/serve.log); scripts/demo-cluster.sh stop ends them"
