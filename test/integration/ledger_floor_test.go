package integration

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// TestLedgerFloor: with --ledger-min-free above what the data directory's
// filesystem has free (1PiB), a request that would add to the ledger is a
// 507 insufficient_storage naming the floor and the flag, and the session
// has no more events than before; stopping and removing the sandbox still
// work and are recorded (a red team's 100 execs of maximal argv added
// 13MiB to the ledger in 2.4s, with nothing to stop them before the disk).
func TestLedgerFloor(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox, Name: "floor-sb"})
	execOK(t, sb.ID, "true")
	restartWith(t, "--ledger-min-free", "1PiB")
	ctx := ctxT(t)
	events := func() int64 {
		t.Helper()
		s, err := e.c.GetSession(ctx, sb.Session)
		if err != nil {
			t.Fatal(err)
		}
		return s.Events
	}
	before := events()
	if before == 0 {
		t.Fatal("the session has no events: the count proves nothing")
	}
	want507 := func(what string, err error) {
		t.Helper()
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != 507 || ce.Code != "insufficient_storage" ||
			!strings.Contains(ce.Message, "1PiB") || !strings.Contains(ce.Message, "--ledger-min-free") {
			t.Fatalf("%s below the floor: %v, want 507 insufficient_storage naming 1PiB and --ledger-min-free", what, err)
		}
	}
	// A maximal argv: what the red team sent.
	big := []string{"echo", strings.Repeat("a", 120<<10)}
	for range 3 {
		_, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: big})
		want507("exec", err)
	}
	_, err := e.c.ExecInteractive(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh"}})
	want507("interactive exec", err)
	_, err = e.c.Fork(ctx, sb.ID, client.ForkRequest{Name: "floor-fork"})
	want507("fork", err)
	_, err = e.c.Create(ctx, client.CreateRequest{Image: busybox, Name: "floor-new"})
	want507("create", err)
	if n := events(); n != before {
		t.Fatalf("the session has %d events after the refused requests, had %d", n, before)
	}
	if _, err := e.c.Get(ctx, "floor-new"); err == nil {
		t.Fatal("a create refused below the floor left a sandbox")
	}
	// What the server records of what happened is still written.
	if _, err := e.c.Stop(ctx, sb.ID); err != nil {
		t.Fatalf("stop below the floor: %v", err)
	}
	if err := e.c.Remove(context.Background(), sb.ID, false); err != nil {
		t.Fatalf("remove below the floor: %v", err)
	}
	page, err := e.c.Events(ctx, sb.Session, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range page.Events {
		types = append(types, ev.Type)
	}
	if n := len(types); n < 2 || types[n-2] != "sandbox.stopped" || types[n-1] != "sandbox.removed" {
		t.Fatalf("the session's events end %v, want sandbox.stopped then sandbox.removed", types[max(0, n-4):])
	}
}
