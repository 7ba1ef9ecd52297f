package network

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func TestPolicyValidate(t *testing.T) {
	for _, tc := range []struct {
		name      string
		in        Policy
		wantAllow []string
		wantDeny  []string
		wantErr   string
	}{
		{name: "empty", in: Policy{}},
		{name: "normalises", in: Policy{
			Allow: []string{" Example.ORG. ", "*.Foo.example.", "10.1.2.3", "10.1.2.3/24", "10.1.2.3/32", "::ffff:10.9.9.9", "_srv.x-y.test"},
			Deny:  []string{"BAD.example.org", ".leading.dot"},
		},
			wantAllow: []string{"example.org", "*.foo.example", "10.1.2.3", "10.1.2.0/24", "10.9.9.9", "_srv.x-y.test"},
			wantDeny:  []string{"bad.example.org", "leading.dot"}},
		{name: "dedupes", in: Policy{Allow: []string{"a.test", "A.test.", "1.2.3.4", "1.2.3.4/32"}},
			wantAllow: []string{"a.test", "1.2.3.4"}},
		{name: "space in name", in: Policy{Allow: []string{"exa mple"}}, wantErr: `allow: "exa mple" is not an IP, a CIDR or a domain name`},
		{name: "bad deny", in: Policy{Deny: []string{"ok.test", "a..b"}}, wantErr: `deny: "a..b" is not an IP, a CIDR or a domain name`},
		{name: "empty entry", in: Policy{Allow: []string{" "}}, wantErr: "empty"},
		{name: "bad cidr", in: Policy{Allow: []string{"10.0.0.0/33"}}, wantErr: `"10.0.0.0/33" is not an IP`},
		{name: "broken address", in: Policy{Allow: []string{"10.0.0.256"}}, wantErr: `"10.0.0.256" is not an IP`},
		{name: "ipv6", in: Policy{Allow: []string{"2001:db8::1"}}, wantErr: "IPv6"},
		{name: "ipv6 cidr", in: Policy{Deny: []string{"2001:db8::/32"}}, wantErr: "IPv6"},
		{name: "star", in: Policy{Deny: []string{"*"}}, wantErr: "deny_all"},
		{name: "star in middle", in: Policy{Deny: []string{"a.*.test"}}, wantErr: "is not an IP"},
		{name: "hyphen edge", in: Policy{Deny: []string{"-a.test"}}, wantErr: "is not an IP"},
		{name: "long label", in: Policy{Deny: []string{strings.Repeat("a", 64) + ".test"}}, wantErr: "is not an IP"},
		{name: "url", in: Policy{Allow: []string{"https://example.org"}}, wantErr: "is not an IP"},
		{name: "too many", in: Policy{Allow: make([]string, maxPolicyEntries+1)}, wantErr: "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.in
			err := p.Validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate() = %v", err)
			}
			if !reflect.DeepEqual(p.Allow, tc.wantAllow) || !reflect.DeepEqual(p.Deny, tc.wantDeny) {
				t.Fatalf("got allow %q deny %q, want %q %q", p.Allow, p.Deny, tc.wantAllow, tc.wantDeny)
			}
		})
	}
}

func TestPolicyEmpty(t *testing.T) {
	for _, tc := range []struct {
		p    *Policy
		want bool
	}{
		{nil, true},
		{&Policy{}, true},
		{&Policy{Allow: []string{}}, true},
		{&Policy{DenyAll: true}, false},
		{&Policy{Allow: []string{"a.test"}}, false},
		{&Policy{Deny: []string{"1.2.3.4"}}, false},
	} {
		if got := tc.p.Empty(); got != tc.want {
			t.Errorf("%+v.Empty() = %v, want %v", tc.p, got, tc.want)
		}
	}
}

func TestDomainMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, name string
		want          bool
	}{
		{"example.org", "example.org", true},
		{"example.org", "www.example.org", true},
		{"example.org", "a.b.example.org", true},
		{"example.org", "badexample.org", false},
		{"example.org", "example.org.evil", false},
		{"example.org", "org", false},
		{"*.example.org", "example.org", false},
		{"*.example.org", "www.example.org", true},
		{"*.example.org", "a.b.example.org", true},
		{"*.example.org", "xexample.org", false},
		{"test", "allowed.test", true},
	} {
		if got := domainMatch(tc.pattern, tc.name); got != tc.want {
			t.Errorf("domainMatch(%q, %q) = %v, want %v", tc.pattern, tc.name, got, tc.want)
		}
	}
}

