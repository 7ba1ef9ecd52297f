// Package sandbox is shard's lifecycle: it creates, starts, stops, removes
// and execs into sandboxes, over a provider (the runtime), the image cache,
// the per-sandbox files (rootfs) and network, with the metadata store as the
// one record of what exists. It knows nothing of HTTP.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/useshards/shard/internal/agent"
	"github.com/useshards/shard/internal/envlist"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/hostdir"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/network"
	"github.com/useshards/shard/internal/oci"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/rootfs"
	"github.com/useshards/shard/internal/secrets"
	"github.com/useshards/shard/internal/store"
	"github.com/useshards/shard/internal/units"
)

// Config wires the service.
type Config struct {
	DataDir         string
	AgentBinary     string // host path of the shard binary; a copy is mounted into sandboxes
	DefaultProvider string
	Providers       []provider.Provider // every known provider, available or not
	Images          *image.Store
	Storage         *rootfs.Storage
	Net             *network.Manager
	Store           *store.Store
	Secrets         *secrets.Service // nil: no secrets (grants refused)
	Log             *slog.Logger
	StopTimeout     time.Duration // how long processes get to end on stop
	FreezeTimeout   time.Duration // how long a fork may hold its source frozen
	MaxSandboxes    int           // most sandboxes at once, forks included (0: no limit)
	DefaultDisk     int64         // disk bound of a create that gives none (0: DefaultDisk)
	LedgerRetention time.Duration // ledger sessions left this long after their sandbox are removed (0: kept)
	LedgerMinFree   int64         // requests that add to the ledger are refused below this much free on DataDir's filesystem (0: image.Reserve; < 0: no floor)
	Limits          Limits        // bounds a sandbox may have at most; zero fields: the host's (HostLimits)
}

// Service is the sandbox lifecycle.
type Service struct {
	cfg       Config
	providers map[string]provider.Provider
	caps      map[string]provider.Capabilities
	order     []string
	agentDir  string // holds the copy of the shard binary that sandboxes run

	allocMu  sync.Mutex      // guards ip allocation
	lastIP   netip.Addr      // guarded by allocMu
	reserved map[string]bool // addresses held by warm spares; guarded by allocMu

	sparesMu     sync.Mutex
	spares       map[string]*spare // environment name → its warm spare; guarded by sparesMu
	sparesClosed bool              // at shutdown: stage no more; guarded by sparesMu
	sparesWG     sync.WaitGroup    // spares being staged

	host  hostSpace    // the host disk promised to memory images being written
	execs execSet      // running execs, ended when their sandbox stops
	watch *watcher     // notices sandboxes that end on their own
	mem   memWatches   // gVisor sandboxes' memory cgroups, for their OOM guards
	floor *ledgerFloor // nil in tests that make a Service by hand: no floor

	locksMu sync.Mutex
	locks   map[string]*sync.Mutex // per-sandbox lifecycle locks; guarded by locksMu
	ckUses  map[string]*ckUse      // checkpoints being read or dropped; guarded by locksMu
}

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
	s := &Service{cfg: cfg, providers: map[string]provider.Provider{}, caps: map[string]provider.Capabilities{}, locks: map[string]*sync.Mutex{}, ckUses: map[string]*ckUse{},
		reserved: map[string]bool{}, spares: map[string]*spare{}, watch: newWatcher(), floor: newLedgerFloor(cfg.DataDir, cfg.LedgerMinFree)}
	for _, p := range cfg.Providers {
		c := p.Probe(ctx)
		c.Default = p.Name() == cfg.DefaultProvider
		s.providers[p.Name()] = p
		s.caps[p.Name()] = c
		s.order = append(s.order, p.Name())
		cfg.Log.Info("provider", "name", c.Name, "available", c.Available, "reason", c.Reason, "fork", c.Fork)
	}
	for _, d := range []string{"run", "checkpoints", "agent"} {
		if err := hostdir.Private(filepath.Join(cfg.DataDir, d)); err != nil {
			return nil, err
		}
	}
	dir, err := installAgent(cfg.DataDir, cfg.AgentBinary)
	if err != nil {
		return nil, fmt.Errorf("install the agent: %w", err)
	}
	s.agentDir = dir
	return s, nil
}

