package sandbox

import (
	"strings"
	"testing"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/store"
)

// TestSparseNeedsThisHelper: a running sandbox that an older shard started
// runs that shard's files helper, which would write a sparse entry's data
// as a whole file: a sparse write to it is refused (the CLI then sends the
// files whole) and a sparse read is not asked of it. The host's helper (a
// stopped sandbox) and that of one this build started take them.
func TestSparseNeedsThisHelper(t *testing.T) {
	f := newFakeService(t)
	sb := f.create("box")
	fs := f.svc.Files()
	if args, err := fs.sparseArgs(own(), "box"); err != nil || strings.Join(args, " ") != "--sparse" {
		t.Fatalf("a sandbox this build started: %v %v", args, err)
	}
	// Inside gVisor the helper finds a file's holes by reading it.
	f.svc.providers["fake"] = hidingHoles{f.p}
	if args, err := fs.sparseArgs(own(), "box"); err != nil || strings.Join(args, " ") != "--sparse --read-holes" {
		t.Fatalf("a sandbox whose files do not show their holes: %v %v", args, err)
	}
	if _, err := f.st.UpdateSandbox(own(), sb.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
		r.AgentDir = "/var/lib/shard/agent/0123456789abcdef"
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if args, err := fs.sparseArgs(own(), "box"); err != nil || len(args) != 0 {
		t.Fatalf("a sandbox an older shard started: %v %v", args, err)
	}
	_, err := fs.WriteFiles(own(), "box", "/x", strings.NewReader("tar"), WriteOptions{Sparse: true, Mode: -1, UID: -1, GID: -1, Size: -1})
	if errdefs.CodeOf(err) != client.CodeUnsupported || !strings.Contains(err.Error(), "older shard") {
		t.Fatalf("a sparse write to an older helper: %v", err)
	}
	if _, err := f.svc.Stop(own(), "box"); err != nil {
		t.Fatal(err)
	}
	if args, err := fs.sparseArgs(own(), "box"); err != nil || strings.Join(args, " ") != "--sparse" {
		t.Fatalf("a stopped sandbox (the host's helper): %v %v", args, err)
	}
}

// hidingHoles is a runtime whose sandboxes do not see their files' holes.
type hidingHoles struct{ *fakeProvider }

func (hidingHoles) HidesHoles() bool { return true }
