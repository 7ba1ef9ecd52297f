// Package network gives every sandbox a network namespace of its own: a veth
// pair whose host end sits on one bridge (shard0) and whose sandbox end has
// the sandbox's address, with NAT for egress, an egress policy per sandbox
// (Policy, SetPolicy) enforced in the host's firewall, and a DNS proxy on
// the gateway (StartDNS) through which domain names in policies are
// enforced.
//
// The namespace is made fresh for every start and every restore: runsc takes
// the addresses and routes of eth0 into its own netstack and strips them from
// the namespace, so a namespace cannot be reused. A fork restored into a new
// namespace simply has the new address.
package network

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Config is the host side of the sandbox network.
type Config struct {
	Bridge   string       // e.g. shard0
	Subnet   netip.Prefix // e.g. 10.88.0.0/16; the bridge takes the first address
	NetnsDir string       // where namespaces are bind-mounted, e.g. /run/shard/netns
	MTU      int          // of the bridge and the sandboxes' links; 0 is DefaultMTU
	// AllowPrivate opens these private ranges (inside PrivateRanges) to
	// sandboxes: shard serve --allow-private-egress. See boundary.go.
	AllowPrivate []netip.Prefix
	// Conns bounds the sandboxes' connections (conns.go); zero: planned
	// with DefaultMaxConnections for this host's conntrack table.
	Conns ConnLimits
	Log   *slog.Logger
}

// Manager sets up the bridge and NAT once and namespaces per sandbox.
type Manager struct {
	cfg     Config
	gateway netip.Addr
	fw      *firewall
	dns     dnsState
	bound   *boundary

	stopWatch chan struct{} // closed by Close: the host address watch ends
	watchDone chan struct{} // closed when it has
}

// New prepares the bridge, its address, IP forwarding and the NAT rules.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Bridge == "" {
		cfg.Bridge = "shard0"
	}
	if !cfg.Subnet.IsValid() {
		cfg.Subnet = netip.MustParsePrefix("10.88.0.0/16")
	}
	cfg.Subnet = cfg.Subnet.Masked()
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	if cfg.MTU < MinMTU || cfg.MTU > MaxMTU {
		return nil, fmt.Errorf("MTU %d: want %d to %d", cfg.MTU, MinMTU, MaxMTU)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Conns.PerSandbox == 0 {
		tableMax, _ := ReadConntrack(ConntrackMaxPath) // unknown: planned for the usual size
		lim, _, err := PlanConnLimits(DefaultMaxConnections, tableMax)
		if err != nil {
			return nil, err
		}
		cfg.Conns = lim
	}
	if err := os.MkdirAll(cfg.NetnsDir, 0o755); err != nil {
		return nil, err
	}
	bound, err := newBoundary(cfg.Subnet, cfg.AllowPrivate)
	if err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, gateway: cfg.Subnet.Addr().Next(), bound: bound,
		stopWatch: make(chan struct{}), watchDone: make(chan struct{})}
	if err := m.setupBridge(); err != nil {
		return nil, fmt.Errorf("bridge %s: %w", cfg.Bridge, err)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return nil, fmt.Errorf("enable ip forwarding: %w", err)
	}
	fw, err := newFirewall(cfg.Bridge, cfg.Subnet, m.gateway, bound, cfg.Conns, cfg.Log)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	m.fw = fw
	// The host's addresses are in the boundary before any sandbox is let
	// out (Open), and followed from then on.
	if err := m.refreshHost(); err != nil {
		return nil, fmt.Errorf("egress boundary: %w", err)
	}
	go m.watchHost(m.stopWatch)
	m.registerRunningPorts()
	return m, nil
}

// Close stops following the host's addresses. The firewall stays: the
// sandboxes outlive the server, and so does their boundary.
func (m *Manager) Close() {
	select {
	case <-m.stopWatch:
		return
	default:
	}
	close(m.stopWatch)
	<-m.watchDone
	m.stopDNS()
}

