package network

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/useshards/shard/internal/testenv"
	"github.com/vishvananda/netlink"
)

// TestForgetNeighbour: a new sandbox's address loses the bridge's
// neighbour entry an earlier holder left (by its key), and only that one.
func TestForgetNeighbour(t *testing.T) {
	testenv.RequireRoot(t, "a bridge and nftables")
	const br = "shneigh0"
	m := testManager(t, br, "10.94.0.0/24")
	l, err := netlink.LinkByName(br)
	if err != nil {
		t.Fatal(err)
	}
	a, b := netip.MustParseAddr("10.94.0.2"), netip.MustParseAddr("10.94.0.3")
	for i, ip := range []netip.Addr{a, b} {
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_REACHABLE,
			IP: ip.AsSlice(), HardwareAddr: net.HardwareAddr{0x02, 0, 0, 0, 0, byte(i + 1)}}); err != nil {
			t.Fatal(err)
		}
	}
	has := func(ip netip.Addr) bool {
		ns, err := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if x, ok := netip.AddrFromSlice(n.IP); ok && x.Unmap() == ip {
				return true
			}
		}
		return false
	}
	if !has(a) || !has(b) {
		t.Fatal("the test's neighbour entries are not there")
	}
	m.forgetNeighbour(a)
	if has(a) {
		t.Error("the entry of the address was kept")
	}
	if !has(b) {
		t.Error("another address's entry went too")
	}
	m.forgetNeighbour(a) // none: nothing happens
	if !has(b) {
		t.Error("forgetting an absent entry took another")
	}
}

// TestSandboxNeighbourIsPermanent: the host never has to ask (an ARP
// broadcast to every sandbox) for a sandbox's MAC: Create sets it for the
// address, Delete takes it away.
func TestSandboxNeighbourIsPermanent(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, a bridge and nftables")
	const br = "shneigh1"
	ctx := context.Background()
	m := testManager(t, br, "10.94.1.0/24", hostVeth("neigh-a"))
	l, err := netlink.LinkByName(br)
	if err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("10.94.1.2")
	entry := func() *netlink.Neigh {
		ns, err := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if x, ok := netip.AddrFromSlice(n.IP); ok && x.Unmap() == ip {
				return &n
			}
		}
		return nil
	}
	// A stale entry of an earlier holder of the address.
	if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_STALE,
		IP: ip.AsSlice(), HardwareAddr: net.HardwareAddr{0x02, 0, 0, 0, 0, 9}}); err != nil {
		t.Fatal(err)
	}
	ns, err := m.Create(ctx, "neigh-a", ip)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Delete("neigh-a") })
	mac := eth0(t, ns).HardwareAddr
	n := entry()
	if n == nil || n.State != netlink.NUD_PERMANENT || n.HardwareAddr.String() != mac.String() {
		t.Fatalf("the bridge's entry for %s = %+v, want permanent at eth0's %s", ip, n, mac)
	}
	if err := m.Delete("neigh-a"); err != nil {
		t.Fatal(err)
	}
	if n := entry(); n != nil {
		t.Errorf("the entry outlived the sandbox: %+v", n)
	}
}

// testManager makes a Manager on a bridge of its own for a root test:
// leftovers of an interrupted run (the bridge and links) go first, and the
// bridge, its tables and ip_forward are put back at the end.
func testManager(t *testing.T, br, subnet string, links ...string) *Manager {
	t.Helper()
	for _, l := range append([]string{br}, links...) {
		delLink(l)
	}
	fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	t.Cleanup(func() {
		if len(fwd) > 0 {
			os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644)
		}
	})
	t.Cleanup(func() { delTables(br); delLink(br) })
	m, err := New(context.Background(), Config{Bridge: br, Subnet: netip.MustParsePrefix(subnet), NetnsDir: filepath.Join(t.TempDir(), "netns"),
		Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}
