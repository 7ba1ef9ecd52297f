package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/store"
)

// lockSandbox finds a sandbox by id or name and holds its lifecycle lock
// until unlock; the record it returns is read under the lock, so no other
// lifecycle step changed it since.
func (s *Service) lockSandbox(ctx context.Context, idOrName string) (*store.Sandbox, func(), error) {
	sb, err := s.cfg.Store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, nil, err
	}
	unlock, err := s.locks.lockCtx(ctx, sb.ID)
	if err != nil {
		return nil, nil, fmt.Errorf("waiting for sandbox %s's step under way (a fork, a stop): %w", sb.Name, err)
	}
	if sb, err = s.cfg.Store.GetSandbox(ctx, sb.ID); err != nil {
		unlock()
		return nil, nil, err
	}
	return sb, unlock, nil
}

// Get finds a sandbox by id or name, with live figures for a running one.
func (s *Service) Get(ctx context.Context, idOrName string) (*store.Sandbox, error) {
	sb, err := s.cfg.Store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	if sb.State == StateRunning {
		sb.OOMKills += s.oomKills(ctx, sb)
	}
	return sb, nil
}

// List returns every sandbox.
func (s *Service) List(ctx context.Context) ([]*store.Sandbox, error) {
	return s.cfg.Store.ListSandboxes(ctx)
}

// Stop ends a sandbox's processes; its files stay.
func (s *Service) Stop(ctx context.Context, idOrName string) (*store.Sandbox, error) {
	sb, unlock, err := s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb, err = s.move(ctx, sb.ID, StateStopping, nil, nil); err != nil {
		return nil, err
	}
	ooms := s.halt(context.WithoutCancel(ctx), sb, true)
	s.execs.end(sb.ID, "sandbox "+sb.Name+" was stopped while the command ran")
	return s.move(context.WithoutCancel(ctx), sb.ID, StateStopped, &store.EventSpec{Type: ledger.Stopped}, func(r *store.Sandbox) {
		r.StoppedAt = time.Now().UTC()
		r.OOMKills += ooms
		r.Error = ""
	})
}

// Start boots a stopped sandbox again with its files.
func (s *Service) Start(ctx context.Context, idOrName string) (*store.Sandbox, error) {
	sb, unlock, err := s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if c := s.caps[sb.Provider]; !c.Available {
		return nil, errdefs.Unsupported("provider %s is not available on this host: %s", sb.Provider, c.Reason)
	}
	if err := s.adm.ledgerRoom(ctx, sb.Project, "start sandbox "+sb.Name); err != nil {
		return nil, err
	}
	// A start is a fresh boot: it runs this server's agent. Its memory and
	// cpu count from the move to starting.
	var add use
	if !holdsMemory(sb.State) {
		add = use{memory: sb.MemoryBytes, cpu: sb.CPUMillis}
	}
	err = s.adm.admit(ctx, sb, add, "sandbox "+sb.Name, func() (err error) {
		sb, err = s.move(ctx, sb.ID, StateStarting, nil, func(r *store.Sandbox) { r.AgentDir = s.agentDir })
		return err
	})
	if err != nil {
		return nil, err
	}
	bg := context.WithoutCancel(ctx)
	if err := s.boot(bg, sb, nil); err != nil {
		s.move(bg, sb.ID, StateStopped, nil, func(r *store.Sandbox) { r.Error = err.Error() })
		return nil, fmt.Errorf("start sandbox %s: %w", sb.Name, err)
	}
	return s.move(bg, sb.ID, StateRunning, &store.EventSpec{Type: ledger.Started}, func(r *store.Sandbox) {
		r.StartedAt = time.Now().UTC()
		r.Error = ""
	})
}

// Remove deletes a sandbox and its files. A running one needs force.
func (s *Service) Remove(ctx context.Context, idOrName string, force bool) error {
	_, err := s.RemoveWith(ctx, idOrName, RemoveOptions{Force: force})
	return err
}

// RemoveWith deletes a sandbox and its files, and then the fork
// checkpoints that no sandbox needs any more (its own, the one it was made
// from: see retention.go) before it answers. With o.Checkpoints the
// checkpoints of its session go too, or, if another sandbox or an
// environment needs one, nothing is removed (checkpoint_in_use).
func (s *Service) RemoveWith(ctx context.Context, idOrName string, o RemoveOptions) (*RemoveResult, error) {
	sb, cks, err := s.removeLocked(ctx, idOrName, o)
	if err != nil {
		return nil, err
	}
	// Outside the sandbox's lock: a drop waits for the restores reading
	// the checkpoint.
	bg := context.WithoutCancel(ctx)
	res := &RemoveResult{}
	err = s.saved.takeCheckpoints(bg, sb, cks, res)
	ids, freed := s.saved.sweepCheckpoints(bg)
	res.Checkpoints, res.FreedBytes = append(res.Checkpoints, ids...), res.FreedBytes+freed
	if len(ids) > 0 {
		s.cfg.Log.Info("remove: fork checkpoints no sandbox needs removed with it", "sandbox", sb.ID, "checkpoints", ids, "freed_bytes", freed)
	}
	s.saved.kickSpace() // the rows it deleted
	return res, err
}

// removeLocked destroys the sandbox under its lock and returns it, with the
// checkpoints o asks to take with it (checked).
func (s *Service) removeLocked(ctx context.Context, idOrName string, o RemoveOptions) (*store.Sandbox, []*store.Checkpoint, error) {
	sb, unlock, err := s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	if sb.State == StateRunning && !o.Force {
		return nil, nil, errdefs.Conflict(client.CodeSandboxRunning, "sandbox %s is running: stop it first, or remove it with --force", sb.Name)
	}
	var cks []*store.Checkpoint
	if o.Checkpoints {
		if cks, err = s.saved.checkTakeCheckpoints(ctx, sb); err != nil {
			return nil, nil, err
		}
	}
	if sb, err = s.move(ctx, sb.ID, StateRemoving, nil, nil); err != nil {
		return nil, nil, err
	}
	if err := s.destroy(context.WithoutCancel(ctx), sb, s.cfg.Log.With("sandbox", sb.ID)); err != nil {
		return nil, nil, err
	}
	return sb, cks, nil
}
