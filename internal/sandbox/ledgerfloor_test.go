package sandbox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/store"
)

// fakeDisk is a filesystem whose free space the test sets, and a clock.
type fakeDisk struct {
	avail, total uint64
	err          error
	calls        int
	now          time.Time
}

func (d *fakeDisk) floor(minFree int64) *ledgerFloor {
	if d.now.IsZero() {
		d.now = time.Unix(1_700_000_000, 0)
	}
	return &ledgerFloor{dir: "/data", minFree: minFree, now: func() time.Time { return d.now },
		free: func(dir string) (uint64, uint64, error) {
			d.calls++
			return d.avail, d.total, d.err
		}}
}

// The floor is the flag's size, or the server's reserve when it is not
// set, whatever the disk's size; below it a request is a 507 that says how much is
// free, the floor and the flag.
func TestLedgerFloor(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name         string
		minFree      int64
		avail, total uint64
		err          error
		wantKind     errdefs.Kind // "" for no error
		says         []string
	}{
		{"above the flag's floor", 2 * gib, 3 * gib, 100 * gib, nil, "", nil},
		{"below the flag's floor", 2 * gib, gib, 100 * gib, nil, errdefs.KindNoSpace, []string{"1GiB free", "below the 2GiB", "--ledger-min-free", "run a command in sandbox web"}},
		{"a floor larger than the disk", 1 << 50, 100 * gib, 100 * gib, nil, errdefs.KindNoSpace, []string{"100GiB free", "below the 1PiB", "--ledger-min-free"}},
		{"default: the reserve", 0, 2*gib - 1, 10 * gib, nil, errdefs.KindNoSpace, []string{"below the 2GiB", "the server's reserve", "--ledger-min-free"}},
		{"default, above the reserve", 0, 2 * gib, 10 * gib, nil, "", nil},
		{"default on a large disk: still the reserve", 0, 3 * gib, 1000 * gib, nil, "", nil},
		{"no floor", -1, 0, 100 * gib, nil, "", nil},
		{"statfs fails", 0, 0, 0, errors.New("boom"), errdefs.KindInternal, []string{"measure the free space of /data", "boom"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &fakeDisk{avail: tt.avail, total: tt.total, err: tt.err}
			err := d.floor(tt.minFree).check("run a command in sandbox web")
			if tt.wantKind == "" {
				if err != nil {
					t.Fatalf("check = %v, want none", err)
				}
				return
			}
			if errdefs.KindOf(err) != tt.wantKind {
				t.Fatalf("check = %v (%s), want %s", err, errdefs.KindOf(err), tt.wantKind)
			}
			if tt.wantKind == errdefs.KindNoSpace && errdefs.CodeOf(err) != "insufficient_storage" {
				t.Errorf("code %q, want insufficient_storage", errdefs.CodeOf(err))
			}
			for _, s := range tt.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("check = %q, want it to say %q", err, s)
				}
			}
		})
	}
}

// One statfs serves a second of checks; the next one after that sees the
// disk as it is then.
func TestLedgerFloorCaches(t *testing.T) {
	d := &fakeDisk{avail: 0, total: 100 << 30}
	f := d.floor(1 << 30)
	for i := range 100 {
		if err := f.check("exec"); errdefs.KindOf(err) != errdefs.KindNoSpace {
			t.Fatalf("check %d on a full disk = %v, want a 507", i, err)
		}
		d.now = d.now.Add(5 * time.Millisecond) // 100 checks in 0.5s
	}
	if d.calls != 1 {
		t.Fatalf("100 checks within half a second made %d statfs calls, want 1", d.calls)
	}
	d.avail = 2 << 30 // space was freed
	if err := f.check("exec"); err == nil {
		t.Fatal("a check within the second saw the freed space: it did not use the cached look")
	}
	d.now = d.now.Add(ledgerFreshness)
	if err := f.check("exec"); err != nil {
		t.Fatalf("a check a second later = %v, want the freed space seen", err)
	}
	if d.calls != 2 {
		t.Fatalf("statfs calls = %d, want 2", d.calls)
	}
	d.now = d.now.Add(-time.Hour) // the clock went back
	d.avail = 0
	if err := f.check("exec"); err == nil {
		t.Fatal("after the clock went back, a check used the old look")
	}
}

// Below the floor, the requests that add to the ledger are refused before
// they write anything; what the server records of what happened (the end
// of an exec, an ungrant) is still written.
func TestLedgerFloorRefusesBeforeLedger(t *testing.T) {
	s, _ := grantTestService(t)
	ctx := own()
	src, err := s.cfg.Store.GetSandbox(ctx, "src")
	if err != nil {
		t.Fatal(err)
	}
	// One with a ledger session of its own (the helper's have none).
	if err := s.cfg.Store.CreateSandbox(ctx, &store.Sandbox{ID: "fl-id", Name: "fl", State: StateRunning, IP: src.IP, Token: "t", Session: "fl"},
		&store.EventSpec{Type: ledger.Created}); err != nil {
		t.Fatal(err)
	}
	// A grant made while there is room, to be ungranted below the floor.
	if _, err := s.Access().Grant(ctx, "fl", GrantRequest{Secret: "one"}); err != nil {
		t.Fatal(err)
	}
	d := &fakeDisk{avail: 10 << 20, total: 100 << 30}
	s.adm.floor = d.floor(1 << 30)
	count := func() int {
		t.Helper()
		evs, err := s.cfg.Store.Events(ctx, "fl", 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			t.Fatal("session fl has no events: the count proves nothing")
		}
		return len(evs)
	}
	refused := []struct {
		name string
		do   func() error
	}{
		{"exec", func() error { _, _, err := s.Exec(ctx, "fl", ExecRequest{Argv: []string{"true"}}); return err }},
		{"grant", func() error { _, err := s.Access().Grant(ctx, "fl", GrantRequest{Secret: "two"}); return err }},
		{"policy", func() error {
			_, err := s.Access().SetPolicy(ctx, "fl", &store.Policy{DenyAll: true})
			return err
		}},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			before := count()
			err := tt.do()
			if errdefs.KindOf(err) != errdefs.KindNoSpace || !strings.Contains(err.Error(), "--ledger-min-free") {
				t.Fatalf("%s below the floor = %v, want a 507 naming --ledger-min-free", tt.name, err)
			}
			if n := count(); n != before {
				t.Fatalf("%s below the floor: the session has %d events, was %d", tt.name, n, before)
			}
		})
	}
	t.Run("recorded anyway", func(t *testing.T) {
		before := count()
		sb, err := s.cfg.Store.GetSandbox(ctx, "fl")
		if err != nil {
			t.Fatal(err)
		}
		e := &ExecSession{s: s, sb: sb, id: "running", start: time.Now(), done: make(chan struct{})}
		e.finish(ledger.ExecFinishedData{Error: "the sandbox stopped"})
		if _, err := s.Access().Ungrant(ctx, "fl", "one"); err != nil {
			t.Fatalf("ungrant below the floor: %v", err)
		}
		if n := count(); n != before+2 {
			t.Fatalf("below the floor, an exec's end and an ungrant left %d events, want %d", n-before, 2)
		}
	})
}
