package network

import (
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

func mustBoundary(t *testing.T, subnet string, opened ...string) *boundary {
	t.Helper()
	var ps []netip.Prefix
	for _, o := range opened {
		ps = append(ps, netip.MustParsePrefix(o))
	}
	b, err := newBoundary(netip.MustParsePrefix(subnet), ps)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBoundaryRefusal(t *testing.T) {
	b := mustBoundary(t, "10.88.0.0/16", "10.20.0.0/16")
	if _, err := b.setHost([]netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("10.20.0.1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.setCluster([]netip.Addr{netip.MustParseAddr("10.20.0.9"), netip.MustParseAddr("::ffff:198.51.100.7")}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr, why, flag string
	}{
		{"169.254.169.254", "link-local", ""},
		{"169.254.0.1", "link-local", ""},
		{"127.0.0.1", "loopback", ""},
		{"0.0.0.0", "unspecified", ""},
		{"224.0.0.251", "multicast", ""},
		{"255.255.255.255", "reserved", ""},
		{"192.0.2.2", "this node", ""},             // the host's own, though in a documentation range
		{"10.20.0.1", "this node", ""},             // the host's own, in an opened range
		{"10.20.0.9", "the cluster", ""},           // etcd or a node, in an opened range
		{"198.51.100.7", "the cluster", ""},        // given IPv4-mapped
		{"::ffff:198.51.100.7", "the cluster", ""}, // asked IPv4-mapped
		{"10.88.0.1", "sandboxes' own network", ""},
		{"10.88.3.4", "sandboxes' own network", ""},
		{"10.1.2.3", "private", AllowPrivateFlag},
		{"172.16.0.1", "private", AllowPrivateFlag},
		{"172.31.255.255", "private", AllowPrivateFlag},
		{"192.168.1.1", "private", AllowPrivateFlag},
		{"100.64.0.1", "private", AllowPrivateFlag},
		{"::ffff:10.1.2.3", "private", AllowPrivateFlag},
		{"64:ff9b::a01:203", "private", AllowPrivateFlag}, // NAT64 of 10.1.2.3
		{"64:ff9b::a9fe:a9fe", "link-local", ""},          // NAT64 of 169.254.169.254
		{"fd00::1", "ULA", ""},
		{"::169.254.169.254", "link-local", ""},            // IPv4-compatible
		{"2002:a9fe:a9fe::1", "link-local", ""},            // 6to4 of 169.254.169.254
		{"2002:0a01:0203::1", "private", AllowPrivateFlag}, // 6to4 of 10.1.2.3
		{"::1", "loopback", ""},
		{"fe80::1", "link-local", ""},
		// Reachable: public, opened private, documentation ranges.
		{"10.20.3.4", "", ""},
		{"8.8.8.8", "", ""},
		{"192.0.2.1", "", ""},
		{"198.51.100.8", "", ""},
		{"203.0.113.80", "", ""},
		{"198.18.0.1", "", ""},
		{"172.32.0.1", "", ""},
		{"100.128.0.1", "", ""},
		{"2001:4860::8888", "", ""},
	} {
		why, flag := b.refusal(netip.MustParseAddr(tc.addr))
		if (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) || flag != tc.flag {
			t.Errorf("%s: refused %q (flag %q); want %q (flag %q)", tc.addr, why, flag, tc.why, tc.flag)
		}
	}
}

func TestBoundarySets(t *testing.T) {
	b := mustBoundary(t, "10.88.0.0/16", "10.20.0.0/16", "192.168.7.0/24")
	nev, priv := b.sets()
	has := func(ps []netip.Prefix, a string) bool {
		for _, p := range ps {
			if p.Contains(netip.MustParseAddr(a)) {
				return true
			}
		}
		return false
	}
	for _, a := range []string{"169.254.169.254", "127.0.0.1", "10.88.0.1", "240.0.0.1"} {
		if !has(nev, a) {
			t.Errorf("never lacks %s: %v", a, nev)
		}
	}
	for _, a := range []string{"10.1.0.1", "172.20.0.1", "192.168.6.1", "100.100.100.100"} {
		if !has(priv, a) {
			t.Errorf("private lacks %s: %v", a, priv)
		}
	}
	for _, a := range []string{"10.20.0.1", "192.168.7.9", "8.8.8.8", "203.0.113.80"} {
		if has(priv, a) || has(nev, a) {
			t.Errorf("%s is refused: never %v private %v", a, nev, priv)
		}
	}
	changed, err := b.setCluster([]netip.Addr{netip.MustParseAddr("10.20.0.9")})
	if err != nil || !changed {
		t.Fatalf("setCluster: changed %v, %v", changed, err)
	}
	if changed, _ := b.setCluster([]netip.Addr{netip.MustParseAddr("10.20.0.9")}); changed {
		t.Error("the same addresses again: changed")
	}
	if nev, _ := b.sets(); !has(nev, "10.20.0.9") {
		t.Errorf("a cluster address is not in never: %v", nev)
	}
	b.setCluster(nil)
	if nev, _ := b.sets(); has(nev, "10.20.0.9") {
		t.Errorf("a cluster address that left is still in never: %v", nev)
	}
}

func TestBoundaryOpenedInsideSubnet(t *testing.T) {
	if _, err := newBoundary(netip.MustParsePrefix("10.88.0.0/16"), []netip.Prefix{netip.MustParsePrefix("10.88.1.0/24")}); err == nil || !strings.Contains(err.Error(), "would open nothing") {
		t.Fatalf("a range inside the sandbox network: %v", err)
	}
	if _, err := newBoundary(netip.MustParsePrefix("10.88.0.0/16"), []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}); err != nil {
		t.Fatalf("a range holding the sandbox network: %v", err)
	}
}

func TestCheckAllowPrivate(t *testing.T) {
	for _, tc := range []struct {
		in, err string
	}{
		{"10.0.0.0/8", ""},
		{"10.1.2.3/32", ""},
		{"172.16.0.0/12", ""},
		{"192.168.0.0/24", ""},
		{"100.64.0.0/10", ""},
		{"169.254.0.0/16", "link-local"},
		{"127.0.0.0/8", "loopback"},
		{"0.0.0.0/0", "no sandbox reaches"},
		{"10.0.0.0/7", "give ranges inside"},
		{"8.8.8.0/24", "give ranges inside"},
		{"fd00::/8", "IPv4"},
	} {
		err := CheckAllowPrivate([]netip.Prefix{netip.MustParsePrefix(tc.in)})
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %v, want %q", tc.in, err, tc.err)
		}
	}
}

func TestCheckPolicy(t *testing.T) {
	m := &Manager{bound: mustBoundary(t, "10.88.0.0/16", "10.20.0.0/16")}
	m.bound.setCluster([]netip.Addr{netip.MustParseAddr("10.20.0.9")})
	for _, tc := range []struct {
		p   Policy
		err string
	}{
		{Policy{Allow: []string{"8.8.8.8", "example.org", "0.0.0.0/0"}}, ""},
		{Policy{Allow: []string{"10.20.1.0/24"}}, ""}, // opened
		{Policy{Deny: []string{"10.1.2.3", "169.254.169.254"}}, ""},
		{Policy{Allow: []string{"10.1.2.3"}}, "--allow-private-egress 10.1.2.3/32"},
		{Policy{Allow: []string{"192.168.0.0/16"}}, "--allow-private-egress 192.168.0.0/16"},
		{Policy{Allow: []string{"10.0.0.0/8"}}, ""}, // partly opened: that part is what it allows
		{Policy{Allow: []string{"169.254.169.254"}}, "no sandbox reaches it"},
		{Policy{Allow: []string{"10.20.0.9"}}, "the cluster"},
		{Policy{Allow: []string{"10.88.0.5"}}, "own network"},
		{Policy{Allow: []string{"127.0.0.1"}}, "loopback"},
	} {
		err := m.CheckPolicy(&tc.p)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v: %v, want %q", tc.p, err, tc.err)
		}
	}
}

