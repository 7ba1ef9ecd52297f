package lineage

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/store"
)

type events struct {
	seq int64
	out []store.Event
}

func (e *events) add(typ, session, sandbox string, data any) {
	e.seq++
	b, _ := json.Marshal(data)
	e.out = append(e.out, store.Event{Seq: e.seq, Type: typ, Session: session, SandboxID: sandbox, At: time.Unix(e.seq, 0), Data: b})
}

// render draws the forest as "kind:name(state)" lines indented by depth.
func render(ns []*Node, depth int, b *strings.Builder) {
	for _, n := range ns {
		b.WriteString(strings.Repeat("  ", depth) + n.Kind + ":" + n.Name + "(" + n.State + ")")
		if n.Via != "" {
			b.WriteString(" via " + n.Via)
		}
		b.WriteString("\n")
		render(n.Children, depth+1, b)
	}
}

func TestBuild(t *testing.T) {
	var ev events
	ev.add(ledger.Created, "base", "b1", ledger.CreatedData{Image: "busybox"})
	ev.add(ledger.CheckpointCreated, "base", "b1", ledger.CheckpointData{Checkpoint: "ck1", Kind: "fork"})
	ev.add(ledger.Created, "fork-base-f1", "f1", ledger.CreatedData{ForkedFrom: "b1", Checkpoint: "ck1"})
	ev.add(ledger.Created, "fork-base-f2", "f2", ledger.CreatedData{ForkedFrom: "b1", Checkpoint: "ck1"})
	ev.add(ledger.CheckpointCreated, "fork-base-f2", "f2", ledger.CheckpointData{Checkpoint: "ck2", Kind: "fork"})
	ev.add(ledger.Created, "fork-f2-g1", "g1", ledger.CreatedData{ForkedFrom: "f2", Checkpoint: "ck2"})
	ev.add(ledger.Removed, "fork-base-f2", "f2", nil)
	ev.add(ledger.Created, "gone", "x1", ledger.CreatedData{ForkedFrom: "f1", Checkpoint: "ck9"})
	ev.add(ledger.Removed, "gone", "x1", nil)
	ev.add(ledger.CheckpointCreated, "base", "b1", ledger.CheckpointData{Checkpoint: "ck3", Kind: "environment"})
	ev.add(ledger.Created, "from-env", "e1", ledger.CreatedData{Environment: "py", Checkpoint: "ck3", RestoredFrom: "ck3"})
	ev.add(ledger.Created, "restored", "r1", ledger.CreatedData{Checkpoint: "ck1", RestoredFrom: "ck1"})
	// A cycle the events should never hold is not followed.
	ev.add(ledger.Created, "loop", "l1", ledger.CreatedData{ForkedFrom: "l1", Checkpoint: "ckl"})
	ev.add(ledger.CheckpointCreated, "loop", "l1", ledger.CheckpointData{Checkpoint: "ckl", Kind: "fork"})
	in := Input{
		Events: ev.out,
		Sandboxes: []*store.Sandbox{
			{ID: "b1", Name: "base", State: "running"}, {ID: "f1", Name: "try-a", State: "stopped"},
			{ID: "g1", Name: "grand", State: "running"}, {ID: "e1", Name: "from-env", State: "running"},
			{ID: "r1", Name: "restored", State: "running"}, {ID: "l1", Name: "loop", State: "running"},
		},
		Checkpoints:  []*store.Checkpoint{{ID: "ck1", Kind: "fork"}, {ID: "ck3", Kind: "environment"}},
		Environments: []*store.Environment{{Name: "py", Checkpoint: "ck3"}},
	}
	var all, pruned strings.Builder
	render(Build(in), 0, &all)
	render(Prune(Build(in)), 0, &pruned)
	wantAll := `sandbox:base(running)
  checkpoint:(kept) via fork
    sandbox:try-a(stopped) via fork
      checkpoint:(removed)
        sandbox:gone(removed) via fork
    sandbox:fork-base-f2(removed) via fork
      checkpoint:(removed) via fork
        sandbox:grand(running) via fork
    sandbox:restored(running) via restore
  checkpoint:(kept) via environment
    environment:py(kept) via environment
      sandbox:from-env(running) via environment
sandbox:loop(running) via fork
  checkpoint:(removed) via fork
`
	if all.String() != wantAll {
		t.Errorf("all:\n%s\nwant:\n%s", all.String(), wantAll)
	}
	if strings.Contains(pruned.String(), "gone") || !strings.Contains(pruned.String(), "fork-base-f2(removed)") {
		t.Errorf("pruned: a removed leaf stays, or a removed parent of a live one goes:\n%s", pruned.String())
	}
	roots := Build(in)
	g := Find(roots, KindSandbox, "g1")
	if g == nil || Root(g).ID != "b1" || g.Parent().ID != "ck2" {
		t.Fatalf("grand: %+v", g)
	}
}

