package integration

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestDemoCluster runs scripts/demo-cluster.sh as the README has an
// operator run it, beside the shared server (its own directory, binary,
// bridges, subnets and ports, the run's registry): the walk-through works,
// the shard it built says the checkout's version as the nodes do
// (scripts/build.sh stamps it; the demo's build once did not), and `stop`
// leaves nothing on the host but the state directory: no mount or loop
// device of its files, no bridge, nftables table, run directory or memory
// images' directory of its nodes, no process (stop once left the stores
// mounted and the bridges and tables behind).
func TestDemoCluster(t *testing.T) {
	e := need(t)
	dir, err := os.MkdirTemp(e.dir, "demo-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "shard")
	bridge := fmt.Sprintf("%.11sd", e.bridge)
	runPrefix := filepath.Join(e.dir, "demo-run")
	base := netip.MustParsePrefix(clusterNet()).Addr().As4()
	api, peer := freePortPair(t), freePortPair(t)
	etcdPort, etcdPeer := mustFreePort(t), mustFreePort(t)
	_, regPort, _ := net.SplitHostPort(e.registry)
	env := append(os.Environ(),
		"SHARD_CLUSTER_DIR="+dir, "SHARD_BIN="+bin, "SHARD_CLUSTER_BRIDGE="+bridge, "SHARD_CLUSTER_RUN="+runPrefix,
		fmt.Sprintf("SHARD_CLUSTER_SUBNETS=%d.%d.240.0/24 %d.%d.241.0/24", base[0], base[1], base[0], base[1]),
		fmt.Sprintf("SHARD_CLUSTER_PORT=%d", api), fmt.Sprintf("SHARD_CLUSTER_PEER_PORT=%d", peer),
		fmt.Sprintf("SHARD_CLUSTER_ETCD_PORT=%d", etcdPort), fmt.Sprintf("SHARD_CLUSTER_ETCD_PEER_PORT=%d", etcdPeer),
		"SHARD_DEMO_REGISTRY_PORT="+regPort, "SHARD_DEMO_REGISTRY_DIR="+filepath.Join(e.dir, "registry"))
	demo := demoScript(t, filepath.Join(e.root, "scripts", "demo-cluster.sh"), env)

	out := demo()
	for _, want := range []string{"hello from", "2.32.3", "try-a"} {
		if !strings.Contains(out, want) {
			t.Errorf("the walk-through's output lacks %q:\n%s", want, out)
		}
	}
	want := "dev"
	if v, err := exec.Command("git", "-C", e.root, "describe", "--always", "--dirty").Output(); err == nil {
		want = strings.TrimSpace(string(v))
	}
	v, err := exec.Command(bin, "--version").CombinedOutput()
	if got := strings.TrimSpace(string(v)); err != nil || got != "shard version "+want {
		t.Errorf("the demo's shard --version: %q (%v), want shard version %s", got, err, want)
	}
	var sv struct{ Version string }
	if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/v0/version", api)); err != nil {
		t.Errorf("node a's version: %v", err)
	} else {
		err := json.NewDecoder(resp.Body).Decode(&sv)
		resp.Body.Close()
		if err != nil || sv.Version != want {
			t.Errorf("node a's version: %q (%v), want %s", sv.Version, err, want)
		}
	}

	var pids []int
	for _, f := range []string{"a/pid", "b/pid", "etcd.pid"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			t.Fatalf("%s: %q %v", f, b, err)
		}
		pids = append(pids, pid)
	}
	demo("stop")

	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("process %d (a node or etcd) still runs after stop", pid)
		}
	}
	for _, m := range mounts() {
		if strings.HasPrefix(m.point, dir+"/") || strings.HasPrefix(m.point, runPrefix) {
			t.Errorf("still mounted after stop: %s", m.point)
		}
	}
	if lo, err := exec.Command("losetup", "-n", "-O", "NAME,BACK-FILE").Output(); err == nil {
		sc := bufio.NewScanner(strings.NewReader(string(lo)))
		for sc.Scan() {
			if strings.Contains(sc.Text(), dir+"/") {
				t.Errorf("a loop device on the demo's files after stop: %s", sc.Text())
			}
		}
	}
	for _, n := range []string{"a", "b"} {
		br := bridge + n
		if exec.Command("ip", "link", "show", br).Run() == nil {
			t.Errorf("bridge %s is still there after stop", br)
		}
		for _, family := range []string{"ip", "bridge"} {
			if exec.Command("nft", "list", "table", family, br).Run() == nil {
				t.Errorf("nftables table %s %s is still there after stop", family, br)
			}
		}
		sum := sha256.Sum256([]byte(filepath.Join(dir, n, "data")))
		for _, p := range []string{runPrefix + "-" + n, "/dev/shm/shard-" + hex.EncodeToString(sum[:4])} {
			if _, err := os.Stat(p); err == nil {
				t.Errorf("%s is still there after stop", p)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "a", "data", "shard.db")); err != nil {
		t.Errorf("stop keeps the state, yet node a's database: %v", err)
	}
}

