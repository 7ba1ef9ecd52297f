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
