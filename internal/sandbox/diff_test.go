package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/useshards/shard/internal/agent/proto"
	"github.com/useshards/shard/internal/store"
)

// viewWith makes each View an upper with one file, /app/f, of the body
// given, then calls also (nil: nothing).
func viewWith(body string, also func(ctx context.Context) error) func(context.Context, string, string, string) (func(), error) {
	return func(ctx context.Context, _, _, dir string) (func(), error) {
		p := filepath.Join(dir, "upper", "app", "f")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			return nil, err
		}
		if also != nil {
			if err := also(ctx); err != nil {
				return nil, err
			}
		}
		return func() {}, nil
	}
}

// TestDiffEndsWithItsContext: a diff whose context ends (its client went
// away) while its copies are being read returns the context's error
// rather than reading on.
func TestDiffEndsWithItsContext(t *testing.T) {
	f := newFakeService(t)
	sb := f.create("a")
	ctx, cancel := context.WithCancel(own())
	defer cancel()
	f.fs.view = viewWith("x", func(context.Context) error { cancel(); return nil })
	if res, err := f.svc.Files().Diff(ctx, sb.ID, DiffOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a diff whose client left: %v, %+v", err, res)
	}
	f.fs.view = viewWith("x", nil)
	res, err := f.svc.Files().Diff(own(), sb.ID, DiffOptions{})
	if err != nil || len(res.Changes) != 2 || res.Changes[1].Path != "/app/f" {
		t.Fatalf("a diff: %v, %+v", err, res)
	}
}

// TestDiffWaitsForASlot: with one diff at once, a second waits without
// mounting anything and ends when its context does; once the first is
// done the next runs.
func TestDiffWaitsForASlot(t *testing.T) {
	f := newFakeService(t, func(c *Config) { c.MaxDiffs = 1 })
	sb := f.create("a")
	var views, inView, most atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	f.fs.view = viewWith("x", func(ctx context.Context) error {
		views.Add(1)
		n := inView.Add(1)
		defer inView.Add(-1)
		if n > most.Load() {
			most.Store(n)
		}
		entered <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	first := make(chan error, 1)
	go func() {
		_, err := f.svc.Files().Diff(own(), sb.ID, DiffOptions{})
		first <- err
	}()
	<-entered
	ctx, cancel := context.WithCancel(own())
	second := make(chan error, 1)
	go func() {
		_, err := f.svc.Files().Diff(ctx, sb.ID, DiffOptions{})
		second <- err
	}()
	for f.svc.files.diffs.waiting.Load() != 1 {
		select {
		case <-entered:
			t.Fatal("a second diff mounted its copy while the only slot was taken")
		case err := <-second:
			t.Fatalf("the second diff ended without waiting: %v", err)
		default:
			runtime.Gosched()
		}
	}
	cancel()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Fatalf("a diff waiting for a slot whose client left: %v", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	go func() { <-entered }()
	if _, err := f.svc.Files().Diff(own(), sb.ID, DiffOptions{}); err != nil {
		t.Fatalf("the next diff: %v", err)
	}
	if views.Load() != 2 || most.Load() != 1 {
		t.Errorf("%d views, %d at once; want 2, 1", views.Load(), most.Load())
	}
}

// TestForkFileMatches: the fork file is the server's only as the agent
// writes it, of the side's own identity.
func TestForkFileMatches(t *testing.T) {
	sb := &store.Sandbox{ID: "sb1", Name: "fork-1", ParentID: "src", ParentName: "base", Generation: 2}
	enc := func(id proto.Identity) string {
		b, _ := json.Marshal(id)
		return string(b) + "\n"
	}
	boot := bootIdentity(sb)
	forked := forkIdentity(sb, "ck1")
	other := boot
	other.ID = "sb2"
	gen := boot
	gen.Generation = 9
	half := boot
	half.Checkpoint = "ck1"
	full := forkFile{want: boot}
	saved := forkFile{want: proto.Identity{ID: "sb1", Name: "fork-1"}, idOnly: true, absent: true}
	for _, tc := range []struct {
		name    string
		ff      forkFile
		data    string
		present bool
		want    bool
	}{
		{"at boot", full, enc(boot), true, true},
		{"forked", full, enc(forked), true, true},
		{"none", full, "", false, false},
		{"another sandbox's", full, enc(other), true, false},
		{"another generation", full, enc(gen), true, false},
		{"a checkpoint without its time", full, enc(half), true, false},
		{"no newline", full, enc(boot)[:len(enc(boot))-1], true, false},
		{"spaces", full, `{"id": "sb1","name":"fork-1","parent_id":"src","parent_name":"base","generation":2}` + "\n", true, false},
		{"a field more", full, `{"id":"sb1","name":"fork-1","parent_id":"src","parent_name":"base","generation":2,"x":1}` + "\n", true, false},
		{"junk", full, "mine\n", true, false},
		{"a saved copy's", saved, enc(forked), true, true},
		{"a saved copy without one", saved, "", false, true},
		{"a saved copy of another", saved, enc(other), true, false},
	} {
		if got := tc.ff.matches([]byte(tc.data), tc.present); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if (forkFile{any: true}).matcher() != nil {
		t.Error("the image's side takes anything")
	}
}

// TestSlots: a slot freed goes to the next; a wait ends with its context.
func TestSlots(t *testing.T) {
	s := newSlots(1)
	release, err := s.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, err := s.acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no slot: %v", err)
	}
	release()
	if r, err := s.acquire(context.Background()); err != nil {
		t.Fatal(err)
	} else {
		r()
	}
}
