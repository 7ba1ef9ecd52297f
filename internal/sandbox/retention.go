package sandbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

// Retention of fork checkpoints, and giving space back.
//
// A fork goes through a checkpoint of its source (a memory image and a copy
// of the files: 268 MiB at 256 MiB of memory). Once the forks run, they
// hold their own files and memory; what still reads the checkpoint later is
// a resume: of a fork's ledger session (it starts from the checkpoint its
// sandbox was made from) and of the source's (from its latest checkpoint),
// and a restore or diff by its id. So a fork's checkpoint is kept while a
// sandbox (any state) has it as its session's resume point
// (store.ResumeUsers: the source until it checkpoints or forks again, each
// fork and each restore from it until they checkpoint or fork themselves),
// and removed as soon as none has: when the last such sandbox is removed
// (at once, before the remove answers), or when the source moves on (in
// the background, kicked by the fork or checkpoint). The sessions of
// removed sandboxes do not keep it: with the ledger's default retention
// (keep every session) they would keep every fork's checkpoint forever,
// which is what this retention is for. A resume of such a session starts
// from an earlier checkpoint of its own, or answers checkpoint_gone.
//
// Kept as before, until removed by hand: a fork's checkpoint asked with
// --keep-checkpoint (keep_checkpoint), the checkpoints users take (shard
// checkpoint), and environments'. A crash between a remove and its
// checkpoint's removal leaks nothing: the sweep runs at start too.
//
// The database gives back what its deletions free (a removed ledger
// session's events, mostly) in the same background loop: see store.Reclaim.

// kickSpace asks the background loop (ReclaimSpace) for a pass; it never
// blocks, and kicks before a pass runs are one.
func (sv *Saved) kickSpace() {
	select {
	case sv.spaceKick <- struct{}{}:
	default:
	}
}

// ReclaimSpace runs until ctx ends: a pass at start, then one at every kick
// (a fork, a checkpoint, a removed ledger session, the ledger's retention)
// and every reclaimEvery. A pass removes the fork checkpoints no sandbox
// needs, then gives the database's free pages back to the filesystem, in
// steps between which requests go on.
func (sv *Saved) ReclaimSpace(ctx context.Context) {
	t := time.NewTicker(reclaimEvery)
	defer t.Stop()
	for {
		sv.spacePass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-sv.spaceKick:
		case <-t.C:
		}
	}
}

// reclaimEvery bounds how long free pages wait for a kick (a remove of a
// sandbox deletes rows too, without one).
const reclaimEvery = 10 * time.Minute

func (sv *Saved) spacePass(ctx context.Context) {
	ctx = project.Unscoped(ctx, "the space sweep: every project's fork checkpoints")
	if ids, freed := sv.sweepCheckpoints(ctx); len(ids) > 0 {
		sv.s.cfg.Log.Info("fork checkpoints no sandbox needs removed", "checkpoints", ids, "freed_bytes", freed)
	}
	before, _ := sv.s.cfg.Store.Space(ctx)
	if before.FreePages == 0 {
		return
	}
	start := time.Now()
	pages, err := sv.s.cfg.Store.Reclaim(ctx, 0)
	if err != nil && ctx.Err() == nil {
		sv.s.cfg.Log.Warn("database: giving free pages back", "err", err)
	}
	if pages > 0 {
		sv.s.cfg.Log.Info("database: free pages given back", "bytes", pages*before.PageSize, "took", time.Since(start))
	}
}

// sweepCheckpoints removes every fork checkpoint that no sandbox needs (and
// was not asked to be kept), and returns their ids and the bytes freed.
func (sv *Saved) sweepCheckpoints(ctx context.Context) (ids []string, freed int64) {
	sv.retainMu.Lock()
	defer sv.retainMu.Unlock()
	ctx = project.Unscoped(ctx, "the checkpoint sweep: every project's fork checkpoints")
	cks, err := sv.s.cfg.Store.ListCheckpoints(ctx, "")
	if err != nil {
		if ctx.Err() == nil {
			sv.s.cfg.Log.Warn("checkpoint retention: listing checkpoints", "err", err)
		}
		return nil, 0
	}
	for _, ck := range cks {
		if !ck.AutoRemove() {
			continue
		}
		// A first look without the drop, which waits for uses (a fork's
		// image still being written): most checkpoints are needed.
		if users, err := sv.checkpointUsers(ctx, ck.ID, nil); err != nil || len(users) > 0 {
			continue
		}
		n, dropped, err := sv.dropUnneeded(ctx, ck, nil)
		if err != nil {
			sv.s.cfg.Log.Warn("checkpoint retention: removing a checkpoint", "checkpoint", ck.ID, "err", err)
			continue
		}
		if dropped {
			ids, freed = append(ids, ck.ID), freed+n
		}
	}
	return ids, freed
}

