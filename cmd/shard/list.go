package main

import (
	"cmp"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
	"github.com/useshards/shard/internal/units"
)

func newListCmd(a *app) *cobra.Command {
	var quiet, allProjects bool
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ps"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return listSandboxes(cmd, a, quiet, allProjects)
		},
	}
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print ids only")
	cmd.Flags().BoolVar(&allProjects, "all-projects", false, "list every project's sandboxes (a key of every project, or the socket)")
	return cmd
}

// listSandboxes is `shard list` (and `shard ls` without arguments).
func listSandboxes(cmd *cobra.Command, a *app, quiet, allProjects bool) error {
	c, err := a.client()
	if err != nil {
		return err
	}
	list := c.List
	if allProjects {
		list = c.ListAllProjects
	}
	all, err := list(cmd.Context())
	if err != nil {
		return err
	}
	if a.json {
		return printJSON(all)
	}
	if len(all) == 0 && !allProjects {
		a.warnEmptyProject(cmd.Context(), c)
	}
	if quiet {
		for _, sb := range all {
			termsafe.Println(sb.ID)
		}
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	// A cluster's sandboxes say their node; a single host's have none.
	clustered := slices.ContainsFunc(all, func(sb client.Sandbox) bool { return sb.Node != "" })
	if allProjects {
		termsafe.Fprintf(tw, "PROJECT\t")
	}
	if clustered {
		termsafe.Fprintf(tw, "NODE\t")
	}
	termsafe.Fprintf(tw, "ID\tNAME\tSTATE\tPROVIDER\tIMAGE\tMEMORY\tCPU\tIP\tCREATED\n")
	for _, sb := range all {
		ip := sb.IP
		if ip == "" {
			ip = "-"
		}
		if allProjects {
			termsafe.Fprintf(tw, "%s\t", sb.Project)
		}
		if clustered {
			termsafe.Fprintf(tw, "%s\t", sb.Node)
		}
		termsafe.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%g\t%s\t%s\n", sb.ID, sb.Name, sb.State, sb.Provider, sb.Image,
			units.FormatSize(sb.MemoryBytes), sb.CPU, ip, ago(sb.CreatedAt))
	}
	return tw.Flush()
}

func newInspectCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect SANDBOX",
		Short: "Show everything about a sandbox (id or name)",
		Args:  exactArgs(1, "a SANDBOX (id or name)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(sb)
			}
			// A sandbox from an older server says only its parent's id:
			// whether that still leads anywhere is asked.
			parentRemoved := false
			if sb.Origin == nil && sb.ParentID != "" {
				var ce *client.Error
				_, err := c.Get(cmd.Context(), sb.ParentID)
				parentRemoved = errors.As(err, &ce) && ce.Code == client.CodeSandboxNotFound
			}
			return writeSandbox(os.Stdout, sb, parentRemoved)
		},
	}
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON")
	return cmd
}

// writeSandbox is inspect's human output: one "Key:  value" row each, and
// a list (Env, Grants, Policy) as rows whose key is named on the first only.
func writeSandbox(w io.Writer, sb *client.Sandbox, parentRemoved bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { termsafe.Fprintf(tw, "%s:\t%v\n", k, v) }
	// rows prints a list under one key: the key and its colon on the first
	// line, the rest in the value column under it.
	rows := func(k string, vs []string) {
		for i, v := range vs {
			if i == 0 {
				row(k, v)
				continue
			}
			termsafe.Fprintf(tw, "\t%s\n", v)
		}
	}
	row("ID", sb.ID)
	row("Name", sb.Name)
	row("Project", sb.Project)
	row("State", sb.State)
	row("Provider", sb.Provider)
	row("Image", sb.Image+" ("+sb.ImageDigest+")")
	row("Memory", units.FormatSize(sb.MemoryBytes))
	row("CPU", sb.CPU)
	row("Disk", units.FormatSize(sb.DiskBytes))
	row("Pids", sb.Pids)
	if sb.IP != "" {
		row("IP", sb.IP)
	}
	row("OOM kills", sb.OOMKills)
	row("Session", sb.Session)
	switch {
	case sb.Origin != nil:
		row("Origin", originText(sb.Origin))
	case sb.ParentID != "" && parentRemoved:
		row("Parent", sb.ParentID+" (removed)")
	case sb.ParentID != "":
		row("Parent", sb.ParentID)
	}
	row("Created", sb.CreatedAt.Local().Format("2006-01-02 15:04:05"))
	if !sb.StartedAt.IsZero() {
		row("Started", sb.StartedAt.Local().Format("2006-01-02 15:04:05"))
	}
	if !sb.StoppedAt.IsZero() {
		row("Stopped", sb.StoppedAt.Local().Format("2006-01-02 15:04:05"))
	}
	if sb.Error != "" {
		row("Error", sb.Error)
	}
	rows("Env", sb.Env)
	grants := make([]string, len(sb.Grants))
	for i, g := range sb.Grants {
		grants[i] = grantLine(g)
	}
	rows("Grants", grants)
	if sb.Policy != nil {
		var b strings.Builder
		writePolicy(&b, *sb.Policy)
		rows("Policy", strings.Split(strings.TrimSpace(b.String()), "\n"))
	}
	return tw.Flush()
}

// grantLine says what a grant gives, for inspect: "API_KEY as $API_KEY",
// "tls.key as the file /etc/app/tls.key".
func grantLine(g client.Grant) string {
	if g.File != "" {
		return g.Secret + " as the file " + g.File
	}
	env := g.Env
	if env == "" {
		env = g.Secret
	}
	return g.Secret + " as $" + env
}

// originText says what a sandbox was made from, by the names the server
// recorded then: "environment py-deps", "fork of base (checkpoint ...)".
func originText(o *client.Origin) string {
	ck := ""
	if o.Checkpoint != "" {
		ck = " (checkpoint " + o.Checkpoint + ")"
	}
	switch o.Kind {
	case "fork":
		return "fork of " + cmp.Or(o.Name, o.ID) + ck
	case "checkpoint":
		if o.Name != "" {
			return "checkpoint " + o.Name + " (" + o.ID + ")"
		}
		return "checkpoint " + o.ID
	case "session":
		return "resume of session " + o.Name + ck
	case "environment":
		return "environment " + o.Name
	}
	return strings.TrimSpace(o.Kind + " " + cmp.Or(o.Name, o.ID))
}
