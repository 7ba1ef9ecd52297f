package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/useshards/shard/internal/errdefs"
)

// Checkpoint is a saved instant of a running sandbox: a memory image and a
// copy of its files. It is self-contained: everything a restore needs is
// here, so it outlives the sandbox it was taken of.
type Checkpoint struct {
	ID          string    `json:"id"`
	Kind        string    `json:"kind"` // checkpoint, fork, environment
	Tag         string    `json:"tag,omitempty"`
	SandboxID   string    `json:"sandbox_id"`
	SandboxName string    `json:"sandbox_name"`
	Session     string    `json:"session"`
	Seq         int64     `json:"seq"` // of its checkpoint_created event
	Image       string    `json:"image"`
	ImageDigest string    `json:"image_digest"`
	Provider    string    `json:"provider"`
	MemoryBytes int64     `json:"memory_bytes"`
	CPUMillis   int64     `json:"cpu_millis"`
	DiskBytes   int64     `json:"disk_bytes"`
	Pids        int64     `json:"pids"`
	Env         []string  `json:"env"`
	Token       string    `json:"token"`     // the agent's, which lives on in the image's memory
	AgentDir    string    `json:"agent_dir"` // the agent binary the image's memory maps
	FreezeMS    int64     `json:"freeze_ms"`
	Grants      []Grant   `json:"grants,omitempty"`
	Policy      *Policy   `json:"policy,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
}

// Snapshot is the files of a stopped sandbox.
type Snapshot struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	SandboxID   string    `json:"sandbox_id"`
	SandboxName string    `json:"sandbox_name"`
	Image       string    `json:"image"`
	ImageDigest string    `json:"image_digest"`
	Provider    string    `json:"provider"`
	DiskBytes   int64     `json:"disk_bytes"`
	Env         []string  `json:"env"`
	CreatedAt   time.Time `json:"created_at"`
}

// Environment is a named set-up state: a checkpoint creates start from.
type Environment struct {
	Name        string     `json:"name"`
	Image       string     `json:"image"`
	ImageDigest string     `json:"image_digest"`
	Provider    string     `json:"provider"`
	MemoryBytes int64      `json:"memory_bytes"`
	CPUMillis   int64      `json:"cpu_millis"`
	DiskBytes   int64      `json:"disk_bytes"`
	Env         []string   `json:"env,omitempty"`
	Setup       [][]string `json:"setup,omitempty"`
	Fingerprint string     `json:"fingerprint"`
	Checkpoint  string     `json:"checkpoint"`
	CreatedAt   time.Time  `json:"created_at"`
}

// Session is a ledger session with a summary of its events.
type Session struct {
	Name      string
	SandboxID string
	CreatedAt time.Time
	Events    int64
	LastType  string
	LastAt    time.Time
}

// AddCheckpoint records ck and appends its checkpoint_created event (ev,
// to sb's session) in one transaction; ck.Seq becomes the event's number.
func (s *Store) AddCheckpoint(ctx context.Context, ck *Checkpoint, sb *Sandbox, ev *EventSpec) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		seq, err := addEventSeq(ctx, tx, sb, ev)
		if err != nil {
			return err
		}
		ck.Seq = seq
		doc, err := json.Marshal(ck)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO checkpoints(id, session, doc) VALUES(?,?,?)`, ck.ID, ck.Session, string(doc))
		return err
	})
}

// GetCheckpoint finds a checkpoint by id.
func (s *Store) GetCheckpoint(ctx context.Context, id string) (*Checkpoint, error) {
	return getDoc[Checkpoint](ctx, s.db, `SELECT doc FROM checkpoints WHERE id = ?`, id,
		errdefs.NotFound("checkpoint_not_found", "checkpoint %s not found (shard checkpoint ls lists them)", id))
}