// TestForkTime: a fork's sandbox.created is written before its source is
// frozen, so before its checkpoint's event; in the tree a fork is never
// earlier than its checkpoint: it is when its source's sandbox.forked says
// it ran, or, that event gone, its checkpoint's time.
func TestForkTime(t *testing.T) {
	for _, tc := range []struct {
		name   string
		forked bool // the source's sandbox.forked event is there
		want   int64
	}{
		{"forked event", true, 4},
		{"source's session swept", false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ev events
			ev.add(ledger.Created, "base", "b1", ledger.CreatedData{Image: "busybox"})
			ev.add(ledger.Created, "fork-base-f1", "f1", ledger.CreatedData{ForkedFrom: "b1", Checkpoint: "ck1"})
			ev.add(ledger.CheckpointCreated, "base", "b1", ledger.CheckpointData{Checkpoint: "ck1", Kind: "fork"})
			ev.add(ledger.Forked, "base", "b1", ledger.ForkedData{Fork: "f1", Name: "try", Checkpoint: "ck1"})
			in := Input{Events: ev.out, Sandboxes: []*store.Sandbox{{ID: "b1", Name: "base"}, {ID: "f1", Name: "try"}}}
			if !tc.forked {
				in.Events = []store.Event{ev.out[1]} // only the fork's own
				in.Checkpoints = []*store.Checkpoint{{ID: "ck1", Kind: "fork", SandboxID: "b1", CreatedAt: time.Unix(3, 0)}}
			}
			f := Find(Build(in), KindSandbox, "f1")
			if f == nil || f.Parent() == nil || f.Parent().ID != "ck1" {
				t.Fatalf("fork: %+v", f)
			}
			if ck := f.Parent(); f.At.Before(ck.At) || f.At.Unix() != tc.want {
				t.Errorf("fork at %d, its checkpoint at %d; want the fork at %d", f.At.Unix(), ck.At.Unix(), tc.want)
			}
		})
	}
}

// TestPruneNamesRemovedSandboxes: a kept checkpoint whose forks were
// removed names them, so it is no unexplained leaf; with all they are its
// children.
func TestPruneNamesRemovedSandboxes(t *testing.T) {
	var ev events
	ev.add(ledger.Created, "base", "b1", ledger.CreatedData{Image: "busybox"})
	ev.add(ledger.Created, "fork-base-f1", "f1", ledger.CreatedData{ForkedFrom: "b1", Checkpoint: "ck1"})
	ev.add(ledger.Created, "fork-base-f2", "f2", ledger.CreatedData{ForkedFrom: "b1", Checkpoint: "ck1"})
	ev.add(ledger.CheckpointCreated, "base", "b1", ledger.CheckpointData{Checkpoint: "ck1", Kind: "fork"})
	ev.add(ledger.Forked, "base", "b1", ledger.ForkedData{Fork: "f1", Name: "try-1", Checkpoint: "ck1"})
	ev.add(ledger.Forked, "base", "b1", ledger.ForkedData{Fork: "f2", Name: "try-2", Checkpoint: "ck1"})
	ev.add(ledger.CheckpointCreated, "fork-base-f2", "f2", ledger.CheckpointData{Checkpoint: "ck2", Kind: "fork"})
	ev.add(ledger.Created, "fork-try-2-g1", "g1", ledger.CreatedData{ForkedFrom: "f2", Checkpoint: "ck2"})
	ev.add(ledger.Removed, "fork-try-2-g1", "g1", nil)
	ev.add(ledger.Removed, "fork-base-f1", "f1", nil)
	ev.add(ledger.Removed, "fork-base-f2", "f2", nil)
	ev.add(ledger.Created, "restored", "r1", ledger.CreatedData{Checkpoint: "ck1", RestoredFrom: "ck1"})
	ev.add(ledger.Removed, "restored", "r1", nil)
	in := Input{
		Events:      ev.out,
		Sandboxes:   []*store.Sandbox{{ID: "b1", Name: "base", State: "running"}},
		Checkpoints: []*store.Checkpoint{{ID: "ck1", Kind: "fork"}},
	}
	pruned := Prune(Build(in))
	ck := Find(pruned, KindCheckpoint, "ck1")
	if ck == nil || len(ck.Children) != 0 {
		t.Fatalf("the kept checkpoint: %+v", ck)
	}
	var got []string
	for _, g := range ck.RemovedSandboxes {
		got = append(got, g.Name+" "+g.Via+" "+g.State)
		if len(g.Children) != 0 || len(g.RemovedSandboxes) != 0 {
			t.Errorf("%s carries what was below it: %+v", g.Name, g)
		}
	}
	if want := "try-1 fork removed,try-2 fork removed,restored restore removed"; strings.Join(got, ",") != want {
		t.Errorf("removed sandboxes of the checkpoint: %q, want %q", strings.Join(got, ","), want)
	}
	if b := Find(pruned, KindSandbox, "b1"); len(b.RemovedSandboxes) != 0 {
		t.Errorf("the source names what its checkpoints did: %+v", b.RemovedSandboxes)
	}
	all := Find(Build(in), KindCheckpoint, "ck1")
	if len(all.Children) != 3 || len(all.RemovedSandboxes) != 0 {
		t.Errorf("all: the removed sandboxes are children: %d children, %d named", len(all.Children), len(all.RemovedSandboxes))
	}
}
