package network

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Connections bounded per sandbox. Every flow a sandbox opens through the
// host (NAT, and TCP to the DNS proxy) is an entry in the host's one
// conntrack table; when it is full the kernel drops every new flow of the
// host, the server's own dials into its agents included. Measured before
// these bounds: one runc sandbox added 20,000 entries in 0.33 s, and under
// --deny-all each source port of a query to the DNS proxy was an entry of
// its own (about 64k a sandbox): five sandboxes filled a table of 262,144.
//
// What bounds it, all in the ip table's "limits" chain, which every new
// flow of a sandbox passes (forward, and TCP to the gateway in input):
//
//   - ct count per sandbox (the "conns" set, keyed on the source address):
//     at most PerSandbox flows held at once. The kernel counts open flows
//     only, not TCP ones closed and waiting (TIME_WAIT, CLOSE), so also:
//   - a rate per sandbox ("rates") and one for all sandboxes together: a
//     sandbox opening and closing flows in a loop adds closed entries at
//     most that fast;
//   - a conntrack timeout policy for the sandboxes' TCP ("sandbox-tcp"):
//     closed flows stay TimeWait, not 120 s. Closed entries are then at
//     most about Rate×TimeWait a sandbox, TotalRate×TimeWait in all.
//   - queries to the DNS proxy over UDP are not tracked at all (notrack
//     both ways): the proxy rate-limits each sandbox itself, and a query
//     needs no state in the kernel.
//   - a hold the server closes when the host's table passes HoldAt (and
//     opens below OpenAt): then the new flows of every sandbox holding more
//     than HoldShare flows are refused, and a sandbox holding few goes on.
//     It bounds what per-sandbox counts cannot: many sandboxes, each within
//     its bound; and one project's many sandboxes cannot cut off another's
//     light ones (a red team's flood did, when the hold refused everyone).
//
// The per-sandbox rate and count come before the bucket of all sandboxes:
// a flood refused by its own rate spends nothing of the shared bucket, so
// one sandbox cannot starve its neighbours' new flows (it could, when the
// shared bucket came first).
//
// Denied flows (boundary, policy, a bound) are refused with a reset or an
// ICMP error and never enter the table: a NEW packet dropped or rejected
// before it leaves the host is not confirmed (checked on this kernel).
// Each refusal by a bound is counted per sandbox address ("refused": a
// dynamic set with a counter per element), which the server reads (see
// WatchConnections).

// ConnLimits are the bounds of sandboxes' connections (see above).
type ConnLimits struct {
	PerSandbox int           // flows one sandbox holds at once
	Rate       int           // new flows a second, one sandbox (past Burst)
	Burst      int           // new flows at once, one sandbox
	TotalRate  int           // new flows a second, all sandboxes (past a burst as large)
	TimeWait   time.Duration // a sandbox's closed TCP flow stays this long in the table
	HoldAt     int           // host table entries at which sandboxes' new flows are held
	HoldShare  int           // flows a sandbox may hold and still open new ones during a hold
	OpenAt     int           // and below which they are let again
	TableMax   int           // the host's nf_conntrack_max the bounds were planned for
}

// Bounds of --max-connections, and the fixed parts of the plan.
const (
	DefaultMaxConnections = 4096
	MinMaxConnections     = 16
	// MaxConnectionsFlag is the server flag that sets PerSandbox.
	MaxConnectionsFlag = "--max-connections"

	connRate     = 256 // new flows a second, one sandbox
	connBurst    = 512
	connTimeWait = 5 * time.Second
	// A table of unknown size is planned as Linux's usual one.
	assumedTableMax = 262144
)

// ConntrackMaxPath is where the kernel says how large its table is.
const (
	ConntrackMaxPath   = "/proc/sys/net/netfilter/nf_conntrack_max"
	ConntrackCountPath = "/proc/sys/net/netfilter/nf_conntrack_count"
)