func TestPolicyDecide(t *testing.T) {
	ip := netip.MustParseAddr
	for _, tc := range []struct {
		name  string
		p     *Policy
		ip    string
		names []string
		want  bool
	}{
		{"nil allows", nil, "1.2.3.4", nil, true},
		{"empty allows", &Policy{}, "1.2.3.4", nil, true},
		{"deny all", &Policy{DenyAll: true}, "1.2.3.4", nil, false},
		{"deny all, allowed cidr", &Policy{DenyAll: true, Allow: []string{"1.2.3.0/24"}}, "1.2.3.4", nil, true},
		{"allow list implies default deny", &Policy{Allow: []string{"1.2.3.0/24"}}, "1.2.4.1", nil, false},
		{"allow list, inside", &Policy{Allow: []string{"1.2.3.0/24"}}, "1.2.3.255", nil, true},
		{"deny only, elsewhere", &Policy{Deny: []string{"1.2.3.4"}}, "1.2.3.5", nil, true},
		{"deny only, denied", &Policy{Deny: []string{"1.2.3.4"}}, "1.2.3.4", nil, false},
		{"deny wins over allow", &Policy{Allow: []string{"1.2.0.0/16"}, Deny: []string{"1.2.3.0/24"}}, "1.2.3.9", nil, false},
		{"allowed name", &Policy{Allow: []string{"example.org"}}, "9.9.9.9", []string{"www.example.org"}, true},
		{"allowed name, trailing dot and case", &Policy{Allow: []string{"example.org"}}, "9.9.9.9", []string{"WWW.Example.ORG."}, true},
		{"allowed name, address only", &Policy{Allow: []string{"example.org"}}, "9.9.9.9", nil, false},
		{"wildcard does not cover apex", &Policy{Allow: []string{"*.example.org"}}, "9.9.9.9", []string{"example.org"}, false},
		{"denied name over allowed cidr", &Policy{Allow: []string{"9.0.0.0/8"}, Deny: []string{"bad.test"}}, "9.9.9.9", []string{"bad.test"}, false},
		{"denied cidr over allowed name", &Policy{Allow: []string{"ok.test"}, Deny: []string{"9.9.9.0/24"}}, "9.9.9.9", []string{"ok.test"}, false},
		{"one denied name of several", &Policy{Allow: []string{"ok.test"}, Deny: []string{"bad.test"}}, "9.9.9.9", []string{"ok.test", "cdn.bad.test"}, false},
		{"denied name, default allow", &Policy{Deny: []string{"bad.test"}}, "9.9.9.9", []string{"other.test"}, true},
		{"mapped address", &Policy{Allow: []string{"1.2.3.4"}}, "::ffff:1.2.3.4", nil, true},
		{"bad entry ignored", &Policy{Deny: []string{"exa mple"}}, "1.2.3.4", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			names := append([]string(nil), tc.names...)
			if got := tc.p.Decide(ip(tc.ip), names); got != tc.want {
				t.Fatalf("Decide(%s, %q) = %v, want %v", tc.ip, tc.names, got, tc.want)
			}
			if !reflect.DeepEqual(names, tc.names) && tc.names != nil {
				t.Fatalf("Decide changed its argument: %q", names)
			}
		})
	}
}

func TestIntervalElems(t *testing.T) {
	pf := netip.MustParsePrefix
	els := intervalElems([]netip.Prefix{pf("10.0.0.0/24"), pf("10.0.0.5/32"), pf("10.0.1.0/24"), pf("192.168.0.1/32")})
	var got []string
	for _, e := range els {
		s := netip.AddrFrom4([4]byte(e.Key)).String()
		if e.IntervalEnd {
			s = "end " + s
		}
		got = append(got, s)
	}
	want := []string{"10.0.0.0", "end 10.0.2.0", "192.168.0.1", "end 192.168.0.2"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	all := intervalElems([]netip.Prefix{pf("0.0.0.0/0"), pf("1.2.3.4/32")})
	if len(all) != 1 || all[0].IntervalEnd || netip.AddrFrom4([4]byte(all[0].Key)) != netip.IPv4Unspecified() {
		t.Fatalf("0.0.0.0/0: %+v", all)
	}
	top := intervalElems([]netip.Prefix{pf("255.255.255.255/32")})
	if len(top) != 1 {
		t.Fatalf("255.255.255.255/32: %+v", top)
	}
}

func TestClassify(t *testing.T) {
	p := &Policy{Allow: []string{"ok.test"}, Deny: []string{"bad.test"}}
	cp := compilePolicy(p)
	now := time.Now()
	d, a := classify(cp, map[string]time.Time{"ok.test": now.Add(time.Minute), "bad.test": now.Add(30 * time.Second), "old.bad.test": now.Add(-time.Second)}, now)
	if !d.Equal(now.Add(30*time.Second)) || !a.Equal(now.Add(time.Minute)) {
		t.Fatalf("denied until %v, allowed until %v", d.Sub(now), a.Sub(now))
	}
	d, a = classify(cp, map[string]time.Time{"other.test": now.Add(time.Minute)}, now)
	if !d.IsZero() || !a.IsZero() {
		t.Fatalf("unrelated name classified: %v %v", d, a)
	}
}

func buildAnswer(t *testing.T, q string, rcode dnsmessage.RCode, rrs []dnsmessage.Resource) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, Response: true, RCode: rcode})
	b.EnableCompression()
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(q), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	b.StartAnswers()
	for _, r := range rrs {
		var err error
		switch body := r.Body.(type) {
		case *dnsmessage.AResource:
			err = b.AResource(r.Header, *body)
		case *dnsmessage.CNAMEResource:
			err = b.CNAMEResource(r.Header, *body)
		case *dnsmessage.TXTResource:
			err = b.TXTResource(r.Header, *body)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func rrA(name string, ttl uint32, ip string) dnsmessage.Resource {
	return dnsmessage.Resource{Header: dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(name), Class: dnsmessage.ClassINET, TTL: ttl},
		Body: &dnsmessage.AResource{A: netip.MustParseAddr(ip).As4()}}
}

func rrCNAME(name, target string) dnsmessage.Resource {
	return dnsmessage.Resource{Header: dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(name), Class: dnsmessage.ClassINET, TTL: 60},
		Body: &dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(target)}}
}

