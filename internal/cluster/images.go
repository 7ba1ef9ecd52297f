package cluster

import (
	"context"
	"encoding/json"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// ImagePlacement is an imported image as the cluster knows it: the node
// that imported it (the only one that sends it) and the digest every
// copy must have. Its name (a canonical localhost/ reference) is its
// project's alone across the nodes.
type ImagePlacement struct {
	Ref       string    `json:"ref"`
	Project   string    `json:"project"`
	Node      string    `json:"node"`
	Digest    string    `json:"digest"`
	CreatedAt time.Time `json:"created_at"`
}

func imageKey(proj, ref string) string { return "images/" + proj + "/" + ref }

// ClaimImport records the import ref of project proj as made on this node
// with digest (image.Registry): an import of that name another node holds
// is refused (name_taken).
func (c *Cluster) ClaimImport(ctx context.Context, proj, ref, digest string) error {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	p := ImagePlacement{Ref: ref, Project: project.OrDefault(proj), Node: c.cfg.Node, Digest: digest, CreatedAt: time.Now().UTC()}
	key := c.cfg.Prefix + imageKey(p.Project, ref)
	for range 5 {
		resp, err := c.cli.Get(ctx, key)
		if err != nil {
			return Unavailable(err)
		}
		var rev int64
		if len(resp.Kvs) == 1 {
			var old ImagePlacement
			if json.Unmarshal(resp.Kvs[0].Value, &old) == nil && old.Node != c.cfg.Node {
				return ImageTaken(ref, old.Node)
			}
			if old.Digest == digest && !old.CreatedAt.IsZero() {
				p.CreatedAt = old.CreatedAt
			}
			rev = resp.Kvs[0].ModRevision
		}
		doc, _ := json.Marshal(p)
		ok, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpPut(key, string(doc))).Commit()
		if err != nil {
			return Unavailable(err)
		}
		if ok.Succeeded {
			c.mirror.put(imageKey(p.Project, ref), doc, ok.Header.Revision)
			return nil
		}
	}
	return errdefs.Conflict(client.CodeNameTaken, "an image named %s is being imported on another node", ref)
}

// ImageTaken is the error of an import under a name another node's import
// of the project holds.
func ImageTaken(ref, node string) error {
	return errdefs.Conflict(client.CodeNameTaken, "an image named %s was imported on node %s: its name is the project's across the cluster (shard image rm %s removes it)", ref, node, ref)
}

// ReleaseImport forgets the import ref of project proj, if this node
// made it (image.Registry).
func (c *Cluster) ReleaseImport(ctx context.Context, proj, ref string) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	if err := c.releaseImport(ctx, project.OrDefault(proj), ref); err != nil {
		c.cfg.Log.Warn("cluster: image removed, but the cluster holds its name until this node reconciles", "image", ref, "project", proj, "err", err)
	}
}

func (c *Cluster) releaseImport(ctx context.Context, proj, ref string) error {
	return c.releaseOwn(ctx, imageKey(proj, ref))
}

// Image returns where the import ref (canonical: image.ImportName) of
// ctx's project was made: from the mirror, else from etcd. One the
// cluster does not know is image_not_found.
func (c *Cluster) Image(ctx context.Context, ref string) (*ImagePlacement, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	proj := project.Of(ctx)
	doc, ok, err := c.record(ctx, imageKey(proj, ref))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errdefs.NotFound(client.CodeImageNotFound, "the cluster knows no imported image %s in project %s", ref, proj)
	}
	var p ImagePlacement
	if err := json.Unmarshal(doc, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// ReconcileImports puts this node's own imports (mine: made here, not
// copies) back into etcd and drops what etcd says this node imported that
// it no longer has. An import whose name another node's took while this
// node was away stays here, unknown to the cluster (warned of).
func (c *Cluster) ReconcileImports(ctx context.Context, mine []ImagePlacement) error {
	ctx, cancel := context.WithTimeout(ctx, 2*Timeout)
	defer cancel()
	have := map[string]bool{}
	for _, p := range mine {
		proj := project.OrDefault(p.Project)
		have[imageKey(proj, p.Ref)] = true
		if err := c.ClaimImport(ctx, proj, p.Ref, p.Digest); err != nil {
			c.cfg.Log.Warn("cluster: cannot claim this node's imported image", "image", p.Ref, "project", proj, "err", err)
		}
	}
	return c.releaseOwnExcept(ctx, "images/", have)
}
