package main

import (
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
)

func newDiffCmd(a *app) *cobra.Command {
	var stat, patch bool
	cmd := &cobra.Command{
		Use:   "diff A [B]",
		Short: "Show the files added, changed and removed between two sandboxes, or since one started",
		Long: `Show what changed in the files from sandbox A to sandbox B (two sandboxes of
one image: forks of one source, say), or, with A alone, what changed in A
since it started: since the checkpoint it was forked or restored from, the
snapshot it was made from, or its image. Running or stopped; each side is
taken at one instant. Only what either sandbox changed over the image is
compared, never the whole image.

  A path  added (+), removed (-) or changed (M: content, mode, owner,
  type, target), one per line;
  --stat  the counts and bytes instead of the paths;
  --patch unified diffs of the text files (after the paths, or after
          the counts and a blank line with --stat, as git prints them),
          which GNU patch -p1 and git apply apply.

  shard diff try-a try-b      # what try-b has that try-a has not
  shard diff --patch try-a    # what try-a did since its fork`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			to, against := args[0], ""
			if len(args) == 2 {
				to, against = args[1], args[0]
			}
			d, err := c.Diff(cmd.Context(), to, against, patch)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(d)
			}
			if stat {
				printDiffStat(d)
				if patch {
					// As git diff --stat --patch: the counts, a blank line, the patches.
					os.Stdout.WriteString("\n")
					printPatches(d)
				}
				return nil
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 1, ' ', 0)
			for _, ch := range d.Changes {
				sign := map[string]string{"added": "+", "removed": "-", "changed": "M"}[ch.Kind]
				what := ""
				if len(ch.What) > 0 {
					what = "(" + strings.Join(ch.What, ", ") + ")"
				}
				termsafe.Fprintf(tw, "%s\t%s\t%s\n", sign, ch.Path, what)
			}
			tw.Flush()
			if d.Truncated {
				termsafe.Fprintf(os.Stderr, "(more changes than listed: the diff stops at %d)\n", len(d.Changes))
			}
			if patch {
				printPatches(d)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&stat, "stat", false, "print the counts instead of the paths (with --patch: then the patches)")
	cmd.Flags().BoolVarP(&patch, "patch", "p", false, "print unified diffs of changed text files")
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON")
	return cmd
}

// printDiffStat prints the counts of d and the bytes its files grew and shrank by.
func printDiffStat(d *client.Diff) {
	var grew, shrank int64
	for _, ch := range d.Changes {
		if ch.SizeB > ch.SizeA {
			grew += ch.SizeB - ch.SizeA
		} else {
			shrank += ch.SizeA - ch.SizeB
		}
	}
	termsafe.Printf("%d added, %d removed, %d changed (%s: %s of files' bytes more, %s less)\n",
		d.Added, d.Removed, d.Changed, d.From.Kind+" "+sideName(d.From.Name, d.From.ID)+" → "+sideName(d.To.Name, d.To.ID),
		humanSize(grew), humanSize(shrank))
}

func printPatches(d *client.Diff) {
	for _, ch := range d.Changes {
		printPatch(ch.Patch)
	}
}

func sideName(name, id string) string {
	if name != "" {
		return name
	}
	return id
}

// printPatch prints a unified diff: file content, printed as it is but for
// a line with a rune a terminal would act on (tabs aside), which is escaped.
func printPatch(p string) {
	for _, line := range strings.SplitAfter(p, "\n") {
		body := strings.TrimSuffix(line, "\n")
		if termsafe.Escape(strings.ReplaceAll(body, "\t", " ")) != strings.ReplaceAll(body, "\t", " ") {
			body = termsafe.Escape(body)
		}
		os.Stdout.WriteString(body)
		if strings.HasSuffix(line, "\n") {
			os.Stdout.WriteString("\n")
		}
	}
}
