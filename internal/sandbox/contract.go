package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/useshards/shard/internal/agent/host"

	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/store"
)

// The fork contract: a sandbox made from a checkpoint (a fork, a restore,
// a create from an environment, a resume) is told so before anyone gets
// it. Its agent gives it a new /etc/machine-id (if the image has one) and
// a new /run/shard/fork, then runs its on-fork hooks (/etc/shard/on-fork.d)
// so programs can reseed what a fork shares with its source (a userspace
// random generator, a client id, a lease). The runtime already gave it its
// own host name, address and kernel random pool.

// DefaultHookTimeout bounds each on-fork hook.
const DefaultHookTimeout = 30 * time.Second

// MaxHookTimeout bounds what a request may ask for.
const MaxHookTimeout = 10 * time.Minute

// HookOptions say how on-fork hooks run for a fork.
type HookOptions struct {
	Timeout  time.Duration // each hook's; 0: DefaultHookTimeout
	Ignore   bool          // a failing hook is recorded, and the fork kept
	InSource bool          // the source runs its hooks too (role source), after the forks'
}

// restoreHooks are the hook options of a restore, a create from an
// environment and a resume: a failing hook is recorded in the sandbox's
// ledger and the sandbox made (they have no option to say otherwise, and a
// checkpoint whose hooks fail must stay restorable).
var restoreHooks = HookOptions{Ignore: true}

// bootIdentity is what a sandbox's agent writes to /run/shard/fork when it
// boots.
func bootIdentity(sb *store.Sandbox) proto.Identity {
	return proto.Identity{ID: sb.ID, Name: sb.Name, ParentID: sb.ParentID, ParentName: sb.ParentName, Generation: sb.Generation}
}

// announce tells sb, just made from checkpoint ckID, that it is a fork
// (role fork), or tells the source of forks (role source, sb the source,
// id the first fork's identity) to run its hooks. Each hook's run goes to
// sb's ledger; a failed one is a fork_hook_failed error unless o.Ignore.
func (s *Service) announce(ctx context.Context, sb *store.Sandbox, role string, id proto.Identity, o HookOptions) error {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultHookTimeout
	}
	req := proto.Request{Op: proto.OpForked, Forked: &proto.Forked{
		Role: role, Identity: id, Hooks: true, HookTimeoutMS: timeout.Milliseconds(), KeepGoing: o.Ignore}}
	// Each hook may take its whole timeout; past that the sandbox is not
	// answering.
	cctx, cancel := context.WithTimeout(ctx, proto.MaxHooks*timeout+30*time.Second)
	defer cancel()
	r, err := s.agentFor(sb).Do(cctx, req)
	if err != nil {
		if errors.Is(err, host.ErrUnsupported) {
			// An agent from before the contract (a sandbox started by an
			// older shard, and its forks): it keeps its source's identity.
			s.cfg.Log.Warn("fork contract: the sandbox's agent is older and cannot take it", "sandbox", sb.ID)
			return nil
		}
		return errdefs.Upstream(client.CodeSandboxUnreachable, "sandbox %s did not take its fork identity: %v", sb.Name, err)
	}
	if r.Error != "" {
		s.cfg.Log.Warn("fork contract: the sandbox's identity files", "sandbox", sb.ID, "err", r.Error)
	}
	var failed *proto.HookResult
	for i, h := range r.Hooks {
		s.fileHookEvent(ctx, sb, role, h)
		if h.Failed() && failed == nil {
			failed = &r.Hooks[i]
		}
	}
	if failed == nil || o.Ignore {
		return nil
	}
	why := fmt.Sprintf("exit code %d", failed.ExitCode)
	switch {
	case failed.TimedOut:
		why = "it ran past its timeout of " + timeout.String()
	case failed.Error != "":
		why = failed.Error
	case failed.Signal != 0:
		why = fmt.Sprintf("killed by signal %d", failed.Signal)
	}
	out := strings.TrimSpace(failed.Output)
	if out != "" {
		out = ": " + tail(out, 300)
	}
	where := "fork " + sb.Name
	if role == proto.RoleSource {
		where = "the source " + sb.Name
	}
	return errdefs.New(errdefs.KindFailed, client.CodeForkHookFailed,
		"on-fork hook %s failed in %s (%s)%s; the fork was not made (--hook-errors=ignore keeps forks whose hooks fail)",
		failed.Hook, where, why, out)
}

// fileHookEvent puts a hook's run in sb's ledger.
func (s *Service) fileHookEvent(ctx context.Context, sb *store.Sandbox, role string, h proto.HookResult) {
	d := ledger.ForkHookData{Hook: h.Hook, Role: role, ExitCode: h.ExitCode, Signal: h.Signal, TimedOut: h.TimedOut,
		Error: h.Error, DurationMS: h.DurationMS, Output: h.Output}
	if err := s.cfg.Store.AddEvent(context.WithoutCancel(ctx), sb, &store.EventSpec{Type: ledger.ForkHook, Data: d}); err != nil {
		s.cfg.Log.Warn("ledger: fork hook", "sandbox", sb.ID, "err", err)
	}
}

// forkIdentity is the identity of fk, made from checkpoint ckID.
func forkIdentity(fk *store.Sandbox, ckID string) proto.Identity {
	id := bootIdentity(fk)
	id.Checkpoint, id.ForkedAt = ckID, time.Now().UTC()
	return id
}
