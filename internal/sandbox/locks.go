package sandbox

import (
	"context"

	"github.com/useshards/shard/internal/kmutex"
)

// keyedMutex is one lifecycle step at a time per sandbox (by id), and per
// environment and snapshot (by their lock names).
type keyedMutex struct{ k kmutex.Keyed }

// lock holds key until unlock is called (once).
func (m *keyedMutex) lock(key string) (unlock func()) { return m.k.Lock(key) }

// lockCtx is lock, giving up when ctx ends first: a request waiting behind
// a long step (a fork's freeze may last minutes) ends when its caller
// leaves.
func (m *keyedMutex) lockCtx(ctx context.Context, key string) (unlock func(), err error) {
	return m.k.LockCtx(ctx, key)
}

// size is how many keys are held or waited for.
func (m *keyedMutex) size() int { return m.k.Len() }

// ckRefs keeps a checkpoint's files while restores read them. A restore
// looks the record up and reads the files and the memory image for a few
// hundred milliseconds after; an environment's rebuild, or an rm, that
// dropped the checkpoint meanwhile made it fail with a missing file. A use
// is a read lock on the checkpoint's id, its drop the write lock.
type ckRefs struct{ k kmutex.Keyed }

// use holds checkpoint id against drop until release is called: look the
// record up after this, so it is either gone already or stays until
// release.
func (c *ckRefs) use(id string) (release func()) { return c.k.RLock(id) }

// drop holds checkpoint id while it is dropped: it waits for every use
// before, and uses after it wait until done.
func (c *ckRefs) drop(id string) (done func()) { return c.k.Lock(id) }

// size is how many checkpoints are in use or being dropped.
func (c *ckRefs) size() int { return c.k.Len() }
