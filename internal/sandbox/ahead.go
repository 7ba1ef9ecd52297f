package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/store"
)

// Sandboxes made ahead: a fork (or a restore) takes a runtime sandbox that
// was created before it was asked for, and restores into it, so that no
// `runsc create` (a gofer and a Sentry started, a kernel booted that the
// restore throws away: 0.3-0.4 s of a fork on two cores) is on its path.
//
// A sandbox made ahead has an id, an address (reserved), a network
// namespace, its cgroups with their bounds, and a runtime sandbox created
// with its root an empty placeholder mount (rootfs.Placeholder): nothing of
// a user's, and no process of the sandbox's running. It has no record:
// after a crash, Reconcile removes it as an unknown container. The fork
// that takes it gets its id and address; the fork's files, a copy of its
// checkpoint's, are mounted over the placeholder once they exist (after the
// source thawed), and the runtime's gofer serves them from then on.
//
// What a sandbox made ahead was created with must be what the restore into
// it needs, so they are kept by aheadKey: the runtime, the bounds its
// cgroups and guest hold, the agent directory it mounts and the image's
// devices. A shape is made ahead once a fork or a restore asked for it:
// Config.Ahead of each (more while a fork asks for more at once), the
// shapes used last, refilled one at a time in the background once no fork
// is under way. Each is counted against the host's memory by what it takes
// idle (aheadFootprint), not by its bounds: the restore's record holds
// those.

// aheadFootprint is what a sandbox made ahead is counted as holding of the
// host's memory: its gofer and Sentry, idle (measured in
// docs/gvisor-fork-speed.md).
const aheadFootprint = 32 << 20

// maxAheadShapes is how many shapes are kept made ahead at once: a new one
// takes the place of the one used longest ago.
const maxAheadShapes = 4

// maxAheadPerShape bounds how many of a shape a burst of forks raises it to.
const maxAheadPerShape = 8

// aheadKey is what a sandbox made ahead shares with every sandbox restored
// into it.
type aheadKey struct {
	Provider string
	Memory   int64
	CPU      int64
	Pids     int64
	AgentDir string
	Devices  string // the spec's devices, as JSON
}

// madeAhead is one sandbox made ahead.
type madeAhead struct {
	key aheadKey
	rec *store.Sandbox // ID, IP and shape set; not in the store
	st  *staged        // created, its root a placeholder
}

// aheadShape is a shape being kept made ahead.
type aheadShape struct {
	digest string // an image of that shape (its devices)
	want   int
	used   time.Time
	ready  []*madeAhead
	making int
}

// aheadPool keeps sandboxes made ahead by shape.
type aheadPool struct {
	s    *Service
	per  int // Config.Ahead; 0: none made
	log  *slog.Logger
	kick chan struct{}

	mu     sync.Mutex
	shapes map[aheadKey]*aheadShape // guarded by mu
	busy   int                      // forks and restores under way; guarded by mu
	filler bool                     // the filling goroutine runs; guarded by mu
	closed bool                     // guarded by mu
}

func newAheadPool(s *Service, per int) *aheadPool {
	return &aheadPool{s: s, per: per, log: s.cfg.Log, kick: make(chan struct{}, 1), shapes: map[aheadKey]*aheadShape{}}
}

// aheadKey is the aheadKey of a sandbox like sb, and whether its runtime can
// make sandboxes ahead at all.
func (s *Service) aheadKey(sb *store.Sandbox) (aheadKey, bool) {
	if _, ok := s.providers[sb.Provider].(provider.AheadMaker); !ok || !s.caps[sb.Provider].Available {
		return aheadKey{}, false
	}
	agentDir := sb.AgentDir
	if agentDir == "" {
		agentDir = s.agentDir
	}
	dev, _ := json.Marshal(s.cfg.Images.Devices(sb.ImageDigest))
	return aheadKey{Provider: sb.Provider, Memory: sb.MemoryBytes, CPU: sb.CPUMillis, Pids: sb.Pids, AgentDir: agentDir, Devices: string(dev)}, true
}

// begin marks a fork or restore of n sandboxes like sb under way (no
// filling meanwhile: it would take the cores the fork needs), and takes up
// to n sandboxes made ahead for it. end ends it and refills.
func (p *aheadPool) begin(sb *store.Sandbox, n int) (taken []*madeAhead, end func()) {
	if p == nil { // a unit test's hand-made Service
		return nil, func() {}
	}
	key, ok := p.s.aheadKey(sb)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.busy++
	end = func() {
		p.mu.Lock()
		p.busy--
		p.mu.Unlock()
		p.wake()
	}
	if !ok || p.per <= 0 || p.closed {
		return nil, end
	}
	sh := p.shapes[key]
	if sh == nil {
		p.evictLocked()
		sh = &aheadShape{digest: sb.ImageDigest}
		p.shapes[key] = sh
	}
	sh.used = time.Now()
	sh.want = min(max(p.per, n, sh.want), maxAheadPerShape)
	k := min(n, len(sh.ready))
	taken = append(taken, sh.ready[:k]...)
	sh.ready = sh.ready[k:]
	if !p.filler {
		p.filler = p.s.life.goBG(p.fill)
	}
	return taken, end
}

// evictLocked makes room for one more shape: the one used longest ago goes,
// with its sandboxes. Caller holds mu.
func (p *aheadPool) evictLocked() {
	if len(p.shapes) < maxAheadShapes {
		return
	}
	var oldest aheadKey
	var at time.Time
	for k, sh := range p.shapes {
		if at.IsZero() || sh.used.Before(at) {
			oldest, at = k, sh.used
		}
	}
	for _, ma := range p.shapes[oldest].ready {
		go p.s.dropAhead(ma)
	}
	delete(p.shapes, oldest)
}