func TestParseAnswer(t *testing.T) {
	ip := netip.MustParseAddr
	resp := buildAnswer(t, "WWW.Allowed.test.", dnsmessage.RCodeSuccess, []dnsmessage.Resource{
		rrCNAME("www.allowed.test.", "edge.cdn.test."),
		rrCNAME("edge.cdn.test.", "e1.cdn.test."),
		rrA("e1.cdn.test.", 20, "10.0.0.1"),
		rrA("e1.cdn.test.", 300, "10.0.0.2"),
		rrA("unrelated.test.", 300, "10.0.0.3"), // not in the chain: ignored
		{Header: dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName("www.allowed.test."), Class: dnsmessage.ClassINET},
			Body: &dnsmessage.TXTResource{TXT: []string{"x"}}},
	})
	addrs, ttls := parseAnswer(resp)
	wantNames := []string{"e1.cdn.test", "edge.cdn.test", "www.allowed.test"}
	if len(addrs) != 2 || !reflect.DeepEqual(addrs[ip("10.0.0.1")], wantNames) || !reflect.DeepEqual(addrs[ip("10.0.0.2")], wantNames) {
		t.Fatalf("addrs = %v", addrs)
	}
	if ttls[ip("10.0.0.1")] != 20*time.Second || ttls[ip("10.0.0.2")] != 300*time.Second {
		t.Fatalf("ttls = %v", ttls)
	}
	if a, _ := parseAnswer(buildAnswer(t, "x.test.", dnsmessage.RCodeNameError, nil)); a != nil {
		t.Fatalf("NXDOMAIN gave %v", a)
	}
	if a, _ := parseAnswer([]byte{1, 2, 3}); a != nil {
		t.Fatalf("garbage gave %v", a)
	}
	r := dnsReply(resp, dnsmessage.RCodeRefused)
	var p dnsmessage.Parser
	h, err := p.Start(r)
	if err != nil || h.ID != 7 || !h.Response || h.RCode != dnsmessage.RCodeRefused {
		t.Fatalf("refusal: %+v %v", h, err)
	}
}

func TestDNSUpstreams(t *testing.T) {
	got, err := dnsUpstreams([]string{"10.0.0.1", "10.0.0.2:5353", "[::1]:53", "::1"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.1:53", "10.0.0.2:5353", "[::1]:53", "[::1]:53"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if _, err := dnsUpstreams([]string{"not a host"}); err == nil {
		t.Fatal("a bad upstream was accepted")
	}
}

func TestIsSandboxAddr(t *testing.T) {
	f := &firewall{subnet: netip.MustParsePrefix("10.93.0.0/24"), gateway: netip.MustParseAddr("10.93.0.1")}
	for s, want := range map[string]bool{"10.93.0.0": false, "10.93.0.1": false, "10.93.0.2": true, "10.93.0.254": true,
		"10.93.0.255": false, "10.94.0.2": false, "::ffff:10.93.0.7": true} {
		if got := f.isSandboxAddr(netip.MustParseAddr(s)); got != want {
			t.Errorf("isSandboxAddr(%s) = %v, want %v", s, got, want)
		}
	}
}
