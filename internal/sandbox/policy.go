package sandbox

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/network"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

// SetPolicy sets (nil: clears) a sandbox's egress policy. It is enforced
// outside the sandbox, keyed on its address, so it takes effect at once on
// a running sandbox and holds across stop and start. A fork gets a copy.
func (a *Access) SetPolicy(ctx context.Context, idOrName string, p *store.Policy) (*store.Sandbox, error) {
	np := toNetPolicy(p)
	if np != nil {
		if err := np.Validate(); err != nil {
			return nil, errdefs.Invalid("%v", err)
		}
		if err := a.s.cfg.Net.CheckPolicy(np); err != nil {
			return nil, errdefs.New(errdefs.KindInvalid, client.CodePolicyRefused, "%v", err)
		}
		if np.Empty() {
			np, p = nil, nil
		} else {
			p = &store.Policy{DenyAll: np.DenyAll, Allow: np.Allow, Deny: np.Deny}
		}
	}
	sb, unlock, err := a.s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := a.s.adm.ledgerRoom(ctx, sb.Project, "set the policy of sandbox "+sb.Name); err != nil {
		return nil, err
	}
	ip, err := netip.ParseAddr(sb.IP)
	if err != nil {
		return nil, err
	}
	if err := a.s.cfg.Net.SetPolicy(ip, np); err != nil {
		return nil, errdefs.Wrap(errdefs.KindInternal, client.CodePolicyFailed, err)
	}
	ev := &store.EventSpec{Type: ledger.PolicySet, Data: p}
	if p == nil {
		ev = &store.EventSpec{Type: ledger.PolicyCleared}
	}
	return a.s.cfg.Store.UpdateSandbox(ctx, sb.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
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

// ApplyPolicies installs every stored network policy in the firewall, which
// is made anew (holding all egress) at each server start; call it before
// the network is opened and the DNS proxy started. A policy that cannot be
// installed fails closed: its sandbox is held at deny-all, and told in the
// log.
func (a *Access) ApplyPolicies(ctx context.Context) error {
	ctx = project.Unscoped(ctx, "start-up: every project's network policies")
	all, err := a.s.cfg.Store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	for _, sb := range all {
		if sb.Policy == nil {
			continue
		}
		if err := a.s.applyPolicy(sb); err != nil {
			a.s.cfg.Log.Error("network policy: cannot install it; the sandbox is held at deny-all", "sandbox", sb.ID, "err", err)
			if ip, perr := netip.ParseAddr(sb.IP); perr == nil {
				if err := a.s.cfg.Net.SetPolicy(ip, &network.Policy{DenyAll: true}); err != nil {
					return fmt.Errorf("hold sandbox %s at deny-all: %w", sb.ID, err)
				}
			}
		}
	}
	return nil
}
