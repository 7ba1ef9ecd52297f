package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// Checkpoint is a saved instant of a running sandbox: a memory image and a
// copy of its files. It is self-contained: everything a restore needs is
// here, so it outlives the sandbox it was taken of.
type Checkpoint struct {
	ID          string `json:"id"`
	Project     string `json:"project,omitempty"`
	Kind        string `json:"kind"` // checkpoint, fork, environment
	Tag         string `json:"tag,omitempty"`
	SandboxID   string `json:"sandbox_id"`
	SandboxName string `json:"sandbox_name"`
	Session     string `json:"session"`
	Seq         int64  `json:"seq"` // of its checkpoint_created event
	Shape
	Token    string `json:"token"`     // the agent's, which lives on in the image's memory
	AgentDir string `json:"agent_dir"` // the agent binary the image's memory maps
	FreezeMS int64  `json:"freeze_ms"`
	// Generation is the sandbox's at the checkpoint (a restore's is one more).
	Generation int `json:"generation,omitempty"`
	// Memory is how the image's memory reaches a restore (provider.MemoryHandoff
	// or MemoryPages), MemoryNote why not handed over.
	Memory     string  `json:"memory,omitempty"`
	MemoryNote string  `json:"memory_note,omitempty"`
	Grants     []Grant `json:"grants,omitempty"`
	Policy     *Policy `json:"policy,omitempty"`
	// Keep, on a fork's checkpoint, keeps it until it is removed by hand
	// (fork --keep-checkpoint); without it the checkpoint goes once no
	// sandbox needs it (see AutoRemove). Other kinds are never removed
	// by shard on its own.
	Keep      bool      `json:"keep,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// AutoRemove says whether shard removes ck on its own once no sandbox
// needs it: a fork's checkpoint not asked to be kept. A checkpoint the user
// took, and an environment's, stay until removed by hand.
func (ck *Checkpoint) AutoRemove() bool { return ck.Kind == "fork" && !ck.Keep }

// Snapshot is the files of a stopped sandbox.
type Snapshot struct {
	ID          string    `json:"id"`
	Project     string    `json:"project,omitempty"`
	Name        string    `json:"name"`
	SandboxID   string    `json:"sandbox_id"`
	SandboxName string    `json:"sandbox_name"`
	Shape                 // the files' image and disk; no other bound
	CreatedAt   time.Time `json:"created_at"`
}

// Environment is a named set-up state: a checkpoint creates start from.
type Environment struct {
	Name    string `json:"name"`
	Project string `json:"project,omitempty"`
	Shape
	Setup       [][]string `json:"setup,omitempty"`
	Fingerprint string     `json:"fingerprint"`
	Checkpoint  string     `json:"checkpoint"`
	CreatedAt   time.Time  `json:"created_at"`
	// Origin is, for a copy cached on this node of a cluster, the node that
	// built the environment; "" for one built here.
	Origin string `json:"origin,omitempty"`
}

// Session is a ledger session with a summary of its events.
type Session struct {
	Project   string
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
	if err := project.Require(ctx); err != nil { // before the event is written
		return err
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		seq, err := addEventSeq(ctx, tx, sb, ev)
		if err != nil {
			return err
		}
		ck.Seq = seq
		if ck.Project, err = projectOf(ctx, sb.Project); err != nil {
			return err
		}
		doc, err := json.Marshal(ck)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO checkpoints(id, project, session, doc) VALUES(?,?,?,?)`, ck.ID, ck.Project, ck.Session, string(doc))
		return err
	})
}

// ImportCheckpoint records a checkpoint another node took (its ledger
// event stays in its sandbox's session there).
func (s *Store) ImportCheckpoint(ctx context.Context, ck *Checkpoint) error {
	if err := project.Require(ctx); err != nil {
		return err
	}
	doc, err := json.Marshal(ck)
	if err != nil {
		return err
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO checkpoints(id, project, session, doc) VALUES(?,?,?,?)`, ck.ID, ck.Project, ck.Session, string(doc))
		return err
	})
}

// GetCheckpoint finds a checkpoint by id.
func (s *Store) GetCheckpoint(ctx context.Context, id string) (*Checkpoint, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	return getDoc[Checkpoint](ctx, s.db, "checkpoints", `id = ?1`, id,
		errdefs.NotFound(client.CodeCheckpointNotFound, "checkpoint %s not found (shard checkpoint ls lists them)", id))
}

// ListCheckpoints returns the checkpoints of a session ("" for all),
// oldest first.
func (s *Store) ListCheckpoints(ctx context.Context, session string) ([]*Checkpoint, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	cond, args := scope(ctx)
	q := `SELECT project, doc FROM checkpoints WHERE 1` + cond
	if session != "" {
		q, args = q+` AND session = ?`, append(args, session)
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
	var err error
	if sn.Project, err = projectOf(ctx, sb.Project); err != nil {
		return err
	}
	doc, err := json.Marshal(sn)
	if err != nil {
		return err
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO snapshots(id, project, name, doc) VALUES(?,?,?,?)`, sn.ID, sn.Project, sn.Name, string(doc)); err != nil {
			if uniqueViolation(err) {
				return errdefs.Conflict(client.CodeNameTaken, "a snapshot named %s already exists", sn.Name)
			}
			return err
		}
		return addEvent(ctx, tx, sb, ev)
	})
}

