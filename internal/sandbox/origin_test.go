package sandbox

import (
	"testing"

	"github.com/useshards/shard/internal/store"
)

// Every sandbox records what it was made from, by name: an environment's
// sandbox was shown only its setup sandbox's id, removed at once.
func TestOriginRecorded(t *testing.T) {
	f := newFakeService(t)
	src, err := f.svc.Create(own(), CreateRequest{Name: "src", Image: fakeImage})
	if err != nil {
		t.Fatal(err)
	}
	if o := src.Origin; o == nil || *o != (store.Origin{Kind: OriginImage, Name: fakeImage}) {
		t.Errorf("a create's origin %+v, want the image", o)
	}
	kids, err := f.svc.Fork(own(), "src", ForkRequest{Name: "kid"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.st.GetSandbox(own(), kids[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if o := got.Origin; o == nil || o.Kind != OriginFork || o.Name != "src" || o.ID != src.ID || o.Checkpoint == "" {
		t.Errorf("a fork's origin %+v, want src and its checkpoint", o)
	}
}

func TestRestoreOrigin(t *testing.T) {
	ck := &store.Checkpoint{ID: "ck1", Tag: "before", SandboxID: "sb1", SandboxName: "setup"}
	for _, tc := range []struct {
		o    RestoreOptions
		want store.Origin
	}{
		{RestoreOptions{}, store.Origin{Kind: OriginCheckpoint, Name: "before", ID: "ck1"}},
		{RestoreOptions{Environment: "py-deps"}, store.Origin{Kind: OriginEnvironment, Name: "py-deps", Checkpoint: "ck1"}},
		{RestoreOptions{ResumedFrom: "s1"}, store.Origin{Kind: OriginSession, Name: "s1", Checkpoint: "ck1"}},
		{RestoreOptions{FromNode: "n2"}, store.Origin{Kind: OriginFork, Name: "setup", ID: "sb1", Checkpoint: "ck1"}},
	} {
		if got := tc.o.origin(ck); *got != tc.want {
			t.Errorf("%+v: origin %+v, want %+v", tc.o, *got, tc.want)
		}
	}
}