// registerRunningPorts restores the anti-spoofing entries of the sandboxes
// that kept running across a restart of the server: the tables are new, but
// each port's address is in its alias (set by Create).
func (m *Manager) registerRunningPorts() {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return
	}
	links, err := netlink.LinkList()
	if err != nil {
		m.cfg.Log.Warn("list links", "err", err)
		return
	}
	for _, l := range links {
		a := l.Attrs()
		if a.MasterIndex != br.Attrs().Index {
			continue
		}
		ip, err := netip.ParseAddr(a.Alias)
		if err != nil || !m.fw.isSandboxAddr(ip) {
			continue
		}
		if err := m.fw.addPort(a.Name, ip); err != nil {
			m.cfg.Log.Warn("register a running sandbox's port", "port", a.Name, "err", err)
		}
	}
}

// Open lets sandboxes out once the server has installed every stored policy
// (until then, a fresh firewall holds all egress, and the DNS proxy should
// not be started): a restart never opens a --deny-all sandbox for a moment.
func (m *Manager) Open() error { return m.fw.open() }

// SetPolicy installs or replaces (nil or Empty: removes) the egress policy
// of the sandbox at address ip, atomically (one netlink batch). The rules
// key on the source address inside the bridge's subnet, not on a namespace,
// so it works whether or not the sandbox runs, and holds across its stops
// and starts. The firewall is made anew at each server start: the caller
// applies every policy again after New; doing so twice is harmless.
// Connections already open are not cut: a change applies to new ones.
func (m *Manager) SetPolicy(ip netip.Addr, p *Policy) error {
	if p != nil && !p.Empty() {
		q := &Policy{DenyAll: p.DenyAll, Allow: append([]string(nil), p.Allow...), Deny: append([]string(nil), p.Deny...)}
		if err := q.Validate(); err != nil {
			return err
		}
		p = q
	}
	return m.fw.setPolicy(ip, p)
}

// The links between the host and its sandboxes carry packets of up to 64
// KiB by default: a stream between the host and a sandbox (an exec's
// output, a forwarded port) then moves in a fortieth of the packets it
// takes at 1500, and in gVisor every packet costs the netstack work and
// wake-ups (100 MiB of exec output: 0.79-0.88x of runsc exec's speed at
// 1500, 0.95-1.0x at 65535). Traffic leaving the host is unaffected: TCP
// agrees on segments no larger than the far end's, and sandboxes do not
// reach each other on the bridge.
const (
	DefaultMTU = 65535
	MinMTU     = 1280 // IPv6's minimum
	MaxMTU     = 65535
)

// Gateway is the bridge's address, the sandboxes' default route.
func (m *Manager) Gateway() netip.Addr { return m.gateway }

// Subnet is the sandboxes' network.
func (m *Manager) Subnet() netip.Prefix { return m.cfg.Subnet }

func (m *Manager) setupBridge() error {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		la := netlink.NewLinkAttrs()
		la.Name = m.cfg.Bridge
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		if br, err = netlink.LinkByName(m.cfg.Bridge); err != nil {
			return err
		}
	}
	// A bridge without an address of its own takes the lowest MAC of its
	// ports, so it changes whenever a sandbox with a lower MAC comes or the
	// lowest one goes; every sandbox's neighbour entry for the gateway is
	// then wrong, and its replies go nowhere until it asks again (seen as
	// a 25 s stall of an exec while another sandbox was being created). A
	// fixed, locally administered MAC per bridge name never moves.
	if mac := bridgeMAC(m.cfg.Bridge); !bytes.Equal(br.Attrs().HardwareAddr, mac) {
		if err := netlink.LinkSetHardwareAddr(br, mac); err != nil {
			return fmt.Errorf("set the MAC of %s: %w", m.cfg.Bridge, err)
		}
	}
	if br.Attrs().MTU != m.cfg.MTU {
		// Sandboxes made before keep their links' MTU: TCP with them
		// agrees on the smaller one.
		if err := netlink.LinkSetMTU(br, m.cfg.MTU); err != nil {
			return fmt.Errorf("set the MTU of %s to %d: %w", m.cfg.Bridge, m.cfg.MTU, err)
		}
	}
	want := &netlink.Addr{IPNet: &net.IPNet{IP: m.gateway.AsSlice(), Mask: net.CIDRMask(m.cfg.Subnet.Bits(), 32)}}
	addrs, err := netlink.AddrList(br, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	has := false
	for _, a := range addrs {
		if a.IPNet.String() == want.IPNet.String() {
			has = true
		}
	}
	if !has {
		if err := netlink.AddrAdd(br, want); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
	}
	return netlink.LinkSetUp(br)
}

