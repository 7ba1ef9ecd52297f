// Package shellquote writes an argv as a POSIX shell command line, for
// messages and listings that people copy into a shell.
package shellquote

import (
	"regexp"
	"strings"
)

var safe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// Join joins argv into a command line a POSIX shell reads back as the same
// argv: a word with anything but letters, digits and _@%+=:,./- in it (or
// an empty one) goes in single quotes.
func Join(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if safe.MatchString(a) {
			out[i] = a
		} else {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(out, " ")
}