// PlanConnLimits makes the bounds for --max-connections perSandbox on a
// host whose conntrack table holds tableMax entries (0: unknown). One
// sandbox may hold at most a sixteenth of the table: a larger perSandbox
// is lowered to that, and a note says so. Sandboxes together are held at
// three quarters of the table; their closed flows add at most about a
// tenth.
func PlanConnLimits(perSandbox, tableMax int) (ConnLimits, []string, error) {
	var notes []string
	if perSandbox < MinMaxConnections {
		return ConnLimits{}, nil, fmt.Errorf("%s %d: give %d or more (the flows one sandbox holds at once)", MaxConnectionsFlag, perSandbox, MinMaxConnections)
	}
	if tableMax <= 0 {
		tableMax = assumedTableMax
		notes = append(notes, fmt.Sprintf("the host's conntrack table size is unknown: planned for %d entries", tableMax))
	}
	if most := tableMax / 16; perSandbox > most {
		notes = append(notes, fmt.Sprintf("%s %d lowered to %d: one sandbox may hold at most a sixteenth of the host's conntrack table (nf_conntrack_max %d)", MaxConnectionsFlag, perSandbox, most, tableMax))
		perSandbox = most
	}
	// Closed flows of all sandboxes: at most TotalRate×TimeWait, under a
	// tenth of the table.
	total := max(tableMax/64, MinMaxConnections)
	l := ConnLimits{PerSandbox: perSandbox, Rate: min(connRate, total), Burst: min(connBurst, perSandbox), TimeWait: connTimeWait,
		TotalRate: total, HoldAt: tableMax * 3 / 4, OpenAt: tableMax / 2, TableMax: tableMax,
		HoldShare: min(perSandbox, max(MinMaxConnections, tableMax/1024))}
	return l, notes, nil
}

// ReadConntrack reads one of the kernel's conntrack figures (count or max).
func ReadConntrack(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Names in the ip table.
const (
	limitsChain   = "limits"
	connsSet      = "conns"
	shareSet      = "share" // each sandbox's flows counted against HoldShare
	ratesSet      = "rates"
	refusedSet    = "refused"
	tcpTimeoutObj = "sandbox-tcp"
	hostHoldTag   = "shard:host-conntrack-full"
)

// How long the per-address state of a sandbox no longer opening flows
// stays: a rate's bucket (refilled long before), a refusal count (read by
// the server every second or so).
const (
	rateElemTimeout    = time.Minute
	refusedElemTimeout = time.Hour
)

// saddr loads a packet's source address into register 1.
func saddr() *expr.Payload { return ipSrc() }

// ctNew matches the first packet of a flow.
func ctNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

// tcpTimeouts is the sandboxes' TCP timeout policy: the kernel's defaults
// (seconds), but closed flows (TIME_WAIT, CLOSE) kept only lim.TimeWait.
// Given in full: the library fills missing states from a map it shares.
func tcpTimeouts(lim ConnLimits) expr.CtStatePolicyTimeout {
	tw := uint32(max(lim.TimeWait, time.Second) / time.Second)
	return expr.CtStatePolicyTimeout{
		expr.CtStateTCPSYNSENT: 120, expr.CtStateTCPSYNRECV: 60, expr.CtStateTCPESTABLISHED: 432000,
		expr.CtStateTCPFINWAIT: 120, expr.CtStateTCPCLOSEWAIT: 60, expr.CtStateTCPLASTACK: 30,
		expr.CtStateTCPTIMEWAIT: tw, expr.CtStateTCPCLOSE: tw, expr.CtStateTCPSYNSENT2: 120,
		expr.CtStateTCPRETRANS: 300, expr.CtStateTCPUNACK: 300,
	}
}

// limitsRules are the rules of the limits chain, in order; refused is the
// set that counts refusals and rej the chain that refuses. Each bound,
// when passed, counts the refusal for the source address and goes to rej.
func limitsRules(lim ConnLimits, conns, share, rates, refused *nftables.Set, rej string) [][]expr.Any {
	refuse := []expr.Any{
		saddr(),
		&expr.Dynset{SrcRegKey: 1, SetName: refused.Name, SetID: refused.ID, Operation: uint32(unix.NFT_DYNSET_OP_UPDATE),
			Exprs: []expr.Any{&expr.Counter{}}},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: rej},
	}
	return [][]expr.Any{
		// The sandboxes' TCP flows get the short wait once closed.
		cat(l4proto(unix.IPPROTO_TCP), []expr.Any{&expr.Objref{Type: unix.NFT_OBJECT_CT_TIMEOUT, Name: tcpTimeoutObj}}),
		// One sandbox's rate.
		cat([]expr.Any{saddr(), &expr.Dynset{SrcRegKey: 1, SetName: rates.Name, SetID: rates.ID, Operation: uint32(unix.NFT_DYNSET_OP_UPDATE),
			Timeout: rateElemTimeout,
			Exprs: []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(lim.Rate), Unit: expr.LimitTimeSecond,
				Burst: uint32(lim.Burst), Over: true}}}}, refuse),
		// One sandbox's open flows.
		cat([]expr.Any{saddr(), &expr.Dynset{SrcRegKey: 1, SetName: conns.Name, SetID: conns.ID, Operation: uint32(unix.NFT_DYNSET_OP_ADD),
			Exprs: []expr.Any{&expr.Connlimit{Count: uint32(lim.PerSandbox), Flags: expr.NFT_CONNLIMIT_F_INV}}}}, refuse),
		// Its flows counted against the hold's share (no verdict: the
		// count must be current when a hold begins; see holdRule).
		shareCount(lim, share),
		// All sandboxes together: a cheap single bucket.
		cat([]expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(lim.TotalRate), Unit: expr.LimitTimeSecond,
			Burst: uint32(lim.TotalRate), Over: true}}, refuse),
	}
}

