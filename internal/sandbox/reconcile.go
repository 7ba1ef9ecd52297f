package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

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
	all, err := s.cfg.Store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, sb := range all {
		known[sb.ID] = true
		// The firewall table is made anew at each start: policies first.
		if sb.Policy != nil {
			if err := s.applyPolicy(sb); err != nil {
				s.cfg.Log.Error("reconcile: network policy", "sandbox", sb.ID, "err", err)
			}
		}
		log := s.cfg.Log.With("sandbox", sb.ID, "name", sb.Name)
		switch sb.State {
		case StateCreating, StateRemoving:
			log.Info("reconcile: finishing an interrupted create or remove")
			s.destroy(ctx, sb, log)
		case StateFreezing:
			// The server died mid-fork: thaw the source; the forks (still
			// creating) are finished off above or below. Whether it is
			// paused is told by its agent: a paused sandbox does not answer
			// (and resuming one that is not paused would crash gVisor).
			if cp, ok := s.providers[sb.Provider].(provider.Checkpointer); ok {
				if st, _ := s.providers[sb.Provider].Status(ctx, sb.ID); st != provider.StatusAbsent && !s.answers(ctx, sb, 3*time.Second) {
					cp.Resume(ctx, sb.ID)
				}
			}
			if s.alive(ctx, sb) {
				log.Info("reconcile: thawed a source frozen by an interrupted fork")
				s.cfg.Store.UpdateSandbox(ctx, sb.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
					r.State = StateRunning
					return nil, nil
				})
				continue
			}
			fallthrough
		case StateRunning, StateStarting, StateStopping:
			if sb.State == StateRunning && s.alive(ctx, sb) {
				continue
			}
			log.Warn("reconcile: sandbox is not running any more; marking it stopped", "was", sb.State)
			ooms := s.halt(ctx, sb, false)
			s.cfg.Store.UpdateSandbox(ctx, sb.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
				r.State, r.StoppedAt = StateStopped, time.Now().UTC()
				r.OOMKills += ooms
				if sb.State == StateRunning {
					r.Error = "the sandbox ended while the server was down"
				}
				return &store.EventSpec{Type: "sandbox.stopped", Data: map[string]string{"reason": "reconcile"}}, nil
			})
		case StateStopped, StateFailed:
			s.halt(ctx, sb, false) // leftovers of a crash mid-stop
		}
	}
	// Containers, mounts, namespaces and files nobody owns.
	for _, name := range s.order {
		p := s.providers[name]
		if !s.caps[name].Available {
			continue
		}
		ids, err := p.List(ctx)
		if err != nil {
			s.cfg.Log.Warn("reconcile: list containers", "provider", name, "err", err)
			continue
		}
		for _, id := range ids {
			if !known[id] {
				s.cfg.Log.Info("reconcile: removing an unknown container", "provider", name, "id", id)
				p.Delete(ctx, id)
			}
		}
	}
	if names, err := s.cfg.Net.List(); err == nil {
		for _, n := range names {
			if !known[n] {
				s.cfg.Net.Delete(n)
			}
		}
	}
	if ents, err := os.ReadDir(filepath.Join(s.cfg.DataDir, "run")); err == nil {
		for _, e := range ents {
			if !known[e.Name()] {
				rootfs.Unmount(filepath.Join(s.cfg.DataDir, "run", e.Name(), "rootfs"))
				os.RemoveAll(filepath.Join(s.cfg.DataDir, "run", e.Name()))
			}
		}
	}
	if ids, err := s.cfg.Storage.List(); err == nil {
		for _, id := range ids {
			if !known[id] {
				s.cfg.Storage.Remove(ctx, id)
			}
		}
	}
	s.reconcileSaved(ctx)
	// Every environment gets its warm spare again.
	if envs, err := s.cfg.Store.ListEnvironments(ctx); err == nil {
		for _, e := range envs {
			s.stageSpare(e)
		}
	}
	return nil
}

// reconcileSaved removes checkpoint images and saved files that no record
// owns: what a crash in the middle of a checkpoint or a removal left.
func (s *Service) reconcileSaved(ctx context.Context) {
	owned := map[string]bool{}
	cks, err := s.cfg.Store.ListCheckpoints(ctx, "")
	if err != nil {
		return
	}
	for _, ck := range cks {
		owned[checkpointKey(ck.ID)] = true
	}
	sns, err := s.cfg.Store.ListSnapshots(ctx)
	if err != nil {
		return
	}
	for _, sn := range sns {
		owned[snapshotKey(sn.ID)] = true
	}
	if keys, err := s.cfg.Storage.ListSaved(); err == nil {
		for _, k := range keys {
			if !owned[k] {
				s.cfg.Log.Info("reconcile: removing files no checkpoint or snapshot owns", "key", k)
				s.cfg.Storage.RemoveSaved(k)
			}
		}
	}
	if ents, err := os.ReadDir(filepath.Join(s.cfg.DataDir, "checkpoints")); err == nil {
		for _, e := range ents {
			if !owned[checkpointKey(e.Name())] {
				s.cfg.Log.Info("reconcile: removing a checkpoint image no record owns", "checkpoint", e.Name())
				provider.RemoveImage(s.checkpointDir(e.Name()))
			}
		}
	}
	// Images a restart caught while they were still in RAM: finish the copy
	// to disk (a host restart lost them: those checkpoints go).
	for _, ck := range cks {
		if ip, ok := s.providers[ck.Provider].(provider.ImagePersister); ok {
			go func() {
				bg := context.WithoutCancel(ctx)
				err := ip.Persisted(bg, s.checkpointDir(ck.ID))
				if errors.Is(err, provider.ErrImageLost) {
					// Only a fork's image can be in RAM unacknowledged:
					// the checkpoint goes, the forks made from it stay.
					s.cfg.Log.Error("reconcile: removing a checkpoint whose image was lost", "checkpoint", ck.ID, "err", err)
					s.dropCheckpoint(bg, ck)
				} else if err != nil {
					s.cfg.Log.Error("reconcile: checkpoint image", "checkpoint", ck.ID, "err", err)
				}
			}()
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

func (s *Service) alive(ctx context.Context, sb *store.Sandbox) bool {
	p, ok := s.providers[sb.Provider]
	if !ok || !s.caps[sb.Provider].Available {
		return false
	}
	st, err := p.Status(ctx, sb.ID)
	if err != nil || st != provider.StatusRunning {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return s.agentFor(sb).WaitReady(cctx) == nil
}
