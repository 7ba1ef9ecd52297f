package sandbox

import "sync"

// Saved is what the service keeps of sandboxes: checkpoints (checkpoint.go;
// restored from by restore.go, sent between nodes by transfer.go, removed
// when no sandbox needs them by retention.go), snapshots (snapshot.go) and
// environments (environment.go) with their warm spares (spare.go).
type Saved struct {
	s      *Service
	spares *sparePool // environments' warm spares

	retainMu  sync.Mutex    // one sweep of fork checkpoints at a time (retention.go)
	spaceKick chan struct{} // asks ReclaimSpace for a pass; buffered 1
}
