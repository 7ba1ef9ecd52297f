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
is the database, the agent binaries, the empty filesystem templates and logs
(the store's own image is shown below the table, as the store).

Below the table, the sandbox store: an image on the host that starts at
'shard serve --storage-size' (4GiB) and grows online when a sandbox does not
fit, by its own size (1GiB at most) or by what is missing, up to
--storage-max; it never shrinks.
Every sandbox's whole --disk is reserved in it, so one sandbox filling its
disk never takes space a neighbour was promised. Then the host: the data
directory's filesystem, and the --reserve the server leaves free of it for
the rest of the machine (the store's growth, image pulls and checkpoints'
memory images stop short of it). A create, fork, snapshot or checkpoint
that fits neither in the store nor in what it can grow by is refused (507
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
			termsafe.Printf("\n")
			for _, l := range dfStore(du) {
				termsafe.Printf("%s\n", l)
			}
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

// dfStore is df's lines on the store and the host.
func dfStore(du *client.DiskUsage) []string {
	st, h := du.Store, du.Host
	grows := ""
	switch {
	case st.SizeBytes == 0:
	case st.MaxBytes > st.SizeBytes:
		grows = fmt.Sprintf("; the image is %s and may grow to %s", humanSize(st.SizeBytes), humanSize(st.MaxBytes))
	default:
		grows = fmt.Sprintf("; the image is %s and may not grow now", humanSize(st.SizeBytes))
	}
	return []string{
		fmt.Sprintf("sandbox store: %s promised to sandboxes' disks and saved copies, %s free of %s%s", humanSize(st.PromisedBytes), humanSize(st.FreeBytes), humanSize(st.CapacityBytes), grows),
		fmt.Sprintf("host disk: %s free of %s; the server keeps %s of it free (shard serve --reserve)", humanSize(h.FreeBytes), humanSize(h.TotalBytes), humanSize(h.ReserveBytes)),
	}
}