// freePortPair returns a port p with p+1 free too (the demo gives node a p
// and node b p+1).
// TestDemo runs scripts/demo.sh, the README's first command after the
// install, beside the shared server (its own data and run directories,
// socket, binary, bridge, subnet and metrics port; the run's registry):
// the seed's walk-through works; `stop` stops its sandboxes (kept) and the
// server it started, and leaves nothing on the host but the data directory:
// no mount or loop device of its files, no bridge, nftables table or run
// directory (a newcomer had no way to stop the demo, and a server's SIGTERM
// leaves all of that for its sandboxes); a rerun starts on the kept state.
func TestDemo(t *testing.T) {
	e := need(t)
	dir, err := os.MkdirTemp(e.dir, "demo-")
	if err != nil {
		t.Fatal(err)
	}
	data, run := filepath.Join(dir, "data"), filepath.Join(e.dir, "demo-single-run")
	bridge := fmt.Sprintf("%.11se", e.bridge)
	base := netip.MustParsePrefix(clusterNet()).Addr().As4()
	_, regPort, _ := net.SplitHostPort(e.registry)
	env := append(os.Environ(),
		"SHARD_DEMO_DIR="+data, "SHARD_DEMO_RUN="+run, "SHARD_DEMO_SOCKET="+filepath.Join(dir, "shard.sock"),
		"SHARD_BIN="+filepath.Join(dir, "shard"), "SHARD_DEMO_BRIDGE="+bridge,
		fmt.Sprintf("SHARD_DEMO_SUBNET=%d.%d.242.0/24", base[0], base[1]),
		fmt.Sprintf("SHARD_DEMO_METRICS=127.0.0.1:%d", mustFreePort(t)), "SHARD_DEMO_LOG="+filepath.Join(dir, "serve.log"),
		"SHARD_DEMO_STORAGE_SIZE=1GiB", "SHARD_DEMO_DEFAULT_DISK=256MiB",
		"SHARD_DEMO_REGISTRY_PORT="+regPort, "SHARD_DEMO_REGISTRY_DIR="+filepath.Join(e.dir, "registry"))
	demo := demoScript(t, filepath.Join(e.root, "scripts", "demo.sh"), env)
	pidOf := func() int {
		t.Helper()
		b, err := os.ReadFile(data + ".demo.pid")
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			t.Fatalf("the demo's pid file: %q %v", b, err)
		}
		return pid
	}
	for round := range 2 { // the second on the state the first's stop kept
		out := demo()
		for _, want := range []string{"2.31.0", "2.32.4", "2.32.3", "demo.sh stop"} {
			if !strings.Contains(out, want) {
				t.Errorf("round %d: the walk-through's output lacks %q:\n%s", round, want, out)
			}
		}
		pid := pidOf()
		out = demo("stop")
		if !strings.Contains(out, "state kept in "+data) {
			t.Errorf("stop says %q", out)
		}
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("the demo's server %d still runs after stop", pid)
		}
		for _, m := range mounts() {
			if strings.HasPrefix(m.point, data+"/") || strings.HasPrefix(m.point, run) {
				t.Errorf("still mounted after stop: %s", m.point)
			}
		}
		if lo, err := exec.Command("losetup", "-n", "-O", "NAME,BACK-FILE").Output(); err == nil && strings.Contains(string(lo), data+"/") {
			t.Errorf("a loop device on the demo's files after stop:\n%s", lo)
		}
		if exec.Command("ip", "link", "show", bridge).Run() == nil {
			t.Errorf("bridge %s is still there after stop", bridge)
		}
		for _, family := range []string{"ip", "bridge"} {
			if exec.Command("nft", "list", "table", family, bridge).Run() == nil {
				t.Errorf("nftables table %s %s is still there after stop", family, bridge)
			}
		}
		if _, err := os.Stat(run); err == nil {
			t.Errorf("%s is still there after stop", run)
		}
		if _, err := os.Stat(filepath.Join(data, "shard.db")); err != nil {
			t.Errorf("stop keeps the state, yet the database: %v", err)
		}
	}
}

// demoScript returns a function that runs script with env and args, failing
// the test with its output if it fails; the test's cleanup runs its stop.
func demoScript(t *testing.T, script string, env []string) func(args ...string) string {
	t.Cleanup(func() {
		cmd := exec.Command(script, "stop")
		cmd.Env = env
		cmd.Run()
	})
	return func(args ...string) string {
		t.Helper()
		cmd := exec.Command(script, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", filepath.Base(script), args, err, out)
		}
		return string(out)
	}
}

func freePortPair(t testing.TB) int {
	t.Helper()
	for range 20 {
		p := mustFreePort(t)
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1)); err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no two free ports in a row")
	return 0
}

func mustFreePort(t testing.TB) int {
	t.Helper()
	p, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}
