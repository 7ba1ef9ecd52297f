package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/useshards/shard/internal/agent/guest"
	"github.com/useshards/shard/internal/agent/proto"

	"github.com/spf13/cobra"
)

func newAgentCmd() *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:    "agent",
		Short:  "Run the in-sandbox agent (shard starts it inside every sandbox)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "agent")
			srv, err := guest.NewServerFromEnv(log)
			if err != nil {
				return err
			}
			return srv.Serve(cmd.Context(), listen)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", fmt.Sprintf(":%d", proto.Port), "address to listen on")
	return cmd
}
