package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/revert"
	"github.com/useshards/shard/internal/store"
)

// restoreInto starts the record rec (state creating) from checkpoint ck:
// its own copy of the checkpoint's files, and the memory image; into ma,
// a sandbox made ahead whose id and address rec has, if not nil. On error
// the caller destroys rec.
func (sv *Saved) restoreInto(ctx context.Context, ck *store.Checkpoint, rec *store.Sandbox, layers []string, ma *madeAhead) error {
	st, err := sv.s.stageRestore(ctx, ck, rec, layers, ma)
	if err != nil {
		return err
	}
	return sv.s.launchRestore(ctx, ck, st)
}

// stageRestore does everything a restore of ck into rec needs but the
// restore itself: the files, rootfs, netns, and the runtime's sandbox
// waiting for the memory image (a fork does this while its source is still
// frozen, so only the restore is left after the thaw).
// Into ma, a sandbox made ahead that rec took, if not nil
// (stageRestoreAhead).
func (s *Service) stageRestore(ctx context.Context, ck *store.Checkpoint, rec *store.Sandbox, layers []string, ma *madeAhead) (*staged, error) {
	if ma != nil {
		return s.stageRestoreAhead(ctx, ck, rec, layers, ma)
	}
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
	if err := cp.Prepare(ctx, st.inst, s.checkpointDir(ck.ID)); err != nil {
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
	FromNode    string // the node that sent the checkpoint (a fork moved across a cluster)
	// Hooks are the on-fork hooks' options (nil: restoreHooks): a fork
	// moved to another node keeps the ones it was asked with.
	Hooks *HookOptions
	Allow Allow // asked whether the sandbox may carry the checkpoint's grants and policy
}

// Kinds of store.Origin: what a sandbox was made from.
const (
	OriginImage       = "image"
	OriginSnapshot    = "snapshot"
	OriginEnvironment = "environment"
	OriginFork        = "fork"
	OriginCheckpoint  = "checkpoint" // a restore
	OriginSession     = "session"    // a resume
)

// origin is what a sandbox restored from ck with o comes from: the
// environment, session or fork that asked, else the checkpoint itself.
func (o RestoreOptions) origin(ck *store.Checkpoint) *store.Origin {
	switch {
	case o.Environment != "":
		return &store.Origin{Kind: OriginEnvironment, Name: o.Environment, Checkpoint: ck.ID}
	case o.ResumedFrom != "":
		return &store.Origin{Kind: OriginSession, Name: o.ResumedFrom, Checkpoint: ck.ID}
	case o.FromNode != "":
		return &store.Origin{Kind: OriginFork, Name: ck.SandboxName, ID: ck.SandboxID, Checkpoint: ck.ID}
	}
	return &store.Origin{Kind: OriginCheckpoint, Name: ck.Tag, ID: ck.ID}
}

// Restore starts a new sandbox from a checkpoint (restoreSnapshot): the
// checkpoint's memory, processes and files, its bounds, a new id, name,
// address and session, and a clean exec history — nothing is replayed.
func (sv *Saved) Restore(ctx context.Context, ckID string, o RestoreOptions) (_ *store.Sandbox, err error) {
	var prov string
	defer sv.s.observe("restore", time.Now(), &prov, &err)
	if err := validName(o.Name); err != nil {
		return nil, err
	}
	release := sv.s.cks.use(ckID)
	defer release()
	ck, err := sv.s.cfg.Store.GetCheckpoint(ctx, ckID)
	if err != nil {
		return nil, err
	}
	prov = ck.Shape.Provider
	return sv.restore(ctx, ck, o)
}

// restore is Restore of ck, whose use the caller holds.
func (sv *Saved) restore(ctx context.Context, ck *store.Checkpoint, o RestoreOptions) (*store.Sandbox, error) {
	if c, ok := sv.s.caps[ck.Provider]; !ok || !c.Available || !c.Checkpoint {
		return nil, errdefs.Unsupported("provider %s does not support restore on this host", ck.Provider)
	}
	if err := o.Allow.check(ck.Grants, ck.Policy); err != nil {
		return nil, err
	}
	if err := checkInherited("checkpoint "+ck.ID, sv.s.Limits(), ck.MemoryBytes, ck.CPUMillis, ck.Pids); err != nil {
		return nil, err
	}
	if err := sv.s.adm.ledgerRoom(ctx, ck.Project, "restore checkpoint "+ck.ID); err != nil {
		return nil, err
	}
	img, err := sv.s.cfg.Images.Get(ctx, ck.ImageDigest)
	if err != nil {
		return nil, fmt.Errorf("image %s of checkpoint %s: %w", ck.Image, ck.ID, err)
	}
	releaseImage, err := sv.s.useImage(ctx, img)
	if err != nil {
		return nil, err
	}
	rec := fromCheckpoint(ck, o.Name)
	rec.Origin = o.origin(ck)
	taken, endAhead := sv.s.ahead.begin(rec, 1)
	defer endAhead()
	var ma *madeAhead
	if len(taken) > 0 {
		ma = taken[0]
		rec.ID, rec.IP = ma.rec.ID, ma.rec.IP
	}
	recs, err := sv.s.insertRecords(ctx, []*store.Sandbox{rec}, func(r *store.Sandbox) (string, ledger.CreatedData) {
		d := ledger.CreatedOf(r.Shape)
		d.Checkpoint, d.RestoredFrom, d.Environment, d.ResumedFrom, d.FromNode = ck.ID, ck.ID, o.Environment, o.ResumedFrom, o.FromNode
		return "", d
	})
	releaseImage()
	if err != nil {
		if ma != nil {
			sv.s.dropAhead(ma)
		}
		return nil, err
	}
	rec = recs[0]
	bg := context.WithoutCancel(ctx)
	log := sv.s.cfg.Log.With("sandbox", rec.ID, "name", rec.Name)
	r := revert.New()
	defer r.Fail()
	r.Add(func() { sv.s.discard(bg, rec, log) })
	if err := sv.restoreInto(bg, ck, rec, img.Layers, ma); err != nil {
		return nil, fmt.Errorf("restore checkpoint %s: %w", ck.ID, err)
	}
	hooks := restoreHooks
	if o.Hooks != nil {
		hooks = *o.Hooks
	}
	if err := sv.s.announce(bg, rec, proto.RoleFork, forkIdentity(rec, ck.ID), hooks); err != nil {
		return nil, fmt.Errorf("restore checkpoint %s: %w", ck.ID, err)
	}
	out, err := sv.s.move(bg, rec.ID, StateRunning, nil, func(r *store.Sandbox) { r.StartedAt = time.Now().UTC() })
	if err != nil {
		return nil, err
	}
	r.Success()
	log.Info("restored", "checkpoint", ck.ID)
	return out, nil
}

// fromCheckpoint is the record of a new sandbox (named name) started from
// ck: its shape, and the agent, grants and policy that live on in its
// memory and files.
func fromCheckpoint(ck *store.Checkpoint, name string) *store.Sandbox {
	return &store.Sandbox{
		Name: name, Shape: ck.Shape.Clone(), Token: ck.Token, AgentDir: ck.AgentDir, ParentID: ck.SandboxID,
		ParentName: ck.SandboxName, Generation: ck.Generation + 1,
		Grants: copyGrants(ck.Grants), Policy: copyPolicy(ck.Policy),
	}
}
