package api

import (
	"net/http"
	"time"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/store"
)

// Checkpoints, snapshots, environments and disk usage: what a sandbox's
// state is kept as.

func (s *Server) checkpointView(ck *store.Checkpoint) Checkpoint {
	return Checkpoint{
		ID: ck.ID, Kind: ck.Kind, Tag: ck.Tag, SandboxID: ck.SandboxID, SandboxName: ck.SandboxName,
		Session: ck.Session, Seq: ck.Seq, Image: ck.Image, ImageDigest: ck.ImageDigest, Provider: ck.Provider,
		MemoryBytes: ck.MemoryBytes, CPU: float64(ck.CPUMillis) / 1000, DiskBytes: ck.DiskBytes,
		Size: s.Checkpoints.CheckpointSize(ck.ID), FreezeMS: ck.FreezeMS, Memory: ck.Memory, MemoryNote: ck.MemoryNote,
		AutoRemove: ck.AutoRemove(), CreatedAt: ck.CreatedAt,
	}
}

func (s *Server) checkpointList(cks []*store.Checkpoint) any {
	out := make([]Checkpoint, 0, len(cks))
	for _, ck := range cks {
		out = append(out, s.checkpointView(ck))
	}
	return map[string]any{"checkpoints": out}
}

func (s *Server) createCheckpoint(r *http.Request) (any, int, error) {
	tag, err := parseCheckpoint(r)
	if err != nil {
		return nil, 0, err
	}
	ck, err := s.Checkpoints.Checkpoint(r.Context(), r.PathValue("id"), tag)
	if err != nil {
		return nil, 0, err
	}
	return s.checkpointView(ck), http.StatusCreated, nil
}

func (s *Server) sandboxCheckpoints(r *http.Request) (any, int, error) {
	cks, err := s.Checkpoints.Checkpoints(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, 0, err
	}
	return s.checkpointList(cks), 200, nil
}

func (s *Server) listCheckpoints(r *http.Request) (any, int, error) {
	cks, err := s.Checkpoints.Checkpoints(r.Context(), r.URL.Query().Get("session"))
	if err != nil {
		return nil, 0, err
	}
	return s.checkpointList(cks), 200, nil
}

func (s *Server) getCheckpoint(r *http.Request) (any, int, error) {
	ck, err := s.Checkpoints.GetCheckpoint(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, 0, err
	}
	return s.checkpointView(ck), 200, nil
}

func (s *Server) removeCheckpoint(r *http.Request) (any, int, error) {
	id := r.PathValue("id")
	if err := s.Checkpoints.RemoveCheckpoint(r.Context(), id); err != nil {
		return nil, 0, err
	}
	return map[string]string{"removed": id}, 200, nil
}

func (s *Server) restoreCheckpoint(r *http.Request) (any, int, error) {
	name, err := parseNewName(r)
	if err != nil {
		return nil, 0, err
	}
	o := sandbox.RestoreOptions{Name: name, Allow: carried(r)}
	if fromNode(r.Context()) != "" { // a fork another node moved here
		q := r.URL.Query()
		o.FromNode = q.Get("from_node")
		if q.Has("hook_errors") {
			h := sandbox.HookOptions{Ignore: q.Get("hook_errors") == "ignore"}
			h.Timeout, _ = time.ParseDuration(q.Get("hook_timeout"))
			o.Hooks = &h
		}
	}
	sb, err := s.Checkpoints.Restore(r.Context(), r.PathValue("id"), o)
	if err != nil {
		return nil, 0, err
	}
	return s.sandboxOut(r, sb), http.StatusCreated, nil
}

func (s *Server) snapshotView(sn *store.Snapshot) Snapshot {
	v := Snapshot{
		ID: sn.ID, Name: sn.Name, SandboxID: sn.SandboxID, SandboxName: sn.SandboxName, Image: sn.Image,
		ImageDigest: sn.ImageDigest, Provider: sn.Provider, DiskBytes: sn.DiskBytes, Env: sn.Env,
		Size: s.Snapshots.SnapshotSize(sn.ID), CreatedAt: sn.CreatedAt,
	}
	if v.Env == nil {
		v.Env = []string{}
	}
	return v
}

func (s *Server) createSnapshot(r *http.Request) (any, int, error) {
	req, err := parseSnapshot(r)
	if err != nil {
		return nil, 0, err
	}
	sn, err := s.Snapshots.CreateSnapshot(r.Context(), req.Sandbox, req.Name)
	if err != nil {
		return nil, 0, err
	}
	return s.snapshotView(sn), http.StatusCreated, nil
}

