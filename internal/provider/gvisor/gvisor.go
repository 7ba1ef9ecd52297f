// Package gvisor runs sandboxes under gVisor's runsc: a user-space kernel
// between the sandbox and the host, and the provider that can fork (runsc
// checkpoint --leave-running, then restore).
//
// Files: runsc runs with --overlay2=none on a host overlayfs rootfs, so the
// sandbox's writes land in its upper directory on the host and survive stop,
// start and crashes (no gVisor overlay in the Sentry's memory: a file the
// sandbox writes is on the host, bounded by --disk).
package gvisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/provider/ocicli"
)

// Options configure the provider.
type Options struct {
	Runsc    string // path of runsc; "" looks it up on PATH
	Root     string // runsc --root state directory
	Platform string // systrap (default) or ptrace
	DebugLog string // if set, runsc writes debug logs here (a directory ending in /)
	// ImageRAM is a directory on tmpfs where checkpoints' pages are written
	// first (see ramimage.go); "" writes them straight to disk.
	ImageRAM string
	// ForkMemory is provider.MemoryPages to load every restore's memory
	// page by page, even where it could be handed over (handoff.go).
	ForkMemory string
	// CopyHelper is the shard binary, whose CopyMemoryCommand makes a
	// fork's copy of its memory charged to the fork's memory cgroup; ""
	// copies in this process (charged to the server's).
	CopyHelper string
	Log        *slog.Logger
}

// Provider is the gvisor provider.
type Provider struct {
	ocicli.Runtime // Kill, Delete, Status, List
	opts           Options
	cli            *ocicli.CLI
	ram            ramImages
	handoffState
}

// New makes the provider; Probe says whether it can run.
func New(opts Options) *Provider {
	if opts.Platform == "" {
		opts.Platform = "systrap"
	}
	if opts.Runsc == "" {
		if p, err := exec.LookPath("runsc"); err == nil {
			opts.Runsc = p
		} else {
			opts.Runsc = "runsc"
		}
	}
	global := []string{"--root", opts.Root, "--platform", opts.Platform, "--network", "sandbox", "--overlay2", "none"}
	if opts.DebugLog != "" {
		global = append(global, "--debug", "--debug-log", opts.DebugLog)
	}
	cli := &ocicli.CLI{Binary: opts.Runsc, Global: global}
	return &Provider{Runtime: ocicli.Runtime{CLI: cli}, opts: opts, cli: cli}
}

// Name is "gvisor".
func (p *Provider) Name() string { return "gvisor" }

// HidesHoles: the Sentry's files report no holes (provider.HoleHider).
func (p *Provider) HidesHoles() bool { return true }

// Probe checks runsc is there and recent enough to checkpoint a running
// sandbox without stopping it.
func (p *Provider) Probe(ctx context.Context) provider.Capabilities {
	c := provider.Capabilities{Name: "gvisor", Isolation: "user-space kernel (gVisor runsc, " + p.opts.Platform + ")",
		Fork: true, Snapshot: true, Checkpoint: true}
	v, err := ocicli.Version(ctx, p.opts.Runsc)
	if err != nil {
		c.Reason = fmt.Sprintf("runsc not found or not runnable (%v): run scripts/install-deps.sh to build it", err)
		c.Fork, c.Checkpoint, c.Snapshot = false, false, false
		return c
	}
	help, _ := exec.CommandContext(ctx, p.opts.Runsc, "help", "checkpoint").CombinedOutput()
	if !contains(help, "leave-running") {
		c.Reason = "runsc at " + p.opts.Runsc + " is too old (no checkpoint --leave-running): build the pinned version with scripts/install-deps.sh"
		c.Fork, c.Checkpoint, c.Snapshot = false, false, false
		return c
	}
	if err := os.MkdirAll(p.opts.Root, 0o700); err != nil {
		c.Reason = err.Error()
		return c
	}
	c.Available = true
	c.Version = v
	c.ForkMemory = p.forkMemoryNote(ctx)
	return c
}

