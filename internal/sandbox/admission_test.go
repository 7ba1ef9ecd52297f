package sandbox

import (
	"context"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

func wantRefused(t *testing.T, err error, kind errdefs.Kind, code string, says ...string) {
	t.Helper()
	if errdefs.KindOf(err) != kind || errdefs.CodeOf(err) != code {
		t.Fatalf("err = %v (%s/%s), want %s/%s", err, errdefs.KindOf(err), errdefs.CodeOf(err), kind, code)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("err = %q, want it to say %q", err, s)
		}
	}
}

// A project's quota refuses what would pass it, names the bound, the use
// and the limit, and leaves nothing made; another project is not touched.
func TestProjectQuotas(t *testing.T) {
	f := newFakeService(t)
	a := project.With(context.Background(), "team-a")
	b := project.With(context.Background(), "team-b")
	if err := f.svc.Admission().SetQuota(own(), "team-a", store.Quota{Sandboxes: 3, MemoryBytes: 1 << 30, DiskBytes: 3 << 30}); err != nil {
		t.Fatal(err)
	}
	mk := func(ctx context.Context, name string, mem, disk int64) (*store.Sandbox, error) {
		return f.svc.Create(ctx, CreateRequest{Name: name, Image: fakeImage, Bounds: store.Bounds{MemoryBytes: mem, DiskBytes: disk}})
	}
	if _, err := mk(a, "a1", 512<<20, 1<<30); err != nil {
		t.Fatal(err)
	}
	if _, err := mk(a, "a2", 512<<20, 1<<30); err != nil {
		t.Fatal(err)
	}
	_, err := mk(a, "a3", 512<<20, 1<<30)
	wantRefused(t, err, errdefs.KindForbidden, "quota_exceeded", "team-a", "memory", "1GiB", "--max-memory")
	// Another project is bounded by nothing of team-a's.
	for _, n := range []string{"b1", "b2", "b3", "b4"} {
		if _, err := mk(b, n, 512<<20, 1<<30); err != nil {
			t.Fatalf("team-b's %s: %v", n, err)
		}
	}
	// A stopped sandbox frees its memory, not its slot nor its disk.
	if _, err := f.svc.Stop(a, "a1"); err != nil {
		t.Fatal(err)
	}
	_, err = mk(a, "a3", 256<<20, 2<<30)
	wantRefused(t, err, errdefs.KindForbidden, "quota_exceeded", "disk", "--max-disk")
	if _, err := mk(a, "a3", 256<<20, 1<<30); err != nil {
		t.Fatalf("a3 within every bound: %v", err)
	}
	_, err = mk(a, "a4", 64<<20, 64<<20)
	wantRefused(t, err, errdefs.KindForbidden, "quota_exceeded", "sandboxes is 3", "holds 3", "--max-sandboxes")
	// A start counts memory again: a1 (512MiB) beside a2 and a3 (768MiB) is past 1GiB.
	_, err = f.svc.Start(a, "a1")
	wantRefused(t, err, errdefs.KindForbidden, "quota_exceeded", "memory")
	if st := f.state("a1"); st != StateStopped {
		t.Errorf("a1 after a refused start: %s", st)
	}
	// A fork of three past the slots makes none.
	if err := f.svc.Admission().SetQuota(own(), "team-a", store.Quota{Sandboxes: 5}); err != nil {
		t.Fatal(err)
	}
	_, err = f.svc.Fork(a, "a2", ForkRequest{Name: "kid", Count: 3})
	wantRefused(t, err, errdefs.KindForbidden, "quota_exceeded", "sandboxes")
	all, err := f.st.ListSandboxes(own())
	if err != nil || len(all) != 7 {
		t.Fatalf("%d sandboxes after a refused fork (%v), want a1-a3 and b1-b4", len(all), err)
	}
	f.checkpoints(0)
	uses, err := f.svc.Admission().ProjectUses(own(), []string{"team-a", "team-b"})
	if err != nil {
		t.Fatal(err)
	}
	if u := uses["team-a"]; u.Sandboxes != 3 || u.Memory != 768<<20 || u.Disk != 3<<30 || u.Quota.Sandboxes != 5 {
		t.Errorf("team-a's use %+v", u)
	}
}

// The host's memory: running sandboxes' bounds summed stay within MemTotal
// times the overcommit; past it a create is 507 naming what is promised.
func TestHostMemoryAdmission(t *testing.T) {
	f := newFakeService(t)
	f.svc.adm.hostMemory, f.svc.adm.overcommit = 1<<30, 1
	ctx := own()
	for _, n := range []string{"m1", "m2"} {
		if _, err := f.svc.Create(ctx, CreateRequest{Name: n, Image: fakeImage, Bounds: store.Bounds{MemoryBytes: 512 << 20}}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := f.svc.Create(ctx, CreateRequest{Name: "m3", Image: fakeImage, Bounds: store.Bounds{MemoryBytes: 64 << 20}})
	wantRefused(t, err, errdefs.KindNoSpace, "insufficient_memory", "64MiB", "promised 1GiB", "--memory-overcommit")
	if _, err := f.svc.Stop(ctx, "m1"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Create(ctx, CreateRequest{Name: "m3", Image: fakeImage, Bounds: store.Bounds{MemoryBytes: 64 << 20}}); err != nil {
		t.Fatalf("after a stop: %v", err)
	}
	_, err = f.svc.Start(ctx, "m1")
	wantRefused(t, err, errdefs.KindNoSpace, "insufficient_memory")
	if st := f.state("m1"); st != StateStopped {
		t.Errorf("m1 after a refused start: %s", st)
	}
}

// The ledger quota refuses what would add to a project's ledger once it
// holds its quota; removing sessions would give the room back.
func TestLedgerQuota(t *testing.T) {
	f := newFakeService(t)
	a := project.With(context.Background(), "team-a")
	if _, err := f.svc.Create(a, CreateRequest{Name: "l1", Image: fakeImage}); err != nil {
		t.Fatal(err)
	}
	n, err := f.st.LedgerBytes(a, "team-a")
	if err != nil || n <= 0 {
		t.Fatalf("team-a's ledger bytes after a create: %d, %v", n, err)
	}
	if err := f.svc.Admission().SetQuota(own(), "team-a", store.Quota{LedgerBytes: n}); err != nil {
		t.Fatal(err)
	}
	_, err = f.svc.Create(a, CreateRequest{Name: "l2", Image: fakeImage})
	wantRefused(t, err, errdefs.KindForbidden, "quota_exceeded", "ledger", "--max-ledger-bytes", "shard ledger rm")
	// Another project's ledger is its own.
	if _, err := f.svc.Create(project.With(context.Background(), "team-b"), CreateRequest{Name: "l2", Image: fakeImage}); err != nil {
		t.Fatal(err)
	}
}

// A batch that fails part way (the second fork's name is taken) leaves
// nothing of the first: no record, no ledger session, no event.
func TestFailedBatchLeavesNoSession(t *testing.T) {
	f := newFakeService(t)
	ctx := own()
	f.create("src")
	f.create("kid-2")
	before, err := f.st.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Fork(ctx, "src", ForkRequest{Name: "kid", Count: 2}); err == nil {
		t.Fatal("a fork whose second name is taken was made")
	}
	after, err := f.st.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		var names []string
		for _, s := range after {
			names = append(names, s.Name)
		}
		t.Errorf("sessions after a failed fork: %v, want the %d there were", names, len(before))
	}
	f.only("src", "kid-2")
}
