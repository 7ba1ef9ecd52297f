// Package cluster joins several `shard serve` nodes into one server. Their
// shared state lives in etcd under one prefix (nodes as leases, where each
// sandbox lives, names unique across the nodes, tokens, sealed secrets), so
// shard runs no consensus or membership protocol of its own; what belongs
// to one node (rootfs, checkpoints, the ledger) stays on that node.
//
// The package knows etcd and nothing of HTTP or runtimes: internal/api
// proxies a request to the node this package names, and the sandbox
// store reports every sandbox it makes or removes (store.Registry).
package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/project"
)

func zapNop() *zap.Logger { return zap.NewNop() }

// Config is how a node joins.
type Config struct {
	Endpoints []string    // etcd client URLs
	TLS       *tls.Config // for https:// endpoints (client certificate, CA); nil: plain
	Prefix    string      // every key lives under it; default "/shard/"
	Node      string      // this node's name, unique in the cluster
	// Instance tells this node's data directory from another's that
	// claims the same name (kept in the data directory): a second server
	// under a name in use is refused, and never drops the first's records.
	Instance string
	// Replace takes the name over from another instance that is down
	// (a machine that will not come back): its placements are dropped.
	Replace   bool
	Advertise string // the URL other nodes reach this node's API at
	// Key is the cluster key (32 bytes) every node holds: it seals secrets
	// and signs node-to-node requests. It is never written to etcd, so
	// etcd's contents alone open no secret and forge no request.
	Key []byte
	// TTL is the node's lease: a node silent this long is unreachable.
	TTL time.Duration
	// Stats returns this node's figures, published at every heartbeat.
	Stats func() Stats
	// OnAddrs is told the cluster's addresses (etcd's, every node's)
	// when the node joins and after every heartbeat (addrs.go).
	OnAddrs func([]netip.Addr)
	Log     *slog.Logger
}

// Stats is what a node publishes of itself for placement and `shard node ls`.
type Stats struct {
	Providers   []string `json:"providers"`
	MemoryTotal int64    `json:"memory_total"`
	MemoryFree  int64    `json:"memory_free"` // memory sandboxes may still be given
	Load        float64  `json:"load"`        // 1-minute load average
	CPUs        int      `json:"cpus"`
	Sandboxes   int      `json:"sandboxes"`
	// Addrs are the node's own addresses (every interface's): the other
	// nodes keep their sandboxes from all of them, not only the
	// advertised one.
	Addrs []string `json:"addrs,omitempty"`
}

// Node states.
const (
	NodeUp          = "up"
	NodeUnreachable = "unreachable" // its lease expired: it may come back
)

// Node is one member of the cluster as etcd knows it.
type Node struct {
	Name     string    `json:"name"`
	Address  string    `json:"address"`
	Instance string    `json:"instance,omitempty"`
	State    string    `json:"state"`
	JoinedAt time.Time `json:"joined_at"`
	SeenAt   time.Time `json:"seen_at"` // its last heartbeat
	Stats
}

// member is a node's lasting record: it stays when the node's lease
// expires, so the node shows as unreachable rather than gone.
type member struct {
	Name     string    `json:"name"`
	Address  string    `json:"address"`
	Instance string    `json:"instance"`
	JoinedAt time.Time `json:"joined_at"`
}

// Cluster is this node's membership. Its methods are safe for concurrent use.
type Cluster struct {
	cfg     Config
	cli     *clientv3.Client
	sealKey []byte // derived from the cluster key: secrets
	signKey []byte // derived from the cluster key: node-to-node requests
	mirror  *mirror
	seen    seenProofs // signatures verified: each is good once
	tls     *NodeTLS   // the cluster's CA and this node's certificate

	mu      sync.Mutex
	lease   clientv3.LeaseID // guarded by mu
	healthy bool             // the last heartbeat reached etcd; guarded by mu
	started bool             // Start ran: the heartbeat is to be waited for; guarded by mu
	addrs   []netip.Addr     // the cluster's addresses last told OnAddrs; guarded by mu
	joined  time.Time

	stop       chan struct{}
	done       chan struct{} // closed when the heartbeat ends
	mirrorDone chan struct{} // closed when the mirror ends
	// reconcile is called after every (re)join: the node puts its own
	// sandboxes back into etcd and drops placements it no longer has.
	reconcile func(context.Context) error
}

