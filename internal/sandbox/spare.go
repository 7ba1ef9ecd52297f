package sandbox

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/oci"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/provider"
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

// stageSpare makes env's spare, if it has none (in the background). While
// it is staged, a placeholder (no st) holds its place, so that a forget or a
// newer staging meanwhile wins over this one.
func (s *Service) stageSpare(env *store.Environment) {
	s.sparesMu.Lock()
	key := envKey(env.Project, env.Name)
	if _, ok := s.spares[key]; ok || s.sparesClosed {
		s.sparesMu.Unlock()
		return
	}
	s.sparesWG.Add(1)
	placeholder := &spare{env: env.Name, ckID: env.Checkpoint}
	s.spares[key] = placeholder
	s.sparesMu.Unlock()
	go func() {
		defer s.sparesWG.Done()
		sp, err := s.makeSpare(context.Background(), env)
		s.sparesMu.Lock()
		defer s.sparesMu.Unlock()
		current := s.spares[key] == placeholder
		if err != nil {
			s.cfg.Log.Warn("environment: warm spare", "environment", env.Name, "err", err)
		}
		if err != nil || !current {
			if current {
				delete(s.spares, key)
			}
			if sp != nil {
				s.dropSpare(sp) // (sparesMu held: dropSpare takes only allocMu)
			}
			return
		}
		s.spares[key] = sp
	}()
}

func (s *Service) makeSpare(ctx context.Context, env *store.Environment) (*spare, error) {
	release := s.useCheckpoint(env.Checkpoint)
	defer release()
	ck, err := s.cfg.Store.GetCheckpoint(ctx, env.Checkpoint)
	if err != nil {
		return nil, err
	}
	img, err := s.cfg.Images.Get(ctx, ck.ImageDigest)
	if err != nil {
		return nil, err
	}
	s.allocMu.Lock()
	ip, err := s.allocate()
	if err == nil {
		s.reserved[ip.String()] = true
	}
	s.allocMu.Unlock()
	if err != nil {
		return nil, err
	}
	id := newID()
	rec := fromCheckpoint(ck, id)
	rec.ID, rec.IP, rec.State = id, ip.String(), StateCreating
	sp := &spare{env: env.Name, ckID: ck.ID, rec: rec}
	if sp.st, err = s.stageRestore(ctx, ck, rec, img.Layers); err != nil {
		s.dropSpare(sp)
		return nil, err
	}
	// Restore it now and hold it paused: a create then only resumes it.
	// Paused right after the restore, its processes are where the
	// checkpoint left them, as they would be after a restore at create.
	// (stageRestore took only a provider that checkpoints.)
	if err := s.launchRestore(ctx, ck, sp.st); err != nil {
		s.dropSpare(sp)
		return nil, err
	}
	if err := sp.st.p.(provider.Checkpointer).Pause(ctx, rec.ID); err != nil {
		s.dropSpare(sp)
		return nil, err
	}
	return sp, nil
}

// envKey names an environment among every project's: the key of its lock
// and of its spare.
func envKey(proj, name string) string {
	return "env:" + project.OrDefault(proj) + "/" + name
}

// takeSpare hands out env's spare (by envKey) if it is staged for
// checkpoint ckID.
func (s *Service) takeSpare(env, ckID string) *spare {
	s.sparesMu.Lock()
	defer s.sparesMu.Unlock()
	sp := s.spares[env]
	if sp == nil || sp.st == nil { // none, or still being staged
		return nil
	}
	delete(s.spares, env)
	if sp.ckID != ckID {
		go s.dropSpare(sp)
		return nil
	}
	return sp
}

// forgetSpare drops env's spare (by envKey; the environment was removed or
// rebuilt).
func (s *Service) forgetSpare(env string) {
	s.sparesMu.Lock()
	sp, ok := s.spares[env]
	delete(s.spares, env)
	s.sparesMu.Unlock()
	if ok && sp.st != nil {
		s.dropSpare(sp)
	}
}

// dropSpare takes a spare down and frees its address.
func (s *Service) dropSpare(sp *spare) {
	if sp.st != nil {
		sp.st.abort()
	}
	if ip, err := netip.ParseAddr(sp.rec.IP); err == nil && sp.rec.Policy != nil {
		s.cfg.Net.SetPolicy(ip, nil) // stage() installed it for the address
	}
	s.cfg.Storage.Remove(context.Background(), sp.rec.ID)
	os.RemoveAll(s.runDir(sp.rec.ID))
	s.allocMu.Lock()
	delete(s.reserved, sp.rec.IP)
	s.allocMu.Unlock()
}

// DropSpares takes every spare down and stages no more (at shutdown); it
// waits for spares being staged, which then drop themselves.
func (s *Service) DropSpares() {
	s.sparesMu.Lock()
	s.sparesClosed = true
	all := s.spares
	s.spares = map[string]*spare{}
	s.sparesMu.Unlock()
	defer s.sparesWG.Wait()
	for _, sp := range all {
		if sp.st != nil {
			s.dropSpare(sp)
		}
	}
}

// restoreFromSpare turns a spare into the sandbox named name: its record
// (with the spare's id and address), then resumes it. The caller holds the
// use of ck.
func (s *Service) restoreFromSpare(ctx context.Context, sp *spare, ck *store.Checkpoint, env, name string) (*store.Sandbox, error) {
	rec := sp.rec
	if name != "" {
		rec.Name = name
	}
	sp.st.t0 = time.Now() // boot phases from here: the spare was staged long ago
	rec.Session, rec.CreatedAt = rec.Name, time.Now().UTC()
	s.allocMu.Lock()
	err := s.checkLimit()
	if err == nil {
		d := ledger.CreatedOf(rec.Shape)
		d.Checkpoint, d.RestoredFrom, d.Environment = ck.ID, ck.ID, env
		err = s.cfg.Store.CreateSandbox(ctx, rec, &store.EventSpec{Type: ledger.Created, Data: d})
	}
	if err == nil {
		delete(s.reserved, rec.IP) // the record holds the address now
	}
	s.allocMu.Unlock()
	if err != nil {
		s.dropSpare(sp)
		return nil, err
	}
	// The hostname files were written for the spare's id.
	if rec.Name != rec.ID {
		s.rewriteHostFiles(rec)
	}
	sp.st.phase(s, "recorded")
	bg := context.WithoutCancel(ctx)
	log := s.cfg.Log.With("sandbox", rec.ID, "name", rec.Name)
	if err := sp.st.p.(provider.Checkpointer).Resume(bg, rec.ID); err != nil {
		// A spare can wait for hours: if its runtime died meanwhile, a
		// plain restore still makes the sandbox.
		log.Warn("warm spare failed; restoring without it", "err", err)
		s.destroy(bg, rec, log)
		return s.restore(ctx, ck, RestoreOptions{Name: name, Environment: env})
	}
	sp.st.phase(s, "resumed")
	out, err := s.move(bg, rec.ID, StateRunning, nil, func(r *store.Sandbox) { r.StartedAt = time.Now().UTC() })
	if err != nil {
		s.destroy(bg, rec, log)
		return nil, err
	}
	sp.st.phase(s, "running")
	log.Info("restored from a warm spare", "environment", env, "checkpoint", ck.ID)
	return out, nil
}

// rewriteHostFiles writes /etc/hosts and /etc/hostname of a staged sandbox
// again, in place (they are bind mounts of these files), for its new name.
func (s *Service) rewriteHostFiles(sb *store.Sandbox) {
	for n, b := range hostFiles(sb) {
		oci.WriteFile(filepath.Join(s.runDir(sb.ID), n), b)
	}
}
