package network

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/useshards/shard/internal/kmutex"
	"golang.org/x/sys/unix"
)

// firewall owns two nftables tables named after the bridge, so two servers
// with two bridges never touch each other's rules:
//
//   - ip <bridge>: NAT for the sandboxes' egress; no way from a sandbox into
//     the host except replies to connections the host opened (the server
//     dialing an agent) and DNS to the proxy on the gateway; and the
//     sandboxes' egress policies, one chain and four sets per sandbox with a
//     policy, reached through a verdict map keyed on the source address.
//   - bridge <bridge>: anti-spoofing. Policies key on the source address, and
//     a sandbox is root in its own namespace: it could take another address
//     (a neighbour's, or a free one with no policy) and leave its policy
//     behind. Each sandbox port may only send IPv4 and ARP from its own
//     address; nothing else (IPv6 included) enters from it.
//
// Both tables are made afresh at each server start; the caller re-applies
// the policies (SetPolicy is idempotent) and New re-registers the ports of
// the sandboxes that kept running (their address is in the host veth's
// alias).
type firewall struct {
	bridge  string
	subnet  netip.Prefix
	gateway netip.Addr
	log     *slog.Logger

	table   *nftables.Table // ip family
	btable  *nftables.Table // bridge family
	egress  *nftables.Set   // vmap: source address -> jump p-<addr>
	never   *nftables.Set   // interval: the boundary no sandbox crosses (boundary.go)
	closed  *nftables.Set   // interval: private ranges not opened to sandboxes
	ports   *nftables.Set   // bridge: sandbox ports (ifname)
	pairs   *nftables.Set   // bridge: ifname . ipv4 a port may send from
	refused *nftables.Set   // dynamic: source address -> refusals by the connection bounds (conns.go)
	lim     ConnLimits      // the connection bounds (conns.go)

	// srcLocks orders one sandbox's set writes (a policy's install, a DNS
	// answer's learning): a write for one sandbox goes to netlink without
	// holding mu, so the DNS answers of the others are not held up by it.
	// Taken before mu, never while holding it.
	srcLocks kmutex.Keyed

	mu       sync.Mutex
	policies map[netip.Addr]*compiled                           // installed, by sandbox address
	learned  map[netip.Addr]map[netip.Addr]map[string]time.Time // sandbox -> destination -> DNS name -> expiry
	portIPs  map[string]netip.Addr                              // registered port -> its address
}

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

// Expression pieces shared by the rules.
var (
	accept = &expr.Verdict{Kind: expr.VerdictAccept}
	drop   = &expr.Verdict{Kind: expr.VerdictDrop}
)

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// ctReply matches packets of conntrack's reply direction (replies to the
// side that opened the connection, related ICMP errors included).
func ctReply() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1}}, // IP_CT_DIR_REPLY
	}
}

// ctStatusDstNAT is IPS_DST_NAT: the connection's destination was
// rewritten.
const ctStatusDstNAT = 1 << 5

// Header offsets the rules read.
const (
	ipSrcOffset     = 12 // IPv4 source address
	ipDstOffset     = 16 // IPv4 destination address
	dportOffset     = 2  // TCP or UDP destination port
	etherTypeOffset = 12 // Ethernet type, in the link-layer header
	arpSenderOffset = 14 // ARP sender protocol (IPv4) address
)

func ipAddr(reg uint32, offset uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}
}

func ipSrc() *expr.Payload { return ipAddr(1, ipSrcOffset) }
func ipDst() *expr.Payload { return ipAddr(1, ipDstOffset) }

// dport loads a TCP or UDP packet's destination port into register 1.
func dport() *expr.Payload {
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: dportOffset, Len: 2}
}

func inSet(s *nftables.Set) *expr.Lookup {
	return &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}
}

// tables builds the firewall's two tables in one netlink batch; each step
// adds one chain (or the bridge table) and says why in its comment.
type tables struct {
	c   *nftables.Conn
	fw  *firewall
	t   *nftables.Table // ip
	rej *nftables.Chain // reject: what a policy or the boundary refuses
	lch *nftables.Chain // the connection bounds (conns.go)

	inSubnet []expr.Any // from a sandbox address
	iif      []expr.Any // in from the bridge
}