func (s *Server) listSnapshots(r *http.Request) (any, int, error) {
	sns, err := s.Snapshots.Snapshots(r.Context())
	if err != nil {
		return nil, 0, err
	}
	out := make([]Snapshot, 0, len(sns))
	for _, sn := range sns {
		out = append(out, s.snapshotView(sn))
	}
	return map[string]any{"snapshots": out}, 200, nil
}

func (s *Server) getSnapshot(r *http.Request) (any, int, error) {
	sn, err := s.Snapshots.GetSnapshot(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, 0, err
	}
	return s.snapshotView(sn), 200, nil
}

func (s *Server) removeSnapshot(r *http.Request) (any, int, error) {
	sn, err := s.Snapshots.RemoveSnapshot(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, 0, err
	}
	return map[string]string{"removed": sn.ID}, 200, nil
}

func environmentView(e *store.Environment) Environment {
	return Environment{
		Name: e.Name, Image: e.Image, ImageDigest: e.ImageDigest, Provider: e.Provider, MemoryBytes: e.MemoryBytes,
		CPU: float64(e.CPUMillis) / 1000, DiskBytes: e.DiskBytes, Env: e.Env, Setup: e.Setup,
		Fingerprint: e.Fingerprint, Checkpoint: e.Checkpoint, CreatedAt: e.CreatedAt, Origin: e.Origin,
	}
}

// createEnvironment answers 201 when it built the environment, 200 when
// the same definition was already built.
func (s *Server) createEnvironment(r *http.Request) (any, int, error) {
	req, err := parseEnvironment(r, s.limits())
	if err != nil {
		return nil, 0, err
	}
	env, built, err := s.Environments.CreateEnvironment(r.Context(), req)
	if err != nil {
		return nil, 0, err
	}
	code := http.StatusOK
	if built {
		code = http.StatusCreated
	}
	return environmentView(env), code, nil
}

func (s *Server) listEnvironments(r *http.Request) (any, int, error) {
	envs, err := s.Environments.Environments(r.Context())
	if err != nil {
		return nil, 0, err
	}
	out := make([]Environment, 0, len(envs))
	for _, e := range envs {
		if e.Origin != "" && s.Cluster != nil {
			continue // a copy: its origin lists it
		}
		out = append(out, environmentView(e))
	}
	return map[string]any{"environments": out}, 200, nil
}

func (s *Server) getEnvironment(r *http.Request) (any, int, error) {
	e, err := s.Environments.GetEnvironment(r.Context(), r.PathValue("name"))
	if err != nil {
		return nil, 0, err
	}
	return environmentView(e), 200, nil
}

func (s *Server) removeEnvironment(r *http.Request) (any, int, error) {
	name := r.PathValue("name")
	// In a cluster the environment goes from every node: its origin and
	// the copies others made on first use.
	removed := s.Cluster != nil && fromNode(r.Context()) == "" && s.removeEnvironmentElsewhere(r, name)
	if err := s.Environments.RemoveEnvironment(r.Context(), name); err != nil && !(removed && errdefs.Is(err, errdefs.KindNotFound)) {
		return nil, 0, err
	}
	return map[string]string{"removed": name}, 200, nil
}

func (s *Server) diskUsage(r *http.Request) (any, int, error) {
	u, err := s.Usage.DiskUsage(r.Context())
	if err != nil {
		return nil, 0, err
	}
	item := func(x sandbox.Usage) DiskUsageItem { return DiskUsageItem{Count: x.Count, Bytes: x.Bytes} }
	out := DiskUsage{Images: item(u.Images), Sandboxes: item(u.Sandboxes), Snapshots: item(u.Snapshots),
		Checkpoints: item(u.Checkpoints), Environments: item(u.Environments), Server: item(u.Server),
		Store: StoreSpace{CapacityBytes: u.Store.Capacity, PromisedBytes: u.Store.Promised, ReservedBytes: u.Store.Meta, FreeBytes: u.Store.Free,
			SizeBytes: u.StoreSize, MaxBytes: u.StoreMax},
		Host: HostSpace{TotalBytes: u.Host.Total, FreeBytes: u.Host.Avail, ReserveBytes: u.Host.Reserve}}
	out.TotalBytes = u.Images.Bytes + u.Sandboxes.Bytes + u.Snapshots.Bytes + u.Checkpoints.Bytes + u.Environments.Bytes + u.Server.Bytes
	return out, 200, nil
}