// bridgeMAC is the bridge's fixed MAC: locally administered, unicast, from
// a hash of its name.
func bridgeMAC(name string) net.HardwareAddr {
	h := sha256.Sum256([]byte("shard bridge " + name))
	return net.HardwareAddr{0x02, h[0], h[1], h[2], h[3], h[4]}
}

// Path is where the namespace of a sandbox instance is bind-mounted.
func (m *Manager) Path(name string) string { return filepath.Join(m.cfg.NetnsDir, name) }

// hostVeth is the host-side interface name for a namespace (15 chars max).
func hostVeth(name string) string {
	n := "vs" + name
	if len(n) > 15 {
		n = n[:15]
	}
	return n
}

// Create makes a namespace named name (unique per sandbox instance) with eth0
// at ip on the bridge and a default route to the gateway. It returns the
// namespace's path.
func (m *Manager) Create(ctx context.Context, name string, ip netip.Addr) (string, error) {
	// The address may have belonged to a sandbox that is gone: forget its
	// MAC, or the host keeps sending to it until the entry goes stale
	// (tens of seconds of silence). plumb sets the new one.
	m.forgetNeighbour(ip)
	path := m.Path(name)
	if err := m.newNamedNetns(path); err != nil {
		return "", fmt.Errorf("netns %s: %w", name, err)
	}
	if err := m.plumb(name, path, ip); err != nil {
		m.Delete(name)
		return "", err
	}
	return path, nil
}

// plumb links the namespace at path to the bridge: the host's end of the
// veth (hostPort), the sandbox's (sandboxPort) and what ties them.
func (m *Manager) plumb(name, path string, ip netip.Addr) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	host, err := m.hostPort(name, ns, ip)
	if err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	return m.sandboxPort(h, host, ip)
}

// hostPort makes the veth into namespace ns (its end there is eth0) and
// sets up the host's end as a port of the bridge that sends from ip only.
func (m *Manager) hostPort(name string, ns netns.NsHandle, ip netip.Addr) (netlink.Link, error) {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return nil, err
	}
	la := netlink.NewLinkAttrs()
	la.Name = hostVeth(name)
	la.MasterIndex = br.Attrs().Index
	la.MTU = m.cfg.MTU // both ends
	veth := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("veth %s: %w", la.Name, err)
	}
	host, err := netlink.LinkByName(la.Name)
	if err != nil {
		return nil, err
	}
	// Sandboxes must not reach each other on the bridge: isolated ports
	// only talk to the bridge itself (the host), never to each other.
	if err := netlink.LinkSetIsolated(host, true); err != nil {
		return nil, fmt.Errorf("isolate %s: %w", la.Name, err)
	}
	// Policies key on the source address: the port may send from its own
	// address only. The alias keeps the address with the link, for New to
	// find after a restart of the server.
	if err := netlink.LinkSetAlias(host, ip.String()); err != nil {
		return nil, fmt.Errorf("alias %s: %w", la.Name, err)
	}
	if err := m.fw.addPort(la.Name, ip); err != nil {
		return nil, err
	}
	return host, netlink.LinkSetUp(host)
}

