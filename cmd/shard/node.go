package main

import (
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/useshards/shard/internal/termsafe"
	"github.com/useshards/shard/internal/units"
)

func newNodeCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "The nodes of a cluster (shard serve --cluster-etcd)",
		Long: `A cluster is several shard serve nodes that act as one server, their
shared state in etcd: any node answers any call, sending a call about a
sandbox on to the node that runs it. A node whose etcd lease expires is
unreachable: its sandboxes are listed as unreachable (not removed), and
calls for them get 503 node_unreachable until it is back.`,
		Args: cobra.NoArgs,
	}
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the nodes: name, address, state, sandboxes, free memory",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			nodes, err := c.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(nodes)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			termsafe.Fprintf(tw, "NAME\tADDRESS\tSTATE\tSANDBOXES\tFREE MEMORY\tLOAD\tPROVIDERS\n")
			for _, n := range nodes {
				name := n.Name
				if n.Self {
					name += " *"
				}
				free, load := "-", "-"
				if n.State == "up" {
					free = units.FormatSize(n.MemoryFree) + " of " + units.FormatSize(n.MemoryBytes)
					load = strconv.FormatFloat(n.Load, 'f', 2, 64)
				}
				termsafe.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", name, n.Address, n.State, n.Sandboxes, free, load, joinOrDash(n.Providers))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&a.json, "json", false, "print JSON")
	cmd.AddCommand(ls)
	return cmd
}

func joinOrDash(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}
