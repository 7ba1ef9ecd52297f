package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"go4.org/netipx"
)

// The boundary is what no sandbox reaches, whatever its policy says: the
// control plane and the host's networks. It is enforced in the forward
// chain before any policy (see firewall.setBoundary), at the DNS proxy
// (answers pointing into it are refused: rebinding), and when a policy is
// set (an allow entry inside it is a 400 that names the server flag that
// would open it, if one would).
//
//   - Never reached: the node's own addresses on every interface (followed
//     as they change), the cluster's (etcd's endpoints and members, every
//     node's advertised address), the sandbox subnet (the DNS proxy on the
//     gateway is let in by the input chain, not here), link-local
//     (169.254/16: cloud metadata), loopback, "this network", multicast
//     and reserved.
//   - Refused unless the administrator opens them (shard serve
//     --allow-private-egress): RFC 1918, CGNAT (100.64/10). Sandboxes have
//     IPv4 only (the bridge drops the rest), so ULA and IPv4-mapped forms
//     matter only where an address is judged (DNS answers, policies): they
//     are unmapped first.
//   - Everything else is the internet, reachable as before; the
//     documentation ranges among it (package mirrors answer there on some
//     hosts).

// never are the ranges no sandbox reaches, with why.
var never = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "an unspecified address"},
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address (where cloud metadata services answer)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address"},
}

// PrivateRanges are the IPv4 ranges refused to sandboxes unless the
// administrator opens (part of) them: RFC 1918 and the shared CGNAT range.
var PrivateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
}

// ulaRange is IPv6's private range: refused in DNS answers (a sandbox has
// no IPv6 route, but a resolver's answer pointing there is still a probe).
var ulaRange = netip.MustParsePrefix("fc00::/7")

