package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/provider"
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
}

// MaxForkCount bounds --count.
const MaxForkCount = 64

// Fork copies a running sandbox: its files, its memory and its processes,
// continuing where they were, into new sandboxes with their own id, name
// and address. It is a checkpoint of the source (kept, and listed with its
// checkpoints) and a restore of that checkpoint per fork. The source is
// frozen only while its memory and files are captured, then carries on. On
// any failure the source runs on and no fork is left behind.
func (s *Service) Fork(ctx context.Context, idOrName string, req ForkRequest) ([]*store.Sandbox, error) {
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Count < 1 || req.Count > MaxForkCount {
		return nil, errdefs.Invalid("count must be between 1 and %d", MaxForkCount)
	}
	if err := names.Tag(req.Tag); err != nil {
		return nil, err
	}
	names := make([]string, req.Count)
	if req.Name != "" {
		for i := range names {
			names[i] = req.Name
			if req.Count > 1 {
				names[i] = fmt.Sprintf("%s-%d", req.Name, i+1)
			}
			if err := validName(names[i]); err != nil {
				return nil, err
			}
		}
	}
	src, cp, unlock, err := s.lockRunning(ctx, idOrName, "fork")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.floor.check("fork sandbox " + src.Name); err != nil {
		return nil, err
	}
	if err := checkInherited("sandbox "+src.Name, s.Limits(), src.MemoryBytes, src.CPUMillis, src.Pids); err != nil {
		return nil, fmt.Errorf("a fork takes its source's bounds: %w", err)
	}
	img, err := s.cfg.Images.Get(ctx, src.ImageDigest)
	if err != nil {
		return nil, fmt.Errorf("image %s of sandbox %s: %w", src.Image, src.Name, err)
	}
	log := s.cfg.Log.With("source", src.ID, "name", src.Name)
	bg := context.WithoutCancel(ctx)
	releaseHost, err := s.reserveHostSpace(memoryImageBound(src), "the memory image of a fork of "+src.Name)
	if err != nil {
		return nil, err
	}
	defer releaseHost() // the image is on the disk (or gone) by the end

	// 1. Records for the forks (state creating): names are taken now, so a
	// taken name fails before the source is touched.
	ckID := newID()
	protos := make([]*store.Sandbox, len(names))
	for i, n := range names {
		protos[i] = &store.Sandbox{
			Name: n, Shape: src.Shape.Clone(),
			// The fork's memory holds the source's agent (and its token),
			// running from the source's /.shard: the fork must mount the
			// very same files.
			Token: src.Token, AgentDir: src.AgentDir, ParentID: src.ID,
			// Grants and policy become the fork's own: a later ungrant or
			// policy change on the source does not reach it.
			Grants: copyGrants(src.Grants), Policy: copyPolicy(src.Policy),
		}
	}
	forks, err := s.insertRecords(ctx, protos, func(f *store.Sandbox) (string, ledger.CreatedData) {
		d := ledger.CreatedOf(f.Shape)
		d.Checkpoint, d.ForkedFrom, d.ParentName = ckID, src.ID, src.Name
		return "fork-" + src.Name + "-" + f.ID[:6], d
	})
	if err != nil {
		return nil, err
	}
	forkIDs := make([]string, len(forks))
	for i, f := range forks {
		forkIDs[i] = f.ID
	}
	res, err := s.reserveCapture(src.ID, checkpointKey(ckID), forkIDs, fmt.Sprintf("%d fork(s) of %s", len(forks), src.Name))
	if err != nil {
		s.undoRecords(bg, forks, err)
		return nil, err
	}
	defer res.Release()
	fail := func(err error) ([]*store.Sandbox, error) {
		var wg sync.WaitGroup
		for _, f := range forks {
			wg.Add(1)
			go func() { defer wg.Done(); s.destroy(bg, f, log) }()
		}
		wg.Wait()
		return nil, err
	}

	// 2. Freeze: files and memory from one instant, kept as a checkpoint.
	// As soon as the source is thawed, each fork is staged (its copy of
	// the files, rootfs, netns, and the runtime's sandbox waiting for a
	// memory image). Not earlier: on two cores, staging beside the save
	// slowed the save, and so the freeze, more than it gained.
	stagedForks := make([]*staged, len(forks))
	stageErrs := make([]error, len(forks))
	var staging sync.WaitGroup
	ckProto := &store.Checkpoint{ID: ckID, Shape: store.Shape{Provider: src.Provider}}
	thawed := func() {
		for i, f := range forks {
			staging.Add(1)
			go func() {
				defer staging.Done()
				stagedForks[i], stageErrs[i] = s.stageRestore(bg, ckProto, f, img.Layers)
			}()
		}
	}
	abortStaged := func() {
		staging.Wait()
		for _, st := range stagedForks {
			if st != nil {
				st.abort() // idempotent: undo runs once
			}
		}
	}
	// The checkpoint is in use from its making until the forks are running
	// and its image is on disk: an rm of it meanwhile waits.
	release, handedOff := s.cks.use(ckID), false
	defer func() {
		if !handedOff {
			release()
		}
	}()
	ck, err := s.capture(bg, src, cp, ckID, "fork", req.Tag, thawed)
	if err != nil {
		abortStaged()
		return fail(fmt.Errorf("fork of %s: %w", src.Name, err))
	}
	log.Info("fork: source thawed", "freeze_ms", ck.FreezeMS, "forks", len(forks))
	// From here a failure also takes the fork's checkpoint away: it was
	// made for forks that did not come to be.
	failAfter := func(err error) ([]*store.Sandbox, error) {
		abortStaged()
		out, err := fail(err)
		release()
		s.dropCheckpoint(bg, ck)
		return out, err
	}
	staging.Wait()
	if err := errors.Join(stageErrs...); err != nil {
		return failAfter(fmt.Errorf("fork of %s: %w", src.Name, err))
	}

	// 3. Restore every fork from the one image, concurrently.
	errs := make([]error, len(forks))
	var wg sync.WaitGroup
	for i := range forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.launchRestore(bg, ck, stagedForks[i])
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return failAfter(fmt.Errorf("fork of %s: %w", src.Name, err))
	}
	out := make([]*store.Sandbox, len(forks))
	for i, f := range forks {
		r, err := s.move(bg, f.ID, StateRunning, nil, func(r *store.Sandbox) { r.StartedAt = time.Now().UTC() })
		if err != nil {
			return failAfter(err)
		}
		out[i] = r
	}
	// The forks are running: now the image may go to disk (from RAM, if
	// that is where the provider put it; not earlier, beside the restores).
	if ip, ok := cp.(provider.ImagePersister); ok {
		handedOff = true // to the copy (a second RLock could wait behind a drop)
		go func() {
			defer release()
			if err := ip.Persisted(bg, s.checkpointDir(ckID)); err != nil {
				log.Error("fork: checkpoint image to disk", "checkpoint", ckID, "err", err)
			}
		}()
	}
	// The source's ledger tells of forks that exist.
	for _, f := range out {
		err := s.cfg.Store.AddEvent(bg, src, &store.EventSpec{Type: ledger.Forked, Data: map[string]any{"fork": f.ID, "name": f.Name, "checkpoint": ckID, "tag": req.Tag}})
		if err != nil {
			log.Error("fork: ledger", "err", err)
		}
	}
	return out, nil
}