// Timeout bounds one etcd call made for a request, so a request never
// hangs on an etcd that is gone.
const Timeout = 3 * time.Second

// Unavailable is the error of a cluster-wide write (or read) while etcd
// cannot be reached: the node still serves its own sandboxes.
func Unavailable(err error) error {
	return errdefs.New(errdefs.KindUnavailable, client.CodeClusterUnavailable,
		"the cluster's etcd cannot be reached (%v): this node still runs its own sandboxes, but creates, names, tokens and secrets need etcd; try again when it is back", shortErr(err))
}

func shortErr(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer in " + Timeout.String()
	}
	return err.Error()
}

// Open connects to etcd and registers this node (a lease holding its
// record, refreshed every TTL/3). It refuses a name a live node at another
// address holds.
func Open(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := names.Name("node", cfg.Node); err != nil {
		return nil, err
	}
	if len(cfg.Key) != 32 {
		return nil, fmt.Errorf("the cluster key is %d bytes: it must be 32 (make one with: head -c 32 /dev/urandom > cluster.key)", len(cfg.Key))
	}
	u, err := url.Parse(cfg.Advertise)
	if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("--advertise %q: give the URL other nodes reach this one's cluster port at, like https://10.0.0.5:7071", cfg.Advertise)
	}
	if u.Scheme != "https" {
		return nil, fmt.Errorf("--advertise %q: nodes talk over mutual TLS: give an https:// URL, like https://%s", cfg.Advertise, u.Host)
	}
	cfg.Advertise = strings.TrimSuffix(cfg.Advertise, "/")
	if cfg.Prefix == "" {
		cfg.Prefix = "/shard/"
	}
	if !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.TTL == 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Stats == nil {
		cfg.Stats = func() Stats { return Stats{} }
	}
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("--cluster-etcd: give at least one etcd URL")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: Timeout, Logger: zapNop(), TLS: cfg.TLS})
	if err != nil {
		return nil, fmt.Errorf("etcd %v: %w", cfg.Endpoints, err)
	}
	cli.KV = retryKV{cli.KV}
	nodeTLS, err := NewNodeTLS(cfg.Key, cfg.Node)
	if err != nil {
		cli.Close()
		return nil, err
	}
	c := &Cluster{cfg: cfg, cli: cli, sealKey: derive(cfg.Key, "shard secrets v1"), signKey: derive(cfg.Key, "shard nodes v1"),
		tls: nodeTLS, stop: make(chan struct{}), done: make(chan struct{}), mirrorDone: make(chan struct{}), joined: time.Now().UTC()}
	c.mirror = newMirror(cfg.Prefix)
	jctx, cancel := context.WithTimeout(ctx, 2*Timeout)
	defer cancel()
	if err := c.join(jctx); err != nil {
		cli.Close()
		return nil, err
	}
	c.refreshAddrs(jctx)
	return c, nil
}

// TLS is this node's TLS material: the cluster's CA and its certificate.
func (c *Cluster) TLS() *NodeTLS { return c.tls }

// Start begins the heartbeat and the token watch; reconcile runs after
// every (re)join.
func (c *Cluster) Start(reconcile func(context.Context) error) {
	c.reconcile = reconcile
	if reconcile != nil {
		ctx, cancel := context.WithTimeout(project.Unscoped(context.Background(), "the cluster's reconcile after joining"), 4*Timeout)
		if err := reconcile(ctx); err != nil {
			c.cfg.Log.Warn("cluster: reconcile after joining", "err", err)
		}
		cancel()
	}
	// The record written when joining had no figures yet (the node's
	// sandbox service did not exist): publish them now, not a beat later,
	// or placement would pass this node over until then.
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	if err := c.publish(ctx); err != nil {
		c.cfg.Log.Warn("cluster: publishing this node's figures", "err", err)
	}
	cancel()
	c.mu.Lock()
	c.started = true
	c.mu.Unlock()
	go func() { defer close(c.mirrorDone); c.mirror.run(c.cli, c.stop) }()
	go c.heartbeat()
}

