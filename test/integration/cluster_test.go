package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/cluster/etcdtest"
)

// node is one `shard serve` of a test cluster: its own data and run
// directories, socket, bridge, subnet and port.
type node struct {
	name, dir, socket, tcp, bridge, subnet, log string
	peer                                        string // the cluster port (--cluster-listen), mutual TLS
	netns                                       string // the network namespace it runs in ("": the host's)
	bin                                         string // the shard binary ("": the one under test)
	args                                        []string
	cmd                                         *exec.Cmd
	admin                                       *client.Client // its socket
}

// testCluster is three nodes over a real etcd of three members.
type testCluster struct {
	etcd  *etcdtest.Cluster
	nodes []*node
	key   string // an API key of every project, made through node 0
}

// clusterNet is the /16 whose /24s the test nodes' sandboxes get (apart
// from the shared server's SHARD_IT_SUBNET).
func clusterNet() string { return envOr("SHARD_IT_CLUSTER_NET", "10.87.0.0/16") }

func startCluster(t testing.TB, memory ...string) *testCluster {
	return startClusterOf(t, "", 0, memory...)
}

// startClusterOf starts a cluster of nodes running bin ("": the binary
// under test), the idx-th of a run (its bridges and subnets its own): a
// build from before the cluster port (no --cluster-listen) is given its
// own flags (--advertise of --listen, plain HTTP), for a benchmark of the
// two side by side.
func startClusterOf(t testing.TB, bin string, idx int, memory ...string) *testCluster {
	e := need(t)
	tc := &testCluster{etcd: etcdtest.Start(t, 3)}
	plainPeers := false
	if bin != "" {
		out, _ := exec.Command(bin, "serve", "--help").CombinedOutput()
		plainPeers = !strings.Contains(string(out), "--cluster-listen")
	}
	keyFile := filepath.Join(t.TempDir(), "cluster.key")
	if err := os.WriteFile(keyFile, []byte(strings.Repeat("c", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	base := netip.MustParsePrefix(clusterNet()).Addr().As4()
	for i, mem := range memory {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		peerPort, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		dir, err := os.MkdirTemp(e.dir, "node-")
		if err != nil {
			t.Fatal(err)
		}
		n := &node{name: string(rune('a' + i)), dir: dir, socket: filepath.Join(dir, "shard.sock"), tcp: fmt.Sprintf("127.0.0.1:%d", port), peer: fmt.Sprintf("127.0.0.1:%d", peerPort),
			bridge: fmt.Sprintf("%.11sc%d%d", e.bridge, idx, i), subnet: fmt.Sprintf("%d.%d.%d.0/24", base[0], base[1], 10*idx+i+1), log: filepath.Join(dir, "serve.log"), bin: bin}
		advertise := "https://" + n.peer
		if plainPeers {
			advertise = "http://" + n.tcp
		}
		n.args = append(e.serveArgs(n.socket, filepath.Join(dir, "data"), filepath.Join(dir, "run"), n.bridge, n.subnet, "1GiB", "4GiB"),
			"--listen", n.tcp, "--cluster-etcd", strings.Join(tc.etcd.Endpoints(), ","), "--node", n.name, "--advertise", advertise,
			"--cluster-key", keyFile, "--node-ttl", "3s", "--node-memory", mem,
			// What these tests write to the host (a 4GiB store at most,
			// an environment's checkpoint) is bounded; the host keeps
			// less free for itself than the default, so that the tests
			// do not depend on how much the host happens to have free.
			"--reserve", "512MiB")
		tc.nodes = append(tc.nodes, n)
		n.start(t)
		t.Cleanup(func() { n.teardown(t) })
	}
	tok, err := tc.nodes[0].admin.CreateToken(ctxT(t), client.TokenRequest{Name: "cluster-admin", Scopes: []string{"*"}, Project: "*"})
	if err != nil {
		t.Fatal(err)
	}
	tc.key = tok.Key
	// Every node has published its figures at least once.
	waitUntil(t, 20*time.Second, "three nodes up", func() bool {
		nodes, err := tc.nodes[0].admin.Nodes(ctxT(t))
		up := 0
		for _, n := range nodes {
			if n.State == "up" && len(n.Providers) > 0 {
				up++
			}
		}
		return err == nil && up == len(memory)
	})
	return tc
}

func (n *node) start(t testing.TB) {
	t.Helper()
	logf, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	bin := n.bin
	if bin == "" {
		bin = need(t).bin
	}
	n.cmd = exec.Command(bin, n.args...)
	if n.netns != "" {
		n.cmd = exec.Command("ip", append([]string{"netns", "exec", n.netns, bin}, n.args...)...)
	}
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	n.cmd.Env = serverEnv()
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if n.admin, err = client.New(client.Options{Socket: n.socket}); err != nil {
		t.Fatal(err)
	}
	if err := waitServing(n.admin, n.cmd, n.log); err != nil {
		t.Fatalf("node %s: %v", n.name, err)
	}
}

// stop ends the server as an administrator does (SIGTERM); its sandboxes
// keep running.
func (n *node) stop(t testing.TB) {
	t.Helper()
	if !n.term() {
		t.Fatalf("node %s did not stop on SIGTERM in 20s", n.name)
	}
}

// term sends SIGTERM and waits 20 s for the server to end, then kills it;
// it reports whether SIGTERM was enough.
func (n *node) term() bool {
	n.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { n.cmd.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(20 * time.Second):
		n.kill()
		return false
	}
}

// waitNodeUp waits until c lists node name up.
func waitNodeUp(t testing.TB, c *client.Client, name string) {
	t.Helper()
	waitUntil(t, 20*time.Second, "node "+name+" up", func() bool {
		nodes, err := c.Nodes(ctxT(t))
		for _, n := range nodes {
			if n.Name == name && n.State == "up" {
				return err == nil
			}
		}
		return false
	})
}

// kill is kill -9: no lease given back, no clean-up.
func (n *node) kill() {
	if n.cmd != nil && n.cmd.Process != nil {
		n.cmd.Process.Signal(syscall.SIGKILL)
		n.cmd.Wait()
	}
}

func (n *node) teardown(t testing.TB) {
	if n.cmd != nil && n.cmd.ProcessState == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if all, err := n.admin.List(ctx); err == nil {
			for _, sb := range all {
				if sb.Node == n.name {
					n.admin.Remove(ctx, sb.ID, true)
				}
			}
		}
		cancel()
		n.term()
	}
	// The node's log outlives the run's directory, for a post-mortem.
	if b, err := os.ReadFile(n.log); err == nil {
		os.WriteFile(filepath.Join(os.TempDir(), "shard-it-node-"+n.name+".log"), b, 0o644)
	}
	for _, rt := range [][2]string{{"runsc", filepath.Join(n.dir, "run", "runsc")}, {"runc", filepath.Join(n.dir, "run", "runc")}} {
		for _, id := range runtimeIDs(rt[0], rt[1]) {
			exec.Command(rt[0], "--root", rt[1], "delete", "--force", id).Run()
		}
	}
	exec.Command("sh", "-c", "grep ' "+n.dir+"/' /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l").Run()
	exec.Command("ip", "link", "del", n.bridge).Run()
	exec.Command("nft", "delete", "table", "ip", n.bridge).Run()
	exec.Command("nft", "delete", "table", "bridge", n.bridge).Run()
	// The node's store and images go now, not with the run's directory:
	// a run starts a dozen nodes, and their stores would add up.
	if os.Getenv("SHARD_KEEP") == "" {
		os.RemoveAll(n.dir)
	}
}

// keyed is a client of node n's TCP API with the cluster's key.
func (tc *testCluster) keyed(t testing.TB, n *node, key string) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{Remote: "http://" + n.tcp, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// signalWriter keeps what is written to it and closes seen once it holds
// want.
type signalWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// waitUntil is waitFor that says what it waited for.
func waitUntil(t testing.TB, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s", what, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func codeOf(err error) string {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return ""
}

func stateOn(t testing.TB, c *client.Client, id string) string {
	t.Helper()
	all, err := c.List(ctxT(t))
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	for _, sb := range all {
		if sb.ID == id {
			return sb.State + "@" + sb.Node
		}
	}
	return "absent"
}

// TestCluster: three nodes over a three-member etcd act as one server.
func TestCluster(t *testing.T) {
	// A single host is no cluster.
	if _, err := need(t).c.Nodes(ctxT(t)); codeOf(err) != "not_clustered" {
		t.Fatalf("GET /v0/nodes of a single host: %v", err)
	}
	// a has the most memory to give, so placement picks it.
	tc := startCluster(t, "6GiB", "3GiB", "2GiB")
	a, b, c := tc.nodes[0], tc.nodes[1], tc.nodes[2]
	viaA, viaB, viaC := tc.keyed(t, a, tc.key), tc.keyed(t, b, tc.key), tc.keyed(t, c, tc.key)
	ctx := ctxT(t)

	// Create through C lands on A; exec, a streamed exec and the
	// WebSocket exec through C reach it.
	sb, err := viaC.Create(ctx, client.CreateRequest{Image: busybox, Name: "placed", MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Node != "a" {
		t.Fatalf("create through c landed on %q, want a (the most free memory)", sb.Node)
	}
	res, err := viaC.Exec(ctx, "placed", client.ExecRequest{Argv: []string{"sh", "-c", "echo hi from $(hostname); echo oops >&2; exit 3"}})
	if err != nil || res.ExitCode != 3 || !strings.HasPrefix(string(res.Stdout), "hi from") || string(res.Stderr) != "oops\n" {
		t.Fatalf("exec through c: %+v %v", res, err)
	}
	var out, errOut strings.Builder
	sres, err := viaC.ExecStream(ctx, sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.2; done"}}, &out, &errOut)
	if err != nil || sres.ExitCode != 0 || out.String() != "1\n2\n3\n" {
		t.Fatalf("streamed exec through c: %+v %q %v", sres, out.String(), err)
	}
	ws, err := viaC.ExecInteractive(ctx, sb.ID, client.ExecRequest{Argv: []string{"cat"}})
	if err != nil {
		t.Fatalf("websocket exec through c: %v", err)
	}
	out.Reset()
	if wres, err := ws.Run(ctx, strings.NewReader("over the socket\n"), &out, &errOut); err != nil || wres.ExitCode != 0 || out.String() != "over the socket\n" {
		t.Fatalf("websocket exec through c: %+v %q %v", wres, out.String(), err)
	}
	if got := stateOn(t, viaB, sb.ID); got != "running@a" {
		t.Fatalf("list through b: %s", got)
	}
	if n := nodeNamed(t, viaC, "a"); n.Sandboxes != 1 || n.MemoryFree <= 0 {
		t.Fatalf("node a as c lists it: %+v", n)
	}
	// A project's key counts its own project's sandboxes only.
	p1, err := a.admin.CreateToken(ctx, client.TokenRequest{Name: "p1-reader", Scopes: []string{"sandbox:read"}, Project: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	if n := nodeNamed(t, tc.keyed(t, c, p1.Key), "a"); n.Sandboxes != 0 {
		t.Fatalf("node a as project p1's key sees it: %+v", n)
	}

	// A name taken on A is refused on B, also when B is asked to make it.
	if _, err := viaB.Create(ctx, client.CreateRequest{Image: busybox, Name: "placed", Node: "b"}); codeOf(err) != "name_taken" {
		t.Fatalf("name taken on a, made on b: %v", err)
	}
	// A token made on B works on A at once.
	tok, err := b.admin.CreateToken(ctx, client.TokenRequest{Name: "made-on-b", Scopes: []string{"sandbox:read"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tc.keyed(t, a, tok.Key).Get(ctx, "placed"); err != nil {
		t.Fatalf("token made on b, used on a: %v", err)
	}
	// ... and its scopes hold on the node the call is sent on to.
	if _, err := tc.keyed(t, c, tok.Key).Exec(ctx, "placed", client.ExecRequest{Argv: []string{"true"}}); codeOf(err) != "missing_scope" {
		t.Fatalf("a read-only key's exec sent on from c: %v", err)
	}
	// A forged node-to-node call is refused.
	if code := forgedCall(t, b); code != "bad_node_signature" {
		t.Fatalf("forged node call: %s", code)
	}

	// On B, a sandbox of B's own.
	onB, err := viaA.Create(ctx, client.CreateRequest{Image: busybox, Name: "on-b", Node: "b"})
	if err != nil || onB.Node != "b" {
		t.Fatalf("create on b through a: %+v %v", onB, err)
	}
	// Its exec through a, the body open while the answer streams (as the
	// CLI sends every exec, for Ctrl-C), stdin sent only once the answer
	// began: a stopped reading the body at the answer's start.
	pr, pw := io.Pipe()
	ready := &signalWriter{want: "ready\n", seen: make(chan struct{})}
	go func() {
		select {
		case <-ready.seen:
			io.WriteString(pw, "through a\n")
		case <-ctx.Done():
		}
		pw.Close()
	}()
	res, err = viaA.ExecPipeSignals(ctx, "on-b", client.ExecRequest{Argv: []string{"sh", "-c", "echo ready; cat"}}, pr, make(chan int), ready, io.Discard)
	if err != nil || res.ExitCode != 0 || ready.buf.String() != "ready\nthrough a\n" {
		t.Fatalf("exec of b's sandbox through a, its body open: %+v %v, stdout %q", res, err, ready.buf.String())
	}

	// A snapshot of b's sandbox asked of c is made on b; a sandbox made
	// from it, asked of a, runs on b, where the snapshot is.
	if _, err := viaC.Stop(ctx, "on-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := viaC.CreateSnapshot(ctx, client.SnapshotRequest{Sandbox: "on-b", Name: "snap-b"}); err != nil {
		t.Fatalf("snapshot of b's sandbox through c: %v", err)
	}
	if _, err := viaA.Start(ctx, "on-b"); err != nil {
		t.Fatal(err)
	}
	fromSnap, err := viaA.Create(ctx, client.CreateRequest{FromSnapshot: "snap-b", Name: "from-snap"})
	if err != nil || fromSnap.Node != "b" {
		t.Fatalf("create from b's snapshot through a: %+v %v", fromSnap, err)
	}

	// An environment built on a, used on b: b copies its checkpoint on the
	// first use and keeps it; lists show it once; removing it through c
	// removes it from both.
	envReq := client.EnvironmentRequest{Name: "env-a", Image: busybox, Setup: [][]string{{"sh", "-c", "echo set-up > /root/marker"}}}
	built, err := viaA.CreateEnvironment(ctx, envReq)
	if err != nil {
		t.Fatalf("environment on a: %v", err)
	}
	// Its name is the cluster's: asked of b, the same definition is a's
	// (sent to a, which has it built already).
	if again, isNew, err := b.admin.BuildEnvironment(ctx, envReq); err != nil || isNew || again.Checkpoint != built.Checkpoint {
		t.Fatalf("env-a asked of b: %+v new %v %v", again, isNew, err)
	}
	for i := range 2 {
		fromEnv, err := viaC.Create(ctx, client.CreateRequest{Environment: "env-a", Node: "b"})
		if err != nil || fromEnv.Node != "b" {
			t.Fatalf("create %d from a's environment on b: %+v %v", i, fromEnv, err)
		}
		if got := execVia2(t, viaC, fromEnv.ID, "cat /root/marker"); got != "set-up\n" {
			t.Fatalf("from a's environment on b: marker %q", got)
		}
	}
	if envs, err := viaB.Environments(ctx); err != nil || len(envs) != 1 || envs[0].Name != "env-a" {
		t.Fatalf("environments listed through b: %+v %v", envs, err)
	}
	if e, err := b.admin.GetEnvironment(ctx, "env-a"); err != nil || e.Origin != "a" {
		t.Fatalf("b's copy of env-a: %+v %v", e, err)
	}
	if err := viaC.RemoveEnvironment(ctx, "env-a"); err != nil {
		t.Fatalf("remove env-a through c: %v", err)
	}
	for _, n := range []*node{a, b} {
		if _, err := n.admin.GetEnvironment(ctx, "env-a"); codeOf(err) != "environment_not_found" {
			t.Fatalf("env-a on %s after its removal: %v", n.name, err)
		}
	}

	// A fork whose source's node is full lands on another node, its
	// memory intact: a shell holding a value only in its memory goes on
	// writing it in the fork.
	src, err := viaA.Create(ctx, client.CreateRequest{Image: busybox, Name: "full-src", Node: "c", MemoryMiB: 1200})
	if err != nil {
		t.Fatal(err)
	}
	execVia(t, viaA, src.ID)
	if res, err := viaA.Exec(ctx, src.ID, client.ExecRequest{Argv: []string{"sh", "-c",
		"v=$(date +%s%N); echo $v > /tmp/v0; (while :; do echo $v > /tmp/v; sleep 0.1; done) >/dev/null 2>&1 & sleep 0.3"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("start the writer: %+v %v", res, err)
	}
	fork, err := viaB.Fork(ctx, "full-src", client.ForkRequest{Name: "moved"})
	if err != nil {
		t.Fatalf("fork of a sandbox on a full node: %v", err)
	}
	if fork.Node == "c" || fork.Node == "" {
		t.Fatalf("the fork of a sandbox on full node c landed on %q", fork.Node)
	}
	want := strings.TrimSpace(execVia2(t, viaC, "moved", "cat /tmp/v0"))
	if got := strings.TrimSpace(execVia2(t, viaC, "moved", "rm -f /tmp/v; sleep 0.5; cat /tmp/v")); got != want {
		t.Fatalf("the moved fork's writer wrote %q, want %q (its memory)", got, want)
	}
	execVia(t, viaA, "full-src") // the source goes on
	page, err := viaA.Events(ctx, fork.Session, 0, 10)
	if err != nil || len(page.Events) == 0 || !strings.Contains(string(page.Events[0].Data), `"from_node": "c"`) && !strings.Contains(string(page.Events[0].Data), `"from_node":"c"`) {
		t.Fatalf("the moved fork's ledger: %+v %v", page, err)
	}

	// One etcd member of three killed: nothing lost, writes go on.
	tc.etcd.Kill(2)
	if _, err := viaB.Create(ctx, client.CreateRequest{Image: busybox, Name: "quorum", Node: "c"}); err != nil {
		t.Fatalf("create with one etcd member of three down: %v", err)
	}
	for _, id := range []string{"placed", "on-b", "quorum"} {
		if _, err := viaC.Get(ctx, id); err != nil {
			t.Fatalf("%s with one etcd member down: %v", id, err)
		}
	}
	if _, err := tc.keyed(t, a, tok.Key).Get(ctx, "on-b"); err != nil {
		t.Fatalf("the token with one etcd member down: %v", err)
	}
	tc.etcd.Restart(2)
	tc.etcd.Wait()

	// kill -9 of A: its sandbox is unreachable (listed, not removed), a
	// call for it gets 503 node_unreachable naming a; B's are unaffected.
	a.kill()
	waitUntil(t, 15*time.Second, "a's lease to expire", func() bool { return nodeNamed(t, viaB, "a").State == "unreachable" })
	if got := stateOn(t, viaC, sb.ID); got != "unreachable@a" {
		t.Fatalf("a's sandbox while a is down: %s", got)
	}
	_, err = viaB.Exec(ctx, "placed", client.ExecRequest{Argv: []string{"true"}})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != "node_unreachable" || ce.Status != 503 || !strings.Contains(ce.Message, "node a") {
		t.Fatalf("exec on a's sandbox while a is down: %v", err)
	}
	execVia(t, viaC, "on-b")
	// A comes back with its sandbox, which runs again.
	a.start(t)
	waitUntil(t, 15*time.Second, "a back", func() bool { return stateOn(t, viaB, sb.ID) == "running@a" })
	execVia(t, viaB, "placed")

	// etcd down altogether: each node still runs its own sandboxes' execs
	// (a key it knows still works); cluster-wide writes are refused.
	for i := range 3 {
		tc.etcd.Kill(i)
	}
	execVia(t, viaB, "on-b")
	if _, err := viaB.Create(ctx, client.CreateRequest{Image: busybox, Node: "b"}); codeOf(err) != "cluster_unavailable" {
		t.Fatalf("create with etcd down: %v", err)
	}
	for i := range 3 {
		tc.etcd.Restart(i)
	}
	tc.etcd.Wait()
	waitUntil(t, 20*time.Second, "etcd back: a create", func() bool {
		_, err := viaB.Create(ctx, client.CreateRequest{Image: busybox, Name: "after", Node: "b"})
		return err == nil
	})
	for _, id := range []string{"placed", "on-b", "quorum", "after"} {
		execVia(t, viaA, id)
	}
}

// execVia2 runs a shell command through c and returns its stdout.
func execVia2(t testing.TB, c *client.Client, id, script string) string {
	t.Helper()
	res, err := c.Exec(ctxT(t), id, client.ExecRequest{Argv: []string{"sh", "-c", script}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q in %s: %+v %v", script, id, res, err)
	}
	return string(res.Stdout)
}

func execVia(t testing.TB, c *client.Client, id string) {
	t.Helper()
	res, err := c.Exec(ctxT(t), id, client.ExecRequest{Argv: []string{"echo", "ok"}})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "ok\n" {
		t.Fatalf("exec in %s: %+v %v", id, res, err)
	}
}

func nodeNamed(t testing.TB, c *client.Client, name string) client.Node {
	t.Helper()
	nodes, err := c.Nodes(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %s in %+v", name, nodes)
	return client.Node{}
}

// forgedCall sends a call that claims to come from another node, with a
// signature made without the cluster key, and returns the error code.
func forgedCall(t testing.TB, n *node) string {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+n.tcp+"/v0/sandboxes", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Shard-Node-Signature", fmt.Sprintf("node=a,t=%d,sig=00", time.Now().Unix()))
	req.Header.Set("Shard-Node-Principal", "eyJhZG1pbiI6dHJ1ZX0") // {"admin":true}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e client.Error
	json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("forged node call: status %d", resp.StatusCode)
	}
	return e.Code
}