// Store is the metadata store (the API reads the ledger from it).
func (s *Service) Store() *store.Store { return s.cfg.Store }

// Capabilities lists every provider, available here or not.
func (s *Service) Capabilities() []provider.Capabilities {
	out := make([]provider.Capabilities, 0, len(s.order))
	for _, n := range s.order {
		out = append(out, s.caps[n])
	}
	return out
}

// lockSandbox finds a sandbox by id or name and holds its lifecycle lock
// until unlock; the record it returns is read under the lock, so no other
// lifecycle step changed it since.
func (s *Service) lockSandbox(ctx context.Context, idOrName string) (*store.Sandbox, func(), error) {
	sb, err := s.cfg.Store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, nil, err
	}
	unlock := s.lock(sb.ID)
	if sb, err = s.cfg.Store.GetSandbox(ctx, sb.ID); err != nil {
		unlock()
		return nil, nil, err
	}
	return sb, unlock, nil
}

func (s *Service) lock(id string) func() {
	s.locksMu.Lock()
	m, ok := s.locks[id]
	if !ok {
		m = &sync.Mutex{}
		s.locks[id] = m
	}
	s.locksMu.Unlock()
	m.Lock()
	return m.Unlock
}

// CreateRequest is what a user asks for.
type CreateRequest struct {
	Name  string
	Image string
	store.Bounds
	Env      []string
	Provider string
	// FromSnapshot starts the sandbox with a snapshot's files (and its
	// image and disk size) instead of empty ones.
	FromSnapshot string
	// Internal: resume makes a sandbox of the very image (Digest) a session
	// started with, and says so in its sandbox.created event.
	Digest      string
	ResumedFrom string
}

// Defaults for what a create leaves out.
const (
	DefaultMemory = 512 << 20
	DefaultCPU    = 1000
	DefaultDisk   = 2 << 30
	DefaultPids   = 4096
	MinMemory     = 32 << 20
	MinDisk       = 16 << 20
)

// validName checks a sandbox name ("" is fine: the id becomes the name);
// snapshots and environments follow the same rule (names.Name).
func validName(name string) error {
	if name == "" {
		return nil
	}
	return names.Name("", name)
}

