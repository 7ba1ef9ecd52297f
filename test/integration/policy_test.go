package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
)

// The policy tests' world: a network namespace of the test's own, reached
// from the host over a veth, with an HTTP server on two addresses and a DNS
// server that knows two names. Nothing else is ever a target.
const (
	targetNS   = "shardit-tgt"
	targetHost = "198.18.251.1"
	allowedIP  = "198.18.251.2"
	deniedIP   = "198.18.251.3"
)

// inNetns runs fn on a thread inside the named namespace (sockets made
// there stay there).
func inNetns(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		ns, err := netns.GetFromName(name)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// testHost makes a network namespace of the test's own, name, reached from
// the host over a veth (host side: veth with hostIP/24; inside: eth0 with
// nsIPs/24), removed when the test ends. Sandboxes reach it through their
// NAT; it is the only kind of outside host the tests talk to.
func testHost(t testing.TB, name, veth, hostIP string, nsIPs ...string) {
	t.Helper()
	run := func(args ...string) {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
	}
	remove := func() {
		exec.Command("ip", "link", "del", veth).Run()
		exec.Command("ip", "netns", "del", name).Run()
	}
	remove() // a killed run's
	run("ip", "netns", "add", name)
	t.Cleanup(remove)
	run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
	run("ip", "addr", "add", hostIP+"/24", "dev", veth)
	run("ip", "link", "set", veth, "up")
	for _, ip := range nsIPs {
		run("ip", "-n", name, "addr", "add", ip+"/24", "dev", "eth0")
	}
	run("ip", "-n", name, "link", "set", "eth0", "up")
	run("ip", "-n", name, "link", "set", "lo", "up")
}

func setupTarget(t testing.TB) {
	t.Helper()
	testHost(t, targetNS, "vshtgt", targetHost, allowedIP, deniedIP)
	var ln net.Listener
	var pc net.PacketConn
	err := inNetns(targetNS, func() error {
		var err error
		if ln, err = net.Listen("tcp", "0.0.0.0:8000"); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", allowedIP+":53")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "target %s\n", r.Context().Value(http.LocalAddrContextKey))
	})}
	go srv.Serve(ln)
	go serveDNS(pc, map[string]string{"allowed.test.": allowedIP, "denied.test.": deniedIP})
	t.Cleanup(func() { srv.Close(); pc.Close() })
}

// serveDNS answers A queries for names, NXDOMAIN for the rest.
func serveDNS(pc net.PacketConn, names map[string]string) {
	buf := make([]byte, 1500)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionAvailable: true})
		b.EnableCompression()
		b.StartQuestions()
		b.Question(q)
		ip, ok := names[strings.ToLower(q.Name.String())]
		if ok && q.Type == dnsmessage.TypeA {
			b.StartAnswers()
			a := net.ParseIP(ip).To4()
			b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: [4]byte(a)})
		} else if !ok {
			b = dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RCode: dnsmessage.RCodeNameError})
			b.StartQuestions()
			b.Question(q)
		}
		msg, err := b.Finish()
		if err == nil {
			pc.WriteTo(msg, addr)
		}
	}
}

// reach reports whether sandbox id gets an answer from url (a denied
// connection is rejected at once; the timeout is a backstop).
func reach(t *testing.T, id, url string) bool {
	t.Helper()
	// Python's client, not busybox wget: Debian's static busybox crashes in
	// getaddrinfo (static glibc and NSS).
	res, err := need(t).c.Exec(ctxT(t), id, client.ExecRequest{Argv: []string{"python3", "-c",
		"import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode(), end='')", url}})
	if err != nil {
		t.Fatalf("exec wget in %s: %v", id, err)
	}
	ok := res.ExitCode == 0 && strings.HasPrefix(string(res.Stdout), "target ")
	if !ok {
		t.Logf("%s from %s: exit %d %s %s", url, id, res.ExitCode, res.Stdout, res.Stderr)
	}
	return ok
}

// TestPolicy: from inside a sandbox, allowed targets answer and denied ones
// do not, by address and by domain (through the server's DNS proxy); the
// same after a fork; a live change takes effect; other sandboxes are not
// touched.
func TestPolicy(t *testing.T) {
	e := need(t)
	setupTarget(t)
	restartWith(t, "--dns-upstream", allowedIP+":53")
	sb := create(t, client.CreateRequest{Image: python, Name: "policy-src"})
	other := create(t, client.CreateRequest{Image: python, Name: "policy-other"})
	allowedURL := "http://" + allowedIP + ":8000/"
	deniedURL := "http://" + deniedIP + ":8000/"
	if !reach(t, sb.ID, allowedURL) || !reach(t, sb.ID, deniedURL) || !reach(t, sb.ID, "http://allowed.test:8000/") {
		t.Fatal("without a policy, the targets do not answer")
	}
	if _, err := e.c.SetPolicy(ctxT(t), sb.ID, client.Policy{DenyAll: true}); err != nil {
		t.Fatal(err)
	}
	if reach(t, sb.ID, allowedURL) {
		t.Fatal("deny-all let a connection out")
	}
	if !reach(t, other.ID, allowedURL) {
		t.Fatal("another sandbox's policy reached this one")
	}
	if _, err := e.c.SetPolicy(ctxT(t), sb.ID, client.Policy{Allow: []string{"allowed.test"}}); err != nil {
		t.Fatal(err)
	}
	if !reach(t, sb.ID, "http://allowed.test:8000/") {
		t.Fatal("an allowed domain does not answer")
	}
	if reach(t, sb.ID, deniedURL) || reach(t, sb.ID, "http://denied.test:8000/") {
		t.Fatal("what the policy does not allow answered")
	}
	p, err := e.c.GetPolicy(ctxT(t), sb.ID)
	if err != nil || len(p.Allow) != 1 || p.Allow[0] != "allowed.test" {
		t.Fatalf("policy show: %+v %v", p, err)
	}

	f, err := e.c.Fork(ctxT(t), sb.ID, client.ForkRequest{Name: "policy-fork"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })
	if f.Policy == nil || f.IP == sb.IP {
		t.Fatalf("fork: policy %+v, address %s (source %s)", f.Policy, f.IP, sb.IP)
	}
	if !reach(t, f.ID, "http://allowed.test:8000/") || reach(t, f.ID, deniedURL) {
		t.Fatal("the fork does not keep the source's policy")
	}
	// A live change on the source: now the other address, by CIDR.
	if _, err := e.c.SetPolicy(ctxT(t), sb.ID, client.Policy{Allow: []string{deniedIP + "/32"}}); err != nil {
		t.Fatal(err)
	}
	if !reach(t, sb.ID, deniedURL) {
		t.Fatal("a live policy change did not take effect")
	}
	if reach(t, f.ID, deniedURL) {
		t.Fatal("the source's change reached its fork")
	}
	_, err = e.c.SetPolicy(ctxT(t), sb.ID, client.Policy{Allow: []string{"exa mple"}})
	wantCode(t, "a bad entry", err, 400, "invalid_argument", "exa mple")
	if err := e.c.ClearPolicy(ctxT(t), sb.ID); err != nil {
		t.Fatal(err)
	}
	if !reach(t, sb.ID, allowedURL) || !reach(t, sb.ID, deniedURL) {
		t.Fatal("after clear, egress is not open again")
	}
	// Stop and start: the fork's policy holds.
	e.c.Stop(ctxT(t), f.ID)
	if _, err := e.c.Start(ctxT(t), f.ID); err != nil {
		t.Fatal(err)
	}
	if reach(t, f.ID, deniedURL) {
		t.Fatal("the fork's policy did not hold across stop and start")
	}
}
