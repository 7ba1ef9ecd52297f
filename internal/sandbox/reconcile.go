package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/rootfs"
	"github.com/useshards/shard/internal/store"
)

// Reconcile makes the record and the host agree after a start of the server,
// also after a kill -9: running sandboxes that still run are kept (they never
// depended on the server process), ones that died are marked stopped with
// their files kept, half-made or half-removed ones are finished off, and
// leftovers nobody owns (containers, mounts, namespaces, files) go.
func (s *Service) Reconcile(ctx context.Context) error {
	ctx = project.Unscoped(ctx, "reconcile: every project's records and the host")
	all, err := s.cfg.Store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	rc := reconciler{s}
	rc.dropViews()
	known := map[string]bool{}
	for _, sb := range all {
		known[sb.ID] = true
		rc.reconcileOne(ctx, sb)
	}
	rc.removeUnknown(ctx, known)
	rc.reconcileSaved(ctx)
	// Every environment gets its warm spare again.
	if envs, err := s.cfg.Store.ListEnvironments(ctx); err == nil {
		for _, e := range envs {
			s.saved.spares.stage(e)
		}
	}
	return nil
}

// reconciler is Reconcile's steps, over the service whose records and host
// it makes agree.
type reconciler struct{ s *Service }

// reconcileOne makes sb's record and its instance agree, by its state.
func (rc *reconciler) reconcileOne(ctx context.Context, sb *store.Sandbox) {
	log := rc.s.cfg.Log.With("sandbox", sb.ID, "name", sb.Name)
	switch sb.State {
	case StateCreating:
		log.Info("reconcile: undoing an interrupted create")
		rc.s.discard(ctx, sb, log)
	case StateRemoving:
		log.Info("reconcile: finishing an interrupted remove")
		rc.s.destroy(ctx, sb, log)
	case StateFreezing:
		// The server died mid-fork: thaw the source; the forks (still
		// creating) are finished off as interrupted creates.
		rc.thawInterrupted(ctx, sb, log)
		if alive, _ := rc.alive(ctx, sb); alive {
			log.Info("reconcile: thawed a source frozen by an interrupted fork")
			rc.s.cfg.Store.UpdateSandbox(ctx, sb.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
				r.State = StateRunning
				return nil, nil
			})
			return
		}
		rc.markStopped(ctx, sb, log)
	case StateRunning:
		alive, err := rc.alive(ctx, sb)
		if err != nil {
			// Not knowing is no reason to kill: the watcher looks again.
			log.Warn("reconcile: cannot tell whether the sandbox runs; left as it is", "err", err)
			return
		}
		if !alive {
			rc.markStopped(ctx, sb, log)
		}
	case StateStarting, StateStopping:
		rc.markStopped(ctx, sb, log)
	case StateStopped, StateFailed:
		rc.s.halt(ctx, sb, false) // leftovers of a crash mid-stop
	}
}

// markStopped takes down what is left of a sandbox that no longer runs and
// records it stopped, with its files kept.
func (rc *reconciler) markStopped(ctx context.Context, sb *store.Sandbox, log *slog.Logger) {
	log.Warn("reconcile: sandbox is not running any more; marking it stopped", "was", sb.State)
	ooms := rc.s.halt(ctx, sb, false)
	rc.s.cfg.Store.UpdateSandbox(ctx, sb.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
		r.State, r.StoppedAt = StateStopped, time.Now().UTC()
		r.OOMKills += ooms
		if sb.State == StateRunning {
			r.Error = "the sandbox ended while the server was down"
		}
		return &store.EventSpec{Type: ledger.Stopped, Data: ledger.EndedData{Reason: "reconcile"}}, nil
	})
}

// removeUnknown removes the containers, network namespaces, run
// directories and files that no record owns (known holds the records' ids).
func (rc *reconciler) removeUnknown(ctx context.Context, known map[string]bool) {
	for _, name := range rc.s.order {
		p := rc.s.providers[name]
		if !rc.s.caps[name].Available {
			continue
		}
		c, cancel := context.WithTimeout(ctx, runtimeCallTimeout)
		ids, err := p.List(c)
		cancel()
		if err != nil {
			rc.s.cfg.Log.Warn("reconcile: list containers", "provider", name, "err", err)
			continue
		}
		for _, id := range ids {
			if !known[id] {
				rc.s.cfg.Log.Info("reconcile: removing an unknown container", "provider", name, "id", id)
				p.Delete(ctx, id)
			}
		}
	}
	if names, err := rc.s.cfg.Net.List(); err == nil {
		for _, n := range names {
			if !known[n] {
				rc.s.cfg.Net.Delete(n)
			}
		}
	}
	if ents, err := os.ReadDir(filepath.Join(rc.s.cfg.DataDir, "run")); err == nil {
		for _, e := range ents {
			if !known[e.Name()] {
				rootfs.Unmount(filepath.Join(rc.s.cfg.DataDir, "run", e.Name(), "rootfs"))
				os.RemoveAll(filepath.Join(rc.s.cfg.DataDir, "run", e.Name()))
			}
		}
	}
	if ids, err := rc.s.cfg.Storage.List(); err == nil {
		for _, id := range ids {
			if !known[id] {
				rc.s.cfg.Storage.Remove(ctx, id)
			}
		}
	}
}

