package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

func newStopCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "stop SANDBOX...",
		Short: "Stop sandboxes: their processes end, their files stay",
		Args:  minArgs(1, "one or more SANDBOX (id or name)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range args {
				if _, err := c.Stop(cmd.Context(), id); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Println(id)
			}
			return errors.Join(errs...)
		},
	}
}
