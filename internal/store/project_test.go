package store

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// schemaV0 is the schema before projects, as a server of that version left
// its database.
const schemaV0 = `
CREATE TABLE sandboxes (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, doc TEXT NOT NULL);
CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL, type TEXT NOT NULL, sandbox_id TEXT NOT NULL, at TEXT NOT NULL, data TEXT);
CREATE INDEX events_session ON events(session, seq);
CREATE TABLE sessions (name TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE checkpoints (id TEXT PRIMARY KEY, session TEXT NOT NULL, doc TEXT NOT NULL);
CREATE TABLE snapshots (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, doc TEXT NOT NULL);
CREATE TABLE tokens (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, doc TEXT NOT NULL);
CREATE TABLE secrets (name TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE environments (name TEXT PRIMARY KEY, doc TEXT NOT NULL);
INSERT INTO sandboxes VALUES ('aaaaaaaaaaaa', 'old', '{"id":"aaaaaaaaaaaa","name":"old","session":"old","state":"running"}');
INSERT INTO sessions VALUES ('old', 'aaaaaaaaaaaa', '2025-01-01T00:00:00.000000000Z');
INSERT INTO events(session, type, sandbox_id, at) VALUES ('old', 'sandbox.created', 'aaaaaaaaaaaa', '2025-01-01T00:00:00.000000000Z');
INSERT INTO checkpoints VALUES ('cccccccccccc', 'old', '{"id":"cccccccccccc","session":"old"}');
INSERT INTO snapshots VALUES ('dddddddddddd', 'snap', '{"id":"dddddddddddd","name":"snap"}');
INSERT INTO tokens VALUES ('eeeeeeeeeeee', 'ci', '{"id":"eeeeeeeeeeee","name":"ci","scopes":["*"]}');
INSERT INTO secrets VALUES ('db', '{"name":"db"}');
INSERT INTO environments VALUES ('py', '{"name":"py"}');
`

// TestMigrateToProjects: a database from before projects opens with all of
// its data in the default project, seen from there and from the server's
// own unscoped context, and not from another project.
func TestMigrateToProjects(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shard.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(schemaV0); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s := openStore(t, path)
	var v int
	if err := s.db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil || v != schemaVersion {
		t.Fatalf("user_version = %d, %v; want %d", v, err, schemaVersion)
	}
	bg := own()
	def := project.With(bg, project.Default)
	other := project.With(bg, "other")
	for _, c := range []struct {
		name string
		get  func(context.Context) (string, error)
	}{
		{"sandbox", func(ctx context.Context) (string, error) {
			r, err := s.GetSandbox(ctx, "old")
			return proj(r, err, func() string { return r.Project })
		}},
		{"session", func(ctx context.Context) (string, error) {
			r, err := s.GetSession(ctx, "old")
			return proj(r, err, func() string { return r.Project })
		}},
		{"checkpoint", func(ctx context.Context) (string, error) {
			r, err := s.GetCheckpoint(ctx, "cccccccccccc")
			return proj(r, err, func() string { return r.Project })
		}},
		{"snapshot", func(ctx context.Context) (string, error) {
			r, err := s.GetSnapshot(ctx, "snap")
			return proj(r, err, func() string { return r.Project })
		}},
		{"token", func(ctx context.Context) (string, error) {
			r, err := s.GetToken(ctx, "ci")
			return proj(r, err, func() string { return r.Project })
		}},
		{"secret", func(ctx context.Context) (string, error) {
			r, err := s.GetSecret(ctx, "db")
			return proj(r, err, func() string { return r.Project })
		}},
		{"environment", func(ctx context.Context) (string, error) {
			r, err := s.GetEnvironment(ctx, "py")
			return proj(r, err, func() string { return r.Project })
		}},
	} {
		for _, ctx := range []context.Context{bg, def} {
			if p, err := c.get(ctx); err != nil || p != project.Default {
				t.Errorf("%s after migration = project %q, %v; want %q", c.name, p, err, project.Default)
			}
		}
		if _, err := c.get(other); !errdefs.Is(err, errdefs.KindNotFound) {
			t.Errorf("%s from project other: err = %v, want not found", c.name, err)
		}
	}
	if evs, err := s.Events(def, "old", 0, 10); err != nil || len(evs) != 1 {
		t.Errorf("Events(old) = %d, %v; want the 1 event", len(evs), err)
	}
	if evs, err := s.Events(other, "old", 0, 10); err != nil || len(evs) != 0 {
		t.Errorf("Events(old) from project other = %d, %v; want none", len(evs), err)
	}
	// Opening again does not migrate twice.
	s.Close()
	openStore(t, path).Close()

	// A shard from before projects refuses the database: the schema it
	// runs at every open (this package's schema, unchanged) fails on it,
	// where it would have seen every project's objects as one.
	old, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := old.Exec(schema); err == nil || !strings.Contains(err.Error(), "events_session") {
		t.Errorf("the old schema on a migrated database: err = %v, want it refused", err)
	}
	// And this shard refuses a database newer than it knows.
	if _, err := old.Exec(`PRAGMA user_version = 99`); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(own(), path); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Errorf("Open of schema 99: err = %v, want refused as newer", err)
	}
}

