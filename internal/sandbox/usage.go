package sandbox

import (
	"context"
	"os"
	"path/filepath"

	"github.com/useshards/shard/internal/hostdir"
	"github.com/useshards/shard/internal/hostdisk"
	"github.com/useshards/shard/internal/rootfs"
)

// Usage is a count and the bytes they hold on disk.
type Usage struct {
	Count int
	Bytes int64
}

// DiskUsage is what each kind of thing holds on disk (`shard df`). Blocks
// that reflinked copies share are counted in each copy, so the figures are
// an upper bound of what removing one would free. Server is everything else
// the server keeps (its database, the agent binaries, the empty filesystem
// templates, runtime logs); Store is the sandbox store's promises.
type DiskUsage struct {
	Images, Sandboxes, Snapshots, Checkpoints, Environments, Server Usage

	Store               rootfs.Space
	StoreSize, StoreMax int64          // the store image's size, and the most it may grow to now
	Host                hostdisk.State // the data directory's filesystem
}

// DiskUsage measures the image cache, every sandbox's files, snapshots,
// and checkpoints (an environment's apart from the others).
func (a *Admission) DiskUsage(ctx context.Context) (*DiskUsage, error) {
	var u DiskUsage
	imgs, err := a.s.cfg.Images.List(ctx)
	if err != nil {
		return nil, err
	}
	u.Images = Usage{Count: len(imgs), Bytes: hostdir.Blocks(a.s.cfg.Images.Dir())}
	sbs, err := a.s.cfg.Store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	for _, sb := range sbs {
		u.Sandboxes.Count++
		u.Sandboxes.Bytes += a.s.cfg.Storage.FileUsage(sb.ID)
	}
	sns, err := a.s.cfg.Store.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	for _, sn := range sns {
		u.Snapshots.Count++
		u.Snapshots.Bytes += a.s.saved.SnapshotSize(sn.ID)
	}
	envs, err := a.s.cfg.Store.ListEnvironments(ctx)
	if err != nil {
		return nil, err
	}
	envCk := map[string]bool{}
	for _, e := range envs {
		envCk[e.Checkpoint] = true
	}
	cks, err := a.s.cfg.Store.ListCheckpoints(ctx, "")
	if err != nil {
		return nil, err
	}
	for _, ck := range cks {
		n := a.s.saved.checkpointSize(ck.ID)
		if envCk[ck.ID] {
			u.Environments.Count++
			u.Environments.Bytes += n
		} else {
			u.Checkpoints.Count++
			u.Checkpoints.Bytes += n
		}
	}
	n, b := a.s.cfg.Storage.TemplateUsage()
	u.Server.Count += n
	u.Server.Bytes += b
	for _, d := range []string{"agent", "run"} {
		u.Server.Count++
		u.Server.Bytes += hostdir.Blocks(filepath.Join(a.s.cfg.DataDir, d))
	}
	backing := a.s.cfg.Storage.Backing()
	if ents, err := os.ReadDir(a.s.cfg.DataDir); err == nil {
		for _, e := range ents {
			// The database and its journal, the key, the lock; the store's
			// image holds the sandboxes' disks and is shown as the store.
			if p := filepath.Join(a.s.cfg.DataDir, e.Name()); e.Type().IsRegular() && p != backing {
				u.Server.Count++
				u.Server.Bytes += hostdir.Blocks(p)
			}
		}
	}
	if u.Store, err = a.s.cfg.Storage.Space(); err != nil {
		return nil, err
	}
	u.StoreSize, u.StoreMax = a.s.cfg.Storage.Size()
	if u.Host, err = a.disk.State(); err != nil {
		return nil, err
	}
	return &u, nil
}
