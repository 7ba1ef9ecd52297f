package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// Every table has a project column, and every query of a scoped context
// (every API request is scoped) is filtered by it: an object of another
// project is not found, as if absent. Names are unique per project. The
// column is the truth; the records' Project fields are filled from it. A
// context that carries no project at all (neither project.With nor
// project.Unscoped) is refused by every method that reads or writes a
// project's rows (project.Require): a path that lost its project fails
// closed, as an internal error.

// AllProjects is the project of a token that may act in every project.
const AllProjects = "*"

// schemaVersion is the database's PRAGMA user_version once migrated.
const schemaVersion = 2

// migrations[v] brings a database from user_version v to v+1.
var migrations = []string{
	// 0 → 1: projects. Tables whose names were unique are rebuilt with
	// (project, name) unique; the others gain the column. Existing data
	// belongs to the default project.
	`
CREATE TABLE sandboxes_v1 (id TEXT PRIMARY KEY, project TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL, UNIQUE(project, name));
INSERT INTO sandboxes_v1 SELECT id, 'default', name, doc FROM sandboxes;
DROP TABLE sandboxes;
ALTER TABLE sandboxes_v1 RENAME TO sandboxes;

CREATE TABLE sessions_v1 (project TEXT NOT NULL, name TEXT NOT NULL, sandbox_id TEXT NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY(project, name));
INSERT INTO sessions_v1 SELECT 'default', name, sandbox_id, created_at FROM sessions;
DROP TABLE sessions;
ALTER TABLE sessions_v1 RENAME TO sessions;

ALTER TABLE events ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
DROP INDEX IF EXISTS events_session;
CREATE INDEX events_by_session ON events(project, session, seq);
-- A shard from before projects must not open this database: it would see
-- every project's objects as one, and its inserts lack the project. Its
-- schema's first statement that fails here is CREATE INDEX events_session
-- ("there is already a table named events_session").
CREATE TABLE events_session (why TEXT NOT NULL);
INSERT INTO events_session VALUES ('this database has projects (schema 1): a shard from before them must not open it');

ALTER TABLE checkpoints ADD COLUMN project TEXT NOT NULL DEFAULT 'default';

CREATE TABLE snapshots_v1 (id TEXT PRIMARY KEY, project TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL, UNIQUE(project, name));
INSERT INTO snapshots_v1 SELECT id, 'default', name, doc FROM snapshots;
DROP TABLE snapshots;
ALTER TABLE snapshots_v1 RENAME TO snapshots;

CREATE TABLE tokens_v1 (id TEXT PRIMARY KEY, project TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL, UNIQUE(project, name));
INSERT INTO tokens_v1 SELECT id, 'default', name, doc FROM tokens;
DROP TABLE tokens;
ALTER TABLE tokens_v1 RENAME TO tokens;

CREATE TABLE secrets_v1 (project TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY(project, name));
INSERT INTO secrets_v1 SELECT 'default', name, doc FROM secrets;
DROP TABLE secrets;
ALTER TABLE secrets_v1 RENAME TO secrets;

CREATE TABLE environments_v1 (project TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY(project, name));
INSERT INTO environments_v1 SELECT 'default', name, doc FROM environments;
DROP TABLE environments;
ALTER TABLE environments_v1 RENAME TO environments;
`,
	// 1 → 2: projects' quotas, and what each project's ledger holds, kept
	// by triggers so that every path that adds or removes events counts
	// (an exec's admission reads one row, not a sum over its events).
	`
CREATE TABLE projects (name TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE ledger_usage (project TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
INSERT INTO ledger_usage SELECT project, SUM(` + eventBytes("") + `) FROM events GROUP BY project;
CREATE TRIGGER events_counted AFTER INSERT ON events BEGIN
	INSERT INTO ledger_usage(project, bytes) VALUES (new.project, ` + eventBytes("new.") + `)
	ON CONFLICT(project) DO UPDATE SET bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER events_uncounted AFTER DELETE ON events BEGIN
	UPDATE ledger_usage SET bytes = max(0, bytes - (` + eventBytes("old.") + `)) WHERE project = old.project;
END;
`,
}

// eventBytes is the SQL of the bytes an events row holds (of row prefix
// "new.", "old." or ""): its columns' lengths and a row's overhead.
func eventBytes(row string) string {
	return "32 + length(" + row + "session) + length(" + row + "type) + length(" + row + "sandbox_id) + length(" + row + "at) + coalesce(length(" + row + "data), 0)"
}

// indexes are made at every open, outside the schema's versions: a shard
// of the same schema without them reads and writes the database as well.
// sandboxes_by_name serves the server's own lookups by id or name (a
// project's use the (project, name) index; the server's scanned every
// sandbox), checkpoints_by_session the checkpoints of a session (listed by
// resume and checkpoint ls; also scanned all), events_by_type the fork
// tree's events (a few types among every exec's).
const indexes = `
CREATE INDEX IF NOT EXISTS sandboxes_by_name ON sandboxes(name);
CREATE INDEX IF NOT EXISTS checkpoints_by_session ON checkpoints(session, project);
CREATE INDEX IF NOT EXISTS events_by_type ON events(project, type, seq);
`

