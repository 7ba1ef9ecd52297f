package main

import (
	"context"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
)

func newStartCmd(a *app) *cobra.Command {
	return eachSandbox(a, "start SANDBOX...", "Start stopped sandboxes again, with their files",
		func(ctx context.Context, c *client.Client, id string) (any, error) { return c.Start(ctx, id) })
}