func proj[T any](r *T, err error, p func() string) (string, error) {
	if err != nil {
		return "", err
	}
	return p(), nil
}

// TestProjectsIsolate: two projects may use the same names; each sees its
// own objects only, by name and by id; the server's own context sees both,
// and a name both use is ambiguous there, never a guess.
func TestProjectsIsolate(t *testing.T) {
	s, _ := newStore(t)
	bg := own()
	a, b := project.With(bg, "a"), project.With(bg, "b")

	sa, sb := sample("aaaaaaaaaaa1", "web"), sample("bbbbbbbbbbb1", "web")
	sa.Session, sb.Session = "web", "web"
	if err := s.CreateSandbox(a, sa, &EventSpec{Type: "sandbox.created"}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(b, sb, &EventSpec{Type: "sandbox.created"}); err != nil {
		t.Fatalf("same name in another project: %v", err)
	}
	if sa.Project != "a" || sb.Project != "b" || sa.Session != "web" || sb.Session != "web" {
		t.Fatalf("projects %q %q sessions %q %q; want a b web web", sa.Project, sb.Project, sa.Session, sb.Session)
	}
	dup := sample("aaaaaaaaaaa2", "web")
	if err := s.CreateSandbox(a, dup, nil); errdefs.CodeOf(err) != "name_taken" {
		t.Errorf("same name in the same project: err = %v, want name_taken", err)
	}
	if got, err := s.GetSandbox(a, "web"); err != nil || got.ID != sa.ID {
		t.Errorf("a: GetSandbox(web) = %v, %v; want a's", got, err)
	}
	if _, err := s.GetSandbox(a, sb.ID); errdefs.CodeOf(err) != "sandbox_not_found" {
		t.Errorf("a: GetSandbox(b's id) err = %v, want sandbox_not_found", err)
	}
	if _, err := s.UpdateSandbox(a, sb.ID, func(*Sandbox) (*EventSpec, error) { return nil, nil }); errdefs.CodeOf(err) != "sandbox_not_found" {
		t.Errorf("a: UpdateSandbox(b's id) err = %v, want sandbox_not_found", err)
	}
	if err := s.DeleteSandbox(a, sb.ID, nil); errdefs.CodeOf(err) != "sandbox_not_found" {
		t.Errorf("a: DeleteSandbox(b's id) err = %v, want sandbox_not_found", err)
	}
	if l, _ := s.ListSandboxes(a); len(l) != 1 || l[0].ID != sa.ID {
		t.Errorf("a: ListSandboxes = %d, want a's one", len(l))
	}
	if l, _ := s.ListSandboxes(bg); len(l) != 2 {
		t.Errorf("server: ListSandboxes = %d, want 2", len(l))
	}
	if _, err := s.GetSandbox(bg, "web"); errdefs.CodeOf(err) != "ambiguous_name" {
		t.Errorf("server: GetSandbox(web) err = %v, want ambiguous_name", err)
	}
	if got, err := s.GetSandbox(bg, sb.ID); err != nil || got.Project != "b" {
		t.Errorf("server: GetSandbox(b's id) = %v, %v", got, err)
	}
	// Each session holds its own project's events.
	if err := s.AddEvent(b, sb, &EventSpec{Type: "sandbox.exec_started"}); err != nil {
		t.Fatal(err)
	}
	if evs, _ := s.Events(a, "web", 0, 10); len(evs) != 1 {
		t.Errorf("a: Events(web) = %d, want 1", len(evs))
	}
	if evs, _ := s.Events(b, "web", 0, 10); len(evs) != 2 {
		t.Errorf("b: Events(web) = %d, want 2", len(evs))
	}
	if ss, _ := s.Sessions(a); len(ss) != 1 || ss[0].Events != 1 {
		t.Errorf("a: Sessions = %+v, want one of 1 event", ss)
	}
	// A record of another project than its context's is refused.
	if err := s.CreateSandbox(a, &Sandbox{ID: "cccccccccccc", Name: "x", Project: "b"}, nil); err == nil {
		t.Errorf("CreateSandbox of project b in a: no error")
	}

	// Secrets, snapshots, environments, tokens, checkpoints.
	now := time.Now().UTC()
	for _, ctx := range []context.Context{a, b} {
		if err := s.PutSecret(ctx, &Secret{Name: "db", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutEnvironment(ctx, &Environment{Name: "py"}); err != nil {
			t.Fatal(err)
		}
		if err := s.AddToken(ctx, &Token{ID: newHex(ctx), Name: "ci"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddSnapshot(a, &Snapshot{ID: "dddddddddddd", Name: "snap"}, sa, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.AddCheckpoint(a, &Checkpoint{ID: "eeeeeeeeeeee", Session: "web"}, sa, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSnapshot(b, "snap"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("b: GetSnapshot(a's) err = %v", err)
	}
	if _, err := s.GetCheckpoint(b, "eeeeeeeeeeee"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("b: GetCheckpoint(a's) err = %v", err)
	}
	if l, _ := s.ListCheckpoints(b, ""); len(l) != 0 {
		t.Errorf("b: ListCheckpoints = %d, want 0", len(l))
	}
	if err := s.DeleteSecret(b, "db"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSecret(a, "db"); err != nil {
		t.Errorf("b's DeleteSecret(db) removed a's: %v", err)
	}
	if err := s.DeleteSnapshot(b, "dddddddddddd"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSnapshot(a, "snap"); err != nil {
		t.Errorf("b's DeleteSnapshot(a's id) removed it: %v", err)
	}
	for _, ctx := range []context.Context{a, b} {
		if l, _ := s.ListTokens(ctx); len(l) != 1 {
			t.Errorf("ListTokens in %v = %d, want 1", ctx, len(l))
		}
		if l, _ := s.ListEnvironments(ctx); len(l) != 1 {
			t.Errorf("ListEnvironments = %d, want 1", len(l))
		}
	}
}

func newHex(ctx context.Context) string {
	p, _ := project.From(ctx)
	return (p + "00000000000000")[:12]
}

// TestNoProjectRefused: a context that carries no project at all (neither
// project.With nor project.Unscoped) is a bug of its caller, and every
// method that reads or writes a project's rows refuses it: under test it
// panics, naming the path that lost its project.
func TestNoProjectRefused(t *testing.T) {
	s, _ := newStore(t)
	bare := context.Background()
	sb := sample("aaaaaaaaaaa1", "web")
	if err := s.CreateSandbox(own(), sb, nil); err != nil {
		t.Fatal(err)
	}
	noEvent := func(*Sandbox) (*EventSpec, error) { return nil, nil }
	for _, tt := range []struct {
		name string
		call func()
	}{
		{"CreateSandbox", func() { s.CreateSandbox(bare, sample("aaaaaaaaaaa2", "api"), nil) }},
		{"UpdateSandbox", func() { s.UpdateSandbox(bare, sb.ID, noEvent) }},
		{"DeleteSandbox", func() { s.DeleteSandbox(bare, sb.ID, nil) }},
		{"DiscardSandbox", func() { s.DiscardSandbox(bare, sb.ID) }},
		{"GetSandbox", func() { s.GetSandbox(bare, sb.ID) }},
		{"ListSandboxes", func() { s.ListSandboxes(bare) }},
		{"Events", func() { s.Events(bare, sb.Session, 0, 0) }},
		{"AddEvent", func() { s.AddEvent(bare, sb, &EventSpec{Type: "sandbox.started"}) }},
		{"LineageEvents", func() { s.LineageEvents(bare) }},
		{"AddCheckpoint", func() { s.AddCheckpoint(bare, sampleCheckpoint("cccccccccccc", sb, time.Now()), sb, nil) }},
		{"ImportCheckpoint", func() { s.ImportCheckpoint(bare, sampleCheckpoint("cccccccccccd", sb, time.Now())) }},
		{"GetCheckpoint", func() { s.GetCheckpoint(bare, "cccccccccccc") }},
		{"ListCheckpoints", func() { s.ListCheckpoints(bare, "") }},
		{"DeleteCheckpoint", func() { s.DeleteCheckpoint(bare, "cccccccccccc") }},
		{"AddSnapshot", func() { s.AddSnapshot(bare, sampleSnapshot("dddddddddddd", "snap", sb, time.Now()), sb, nil) }},
		{"GetSnapshot", func() { s.GetSnapshot(bare, "snap") }},
		{"ListSnapshots", func() { s.ListSnapshots(bare) }},
		{"DeleteSnapshot", func() { s.DeleteSnapshot(bare, "dddddddddddd") }},
		{"PutEnvironment", func() { s.PutEnvironment(bare, &Environment{Name: "py"}) }},
		{"GetEnvironment", func() { s.GetEnvironment(bare, "py") }},
		{"ListEnvironments", func() { s.ListEnvironments(bare) }},
		{"DeleteEnvironment", func() { s.DeleteEnvironment(bare, "py") }},
		{"Sessions", func() { s.Sessions(bare) }},
		{"GetSession", func() { s.GetSession(bare, sb.Session) }},
		{"DeleteSession", func() { s.DeleteSession(bare, sb.Session) }},
		{"ExpiredSessions", func() { s.ExpiredSessions(bare, time.Now(), 10) }},
		{"ResumeUsers", func() { s.ResumeUsers(bare, "cccccccccccc") }},
		{"AddToken", func() { s.AddToken(bare, &Token{ID: "eeeeeeeeeeee", Name: "ci"}) }},
		{"GetToken", func() { s.GetToken(bare, "ci") }},
		{"ListTokens", func() { s.ListTokens(bare) }},
		{"DeleteToken", func() { s.DeleteToken(bare, "eeeeeeeeeeee") }},
		{"PutSecret", func() { s.PutSecret(bare, &Secret{Name: "db"}) }},
		{"GetSecret", func() { s.GetSecret(bare, "db") }},
		{"ListSecrets", func() { s.ListSecrets(bare) }},
		{"DeleteSecret", func() { s.DeleteSecret(bare, "db") }},
		{"Projects", func() { s.Projects(bare) }},
	} {
		if !panicsWith(tt.call, project.ErrNoProject) {
			t.Errorf("%s with no project: no ErrNoProject panic", tt.name)
		}
	}
	// Nothing was written meanwhile.
	if all, err := s.ListSandboxes(own()); err != nil || len(all) != 1 {
		t.Errorf("sandboxes after the refusals: %d, %v; want the 1", len(all), err)
	}
}

// panicsWith reports whether fn panics with (an error wrapping) want.
func panicsWith(fn func(), want error) (did bool) {
	defer func() {
		err, _ := recover().(error)
		did = errors.Is(err, want)
	}()
	fn()
	return false
}
