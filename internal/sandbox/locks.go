package sandbox

import "sync"

// keyedMutex is one mutex per key (a sandbox's id, an environment's or a
// snapshot's lock name), made on first use and dropped when nobody holds
// or waits for it, so the table stays as small as the work under way
// (containerd's kmutex).
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry // guarded by mu
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int // holders and waiters; guarded by keyedMutex.mu
}

// lock holds key's mutex until unlock is called (once).
func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedEntry{}
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Unlock()
			k.mu.Lock()
			if e.refs--; e.refs == 0 {
				delete(k.m, key)
			}
			k.mu.Unlock()
		})
	}
}

// size is how many keys are held or waited for.
func (k *keyedMutex) size() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}

// ckRefs keeps a checkpoint's files while restores read them. A restore
// looks the record up and reads the files and the memory image for a few
// hundred milliseconds after; an environment's rebuild, or an rm, that
// dropped the checkpoint meanwhile made it fail with a missing file. A use
// is a read lock on the checkpoint's id, its drop the write lock.
type ckRefs struct {
	mu sync.Mutex
	m  map[string]*ckUse // guarded by mu
}

type ckUse struct {
	rw   sync.RWMutex // read: restores of the checkpoint; write: its drop
	refs int          // holders and waiters; guarded by ckRefs.mu
}

// use holds checkpoint id against drop until release is called: look the
// record up after this, so it is either gone already or stays until
// release.
func (c *ckRefs) use(id string) (release func()) { return c.hold(id, false) }

// drop holds checkpoint id while it is dropped: it waits for every use
// before, and uses after it wait until done.
func (c *ckRefs) drop(id string) (done func()) { return c.hold(id, true) }

func (c *ckRefs) hold(id string, drop bool) func() {
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]*ckUse{}
	}
	u := c.m[id]
	if u == nil {
		u = &ckUse{}
		c.m[id] = u
	}
	u.refs++
	c.mu.Unlock()
	lock, unlock := u.rw.RLock, u.rw.RUnlock
	if drop {
		lock, unlock = u.rw.Lock, u.rw.Unlock
	}
	lock()
	var once sync.Once
	return func() {
		once.Do(func() {
			unlock()
			c.mu.Lock()
			if u.refs--; u.refs == 0 {
				delete(c.m, id)
			}
			c.mu.Unlock()
		})
	}
}

// size is how many checkpoints are in use or being dropped.
func (c *ckRefs) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
