// Package store is shard's metadata store: one embedded SQLite database
// (modernc.org/sqlite, no cgo) under the data directory.
//
// Every state change of a sandbox and the ledger event that records it are
// written in one transaction (see UpdateSandbox), so the ledger never misses
// a change that happened and never tells of one that did not.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Store wraps the database.
type Store struct {
	db *sql.DB

	mu      sync.Mutex
	changed chan struct{} // closed (and replaced) when events are appended; guarded by mu

	addrMu sync.Mutex
	addrs  addrIndex // guarded by addrMu

	onAppend func(time.Duration) // see ObserveAppends

	converted  time.Duration // see Converted
	convertErr error
	reg        Registry // see SetRegistry; nil on a single host
}

// Shape is what a sandbox is made of and bounded by: its image, runtime,
// bounds and environment. Every record a sandbox can be made from (a
// checkpoint, a snapshot, an environment) embeds it, as the sandbox's own
// record does, so a make copies one value and a new bound is added here
// only. A snapshot keeps the files only: its bounds are unset.
type Shape struct {
	Image       string `json:"image"`        // as the user gave it
	ImageDigest string `json:"image_digest"` // manifest digest
	Provider    string `json:"provider"`
	Bounds
	Env []string `json:"env"`
}

// Bounds are what a sandbox may use. The ledger's sandbox.created event
// embeds them too (zero ones left out).
type Bounds struct {
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	CPUMillis   int64 `json:"cpu_millis,omitempty"` // 1000 = one cpu
	DiskBytes   int64 `json:"disk_bytes,omitempty"`
	Pids        int64 `json:"pids,omitempty"`
}

// Clone is a copy of sh that shares no memory with it.
func (sh Shape) Clone() Shape {
	sh.Env = slices.Clone(sh.Env)
	return sh
}

// Sandbox is the persisted record of a sandbox.
type Sandbox struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Project string `json:"project,omitempty"`
	Shape
	State    string `json:"state"`
	IP       string `json:"ip"`
	Token    string `json:"token"`               // agent token; never shown by the API
	AgentDir string `json:"agent_dir,omitempty"` // host dir mounted at /.shard in the running instance
	Error    string `json:"error,omitempty"`
	OOMKills int64  `json:"oom_kills"`
	ParentID string `json:"parent_id,omitempty"`
	// ParentName is the parent's name when this one was made; Generation
	// counts the forks (and restores) between it and its lineage's first
	// sandbox. Both are in its /run/shard/fork (proto.Identity).
	ParentName string            `json:"parent_name,omitempty"`
	Generation int               `json:"generation,omitempty"`
	Session    string            `json:"session"` // ledger session name
	Labels     map[string]string `json:"labels,omitempty"`
	Grants     []Grant           `json:"grants,omitempty"` // secrets given to it (names, never values)
	Policy     *Policy           `json:"policy,omitempty"` // its egress network policy
	// Origin is what it was made from; nil for a sandbox made before
	// shard recorded it.
	Origin    *Origin   `json:"origin,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	StartedAt time.Time `json:"started_at"`
	StoppedAt time.Time `json:"stopped_at"`
}

// Origin is what a sandbox was made from, named as it was then: the names
// still say what it was once that is removed (an environment's setup
// sandbox is, at once), which a bare parent id does not.
type Origin struct {
	Kind       string `json:"kind"`                 // image, snapshot, environment, fork, checkpoint, session
	Name       string `json:"name,omitempty"`       // the image, snapshot, environment, forked sandbox or session; a checkpoint's tag
	ID         string `json:"id,omitempty"`         // the snapshot's, forked sandbox's or checkpoint's id
	Checkpoint string `json:"checkpoint,omitempty"` // the checkpoint a fork, environment or resume started from
}

// Grant makes a secret available inside a sandbox: as an environment
// variable of every exec (Env), or as a file (File).
type Grant struct {
	Secret string    `json:"secret"`
	Env    string    `json:"env,omitempty"`
	File   string    `json:"file,omitempty"`
	At     time.Time `json:"at"`
	// Dirs are the directories writing File made in the sandbox (outermost
	// first): the ungrant removes those that are empty.
	Dirs []string `json:"dirs,omitempty"`
}

// Policy is a sandbox's egress policy (see internal/network.Policy).
type Policy struct {
	DenyAll bool     `json:"deny_all,omitempty"`
	Allow   []string `json:"allow,omitempty"`
	Deny    []string `json:"deny,omitempty"`
}

// Event is a ledger entry.
type Event struct {
	Seq       int64           `json:"seq"`
	Project   string          `json:"project,omitempty"`
	Session   string          `json:"session"`
	Type      string          `json:"type"`
	SandboxID string          `json:"sandbox_id"`
	At        time.Time       `json:"at"`
	Data      json.RawMessage `json:"data,omitempty"`
}

// schema is the database before projects (version 0), where every
// database starts; migrations (project.go) bring it to schemaVersion.
const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	session TEXT NOT NULL,
	type TEXT NOT NULL,
	sandbox_id TEXT NOT NULL,
	at TEXT NOT NULL,
	data TEXT
);
CREATE INDEX IF NOT EXISTS events_session ON events(session, seq);
CREATE TABLE IF NOT EXISTS sessions (
	name TEXT PRIMARY KEY,
	sandbox_id TEXT NOT NULL,
	created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
	id TEXT PRIMARY KEY,
	session TEXT NOT NULL,
	doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshots (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS secrets (
	name TEXT PRIMARY KEY,
	doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS environments (
	name TEXT PRIMARY KEY,
	doc TEXT NOT NULL
);
`

