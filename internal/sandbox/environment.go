package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/revert"
	"github.com/useshards/shard/internal/shellquote"
	"github.com/useshards/shard/internal/store"
)

// EnvironmentRequest defines an environment: a sandbox made as Create says
// and set up by Setup (commands run in order, each must exit 0) — or, with
// Sandbox, a running sandbox the caller set up itself (the SDKs' setup
// callback). Fingerprint names the definition; it is computed when empty.
type EnvironmentRequest struct {
	Name        string
	Create      CreateRequest
	Setup       [][]string
	Sandbox     string
	Fingerprint string
}

// CreateEnvironment builds an environment once: it runs the setup in a new
// sandbox, checkpoints it, keeps the checkpoint, and removes the sandbox.
// With the definition unchanged it returns the existing one (built false);
// a changed definition rebuilds it, and the old checkpoint goes once the new
// one is in place.
func (sv *Saved) CreateEnvironment(ctx context.Context, req EnvironmentRequest) (*store.Environment, bool, error) {
	if req.Name == "" {
		return nil, false, errdefs.Invalid("an environment needs a name")
	}
	if err := validName(req.Name); err != nil {
		return nil, false, err
	}
	for _, argv := range req.Setup {
		if len(argv) == 0 {
			return nil, false, errdefs.Invalid("a setup command is empty")
		}
	}
	unlock := sv.s.locks.lock(envKey(project.Of(ctx), req.Name))
	defer unlock()
	if req.Sandbox != "" {
		if len(req.Setup) > 0 || req.Create.Image != "" || req.Create.MemoryBytes != 0 || req.Create.CPUMillis != 0 || req.Create.DiskBytes != 0 || len(req.Create.Env) > 0 {
			return nil, false, errdefs.Invalid("an environment from a sandbox takes that sandbox's image, bounds and state: leave out image, memory, cpu, disk, env and setup")
		}
		return sv.envFromSandbox(ctx, req)
	}
	return sv.envFromSetup(ctx, req)
}

// current returns the environment if it exists with this fingerprint and
// its checkpoint is still there.
func (sv *Saved) current(ctx context.Context, name, fp string) (*store.Environment, bool) {
	old, err := sv.s.cfg.Store.GetEnvironment(ctx, name)
	if err != nil || old.Fingerprint != fp {
		return nil, false
	}
	if _, err = sv.s.cfg.Store.GetCheckpoint(ctx, old.Checkpoint); err != nil {
		return nil, false
	}
	return old, true
}

func (sv *Saved) envFromSetup(ctx context.Context, req EnvironmentRequest) (*store.Environment, bool, error) {
	cr := req.Create
	cr.Name = ""
	if err := sv.s.validate(&cr); err != nil {
		return nil, false, err
	}
	c := sv.s.caps[cr.Provider]
	if !c.Checkpoint {
		return nil, false, errdefs.Unsupported("provider %s does not support checkpoint on this host, which an environment needs", cr.Provider)
	}
	fp := req.Fingerprint
	if fp == "" {
		fp = fingerprint(cr.Image, cr.Provider, cr.Bounds, cr.Env, req.Setup)
	}
	if env, ok := sv.current(ctx, req.Name, fp); ok {
		return env, false, nil
	}
	// The sandbox the setup runs in: named after the environment when that
	// name is free, so its ledger session tells what the setup did.
	cr.Name = "env-" + req.Name
	if len(cr.Name) > 63 {
		cr.Name = ""
	}
	sb, err := sv.s.Create(ctx, cr)
	if errdefs.CodeOf(err) == client.CodeNameTaken {
		cr.Name = ""
		sb, err = sv.s.Create(ctx, cr)
	}
	if err != nil {
		return nil, false, fmt.Errorf("environment %s: %w", req.Name, err)
	}
	bg := context.WithoutCancel(ctx)
	defer sv.s.Remove(bg, sb.ID, true)
	for _, argv := range req.Setup {
		var out bytes.Buffer
		code, err := sv.s.run(ctx, sb, argv, &out)
		if err != nil {
			return nil, false, fmt.Errorf("environment %s: setup %s: %w", req.Name, shellquote.Join(argv), err)
		}
		if code != 0 {
			return nil, false, setupFailed(req.Name, argv, code, out.String())
		}
	}
	env, err := sv.envCheckpoint(bg, req.Name, sb.ID, fp, req.Setup)
	return env, err == nil, err
}