// oif matches the bridge as the output interface (op: equal or not).
func (b *tables) oif(op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: ifname(b.fw.bridge)},
	}
}

func (b *tables) rule(ch *nftables.Chain, exprs ...[]expr.Any) {
	b.c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: cat(exprs...)})
}

var policyAccept = nftables.ChainPolicyAccept

func newFirewall(bridge string, subnet netip.Prefix, gateway netip.Addr, bound *boundary, lim ConnLimits, log *slog.Logger) (*firewall, error) {
	fw := &firewall{bridge: bridge, subnet: subnet, gateway: gateway, log: log, lim: lim,
		policies: map[netip.Addr]*compiled{},
		learned:  map[netip.Addr]map[netip.Addr]map[string]time.Time{},
		portIPs:  map[string]netip.Addr{},
	}
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: bridge}
	bt := &nftables.Table{Family: nftables.TableFamilyBridge, Name: bridge}
	// Start from clean tables: rules are ours alone, made anew each start.
	// The old tables go and the new ones come in one transaction (one
	// Flush, at the end): a restart never leaves a moment with no rules,
	// when a sandbox could open a connection the new rules would then let
	// live on.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(bt)
	c.DelTable(bt)
	fw.table = c.AddTable(t)
	netAddr := subnet.Addr().As4()
	b := &tables{c: c, fw: fw, t: fw.table,
		inSubnet: []expr.Any{
			ipSrc(),
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: maskBytes(subnet.Bits()), Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: netAddr[:]},
		},
		iif: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
		},
	}
	b.nat()
	b.reject()
	// The connection bounds (conns.go), which every new flow of a
	// sandbox passes.
	if b.lch, fw.refused, err = addLimits(c, b.t, lim, bridge, gateway, b.rej.Name); err != nil {
		return nil, err
	}
	for _, step := range []func() error{func() error { return b.sets(bound) }, b.forward, b.input, b.output, func() error { return b.bridge(bt) }} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("write table %s: %w", bridge, err)
	}
	return fw, nil
}

// nat masquerades the sandboxes' egress.
func (b *tables) nat() {
	post := b.c.AddChain(&nftables.Chain{Name: "postrouting", Table: b.t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	b.rule(post, b.inSubnet, b.oif(expr.CmpOpNeq), []expr.Any{&expr.Masq{}})
}

// reject is the chain of what a policy denies: rejected, not dropped, so
// a program in the sandbox learns at once (connection refused, or
// administratively prohibited) instead of hanging in retries for minutes.
func (b *tables) reject() {
	b.rej = b.c.AddChain(&nftables.Chain{Name: "reject", Table: b.t})
	b.rule(b.rej, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	})
	b.rule(b.rej, []expr.Any{
		&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 13}, // admin-prohibited
	})
}

