package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
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
func (s *Service) Checkpoint(ctx context.Context, idOrName, tag string) (*store.Checkpoint, error) {
	if err := names.Tag(tag); err != nil {
		return nil, err
	}
	src, cp, unlock, err := s.lockRunning(ctx, idOrName, "checkpoint")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.floor.check("checkpoint sandbox " + src.Name); err != nil {
		return nil, err
	}
	ckID := newID()
	releaseHost, err := s.reserveHostSpace(memoryImageBound(src), "a checkpoint of "+src.Name)
	if err != nil {
		return nil, err
	}
	defer releaseHost()
	res, err := s.reserveCapture(src.ID, checkpointKey(ckID), nil, "a checkpoint of "+src.Name)
	if err != nil {
		return nil, err
	}
	defer res.Release()
	return s.capture(context.WithoutCancel(ctx), src, cp, ckID, "checkpoint", tag, nil)
}

// capture freezes src, saves its files and memory as checkpoint ckID,
// thaws it, and records the checkpoint together with its
// sandbox.checkpoint_created event. On failure nothing of the checkpoint is
// left and src runs on. The caller holds src's lock. thawed, if set, is
// called as soon as src is thawed, while the checkpoint is being recorded (a
// fork stages its sandboxes then).
func (s *Service) capture(ctx context.Context, src *store.Sandbox, cp provider.Checkpointer, ckID, kind, tag string, thawed func()) (*store.Checkpoint, error) {
	dir := s.checkpointDir(ckID)
	drop := func() {
		provider.RemoveImage(dir)
		s.cfg.Storage.RemoveSaved(checkpointKey(ckID))
	}
	if st, ok := cp.(provider.ImageStager); ok {
		if err := st.StageImage(ctx, src.ID, dir); err != nil {
			// Not fatal: the image is written to disk as it comes.
			s.cfg.Log.Warn("checkpoint: staging the image in RAM", "sandbox", src.ID, "err", err)
			provider.RemoveImage(dir)
		}
	}
	frozen, err := s.freeze(ctx, src, cp, ckID, dir, thawed)
	if err != nil {
		drop()
		return nil, err
	}
	// A checkpoint asked for, or an environment's, is on disk when it is
	// acknowledged. A fork's may reach the disk after the fork is answered:
	// the fork restores from RAM meanwhile.
	if ip, ok := cp.(provider.ImagePersister); ok && kind != "fork" {
		if err := ip.Persisted(ctx, dir); err != nil {
			drop()
			return nil, fmt.Errorf("checkpoint of %s: %w", src.Name, err)
		}
	}
	ck := &store.Checkpoint{
		ID: ckID, Kind: kind, Tag: tag, SandboxID: src.ID, SandboxName: src.Name, Session: src.Session,
		Shape: src.Shape.Clone(), Token: src.Token, AgentDir: src.AgentDir,
		Grants: copyGrants(src.Grants), Policy: copyPolicy(src.Policy),
		FreezeMS: frozen.Milliseconds(), CreatedAt: time.Now().UTC(),
	}
	ev := &store.EventSpec{Type: ledger.CheckpointCreated, Data: ledger.CheckpointData{
		Checkpoint: ckID, Tag: tag, Kind: kind, FreezeMS: ck.FreezeMS}}
	if err := s.cfg.Store.AddCheckpoint(ctx, ck, src, ev); err != nil {
		drop()
		return nil, err
	}
	s.cfg.Log.Info("checkpoint", "sandbox", src.ID, "checkpoint", ckID, "kind", kind, "freeze", frozen)
	return ck, nil
}

// restoreInto starts the record rec (state creating) from checkpoint ck:
// its own copy of the checkpoint's files, and the memory image. On error the
// caller destroys rec.
func (s *Service) restoreInto(ctx context.Context, ck *store.Checkpoint, rec *store.Sandbox, layers []string) error {
	st, err := s.stageRestore(ctx, ck, rec, layers)
	if err != nil {
		return err
	}
	return s.launchRestore(ctx, ck, st)
}