func (sv *Saved) envFromSandbox(ctx context.Context, req EnvironmentRequest) (*store.Environment, bool, error) {
	sb, err := sv.s.cfg.Store.GetSandbox(ctx, req.Sandbox)
	if err != nil {
		return nil, false, err
	}
	fp := req.Fingerprint
	if fp == "" {
		// Without a fingerprint from the caller, every call is a new
		// definition: the sandbox's state is what defines it.
		fp = fingerprint(sb.ImageDigest, sb.Provider, sb.Bounds, sb.Env, [][]string{{"sandbox", sb.ID, time.Now().String()}})
	}
	if env, ok := sv.current(ctx, req.Name, fp); ok {
		return env, false, nil
	}
	env, err := sv.envCheckpoint(context.WithoutCancel(ctx), req.Name, sb.ID, fp, nil)
	return env, err == nil, err
}

// envCheckpoint checkpoints the set-up sandbox and makes that checkpoint
// the environment's, dropping the one it had before.
func (sv *Saved) envCheckpoint(ctx context.Context, name, sandboxID, fp string, setup [][]string) (*store.Environment, error) {
	src, cp, unlock, err := sv.s.lockRunning(ctx, sandboxID, "checkpoint")
	if err != nil {
		return nil, err
	}
	release, err := sv.s.adm.reserveSaved(ctx, src, sv.s.adm.memoryImageBound(src), sv.s.cfg.Storage.FileUsage(src.ID), "the checkpoint of environment "+name)
	if err != nil {
		unlock()
		return nil, fmt.Errorf("environment %s: %w", name, err)
	}
	ck, err := sv.s.capture(ctx, src, cp, newID(), "environment", "environment:"+name, false, nil)
	release()
	unlock()
	if err != nil {
		return nil, fmt.Errorf("environment %s: %w", name, err)
	}
	env := &store.Environment{
		Name: name, Shape: ck.Shape.Clone(),
		Setup: setup, Fingerprint: fp, Checkpoint: ck.ID, CreatedAt: time.Now().UTC(),
	}
	r := revert.New()
	defer r.Fail()
	r.Add(func() { sv.dropCheckpoint(ctx, ck) }) // made for an environment that did not come to be
	old, oldErr := sv.s.cfg.Store.GetEnvironment(ctx, name)
	if err := sv.s.cfg.Store.PutEnvironment(ctx, env); err != nil {
		return nil, err
	}
	r.Success()
	sv.spares.forget(envKey(project.Of(ctx), name))
	sv.spares.stage(env)
	if oldErr == nil && old.Checkpoint != ck.ID {
		if ock, err := sv.s.cfg.Store.GetCheckpoint(ctx, old.Checkpoint); err == nil {
			sv.dropCheckpoint(ctx, ock)
		}
	}
	return env, nil
}

// fingerprint hashes an environment's definition.
func fingerprint(image, provider string, b store.Bounds, env []string, setup [][]string) string {
	js, _ := json.Marshal([]any{image, provider, b.MemoryBytes, b.CPUMillis, b.DiskBytes, b.Pids, env, setup})
	h := sha256.Sum256(js)
	return hex.EncodeToString(h[:12])
}

// GetEnvironment finds an environment by name.
func (sv *Saved) GetEnvironment(ctx context.Context, name string) (*store.Environment, error) {
	return sv.s.cfg.Store.GetEnvironment(ctx, name)
}

// Environments lists every environment.
func (sv *Saved) Environments(ctx context.Context) ([]*store.Environment, error) {
	return sv.s.cfg.Store.ListEnvironments(ctx)
}

