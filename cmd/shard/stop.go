package main

import (
	"context"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
)

func newStopCmd(a *app) *cobra.Command {
	return eachSandbox(a, "stop SANDBOX...", "Stop sandboxes: their processes end, their files stay",
		func(ctx context.Context, c *client.Client, id string) (any, error) { return c.Stop(ctx, id) })
}