// sandboxPort sets up the sandbox's end (eth0, through h): the bridge
// knows its one MAC, and it gets ip and a default route to the gateway.
func (m *Manager) sandboxPort(h *netlink.Handle, host netlink.Link, ip netip.Addr) error {
	la := host.Attrs()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return err
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	// A sandbox with CAP_NET_RAW (runc's) sends frames from any MAC it
	// likes: were the bridge to learn from its port, one claiming a
	// neighbour's MAC would get the host's frames for that neighbour (its
	// agent's requests, secrets and tokens among them). The port learns
	// nothing and is sent no unknown unicast; the sandbox's own MAC is a
	// static entry on it. (Before eth0 is up: nothing was learned yet.)
	if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: host.Attrs().Index, Family: unix.AF_BRIDGE,
		Flags: netlink.NTF_MASTER, State: netlink.NUD_NOARP, HardwareAddr: eth.Attrs().HardwareAddr}); err != nil {
		return fmt.Errorf("static FDB entry on %s: %w", la.Name, err)
	}
	if err := netlink.LinkSetLearning(host, false); err != nil {
		return fmt.Errorf("no learning on %s: %w", la.Name, err)
	}
	if err := netlink.LinkSetFlood(host, false); err != nil {
		return fmt.Errorf("no unicast flood to %s: %w", la.Name, err)
	}
	// The host knows the sandbox's MAC for its address from the start (the
	// only MAC its port takes, above), and never asks for it: an ARP
	// request is a broadcast to every sandbox port, and every sandbox's
	// netstack wakes for it (with 200 sandboxes, one such round cost the
	// host tens of ms of CPU, on every create and on each exec to a sandbox
	// whose entry the kernel had dropped; the table keeps 128 cheaply).
	// Permanent entries are never dropped nor counted for that; Delete
	// removes it, and the address's next holder replaces it.
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: la.MasterIndex, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: ip.AsSlice(), HardwareAddr: eth.Attrs().HardwareAddr}); err != nil {
		return fmt.Errorf("neighbour entry of %s: %w", ip, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(m.cfg.Subnet.Bits(), 32)}}
	if err := h.AddrAdd(eth, addr); err != nil {
		return fmt.Errorf("address %s: %w", ip, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return err
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: m.gateway.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// forgetNeighbour deletes the bridge's neighbour entry for ip, if it has
// one: by its key (device and address), not by listing the table, which
// holds an entry for every sandbox the host talked to.
func (m *Manager) forgetNeighbour(ip netip.Addr) {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return
	}
	netlink.NeighDel(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, IP: ip.AsSlice()}) // ENOENT: none
}

// newNamedNetns creates a network namespace and bind-mounts it at path, on a
// locked OS thread that returns to the host namespace before it is released.
func (m *Manager) newNamedNetns(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%s exists", path)
		}
		if _, serr := os.Stat(m.cfg.NetnsDir); errors.Is(serr, os.ErrNotExist) {
			// Not the request's fault, nor one a retry mends: say what
			// broke and what mends it (the host's path to the log only).
			m.cfg.Log.Error("the netns directory is gone: restart shard serve", "dir", m.cfg.NetnsDir)
			return errdefs.Unavailable("", "the server's run directory lost its netns directory (something removed it while the server ran): restart shard serve, which makes it again")
		}
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Not unlocked on purpose when the thread cannot go back: the Go
		// runtime then ends the thread instead of reusing it.
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		err = unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
		if serr := netns.Set(orig); serr != nil {
			errc <- fmt.Errorf("return to host netns: %w", serr)
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// Delete removes a namespace and its host veth. Missing pieces are fine.
func (m *Manager) Delete(name string) error {
	if l, err := netlink.LinkByName(hostVeth(name)); err == nil {
		netlink.LinkDel(l)
	}
	if ip, ok := m.fw.delPort(hostVeth(name)); ok {
		// What it resolved was for the process that is gone.
		m.fw.forget(ip)
		m.forgetNeighbour(ip) // its MAC: gone with its eth0
	}
	path := m.Path(name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// List returns the names of the namespaces on disk (for cleaning up after
// a crash).
func (m *Manager) List() ([]string, error) {
	ents, err := os.ReadDir(m.cfg.NetnsDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// ResolvConf is the resolv.conf a sandbox gets: the DNS proxy on the
// gateway (StartDNS) as its only name server, since domain names in egress
// policies are enforced from the proxy's answers; the host's search and
// options lines are kept.
func (m *Manager) ResolvConf() []byte {
	out := []string{"nameserver " + m.gateway.String()}
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 0 && (f[0] == "search" || f[0] == "options") {
				out = append(out, line)
			}
		}
	}
	return []byte(strings.Join(out, "\n") + "\n")
}

// ResolvConf is the resolv.conf of a sandbox that bypasses the DNS proxy:
// the host's name servers, without loopback ones (unreachable from a
// sandbox).
//
// Deprecated: use Manager.ResolvConf; with this one, domain names in egress
// policies only ever match what the sandbox had resolved through the proxy.
func ResolvConf() []byte {
	b, err := os.ReadFile("/etc/resolv.conf")
	var out []string
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "nameserver" {
				if a, err := netip.ParseAddr(f[1]); err == nil && a.IsLoopback() {
					continue
				}
			}
			if len(f) > 0 && (f[0] == "nameserver" || f[0] == "search" || f[0] == "options") {
				out = append(out, line)
			}
		}
	}
	return []byte(strings.Join(out, "\n") + "\n")
}