// CacheEnvironment records e, built on node origin of a cluster, as a copy
// here: its checkpoint (e.Checkpoint) must have been imported already.
func (sv *Saved) CacheEnvironment(ctx context.Context, e *store.Environment, origin string) error {
	unlock := sv.s.locks.lock(envKey(e.Project, e.Name))
	defer unlock()
	if old, err := sv.s.cfg.Store.GetEnvironment(project.With(ctx, e.Project), e.Name); err == nil && old.Origin == "" {
		return errdefs.Conflict(client.CodeEnvironmentExists, "environment %s was built on this node", e.Name)
	}
	if _, err := sv.s.cfg.Store.GetCheckpoint(project.Unscoped(ctx, "an environment copy's checkpoint, imported with its own project"), e.Checkpoint); err != nil {
		return err
	}
	cp := *e
	cp.Origin = origin
	return sv.s.cfg.Store.PutEnvironment(project.With(ctx, e.Project), &cp)
}

// RemoveEnvironment deletes an environment and its checkpoint. Sandboxes
// started from it keep running with their own copies.
func (sv *Saved) RemoveEnvironment(ctx context.Context, name string) error {
	unlock := sv.s.locks.lock(envKey(project.Of(ctx), name))
	defer unlock()
	env, err := sv.s.cfg.Store.GetEnvironment(ctx, name)
	if err != nil {
		return err
	}
	if err := sv.s.cfg.Store.DeleteEnvironment(ctx, name); err != nil {
		return err
	}
	sv.spares.forget(envKey(project.Of(ctx), name))
	if ck, err := sv.s.cfg.Store.GetCheckpoint(ctx, env.Checkpoint); err == nil {
		return sv.dropCheckpoint(ctx, ck)
	}
	return nil
}

// CreateFromEnvironment starts a new sandbox warm from an environment:
// into its warm spare when one is staged, else by a plain restore; then a
// new spare is staged for the next create.
//
// allow, if set, is asked whether the sandbox may carry the grants and
// policy of the environment's checkpoint, once that is held.
func (sv *Saved) CreateFromEnvironment(ctx context.Context, env, name string, allow Allow) (*store.Sandbox, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if err := sv.s.adm.ledgerRoom(ctx, project.Of(ctx), "create a sandbox from environment "+env); err != nil {
		return nil, err
	}
	// A rebuild stores the environment's new checkpoint, then drops the
	// old one: a create that finds the checkpoint it read gone looks again.
	for try := 0; ; try++ {
		e, err := sv.s.cfg.Store.GetEnvironment(ctx, env)
		if err != nil {
			return nil, err
		}
		release := sv.s.cks.use(e.Checkpoint)
		ck, err := sv.s.cfg.Store.GetCheckpoint(ctx, e.Checkpoint)
		if errdefs.Is(err, errdefs.KindNotFound) && try < 3 {
			release()
			continue
		}
		if err == nil {
			err = allow.check(ck.Grants, ck.Policy)
		}
		if err != nil {
			release()
			return nil, err
		}
		sb, err := sv.fromEnvironment(ctx, e, ck, name)
		release()
		sv.spares.stage(e)
		return sb, err
	}
}

// fromEnvironment is CreateFromEnvironment from e's checkpoint ck, whose
// use the caller holds.
func (sv *Saved) fromEnvironment(ctx context.Context, e *store.Environment, ck *store.Checkpoint, name string) (*store.Sandbox, error) {
	if name != "" {
		if _, err := sv.s.cfg.Store.GetSandbox(ctx, name); err == nil {
			return nil, errdefs.Conflict(client.CodeNameTaken, "a sandbox named %s already exists: pick another name, or remove that sandbox first", name)
		}
	}
	// A warm spare was restored with its id for a hostname, which its
	// kernel keeps (the agent cannot change it: it gave up CAP_SYS_ADMIN):
	// a sandbox whose hostname is its name is restored now, with it.
	if name == "" || !hostnameOK(name) {
		if sp := sv.spares.take(envKey(e.Project, e.Name), ck.ID); sp != nil {
			return sv.restoreFromSpare(ctx, sp, ck, e.Name, name)
		}
	}
	return sv.restore(ctx, ck, RestoreOptions{Name: name, Environment: e.Name})
}

// setupFailed is the error of a setup command that exited code, its argv
// written as a shell would read it back (joined with spaces, "sh -c echo
// oops; exit 2" lost its quoting), then the end of its output.
func setupFailed(env string, argv []string, code int, out string) error {
	return errdefs.New(errdefs.KindFailed, client.CodeSetupFailed, "environment %s: setup command %s exited %d: %s",
		env, shellquote.Join(argv), code, tail(out, 2000))
}
