#!/usr/bin/env bash
# test-images.sh: build small OCI test images from Debian packages (no
# container registry on the internet needed) and push them to a local
# registry, e.g. one started with scripts/registry.sh.
#
# Usage: scripts/test-images.sh REGISTRY_HOSTPORT      (e.g. 127.0.0.1:5000)
#
# Images (each pushed as HOSTPORT/library/NAME:TAG and HOSTPORT/NAME:TAG, so
# both a plain "HOSTPORT/busybox" reference and a docker.io-mirror lookup of
# "library/busybox" resolve):
#
#   busybox:latest     one layer: /bin/busybox from Debian's busybox-static,
#                      a symlink per applet, /etc/passwd (root, nobody 65534),
#                      /etc/group, /tmp (1777), /root, empty /etc/hostname and
#                      /etc/resolv.conf. Cmd ["/bin/sh"].
#   python:3.12-slim   named so that walk-throughs using python:3.12-slim work
#                      against a local mirror; it really holds Debian 12's
#                      python3 (3.11) and pip. Two layers: a debootstrap
#                      minbase of bookworm with python3 and python3-pip (apt
#                      lists/caches removed), then a small layer adding
#                      /usr/local/bin/python -> python3, /etc/shard-test-image,
#                      and removing Debian's EXTERNALLY-MANAGED marker so that
#                      `pip install` works as in the official image, and an
#                      /etc/pip.conf trusting the tests' package index host
#                      (198.18.252.2, plain HTTP; see test/integration/pypi_test.go).
#                      Cmd ["python3"], LANG=C.UTF-8.
#   node:22            named for the seeds' node:22; it holds the python image
#                      plus this machine's own Node.js (/usr/bin/node, 20.x)
#                      and npm, under /usr/local. Cmd ["node"].
#
# The OCI layouts are built with umoci and cached in
#   ${SHARD_TEST_IMAGE_CACHE:-/var/cache/shard-test-images}/<key>/<name>
# where <key> includes this script's sha256, so debootstrap (~90 s) runs once
# per machine and again only after this script changes; later runs only push
# (a few seconds; blobs the registry already has are skipped).
#
# Environment:
#   SHARD_TEST_IMAGE_CACHE  cache directory (default /var/cache/shard-test-images)
#   SHARD_DEBIAN_MIRROR     Debian mirror for debootstrap (default: the one the
#                           machine's apt uses, else http://deb.debian.org/debian)
#
# Needs root (debootstrap, ownership-preserving umoci unpack/repack) and the
# packages from scripts/install-deps.sh (umoci skopeo debootstrap busybox-static).
set -euo pipefail

SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")
CACHE=${SHARD_TEST_IMAGE_CACHE:-/var/cache/shard-test-images}
SUITE=bookworm
IMAGE_PATH_ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { printf 'test-images: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if (($# != 1)) || [[ $1 != *:* ]]; then
	echo "usage: $0 REGISTRY_HOSTPORT   (e.g. 127.0.0.1:5000)" >&2
	exit 2
fi
REGISTRY=$1

[[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap, umoci unpack/repack preserving ownership)"
for tool in umoci skopeo debootstrap sha256sum flock; do
	command -v "$tool" >/dev/null || die "$tool not found: run scripts/install-deps.sh"
done
[[ -x /bin/busybox ]] || die "/bin/busybox not found: run scripts/install-deps.sh (busybox-static)"

# Cache key: this script's content (any edit rebuilds) and the architecture.
KEY=$(sha256sum "$SCRIPT" | cut -c1-16)-$(dpkg --print-architecture)
KEYDIR=$CACHE/$KEY

mkdir -p "$CACHE"
# One run at a time per cache (two concurrent cold runs would both debootstrap).
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
	log "waiting for another test-images.sh run (lock $CACHE/.lock)"
	flock 9
fi

WORK=""
# Remove the scratch directory; first unmount anything debootstrap may have
# left mounted in it (proc, sys) if it failed, and never cross into mounts.
cleanup() {
	[[ -n $WORK && -d $WORK ]] || return 0
	local m
	while read -r m; do
		umount -l "$m" 2>/dev/null || true
	done < <(findmnt -rn -o TARGET | grep -F "$WORK/" | sort -r || true)
	rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT

# The Debian archive the machine's apt uses: the first enabled "deb" source for
# $SUITE, from /etc/apt/sources.list(.d/*.list) one-line entries or
# /etc/apt/sources.list.d/*.sources deb822 stanzas.
apt_mirror() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[[ -f $f ]] || continue
		# deb [options] URI SUITE COMPONENTS...
		awk -v suite="$SUITE" '
			$1 == "deb" {
				i = 2
				if ($i ~ /^\[/) { while ($i !~ /\]$/ && i < NF) i++; i++ }
				if ($(i + 1) == suite) { print $i; exit }
			}' "$f"
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -f $f ]] || continue
		# Stanzas are separated by blank lines; keys are case-insensitive.
		awk -v suite="$SUITE" '
			function flush() {
				if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " suite " ") && uris != "") {
					split(uris, u, " "); print u[1]; found = 1
				}
				types = suites = uris = ""; enabled = "yes"
			}
			BEGIN { enabled = "yes" }
			/^[ \t]*#/ { next }
			/^[ \t]*$/ { flush(); if (found) exit; next }
			{
				k = tolower($1); sub(/:$/, "", k); $1 = ""; sub(/^ +/, "")
				if (k == "types") types = $0
				else if (k == "suites") suites = $0
				else if (k == "uris") uris = $0
				else if (k == "enabled") enabled = tolower($0)
			}
			END { if (!found) flush() }' "$f"
	done
}

debian_mirror() {
	local m
	if [[ -n ${SHARD_DEBIAN_MIRROR:-} ]]; then
		echo "$SHARD_DEBIAN_MIRROR"
		return
	fi
	m=$(apt_mirror | head -n1)
	echo "${m:-http://deb.debian.org/debian}"
}

# umoci wrappers. A layout L holds one image tag; BUNDLE is an unpacked copy.
oci_new() { # LAYOUT TAG BUNDLE: empty image, unpacked to BUNDLE (rootfs empty)
	umoci init --layout "$1"
	umoci new --image "$1:$2"
	umoci unpack --image "$1:$2" "$3"
}
oci_commit() { # LAYOUT TAG BUNDLE WHAT: new layer from the changes in BUNDLE/rootfs
	umoci repack --refresh-bundle --history.created_by "test-images.sh: $4" --image "$1:$2" "$3"
}

build_busybox() { # OUT_LAYOUT TAG
	local L=$1 tag=$2 B=$WORK/busybox-bundle
	oci_new "$L" "$tag" "$B"
	local R=$B/rootfs applet
	install -d -m 0755 "$R"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,dev,proc,sys,home,var}
	install -d -m 0700 "$R/root"
	install -d -m 1777 "$R/tmp"
	install -m 0755 /bin/busybox "$R/bin/busybox"
	# One symlink per applet at its standard place (bin/sh, usr/bin/awk, ...;
	# not the initrd-only /linuxrc); fall back to /bin for everything if
	# --list-full is not supported.
	if /bin/busybox --list-full >/dev/null 2>&1; then
		while read -r applet; do
			[[ $applet == bin/busybox || $applet == linuxrc || -e $R/$applet ]] && continue
			ln -s /bin/busybox "$R/$applet"
		done < <(/bin/busybox --list-full)
	else
		while read -r applet; do
			[[ $applet == busybox || -e $R/bin/$applet ]] && continue
			ln -s busybox "$R/bin/$applet"
		done < <(/bin/busybox --list)
	fi
	[[ -e $R/bin/sh ]] || ln -s busybox "$R/bin/sh"
	cat >"$R/etc/passwd" <<-'EOF'
		root:x:0:0:root:/root:/bin/sh
		nobody:x:65534:65534:nobody:/nonexistent:/bin/false
	EOF
	cat >"$R/etc/group" <<-'EOF'
		root:x:0:
		nogroup:x:65534:
	EOF
	: >"$R/etc/hostname"
	: >"$R/etc/resolv.conf"
	chmod 0644 "$R"/etc/{passwd,group,hostname,resolv.conf}
	oci_commit "$L" "$tag" "$B" "busybox-static $(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || echo '?')"
	umoci config --image "$L:$tag" --history.created_by "test-images.sh: config" \
		--config.cmd /bin/sh --config.env "$IMAGE_PATH_ENV"
}

