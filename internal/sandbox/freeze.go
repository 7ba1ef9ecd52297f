package sandbox

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/store"
)

// lockRunning finds a running sandbox whose provider can checkpoint it, and
// holds its lifecycle lock (one fork, checkpoint, stop or remove at a time)
// until unlock. verb names what the caller wants in the errors.
func (s *Service) lockRunning(ctx context.Context, idOrName, verb string) (*store.Sandbox, provider.Checkpointer, func(), error) {
	src, unlock, err := s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, nil, nil, err
	}
	switch src.State {
	case StateRunning:
	case StateStopped, StateFailed:
		unlock()
		if verb == "fork" {
			return nil, nil, nil, errdefs.Conflict(client.CodeSandboxNotRunning, "sandbox %s is stopped: fork takes a running sandbox", src.Name)
		}
		return nil, nil, nil, errdefs.Conflict(client.CodeSandboxNotRunning, "sandbox %s is stopped: %s takes a running sandbox (to keep a stopped sandbox's files, take a snapshot)", src.Name, verb)
	default:
		unlock()
		return nil, nil, nil, errdefs.Conflict(client.CodeSandboxBusy, "sandbox %s is %s: try again when that is done", src.Name, src.State)
	}
	cp, ok := s.providers[src.Provider].(provider.Checkpointer)
	c := s.caps[src.Provider]
	if can := c.Checkpoint; verb == "fork" {
		ok = ok && c.Fork
	} else {
		ok = ok && can
	}
	if !ok || !c.Available {
		unlock()
		return nil, nil, nil, errdefs.Unsupported("provider %s does not support %s on this host", src.Provider, verb)
	}
	return src, cp, unlock, nil
}

// freeze pauses the source, writes its memory image to ckDir, saves a copy
// of its files under the checkpoint's key, and thaws it, all within the
// freeze timeout; then it calls thawed. It returns how long the source was frozen.
// The source is thawed whatever happens.
func (s *Service) freeze(ctx context.Context, src *store.Sandbox, cp provider.Checkpointer, ckID, ckDir string, thawed func()) (time.Duration, error) {
	if _, err := s.move(ctx, src.ID, StateFreezing, nil, nil); err != nil {
		return 0, err
	}
	fctx, cancel := context.WithTimeout(ctx, s.cfg.FreezeTimeout)
	defer cancel()
	start := time.Now()
	var tPause, tCheckpoint, tFiles time.Duration
	paused := false
	err := func() error {
		if err := os.MkdirAll(ckDir, 0o700); err != nil {
			return err
		}
		// The pause gets its own deadline, not the freeze's: a pause cut
		// short may still have paused the Sentry, and then nobody would
		// know to thaw it. A pause that outlasts the freeze limit fails
		// the freeze below, and is thawed.
		pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err := cp.Pause(pctx, src.ID)
		pcancel()
		if err != nil {
			// The call may have paused it and lost the answer: a paused
			// sandbox's agent does not answer, and then it is thawed below.
			paused = !s.answers(context.WithoutCancel(ctx), src, 2*time.Second)
			return err
		}
		paused = true
		if fctx.Err() != nil {
			return fctx.Err()
		}
		tPause = time.Since(start)
		// While the source is paused its files and memory hold still.
		// Memory first: gVisor's save flushes file data cached in the
		// Sentry to the host, and the copy of the files must have it.
		if err := cp.Checkpoint(fctx, src.ID, ckDir); err != nil {
			return err
		}
		tCheckpoint = time.Since(start)
		if err := s.cfg.Storage.Save(src.ID, checkpointKey(ckID)); err != nil {
			return err
		}
		tFiles = time.Since(start)
		return nil
	}()
	defer func() {
		s.cfg.Log.Debug("fork: freeze phases", "source", src.ID, "paused", tPause, "checkpoint", tCheckpoint, "files", tFiles, "thawed", time.Since(start))
	}()
	// The deadline, not only fctx.Err(): a call cut by its connection's
	// deadline can return a moment before the context's timer fires.
	if dl, _ := fctx.Deadline(); fctx.Err() != nil || (err != nil && !time.Now().Before(dl)) {
		err = errdefs.New(errdefs.KindTimeout, client.CodeFreezeTimeout, "the freeze of sandbox %s lasted %s, the limit: the fork failed and %s thawed", src.Name, s.cfg.FreezeTimeout, src.Name)
	}
	// Thaw whatever happened after the pause (a fresh context: the freeze's
	// may be over). Only then: gVisor panics on a resume without a pause.
	var rerr error
	if paused {
		rerr = cp.Resume(context.WithoutCancel(ctx), src.ID)
	}
	frozen := time.Since(start)
	s.cfg.Metrics.Freeze(frozen)
	if _, merr := s.move(context.WithoutCancel(ctx), src.ID, StateRunning, nil, nil); merr != nil && err == nil {
		err = merr
	}
	if err != nil {
		return frozen, err
	}
	if rerr != nil {
		return frozen, fmt.Errorf("thaw %s: %w", src.Name, rerr)
	}
	// Only now: whatever thawed starts must not hold up the thaw.
	if thawed != nil {
		thawed()
	}
	return frozen, nil
}

// capture freezes src, saves its files and memory as checkpoint ckID,
// thaws it, and records the checkpoint together with its
// sandbox.checkpoint_created event. On failure nothing of the checkpoint is
// left and src runs on. The caller holds src's lock. thawed, if set, is
// called as soon as src is thawed, while the checkpoint is being recorded (a
// fork stages its sandboxes then).
func (s *Service) capture(ctx context.Context, src *store.Sandbox, cp provider.Checkpointer, ckID, kind, tag string, keep bool, thawed func()) (*store.Checkpoint, error) {
	dir := s.checkpointDir(ckID)
	drop := func() {
		provider.RemoveImage(dir)
		s.cfg.Storage.RemoveSaved(checkpointKey(ckID))
	}
	if st, ok := cp.(provider.ImageStager); ok {
		start := time.Now()
		err := st.StageImage(ctx, src.ID, dir)
		s.cfg.Log.Debug("checkpoint: image staged", "sandbox", src.ID, "took", time.Since(start))
		if err != nil {
			// Not fatal: the image is written to disk as it comes.
			s.cfg.Log.Warn("checkpoint: staging the image in RAM", "sandbox", src.ID, "err", err)
			provider.RemoveImage(dir)
		}
	}
	frozen, err := s.freeze(ctx, src, cp, ckID, dir, thawed)
	var mem, memNote string
	if d, ok := cp.(provider.ImageDescriber); ok {
		mem, memNote = d.MemoryPath(dir)
	}
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
		FreezeMS: frozen.Milliseconds(), Memory: mem, MemoryNote: memNote, CreatedAt: time.Now().UTC(),
		Generation: src.Generation, Keep: keep,
	}
	ev := &store.EventSpec{Type: ledger.CheckpointCreated, Data: ledger.CheckpointData{
		Checkpoint: ckID, Tag: tag, Kind: kind, FreezeMS: ck.FreezeMS, Memory: mem, MemoryNote: memNote}}
	if err := s.cfg.Store.AddCheckpoint(ctx, ck, src, ev); err != nil {
		drop()
		return nil, err
	}
	s.cfg.Log.Info("checkpoint", "sandbox", src.ID, "checkpoint", ckID, "kind", kind, "freeze", frozen, "memory", mem, "memory_note", memNote)
	return ck, nil
}
