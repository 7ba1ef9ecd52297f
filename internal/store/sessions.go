package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// Removing ledger sessions. A session is history: it may go only once
// nothing can write to it or restore from it — its sandbox is gone (a
// stopped one writes again when started) and it has no checkpoints left
// (their records say where their images are; shard checkpoint rm removes
// them, files and all). Removing a session removes its events.

// DeleteSession removes the session name of ctx's project and its events:
// 404 if there is none, 409 while its sandbox exists or it has checkpoints.
func (s *Store) DeleteSession(ctx context.Context, name string) error {
	if err := project.Require(ctx); err != nil {
		return err
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		cond, args := scope(ctx)
		var proj, sandboxID string
		rows, err := tx.QueryContext(ctx, `SELECT project, sandbox_id FROM sessions WHERE name = ?`+cond+` LIMIT 2`, append([]any{name}, args...)...)
		if err != nil {
			return err
		}
		found := 0
		for rows.Next() {
			if err := rows.Scan(&proj, &sandboxID); err != nil {
				rows.Close()
				return err
			}
			found++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		switch found {
		case 0:
			return errdefs.NotFound(client.CodeSessionNotFound, "ledger session %s not found (shard ledger ls lists them)", name)
		case 2:
			return ambiguous("ledger session", name)
		}
		var sbName string
		err = tx.QueryRowContext(ctx, `SELECT name FROM sandboxes WHERE id = ?`, sandboxID).Scan(&sbName)
		if err == nil {
			return errdefs.Conflict(client.CodeSessionInUse, "ledger session %s is still written by sandbox %s: remove the sandbox first (shard rm %s)", name, sbName, sbName)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		var cks int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM checkpoints WHERE project = ? AND session = ?`, proj, name).Scan(&cks); err != nil {
			return err
		}
		if cks > 0 {
			return errdefs.Conflict(client.CodeSessionHasCheckpoints, "ledger session %s has %d checkpoints: remove them first (shard checkpoint ls, shard checkpoint rm)", name, cks)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM events WHERE project = ? AND session = ?`, proj, name); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM sessions WHERE project = ? AND name = ?`, proj, name)
		return err
	})
}

// SessionKey names a session among every project's.
type SessionKey struct{ Project, Name string }

// ExpiredSessions lists up to limit sessions that may be removed (their
// sandbox gone, no checkpoints) whose last event (or, with none, whose
// start) is before before, by project and name, in every project.
func (s *Store) ExpiredSessions(ctx context.Context, before time.Time, limit int) ([]SessionKey, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, `SELECT s.project, s.name FROM sessions s
		WHERE NOT EXISTS (SELECT 1 FROM sandboxes b WHERE b.id = s.sandbox_id)
		AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.project = s.project AND c.session = s.name)
		AND COALESCE((SELECT e.at FROM events e WHERE e.project = s.project AND e.session = s.name ORDER BY e.seq DESC LIMIT 1), s.created_at) < ?
		ORDER BY s.project, s.name LIMIT ?`, ts(before), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SessionKey
	for rows.Next() {
		var k SessionKey
		if err := rows.Scan(&k.Project, &k.Name); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}