// nat64 is the well-known NAT64 prefix: its addresses are judged by the
// IPv4 address they embed.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// v4compat (::a.b.c.d, deprecated) and sixToFour (2002::/16) also carry
// an IPv4 address.
var (
	v4compat  = netip.MustParsePrefix("::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// AllowPrivateFlag is the server flag that opens private ranges.
const AllowPrivateFlag = "--allow-private-egress"

// CheckAllowPrivate validates --allow-private-egress: each range must lie
// inside a private range (what is public is open already; what is never
// reached cannot be opened).
func CheckAllowPrivate(ps []netip.Prefix) error {
	for _, p := range ps {
		if !p.Addr().Is4() {
			return fmt.Errorf("%s %s: give IPv4 ranges (sandboxes have IPv4 only)", AllowPrivateFlag, p)
		}
		p = p.Masked()
		for _, n := range never {
			if n.prefix.Overlaps(p) {
				return fmt.Errorf("%s %s: it holds %s: no sandbox reaches those, whatever the flags", AllowPrivateFlag, p, n.why)
			}
		}
		inside := false
		for _, r := range PrivateRanges {
			inside = inside || (r.Bits() <= p.Bits() && r.Contains(p.Addr()))
		}
		if !inside {
			return fmt.Errorf("%s %s: give ranges inside %s (other addresses are not private: sandboxes reach them already)", AllowPrivateFlag, p, joinPrefixes(PrivateRanges))
		}
	}
	return nil
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

// boundary holds what the boundary is made of now. Its methods are safe
// for concurrent use.
type boundary struct {
	subnet  netip.Prefix
	opened  []netip.Prefix // --allow-private-egress
	private *netipx.IPSet  // PrivateRanges less opened; fixed

	mu      sync.Mutex
	host    []netip.Addr  // the node's own addresses; guarded by mu
	cluster []netip.Addr  // etcd's and the nodes' addresses; guarded by mu
	never   *netipx.IPSet // never, subnet, host and cluster; guarded by mu
}

func newBoundary(subnet netip.Prefix, opened []netip.Prefix) (*boundary, error) {
	if err := CheckAllowPrivate(opened); err != nil {
		return nil, err
	}
	for _, p := range opened {
		if subnet.Bits() <= p.Bits() && subnet.Contains(p.Addr()) {
			return nil, fmt.Errorf("%s %s: it is inside the sandbox network %s, which no sandbox reaches: it would open nothing", AllowPrivateFlag, p, subnet)
		}
	}
	var b netipx.IPSetBuilder
	for _, p := range PrivateRanges {
		b.AddPrefix(p)
	}
	for _, p := range opened {
		b.RemovePrefix(p.Masked())
	}
	private, err := b.IPSet()
	if err != nil {
		return nil, err
	}
	bd := &boundary{subnet: subnet, opened: opened, private: private}
	bd.mu.Lock()
	err = bd.rebuild()
	bd.mu.Unlock()
	return bd, err
}

// rebuild remakes never from its parts. Called with mu held.
func (b *boundary) rebuild() error {
	var sb netipx.IPSetBuilder
	for _, n := range never {
		sb.AddPrefix(n.prefix)
	}
	sb.AddPrefix(b.subnet)
	for _, a := range b.host {
		sb.Add(a)
	}
	for _, a := range b.cluster {
		sb.Add(a)
	}
	s, err := sb.IPSet()
	if err != nil {
		return err
	}
	b.never = s
	return nil
}

// ipv4 keeps the IPv4 addresses of as (IPv4-mapped ones unmapped), sorted
// and without duplicates.
func ipv4(as []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range as {
		if a = a.Unmap().WithZone(""); a.Is4() {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// setHost and setCluster replace a part; they report whether it changed.
func (b *boundary) setHost(as []netip.Addr) (bool, error) {
	return b.set(&b.host, as)
}

func (b *boundary) setCluster(as []netip.Addr) (bool, error) {
	return b.set(&b.cluster, as)
}

func (b *boundary) set(part *[]netip.Addr, as []netip.Addr) (bool, error) {
	as = ipv4(as)
	b.mu.Lock()
	defer b.mu.Unlock()
	if slices.Equal(*part, as) {
		return false, nil
	}
	old := *part
	*part = as
	if err := b.rebuild(); err != nil {
		*part = old
		return false, err
	}
	return true, nil
}

// sets returns the prefixes of the two nftables sets: never, and private
// (less what was opened).
func (b *boundary) sets() (nev, priv []netip.Prefix) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.never.Prefixes(), b.private.Prefixes()
}

// refusal says why a sandbox may not reach a (and which server flag would
// let it, if one would); "" when it may.
func (b *boundary) refusal(a netip.Addr) (why, flag string) {
	a = a.WithZone("")
	// IPv6 forms that carry an IPv4 address are judged by it: NAT64's
	// (what a NAT64 gateway would reach), IPv4-compatible (::a.b.c.d) and
	// 6to4 (2002:aabb:ccdd::).
	switch v := a.As16(); {
	case nat64.Contains(a), v4compat.Contains(a) && !a.IsUnspecified() && !a.IsLoopback():
		a = netip.AddrFrom4([4]byte{v[12], v[13], v[14], v[15]})
	case sixToFour.Contains(a):
		a = netip.AddrFrom4([4]byte{v[2], v[3], v[4], v[5]})
	}
	if a.Is6() && !a.Is4In6() {
		if ulaRange.Contains(a) {
			return "a private (ULA) IPv6 address", ""
		}
		if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() || a.IsMulticast() {
			return "a loopback, link-local or special IPv6 address", ""
		}
		return "", ""
	}
	a = a.Unmap()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.never.Contains(a) {
		switch {
		case slices.Contains(b.cluster, a):
			return "an address of the cluster (etcd or a node)", ""
		case slices.Contains(b.host, a):
			return "an address of this node", ""
		case b.subnet.Contains(a):
			return "in the sandboxes' own network " + b.subnet.String(), ""
		}
		for _, n := range never {
			if n.prefix.Contains(a) {
				return n.why, ""
			}
		}
		return "refused", ""
	}
	if b.private.Contains(a) {
		for _, r := range PrivateRanges {
			if r.Contains(a) {
				return "a private address (in " + r.String() + ")", AllowPrivateFlag
			}
		}
	}
	return "", ""
}

// prefixRefusal is refusal for a policy entry's prefix: refused when all
// of it lies where no sandbox may go (a wider entry, 0.0.0.0/0 say, is
// taken, and the boundary still applies inside it).
func (b *boundary) prefixRefusal(p netip.Prefix) (why, flag string) {
	p = p.Masked()
	b.mu.Lock()
	inNever := b.never.ContainsPrefix(p)
	inPrivate := b.private.ContainsPrefix(p)
	b.mu.Unlock()
	if !inNever && !inPrivate {
		return "", ""
	}
	return b.refusal(p.Addr())
}

// CheckPolicy refuses a policy whose allow list names what the boundary
// refuses: an address or range it never lets a sandbox reach, or a private
// one the server did not open (the error names the flag that would). Deny
// entries are always fine.
func (m *Manager) CheckPolicy(p *Policy) error {
	if p == nil {
		return nil
	}
	for _, raw := range p.Allow {
		e, err := parseEntry(raw)
		if err != nil || e.domain != "" {
			continue // Validate names bad entries; domains are judged at the DNS proxy
		}
		why, flag := m.bound.prefixRefusal(e.prefix)
		switch {
		case why == "":
		case flag != "":
			return fmt.Errorf("allow: %s is %s, which this server refuses to sandboxes: a policy can open it only once the server is started with %s %s (or a range holding it)", e, why, flag, e.prefix.Masked())
		default:
			return fmt.Errorf("allow: %s is %s: no sandbox reaches it, whatever its policy", e, why)
		}
	}
	return nil
}

// Refusal says why no sandbox of this server may reach a, or "" if it
// may (as far as the boundary goes: a policy may refuse more).
func (m *Manager) Refusal(a netip.Addr) string {
	why, _ := m.bound.refusal(a)
	return why
}

// SetClusterAddrs replaces the cluster's addresses (etcd's, the nodes')
// in the boundary. The caller keeps what it knew while it cannot read the
// cluster's list: only a list read from etcd shrinks it.
func (m *Manager) SetClusterAddrs(as []netip.Addr) error {
	changed, err := m.bound.setCluster(as)
	if err != nil || !changed {
		return err
	}
	m.cfg.Log.Info("egress boundary: the cluster's addresses", "addrs", ipv4(as))
	return m.fw.setBoundary(m.bound.sets())
}
