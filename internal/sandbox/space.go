package sandbox

import (
	"github.com/useshards/shard/internal/rootfs"
	"github.com/useshards/shard/internal/store"
)

// reserveHostSpace promises need bytes of the data directory's filesystem
// to a memory image (a checkpoint's or a fork's), until release; one that
// would eat into the host's reserve is refused: the write would fail
// mid-freeze, or fill the host's disk.
func (a *Admission) reserveHostSpace(need int64, what string) (release func(), err error) {
	return a.disk.Take(need, what)
}

// memoryImageBound is the most a memory image of sb can take: what its
// runtime may hold, the bound and, with a guest kernel, the headroom above
// it.
func (a *Admission) memoryImageBound(sb *store.Sandbox) int64 {
	if g := a.s.guest(sb); g != nil {
		mem, _ := g.HostBounds(sb.MemoryBytes, sb.Pids)
		return mem
	}
	return sb.MemoryBytes
}

// reserveCapture promises the store what a checkpoint of src (its files'
// copy) and forks of it (each a copy of src's disk) will take, before src
// is frozen: a full store then fails the request, not the freeze.
func (a *Admission) reserveCapture(srcID, ckKey string, forkIDs []string, what string) (*rootfs.Reservation, error) {
	st := a.s.cfg.Storage
	need := map[string]int64{st.SavedPath(ckKey): st.FileUsage(srcID)}
	for _, id := range forkIDs {
		need[st.ImagePath(id)] = st.Bound(srcID)
	}
	return st.Reserve(need, what)
}
