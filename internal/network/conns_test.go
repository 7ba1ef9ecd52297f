package network

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/useshards/shard/internal/testenv"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestPlanConnLimits(t *testing.T) {
	for _, tc := range []struct {
		name        string
		per, max    int
		want        ConnLimits
		notes       int
		errContains string
	}{
		{name: "default on the usual table", per: 4096, max: 262144,
			want: ConnLimits{PerSandbox: 4096, Rate: 256, Burst: 512, TotalRate: 4096, TimeWait: 5 * time.Second, HoldAt: 196608, OpenAt: 131072, TableMax: 262144, HoldShare: 256}},
		{name: "lowered to a sixteenth", per: 100000, max: 262144, notes: 1,
			want: ConnLimits{PerSandbox: 16384, Rate: 256, Burst: 512, TotalRate: 4096, TimeWait: 5 * time.Second, HoldAt: 196608, OpenAt: 131072, TableMax: 262144, HoldShare: 256}},
		{name: "small limit: burst no larger", per: 100, max: 65536,
			want: ConnLimits{PerSandbox: 100, Rate: 256, Burst: 100, TotalRate: 1024, TimeWait: 5 * time.Second, HoldAt: 49152, OpenAt: 32768, TableMax: 65536, HoldShare: 64}},
		{name: "tiny table: rates lowered", per: 16, max: 4096,
			want: ConnLimits{PerSandbox: 16, Rate: 64, Burst: 16, TotalRate: 64, TimeWait: 5 * time.Second, HoldAt: 3072, OpenAt: 2048, TableMax: 4096, HoldShare: 16}},
		{name: "unknown table", per: 4096, max: 0, notes: 1,
			want: ConnLimits{PerSandbox: 4096, Rate: 256, Burst: 512, TotalRate: 4096, TimeWait: 5 * time.Second, HoldAt: 196608, OpenAt: 131072, TableMax: 262144, HoldShare: 256}},
		{name: "zero refused", per: 0, max: 262144, errContains: "give 16 or more"},
		{name: "too few refused", per: 15, max: 262144, errContains: MaxConnectionsFlag},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, notes, err := PlanConnLimits(tc.per, tc.max)
			if tc.errContains != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errContains) {
					t.Fatalf("err %v, want one with %q", err, tc.errContains)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
			if len(notes) != tc.notes {
				t.Errorf("notes %q, want %d", notes, tc.notes)
			}
			// What sandboxes may hold together stays below the table.
			if got.HoldAt+got.TotalRate*int(got.TimeWait/time.Second) >= got.TableMax {
				t.Errorf("hold %d plus closed flows reach the table's %d", got.HoldAt, got.TableMax)
			}
		})
	}
}

