package sandbox

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/store"
)

// watcher notices sandboxes that end without being asked to: the host's OOM
// killer taking a gVisor Sentry, a crash, a kill from outside. It checks the
// runtime's host process of every running sandbox (a stat of /proc/PID, so
// an idle sandbox costs next to nothing) and marks a dead one failed, with
// the reason, and cleans up its mounts and network; its files stay, and
// `shard start` boots it again.
type watcher struct {
	mu   sync.Mutex
	pids map[string]int // sandbox id -> host pid; guarded by mu
}

// Watch runs until ctx ends, checking every interval.
func (s *Service) Watch(ctx context.Context, interval time.Duration) {
	w := &watcher{pids: map[string]int{}}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.watchOnce(ctx, w)
	}
}

func (s *Service) watchOnce(ctx context.Context, w *watcher) {
	all, err := s.cfg.Store.ListSandboxes(ctx)
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for _, sb := range all {
		if sb.State != StateRunning {
			continue
		}
		seen[sb.ID] = true
		pider, ok := s.providers[sb.Provider].(provider.PIDer)
		if !ok {
			continue
		}
		w.mu.Lock()
		pid, known := w.pids[sb.ID]
		w.mu.Unlock()
		if !known {
			// First look at this one: it may have died before we knew
			// its pid.
			if st, err := s.providers[sb.Provider].Status(ctx, sb.ID); err == nil && (st == provider.StatusStopped || st == provider.StatusAbsent) {
				s.markDead(ctx, sb)
				continue
			}
			p, err := pider.InitPID(ctx, sb.ID)
			if err != nil {
				continue // look again next round
			}
			w.mu.Lock()
			w.pids[sb.ID] = p
			w.mu.Unlock()
			pid = p
		}
		if processAlive(pid) {
			continue
		}
		s.markDead(ctx, sb)
		w.mu.Lock()
		delete(w.pids, sb.ID)
		w.mu.Unlock()
	}
	w.mu.Lock()
	for id := range w.pids {
		if !seen[id] {
			delete(w.pids, id) // stopped, removed or restarted: look again
		}
	}
	w.mu.Unlock()
}

// processAlive: the pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// The state is the field after the parenthesised command name.
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z' && b[i+2] != 'X'
	}
	return true
}

func (s *Service) markDead(ctx context.Context, sb *store.Sandbox) {
	unlock := s.lock(sb.ID)
	defer unlock()
	cur, err := s.cfg.Store.GetSandbox(ctx, sb.ID)
	if err != nil || cur.State != StateRunning {
		return // a stop, remove or fork got there first
	}
	if st, err := s.providers[cur.Provider].Status(ctx, cur.ID); err == nil && st == provider.StatusRunning {
		return // the runtime says it runs (a restart under another pid)
	}
	ooms := s.halt(ctx, cur, false)
	reason := "the sandbox ended on its own (its runtime process is gone)"
	if ooms > 0 {
		reason = "the sandbox ran out of memory and the host killed it"
	}
	s.cfg.Log.Warn("sandbox died", "sandbox", cur.ID, "name", cur.Name, "reason", reason)
	s.cfg.Store.UpdateSandbox(ctx, cur.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
		r.State, r.StoppedAt, r.Error = StateFailed, time.Now().UTC(), reason
		r.OOMKills += ooms
		return &store.EventSpec{Type: "sandbox.failed", Data: map[string]string{"reason": reason}}, nil
	})
}