// GetSnapshot finds a snapshot by id or name.
func (s *Store) GetSnapshot(ctx context.Context, idOrName string) (*Snapshot, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	return getDoc[Snapshot](ctx, s.db, "snapshots", `id = ?1 OR name = ?1`, idOrName,
		errdefs.NotFound(client.CodeSnapshotNotFound, "snapshot %s not found (shard snapshot ls lists them)", idOrName))
}

// ListSnapshots returns every snapshot, oldest first.
func (s *Store) ListSnapshots(ctx context.Context) ([]*Snapshot, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	out, err := list[Snapshot](ctx, s.db, "snapshots")
	slices.SortStableFunc(out, func(a, b *Snapshot) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, err
}

// DeleteSnapshot removes a snapshot's record.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	return s.deleteRow(ctx, "snapshots", "id", id)
}

// EnvironmentNotFound is the error of an environment that is not there.
func EnvironmentNotFound(name string) error {
	return errdefs.NotFound(client.CodeEnvironmentNotFound, "environment %s not found (shard env ls lists them)", name)
}

// PutEnvironment creates or replaces an environment.
func (s *Store) PutEnvironment(ctx context.Context, e *Environment) error {
	var err error
	if e.Project, err = projectOf(ctx, e.Project); err != nil {
		return err
	}
	if reg, ok := s.reg.(EnvRegistry); ok && e.Origin == "" {
		if err := reg.ClaimEnvironment(ctx, e); err != nil {
			return err
		}
	}
	doc, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO environments(project, name, doc) VALUES(?,?,?) ON CONFLICT(project, name) DO UPDATE SET doc = excluded.doc`, e.Project, e.Name, string(doc))
		return err
	})
}

// GetEnvironment finds an environment by name.
func (s *Store) GetEnvironment(ctx context.Context, name string) (*Environment, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	return getDoc[Environment](ctx, s.db, "environments", `name = ?1`, name, EnvironmentNotFound(name))
}

// ListEnvironments returns every environment by name.
func (s *Store) ListEnvironments(ctx context.Context) ([]*Environment, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	out, err := list[Environment](ctx, s.db, "environments")
	slices.SortStableFunc(out, func(a, b *Environment) int { return strings.Compare(a.Name, b.Name) })
	return out, err
}

// DeleteEnvironment removes an environment's record.
func (s *Store) DeleteEnvironment(ctx context.Context, name string) error {
	if err := project.Require(ctx); err != nil {
		return err
	}
	e, _ := s.GetEnvironment(ctx, name)
	if err := s.deleteRow(ctx, "environments", "name", name); err != nil {
		return err
	}
	if reg, ok := s.reg.(EnvRegistry); ok && e != nil && e.Origin == "" {
		reg.ReleaseEnvironment(context.WithoutCancel(ctx), e)
	}
	return nil
}

const sessionSummary = `SELECT s.project, s.name, s.sandbox_id, s.created_at,
	(SELECT COUNT(*) FROM events e WHERE e.project = s.project AND e.session = s.name),
	(SELECT e.type || ' ' || e.at FROM events e WHERE e.project = s.project AND e.session = s.name ORDER BY e.seq DESC LIMIT 1)
	FROM sessions s WHERE 1`

// Sessions lists every ledger session, oldest first.
func (s *Store) Sessions(ctx context.Context) ([]*Session, error) {
	return s.querySessions(ctx, "", ` ORDER BY s.created_at, s.name`)
}

// GetSession returns one session.
func (s *Store) GetSession(ctx context.Context, name string) (*Session, error) {
	found, err := s.sessionsWhere(ctx, ` AND s.name = ?`, name)
	if err != nil {
		return nil, err
	}
	switch len(found) {
	case 0:
		return nil, errdefs.NotFound(client.CodeSessionNotFound, "ledger session %s not found (shard ledger ls lists them)", name)
	case 1:
		return found[0], nil
	}
	return nil, ambiguous("ledger session", name)
}

// FindSession returns the session ref names: the session of the live
// sandbox of that name or id, else the session of that name, else that of
// the removed sandbox of that id. A live sandbox wins, as every verb takes
// a sandbox's name: when a new sandbox took the name of a removed one, its
// session is NAME-2 and the removed one's session NAME is reached by that
// sandbox's id.
func (s *Store) FindSession(ctx context.Context, ref string) (*Session, error) {
	sb, err := s.GetSandbox(ctx, ref)
	if err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		return nil, err
	}
	if sb != nil {
		found, err := s.sessionsWhere(ctx, ` AND s.project = ? AND s.name = ?`, sb.Project, sb.Session)
		if err != nil {
			return nil, err
		}
		if len(found) == 1 {
			return found[0], nil
		}
	}
	ss, err := s.GetSession(ctx, ref)
	if !errdefs.Is(err, errdefs.KindNotFound) {
		return ss, err
	}
	found, err := s.sessionsWhere(ctx, ` AND s.sandbox_id = ?`, ref)
	if err != nil {
		return nil, err
	}
	switch len(found) {
	case 0:
		return nil, errdefs.NotFound(client.CodeSessionNotFound,
			"ledger session %s not found, nor a sandbox of that name or id (a removed sandbox's by id): shard ledger ls lists sessions", ref)
	case 1:
		return found[0], nil
	}
	return nil, ambiguous("the ledger session of sandbox", ref)
}

// sessionsWhere is at most two sessions of ctx's projects matching cond
// (" AND ...", over sessions s) with args: two say it is ambiguous.
func (s *Store) sessionsWhere(ctx context.Context, cond string, args ...any) ([]*Session, error) {
	return s.querySessions(ctx, cond, ` LIMIT 2`, args...)
}

// querySessions is the sessions of ctx's projects matching cond (" AND
// ...", over sessions s) with args, then tail (an order, a limit).
func (s *Store) querySessions(ctx context.Context, cond, tail string, args ...any) ([]*Session, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	pcond, pargs := scope(ctx)
	rows, err := s.db.QueryContext(ctx, sessionSummary+cond+strings.ReplaceAll(pcond, "project", "s.project")+tail, append(args, pargs...)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var found []*Session
	for rows.Next() {
		ss, err := scanSession(rows)
		if err != nil {
			return nil, err
		}
		found = append(found, ss)
	}
	return found, rows.Err()
}

func scanSession(row interface{ Scan(...any) error }) (*Session, error) {
	var ss Session
	var created string
	var last sql.NullString
	if err := row.Scan(&ss.Project, &ss.Name, &ss.SandboxID, &created, &ss.Events, &last); err != nil {
		return nil, err
	}
	ss.CreatedAt, _ = time.Parse(time.RFC3339Nano, created)
	if typ, at, ok := strings.Cut(last.String, " "); ok {
		ss.LastType = typ
		ss.LastAt, _ = time.Parse(time.RFC3339Nano, at)
	}
	return &ss, nil
}

// deleteRow deletes the rows of table whose key column equals v, in ctx's
// project (table and column are this package's constants, never input).
func (s *Store) deleteRow(ctx context.Context, table, column string, v any) error {
	if err := project.Require(ctx); err != nil {
		return err
	}
	cond, args := scope(ctx)
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE `+column+` = ?`+cond, append([]any{v}, args...)...)
		return err
	})
}

