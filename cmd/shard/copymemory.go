package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/internal/provider/gvisor"
)

// newCopyMemoryCmd is the helper the gvisor provider runs to make a fork's
// copy of its checkpoint's memory file inside the fork's memory cgroup:
// tmpfs pages are charged to the cgroup of the process that first writes
// them, and the copy is the fork's memory from then on.
func newCopyMemoryCmd() *cobra.Command {
	var cgroup string
	cmd := &cobra.Command{
		Use:    gvisor.CopyMemoryCommand + " --cgroup DIR SRC DST",
		Short:  "Copy a checkpoint's memory file for a fork, charged to the fork's memory cgroup (the server runs it)",
		Hidden: true,
		Args:   cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cgroup != "" {
				if err := joinCgroup(cgroup, 10*time.Second); err != nil {
					return err
				}
			}
			return gvisor.CopyMemoryFile(args[1], args[0])
		},
	}
	cmd.Flags().StringVar(&cgroup, "cgroup", "", "memory cgroup directory to join first, once it exists (runsc create makes it meanwhile)")
	return cmd
}

// joinCgroup moves this process into the cgroup directory dir, waiting up
// to wait for it to appear.
func joinCgroup(dir string, wait time.Duration) error {
	procs := filepath.Join(dir, "cgroup.procs")
	deadline := time.Now().Add(wait)
	for {
		err := os.WriteFile(procs, []byte(strconv.Itoa(os.Getpid())), 0)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("join memory cgroup %s: %w", dir, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