// migrate runs the migrations the database has not had, each in one
// transaction with its new user_version, so a crash leaves it at a version;
// then it makes the indexes.
func migrate(ctx context.Context, db *sql.DB) error {
	var v int
	if err := db.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v); err != nil {
		return err
	}
	if v > schemaVersion {
		return fmt.Errorf("the database is of schema %d, newer than this shard's %d: use a newer shard", v, schemaVersion)
	}
	if v == 0 { // new, or from before projects
		if _, err := db.ExecContext(ctx, schema); err != nil {
			return err
		}
	}
	for ; v < schemaVersion; v++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate schema %d to %d: %w", v, v+1, err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, v+1)); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	_, err := db.ExecContext(ctx, indexes)
	return err
}

// scope is the SQL condition that keeps ctx's project's rows (" AND
// project = ?" and its argument), or nothing for the server's own work.
func scope(ctx context.Context) (string, []any) {
	// A context with no project at all sees nothing (From says "-", no
	// project's name); under test it panics here, where it went wrong.
	_ = project.Require(ctx)
	if p, ok := project.From(ctx); ok {
		return ` AND project = ?`, []any{p}
	}
	return "", nil
}

// ProjectOf is projectOf for the stores kept elsewhere (the cluster's).
func ProjectOf(ctx context.Context, rec string) (string, error) { return projectOf(ctx, rec) }

// projectOf is the project a new record made under ctx belongs to: its own
// if it names one (a fork's is its source's), else ctx's. A record of
// another project than a scoped ctx's is a bug of the caller's, refused.
func projectOf(ctx context.Context, rec string) (string, error) {
	if err := project.Require(ctx); err != nil {
		return "", err
	}
	p, scoped := project.From(ctx)
	switch {
	case rec == "" && scoped:
		return p, nil
	case rec == "":
		return project.Default, nil
	case scoped && rec != p && rec != AllProjects:
		return "", fmt.Errorf("a record of project %s written in project %s", rec, p)
	}
	return rec, nil
}

// Ambiguous is ambiguous for the stores kept elsewhere (the cluster's).
func Ambiguous(what, name string) error { return ambiguous(what, name) }

// ambiguous is the error of a name that, seen from every project, names
// objects of several: the server's own lookups are by id.
func ambiguous(what, name string) error {
	return errdefs.Conflict(client.CodeAmbiguousName, "%s %s exists in more than one project: give its id, or choose a project", what, name)
}

// projected is a record whose project the store fills in from its column.
type projected[T any] interface {
	*T
	setProject(string)
}

func (s *Sandbox) setProject(p string)     { s.Project = p }
func (c *Checkpoint) setProject(p string)  { c.Project = p }
func (s *Snapshot) setProject(p string)    { s.Project = p }
func (e *Environment) setProject(p string) { e.Project = p }
func (t *Token) setProject(p string)       { t.Project = p }
func (s *Secret) setProject(p string)      { s.Project = p }

// ProjectCounts is a project and how many objects of each kind it holds.
type ProjectCounts struct {
	Name         string
	Sandboxes    int
	Sessions     int
	Checkpoints  int
	Snapshots    int
	Environments int
	Secrets      int
	Tokens       int
}

// Projects lists the projects that hold anything (ctx's only, when it is
// scoped), by name.
func (s *Store) Projects(ctx context.Context) ([]*ProjectCounts, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	cond, args := scope(ctx)
	byName := map[string]*ProjectCounts{}
	for _, t := range []struct {
		table string
		n     func(*ProjectCounts) *int
	}{
		{"sandboxes", func(p *ProjectCounts) *int { return &p.Sandboxes }},
		{"sessions", func(p *ProjectCounts) *int { return &p.Sessions }},
		{"checkpoints", func(p *ProjectCounts) *int { return &p.Checkpoints }},
		{"snapshots", func(p *ProjectCounts) *int { return &p.Snapshots }},
		{"environments", func(p *ProjectCounts) *int { return &p.Environments }},
		{"secrets", func(p *ProjectCounts) *int { return &p.Secrets }},
		{"tokens", func(p *ProjectCounts) *int { return &p.Tokens }},
	} {
		rows, err := s.db.QueryContext(ctx, `SELECT project, COUNT(*) FROM `+t.table+` WHERE project != '*'`+cond+` GROUP BY project`, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var name string
			var n int
			if err := rows.Scan(&name, &n); err != nil {
				rows.Close()
				return nil, err
			}
			p := byName[name]
			if p == nil {
				p = &ProjectCounts{Name: name}
				byName[name] = p
			}
			*t.n(p) = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	out := make([]*ProjectCounts, 0, len(byName))
	for _, p := range byName {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *ProjectCounts) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
