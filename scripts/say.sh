# Sourced by the demo scripts: say prints a command as it is shown, run
# shows and runs one. shq prints its arguments as a shell reads them back
# (as shard's own shellquote.Join): a plain word as it is, any other in
# single quotes; so a command shown can be pasted.
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
shq() {
	local a out=() IFS=' '
	for a; do
		if [[ $a =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
			out+=("$a")
		else
			out+=("'${a//\'/\'\\\'\'}'")
		fi
	done
	printf '%s' "${out[*]}"
}
run() { say "$(shq "$@")"; "$@"; }
