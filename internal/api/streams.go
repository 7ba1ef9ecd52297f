package api

import (
	"context"
	"fmt"
	"sync"
)

// WaitStreams refuses new hijacked streams (WebSocket execs: the server's
// Shutdown neither waits for them nor ends them) and waits, until ctx
// ends, for those running (they end once Stopping is closed).
func (s *Server) WaitStreams(ctx context.Context) error {
	s.streams.Begin()
	if err := s.streams.Wait(ctx); err != nil {
		return fmt.Errorf("streams still open at the deadline: %w", err)
	}
	return nil
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
