package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
	"github.com/useshards/shard/internal/units"
)

func newCreateCmd(a *app) *cobra.Command {
	var name, memory, cpu, disk, provider, fromSnapshot, envFrom, node string
	var env []string
	var pids int64
	var quiet bool
	cmd := &cobra.Command{
		Use:   "create [flags] IMAGE",
		Short: "Create and start a sandbox from an image; prints its id",
		Long: `Create and start a sandbox from an image (pulled first when it is not cached).

--from-snapshot SNAPSHOT starts it with a copy of a snapshot's files (shard
snapshot); IMAGE may then be left out: it is the snapshot's, and so is the
disk size.

--env-from ENVIRONMENT starts it warm from an environment's checkpoint (shard
env): memory, processes and files as the environment's setup left them. Its
image, bounds, variables and provider are the environment's, so IMAGE,
--memory, --cpu, --disk, --pids, --env and --provider are left out.`,
		Example: `  shard create --name base --memory 512MiB python:3.12-slim
  shard create --cpu 0.5 --disk 2GiB --env DEBUG=1 --provider runc busybox
  shard create --from-snapshot base-v1 --name work
  shard create --env-from py-deps --name job-1`,
		Args: func(cmd *cobra.Command, args []string) error {
			if fromSnapshot == "" && envFrom == "" {
				return exactArgs(1, "an IMAGE")(cmd, args)
			}
			if len(args) > 1 {
				return fmt.Errorf("create takes at most one IMAGE (got %d arguments); see shard create --help", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if fromSnapshot != "" && envFrom != "" {
				return fmt.Errorf("--from-snapshot and --env-from do not go together: an environment's checkpoint has files of its own")
			}
			if envFrom != "" {
				var given []string
				for _, f := range []string{"memory", "cpu", "disk", "pids", "env", "provider"} {
					if cmd.Flags().Changed(f) {
						given = append(given, "--"+f)
					}
				}
				if len(args) > 0 {
					given = append(given, "IMAGE")
				}
				if err := envFromConflict(envFrom, given); err != nil {
					return err
				}
			}
			if err := pidsFlag(cmd, pids); err != nil {
				return err
			}
			if err := nameFlag("sandbox", name); err != nil {
				return err
			}
			req := client.CreateRequest{Name: name, Provider: provider, Pids: pids, FromSnapshot: fromSnapshot, Environment: envFrom, Node: node}
			if len(args) > 0 {
				req.Image = args[0]
			}
			var err error
			if req.Memory, req.CPU, req.Disk, err = sizeFlags(memory, cpu, disk); err != nil {
				return err
			}
			if req.Env, err = envList(env); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			// A snapshot's or environment's image is in the cache already.
			if fromSnapshot == "" && envFrom == "" {
				if err := ensureImage(ctx, c, req.Image, quiet || a.json); err != nil {
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
			termsafe.Println(sb.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "name of the sandbox (unique); default: its id")
	f.StringVar(&memory, "memory", "", "memory bound, e.g. 512MiB (default 512MiB)")
	f.StringVar(&cpu, "cpu", "", "cpu bound in cpus, e.g. 1, 0.5 or 500m (default 1)")
	f.StringVar(&disk, "disk", "", "disk bound for the sandbox's own files, e.g. 4GiB (default 2GiB; reserved in full on the server)")
	f.Int64Var(&pids, "pids", 0, "most processes at once, 8 to 4194304 (default 4096)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVar(&node, "node", "", "in a cluster, make it on this node (default: the node with the most free memory that has the provider; see shard node ls)")
	f.StringVar(&provider, "provider", "", "isolation provider: gvisor (default), runc; see shard capabilities")
	f.StringVar(&fromSnapshot, "from-snapshot", "", "start from a snapshot's files (id or name); IMAGE is then optional")
	f.StringVar(&envFrom, "env-from", "", "start warm from an environment's checkpoint (its image and bounds)")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress bar while pulling")
	f.BoolVar(&a.json, "json", false, "print the sandbox as JSON instead of its id")
	return cmd
}

// envFromConflict refuses what create --env-from cannot take: given lists
// the flags (and IMAGE) the command line set that the environment decides.
func envFromConflict(envName string, given []string) error {
	if len(given) == 0 {
		return nil
	}
	list := given[0]
	if n := len(given); n > 1 {
		list = strings.Join(given[:n-1], ", ") + " and " + given[n-1]
	}
	return fmt.Errorf("--env-from %s starts from the environment's checkpoint, so its image, bounds, variables and provider are the environment's: leave out %s (to change them, run shard env create %s again with the new ones)",
		envName, list, envName)
}

// sizeFlags checks --memory, --cpu and --disk with the server's own parsers
// and returns them as the API takes them; an empty flag stays unset.
func sizeFlags(memory, cpu, disk string) (mem, cpus, dsk json.RawMessage, err error) {
	for _, f := range []struct {
		flag, val string
		dst       *json.RawMessage
	}{{"--memory", memory, &mem}, {"--disk", disk, &dsk}} {
		if f.val == "" {
			continue
		}
		if n, err := units.ParseSize(f.val); err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w", f.flag, err)
		} else if n == 0 {
			return nil, nil, nil, fmt.Errorf("%s must be above zero (leave it out for the default)", f.flag)
		}
		*f.dst, _ = json.Marshal(f.val)
	}
	if cpu != "" {
		if _, err := units.ParseCPU(cpu); err != nil {
			return nil, nil, nil, fmt.Errorf("--cpu: %w", err)
		}
		cpus, _ = json.Marshal(cpu)
	}
	return mem, cpus, dsk, nil
}

// envList turns --env flags into the API's list; a bare NAME takes its
// value from here, as docker's --env does. No flags: nil.
func envList(env []string) (json.RawMessage, error) {
	var raw json.RawMessage
	for _, kv := range env {
		if !strings.Contains(kv, "=") {
			v, ok := os.LookupEnv(kv)
			if !ok {
				return nil, fmt.Errorf("--env %s: not KEY=VALUE and not set here", kv)
			}
			kv += "=" + v
		}
		raw = appendEnv(raw, kv)
	}
	return raw, nil
}

// ensureImage pulls ref first when it is not cached, so a progress bar
// shows.
func ensureImage(ctx context.Context, c *client.Client, ref string, quiet bool) error {
	if _, err := c.Image(ctx, ref); err != nil {
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != 404 {
			return err
		}
		if _, err := pullWithProgress(ctx, c, ref, quiet); err != nil {
			return err
		}
	}
	return nil
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
