package network

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/testenv"
	"github.com/vishvananda/netlink"
)

// TestLinksTakeTheMTU: a bridge left at 1500 by an older server is raised
// to the configured MTU, and a sandbox's links (both ends) get it too.
func TestLinksTakeTheMTU(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, a bridge and nftables")
	const br = "shmtu1"
	delLink(br)
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU = br, 1500
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
		t.Fatal(err)
	}
	m := testManager(t, br, "10.94.2.0/24", hostVeth("mtu-a"))
	ns, err := m.Create(context.Background(), "mtu-a", netip.MustParseAddr("10.94.2.2"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Delete("mtu-a") })
	mtu := func(name string) int {
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().MTU
	}
	if got := mtu(br); got != DefaultMTU {
		t.Errorf("bridge MTU %d, want %d", got, DefaultMTU)
	}
	if got := mtu(hostVeth("mtu-a")); got != DefaultMTU {
		t.Errorf("host end MTU %d, want %d", got, DefaultMTU)
	}
	inside := eth0(t, ns).MTU
	if inside != DefaultMTU {
		t.Errorf("the sandbox's eth0 MTU %d, want %d", inside, DefaultMTU)
	}
}

func TestMTUBounds(t *testing.T) {
	for _, mtu := range []int{MinMTU - 1, MaxMTU + 1, -5} {
		_, err := New(context.Background(), Config{Bridge: "unused0", MTU: mtu, NetnsDir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), "MTU") {
			t.Errorf("MTU %d: err %v, want it refused", mtu, err)
		}
	}
}