func (p *aheadPool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// ready counts the sandboxes made ahead and waiting.
func (p *aheadPool) ready() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, sh := range p.shapes {
		n += len(sh.ready)
	}
	return n
}

// fill makes the sandboxes the shapes want, one at a time, while no fork
// or restore is under way, until the service closes.
func (p *aheadPool) fill() {
	for {
		key, sh := p.next()
		if sh == nil {
			select {
			case <-p.kick:
				continue
			case <-p.s.life.Done():
				return
			}
		}
		ma, err := p.s.makeAhead(context.Background(), key, sh.digest)
		p.mu.Lock()
		sh.making--
		keep := err == nil && !p.closed && p.shapes[key] == sh
		if keep {
			sh.ready = append(sh.ready, ma)
		}
		p.mu.Unlock()
		if err != nil {
			p.log.Warn("a sandbox made ahead", "provider", key.Provider, "err", err)
			// Not again at once: what failed (memory, addresses) may
			// stay short a while.
			select {
			case <-time.After(5 * time.Second):
			case <-p.s.life.Done():
				return
			}
		} else if !keep {
			p.s.dropAhead(ma)
		}
	}
}

// next is a shape that wants one more sandbox made, once nothing is under
// way; nil if none does.
func (p *aheadPool) next() (aheadKey, *aheadShape) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return aheadKey{}, nil
		}
		if p.busy == 0 {
			for k, sh := range p.shapes {
				if len(sh.ready)+sh.making < sh.want {
					sh.making++
					p.mu.Unlock()
					return k, sh
				}
			}
			p.mu.Unlock()
			return aheadKey{}, nil
		}
		p.mu.Unlock()
		select {
		case <-p.kick:
		case <-time.After(50 * time.Millisecond):
		case <-p.s.life.Done():
			return aheadKey{}, nil
		}
	}
}

// close takes every sandbox made ahead down, and makes no more (at
// shutdown; one being made drops itself).
func (p *aheadPool) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	var all []*madeAhead
	for _, sh := range p.shapes {
		all = append(all, sh.ready...)
	}
	p.shapes = map[aheadKey]*aheadShape{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, ma := range all {
		wg.Add(1)
		go func() { defer wg.Done(); p.s.dropAhead(ma) }()
	}
	wg.Wait()
}

// makeAhead makes one sandbox of key ahead: an address, its network, its
// runtime sandbox created on a placeholder root.
func (s *Service) makeAhead(ctx context.Context, key aheadKey, digest string) (*madeAhead, error) {
	ip, err := s.addrs.Reserve()
	if err != nil {
		return nil, err
	}
	id := newID()
	rec := &store.Sandbox{ID: id, Name: id, IP: ip.String(), State: StateCreating, AgentDir: key.AgentDir,
		Shape: store.Shape{Provider: key.Provider, ImageDigest: digest,
			Bounds: store.Bounds{MemoryBytes: key.Memory, CPUMillis: key.CPU, Pids: key.Pids}}}
	ma := &madeAhead{key: key, rec: rec}
	if err := s.adm.holdAhead(ctx, id); err != nil {
		s.addrs.Release(rec.IP)
		return nil, err
	}
	start := time.Now()
	st, err := s.stageWith(ctx, rec, s.cfg.Storage.Placeholder)
	if err == nil {
		ma.st = st
		err = st.p.(provider.AheadMaker).CreateAhead(ctx, st.inst)
	}
	if err != nil {
		s.dropAhead(ma)
		return nil, err
	}
	s.cfg.Log.Debug("made ahead", "sandbox", id, "provider", key.Provider, "took", time.Since(start))
	return ma, nil
}

// dropAhead takes down a sandbox made ahead that no record took.
func (s *Service) dropAhead(ma *madeAhead) {
	if ma.st != nil {
		ma.st.abort()
	}
	os.RemoveAll(s.runDir(ma.rec.ID))
	s.addrs.Release(ma.rec.IP)
	s.adm.unholdAhead(ma.rec.ID)
}

// stageRestoreAhead is stageRestore into a sandbox made ahead, which rec
// (its record, with the sandbox's id and address) now owns: its files, a
// copy of ck's, mounted over its placeholder root, its host files and
// egress policy, and what the runtime needs before the restore. On error
// the sandbox made ahead is taken down.
func (s *Service) stageRestoreAhead(ctx context.Context, ck *store.Checkpoint, rec *store.Sandbox, layers []string, ma *madeAhead) (_ *staged, err error) {
	st := ma.st
	st.sb, st.t0 = rec, time.Now()
	defer func() {
		if err != nil {
			st.abort()
		}
	}()
	if err := s.cfg.Storage.CreateFrom(checkpointKey(ck.ID), rec.ID); err != nil {
		return nil, err
	}
	if err := s.cfg.Storage.Mount(ctx, rec.ID, layers, filepath.Join(s.runDir(rec.ID), "rootfs")); err != nil {
		return nil, err
	}
	st.phase(s, "rootfs")
	// Written for the sandbox made ahead: its name was its id. (The
	// restore gives the kernel the spec's hostname.)
	st.inst.Spec.Hostname = sandboxHostname(rec)
	if err := s.writeHostFiles(rec); err != nil {
		return nil, err
	}
	if rec.IP != ma.rec.IP {
		return nil, fmt.Errorf("sandbox made ahead %s: address %s, not its own %s", rec.ID, rec.IP, ma.rec.IP)
	}
	if err := s.applyPolicy(rec); err != nil {
		return nil, fmt.Errorf("network policy: %w", err)
	}
	if err := st.p.(provider.AheadMaker).PrepareAhead(ctx, st.inst, s.checkpointDir(ck.ID)); err != nil {
		return nil, err
	}
	st.phase(s, "prepared")
	return st, nil
}
