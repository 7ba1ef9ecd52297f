package main

import (
	"bytes"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
	"golang.org/x/term"
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
  type, target), one per line; ? for a file whose content was not
  compared (a diff reads at most 1 GiB of files' data; holes are not
  read), which may be the same; a diff stops at 20000 changes or 1048576
  directory entries read, and does not reach a path longer than the
  server looks up (about 4000 bytes): it says so on stderr;
  --stat  the counts and bytes instead of the paths;
  --patch unified diffs of the text files (after the paths, or after
          the counts and a blank line with --stat, as git prints them),
          which GNU patch -p1 and git apply apply: the files' bytes as
          they are, escaped only on a terminal.

With no differences nothing is printed on stdout, as diff and git diff
do, and a line on stderr says so; the exit status is 0 either way.

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
			// A patch is the files' bytes, for patch and git apply: escaped
			// only where a terminal would act on them.
			escape := term.IsTerminal(int(os.Stdout.Fd()))
			defer printDiffNotes(d)
			if len(d.Changes) == 0 && !d.Truncated {
				// stdout stays empty, as diff's and git diff's (--stat
				// too): a script that saves or applies it, or tests it
				// for emptiness, still can.
				termsafe.Fprintf(os.Stderr, "(no differences: %s → %s)\n", d.From.Kind+" "+sideName(d.From.Name, d.From.ID), sideName(d.To.Name, d.To.ID))
				return nil
			}
			if stat {
				printDiffStat(d)
				if patch {
					// As git diff --stat --patch: the counts, a blank line, the patches.
					os.Stdout.WriteString("\n")
					printPatches(os.Stdout, d, escape)
				}
				return nil
			}
			var list bytes.Buffer
			tw := tabwriter.NewWriter(&list, 0, 4, 1, ' ', 0)
			ends := make([]int, len(d.Changes)) // where a line without a note ends (0: it has one)
			for i, ch := range d.Changes {
				sign := map[string]string{"added": "+", "removed": "-", "changed": "M"}[ch.Kind]
				what := slices.Clip(ch.What) // appended to: not into the answer's array
				if len(ch.NotCompared) > 0 {
					if len(what) == 0 {
						sign = "?"
					}
					what = append(what, strings.Join(ch.NotCompared, ", ")+" not compared")
				}
				note := ""
				if len(what) > 0 {
					note = "(" + strings.Join(what, ", ") + ")"
				} else {
					ends[i] = len(sign) + 1 + len(termsafe.Escape(changePath(ch)))
				}
				termsafe.Fprintf(tw, "%s\t%s\t%s\n", sign, changePath(ch), note)
			}
			tw.Flush()
			// A line without a note ends at its path (which may end in a
			// space of its own), not in the spaces that align the notes.
			i := 0
			for line := range strings.Lines(list.String()) {
				if i < len(ends) && ends[i] > 0 && ends[i] < len(line) {
					line = line[:ends[i]] + "\n"
				}
				os.Stdout.WriteString(line)
				i++
			}
			if patch {
				printPatches(os.Stdout, d, escape)
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

// printDiffNotes says on stderr what d leaves out.
func printDiffNotes(d *client.Diff) {
	if d.Truncated {
		termsafe.Fprintln(os.Stderr, "(the list is not complete: a diff stops at 20000 changes or 1048576 directory entries read, and leaves out a path longer than the server looks up)")
	}
	if d.NotCompared > 0 {
		termsafe.Fprintf(os.Stderr, "(%d files' contents not compared: the diff reached its bound of files' data read)\n", d.NotCompared)
	}
}

// changePath is ch's path: its bytes when they are not UTF-8, which the
// terminal sees escaped.
func changePath(ch client.Change) string {
	if len(ch.PathBytes) > 0 {
		return string(ch.PathBytes)
	}
	return ch.Path
}

func printPatches(w io.Writer, d *client.Diff, escape bool) {
	for _, ch := range d.Changes {
		printPatch(w, ch.Patch, escape)
	}
}

func sideName(name, id string) string {
	if name != "" {
		return name
	}
	return id
}

// printPatch prints a unified diff, which is file content: as it is, but
// with escape (a terminal) a line with a rune a terminal would act on
// (tabs aside) is escaped. Saved or piped, the patch must give the files'
// bytes back: a CRLF file's \r is its own.
func printPatch(w io.Writer, p string, escape bool) {
	if !escape {
		io.WriteString(w, p)
		return
	}
	for _, line := range strings.SplitAfter(p, "\n") {
		body := strings.TrimSuffix(line, "\n")
		if termsafe.Escape(strings.ReplaceAll(body, "\t", " ")) != strings.ReplaceAll(body, "\t", " ") {
			body = termsafe.Escape(body)
		}
		io.WriteString(w, body)
		if strings.HasSuffix(line, "\n") {
			io.WriteString(w, "\n")
		}
	}
}
