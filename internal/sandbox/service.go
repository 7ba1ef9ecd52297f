package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/useshards/shard/internal/hostdir"
	"github.com/useshards/shard/internal/hostdisk"
	"github.com/useshards/shard/internal/kmutex"
	"github.com/useshards/shard/internal/metrics"
	"github.com/useshards/shard/internal/network"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/secrets"
	"github.com/useshards/shard/internal/store"
)

// Config wires the service.
type Config struct {
	DataDir         string
	AgentBinary     string // host path of the shard binary; a copy is mounted into sandboxes
	DefaultProvider string
	Providers       []provider.Provider // every known provider, available or not
	Images          Images
	Storage         Storage
	Net             Network
	Store           *store.Store     // the one record; a unit test opens a real one in a temporary directory
	Secrets         *secrets.Service // nil: no secrets (grants refused)
	Log             *slog.Logger
	StopTimeout     time.Duration    // how long processes get to end on stop
	FreezeTimeout   time.Duration    // how long a fork may hold its source frozen
	MaxSandboxes    int              // most sandboxes at once, forks included (0: no limit)
	DefaultDisk     int64            // disk bound of a create that gives none (0: DefaultDisk)
	LedgerRetention time.Duration    // ledger sessions left this long after their sandbox are removed (0: kept)
	LedgerMinFree   int64            // requests that add to the ledger are refused below this much free on DataDir's filesystem (0: hostdisk.DefaultReserve; < 0: no floor)
	Disk            *hostdisk.Budget // DataDir's filesystem, which memory images are written within (nil: DataDir's with hostdisk.DefaultReserve)
	// MemoryOvercommit admits running sandboxes' memory bounds (and warm
	// spares') up to MemTotal times it (0: not admitted).
	MemoryOvercommit float64
	Limits           Limits           // bounds a sandbox may have at most; zero fields: the host's (HostLimits)
	Metrics          *metrics.Metrics // nil: nothing counted
	MaxDiffs         int              // diffs at once, more waiting (0: DefaultMaxDiffs)
	// Ahead is how many sandboxes of each shape that forks and restores
	// use are made ahead of them (ahead.go); 0: none.
	Ahead int
	// AgentAddr is where a sandbox's agent listens (nil: its address and
	// proto.Port); a unit test points it at an agent of its own.
	AgentAddr func(sb *store.Sandbox) string
}

// Service is the sandbox lifecycle: create, start, stop, remove, fork,
// exec, get and list, and the steps its jobs share (boot, halt, destroy,
// a state's move, a sandbox's lock). The jobs over it (Admission, Files,
// Access, Saved, Sessions) are types of their own, reached through its
// accessors.
type Service struct {
	cfg       Config
	providers map[string]provider.Provider
	caps      map[string]provider.Capabilities
	order     []string
	agentDir  string // holds the copy of the shard binary that sandboxes run

	addrs *network.Pool // the sandboxes' addresses
	locks keyedMutex    // one lifecycle step at a time per sandbox (and environment, snapshot)
	cks   ckRefs        // checkpoints being read by restores, or dropped

	execs execSet    // running execs, ended when their sandbox stops
	watch *watcher   // notices sandboxes that end on their own
	mem   memWatches // gVisor sandboxes' memory cgroups, for their OOM guards

	life     life         // the service's own goroutines, waited for by Close (life.go)
	ahead    *aheadPool   // sandboxes made ahead for forks and restores (ahead.go)
	imageUse kmutex.Keyed // by image digest: makes against removals (images.go)

	// The jobs, each pointing back here (link).
	adm      Admission // host memory, projects' quotas, disk room (admission.go)
	files    Files     // files in and out, diffs, the fork tree (files.go)
	access   Access    // secret grants, egress policies, refused connections (grants.go)
	saved    Saved     // checkpoints, snapshots, environments, their retention (saved.go)
	sessions Sessions  // ledger sessions resumed, removed, expired (resume.go)
}

// link points the jobs at s: New's, or a test's hand-made Service.
func link(s *Service) *Service {
	s.adm.s, s.files.s, s.access.s, s.saved.s, s.sessions.s = s, s, s, s, s
	return s
}

