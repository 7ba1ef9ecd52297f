package api

import (
	"context"
	"fmt"
	"sync"
)

// streamSet is the handlers running on hijacked connections (WebSocket
// execs): http.Server.Shutdown neither waits for them nor ends them, so
// the daemon does, through WaitStreams.
type streamSet struct {
	mu     sync.Mutex
	closed bool // guarded by mu: no new stream starts
	wg     sync.WaitGroup
}

// hold counts a stream in; false once the server is shutting down.
func (x *streamSet) hold() (release func(), ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil, false
	}
	x.wg.Add(1)
	return sync.OnceFunc(x.wg.Done), true
}

// WaitStreams refuses new hijacked streams and waits, until ctx ends, for
// those running (they end once Stopping is closed).
func (s *Server) WaitStreams(ctx context.Context) error {
	s.streams.mu.Lock()
	s.streams.closed = true
	s.streams.mu.Unlock()
	done := make(chan struct{})
	go func() { s.streams.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("streams still open at the deadline: %w", ctx.Err())
	}
}

// onStopping calls f once the server starts shutting down (Stopping is
// closed), unless the returned func is called first.
func (s *Server) onStopping(f func()) (cancel func()) {
	if s.Stopping == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-s.Stopping:
			f()
		case <-done:
		}
	}()
	return sync.OnceFunc(func() { close(done) })
}

// isStopping reports whether the server is shutting down.
func (s *Server) isStopping() bool {
	if s.Stopping == nil {
		return false
	}
	select {
	case <-s.Stopping:
		return true
	default:
		return false
	}
}

// Close lets go of the connections kept to other nodes.
func (s *Server) Close() {
	if c := s.nodeClient(); c != nil {
		c.Close()
	}
}