// validate fills in the bounds a create leaves out and refuses what this
// host cannot honour (CheckCreate), then checks the image and provider.
func (s *Service) validate(req *CreateRequest) error {
	if req.DiskBytes == 0 && s.cfg.DefaultDisk > 0 {
		req.DiskBytes = s.cfg.DefaultDisk
	}
	lim := s.Limits()
	withDefaults(req, lim)
	if err := checkCreate(req, lim); err != nil {
		return err
	}
	if strings.TrimSpace(req.Image) == "" {
		return errdefs.Invalid("an image is required")
	}
	if req.Provider == "" {
		req.Provider = s.cfg.DefaultProvider
	}
	if req.Provider == "gvisor" && req.CPUMillis < MinGvisorCPU {
		return errdefs.Invalid("cpu %s is too little for gvisor: at least %s (its kernel runs in user space, and boots in minutes below that); runc takes from %s",
			units.FormatCPU(req.CPUMillis), units.FormatCPU(MinGvisorCPU), units.FormatCPU(MinCPU))
	}
	c, ok := s.caps[req.Provider]
	if !ok {
		return errdefs.Invalid("unknown provider %q: shard capabilities lists them", req.Provider)
	}
	if !c.Available {
		return errdefs.Unsupported("provider %s is not available on this host: %s", req.Provider, c.Reason)
	}
	return nil
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newID is a sandbox (or checkpoint) id: 12 hex digits, a fixed length, so
// that no id is a prefix of another (runsc matches ids by prefix).
func newID() string { return randomHex(6) }

func newToken() string { return randomHex(24) }

// Create makes and starts a sandbox. On any failure nothing is left behind.
func (s *Service) Create(ctx context.Context, req CreateRequest) (*store.Sandbox, error) {
	var snap *store.Snapshot
	if req.FromSnapshot != "" {
		var err error
		if snap, err = s.cfg.Store.GetSnapshot(ctx, req.FromSnapshot); err != nil {
			return nil, err
		}
		if req.Image == "" {
			req.Image = snap.Image
		} else if req.Image != snap.Image && req.Image != snap.ImageDigest {
			return nil, errdefs.Invalid("snapshot %s holds files over image %s: leave the image out, or give that one", snap.Name, snap.Image)
		}
		if req.DiskBytes != 0 && req.DiskBytes != snap.DiskBytes {
			return nil, errdefs.Invalid("snapshot %s has a disk of %d bytes: a sandbox from it has that size (leave --disk out)", snap.Name, snap.DiskBytes)
		}
		req.DiskBytes = snap.DiskBytes
	}
	if err := s.validate(&req); err != nil {
		return nil, err
	}
	if err := s.floor.check("create a sandbox"); err != nil {
		return nil, err
	}
	// Checked again when the files are made; here so that a create that
	// cannot fit leaves no record and pulls no image.
	if err := s.cfg.Storage.Fits(req.DiskBytes, "a sandbox with a "+units.FormatSize(req.DiskBytes)+" disk"); err != nil {
		return nil, err
	}
	var img *image.Image
	var err error
	if snap != nil {
		// The snapshot's files sit over the very image they were made on,
		// whatever its tag names today.
		if img, err = s.cfg.Images.Get(ctx, snap.ImageDigest); err != nil {
			return nil, fmt.Errorf("image %s of snapshot %s: %w", snap.Image, snap.Name, err)
		}
	} else if req.Digest != "" {
		if img, err = s.cfg.Images.Get(ctx, req.Digest); err != nil {
			return nil, fmt.Errorf("image %s (%s): %w", req.Image, req.Digest, err)
		}
	} else if img, err = s.cfg.Images.Ensure(ctx, req.Image, nil); err != nil {
		return nil, err
	}
	env := envlist.Merge(img.Config.Env, req.Env)
	if snap != nil {
		env = envlist.Merge(snap.Env, req.Env)
	}
	if !envlist.Has(env, "PATH") {
		env = append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	shape := store.Shape{Image: req.Image, ImageDigest: img.Digest, Provider: req.Provider, Bounds: req.Bounds, Env: env}
	created := ledger.CreatedOf(shape)
	created.ResumedFrom = req.ResumedFrom
	if snap != nil {
		created.FromSnapshot = snap.ID
	}
	recs, err := s.insertRecords(ctx, []*store.Sandbox{{
		Name: req.Name, Shape: shape, Token: newToken(), AgentDir: s.agentDir,
	}}, func(*store.Sandbox) (string, ledger.CreatedData) { return "", created })
	if err != nil {
		return nil, err
	}
	sb := recs[0]
	log := s.cfg.Log.With("sandbox", sb.ID, "name", sb.Name)
	// From here on the record exists: a failure must remove every piece.
	bg := context.WithoutCancel(ctx)
	if snap != nil {
		err = s.filesFromSnapshot(ctx, snap, sb)
	} else {
		err = s.cfg.Storage.Create(ctx, sb.ID, req.DiskBytes)
	}
	if err != nil {
		s.destroy(bg, sb, log)
		return nil, fmt.Errorf("create sandbox %s: %w", sb.Name, err)
	}
	if err := s.boot(ctx, sb, img.Layers); err != nil {
		s.destroy(bg, sb, log)
		return nil, fmt.Errorf("create sandbox %s: %w", sb.Name, err)
	}
	out, err := s.move(bg, sb.ID, StateRunning, nil, func(r *store.Sandbox) { r.StartedAt = time.Now().UTC() })
	if err != nil {
		s.destroy(bg, sb, log)
		return nil, err
	}
	log.Info("created", "image", req.Image, "provider", req.Provider, "ip", sb.IP)
	return out, nil
}

// checkLimit refuses one more sandbox past the server's limit. Every
// project's count, whoever asks: the limit is the server's, not a
// project's (a project's list gave each project a limit of its own).
// Caller holds allocMu.
func (s *Service) checkLimit() error {
	if s.cfg.MaxSandboxes > 0 && s.cfg.Store.SandboxCount() >= s.cfg.MaxSandboxes {
		return errdefs.Conflict("sandbox_limit", "this server holds at most %d sandboxes (forks count too): remove one first", s.cfg.MaxSandboxes)
	}
	return nil
}

// allocate picks the next free address after the last one handed out.
// Caller holds allocMu.
func (s *Service) allocate() (netip.Addr, error) {
	if err := s.checkLimit(); err != nil {
		return netip.Addr{}, err
	}
	// Every project's addresses are taken, whoever asks (a project's list
	// gave two projects' sandboxes one address): the store keeps them all
	// (no list of every record per create), and spares hold theirs.
	used := func(ip string) bool { return s.reserved[ip] || s.cfg.Store.AddrInUse(ip) }
	ip, err := nextFree(s.cfg.Net.Subnet(), s.cfg.Net.Gateway(), s.lastIP, used)
	if err != nil {
		return netip.Addr{}, err
	}
	s.lastIP = ip
	return ip, nil
}

// nextFree is the first address after last (round robin in subnet, past
// the gateway, never the broadcast address) that used does not claim.
// Round robin from the last address handed out: an address just freed is
// the last to be reused, so stale neighbour entries and connections to a
// removed sandbox never reach a new one.
func nextFree(subnet netip.Prefix, gateway, last netip.Addr, used func(string) bool) (netip.Addr, error) {
	first := gateway.Next()
	ip := last.Next()
	if !last.IsValid() || !subnet.Contains(ip) {
		ip = first
	}
	for tries := 0; ; tries++ {
		if !subnet.Contains(ip.Next()) { // the broadcast address
			ip = first
			continue
		}
		if !used(ip.String()) {
			return ip, nil
		}
		if tries > 1<<20 {
			return netip.Addr{}, errdefs.Unavailable("no_addresses", "no free address left in %s", subnet)
		}
		ip = ip.Next()
	}
}

func (s *Service) runDir(id string) string { return filepath.Join(s.cfg.DataDir, "run", id) }

// boot mounts the rootfs, makes the network and starts the runtime, then
// waits for the agent. On error it undoes its own steps.
func (s *Service) boot(ctx context.Context, sb *store.Sandbox, layers []string) error {
	return s.bootWith(ctx, sb, layers, func(p provider.Provider, inst *provider.Instance) error {
		return p.Start(ctx, inst)
	})
}

// bootWith prepares a sandbox instance (rootfs, network, spec) and hands it
// to run, which starts it (or restores it from a checkpoint); then it waits
// for the agent. On error it undoes every step it made.
func (s *Service) bootWith(ctx context.Context, sb *store.Sandbox, layers []string, run func(provider.Provider, *provider.Instance) error) error {
	st, err := s.stage(ctx, sb, layers)
	if err != nil {
		return err
	}
	return s.launch(ctx, st, run)
}

// staged is a sandbox instance made ready to start: rootfs mounted, netns
// made, spec written; undo takes it down again.
type staged struct {
	sb   *store.Sandbox
	p    provider.Provider
	inst *provider.Instance
	undo []func()
	t0   time.Time
}

func (st *staged) abort() {
	for i := len(st.undo) - 1; i >= 0; i-- {
		st.undo[i]()
	}
	st.undo = nil
}

// stage mounts the rootfs, makes the network namespace and builds the spec.
// On error it undoes its own steps.
func (s *Service) stage(ctx context.Context, sb *store.Sandbox, layers []string) (_ *staged, err error) {
	if layers == nil {
		img, err := s.cfg.Images.Get(ctx, sb.ImageDigest)
		if err != nil {
			return nil, fmt.Errorf("image %s of sandbox %s: %w", sb.Image, sb.Name, err)
		}
		layers = img.Layers
	}
	st := &staged{sb: sb, p: s.providers[sb.Provider], t0: time.Now()}
	defer func() {
		if err != nil {
			st.abort()
		}
	}()
	dir := s.runDir(sb.ID)
	if err := hostdir.Private(dir); err != nil {
		return nil, err
	}
	rootfsDir := filepath.Join(dir, "rootfs")
	if err := s.cfg.Storage.Mount(ctx, sb.ID, layers, rootfsDir); err != nil {
		return nil, err
	}
	st.undo = append(st.undo, func() { rootfs.Unmount(rootfsDir); s.cfg.Storage.Detach(sb.ID) })
	st.phase(s, "rootfs")
	ip, err := netip.ParseAddr(sb.IP)
	if err != nil {
		return nil, err
	}
	// The egress policy keys on the address: install this sandbox's (or
	// clear what an earlier holder of the address had) before anything
	// can leave it.
	if err := s.applyPolicy(sb); err != nil {
		return nil, fmt.Errorf("network policy: %w", err)
	}
	s.cfg.Net.Delete(sb.ID) // a leftover of a crash would block the name
	nsPath, err := s.cfg.Net.Create(ctx, sb.ID, ip)
	if err != nil {
		return nil, err
	}
	st.undo = append(st.undo, func() { s.cfg.Net.Delete(sb.ID) })
	st.phase(s, "netns")
	if st.inst, err = s.instance(sb, rootfsDir, nsPath); err != nil {
		return nil, err
	}
	// From here the runtime may hold a container: take it down on undo.
	st.undo = append(st.undo, func() { st.p.Delete(context.Background(), sb.ID) })
	return st, nil
}

func (st *staged) phase(s *Service, name string) {
	s.cfg.Log.Debug("boot phase", "sandbox", st.sb.ID, "phase", name, "at", time.Since(st.t0))
}

// launch runs a staged instance and waits for its agent. On error it takes
// the instance down.
func (s *Service) launch(ctx context.Context, st *staged, run func(provider.Provider, *provider.Instance) error) (err error) {
	defer func() {
		if err != nil {
			st.abort()
		}
	}()
	if err := run(st.p, st.inst); err != nil {
		return err
	}
	st.phase(s, "runtime")
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.agentFor(st.sb).WaitReady(actx); err != nil {
		return fmt.Errorf("sandbox did not come up: %w (agent log: %s)", err, tail(readTail(st.inst.LogOut, 4096), 400))
	}
	st.phase(s, "agent")
	return nil
}

// sandboxHostname is a sandbox's host name: its name, when that is a valid
// one, else its id.
func sandboxHostname(sb *store.Sandbox) string {
	if len(sb.Name) > 63 || strings.ContainsAny(sb.Name, "_.") {
		return sb.ID
	}
	return sb.Name
}

// hostFiles are the contents of the sandbox's /etc/hosts and /etc/hostname
// (bind mounts of files of these names in its run directory).
func hostFiles(sb *store.Sandbox) map[string][]byte {
	h := sandboxHostname(sb)
	return map[string][]byte{
		"hosts":    []byte(fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", sb.IP, h)),
		"hostname": []byte(h + "\n"),
	}
}

// instance writes the small files a sandbox mounts and builds its spec.
func (s *Service) instance(sb *store.Sandbox, rootfsDir, nsPath string) (*provider.Instance, error) {
	dir := s.runDir(sb.ID)
	hostname := sandboxHostname(sb)
	files := hostFiles(sb)
	files["resolv.conf"] = s.cfg.Net.ResolvConf()
	for n, b := range files {
		if err := oci.WriteFile(filepath.Join(dir, n), b); err != nil {
			return nil, err
		}
	}
	cgroupLimit := sb.MemoryBytes
	pids := sb.Pids
	agentEnv := []string{agent.EnvToken + "=" + sb.Token}
	if sb.Provider == "gvisor" {
		// gVisor has no OOM killer of its own: the agent is the sandbox's
		// OOM killer at the bound, and the host cgroup gets headroom so the
		// host kernel never kills the whole sandbox first.
		agentEnv = append(agentEnv, agent.EnvMemoryLimit+"="+strconv.FormatInt(sb.MemoryBytes, 10))
		cgroupLimit = gvisorCgroupLimit(sb.MemoryBytes)
		// The host pids cgroup also counts the Sentry's threads and the
		// systrap stubs (about one per guest thread), and a Sentry that
		// cannot make a thread hangs the whole sandbox: the bound becomes a
		// backstop of twice the guest's plus room for the Sentry.
		pids = GvisorPidsBackstop(sb.Pids)
	}
	agentDir := sb.AgentDir
	if agentDir == "" {
		agentDir = s.agentDir
	}
	spec := oci.Build(oci.Options{
		Rootfs: rootfsDir, Hostname: hostname, Env: sb.Env, AgentEnv: agentEnv,
		AgentDir: agentDir, Netns: nsPath, CgroupsPath: cgroupsPath(sb.ID),
		MemoryLimit: cgroupLimit, CPUMillis: sb.CPUMillis, Pids: pids,
		ResolvConf: filepath.Join(dir, "resolv.conf"), Hosts: filepath.Join(dir, "hosts"), HostnameF: filepath.Join(dir, "hostname"),
		Devices: s.cfg.Images.Devices(sb.ImageDigest),
	})
	if sb.Provider == "gvisor" {
		gvisorAgentBounds(spec, sb)
	}
	return &provider.Instance{ID: sb.ID, Bundle: dir, Spec: spec, LogOut: filepath.Join(dir, "agent.log"), Log: s.cfg.Log}, nil
}

// gvisorCgroupLimit is the host memory cgroup's bound of a gVisor sandbox
// whose guest may use mem: the bound plus headroom for the Sentry.
func gvisorCgroupLimit(mem int64) int64 { return mem + max(64<<20, mem/4) }

// GvisorPidsBackstop is the host pids bound of a gVisor sandbox whose guest
// may have n processes.
func GvisorPidsBackstop(n int64) int64 { return 2*n + 512 }

// readTail reads at most the last n bytes of a file (a runtime's log, which
// a sandbox may have written to).
func readTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}

func (s *Service) agentFor(sb *store.Sandbox) *agent.Client {
	return &agent.Client{Addr: netip.AddrPortFrom(netip.MustParseAddr(sb.IP), agent.Port).String(), Token: sb.Token}
}

// halt stops the runtime and takes down mounts and network; files stay. It
// returns the OOM kills the instance counted.
func (s *Service) halt(ctx context.Context, sb *store.Sandbox, graceful bool) int64 {
	p := s.providers[sb.Provider]
	s.unwatchMemory(sb.ID)
	var ooms int64
	// Every runtime call is bounded: a Sentry that cannot answer (wedged,
	// stopped) makes runsc wait for ever, and would hold the stop, the
	// sandbox's lock and its execs with it.
	rctx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, runtimeCallTimeout) }
	if graceful {
		c, cancel := rctx()
		st, _ := p.Status(c, sb.ID)
		cancel()
		if st == provider.StatusRunning {
			// Ask the agent while it still answers: after the kill, a dial
			// to its address only times out.
			ooms += s.agentOOMKills(ctx, sb)
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			s.agentFor(sb).Call(sctx, agent.OpSync)
			cancel()
			pid := 0
			if pider, ok := p.(provider.PIDer); ok {
				c, cancel := rctx()
				pid, _ = pider.InitPID(c, sb.ID)
				cancel()
			}
			c, cancel := rctx()
			err := p.Kill(c, sb.ID, 15)
			cancel()
			if err == nil {
				s.waitEnded(ctx, p, sb.ID, pid)
			}
		}
	}
	ooms += cgroupOOMKills(sb.ID)
	c, cancel := rctx()
	err := p.Delete(c, sb.ID)
	cancel()
	if err != nil {
		// The runtime could not take it down in time: kill every process
		// in the sandbox's cgroups (the runtime's own too), then ask again.
		n := killCgroups(sb.ID)
		c, cancel := rctx()
		err = p.Delete(c, sb.ID)
		cancel()
		s.cfg.Log.Warn("delete container: the runtime did not answer; killed the sandbox's processes", "sandbox", sb.ID, "killed", n, "err", err)
	}
	rootfs.Unmount(filepath.Join(s.runDir(sb.ID), "rootfs"))
	s.cfg.Storage.Detach(sb.ID)
	s.cfg.Net.Delete(sb.ID)
	return ooms
}