// shareCount matches a sandbox holding more than lim.HoldShare flows,
// adding this one to its count.
func shareCount(lim ConnLimits, share *nftables.Set) []expr.Any {
	return []expr.Any{saddr(), &expr.Dynset{SrcRegKey: 1, SetName: share.Name, SetID: share.ID, Operation: uint32(unix.NFT_DYNSET_OP_ADD),
		Exprs: []expr.Any{&expr.Connlimit{Count: uint32(lim.HoldShare), Flags: expr.NFT_CONNLIMIT_F_INV}}}}
}

// addLimits makes the limits chain, its sets and the sandboxes' TCP timeout
// policy in table t (in the batch of c), and the raw chains that leave UDP
// to and from the DNS proxy untracked. It returns the chain and the
// refusals' set.
func addLimits(c *nftables.Conn, t *nftables.Table, lim ConnLimits, bridge string, gateway netip.Addr, rej string) (*nftables.Chain, *nftables.Set, error) {
	c.AddObj(&nftables.NamedObj{Table: t, Name: tcpTimeoutObj, Type: nftables.ObjTypeCtTimeout,
		Obj: &expr.CtTimeout{L3Proto: unix.NFPROTO_IPV4, L4Proto: unix.IPPROTO_TCP, Policy: tcpTimeouts(lim)}})
	conns := &nftables.Set{Table: t, Name: connsSet, KeyType: nftables.TypeIPAddr, Dynamic: true, Size: 65535}
	share := &nftables.Set{Table: t, Name: shareSet, KeyType: nftables.TypeIPAddr, Dynamic: true, Size: 65535}
	rates := &nftables.Set{Table: t, Name: ratesSet, KeyType: nftables.TypeIPAddr, Dynamic: true, HasTimeout: true,
		Timeout: rateElemTimeout, Size: 65535}
	refused := &nftables.Set{Table: t, Name: refusedSet, KeyType: nftables.TypeIPAddr, Dynamic: true, HasTimeout: true,
		Timeout: refusedElemTimeout, Size: 65535}
	for _, s := range []*nftables.Set{conns, share, rates, refused} {
		if err := c.AddSet(s, nil); err != nil {
			return nil, nil, err
		}
	}
	ch := c.AddChain(&nftables.Chain{Name: limitsChain, Table: t})
	for _, r := range limitsRules(lim, conns, share, rates, refused, rej) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
	}

	// DNS over UDP to the proxy, both ways, is never tracked.
	gw := gateway.As4()
	raw := nftables.ChainPriorityRaw
	accept := nftables.ChainPolicyAccept
	pre := c.AddChain(&nftables.Chain{Name: "raw-prerouting", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: raw, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: cat([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
		ipDst(),
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: gw[:]},
	}, l4proto(unix.IPPROTO_UDP), []expr.Any{
		dport(),
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(53)},
		&expr.Notrack{},
	})})
	out := c.AddChain(&nftables.Chain{Name: "raw-output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: raw, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: cat([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
		ipSrc(),
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: gw[:]},
	}, l4proto(unix.IPPROTO_UDP), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(53)},
		&expr.Notrack{},
	})})
	return ch, refused, nil
}

