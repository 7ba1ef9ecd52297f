package main

import (
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// TestDiffOutput: the paths, the counts (--stat) and the patches (--patch),
// --stat --patch printing the counts, a blank line and the patches, as git
// does; a patch saved or piped is the files' bytes (a CRLF line's \r, a
// form feed, an ESC), for patch -p1 and git apply.
func TestDiffOutput(t *testing.T) {
	patch := "--- a/app/my file\t\n+++ b/app/my file\t\n@@ -1,2 +1,2 @@\n-1\r\n+2\r\n c\f\x1b[31m\r\n"
	sock := fakeServer(t, map[string]any{
		"/v0/sandboxes/b/diff": client.Diff{
			From: client.DiffSide{Kind: "sandbox", ID: "a1", Name: "a"}, To: client.DiffSide{Kind: "sandbox", ID: "b1", Name: "b"},
			Changes: []client.Change{{Path: "/app/my file", Kind: "changed", Type: "file", What: []string{"content"}, SizeA: 2, SizeB: 2, Patch: patch}},
			Changed: 1,
		},
	})
	stat := "0 added, 0 removed, 1 changed (sandbox a → b: 0B of files' bytes more, 0B less)\n"
	list := "M /app/my file (content)\n"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"diff", "a", "b"}, list},
		{[]string{"diff", "--patch", "a", "b"}, list + patch},
		{[]string{"diff", "--stat", "a", "b"}, stat},
		{[]string{"diff", "--stat", "--patch", "a", "b"}, stat + "\n" + patch},
	} {
		if got := runCLI(t, append([]string{"--socket", sock}, tc.args...)...); got != tc.want {
			t.Errorf("shard %v:\n%q\nwant\n%q", tc.args, got, tc.want)
		}
	}
}

// TestPrintPatchOnATerminal: on a terminal a patch's line with a rune
// the terminal would act on is escaped.
func TestPrintPatchOnATerminal(t *testing.T) {
	patch := "--- a/crlf\n+++ b/crlf\n@@ -1,2 +1,2 @@\n-a\r\n+b\r\n c\f\x1b[31m\r\n \tok\n"
	var tty strings.Builder
	printPatch(&tty, patch, true)
	want := "--- a/crlf\n+++ b/crlf\n@@ -1,2 +1,2 @@\n-a\\r\n+b\\r\n c\\x0c\\x1b[31m\\r\n \tok\n"
	if tty.String() != want {
		t.Errorf("on a terminal:\n%q\nwant\n%q", tty.String(), want)
	}
}

// TestDiffNotes: no differences leave stdout empty, as diff and git diff
// do, with a line on stderr; a file not compared is marked ?, or says so
// beside what else changed, with a note on stderr; a name that is not
// UTF-8 is shown by its bytes, escaped.
func TestDiffNotes(t *testing.T) {
	sides := func(d client.Diff) client.Diff {
		d.From, d.To = client.DiffSide{Kind: "sandbox", ID: "a1", Name: "a"}, client.DiffSide{Kind: "sandbox", ID: "b1", Name: "b"}
		return d
	}
	sock := fakeServer(t, map[string]any{
		"/v0/sandboxes/same/diff": sides(client.Diff{Changes: []client.Change{}}),
		"/v0/sandboxes/big/diff": sides(client.Diff{Changes: []client.Change{
			{Path: "/big", Kind: "changed", Type: "file", NotCompared: []string{"content"}},
			{Path: "/caf\uFFFD", PathBytes: []byte("/caf\xe9"), Kind: "added", Type: "file"},
			{Path: "/mode", Kind: "changed", Type: "file", What: []string{"mode"}, NotCompared: []string{"content"}},
			{Path: "/end ", Kind: "added", Type: "file"}, // a name's own last space stays
		}, Added: 2, Changed: 2, NotCompared: 2}),
	})
	var out string
	errOut := captureStderr(t, func() { out = runCLI(t, "--socket", sock, "diff", "a", "same") })
	if out != "" || errOut != "(no differences: sandbox a → b)\n" {
		t.Errorf("no differences: stdout %q, stderr %q", out, errOut)
	}
	errOut = captureStderr(t, func() { out = runCLI(t, "--socket", sock, "diff", "--stat", "a", "same") })
	if out != "" || errOut != "(no differences: sandbox a → b)\n" {
		t.Errorf("no differences, --stat: stdout %q, stderr %q", out, errOut)
	}
	errOut = captureStderr(t, func() { out = runCLI(t, "--socket", sock, "diff", "a", "big") })
	want := "? /big     (content not compared)\n+ /caf\\xe9\nM /mode    (mode, content not compared)\n+ /end \n"
	if out != want || !strings.Contains(errOut, "2 files' contents not compared") {
		t.Errorf("not compared:\n%q\nwant\n%q\nstderr %q", out, want, errOut)
	}
	if j := runCLI(t, "--socket", sock, "diff", "--json", "a", "big"); !strings.Contains(j, `"not_compared": [`) || !strings.Contains(j, `"path_bytes": "L2NhZuk="`) {
		t.Errorf("--json: %s", j)
	}
}
