package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

// Placement says which node a sandbox lives on, with enough of it to list
// it while that node is unreachable.
type Placement struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Project   string    `json:"project"`
	Node      string    `json:"node"`
	Provider  string    `json:"provider"`
	Image     string    `json:"image,omitempty"`
	ParentID  string    `json:"parent_id,omitempty"`
	Session   string    `json:"session,omitempty"`
	MemoryMiB int64     `json:"memory_mib,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

func placementOf(node string, sb *store.Sandbox) Placement {
	return Placement{ID: sb.ID, Name: sb.Name, Project: project.OrDefault(sb.Project), Node: node, Provider: sb.Provider,
		Image: sb.Image, ParentID: sb.ParentID, Session: sb.Session, MemoryMiB: sb.MemoryBytes >> 20, CreatedAt: sb.CreatedAt}
}

// Claim records that sb lives on this node and reserves its name in its
// project across the cluster (store.Registry): a name any node's sandbox
// holds is refused with name_taken. A rename moves the reservation.
func (c *Cluster) Claim(ctx context.Context, sb *store.Sandbox) error {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	p := placementOf(c.cfg.Node, sb)
	doc, _ := json.Marshal(p)
	nameKey := c.key("names", p.Project, p.Name)
	placeKey := c.key("sandboxes", p.ID)
	for range 5 {
		resp, err := c.cli.Txn(ctx).Then(clientv3.OpGet(nameKey), clientv3.OpGet(placeKey)).Commit()
		if err != nil {
			return Unavailable(err)
		}
		var nameRev, placeRev int64
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
			if string(kvs[0].Value) != p.ID {
				return errdefs.Conflict(client.CodeNameTaken, "a sandbox named %s already exists: pick another name, or remove that sandbox first", p.Name)
			}
			nameRev = kvs[0].ModRevision
		}
		ops := []clientv3.Op{clientv3.OpPut(nameKey, p.ID), clientv3.OpPut(placeKey, string(doc))}
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
			placeRev = kvs[0].ModRevision
			var old Placement
			if json.Unmarshal(kvs[0].Value, &old) == nil && old.Name != p.Name {
				ops = append(ops, clientv3.OpDelete(c.key("names", old.Project, old.Name)))
			}
		}
		ok, err := c.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(nameKey), "=", nameRev),
			clientv3.Compare(clientv3.ModRevision(placeKey), "=", placeRev),
		).Then(ops...).Commit()
		if err != nil {
			return Unavailable(err)
		}
		if ok.Succeeded {
			return nil
		}
	}
	return errdefs.Conflict(client.CodeNameTaken, "a sandbox named %s is being made on another node", p.Name)
}

// placeOnly records where sb lives, without its name.
func (c *Cluster) placeOnly(ctx context.Context, sb *store.Sandbox) error {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	doc, _ := json.Marshal(placementOf(c.cfg.Node, sb))
	if _, err := c.cli.Put(ctx, c.key("sandboxes", sb.ID), string(doc)); err != nil {
		return Unavailable(err)
	}
	return nil
}

// Release forgets sb's placement and its name (store.Registry), if they
// are still sb's. With etcd away, the next reconcile does it.
func (c *Cluster) Release(ctx context.Context, sb *store.Sandbox) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	if err := c.release(ctx, placementOf(c.cfg.Node, sb)); err != nil {
		c.cfg.Log.Warn("cluster: sandbox gone, but its name stays held until this node reconciles", "id", sb.ID, "name", sb.Name, "err", err)
	}
}

func (c *Cluster) release(ctx context.Context, p Placement) error {
	nameKey := c.key("names", p.Project, p.Name)
	_, err := c.cli.Txn(ctx).Then(
		clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(nameKey), "=", p.ID)}, []clientv3.Op{clientv3.OpDelete(nameKey)}, nil),
		clientv3.OpDelete(c.key("sandboxes", p.ID)),
	).Commit()
	if err != nil {
		return Unavailable(err)
	}
	return nil
}

// Locate finds where a sandbox (by id, or by name in ctx's project) lives:
// in the mirror, else (it may be a moment old) in etcd.
func (c *Cluster) Locate(ctx context.Context, idOrName string) (*Placement, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	if p, ok := c.locateMirrored(ctx, idOrName); ok {
		return p, nil
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	proj, scoped := project.From(ctx)
	ops := []clientv3.Op{clientv3.OpGet(c.key("sandboxes", idOrName))}
	if scoped {
		ops = append(ops, clientv3.OpGet(c.key("names", proj, idOrName)))
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, Unavailable(err)
	}
	notFound := errdefs.NotFound(client.CodeSandboxNotFound, "sandbox %s not found", idOrName)
	var doc []byte
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		doc = kvs[0].Value
	} else if scoped {
		kvs := resp.Responses[1].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return nil, notFound
		}
		g, err := c.cli.Get(ctx, c.key("sandboxes", string(kvs[0].Value)))
		if err != nil {
			return nil, Unavailable(err)
		}
		if len(g.Kvs) == 0 {
			return nil, notFound
		}
		doc = g.Kvs[0].Value
	} else {
		return nil, notFound
	}
	var p Placement
	if err := json.Unmarshal(doc, &p); err != nil {
		return nil, fmt.Errorf("placement of %s: %w", idOrName, err)
	}
	if !project.Visible(ctx, p.Project) {
		return nil, notFound
	}
	return &p, nil
}

func (c *Cluster) locateMirrored(ctx context.Context, idOrName string) (*Placement, bool) {
	doc, ok := c.mirror.get("sandboxes/" + idOrName)
	if proj, scoped := project.From(ctx); !ok && scoped {
		if id, found := c.mirror.get("names/" + proj + "/" + idOrName); found {
			doc, ok = c.mirror.get("sandboxes/" + string(id))
		}
	}
	var p Placement
	if !ok || json.Unmarshal(doc, &p) != nil || !project.Visible(ctx, p.Project) {
		return nil, false
	}
	return &p, true
}

// Placements lists the placements of one node ("" for every node), in
// ctx's project when it is scoped.
func (c *Cluster) Placements(ctx context.Context, node string) ([]Placement, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	docs := c.mirror.list("sandboxes/")
	if !c.mirror.current() {
		ctx, cancel := context.WithTimeout(ctx, Timeout)
		defer cancel()
		resp, err := c.cli.Get(ctx, c.key("sandboxes")+"/", clientv3.WithPrefix())
		if err != nil {
			return nil, Unavailable(err)
		}
		docs = docs[:0]
		for _, kv := range resp.Kvs {
			docs = append(docs, kv.Value)
		}
	}
	var out []Placement
	for _, doc := range docs {
		var p Placement
		if json.Unmarshal(doc, &p) != nil || (node != "" && p.Node != node) || !project.Visible(ctx, p.Project) {
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Placement) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// Reconcile makes etcd agree with this node's own sandboxes (mine, every
// project) and environments (envs): each is claimed (a name another node took while this one was
// away stays with it, and is logged), and a placement of this node's that
// it no longer has is released.
func (c *Cluster) Reconcile(ctx context.Context, mine []*store.Sandbox, envs []*store.Environment) error {
	if err := c.reconcileEnvs(ctx, envs); err != nil {
		return err
	}
	held, err := c.Placements(project.Unscoped(ctx, "the cluster's reconcile: this node's placements"), c.cfg.Node)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, sb := range mine {
		have[sb.ID] = true
		err := c.Claim(ctx, sb)
		if errdefs.CodeOf(err) == client.CodeNameTaken {
			// Another node's sandbox took the name while this one was
			// away: this one stays reachable by its id.
			c.cfg.Log.Warn("cluster: this node's sandbox lost its name to another node's while this node was away; reach it by its id", "id", sb.ID, "name", sb.Name)
			err = c.placeOnly(ctx, sb)
		}
		if err != nil {
			c.cfg.Log.Warn("cluster: cannot claim this node's sandbox", "id", sb.ID, "name", sb.Name, "err", err)
		}
	}
	for _, p := range held {
		if !have[p.ID] {
			if err := c.release(ctx, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// Place chooses the node for a new sandbox: the named one (want), or the
// up node with the most free memory that has the provider (any provider
// when it is ""). It fails when none has room for memory bytes.
func (c *Cluster) Place(ctx context.Context, want, provider string, memory int64) (Node, error) {
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return Node{}, err
	}
	return Choose(nodes, want, provider, memory)
}

// Choose is Place's choice among nodes.
func Choose(nodes []Node, want, provider string, memory int64) (Node, error) {
	if want != "" {
		for _, n := range nodes {
			if n.Name != want {
				continue
			}
			if n.State != NodeUp {
				return Node{}, NodeDown(n.Name)
			}
			if provider != "" && !slices.Contains(n.Providers, provider) {
				return Node{}, errdefs.New(errdefs.KindUnsupported, client.CodeProviderUnavailable, "node %s has no provider %s (it has %v)", n.Name, provider, n.Providers)
			}
			if memory > 0 && n.MemoryFree < memory {
				return Node{}, errdefs.New(errdefs.KindNoSpace, client.CodeNodeFull, "node %s has %d MiB free, not the %d MiB the sandbox needs (shard node ls)", n.Name, n.MemoryFree>>20, memory>>20)
			}
			return n, nil
		}
		return Node{}, errdefs.NotFound(client.CodeNodeNotFound, "no node %s in the cluster (shard node ls lists them)", want)
	}
	var best *Node
	for i := range nodes {
		n := &nodes[i]
		if n.State != NodeUp || (provider != "" && !slices.Contains(n.Providers, provider)) {
			continue
		}
		if best == nil || n.MemoryFree > best.MemoryFree || (n.MemoryFree == best.MemoryFree && n.Name < best.Name) {
			best = n
		}
	}
	if best == nil {
		if provider != "" {
			return Node{}, errdefs.New(errdefs.KindUnsupported, client.CodeProviderUnavailable, "no node that is up has the provider %s", provider)
		}
		return Node{}, errdefs.New(errdefs.KindUnavailable, client.CodeNoNode, "no node of the cluster is up")
	}
	if memory > 0 && best.MemoryFree < memory {
		return Node{}, errdefs.New(errdefs.KindNoSpace, client.CodeClusterFull, "no node has %d MiB free for the sandbox (the most is %d MiB, on %s)", memory>>20, best.MemoryFree>>20, best.Name)
	}
	return *best, nil
}

// NodeDown is the error of a request for a sandbox on a node whose lease
// has expired.
func NodeDown(node string) error {
	return errdefs.New(errdefs.KindUnavailable, client.CodeNodeUnreachable, "node %s is unreachable: its sandboxes are kept and come back with it", node)
}
