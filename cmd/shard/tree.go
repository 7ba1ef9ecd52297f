package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
	"golang.org/x/term"
)

func newTreeCmd(a *app) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "tree [SANDBOX]",
		Short: "Show the fork tree: which sandbox came from which, at which checkpoint, when",
		Long: `Show the lineage of sandboxes, checkpoints, snapshots and environments, from
the ledger: which fork came from which source at which checkpoint, and when;
which sandboxes a checkpoint was restored into, an environment made, a
snapshot started. With SANDBOX, the tree it is in; without, every tree of
the project.

What was removed is shown (greyed on a terminal, and marked "removed") where
something that still exists came from it; --all shows every removed one.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb := ""
			if len(args) == 1 {
				sb = args[0]
			}
			roots, err := c.Tree(cmd.Context(), sb, all)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(roots)
			}
			if len(roots) == 0 {
				termsafe.Fprintln(os.Stderr, "no sandboxes")
				return nil
			}
			p := treePrinter{color: term.IsTerminal(int(os.Stdout.Fd())), mark: sb}
			for _, r := range roots {
				p.print(r, "", "")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "show every removed sandbox, checkpoint and snapshot")
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON")
	return cmd
}

type treePrinter struct {
	color bool
	mark  string // the sandbox asked for: marked with *
}

// print writes n's line (after lead) and its children's (after indent).
func (p treePrinter) print(n client.TreeNode, lead, indent string) {
	line := p.label(n)
	if n.Removed {
		line += "  (removed)"
	}
	dim := n.Removed && p.color
	termsafe.Printf("%s", lead)
	if dim {
		os.Stdout.WriteString("\x1b[2m") // our own escape: not escaped
	}
	termsafe.Printf("%s", line)
	if dim {
		os.Stdout.WriteString("\x1b[0m")
	}
	os.Stdout.WriteString("\n")
	for i, ch := range n.Children {
		if i == len(n.Children)-1 {
			p.print(ch, indent+"└─ ", indent+"   ")
		} else {
			p.print(ch, indent+"├─ ", indent+"│  ")
		}
	}
}

func (p treePrinter) label(n client.TreeNode) string {
	at := n.At.Local().Format("2006-01-02 15:04:05")
	if n.At.IsZero() {
		at = "-"
	}
	switch n.Kind {
	case "sandbox":
		mark := ""
		if p.mark != "" && (p.mark == n.ID || p.mark == n.Name) {
			mark = " *"
		}
		state := n.State
		if n.Removed {
			state = ""
		}
		return strings.TrimSpace(fmt.Sprintf("%s (%s)%s  %s  %s  %s", n.Name, n.ID, mark, state, n.Image, at))
	case "checkpoint":
		kind := "checkpoint"
		if n.Via != "" && n.Via != "checkpoint" {
			kind = n.Via + " checkpoint"
		}
		tag := ""
		if n.Name != "" {
			tag = " " + n.Name
		}
		return fmt.Sprintf("%s %s%s  %s", kind, n.ID, tag, at)
	case "snapshot":
		return fmt.Sprintf("snapshot %s (%s)  %s", n.Name, n.ID, at)
	case "environment":
		return fmt.Sprintf("environment %s  %s", n.Name, at)
	}
	return n.Kind + " " + n.ID
}
