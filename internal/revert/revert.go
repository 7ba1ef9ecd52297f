// Package revert undoes the steps of an operation that failed half-way.
//
// An operation that makes several things (a record, files, a network
// namespace, a runtime container) must leave none of them behind when a
// later step fails. Rather than a hand-written undo closure per function,
// each step registers its undo as it succeeds, and one deferred Fail runs
// them all, newest first, unless the operation reached Success:
//
//	r := revert.New()
//	defer r.Fail()
//	rec, err := makeRecord()
//	if err != nil {
//		return err
//	}
//	r.Add(func() { deleteRecord(rec) })
//	...
//	r.Success()
//
// The shape is Incus's (github.com/lxc/incus, shared/revert).
package revert

import "sync"

// Reverter holds the undo steps of one operation. Its methods are safe for
// concurrent use, so steps run in parallel may register their own undos.
type Reverter struct {
	mu    sync.Mutex
	undo  []func()
	ended bool // Fail ran or Success was called
}

// New returns an empty Reverter.
func New() *Reverter { return &Reverter{} }

// Add registers undo steps, to run (newest first) if the operation fails.
// Add after Success or Fail runs nothing and keeps nothing.
func (r *Reverter) Add(undo ...func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return
	}
	r.undo = append(r.undo, undo...)
}

// Fail runs the undo steps registered so far, newest first, unless Success
// was called. It runs them once: a second Fail (or one after Success) does
// nothing, so it is safe to defer and also call early.
func (r *Reverter) Fail() {
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		return
	}
	r.ended = true
	undo := r.undo
	r.undo = nil
	r.mu.Unlock()
	// Outside the lock: an undo may take long (a runtime call) and must
	// not block an Add from a step still under way.
	for i := len(undo) - 1; i >= 0; i-- {
		undo[i]()
	}
}

// Success keeps everything the operation made: the undo steps are dropped.
func (r *Reverter) Success() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = true
	r.undo = nil
}

// Clone returns a Reverter holding the same undo steps, and ends r as
// Success does: the clone is now the one that undoes them. It hands the
// undo of a finished part on to a caller that may still fail later
// (Incus's Clone, used with a returned cleanup function).
func (r *Reverter) Clone() *Reverter {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := &Reverter{undo: r.undo, ended: r.ended}
	r.ended = true
	r.undo = nil
	return c
}