// sets makes the policies' map and the boundary's sets: what no sandbox
// reaches (never), and the private ranges the administrator did not open
// (closed).
func (b *tables) sets(bound *boundary) error {
	fw := b.fw
	fw.egress = &nftables.Set{Table: b.t, Name: "egress", IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	if err := b.c.AddSet(fw.egress, nil); err != nil {
		return err
	}
	nev, priv := bound.sets()
	fw.never = &nftables.Set{Table: b.t, Name: "never", KeyType: nftables.TypeIPAddr, Interval: true}
	fw.closed = &nftables.Set{Table: b.t, Name: "private", KeyType: nftables.TypeIPAddr, Interval: true}
	if err := b.c.AddSet(fw.never, intervalElems(nev)); err != nil {
		return err
	}
	return b.c.AddSet(fw.closed, intervalElems(priv))
}

// forward judges what crosses the host between a sandbox and the world.
func (b *tables) forward() error {
	fw, out := b.fw, b.oif(expr.CmpOpNeq)
	fwd := b.c.AddChain(&nftables.Chain{Name: "forward", Table: b.t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	// Out of a sandbox into the boundary: refused, whatever its policy
	// (the chain boundary). A connection the host rewrote (DNAT: a
	// published port of another container runtime, say, which rewrites
	// only what is sent to the node's own addresses) is refused too: what
	// the sandbox asked for was the node. (Judging conntrack's original
	// destination would say so more narrowly, but nft 1.0.6 cannot list
	// the rule this library writes for it, and `nft list ruleset` must
	// keep working on a host running shard.)
	bch := b.c.AddChain(&nftables.Chain{Name: "boundary", Table: b.t})
	for _, s := range []*nftables.Set{fw.never, fw.closed} {
		b.rule(bch, []expr.Any{ipDst(), inSet(s), &expr.Verdict{Kind: expr.VerdictGoto, Chain: b.rej.Name}})
	}
	b.rule(bch, []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ctStatusDstNAT), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: b.rej.Name},
	})
	b.rule(fwd, b.iif, out, []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: bch.Name}})
	// A new flow out of a sandbox, past the boundary: within the
	// connection bounds, or refused.
	b.rule(fwd, b.iif, out, ctNew(), []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: b.lch.Name}})
	// Out of a sandbox with a policy: through its chain (p-<addr>), which
	// ends in a verdict. Sources not in the map go on to the next rule.
	b.rule(fwd, b.iif, out, []expr.Any{
		ipSrc(),
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: fw.egress.Name, SetID: fw.egress.ID},
	})
	// Until the server has installed every stored policy (Open), nothing
	// leaves a sandbox: a restarted server's fresh table would otherwise
	// let a --deny-all sandbox out until its policy came back.
	b.c.AddRule(&nftables.Rule{Table: b.t, Chain: fwd, UserData: []byte(holdTag), Exprs: cat(b.iif, out, []expr.Any{
		&expr.Verdict{Kind: expr.VerdictJump, Chain: b.rej.Name},
	})})
	// Out of a sandbox without a policy to the world: allowed.
	b.rule(fwd, b.iif, out, []expr.Any{accept})
	// Into a sandbox from elsewhere: only replies to what it opened.
	b.rule(fwd, b.oif(expr.CmpOpEq), ctReply(), []expr.Any{accept})
	b.rule(fwd, b.oif(expr.CmpOpEq), []expr.Any{drop})
	return nil
}

// input judges what a sandbox sends the host itself: only replies to what
// the host opened (conntrack's reply direction: a connection a sandbox
// opened to the host is never let in, whatever its state), and DNS to the
// proxy on the gateway.
func (b *tables) input() error {
	in := b.c.AddChain(&nftables.Chain{Name: "input", Table: b.t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	b.rule(in, b.iif, ctReply(), []expr.Any{accept})
	gw := b.fw.gateway.As4()
	toDNS := []expr.Any{ipDst(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: gw[:]}}
	port53 := []expr.Any{dport(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(53)}}
	// A TCP connection to the proxy is a flow in the table like any other
	// (UDP queries are not tracked: addLimits).
	b.rule(in, b.iif, toDNS, l4proto(unix.IPPROTO_TCP), port53, ctNew(), []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: b.lch.Name}})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		b.rule(in, b.iif, toDNS, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		}, port53, []expr.Any{accept})
	}
	b.rule(in, b.iif, []expr.Any{drop})
	return nil
}

