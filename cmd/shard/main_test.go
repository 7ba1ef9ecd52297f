package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
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

// TestPrintError: the CLI's own multi-line errors print as lines (cobra's
// suggestions were "\\n\\nDid you mean this?\\n\\tui"), while the
// server's text stays escaped whole.
func TestPrintError(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"cobra's", errors.New("unknown command \"run\" for \"shard\"\n\nDid you mean this?\n\tui\n"),
			"shard: unknown command \"run\" for \"shard\"\n\nDid you mean this?\n\tui\n"},
		{"own, with an escape", errors.New("bad name \"\x1b[2J\""), `shard: bad name "\x1b[2J"` + "\n"},
		{"server's", fmt.Errorf("create: %w", &client.Error{Status: 400, Code: "invalid_argument", Message: "no\nshard: forged\x1b[2J"}),
			`shard: create: no\nshard: forged\x1b[2J` + "\n"},
		{"server's fault", &client.Error{Status: 500, Code: "internal", Message: "boom", RequestID: "r1"},
			"shard: boom\nshard: (request id r1 in the server's log)\n"},
	} {
		var b strings.Builder
		printError(&b, tc.err)
		if b.String() != tc.want {
			t.Errorf("%s: printed %q, want %q", tc.name, b.String(), tc.want)
		}
	}
}
