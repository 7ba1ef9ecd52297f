package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/useshards/shard/internal/errdefs"
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
// and address. The source is frozen only while its memory and files are
// captured, then carries on. On any failure the source runs on and no fork
// is left behind.
func (s *Service) Fork(ctx context.Context, idOrName string, req ForkRequest) ([]*store.Sandbox, error) {
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Count < 1 || req.Count > MaxForkCount {
		return nil, errdefs.Invalid("count must be between 1 and %d", MaxForkCount)
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
	src, err := s.cfg.Store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	unlock := s.lock(src.ID) // one fork (or stop, start, remove) of a source at a time
	defer unlock()
	if src, err = s.cfg.Store.GetSandbox(ctx, src.ID); err != nil {
		return nil, err
	}
	switch src.State {
	case StateRunning:
	case StateStopped, StateFailed:
		return nil, errdefs.Conflict("sandbox_not_running", "sandbox %s is stopped: fork takes a running sandbox", src.Name)
	default:
		return nil, errdefs.Conflict("sandbox_busy", "sandbox %s is %s: try again when that is done", src.Name, src.State)
	}
	cp, ok := s.providers[src.Provider].(provider.Checkpointer)
	if !ok || !s.caps[src.Provider].Fork || !s.caps[src.Provider].Available {
		return nil, errdefs.Unsupported("provider %s does not support fork on this host", src.Provider)
	}
	img, err := s.cfg.Images.Get(ctx, src.ImageDigest)
	if err != nil {
		return nil, fmt.Errorf("image %s of sandbox %s: %w", src.Image, src.Name, err)
	}
	log := s.cfg.Log.With("source", src.ID, "name", src.Name)
	bg := context.WithoutCancel(ctx)

	// 1. Records for the forks (state creating): names are taken now, so a
	// taken name fails before the source is touched.
	forks, err := s.forkRecords(ctx, src, names)
	if err != nil {
		return nil, err
	}
	fail := func(err error) ([]*store.Sandbox, error) {
		var wg sync.WaitGroup
		for _, f := range forks {
			wg.Add(1)
			go func() { defer wg.Done(); s.destroy(bg, f, log) }()
		}
		wg.Wait()
		return nil, err
	}

	// 2. Freeze: files and memory from one instant.
	ckID := newID()
	ckDir := filepath.Join(s.cfg.DataDir, "checkpoints", ckID)
	defer os.RemoveAll(ckDir)
	freeze, err := s.freeze(bg, src, cp, forks, ckDir)
	if err != nil {
		return fail(fmt.Errorf("fork of %s: %w", src.Name, err))
	}
	log.Info("fork: source thawed", "freeze", freeze, "forks", len(forks))
	ev := []*store.EventSpec{{Type: "sandbox.checkpoint_created", Data: map[string]any{"checkpoint": ckID, "tag": req.Tag, "freeze_ms": freeze.Milliseconds()}}}
	for _, f := range forks {
		ev = append(ev, &store.EventSpec{Type: "sandbox.forked", Data: map[string]any{"fork": f.ID, "name": f.Name, "checkpoint": ckID, "tag": req.Tag}})
	}
	for _, e := range ev {
		if err := s.cfg.Store.AddEvent(bg, src, e); err != nil {
			log.Error("fork: ledger", "err", err)
		}
	}

	// 3. Restore every fork from the one image, concurrently.
	errs := make([]error, len(forks))
	var wg sync.WaitGroup
	for i, f := range forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.bootWith(bg, f, img.Layers, func(_ provider.Provider, inst *provider.Instance) error {
				return cp.Restore(bg, inst, ckDir)
			})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fail(fmt.Errorf("fork of %s: %w", src.Name, err))
	}
	out := make([]*store.Sandbox, len(forks))
	for i, f := range forks {
		r, err := s.cfg.Store.UpdateSandbox(bg, f.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
			r.State, r.StartedAt = StateRunning, time.Now().UTC()
			return nil, nil
		})
		if err != nil {
			return fail(err)
		}
		out[i] = r
	}
	return out, nil
}

