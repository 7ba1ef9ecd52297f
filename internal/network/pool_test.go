package network

import (
	"errors"
	"net/netip"
	"testing"
)

func TestNextFree(t *testing.T) {
	subnet := netip.MustParsePrefix("10.92.0.0/29") // .1 gateway, .2-.6 sandboxes, .7 broadcast
	gw := netip.MustParseAddr("10.92.0.1")
	used := map[string]bool{}
	in := func(ip string) bool { return used[ip] }
	next := func(last string) string {
		t.Helper()
		var l netip.Addr
		if last != "" {
			l = netip.MustParseAddr(last)
		}
		ip, err := nextFree(subnet, gw, l, in)
		if err != nil {
			t.Fatalf("nextFree after %q: %v", last, err)
		}
		return ip.String()
	}
	for _, c := range []struct{ last, want string }{
		{"", "10.92.0.2"},          // a fresh server starts at the bottom
		{"10.92.0.2", "10.92.0.3"}, // round robin
		{"10.92.0.6", "10.92.0.2"}, // past the last: around, never .7
		{"10.92.9.9", "10.92.0.2"}, // a last outside the subnet
	} {
		if got := next(c.last); got != c.want {
			t.Errorf("nextFree after %q = %s, want %s", c.last, got, c.want)
		}
	}
	used["10.92.0.3"], used["10.92.0.4"] = true, true
	if got := next("10.92.0.2"); got != "10.92.0.5" {
		t.Errorf("nextFree past used ones = %s, want 10.92.0.5", got)
	}
	used["10.92.0.2"], used["10.92.0.5"], used["10.92.0.6"] = true, true, true
	if ip, err := nextFree(subnet, gw, netip.MustParseAddr("10.92.0.2"), in); err == nil {
		t.Errorf("nextFree in a full subnet = %s, want an error", ip)
	}
}

// A pool hands out each address once: to a record (Take), or held by a
// reservation until it is released or claimed; admit is asked first.
func TestPool(t *testing.T) {
	subnet := netip.MustParsePrefix("10.92.0.0/29")
	records := map[string]bool{}
	var limit error
	p := NewPool(subnet, netip.MustParseAddr("10.92.0.1"), func(ip string) bool { return records[ip] }, func() error { return limit })
	take := func() (string, error) {
		var got string
		err := p.Take(func(ip netip.Addr) error { got = ip.String(); records[got] = true; return nil })
		return got, err
	}
	if ip, err := take(); err != nil || ip != "10.92.0.2" {
		t.Fatalf("Take = %s, %v; want 10.92.0.2", ip, err)
	}
	res, err := p.Reserve()
	if err != nil || res.String() != "10.92.0.3" {
		t.Fatalf("Reserve = %s, %v; want 10.92.0.3", res, err)
	}
	// A claim that fails leaves the address free.
	if err := p.Take(func(netip.Addr) error { return errors.New("no record") }); err == nil {
		t.Fatal("Take with a failing claim: no error")
	}
	if ip, _ := take(); ip != "10.92.0.5" { // .4 was tried and left free; round robin goes on
		t.Errorf("Take after a failed claim = %s, want 10.92.0.5", ip)
	}
	if ip, _ := take(); ip != "10.92.0.6" {
		t.Errorf("Take = %s, want 10.92.0.6", ip)
	}
	if ip, _ := take(); ip != "10.92.0.4" { // around, past the reserved .3
		t.Errorf("Take around = %s, want 10.92.0.4", ip)
	}
	if ip, err := take(); err == nil {
		t.Errorf("Take in a full pool = %s, want no_addresses", ip)
	}
	limit = errors.New("limit")
	if err := p.Claim(res.String(), func() error { records[res.String()] = true; return nil }); err != limit {
		t.Errorf("Claim past the limit = %v, want the limit's error", err)
	}
	limit = nil
	if err := p.Claim(res.String(), func() error { records[res.String()] = true; return nil }); err != nil {
		t.Errorf("Claim = %v", err)
	}
	delete(records, res.String())
	if ip, err := take(); err != nil || ip != res.String() {
		t.Errorf("Take after the claim's record went = %s, %v; want %s (no reservation left)", ip, err, res)
	}
}
