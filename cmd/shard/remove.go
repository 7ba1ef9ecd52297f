package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

func newRemoveCmd(a *app) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:     "remove [--force] SANDBOX...",
		Aliases: []string{"rm"},
		Short:   "Remove sandboxes and their files (--force for running ones)",
		Args:    minArgs(1, "one or more SANDBOX (id or name)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range args {
				if err := c.Remove(cmd.Context(), id, force); err != nil {
					errs = append(errs, err)
					continue
				}
				if a.json {
					printJSON(map[string]string{"removed": id})
					continue
				}
				fmt.Println(id)
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "remove a running sandbox too")
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON")
	return cmd
}
