package store

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/internal/errdefs"
)

func sessionNames(t *testing.T, s *Store) []string {
	t.Helper()
	list, err := s.Sessions(own())
	if err != nil {
		t.Fatalf("Sessions() error = %v", err)
	}
	var out []string
	for _, ss := range list {
		out = append(out, ss.Name)
	}
	return out
}

// FindSession takes a sandbox's name or id (a removed one's by id), or a
// session's name; a live sandbox's name wins over a session's.
func TestFindSession(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	add := func(id, name, session string) {
		sb := sample(id, name)
		sb.Session = session
		mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created"})
	}
	rm := func(id string) {
		if err := s.DeleteSandbox(ctx, id, &EventSpec{Type: "sandbox.removed"}); err != nil {
			t.Fatal(err)
		}
	}
	add("aaaaaaaaaaaa", "web", "web")
	rm("aaaaaaaaaaaa")
	add("bbbbbbbbbbbb", "web", "web") // its session is web-2
	add("cccccccccccc", "kid", "fork-web-cccccc")
	add("dddddddddddd", "gone", "fork-web-dddddd")
	rm("dddddddddddd")
	tests := []struct{ ref, want string }{
		{"web", "web-2"}, // the live sandbox web's, not the removed one's session web
		{"web-2", "web-2"},
		{"bbbbbbbbbbbb", "web-2"},
		{"aaaaaaaaaaaa", "web"}, // a removed sandbox, by id
		{"kid", "fork-web-cccccc"},
		{"cccccccccccc", "fork-web-cccccc"},
		{"fork-web-cccccc", "fork-web-cccccc"},
		{"dddddddddddd", "fork-web-dddddd"},
		{"gone", ""},                           // a removed sandbox's name is not kept
		{"fork-web-dddddd", "fork-web-dddddd"}, // a session's name with no sandbox of it
		{"nothing", ""},
	}
	for _, tt := range tests {
		ss, err := s.FindSession(ctx, tt.ref)
		if tt.want == "" {
			if errdefs.CodeOf(err) != "session_not_found" || !strings.Contains(err.Error(), tt.ref) || !strings.Contains(err.Error(), "shard ledger ls") {
				t.Errorf("FindSession(%q) = %+v, %v; want session_not_found naming it and shard ledger ls", tt.ref, ss, err)
			}
			continue
		}
		if err != nil || ss.Name != tt.want {
			t.Errorf("FindSession(%q) = %+v, %v; want session %s", tt.ref, ss, err, tt.want)
		}
	}
}

// A name that comes back gets a session of its own: NAME, NAME-2, NAME-3.
func TestCreateSandboxSessionNames(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	tests := []struct {
		id          string
		name        string
		session     string
		wantSession string
	}{
		{"id1", "alpha", "alpha", "alpha"},
		{"id2", "alpha", "alpha", "alpha-2"},
		{"id3", "alpha", "alpha", "alpha-3"},
		{"id4", "beta", "beta", "beta"},
		// A sandbox whose own name looks like a suffixed session.
		{"id5", "gamma-2", "gamma-2", "gamma-2"},
		{"id6", "gamma", "gamma", "gamma"},
		{"id7", "gamma", "gamma", "gamma-3"}, // gamma-2 is taken by id5
		{"id8", "nosession", "", ""},
	}
	for i, tt := range tests {
		sb := sample(tt.id, tt.name)
		sb.Session = tt.session
		mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created"})
		if sb.Session != tt.wantSession {
			t.Errorf("CreateSandbox(%s, session %q) set Session = %q, want %q", tt.id, tt.session, sb.Session, tt.wantSession)
		}
		if got, err := s.GetSandbox(ctx, tt.id); err != nil || got.Session != tt.wantSession {
			t.Errorf("GetSandbox(%s).Session = %v, %v; want %q stored", tt.id, got, err, tt.wantSession)
		}
		if tt.wantSession != "" {
			ss, err := s.GetSession(ctx, tt.wantSession)
			if err != nil || ss.SandboxID != tt.id || ss.Events != 1 {
				t.Errorf("GetSession(%q) = %+v, %v; want sandbox %s with 1 event", tt.wantSession, ss, err, tt.id)
			}
		}
		// Free the name for the next one (the session stays).
		if i+1 < len(tests) && tests[i+1].name == tt.name {
			if err := s.DeleteSandbox(ctx, tt.id, &EventSpec{Type: "sandbox.removed"}); err != nil {
				t.Fatalf("DeleteSandbox(%s) error = %v", tt.id, err)
			}
		}
	}
	// Each session holds one sandbox's events only.
	for _, sess := range []string{"alpha", "alpha-2"} {
		evs := events(t, s, sess)
		if want := []string{"sandbox.created", "sandbox.removed"}; !slices.Equal(eventTypes(evs), want) {
			t.Errorf("Events(%q) = %v, want %v", sess, eventTypes(evs), want)
		}
	}
	want := []string{"alpha", "alpha-2", "alpha-3", "beta", "gamma-2", "gamma", "gamma-3"}
	if got := sessionNames(t, s); !slices.Equal(got, want) {
		t.Errorf("Sessions() = %v, want %v", got, want)
	}
}

