package network

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/useshards/shard/internal/testenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"
)

// Names and addresses of the policy test; nothing else on the host uses them.
const (
	ptBridge    = "shpolt0"
	ptTargetVet = "shpolt-tgt"
	ptSbA       = "polt-a"
	ptSbB       = "polt-b"
)

var (
	ptSubnet = netip.MustParsePrefix("10.93.0.0/24")
	ptA      = netip.MustParseAddr("10.93.0.2")
	ptB      = netip.MustParseAddr("10.93.0.3")
	ptT1     = "198.18.94.2:8080" // allowed.test
	ptT3     = "198.18.94.3:8080" // denied.test
)

// inNetns runs fn on an OS thread in the namespace at path: sockets made
// there belong to that namespace for good.
// eth0 is the attributes of the sandbox's eth0 in the namespace at path.
func eth0(t *testing.T, path string) netlink.LinkAttrs {
	t.Helper()
	var a netlink.LinkAttrs
	if err := inNetns(path, func() error {
		l, err := netlink.LinkByName("eth0")
		if err == nil {
			a = *l.Attrs()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return a
}

func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
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
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("back to the host namespace: %w", err) // the thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// dialFrom connects from the namespace at ns to addr (from local, if
// valid) and reads the target's greeting.
func dialFrom(ns, addr string, local netip.Addr) error {
	return inNetns(ns, func() error {
		d := net.Dialer{Timeout: 1500 * time.Millisecond}
		if local.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: local.AsSlice()}
		}
		c, err := d.Dial("tcp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		if line != "hi\n" {
			return fmt.Errorf("greeting %q", line)
		}
		return nil
	})
}

// resolveFrom asks the proxy on the gateway, from the namespace at ns,
// for name's A records.
func resolveFrom(ns, network, server, name string) (ips []netip.Addr, err error) {
	err = inNetns(ns, func() error {
		rcode, got, err := queryA(network, server, name)
		if err == nil && rcode != dnsmessage.RCodeSuccess {
			err = fmt.Errorf("rcode %v", rcode)
		}
		ips = got
		return err
	})
	return ips, err
}

// queryA sends one A query for name to server over network (udp or tcp).
func queryA(network, server, name string) (dnsmessage.RCode, []netip.Addr, error) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 4242, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, err := b.Finish()
	if err != nil {
		return 0, nil, err
	}
	c, err := net.DialTimeout(network, server, 2*time.Second)
	if err != nil {
		return 0, nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	var resp []byte
	if network == "tcp" {
		if err := writeTCPMsg(c, q); err != nil {
			return 0, nil, err
		}
		if resp, err = readTCPMsg(c); err != nil {
			return 0, nil, err
		}
	} else {
		if _, err := c.Write(q); err != nil {
			return 0, nil, err
		}
		buf := make([]byte, 4096)
		n, err := c.Read(buf)
		if err != nil {
			return 0, nil, err
		}
		resp = buf[:n]
	}
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil {
		return 0, nil, err
	}
	if h.ID != 4242 || !h.Response {
		return 0, nil, fmt.Errorf("answer id %d response %v", h.ID, h.Response)
	}
	p.SkipAllQuestions()
	var out []netip.Addr
	for {
		rh, err := p.AnswerHeader()
		if err != nil {
			break
		}
		if rh.Type != dnsmessage.TypeA {
			p.SkipAnswer()
			continue
		}
		r, err := p.AResource()
		if err != nil {
			return 0, nil, err
		}
		out = append(out, netip.AddrFrom4(r.A))
	}
	return h.RCode, out, nil
}

// serveTarget runs, in the target namespace, a TCP server on :8080 (a
// greeting, then an echo) and a DNS server on 198.18.94.2:53 (UDP and TCP).
func serveTarget(t *testing.T, ns string) {
	var tl, dl net.Listener
	var dp net.PacketConn
	err := inNetns(ns, func() error {
		var err error
		if tl, err = net.Listen("tcp4", ":8080"); err != nil {
			return err
		}
		if dl, err = net.Listen("tcp4", "198.18.94.2:53"); err != nil {
			return err
		}
		dp, err = net.ListenPacket("udp4", "198.18.94.2:53")
		return err
	})
	if err != nil {
		t.Fatalf("target servers: %v", err)
	}
	t.Cleanup(func() { tl.Close(); dl.Close(); dp.Close() })
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte("hi\n"))
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(line))
				}
			}()
		}
	}()
	answer := func(q []byte) []byte {
		var p dnsmessage.Parser
		h, err := p.Start(q)
		if err != nil {
			return nil
		}
		qq, err := p.Question()
		if err != nil {
			return nil
		}
		ips := map[string]string{"allowed.test.": "198.18.94.2", "denied.test.": "198.18.94.3"}
		ip, ok := ips[strings.ToLower(qq.Name.String())]
		rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RCode: dnsmessage.RCodeSuccess}
		if !ok {
			rh.RCode = dnsmessage.RCodeNameError
		}
		b := dnsmessage.NewBuilder(nil, rh)
		b.StartQuestions()
		b.Question(qq)
		if ok && qq.Type == dnsmessage.TypeA {
			b.StartAnswers()
			b.AResource(dnsmessage.ResourceHeader{Name: qq.Name, Class: dnsmessage.ClassINET, TTL: 60},
				dnsmessage.AResource{A: netip.MustParseAddr(ip).As4()})
		}
		out, _ := b.Finish()
		return out
	}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := dp.ReadFrom(buf)
			if err != nil {
				return
			}
			if r := answer(buf[:n]); r != nil {
				dp.WriteTo(r, from)
			}
		}
	}()
	go func() {
		for {
			c, err := dl.Accept()
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
					if writeTCPMsg(c, answer(q)) != nil {
						return
					}
				}
			}()
		}
	}()
}