// reconcileSaved removes checkpoint images and saved files that no record
// owns: what a crash in the middle of a checkpoint or a removal left.
func (rc *reconciler) reconcileSaved(ctx context.Context) {
	owned := map[string]bool{}
	cks, err := rc.s.cfg.Store.ListCheckpoints(ctx, "")
	if err != nil {
		return
	}
	for _, ck := range cks {
		owned[checkpointKey(ck.ID)] = true
	}
	sns, err := rc.s.cfg.Store.ListSnapshots(ctx)
	if err != nil {
		return
	}
	for _, sn := range sns {
		owned[snapshotKey(sn.ID)] = true
	}
	if keys, err := rc.s.cfg.Storage.ListSaved(); err == nil {
		for _, k := range keys {
			if !owned[k] {
				rc.s.cfg.Log.Info("reconcile: removing files no checkpoint or snapshot owns", "key", k)
				rc.s.cfg.Storage.RemoveSaved(k)
			}
		}
	}
	if ents, err := os.ReadDir(filepath.Join(rc.s.cfg.DataDir, "checkpoints")); err == nil {
		for _, e := range ents {
			if !owned[checkpointKey(e.Name())] {
				rc.s.cfg.Log.Info("reconcile: removing a checkpoint image no record owns", "checkpoint", e.Name())
				provider.RemoveImage(rc.s.checkpointDir(e.Name()))
			}
		}
	}
	// Images a restart caught while they were still in RAM: finish the copy
	// to disk (a host restart lost them: those checkpoints go).
	for _, ck := range cks {
		if ip, ok := rc.s.providers[ck.Provider].(provider.ImagePersister); ok {
			rc.s.life.goBG(func() {
				bg := context.WithoutCancel(ctx)
				err := ip.Persisted(bg, rc.s.checkpointDir(ck.ID))
				if errors.Is(err, provider.ErrImageLost) {
					// Only a fork's image can be in RAM unacknowledged:
					// the checkpoint goes, the forks made from it stay.
					rc.s.cfg.Log.Error("reconcile: removing a checkpoint whose image was lost", "checkpoint", ck.ID, "err", err)
					rc.s.saved.dropCheckpoint(bg, ck)
				} else if err != nil {
					rc.s.cfg.Log.Error("reconcile: checkpoint image", "checkpoint", ck.ID, "err", err)
				}
			})
		}
	}
}

// thawInterrupted resumes a sandbox that a fork or checkpoint paused before
// the server died. Whether it is paused is what the provider wrote down; a
// pause whose answer never came is settled by the agent, which a paused
// sandbox cannot run (resuming one that is not paused would crash gVisor,
// so a slow agent gets a long while).
func (rc *reconciler) thawInterrupted(ctx context.Context, sb *store.Sandbox, log *slog.Logger) {
	p := rc.s.providers[sb.Provider]
	cp, ok := p.(provider.Checkpointer)
	if !ok {
		return
	}
	c, cancel := context.WithTimeout(ctx, runtimeCallTimeout)
	st, _ := p.Status(c, sb.ID)
	cancel()
	if st == provider.StatusAbsent || st == provider.StatusStopped {
		return
	}
	paused, sure := false, false
	if pt, ok := p.(provider.PauseTracker); ok {
		paused, sure = pt.Paused(sb.ID)
	}
	if !sure {
		paused = !rc.s.answers(ctx, sb, 20*time.Second)
	}
	if paused {
		if err := cp.Resume(ctx, sb.ID); err != nil {
			log.Error("reconcile: thaw a sandbox an interrupted fork froze", "err", err)
		}
	}
}

// answers reports whether the sandbox's agent answers a ping within d.
func (s *Service) answers(ctx context.Context, sb *store.Sandbox, d time.Duration) bool {
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := s.agentFor(sb).Call(cctx, "ping")
	return err == nil
}

// alive reports whether the runtime still runs the sandbox: its word alone
// decides, never a timeout on the agent, so a sandbox that is merely slow
// (starved of CPU, or swapping) is never taken for dead and killed.
func (rc *reconciler) alive(ctx context.Context, sb *store.Sandbox) (bool, error) {
	p, ok := rc.s.providers[sb.Provider]
	if !ok || !rc.s.caps[sb.Provider].Available {
		return false, nil
	}
	// Bounded: runsc asks the Sentry, and a sandbox starved of CPU would
	// hold the whole server's start.
	c, cancel := context.WithTimeout(ctx, runtimeCallTimeout)
	defer cancel()
	st, err := p.Status(c, sb.ID)
	if err != nil {
		return false, err
	}
	return st == provider.StatusRunning || st == provider.StatusPaused, nil
}

// dropViews unmounts what a server that went down left of its file
// operations and diffs: a stopped sandbox's files mounted for a copy (which
// would keep its start from mounting them), and diffs' private copies.
func (rc *reconciler) dropViews() {
	run := filepath.Join(rc.s.cfg.DataDir, "run")
	for _, m := range rootfs.MountsUnder(run) {
		rel, _ := filepath.Rel(run, m)
		parts := strings.Split(rel, string(filepath.Separator))
		if strings.HasPrefix(parts[0], "diff-") || (len(parts) == 2 && parts[1] == "files") {
			if err := rootfs.Unmount(m); err != nil {
				rc.s.cfg.Log.Warn("reconcile: unmount", "at", m, "err", err)
				continue
			}
			rc.s.cfg.Log.Info("reconcile: unmounted what a file operation or diff left", "at", m)
		}
	}
	if ds, _ := filepath.Glob(filepath.Join(run, "diff-*")); len(ds) > 0 {
		for _, d := range ds {
			if len(rootfs.MountsUnder(d)) == 0 {
				os.RemoveAll(d)
			}
		}
	}
}