// A create that fails leaves the caller's record and the sessions as they were.
func TestCreateSandboxFailureKeepsSession(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	first := sample("id1", "alpha")
	first.Session = "alpha"
	mustCreate(t, s, first, &EventSpec{Type: "sandbox.created"})
	before := sessionNames(t, s)

	tests := []struct {
		name     string
		sb       *Sandbox
		wantCode string
	}{
		{"name taken", sample("id2", "alpha"), "name_taken"},
		{"id taken", sample("id1", "other"), "internal"},
	}
	for _, tt := range tests {
		tt.sb.Session = "alpha"
		err := s.CreateSandbox(ctx, tt.sb, &EventSpec{Type: "sandbox.created"})
		if err == nil || errdefs.CodeOf(err) != tt.wantCode {
			t.Errorf("%s: CreateSandbox() = %v (code %q), want code %s", tt.name, err, errdefs.CodeOf(err), tt.wantCode)
		}
		if tt.sb.Session != "alpha" {
			t.Errorf("%s: after a failed create sb.Session = %q, want unchanged %q", tt.name, tt.sb.Session, "alpha")
		}
		if got := sessionNames(t, s); !slices.Equal(got, before) {
			t.Errorf("%s: Sessions() after a failed create = %v, want %v", tt.name, got, before)
		}
		if _, err := s.GetSession(ctx, "alpha-2"); errdefs.CodeOf(err) != "session_not_found" {
			t.Errorf("%s: GetSession(alpha-2) error = %v, want session_not_found", tt.name, err)
		}
		if evs := events(t, s, "alpha"); len(evs) != 1 || evs[0].SandboxID != "id1" {
			t.Errorf("%s: Events(alpha) = %+v, want only id1's sandbox.created", tt.name, evs)
		}
	}
	// The name, once free, takes the next session.
	if err := s.DeleteSandbox(ctx, "id1", nil); err != nil {
		t.Fatal(err)
	}
	again := sample("id3", "alpha")
	again.Session = "alpha"
	mustCreate(t, s, again, nil)
	if again.Session != "alpha-2" {
		t.Errorf("CreateSandbox() after the failures: Session = %q, want alpha-2", again.Session)
	}
}

func sampleCheckpoint(id string, sb *Sandbox, created time.Time) *Checkpoint {
	return &Checkpoint{
		ID:          id,
		Kind:        "checkpoint",
		Tag:         "tag-" + id,
		SandboxID:   sb.ID,
		SandboxName: sb.Name,
		Session:     sb.Session,
		Token:       sb.Token,
		AgentDir:    "/var/lib/shard/agent/" + sb.ID,
		FreezeMS:    42,
		CreatedAt:   created,
		Shape:       Shape{Image: sb.Image, ImageDigest: sb.ImageDigest, Provider: sb.Provider, Bounds: Bounds{MemoryBytes: sb.MemoryBytes, CPUMillis: sb.CPUMillis, DiskBytes: sb.DiskBytes, Pids: sb.Pids}, Env: sb.Env},
	}
}

