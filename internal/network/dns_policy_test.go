package network

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func TestPolicyAllowsName(t *testing.T) {
	type want map[string]bool
	for _, tc := range []struct {
		name   string
		p      *Policy
		limits bool
		names  want
	}{
		{"no policy", nil, false, want{"attacker.example": true, "": true}},
		{"empty policy", &Policy{}, false, want{"attacker.example": true}},
		{"deny-all", &Policy{DenyAll: true}, true, want{
			"attacker.example": false, "secret.attacker.example": false, "example.org": false, "": false, "localhost": false}},
		{"deny-all, allowed cidr only", &Policy{DenyAll: true, Allow: []string{"10.0.0.0/8"}}, true, want{
			"example.org": false, "10.in-addr.arpa": false}},
		{"allow list of addresses only", &Policy{Allow: []string{"1.2.3.4"}}, true, want{"example.org": false}},
		{"allow domain", &Policy{Allow: []string{"example.org"}}, true, want{
			"example.org": true, "www.example.org": true, "a.b.example.org": true, "WWW.Example.ORG.": true,
			"evilexample.org": false, "example.org.attacker.example": false, "org": false, "": false,
			"attacker.example": false, "xexample.org": false}},
		{"deny-all and allow domain", &Policy{DenyAll: true, Allow: []string{"example.org"}}, true, want{
			"www.example.org": true, "attacker.example": false}},
		{"allow wildcard: subdomains only", &Policy{Allow: []string{"*.example.org"}}, true, want{
			"example.org": false, "a.example.org": true, "a.b.example.org": true, "aexample.org": false}},
		{"deny domain only", &Policy{Deny: []string{"foo.com"}}, true, want{
			"foo.com": false, "x.foo.com": false, "FOO.COM.": false, "bar.com": true, "foo.com.bar": true, "xfoo.com": true, "": true}},
		{"deny wildcard only", &Policy{Deny: []string{"*.foo.com"}}, true, want{
			"foo.com": true, "x.foo.com": false}},
		{"deny wins over allow", &Policy{Allow: []string{"example.org"}, Deny: []string{"secret.example.org"}}, true, want{
			"www.example.org": true, "secret.example.org": false, "x.secret.example.org": false}},
		{"deny address only: names unlimited", &Policy{Deny: []string{"169.254.169.254"}}, false, want{
			"attacker.example": true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.p != nil {
				if err := tc.p.Validate(); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.p.Empty() {
				if got := compilePolicy(tc.p).limitsNames(); got != tc.limits {
					t.Errorf("limitsNames() = %v, want %v", got, tc.limits)
				}
			}
			for n, w := range tc.names {
				if got := tc.p.AllowsName(n); got != w {
					t.Errorf("AllowsName(%q) = %v, want %v", n, got, w)
				}
			}
		})
	}
}

// query builds a DNS query: questions qs ("name/type/class" is not needed:
// all A IN unless given), opcode, and an OPT record with size and options
// when size > 0.
type testQuery struct {
	id       uint16
	opcode   dnsmessage.OpCode
	qs       []dnsmessage.Question
	size     int
	do       bool
	options  []dnsmessage.Option
	extraTXT bool // an additional TXT record after the OPT
}

func q1(name string) []dnsmessage.Question {
	return []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}
}

