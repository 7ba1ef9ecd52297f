package main

import (
	"testing"

	"github.com/useshards/shard/client"
)

// TestTreeNamesRemovedSandboxes: a kept checkpoint whose forks were
// removed names them on its line (at most three, then how many more).
func TestTreeNamesRemovedSandboxes(t *testing.T) {
	gone := func(name, via string) client.TreeNode {
		return client.TreeNode{Kind: "sandbox", ID: name + "-id", Name: name, State: "removed", Removed: true, Via: via}
	}
	root := client.TreeNode{Kind: "sandbox", ID: "b1", Name: "base", State: "running", Image: "busybox", Children: []client.TreeNode{
		{Kind: "checkpoint", ID: "ck1", State: "kept", Via: "fork", RemovedSandboxes: []client.TreeNode{gone("try-2", "fork")}},
		{Kind: "checkpoint", ID: "ck2", Name: "mark", State: "kept", Via: "checkpoint", RemovedSandboxes: []client.TreeNode{
			gone("r1", "restore"), gone("r2", "restore"), gone("r3", "restore"), gone("r4", "restore"), gone("r5", "restore")}},
	}}
	sock := fakeServer(t, map[string]any{"/v0/sandboxes/base/tree": map[string]any{"roots": []client.TreeNode{root}}})
	want := "base (b1) *  running  busybox  -\n" +
		"├─ fork checkpoint ck1  -  (removed since: fork try-2)\n" +
		"└─ checkpoint ck2 mark  -  (removed since: restore r1, restore r2, restore r3, and 2 more; --all shows them)\n"
	if got := runCLI(t, "--socket", sock, "tree", "base"); got != want {
		t.Errorf("shard tree:\n%s\nwant:\n%s", got, want)
	}
}