// stageRestore does everything a restore of ck into rec needs but the
// restore itself: the files, rootfs, netns, and the runtime's sandbox
// waiting for the memory image (a fork does this while its source is still
// frozen, so only the restore is left after the thaw).
func (s *Service) stageRestore(ctx context.Context, ck *store.Checkpoint, rec *store.Sandbox, layers []string) (*staged, error) {
	cp, ok := s.providers[ck.Provider].(provider.Checkpointer)
	if !ok || !s.caps[ck.Provider].Available {
		return nil, errdefs.Unsupported("provider %s does not support restore on this host", ck.Provider)
	}
	if err := s.cfg.Storage.CreateFrom(checkpointKey(ck.ID), rec.ID); err != nil {
		return nil, err
	}
	st, err := s.stage(ctx, rec, layers)
	if err != nil {
		return nil, err
	}
	if err := cp.Prepare(ctx, st.inst); err != nil {
		st.abort()
		return nil, err
	}
	st.phase(s, "prepared")
	return st, nil
}

func (s *Service) launchRestore(ctx context.Context, ck *store.Checkpoint, st *staged) error {
	return s.launch(ctx, st, func(p provider.Provider, inst *provider.Instance) error {
		return p.(provider.Checkpointer).Restore(ctx, inst, s.checkpointDir(ck.ID))
	})
}

// RestoreOptions name the sandbox a restore makes and what its
// sandbox.created event says it came from.
type RestoreOptions struct {
	Name        string
	Environment string // set by a create from an environment
	ResumedFrom string // set by resume
}

// Restore starts a new sandbox from a checkpoint (restoreSnapshot): the
// checkpoint's memory, processes and files, its bounds, a new id, name,
// address and session, and a clean exec history — nothing is replayed.
func (s *Service) Restore(ctx context.Context, ckID string, o RestoreOptions) (*store.Sandbox, error) {
	if err := validName(o.Name); err != nil {
		return nil, err
	}
	release := s.useCheckpoint(ckID)
	defer release()
	ck, err := s.cfg.Store.GetCheckpoint(ctx, ckID)
	if err != nil {
		return nil, err
	}
	return s.restore(ctx, ck, o)
}

// restore is Restore of ck, whose use the caller holds.
func (s *Service) restore(ctx context.Context, ck *store.Checkpoint, o RestoreOptions) (*store.Sandbox, error) {
	if c, ok := s.caps[ck.Provider]; !ok || !c.Available || !c.Checkpoint {
		return nil, errdefs.Unsupported("provider %s does not support restore on this host", ck.Provider)
	}
	if err := checkInherited("checkpoint "+ck.ID, s.Limits(), ck.MemoryBytes, ck.CPUMillis, ck.Pids); err != nil {
		return nil, err
	}
	if err := s.floor.check("restore checkpoint " + ck.ID); err != nil {
		return nil, err
	}
	img, err := s.cfg.Images.Get(ctx, ck.ImageDigest)
	if err != nil {
		return nil, fmt.Errorf("image %s of checkpoint %s: %w", ck.Image, ck.ID, err)
	}
	recs, err := s.insertRecords(ctx, []*store.Sandbox{fromCheckpoint(ck, o.Name)}, func(r *store.Sandbox) (string, ledger.CreatedData) {
		d := ledger.CreatedOf(r.Shape)
		d.Checkpoint, d.RestoredFrom, d.Environment, d.ResumedFrom = ck.ID, ck.ID, o.Environment, o.ResumedFrom
		return "", d
	})
	if err != nil {
		return nil, err
	}
	rec := recs[0]
	bg := context.WithoutCancel(ctx)
	log := s.cfg.Log.With("sandbox", rec.ID, "name", rec.Name)
	if err := s.restoreInto(bg, ck, rec, img.Layers); err != nil {
		s.destroy(bg, rec, log)
		return nil, fmt.Errorf("restore checkpoint %s: %w", ck.ID, err)
	}
	out, err := s.move(bg, rec.ID, StateRunning, nil, func(r *store.Sandbox) { r.StartedAt = time.Now().UTC() })
	if err != nil {
		s.destroy(bg, rec, log)
		return nil, err
	}
	log.Info("restored", "checkpoint", ck.ID)
	return out, nil
}

// fromCheckpoint is the record of a new sandbox (named name) started from
// ck: its shape, and the agent, grants and policy that live on in its
// memory and files.
func fromCheckpoint(ck *store.Checkpoint, name string) *store.Sandbox {
	return &store.Sandbox{
		Name: name, Shape: ck.Shape.Clone(), Token: ck.Token, AgentDir: ck.AgentDir, ParentID: ck.SandboxID,
		Grants: copyGrants(ck.Grants), Policy: copyPolicy(ck.Policy),
	}
}

