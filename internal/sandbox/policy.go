package sandbox

import (
	"context"
	"net/netip"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/network"
	"github.com/useshards/shard/internal/store"
)

// SetPolicy sets (nil: clears) a sandbox's egress policy. It is enforced
// outside the sandbox, keyed on its address, so it takes effect at once on
// a running sandbox and holds across stop and start. A fork gets a copy.
func (s *Service) SetPolicy(ctx context.Context, idOrName string, p *store.Policy) (*store.Sandbox, error) {
	np := toNetPolicy(p)
	if np != nil {
		if err := np.Validate(); err != nil {
			return nil, errdefs.Invalid("%v", err)
		}
		if err := s.cfg.Net.CheckPolicy(np); err != nil {
			return nil, errdefs.New(errdefs.KindInvalid, client.CodePolicyRefused, "%v", err)
		}
		if np.Empty() {
			np, p = nil, nil
		} else {
			p = &store.Policy{DenyAll: np.DenyAll, Allow: np.Allow, Deny: np.Deny}
		}
	}
	sb, unlock, err := s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.adm.ledgerRoom(ctx, sb.Project, "set the policy of sandbox "+sb.Name); err != nil {
		return nil, err
	}
	ip, err := netip.ParseAddr(sb.IP)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.Net.SetPolicy(ip, np); err != nil {
		return nil, errdefs.Wrap(errdefs.KindInternal, client.CodePolicyFailed, err)
	}
	ev := &store.EventSpec{Type: ledger.PolicySet, Data: p}
	if p == nil {
		ev = &store.EventSpec{Type: ledger.PolicyCleared}
	}
	return s.cfg.Store.UpdateSandbox(ctx, sb.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
		r.Policy = p
		return ev, nil
	})
}

func toNetPolicy(p *store.Policy) *network.Policy {
	if p == nil {
		return nil
	}
	return &network.Policy{DenyAll: p.DenyAll, Allow: append([]string(nil), p.Allow...), Deny: append([]string(nil), p.Deny...)}
}

// applyPolicy installs a record's policy (a fork's or a restore's, before
// it starts; every sandbox's after a server start, since the firewall
// table is made anew then).
func (s *Service) applyPolicy(sb *store.Sandbox) error {
	ip, err := netip.ParseAddr(sb.IP)
	if err != nil {
		return err
	}
	return s.cfg.Net.SetPolicy(ip, toNetPolicy(sb.Policy))
}
