package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

func newStartCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "start SANDBOX...",
		Short: "Start stopped sandboxes again, with their files",
		Args:  minArgs(1, "one or more SANDBOX (id or name)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range args {
				if _, err := c.Start(cmd.Context(), id); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Println(id)
			}
			return errors.Join(errs...)
		},
	}
}
