// Package runc runs sandboxes as plain Linux containers under runc:
// namespaces and cgroups, the host kernel shared. It cannot fork here: the
// only packaged CRIU fails on this kernel (PLATFORM.md), so Checkpointer is
// not implemented and `shard capabilities` says so.
package runc

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/useshards/shard/internal/agent"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/provider/ocicli"
)

// Options configure the provider.
type Options struct {
	Runc string // path of runc; "" looks it up on PATH
	Root string // runc --root state directory
	Log  *slog.Logger
}

// Provider is the runc provider.
type Provider struct {
	ocicli.Runtime // Kill, Delete, Status, List
	opts           Options
	cli            *ocicli.CLI
}

// New makes the provider.
func New(opts Options) *Provider {
	if opts.Runc == "" {
		if p, err := exec.LookPath("runc"); err == nil {
			opts.Runc = p
		} else {
			opts.Runc = "runc"
		}
	}
	cli := &ocicli.CLI{Binary: opts.Runc, Global: []string{"--root", opts.Root}}
	return &Provider{Runtime: ocicli.Runtime{CLI: cli}, opts: opts, cli: cli}
}

// Name is "runc".
func (p *Provider) Name() string { return "runc" }

// Probe checks runc is there.
func (p *Provider) Probe(ctx context.Context) provider.Capabilities {
	c := provider.Capabilities{Name: "runc", Isolation: "linux namespaces and cgroups (shared host kernel)",
		Snapshot: true}
	v, err := ocicli.Version(ctx, p.opts.Runc)
	if err != nil {
		c.Reason = fmt.Sprintf("runc not found or not runnable (%v): apt-get install runc", err)
		c.Snapshot = false
		return c
	}
	if err := os.MkdirAll(p.opts.Root, 0o700); err != nil {
		c.Reason = err.Error()
		return c
	}
	c.Available, c.Version = true, v
	return c
}

// Start runs the container detached.
func (p *Provider) Start(ctx context.Context, inst *provider.Instance) error {
	tasks, err := pidsCgroups(inst.Spec)
	if err != nil {
		return err
	}
	defer func() {
		for _, f := range tasks {
			f.Close()
		}
	}()
	if err := ocicli.WriteBundle(inst, inst.Spec); err != nil {
		return err
	}
	args := []string{"run", "--detach", "--bundle", inst.Bundle, inst.ID}
	if len(tasks) > 0 {
		args = append([]string{"run", "--preserve-fds", strconv.Itoa(len(tasks))}, args[1:]...)
	}
	if err := p.cli.RunDetachedFiles(ctx, inst, tasks, args...); err != nil {
		p.Delete(context.WithoutCancel(ctx), inst.ID)
		return err
	}
	return nil
}

// Delete removes the container, and the pids cgroups made for it.
func (p *Provider) Delete(ctx context.Context, id string) error {
	err := p.Runtime.Delete(ctx, id)
	dir := filepath.Join(pidsRoot, "shard", id)
	for _, sub := range []string{"sandbox", "reserve", ""} {
		os.Remove(filepath.Join(dir, sub)) // rmdir: gone with runc's already, or busy
	}
	return err
}

const pidsRoot = "/sys/fs/cgroup/pids"

// pidsCgroups splits the container's pids cgroup so a fork bomb cannot
// starve the agent (it shares the container's cgroup with its commands):
// commands start in "sandbox", bound to the sandbox's --pids, or in
// "reserve" (agent.PidsReserve) when that is full, so a command can still
// start to end the bomb; the container's own cgroup, where the agent
// stays, gets the bound plus the reserve plus agent.AgentPids for the
// agent's threads. Linux's pids cgroups are hierarchical. The agent gets
// the two tasks files as descriptors 3 and 4 (agent.EnvPidsTasks) and
// moves a thread into each, from which it starts commands. (It also starts
// them with oom_score_adj 1000, so the OOM killer never takes the agent
// while there is a command to take.)
func pidsCgroups(spec *specs.Spec) ([]*os.File, error) {
	if spec.Linux == nil || spec.Linux.Resources == nil || spec.Linux.Resources.Pids == nil ||
		spec.Linux.Resources.Pids.Limit == nil || *spec.Linux.Resources.Pids.Limit <= 0 || !filepath.IsAbs(spec.Linux.CgroupsPath) {
		return nil, nil
	}
	n := *spec.Linux.Resources.Pids.Limit
	total := n + agent.PidsReserve + agent.AgentPids
	spec.Linux.Resources.Pids.Limit = &total
	dir := filepath.Join(pidsRoot, spec.Linux.CgroupsPath)
	var files []*os.File
	for _, cg := range []struct {
		name string
		max  int64
	}{{"sandbox", n}, {"reserve", agent.PidsReserve}} {
		sub := filepath.Join(dir, cg.name)
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return nil, fmt.Errorf("pids cgroup: %w", err)
		}
		if err := os.WriteFile(filepath.Join(sub, "pids.max"), []byte(strconv.FormatInt(cg.max, 10)), 0); err != nil {
			return nil, fmt.Errorf("pids cgroup: %w", err)
		}
		f, err := os.OpenFile(filepath.Join(sub, "tasks"), os.O_WRONLY, 0)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, fmt.Errorf("pids cgroup: %w", err)
		}
		files = append(files, f)
	}
	spec.Process.Env = append(spec.Process.Env, agent.EnvPidsTasks+"=3,4")
	return files, nil
}