build_python() { # OUT_LAYOUT TAG
	local L=$1 tag=$2 B=$WORK/python-bundle mirror
	oci_new "$L" "$tag" "$B"
	local R=$B/rootfs
	mirror=$(debian_mirror)
	# debootstrap runs wget, which does not read apt's proxy setting.
	if [[ -z ${http_proxy:-} ]]; then
		local APT_HTTP_PROXY=""
		eval "$(apt-config shell APT_HTTP_PROXY Acquire::http::Proxy 2>/dev/null || true)"
		[[ -n $APT_HTTP_PROXY && $APT_HTTP_PROXY != DIRECT ]] && export http_proxy=$APT_HTTP_PROXY
	fi
	log "debootstrap $SUITE from $mirror (about 90 s)"
	if ! debootstrap --variant=minbase --include=python3-minimal,python3,python3-pip \
		"$SUITE" "$R" "$mirror" >"$WORK/debootstrap.log" 2>&1; then
		tail -n 40 "$WORK/debootstrap.log" >&2
		[[ -f $R/debootstrap/debootstrap.log ]] && tail -n 40 "$R/debootstrap/debootstrap.log" >&2
		die "debootstrap failed"
	fi
	# Shrink: apt indexes and caches, docs, man pages, the debootstrap dir.
	# Also drop what debootstrap copied from this host or created for itself:
	# /etc/resolv.conf, /etc/hostname (runtimes provide them) and /dev nodes.
	rm -rf "${R:?}"/var/lib/apt/lists/* "${R:?}"/var/cache/apt/* "${R:?}"/var/cache/debconf/*-old \
		"${R:?}"/var/log/* "${R:?}"/usr/share/man/* "${R:?}"/usr/share/info/* "${R:?}"/debootstrap \
		"${R:?}"/dev/* "${R:?}"/tmp/* "${R:?}"/var/tmp/*
	find "$R/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
	find "$R/usr/share/doc" -mindepth 1 -type d -empty -delete
	: >"$R/etc/resolv.conf"
	: >"$R/etc/hostname"
	chmod 0644 "$R/etc/resolv.conf" "$R/etc/hostname" # copied with the host's mode
	oci_commit "$L" "$tag" "$B" "debootstrap --variant=minbase --include=python3-minimal,python3,python3-pip $SUITE"

	# Second, small layer, so that tests see a multi-layer image.
	ln -sfn /usr/bin/python3 "$R/usr/local/bin/python"
	rm -f "$R"/usr/lib/python3*/EXTERNALLY-MANAGED
	# The tests' stand-in for PyPI is served over plain HTTP from 198.18.252.2
	# (test/integration/pypi_test.go): pip must trust that host.
	printf '[global]\ntrusted-host = 198.18.252.2\n' >"$R/etc/pip.conf"
	printf 'shard test image python:%s (Debian %s python3 %s), built by scripts/test-images.sh\n' \
		"$tag" "$SUITE" "$(chroot "$R" python3 -c 'import platform; print(platform.python_version())')" \
		>"$R/etc/shard-test-image"
	oci_commit "$L" "$tag" "$B" "python symlink, /etc/shard-test-image, pip without EXTERNALLY-MANAGED"
	umoci config --image "$L:$tag" --history.created_by "test-images.sh: config" \
		--config.cmd python3 --config.env "$IMAGE_PATH_ENV" --config.env LANG=C.UTF-8
}

