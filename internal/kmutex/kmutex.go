// Package kmutex is a table of read-write mutexes by key (containerd's
// kmutex): one lifecycle step at a time per sandbox, restores of a
// checkpoint against its drop, runtime calls about one container. An entry
// is made on first use and dropped when nobody holds or waits for it, so
// the table is as small as the work under way, however many keys there
// have been.
package kmutex

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"
)

// Keyed is the table; its zero value is ready to use.
type Keyed struct {
	mu sync.Mutex
	m  map[string]*entry // guarded by mu
}

// entry is one key's lock: a weighted semaphore, so that a wait can end
// with its context (a sync.RWMutex's cannot). A reader takes 1, a writer
// all of it; waiters are served in order, so readers do not starve a
// writer.
type entry struct {
	sem  *semaphore.Weighted
	refs int // holders and waiters; guarded by Keyed.mu
}

// readers is the most RLocks held at once on one key.
const readers = 1 << 30

// Lock holds key exclusively until unlock is called (once; later calls do
// nothing).
func (k *Keyed) Lock(key string) (unlock func()) {
	unlock, _ = k.hold(context.Background(), key, readers)
	return unlock
}

// RLock holds key shared with other RLocks until unlock is called.
func (k *Keyed) RLock(key string) (unlock func()) {
	unlock, _ = k.hold(context.Background(), key, 1)
	return unlock
}

// LockCtx is Lock, giving up when ctx ends first (its error then).
func (k *Keyed) LockCtx(ctx context.Context, key string) (unlock func(), err error) {
	return k.hold(ctx, key, readers)
}

func (k *Keyed) hold(ctx context.Context, key string, weight int64) (func(), error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*entry{}
	}
	e := k.m[key]
	if e == nil {
		e = &entry{sem: semaphore.NewWeighted(readers)}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	forget := func() {
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	if err := e.sem.Acquire(ctx, weight); err != nil {
		forget()
		return nil, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			e.sem.Release(weight)
			forget()
		})
	}, nil
}

// Len is how many keys are held or waited for.
func (k *Keyed) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