// refusals reads how many new flows the bounds refused, by sandbox
// address, since each address's entry was made (it goes an hour after
// its last refusal).
func (f *firewall) refusals() (map[netip.Addr]uint64, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	els, err := c.GetSetElements(f.refused)
	if err != nil {
		return nil, fmt.Errorf("read the refused connections: %w", err)
	}
	out := make(map[netip.Addr]uint64, len(els))
	for _, e := range els {
		a, ok := netip.AddrFromSlice(e.Key)
		if !ok || e.Counter == nil {
			continue
		}
		out[a] = e.Counter.Packets
	}
	return out, nil
}

// setHostHold closes (hold) or opens the new flows of every sandbox holding
// more than its share (ConnLimits.HoldShare): the first rule of the limits
// chain, tagged.
func (f *firewall) setHostHold(hold bool) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	ch := &nftables.Chain{Name: limitsChain, Table: f.table}
	rules, err := c.GetRules(f.table, ch)
	if err != nil {
		return fmt.Errorf("read the limits chain: %w", err)
	}
	held := false
	for _, r := range rules {
		if string(r.UserData) == hostHoldTag {
			if hold {
				held = true
				continue
			}
			if err := c.DelRule(r); err != nil {
				return err
			}
		}
	}
	if hold && !held {
		share := &nftables.Set{Table: f.table, Name: shareSet}
		c.InsertRule(&nftables.Rule{Table: f.table, Chain: ch, UserData: []byte(hostHoldTag), Exprs: cat(shareCount(f.lim, share), []expr.Any{
			saddr(),
			&expr.Dynset{SrcRegKey: 1, SetName: f.refused.Name, SetID: f.refused.ID, Operation: uint32(unix.NFT_DYNSET_OP_UPDATE),
				Exprs: []expr.Any{&expr.Counter{}}},
			&expr.Verdict{Kind: expr.VerdictGoto, Chain: "reject"},
		})})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("hold sandboxes' new connections (%v): %w", hold, err)
	}
	return nil
}

// ConnLimits are the bounds the firewall enforces.
func (m *Manager) ConnLimits() ConnLimits { return m.cfg.Conns }

// Refusal is what WatchConnections reports of one sandbox address: the
// new flows the bounds refused it since the last report.
type Refusal struct {
	Addr    netip.Addr
	Refused uint64
}

// WatchConnections follows the host's conntrack table and the refusals,
// every interval, until ctx ends: it holds every sandbox's new flows while
// the table holds HoldAt entries or more (until it is below OpenAt), and
// calls report with the refusals counted since its last look (none: not
// called). Polling is the simple robust way: a set of a counter per
// address that was refused, read once a second, costs nothing when no
// sandbox is refused and the same when thousands of flows are, where a
// log of each refused packet would cost a message each.
func (m *Manager) WatchConnections(ctx context.Context, interval time.Duration, report func([]Refusal)) {
	last := map[netip.Addr]uint64{}
	held := false
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if n, err := ReadConntrack(ConntrackCountPath); err == nil {
			switch {
			case !held && n >= m.cfg.Conns.HoldAt:
				if err := m.fw.setHostHold(true); err != nil {
					m.cfg.Log.Error("connections: hold sandboxes' new connections", "err", err)
				} else {
					held = true
					m.cfg.Log.Warn("connections: the host's conntrack table is filling: every sandbox's new connections are refused until it is below the mark",
						"entries", n, "hold_at", m.cfg.Conns.HoldAt, "open_at", m.cfg.Conns.OpenAt)
				}
			case held && n < m.cfg.Conns.OpenAt:
				if err := m.fw.setHostHold(false); err != nil {
					m.cfg.Log.Error("connections: let sandboxes' new connections again", "err", err)
				} else {
					held = false
					m.cfg.Log.Info("connections: the host's conntrack table has room again: sandboxes' new connections are let", "entries", n)
				}
			}
		}
		now, err := m.fw.refusals()
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				m.cfg.Log.Warn("connections: read refusals", "err", err)
			}
		} else {
			out := refusalDeltas(last, now)
			last = now
			if len(out) > 0 {
				report(out)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refusalDeltas is what was refused between two reads of the counters,
// by address. A counter lower than before is an entry that went (an hour
// without refusals) and came back: all of it is new.
func refusalDeltas(last, now map[netip.Addr]uint64) []Refusal {
	var out []Refusal
	for a, n := range now {
		d := n
		if prev, ok := last[a]; ok && prev <= n {
			d = n - prev
		}
		if d > 0 {
			out = append(out, Refusal{Addr: a, Refused: d})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr.Less(out[j].Addr) })
	return out
}
