package main

import (
	"context"
	"errors"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
)

// eachSandbox makes a verb that acts on one or more sandboxes (stop, start,
// remove): it runs do on every argument, prints each id (or JSON of what
// do returns, with --json), and joins the errors, so one bad name does not
// stop the others.
func eachSandbox(a *app, use, short string, do func(ctx context.Context, c *client.Client, id string) (any, error)) *cobra.Command {
	return eachArg(a, use, short, "one or more SANDBOX (id or name)", do)
}

// eachArg is eachSandbox for any kind of thing (snapshot rm, checkpoint rm,
// env rm); what says which arguments it takes.
func eachArg(a *app, use, short, what string, do func(ctx context.Context, c *client.Client, id string) (any, error)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  minArgs(1, what),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range args {
				v, err := do(cmd.Context(), c, id)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				if a.json {
					printJSON(v)
					continue
				}
				termsafe.Println(id)
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON")
	return cmd
}

// inspectCmd is an `inspect X` verb: one argument, the object printed as
// JSON (--json is accepted for symmetry; JSON is the only form).
func inspectCmd(a *app, use, short, example, what string, get func(ctx context.Context, c *client.Client, id string) (any, error)) *cobra.Command {
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    exactArgs(1, what),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			v, err := get(cmd.Context(), c, args[0])
			if err != nil {
				return err
			}
			return printJSON(v)
		},
	}
	cmd.Flags().BoolVar(&a.json, "json", false, "print JSON (the default here)")
	return cmd
}