func delLink(name string) {
	if l, err := netlink.LinkByName(name); err == nil {
		netlink.LinkDel(l)
	}
}

func delTables(name string) {
	c, err := nftables.New()
	if err != nil {
		return
	}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyBridge} {
		t := &nftables.Table{Family: fam, Name: name}
		c.AddTable(t)
		c.DelTable(t)
	}
	c.Flush()
}

// makeTarget makes a namespace standing for the outside world: eth0 with
// 198.18.94.2 and 198.18.94.3, its peer on the host with 198.18.94.1.
func makeTarget(t *testing.T, m *Manager, dir string) string {
	path := filepath.Join(dir, "target")
	if err := m.newNamedNetns(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(path, unix.MNT_DETACH); os.Remove(path) })
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	la := netlink.NewLinkAttrs()
	la.Name = ptTargetVet
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { delLink(ptTargetVet) })
	host, err := netlink.LinkByName(ptTargetVet)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(netlink.AddrAdd(host, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 18, 94, 1), Mask: net.CIDRMask(24, 32)}}))
	must(netlink.LinkSetUp(host))
	h, err := netlink.NewHandleAt(ns)
	must(err)
	defer h.Close()
	lo, err := h.LinkByName("lo")
	must(err)
	must(h.LinkSetUp(lo))
	eth, err := h.LinkByName("eth0")
	must(err)
	for _, last := range []byte{2, 3} {
		must(h.AddrAdd(eth, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 18, 94, last), Mask: net.CIDRMask(24, 32)}}))
	}
	must(h.LinkSetUp(eth))
	must(h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IPv4(198, 18, 94, 1)}))
	return path
}