// output judges what the host sends into the sandboxes: only root's
// sockets (the server: its agent calls, port proxy and DNS answers).
// Another host user could otherwise reach every sandbox's services and
// agent directly, past the port proxy's scopes. Packets of no socket (the
// kernel's own replies) carry no uid, and the rule does not match them.
func (b *tables) output() error {
	out := b.c.AddChain(&nftables.Chain{Name: "output", Table: b.t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	b.rule(out, b.oif(expr.CmpOpEq), []expr.Any{
		&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: b.rej.Name},
	})
	return nil
}

// bridge is the anti-spoofing at the bridge's door: a sandbox port sends
// IPv4 and ARP from its own address only.
func (b *tables) bridge(bt *nftables.Table) error {
	fw := b.fw
	bt = b.c.AddTable(bt)
	fw.btable = bt
	fw.ports = &nftables.Set{Table: bt, Name: "ports", KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian}
	fw.pairs = &nftables.Set{Table: bt, Name: "pairs", Concatenation: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)}
	if err := b.c.AddSet(fw.ports, nil); err != nil {
		return err
	}
	if err := b.c.AddSet(fw.pairs, nil); err != nil {
		return err
	}
	pre := b.c.AddChain(&nftables.Chain{Name: "prerouting", Table: bt, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	// Not a registered sandbox port (another bridge's, or a sandbox made
	// before ports were registered): not ours to judge.
	b.rule(pre, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: fw.ports.Name, SetID: fw.ports.ID, Invert: true},
		accept,
	})
	for _, p := range []struct {
		etherType uint16
		offset    uint32
	}{{unix.ETH_P_IP, ipSrcOffset}, {unix.ETH_P_ARP, arpSenderOffset}} {
		b.rule(pre, []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: etherTypeOffset, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p.etherType)},
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseNetworkHeader, Offset: p.offset, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: fw.pairs.Name, SetID: fw.pairs.ID},
			accept,
		})
	}
	b.rule(pre, []expr.Any{drop})
	return nil
}

// setBoundary replaces the contents of the boundary's sets, in one batch:
// no packet sees the boundary half made.
func (f *firewall) setBoundary(nev, priv []netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return err
	}
	for _, x := range []struct {
		s  *nftables.Set
		ps []netip.Prefix
	}{{f.never, nev}, {f.closed, priv}} {
		c.FlushSet(x.s)
		if els := intervalElems(x.ps); len(els) > 0 {
			if err := c.SetAddElements(x.s, els); err != nil {
				return err
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("egress boundary: %w", err)
	}
	return nil
}

func maskBytes(bits int) []byte {
	var m [4]byte
	for i := 0; i < bits; i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return m[:]
}

// isSandboxAddr reports an address a sandbox may have: in the subnet, not
// the network's, the gateway's or the broadcast address.
func (f *firewall) isSandboxAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.Is4() || !f.subnet.Contains(ip) || ip == f.gateway || ip == f.subnet.Addr() {
		return false
	}
	last := f.subnet.Addr().As4()
	host := uint32(1)<<(32-f.subnet.Bits()) - 1
	v := (uint32(last[0])<<24 | uint32(last[1])<<16 | uint32(last[2])<<8 | uint32(last[3])) | host
	return ip != netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// addPort lets port send from ip only (and registers it as a sandbox port).
func (f *firewall) addPort(port string, ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return err
	}
	a := ip.As4()
	if old, ok := f.portIPs[port]; ok && old != ip {
		o := old.As4()
		if err := c.SetDeleteElements(f.pairs, []nftables.SetElement{{Key: append(ifname(port), o[:]...)}}); err != nil {
			return err
		}
	}
	if err := c.SetAddElements(f.ports, []nftables.SetElement{{Key: ifname(port)}}); err != nil {
		return err
	}
	if err := c.SetAddElements(f.pairs, []nftables.SetElement{{Key: append(ifname(port), a[:]...)}}); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("register port %s: %w", port, err)
	}
	f.portIPs[port] = ip
	return nil
}

// delPort forgets a port; it returns the address it had, if it was known.
func (f *firewall) delPort(port string) (netip.Addr, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ip, ok := f.portIPs[port]
	if !ok {
		return netip.Addr{}, false
	}
	c, err := nftables.New()
	if err != nil {
		return ip, true
	}
	a := ip.As4()
	c.SetDeleteElements(f.ports, []nftables.SetElement{{Key: ifname(port)}})
	c.SetDeleteElements(f.pairs, []nftables.SetElement{{Key: append(ifname(port), a[:]...)}})
	if err := c.Flush(); err != nil {
		f.log.Warn("unregister sandbox port", "port", port, "err", err)
	}
	delete(f.portIPs, port)
	return ip, true
}

