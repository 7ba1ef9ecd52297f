package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/internal/api"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/sandbox"
)

// The checks below refuse a flag the server would refuse, before anything
// is sent, with the flag's name and the range it takes. A flag given as 0
// is refused rather than read as "left out".

// pidsFlag checks --pids when it was given.
func pidsFlag(cmd *cobra.Command, pids int64) error {
	if cmd.Flags().Changed("pids") && (pids < sandbox.MinPids || pids > sandbox.MaxPids) {
		return fmt.Errorf("--pids %d is out of range: from %d to %d", pids, sandbox.MinPids, sandbox.MaxPids)
	}
	return nil
}

// countFlag checks fork's --count.
func countFlag(count int) error {
	if count < 1 || count > sandbox.MaxForkCount {
		return fmt.Errorf("--count %d is out of range: from 1 to %d", count, sandbox.MaxForkCount)
	}
	return nil
}

// tagFlag checks a checkpoint's --tag.
func tagFlag(tag string) error {
	if err := names.Tag(tag); err != nil {
		return fmt.Errorf("--tag: %w", err)
	}
	return nil
}

// nameFlag checks a --name of what (a sandbox, snapshot, fork...), if given.
func nameFlag(what, name string) error {
	if name == "" {
		return nil
	}
	if err := names.Name(what, name); err != nil {
		return fmt.Errorf("--name: %w", err)
	}
	return nil
}

// timeoutFlag checks exec's --timeout: 0 is none, else 1ms to
// api.MaxExecTimeout in whole milliseconds.
func timeoutFlag(d time.Duration) error {
	switch {
	case d < 0:
		return fmt.Errorf("--timeout %s: it must be positive", d)
	case d > api.MaxExecTimeout:
		return fmt.Errorf("--timeout %s is too long: at most %s", d, api.MaxExecTimeout)
	case d%time.Millisecond != 0:
		return fmt.Errorf("--timeout %s is finer than a millisecond: give whole milliseconds, e.g. 1ms", d)
	}
	return nil
}