// ListCheckpoints returns the checkpoints of a session ("" for all),
// oldest first.
func (s *Store) ListCheckpoints(ctx context.Context, session string) ([]*Checkpoint, error) {
	q, args := `SELECT doc FROM checkpoints`, []any{}
	if session != "" {
		q, args = q+` WHERE session = ?`, append(args, session)
	}
	out, err := listDocs[Checkpoint](ctx, s.db, q, args...)
	slices.SortStableFunc(out, func(a, b *Checkpoint) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, err
}

// DeleteCheckpoint removes a checkpoint's record.
func (s *Store) DeleteCheckpoint(ctx context.Context, id string) error {
	return s.deleteRow(ctx, "checkpoints", "id", id)
}

// AddSnapshot records a snapshot and appends ev to sb's session.
func (s *Store) AddSnapshot(ctx context.Context, sn *Snapshot, sb *Sandbox, ev *EventSpec) error {
	doc, err := json.Marshal(sn)
	if err != nil {
		return err
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO snapshots(id, name, doc) VALUES(?,?,?)`, sn.ID, sn.Name, string(doc)); err != nil {
			if strings.Contains(err.Error(), "snapshots.name") {
				return errdefs.Conflict("name_taken", "a snapshot named %s already exists", sn.Name)
			}
			return err
		}
		return addEvent(ctx, tx, sb, ev)
	})
}

// GetSnapshot finds a snapshot by id or name.
func (s *Store) GetSnapshot(ctx context.Context, idOrName string) (*Snapshot, error) {
	return getDoc[Snapshot](ctx, s.db, `SELECT doc FROM snapshots WHERE id = ?1 OR name = ?1 LIMIT 1`, idOrName,
		errdefs.NotFound("snapshot_not_found", "snapshot %s not found (shard snapshot ls lists them)", idOrName))
}

// ListSnapshots returns every snapshot, oldest first.
func (s *Store) ListSnapshots(ctx context.Context) ([]*Snapshot, error) {
	out, err := listDocs[Snapshot](ctx, s.db, `SELECT doc FROM snapshots`)
	slices.SortStableFunc(out, func(a, b *Snapshot) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, err
}

// DeleteSnapshot removes a snapshot's record.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	return s.deleteRow(ctx, "snapshots", "id", id)
}

// PutEnvironment creates or replaces an environment.
func (s *Store) PutEnvironment(ctx context.Context, e *Environment) error {
	doc, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO environments(name, doc) VALUES(?,?) ON CONFLICT(name) DO UPDATE SET doc = excluded.doc`, e.Name, string(doc))
		return err
	})
}

// GetEnvironment finds an environment by name.
func (s *Store) GetEnvironment(ctx context.Context, name string) (*Environment, error) {
	return getDoc[Environment](ctx, s.db, `SELECT doc FROM environments WHERE name = ?`, name,
		errdefs.NotFound("environment_not_found", "environment %s not found (shard env ls lists them)", name))
}

// ListEnvironments returns every environment by name.
func (s *Store) ListEnvironments(ctx context.Context) ([]*Environment, error) {
	out, err := listDocs[Environment](ctx, s.db, `SELECT doc FROM environments`)
	slices.SortStableFunc(out, func(a, b *Environment) int { return strings.Compare(a.Name, b.Name) })
	return out, err
}

// DeleteEnvironment removes an environment's record.
func (s *Store) DeleteEnvironment(ctx context.Context, name string) error {
	return s.deleteRow(ctx, "environments", "name", name)
}

const sessionSummary = `SELECT s.name, s.sandbox_id, s.created_at,
	(SELECT COUNT(*) FROM events e WHERE e.session = s.name),
	(SELECT e.type || ' ' || e.at FROM events e WHERE e.session = s.name ORDER BY e.seq DESC LIMIT 1)
	FROM sessions s`

// Sessions lists every ledger session, oldest first.
func (s *Store) Sessions(ctx context.Context) ([]*Session, error) {
	rows, err := s.db.QueryContext(ctx, sessionSummary+` ORDER BY s.created_at, s.name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Session
	for rows.Next() {
		ss, err := scanSession(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, ss)
	}
	return out, rows.Err()
}

// GetSession returns one session.
func (s *Store) GetSession(ctx context.Context, name string) (*Session, error) {
	ss, err := scanSession(s.db.QueryRowContext(ctx, sessionSummary+` WHERE s.name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.NotFound("session_not_found", "ledger session %s not found (shard ledger ls lists them)", name)
	}
	return ss, err
}

func scanSession(row interface{ Scan(...any) error }) (*Session, error) {
	var ss Session
	var created string
	var last sql.NullString
	if err := row.Scan(&ss.Name, &ss.SandboxID, &created, &ss.Events, &last); err != nil {
		return nil, err
	}
	ss.CreatedAt, _ = time.Parse(time.RFC3339Nano, created)
	if typ, at, ok := strings.Cut(last.String, " "); ok {
		ss.LastType = typ
		ss.LastAt, _ = time.Parse(time.RFC3339Nano, at)
	}
	return &ss, nil
}

// deleteRow deletes the rows of table whose key column equals v (table and
// column are this package's constants, never input).
func (s *Store) deleteRow(ctx context.Context, table, column string, v any) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE `+column+` = ?`, v)
		return err
	})
}

// getDoc reads one JSON document; notFound is returned when there is none.
func getDoc[T any](ctx context.Context, db *sql.DB, q string, arg any, notFound error) (*T, error) {
	var doc string
	err := db.QueryRowContext(ctx, q, arg).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, notFound
	}
	if err != nil {
		return nil, err
	}
	v := new(T)
	if err := json.Unmarshal([]byte(doc), v); err != nil {
		return nil, fmt.Errorf("decode record: %w", err)
	}
	return v, nil
}

func listDocs[T any](ctx context.Context, db *sql.DB, q string, args ...any) ([]*T, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*T
	for rows.Next() {
		var doc string
		if err := rows.Scan(&doc); err != nil {
			return nil, err
		}
		v := new(T)
		if err := json.Unmarshal([]byte(doc), v); err != nil {
			return nil, fmt.Errorf("decode record: %w", err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
