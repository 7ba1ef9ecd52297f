package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/revert"
	"github.com/useshards/shard/internal/store"
)

// A warm spare is a sandbox of an environment made ahead of time: its copy
// of the environment's files, rootfs, netns, the runtime's sandbox, and the
// restore of the environment's checkpoint into it, then paused. A create
// from the environment takes it and only resumes it (a millisecond, where a
// restore into a created sandbox took 60-75 ms and a full one 160-190 ms);
// its memory is loaded by then too. One spare per environment, holding the
// environment's memory while it waits; a new one is made after each use. A
// spare has an id and an address (reserved) but no record: after a crash,
// Reconcile removes it as an unknown container.
type spare struct {
	env  string
	ckID string
	rec  *store.Sandbox // ID and IP set; not in the store
	st   *staged        // restored and paused
}

// sparePool holds one warm spare per environment (by envKey), made in the
// background by build and taken down by drop.
type sparePool struct {
	build func(context.Context, *store.Environment) (*spare, error)
	drop  func(*spare)
	log   *slog.Logger

	mu     sync.Mutex
	m      map[string]*spare // envKey → its spare (no st: being staged); guarded by mu
	closed bool              // at shutdown: stage no more; guarded by mu
	wg     sync.WaitGroup    // spares being staged
}

func newSparePool(build func(context.Context, *store.Environment) (*spare, error), drop func(*spare), log *slog.Logger) *sparePool {
	return &sparePool{build: build, drop: drop, log: log, m: map[string]*spare{}}
}

// stage makes env's spare, if it has none (in the background). While it
// is staged, a placeholder (no st) holds its place, so that a forget or a
// newer staging meanwhile wins over this one.
func (p *sparePool) stage(env *store.Environment) {
	p.mu.Lock()
	key := envKey(env.Project, env.Name)
	if _, ok := p.m[key]; ok || p.closed {
		p.mu.Unlock()
		return
	}
	p.wg.Add(1)
	placeholder := &spare{env: env.Name, ckID: env.Checkpoint}
	p.m[key] = placeholder
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		// A spare is its environment's, and sees that project only.
		sp, err := p.build(project.With(context.Background(), project.OrDefault(env.Project)), env)
		p.mu.Lock()
		defer p.mu.Unlock()
		current := p.m[key] == placeholder
		if err != nil {
			p.log.Warn("environment: warm spare", "environment", env.Name, "err", err)
		}
		if err != nil || !current {
			if current {
				delete(p.m, key)
			}
			if sp != nil {
				p.drop(sp) // (mu held: drop takes no lock of the pool)
			}
			return
		}
		p.m[key] = sp
	}()
}

// take hands out the spare of key (an envKey) if it is staged for
// checkpoint ckID.
func (p *sparePool) take(key, ckID string) *spare {
	p.mu.Lock()
	defer p.mu.Unlock()
	sp := p.m[key]
	if sp == nil || sp.st == nil { // none, or still being staged
		return nil
	}
	delete(p.m, key)
	if sp.ckID != ckID {
		p.wg.Add(1) // (mu held: close waits for this drop too)
		go func() { defer p.wg.Done(); p.drop(sp) }()
		return nil
	}
	return sp
}

// ready counts the spares staged and waiting.
func (p *sparePool) ready() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, sp := range p.m {
		if sp.st != nil {
			n++
		}
	}
	return n
}

// forget drops the spare of key (the environment was removed or rebuilt).
func (p *sparePool) forget(key string) {
	p.mu.Lock()
	sp, ok := p.m[key]
	delete(p.m, key)
	p.mu.Unlock()
	if ok && sp.st != nil {
		p.drop(sp)
	}
}

// close takes every spare down and stages no more (at shutdown); it waits
// for spares being staged, which then drop themselves.
func (p *sparePool) close() {
	p.mu.Lock()
	p.closed = true
	all := p.m
	p.m = map[string]*spare{}
	p.mu.Unlock()
	defer p.wg.Wait()
	for _, sp := range all {
		if sp.st != nil {
			p.drop(sp)
		}
	}
}

func (sv *Saved) makeSpare(ctx context.Context, env *store.Environment) (*spare, error) {
	release := sv.s.cks.use(env.Checkpoint)
	defer release()
	ck, err := sv.s.cfg.Store.GetCheckpoint(ctx, env.Checkpoint)
	if err != nil {
		return nil, err
	}
	img, err := sv.s.cfg.Images.Get(ctx, ck.ImageDigest)
	if err != nil {
		return nil, err
	}
	ip, err := sv.s.addrs.Reserve()
	if err != nil {
		return nil, err
	}
	id := newID()
	rec := fromCheckpoint(ck, id)
	rec.ID, rec.IP, rec.State = id, ip.String(), StateCreating
	sp := &spare{env: env.Name, ckID: ck.ID, rec: rec}
	if err := sv.s.adm.holdSpare(ctx, rec); err != nil {
		sv.s.addrs.Release(rec.IP)
		return nil, err
	}
	r := revert.New()
	defer r.Fail()
	r.Add(func() { sv.dropSpare(sp) })
	if sp.st, err = sv.s.stageRestore(ctx, ck, rec, img.Layers, nil); err != nil {
		return nil, err
	}
	// Restore it now and hold it paused: a create then only resumes it.
	// Paused right after the restore, its processes are where the
	// checkpoint left them, as they would be after a restore at create.
	// (stageRestore took only a provider that checkpoints.)
	if err := sv.s.launchRestore(ctx, ck, sp.st); err != nil {
		return nil, err
	}
	if err := sp.st.p.(provider.Checkpointer).Pause(ctx, rec.ID); err != nil {
		return nil, err
	}
	r.Success()
	return sp, nil
}

