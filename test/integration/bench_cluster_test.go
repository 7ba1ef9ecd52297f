package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
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

// BenchmarkClusterForkMove: a fork of a 256 MiB gVisor sandbox (160 MiB of
// it held by a process) whose node has no room, moved to another node (checkpoint,
// send, restore), against a fork on the node itself in the same run; and
// the bytes sent between the nodes (from the source node's log).
func BenchmarkClusterForkMove(b *testing.B) {
	// a holds the source and has no room for a fork of it; b has.
	tc := startCluster(b, "400MiB", "8GiB")
	viaA, viaB := tc.keyed(b, tc.nodes[0], tc.key), tc.keyed(b, tc.nodes[1], tc.key)
	ctx := context.Background()
	// sort holds what it read in memory until its input ends, which is never.
	fill := "((head -c 160m /dev/urandom; sleep 100000) | sort > /dev/null 2>&1 &); sleep 5; grep -E 'VmRSS' /proc/$(pidof sort)/status"
	srcA, err := viaA.Create(ctx, client.CreateRequest{Image: busybox, Node: "a", MemoryMiB: 256})
	if err != nil {
		b.Fatal(err)
	}
	srcB, err := viaB.Create(ctx, client.CreateRequest{Image: busybox, Node: "b", MemoryMiB: 256})
	if err != nil {
		b.Fatal(err)
	}
	for _, sb := range []*client.Sandbox{srcA, srcB} {
		b.Cleanup(func() { viaB.Remove(context.Background(), sb.ID, true) })
		if res, err := viaB.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", fill}}); err != nil || res.ExitCode != 0 {
			b.Fatalf("fill: %+v %v", res, err)
		}
	}
	s := samples{}
	var moved []float64
	for i := 0; i < b.N; i++ {
		for _, f := range []struct {
			name string
			src  string
		}{{"fork-same-node", srcB.ID}, {"fork-moved", srcA.ID}} {
			t0 := time.Now()
			fk, err := viaA.Fork(ctx, f.src, client.ForkRequest{})
			if err != nil {
				b.Fatal(err)
			}
			s.add(f.name, time.Since(t0))
			if f.name == "fork-moved" && fk.Node != "b" {
				b.Fatalf("the fork landed on %q", fk.Node)
			}
			if err := viaB.Remove(ctx, fk.ID, true); err != nil {
				b.Fatal(err)
			}
		}
	}
	report(b, s, "fork-same-node", "fork-same-node", "fork-moved")
	log, _ := os.ReadFile(tc.nodes[0].log)
	for _, line := range strings.Split(string(log), "\n") {
		if i := strings.Index(line, "sent_bytes="); i >= 0 && strings.Contains(line, "fork moved") {
			var n float64
			fmt.Sscanf(line[i+len("sent_bytes="):], "%g", &n)
			moved = append(moved, n/(1<<20))
		}
	}
	if len(moved) > 0 {
		slices.Sort(moved)
		b.ReportMetric(moved[len(moved)/2], "moved-p50-MiB")
	}
}
