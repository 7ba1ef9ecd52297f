package sandbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/store"
)

// The failure paths of fork, restore and reconcile, over fakes: whatever
// fails, the source runs on and nothing of the failed operation is left.

func TestForkFailures(t *testing.T) {
	tests := []struct {
		name  string
		count int
		setup func(f *fakes)
		code  string // the error's code; "" any
	}{
		{name: "checkpoint fails", count: 1, setup: func(f *fakes) {
			f.p.checkpointHook = func(context.Context, string) error { return errors.New("checkpoint: disk on fire") }
		}},
		{name: "restore of one of three fails", count: 3, setup: func(f *fakes) {
			var mu sync.Mutex
			n := 0
			f.p.restoreHook = func(string) error {
				mu.Lock()
				defer mu.Unlock()
				if n++; n == 2 {
					return errors.New("restore: the second fork's runtime died")
				}
				return nil
			}
		}},
		{name: "the store refuses the checkpoint's room", count: 2, code: "insufficient_storage", setup: func(f *fakes) {
			f.fs.fail = failOn("reserve", noSpace())
		}},
		{name: "the store refuses a fork's disk", count: 2, code: "insufficient_storage", setup: func(f *fakes) {
			f.fs.fail = failOn("createFrom", noSpace())
		}},
		{name: "freeze times out", count: 2, code: "freeze_timeout", setup: func(f *fakes) {
			f.svc.cfg.FreezeTimeout = 100 * time.Millisecond
			f.p.checkpointHook = func(ctx context.Context, _ string) error {
				<-ctx.Done() // a save that outlasts the freeze limit
				return ctx.Err()
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeService(t)
			src := f.create("src")
			tt.setup(f)
			forks, err := f.svc.Fork(own(), "src", ForkRequest{Name: "child", Count: tt.count})
			if err == nil {
				t.Fatalf("Fork = %d forks, want an error", len(forks))
			}
			if tt.code != "" && errdefs.CodeOf(err) != tt.code {
				t.Errorf("Fork error %v (code %s), want code %s", err, errdefs.CodeOf(err), tt.code)
			}
			if st := f.state("src"); st != StateRunning {
				t.Errorf("source is %s after the failed fork, want running", st)
			}
			if st, _ := f.p.Status(own(), src.ID); st != provider.StatusRunning {
				t.Errorf("source's runtime is %s, want running (thawed)", st)
			}
			if f.p.pauses != f.p.resumes {
				t.Errorf("%d pauses, %d resumes: the source was left frozen", f.p.pauses, f.p.resumes)
			}
			f.only("src")
			f.sessions("src")
			f.checkpoints(0)
			// And the source forks again once the fault is gone.
			f.p.checkpointHook, f.p.restoreHook, f.fs.fail = nil, nil, nil
			f.svc.cfg.FreezeTimeout = DefaultFreezeTimeout
			if _, err := f.svc.Fork(own(), "src", ForkRequest{Name: "again"}); err != nil {
				t.Fatalf("Fork after the failure: %v", err)
			}
			f.only("src", "again")
			f.sessions("src", "fork-src")
			f.checkpoints(1)
		})
	}
}

// A fork that succeeds leaves its forks running and its checkpoint kept.
func TestForkCount(t *testing.T) {
	f := newFakeService(t)
	f.create("src")
	forks, err := f.svc.Fork(own(), "src", ForkRequest{Name: "kid", Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, fk := range forks {
		if fk.State != StateRunning || fk.ParentID == "" {
			t.Errorf("fork %s: state %s parent %q", fk.Name, fk.State, fk.ParentID)
		}
	}
	f.only("src", "kid-1", "kid-2", "kid-3")
	f.checkpoints(1)
}

// A remove of the source while a fork holds it frozen waits for the fork,
// then removes the source; the forks stay.
func TestRemoveRacingFork(t *testing.T) {
	f := newFakeService(t)
	f.create("src")
	inSave, release := make(chan struct{}), make(chan struct{})
	f.p.checkpointHook = func(context.Context, string) error {
		close(inSave)
		<-release
		return nil
	}
	forked := make(chan error, 1)
	go func() {
		_, err := f.svc.Fork(own(), "src", ForkRequest{Name: "kid"})
		forked <- err
	}()
	<-inSave
	removed := make(chan error, 1)
	go func() { removed <- f.svc.Remove(own(), "src", true) }()
	select {
	case err := <-removed:
		t.Fatalf("Remove returned (%v) while the fork held the source frozen", err)
	case <-time.After(100 * time.Millisecond):
	}
	if st := f.state("src"); st != StateFreezing {
		t.Errorf("source is %s during the fork's save, want freezing", st)
	}
	close(release)
	if err := <-forked; err != nil {
		t.Fatalf("Fork: %v", err)
	}
	if err := <-removed; err != nil {
		t.Fatalf("Remove after the fork: %v", err)
	}
	f.only("kid")
	f.checkpoints(1) // the fork's checkpoint outlives its source
}

// A restore that fails leaves no sandbox; the checkpoint stays for the
// next try.
func TestRestoreFails(t *testing.T) {
	f := newFakeService(t)
	f.create("src")
	ck, err := f.svc.Saved().Checkpoint(own(), "src", "t1")
	if err != nil {
		t.Fatal(err)
	}
	f.p.restoreHook = func(string) error { return errors.New("restore: no memory") }
	if _, err := f.svc.Saved().Restore(own(), ck.ID, RestoreOptions{Name: "back"}); err == nil {
		t.Fatal("Restore succeeded, want the runtime's error")
	}
	f.only("src")
	f.sessions("src")
	f.checkpoints(1)
	f.p.restoreHook = nil
	if _, err := f.svc.Saved().Restore(own(), ck.ID, RestoreOptions{Name: "back"}); err != nil {
		t.Fatalf("Restore after the failure: %v", err)
	}
	f.only("src", "back")
	f.sessions("src", "back") // not back-2: the failed one left no session
}

// A create the store refuses once its record is written leaves nothing:
// no sandbox, no ledger session.
func TestCreateFails(t *testing.T) {
	f := newFakeService(t)
	f.fs.fail = failOn("create", noSpace())
	_, err := f.svc.Create(own(), CreateRequest{Name: "sb", Image: fakeImage})
	if errdefs.CodeOf(err) != "insufficient_storage" {
		t.Fatalf("Create = %v, want insufficient_storage", err)
	}
	f.only()
	f.sessions()
	f.fs.fail = nil
	f.create("sb")
	f.sessions("sb") // not sb-2
}

// failOn is a fakeStorage.fail that fails op with err.
func failOn(op string, err error) func(string) error {
	return func(o string) error {
		if o == op {
			return err
		}
		return nil
	}
}

func noSpace() error {
	return errdefs.New(errdefs.KindNoSpace, "insufficient_storage", "the store is full")
}

// Reconcile after a crash: each half-done state ends where it must.
func TestReconcileHalfDone(t *testing.T) {
	tests := []struct {
		state   string
		runtime provider.Status // the runtime's word after the crash
		want    string          // the record's state after; "" removed
	}{
		{StateCreating, provider.StatusRunning, ""}, // and its session: it never was
		{StateRemoving, provider.StatusRunning, ""}, // its session stays
		{StateRemoving, provider.StatusAbsent, ""},
		{StateFreezing, provider.StatusPaused, StateRunning}, // thawed
		{StateFreezing, provider.StatusAbsent, StateStopped},
		{StateStarting, provider.StatusRunning, StateStopped},
		{StateStopping, provider.StatusRunning, StateStopped},
		{StateRunning, provider.StatusRunning, StateRunning},
		{StateRunning, provider.StatusAbsent, StateStopped},
		{StateStopped, provider.StatusAbsent, StateStopped},
	}
	for _, tt := range tests {
		t.Run(tt.state+"/"+string(tt.runtime), func(t *testing.T) {
			f := newFakeService(t)
			sb := f.create("sb")
			// The crash: the record in tt.state, the runtime as it says.
			if _, err := f.st.UpdateSandbox(own(), sb.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
				r.State = tt.state
				return nil, nil
			}); err != nil {
				t.Fatal(err)
			}
			f.p.set(sb.ID, tt.runtime)
			if err := f.svc.Reconcile(own()); err != nil {
				t.Fatal(err)
			}
			if tt.want == "" {
				f.only()
				if tt.state == StateCreating {
					f.sessions()
				} else {
					f.sessions("sb")
				}
				return
			}
			if got := f.state("sb"); got != tt.want {
				t.Errorf("state after reconcile %s, want %s", got, tt.want)
			}
			st, _ := f.p.Status(own(), sb.ID)
			if tt.want == StateRunning && st != provider.StatusRunning {
				t.Errorf("runtime %s after reconcile, want running", st)
			}
			if tt.want == StateStopped && st != provider.StatusAbsent {
				t.Errorf("runtime %s after reconcile, want the container gone", st)
			}
		})
	}
}

// Reconcile removes what no record owns: a container, a namespace, files
// and a run directory a crash left behind (a warm spare's, a create's
// before its record).
func TestReconcileRemovesUnknown(t *testing.T) {
	f := newFakeService(t)
	f.create("keep")
	f.p.set("0123456789ab", provider.StatusRunning)
	f.net.Create(own(), "0123456789ab", f.net.Gateway())
	f.fs.Create(own(), "0123456789ab", 0)
	if err := f.svc.Reconcile(own()); err != nil {
		t.Fatal(err)
	}
	f.only("keep")
}

// Allow is asked under the source's lock with what the source carries, and
// a refusal leaves nothing behind.
func TestForkAllow(t *testing.T) {
	f := newFakeService(t)
	src := f.create("src")
	if _, err := f.svc.Access().SetPolicy(own(), "src", &store.Policy{DenyAll: true}); err != nil {
		t.Fatal(err)
	}
	refuse := errdefs.New(errdefs.KindForbidden, "missing_scope", "policy:* needed")
	var asked []bool
	_, err := f.svc.Fork(own(), src.ID, ForkRequest{Name: "kid", Allow: func(grants, policy bool) error {
		asked = append(asked, grants, policy)
		return refuse
	}})
	if err != refuse || len(asked) != 2 || asked[0] || !asked[1] {
		t.Fatalf("Fork = %v, Allow asked %v; want the refusal, asked (grants false, policy true)", err, asked)
	}
	f.only("src")
	f.checkpoints(0)
}

// An environment's fingerprint is what it was before the shape became one
// value: a server upgrade must not rebuild every environment.
func TestFingerprintStable(t *testing.T) {
	got := fingerprint("busybox", "gvisor", store.Bounds{MemoryBytes: 512 << 20, CPUMillis: 1000, DiskBytes: 2 << 30, Pids: 4096},
		[]string{"A=1"}, [][]string{{"true"}})
	if want := "dae09f254f4eb67ea8e5eb34"; got != want {
		t.Fatalf("fingerprint = %s, want %s (as the servers before computed it)", got, want)
	}
}

// A resume that restores another session's checkpoint (a fork's session
// starts from its source's) asks Allow about that checkpoint: a key that
// may not fork a sandbox with a policy may not resume its fork's session
// either (the red team's bypass).
func TestResumeAllowsCarriedOfOtherSession(t *testing.T) {
	f := newFakeService(t)
	f.create("src")
	if _, err := f.svc.Access().SetPolicy(own(), "src", &store.Policy{DenyAll: true}); err != nil {
		t.Fatal(err)
	}
	kids, err := f.svc.Fork(own(), "src", ForkRequest{Name: "kid"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Remove(own(), "kid", true); err != nil {
		t.Fatal(err)
	}
	refuse := errdefs.New(errdefs.KindForbidden, "missing_scope", "policy:* needed")
	deny := func(grants, policy bool) error {
		if grants || policy {
			return refuse
		}
		return nil
	}
	if res, err := f.svc.Sessions().Resume(own(), kids[0].Session, "stolen", deny); !errors.Is(err, refuse) || errdefs.CodeOf(err) != "missing_scope" {
		t.Fatalf("Resume of the fork's session = %+v, %v; want the refusal", res, err)
	}
	f.only("src")
}

// Forks take the sandboxes made ahead of them (their ids and addresses),
// which are made again after each; a fork that fails leaves nothing of the
// one it took, and the rest wait on; a close takes them all down.
func TestForkAhead(t *testing.T) {
	f := newFakeService(t, func(c *Config) { c.Ahead = 2 })
	f.create("src")
	if _, err := f.svc.Fork(own(), "src", ForkRequest{Name: "first"}); err != nil {
		t.Fatal(err)
	}
	f.settleAhead(2) // the shape is known now
	f.only("src", "first")
	ahead := f.aheadIDs()
	if n := f.svc.adm.aheadHeld(); n != 2 {
		t.Errorf("%d sandboxes made ahead held against the host's memory, want 2", n)
	}

	fk, err := f.svc.Fork(own(), "src", ForkRequest{Name: "second"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ahead, fk[0].ID) {
		t.Errorf("fork %s, not one of the sandboxes made ahead %v", fk[0].ID, ahead)
	}
	f.settleAhead(2)
	f.only("src", "first", "second")

	// A restore that fails takes the fork, and the sandbox it took, away.
	f.p.restoreHook = func(string) error { return errors.New("restore: the runtime died") }
	before := f.aheadIDs()
	if _, err := f.svc.Fork(own(), "src", ForkRequest{Name: "third"}); err == nil {
		t.Fatal("Fork succeeded with a failing restore")
	}
	f.p.restoreHook = nil
	f.settleAhead(2)
	f.only("src", "first", "second")
	if after := f.aheadIDs(); slices.Equal(after, before) {
		t.Errorf("sandboxes made ahead %v are those before the failed fork: it took none", after)
	}
	if n := f.svc.adm.aheadHeld(); n != 2 {
		t.Errorf("%d sandboxes made ahead held after the failed fork, want 2", n)
	}

	// More at once than are made ahead: the rest are created, and the
	// shape keeps that many from then on.
	ready := f.aheadIDs()
	forks, err := f.svc.Fork(own(), "src", ForkRequest{Name: "kid", Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	took := 0
	for _, fk := range forks {
		if slices.Contains(ready, fk.ID) {
			took++
		}
	}
	if took != 2 {
		t.Errorf("%d of 3 forks took a sandbox made ahead, want 2 (all there were)", took)
	}
	f.settleAhead(3)
	f.only("src", "first", "second", "kid-1", "kid-2", "kid-3")

	// A restore takes one too.
	ready = f.aheadIDs()
	back, err := f.svc.Saved().Restore(own(), forks[0].Origin.Checkpoint, RestoreOptions{Name: "back"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ready, back.ID) {
		t.Errorf("restored %s, not one of the sandboxes made ahead %v", back.ID, ready)
	}
	f.settleAhead(3)
	f.only("src", "first", "second", "kid-1", "kid-2", "kid-3", "back")

	if err := f.svc.Close(own()); err != nil {
		t.Fatal(err)
	}
	f.only("src", "first", "second", "kid-1", "kid-2", "kid-3", "back")
	if ids := f.aheadIDs(); len(ids) != 0 {
		t.Errorf("sandboxes made ahead %v left after Close", ids)
	}
	if n := f.svc.adm.aheadHeld(); n != 0 {
		t.Errorf("%d holds of sandboxes made ahead left after Close", n)
	}
}
