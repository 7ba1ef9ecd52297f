package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/units"
)

func newCreateCmd(a *app) *cobra.Command {
	var name, memory, cpu, disk, provider string
	var env []string
	var pids int64
	var quiet bool
	cmd := &cobra.Command{
		Use:   "create [flags] IMAGE",
		Short: "Create and start a sandbox from an image; prints its id",
		Example: `  shard create --name base --memory 512MiB python:3.12-slim
  shard create --cpu 0.5 --disk 2GiB --env DEBUG=1 --provider runc busybox`,
		Args: exactArgs(1, "an IMAGE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := client.CreateRequest{Image: args[0], Name: name, Provider: provider, Pids: pids}
			for _, f := range []struct {
				flag, val string
				dst       *json.RawMessage
			}{{"--memory", memory, &req.Memory}, {"--disk", disk, &req.Disk}} {
				if f.val == "" {
					continue
				}
				if _, err := units.ParseSize(f.val); err != nil {
					return fmt.Errorf("%s: %w", f.flag, err)
				}
				*f.dst, _ = json.Marshal(f.val)
			}
			if cpu != "" {
				if _, err := units.ParseCPU(cpu); err != nil {
					return fmt.Errorf("--cpu: %w", err)
				}
				req.CPU, _ = json.Marshal(cpu)
			}
			for _, kv := range env {
				if !strings.Contains(kv, "=") {
					v, ok := os.LookupEnv(kv) // docker's --env NAME takes the value from here
					if !ok {
						return fmt.Errorf("--env %s: not KEY=VALUE and not set here", kv)
					}
					kv += "=" + v
				}
				req.Env = appendEnv(req.Env, kv)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			// Pull first when the image is not cached, so a progress bar shows.
			if _, err := c.Image(ctx, args[0]); err != nil {
				var ce *client.Error
				if !errors.As(err, &ce) || ce.Status != 404 {
					return err
				}
				if _, err := pullWithProgress(ctx, c, args[0], quiet || a.json); err != nil {
					return err
				}
			}
			sb, err := c.Create(ctx, req)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(sb)
			}
			fmt.Println(sb.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "name of the sandbox (unique); default: its id")
	f.StringVar(&memory, "memory", "", "memory bound, e.g. 512MiB (default 512MiB)")
	f.StringVar(&cpu, "cpu", "", "cpu bound in cpus, e.g. 1, 0.5 or 500m (default 1)")
	f.StringVar(&disk, "disk", "", "disk bound for the sandbox's own files, e.g. 2GiB (default 10GiB)")
	f.Int64Var(&pids, "pids", 0, "most processes at once (default 4096)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVar(&provider, "provider", "", "isolation provider: gvisor (default), runc; see shard capabilities")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress bar while pulling")
	f.BoolVar(&a.json, "json", false, "print the sandbox as JSON instead of its id")
	return cmd
}

func appendEnv(raw json.RawMessage, kv string) json.RawMessage {
	var list []string
	if len(raw) > 0 {
		json.Unmarshal(raw, &list)
	}
	list = append(list, kv)
	b, _ := json.Marshal(list)
	return b
}
