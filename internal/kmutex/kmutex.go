// Package kmutex is a table of read-write mutexes by key (containerd's
// kmutex): one lifecycle step at a time per sandbox, restores of a
// checkpoint against its drop, runtime calls about one container. An entry
// is made on first use and dropped when nobody holds or waits for it, so
// the table is as small as the work under way, however many keys there
// have been.
package kmutex

import "sync"

// Keyed is the table; its zero value is ready to use.
type Keyed struct {
	mu sync.Mutex
	m  map[string]*entry // guarded by mu
}

type entry struct {
	rw   sync.RWMutex
	refs int // holders and waiters; guarded by Keyed.mu
}

// Lock holds key exclusively until unlock is called (once; later calls do
// nothing).
func (k *Keyed) Lock(key string) (unlock func()) { return k.hold(key, false) }

// RLock holds key shared with other RLocks until unlock is called.
func (k *Keyed) RLock(key string) (unlock func()) { return k.hold(key, true) }

func (k *Keyed) hold(key string, shared bool) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*entry{}
	}
	e := k.m[key]
	if e == nil {
		e = &entry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	lock, unlock := e.rw.Lock, e.rw.Unlock
	if shared {
		lock, unlock = e.rw.RLock, e.rw.RUnlock
	}
	lock()
	var once sync.Once
	return func() {
		once.Do(func() {
			unlock()
			k.mu.Lock()
			if e.refs--; e.refs == 0 {
				delete(k.m, key)
			}
			k.mu.Unlock()
		})
	}
}

// Len is how many keys are held or waited for.
func (k *Keyed) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