// GetCheckpoint returns one checkpoint.
func (s *Service) GetCheckpoint(ctx context.Context, id string) (*store.Checkpoint, error) {
	return s.cfg.Store.GetCheckpoint(ctx, id)
}

// Checkpoints lists the checkpoints taken of a sandbox (by id or name, also
// a removed one's ledger session name); "" lists all.
func (s *Service) Checkpoints(ctx context.Context, sandboxOrSession string) ([]*store.Checkpoint, error) {
	if sandboxOrSession == "" {
		return s.cfg.Store.ListCheckpoints(ctx, "")
	}
	session := sandboxOrSession
	if sb, err := s.cfg.Store.GetSandbox(ctx, sandboxOrSession); err == nil {
		session = sb.Session
	} else if _, serr := s.cfg.Store.GetSession(ctx, sandboxOrSession); serr != nil {
		return nil, errdefs.NotFound("sandbox_not_found", "no sandbox or ledger session named %s", sandboxOrSession)
	}
	return s.cfg.Store.ListCheckpoints(ctx, session)
}

// RemoveCheckpoint deletes a checkpoint and frees its disk. Sandboxes
// restored from it keep their own files and memory.
func (s *Service) RemoveCheckpoint(ctx context.Context, id string) error {
	ck, err := s.cfg.Store.GetCheckpoint(ctx, id)
	if err != nil {
		return err
	}
	envs, err := s.cfg.Store.ListEnvironments(ctx)
	if err != nil {
		return err
	}
	for _, e := range envs {
		if e.Checkpoint == ck.ID {
			return errdefs.Conflict("checkpoint_in_use", "checkpoint %s is environment %s's: remove the environment instead (shard env rm %s)", ck.ID, e.Name, e.Name)
		}
	}
	return s.dropCheckpoint(ctx, ck)
}

// dropCheckpoint deletes the record first, then the files, so a crash in
// between leaves orphan files (Reconcile removes them), never a record
// whose files are gone. It waits for the restores reading the checkpoint
// (see useCheckpoint); the caller must hold no use of it.
func (s *Service) dropCheckpoint(ctx context.Context, ck *store.Checkpoint) error {
	done := s.holdCheckpoint(ck.ID, true)
	defer done()
	if err := s.cfg.Store.DeleteCheckpoint(ctx, ck.ID); err != nil {
		return err
	}
	return errors.Join(provider.RemoveImage(s.checkpointDir(ck.ID)), s.cfg.Storage.RemoveSaved(checkpointKey(ck.ID)))
}

// A ckUse keeps a checkpoint's files while restores read them. A restore
// looks the record up and reads the files and the memory image for a few
// hundred milliseconds after; an environment's rebuild, or an rm, that
// dropped the checkpoint meanwhile made it fail with a missing file.
type ckUse struct {
	mu   sync.RWMutex // read: restores of the checkpoint; write: its drop
	refs int          // holders and waiters; guarded by Service.locksMu
}

// useCheckpoint holds checkpoint id against dropCheckpoint until release is
// called: look the record up after this, so it is either gone already or
// stays until release.
func (s *Service) useCheckpoint(id string) (release func()) {
	return s.holdCheckpoint(id, false)
}

func (s *Service) holdCheckpoint(id string, drop bool) func() {
	s.locksMu.Lock()
	u := s.ckUses[id]
	if u == nil {
		u = &ckUse{}
		s.ckUses[id] = u
	}
	u.refs++
	s.locksMu.Unlock()
	lock, unlock := u.mu.RLock, u.mu.RUnlock
	if drop {
		lock, unlock = u.mu.Lock, u.mu.Unlock
	}
	lock()
	var once sync.Once
	return func() {
		once.Do(func() {
			unlock()
			s.locksMu.Lock()
			if u.refs--; u.refs == 0 {
				delete(s.ckUses, id)
			}
			s.locksMu.Unlock()
		})
	}
}

// checkpointSize is the bytes a checkpoint takes: its memory image and its
// copy of the files (blocks it shares with the sandbox counted too).
func (s *Service) checkpointSize(id string) int64 {
	return treeBlocks(s.checkpointDir(id)) + s.cfg.Storage.SavedUsage(checkpointKey(id))
}

// CheckpointSize is checkpointSize for the API.
func (s *Service) CheckpointSize(id string) int64 { return s.checkpointSize(id) }
