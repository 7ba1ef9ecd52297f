package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/useshards/shard/internal/errdefs"
)

// Removing ledger sessions. A session is history: it may go only once
// nothing can write to it or restore from it — its sandbox is gone (a
// stopped one writes again when started) and it has no checkpoints left
// (their records say where their images are; shard checkpoint rm removes
// them, files and all). Removing a session removes its events.

// DeleteSession removes the session name and its events: 404 if there is
// none, 409 while its sandbox exists or it has checkpoints.
func (s *Store) DeleteSession(ctx context.Context, name string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var sandboxID string
		err := tx.QueryRowContext(ctx, `SELECT sandbox_id FROM sessions WHERE name = ?`, name).Scan(&sandboxID)
		if errors.Is(err, sql.ErrNoRows) {
			return errdefs.NotFound("session_not_found", "ledger session %s not found (shard ledger ls lists them)", name)
		}
		if err != nil {
			return err
		}
		var sbName string
		err = tx.QueryRowContext(ctx, `SELECT name FROM sandboxes WHERE id = ?`, sandboxID).Scan(&sbName)
		if err == nil {
			return errdefs.Conflict("session_in_use", "ledger session %s is still written by sandbox %s: remove the sandbox first (shard rm %s)", name, sbName, sbName)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		var cks int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM checkpoints WHERE session = ?`, name).Scan(&cks); err != nil {
			return err
		}
		if cks > 0 {
			return errdefs.Conflict("session_has_checkpoints", "ledger session %s has %d checkpoints: remove them first (shard checkpoint ls, shard checkpoint rm)", name, cks)
		}
		return deleteSessionTx(ctx, tx, name)
	})
}

func deleteSessionTx(ctx context.Context, tx *sql.Tx, name string) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM events WHERE session = ?`, name); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM sessions WHERE name = ?`, name)
	return err
}

// ExpiredSessions lists up to limit sessions that may be removed (their
// sandbox gone, no checkpoints) whose last event (or, with none, whose
// start) is before before, oldest names first.
func (s *Store) ExpiredSessions(ctx context.Context, before time.Time, limit int) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT s.name FROM sessions s
		WHERE NOT EXISTS (SELECT 1 FROM sandboxes b WHERE b.id = s.sandbox_id)
		AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.session = s.name)
		AND COALESCE((SELECT e.at FROM events e WHERE e.session = s.name ORDER BY e.seq DESC LIMIT 1), s.created_at) < ?
		ORDER BY s.name LIMIT ?`, ts(before), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}