func TestCheckpoints(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	a, b := sample("id1", "alpha"), sample("id2", "beta")
	mustCreate(t, s, a, &EventSpec{Type: "sandbox.created"})
	mustCreate(t, s, b, &EventSpec{Type: "sandbox.created"})

	// Added out of time order; the lists are oldest first.
	adds := []struct {
		ck *Checkpoint
		sb *Sandbox
	}{
		{sampleCheckpoint("ck-a2", a, t0.Add(2*time.Minute)), a},
		{sampleCheckpoint("ck-b1", b, t0.Add(time.Minute)), b},
		{sampleCheckpoint("ck-a1", a, t0), a},
		{sampleCheckpoint("ck-a3", a, t0.Add(3*time.Minute)), a},
	}
	for _, add := range adds {
		err := s.AddCheckpoint(ctx, add.ck, add.sb, &EventSpec{Type: "sandbox.checkpoint_created", Data: map[string]string{"checkpoint": add.ck.ID}})
		if err != nil {
			t.Fatalf("AddCheckpoint(%s) error = %v", add.ck.ID, err)
		}
		evs := events(t, s, add.sb.Session)
		last := evs[len(evs)-1]
		if last.Type != "sandbox.checkpoint_created" || add.ck.Seq != last.Seq || add.ck.Seq <= 0 {
			t.Errorf("AddCheckpoint(%s): ck.Seq = %d, last event of %s = %+v; want the checkpoint_created event's seq",
				add.ck.ID, add.ck.Seq, add.sb.Session, last)
		}
		if want := fmt.Sprintf(`{"checkpoint":%q}`, add.ck.ID); string(last.Data) != want {
			t.Errorf("AddCheckpoint(%s) event data = %s, want %s", add.ck.ID, last.Data, want)
		}
	}

	for _, add := range adds {
		got, err := s.GetCheckpoint(ctx, add.ck.ID)
		if err != nil || !reflect.DeepEqual(got, add.ck) {
			t.Errorf("GetCheckpoint(%s) = %+v, %v; want %+v", add.ck.ID, got, err, add.ck)
		}
	}

	lists := []struct {
		session string
		want    []string
	}{
		{a.Session, []string{"ck-a1", "ck-a2", "ck-a3"}},
		{b.Session, []string{"ck-b1"}},
		{"", []string{"ck-a1", "ck-b1", "ck-a2", "ck-a3"}},
		{"no-such-session", nil},
	}
	for _, l := range lists {
		list, err := s.ListCheckpoints(ctx, l.session)
		var ids []string
		for _, ck := range list {
			ids = append(ids, ck.ID)
		}
		if err != nil || !slices.Equal(ids, l.want) {
			t.Errorf("ListCheckpoints(%q) = %v, %v; want %v", l.session, ids, err, l.want)
		}
	}

	if err := s.DeleteCheckpoint(ctx, "ck-a2"); err != nil {
		t.Fatalf("DeleteCheckpoint(ck-a2) error = %v", err)
	}
	for _, id := range []string{"ck-a2", "nope", ""} {
		got, err := s.GetCheckpoint(ctx, id)
		if errdefs.CodeOf(err) != "checkpoint_not_found" || got != nil {
			t.Errorf("GetCheckpoint(%q) = %+v, %v; want code checkpoint_not_found", id, got, err)
		}
		if !errdefs.Is(err, errdefs.KindNotFound) {
			t.Errorf("GetCheckpoint(%q) kind = %q, want not_found", id, errdefs.KindOf(err))
		}
	}
	if list, _ := s.ListCheckpoints(ctx, a.Session); len(list) != 2 {
		t.Errorf("ListCheckpoints(%q) after a delete has %d, want 2", a.Session, len(list))
	}
	// The event stays: the ledger outlives what it records.
	if evs := events(t, s, a.Session); len(evs) != 4 {
		t.Errorf("Events(%q) after DeleteCheckpoint = %v, want 4 events", a.Session, eventTypes(evs))
	}
	if err := s.DeleteCheckpoint(ctx, "nope"); err != nil {
		t.Errorf("DeleteCheckpoint(unknown) = %v, want nil", err)
	}
}

