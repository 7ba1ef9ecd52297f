package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/revert"
	"github.com/useshards/shard/internal/store"
)

// FrozenMessage ends the error of an exec refused during a fork's freeze
// (seed 001, word for word).
const FrozenMessage = "a fork holds the sandbox frozen, and nothing starts in it until that ends: run the command again"

// DefaultFreezeTimeout is how long a fork may hold its source frozen before
// it gives up and thaws the source (seed 001: 10 minutes on gvisor).
const DefaultFreezeTimeout = 10 * time.Minute

// ForkRequest asks for Count forks (default 1) of a running sandbox from one
// freeze. With Count > 1, Name is a prefix: NAME-1 ... NAME-N.
type ForkRequest struct {
	Name  string
	Count int
	Tag   string // stored with the checkpoint event in the source's ledger
	// KeepCheckpoint keeps the fork's checkpoint until it is removed by
	// hand; without it, it goes once no sandbox needs it (see retention.go).
	KeepCheckpoint bool
	Hooks          HookOptions
	// Allow, if set, is asked (under the source's lock) whether the forks
	// may carry the source's secret grants and network policy: the API
	// checks the caller's scopes there. See Allow.
	Allow Allow
}

// Allow says whether a new sandbox may carry secret grants (grants) and a
// network policy (policy) that it inherits; an error refuses it. Fork,
// Restore, CreateFromEnvironment and Resume ask it where what is carried is
// known for sure: under the lock of the sandbox, or with the checkpoint
// held.
type Allow func(grants, policy bool) error

// check asks a whether grants and policy may be carried; a nil Allow
// allows all (the service's own callers: resume's replay, tests).
func (a Allow) check(grants []store.Grant, policy *store.Policy) error {
	if a == nil {
		return nil
	}
	return a(len(grants) > 0, policy != nil)
}

// MaxForkCount bounds --count.
const MaxForkCount = 64

// Fork copies a running sandbox: its files, its memory and its processes,
// continuing where they were, into new sandboxes with their own id, name
// and address. It is a checkpoint of the source (kept, and listed with its
// checkpoints) and a restore of that checkpoint per fork. The source is
// frozen only while its memory and files are captured, then carries on. On
// any failure the source runs on and no fork is left behind.
//
// The phases, in order: records for the forks (their names are taken before
// the source is touched), the freeze (a checkpoint; the forks are staged as
// soon as the source thaws), the restores, and the forks' move to running.
func (s *Service) Fork(ctx context.Context, idOrName string, req ForkRequest) (_ []*store.Sandbox, err error) {
	var prov string
	defer s.observe("fork", time.Now(), &prov, &err)
	names, err := forkNames(req)
	if err != nil {
		return nil, err
	}
	tl := newTimeline()
	src, cp, unlock, err := s.lockRunning(ctx, idOrName, "fork")
	if err != nil {
		return nil, err
	}
	defer unlock()
	prov = src.Provider
	if err := req.Allow.check(src.Grants, src.Policy); err != nil {
		return nil, err
	}
	tl.mark("locked")
	f, err := s.newFork(ctx, src, cp, len(names))
	if err != nil {
		return nil, err
	}
	f.keep = req.KeepCheckpoint
	defer f.releaseCheckpoint()
	releaseHost, err := s.adm.reserveSaved(ctx, src, s.adm.memoryImageBound(src), s.cfg.Storage.FileUsage(src.ID), "the checkpoint of a fork of "+src.Name)
	if err != nil {
		return nil, err
	}
	defer releaseHost() // the image is on the disk (or gone) by the end
	r := revert.New()
	defer r.Fail()
	tl.mark("checked")
	taken, endAhead := s.ahead.begin(src, len(names))
	defer endAhead()
	if err := f.insertRecords(names, taken, r); err != nil {
		for _, ma := range taken {
			s.dropAhead(ma)
		}
		return nil, err
	}
	tl.mark("records")
	res, err := s.adm.reserveCapture(src.ID, checkpointKey(f.ckID), f.ids(), fmt.Sprintf("%d fork(s) of %s", len(f.forks), src.Name))
	if err != nil {
		return nil, err
	}
	defer res.Release()
	if err := f.freeze(req.Tag, r); err != nil {
		return nil, fmt.Errorf("fork of %s: %w", src.Name, err)
	}
	tl.mark("staged")
	if err := f.restore(); err != nil {
		return nil, fmt.Errorf("fork of %s: %w", src.Name, err)
	}
	tl.mark("restored")
	if err := f.announce(req.Hooks); err != nil {
		return nil, fmt.Errorf("fork of %s: %w", src.Name, err)
	}
	tl.mark("announced")
	out, err := f.running()
	if err != nil {
		return nil, fmt.Errorf("fork of %s: %w", src.Name, err)
	}
	tl.mark("running")
	f.log.Debug("fork: timeline", tl.attrs()...)
	frozen := time.Duration(f.ck.FreezeMS) * time.Millisecond
	s.cfg.Metrics.ForkPhase("freeze", frozen)
	s.cfg.Metrics.ForkPhase("staging", tl.at("staged")-tl.at("records")-frozen)
	s.cfg.Metrics.ForkPhase("restore", tl.at("restored")-tl.at("staged"))
	s.cfg.Metrics.ForkPhase("first_exec", tl.at("running")-tl.at("restored"))
	r.Success()
	f.persist()
	f.tellSource(out, req.Tag)
	// The source's resume now starts from this checkpoint: an earlier one
	// of its forks may be needed by no one any more.
	s.saved.kickSpace()
	return out, nil
}