build_node() { # OUT_LAYOUT TAG: the python image plus the host's Node.js and npm
	local L=$1 tag=$2 B=$WORK/node-bundle node npmdir
	node=$(command -v node) || die "node not found: run scripts/install-deps.sh"
	npmdir=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")
	[[ -f $npmdir/package.json ]] || die "npm's directory not found (from $(command -v npm))"
	cp -a "$KEYDIR/python" "$L"
	rm -f "$L/.complete"
	umoci tag --image "$L:3.12-slim" "$tag"
	umoci rm --image "$L:3.12-slim"
	umoci unpack --image "$L:$tag" "$B"
	local R=$B/rootfs
	install -m 0755 "$(readlink -f "$node")" "$R/usr/local/bin/node"
	install -d "$R/usr/local/lib/node_modules"
	cp -a "$npmdir" "$R/usr/local/lib/node_modules/npm"
	ln -sfn ../lib/node_modules/npm/bin/npm-cli.js "$R/usr/local/bin/npm"
	ln -sfn ../lib/node_modules/npm/bin/npx-cli.js "$R/usr/local/bin/npx"
	chroot "$R" /usr/local/bin/node --version >/dev/null || die "node does not run in the image"
	oci_commit "$L" "$tag" "$B" "node $("$node" --version) and npm from the build host"
	umoci config --image "$L:$tag" --history.created_by "test-images.sh: config" --config.cmd node
}

# ensure_image NAME TAG BUILDER: make sure $KEYDIR/NAME holds NAME:TAG.
ensure_image() {
	local name=$1 tag=$2 builder=$3 out=$KEYDIR/$1 start=$SECONDS
	if [[ -f $out/.complete ]]; then
		log "$name:$tag: cached in $out"
		return
	fi
	log "$name:$tag: building"
	[[ -n $WORK ]] || WORK=$(mktemp -d "$CACHE/.work.XXXXXX")
	local L=$WORK/$name-oci
	"$builder" "$L" "$tag"
	umoci gc --layout "$L" # drop the intermediate manifests/configs
	touch "$L/.complete"
	mkdir -p "$KEYDIR"
	rm -rf "$out"
	mv "$L" "$out" # same filesystem: atomic
	log "$name:$tag: built in $((SECONDS - start))s"
}

# Drop layouts built by other versions of this script (only our <key> dirs).
for d in "$CACHE"/*; do
	[[ -d $d && $d != "$KEYDIR" && ${d##*/} =~ ^[0-9a-f]{16}-[a-z0-9]+$ ]] || continue
	log "removing stale cache $d"
	rm -rf --one-file-system "$d"
done
# Leftover scratch from an interrupted run (we hold the lock, so not in use).
for d in "$CACHE"/.work.*; do
	[[ -d $d ]] || continue
	WORK=$d cleanup
done
WORK=""

IMAGES=("busybox latest build_busybox" "python 3.12-slim build_python" "node 22 build_node")
for spec in "${IMAGES[@]}"; do
	read -r name tag builder <<<"$spec"
	ensure_image "$name" "$tag" "$builder"
done

# Push each image under both names. skopeo only uploads blobs the registry
# does not have yet. --insecure-policy: no signature policy for a local test
# registry (and /etc/containers/policy.json may be absent).
PUSHED=()
for spec in "${IMAGES[@]}"; do
	read -r name tag _ <<<"$spec"
	for ref in "$REGISTRY/library/$name:$tag" "$REGISTRY/$name:$tag"; do
		skopeo --insecure-policy copy --quiet --dest-tls-verify=false \
			--digestfile "$CACHE/.digest" "oci:$KEYDIR/$name:$tag" "docker://$ref"
		PUSHED+=("$ref@$(<"$CACHE/.digest")")
	done
done
rm -f "$CACHE/.digest"

echo "pushed:"
printf '  %s\n' "${PUSHED[@]}"