// Open opens (creating if needed) the database at path.
func Open(ctx context.Context, path string) (*Store, error) {
	ctx = project.Unscoped(ctx, "the store's own: its migrations and the address index of every project")
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(FULL)&_pragma=foreign_keys(ON)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// synchronous(FULL): a commit is on disk before it returns, so an event
	// the API acknowledged survives a crash of the server or of the host.
	// One writer at a time is SQLite's rule anyway; one connection keeps
	// transactions simple and avoids SQLITE_BUSY between our own goroutines.
	db.SetMaxOpenConns(1)
	// Before the schema, so a new database is made in the mode; an older
	// one is rewritten once (see ensureIncremental). A failed switch (no
	// disk for the rewrite) leaves the database working as it was.
	converted, convertErr := ensureIncremental(ctx, db)
	if err := migrate(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("init %s: %w", path, err)
	}
	s := &Store{db: db, changed: make(chan struct{}), converted: converted, convertErr: convertErr}
	if err := s.addrs.load(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// EventSpec is an event to write with a change.
type EventSpec struct {
	Type    string
	Session string // defaults to the sandbox's session
	Data    any
}

// Registry is told of every sandbox this store makes or removes: a cluster (internal/cluster) keeps names unique across its
// nodes and knows where each sandbox lives. Claim refuses a name another
// node's sandbox holds (name_taken), or fails when the registry cannot be
// reached, and then nothing is made.
type Registry interface {
	Claim(ctx context.Context, sb *Sandbox) error
	// Release forgets sb; a registry that cannot be reached now puts it
	// right when it reconciles (and logs why it could not).
	Release(ctx context.Context, sb *Sandbox)
}

// EnvRegistry is a Registry that also keeps environments' names (those
// built here, not copies) unique across a cluster's nodes, and says where
// each was built.
type EnvRegistry interface {
	ClaimEnvironment(ctx context.Context, e *Environment) error
	ReleaseEnvironment(ctx context.Context, e *Environment)
}

// SetRegistry makes reg the store's registry (before the store is used).
func (s *Store) SetRegistry(reg Registry) { s.reg = reg }

// CreateSandbox inserts a new record (and its ledger session and event).
func (s *Store) CreateSandbox(ctx context.Context, sb *Sandbox, ev *EventSpec) (err error) {
	if sb.Project, err = projectOf(ctx, sb.Project); err != nil {
		return err
	}
	if s.reg != nil {
		if err := s.reg.Claim(ctx, sb); err != nil {
			return err
		}
		defer func() {
			if err != nil {
				s.reg.Release(context.WithoutCancel(ctx), sb)
			}
		}()
	}
	want := sb.Session
	err = s.tx(ctx, func(tx *sql.Tx) error {
		// Sessions outlive their sandboxes, so a name can come back: the
		// new sandbox's session is NAME-2, NAME-3... (never a mix of two
		// sandboxes' events in one session).
		if want != "" {
			for n := 1; ; n++ {
				sb.Session = want
				if n > 1 {
					sb.Session = fmt.Sprintf("%s-%d", want, n)
				}
				res, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO sessions(project, name, sandbox_id, created_at) VALUES(?,?,?,?)`, sb.Project, sb.Session, sb.ID, ts(time.Now()))
				if err != nil {
					return err
				}
				if k, _ := res.RowsAffected(); k == 1 {
					break
				}
			}
		}
		doc, err := json.Marshal(sb)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandboxes(id, project, name, doc) VALUES(?,?,?,?)`, sb.ID, sb.Project, sb.Name, string(doc)); err != nil {
			if uniqueViolation(err) {
				return errdefs.Conflict(client.CodeNameTaken, "a sandbox named %s already exists: pick another name, or remove that sandbox first", sb.Name)
			}
			return err
		}
		return addEvent(ctx, tx, sb, ev)
	})
	if err != nil {
		sb.Session = want
		return err
	}
	s.indexAddr(sb.ID, sb.IP)
	return nil
}

// UpdateSandbox reads the record, applies fn, and writes it back with the
// event, in one transaction. fn may return an error to abort.
func (s *Store) UpdateSandbox(ctx context.Context, id string, fn func(*Sandbox) (*EventSpec, error)) (*Sandbox, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	var out *Sandbox
	err := s.tx(ctx, func(tx *sql.Tx) error {
		sb, err := getTx(ctx, tx, `id = ?1`, id)
		if err != nil {
			return err
		}
		was := sb.Name
		ev, err := fn(sb)
		if err != nil {
			return err
		}
		if sb.Name != was {
			// No lifecycle step renames a sandbox. One that did would
			// have to claim the name in the registry (etcd) first, outside
			// this transaction: a call over the network here would hold
			// the database's one connection, and every request with it.
			return fmt.Errorf("sandbox %s: an update may not rename it (to %s)", was, sb.Name)
		}
		doc, err := json.Marshal(sb)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET doc = ?, name = ? WHERE id = ?`, string(doc), sb.Name, sb.ID); err != nil {
			if uniqueViolation(err) {
				return errdefs.Conflict(client.CodeNameTaken, "a sandbox named %s already exists: pick another name, or remove that sandbox first", sb.Name)
			}
			return err
		}
		out = sb
		return addEvent(ctx, tx, sb, ev)
	})
	if err == nil {
		s.indexAddr(out.ID, out.IP)
	}
	return out, err
}

// DeleteSandbox removes the record, writing ev in the same transaction.
func (s *Store) DeleteSandbox(ctx context.Context, id string, ev *EventSpec) error {
	if err := project.Require(ctx); err != nil {
		return err
	}
	var gone *Sandbox
	err := s.tx(ctx, func(tx *sql.Tx) error {
		sb, err := getTx(ctx, tx, `id = ?1`, id)
		if err != nil {
			return err
		}
		gone = sb
		if _, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
			return err
		}
		return addEvent(ctx, tx, sb, ev)
	})
	if err == nil {
		s.unindexAddr(id)
		if s.reg != nil {
			s.reg.Release(context.WithoutCancel(ctx), gone)
		}
	}
	return err
}

// DiscardSandbox undoes a record that was never made into a sandbox (a
// batch refused after it was written): the record, the events it wrote,
// and its ledger session when the record started it and nothing else
// wrote to it. A refused request leaves no history of what never was.
func (s *Store) DiscardSandbox(ctx context.Context, id string) error {
	if err := project.Require(ctx); err != nil {
		return err
	}
	var gone *Sandbox
	err := s.tx(ctx, func(tx *sql.Tx) error {
		sb, err := getTx(ctx, tx, `id = ?1`, id)
		if err != nil {
			return err
		}
		gone = sb
		if _, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM events WHERE project = ? AND session = ? AND sandbox_id = ?`, sb.Project, sb.Session, id); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM sessions WHERE project = ? AND name = ? AND sandbox_id = ?
			AND NOT EXISTS (SELECT 1 FROM events WHERE project = ? AND session = ?)`, sb.Project, sb.Session, id, sb.Project, sb.Session)
		return err
	})
	if err == nil {
		s.unindexAddr(id)
		if s.reg != nil {
			s.reg.Release(context.WithoutCancel(ctx), gone)
		}
	}
	return err
}

// GetSandbox finds a sandbox by id or name.
func (s *Store) GetSandbox(ctx context.Context, idOrName string) (*Sandbox, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() // a read: nothing to commit, nobody to wake
	return getTx(ctx, tx, `id = ?1 OR name = ?1`, idOrName)
}

// ListSandboxes returns every sandbox, oldest first.
func (s *Store) ListSandboxes(ctx context.Context) ([]*Sandbox, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	out, err := list[Sandbox](ctx, s.db, "sandboxes")
	sortByCreated(out)
	return out, err
}

// Events returns a session's events after seq, at most limit.
func (s *Store) Events(ctx context.Context, session string, after int64, limit int) ([]Event, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 1000
	}
	// A session is its project's: an unscoped ctx (the server's own)
	// reads the default project's.
	return s.queryEvents(ctx, `SELECT seq, project, session, type, sandbox_id, at, data FROM events WHERE project = ? AND session = ? AND seq > ? ORDER BY seq LIMIT ?`, project.Of(ctx), session, after, limit)
}

// queryEvents runs a query of events' columns (seq, project, session,
// type, sandbox_id, at, data) and reads its rows.
func (s *Store) queryEvents(ctx context.Context, query string, args ...any) ([]Event, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		var at string
		var data sql.NullString
		if err := rows.Scan(&e.Seq, &e.Project, &e.Session, &e.Type, &e.SandboxID, &at, &data); err != nil {
			return nil, err
		}
		e.At, _ = time.Parse(time.RFC3339Nano, at)
		if data.Valid && data.String != "" {
			e.Data = json.RawMessage(data.String)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// AddEvent appends an event to a sandbox's session on its own. It returns
// once the event is on disk.
func (s *Store) AddEvent(ctx context.Context, sb *Sandbox, ev *EventSpec) error {
	if err := project.Require(ctx); err != nil {
		return err
	}
	start := time.Now()
	err := s.tx(ctx, func(tx *sql.Tx) error { return addEvent(ctx, tx, sb, ev) })
	if s.onAppend != nil && err == nil {
		s.onAppend(time.Since(start))
	}
	return err
}

// ObserveAppends has fn told how long each event appended on its own took
// to reach the disk (the metrics' ledger append latency). Call it before
// the store is shared.
func (s *Store) ObserveAppends(fn func(time.Duration)) { s.onAppend = fn }

func addEvent(ctx context.Context, tx *sql.Tx, sb *Sandbox, ev *EventSpec) error {
	_, err := addEventSeq(ctx, tx, sb, ev)
	return err
}

// addEventSeq appends ev and returns its sequence number (0 if none).
func addEventSeq(ctx context.Context, tx *sql.Tx, sb *Sandbox, ev *EventSpec) (int64, error) {
	if ev == nil {
		return 0, nil
	}
	session := ev.Session
	if session == "" {
		session = sb.Session
	}
	if session == "" {
		return 0, nil
	}
	var data any
	if ev.Data != nil {
		b, err := json.Marshal(ev.Data)
		if err != nil {
			return 0, err
		}
		data = string(b)
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO events(project, session, type, sandbox_id, at, data) VALUES(?,?,?,?,?,?)`,
		project.OrDefault(sb.Project), session, ev.Type, sb.ID, ts(time.Now()), data)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// getTx finds the one sandbox that where (with its one argument, ?1) finds
// in ctx's project.
func getTx(ctx context.Context, tx *sql.Tx, where string, arg any) (*Sandbox, error) {
	return getDoc[Sandbox](ctx, tx, "sandboxes", where, arg, errdefs.NotFound(client.CodeSandboxNotFound, "sandbox %s not found", arg))
}

func (s *Store) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.notify()
	return nil
}

// notify wakes everyone waiting in Changed. Cheap enough to call after
// every write: a closed channel and a new one.
func (s *Store) notify() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// Changed returns a channel that is closed at the next committed write
// (ledger followers wait on it, then read what is new).
func (s *Store) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// ts is a fixed-width time, so that text order is time order (RFC3339Nano
// drops trailing zeros); time.RFC3339Nano parses it.
func ts(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000000Z07:00") }

func sortByCreated(s []*Sandbox) {
	slices.SortStableFunc(s, func(a, b *Sandbox) int { return a.CreatedAt.Compare(b.CreatedAt) })
}

// LineageEvents returns, oldest first, the events of ctx's project that say
// where sandboxes, checkpoints and snapshots came from and when sandboxes
// went (the fork tree's input): created, checkpoint_created,
// snapshot_created, forked (a fork's name) and removed, of every session, removed sandboxes' too.
func (s *Store) LineageEvents(ctx context.Context) ([]Event, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	return s.queryEvents(ctx, `SELECT seq, project, session, type, sandbox_id, at, data FROM events
		WHERE project = ? AND type IN ('sandbox.created', 'sandbox.checkpoint_created', 'sandbox.snapshot_created', 'sandbox.forked', 'sandbox.removed') ORDER BY seq`, project.Of(ctx))
}

// uniqueViolation reports whether err is SQLite's refusal of a row whose
// unique key another holds. Each insert or update that checks it has one
// unique key a caller can collide on, (project, name): the id is random.
func uniqueViolation(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE
}
