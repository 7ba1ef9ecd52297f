package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// The cost of the egress boundary and of the nodes' mutual TLS, each
// measured side by side with a build from before them, in one run:
//
//	SHARD_BENCH_BASE=1cb3111 scripts/test.sh -run '^$' -bench 'Boundary|ClusterTLS' ./test/integration
//
// SHARD_BENCH_BASE is a git revision of this repository (built into the
// run's directory from a worktree) or the path of a shard binary.

// baseBinary is the shard binary of SHARD_BENCH_BASE.
func baseBinary(b *testing.B) string {
	e := need(b)
	base := os.Getenv("SHARD_BENCH_BASE")
	if base == "" {
		b.Fatal("set SHARD_BENCH_BASE to a git revision (e.g. 1cb3111, before the egress boundary and the cluster port) or a shard binary to compare with")
	}
	if st, err := os.Stat(base); err == nil && !st.IsDir() {
		return base
	}
	bin := filepath.Join(e.dir, "shard-base")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	wt := filepath.Join(e.dir, "base-src")
	if out, err := exec.Command("git", "-C", e.root, "worktree", "add", "--detach", wt, base).CombinedOutput(); err != nil {
		b.Fatalf("worktree of %s: %v %s", base, err, out)
	}
	b.Cleanup(func() { exec.Command("git", "-C", e.root, "worktree", "remove", "--force", wt).Run() })
	build := exec.Command("go", "build", "-o", bin, "./cmd/shard")
	build.Dir = wt
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CGO_ENABLED=") {
			build.Env = append(build.Env, kv)
		}
	}
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build %s: %v %s", base, err, out)
	}
	return bin
}

// startSingle starts a single-host server running bin, the idx-th of a
// run, with flags of its own beside the shared server's.
func startSingle(b *testing.B, bin string, idx int, extra ...string) *node {
	e := need(b)
	dir, err := os.MkdirTemp(e.dir, "single-")
	if err != nil {
		b.Fatal(err)
	}
	n := &node{name: fmt.Sprintf("s%d", idx), dir: dir, socket: filepath.Join(dir, "shard.sock"), bridge: fmt.Sprintf("%.11ss%d", e.bridge, idx),
		subnet: fmt.Sprintf("10.86.%d.0/24", idx), log: filepath.Join(dir, "serve.log"), bin: bin}
	n.args = append(e.serveArgs(n.socket, filepath.Join(dir, "data"), filepath.Join(dir, "run"), n.bridge, n.subnet, "3GiB", ""), extra...)
	n.start(b)
	b.Cleanup(func() { n.teardown(b) })
	return n
}

// downloadHost serves size bytes at http://198.18.249.2:8000/ from a
// namespace of the test's own (a range sandboxes may reach: not private).
func downloadHost(b *testing.B, size int64) string {
	testHost(b, "shardit-dl", "vshdl", "198.18.249.1", "198.18.249.2")
	var ln net.Listener
	if err := inNetns("shardit-dl", func() (err error) {
		ln, err = net.Listen("tcp4", "198.18.249.2:8000")
		return err
	}); err != nil {
		b.Fatal(err)
	}
	zeros := make([]byte, 1<<20)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		for left := size; left > 0; left -= int64(len(zeros)) {
			if _, err := w.Write(zeros[:min(left, int64(len(zeros)))]); err != nil {
				return
			}
		}
	})}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return "http://198.18.249.2:8000/"
}

