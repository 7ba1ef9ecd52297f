package sandbox

import (
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