func (tq testQuery) build(t *testing.T) []byte {
	t.Helper()
	id := tq.id
	if id == 0 {
		id = 0x5151
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, OpCode: tq.opcode, RecursionDesired: true, CheckingDisabled: true})
	b.StartQuestions()
	for _, q := range tq.qs {
		if err := b.Question(q); err != nil {
			t.Fatal(err)
		}
	}
	if tq.size > 0 || tq.extraTXT {
		b.StartAdditionals()
	}
	if tq.size > 0 {
		var h dnsmessage.ResourceHeader
		if err := h.SetEDNS0(tq.size, dnsmessage.RCodeSuccess, tq.do); err != nil {
			t.Fatal(err)
		}
		if err := b.OPTResource(h, dnsmessage.OPTResource{Options: tq.options}); err != nil {
			t.Fatal(err)
		}
	}
	if tq.extraTXT {
		if err := b.TXTResource(dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName("smuggled.attacker.example."), Class: dnsmessage.ClassINET},
			dnsmessage.TXTResource{TXT: []string{"the secret"}}); err != nil {
			t.Fatal(err)
		}
	}
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestJudgeQuery(t *testing.T) {
	chaos := []dnsmessage.Question{{Name: dnsmessage.MustNewName("www.example.org."), Type: dnsmessage.TypeTXT, Class: dnsmessage.ClassCHAOS}}
	anyClass := []dnsmessage.Question{{Name: dnsmessage.MustNewName("www.example.org."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassANY}}
	two := append(q1("www.example.org."), q1("secret.attacker.example.")[0])
	twoAllowed := append(q1("www.example.org."), q1("example.org.")[0])
	cookie := []dnsmessage.Option{{Code: 10, Data: []byte("0123456789abcdef")}} // COOKIE, or anything else
	allowExample := &Policy{Allow: []string{"example.org"}}
	denyAll := &Policy{DenyAll: true}
	denyFoo := &Policy{Deny: []string{"foo.com"}}
	for _, tc := range []struct {
		name    string
		p       *Policy
		q       testQuery
		raw     []byte // instead of q
		forward bool
		rcode   dnsmessage.RCode // when not forwarded
	}{
		{name: "no policy: everything", p: nil, q: testQuery{qs: two, opcode: 5, size: 4096, options: cookie, extraTXT: true}, forward: true},
		{name: "no policy: garbage too", p: nil, raw: []byte("0123456789abcdef"), forward: true},
		{name: "deny address only: as is", p: &Policy{Deny: []string{"1.2.3.4"}}, q: testQuery{qs: q1("secret.attacker.example.")}, forward: true},
		{name: "deny-all: nothing", p: denyAll, q: testQuery{qs: q1("secret.attacker.example.")}, rcode: dnsmessage.RCodeRefused},
		{name: "deny-all: root", p: denyAll, q: testQuery{qs: q1(".")}, rcode: dnsmessage.RCodeRefused},
		{name: "allowed name", p: allowExample, q: testQuery{qs: q1("www.example.org.")}, forward: true},
		{name: "allowed apex, mixed case", p: allowExample, q: testQuery{qs: q1("ExAmPlE.OrG.")}, forward: true},
		{name: "name not allowed", p: allowExample, q: testQuery{qs: q1("secret.attacker.example.")}, rcode: dnsmessage.RCodeRefused},
		{name: "allowed name as a label", p: allowExample, q: testQuery{qs: q1("example.org.attacker.example.")}, rcode: dnsmessage.RCodeRefused},
		{name: "suffix without a dot", p: allowExample, q: testQuery{qs: q1("secretexample.org.")}, rcode: dnsmessage.RCodeRefused},
		{name: "two questions, one denied", p: allowExample, q: testQuery{qs: two}, rcode: dnsmessage.RCodeRefused},
		{name: "two questions, both allowed", p: allowExample, q: testQuery{qs: twoAllowed}, rcode: dnsmessage.RCodeRefused},
		{name: "no question", p: allowExample, q: testQuery{}, rcode: dnsmessage.RCodeRefused},
		{name: "chaos class", p: allowExample, q: testQuery{qs: chaos}, rcode: dnsmessage.RCodeRefused},
		{name: "any class", p: allowExample, q: testQuery{qs: anyClass}, rcode: dnsmessage.RCodeRefused},
		{name: "opcode update", p: allowExample, q: testQuery{qs: q1("www.example.org."), opcode: 5}, rcode: dnsmessage.RCodeRefused},
		{name: "opcode notify", p: allowExample, q: testQuery{qs: q1("www.example.org."), opcode: 4}, rcode: dnsmessage.RCodeRefused},
		{name: "garbage", p: allowExample, raw: []byte("0123456789abcdef"), rcode: dnsmessage.RCodeRefused}, // opcode 6
		{name: "bad pointer", p: allowExample, raw: []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0xff, 0, 1, 0, 1}, rcode: dnsmessage.RCodeFormatError},
		{name: "pointer loop", p: allowExample, raw: []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}, rcode: dnsmessage.RCodeFormatError},
		{name: "truncated question", p: allowExample, raw: truncate(testQuery{qs: q1("www.example.org.")}.build(t), 5), rcode: dnsmessage.RCodeFormatError},
		{name: "denied domain", p: denyFoo, q: testQuery{qs: q1("x.foo.com.")}, rcode: dnsmessage.RCodeRefused},
		{name: "not the denied domain", p: denyFoo, q: testQuery{qs: q1("bar.com.")}, forward: true},
		{name: "edns options and extra records dropped", p: allowExample,
			q: testQuery{qs: q1("www.example.org."), size: 65535, do: true, options: cookie, extraTXT: true}, forward: true},
		{name: "small edns size raised", p: allowExample, q: testQuery{qs: q1("www.example.org."), size: 100}, forward: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := tc.raw
			if q == nil {
				q = tc.q.build(t)
			}
			var cp *compiled
			if !tc.p.Empty() {
				if err := tc.p.Validate(); err != nil {
					t.Fatal(err)
				}
				cp = compilePolicy(tc.p)
			}
			fwd, rcode := judgeQuery(cp, q)
			if !tc.forward {
				if fwd != nil || rcode != tc.rcode {
					t.Fatalf("judgeQuery = %x, %v; want not forwarded, %v", fwd, rcode, tc.rcode)
				}
				return
			}
			if fwd == nil || rcode != dnsmessage.RCodeSuccess {
				t.Fatalf("judgeQuery = nil, %v; want forwarded", rcode)
			}
			if cp == nil || !cp.limitsNames() {
				if !bytes.Equal(fwd, q) {
					t.Fatal("a policy that does not limit names changed the query")
				}
				return
			}
			checkRebuilt(t, q, fwd, tc.q)
		})
	}
}