// Names of a sandbox's policy chain and sets. nftables names may be 255
// bytes; these are at most 17.
func policyNames(ip netip.Addr) (chain, deny, allow, denied, resolved string) {
	n := strings.ReplaceAll(ip.String(), ".", "-")
	return "p-" + n, "d-" + n, "a-" + n, "x-" + n, "r-" + n
}

type policyObjs struct {
	chain                         *nftables.Chain
	deny, allow, denied, resolved *nftables.Set
}

func (f *firewall) objs(ip netip.Addr) policyObjs {
	cn, d, a, x, r := policyNames(ip)
	interval := func(name string) *nftables.Set {
		return &nftables.Set{Table: f.table, Name: name, KeyType: nftables.TypeIPAddr, Interval: true}
	}
	timed := func(name string) *nftables.Set {
		return &nftables.Set{Table: f.table, Name: name, KeyType: nftables.TypeIPAddr, HasTimeout: true}
	}
	return policyObjs{chain: &nftables.Chain{Name: cn, Table: f.table},
		deny: interval(d), allow: interval(a), denied: timed(x), resolved: timed(r)}
}

// holdTag marks the forward rule that holds every sandbox's egress until
// the stored policies are in (see open).
const holdTag = "shard:hold-until-policies"

// open lets sandboxes without a policy out, once every stored policy is
// installed: it removes the rule newFirewall made to hold them.
func (f *firewall) open() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	rules, err := c.GetRules(f.table, &nftables.Chain{Name: "forward", Table: f.table})
	if err != nil {
		return fmt.Errorf("read the forward chain: %w", err)
	}
	for _, r := range rules {
		if string(r.UserData) == holdTag {
			if err := c.DelRule(r); err != nil {
				return err
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("open the sandboxes' egress: %w", err)
	}
	return nil
}

// setPolicy installs, replaces or (nil or empty) removes the policy of
// the sandbox at ip, in one netlink batch: the kernel applies all of it or
// none, so no packet ever sees half a policy.
func (f *firewall) setPolicy(ip netip.Addr, p *Policy) error {
	ip = ip.Unmap()
	if !f.isSandboxAddr(ip) {
		return fmt.Errorf("%s is not a sandbox address in %s", ip, f.subnet)
	}
	defer f.srcLocks.Lock(ip.String())()
	f.mu.Lock()
	defer f.mu.Unlock()
	_, installed := f.policies[ip]
	o := f.objs(ip)
	c, err := nftables.New()
	if err != nil {
		return err
	}
	if p.Empty() {
		if !installed {
			return nil
		}
		return f.removePolicy(c, ip, o)
	}
	cp := compilePolicy(p)
	if err := f.policySets(c, ip, o, cp, installed); err != nil {
		return err
	}
	for _, r := range policyRules(o, cp) {
		c.AddRule(&nftables.Rule{Table: f.table, Chain: o.chain, Exprs: r})
	}
	if !installed {
		a4 := ip.As4()
		if err := c.SetAddElements(f.egress, []nftables.SetElement{{Key: a4[:],
			VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: o.chain.Name}}}); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install the policy of %s: %w", ip, err)
	}
	f.policies[ip] = cp
	return nil
}

// removePolicy removes ip's chain and sets and its entry in the egress
// map, in c's batch. Caller holds mu.
func (f *firewall) removePolicy(c *nftables.Conn, ip netip.Addr, o policyObjs) error {
	a4 := ip.As4()
	if err := c.SetDeleteElements(f.egress, []nftables.SetElement{{Key: a4[:]}}); err != nil {
		return err
	}
	c.FlushChain(o.chain)
	c.DelChain(o.chain)
	for _, s := range []*nftables.Set{o.deny, o.allow, o.denied, o.resolved} {
		c.DelSet(s)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove the policy of %s: %w", ip, err)
	}
	delete(f.policies, ip)
	return nil
}

