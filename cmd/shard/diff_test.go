package main

import (
	"testing"

	"github.com/useshards/shard/client"
)

// TestDiffOutput: the paths, the counts (--stat) and the patches (--patch),
// --stat --patch printing the counts, a blank line and the patches, as git
// does.
func TestDiffOutput(t *testing.T) {
	patch := "--- a/app/my file\t\n+++ b/app/my file\t\n@@ -1 +1 @@\n-1\n+2\n"
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