// dropUnneeded removes ck if no sandbox but those in but needs it (see
// store.ResumeUsers), and returns the bytes it freed. It decides with the
// checkpoint held against restores (which wait, then find it gone), so a
// sandbox made from it meanwhile is seen.
func (sv *Saved) dropUnneeded(ctx context.Context, ck *store.Checkpoint, but []string) (int64, bool, error) {
	done := sv.s.cks.drop(ck.ID)
	defer done()
	users, err := sv.checkpointUsers(ctx, ck.ID, but)
	if err != nil || len(users) > 0 {
		return 0, false, err
	}
	size := sv.checkpointSize(ck.ID)
	if err := sv.deleteCheckpoint(ctx, ck); err != nil {
		if errdefs.Is(err, errdefs.KindNotFound) {
			return 0, false, nil // removed by hand meanwhile
		}
		return 0, false, err
	}
	return size, true, nil
}

// checkpointUsers names what needs checkpoint id, but the sandboxes in but:
// the sandboxes whose resume starts from it, and an environment made of it.
func (sv *Saved) checkpointUsers(ctx context.Context, id string, but []string) ([]string, error) {
	names, err := sv.s.cfg.Store.ResumeUsers(project.Unscoped(ctx, "a checkpoint's users, of every project"), id)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		if !contains(but, n) {
			out = append(out, "sandbox "+n)
		}
	}
	envs, err := sv.s.cfg.Store.ListEnvironments(project.Unscoped(ctx, "a checkpoint's users: every project's environments"))
	if err != nil {
		return nil, err
	}
	for _, e := range envs {
		if e.Checkpoint == id {
			out = append(out, "environment "+e.Name)
		}
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// CheckpointUsers names what keeps checkpoint id: the sandboxes whose
// resume starts from it and the environment made of it (empty: a fork's
// checkpoint goes at the next sweep, unless kept).
func (sv *Saved) CheckpointUsers(ctx context.Context, id string) ([]string, error) {
	return sv.checkpointUsers(ctx, id, nil)
}

// RemoveOptions says how a sandbox is removed.
type RemoveOptions struct {
	Force bool // a running one too
	// Checkpoints takes the checkpoints of the sandbox's ledger session
	// with it (those it took, its forks', kept ones too), refused if
	// another sandbox or an environment needs one.
	Checkpoints bool
}

// RemoveResult is what a remove freed besides the sandbox.
type RemoveResult struct {
	Checkpoints []string // removed with it: asked for, or needed by no sandbox any more
	FreedBytes  int64    // their bytes
}

// checkTakeCheckpoints refuses a remove with its checkpoints that another
// sandbox or an environment still needs; it returns the checkpoints.
func (sv *Saved) checkTakeCheckpoints(ctx context.Context, sb *store.Sandbox) ([]*store.Checkpoint, error) {
	cks, err := sv.s.cfg.Store.ListCheckpoints(ctx, sb.Session)
	if err != nil {
		return nil, err
	}
	for _, ck := range cks {
		users, err := sv.checkpointUsers(ctx, ck.ID, []string{sb.Name})
		if err != nil {
			return nil, err
		}
		if len(users) > 0 {
			return nil, errdefs.Conflict(client.CodeCheckpointInUse, "checkpoint %s of sandbox %s is still needed by %s (their resume starts from it): remove them first, or remove %s without --checkpoints",
				ck.ID, sb.Name, strings.Join(users, ", "), sb.Name)
		}
	}
	return cks, nil
}

// takeCheckpoints removes cks (checked by checkTakeCheckpoints) once their
// sandbox is gone; one that a sandbox took up meanwhile stays, said so.
func (sv *Saved) takeCheckpoints(ctx context.Context, sb *store.Sandbox, cks []*store.Checkpoint, res *RemoveResult) error {
	var kept []string
	for _, ck := range cks {
		n, dropped, err := sv.dropUnneeded(ctx, ck, nil)
		if err != nil {
			return fmt.Errorf("sandbox %s was removed, its checkpoint %s was not: %w", sb.Name, ck.ID, err)
		}
		if !dropped {
			kept = append(kept, ck.ID)
			continue
		}
		res.Checkpoints, res.FreedBytes = append(res.Checkpoints, ck.ID), res.FreedBytes+n
	}
	if len(kept) > 0 {
		return errdefs.Conflict(client.CodeCheckpointInUse, "sandbox %s was removed; its checkpoints %s were not: a sandbox was made from them meanwhile", sb.Name, strings.Join(kept, ", "))
	}
	return nil
}
