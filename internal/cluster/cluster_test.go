package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/internal/cluster/etcdtest"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

var testKey = []byte(strings.Repeat("k", 32))

func join(t *testing.T, endpoints []string, name string, stats Stats) *Cluster {
	t.Helper()
	c, err := Open(context.Background(), Config{Endpoints: endpoints, Node: name, Instance: "instance-" + name, Advertise: "https://127.0.0.1:1/",
		Key: testKey, TTL: 2 * time.Second, Stats: func() Stats { return stats }, Log: slog.New(slog.DiscardHandler), Prefix: "/t/"})
	if err != nil {
		t.Fatal(err)
	}
	c.cfg.Advertise = "https://" + name + ".invalid"
	t.Cleanup(func() { c.Close() })
	return c
}

func TestNamesAcrossNodes(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a := join(t, etcd.Endpoints(), "a", Stats{})
	b := join(t, etcd.Endpoints(), "b", Stats{})
	ctx := project.With(context.Background(), "p1")
	sb := &store.Sandbox{ID: "0123456789ab", Name: "web", Project: "p1", CreatedAt: time.Now()}
	if err := a.Claim(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := a.Claim(ctx, sb); err != nil {
		t.Fatalf("claiming again the same sandbox: %v", err)
	}
	other := &store.Sandbox{ID: "ba9876543210", Name: "web", Project: "p1"}
	if err := b.Claim(ctx, other); errdefs.CodeOf(err) != "name_taken" {
		t.Fatalf("a name taken on a, claimed on b: %v, want name_taken", err)
	}
	// Another project's name is another name.
	other.Project = "p2"
	if err := b.Claim(project.With(context.Background(), "p2"), other); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"web", "0123456789ab"} {
		p, err := b.Locate(ctx, q)
		if err != nil || p.Node != "a" || p.ID != sb.ID {
			t.Fatalf("locate %s from b: %+v %v", q, p, err)
		}
	}
	if _, err := b.Locate(project.With(context.Background(), "p2"), "0123456789ab"); errdefs.CodeOf(err) != "sandbox_not_found" {
		t.Fatalf("another project's sandbox by id: %v", err)
	}
	// A rename moves the reservation.
	sb.Name = "web2"
	if err := a.Claim(ctx, sb); err != nil {
		t.Fatal(err)
	}
	other.Project, other.Name = "p1", "web"
	if err := b.Claim(ctx, other); err != nil {
		t.Fatalf("the old name after a rename: %v", err)
	}
	b.Release(ctx, other)
	a.Release(ctx, sb)
	if _, err := b.Locate(ctx, "web2"); errdefs.CodeOf(err) != "sandbox_not_found" {
		t.Fatalf("released: %v", err)
	}
}

func TestEnvironmentsAcrossNodes(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a := join(t, etcd.Endpoints(), "a", Stats{})
	b := join(t, etcd.Endpoints(), "b", Stats{})
	ctx := project.With(context.Background(), "p1")
	e := &store.Environment{Name: "py", Project: "p1", Checkpoint: "000000000001", Fingerprint: "f1"}
	if err := a.ClaimEnvironment(ctx, e); err != nil {
		t.Fatal(err)
	}
	e.Checkpoint = "000000000002" // a rebuild on a
	if err := a.ClaimEnvironment(ctx, e); err != nil {
		t.Fatal(err)
	}
	if err := b.ClaimEnvironment(ctx, &store.Environment{Name: "py", Project: "p1"}); errdefs.CodeOf(err) != "name_taken" {
		t.Fatalf("py built on b too: %v", err)
	}
	if p, err := b.Environment(ctx, "py"); err != nil || p.Node != "a" || p.Checkpoint != "000000000002" {
		t.Fatalf("py seen from b: %+v %v", p, err)
	}
	b.ReleaseEnvironment(ctx, e) // not b's: nothing happens
	if _, err := b.Environment(ctx, "py"); err != nil {
		t.Fatalf("b released a's environment: %v", err)
	}
	a.ReleaseEnvironment(ctx, e)
	if _, err := b.Environment(ctx, "py"); errdefs.CodeOf(err) != "environment_not_found" {
		t.Fatalf("after a removed it: %v", err)
	}
}