// BenchmarkBoundary: a create (busybox, gvisor and runc) and a 256 MiB
// download through the bridge from a host sandboxes may reach, on a
// server of this build (the egress boundary in its firewall) and one of
// SHARD_BENCH_BASE (none), alternated in one run; ratios are this build's
// over the base's.
func BenchmarkBoundary(b *testing.B) {
	e := need(b)
	base := startSingle(b, baseBinary(b), 1)
	url := downloadHost(b, 256<<20)
	ctx := context.Background()
	servers := []struct {
		name string
		c    *client.Client
	}{{"base", base.admin}, {"boundary", e.c}}
	s := samples{}
	mibs := map[string][]float64{}
	for _, prov := range providers {
		dl := map[string]string{}
		for _, srv := range servers {
			sb, err := srv.c.Create(ctx, client.CreateRequest{Image: busybox, Provider: prov})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { srv.c.Remove(context.Background(), sb.ID, true) })
			dl[srv.name] = sb.ID
		}
		for i := 0; i < b.N; i++ {
			for _, srv := range servers {
				t0 := time.Now()
				sb, err := srv.c.Create(ctx, client.CreateRequest{Image: busybox, Provider: prov})
				if err != nil {
					b.Fatal(err)
				}
				s.add("create-"+prov+"-"+srv.name, time.Since(t0))
				if err := srv.c.Remove(ctx, sb.ID, true); err != nil {
					b.Fatal(err)
				}
				t0 = time.Now()
				res, err := srv.c.Exec(ctx, dl[srv.name], client.ExecRequest{Argv: []string{"wget", "-q", "-O", "/dev/null", url}})
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("download on %s: %v %+v", srv.name, err, res)
				}
				d := time.Since(t0)
				s.add("download-"+prov+"-"+srv.name, d)
				mibs[prov+"-"+srv.name] = append(mibs[prov+"-"+srv.name], 256/d.Seconds())
			}
		}
		report(b, s, "create-"+prov+"-base", "create-"+prov+"-base", "create-"+prov+"-boundary")
		report(b, s, "download-"+prov+"-base", "download-"+prov+"-base", "download-"+prov+"-boundary")
		for _, srv := range servers {
			v := median(mibs[prov+"-"+srv.name])
			b.ReportMetric(v, "download-"+prov+"-"+srv.name+"-MiB/s")
			fmt.Fprintf(os.Stderr, "BENCH %s download %s %s: p50 %.0f MiB/s\n", b.Name(), prov, srv.name, v)
		}
	}
}

