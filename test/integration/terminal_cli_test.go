package integration

import (
	"strings"
	"testing"
)

// TestCLIEscapesControls: what a key or a sandbox puts in a value (an
// environment variable, a command line) reaches the terminal of whoever
// runs `shard inspect` or `shard ledger` escaped: no ESC sequence, no
// forged field or event line. A tag with one is refused; a command's own
// output is passed as it is.
func TestCLIEscapesControls(t *testing.T) {
	e := need(t)
	const esc = "\x1b]0;pwned\x07\x1b[31m"
	raw := func(s string) bool {
		return strings.ContainsFunc(s, func(r rune) bool { return r == 0x1b || r == 0x07 || r == '\u202e' })
	}
	sh := func(args ...string) string {
		t.Helper()
		out, errOut, code := e.cli(t, "", args...)
		if code != 0 {
			t.Fatalf("shard %q: exit %d: %s", args, code, errOut)
		}
		return out
	}
	sh("create", "--provider", "runc", "--name", "cli-esc", "--env", "PS1="+esc, "--env", "X=a\nForged:\tb\u202e", busybox)
	t.Cleanup(func() { e.cli(t, "", "remove", "--force", "cli-esc") })

	out := sh("inspect", "cli-esc")
	if raw(out) || strings.Contains(out, "\nForged:") {
		t.Errorf("inspect printed controls raw:\n%q", out)
	}
	for _, want := range []string{`PS1=\x1b]0;pwned\x07\x1b[31m`, `X=a\nForged:\tb\u202e`} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect lacks %q:\n%s", want, out)
		}
	}
	if out := sh("inspect", "--json", "cli-esc"); !strings.Contains(out, `\u001b]0;pwned\u0007`) {
		t.Errorf("inspect --json changed the value:\n%s", out)
	}

	// The command's own output is the command's: exact.
	if out := sh("exec", "cli-esc", "printf", "%s", esc+"\n"); out != esc+"\n" {
		t.Errorf("exec output %q, want it as printed", out)
	}
	before := strings.Count(sh("ledger", "cli-esc"), "\n")
	sh("exec", "cli-esc", "true", "\n2099-01-01 00:00:00.000  sandbox.forged", esc)
	out = sh("ledger", "cli-esc")
	if raw(out) || strings.Contains(out, "\n2099") {
		t.Errorf("ledger printed controls raw:\n%q", out)
	}
	if n := strings.Count(out, "\n"); n != before+2 {
		t.Errorf("ledger: %d lines after one exec, want %d (started, finished):\n%s", n, before+2, out)
	}

	_, errOut, code := e.cli(t, "", "checkpoint", "--tag", "v1"+esc, "cli-esc")
	if code == 0 || raw(errOut) || !strings.Contains(errOut, "tag") {
		t.Errorf("checkpoint --tag with ESC: exit %d, stderr %q; want a refusal, escaped", code, errOut)
	}
	_, errOut, code = e.cli(t, "", "inspect", "no-such-"+esc)
	if code == 0 || raw(errOut) {
		t.Errorf("inspect of a name with ESC: exit %d, stderr %q; want an error, escaped", code, errOut)
	}
}