// envKey names an environment among every project's: the key of its lock
// and of its spare.
func envKey(proj, name string) string {
	return "env:" + project.OrDefault(proj) + "/" + name
}

// dropSpare takes a spare down and frees its address.
func (sv *Saved) dropSpare(sp *spare) {
	if sp.st != nil {
		sp.st.abort()
	}
	if ip, err := netip.ParseAddr(sp.rec.IP); err == nil && sp.rec.Policy != nil {
		sv.s.cfg.Net.SetPolicy(ip, nil) // stage() installed it for the address
	}
	sv.s.cfg.Storage.Remove(context.Background(), sp.rec.ID)
	os.RemoveAll(sv.s.runDir(sp.rec.ID))
	sv.s.addrs.Release(sp.rec.IP)
	sv.s.adm.unholdSpare(sp.rec.ID)
}

// DropSpares takes every spare down and stages no more (at shutdown).
func (sv *Saved) DropSpares() { sv.spares.close() }

// restoreFromSpare turns a spare into the sandbox named name: its record
// (with the spare's id and address), then resumes it. The caller holds the
// use of ck.
func (sv *Saved) restoreFromSpare(ctx context.Context, sp *spare, ck *store.Checkpoint, env, name string) (*store.Sandbox, error) {
	rec := sp.rec
	if name != "" {
		rec.Name = name
	}
	sp.st.t0 = time.Now() // boot phases from here: the spare was staged long ago
	rec.Session, rec.CreatedAt = rec.Name, time.Now().UTC()
	// Staged from the checkpoint, it is made from the environment now.
	rec.Origin = RestoreOptions{Environment: env}.origin(ck)
	d := ledger.CreatedOf(rec.Shape)
	d.Checkpoint, d.RestoredFrom, d.Environment = ck.ID, ck.ID, env
	// The spare's memory and cpu were admitted when it was made; the
	// record adds a sandbox and its disk, and holds the rest now. (The
	// admission lock comes before the pool's, as in insertRecords.)
	err := sv.s.adm.admit(ctx, rec, use{sandboxes: 1, disk: rec.DiskBytes}, "sandbox "+rec.Name, func() error {
		return sv.s.addrs.Claim(rec.IP, func() error { // the record holds the address now
			if err := sv.s.cfg.Store.CreateSandbox(ctx, rec, &store.EventSpec{Type: ledger.Created, Data: d}); err != nil {
				return err
			}
			delete(sv.s.adm.spares, rec.ID)
			return nil
		})
	})
	if err != nil {
		sv.dropSpare(sp)
		return nil, err
	}
	// From here the record holds the spare's pieces: a failure removes
	// them all with it.
	bg := context.WithoutCancel(ctx)
	log := sv.s.cfg.Log.With("sandbox", rec.ID, "name", rec.Name)
	r := revert.New()
	defer r.Fail()
	r.Add(func() { sv.s.discard(bg, rec, log) })
	// The hostname files were written for the spare's id.
	if rec.Name != rec.ID {
		sv.s.writeHostFiles(rec) // best effort: it only names the host
	}
	sp.st.phase(sv.s, "recorded")
	if err := sp.st.p.(provider.Checkpointer).Resume(bg, rec.ID); err != nil {
		// A spare can wait for hours: if its runtime died meanwhile, a
		// plain restore still makes the sandbox.
		log.Warn("warm spare failed; restoring without it", "err", err)
		r.Fail()
		return sv.restore(ctx, ck, RestoreOptions{Name: name, Environment: env})
	}
	sp.st.phase(sv.s, "resumed")
	if err := sv.s.announce(bg, rec, proto.RoleFork, forkIdentity(rec, ck.ID), restoreHooks); err != nil {
		return nil, fmt.Errorf("sandbox from environment %s: %w", env, err)
	}
	out, err := sv.s.move(bg, rec.ID, StateRunning, nil, func(r *store.Sandbox) { r.StartedAt = time.Now().UTC() })
	if err != nil {
		return nil, err
	}
	r.Success()
	sp.st.phase(sv.s, "running")
	log.Info("restored from a warm spare", "environment", env, "checkpoint", ck.ID)
	return out, nil
}