// BenchmarkClusterTLS: an exec in a sandbox on node a (runc and gvisor)
// asked of a and of b (sent on to a), and a fork of a 256 MiB gVisor
// sandbox moved from a to b, on a cluster of this build (mutual TLS
// between nodes) and one of SHARD_BENCH_BASE (plain HTTP between nodes),
// in one run: each exec sample alternates the four ways (direct and
// proxied, plain and mTLS), then the forks alternate the two clusters.
func BenchmarkClusterTLS(b *testing.B) {
	baseBin := baseBinary(b)
	type side struct {
		name       string
		viaA, viaB *client.Client
		sbs        map[string]string // by provider
		src        string
	}
	ctx := context.Background()
	var sides []*side
	fill := "((head -c 160m /dev/urandom; sleep 100000) | sort > /dev/null 2>&1 &); sleep 5; grep -E 'VmRSS' /proc/$(pidof sort)/status"
	for i, bin := range []string{baseBin, ""} {
		// a has no room for a fork of its 256 MiB sandbox; b has.
		tc := startClusterOf(b, bin, i+1, "400MiB", "8GiB")
		sd := &side{name: []string{"plain", "mtls"}[i], viaA: tc.keyed(b, tc.nodes[0], tc.key), viaB: tc.keyed(b, tc.nodes[1], tc.key), sbs: map[string]string{}}
		for _, prov := range providers {
			sb, err := sd.viaA.Create(ctx, client.CreateRequest{Image: busybox, Provider: prov, Node: "a", MemoryMiB: 32})
			if err != nil {
				b.Fatal(err)
			}
			sd.sbs[prov] = sb.ID
			for range 5 { // warm both paths' connections
				sd.viaA.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}})
				sd.viaB.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}})
			}
		}
		src, err := sd.viaA.Create(ctx, client.CreateRequest{Image: busybox, Provider: "gvisor", Node: "a", MemoryMiB: 256})
		if err != nil {
			b.Fatal(err)
		}
		if res, err := sd.viaA.Exec(ctx, src.ID, client.ExecRequest{Argv: []string{"sh", "-c", fill}}); err != nil || res.ExitCode != 0 {
			b.Fatalf("fill: %+v %v", res, err)
		}
		sd.src = src.ID
		sides = append(sides, sd)
	}
	s := samples{}
	for i := 0; i < b.N; i++ {
		for range 5 {
			for _, prov := range providers {
				for _, sd := range sides {
					for _, via := range []struct {
						name string
						c    *client.Client
					}{{"direct", sd.viaA}, {"proxied", sd.viaB}} {
						t0 := time.Now()
						if _, err := via.c.Exec(ctx, sd.sbs[prov], client.ExecRequest{Argv: []string{"true"}}); err != nil {
							b.Fatal(err)
						}
						s.add("exec-"+prov+"-"+via.name+"-"+sd.name, time.Since(t0))
					}
				}
			}
		}
	}
	for i := 0; i < b.N; i++ {
		for _, sd := range sides {
			t0 := time.Now()
			fk, err := sd.viaB.Fork(ctx, sd.src, client.ForkRequest{})
			if err != nil {
				b.Fatal(err)
			}
			s.add("fork-moved-"+sd.name, time.Since(t0))
			if fk.Node != "b" {
				b.Fatalf("%s: the fork landed on %q", sd.name, fk.Node)
			}
			if err := sd.viaB.Remove(ctx, fk.ID, true); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, prov := range providers {
		k := "exec-" + prov + "-"
		report(b, s, k+"proxied-plain", k+"direct-plain", k+"proxied-plain", k+"direct-mtls", k+"proxied-mtls")
		for _, name := range []string{"plain", "mtls"} {
			o := pct(s[k+"proxied-"+name], 0.5) - pct(s[k+"direct-"+name], 0.5)
			b.ReportMetric(o, k+"overhead-"+name+"-p50-ms")
			fmt.Fprintf(os.Stderr, "BENCH %s exec (%s) overhead across nodes, %s: p50 %.2f ms\n", b.Name(), prov, name, o)
		}
	}
	report(b, s, "fork-moved-plain", "fork-moved-plain", "fork-moved-mtls")
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	c := slices.Clone(v)
	slices.Sort(c)
	return c[len(c)/2]
}

// BenchmarkBoundaryProbe prints what a sandbox of each provider reaches
// from a node of a cluster of SHARD_BENCH_BASE's build and from one of
// this build, both with default flags, in one world (etcd on a LAN
// namespace, a second node on another, a LAN service, a link-local address routed
// there, the internet's stand-in, names of them; every address of the
// node on four ports): one line a target. It measures nothing else.
func BenchmarkBoundaryProbe(b *testing.B) {
	baseBin := baseBinary(b)
	startLAN(b)
	w := newBoundaryWorld(b, "/")
	for i, bin := range []string{baseBin, ""} {
		side := []string{"before", "after"}[i]
		w.prefix = fmt.Sprintf("/probe-%s/", side)
		apiA, peerA := freePortOn(b, lanGW), freePortOn(b, lanGW)
		a := w.node(b, bin, "a", 10*i+10, net.JoinHostPort(lanGW, apiA), "0.0.0.0:"+peerA, net.JoinHostPort(lanGW, peerA))
		a.start(b)
		b.Cleanup(func() { a.teardown(b) })
		apiB, peerB := fmt.Sprint(7070+2*i), fmt.Sprint(7071+2*i)
		nb := w.node(b, bin, "b", 10*i+11, net.JoinHostPort(lanPeer, apiB), net.JoinHostPort(lanPeer, peerB), net.JoinHostPort(lanPeer, peerB))
		nb.netns = peerNS
		nb.start(b)
		b.Cleanup(func() { nb.teardown(b) })
		waitNodeUp(b, a.admin, "b")
		time.Sleep(2 * time.Second) // a heartbeat: b's address is in a's boundary
		targets := append([]string{lanService + ":8000", "dns:lan.test", lanPeer + ":8000", net.JoinHostPort(lanPeer, apiB), net.JoinHostPort(lanPeer, peerB),
			lanPublic + ":8000", "dns:public.test"}, w.never(b, a, apiA, peerA)...)
		for _, prov := range providers {
			sb, err := a.admin.Create(context.Background(), client.CreateRequest{Image: python, Provider: prov, Node: "a"})
			if err != nil {
				b.Fatal(err)
			}
			got := probe(b, a.admin, sb.ID, targets)
			reached := 0
			for _, tg := range targets {
				fmt.Fprintf(os.Stderr, "BENCH %s %s %-6s %-28s %s\n", b.Name(), side, prov, tg, got[tg])
				if o := got[tg]; o == "open" || strings.HasPrefix(o, "resolved") {
					reached++
				}
			}
			b.ReportMetric(float64(reached), side+"-"+prov+"-reached")
			fmt.Fprintf(os.Stderr, "BENCH %s %s %s: %d of %d targets reached: %v\n", b.Name(), side, prov, reached, len(targets), summarize(got))
		}
	}
}