// Close stops the heartbeat and gives the lease back, so the node shows as
// unreachable at once rather than after its TTL.
func (c *Cluster) Close() error {
	select {
	case <-c.stop:
		return nil
	default:
	}
	close(c.stop)
	c.mu.Lock()
	lease, started := c.lease, c.started
	c.mu.Unlock()
	if started {
		<-c.done
		<-c.mirrorDone // its watch must end before the client closes
	}
	if c.Healthy() { // with etcd away the lease runs out by itself
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		defer cancel()
		c.cli.Revoke(ctx, lease)
	}
	return c.cli.Close()
}

// Name is this node's name.
func (c *Cluster) Name() string { return c.cfg.Node }

// Address is the URL this node is reached at.
func (c *Cluster) Address() string { return c.cfg.Advertise }

// Free is the memory this node's sandboxes may still be given, now: a
// fork decides by it whether it stays here, so it is counted again (as the
// fork's own admission counts), not read from the last heartbeat, which a
// burst of creates outdates.
func (c *Cluster) Free() int64 { return c.cfg.Stats().MemoryFree }

// Healthy reports whether the last heartbeat reached etcd.
func (c *Cluster) Healthy() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.healthy }

func (c *Cluster) key(parts ...string) string { return c.cfg.Prefix + strings.Join(parts, "/") }

// join takes a lease and writes this node's records. A name held by
// another instance (another data directory) is refused: while that one is
// up, always; while it is down, unless Replace says to take it over. The
// same instance (this one before a restart) takes its name back.
func (c *Cluster) join(ctx context.Context) error {
	nodeKey, memberKey := c.key("nodes", c.cfg.Node), c.key("members", c.cfg.Node)
	if err := c.checkKey(ctx); err != nil {
		return err
	}
	resp, err := c.cli.Txn(ctx).Then(clientv3.OpGet(nodeKey), clientv3.OpGet(memberKey)).Commit()
	if err != nil {
		return fmt.Errorf("etcd %v: %w", c.cfg.Endpoints, err)
	}
	var memberRev int64
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		var live Node
		if json.Unmarshal(kvs[0].Value, &live) == nil && live.Instance != c.cfg.Instance {
			return fmt.Errorf("node name %s is taken by a live node at %s (another data directory): give this one another --node", c.cfg.Node, live.Address)
		}
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
		memberRev = kvs[0].ModRevision
		var m member
		if json.Unmarshal(kvs[0].Value, &m) == nil && m.Instance != c.cfg.Instance && !c.cfg.Replace {
			return fmt.Errorf("node name %s belongs to another shard serve (at %s, with another data directory), now down: give this one another --node, or --replace-node to take the name over (that node's sandboxes are then forgotten by the cluster)", c.cfg.Node, m.Address)
		}
	}
	lease, err := c.cli.Grant(ctx, int64(c.cfg.TTL/time.Second))
	if err != nil {
		return fmt.Errorf("etcd lease: %w", err)
	}
	m, _ := json.Marshal(member{Name: c.cfg.Node, Address: c.cfg.Advertise, Instance: c.cfg.Instance, JoinedAt: c.joined})
	ok, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(memberKey), "=", memberRev)).Then(clientv3.OpPut(memberKey, string(m))).Commit()
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	if !ok.Succeeded {
		return fmt.Errorf("node name %s was taken while this node joined: try again, or give another --node", c.cfg.Node)
	}
	c.mu.Lock()
	c.lease = lease.ID
	c.mu.Unlock()
	return c.publish(ctx)
}