// policySets makes (or empties and refills) ip's chain and its four sets,
// in c's batch: the policy's addresses, and what its names resolved to.
// Caller holds mu.
func (f *firewall) policySets(c *nftables.Conn, ip netip.Addr, o policyObjs, cp *compiled, installed bool) error {
	now := time.Now()
	denied, resolved := f.learnedElems(ip, cp, now)
	fill := map[*nftables.Set][]nftables.SetElement{
		o.deny:     intervalElems(cp.deny.prefixes),
		o.allow:    intervalElems(cp.allow.prefixes),
		o.denied:   denied,
		o.resolved: resolved,
	}
	order := []*nftables.Set{o.deny, o.allow, o.denied, o.resolved}
	if installed {
		c.FlushChain(o.chain)
		for _, s := range order {
			c.FlushSet(s)
			if len(fill[s]) > 0 {
				if err := c.SetAddElements(s, fill[s]); err != nil {
					return err
				}
			}
		}
		return nil
	}
	c.AddChain(o.chain)
	for _, s := range order {
		if err := c.AddSet(s, fill[s]); err != nil {
			return err
		}
	}
	return nil
}

// policyRules are the rules of a policy's chain: established flows go on,
// then the denied addresses and names are rejected, the allowed accepted,
// and the rest meets the policy's default.
func policyRules(o policyObjs, cp *compiled) [][]expr.Any {
	rej := &expr.Verdict{Kind: expr.VerdictGoto, Chain: "reject"}
	daddrIn := func(s *nftables.Set, v *expr.Verdict) []expr.Any {
		return []expr.Any{ipDst(), inSet(s), v}
	}
	rules := [][]expr.Any{
		cat(ctEstablished(), []expr.Any{accept}),
		daddrIn(o.deny, rej),
		daddrIn(o.denied, rej),
		daddrIn(o.allow, accept),
		daddrIn(o.resolved, accept),
	}
	if cp.defaultDeny {
		return append(rules, []expr.Any{rej})
	}
	return append(rules, []expr.Any{accept})
}

// intervalElems turns prefixes into the elements of an interval set: the
// ranges merged (the kernel refuses overlaps), each a start element and an
// end element (the first address after it; none at the top of the space).
func intervalElems(prefixes []netip.Prefix) []nftables.SetElement {
	type rng struct{ lo, hi uint64 } // [lo, hi)
	var rs []rng
	for _, p := range prefixes {
		a := p.Masked().Addr().As4()
		lo := uint64(a[0])<<24 | uint64(a[1])<<16 | uint64(a[2])<<8 | uint64(a[3])
		rs = append(rs, rng{lo, lo + 1<<(32-p.Bits())})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	var merged []rng
	for _, r := range rs {
		if n := len(merged); n > 0 && r.lo <= merged[n-1].hi {
			merged[n-1].hi = max(merged[n-1].hi, r.hi)
			continue
		}
		merged = append(merged, r)
	}
	key := func(v uint64) []byte { return []byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)} }
	var out []nftables.SetElement
	for _, r := range merged {
		out = append(out, nftables.SetElement{Key: key(r.lo)})
		if r.hi < 1<<32 {
			out = append(out, nftables.SetElement{Key: key(r.hi), IntervalEnd: true})
		}
	}
	return out
}

// Bounds of what the DNS proxy remembers.
const (
	minLearnTTL       = 30 * time.Second
	maxLearnTTL       = time.Hour
	maxLearnedPerSrc  = 4096
	maxNamesPerLearnt = 32
)

// classify says, for one destination a sandbox resolved, until when it is
// denied by name and until when it is allowed by name (zero: not at all),
// from the names it was resolved from that have not expired.
func classify(cp *compiled, names map[string]time.Time, now time.Time) (deniedUntil, allowedUntil time.Time) {
	for n, exp := range names {
		if !exp.After(now) {
			continue
		}
		one := []string{n}
		if cp.deny.matchesName(one) && exp.After(deniedUntil) {
			deniedUntil = exp
		}
		if cp.allow.matchesName(one) && exp.After(allowedUntil) {
			allowedUntil = exp
		}
	}
	return
}

