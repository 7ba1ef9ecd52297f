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
	if err := ocicli.WriteBundle(inst, inst.Spec); err != nil {
		return err
	}
	if err := p.cli.RunDetached(ctx, inst, "run", "--detach", "--bundle", inst.Bundle, inst.ID); err != nil {
		p.cli.Delete(context.WithoutCancel(ctx), inst.ID)
		return err
	}
	return nil
}
