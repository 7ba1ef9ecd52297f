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
something that still exists came from it; --all shows every removed one.
Otherwise a removed sandbox is named on the line of what it came from, as
"(removed since: fork try-2)": a kept checkpoint whose forks or restores
were all removed says what it was for. A fork's time is when it ran, after
its checkpoint's.`,
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
	termsafe.Printf("%s", lead)
	p.write(line, n.Removed)
	if gone := removedSince(n.RemovedSandboxes); gone != "" {
		p.write("  "+gone, true)
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

// write prints s, greyed on a terminal if dim.
func (p treePrinter) write(s string, dim bool) {
	dim = dim && p.color
	if dim {
		os.Stdout.WriteString("\x1b[2m") // our own escape: not escaped
	}
	termsafe.Printf("%s", s)
	if dim {
		os.Stdout.WriteString("\x1b[0m")
	}
}

// maxRemovedNamed bounds the removed sandboxes a line names.
const maxRemovedNamed = 3

// removedSince names the removed sandboxes that came from a node and that
// the tree leaves out ("" if none): why a checkpoint with nothing below it
// is there.
func removedSince(gone []client.TreeNode) string {
	if len(gone) == 0 {
		return ""
	}
	var names []string
	for _, g := range gone[:min(len(gone), maxRemovedNamed)] {
		names = append(names, strings.TrimSpace(g.Via+" "+g.Name))
	}
	s := "(removed since: " + strings.Join(names, ", ")
	if more := len(gone) - maxRemovedNamed; more > 0 {
		s += fmt.Sprintf(", and %d more; --all shows them", more)
	}
	return s + ")"
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