// A checkpoint that cannot be recorded leaves no event behind, and one
// without an event has seq 0.
func TestAddCheckpointAtomic(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	sb := sample("id1", "alpha")
	mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created"})
	ck := sampleCheckpoint("ck1", sb, t0)
	if err := s.AddCheckpoint(ctx, ck, sb, &EventSpec{Type: "sandbox.checkpoint_created"}); err != nil {
		t.Fatal(err)
	}
	dup := sampleCheckpoint("ck1", sb, t0.Add(time.Hour))
	if err := s.AddCheckpoint(ctx, dup, sb, &EventSpec{Type: "sandbox.checkpoint_created"}); err == nil {
		t.Error("AddCheckpoint(duplicate id) = nil, want an error")
	}
	if evs := events(t, s, sb.Session); len(evs) != 2 {
		t.Errorf("Events() after a failed AddCheckpoint = %v, want 2 events", eventTypes(evs))
	}
	if got, _ := s.GetCheckpoint(ctx, "ck1"); got == nil || !got.CreatedAt.Equal(t0) {
		t.Errorf("GetCheckpoint(ck1) after a failed duplicate = %+v, want the first", got)
	}

	quiet := sampleCheckpoint("ck2", sb, t0)
	quiet.Seq = 99
	if err := s.AddCheckpoint(ctx, quiet, sb, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetCheckpoint(ctx, "ck2"); quiet.Seq != 0 || got == nil || got.Seq != 0 {
		t.Errorf("AddCheckpoint(no event): ck.Seq = %d, stored %+v; want 0", quiet.Seq, got)
	}
}

func sampleSnapshot(id, name string, sb *Sandbox, created time.Time) *Snapshot {
	return &Snapshot{
		ID:          id,
		Name:        name,
		SandboxID:   sb.ID,
		SandboxName: sb.Name,
		CreatedAt:   created,
		Shape:       Shape{Image: sb.Image, ImageDigest: sb.ImageDigest, Provider: sb.Provider, Bounds: Bounds{DiskBytes: sb.DiskBytes}, Env: sb.Env},
	}
}

func TestSnapshots(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	sb := sample("id1", "alpha")
	mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created"})

	adds := []*Snapshot{
		sampleSnapshot("sn1", "late", sb, t0.Add(time.Hour)),
		sampleSnapshot("sn2", "early", sb, t0),
		sampleSnapshot("sn3", "middle", sb, t0.Add(time.Minute)),
	}
	for _, sn := range adds {
		if err := s.AddSnapshot(ctx, sn, sb, &EventSpec{Type: "sandbox.snapshot_created", Data: map[string]string{"snapshot": sn.ID}}); err != nil {
			t.Fatalf("AddSnapshot(%s) error = %v", sn.ID, err)
		}
	}
	if evs := events(t, s, sb.Session); len(evs) != 4 || evs[3].Type != "sandbox.snapshot_created" {
		t.Errorf("Events() after 3 snapshots = %v, want sandbox.created and 3 snapshot_created", eventTypes(evs))
	}

	gets := []struct {
		key  string
		want *Snapshot
	}{
		{"sn1", adds[0]},
		{"late", adds[0]},
		{"sn2", adds[1]},
		{"early", adds[1]},
		{"middle", adds[2]},
		{"nope", nil},
		{"", nil},
		{"LATE", nil},
	}
	for _, g := range gets {
		got, err := s.GetSnapshot(ctx, g.key)
		if g.want == nil {
			if errdefs.CodeOf(err) != "snapshot_not_found" || got != nil {
				t.Errorf("GetSnapshot(%q) = %+v, %v; want code snapshot_not_found", g.key, got, err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, g.want) {
			t.Errorf("GetSnapshot(%q) = %+v, %v; want %+v", g.key, got, err, g.want)
		}
	}

	// A taken name: name_taken, and nothing written.
	dup := sampleSnapshot("sn4", "early", sb, t0)
	err := s.AddSnapshot(ctx, dup, sb, &EventSpec{Type: "sandbox.snapshot_created"})
	if errdefs.CodeOf(err) != "name_taken" || !errdefs.Is(err, errdefs.KindConflict) {
		t.Errorf("AddSnapshot(taken name) = %v (code %q), want code name_taken", err, errdefs.CodeOf(err))
	}
	if _, err := s.GetSnapshot(ctx, "sn4"); errdefs.CodeOf(err) != "snapshot_not_found" {
		t.Errorf("GetSnapshot(sn4) after a failed add = %v, want snapshot_not_found", err)
	}
	if evs := events(t, s, sb.Session); len(evs) != 4 {
		t.Errorf("Events() after a failed AddSnapshot = %v, want 4 events", eventTypes(evs))
	}

	list, err := s.ListSnapshots(ctx)
	var ids []string
	for _, sn := range list {
		ids = append(ids, sn.ID)
	}
	if want := []string{"sn2", "sn3", "sn1"}; err != nil || !slices.Equal(ids, want) {
		t.Errorf("ListSnapshots() = %v, %v; want %v (oldest first)", ids, err, want)
	}

	if err := s.DeleteSnapshot(ctx, "sn2"); err != nil {
		t.Fatalf("DeleteSnapshot(sn2) error = %v", err)
	}
	for _, key := range []string{"sn2", "early"} {
		if _, err := s.GetSnapshot(ctx, key); errdefs.CodeOf(err) != "snapshot_not_found" {
			t.Errorf("GetSnapshot(%q) after delete = %v, want snapshot_not_found", key, err)
		}
	}
	// The name is free again.
	if err := s.AddSnapshot(ctx, sampleSnapshot("sn5", "early", sb, t0), sb, nil); err != nil {
		t.Errorf("AddSnapshot(freed name) = %v, want nil", err)
	}
	if list, _ := s.ListSnapshots(ctx); len(list) != 3 {
		t.Errorf("ListSnapshots() has %d, want 3", len(list))
	}
}

func TestEnvironments(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	env := func(name, ck string) *Environment {
		return &Environment{
			Name:        name,
			Project:     "default",
			Setup:       [][]string{{"pip", "install", "numpy"}, {"sh", "-c", "echo ok"}},
			Fingerprint: "fp-" + ck,
			Checkpoint:  ck,
			CreatedAt:   t0,
			Shape:       Shape{Image: "python:3", ImageDigest: "sha256:def", Provider: "gvisor", Bounds: Bounds{MemoryBytes: 1 << 30, CPUMillis: 2000, DiskBytes: 4 << 30}, Env: []string{"PIP_NO_CACHE_DIR=1"}},
		}
	}
	if list, err := s.ListEnvironments(ctx); err != nil || len(list) != 0 {
		t.Errorf("ListEnvironments() of an empty store = %v, %v; want none", list, err)
	}
	for _, e := range []*Environment{env("py", "ck1"), env("go", "ck2"), env("rust", "ck3"), env("Node", "ck4")} {
		if err := s.PutEnvironment(ctx, e); err != nil {
			t.Fatalf("PutEnvironment(%s) error = %v", e.Name, err)
		}
	}
	replaced := env("py", "ck9")
	replaced.Setup = nil
	if err := s.PutEnvironment(ctx, replaced); err != nil {
		t.Fatalf("PutEnvironment(replace py) error = %v", err)
	}

	gets := []struct {
		name string
		want *Environment
	}{
		{"py", replaced},
		{"go", env("go", "ck2")},
		{"Node", env("Node", "ck4")},
		{"node", nil},
		{"nope", nil},
		{"", nil},
	}
	for _, g := range gets {
		got, err := s.GetEnvironment(ctx, g.name)
		if g.want == nil {
			if errdefs.CodeOf(err) != "environment_not_found" || got != nil {
				t.Errorf("GetEnvironment(%q) = %+v, %v; want code environment_not_found", g.name, got, err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, g.want) {
			t.Errorf("GetEnvironment(%q) = %+v, %v; want %+v", g.name, got, err, g.want)
		}
	}

	names := func() []string {
		list, err := s.ListEnvironments(ctx)
		if err != nil {
			t.Fatalf("ListEnvironments() error = %v", err)
		}
		var out []string
		for _, e := range list {
			out = append(out, e.Name+"@"+e.Checkpoint)
		}
		return out
	}
	if got, want := names(), []string{"Node@ck4", "go@ck2", "py@ck9", "rust@ck3"}; !slices.Equal(got, want) {
		t.Errorf("ListEnvironments() = %v, want %v (by name, one per name)", got, want)
	}

	if err := s.DeleteEnvironment(ctx, "go"); err != nil {
		t.Fatalf("DeleteEnvironment(go) error = %v", err)
	}
	if _, err := s.GetEnvironment(ctx, "go"); errdefs.CodeOf(err) != "environment_not_found" {
		t.Errorf("GetEnvironment(go) after delete = %v, want environment_not_found", err)
	}
	if err := s.DeleteEnvironment(ctx, "go"); err != nil {
		t.Errorf("DeleteEnvironment(go) again = %v, want nil", err)
	}
	if got, want := names(), []string{"Node@ck4", "py@ck9", "rust@ck3"}; !slices.Equal(got, want) {
		t.Errorf("ListEnvironments() after delete = %v, want %v", got, want)
	}
}

func TestSessions(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	if list, err := s.Sessions(ctx); err != nil || len(list) != 0 {
		t.Errorf("Sessions() of an empty store = %v, %v; want none", list, err)
	}
	before := time.Now().Add(-time.Second)

	a := sample("id1", "alpha")
	mustCreate(t, s, a, &EventSpec{Type: "sandbox.created"})
	for _, typ := range []string{"sandbox.started", "sandbox.exec_started", "sandbox.exec_finished"} {
		if err := s.AddEvent(ctx, a, &EventSpec{Type: typ}); err != nil {
			t.Fatal(err)
		}
	}
	b := sample("id2", "beta")
	mustCreate(t, s, b, nil) // a session with no events
	c := sample("id3", "gamma")
	mustCreate(t, s, c, &EventSpec{Type: "sandbox.created"})
	if err := s.DeleteSandbox(ctx, c.ID, &EventSpec{Type: "sandbox.removed"}); err != nil {
		t.Fatal(err)
	}
	// Written to a's session, though for c: counts in a's.
	if err := s.AddEvent(ctx, c, &EventSpec{Type: "sandbox.forked", Session: a.Session}); err != nil {
		t.Fatal(err)
	}
	// An event in a session no sandbox was created with is not a session.
	if err := s.AddEvent(ctx, b, &EventSpec{Type: "x", Session: "stray"}); err != nil {
		t.Fatal(err)
	}

	lastAt := func(session string) time.Time {
		evs := events(t, s, session)
		if len(evs) == 0 {
			return time.Time{}
		}
		return evs[len(evs)-1].At
	}
	want := []Session{
		{Name: a.Session, SandboxID: "id1", Events: 5, LastType: "sandbox.forked", LastAt: lastAt(a.Session)},
		{Name: b.Session, SandboxID: "id2", Events: 0},
		{Name: c.Session, SandboxID: "id3", Events: 2, LastType: "sandbox.removed", LastAt: lastAt(c.Session)},
	}
	check := func(what string, got *Session, w Session) {
		t.Helper()
		if got.Name != w.Name || got.SandboxID != w.SandboxID || got.Events != w.Events || got.LastType != w.LastType || !got.LastAt.Equal(w.LastAt) {
			t.Errorf("%s = %+v, want %+v", what, *got, w)
		}
		if got.CreatedAt.Before(before) || got.CreatedAt.After(time.Now().Add(time.Second)) {
			t.Errorf("%s CreatedAt = %v, want about now", what, got.CreatedAt)
		}
		if w.LastType != "" && got.LastAt.Before(got.CreatedAt) {
			t.Errorf("%s LastAt %v is before CreatedAt %v", what, got.LastAt, got.CreatedAt)
		}
	}

	list, err := s.Sessions(ctx)
	if err != nil {
		t.Fatalf("Sessions() error = %v", err)
	}
	if len(list) != len(want) {
		t.Fatalf("Sessions() = %d sessions %v, want %d", len(list), sessionNames(t, s), len(want))
	}
	for i, w := range want {
		check(fmt.Sprintf("Sessions()[%d]", i), list[i], w)
		got, err := s.GetSession(ctx, w.Name)
		if err != nil {
			t.Errorf("GetSession(%q) error = %v", w.Name, err)
			continue
		}
		check(fmt.Sprintf("GetSession(%q)", w.Name), got, w)
	}

	for _, name := range []string{"stray", "nope", "", "SESS-ID1"} {
		got, err := s.GetSession(ctx, name)
		if errdefs.CodeOf(err) != "session_not_found" || got != nil {
			t.Errorf("GetSession(%q) = %+v, %v; want code session_not_found", name, got, err)
		}
		if !errdefs.Is(err, errdefs.KindNotFound) {
			t.Errorf("GetSession(%q) kind = %q, want not_found", name, errdefs.KindOf(err))
		}
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestChanged(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	sb := sample("id1", "alpha")
	mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created"})

	ch := s.Changed()
	if closed(ch) {
		t.Fatal("Changed() is closed before any write after it")
	}
	if ch2 := s.Changed(); ch2 != ch {
		t.Error("two Changed() calls with no write between them return different channels")
	}
	// Reads a ledger follower makes between Changed and waiting must not
	// wake it, or it would spin.
	if _, err := s.Events(ctx, sb.Session, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSession(ctx, sb.Session); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sessions(ctx); err != nil {
		t.Fatal(err)
	}
	if closed(ch) {
		t.Fatal("Changed() was closed by reads (Events, GetSession, Sessions)")
	}
	// A write that fails (and is rolled back) is not a change.
	if err := s.AddEvent(ctx, sb, &EventSpec{Type: "bad", Data: make(chan int)}); err == nil {
		t.Fatal("AddEvent(data not JSON-able) = nil error, want one")
	}
	if closed(ch) {
		t.Fatal("Changed() was closed by a write that failed")
	}

	// A waiter is woken by the next committed write.
	woken := make(chan struct{})
	go func() {
		<-ch
		close(woken)
	}()
	if err := s.AddEvent(ctx, sb, &EventSpec{Type: "sandbox.started"}); err != nil {
		t.Fatal(err)
	}
	if !closed(ch) {
		t.Fatal("Changed() is not closed once AddEvent has returned")
	}
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatal("a goroutine waiting on Changed() was not woken by AddEvent")
	}

	// The next channel is a new one, open until the next write.
	next := s.Changed()
	if next == ch || closed(next) {
		t.Fatal("Changed() after a write returns the closed channel, want a new open one")
	}
	writes := []struct {
		name string
		do   func() error
	}{
		{"UpdateSandbox", func() error {
			_, err := s.UpdateSandbox(ctx, sb.ID, func(r *Sandbox) (*EventSpec, error) { r.IP = "10.0.0.9"; return nil, nil })
			return err
		}},
		{"PutEnvironment", func() error { return s.PutEnvironment(ctx, &Environment{Name: "e"}) }},
		{"AddCheckpoint", func() error {
			return s.AddCheckpoint(ctx, sampleCheckpoint("ck1", sb, t0), sb, &EventSpec{Type: "sandbox.checkpoint_created"})
		}},
		{"DeleteSandbox", func() error { return s.DeleteSandbox(ctx, sb.ID, &EventSpec{Type: "sandbox.removed"}) }},
	}
	for _, w := range writes {
		ch := s.Changed()
		if closed(ch) {
			t.Fatalf("before %s: Changed() already closed", w.name)
		}
		if err := w.do(); err != nil {
			t.Fatalf("%s error = %v", w.name, err)
		}
		if !closed(ch) {
			t.Errorf("%s did not close Changed()", w.name)
		}
	}
}
