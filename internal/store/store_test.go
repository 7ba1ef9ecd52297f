package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// openStore opens a store at path and closes it when the test ends.
func openStore(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(own(), path)
	if err != nil {
		t.Fatalf("Open(%q) error = %v, want nil", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newStore(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "shard.db")
	return openStore(t, path), path
}

var t0 = time.Date(2025, 3, 4, 5, 6, 7, 890123456, time.UTC)

// sample returns a sandbox with every field set.
func sample(id, name string) *Sandbox {
	return &Sandbox{
		ID:        id,
		Name:      name,
		State:     "creating",
		IP:        "10.88.0.2",
		Token:     "secret-" + id,
		OOMKills:  0,
		ParentID:  "",
		Session:   "sess-" + id,
		Labels:    map[string]string{"team": "x", "ünïcode": "✓"},
		CreatedAt: t0,
		Shape:     Shape{Image: "alpine:3", ImageDigest: "sha256:abc", Provider: "gvisor", Bounds: Bounds{MemoryBytes: 512 << 20, CPUMillis: 1500, DiskBytes: 1 << 30, Pids: 256}, Env: []string{"A=1", "B=two words"}},
	}
}

func mustCreate(t *testing.T, s *Store, sb *Sandbox, ev *EventSpec) {
	t.Helper()
	if err := s.CreateSandbox(own(), sb, ev); err != nil {
		t.Fatalf("CreateSandbox(%s, %s) error = %v, want nil", sb.ID, sb.Name, err)
	}
}

func events(t *testing.T, s *Store, session string) []Event {
	t.Helper()
	evs, err := s.Events(own(), session, 0, 0)
	if err != nil {
		t.Fatalf("Events(%q) error = %v", session, err)
	}
	return evs
}

func eventTypes(evs []Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

func TestOpenCreatesAndIsIdempotent(t *testing.T) {
	_, path := newStore(t)
	// A second handle on the same file (schema already there) works too.
	s2 := openStore(t, path)
	if list, err := s2.ListSandboxes(own()); err != nil || len(list) != 0 {
		t.Errorf("ListSandboxes() on a new store = %v, %v; want empty, nil", list, err)
	}
}

func TestOpenBadPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no", "such", "dir", "shard.db")
	s, err := Open(own(), path)
	if err == nil {
		s.Close()
		t.Fatalf("Open(%q) = nil error, want one (the directory does not exist)", path)
	}
}

func TestCreateAndGet(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	want := sample("id1", "alpha")
	mustCreate(t, s, want, &EventSpec{Type: "sandbox.created"})
	mustCreate(t, s, sample("id2", "beta"), nil)

	for _, key := range []string{"id1", "alpha"} {
		got, err := s.GetSandbox(ctx, key)
		if err != nil {
			t.Errorf("GetSandbox(%q) error = %v, want nil", key, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("GetSandbox(%q) = %+v, want %+v", key, got, want)
		}
	}
	if got, err := s.GetSandbox(ctx, "beta"); err != nil || got.ID != "id2" {
		t.Errorf("GetSandbox(%q) = %v, %v; want id2", "beta", got, err)
	}
	for _, key := range []string{"nope", "", "ALPHA", "id"} {
		got, err := s.GetSandbox(ctx, key)
		if code := errdefs.CodeOf(err); code != "sandbox_not_found" || got != nil {
			t.Errorf("GetSandbox(%q) = %v, code %q (%v); want nil, code sandbox_not_found", key, got, code, err)
		}
		if !errdefs.Is(err, errdefs.KindNotFound) {
			t.Errorf("GetSandbox(%q) kind = %q, want %q", key, errdefs.KindOf(err), errdefs.KindNotFound)
		}
	}
}

func TestCreateDuplicateName(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	mustCreate(t, s, sample("id1", "alpha"), &EventSpec{Type: "sandbox.created"})

	dup := sample("id2", "alpha")
	err := s.CreateSandbox(ctx, dup, &EventSpec{Type: "sandbox.created"})
	if code := errdefs.CodeOf(err); code != "name_taken" {
		t.Fatalf("CreateSandbox(duplicate name) = %v (code %q), want code name_taken", err, code)
	}
	if !errdefs.Is(err, errdefs.KindConflict) {
		t.Errorf("CreateSandbox(duplicate name) kind = %q, want %q", errdefs.KindOf(err), errdefs.KindConflict)
	}
	// Nothing of the failed create was written: no record, no event.
	if got, err := s.GetSandbox(ctx, "id2"); err == nil {
		t.Errorf("GetSandbox(id2) after a failed create = %+v, want not found", got)
	}
	if evs := events(t, s, dup.Session); len(evs) != 0 {
		t.Errorf("Events(%q) after a failed create = %v, want none", dup.Session, eventTypes(evs))
	}
	if got, _ := s.GetSandbox(ctx, "alpha"); got == nil || got.ID != "id1" {
		t.Errorf("GetSandbox(alpha) after a failed duplicate = %+v, want id1", got)
	}
}

func TestCreateDuplicateID(t *testing.T) {
	s, _ := newStore(t)
	mustCreate(t, s, sample("id1", "alpha"), nil)
	if err := s.CreateSandbox(own(), sample("id1", "other"), nil); err == nil {
		t.Errorf("CreateSandbox(duplicate id) = nil, want an error")
	}
}

func TestCreateWritesEvent(t *testing.T) {
	s, _ := newStore(t)
	sb := sample("id1", "alpha")
	before := time.Now().Add(-time.Second)
	mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created", Data: map[string]any{"image": "alpine:3"}})
	evs := events(t, s, sb.Session)
	if len(evs) != 1 {
		t.Fatalf("Events(%q) = %v, want one event", sb.Session, eventTypes(evs))
	}
	e := evs[0]
	if e.Type != "sandbox.created" || e.SandboxID != "id1" || e.Session != sb.Session || e.Seq <= 0 {
		t.Errorf("event = %+v, want type sandbox.created, sandbox id1, session %s, seq > 0", e, sb.Session)
	}
	if e.At.Before(before) || e.At.After(time.Now().Add(time.Second)) {
		t.Errorf("event time = %v, want about now", e.At)
	}
	var data map[string]string
	if err := json.Unmarshal(e.Data, &data); err != nil || data["image"] != "alpine:3" {
		t.Errorf("event data = %s (%v), want {\"image\":\"alpine:3\"}", e.Data, err)
	}
}

func TestEventSessions(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	tests := []struct {
		name        string
		sbSession   string
		evSession   string
		wantSession string // "" means no event is written
	}{
		{"sandbox's session", "s-a", "", "s-a"},
		{"explicit session", "s-b", "other", "other"},
		{"explicit session, none on the sandbox", "", "other2", "other2"},
		{"no session at all", "", "", ""},
	}
	for i, tt := range tests {
		sb := sample(fmt.Sprintf("id%d", i), fmt.Sprintf("name%d", i))
		sb.Session = tt.sbSession
		mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created", Session: tt.evSession})
		if tt.wantSession == "" {
			if evs := events(t, s, ""); len(evs) != 0 {
				t.Errorf("%s: an event without a session was written: %+v", tt.name, evs)
			}
			continue
		}
		evs := events(t, s, tt.wantSession)
		if len(evs) != 1 || evs[0].SandboxID != sb.ID {
			t.Errorf("%s: Events(%q) = %+v, want one event of %s", tt.name, tt.wantSession, evs, sb.ID)
		}
	}
	if evs, err := s.Events(ctx, "unknown-session", 0, 0); err != nil || len(evs) != 0 {
		t.Errorf("Events(unknown session) = %v, %v; want none, nil", evs, err)
	}
}

func TestUpdateWithEvent(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	sb := sample("id1", "alpha")
	mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created"})

	started := t0.Add(time.Minute)
	got, err := s.UpdateSandbox(ctx, "id1", func(r *Sandbox) (*EventSpec, error) {
		if r.State != "creating" {
			t.Errorf("UpdateSandbox fn got state %q, want the stored %q", r.State, "creating")
		}
		r.State = "running"
		r.StartedAt = started
		return &EventSpec{Type: "sandbox.started", Data: map[string]int{"pid": 7}}, nil
	})
	if err != nil {
		t.Fatalf("UpdateSandbox() error = %v, want nil", err)
	}
	if got.State != "running" || !got.StartedAt.Equal(started) {
		t.Errorf("UpdateSandbox() returned state %q started %v, want running, %v", got.State, got.StartedAt, started)
	}
	stored, err := s.GetSandbox(ctx, "alpha")
	if err != nil || !reflect.DeepEqual(stored, got) {
		t.Errorf("GetSandbox() after update = %+v, %v; want %+v", stored, err, got)
	}
	evs := events(t, s, sb.Session)
	if want := []string{"sandbox.created", "sandbox.started"}; !slices.Equal(eventTypes(evs), want) {
		t.Fatalf("Events() = %v, want %v", eventTypes(evs), want)
	}
	if evs[1].Seq <= evs[0].Seq {
		t.Errorf("event seqs %d, %d; want increasing", evs[0].Seq, evs[1].Seq)
	}
	if string(evs[1].Data) != `{"pid":7}` || evs[1].SandboxID != "id1" {
		t.Errorf("sandbox.started event = %+v, want data {\"pid\":7}, sandbox id1", evs[1])
	}

	// An update without an event writes none.
	if _, err := s.UpdateSandbox(ctx, "id1", func(r *Sandbox) (*EventSpec, error) {
		r.IP = "10.88.0.3"
		return nil, nil
	}); err != nil {
		t.Fatalf("UpdateSandbox(no event) error = %v", err)
	}
	if n := len(events(t, s, sb.Session)); n != 2 {
		t.Errorf("after an update without an event there are %d events, want 2", n)
	}
	if got, _ := s.GetSandbox(ctx, "id1"); got.IP != "10.88.0.3" {
		t.Errorf("GetSandbox() IP = %q, want %q", got.IP, "10.88.0.3")
	}
}

// An update may not rename: a rename would have to claim the name in the
// registry (a network call) inside the transaction.
func TestUpdateRename(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	mustCreate(t, s, sample("id1", "alpha"), nil)
	if _, err := s.UpdateSandbox(ctx, "id1", func(r *Sandbox) (*EventSpec, error) {
		r.Name = "gamma"
		return nil, nil
	}); err == nil || !strings.Contains(err.Error(), "may not rename") {
		t.Fatalf("UpdateSandbox(rename) error = %v, want a refusal", err)
	}
	if got, err := s.GetSandbox(ctx, "alpha"); err != nil || got.ID != "id1" {
		t.Errorf("GetSandbox(old name) = %v, %v; want id1 unchanged", got, err)
	}
	if _, err := s.GetSandbox(ctx, "gamma"); errdefs.CodeOf(err) != "sandbox_not_found" {
		t.Errorf("GetSandbox(new name) error = %v, want sandbox_not_found", err)
	}
}

func TestUpdateErrorRollsBack(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	sb := sample("id1", "alpha")
	mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created"})

	boom := errdefs.Conflict("sandbox_busy", "busy")
	got, err := s.UpdateSandbox(ctx, "id1", func(r *Sandbox) (*EventSpec, error) {
		r.State = "running"
		r.Name = "changed"
		return &EventSpec{Type: "sandbox.started"}, boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("UpdateSandbox(fn fails) error = %v, want the fn's error %v", err, boom)
	}
	if errdefs.CodeOf(err) != "sandbox_busy" {
		t.Errorf("UpdateSandbox(fn fails) code = %q, want the fn's code sandbox_busy", errdefs.CodeOf(err))
	}
	if got != nil {
		t.Errorf("UpdateSandbox(fn fails) = %+v, want nil", got)
	}
	stored, err := s.GetSandbox(ctx, "id1")
	if err != nil || !reflect.DeepEqual(stored, sb) {
		t.Errorf("GetSandbox() after a failed update = %+v, %v; want unchanged %+v", stored, err, sb)
	}
	if evs := events(t, s, sb.Session); !slices.Equal(eventTypes(evs), []string{"sandbox.created"}) {
		t.Errorf("Events() after a failed update = %v, want only sandbox.created", eventTypes(evs))
	}
}

// A failure to write the event undoes the change it records.
func TestUpdateEventFailureRollsBack(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	sb := sample("id1", "alpha")
	mustCreate(t, s, sb, nil)
	_, err := s.UpdateSandbox(ctx, "id1", func(r *Sandbox) (*EventSpec, error) {
		r.State = "running"
		return &EventSpec{Type: "bad", Data: make(chan int)}, nil // not JSON-able
	})
	if err == nil {
		t.Fatal("UpdateSandbox(event data not JSON-able) = nil error, want one")
	}
	if got, _ := s.GetSandbox(ctx, "id1"); got.State != "creating" {
		t.Errorf("state after the event failed = %q, want unchanged %q", got.State, "creating")
	}
}

func TestUpdateMissing(t *testing.T) {
	s, _ := newStore(t)
	called := false
	_, err := s.UpdateSandbox(own(), "nope", func(r *Sandbox) (*EventSpec, error) {
		called = true
		return nil, nil
	})
	if errdefs.CodeOf(err) != "sandbox_not_found" {
		t.Errorf("UpdateSandbox(missing) error = %v, want code sandbox_not_found", err)
	}
	if called {
		t.Error("UpdateSandbox(missing) called fn, want it not called")
	}
}

func TestDelete(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	sb := sample("id1", "alpha")
	mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created"})
	mustCreate(t, s, sample("id2", "beta"), nil)

	if err := s.DeleteSandbox(ctx, "id1", &EventSpec{Type: "sandbox.removed"}); err != nil {
		t.Fatalf("DeleteSandbox(id1) error = %v, want nil", err)
	}
	for _, key := range []string{"id1", "alpha"} {
		if got, err := s.GetSandbox(ctx, key); errdefs.CodeOf(err) != "sandbox_not_found" {
			t.Errorf("GetSandbox(%q) after delete = %+v, %v; want code sandbox_not_found", key, got, err)
		}
	}
	evs := events(t, s, sb.Session)
	if want := []string{"sandbox.created", "sandbox.removed"}; !slices.Equal(eventTypes(evs), want) {
		t.Errorf("Events() after delete = %v, want %v (the ledger outlives the sandbox)", eventTypes(evs), want)
	} else if evs[1].SandboxID != "id1" {
		t.Errorf("sandbox.removed event sandbox = %q, want id1", evs[1].SandboxID)
	}
	if err := s.DeleteSandbox(ctx, "id1", &EventSpec{Type: "sandbox.removed"}); errdefs.CodeOf(err) != "sandbox_not_found" {
		t.Errorf("DeleteSandbox(id1) again = %v, want code sandbox_not_found", err)
	}
	if n := len(events(t, s, sb.Session)); n != 2 {
		t.Errorf("a failed delete wrote an event: %d events, want 2", n)
	}
	// The name is free again; the other sandbox is untouched.
	mustCreate(t, s, sample("id3", "alpha"), nil)
	if got, err := s.GetSandbox(ctx, "beta"); err != nil || got.ID != "id2" {
		t.Errorf("GetSandbox(beta) = %v, %v; want id2", got, err)
	}
}

func TestListSandboxesOrder(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	if list, err := s.ListSandboxes(ctx); err != nil || len(list) != 0 {
		t.Errorf("ListSandboxes() of an empty store = %v, %v; want empty", list, err)
	}
	// Inserted out of order (and with ids in another order again).
	offsets := map[string]time.Duration{"a": 3 * time.Hour, "b": 0, "c": 2 * time.Hour, "d": time.Nanosecond, "e": -time.Hour}
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		sb := sample(id, "name-"+id)
		sb.CreatedAt = t0.Add(offsets[id])
		mustCreate(t, s, sb, nil)
	}
	list, err := s.ListSandboxes(ctx)
	if err != nil {
		t.Fatalf("ListSandboxes() error = %v", err)
	}
	var ids []string
	for _, sb := range list {
		ids = append(ids, sb.ID)
	}
	if want := []string{"e", "b", "d", "c", "a"}; !slices.Equal(ids, want) {
		t.Errorf("ListSandboxes() order = %v, want %v (oldest first)", ids, want)
	}
}

func TestEventsPaging(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	sb := sample("id1", "alpha")
	mustCreate(t, s, sb, &EventSpec{Type: "e0"})
	for i := 1; i < 5; i++ {
		if err := s.AddEvent(ctx, sb, &EventSpec{Type: fmt.Sprintf("e%d", i)}); err != nil {
			t.Fatalf("AddEvent(e%d) error = %v", i, err)
		}
	}
	// Another session's events are interleaved and must not show.
	other := sample("id2", "beta")
	mustCreate(t, s, other, &EventSpec{Type: "other"})

	all := events(t, s, sb.Session)
	if want := []string{"e0", "e1", "e2", "e3", "e4"}; !slices.Equal(eventTypes(all), want) {
		t.Fatalf("Events() = %v, want %v", eventTypes(all), want)
	}
	tests := []struct {
		after int64
		limit int
		want  []string
	}{
		{0, 0, []string{"e0", "e1", "e2", "e3", "e4"}},
		{0, -1, []string{"e0", "e1", "e2", "e3", "e4"}},
		{0, 2, []string{"e0", "e1"}},
		{all[1].Seq, 2, []string{"e2", "e3"}},
		{all[3].Seq, 10, []string{"e4"}},
		{all[4].Seq, 10, nil},
	}
	for _, tt := range tests {
		evs, err := s.Events(ctx, sb.Session, tt.after, tt.limit)
		if err != nil || !slices.Equal(eventTypes(evs), tt.want) {
			t.Errorf("Events(after %d, limit %d) = %v, %v; want %v", tt.after, tt.limit, eventTypes(evs), err, tt.want)
		}
	}
	if err := s.AddEvent(ctx, sb, nil); err != nil {
		t.Errorf("AddEvent(nil) = %v, want nil (no-op)", err)
	}
	if n := len(events(t, s, sb.Session)); n != 5 {
		t.Errorf("AddEvent(nil) wrote an event: %d events, want 5", n)
	}
}

func TestReopenKeepsData(t *testing.T) {
	ctx := own()
	path := filepath.Join(t.TempDir(), "shard.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open(%q) error = %v", path, err)
	}
	sb := sample("id1", "alpha")
	if err := s.CreateSandbox(ctx, sb, &EventSpec{Type: "sandbox.created"}); err != nil {
		t.Fatal(err)
	}
	want, err := s.UpdateSandbox(ctx, "id1", func(r *Sandbox) (*EventSpec, error) {
		r.State = "stopped"
		r.StoppedAt = t0.Add(time.Hour)
		r.OOMKills = 2
		return &EventSpec{Type: "sandbox.stopped"}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, sample("id2", "gone"), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx, "id2", nil); err != nil {
		t.Fatal(err)
	}
	before := events(t, s, sb.Session)
	if err := s.Close(); err != nil {
		t.Fatalf("Close() error = %v", err)
	}

	s2 := openStore(t, path)
	got, err := s2.GetSandbox(ctx, "alpha")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("after reopening, GetSandbox(alpha) = %+v, %v; want %+v", got, err, want)
	}
	if _, err := s2.GetSandbox(ctx, "id2"); errdefs.CodeOf(err) != "sandbox_not_found" {
		t.Errorf("after reopening, a deleted sandbox: GetSandbox(id2) error = %v, want sandbox_not_found", err)
	}
	after := events(t, s2, sb.Session)
	if !reflect.DeepEqual(after, before) {
		t.Errorf("after reopening, Events() = %+v, want %+v", after, before)
	}
	// Sequence numbers keep growing across restarts.
	if err := s2.AddEvent(ctx, got, &EventSpec{Type: "sandbox.started"}); err != nil {
		t.Fatal(err)
	}
	evs := events(t, s2, sb.Session)
	if last := evs[len(evs)-1]; last.Type != "sandbox.started" || last.Seq <= before[len(before)-1].Seq {
		t.Errorf("event after reopening = %+v, want sandbox.started with seq > %d", last, before[len(before)-1].Seq)
	}
	// Names stay unique across restarts.
	if err := s2.CreateSandbox(ctx, sample("id9", "alpha"), nil); errdefs.CodeOf(err) != "name_taken" {
		t.Errorf("after reopening, CreateSandbox(taken name) = %v, want code name_taken", err)
	}
}

// Concurrent updates are serialised: none is lost.
func TestConcurrentUpdates(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	sb := sample("id1", "alpha")
	mustCreate(t, s, sb, nil)
	const n = 20
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.UpdateSandbox(ctx, "id1", func(r *Sandbox) (*EventSpec, error) {
				r.OOMKills++
				return &EventSpec{Type: "tick"}, nil
			}); err != nil {
				t.Errorf("UpdateSandbox() error = %v", err)
			}
		}()
	}
	wg.Wait()
	got, err := s.GetSandbox(ctx, "id1")
	if err != nil || got.OOMKills != n {
		t.Errorf("after %d concurrent increments, OOMKills = %v (%v), want %d", n, got, err, n)
	}
	if evs := events(t, s, sb.Session); len(evs) != n {
		t.Errorf("after %d concurrent updates, %d events, want %d", n, len(evs), n)
	}
}