func truncate(b []byte, n int) []byte { return b[:len(b)-n] }

// checkRebuilt checks fwd holds q's ID, flags, its one question and an OPT
// with only its size (clamped) and DO bit: nothing else.
func checkRebuilt(t *testing.T, q, fwd []byte, tq testQuery) {
	t.Helper()
	var p dnsmessage.Parser
	h, err := p.Start(fwd)
	if err != nil {
		t.Fatal(err)
	}
	if h.ID != binary.BigEndian.Uint16(q) || !h.RecursionDesired || !h.CheckingDisabled || h.Response || h.OpCode != 0 {
		t.Fatalf("header %+v", h)
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 || qs[0] != tq.qs[0] {
		t.Fatalf("questions %+v %v, want %+v", qs, err, tq.qs[:1])
	}
	if n, err := p.AllAnswers(); err != nil || len(n) != 0 {
		t.Fatalf("answers %v %v", n, err)
	}
	if n, err := p.AllAuthorities(); err != nil || len(n) != 0 {
		t.Fatalf("authorities %v %v", n, err)
	}
	add, err := p.AllAdditionals()
	if err != nil {
		t.Fatal(err)
	}
	if tq.size == 0 {
		if len(add) != 0 {
			t.Fatalf("additionals %+v, want none", add)
		}
		return
	}
	if len(add) != 1 || add[0].Header.Type != dnsmessage.TypeOPT {
		t.Fatalf("additionals %+v, want one OPT", add)
	}
	wantSize := min(max(tq.size, 512), 4096)
	if int(add[0].Header.Class) != wantSize || add[0].Header.DNSSECAllowed() != tq.do {
		t.Fatalf("OPT size %d DO %v, want %d %v", add[0].Header.Class, add[0].Header.DNSSECAllowed(), wantSize, tq.do)
	}
	if o := add[0].Body.(*dnsmessage.OPTResource); len(o.Options) != 0 {
		t.Fatalf("OPT options %+v forwarded", o.Options)
	}
	if len(fwd) >= len(q) && tq.extraTXT {
		t.Fatalf("the rebuilt query (%d bytes) is no smaller than the sandbox's (%d)", len(fwd), len(q))
	}
}

func TestDNSRefusal(t *testing.T) {
	for _, tc := range []struct {
		name    string
		q       testQuery
		wantEDE bool
	}{
		{"plain", testQuery{qs: q1("secret.attacker.example.")}, false},
		{"edns", testQuery{qs: q1("secret.attacker.example."), size: 1232}, true},
		{"several questions", testQuery{qs: append(q1("a.test."), q1("b.test.")[0])}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dnsRefusal(tc.q.build(t), dnsmessage.RCodeRefused)
			var p dnsmessage.Parser
			h, err := p.Start(r)
			if err != nil || h.ID != 0x5151 || !h.Response || h.RCode != dnsmessage.RCodeRefused {
				t.Fatalf("header %+v %v", h, err)
			}
			qs, err := p.AllQuestions()
			if err != nil || len(qs) != 1 || qs[0] != tc.q.qs[0] {
				t.Fatalf("questions %+v %v", qs, err)
			}
			p.SkipAllAnswers()
			p.SkipAllAuthorities()
			add, err := p.AllAdditionals()
			if err != nil {
				t.Fatal(err)
			}
			if !tc.wantEDE {
				if len(add) != 0 {
					t.Fatalf("additionals %+v", add)
				}
				return
			}
			if len(add) != 1 {
				t.Fatalf("additionals %+v", add)
			}
			o := add[0].Body.(*dnsmessage.OPTResource)
			if len(o.Options) != 1 || o.Options[0].Code != ednsOptionEDE || binary.BigEndian.Uint16(o.Options[0].Data) != edeProhibited ||
				!strings.Contains(string(o.Options[0].Data[2:]), "policy") {
				t.Fatalf("EDE %+v", o.Options)
			}
		})
	}
	if r := dnsRefusal([]byte{1, 2, 3}, dnsmessage.RCodeFormatError); r != nil {
		t.Fatalf("an answer to garbage: %x", r)
	}
}

