// Package lineage builds the fork tree: which sandbox came from which, at
// which checkpoint, when, from the ledger (so sandboxes removed since are
// still in it) and the records that exist now (so it says what still is).
// It is pure: the events and records come in, a forest goes out.
package lineage

import (
	"slices"
	"strings"
	"time"

	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/store"
)

// Kinds of Node.
const (
	KindSandbox     = "sandbox"
	KindCheckpoint  = "checkpoint"
	KindSnapshot    = "snapshot"
	KindEnvironment = "environment"
)

// Node is one object of the tree and what came from it.
type Node struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`             // a sandbox's, checkpoint's or snapshot's id; an environment's name
	Name string `json:"name,omitempty"` // a sandbox's or snapshot's name; a checkpoint's tag
	// State is a sandbox's state, or "removed"; "kept" or "removed" for
	// the other kinds.
	State   string `json:"state"`
	Removed bool   `json:"removed"`
	// At is when it was made; a fork's, when it ran (after its checkpoint).
	At time.Time `json:"at"`
	// Via says how it came from its parent: fork, restore, environment,
	// resume or snapshot for a sandbox; a checkpoint's kind (fork,
	// checkpoint, environment); snapshot; environment.
	Via      string  `json:"via,omitempty"`
	Image    string  `json:"image,omitempty"`
	Provider string  `json:"provider,omitempty"`
	Children []*Node `json:"children,omitempty"`
	// RemovedSandboxes are the removed sandboxes that came straight from
	// it and that Prune left out (nothing live is below them), without
	// what was below them: why a kept checkpoint whose forks or restores
	// were all removed is there.
	RemovedSandboxes []*Node `json:"removed_sandboxes,omitempty"`

	parent *Node
	seq    int64
}

// Input is what the tree is made of.
type Input struct {
	Events       []store.Event // store.LineageEvents
	Sandboxes    []*store.Sandbox
	Checkpoints  []*store.Checkpoint
	Snapshots    []*store.Snapshot
	Environments []*store.Environment
}

type key struct{ kind, id string }

type builder struct {
	nodes   map[key]*Node
	session map[string]*Node       // a session's sandbox
	forked  map[string]store.Event // a fork's id → its source's sandbox.forked event
	created []created              // sandboxes whose origin is linked last
}

func (b *builder) node(kind, id string) *Node {
	k := key{kind, id}
	n := b.nodes[k]
	if n == nil {
		// Known only as named by another (its own record and events are
		// gone): removed.
		n = &Node{Kind: kind, ID: id, State: "removed", Removed: true}
		b.nodes[k] = n
	}
	return n
}

func (b *builder) link(child, parent *Node) {
	if child.parent != nil || parent == nil || child == parent {
		return
	}
	for p := parent; p != nil; p = p.parent {
		if p == child {
			return // never a cycle, whatever the events say
		}
	}
	child.parent = parent
	parent.Children = append(parent.Children, child)
}

// Build makes the forest: every root (a node with no parent) with what
// came from it. Removed nodes are in it; Prune leaves them out.
func Build(in Input) []*Node {
	b := &builder{nodes: map[key]*Node{}, session: map[string]*Node{}, forked: map[string]store.Event{}}
	for _, e := range in.Events {
		b.event(e)
	}
	b.environments(in.Environments)
	for _, p := range b.created {
		b.origin(p.n, p.d)
	}
	b.present(in)
	for _, n := range b.nodes {
		if n.Kind != KindSandbox {
			continue
		}
		var fk ledger.ForkedData
		if e, ok := b.forked[n.ID]; ok && ledger.Decode(e, &fk) == nil {
			if fk.Name != "" && n.Removed {
				n.Name = fk.Name
			}
			// A fork's own sandbox.created is written before its source
			// is frozen (its name is taken first), so before the
			// checkpoint it came from: it came to be when it ran, which
			// its source's sandbox.forked says.
			n.At = e.At
		}
		if p := n.parent; n.Via == "fork" && p != nil && p.Kind == KindCheckpoint && n.At.Before(p.At) {
			n.At = p.At // the source's session, and its forked event, are gone
		}
		if n.Name == "" {
			n.Name = n.ID
		}
	}
	var roots []*Node
	for _, n := range b.nodes {
		if n.parent == nil {
			roots = append(roots, n)
		}
	}
	sortNodes(roots)
	for _, n := range b.nodes {
		sortNodes(n.Children)
	}
	return roots
}

// created is a sandbox's node and its sandbox.created data, linked to its
// origin once every node is known.
type created struct {
	n *Node
	d ledger.CreatedData
}

// event adds what one ledger event says.
func (b *builder) event(e store.Event) {
	switch e.Type {
	case ledger.Created:
		// A record whose data does not read still made a sandbox: its
		// node stays, without the image and provider it could not say.
		var d ledger.CreatedData
		_ = ledger.Decode(e, &d)
		n := b.node(KindSandbox, e.SandboxID)
		if n.seq == 0 {
			n.Name, n.At, n.Image, n.Provider, n.seq = e.Session, e.At, d.Image, d.Provider, e.Seq
			b.session[e.Session] = n
			b.created = append(b.created, created{n, d})
		}
	case ledger.CheckpointCreated:
		var d ledger.CheckpointData
		if ledger.Decode(e, &d) != nil || d.Checkpoint == "" {
			return
		}
		c := b.node(KindCheckpoint, d.Checkpoint)
		c.Name, c.At, c.Via, c.seq = d.Tag, e.At, d.Kind, e.Seq
		b.link(c, b.node(KindSandbox, e.SandboxID))
	case ledger.SnapshotCreated:
		var d ledger.SnapshotCreatedData
		if ledger.Decode(e, &d) != nil || d.Snapshot == "" {
			return
		}
		sn := b.node(KindSnapshot, d.Snapshot)
		sn.Name, sn.At, sn.Via, sn.seq = d.Name, e.At, "snapshot", e.Seq
		b.link(sn, b.node(KindSandbox, e.SandboxID))
	case ledger.Forked:
		// The source's record of a fork names it (its session may not),
		// and says when it ran.
		var d ledger.ForkedData
		if ledger.Decode(e, &d) == nil && d.Fork != "" {
			b.forked[d.Fork] = e
		}
	case ledger.Removed:
		n := b.node(KindSandbox, e.SandboxID)
		n.Removed, n.State = true, "removed"
	}
}

// environments hang from their checkpoint.
func (b *builder) environments(envs []*store.Environment) {
	for _, env := range envs {
		n := b.node(KindEnvironment, env.Name)
		n.Name, n.At, n.Image, n.Provider, n.Via = env.Name, env.CreatedAt, env.Image, env.Provider, "environment"
		n.State, n.Removed = "kept", false
		if env.Checkpoint != "" {
			b.link(n, b.node(KindCheckpoint, env.Checkpoint))
		}
	}
}

// origin hangs sandbox n from what it started from.
func (b *builder) origin(n *Node, d ledger.CreatedData) {
	switch {
	case d.Environment != "":
		n.Via = "environment"
		env := b.node(KindEnvironment, d.Environment)
		if env.Name == "" {
			env.Name = d.Environment
		}
		if env.Removed && d.Checkpoint != "" {
			// A removed environment still shows where its sandboxes came from.
			b.link(env, b.node(KindCheckpoint, d.Checkpoint))
		}
		b.link(n, env)
	case d.ForkedFrom != "":
		n.Via = "fork"
		src := b.node(KindSandbox, d.ForkedFrom)
		if d.Checkpoint == "" {
			b.link(n, src)
			return
		}
		ck := b.node(KindCheckpoint, d.Checkpoint)
		// A checkpoint whose own event is gone (its session was swept)
		// still came from the fork's source.
		b.link(ck, src)
		b.link(n, ck)
	case d.ResumedFrom != "":
		n.Via = "resume"
		if d.Checkpoint != "" {
			b.link(n, b.node(KindCheckpoint, d.Checkpoint))
		} else if src := b.session[d.ResumedFrom]; src != nil {
			b.link(n, src)
		}
	case d.RestoredFrom != "":
		n.Via = "restore"
		b.link(n, b.node(KindCheckpoint, d.RestoredFrom))
	case d.FromSnapshot != "":
		n.Via = "snapshot"
		b.link(n, b.node(KindSnapshot, d.FromSnapshot))
	}
}

// present: what exists now says its own name and state.
func (b *builder) present(in Input) {
	for _, sb := range in.Sandboxes {
		n := b.node(KindSandbox, sb.ID)
		n.Name, n.State, n.Removed = sb.Name, sb.State, false
		if n.At.IsZero() {
			n.At, n.Image, n.Provider = sb.CreatedAt, sb.Image, sb.Provider
		}
	}
	for _, ck := range in.Checkpoints {
		n := b.node(KindCheckpoint, ck.ID)
		n.State, n.Removed = "kept", false
		if n.At.IsZero() {
			n.At, n.Name, n.Via = ck.CreatedAt, ck.Tag, ck.Kind
			b.link(n, b.node(KindSandbox, ck.SandboxID))
		}
	}
	for _, sn := range in.Snapshots {
		n := b.node(KindSnapshot, sn.ID)
		n.Name, n.State, n.Removed = sn.Name, "kept", false
		if n.At.IsZero() {
			n.At, n.Via = sn.CreatedAt, "snapshot"
			b.link(n, b.node(KindSandbox, sn.SandboxID))
		}
	}
}

// sortNodes orders nodes by time, then kind and id (a stable answer).
func sortNodes(ns []*Node) {
	slices.SortFunc(ns, func(a, b *Node) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		if c := strings.Compare(a.Kind, b.Kind); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}

// Prune leaves out what is removed and has nothing live below it (a
// removed node that something live came from stays, marked removed). A
// removed sandbox it leaves out is named in its parent's RemovedSandboxes.
func Prune(ns []*Node) []*Node {
	var out []*Node
	for _, n := range ns {
		if n.prune() {
			out = append(out, n)
		}
	}
	return out
}

// prune prunes what is below n and says whether n stays.
func (n *Node) prune() bool {
	var kept []*Node
	for _, c := range n.Children {
		switch {
		case c.prune():
			kept = append(kept, c)
		case c.Kind == KindSandbox:
			gone := *c
			gone.Children, gone.RemovedSandboxes = nil, nil
			n.RemovedSandboxes = append(n.RemovedSandboxes, &gone)
		}
	}
	n.Children = kept
	return !n.Removed || len(n.Children) > 0
}

// Find is the node of kind and id in the forest, or nil.
func Find(roots []*Node, kind, id string) *Node {
	for _, n := range roots {
		if n.Kind == kind && n.ID == id {
			return n
		}
		if f := Find(n.Children, kind, id); f != nil {
			return f
		}
	}
	return nil
}

// Root is the root of the tree n is in.
func Root(n *Node) *Node {
	for n.parent != nil {
		n = n.parent
	}
	return n
}

// Parent is the node n came from, or nil.
func (n *Node) Parent() *Node { return n.parent }
