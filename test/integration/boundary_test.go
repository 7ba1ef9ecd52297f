package integration

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/cluster/etcdtest"
	"github.com/vishvananda/netlink"
)

// The boundary test's world: a namespace standing for the nodes' LAN,
// reached from the host over a veth (the host's side, 10.77.0.1, is an
// address of node a). In it: etcd (client-certificate TLS, as
// docs/cluster.md runs it), a LAN service, a DNS server, and two addresses
// routed there by the test: a link-local one standing for a cloud
// metadata service (this machine's own network answers at
// 169.254.169.254: it is never probed before it is routed here) and one
// standing for the public internet. A second namespace, on the host's
// other side (10.77.1.0/24), is the machine of a second node (node b runs
// there). Every one of them has a server on port 8000 that says so.
const (
	lanNS       = "shardit-lan"
	lanVeth     = "vshlan"
	lanGW       = "10.77.0.1" // the host's side: an address of node a
	lanNet      = "10.77.0.0/16"
	lanEtcd     = "10.77.0.10"
	lanService  = "10.77.0.20" // also the LAN's DNS server
	lanMetadata = "169.254.169.254"
	lanPublic   = "198.18.250.2"
	peerNS      = "shardit-peer"
	peerVeth    = "vshpeer"
	peerGW      = "10.77.1.1"  // the host's side
	lanPeer     = "10.77.1.30" // node b's machine
)

// probeScript tries each target from inside a sandbox, at once: host:port
// is a TCP connect ("open" when it completes), dns:name a lookup through
// the sandbox's resolver. It prints {target: outcome} as JSON.
const probeScript = `
import concurrent.futures, json, socket, sys
def tcp(t):
    host, port = t.rsplit(":", 1)
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, int(port)))
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return "error %d" % e.errno
    finally:
        s.close()
def dns(name):
    try:
        return "resolved " + socket.gethostbyname(name)
    except OSError:
        return "unresolved"
ts = json.loads(sys.argv[1])
with concurrent.futures.ThreadPoolExecutor(64) as ex:
    out = dict(zip(ts, ex.map(lambda t: dns(t[4:]) if t.startswith("dns:") else tcp(t), ts)))
print(json.dumps(out))
`

