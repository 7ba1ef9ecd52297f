package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/network"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

// connEventEvery is how often a sandbox whose connections keep being
// refused gets a sandbox.connections_refused event: the first refusal at
// once, then what was refused since, at most this often (a sandbox past
// its bound is refused per packet; its ledger must not grow so).
const connEventEvery = time.Minute

// connRefusals is what was refused of each sandbox and not yet recorded.
type connRefusals struct {
	mu      sync.Mutex
	pending map[string]uint64    // sandbox id → refused since its last event; guarded by mu
	last    map[string]time.Time // sandbox id → its last event; guarded by mu
}

// due adds n refusals to sandbox id's and says how many to record now (0:
// not yet).
func (c *connRefusals) due(id string, n uint64, now time.Time) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending, c.last = map[string]uint64{}, map[string]time.Time{}
	}
	c.pending[id] += n
	if t, ok := c.last[id]; ok && now.Sub(t) < connEventEvery {
		return 0
	}
	out := c.pending[id]
	delete(c.pending, id)
	c.last[id] = now
	return out
}

// ConnectionsRefused takes what network.Manager.WatchConnections reports:
// it counts the refusals in the metrics and records them in the ledger
// sessions of the sandboxes at those addresses.
func (a *Access) ConnectionsRefused(ctx context.Context, lim network.ConnLimits, rs []network.Refusal) {
	var n uint64
	for _, r := range rs {
		n += r.Refused
	}
	a.s.cfg.Metrics.ConnectionsRefused(n)
	ctx = project.Unscoped(ctx, "refused connections: the sandboxes of every project at those addresses")
	all, err := a.s.cfg.Store.ListSandboxes(ctx)
	if err != nil {
		a.s.cfg.Log.Warn("connections refused: list sandboxes", "err", err)
		return
	}
	byIP := map[string]*store.Sandbox{}
	for _, sb := range all {
		if sb.State == StateRunning {
			byIP[sb.IP] = sb
		}
	}
	now := time.Now()
	for _, r := range rs {
		sb := byIP[r.Addr.String()]
		if sb == nil {
			continue // gone, or an address no running sandbox holds
		}
		k := a.conns.due(sb.ID, r.Refused, now)
		if k == 0 {
			continue
		}
		a.s.cfg.Log.Warn("sandbox connections refused", "sandbox", sb.ID, "name", sb.Name, "refused", k, "limit", lim.PerSandbox)
		ev := &store.EventSpec{Type: ledger.ConnectionsRefused, Data: ledger.ConnectionsRefusedData{
			Refused: int64(k), Limit: lim.PerSandbox, Rate: lim.Rate,
			Message: fmt.Sprintf("new connections refused: a sandbox holds at most %d at once and opens at most %d a second (past a burst of %d); every sandbox's are refused while the host's connection table is three quarters full",
				lim.PerSandbox, lim.Rate, lim.Burst)}}
		if err := a.s.cfg.Store.AddEvent(ctx, sb, ev); err != nil {
			a.s.cfg.Log.Warn("connections refused: ledger", "sandbox", sb.ID, "err", err)
		}
	}
}