// countingUpstream is a DNS server on loopback (UDP and TCP) that answers
// NXDOMAIN to everything and counts the questions it was asked, by name.
type countingUpstream struct {
	addr string
	mu   sync.Mutex
	seen map[string]int
	raw  int
}

func startCountingUpstream(t *testing.T) *countingUpstream {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close(); ln.Close() })
	u := &countingUpstream{addr: pc.LocalAddr().String(), seen: map[string]int{}}
	answer := func(q []byte) []byte {
		u.mu.Lock()
		u.raw++
		u.mu.Unlock()
		var p dnsmessage.Parser
		h, err := p.Start(q)
		if err != nil {
			return nil
		}
		qs, _ := p.AllQuestions()
		u.mu.Lock()
		for _, qq := range qs {
			u.seen[strings.ToLower(qq.Name.String())]++
		}
		u.mu.Unlock()
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RCode: dnsmessage.RCodeNameError})
		b.StartQuestions()
		for _, qq := range qs {
			b.Question(qq)
		}
		out, _ := b.Finish()
		return out
	}
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if r := answer(buf[:n]); r != nil {
				pc.WriteTo(r, from)
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
					q, err := readTCPMsg(c)
					if err != nil {
						return
					}
					if r := answer(q); r == nil || writeTCPMsg(c, r) != nil {
						return
					}
				}
			}()
		}
	}()
	return u
}

func (u *countingUpstream) counts() (map[string]int, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	m := map[string]int{}
	for k, v := range u.seen {
		m[k] = v
	}
	return m, u.raw
}

