package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/hostdir"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/store"
)

// A checkpoint is two things on disk: the runtime's memory image under
// DataDir/checkpoints/<id>, and a copy of the files (a reflink) kept by the
// storage under checkpointKey(id).
func checkpointKey(id string) string { return "ck-" + id }

func (s *Service) checkpointDir(id string) string {
	return filepath.Join(s.cfg.DataDir, "checkpoints", id)
}

// Checkpoint saves a running sandbox's memory, processes and files without
// stopping it (the fork machinery, minus the new sandbox) and writes
// sandbox.checkpoint_created to its ledger session. A tag follows
// names.Tag's rule.
func (sv *Saved) Checkpoint(ctx context.Context, idOrName, tag string) (_ *store.Checkpoint, err error) {
	var prov string
	defer sv.s.observe("checkpoint", time.Now(), &prov, &err)
	if err := names.Tag(tag); err != nil {
		return nil, err
	}
	src, cp, unlock, err := sv.s.lockRunning(ctx, idOrName, "checkpoint")
	if err != nil {
		return nil, err
	}
	prov = src.Provider
	defer unlock()
	if err := sv.s.adm.ledgerRoom(ctx, src.Project, "checkpoint sandbox "+src.Name); err != nil {
		return nil, err
	}
	ckID := newID()
	releaseHost, err := sv.s.adm.reserveSaved(ctx, src, sv.s.adm.memoryImageBound(src), sv.s.cfg.Storage.FileUsage(src.ID), "a checkpoint of "+src.Name)
	if err != nil {
		return nil, err
	}
	defer releaseHost()
	res, err := sv.s.adm.reserveCapture(src.ID, checkpointKey(ckID), nil, "a checkpoint of "+src.Name)
	if err != nil {
		return nil, err
	}
	defer res.Release()
	ck, err := sv.s.capture(context.WithoutCancel(ctx), src, cp, ckID, "checkpoint", tag, false, nil)
	if err == nil {
		// The sandbox's resume starts here now: its forks' checkpoints
		// before may be needed by no one.
		sv.kickSpace()
	}
	return ck, err
}

// GetCheckpoint returns one checkpoint.
func (sv *Saved) GetCheckpoint(ctx context.Context, id string) (*store.Checkpoint, error) {
	return sv.s.cfg.Store.GetCheckpoint(ctx, id)
}

// Checkpoints lists the checkpoints taken of a sandbox (by id or name, also
// a removed one's ledger session name); "" lists all.
func (sv *Saved) Checkpoints(ctx context.Context, sandboxOrSession string) ([]*store.Checkpoint, error) {
	if sandboxOrSession == "" {
		return sv.s.cfg.Store.ListCheckpoints(ctx, "")
	}
	session := sandboxOrSession
	if sb, err := sv.s.cfg.Store.GetSandbox(ctx, sandboxOrSession); err == nil {
		session = sb.Session
	} else if _, serr := sv.s.cfg.Store.GetSession(ctx, sandboxOrSession); serr != nil {
		return nil, errdefs.NotFound(client.CodeSandboxNotFound, "no sandbox or ledger session named %s", sandboxOrSession)
	}
	return sv.s.cfg.Store.ListCheckpoints(ctx, session)
}

// RemoveCheckpoint deletes a checkpoint and frees its disk. Sandboxes
// restored from it keep their own files and memory.
func (sv *Saved) RemoveCheckpoint(ctx context.Context, id string) error {
	ck, err := sv.s.cfg.Store.GetCheckpoint(ctx, id)
	if err != nil {
		return err
	}
	envs, err := sv.s.cfg.Store.ListEnvironments(ctx)
	if err != nil {
		return err
	}
	for _, e := range envs {
		if e.Checkpoint == ck.ID {
			return errdefs.Conflict(client.CodeCheckpointInUse, "checkpoint %s is environment %s's: remove the environment instead (shard env rm %s)", ck.ID, e.Name, e.Name)
		}
	}
	return sv.dropCheckpoint(ctx, ck)
}

// dropCheckpoint deletes the record first, then the files, so a crash in
// between leaves orphan files (Reconcile removes them), never a record
// whose files are gone. It waits for the restores reading the checkpoint
// (see ckRefs); the caller must hold no use of it.
func (sv *Saved) dropCheckpoint(ctx context.Context, ck *store.Checkpoint) error {
	done := sv.s.cks.drop(ck.ID)
	defer done()
	return sv.deleteCheckpoint(ctx, ck)
}

// deleteCheckpoint is dropCheckpoint for a caller that holds the drop.
func (sv *Saved) deleteCheckpoint(ctx context.Context, ck *store.Checkpoint) error {
	if err := sv.s.cfg.Store.DeleteCheckpoint(ctx, ck.ID); err != nil {
		return err
	}
	return errors.Join(provider.RemoveImage(sv.s.checkpointDir(ck.ID)), sv.s.cfg.Storage.RemoveSaved(checkpointKey(ck.ID)))
}

// checkpointSize is the bytes a checkpoint takes on the host's disk: its
// memory image and its copy of the files (blocks it shares with the sandbox
// counted too). CheckpointSize is the same for the API and for whatever
// charges checkpoints to a project's quota.
func (sv *Saved) checkpointSize(id string) int64 {
	return hostdir.Blocks(sv.s.checkpointDir(id)) + sv.s.cfg.Storage.SavedUsage(checkpointKey(id))
}

// CheckpointSize is checkpointSize for the API.
func (sv *Saved) CheckpointSize(id string) int64 { return sv.checkpointSize(id) }
