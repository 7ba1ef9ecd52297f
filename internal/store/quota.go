package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/useshards/shard/internal/project"
)

// Quota bounds what one project may hold; a zero field has no bound. An
// administrator sets them (shard project set); a project with none set
// has none, as on a server of one user.
type Quota struct {
	Sandboxes   int64 `json:"max_sandboxes,omitempty"`    // sandboxes, whatever their state
	MemoryBytes int64 `json:"max_memory_bytes,omitempty"` // the memory bounds of its running sandboxes and warm spares
	CPUMillis   int64 `json:"max_cpu_millis,omitempty"`   // their cpu bounds
	DiskBytes   int64 `json:"max_disk_bytes,omitempty"`   // its sandboxes' disk bounds, whatever their state
	SavedBytes  int64 `json:"max_saved_bytes,omitempty"`  // what its checkpoints and snapshots take
	LedgerBytes int64 `json:"max_ledger_bytes,omitempty"` // what its ledger's events take
}

// ProjectQuota is the quota of project name (none set: the zero Quota).
func (s *Store) ProjectQuota(ctx context.Context, name string) (Quota, error) {
	var doc string
	err := s.db.QueryRowContext(ctx, `SELECT doc FROM projects WHERE name = ?`, name).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return Quota{}, nil
	}
	if err != nil {
		return Quota{}, err
	}
	var q Quota
	if err := json.Unmarshal([]byte(doc), &q); err != nil {
		return Quota{}, fmt.Errorf("quota of project %s: %w", name, err)
	}
	return q, nil
}

// SetProjectQuota sets project name's quota; the zero Quota removes it.
func (s *Store) SetProjectQuota(ctx context.Context, name string, q Quota) error {
	if err := project.Check(name); err != nil {
		return err
	}
	if q == (Quota{}) {
		_, err := s.db.ExecContext(ctx, `DELETE FROM projects WHERE name = ?`, name)
		return err
	}
	doc, err := json.Marshal(q)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO projects(name, doc) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET doc = excluded.doc`, name, string(doc))
	return err
}

// ProjectQuotas is every project's quota that is set, by name.
func (s *Store) ProjectQuotas(ctx context.Context) (map[string]Quota, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, doc FROM projects`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]Quota{}
	for rows.Next() {
		var name, doc string
		if err := rows.Scan(&name, &doc); err != nil {
			return nil, err
		}
		var q Quota
		if err := json.Unmarshal([]byte(doc), &q); err != nil {
			return nil, fmt.Errorf("quota of project %s: %w", name, err)
		}
		out[name] = q
	}
	return out, rows.Err()
}

// LedgerBytes is what project name's ledger events take (as counted by
// the events table's triggers: columns' lengths and a row's overhead).
func (s *Store) LedgerBytes(ctx context.Context, name string) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT bytes FROM ledger_usage WHERE project = ?`, name).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return n, err
}
