package integration

import (
	"context"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// BenchmarkClusterExec: an exec in a sandbox on node a, asked of a itself
// (direct) and of b (which sends it on to a), alternated in one run; the
// figure is the proxied p50 less the direct p50 (goal: at most 2 ms).
func BenchmarkClusterExec(b *testing.B) {
	tc := startCluster(b, "4GiB", "2GiB")
	viaA, viaB := tc.keyed(b, tc.nodes[0], tc.key), tc.keyed(b, tc.nodes[1], tc.key)
	ctx := context.Background()
	s := samples{}
	for _, prov := range []string{"runc", "gvisor"} {
		sb, err := viaA.Create(ctx, client.CreateRequest{Image: busybox, Provider: prov, Node: "a"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { viaA.Remove(context.Background(), sb.ID, true) })
		for range 5 { // warm both paths' connections
			viaA.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}})
			viaB.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}})
		}
		for i := 0; i < b.N; i++ {
			for _, via := range []struct {
				name string
				c    *client.Client
			}{{"direct-" + prov, viaA}, {"proxied-" + prov, viaB}} {
				t0 := time.Now()
				if _, err := via.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
					b.Fatal(err)
				}
				s.add(via.name, time.Since(t0))
			}
		}
	}
	report(b, s, "direct-runc", "direct-runc", "proxied-runc", "direct-gvisor", "proxied-gvisor")
	for _, prov := range []string{"runc", "gvisor"} {
		b.ReportMetric(pct(s["proxied-"+prov], 0.5)-pct(s["direct-"+prov], 0.5), "overhead-"+prov+"-p50-ms")
	}
}

// BenchmarkClusterCreate: a create on node a asked of a (direct) and of b
// (placed on a, sent on), alternated; goal: through another node at most
// 1.1x of direct.
func BenchmarkClusterCreate(b *testing.B) {
	tc := startCluster(b, "4GiB", "2GiB")
	viaA, viaB := tc.keyed(b, tc.nodes[0], tc.key), tc.keyed(b, tc.nodes[1], tc.key)
	ctx := context.Background()
	s := samples{}
	for i := 0; i < b.N; i++ {
		for _, via := range []struct {
			name string
			c    *client.Client
		}{{"direct", viaA}, {"through-b", viaB}} {
			t0 := time.Now()
			sb, err := via.c.Create(ctx, client.CreateRequest{Image: busybox, Node: "a"})
			if err != nil {
				b.Fatal(err)
			}
			s.add(via.name, time.Since(t0))
			if err := viaA.Remove(ctx, sb.ID, true); err != nil {
				b.Fatal(err)
			}
		}
	}
	report(b, s, "direct", "direct", "through-b")
}