// forkRecords writes the forks' records: the source's bounds, environment,
// image and agent token (the agent in the fork's memory is the source's),
// a new id, name and address, and a ledger session of its own.
func (s *Service) forkRecords(ctx context.Context, src *store.Sandbox, names []string) ([]*store.Sandbox, error) {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	var out []*store.Sandbox
	for _, name := range names {
		ip, err := s.allocate(ctx)
		if err != nil {
			return s.undoRecords(ctx, out, err)
		}
		id := newID()
		if name == "" {
			name = id
		}
		f := &store.Sandbox{
			ID: id, Name: name, Image: src.Image, ImageDigest: src.ImageDigest, Provider: src.Provider,
			State: StateCreating, MemoryBytes: src.MemoryBytes, CPUMillis: src.CPUMillis, DiskBytes: src.DiskBytes,
			Pids: src.Pids, Env: append([]string(nil), src.Env...), IP: ip.String(), Token: src.Token,
			// The fork's memory holds the source's agent, running from the
			// source's /.shard: the fork must mount the very same files.
			AgentDir: src.AgentDir,
			ParentID: src.ID, Session: "fork-" + src.Name + "-" + id[:6], CreatedAt: time.Now().UTC(),
		}
		err = s.cfg.Store.CreateSandbox(ctx, f, &store.EventSpec{Type: "sandbox.created", Data: map[string]any{
			"image": f.Image, "provider": f.Provider, "forked_from": src.ID, "parent_name": src.Name}})
		if err != nil {
			return s.undoRecords(ctx, out, err)
		}
		out = append(out, f)
	}
	return out, nil
}

func (s *Service) undoRecords(ctx context.Context, recs []*store.Sandbox, err error) ([]*store.Sandbox, error) {
	for _, r := range recs {
		s.cfg.Store.DeleteSandbox(ctx, r.ID, nil)
	}
	return nil, err
}

// freeze pauses the source, copies its files for every fork, writes its
// memory image, and thaws it, all within the freeze timeout. It returns how
// long the source was frozen. The source is thawed whatever happens.
func (s *Service) freeze(ctx context.Context, src *store.Sandbox, cp provider.Checkpointer, forks []*store.Sandbox, ckDir string) (time.Duration, error) {
	if _, err := s.move(ctx, src.ID, StateFreezing, nil, nil); err != nil {
		return 0, err
	}
	fctx, cancel := context.WithTimeout(ctx, s.cfg.FreezeTimeout)
	defer cancel()
	start := time.Now()
	var tPause, tFiles time.Duration
	paused := false
	err := func() error {
		if err := os.MkdirAll(ckDir, 0o700); err != nil {
			return err
		}
		if err := cp.Pause(fctx, src.ID); err != nil {
			return err
		}
		paused = true
		tPause = time.Since(start)
		// While the source is paused its files and memory hold still: copy
		// the files and write the memory image at the same time.
		filesErr := make(chan error, 1)
		go func() {
			var err error
			for _, f := range forks {
				if err = s.cfg.Storage.Clone(src.ID, f.ID); err != nil {
					break
				}
			}
			tFiles = time.Since(start)
			filesErr <- err
		}()
		ckErr := cp.Checkpoint(fctx, src.ID, ckDir)
		return errors.Join(<-filesErr, ckErr)
	}()
	tCheckpoint := time.Since(start)
	defer func() {
		s.cfg.Log.Debug("fork: freeze phases", "source", src.ID, "paused", tPause, "files", tFiles, "checkpoint", tCheckpoint, "thawed", time.Since(start))
	}()
	if fctx.Err() != nil {
		err = errdefs.Unavailable("freeze_timeout", "the freeze of sandbox %s lasted %s, the limit: the fork failed and %s thawed", src.Name, s.cfg.FreezeTimeout, src.Name)
	}
	// Thaw whatever happened after the pause (a fresh context: the freeze's
	// may be over). Only then: gVisor panics on a resume without a pause.
	var rerr error
	if paused {
		rerr = cp.Resume(context.WithoutCancel(ctx), src.ID)
	}
	frozen := time.Since(start)
	if _, merr := s.move(context.WithoutCancel(ctx), src.ID, StateRunning, nil, nil); merr != nil && err == nil {
		err = merr
	}
	if err != nil {
		return frozen, err
	}
	if rerr != nil {
		return frozen, fmt.Errorf("thaw %s: %w", src.Name, rerr)
	}
	return frozen, nil
}
