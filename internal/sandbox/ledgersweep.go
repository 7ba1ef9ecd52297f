package sandbox

import (
	"context"
	"time"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// The ledger's retention (shard serve --ledger-retention): a session whose
// sandbox is gone, that has no checkpoints left, and whose last event is
// older than the retention is removed with its events. One sweep every
// tenth of the retention (at least a minute apart, at most an hour), in
// batches: its cost follows the sessions due, not the sandboxes.

// sweepBatch is how many sessions one query of a sweep takes.
const sweepBatch = 100

// SweepLedger removes expired ledger sessions until ctx ends. With no
// retention it returns at once.
func (ss *Sessions) SweepLedger(ctx context.Context) {
	keep := ss.s.cfg.LedgerRetention
	if keep <= 0 {
		return
	}
	t := time.NewTicker(min(max(keep/10, time.Minute), time.Hour))
	defer t.Stop()
	for {
		if n := ss.sweepLedger(ctx, time.Now().Add(-keep)); n > 0 {
			ss.s.cfg.Log.Info("ledger sessions past their retention removed", "sessions", n, "retention", keep)
			ss.s.saved.kickSpace() // their events' pages go back to the filesystem
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweepLedger removes the sessions that expired before before and returns
// how many it removed.
func (ss *Sessions) sweepLedger(ctx context.Context, before time.Time) int {
	ctx = project.Unscoped(ctx, "the ledger's retention: every project's expired sessions")
	removed := 0
	for {
		keys, err := ss.s.cfg.Store.ExpiredSessions(ctx, before, sweepBatch)
		if err != nil {
			if ctx.Err() == nil {
				ss.s.cfg.Log.Warn("ledger retention: listing expired sessions", "err", err)
			}
			return removed
		}
		n := 0
		for _, k := range keys {
			err := ss.s.cfg.Store.DeleteSession(project.With(ctx, k.Project), k.Name)
			switch {
			case err == nil:
				n++
			case errdefs.Is(err, errdefs.KindConflict), errdefs.Is(err, errdefs.KindNotFound):
				// Taken up again (a checkpoint, a sandbox) or removed
				// meanwhile: not ours to remove.
			default:
				if ctx.Err() == nil {
					ss.s.cfg.Log.Warn("ledger retention: removing a session", "project", k.Project, "session", k.Name, "err", err)
				}
				return removed + n
			}
		}
		removed += n
		if len(keys) < sweepBatch || n == 0 {
			return removed
		}
	}
}

// RemoveSession removes a ledger session and its events (see
// store.DeleteSession), then has the space they took given back to the
// filesystem in the background (ReclaimSpace): the answer does not wait for
// it.
func (ss *Sessions) RemoveSession(ctx context.Context, name string) error {
	if err := ss.s.cfg.Store.DeleteSession(ctx, name); err != nil {
		return err
	}
	ss.s.saved.kickSpace()
	return nil
}