// getDoc reads the one record of table that where (with its one argument,
// ?1) finds in ctx's project; notFound is returned when there is none, and
// an ambiguous_name conflict when an unscoped lookup finds several.
func getDoc[T any, PT projected[T]](ctx context.Context, db querier, table, where string, arg any, notFound error) (*T, error) {
	cond, args := scope(ctx)
	out, err := listDocs[T, PT](ctx, db, `SELECT project, doc FROM `+table+` WHERE (`+where+`)`+cond+` LIMIT 2`, append([]any{arg}, args...)...)
	switch {
	case err != nil:
		return nil, err
	case len(out) == 0:
		return nil, notFound
	case len(out) > 1:
		return nil, ambiguous(strings.TrimSuffix(table, "s"), fmt.Sprint(arg))
	}
	return out[0], nil
}

// listDocs decodes the records a query of (project, doc) rows returns.
func listDocs[T any, PT projected[T]](ctx context.Context, db querier, q string, args ...any) ([]*T, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*T
	for rows.Next() {
		var proj, doc string
		if err := rows.Scan(&proj, &doc); err != nil {
			return nil, err
		}
		v := new(T)
		if err := json.Unmarshal([]byte(doc), v); err != nil {
			return nil, fmt.Errorf("decode record: %w", err)
		}
		PT(v).setProject(proj)
		out = append(out, v)
	}
	return out, rows.Err()
}

// querier is a database or a transaction.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// list returns table's records in ctx's project.
func list[T any, PT projected[T]](ctx context.Context, db *sql.DB, table string) ([]*T, error) {
	cond, args := scope(ctx)
	return listDocs[T, PT](ctx, db, `SELECT project, doc FROM `+table+` WHERE 1`+cond, args...)
}
