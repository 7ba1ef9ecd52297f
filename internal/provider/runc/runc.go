// Package runc runs sandboxes as plain Linux containers under runc:
// namespaces and cgroups, the host kernel shared. It cannot fork here: the
// only packaged CRIU cannot dump a runc container on this kernel, so
// Checkpointer is not implemented and `shard capabilities` says so.
package runc

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/useshards/shard/internal/agent/proto"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/useshards/shard/internal/oci"
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

// Start runs the container detached, confined as Docker confines a
// container (oci.ConfineHostKernel): a runc sandbox shares the host kernel.
func (p *Provider) Start(ctx context.Context, inst *provider.Instance) error {
	if err := oci.ConfineHostKernel(inst.Spec); err != nil {
		return err
	}
	tasks, err := commandCgroups(inst.Spec)
	if err != nil {
		return err
	}
	defer func() {
		for _, f := range tasks {
			f.Close()
		}
	}()
	args := []string{"run", "--detach", "--bundle", inst.Bundle, inst.ID}
	if len(tasks) > 0 {
		args = append([]string{"run", "--preserve-fds", strconv.Itoa(len(tasks))}, args[1:]...)
	}
	if err := p.Launch(ctx, inst, tasks, args...); err != nil {
		p.Delete(context.WithoutCancel(ctx), inst.ID) // the commands' cgroups too
		return err
	}
	return nil
}

// Delete removes the container, and the cgroups made for its commands.
func (p *Provider) Delete(ctx context.Context, id string) error {
	err := p.Runtime.Delete(ctx, id)
	for _, c := range []string{"pids", "memory", "cpu"} {
		dir := filepath.Join(cgroupRoot, c, oci.CgroupsPath(id))
		for _, sub := range []string{"sandbox", "reserve", ""} {
			os.Remove(filepath.Join(dir, sub)) // rmdir: gone with runc's already, or busy
		}
	}
	return err
}

const cgroupRoot = "/sys/fs/cgroup"

// OOMKills counts the kills in the commands' memory cgroup too (see
// commandCgroups): cgroup v1 counts a kill only where the limit was hit.
func (p *Provider) OOMKills(id string) int64 { return ocicli.OOMKills(id, "sandbox") }

// commandCgroups gives the agent's commands cgroups of their own under the
// container's, so that nothing they do can starve the agent, which shares
// the container's cgroups with them (cgroup v1 here; each controller's
// cgroups are hierarchical):
//
//   - pids: commands start in "sandbox", bound to the sandbox's --pids, or
//     in "reserve" (proto.PidsReserve) when that is full, so a command can
//     still start to end a fork bomb; the container's own cgroup, where
//     the agent stays, gets the bound plus the reserve plus
//     proto.AgentPids for the agent's threads. Before, a fork bomb left the
//     agent no pid to start a command, nor to make a thread.
//   - memory: "sandbox" has the sandbox's --memory; the container's cgroup
//     has agentMemory more, the agent's. Before, the agent faulted and
//     allocated in a cgroup thrashing at its limit and did not answer.
//   - cpu: "sandbox" has no quota of its own (the container's applies);
//     the agent competes with it as one group (half the CPU when both want
//     it), not with each of a bomb's hundreds of processes.
//
// The agent gets the tasks files as descriptors from 3 on
// (proto.EnvPidsTasks says which belong to which of its spawner threads)
// and moves a thread into each set, from which it starts commands. (It
// also starts them with oom_score_adj 1000, so the OOM killer never takes
// the agent while there is a command to take.)
func commandCgroups(spec *specs.Spec) ([]*os.File, error) {
	if spec.Linux == nil || spec.Linux.Resources == nil || !filepath.IsAbs(spec.Linux.CgroupsPath) {
		return nil, nil
	}
	r := spec.Linux.Resources
	if r.Pids == nil || r.Pids.Limit == nil || *r.Pids.Limit <= 0 {
		return nil, nil
	}
	var files []*os.File
	fail := func(err error) ([]*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, fmt.Errorf("command cgroups: %w", err)
	}
	// sub makes controller's child cgroup name, writes its settings and
	// opens its tasks file.
	sub := func(controller, name string, set map[string]int64) error {
		dir := filepath.Join(cgroupRoot, controller, spec.Linux.CgroupsPath, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for k, v := range set {
			if err := os.WriteFile(filepath.Join(dir, k), []byte(strconv.FormatInt(v, 10)), 0); err != nil {
				return err
			}
		}
		f, err := os.OpenFile(filepath.Join(dir, "tasks"), os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		files = append(files, f)
		return nil
	}
	n := *r.Pids.Limit
	total := n + proto.PidsReserve + proto.AgentPids
	r.Pids.Limit = &total
	if err := sub("pids", "sandbox", map[string]int64{"pids.max": n}); err != nil { // fd 3
		return fail(err)
	}
	if err := sub("pids", "reserve", map[string]int64{"pids.max": proto.PidsReserve}); err != nil { // fd 4
		return fail(err)
	}
	bounded, reserve := "3", "4"
	if r.Memory != nil && r.Memory.Limit != nil && *r.Memory.Limit > 0 {
		mem := *r.Memory.Limit
		total := mem + agentMemory
		r.Memory.Limit = &total
		if err := sub("memory", "sandbox", map[string]int64{"memory.limit_in_bytes": mem}); err != nil {
			return fail(err)
		}
		fd := strconv.Itoa(2 + len(files))
		bounded, reserve = bounded+"+"+fd, reserve+"+"+fd
	}
	if err := sub("cpu", "sandbox", nil); err != nil {
		return fail(err)
	}
	fd := strconv.Itoa(2 + len(files))
	bounded, reserve = bounded+"+"+fd, reserve+"+"+fd
	spec.Process.Env = append(spec.Process.Env, proto.EnvPidsTasks+"="+bounded+","+reserve)
	return files, nil
}

// agentMemory is the room the container's memory cgroup has for the agent
// beside its commands' bound.
const agentMemory = 64 << 20