func contains(b []byte, s string) bool {
	return strings.Contains(string(b), s)
}

// Start runs the sandbox detached.
func (p *Provider) Start(ctx context.Context, inst *provider.Instance) error {
	return p.Launch(ctx, inst, nil, "run", "--detach", "--bundle", inst.Bundle, inst.ID)
}

// Pause freezes every process of the sandbox (a direct control call; runsc
// pause only when the control socket cannot be reached at all). Once the
// call was made, the Sentry may have paused even if the answer was lost:
// falling back to another pause then would pause twice, and one resume
// would leave the sandbox frozen. So a lost answer is an error, and the
// caller finds out with Paused.
//
// Each pause is written down on disk (see Paused), since gVisor cannot be
// asked whether it is paused, and resuming a sandbox that is not panics its
// kernel: a server restarted mid-fork must know which to thaw.
func (p *Provider) Pause(ctx context.Context, id string) error {
	if err := p.mark(id, markPausing); err != nil {
		return err
	}
	err := p.controlCall(ctx, id, "containerManager.Pause")
	var de *dialError
	if errors.As(err, &de) {
		p.opts.logger().Debug("control socket unreachable, using runsc pause", "sandbox", id, "err", err)
		_, err = p.cli.Run(ctx, "pause", id)
	}
	if err == nil {
		err = p.mark(id, markPaused)
	}
	return err
}

// Resume thaws it (see Pause on the fallback).
func (p *Provider) Resume(ctx context.Context, id string) error {
	err := p.controlCall(ctx, id, "containerManager.Resume")
	var de *dialError
	if errors.As(err, &de) {
		p.opts.logger().Debug("control socket unreachable, using runsc resume", "sandbox", id, "err", err)
		_, err = p.cli.Run(ctx, "resume", id)
	}
	if err == nil {
		p.mark(id, "")
	}
	return err
}

const (
	markPausing = "pausing" // a pause was asked for: it may or may not have happened
	markPaused  = "paused"  // the Sentry said it paused
)

func (p *Provider) markPath(id string) string { return filepath.Join(p.opts.Root+"-paused", id) }

