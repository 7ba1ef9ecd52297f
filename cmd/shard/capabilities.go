package main

import (
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/internal/termsafe"
)

func newCapabilitiesCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "capabilities",
		Short: "Show which providers this server has, and what each can do here",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			caps, err := c.Capabilities(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(caps)
			}
			yn := func(b bool) string {
				if b {
					return "yes"
				}
				return "no"
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			termsafe.Fprintf(tw, "PROVIDER\tAVAILABLE\tFORK\tSNAPSHOT\tCHECKPOINT\tISOLATION\tNOTE\n")
			for _, p := range caps {
				name := p.Name
				if p.Default {
					name += " (default)"
				}
				note := p.Reason
				if note == "" {
					note = p.Version
				}
				termsafe.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, yn(p.Available), yn(p.Fork), yn(p.Snapshot), yn(p.Checkpoint), p.Isolation, note)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, p := range caps {
				if p.Available && p.ForkMemory != "" {
					termsafe.Fprintf(os.Stdout, "\n%s: fork memory by %s\n", p.Name, p.ForkMemory)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON")
	return cmd
}