// runtimeCallTimeout bounds one runtime call of a halt.
const runtimeCallTimeout = 10 * time.Second

// killCgroups sends SIGKILL to every process in sandbox id's cgroups, under
// every controller (v1) and the unified hierarchy, and returns how many.
func killCgroups(id string) int {
	seen := map[int]bool{}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + cgroupsPath(id))
	dirs = append(dirs, "/sys/fs/cgroup"+cgroupsPath(id))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && !seen[pid] {
				seen[pid] = true
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return len(seen)
}

// destroy removes every piece of a sandbox and its record.
func (s *Service) destroy(ctx context.Context, sb *store.Sandbox, log *slog.Logger) error {
	s.halt(ctx, sb, false)
	s.endExecs(sb.ID, "sandbox "+sb.Name+" was removed while the command ran")
	var errs []error
	if ip, err := netip.ParseAddr(sb.IP); err == nil && sb.Policy != nil {
		if err := s.cfg.Net.SetPolicy(ip, nil); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.cfg.Storage.Remove(ctx, sb.ID); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(s.runDir(sb.ID)); err != nil {
		errs = append(errs, err)
	}
	if err := s.cfg.Store.DeleteSandbox(ctx, sb.ID, &store.EventSpec{Type: "sandbox.removed"}); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		log.Error("remove", "err", err)
		return err
	}
	return nil
}

