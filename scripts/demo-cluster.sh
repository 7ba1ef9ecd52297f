#!/usr/bin/env bash
# demo-cluster.sh: two shard serve nodes on this host acting as one server,
# their shared state in a one-member etcd (Debian's etcd-server), as root on
# a machine prepared by install-deps.sh. Each node has its own data and run
# directories, socket, bridge, subnet, API port (--listen) and cluster port
# (--cluster-listen, where the other node calls it over mutual TLS with
# certificates made from the cluster key); both use the demo registry.
#
# etcd gets TLS with client certificates, as in any real setup
# (docs/cluster.md): anyone who reaches etcd administers the cluster. It
# holds the API keys' hashes (a writer adds a key of every project), where
# each node is (a writer points one elsewhere) and every placement; only the
# secrets are sealed. Loopback is no shelter: every local user reaches it.
# So etcd here takes only clients with a certificate of a throwaway CA made
# below (DIR/tls): one client certificate per node, one for etcdctl.
#
# Usage: scripts/demo-cluster.sh          start etcd and the nodes, walk through
#        scripts/demo-cluster.sh stop     stop the nodes (sandboxes removed) and etcd,
#                                         and undo what the nodes set up on the host
#
# stop leaves no trace on the host but the state in DIR: each node's
# store and mounts unmounted (the loop devices with them), its run
# directory, bridge and nftables tables (ip and bridge, named after the
# bridge) and its memory images' directory on /dev/shm removed; only what
# bears this demo's names. The registry is the demos' own (scripts/demo.sh
# uses it too) and keeps running: scripts/registry.sh stop DIR ends it.
#
# Environment, to run a second demo cluster beside this one (as the test of
# this script does; stop needs the same values):
#   SHARD_CLUSTER_DIR            state (default /var/lib/shard-demo-cluster)
#   SHARD_BIN                    where shard is built (default /usr/local/bin/shard)
#   SHARD_CLUSTER_BRIDGE         the bridges' prefix: node a's is PREFIXa (default shardc)
#   SHARD_CLUSTER_RUN            the run directories' prefix: node a's is PREFIX-a (default /run/shard-demo)
#   SHARD_CLUSTER_SUBNETS        the nodes' subnets (default "10.84.0.0/16 10.85.0.0/16")
#   SHARD_CLUSTER_PORT           node a's API port; b's is the next (default 7081)
#   SHARD_CLUSTER_PEER_PORT      node a's cluster port; b's is the next (default 7181)
#   SHARD_CLUSTER_ETCD_PORT, SHARD_CLUSTER_ETCD_PEER_PORT       etcd's (2379, 2380)
#   SHARD_DEMO_REGISTRY_PORT, SHARD_DEMO_REGISTRY_DIR           the registry's (5000)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="/usr/local/go/bin:$PATH"
DIR=${SHARD_CLUSTER_DIR:-/var/lib/shard-demo-cluster}
[[ $DIR == /* ]] || DIR=$PWD/$DIR # as the nodes see their --data-dir (clean names /dev/shm's by it)
BIN=${SHARD_BIN:-/usr/local/bin/shard}
TLS=$DIR/tls
REG_PORT=${SHARD_DEMO_REGISTRY_PORT:-5000}
ETCD=https://127.0.0.1:${SHARD_CLUSTER_ETCD_PORT:-2379}
ETCD_PEER=https://127.0.0.1:${SHARD_CLUSTER_ETCD_PEER_PORT:-2380}
NODES=(a b)
# PORT: the API (--listen, what callers use); CPORT: the cluster port.
port=${SHARD_CLUSTER_PORT:-7081} cport=${SHARD_CLUSTER_PEER_PORT:-7181}
read -r subnet_a subnet_b <<<"${SHARD_CLUSTER_SUBNETS:-10.84.0.0/16 10.85.0.0/16}"
declare -A PORT=([a]=$port [b]=$((port + 1))) CPORT=([a]=$cport [b]=$((cport + 1))) SUBNET=([a]=$subnet_a [b]=$subnet_b)
declare -A BRIDGE=([a]=${SHARD_CLUSTER_BRIDGE:-shardc}a [b]=${SHARD_CLUSTER_BRIDGE:-shardc}b)
declare -A RUN=([a]=${SHARD_CLUSTER_RUN:-/run/shard-demo}-a [b]=${SHARD_CLUSTER_RUN:-/run/shard-demo}-b)

# say, shq, run: show a command (pasteable) and run it.
. "$ROOT/scripts/say.sh"
# shard is the binary this script built (SHARD_BIN), wherever PATH points.
shard() { "$BIN" "$@"; }
on() { local n=$1; shift; shard --socket "$DIR/$n/shard.sock" "$@"; }
[[ $(id -u) -eq 0 ]] || { echo "demo-cluster.sh: run as root" >&2; exit 1; }

# clean_host DATA RUN BRIDGE, stop_pid FILE MARK
. "$ROOT/scripts/host-clean.sh"

# clean NODE: undo on the host what node NODE set up, once it has ended.
clean() { clean_host "$DIR/$1/data" "${RUN[$1]}" "${BRIDGE[$1]}"; }

stop() {
	for n in "${NODES[@]}"; do
		if [[ -f $DIR/$n/pid ]] && kill -0 "$(cat "$DIR/$n/pid")" 2>/dev/null; then
			for id in $(on "$n" list -q 2>/dev/null); do on "$n" remove --force "$id" >/dev/null 2>&1 || true; done
		fi
		stop_pid "$DIR/$n/pid" "$DIR/$n/shard.sock"
		clean "$n"
	done
	stop_pid "$DIR/etcd.pid" "$DIR/etcd"
	echo "stopped (state kept in $DIR)"
}
[[ ${1:-} == stop ]] && { stop; exit 0; }

echo "== build shard (stamped with the checkout's version) into $BIN"
"$ROOT/scripts/build.sh" "$BIN"
"$ROOT/scripts/registry.sh" start "${SHARD_DEMO_REGISTRY_DIR:-/var/lib/shard-demo-registry}" "$REG_PORT"
"$ROOT/scripts/test-images.sh" "127.0.0.1:$REG_PORT"
mkdir -p "$DIR"
chmod 700 "$DIR"

echo "== a throwaway CA, etcd's server certificate and the clients' (in $TLS)"
# openssl's chatter is kept in TLS/openssl.log, shown if a step fails.
ossl() { openssl "$@" 2>>"$TLS/openssl.log" >/dev/null || { cat "$TLS/openssl.log" >&2; exit 1; }; }
# issue NAME CN EXTENSIONS: NAME.key and NAME.crt, signed by the CA.
issue() {
	[[ -f $TLS/$1.crt ]] && return
	ossl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$2" \
		-keyout "$TLS/$1.key" -out "$TLS/$1.csr"
	printf '%s\n' "$3" >"$TLS/$1.ext"
	ossl x509 -req -in "$TLS/$1.csr" -CA "$TLS/ca.crt" -CAkey "$TLS/ca.key" -set_serial "0x$(openssl rand -hex 16)" \
		-days 825 -extfile "$TLS/$1.ext" -out "$TLS/$1.crt"
	rm -f "$TLS/$1.csr" "$TLS/$1.ext"
}
(umask 077 && mkdir -p "$TLS")
[[ -f $TLS/ca.crt ]] || ossl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
	-subj "/CN=shard demo etcd CA" -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
	-keyout "$TLS/ca.key" -out "$TLS/ca.crt"
# etcd's own: its client and peer URLs' addresses as SANs; clientAuth too,
# since the same certificate is the one member's peer certificate.
issue etcd "demo etcd" "$(printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" \
	"keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth,clientAuth")"
# One client certificate per node (its CN is the etcd user it would be with
# etcd's auth enabled), and one for etcdctl below.
for c in "${NODES[@]/#/node-}" etcdctl; do
	issue "$c" "shard-$c" "$(printf '%s\n' "keyUsage=critical,digitalSignature" "extendedKeyUsage=clientAuth")"
done
chmod 600 "$TLS"/*.key
ectl() { etcdctl --endpoints "$ETCD" --cacert "$TLS/ca.crt" --cert "$TLS/etcdctl.crt" --key "$TLS/etcdctl.key" "$@"; }

echo "== etcd (one member) on $ETCD, client certificates required"
if ! ectl endpoint health >/dev/null 2>&1; then
	etcd --name demo --data-dir "$DIR/etcd" --listen-client-urls "$ETCD" --advertise-client-urls "$ETCD" \
		--client-cert-auth --trusted-ca-file "$TLS/ca.crt" --cert-file "$TLS/etcd.crt" --key-file "$TLS/etcd.key" \
		--listen-peer-urls "$ETCD_PEER" --initial-advertise-peer-urls "$ETCD_PEER" --initial-cluster "demo=$ETCD_PEER" \
		--peer-client-cert-auth --peer-trusted-ca-file "$TLS/ca.crt" --peer-cert-file "$TLS/etcd.crt" --peer-key-file "$TLS/etcd.key" \
		>>"$DIR/etcd.log" 2>&1 &
	echo $! >"$DIR/etcd.pid"
	for _ in $(seq 100); do ectl endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
	ectl endpoint health >/dev/null 2>&1 || { tail -20 "$DIR/etcd.log" >&2; echo "demo-cluster.sh: etcd did not start (log: $DIR/etcd.log)" >&2; exit 1; }
fi

echo "== the cluster key every node holds (never written to etcd; the nodes' TLS is made from it)"
[[ -f $DIR/cluster.key ]] || (umask 077 && head -c 32 /dev/urandom >"$DIR/cluster.key")

for n in "${NODES[@]}"; do
	echo "== node $n: API on 127.0.0.1:${PORT[$n]}, cluster port on 127.0.0.1:${CPORT[$n]}"
	mkdir -p "$DIR/$n"
	if ! on "$n" capabilities >/dev/null 2>&1; then
		nohup "$BIN" serve --socket "$DIR/$n/shard.sock" --data-dir "$DIR/$n/data" --run-dir "${RUN[$n]}" \
			--bridge "${BRIDGE[$n]}" --subnet "${SUBNET[$n]}" --storage-size 1GiB --default-disk 512MiB \
			--registry-mirror "http://127.0.0.1:$REG_PORT" --listen "127.0.0.1:${PORT[$n]}" \
			--cluster-etcd "$ETCD" --etcd-ca "$TLS/ca.crt" --etcd-cert "$TLS/node-$n.crt" --etcd-key "$TLS/node-$n.key" \
			--node "$n" --advertise "https://127.0.0.1:${CPORT[$n]}" --cluster-listen "127.0.0.1:${CPORT[$n]}" \
			--cluster-key "$DIR/cluster.key" >>"$DIR/$n/serve.log" 2>&1 &
		echo $! >"$DIR/$n/pid"
		for _ in $(seq 200); do on "$n" capabilities >/dev/null 2>&1 && break; sleep 0.1; done
		on "$n" capabilities >/dev/null 2>&1 || { tail -20 "$DIR/$n/serve.log" >&2; echo "demo-cluster.sh: node $n did not start (log: $DIR/$n/serve.log)" >&2; exit 1; }
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
# What is not a node or the administrator gets nothing from etcd or a
# cluster port: both want a client certificate (etcd: of the demo's CA; a
# node: one made from the cluster key).
say "etcdctl --endpoints $ETCD --cacert $TLS/ca.crt get --prefix /shard/tokens/   # no client certificate"
etcdctl --endpoints "$ETCD" --cacert "$TLS/ca.crt" --dial-timeout 2s --command-timeout 3s get --prefix /shard/tokens/ 2>&1 | tail -1 || true
say "curl --insecure https://127.0.0.1:${CPORT[b]}/v0/nodes   # b's cluster port, without a node's certificate"
curl -sS --insecure --max-time 5 "https://127.0.0.1:${CPORT[b]}/v0/nodes" 2>&1 | tail -1 || true
echo
echo "both nodes keep running (logs in $DIR/*/serve.log); scripts/demo-cluster.sh stop ends them"