func TestRefusalDeltas(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.88.0.2"), netip.MustParseAddr("10.88.0.3"), netip.MustParseAddr("10.88.0.4")
	for _, tc := range []struct {
		name      string
		last, now map[netip.Addr]uint64
		want      []Refusal
	}{
		{"nothing", nil, nil, nil},
		{"first look", nil, map[netip.Addr]uint64{a: 5}, []Refusal{{a, 5}}},
		{"unchanged", map[netip.Addr]uint64{a: 5}, map[netip.Addr]uint64{a: 5}, nil},
		{"grew", map[netip.Addr]uint64{a: 5, b: 1}, map[netip.Addr]uint64{a: 9, b: 1, c: 2}, []Refusal{{a, 4}, {c, 2}}},
		{"went and came back", map[netip.Addr]uint64{a: 50}, map[netip.Addr]uint64{a: 3}, []Refusal{{a, 3}}},
		{"gone", map[netip.Addr]uint64{a: 50}, map[netip.Addr]uint64{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refusalDeltas(tc.last, tc.now); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTCPTimeouts(t *testing.T) {
	p := tcpTimeouts(ConnLimits{TimeWait: 5 * time.Second})
	if len(p) != 11 {
		t.Fatalf("%d states, want all 11", len(p))
	}
	for _, st := range []uint16{6, 7} { // TIME_WAIT, CLOSE
		if p[st] != 5 {
			t.Errorf("state %d: %d s, want 5", st, p[st])
		}
	}
	if p[2] != 432000 {
		t.Errorf("established: %d s, want the kernel's 432000", p[2])
	}
}

// Names and addresses of the connection test; nothing else uses them.
const ctBridge = "shctt0"

var (
	ctSubnet = netip.MustParsePrefix("10.94.0.0/24")
	ctA      = netip.MustParseAddr("10.94.0.2")
	ctB      = netip.MustParseAddr("10.94.0.3")
)

// TestConnectionBounds: a sandbox holds at most PerSandbox flows (the rest
// are refused at once, and counted for its address); a neighbour's flows
// are not touched; queries to the DNS proxy over UDP leave no entry in
// the host's table; nft still lists the table.
func TestConnectionBounds(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, a bridge and nftables")
	for _, l := range []string{ctBridge, ptTargetVet, hostVeth("ctt-a"), hostVeth("ctt-b")} {
		delLink(l)
	}
	t.Cleanup(func() { delTables(ctBridge); delLink(ctBridge) })
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	lim, _, err := PlanConnLimits(16, 262144)
	if err != nil {
		t.Fatal(err)
	}
	lim.HoldShare = 8  // below PerSandbox: what the hold refuses, the count does not
	lim.TotalRate = 64 // small: a flood that spent it would show
	m, err := New(ctx, Config{Bridge: ctBridge, Subnet: ctSubnet, NetnsDir: filepath.Join(dir, "netns"), Conns: lim, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	if err := m.Open(); err != nil {
		t.Fatal(err)
	}
	nsA, err := m.Create(ctx, "ctt-a", ctA)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Delete("ctt-a") })
	nsB, err := m.Create(ctx, "ctt-b", ctB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Delete("ctt-b") })
	serveTarget(t, makeTarget(t, m, dir))
	if err := m.StartDNS(ctx, []string{"198.18.94.2"}); err != nil {
		t.Fatal(err)
	}

	// hold opens n connections from ns and keeps them until the test ends.
	hold := func(ns string, n int) (ok, refused int) {
		t.Helper()
		if err := inNetns(ns, func() error {
			for range n {
				c, err := net.DialTimeout("tcp4", "198.18.94.2:8080", 2*time.Second)
				if err != nil {
					if !strings.Contains(err.Error(), "refused") {
						t.Errorf("dial %d: %v, want refused at once", ok+refused, err)
					}
					refused++
					continue
				}
				ok++
				t.Cleanup(func() { c.Close() })
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return ok, refused
	}
	ok, refused := hold(nsA, 40)
	if ok != lim.PerSandbox || refused != 40-lim.PerSandbox {
		t.Fatalf("A: %d connected, %d refused; want %d and %d", ok, refused, lim.PerSandbox, 40-lim.PerSandbox)
	}
	if n := entriesFrom(t, ctA); n > lim.PerSandbox {
		t.Errorf("A holds %d entries in the host's table, want at most %d", n, lim.PerSandbox)
	}
	if ok, refused := hold(nsB, 5); ok != 5 || refused != 0 {
		t.Errorf("B, a neighbour: %d connected, %d refused; want all 5 through", ok, refused)
	}
	got, err := m.fw.refusals()
	if err != nil {
		t.Fatal(err)
	}
	if got[ctA] < uint64(40-lim.PerSandbox) || got[ctB] != 0 {
		t.Errorf("refusals %v, want at least %d for A and none for B", got, 40-lim.PerSandbox)
	}

	// The watch reports the refusals once, by address.
	reports := make(chan []Refusal, 4)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go m.WatchConnections(wctx, 50*time.Millisecond, func(r []Refusal) { reports <- r })
	select {
	case r := <-reports:
		if len(r) != 1 || r[0].Addr != ctA || r[0].Refused < uint64(40-lim.PerSandbox) {
			t.Errorf("report %v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no report of the refusals")
	}
	select {
	case r := <-reports:
		t.Errorf("a second report with nothing new: %v", r)
	case <-time.After(200 * time.Millisecond):
	}
	wcancel()

	// Queries to the proxy from many source ports: answered, untracked.
	gw := netip.AddrPortFrom(m.Gateway(), 53).String()
	if err := inNetns(nsB, func() error {
		for range 50 {
			if _, _, err := queryA("udp", gw, "allowed.test"); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("DNS over UDP: %v", err)
	}
	if n := entriesTo(t, ctB, m.Gateway(), unix.IPPROTO_UDP); n != 0 {
		t.Errorf("%d entries of B's UDP queries to the proxy, want none", n)
	}

	// nft lists what the library wrote (nft list ruleset must keep
	// working on a host running shard).
	out, err := exec.Command("nft", "list", "table", "ip", ctBridge).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v %s", err, out)
	}
	for _, want := range []string{"ct count over 16", "limit rate over 256/second burst 16 packets", `ct timeout set "sandbox-tcp"`, "notrack"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("nft list lacks %q:\n%s", want, out)
		}
	}

	// The hold refuses the new flows of a sandbox past its share (B holds
	// 5 of its share of 8: 3 more pass, then it is refused, though its own
	// bound of 16 is far), and goes.
	if err := m.fw.setHostHold(true); err != nil {
		t.Fatal(err)
	}
	if err := m.fw.setHostHold(true); err != nil { // idempotent
		t.Fatal(err)
	}
	if ok, refused := hold(nsB, 5); ok < 1 || refused < 1 || entriesFrom(t, ctB) > lim.HoldShare {
		t.Errorf("B during the hold: %d connected, %d refused, %d held; want some through, then refusals at its share of %d", ok, refused, entriesFrom(t, ctB), lim.HoldShare)
	}
	if err := m.fw.setHostHold(false); err != nil {
		t.Fatal(err)
	}
	if ok, _ := hold(nsB, 1); ok != 1 {
		t.Error("a new flow refused after the hold went")
	}
	// A flood refused by A's own bounds spends nothing of the bucket all
	// sandboxes share: B's new flows pass meanwhile (a red team's flood of
	// 45k SYNs a second refused 64 of a neighbour's 100 when the shared
	// bucket came first).
	if _, refused := hold(nsA, 300); refused != 300 {
		t.Errorf("A's flood at its bound: %d refused of 300", refused)
	}
	if ok, refused := hold(nsB, 3); ok != 3 {
		t.Errorf("B after A's flood: %d connected, %d refused; want all 3", ok, refused)
	}
	c, _ := nftables.New()
	rules, _ := c.GetRules(m.fw.table, &nftables.Chain{Name: limitsChain, Table: m.fw.table})
	if len(rules) != 5 {
		t.Errorf("limits chain has %d rules after the hold, want 5", len(rules))
	}
}

// entriesFrom counts the host's conntrack entries whose original source
// is ip.
func entriesFrom(t *testing.T, ip netip.Addr) int {
	t.Helper()
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		if a, ok := netip.AddrFromSlice(f.Forward.SrcIP); ok && a.Unmap() == ip {
			n++
		}
	}
	return n
}

// entriesTo counts those from src to dst over proto.
func entriesTo(t *testing.T, src, dst netip.Addr, proto uint8) int {
	t.Helper()
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		s, _ := netip.AddrFromSlice(f.Forward.SrcIP)
		d, _ := netip.AddrFromSlice(f.Forward.DstIP)
		if s.Unmap() == src && d.Unmap() == dst && f.Forward.Protocol == proto {
			n++
		}
	}
	return n
}
