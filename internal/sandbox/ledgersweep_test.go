package sandbox

import (
	"fmt"
	"testing"
	"time"

	"github.com/useshards/shard/internal/store"
)

// The sweep removes every session past the retention whose sandbox is
// gone, over more than one batch, and leaves a live sandbox's session and
// newer ones.
func TestSweepLedger(t *testing.T) {
	s, _ := grantTestService(t)
	ctx := own()
	st := s.cfg.Store
	for i := range sweepBatch + 50 {
		sb := &store.Sandbox{ID: fmt.Sprintf("id-%d", i), Name: fmt.Sprintf("sb-%d", i), State: StateStopped, Session: fmt.Sprintf("sb-%d", i)}
		if err := st.CreateSandbox(ctx, sb, &store.EventSpec{Type: "sandbox.created"}); err != nil {
			t.Fatal(err)
		}
		if err := st.DeleteSandbox(ctx, sb.ID, &store.EventSpec{Type: "sandbox.removed"}); err != nil {
			t.Fatal(err)
		}
	}
	live := &store.Sandbox{ID: "live-id", Name: "live", State: StateRunning, Session: "live"}
	if err := st.CreateSandbox(ctx, live, &store.EventSpec{Type: "sandbox.created"}); err != nil {
		t.Fatal(err)
	}
	if n := s.sessions.sweepLedger(ctx, time.Now().Add(-time.Hour)); n != 0 {
		t.Fatalf("a sweep of sessions older than an hour removed %d, want 0 (all are newer)", n)
	}
	if n := s.sessions.sweepLedger(ctx, time.Now().Add(time.Hour)); n != sweepBatch+50 {
		t.Fatalf("sweep removed %d sessions, want %d", n, sweepBatch+50)
	}
	all, err := st.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].Name != "live" {
		t.Fatalf("sessions left = %d (%v...), want only live", len(all), all[0].Name)
	}
}