// probe runs probeScript in sandbox id on node c.
func probe(t testing.TB, c *client.Client, id string, targets []string) map[string]string {
	t.Helper()
	b, _ := json.Marshal(targets)
	res, err := c.Exec(ctxT(t), id, client.ExecRequest{Argv: []string{"python3", "-c", probeScript, string(b)}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("probe in %s: %v %+v", id, err, res)
	}
	out := map[string]string{}
	if err := json.Unmarshal(res.Stdout, &out); err != nil {
		t.Fatalf("probe in %s: %v: %s", id, err, res.Stdout)
	}
	return out
}

// startLAN makes the LAN namespace with its servers and routes.
func startLAN(t testing.TB) {
	t.Helper()
	testHost(t, lanNS, lanVeth, lanGW, lanEtcd, lanService)
	testHost(t, peerNS, peerVeth, peerGW, lanPeer)
	for _, a := range []string{lanMetadata, lanPublic} {
		if out, err := exec.Command("ip", "-n", lanNS, "addr", "add", a+"/32", "dev", "eth0").CombinedOutput(); err != nil {
			t.Fatalf("%s: %v %s", a, err, out)
		}
		// Routed into the test's namespace before anything goes there.
		if out, err := exec.Command("ip", "route", "replace", a+"/32", "dev", lanVeth).CombinedOutput(); err != nil {
			t.Fatalf("route %s: %v %s", a, err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "route", "del", a+"/32", "dev", lanVeth).Run() })
	}
	for ns, gw := range map[string]string{lanNS: lanGW, peerNS: peerGW} {
		if out, err := exec.Command("ip", "-n", ns, "route", "add", "default", "via", gw).CombinedOutput(); err != nil {
			t.Fatalf("default route in %s: %v %s", ns, err, out)
		}
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "target %s\n", r.Context().Value(http.LocalAddrContextKey))
	})}
	var pc net.PacketConn
	for _, ns := range []string{lanNS, peerNS} {
		var ln net.Listener
		if err := inNetns(ns, func() (err error) {
			if ln, err = net.Listen("tcp4", "0.0.0.0:8000"); err != nil {
				return err
			}
			if ns == lanNS {
				pc, err = net.ListenPacket("udp4", lanService+":53")
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		go srv.Serve(ln)
	}
	go serveDNS(pc, map[string]string{"lan.test.": lanService, "etcd.test.": lanEtcd, "meta.test.": lanMetadata, "public.test.": lanPublic})
	t.Cleanup(func() { srv.Close(); pc.Close() })
	// From the host, every server answers: what a sandbox is refused is
	// refused by the boundary, not missing.
	for _, a := range []string{lanEtcd, lanService, lanPeer, lanMetadata, lanPublic} {
		c, err := net.DialTimeout("tcp", a+":8000", 2*time.Second)
		if err != nil {
			t.Fatalf("the test's server at %s does not answer the host: %v", a, err)
		}
		c.Close()
	}
}

// hostListener listens on every address of the host, standing for any
// service of the node's, and returns its port.
func hostListener(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "host\n")
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// hostAddrs lists the host's IPv4 addresses, on every interface.
func hostAddrs(t testing.TB) []string {
	t.Helper()
	list, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range list {
		out = append(out, a.IP.String())
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// boundaryWorld is what the nodes of a boundary test share: etcd in the
// LAN namespace (client-certificate TLS), a cluster key, a port of the
// test's own open on every host address.
type boundaryWorld struct {
	etcd     *etcdtest.Cluster
	files    [3]string // etcd's CA, a client's certificate and key
	key      []byte
	keyFile  string
	prefix   string // the cluster's etcd prefix
	hostPort string
}

func newBoundaryWorld(t testing.TB, prefix string) *boundaryWorld {
	w := &boundaryWorld{key: []byte(strings.Repeat("b", 32)), keyFile: filepath.Join(t.TempDir(), "cluster.key"), prefix: prefix}
	w.etcd, w.files = etcdtest.StartIn(t, lanNS, lanEtcd)
	if err := os.WriteFile(w.keyFile, w.key, 0o600); err != nil {
		t.Fatal(err)
	}
	w.hostPort = hostListener(t)
	return w
}

// node is a node of the world's cluster running bin ("": the binary under
// test), its i-th, with its API on listen and its cluster port on peer,
// reached at advertise. A build from before the cluster port (no
// --cluster-listen) is advertised at its API, over plain HTTP.
func (w *boundaryWorld) node(t testing.TB, bin, name string, i int, listen, peer, advertise string, extra ...string) *node {
	e := need(t)
	dir, err := os.MkdirTemp(e.dir, "bnode-")
	if err != nil {
		t.Fatal(err)
	}
	base := netip.MustParsePrefix(clusterNet()).Addr().As4()
	n := &node{name: name, dir: dir, socket: filepath.Join(dir, "shard.sock"), tcp: listen, peer: peer, bin: bin,
		bridge: fmt.Sprintf("%.11sx%d", e.bridge, i), subnet: fmt.Sprintf("%d.%d.%d.0/24", base[0], base[1], 20+i), log: filepath.Join(dir, "serve.log")}
	cport := []string{"--cluster-listen", peer, "--advertise", "https://" + advertise}
	if bin != "" {
		if out, _ := exec.Command(bin, "serve", "--help").CombinedOutput(); !strings.Contains(string(out), "--cluster-listen") {
			cport = []string{"--advertise", "http://" + listen}
		}
	}
	n.args = append(append(append(e.serveArgs(n.socket, filepath.Join(dir, "data"), filepath.Join(dir, "run"), n.bridge, n.subnet, "1GiB", "4GiB"),
		"--listen", listen, "--dns-upstream", lanService+":53", "--cluster-prefix", w.prefix,
		"--cluster-etcd", strings.Join(w.etcd.Endpoints(), ","), "--etcd-ca", w.files[0], "--etcd-cert", w.files[1], "--etcd-key", w.files[2],
		"--node", name, "--cluster-key", w.keyFile, "--node-ttl", "3s", "--node-memory", "2GiB"), cport...), extra...)
	return n
}

// never are the targets no sandbox of node n may reach, whatever the
// flags: etcd, the metadata address, names of them, and every address of
// the node on its API port, its cluster port, the world's port and DNS
// (but its sandboxes' own gateway's, where the DNS proxy is their name
// server).
func (w *boundaryWorld) never(t testing.TB, n *node, apiPort, peerPort string) []string {
	gw := netip.MustParsePrefix(n.subnet).Addr().Next().String()
	out := []string{lanEtcd + ":2379", lanEtcd + ":2380", lanEtcd + ":8000", lanMetadata + ":8000", lanMetadata + ":80",
		"dns:etcd.test", "dns:meta.test"}
	for _, ip := range hostAddrs(t) {
		for _, port := range []string{apiPort, peerPort, w.hostPort, "53"} {
			if ip == gw && port == "53" {
				continue
			}
			out = append(out, net.JoinHostPort(ip, port))
		}
	}
	return out
}

// TestEgressBoundary: from inside a sandbox of each provider on a node of a
// cluster, nothing of the control plane or the host's networks answers:
// etcd, the other node (on a machine of the LAN), every address of the node
// itself on every port tried, a LAN service (until the administrator opens
// its range, and then etcd and the node still do not), a link-local
// address, names that resolve into any of these; the internet does. The
// other node is refused as soon as it joins. A node's cluster port takes
// no handshake from a certificate of another cluster key, nor a call from
// a node's certificate without its signature.
func TestEgressBoundary(t *testing.T) {
	need(t)
	startLAN(t)
	w := newBoundaryWorld(t, "/shard/")
	apiA, peerA := freePortOn(t, lanGW), freePortOn(t, lanGW)
	a := w.node(t, "", "a", 0, net.JoinHostPort(lanGW, apiA), "0.0.0.0:"+peerA, net.JoinHostPort(lanGW, peerA))
	withOpened := append(slices.Clone(a.args), "--allow-private-egress", lanNet)
	plain := a.args
	a.args = withOpened
	a.start(t)
	t.Cleanup(func() { a.teardown(t) })
	sbs := map[string]string{}
	for _, p := range providers {
		sb, err := a.admin.Create(ctxT(t), client.CreateRequest{Image: python, Provider: p, Node: "a"})
		if err != nil {
			t.Fatalf("create on %s: %v", p, err)
		}
		sbs[p] = sb.ID
	}

	never := w.never(t, a, apiA, peerA)
	check := func(phase string, open, closed []string) {
		t.Helper()
		targets := append(append(slices.Clone(open), closed...), never...)
		for p, id := range sbs {
			got := probe(t, a.admin, id, targets)
			for _, tg := range open {
				if o := got[tg]; o != "open" && !strings.HasPrefix(o, "resolved") {
					t.Errorf("%s, %s: %s: %s, want it reached", phase, p, tg, o)
				}
			}
			for _, tg := range append(slices.Clone(closed), never...) {
				if o := got[tg]; o == "open" || strings.HasPrefix(o, "resolved") {
					t.Errorf("%s, %s: %s answered (%s): it must be refused", phase, p, tg, o)
				}
			}
			t.Logf("%s, %s: %d targets: %v", phase, p, len(got), summarize(got))
		}
	}

	t.Log("--allow-private-egress names the LAN: its service answers, etcd and the node do not")
	check("LAN opened", []string{lanService + ":8000", lanPeer + ":8000", lanPublic + ":8000", "dns:lan.test", "dns:public.test"}, nil)

	t.Log("node b joins from a machine of the LAN: refused within a heartbeat")
	apiB, peerB := "7070", "7071" // in a namespace of its own
	b := w.node(t, "", "b", 1, net.JoinHostPort(lanPeer, apiB), net.JoinHostPort(lanPeer, peerB), net.JoinHostPort(lanPeer, peerB))
	b.netns = peerNS
	b.start(t)
	t.Cleanup(func() { b.teardown(t) })
	waitNodeUp(t, a.admin, "b")
	joined := time.Now()
	waitUntil(t, 10*time.Second, "node b's machine refused", func() bool {
		got := probe(t, a.admin, sbs["runc"], []string{lanPeer + ":8000"})
		return got[lanPeer+":8000"] != "open"
	})
	t.Logf("node b's address refused %s after it was listed up", time.Since(joined).Round(time.Millisecond))
	bTargets := []string{lanPeer + ":8000", net.JoinHostPort(lanPeer, apiB), net.JoinHostPort(lanPeer, peerB)}
	check("LAN opened, b joined", []string{lanService + ":8000", lanPublic + ":8000"}, bTargets)

	// The cluster works over mutual TLS: a call through a about b's
	// sandbox goes on to b.
	keyed := keyedClient(t, a)
	if _, err := keyed.Nodes(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	t.Log("node a restarts without --allow-private-egress: the LAN is refused too, and names into it")
	a.stop(t)
	a.args = plain
	a.start(t)
	check("default", []string{lanPublic + ":8000", "dns:public.test"}, append([]string{lanService + ":8000", "dns:lan.test"}, bTargets...))

	t.Log("a policy cannot open what the server refuses")
	for _, tc := range []struct{ allow, want string }{
		{lanService, "--allow-private-egress " + lanService + "/32"},
		{lanNet, "--allow-private-egress " + lanNet},
		{lanMetadata, "no sandbox reaches it"},
		{lanEtcd, "no sandbox reaches it"},
		{lanGW, "no sandbox reaches it"},
	} {
		_, err := a.admin.SetPolicy(ctxT(t), sbs["gvisor"], client.Policy{Allow: []string{tc.allow}})
		var ce *client.Error
		if !asClientErr(err, &ce) || ce.Status != 400 || ce.Code != "policy_refused" || !strings.Contains(ce.Message, tc.want) {
			t.Errorf("policy allowing %s: %v, want a 400 policy_refused saying %q", tc.allow, err, tc.want)
		}
	}

	t.Log("the cluster port: mutual TLS with the cluster's CA, and a node's signature")
	peerAddr := net.JoinHostPort(lanGW, peerA)
	other, err := cluster.NewNodeTLS([]byte(strings.Repeat("x", 32)), "b")
	if err != nil {
		t.Fatal(err)
	}
	ours, err := cluster.NewNodeTLS(w.key, "b")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"another cluster key", other.Client("a")},
		{"no client certificate", &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}},
	} {
		if status, err := clusterPortGet(peerAddr, tc.cfg); err == nil {
			t.Errorf("%s: the cluster port answered %d", tc.name, status)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	// A's certificate is checked by a client of this key, and refused by
	// one of another.
	if _, err := clusterPortGet(peerAddr, ours.Client("a")); err != nil {
		t.Errorf("a certificate of the cluster's key: %v", err)
	}
	if _, err := clusterPortGet(peerAddr, ours.Client("c")); err == nil || !strings.Contains(err.Error(), "not c's") {
		t.Errorf("a's certificate taken for node c's: %v", err)
	}
	if status, _ := clusterPortGet(peerAddr, ours.Client("a")); status != http.StatusUnauthorized {
		t.Errorf("an unsigned call on the cluster port: %d, want 401", status)
	}
	if code := forgedCall(t, a); code != "bad_node_signature" {
		t.Errorf("a node's call on the API port: %q, want bad_node_signature", code)
	}
}

// clusterPortGet makes an unsigned GET /v0/sandboxes on a cluster port
// with cfg.
func clusterPortGet(addr string, cfg *tls.Config) (int, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	resp, err := c.Get("https://" + addr + "/v0/sandboxes")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// freePortOn finds a free TCP port on ip.
func freePortOn(t testing.TB, ip string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

func replaceAfter(args []string, flag, value string) []string {
	out := slices.Clone(args)
	for i := range out[:len(out)-1] {
		if out[i] == flag {
			out[i+1] = value
		}
	}
	return out
}

// keyedClient is a client of node n's API with a key of every project
// made through it.
func keyedClient(t *testing.T, n *node) *client.Client {
	t.Helper()
	tok, err := n.admin.CreateToken(ctxT(t), client.TokenRequest{Name: "boundary-admin", Scopes: []string{"*"}, Project: "*"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Remote: "http://" + n.tcp, APIKey: tok.Key})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func asClientErr(err error, ce **client.Error) bool {
	e, ok := err.(*client.Error)
	if ok {
		*ce = e
	}
	return ok
}

// summarize counts outcomes.
func summarize(got map[string]string) map[string]int {
	out := map[string]int{}
	for _, o := range got {
		if strings.HasPrefix(o, "resolved") {
			o = "resolved"
		}
		out[o]++
	}
	return out
}
