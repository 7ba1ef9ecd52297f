#!/usr/bin/env bash
# sdk-install.sh: install one of shard's SDKs into a project of yours, from
# this checkout. Neither SDK is on a registry (npm, PyPI) yet. Nothing is
# built or left in the checkout: the build happens in a temporary copy.
#
# Usage: scripts/sdk-install.sh ts PROJECT_DIR
#            the TypeScript SDK (npm package useshards; Node 20+): builds it
#            (npm ci, tsc: npm fetches TypeScript once), packs it into
#            PROJECT_DIR/useshards-VERSION.tgz and runs `npm install` of that
#            file in PROJECT_DIR, so the project's package.json names a file
#            it keeps (commit it, or run this again after an update).
#        scripts/sdk-install.sh python PROJECT_DIR
#            the Python SDK (package useshards; standard library only, no
#            download): pip-installs it into PROJECT_DIR/.venv, made with
#            `python3 -m venv` if the project has none. PYTHON=/path/to/python
#            installs into that interpreter's environment instead.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() {
	sed -n '7,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}
(($# == 2)) || usage
kind=$1
mkdir -p "$2"
project=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# copy SDK: the SDK's sources in tmp/SDK, without what a build in the
# checkout may have left (node_modules, dist, caches).
copy() {
	tar -C "$ROOT/sdk" --exclude node_modules --exclude dist --exclude dist-test --exclude __pycache__ -cf - "$1" | tar -C "$tmp" -xf -
}

case $kind in
ts | typescript)
	copy typescript
	(cd "$tmp/typescript" && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build)
	tgz=$(cd "$tmp/typescript" && npm pack --silent --pack-destination "$project")
	(cd "$project" && npm install --no-audit --no-fund --loglevel=error "./$tgz")
	echo "installed useshards into $project (from $project/$tgz): import { Shard } from \"useshards\""
	;;
python | py)
	copy python
	py=${PYTHON:-}
	if [[ -z $py ]]; then
		[[ -x $project/.venv/bin/python ]] || { python3 -m venv "$project/.venv" && echo "made $project/.venv"; }
		py=$project/.venv/bin/python
	fi
	"$py" -m pip install --quiet --disable-pip-version-check "$tmp/python"
	echo "installed useshards for $py: from useshards import Shard"
	;;
*) usage ;;
esac