// answerWith is an answer to a query for name with the given A and AAAA
// records, each owned by owner.
func answerWith(t *testing.T, name, owner string, addrs ...string) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, Response: true, RecursionAvailable: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	b.StartAnswers()
	for _, s := range addrs {
		a := netip.MustParseAddr(s)
		h := dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(owner), Class: dnsmessage.ClassINET, TTL: 60}
		if a.Is4() {
			b.AResource(h, dnsmessage.AResource{A: a.As4()})
		} else {
			b.AAAAResource(h, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
	}
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestBoundaryAnswer(t *testing.T) {
	m := &Manager{cfg: Config{Log: slog.New(slog.DiscardHandler)}, bound: mustBoundary(t, "10.88.0.0/16")}
	for _, tc := range []struct {
		owner   string
		addrs   []string
		refused bool
	}{
		{"a.example.", []string{"93.184.216.34"}, false},
		{"a.example.", []string{"203.0.113.80", "198.51.100.1"}, false},
		{"a.example.", []string{"93.184.216.34", "10.0.0.5"}, true}, // one bad address spoils the answer
		{"a.example.", []string{"169.254.169.254"}, true},
		{"a.example.", []string{"127.0.0.1"}, true},
		{"a.example.", []string{"10.88.0.1"}, true},
		{"other.example.", []string{"192.168.1.1"}, true}, // whoever owns the record
		{"a.example.", []string{"::ffff:10.0.0.1"}, true},
		{"a.example.", []string{"::169.254.169.254"}, true},
		{"a.example.", []string{"2002:a9fe:a9fe::1"}, true},
		{"a.example.", []string{"fd12::1"}, true},
		{"a.example.", []string{"2001:db8::1"}, false},
	} {
		_, why := m.boundaryAnswer(answerWith(t, "a.example.", tc.owner, tc.addrs...))
		if (why != "") != tc.refused {
			t.Errorf("%v owned by %s: refused %q, want refused %v", tc.addrs, tc.owner, why, tc.refused)
		}
	}

	// Addresses in the other sections, and in SVCB/HTTPS hints.
	build := func(fill func(b *dnsmessage.Builder)) []byte {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, Response: true})
		b.StartQuestions()
		b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("a.example."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		fill(&b)
		out, err := b.Finish()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	h := dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName("ns.example."), Class: dnsmessage.ClassINET, TTL: 60}
	svcb := func(hint [4]byte) dnsmessage.SVCBResource {
		var r dnsmessage.SVCBResource
		r.Priority, r.Target = 1, dnsmessage.MustNewName(".")
		r.SetParam(dnsmessage.SVCParamIPv4Hint, hint[:])
		return r
	}
	for _, tc := range []struct {
		name    string
		msg     []byte
		refused bool
	}{
		{"authority", build(func(b *dnsmessage.Builder) {
			b.StartAuthorities()
			b.AResource(h, dnsmessage.AResource{A: [4]byte{10, 1, 2, 3}})
		}), true},
		{"additional", build(func(b *dnsmessage.Builder) {
			b.StartAdditionals()
			b.AResource(h, dnsmessage.AResource{A: [4]byte{169, 254, 169, 254}})
		}), true},
		{"https ipv4hint", build(func(b *dnsmessage.Builder) {
			b.StartAnswers()
			b.HTTPSResource(h, dnsmessage.HTTPSResource{SVCBResource: svcb([4]byte{192, 168, 0, 1})})
		}), true},
		{"svcb ipv4hint public", build(func(b *dnsmessage.Builder) {
			b.StartAnswers()
			b.SVCBResource(h, svcb([4]byte{93, 184, 216, 34}))
		}), false},
	} {
		if _, why := m.boundaryAnswer(tc.msg); (why != "") != tc.refused {
			t.Errorf("%s: refused %q, want refused %v", tc.name, why, tc.refused)
		}
	}
	// An answer the proxy cannot read to its end: refused (a sandbox's
	// resolver might read what the proxy could not). Here, an A record
	// whose owner is a chain of 11 compression pointers (the parser
	// follows 10), and one cut short.
	good := answerWith(t, "a.example.", "a.example.", "93.184.216.34")
	if _, why := m.boundaryAnswer(good[:len(good)-2]); why != "an answer that does not parse" {
		t.Errorf("an answer cut short: %q", why)
	}
	if _, why := m.boundaryAnswer(pointerChain(t, 3)); !strings.Contains(why, "private") {
		t.Errorf("a private address behind 3 pointers: %q (the message is not well made?)", why)
	}
	if _, why := m.boundaryAnswer(pointerChain(t, 11)); why != "an answer that does not parse" {
		t.Errorf("a private address behind 11 pointers: %q", why)
	}
}

// pointerChain is an answer whose second record, an A record of 10.1.2.3,
// has an owner name reached through n compression pointers in a row; the
// pointers sit in the data of the first record (of a type no parser
// reads).
func pointerChain(t *testing.T, n int) []byte {
	t.Helper()
	msg := []byte{0, 7, 0x81, 0x80, 0, 1, 0, 2, 0, 0, 0, 0} // one question, two answers
	msg = append(msg, 1, 'x', 0, 0, 1, 0, 1)                // x. A IN, at 12
	// Record 1: x. (a pointer to 12), type 65280, IN, TTL 60, the chain.
	msg = append(msg, 0xC0, 12, 0xFF, 0, 0, 1, 0, 0, 0, 60, 0, byte(2*n))
	prev := 12
	for i := 0; i < n; i++ {
		at := len(msg)
		msg = append(msg, 0xC0|byte(prev>>8), byte(prev))
		prev = at
	}
	// Record 2: owner = the last pointer, A, IN, TTL 60, 10.1.2.3.
	return append(msg, 0xC0|byte(prev>>8), byte(prev), 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 1, 2, 3)
}
