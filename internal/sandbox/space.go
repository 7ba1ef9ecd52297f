package sandbox

import (
	"fmt"
	"path/filepath"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/rootfs"
	"github.com/useshards/shard/internal/store"
	"github.com/useshards/shard/internal/units"
	"golang.org/x/sys/unix"
)

// hostMargin is left free on the host filesystem beside a memory image: the
// database, logs and image layers live there too.
const hostMargin = 256 << 20

// checkHostSpace refuses a memory image of up to need bytes (a checkpoint's
// or a fork's) that the data directory's filesystem cannot hold: the write
// would fail mid-freeze, or fill the host's disk.
func (s *Service) checkHostSpace(need int64, what string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Join(s.cfg.DataDir, "checkpoints"), &st); err != nil {
		return fmt.Errorf("measure the host's free space: %w", err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if need+hostMargin > free {
		return errdefs.New(errdefs.KindNoSpace, "insufficient_storage",
			"not enough disk space for %s: it needs up to %s, and the server's disk has %s free (remove checkpoints, snapshots or images)",
			what, units.FormatSize(need), units.FormatSize(max(0, free-hostMargin)))
	}
	return nil
}

// memoryImageBound is the most a memory image of sb can take: what its
// runtime may hold, the bound and, on gVisor, the headroom above it.
func memoryImageBound(sb *store.Sandbox) int64 {
	if sb.Provider == "gvisor" {
		return gvisorCgroupLimit(sb.MemoryBytes)
	}
	return sb.MemoryBytes
}

// reserveCapture promises the store what a checkpoint of src (its files'
// copy) and forks of it (each a copy of src's disk) will take, before src
// is frozen: a full store then fails the request, not the freeze.
func (s *Service) reserveCapture(srcID, ckKey string, forkIDs []string, what string) (*rootfs.Reservation, error) {
	st := s.cfg.Storage
	need := map[string]int64{st.SavedPath(ckKey): st.FileUsage(srcID)}
	for _, id := range forkIDs {
		need[st.ImagePath(id)] = st.Bound(srcID)
	}
	return st.Reserve(need, what)
}