// Get finds a sandbox by id or name, with live figures for a running one.
func (s *Service) Get(ctx context.Context, idOrName string) (*store.Sandbox, error) {
	sb, err := s.cfg.Store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	if sb.State == StateRunning {
		sb.OOMKills += s.oomKills(ctx, sb)
	}
	return sb, nil
}

// List returns every sandbox.
func (s *Service) List(ctx context.Context) ([]*store.Sandbox, error) {
	return s.cfg.Store.ListSandboxes(ctx)
}

// waitEnded waits up to the stop timeout for the runtime to end after a
// kill: by watching its host process when the provider names it (a stat of
// /proc), else by asking the runtime (a process per look).
func (s *Service) waitEnded(ctx context.Context, p provider.Provider, id string, pid int) {
	deadline := time.Now().Add(s.cfg.StopTimeout)
	for time.Now().Before(deadline) {
		if pid > 0 {
			if !processAlive(pid) {
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		c, cancel := context.WithDeadline(ctx, deadline)
		st, err := p.Status(c, id)
		cancel()
		if err != nil || st != provider.StatusRunning {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// oomKills counts processes killed for memory in the running instance: by
// the host kernel (memory cgroup) and, on gVisor, by the agent's guard.
func (s *Service) oomKills(ctx context.Context, sb *store.Sandbox) int64 {
	return cgroupOOMKills(sb.ID) + s.agentOOMKills(ctx, sb)
}

// cgroupOOMKills is the host kernel's OOM kill count in the sandbox's
// memory cgroup (gone once the runtime deletes the container).
func cgroupOOMKills(id string) int64 {
	var n int64
	// runc's commands have a memory cgroup of their own below the
	// container's (internal/provider/runc), and v1 counts a kill only
	// where the limit was hit.
	for _, sub := range []string{"", "/sandbox"} {
		b, err := os.ReadFile("/sys/fs/cgroup/memory" + cgroupsPath(id) + sub + "/memory.oom_control")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				k, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += k
			}
		}
	}
	return n
}

// agentOOMKills is what the agent's OOM guard killed (gVisor only).
func (s *Service) agentOOMKills(ctx context.Context, sb *store.Sandbox) int64 {
	if sb.Provider != "gvisor" {
		return 0
	}
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if r, err := s.agentFor(sb).Call(cctx, agent.OpStats); err == nil {
		return r.OOMKills
	}
	return 0
}

// cgroupsPath is the sandbox's cgroup, under every v1 controller.
func cgroupsPath(id string) string { return "/shard/" + id }

// move changes a sandbox's state if the table allows it.
func (s *Service) move(ctx context.Context, id, to string, ev *store.EventSpec, also func(*store.Sandbox)) (*store.Sandbox, error) {
	out, err := s.cfg.Store.UpdateSandbox(ctx, id, func(r *store.Sandbox) (*store.EventSpec, error) {
		if !canMove(r.State, to) {
			return nil, transitionErr(r.Name, r.State, to)
		}
		r.State = to
		if also != nil {
			also(r)
		}
		return ev, nil
	})
	if err == nil && to == StateRunning {
		s.watchSandbox(id)
	}
	return out, err
}

// Stop ends a sandbox's processes; its files stay.
func (s *Service) Stop(ctx context.Context, idOrName string) (*store.Sandbox, error) {
	sb, unlock, err := s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb, err = s.move(ctx, sb.ID, StateStopping, nil, nil); err != nil {
		return nil, err
	}
	ooms := s.halt(context.WithoutCancel(ctx), sb, true)
	s.endExecs(sb.ID, "sandbox "+sb.Name+" was stopped while the command ran")
	return s.move(context.WithoutCancel(ctx), sb.ID, StateStopped, &store.EventSpec{Type: "sandbox.stopped"}, func(r *store.Sandbox) {
		r.StoppedAt = time.Now().UTC()
		r.OOMKills += ooms
		r.Error = ""
	})
}

// Start boots a stopped sandbox again with its files.
func (s *Service) Start(ctx context.Context, idOrName string) (*store.Sandbox, error) {
	sb, unlock, err := s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if c := s.caps[sb.Provider]; !c.Available {
		return nil, errdefs.Unsupported("provider %s is not available on this host: %s", sb.Provider, c.Reason)
	}
	if err := s.floor.check("start sandbox " + sb.Name); err != nil {
		return nil, err
	}
	// A start is a fresh boot: it runs this server's agent.
	if sb, err = s.move(ctx, sb.ID, StateStarting, nil, func(r *store.Sandbox) { r.AgentDir = s.agentDir }); err != nil {
		return nil, err
	}
	bg := context.WithoutCancel(ctx)
	if err := s.boot(bg, sb, nil); err != nil {
		s.move(bg, sb.ID, StateStopped, nil, func(r *store.Sandbox) { r.Error = err.Error() })
		return nil, fmt.Errorf("start sandbox %s: %w", sb.Name, err)
	}
	return s.move(bg, sb.ID, StateRunning, &store.EventSpec{Type: "sandbox.started"}, func(r *store.Sandbox) {
		r.StartedAt = time.Now().UTC()
		r.Error = ""
	})
}

// Remove deletes a sandbox and its files. A running one needs force.
func (s *Service) Remove(ctx context.Context, idOrName string, force bool) error {
	sb, unlock, err := s.lockSandbox(ctx, idOrName)
	if err != nil {
		return err
	}
	defer unlock()
	if sb.State == StateRunning && !force {
		return errdefs.Conflict("sandbox_running", "sandbox %s is running: stop it first, or remove it with --force", sb.Name)
	}
	if sb, err = s.move(ctx, sb.ID, StateRemoving, nil, nil); err != nil {
		return err
	}
	err = s.destroy(context.WithoutCancel(ctx), sb, s.cfg.Log.With("sandbox", sb.ID))
	s.locksMu.Lock()
	delete(s.locks, sb.ID)
	s.locksMu.Unlock()
	return err
}
