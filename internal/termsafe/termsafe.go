// Package termsafe makes text that a sandbox, an image or an API key
// controls safe to print on a terminal: an ESC sequence in a checkpoint's
// tag must not recolour the terminal, nor a newline in an environment value
// forge a row of a table, nor U+202E turn a line around.
//
// The CLI prints every human-readable line with Printf, Fprintf, Println
// and Fprintln, whose format strings are its own and whose arguments are
// escaped. JSON output and the output of `shard exec` are not text about
// objects and are not escaped.
package termsafe

import (
	"fmt"
	"io"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"
)

// unsafe reports whether a terminal may act on r rather than show it: C0
// and C1 controls and DEL (unicode.IsControl), bidirectional formatting
// (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C) and the line and
// paragraph separators.
func unsafe(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || r == '\u2028' || r == '\u2029'
}

// Escape returns s with every rune a terminal may act on written as a Go
// escape: \n, \r, \t, \xNN below U+0080 (\x1b for ESC, \x7f for DEL),
// \uNNNN above; a byte that is not UTF-8 (a lone 0x9b is CSI to some
// terminals) as \xNN. Everything else, ordinary UTF-8 and backslashes
// included, is left alone, and s is returned as it is when nothing needs
// escaping.
func Escape(s string) string {
	i := strings.IndexFunc(s, func(r rune) bool { return r == utf8.RuneError || unsafe(r) })
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case unsafe(r) && r < utf8.RuneSelf:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafe(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// EscapeLines is Escape for text of several lines that the caller wrote
// (cobra's "unknown command ... Did you mean this?\n\tui"): each line is
// escaped, the line breaks between them and the tabs that indent a line are
// kept. Text a server or a sandbox controls takes Escape, whole: a newline
// of its own could forge a line.
func EscapeLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		body := strings.TrimLeft(l, "\t")
		lines[i] = l[:len(l)-len(body)] + Escape(body)
	}
	return strings.Join(lines, "\n")
}

// escaped formats its value as fmt would with the same verb and flags, then
// escapes the result.
type escaped struct{ v any }

func (e escaped) Format(f fmt.State, verb rune) {
	io.WriteString(f, Escape(fmt.Sprintf(fmt.FormatString(f, verb), e.v)))
}

// Args wraps each argument so that fmt escapes what it prints of it.
func Args(a []any) []any {
	out := make([]any, len(a))
	for i, v := range a {
		out[i] = escaped{v}
	}
	return out
}

// Fprintf is fmt.Fprintf with every argument escaped; the format is the
// caller's own text and is printed as it is.
func Fprintf(w io.Writer, format string, a ...any) (int, error) {
	return fmt.Fprintf(w, format, Args(a)...)
}

// Fprintln is fmt.Fprintln with every argument escaped.
func Fprintln(w io.Writer, a ...any) (int, error) { return fmt.Fprintln(w, Args(a)...) }

// Printf is Fprintf to standard output.
func Printf(format string, a ...any) (int, error) { return Fprintf(os.Stdout, format, a...) }

// Println is Fprintln to standard output.
func Println(a ...any) (int, error) { return Fprintln(os.Stdout, a...) }
