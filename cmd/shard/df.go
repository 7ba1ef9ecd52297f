package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
)

func newDfCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "df",
		Short: "Show the disk space images, sandboxes, snapshots, checkpoints and environments use",
		Long: `Show how much of the server's disk each kind of thing uses. An environment's
checkpoint counts under environments, not again under checkpoints; "server"
is the database, the agent binaries, the empty filesystem templates and logs.

The last line is the sandbox store (--storage-size of shard serve): every
sandbox's whole --disk is reserved in it, so one sandbox filling its disk
never takes space a neighbour was promised. A create, fork, snapshot or
checkpoint that does not fit in what is free is refused (507
insufficient_storage).`,
		Example: `  shard df
  shard df --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			du, err := c.DiskUsage(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(du)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			termsafe.Fprintf(tw, "TYPE\tCOUNT\tSIZE\n")
			for _, r := range dfRows(du) {
				termsafe.Fprintf(tw, "%s\t%s\t%s\n", r[0], r[1], r[2])
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			st := du.Store
			termsafe.Printf("\nsandbox store: %s free of %s (%s promised to sandboxes' disks and saved copies)\n",
				humanSize(st.FreeBytes), humanSize(st.CapacityBytes), humanSize(st.PromisedBytes))
			return nil
		},
	}
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON")
	return cmd
}

// dfRows is df's table: one row per kind, then the total.
func dfRows(du *client.DiskUsage) [][3]string {
	var rows [][3]string
	for _, it := range []struct {
		name string
		item client.DiskUsageItem
	}{
		{"images", du.Images}, {"sandboxes", du.Sandboxes}, {"snapshots", du.Snapshots},
		{"checkpoints", du.Checkpoints}, {"environments", du.Environments}, {"server", du.Server},
	} {
		rows = append(rows, [3]string{it.name, fmt.Sprint(it.item.Count), humanSize(it.item.Bytes)})
	}
	return append(rows, [3]string{"total", "-", humanSize(du.TotalBytes)})
}
