package sandbox

import (
	"context"
	"slices"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/store"
)

// snapshotKey is where the storage keeps a snapshot's files.
func snapshotKey(id string) string { return "sn-" + id }

// CreateSnapshot keeps the files of a stopped sandbox, for creates to start
// from. A running sandbox is refused: its files change under a copy, and
// what a user wants of a running one is fork or checkpoint (memory too).
func (sv *Saved) CreateSnapshot(ctx context.Context, idOrName, name string) (*store.Snapshot, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	sb, unlock, err := sv.s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := sv.s.adm.ledgerRoom(ctx, sb.Project, "snapshot sandbox "+sb.Name); err != nil {
		return nil, err
	}
	switch sb.State {
	case StateStopped, StateFailed:
	case StateRunning, StateFreezing:
		return nil, errdefs.Conflict(client.CodeSandboxRunning, "sandbox %s is running: a snapshot takes a stopped sandbox's files (shard stop %s first); to copy a running sandbox with its memory and processes, use shard fork or shard checkpoint", sb.Name, sb.Name)
	default:
		return nil, errdefs.Conflict(client.CodeSandboxBusy, "sandbox %s is %s: try again when that is done", sb.Name, sb.State)
	}
	id := newID()
	if name == "" {
		name = id
	}
	if _, err := sv.s.cfg.Store.GetSnapshot(ctx, name); err == nil {
		return nil, errdefs.Conflict(client.CodeNameTaken, "a snapshot named %s already exists", name)
	}
	release, err := sv.s.adm.reserveSaved(ctx, sb, 0, sv.s.cfg.Storage.FileUsage(sb.ID), "a snapshot of "+sb.Name)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := sv.s.cfg.Storage.Save(sb.ID, snapshotKey(id)); err != nil {
		return nil, err
	}
	sn := &store.Snapshot{
		ID: id, Name: name, SandboxID: sb.ID, SandboxName: sb.Name, CreatedAt: time.Now().UTC(),
		// The files only: a sandbox made from it takes its bounds anew.
		Shape: store.Shape{Image: sb.Image, ImageDigest: sb.ImageDigest, Provider: sb.Provider,
			Bounds: store.Bounds{DiskBytes: sb.DiskBytes}, Env: slices.Clone(sb.Env)},
	}
	err = sv.s.cfg.Store.AddSnapshot(ctx, sn, sb, &store.EventSpec{Type: ledger.SnapshotCreated, Data: ledger.SnapshotCreatedData{Snapshot: id, Name: name}})
	if err != nil {
		sv.s.cfg.Storage.RemoveSaved(snapshotKey(id))
		return nil, err
	}
	return sn, nil
}

// GetSnapshot finds a snapshot by id or name.
func (sv *Saved) GetSnapshot(ctx context.Context, idOrName string) (*store.Snapshot, error) {
	return sv.s.cfg.Store.GetSnapshot(ctx, idOrName)
}

// Snapshots lists every snapshot.
func (sv *Saved) Snapshots(ctx context.Context) ([]*store.Snapshot, error) {
	return sv.s.cfg.Store.ListSnapshots(ctx)
}

// RemoveSnapshot deletes a snapshot and frees what only it holds on disk.
// Sandboxes created from it keep their files: they are copy-on-write
// copies, not references.
func (sv *Saved) RemoveSnapshot(ctx context.Context, idOrName string) (*store.Snapshot, error) {
	sn, err := sv.s.cfg.Store.GetSnapshot(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	unlock := sv.s.locks.lock(snapshotLock(sn.ID))
	defer unlock()
	if err := sv.s.cfg.Store.DeleteSnapshot(ctx, sn.ID); err != nil {
		return nil, err
	}
	return sn, sv.s.cfg.Storage.RemoveSaved(snapshotKey(sn.ID))
}

// filesFromSnapshot gives sandbox sb a copy of snapshot snap's files. The
// snapshot is held meanwhile: a removal waits for the copy (a reflink,
// quick), and one that came first is a clear 404, not a missing file.
func (sv *Saved) filesFromSnapshot(ctx context.Context, snap *store.Snapshot, sb *store.Sandbox) error {
	unlock := sv.s.locks.lock(snapshotLock(snap.ID))
	defer unlock()
	if _, err := sv.s.cfg.Store.GetSnapshot(ctx, snap.ID); err != nil {
		if errdefs.Is(err, errdefs.KindNotFound) {
			return errdefs.NotFound(client.CodeSnapshotNotFound, "snapshot %s was removed while sandbox %s was being made from it", snap.Name, sb.Name)
		}
		return err
	}
	return sv.s.cfg.Storage.CreateFrom(snapshotKey(snap.ID), sb.ID)
}

// snapshotLock is the key of snapshot id in Service.locks (sandbox ids are
// bare, so the two never meet).
func snapshotLock(id string) string { return "snapshot/" + id }

// SnapshotSize is the bytes a snapshot's files take on disk.
func (sv *Saved) SnapshotSize(id string) int64 { return sv.s.cfg.Storage.SavedUsage(snapshotKey(id)) }
