package sandbox

import (
	"slices"
	"testing"

	"github.com/useshards/shard/internal/errdefs"
)

// A fork's checkpoint lives while a sandbox's resume starts from it, then
// goes with the remove that leaves none; kept ones, the user's, and those
// a restore needs stay. remove --checkpoints takes a session's checkpoints,
// or nothing when another sandbox needs one.
func TestForkCheckpointRetention(t *testing.T) {
	type env struct {
		f   *fakes
		cks map[string]string // name given by the steps -> checkpoint id
	}
	ctx := own()
	rm := func(name string) func(*testing.T, *env) {
		return func(t *testing.T, e *env) {
			if err := e.f.svc.Remove(ctx, name, true); err != nil {
				t.Fatalf("remove %s: %v", name, err)
			}
		}
	}
	fork := func(src, name, ck string, keep bool) func(*testing.T, *env) {
		return func(t *testing.T, e *env) {
			fk, err := e.f.svc.Fork(ctx, src, ForkRequest{Name: name, KeepCheckpoint: keep})
			if err != nil {
				t.Fatalf("fork %s: %v", name, err)
			}
			cks, _ := e.f.st.ListCheckpoints(ctx, "")
			for _, c := range cks {
				if c.Kind == "fork" && slices.Contains(mustUsers(t, e.f, c.ID), "sandbox "+fk[0].Name) {
					e.cks[ck] = c.ID
				}
			}
		}
	}
	checkpoint := func(src, ck string) func(*testing.T, *env) {
		return func(t *testing.T, e *env) {
			c, err := e.f.svc.Saved().Checkpoint(ctx, src, "")
			if err != nil {
				t.Fatal(err)
			}
			e.cks[ck] = c.ID
		}
	}
	restore := func(ck, name string) func(*testing.T, *env) {
		return func(t *testing.T, e *env) {
			if _, err := e.f.svc.Saved().Restore(ctx, e.cks[ck], RestoreOptions{Name: name}); err != nil {
				t.Fatalf("restore %s: %v", ck, err)
			}
		}
	}
	sweep := func(t *testing.T, e *env) { e.f.svc.saved.sweepCheckpoints(ctx) }
	rmWith := func(name, wantCode string) func(*testing.T, *env) {
		return func(t *testing.T, e *env) {
			_, err := e.f.svc.RemoveWith(ctx, name, RemoveOptions{Force: true, Checkpoints: true})
			if (wantCode == "" && err != nil) || (wantCode != "" && errdefs.CodeOf(err) != wantCode) {
				t.Fatalf("remove --checkpoints %s = %v, want %q", name, err, wantCode)
			}
		}
	}
	tests := []struct {
		name  string
		steps []func(*testing.T, *env)
		left  []string // sandboxes
		kept  []string // checkpoints (names given by the steps)
	}{
		{"fork, remove fork then source", []func(*testing.T, *env){fork("src", "kid", "f1", false), rm("kid"), rm("src")}, nil, nil},
		{"fork, remove source then fork", []func(*testing.T, *env){fork("src", "kid", "f1", false), rm("src")}, []string{"kid"}, []string{"f1"}},
		{"the source still resumes from it", []func(*testing.T, *env){fork("src", "kid", "f1", false), rm("kid")}, []string{"src"}, []string{"f1"}},
		{"keep_checkpoint", []func(*testing.T, *env){fork("src", "kid", "f1", true), rm("kid"), rm("src")}, nil, []string{"f1"}},
		{"a checkpoint the user took", []func(*testing.T, *env){checkpoint("src", "c1"), rm("src")}, nil, []string{"c1"}},
		{"the source moves on", []func(*testing.T, *env){fork("src", "kid", "f1", false), rm("kid"), fork("src", "kid2", "f2", false), sweep}, []string{"src", "kid2"}, []string{"f2"}},
		{"a restore from it", []func(*testing.T, *env){fork("src", "kid", "f1", false), restore("f1", "r"), rm("kid"), rm("src")}, []string{"r"}, []string{"f1"}},
		{"a restore from it, removed", []func(*testing.T, *env){fork("src", "kid", "f1", false), restore("f1", "r"), rm("kid"), rm("src"), rm("r")}, nil, nil},
		{"fork of a fork", []func(*testing.T, *env){fork("src", "kid", "f1", false), fork("kid", "grandkid", "f2", false), rm("src")}, []string{"kid", "grandkid"}, []string{"f2"}},
		{"remove --checkpoints", []func(*testing.T, *env){checkpoint("src", "c1"), fork("src", "kid", "f1", true), rm("kid"), rmWith("src", "")}, nil, nil},
		{"remove --checkpoints refused", []func(*testing.T, *env){checkpoint("src", "c1"), restore("c1", "r"), rmWith("src", "checkpoint_in_use")}, []string{"src", "r"}, []string{"c1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &env{f: newFakeService(t), cks: map[string]string{}}
			e.f.create("src")
			for _, step := range tt.steps {
				step(t, e)
			}
			e.f.only(tt.left...)
			e.f.checkpoints(len(tt.kept))
			for _, k := range tt.kept {
				if _, err := e.f.st.GetCheckpoint(ctx, e.cks[k]); err != nil {
					t.Errorf("checkpoint %s (%s): %v, want it kept", k, e.cks[k], err)
				}
			}
		})
	}
}

func mustUsers(t *testing.T, f *fakes, id string) []string {
	t.Helper()
	u, err := f.svc.Saved().CheckpointUsers(own(), id)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