func timedElem(dst netip.Addr, until, now time.Time) (nftables.SetElement, bool) {
	d := until.Sub(now).Truncate(time.Millisecond)
	if d < time.Second {
		return nftables.SetElement{}, false
	}
	a := dst.As4()
	return nftables.SetElement{Key: a[:], Timeout: d}, true
}

// learnedElems is the content of a sandbox's x- and r- sets under policy cp,
// from what it resolved so far. Called with f.mu held.
func (f *firewall) learnedElems(src netip.Addr, cp *compiled, now time.Time) (denied, resolved []nftables.SetElement) {
	if !cp.hasDomains() {
		return nil, nil
	}
	for dst, names := range f.learned[src] {
		d, a := classify(cp, names, now)
		if e, ok := timedElem(dst, d, now); ok {
			denied = append(denied, e)
		}
		if e, ok := timedElem(dst, a, now); ok {
			resolved = append(resolved, e)
		}
	}
	return
}

// learn records that src resolved names to dst for ttl, and, when src's
// policy names one of them, opens (r-) or closes (x-) dst for it before the
// answer is handed to src.
func (f *firewall) learn(src netip.Addr, answers map[netip.Addr][]string, ttls map[netip.Addr]time.Duration) error {
	defer f.srcLocks.Lock(src.String())()
	denied, resolved := f.record(src, answers, ttls)
	if len(denied)+len(resolved) == 0 {
		return nil
	}
	o := f.objs(src)
	c, err := nftables.New()
	if err != nil {
		return err
	}
	// Adding an element that is there already renews its timeout.
	if len(denied) > 0 {
		if err := c.SetAddElements(o.denied, denied); err != nil {
			return err
		}
	}
	if len(resolved) > 0 {
		if err := c.SetAddElements(o.resolved, resolved); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("learn addresses for %s: %w", src, err)
	}
	return nil
}

// record notes the answers for src and returns the elements its policy
// asks for: what to close (denied) and open (resolved).
func (f *firewall) record(src netip.Addr, answers map[netip.Addr][]string, ttls map[netip.Addr]time.Duration) (denied, resolved []nftables.SetElement) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	bySrc := f.learned[src]
	if bySrc == nil {
		bySrc = map[netip.Addr]map[string]time.Time{}
		f.learned[src] = bySrc
	}
	cp := f.policies[src]
	for dst, names := range answers {
		ttl := min(max(ttls[dst], minLearnTTL), maxLearnTTL)
		rec := bySrc[dst]
		if rec == nil {
			if len(bySrc) >= maxLearnedPerSrc {
				pruneLearned(bySrc, now)
			}
			if len(bySrc) >= maxLearnedPerSrc {
				for k := range bySrc { // full of live entries: forget one
					delete(bySrc, k)
					break
				}
			}
			rec = map[string]time.Time{}
			bySrc[dst] = rec
		}
		for _, n := range names {
			if _, ok := rec[n]; !ok && len(rec) >= maxNamesPerLearnt {
				continue
			}
			if exp := now.Add(ttl); exp.After(rec[n]) {
				rec[n] = exp
			}
		}
		if cp == nil || !cp.hasDomains() {
			continue
		}
		d, a := classify(cp, rec, now)
		if e, ok := timedElem(dst, d, now); ok {
			denied = append(denied, e)
		}
		if e, ok := timedElem(dst, a, now); ok {
			resolved = append(resolved, e)
		}
	}
	return denied, resolved
}

func pruneLearned(bySrc map[netip.Addr]map[string]time.Time, now time.Time) {
	for dst, names := range bySrc {
		for n, exp := range names {
			if !exp.After(now) {
				delete(names, n)
			}
		}
		if len(names) == 0 {
			delete(bySrc, dst)
		}
	}
}

// forget drops what a sandbox address resolved (its sandbox is gone or
// stopped: a new process starts with no answers).
func (f *firewall) forget(src netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.learned, src)
}

// learnedNames lists the unexpired names src resolved to dst.
func (f *firewall) learnedNames(src, dst netip.Addr) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	var out []string
	for n, exp := range f.learned[src][dst] {
		if exp.After(now) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
