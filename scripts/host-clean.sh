# Sourced by the demo scripts. clean_host DATA RUN BRIDGE undoes on the host
# what a shard serve with those --data-dir, --run-dir and --bridge set up,
# once it has ended (or died) and its sandboxes with it: the runtimes'
# leftovers, every mount under its data and run directories (deepest
# first), loop devices still on its files, its bridge and nftables tables
# (ip and bridge, named after the bridge), its run directory and its memory
# images' directory on /dev/shm. Its state in DATA stays.
clean_host() {
	local data=$1 run=$2 br=$3 rt id m dev file
	for rt in runsc runc; do
		[[ -d $run/$rt ]] || continue
		for id in $("$rt" --root "$run/$rt" list --quiet 2>/dev/null); do "$rt" --root "$run/$rt" delete --force "$id" >/dev/null 2>&1 || true; done
	done
	# Field 5 of mountinfo is the mount point (octal escapes aside, which
	# these paths have none of); deepest first.
	for m in $(awk -v a="$data/" -v b="$run" 'index($5, a) == 1 || index($5, b "/") == 1 || $5 == b {print $5}' /proc/self/mountinfo | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m" || true
	done
	while read -r dev file; do
		[[ $file == "$data/"* ]] && losetup -d "$dev" 2>/dev/null || true
	done < <(losetup -n -O NAME,BACK-FILE 2>/dev/null)
	ip link del "$br" 2>/dev/null || true
	nft delete table ip "$br" 2>/dev/null || true
	nft delete table bridge "$br" 2>/dev/null || true
	rm -rf "$run" "/dev/shm/shard-$(printf %s "$data" | sha256sum | cut -c1-8)"
}

# stop_pid FILE MARK: end the process whose pid FILE holds, if it runs and
# its command line holds MARK (a stale file's pid may be another's now),
# and wait for it.
stop_pid() {
	local pid
	[[ -f $1 ]] || return 0
	pid=$(<"$1")
	if [[ $pid =~ ^[0-9]+$ ]] && { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qF -- "$2"; then
		kill "$pid"
		while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
	fi
	rm -f "$1"
}