// TestShapeJSON: records written before Shape was embedded (the same keys,
// at the top level) read back the same, and a record writes them there.
func TestShapeJSON(t *testing.T) {
	old := `{"id":"i","name":"n","image":"alpine:3","image_digest":"sha256:abc","provider":"runc","state":"running",` +
		`"memory_bytes":536870912,"cpu_millis":1500,"disk_bytes":1073741824,"pids":256,"env":["A=1"],"ip":"10.88.0.2"}`
	var sb Sandbox
	if err := json.Unmarshal([]byte(old), &sb); err != nil {
		t.Fatal(err)
	}
	want := Shape{Image: "alpine:3", ImageDigest: "sha256:abc", Provider: "runc",
		Bounds: Bounds{MemoryBytes: 512 << 20, CPUMillis: 1500, DiskBytes: 1 << 30, Pids: 256}, Env: []string{"A=1"}}
	if !reflect.DeepEqual(sb.Shape, want) || sb.IP != "10.88.0.2" {
		t.Fatalf("old record read as %+v", sb)
	}
	b, err := json.Marshal(&sb)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	for _, k := range []string{"image", "image_digest", "provider", "memory_bytes", "cpu_millis", "disk_bytes", "pids", "env"} {
		if _, ok := m[k]; !ok {
			t.Errorf("written record %s has no top-level %q", b, k)
		}
	}
	if c := want.Clone(); &c.Env[0] == &want.Env[0] {
		t.Error("Clone shares Env with the original")
	}
}

// own is the context of a test that calls the store as the server's own
// work does: it sees every project.
func own() context.Context { return project.Unscoped(context.Background(), "a test") }