// forkNames checks a fork request and returns the forks' names ("" each
// when the request names none: the id becomes the name).
func forkNames(req ForkRequest) ([]string, error) {
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Count < 1 || req.Count > MaxForkCount {
		return nil, errdefs.Invalid("count must be between 1 and %d", MaxForkCount)
	}
	if err := names.Tag(req.Tag); err != nil {
		return nil, err
	}
	out := make([]string, req.Count)
	if req.Name != "" {
		for i := range out {
			out[i] = req.Name
			if req.Count > 1 {
				out[i] = fmt.Sprintf("%s-%d", req.Name, i+1)
			}
			if err := validName(out[i]); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// forkOp is one fork request under way: what its phases share.
type forkOp struct {
	s    *Service
	ctx  context.Context // without cancel: once begun, a fork ends in success or a full undo
	src  *store.Sandbox  // its lock is held
	cp   provider.Checkpointer
	img  *image.Image
	log  *slog.Logger
	ckID string
	keep bool // the checkpoint is kept (ForkRequest.KeepCheckpoint)

	forks     []*store.Sandbox // their records (state creating)
	ahead     []*madeAhead     // the sandbox made ahead each fork restores into (nil: none)
	staged    []*staged        // each fork staged for its restore
	stageErrs []error
	staging   sync.WaitGroup
	ck        *store.Checkpoint
	release   func() // the fork's use of its checkpoint (see ckRefs); idempotent
}

// newFork checks that src may be forked here, and finds its image.
func (s *Service) newFork(ctx context.Context, src *store.Sandbox, cp provider.Checkpointer, count int) (*forkOp, error) {
	if err := s.adm.ledgerRoom(ctx, src.Project, "fork sandbox "+src.Name); err != nil {
		return nil, err
	}
	if err := checkInherited("sandbox "+src.Name, s.Limits(), src.MemoryBytes, src.CPUMillis, src.Pids); err != nil {
		return nil, fmt.Errorf("a fork takes its source's bounds: %w", err)
	}
	if err := s.adm.precheck(ctx, src, int64(max(1, count)), "a fork of "+src.Name); err != nil {
		return nil, err
	}
	img, err := s.cfg.Images.Get(ctx, src.ImageDigest)
	if err != nil {
		return nil, fmt.Errorf("image %s of sandbox %s: %w", src.Image, src.Name, err)
	}
	ckID := newID()
	return &forkOp{s: s, ctx: context.WithoutCancel(ctx), src: src, cp: cp, img: img, ckID: ckID,
		log: s.cfg.Log.With("source", src.ID, "name", src.Name),
		// The checkpoint is in use from its making until the forks are
		// running and its image is on disk: an rm of it meanwhile waits.
		release: s.cks.use(ckID)}, nil
}

func (f *forkOp) ids() []string {
	ids := make([]string, len(f.forks))
	for i, r := range f.forks {
		ids[i] = r.ID
	}
	return ids
}

// insertRecords writes the forks' records (state creating) with their
// sandbox.created events; an undo removes every piece of them. The first
// forks take the sandboxes made ahead, their ids and addresses.
func (f *forkOp) insertRecords(names []string, ahead []*madeAhead, r *revert.Reverter) error {
	src := f.src
	protos := make([]*store.Sandbox, len(names))
	f.ahead = make([]*madeAhead, len(names))
	for i, n := range names {
		protos[i] = &store.Sandbox{
			Name: n, Shape: src.Shape.Clone(),
			// The fork's memory holds the source's agent (and its token),
			// running from the source's /.shard: the fork must mount the
			// very same files.
			Token: src.Token, AgentDir: src.AgentDir, ParentID: src.ID,
			ParentName: src.Name, Generation: src.Generation + 1,
			Origin: &store.Origin{Kind: OriginFork, Name: src.Name, ID: src.ID, Checkpoint: f.ckID},
			// Grants and policy become the fork's own: a later ungrant or
			// policy change on the source does not reach it.
			Grants: copyGrants(src.Grants), Policy: copyPolicy(src.Policy),
		}
		if i < len(ahead) {
			f.ahead[i] = ahead[i]
			protos[i].ID, protos[i].IP = ahead[i].rec.ID, ahead[i].rec.IP
		}
	}
	forks, err := f.s.insertRecords(f.ctx, protos, func(fk *store.Sandbox) (string, ledger.CreatedData) {
		d := ledger.CreatedOf(fk.Shape)
		d.Checkpoint, d.ForkedFrom, d.ParentName = f.ckID, src.ID, src.Name
		return "fork-" + src.Name + "-" + fk.ID[:6], d
	})
	if err != nil {
		return err
	}
	f.forks = forks
	r.Add(func() { f.s.undoRecords(f.ctx, forks, nil) })
	return nil
}

// destroyForks removes every piece of the forks, records and ledger
// sessions included: a fork that failed never was.
func (f *forkOp) destroyForks() {
	var wg sync.WaitGroup
	for _, fk := range f.forks {
		wg.Add(1)
		go func() { defer wg.Done(); f.s.discard(f.ctx, fk, f.log) }()
	}
	wg.Wait()
}

// freeze captures the source as the fork's checkpoint (files and memory
// from one instant). As soon as the source is thawed, each fork is staged
// (its copy of the files, rootfs, netns, and the runtime's sandbox waiting
// for a memory image). Not earlier: on two cores, staging beside the save
// slowed the save, and so the freeze, more than it gained. It returns once
// every fork is staged.
func (f *forkOp) freeze(tag string, r *revert.Reverter) error {
	f.staged = make([]*staged, len(f.forks))
	f.stageErrs = make([]error, len(f.forks))
	proto := &store.Checkpoint{ID: f.ckID, Shape: store.Shape{Provider: f.src.Provider}}
	thawed := func() {
		for i, fk := range f.forks {
			f.staging.Add(1)
			go func() {
				defer f.staging.Done()
				f.staged[i], f.stageErrs[i] = f.s.stageRestore(f.ctx, proto, fk, f.img.Layers, f.ahead[i])
			}()
		}
	}
	// Whatever fails from here destroys the forks, once their staged
	// instances are down (a staging still under way is waited for).
	r.Add(f.destroyForks, f.abortStaged)
	ck, err := f.s.capture(f.ctx, f.src, f.cp, f.ckID, "fork", tag, f.keep, thawed)
	if err != nil {
		return err
	}
	f.ck = ck
	f.log.Info("fork: source thawed", "freeze_ms", ck.FreezeMS, "forks", len(f.forks))
	// A failure from here also takes the checkpoint away: it was made for
	// forks that did not come to be. (Its drop waits for every use, so
	// the fork's own goes first.)
	r.Add(func() {
		f.release()
		f.s.saved.dropCheckpoint(f.ctx, ck)
	}, f.abortStaged)
	f.staging.Wait()
	return errors.Join(f.stageErrs...)
}

// abortStaged takes down every fork staged so far (undo runs once each).
func (f *forkOp) abortStaged() {
	f.staging.Wait()
	for _, st := range f.staged {
		if st != nil {
			st.abort()
		}
	}
}

// restore restores every fork from the one image, concurrently.
func (f *forkOp) restore() error {
	errs := make([]error, len(f.forks))
	var wg sync.WaitGroup
	for i := range f.forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f.s.launchRestore(f.ctx, f.ck, f.staged[i])
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// announce gives every fork its identity and runs its hooks (then the
// source's, if asked), concurrently across forks.
func (f *forkOp) announce(o HookOptions) error {
	errs := make([]error, len(f.forks))
	var wg sync.WaitGroup
	for i, fk := range f.forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f.s.announce(f.ctx, fk, proto.RoleFork, forkIdentity(fk, f.ckID), o)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if o.InSource {
		return f.s.announce(f.ctx, f.src, proto.RoleSource, forkIdentity(f.forks[0], f.ckID), o)
	}
	return nil
}

// running moves every fork's record to running.
func (f *forkOp) running() ([]*store.Sandbox, error) {
	out := make([]*store.Sandbox, len(f.forks))
	for i, fk := range f.forks {
		r, err := f.s.move(f.ctx, fk.ID, StateRunning, nil, func(r *store.Sandbox) { r.StartedAt = time.Now().UTC() })
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

// persist writes the checkpoint's image to disk, now that the forks are
// running (from RAM, if that is where the provider put it; not earlier,
// beside the restores), and then lets go of the checkpoint.
func (f *forkOp) persist() {
	ip, ok := f.cp.(provider.ImagePersister)
	if !ok {
		return
	}
	use := f.release
	f.release = func() {} // handed to the copy (a second use could wait behind a drop)
	if !f.s.life.goBG(func() {
		defer use()
		if err := ip.Persisted(f.ctx, f.s.checkpointDir(f.ckID)); err != nil {
			f.log.Error("fork: checkpoint image to disk", "checkpoint", f.ckID, "err", err)
		}
	}) {
		use() // closing: the next start's reconcile finishes the copy
	}
}

// releaseCheckpoint lets go of the fork's use of its checkpoint, unless
// persist handed it on.
func (f *forkOp) releaseCheckpoint() { f.release() }

// tellSource writes the forks that exist to the source's ledger.
func (f *forkOp) tellSource(forks []*store.Sandbox, tag string) {
	for _, fk := range forks {
		err := f.s.cfg.Store.AddEvent(f.ctx, f.src, &store.EventSpec{Type: ledger.Forked, Data: ledger.ForkedData{Fork: fk.ID, Name: fk.Name, Checkpoint: f.ckID, Tag: tag}})
		if err != nil {
			f.log.Error("fork: ledger", "err", err)
		}
	}
}