// Admission checks host memory, projects' quotas and disk room before
// anything is made, and reports what projects and the node use.
func (s *Service) Admission() *Admission { return &s.adm }

// Files reads and writes sandboxes' files, and diffs them.
func (s *Service) Files() *Files { return &s.files }

// Access grants secrets to sandboxes and sets their egress policies.
func (s *Service) Access() *Access { return &s.access }

// Saved keeps sandboxes' states: checkpoints, snapshots and environments.
func (s *Service) Saved() *Saved { return &s.saved }

// Sessions resumes ledger sessions and removes them, by hand and past the
// ledger's retention.
func (s *Service) Sessions() *Sessions { return &s.sessions }

// New probes the providers and returns the service. Call Reconcile next.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = 5 * time.Second
	}
	if cfg.FreezeTimeout == 0 {
		cfg.FreezeTimeout = DefaultFreezeTimeout
	}
	s := link(&Service{cfg: cfg, providers: map[string]provider.Provider{}, caps: map[string]provider.Capabilities{}})
	s.watch, s.mem.s = newWatcher(s), s
	s.adm.floor, s.adm.disk = newLedgerFloor(cfg.DataDir, cfg.LedgerMinFree), cfg.Disk
	if s.adm.disk == nil {
		s.adm.disk = hostdisk.New(cfg.DataDir, 0)
	}
	if cfg.MemoryOvercommit > 0 {
		s.adm.overcommit = cfg.MemoryOvercommit
		s.adm.hostMemory = int64(float64(HostLimits().MemoryBytes) * cfg.MemoryOvercommit)
	}
	s.addrs = network.NewPool(cfg.Net.Subnet(), cfg.Net.Gateway(), cfg.Store.AddrInUse, s.adm.checkLimit)
	s.saved.spares = newSparePool(s.saved.makeSpare, s.saved.dropSpare, cfg.Log)
	s.ahead = newAheadPool(s, cfg.Ahead)
	s.saved.spaceKick = make(chan struct{}, 1)
	if cfg.MaxDiffs <= 0 {
		cfg.MaxDiffs = DefaultMaxDiffs
	}
	s.files.diffs = newSlots(cfg.MaxDiffs)
	for _, p := range cfg.Providers {
		c := p.Probe(ctx)
		c.Default = p.Name() == cfg.DefaultProvider
		s.providers[p.Name()] = p
		s.caps[p.Name()] = c
		s.order = append(s.order, p.Name())
		if c.Available {
			cfg.Metrics.Provider(p.Name())
		}
		cfg.Log.Info("provider", "name", c.Name, "available", c.Available, "reason", c.Reason, "fork", c.Fork)
	}
	for _, d := range []string{"run", "checkpoints", "agent"} {
		if err := hostdir.Private(filepath.Join(cfg.DataDir, d)); err != nil {
			return nil, err
		}
	}
	if cfg.AgentBinary == "" {
		return s, nil // a unit test's: its fake runtime runs no agent binary
	}
	dir, err := installAgent(cfg.DataDir, cfg.AgentBinary)
	if err != nil {
		return nil, fmt.Errorf("install the agent: %w", err)
	}
	s.agentDir = dir
	return s, nil
}

// Capabilities lists every provider, available here or not.
func (s *Service) Capabilities() []provider.Capabilities {
	out := make([]provider.Capabilities, 0, len(s.order))
	for _, n := range s.order {
		out = append(out, s.caps[n])
	}
	return out
}

// observe counts a lifecycle step in the metrics, under its provider's
// name (the default for a request that named none; "other" for a name no
// provider has, which a caller chose: labels stay bounded).
func (s *Service) observe(op string, start time.Time, provider *string, err *error) {
	p := *provider
	if p == "" {
		p = s.cfg.DefaultProvider
	}
	if _, ok := s.providers[p]; !ok {
		p = "other"
	}
	s.cfg.Metrics.Op(op, p, time.Since(start), *err)
}
