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
		{"a.example.", []string{"fd12::1"}, true},
		{"a.example.", []string{"2001:db8::1"}, false},
	} {
		_, why := m.boundaryAnswer(answerWith(t, "a.example.", tc.owner, tc.addrs...))
		if (why != "") != tc.refused {
			t.Errorf("%v owned by %s: refused %q, want refused %v", tc.addrs, tc.owner, why, tc.refused)
		}
	}
}
