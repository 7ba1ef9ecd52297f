package termsafe

import (
	"bytes"
	"errors"
	"testing"
	"text/tabwriter"
)

func TestEscape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain tag v1.2_x-y", "plain tag v1.2_x-y"},
		{"héllo wörld 日本語 🙂", "héllo wörld 日本語 🙂"},
		{`C:\path\n stays`, `C:\path\n stays`},
		{"\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"a\nb", `a\nb`},
		{"a\r\nb\tc", `a\r\nb\tc`},
		{"nul\x00bel\x07", `nul\x00bel\x07`},
		{"del\x7f", `del\x7f`},
		{"c1 csi \u009b31m", `c1 csi \u009b31m`},
		{"nel \u0085", `nel \u0085`},
		{"raw byte \x9b31m", `raw byte \x9b31m`},
		{"bad utf8 \xff\xfe", `bad utf8 \xff\xfe`},
		{"evil\u202etxt.exe", `evil\u202etxt.exe`},
		{"\u2066isolate\u2069 \u200e\u200f\u061c", `\u2066isolate\u2069 \u200e\u200f\u061c`},
		{"line\u2028sep\u2029", `line\u2028sep\u2029`},
		{"real U+FFFD \ufffd stays", "real U+FFFD \ufffd stays"},
		{"osc \x1b]0;title\x07", `osc \x1b]0;title\x07`},
	} {
		if got := Escape(tc.in); got != tc.want {
			t.Errorf("Escape(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

type stringer string

func (s stringer) String() string { return string(s) }

func TestFprintf(t *testing.T) {
	for _, tc := range []struct {
		name   string
		format string
		args   []any
		want   string
	}{
		{"format is the caller's", "%s\t%s\n", []any{"a", "b"}, "a\tb\n"},
		{"string arg", "tag: %s\n", []any{"x\ny"}, "tag: x\\ny\n"},
		{"error arg", "shard: %v\n", []any{errors.New("bad \x1b[2J")}, "shard: bad \\x1b[2J\n"},
		{"stringer arg", "%s|", []any{stringer("\u202e")}, `\u202e|`},
		{"slice arg", "%v", []any{[]string{"a\tb", "c"}}, `[a\tb c]`},
		{"numbers keep their verbs", "%d %5.1f %x %q", []any{42, 3.14159, 255, "q"}, `42   3.1 ff "q"`},
		{"width pads the value", "[%-4s]", []any{"ab"}, "[ab  ]"},
		{"nil", "%v", []any{nil}, "<nil>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			Fprintf(&b, tc.format, tc.args...)
			if b.String() != tc.want {
				t.Errorf("got %q, want %q", b.String(), tc.want)
			}
		})
	}
}

func TestFprintln(t *testing.T) {
	var b bytes.Buffer
	Fprintln(&b, "id", "tag\x1b[31m", 3)
	if want := "id tag\\x1b[31m 3\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}

// A value holding a newline and a tab cannot add a row or a column to a
// table.
func TestTableRowNotForged(t *testing.T) {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	Fprintf(tw, "ID\tTAG\n") // a header is the format itself: Fprintln would escape its tab
	Fprintf(tw, "%s\t%s\n", "aaa", "x\nbbb\tforged")
	tw.Flush()
	want := "ID   TAG\naaa  x\\nbbb\\tforged\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestEscapeLines(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"unknown command \"run\" for \"shard\"\n\nDid you mean this?\n\tui\n",
			"unknown command \"run\" for \"shard\"\n\nDid you mean this?\n\tui\n"},
		{"a\tb\r\n\t\x1b[31mred", `a\tb\r` + "\n\t" + `\x1b[31mred`},
		{"\u202eevil\n", `\u202eevil` + "\n"},
	} {
		if got := EscapeLines(tc.in); got != tc.want {
			t.Errorf("EscapeLines(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
