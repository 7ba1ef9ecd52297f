package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// groupsWithArgs are the command groups that act on an argument of their
// own (shard checkpoint SANDBOX, shard ledger SESSION) besides holding
// subcommands: "bogus" is that argument to them.
var groupsWithArgs = map[string]bool{"checkpoint": true, "ledger": true}

// TestGroupsRefuseUnknownSubcommands walks the whole command tree: every
// group errs on a subcommand it does not have, as the root does, instead of
// printing its help and succeeding; with no arguments it still prints its
// help.
func TestGroupsRefuseUnknownSubcommands(t *testing.T) {
	var groups [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		for _, sub := range c.Commands() {
			p := append(append([]string(nil), path...), sub.Name())
			if sub.HasSubCommands() && !groupsWithArgs[strings.Join(p, " ")] {
				groups = append(groups, p)
			}
			walk(sub, p)
		}
	}
	walk(newRoot(), nil)
	if len(groups) < 8 {
		t.Fatalf("found only %d command groups: %v", len(groups), groups)
	}
	// A socket that is not there: nothing may reach a real server.
	sock := []string{"--socket", t.TempDir() + "/none.sock"}
	for _, g := range groups {
		name := strings.Join(g, " ")
		root := newRoot()
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		root.SetArgs(append(append(sock, g...), "bogus"))
		want := `unknown command "bogus" for "shard ` + name + `"`
		if err := root.Execute(); err == nil || err.Error() != want {
			t.Errorf("shard %s bogus: error %v, want %q", name, err, want)
		}

		root = newRoot()
		var out strings.Builder
		root.SetOut(&out)
		root.SetArgs(append(sock, g...))
		if err := root.Execute(); err != nil || !strings.Contains(out.String(), "Available Commands:") {
			t.Errorf("shard %s: error %v, printed %q; want its help", name, err, out.String())
		}
	}
}

func TestUnknownSubcommandSuggests(t *testing.T) {
	root := newRoot()
	root.SetArgs([]string{"snapshot", "lss"})
	err := root.Execute()
	want := "unknown command \"lss\" for \"shard snapshot\"\n\nDid you mean this?\n\tls\n"
	if err == nil || err.Error() != want {
		t.Fatalf("shard snapshot lss: error %q, want %q", err, want)
	}
}