// TestDNSProxyForwardsOnlyAllowed runs the proxy's handler against an
// upstream on loopback that counts what reaches it: names a sandbox's
// policy does not allow never do, over UDP or TCP.
func TestDNSProxyForwardsOnlyAllowed(t *testing.T) {
	up := startCountingUpstream(t)
	subnet := netip.MustParsePrefix("10.93.0.0/24")
	fw := &firewall{subnet: subnet, gateway: netip.MustParseAddr("10.93.0.1"), policies: map[netip.Addr]*compiled{}}
	bound, err := newBoundary(subnet, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{cfg: Config{Log: slog.New(slog.DiscardHandler)}, fw: fw, gateway: fw.gateway, bound: bound}
	d := newDNSProxy(m, []string{up.addr})
	sbs := map[string]*Policy{
		"10.93.0.2": {DenyAll: true},
		"10.93.0.3": {Allow: []string{"example.org"}},
		"10.93.0.4": {Deny: []string{"foo.com"}},
		"10.93.0.5": nil,
		"10.93.0.6": {Allow: []string{"*.example.org"}},
		"10.93.0.7": {DenyAll: true, Allow: []string{"10.0.0.0/8"}},
	}
	for ip, p := range sbs {
		if !p.Empty() {
			fw.policies[netip.MustParseAddr(ip)] = compilePolicy(p)
		}
	}
	for _, tc := range []struct {
		src     string
		q       testQuery
		forward bool
	}{
		{"10.93.0.2", testQuery{qs: q1("s3cr3t.attacker.example.")}, false},
		{"10.93.0.2", testQuery{qs: q1("example.org.")}, false},
		{"10.93.0.7", testQuery{qs: q1("cidr-only.attacker.example.")}, false},
		{"10.93.0.3", testQuery{qs: q1("www.example.org.")}, true},
		{"10.93.0.3", testQuery{qs: q1("example.org.")}, true},
		{"10.93.0.3", testQuery{qs: q1("leak.attacker.example.")}, false},
		{"10.93.0.3", testQuery{qs: append(q1("two.example.org."), q1("multi.attacker.example.")[0])}, false},
		{"10.93.0.3", testQuery{qs: []dnsmessage.Question{{Name: dnsmessage.MustNewName("chaos.example.org."), Type: dnsmessage.TypeTXT, Class: dnsmessage.ClassCHAOS}}}, false},
		{"10.93.0.6", testQuery{qs: q1("example.org.")}, false},
		{"10.93.0.6", testQuery{qs: q1("sub.example.org.")}, true},
		{"10.93.0.4", testQuery{qs: q1("x.foo.com.")}, false},
		{"10.93.0.4", testQuery{qs: q1("bar.com.")}, true},
		{"10.93.0.5", testQuery{qs: q1("anything.attacker.example.")}, true},
		{"10.93.0.1", testQuery{qs: q1("from-gateway.example.org.")}, false}, // not a sandbox
		{"10.94.0.9", testQuery{qs: q1("from-elsewhere.example.org.")}, false},
	} {
		for _, tcp := range []bool{false, true} {
			name := tc.q.qs[len(tc.q.qs)-1].Name.String()
			seenBefore, before := up.counts()
			resp := d.handle(netip.MustParseAddr(tc.src), tc.q.build(t), tcp)
			seen, after := up.counts()
			var p dnsmessage.Parser
			h, err := p.Start(resp)
			if err != nil {
				t.Fatalf("%s from %s (tcp %v): no answer: %v", name, tc.src, tcp, err)
			}
			if tc.forward {
				if after != before+1 || h.RCode != dnsmessage.RCodeNameError {
					t.Errorf("%s from %s (tcp %v): upstream asked %d times, rcode %v; want forwarded once", name, tc.src, tcp, after-before, h.RCode)
				}
				continue
			}
			if after != before || seen[strings.ToLower(name)] != seenBefore[strings.ToLower(name)] {
				t.Errorf("%s from %s (tcp %v) reached the upstream", name, tc.src, tcp)
			}
			if h.RCode != dnsmessage.RCodeRefused {
				t.Errorf("%s from %s (tcp %v): rcode %v, want REFUSED", name, tc.src, tcp, h.RCode)
			}
		}
	}
}

func TestDNSLimiter(t *testing.T) {
	l := dnsLimiter{srcs: map[netip.Addr]*dnsSrc{}}
	a, b := netip.MustParseAddr("10.93.0.2"), netip.MustParseAddr("10.93.0.3")
	now := time.Now()
	n := 0
	for l.admit(a, now) {
		l.done(a)
		n++
		if n > 10*dnsBurstPerSrc {
			break
		}
	}
	if n != dnsBurstPerSrc {
		t.Fatalf("a burst of %d admitted, want %d", n, dnsBurstPerSrc)
	}
	if !l.admit(b, now) {
		t.Fatal("another sandbox was limited by the first one's flood")
	}
	l.done(b)
	if !l.admit(a, now.Add(time.Second/dnsRatePerSrc+time.Millisecond)) {
		t.Fatal("no token back after a refill period")
	}
	l.done(a)
	// In flight: at most dnsInFlightPerSrc at once, whatever the tokens.
	later := now.Add(time.Hour)
	for i := 0; i < dnsInFlightPerSrc; i++ {
		if !l.admit(b, later) {
			t.Fatalf("query %d in flight refused", i)
		}
	}
	if l.admit(b, later) {
		t.Fatal("more than dnsInFlightPerSrc in flight")
	}
	l.done(b)
	if !l.admit(b, later) {
		t.Fatal("a freed place was not given back")
	}
	for i := 0; i < dnsTCPPerSrc; i++ {
		if !l.openTCP(a) {
			t.Fatalf("TCP connection %d refused", i)
		}
	}
	if l.openTCP(a) {
		t.Fatal("more than dnsTCPPerSrc TCP connections")
	}
	l.closeTCP(a)
	if !l.openTCP(a) {
		t.Fatal("a closed TCP connection's place was not given back")
	}
	// Idle entries are swept; busy ones stay.
	for i := 0; i < dnsTCPPerSrc; i++ {
		l.closeTCP(a)
	}
	for i := 0; i < dnsInFlightPerSrc; i++ {
		l.done(b)
	}
	c := netip.MustParseAddr("10.93.0.4")
	l.admit(c, later.Add(2*time.Hour)) // c in flight; a and b idle, their buckets full by then
	if len(l.srcs) != 1 || l.srcs[c] == nil {
		t.Fatalf("after a sweep: %v", l.srcs)
	}
}