// checkKey makes sure this node holds the cluster's key: the first node
// writes a check value derived from it, the others compare. A node with
// another key would sign calls no node accepts (and open no secret).
func (c *Cluster) checkKey(ctx context.Context) error {
	check := hex.EncodeToString(derive(c.cfg.Key, "shard key check v1"))
	key := c.key("key-check")
	if _, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(clientv3.OpPut(key, check)).Commit(); err != nil {
		return fmt.Errorf("etcd %v: %w", c.cfg.Endpoints, err)
	}
	resp, err := c.cli.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("etcd %v: %w", c.cfg.Endpoints, err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != check {
		return fmt.Errorf("--cluster-key differs from the key the cluster's nodes hold: give every node the same key file")
	}
	return nil
}

// publish writes this node's record under its lease.
func (c *Cluster) publish(ctx context.Context) error {
	c.mu.Lock()
	lease := c.lease
	c.mu.Unlock()
	st := c.cfg.Stats()
	n := Node{Name: c.cfg.Node, Address: c.cfg.Advertise, Instance: c.cfg.Instance, State: NodeUp, JoinedAt: c.joined, SeenAt: time.Now().UTC(), Stats: st}
	b, _ := json.Marshal(n)
	_, err := c.cli.Put(ctx, c.key("nodes", c.cfg.Node), string(b), clientv3.WithLease(lease))
	return err
}

// heartbeat renews the lease and republishes the node's figures every
// TTL/3. A lease lost (etcd was away longer than the TTL) is taken anew,
// and the node reconciles its placements.
func (c *Cluster) heartbeat() {
	defer close(c.done)
	tick := time.NewTicker(c.cfg.TTL / 3)
	defer tick.Stop()
	c.setHealthy(true)
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		err := c.beat(ctx)
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), Timeout)
		c.refreshAddrs(ctx)
		cancel()
		if err != nil && c.Healthy() {
			c.cfg.Log.Warn("cluster: etcd unreachable: serving this node's sandboxes only", "err", err)
		} else if err == nil && !c.Healthy() {
			c.cfg.Log.Info("cluster: etcd reachable again")
		}
		c.setHealthy(err == nil)
	}
}

func (c *Cluster) beat(ctx context.Context) error {
	c.mu.Lock()
	lease := c.lease
	c.mu.Unlock()
	if _, err := c.cli.KeepAliveOnce(ctx, lease); err != nil {
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return err
		}
		c.cfg.Log.Warn("cluster: this node's lease expired: joining again")
		if err := c.join(ctx); err != nil {
			return err
		}
		if c.reconcile != nil {
			rctx, cancel := context.WithTimeout(project.Unscoped(context.Background(), "the cluster's reconcile after joining again"), 4*Timeout)
			defer cancel()
			if err := c.reconcile(rctx); err != nil {
				c.cfg.Log.Warn("cluster: reconcile after joining again", "err", err)
			}
		}
		return nil
	}
	return c.publish(ctx)
}

func (c *Cluster) setHealthy(ok bool) { c.mu.Lock(); c.healthy = ok; c.mu.Unlock() }

// Nodes lists every member: up (its lease holds) or unreachable. It reads
// the mirror while it follows etcd; when etcd cannot be reached it returns
// what the mirror last knew and an Unavailable error.
func (c *Cluster) Nodes(ctx context.Context) ([]Node, error) {
	if c.mirror.current() {
		return nodesOf(c.mirror.list("members/"), c.mirror.list("nodes/")), nil
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(c.key("members")+"/", clientv3.WithPrefix()),
		clientv3.OpGet(c.key("nodes")+"/", clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nodesOf(c.mirror.list("members/"), c.mirror.list("nodes/")), Unavailable(err)
	}
	values := func(i int) [][]byte {
		var out [][]byte
		for _, kv := range resp.Responses[i].GetResponseRange().Kvs {
			out = append(out, kv.Value)
		}
		return out
	}
	return nodesOf(values(0), values(1)), nil
}

// nodesOf joins members' records with the live nodes' (by name).
func nodesOf(members, live [][]byte) []Node {
	up := map[string]Node{}
	for _, b := range live {
		var n Node
		if json.Unmarshal(b, &n) == nil {
			up[n.Name] = n
		}
	}
	var out []Node
	for _, b := range members {
		var m member
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		n, ok := up[m.Name]
		if !ok {
			n = Node{Name: m.Name, Address: m.Address, JoinedAt: m.JoinedAt, State: NodeUnreachable}
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Node returns one member by name.
func (c *Cluster) Node(ctx context.Context, name string) (Node, error) {
	nodes, err := c.Nodes(ctx)
	for _, n := range nodes {
		if n.Name == name {
			return n, nil
		}
	}
	if err != nil {
		return Node{}, err
	}
	return Node{}, errdefs.NotFound(client.CodeNodeNotFound, "no node %s in the cluster (shard node ls lists them)", name)
}

// derive makes a purpose's key from the cluster key, so one file serves
// both purposes without either key opening the other's.
func derive(key []byte, purpose string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(purpose))
	return m.Sum(nil)
}
