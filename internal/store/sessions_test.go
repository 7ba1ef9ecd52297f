package store

import (
	"slices"
	"testing"
	"time"

	"github.com/useshards/shard/internal/errdefs"
)

// A session goes only once its sandbox and checkpoints are gone; then its
// events go with it.
func TestDeleteSession(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	live, gone, held := sample("id1", "live"), sample("id2", "gone"), sample("id3", "held")
	for _, sb := range []*Sandbox{live, gone, held} {
		sb.Session = sb.Name
		mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created"})
	}
	if err := s.AddCheckpoint(ctx, sampleCheckpoint("ck1", held, time.Now()), held, &EventSpec{Type: "sandbox.checkpoint_created"}); err != nil {
		t.Fatal(err)
	}
	for _, sb := range []*Sandbox{gone, held} {
		if err := s.DeleteSandbox(ctx, sb.ID, &EventSpec{Type: "sandbox.removed"}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		session  string
		wantKind errdefs.Kind // "" for removed
		wantCode string
	}{
		{"live", errdefs.KindConflict, "session_in_use"},
		{"held", errdefs.KindConflict, "session_has_checkpoints"},
		{"nope", errdefs.KindNotFound, "session_not_found"},
		{"gone", "", ""},
		{"gone", errdefs.KindNotFound, "session_not_found"}, // twice: gone
	}
	for _, tt := range tests {
		err := s.DeleteSession(ctx, tt.session)
		if tt.wantKind == "" {
			if err != nil {
				t.Fatalf("DeleteSession(%s) = %v, want nil", tt.session, err)
			}
			continue
		}
		if errdefs.KindOf(err) != tt.wantKind || errdefs.CodeOf(err) != tt.wantCode {
			t.Errorf("DeleteSession(%s) = %v, want %s %s", tt.session, err, tt.wantKind, tt.wantCode)
		}
	}
	if got := sessionNames(t, s); !slices.Equal(got, []string{"live", "held"}) {
		t.Errorf("sessions after = %v, want [live held]", got)
	}
	if evs, _ := s.Events(ctx, "gone", 0, 100); len(evs) != 0 {
		t.Errorf("the removed session still has %d events", len(evs))
	}
	if evs, _ := s.Events(ctx, "live", 0, 100); len(evs) != 1 {
		t.Errorf("the live session has %d events, want 1 (untouched)", len(evs))
	}
	// Its name comes back fresh for a new sandbox.
	again := sample("id4", "gone")
	again.Session = "gone"
	mustCreate(t, s, again, &EventSpec{Type: "sandbox.created"})
	if again.Session != "gone" {
		t.Errorf("a new sandbox named gone got session %s, want gone", again.Session)
	}
}

// ExpiredSessions lists the removable sessions whose last event is older
// than the bound, and no others.
func TestExpiredSessions(t *testing.T) {
	s, _ := newStore(t)
	ctx := own()
	for _, n := range []string{"a", "b", "c", "live", "held"} {
		sb := sample("id-"+n, n)
		sb.Session = n
		mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created"})
		if n == "held" {
			if err := s.AddCheckpoint(ctx, sampleCheckpoint("ck1", sb, time.Now()), sb, &EventSpec{Type: "sandbox.checkpoint_created"}); err != nil {
				t.Fatal(err)
			}
		}
		if n != "live" {
			if err := s.DeleteSandbox(ctx, sb.ID, &EventSpec{Type: "sandbox.removed"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		before time.Time
		limit  int
		want   []string
	}{
		{time.Now().Add(-time.Hour), 10, nil},                    // every last event is newer
		{time.Now().Add(time.Hour), 10, []string{"a", "b", "c"}}, // not live, not held
		{time.Now().Add(time.Hour), 2, []string{"a", "b"}},       // a batch
	}
	for _, tt := range tests {
		keys, err := s.ExpiredSessions(ctx, tt.before, tt.limit)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, k := range keys {
			if k.Project != "default" {
				t.Errorf("ExpiredSessions: %+v, want project default", k)
			}
			got = append(got, k.Name)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("ExpiredSessions(%s, %d) = %v, want %v", tt.before.Format(time.RFC3339), tt.limit, got, tt.want)
		}
	}
}
