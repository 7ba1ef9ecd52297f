package cluster

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

// EnvPlacement is an environment's definition as the cluster knows it:
// the node that built it (its origin) and the checkpoint creates start
// from. Other nodes copy that checkpoint on their first use and check
// their copy against it.
type EnvPlacement struct {
	Name        string    `json:"name"`
	Project     string    `json:"project"`
	Node        string    `json:"node"`
	Checkpoint  string    `json:"checkpoint"`
	Fingerprint string    `json:"fingerprint"`
	Provider    string    `json:"provider"`
	MemoryBytes int64     `json:"memory_bytes"`
	CreatedAt   time.Time `json:"created_at"`
}

func envKey(proj, name string) string { return "environments/" + proj + "/" + name }

// ClaimEnvironment records e as built on this node (store.EnvRegistry):
// an environment of that name another node built is refused.
func (c *Cluster) ClaimEnvironment(ctx context.Context, e *store.Environment) error {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	p := EnvPlacement{Name: e.Name, Project: project.OrDefault(e.Project), Node: c.cfg.Node, Checkpoint: e.Checkpoint,
		Fingerprint: e.Fingerprint, Provider: e.Provider, MemoryBytes: e.MemoryBytes, CreatedAt: e.CreatedAt}
	doc, _ := json.Marshal(p)
	key := c.cfg.Prefix + envKey(p.Project, p.Name)
	for range 5 {
		resp, err := c.cli.Get(ctx, key)
		if err != nil {
			return Unavailable(err)
		}
		var rev int64
		if len(resp.Kvs) == 1 {
			var old EnvPlacement
			if json.Unmarshal(resp.Kvs[0].Value, &old) == nil && old.Node != c.cfg.Node {
				return errdefs.Conflict(client.CodeNameTaken, "an environment named %s was built on node %s (shard env rm %s removes it)", e.Name, old.Node, e.Name)
			}
			rev = resp.Kvs[0].ModRevision
		}
		ok, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpPut(key, string(doc))).Commit()
		if err != nil {
			return Unavailable(err)
		}
		if ok.Succeeded {
			c.mirror.put(envKey(p.Project, p.Name), doc, ok.Header.Revision)
			return nil
		}
	}
	return errdefs.Conflict(client.CodeNameTaken, "an environment named %s is being built on another node", e.Name)
}

// ReleaseEnvironment forgets e, if this node built it.
func (c *Cluster) ReleaseEnvironment(ctx context.Context, e *store.Environment) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	if err := c.releaseEnv(ctx, project.OrDefault(e.Project), e.Name); err != nil {
		c.cfg.Log.Warn("cluster: environment gone, but the cluster holds its name until this node reconciles", "environment", e.Name, "err", err)
	}
}

func (c *Cluster) releaseEnv(ctx context.Context, proj, name string) error {
	return c.releaseOwn(ctx, envKey(proj, name))
}

// Environment returns where environment name (in ctx's project) was
// built: from the mirror, else from etcd.
func (c *Cluster) Environment(ctx context.Context, name string) (*EnvPlacement, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	doc, ok, err := c.record(ctx, envKey(project.Of(ctx), name))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, store.EnvironmentNotFound(name)
	}
	var p EnvPlacement
	if err := json.Unmarshal(doc, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// reconcileEnvs puts this node's own environments back into etcd and drops
// what etcd says this node built that it no longer has.
func (c *Cluster) reconcileEnvs(ctx context.Context, mine []*store.Environment) error {
	ctx, cancel := context.WithTimeout(ctx, 2*Timeout)
	defer cancel()
	have := map[string]bool{}
	for _, e := range mine {
		if e.Origin != "" {
			continue
		}
		have[envKey(project.OrDefault(e.Project), e.Name)] = true
		if err := c.ClaimEnvironment(ctx, e); err != nil {
			c.cfg.Log.Warn("cluster: cannot claim this node's environment", "environment", e.Name, "err", err)
		}
	}
	return c.releaseOwnExcept(ctx, "environments/", have)
}

// owned is the part of a record (an environment's, an import's) that
// names the node that made it.
type owned struct {
	Node string `json:"node"`
}

// releaseOwn deletes the record at key (under the prefix) if this node
// made it, unless it changed in the meantime.
func (c *Cluster) releaseOwn(ctx context.Context, key string) error {
	resp, err := c.cli.Get(ctx, c.cfg.Prefix+key)
	if err != nil {
		return Unavailable(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	var old owned
	if json.Unmarshal(resp.Kvs[0].Value, &old) == nil && old.Node != c.cfg.Node {
		return nil
	}
	del, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(c.cfg.Prefix+key), "=", resp.Kvs[0].ModRevision)).Then(clientv3.OpDelete(c.cfg.Prefix + key)).Commit()
	if err != nil {
		return Unavailable(err)
	}
	if del.Succeeded {
		c.mirror.del(key, del.Header.Revision)
	}
	return nil
}

// releaseOwnExcept releases every record under dir (under the prefix)
// this node made, but those have names (keys under the prefix).
func (c *Cluster) releaseOwnExcept(ctx context.Context, dir string, have map[string]bool) error {
	resp, err := c.cli.Get(ctx, c.cfg.Prefix+dir, clientv3.WithPrefix())
	if err != nil {
		return Unavailable(err)
	}
	for _, kv := range resp.Kvs {
		key := strings.TrimPrefix(string(kv.Key), c.cfg.Prefix)
		var o owned
		if json.Unmarshal(kv.Value, &o) == nil && o.Node == c.cfg.Node && !have[key] {
			if err := c.releaseOwn(ctx, key); err != nil {
				return err
			}
		}
	}
	return nil
}

// record reads the record at key (under the prefix) from the mirror, else
// from etcd; ok is false when there is none.
func (c *Cluster) record(ctx context.Context, key string) (doc []byte, ok bool, err error) {
	if doc, ok := c.mirror.get(key); ok {
		return doc, true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	resp, err := c.cli.Get(ctx, c.cfg.Prefix+key)
	if err != nil {
		return nil, false, Unavailable(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, false, nil
	}
	return resp.Kvs[0].Value, true, nil
}
