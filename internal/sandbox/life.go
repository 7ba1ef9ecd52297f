package sandbox

import (
	"context"
	"fmt"

	"github.com/useshards/shard/internal/closing"
	"github.com/useshards/shard/internal/provider"
)

// life is the service's own goroutines: the ones a request does not wait
// for (a death's handling, a watch, a checkpoint's copy to disk, an exec's
// pump). Close waits them out, so nothing writes to the database after the
// daemon closed it and a shutdown leaves no goroutine behind.
type life struct{ closing.Group }

// goBG runs f in a goroutine Close waits for, unless the service is
// closing (then f does not run, and goBG reports false).
func (l *life) goBG(f func()) bool { return l.Go(f) }

// stopping reports whether Close has begun.
func (l *life) stopping() bool { return l.Closing() }

// Close ends the service's own work, in order: no new background work
// starts, warm spares and sandboxes made ahead go (nothing may outlive the
// server of them), memory
// watches end, running execs are let go (their commands run on in the
// sandboxes; their ends are not recorded), and then it waits, until ctx
// ends, for the goroutines still running and for the providers' own (a
// checkpoint image still being copied to disk). Sandboxes keep running.
func (s *Service) Close(ctx context.Context) error {
	if !s.life.Begin() {
		return nil
	}
	s.saved.DropSpares()
	s.ahead.close()
	s.mem.stopAll()
	s.execs.closeAll()
	if err := s.life.Wait(ctx); err != nil {
		return fmt.Errorf("sandbox service: background work still running at the deadline: %w", err)
	}
	for _, name := range s.order {
		if c, ok := s.providers[name].(provider.Closer); ok {
			if err := c.Close(ctx); err != nil {
				return fmt.Errorf("provider %s: %w", name, err)
			}
		}
	}
	return nil
}