func TestReconcile(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a := join(t, etcd.Endpoints(), "a", Stats{})
	ctx := project.Unscoped(context.Background(), "a test: the node's reconcile")
	gone := &store.Sandbox{ID: "000000000001", Name: "gone", Project: "default"}
	kept := &store.Sandbox{ID: "000000000002", Name: "kept", Project: "default"}
	if err := a.Claim(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if err := a.Reconcile(ctx, []*store.Sandbox{kept}, nil); err != nil {
		t.Fatal(err)
	}
	ps, err := a.Placements(ctx, "a")
	if err != nil || len(ps) != 1 || ps[0].ID != kept.ID {
		t.Fatalf("after reconcile: %+v %v", ps, err)
	}
}

func TestLeaseExpiry(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a := join(t, etcd.Endpoints(), "a", Stats{Providers: []string{"runc"}})
	b := join(t, etcd.Endpoints(), "b", Stats{})
	a.Start(nil)
	b.Start(nil)
	state := func() map[string]string {
		nodes, err := a.Nodes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, n := range nodes {
			m[n.Name] = n.State
		}
		return m
	}
	if got := fmt.Sprint(state()); got != "map[a:up b:up]" {
		t.Fatalf("nodes: %s", got)
	}
	// b stops beating (a crash): its lease runs out and it is unreachable,
	// still a member.
	close(b.stop)
	<-b.done
	deadline := time.Now().Add(10 * time.Second)
	for state()["b"] != NodeUnreachable {
		if time.Now().After(deadline) {
			t.Fatalf("b still %s after its lease's TTL", state()["b"])
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The same name from another data directory is refused while a is up,
	// and while b is down unless it takes b's name over.
	other := func(name string, replace bool) error {
		c, err := Open(context.Background(), Config{Endpoints: etcd.Endpoints(), Node: name, Instance: "elsewhere", Replace: replace,
			Advertise: "https://elsewhere.invalid:7000", Key: testKey, Prefix: "/t/", Log: slog.New(slog.DiscardHandler)})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := other("a", true); err == nil || !strings.Contains(err.Error(), "taken by a live node") {
		t.Fatalf("a second node a: %v", err)
	}
	if err := other("b", false); err == nil || !strings.Contains(err.Error(), "--replace-node") {
		t.Fatalf("a second node b while b is down: %v", err)
	}
	if err := other("b", true); err != nil {
		t.Fatalf("b taken over: %v", err)
	}
	// A node with another cluster key is refused.
	if _, err := Open(context.Background(), Config{Endpoints: etcd.Endpoints(), Node: "z", Instance: "z", Advertise: "https://z.invalid:7000",
		Key: []byte(strings.Repeat("x", 32)), Prefix: "/t/", Log: slog.New(slog.DiscardHandler)}); err == nil || !strings.Contains(err.Error(), "--cluster-key differs") {
		t.Fatalf("a node with another key: %v", err)
	}
}

func TestTokensAcrossNodes(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a := join(t, etcd.Endpoints(), "a", Stats{})
	b := join(t, etcd.Endpoints(), "b", Stats{})
	a.Start(nil)
	b.Start(nil)
	ctx := project.With(context.Background(), "p1")
	tok := &store.Token{ID: "aaaaaaaaaaaa", Name: "ci", Hash: "h", Scopes: []string{"*"}, CreatedAt: time.Now()}
	if err := b.Tokens().AddToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	// At once on a (not yet in its copy: read from etcd).
	got, err := a.Tokens().GetToken(project.Unscoped(context.Background(), "a test: authentication"), tok.ID)
	if err != nil || got.Project != "p1" {
		t.Fatalf("token made on b, read on a: %+v %v", got, err)
	}
	if err := a.Tokens().AddToken(ctx, &store.Token{ID: "bbbbbbbbbbbb", Name: "ci"}); errdefs.CodeOf(err) != "name_taken" {
		t.Fatalf("same token name in the project: %v", err)
	}
	if err := a.Tokens().DeleteToken(ctx, "ci"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := b.Tokens().GetToken(project.Unscoped(context.Background(), "a test: authentication"), tok.ID); errdefs.Is(err, errdefs.KindNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a token revoked on a still works on b")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Secrets: sealed on one node, listed on the other, per project.
	sec := &store.Secret{Name: "db", Sealed: []byte("x")}
	if err := a.Secrets().PutSecret(ctx, sec); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Secrets().GetSecret(ctx, "db"); err != nil || string(got.Sealed) != "x" {
		t.Fatalf("secret on b: %v %v", got, err)
	}
	if _, err := b.Secrets().GetSecret(project.With(context.Background(), "p2"), "db"); errdefs.CodeOf(err) != "secret_not_found" {
		t.Fatalf("another project's secret: %v", err)
	}
}

func TestEtcdDown(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a := join(t, etcd.Endpoints(), "a", Stats{})
	a.Start(nil)
	ctx := project.Unscoped(context.Background(), "a test")
	tok := &store.Token{ID: "cccccccccccc", Name: "k", Project: "default", Scopes: []string{"*"}}
	if err := a.Tokens().AddToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	etcd.Kill(0)
	if _, err := a.Tokens().GetToken(ctx, tok.ID); err != nil {
		t.Fatalf("a known key with etcd down: %v", err)
	}
	err := a.Claim(ctx, &store.Sandbox{ID: "000000000003", Name: "x"})
	if errdefs.CodeOf(err) != "cluster_unavailable" || errdefs.KindOf(err) != errdefs.KindUnavailable {
		t.Fatalf("a claim with etcd down: %v (%s)", err, errdefs.CodeOf(err))
	}
}

func TestChoose(t *testing.T) {
	up := func(name string, free int64, prov ...string) Node {
		return Node{Name: name, State: NodeUp, Stats: Stats{MemoryFree: free << 20, Providers: prov}}
	}
	nodes := []Node{up("a", 100, "runc"), up("b", 300, "gvisor"), up("c", 200, "gvisor", "runc"),
		{Name: "d", State: NodeUnreachable, Stats: Stats{MemoryFree: 900 << 20, Providers: []string{"runc"}}}}
	for _, tc := range []struct {
		want, provider string
		mem            int64
		node, code     string
	}{
		{"", "", 0, "b", ""},
		{"", "runc", 0, "c", ""},
		{"", "runc", 150 << 20, "c", ""},
		{"", "runc", 250 << 20, "", "cluster_full"},
		{"", "vz", 0, "", "provider_unavailable"},
		{"a", "", 0, "a", ""},
		{"a", "gvisor", 0, "", "provider_unavailable"},
		{"a", "", 150 << 20, "", "node_full"},
		{"d", "", 0, "", "node_unreachable"},
		{"zz", "", 0, "", "node_not_found"},
	} {
		n, err := Choose(nodes, tc.want, tc.provider, tc.mem)
		if n.Name != tc.node || errdefs.CodeOf(err) != tc.code && !(err == nil && tc.code == "") {
			t.Errorf("choose(%q, %q, %d) = %s, %v; want %s, %s", tc.want, tc.provider, tc.mem, n.Name, err, tc.node, tc.code)
		}
	}
}

func TestSignature(t *testing.T) {
	key := derive(testKey, "shard nodes v1")
	now := time.Unix(1_800_000_000, 0)
	p := []byte(`{"name":"ci"}`)
	proof := sign(key, "a", "b", now, "GET", "/v0/sandboxes/x", p)
	if n, err := verify(key, "b", now.Add(time.Second), proof, "GET", "/v0/sandboxes/x", p); err != nil || n != "a" {
		t.Fatalf("good proof: %s %v", n, err)
	}
	for name, tc := range map[string]struct {
		key         []byte
		at          time.Time
		proof       string
		method, uri string
		principal   []byte
	}{
		"other key":       {derive([]byte(strings.Repeat("x", 32)), "shard nodes v1"), now, proof, "GET", "/v0/sandboxes/x", p},
		"late":            {key, now.Add(time.Minute), proof, "GET", "/v0/sandboxes/x", p},
		"other method":    {key, now, proof, "DELETE", "/v0/sandboxes/x", p},
		"other uri":       {key, now, proof, "GET", "/v0/sandboxes/y", p},
		"other principal": {key, now, proof, "GET", "/v0/sandboxes/x", []byte(`{"name":"admin"}`)},
		"other node":      {key, now, strings.Replace(proof, "node=a", "node=b", 1), "GET", "/v0/sandboxes/x", p},
		"garbage":         {key, now, "sig=00", "GET", "/v0/sandboxes/x", p},
		"other nonce":     {key, now, regexp.MustCompile(`n=[0-9a-f]+`).ReplaceAllString(proof, "n="+strings.Repeat("0", 24)), "GET", "/v0/sandboxes/x", p},
	} {
		if _, err := verify(tc.key, "b", tc.at, tc.proof, tc.method, tc.uri, tc.principal); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := verify(key, "c", now, proof, "GET", "/v0/sandboxes/x", p); err == nil {
		t.Error("a call made for b accepted by c")
	}
}

// An etcd that serves https and wants a client certificate: a node with
// the right one joins; one without it is refused with etcd's reason.
func TestEtcdTLS(t *testing.T) {
	etcd, tlsCfg, _ := etcdtest.StartTLS(t)
	c, err := Open(context.Background(), Config{Endpoints: etcd.Endpoints(), TLS: tlsCfg, Node: "a", Advertise: "https://127.0.0.1:1",
		Key: testKey, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("join over TLS: %v", err)
	}
	c.Close()
	noCert := tlsCfg.Clone()
	noCert.Certificates = nil
	if _, err := Open(context.Background(), Config{Endpoints: etcd.Endpoints(), TLS: noCert, Node: "b", Advertise: "https://127.0.0.1:2",
		Key: testKey, Log: slog.New(slog.DiscardHandler)}); err == nil {
		t.Fatal("a node without a client certificate joined")
	}
}

// A signature is good once.
func TestReplay(t *testing.T) {
	c := &Cluster{signKey: derive(testKey, "shard nodes v1"), cfg: Config{Node: "a"}}
	proof := c.Sign("a", "POST", "/v0/sandboxes/x/exec", []byte("{}"))
	if _, err := c.Verify(proof, "POST", "/v0/sandboxes/x/exec", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Verify(proof, "POST", "/v0/sandboxes/x/exec", []byte("{}")); err == nil || !strings.Contains(err.Error(), "replayed") {
		t.Fatalf("a replay: %v", err)
	}
	if a, b := c.Sign("a", "GET", "/", nil), c.Sign("a", "GET", "/", nil); a == b {
		t.Fatal("two signatures of one request in one second are the same")
	}
}

// BenchmarkPlace measures a placement decision (read every node from etcd,
// choose) with 50 nodes registered.
func BenchmarkPlace(b *testing.B) {
	etcd := etcdtest.Start(b, 1)
	var cs []*Cluster
	for i := range 50 {
		c, err := Open(context.Background(), Config{Endpoints: etcd.Endpoints(), Node: fmt.Sprintf("n%02d", i), Advertise: fmt.Sprintf("https://10.0.0.%d:7000", i+1),
			Key: testKey, Prefix: "/b/", Stats: func() Stats { return Stats{MemoryFree: int64(i) << 30, Providers: []string{"gvisor", "runc"}} }, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
	}
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	ctx := context.Background()
	var times []time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		n, err := cs[0].Place(ctx, "", "runc", 1<<30)
		times = append(times, time.Since(t0))
		if err != nil || n.Name != "n49" {
			b.Fatalf("placed on %s: %v", n.Name, err)
		}
	}
	reportPercentiles(b, times)
}

func reportPercentiles(b *testing.B, times []time.Duration) {
	slices.Sort(times)
	at := func(q float64) float64 { return float64(times[int(q*float64(len(times)-1))].Microseconds()) / 1000 }
	b.ReportMetric(at(0.5), "p50-ms")
	b.ReportMetric(at(0.9), "p90-ms")
}
