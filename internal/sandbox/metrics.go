package sandbox

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/useshards/shard/internal/metrics"
	"github.com/useshards/shard/internal/project"
)

// MetricsState is what a metrics scrape reads: every sandbox of every
// project by state and provider (zeros included for the providers that run
// here, so a scraper sees a state empty rather than unknown; a provider
// that cannot run here would only add series that are always 0), warm
// spares ready, and disk.
func (s *Service) MetricsState() (metrics.State, error) {
	ctx, cancel := context.WithTimeout(project.Unscoped(context.Background(), "the metrics count every project's sandboxes"), 5*time.Second)
	defer cancel()
	st := metrics.State{Sandboxes: map[metrics.SandboxKey]int{}, Store: map[string]int64{}, DataDir: map[string]int64{}}
	for state := range transitions {
		for _, p := range s.order {
			if !s.caps[p].Available {
				continue
			}
			st.Sandboxes[metrics.SandboxKey{State: state, Provider: p}] = 0
		}
	}
	var errs []error
	sbs, err := s.cfg.Store.ListSandboxes(ctx)
	errs = append(errs, err)
	for _, sb := range sbs {
		st.Sandboxes[metrics.SandboxKey{State: sb.State, Provider: sb.Provider}]++
	}
	st.SparesReady = s.saved.spares.ready()
	st.AheadReady = s.ahead.ready()
	sp, err := s.cfg.Storage.Space()
	errs = append(errs, err)
	if err == nil {
		st.Store["capacity"], st.Store["promised"], st.Store["meta"], st.Store["free"] = sp.Capacity, sp.Promised, sp.Meta, sp.Free
	}
	var fs unix.Statfs_t
	err = unix.Statfs(s.cfg.DataDir, &fs)
	errs = append(errs, err)
	if err == nil {
		st.DataDir["size"] = int64(fs.Blocks) * int64(fs.Bsize)
		st.DataDir["free"] = int64(fs.Bavail) * int64(fs.Bsize)
	}
	if err := errors.Join(errs...); err != nil {
		s.cfg.Log.Warn("metrics: reading the server's state", "err", err)
		return st, err
	}
	return st, nil
}