func TestEgressPolicy(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, a bridge and nftables")

	// Leftovers of an interrupted run.
	for _, l := range []string{ptBridge, ptTargetVet, hostVeth(ptSbA), hostVeth(ptSbB)} {
		delLink(l)
	}
	fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	t.Cleanup(func() {
		if len(fwd) > 0 {
			os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644)
		}
	})
	t.Cleanup(func() { delTables(ptBridge); delLink(ptBridge) })

	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := Config{Bridge: ptBridge, Subnet: ptSubnet, NetnsDir: filepath.Join(dir, "netns"), Log: log}
	m, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	if err := m.Open(); err != nil {
		t.Fatal(err)
	}
	nsA, err := m.Create(ctx, ptSbA, ptA)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Delete(ptSbA) })
	nsB, err := m.Create(ctx, ptSbB, ptB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Delete(ptSbB) })
	target := makeTarget(t, m, dir)
	serveTarget(t, target)
	if err := m.StartDNS(ctx, []string{"198.18.94.2"}); err != nil {
		t.Fatal(err)
	}
	if err := m.StartDNS(ctx, nil); err == nil {
		t.Fatal("a second StartDNS succeeded")
	}
	gw := netip.AddrPortFrom(m.Gateway(), 53).String()

	// reach checks a connection from ns to addr succeeds or not.
	reach := func(who, ns, addr string, want bool) {
		t.Helper()
		start := time.Now()
		err := dialFrom(ns, addr, netip.Addr{})
		if want && err != nil {
			t.Fatalf("%s -> %s: %v, want a connection", who, addr, err)
		}
		if !want && err == nil {
			t.Fatalf("%s -> %s connected, want it blocked", who, addr)
		}
		if !want {
			t.Logf("%s -> %s blocked after %v: %v", who, addr, time.Since(start).Round(time.Millisecond), err)
		}
	}
	// bUnaffected: the second sandbox, without a policy, reaches everything.
	bUnaffected := func() {
		t.Helper()
		reach("B", nsB, ptT1, true)
		reach("B", nsB, ptT3, true)
	}
	set := func(p *Policy) {
		t.Helper()
		if err := m.SetPolicy(ptA, p); err != nil {
			t.Fatalf("SetPolicy(%+v): %v", p, err)
		}
	}
	resolve := func(ns, network, name string, want string) {
		t.Helper()
		ips, err := resolveFrom(ns, network, gw, name)
		if err != nil {
			t.Fatalf("resolve %s over %s: %v", name, network, err)
		}
		if len(ips) != 1 || ips[0].String() != want {
			t.Fatalf("resolve %s: %v, want %s", name, ips, want)
		}
	}
	// refused: the proxy answers a name the policy does not allow REFUSED
	// itself (it never reaches the upstream).
	refused := func(ns, network, name string) {
		t.Helper()
		var rcode dnsmessage.RCode
		err := inNetns(ns, func() (err error) {
			rcode, _, err = queryA(network, gw, name)
			return err
		})
		if err != nil || rcode != dnsmessage.RCodeRefused {
			t.Fatalf("resolve %s over %s: %v %v, want REFUSED", name, network, rcode, err)
		}
	}

	func() {
		t.Log("step: no policy")
		reach("A", nsA, ptT1, true)
		reach("A", nsA, ptT3, true)
		bUnaffected()
	}()
	func() {
		t.Log("step: deny all")
		set(&Policy{DenyAll: true})
		set(&Policy{DenyAll: true}) // idempotent
		reach("A", nsA, ptT1, false)
		reach("A", nsA, ptT3, false)
		bUnaffected()
	}()
	func() {
		t.Log("step: allow cidr")
		set(&Policy{Allow: []string{"198.18.94.0/24"}})
		reach("A", nsA, ptT1, true)
		reach("A", nsA, ptT3, true)
		bUnaffected()
	}()
	func() {
		t.Log("step: allow domain")
		p := &Policy{Allow: []string{"Allowed.test"}}
		set(p)
		reach("A", nsA, ptT1, false) // not resolved yet
		resolve(nsA, "udp", "allowed.test", "198.18.94.2")
		reach("A", nsA, ptT1, true)
		reach("A", nsA, ptT3, false)
		refused(nsA, "tcp", "denied.test") // not allowed: not even resolved
		refused(nsA, "udp", "denied.test")
		reach("A", nsA, ptT3, false)
		if got := m.fw.learnedNames(ptA, netip.MustParseAddr("198.18.94.2")); !reflect.DeepEqual(got, []string{"allowed.test"}) {
			t.Fatalf("learned names for 198.18.94.2: %q", got)
		}
		for _, tc := range []struct {
			dst  string
			want bool
		}{{"198.18.94.2", true}, {"198.18.94.3", false}} {
			dst := netip.MustParseAddr(tc.dst)
			if got := p.Decide(dst, m.fw.learnedNames(ptA, dst)); got != tc.want {
				t.Fatalf("Decide(%s) = %v, want %v as enforced", dst, got, tc.want)
			}
		}
		// B resolving through the proxy changes nothing for A or B.
		resolve(nsB, "udp", "allowed.test", "198.18.94.2")
		bUnaffected()
	}()
	func() {
		t.Log("step: deny address, live change")
		set(&Policy{Deny: []string{"198.18.94.2"}})
		reach("A", nsA, ptT1, false)
		reach("A", nsA, ptT3, true)
		resolve(nsA, "tcp", "denied.test", "198.18.94.3") // names are not limited: resolved
		bUnaffected()
		// A connection open when the policy changes stays open; new ones
		// follow the new policy.
		var held net.Conn
		if err := inNetns(nsA, func() (err error) {
			held, err = net.DialTimeout("tcp4", ptT3, 2*time.Second)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		r := bufio.NewReader(held)
		r.ReadString('\n')
		set(&Policy{Deny: []string{"198.18.94.3"}})
		reach("A", nsA, ptT3, false)
		reach("A", nsA, ptT1, true)
		held.SetDeadline(time.Now().Add(2 * time.Second))
		held.Write([]byte("ping\n"))
		if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("the connection open before the change: %q %v", line, err)
		}
		bUnaffected()
	}()
	func() {
		t.Log("step: deny domain")
		// A resolved denied.test above: its address is closed at once.
		set(&Policy{Deny: []string{"denied.test"}})
		reach("A", nsA, ptT3, false)
		reach("A", nsA, ptT1, true)
		refused(nsA, "udp", "denied.test")
		resolve(nsA, "udp", "allowed.test", "198.18.94.2")
		reach("A", nsA, ptT3, false)
		// Deny wins over an allowed CIDR.
		set(&Policy{Allow: []string{"198.18.94.0/24"}, Deny: []string{"denied.test"}})
		reach("A", nsA, ptT1, true)
		reach("A", nsA, ptT3, false)
		bUnaffected()
	}()
	func() {
		t.Log("step: remove")
		set(nil)
		set(&Policy{}) // empty: also removes; idempotent
		reach("A", nsA, ptT1, true)
		reach("A", nsA, ptT3, true)
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		tbl := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: ptBridge}
		chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range chains {
			if ch.Table.Name == ptBridge && strings.HasPrefix(ch.Name, "p-") {
				t.Fatalf("chain %s left", ch.Name)
			}
		}
		sets, err := c.GetSets(tbl)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sets {
			switch s.Name {
			case "egress", "never", "private", connsSet, shareSet, ratesSet, refusedSet: // the table's own
			default:
				t.Fatalf("set %s left", s.Name)
			}
		}
		if els, err := c.GetSetElements(m.fw.egress); err != nil || len(els) != 0 {
			t.Fatalf("egress map: %v %v", els, err)
		}
		bUnaffected()
	}()
	func() {
		t.Log("step: bad address")
		for _, ip := range []string{"198.18.94.2", "10.93.0.1", "10.93.0.255"} {
			if err := m.SetPolicy(netip.MustParseAddr(ip), &Policy{DenyAll: true}); err == nil {
				t.Fatalf("SetPolicy(%s) succeeded", ip)
			}
		}
		if err := m.SetPolicy(ptA, &Policy{Allow: []string{"exa mple"}}); err == nil || !strings.Contains(err.Error(), "is not an IP") {
			t.Fatalf("invalid policy: %v", err)
		}
	}()
	func() {
		t.Log("step: not from a sandbox")
		// The host itself (source: the gateway) is not a sandbox.
		rcode, _, err := queryA("udp", gw, "allowed.test")
		if err != nil || rcode != dnsmessage.RCodeRefused {
			t.Fatalf("query from the host: %v %v, want REFUSED", rcode, err)
		}
		if rcode, _, err := queryA("tcp", gw, "allowed.test"); err != nil || rcode != dnsmessage.RCodeRefused {
			t.Fatalf("query from the host over TCP: %v %v, want REFUSED", rcode, err)
		}
	}()
	func() {
		t.Log("step: measure")
		var cidrs []string
		for i := 0; i < 1000; i++ {
			cidrs = append(cidrs, fmt.Sprintf("172.%d.%d.0/24", 16+i/256, i%256))
		}
		big := &Policy{Allow: append(cidrs, "allowed.test"), Deny: []string{"denied.test"}}
		start := time.Now()
		set(big)
		install := time.Since(start)
		start = time.Now()
		set(big)
		replace := time.Since(start)
		start = time.Now()
		set(&Policy{DenyAll: true})
		small := time.Since(start)
		start = time.Now()
		set(nil)
		remove := time.Since(start)
		t.Logf("SetPolicy, 1002 entries: install %v, replace %v; 1 entry: replace %v; remove %v",
			install.Round(time.Microsecond), replace.Round(time.Microsecond), small.Round(time.Microsecond), remove.Round(time.Microsecond))
		set(&Policy{Allow: []string{"allowed.test"}})
		defer set(nil)
		const n = 200
		var lat []time.Duration
		err := inNetns(nsA, func() error {
			for i := 0; i < n; i++ {
				s := time.Now()
				if _, _, err := queryA("udp", gw, "allowed.test"); err != nil {
					return err
				}
				lat = append(lat, time.Since(s))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		t.Logf("DNS through the proxy (learning into r-), %d sequential UDP queries: median %v, p95 %v, max %v",
			n, lat[n/2].Round(time.Microsecond), lat[n*95/100].Round(time.Microsecond), lat[n-1].Round(time.Microsecond))
		reach("A", nsA, ptT1, true)
	}()
	func() {
		t.Log("step: spoofing")
		// A takes a free address (and B's) to leave its policy behind.
		set(&Policy{DenyAll: true})
		defer set(nil)
		h, err := netlink.NewHandleAt(mustNetns(t, nsA))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		eth, err := h.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"10.93.0.50", ptB.String()} {
			spoof := netip.MustParseAddr(s)
			a := &netlink.Addr{IPNet: &net.IPNet{IP: spoof.AsSlice(), Mask: net.CIDRMask(32, 32)}}
			if err := h.AddrAdd(eth, a); err != nil {
				t.Fatal(err)
			}
			err := dialFrom(nsA, ptT1, spoof)
			h.AddrDel(eth, a)
			if err == nil {
				t.Fatalf("A connected from %s", spoof)
			}
			t.Logf("A from %s: %v", spoof, err)
		}
		bUnaffected()
	}()
	func() {
		t.Log("step: boundary")
		// The administrator's nft lists our tables (a rule it cannot print
		// makes it abort, and `nft list ruleset` with it, host-wide).
		for _, fam := range []string{"ip", "bridge"} {
			if out, err := exec.Command("nft", "list", "table", fam, ptBridge).CombinedOutput(); err != nil || !strings.Contains(string(out), "chain") {
				t.Fatalf("nft list table %s %s: %v\n%s", fam, ptBridge, err, out)
			}
		}
		// A cluster address: refused to every sandbox, policy or none, as
		// soon as it is given; reachable again once it leaves.
		if err := m.SetClusterAddrs([]netip.Addr{netip.MustParseAddr("198.18.94.3")}); err != nil {
			t.Fatal(err)
		}
		set(&Policy{Allow: []string{"198.18.94.0/24"}})
		reach("A", nsA, ptT3, false)
		reach("B", nsB, ptT3, false)
		reach("B", nsB, ptT1, true)
		set(nil)
		if err := m.SetClusterAddrs(nil); err != nil {
			t.Fatal(err)
		}
		bUnaffected()

		// A DNAT on the host (another runtime's published port): a
		// connection to the node's own address that the host rewrites to
		// an allowed target is refused (the rule's counter shows the
		// rewrite was made).
		const dnatTable = "shpolt-dnat"
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: dnatTable})
		t.Cleanup(func() {
			c, _ := nftables.New()
			c.DelTable(tbl)
			c.Flush()
		})
		pre := c.AddChain(&nftables.Chain{Name: "pre", Table: tbl, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
		target := netip.MustParseAddr("198.18.94.2").As4()
		node := netip.MustParseAddr("198.18.94.1").As4() // the target veth's host side: an address of the node
		c.AddRule(&nftables.Rule{Table: tbl, Chain: pre, Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: node[:]},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Counter{},
			&expr.Immediate{Register: 1, Data: target[:]},
			&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(8080)},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
		}})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		reach("A", nsA, "198.18.94.1:9999", false)
		rules, err := c.GetRules(tbl, pre)
		if err != nil || len(rules) != 1 {
			t.Fatalf("the DNAT rule: %v %v", rules, err)
		}
		rewritten := uint64(0)
		for _, x := range rules[0].Exprs {
			if ctr, ok := x.(*expr.Counter); ok {
				rewritten = ctr.Packets
			}
		}
		if rewritten == 0 {
			t.Fatal("the host's DNAT rule never matched: the test proves nothing")
		}

		// The node's addresses are followed: one added to an interface is
		// in the boundary at once, and leaves it with the interface.
		const dummy = "shpolt-dum"
		delLink(dummy)
		la := netlink.NewLinkAttrs()
		la.Name = dummy
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil { // no dummy module on every kernel
			t.Fatal(err)
		}
		t.Cleanup(func() { delLink(dummy) })
		l, err := netlink.LinkByName(dummy)
		if err != nil {
			t.Fatal(err)
		}
		added := netip.MustParseAddr("198.51.100.77")
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: added.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			t.Fatal(err)
		}
		// In the boundary, and in the firewall's set (an element that
		// starts at the address).
		inNever := func() bool {
			c, _ := nftables.New()
			els, err := c.GetSetElements(m.fw.never)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range els {
				if a, ok := netip.AddrFromSlice(e.Key); ok && a == added && !e.IntervalEnd {
					return m.Refusal(added) != ""
				}
			}
			return false
		}
		waitNet(t, 5*time.Second, "the added address in the boundary", inNever)
		if why := m.Refusal(added); !strings.Contains(why, "this node") {
			t.Fatalf("an address added to the host: refused %q", why)
		}
		delLink(dummy)
		waitNet(t, 5*time.Second, "the removed address out of the boundary", func() bool { return m.Refusal(added) == "" })
	}()
	func() {
		t.Log("step: restart")
		// A new Manager remakes the tables, as a server start does: the
		// ports of running sandboxes are registered again from their
		// aliases, and policies are applied again by the caller.
		// A denied sandbox sends all the while the tables are remade:
		// not one packet may get out (the old tables go and the new come
		// in one transaction).
		set(&Policy{DenyAll: true})
		var udp net.PacketConn
		if err := inNetns(target, func() (err error) { udp, err = net.ListenPacket("udp4", "198.18.94.2:9999"); return err }); err != nil {
			t.Fatal(err)
		}
		defer udp.Close()
		got := make(chan int, 1)
		go func() {
			n, buf := 0, make([]byte, 64)
			for {
				udp.SetReadDeadline(time.Now().Add(time.Second))
				if _, _, err := udp.ReadFrom(buf); err != nil {
					got <- n
					return
				}
				n++
			}
		}()
		stop := make(chan struct{})
		sent := make(chan int, 1)
		go func() {
			n := 0
			inNetns(nsA, func() error {
				c, err := net.Dial("udp4", "198.18.94.2:9999")
				if err != nil {
					return err
				}
				defer c.Close()
				for {
					select {
					case <-stop:
						return nil
					default:
					}
					c.Write([]byte("x"))
					n++
				}
			})
			sent <- n
		}()
		time.Sleep(50 * time.Millisecond)
		m.Close()
		m2, err := New(ctx, cfg)
		time.Sleep(50 * time.Millisecond)
		close(stop)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m2.Close)
		if n, tried := <-got, <-sent; n != 0 || tried < 1000 {
			t.Fatalf("while the tables were remade, %d of %d packets of a denied sandbox got out (want 0 of 1000 or more)", n, tried)
		} else {
			t.Logf("while the tables were remade, 0 of %d packets of a denied sandbox got out", tried)
		}
		if got := m2.fw.portIPs; got[hostVeth(ptSbA)] != ptA || got[hostVeth(ptSbB)] != ptB {
			t.Fatalf("ports after restart: %v", got)
		}
		// Until Open, nothing leaves any sandbox: no policy-less moment.
		reach("A", nsA, ptT1, false)
		reach("B", nsB, ptT1, false)
		if err := m2.SetPolicy(ptA, &Policy{DenyAll: true}); err != nil {
			t.Fatal(err)
		}
		if err := m2.Open(); err != nil {
			t.Fatal(err)
		}
		reach("A", nsA, ptT1, false)
		bUnaffected()
		if err := m2.SetPolicy(ptA, nil); err != nil {
			t.Fatal(err)
		}
		reach("A", nsA, ptT1, true)
		// The old Manager's view is stale now; let the new one take over
		// the deletes (they find the ports it registered).
		m = m2
		if err := m2.Delete(ptSbB); err != nil {
			t.Fatal(err)
		}
		c, _ := nftables.New()
		els, err := c.GetSetElements(m2.fw.ports)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range els {
			if strings.TrimRight(string(e.Key), "\x00") == hostVeth(ptSbB) {
				t.Fatal("B's port is still registered after Delete")
			}
		}
	}()
}

func mustNetns(t *testing.T, path string) netns.NsHandle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// waitNet waits until ok, at most d.
func waitNet(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
