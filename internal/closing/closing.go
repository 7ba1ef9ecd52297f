// Package closing is work a shutdown waits for: goroutines and held
// operations counted in a Group, none of which starts once the group is
// closing. Its zero value is ready to use.
package closing

import (
	"context"
	"sync"
)

// Group counts what runs until it is closed, then refuses more and waits
// for what runs.
type Group struct {
	mu      sync.Mutex
	closing bool          // guarded by mu
	done    chan struct{} // closed by Begin; made on first use, guarded by mu
	wg      sync.WaitGroup
}

func (g *Group) doneLocked() chan struct{} {
	if g.done == nil {
		g.done = make(chan struct{})
	}
	return g.done
}

// Hold counts one more in until release is called (once; later calls do
// nothing); false once the group is closing.
func (g *Group) Hold() (release func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return nil, false
	}
	g.wg.Add(1)
	return sync.OnceFunc(g.wg.Done), true
}

// Go runs f in a goroutine the group waits for, unless it is closing
// (then f does not run, and Go reports false).
func (g *Group) Go(f func()) bool {
	release, ok := g.Hold()
	if !ok {
		return false
	}
	go func() {
		defer release()
		f()
	}()
	return true
}

// Done is closed once the group begins closing.
func (g *Group) Done() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.doneLocked()
}

// Closing reports whether the group has begun closing.
func (g *Group) Closing() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closing
}

// Begin starts the closing: nothing more is held or run. It reports
// whether this call began it (false for a group already closing).
func (g *Group) Begin() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return false
	}
	g.closing = true
	close(g.doneLocked())
	return true
}

// Wait waits, until ctx ends, for what the group holds (ctx's error then).
// Call it after Begin: before it, more may still be held.
func (g *Group) Wait(ctx context.Context) error {
	waited := make(chan struct{})
	go func() {
		g.wg.Wait()
		close(waited)
	}()
	select {
	case <-waited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
