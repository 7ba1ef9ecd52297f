package sandbox

import (
	"fmt"
	"path/filepath"
	"sync"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/rootfs"
	"github.com/useshards/shard/internal/store"
	"github.com/useshards/shard/internal/units"
	"golang.org/x/sys/unix"
)

// hostMargin is left free on the host filesystem beside a memory image: the
// database, logs and image layers live there too.
const hostMargin = 256 << 20

// hostSpace holds what memory images being written have been promised, so
// that concurrent checkpoints and forks do not all count the same free
// space.
type hostSpace struct {
	mu      sync.Mutex
	pending int64 // guarded by mu
}

// reserveHostSpace promises need bytes of the data directory's filesystem
// to a memory image (a checkpoint's or a fork's), until release; one that
// does not fit beside what is promised is refused: the write would fail
// mid-freeze, or fill the host's disk.
func (s *Service) reserveHostSpace(need int64, what string) (release func(), err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Join(s.cfg.DataDir, "checkpoints"), &st); err != nil {
		return nil, fmt.Errorf("measure the host's free space: %w", err)
	}
	h := &s.host
	h.mu.Lock()
	defer h.mu.Unlock()
	free := int64(st.Bavail)*int64(st.Bsize) - h.pending
	if need+hostMargin > free {
		return nil, errdefs.New(errdefs.KindNoSpace, "insufficient_storage",
			"not enough disk space for %s: it needs up to %s, and the server's disk has %s free (remove checkpoints, snapshots or images)",
			what, units.FormatSize(need), units.FormatSize(max(0, free-hostMargin)))
	}
	h.pending += need
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			h.pending -= need
			h.mu.Unlock()
		})
	}, nil
}

// memoryImageBound is the most a memory image of sb can take: what its
// runtime may hold, the bound and, with a guest kernel, the headroom above
// it.
func (s *Service) memoryImageBound(sb *store.Sandbox) int64 {
	if g := s.guest(sb); g != nil {
		mem, _ := g.HostBounds(sb.MemoryBytes, sb.Pids)
		return mem
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