// mark records what is known of id's pause ("" for none).
func (p *Provider) mark(id, what string) error {
	path := p.markPath(id)
	if what == "" {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", []byte(what), 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// Paused reports whether id is paused, as recorded by Pause and Resume:
// sure is false when a pause was asked for and its answer never came (the
// server died, or the call failed), so it may or may not have happened.
func (p *Provider) Paused(id string) (paused, sure bool) {
	b, err := os.ReadFile(p.markPath(id))
	switch {
	case err != nil:
		return false, true
	case string(b) == markPaused:
		return true, true
	}
	return false, false
}

// Delete removes the container and what is recorded of its pauses.
func (p *Provider) Delete(ctx context.Context, id string) error {
	if err := p.Runtime.Delete(ctx, id); err != nil {
		return err
	}
	p.pids.Delete(id)
	if p.opts.ImageRAM != "" {
		os.Remove(p.forkMemory(id)) // a fork's memory that was never restored
	}
	return p.mark(id, "")
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func (o Options) logger() *slog.Logger {
	if o.Log != nil {
		return o.Log
	}
	return slog.Default()
}

// Checkpoint saves memory, processes and (in-sandbox) file state to dir and
// leaves the sandbox running. It calls the Sentry's checkpoint directly on
// its control socket with files it opened itself (the three runsc would
// make: checkpoint.img, pages_meta.img, pages.img, so `runsc restore
// --image-path dir` reads them): no runsc process to start and no state to
// load while the source is frozen.
func (p *Provider) Checkpoint(ctx context.Context, id, dir string) error {
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, name := range []string{"checkpoint.img", "pages_meta.img"} {
		fh, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
		if err != nil {
			return err
		}
		files = append(files, fh)
	}
	pages, ram, err := openPages(dir)
	if err != nil {
		return err
	}
	files = append(files, pages)
	// A staged memory.img takes the memory file's pages (see handoff.go).
	mem, err := os.OpenFile(filepath.Join(dir, memoryFile), os.O_RDWR, 0)
	switch {
	case err == nil:
		p.topUp(dir) // the source is paused
		files = append(files, mem)
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	arg := map[string]any{
		"metadata": map[string]string{"compression": "none"},
		// Not scanning known-committed pages for zeroes: the scan runs on
		// one thread while the source is frozen (about 30 ms per 46 MB
		// allocated here), and restores load pages in the background.
		"app_mf_exclude_committed_zero_pages": false,
		"have_pages_file":                     true,
		"have_memory_file_copy":               mem != nil,
		"Resume":                              true,
	}
	if err := p.controlCallFiles(ctx, id, "containerManager.Checkpoint", arg, files); err != nil {
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	if ram {
		p.saved(pages)
	}
	return nil
}

// Prepare creates the sandbox (`runsc create`: its gofer and Sentry
// processes, waiting to be started) without starting anything in it, and
// meanwhile the sandbox's own copy of the image's memory file, if it has
// one (see handoff.go).
func (p *Provider) Prepare(ctx context.Context, inst *provider.Instance, dir string) error {
	var copyErr error
	done := make(chan struct{})
	start := time.Now()
	var copied time.Duration
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(done)
		_, copyErr = p.copyForkMemory(cctx, inst.ID, dir)
		copied = time.Since(start)
	}()
	err := p.Launch(ctx, inst, nil, p.createArgs(ctx, inst)...)
	created := time.Since(start)
	if err != nil {
		cancel() // its cgroup may never come
	}
	<-done
	p.opts.logger().Debug("prepared", "sandbox", inst.ID, "created", created, "memory_copied", copied)
	if err == nil && copyErr != nil {
		p.Runtime.Delete(context.WithoutCancel(ctx), inst.ID)
		err = copyErr
	}
	if err != nil {
		os.Remove(p.forkMemory(inst.ID))
	}
	return err
}

// CreateAhead creates inst's sandbox ahead of the restore that will give
// it its files and memory (provider.AheadMaker): `runsc create` with its
// root an empty mount point (rootfs.Placeholder), over which the restored
// sandbox's root is mounted before Restore. Nothing of a user's is in it.
func (p *Provider) CreateAhead(ctx context.Context, inst *provider.Instance) error {
	if why := p.unpatchedRunsc(ctx); why != "" {
		// Stock runsc serves the root as it was at its create.
		return fmt.Errorf("a sandbox made ahead: %s", why)
	}
	return p.Launch(ctx, inst, nil, p.createArgs(ctx, inst)...)
}

// createArgs is `runsc create` of a sandbox to be restored: with the
// patched runsc, its network set up at once, for Restore's direct call.
func (p *Provider) createArgs(ctx context.Context, inst *provider.Instance) []string {
	args := []string{"create", "--bundle", inst.Bundle}
	if p.unpatchedRunsc(ctx) == "" {
		args = append(args, "--setup-network")
	}
	return append(args, inst.ID)
}

// PrepareAhead is Prepare of a sandbox made ahead: its own copy of the
// image's memory file, made in its memory cgroup (which exists already).
func (p *Provider) PrepareAhead(ctx context.Context, inst *provider.Instance, dir string) error {
	start := time.Now()
	if _, err := p.copyForkMemory(ctx, inst.ID, dir); err != nil {
		return err // (it removed its copy)
	}
	p.opts.logger().Debug("prepared ahead", "sandbox", inst.ID, "memory_copied", time.Since(start))
	return nil
}

var (
	_ provider.Checkpointer   = (*Provider)(nil)
	_ provider.PauseTracker   = (*Provider)(nil)
	_ provider.ImageDescriber = (*Provider)(nil)
	_ provider.HoleHider      = (*Provider)(nil)
	_ provider.AheadMaker     = (*Provider)(nil)
)
