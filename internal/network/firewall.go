package network

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
)

// firewall owns one nftables table, named after the bridge (ip family), so
// two servers with two bridges never touch each other's rules: NAT for the
// sandboxes' egress, and no way from a sandbox into the host except replies
// to connections the host opened (the server dialing an agent).
type firewall struct {
	bridge string
	subnet netip.Prefix
}

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

func newFirewall(bridge string, subnet netip.Prefix) (*firewall, error) {
	fw := &firewall{bridge: bridge, subnet: subnet}
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	tableName := bridge
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: tableName}
	// Start from a clean table: rules are ours alone, made anew each start.
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("reset table %s: %w", tableName, err)
	}
	t = c.AddTable(t)

	netAddr := subnet.Addr().As4()
	m := maskBytes(subnet.Bits())
	inSubnet := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: netAddr[:]},
	}
	established := []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
	iif := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
	}
	oif := func(op expr.CmpOp) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: op, Register: 1, Data: ifname(bridge)},
		}
	}
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	drop := &expr.Verdict{Kind: expr.VerdictDrop}
	cat := func(parts ...[]expr.Any) []expr.Any {
		var out []expr.Any
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}

	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: cat(inSubnet, oif(expr.CmpOpNeq), []expr.Any{&expr.Masq{}})})

	policyAccept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	// Out of a sandbox to the world: allowed (egress policy comes later).
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(iif, oif(expr.CmpOpNeq), []expr.Any{accept})})
	// Into a sandbox from elsewhere: only replies.
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(oif(expr.CmpOpEq), established, []expr.Any{accept})})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(oif(expr.CmpOpEq), []expr.Any{drop})})

	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	// From a sandbox to the host itself: only replies to what the host opened.
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(iif, established, []expr.Any{accept})})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(iif, []expr.Any{drop})})

	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("write table %s: %w", tableName, err)
	}
	return fw, nil
}

func maskBytes(bits int) []byte {
	var m [4]byte
	for i := 0; i < bits; i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return m[:]
}
