package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/useshards/shard/internal/api"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/hostdir"
	"github.com/useshards/shard/internal/hostdisk"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/metrics"
	"github.com/useshards/shard/internal/network"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/provider/gvisor"
	"github.com/useshards/shard/internal/provider/runc"
	"github.com/useshards/shard/internal/rootfs"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/secrets"
	"github.com/useshards/shard/internal/store"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// Deadlines of a shutdown, each step its own: the HTTP servers' requests,
// the hijacked streams, then the sandbox service's background work.
const (
	shutdownRequests = 10 * time.Second
	shutdownStreams  = 10 * time.Second
	shutdownWork     = 10 * time.Second
)

// daemon owns the server's life: newDaemon opens its parts in dependency
// order (registering how to close each), run serves until ctx ends or a
// listener fails, and close shuts what was opened in reverse order, whether
// the start got all the way or not. Sandboxes keep running across it.
type daemon struct {
	cfg *config
	log *slog.Logger

	closers []closer // in the order opened; close runs them backwards

	db      *store.Store
	metrics *metrics.Metrics
	disk    *hostdisk.Budget
	images  *image.Store
	storage *rootfs.Storage
	nets    *network.Manager
	clu     *cluster.Cluster // nil: a single host
	cluLn   net.Listener     // the cluster port, taken before joining
	secrets *secrets.Service
	tokens  auth.TokenStore
	svc     *sandbox.Service
	api     *api.Server

	stopping context.CancelFunc // closes api.Server.Stopping: long streams end
	servers  []served
}

type closer struct {
	what  string
	close func(context.Context) error
}

// served is one HTTP server on its listener.
type served struct {
	srv *http.Server
	ln  net.Listener
}

func (d *daemon) onClose(what string, f func(context.Context) error) {
	d.closers = append(d.closers, closer{what, f})
}

// newDaemon opens everything the server needs, and the listeners; on an
// error it closes what it opened.
func newDaemon(ctx context.Context, cfg *config) (d *daemon, err error) {
	// What the start does is the server's own work, for every project.
	ctx = project.Unscoped(ctx, "the daemon's start")
	d = &daemon{cfg: cfg, log: cfg.logger()}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	for _, n := range cfg.notes {
		d.log.Warn(n)
	}
	c := cfg.conns
	d.log.Info("connections bounded", "per_sandbox", c.PerSandbox, "rate_per_sandbox", c.Rate, "rate_all", c.TotalRate,
		"hold_at", c.HoldAt, "nf_conntrack_max", c.TableMax)
	for _, step := range []func(context.Context) error{d.lockDataDir, d.openState, d.joinOrAlone, d.openSandboxes, d.listen} {
		if err := step(ctx); err != nil {
			return d, err
		}
	}
	return d, nil
}

// lockDataDir makes the data and run directories root's and takes the data
// directory's lock: a second server would fight over namespaces, mounts and
// the database.
func (d *daemon) lockDataDir(context.Context) error {
	// Only root may enter them: below them are trees that sandboxes and
	// images write (see internal/hostdir).
	for _, dir := range []string{d.cfg.dataDir, d.cfg.runDir} {
		if err := hostdir.Private(dir); err != nil {
			return err
		}
	}
	// Again, now that they exist: a symbolic link that led nowhere when
	// config checked may lead into the other directory now.
	if err := checkDirs(&d.cfg.serveOptions, resolveDir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(d.cfg.socket), 0o711); err != nil {
		return err
	}
	lock, err := holdLock(filepath.Join(d.cfg.dataDir, "lock"))
	if errors.Is(err, errLocked) {
		return fmt.Errorf("another shard serve is using %s", d.cfg.dataDir)
	} else if err != nil {
		return err
	}
	d.onClose("the data directory's lock", func(context.Context) error { return lock.Close() })
	// The bridge and its nftables tables are named after --bridge, not the
	// data directory: a second server on another data directory given the
	// same bridge would take a live server's bridge and replace its
	// firewall (every sandbox of it cut off).
	if err := os.MkdirAll(bridgeLockDir, 0o755); err != nil {
		return err
	}
	bl, err := holdLock(filepath.Join(bridgeLockDir, "shard-bridge-"+d.cfg.bridge+".lock"))
	if errors.Is(err, errLocked) {
		return fmt.Errorf("another shard serve uses bridge %s (and its nftables tables): give this one a --bridge (and --subnet) of its own", d.cfg.bridge)
	} else if err != nil {
		return err
	}
	d.onClose("the bridge's lock", func(context.Context) error { return bl.Close() })
	return nil
}

// errLocked is holdLock's answer when another process holds the lock.
var errLocked = errors.New("held by another process")

// holdLock takes path's lock (flock, exclusive), held until the file is
// closed; errLocked at once if another process holds it.
func holdLock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, errLocked
	}
	return f, nil
}

// bridgeLockDir holds a lock per bridge name, whatever the data directory.
const bridgeLockDir = "/run/lock"

// openState opens the database, the image store, the sandbox store and the
// network.
func (d *daemon) openState(ctx context.Context) error {
	cfg := d.cfg
	db, err := store.Open(ctx, filepath.Join(cfg.dataDir, "shard.db"))
	if err != nil {
		return err
	}
	d.db = db
	d.onClose("the database", func(context.Context) error { return db.Close() })
	if took, err := db.Converted(); err != nil {
		d.log.Warn("database: could not switch to auto_vacuum=INCREMENTAL (its deletions give no space back until it can)", "err", err)
	} else if took > 0 {
		d.log.Info("database: switched to auto_vacuum=INCREMENTAL (rewritten once)", "took", took)
	}
	d.metrics = metrics.New(cfg.cluster.node)
	db.ObserveAppends(d.metrics.LedgerAppend)
	d.disk = hostdisk.New(cfg.dataDir, cfg.reserve)
	d.images, err = image.Open(image.Options{Dir: filepath.Join(cfg.dataDir, "images"), Mirrors: cfg.mirrors, Insecure: cfg.insecure,
		Allowed: cfg.allowed, Blocked: []netip.Prefix{cfg.subnet}, PullTimeout: cfg.pullTimeout,
		MaxImageSize: cfg.maxImageSize, Logger: d.log.With("component", "image"), Metrics: d.metrics, Disk: d.disk})
	if err != nil {
		return err
	}
	d.onClose("the image store", func(context.Context) error { d.images.Close(); return nil })
	d.storage, err = rootfs.Open(ctx, rootfs.Options{Dir: filepath.Join(cfg.dataDir, "storage"), Size: cfg.storageSize, Max: cfg.storageMax, Host: d.disk, Log: d.log})
	if err != nil {
		return fmt.Errorf("sandbox storage: %w", err)
	}
	d.nets, err = network.New(ctx, network.Config{Bridge: cfg.bridge, Subnet: cfg.subnet, MTU: cfg.mtu, NetnsDir: filepath.Join(cfg.runDir, "netns"),
		AllowPrivate: cfg.allowPrivate, Conns: cfg.conns, Log: d.log})
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	d.onClose("the network", func(context.Context) error { d.nets.Close(); return nil })
	return nil
}

// joinOrAlone joins the cluster, if the flags name one: then tokens and
// secrets are in etcd (secrets sealed with the cluster's key), and every
// sandbox made is placed there. Alone, they are in the database.
func (d *daemon) joinOrAlone(ctx context.Context) error {
	cfg := d.cfg
	d.tokens = d.db
	if !cfg.cluster.enabled() {
		var err error
		if d.secrets, err = secrets.Open(d.db, filepath.Join(cfg.dataDir, "secret.key")); err != nil {
			return fmt.Errorf("secrets: %w", err)
		}
		return nil
	}
	cfg.cluster.warnPlainEtcd(d.log)
	// The cluster port is taken before the node joins: a port in use fails
	// the start before etcd is told of a node that cannot answer.
	ln, err := net.Listen("tcp", cfg.cluster.listen)
	if err != nil {
		return fmt.Errorf("--cluster-listen %s: %w", cfg.cluster.listen, err)
	}
	d.onClose("the cluster port", func(context.Context) error { ln.Close(); return nil })
	// The cluster's addresses join the egress boundary as the node joins
	// (before any sandbox is let out) and follow its node list.
	onAddrs := func(as []netip.Addr) {
		if err := d.nets.SetClusterAddrs(as); err != nil {
			d.log.Error("egress boundary: the cluster's addresses", "err", err)
		}
	}
	d.clu, err = joinCluster(ctx, &cfg.cluster, cfg.dataDir, d.db, &d.svc, d.nets, onAddrs, d.log)
	if err != nil {
		return err
	}
	d.onClose("the cluster", func(context.Context) error { return d.clu.Close() })
	d.images.SetRegistry(d.clu) // an import's name is its project's across the nodes
	d.tokens = d.clu.Tokens()
	if d.secrets, err = secrets.New(d.clu.Secrets(), d.clu.SealKey()); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	d.cluLn = tls.NewListener(ln, d.clu.TLS().Server())
	return nil
}

// openSandboxes makes the sandbox service over the providers, lets the
// sandboxes out under their stored policies and reconciles the records
// with the runtimes.
func (d *daemon) openSandboxes(ctx context.Context) error {
	cfg := d.cfg
	self, err := os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		return err
	}
	// Checkpoint images staged in RAM: the directory goes when empty.
	ramDir := imageRAMDir(cfg.imageRAM, cfg.dataDir)
	if ramDir != "" {
		d.onClose("the RAM image directory", func(context.Context) error { os.Remove(ramDir); return nil })
	}
	providers := []provider.Provider{
		gvisor.New(gvisor.Options{Runsc: cfg.runsc, Root: filepath.Join(cfg.runDir, "runsc"), Platform: cfg.platform, DebugLog: os.Getenv("SHARD_RUNSC_DEBUG"), ImageRAM: ramDir, ForkMemory: cfg.forkMemory, CopyHelper: self, Log: d.log}),
		runc.New(runc.Options{Runc: cfg.runc, Root: filepath.Join(cfg.runDir, "runc"), Log: d.log}),
	}
	providers = append(providers, provider.Others()...)
	d.svc, err = sandbox.New(ctx, sandbox.Config{
		DataDir: cfg.dataDir, AgentBinary: self, DefaultProvider: cfg.defaultProvider, Providers: providers,
		Images: d.images, Storage: d.storage, Net: d.nets, Store: d.db, Secrets: d.secrets, Log: d.log, StopTimeout: cfg.stopTimeout, FreezeTimeout: cfg.freezeTimeout, MaxSandboxes: cfg.maxSandboxes, DefaultDisk: cfg.defaultDisk,
		LedgerRetention: cfg.ledgerRetention, LedgerMinFree: cfg.ledgerFloor, Disk: d.disk, MemoryOvercommit: cfg.memoryOvercommit, Limits: cfg.limits, Metrics: d.metrics, Ahead: cfg.ahead,
	})
	if err != nil {
		return err
	}
	d.onClose("the sandbox service", func(ctx context.Context) error { return d.svc.Close(ctx) })
	d.metrics.Watch(d.svc.MetricsState)
	// The new firewall holds every sandbox's egress until the stored
	// policies are in; only then are they let out and is DNS answered.
	if err := d.svc.Access().ApplyPolicies(ctx); err != nil {
		return fmt.Errorf("network policies: %w", err)
	}
	if err := d.nets.Open(); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	if err := d.nets.StartDNS(ctx, cfg.dnsUpstream); err != nil {
		return fmt.Errorf("dns proxy: %w", err)
	}
	if err := d.svc.Reconcile(ctx); err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	return nil
}

// listen makes the API's handler and takes the socket and the TCP ports.
func (d *daemon) listen(context.Context) error {
	cfg := d.cfg
	// Ledger followers and exec streams run until their client leaves:
	// they end when the server starts shutting down.
	stopping, stop := context.WithCancel(context.Background())
	d.stopping = stop
	d.onClose("the streams' stop", func(context.Context) error { stop(); return nil })
	var apiClu api.Cluster
	if d.clu != nil {
		apiClu = d.clu
	}
	// Each handler group takes the job of the sandbox service it uses.
	svc := d.svc
	d.api = &api.Server{Sandboxes: svc, Ledger: d.db, Images: d.images, Tokens: &auth.Tokens{Store: d.tokens}, Secrets: d.secrets, Cluster: apiClu,
		Files: svc.Files(), Lineage: svc.Files(), Checkpoints: svc.Saved(), Snapshots: svc.Saved(), Environments: svc.Saved(),
		Access: svc.Access(), Usage: svc.Admission(), Sessions: svc.Sessions(),
		Log: d.log, Version: version, Stopping: stopping.Done(), BodyTimeout: cfg.bodyTimeout, Metrics: d.metrics}
	d.onClose("the API's peer connections", func(context.Context) error { d.api.Close(); return nil })
	h := d.api.Handler()
	errLog := slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)
	main := &http.Server{Handler: h,
		// The Unix socket is root's alone: whoever reaches it is the
		// administrator. TCP requests need an API key (api.guard).
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if _, ok := c.(*net.UnixConn); ok {
				return auth.WithPrincipal(ctx, auth.Socket)
			}
			return ctx
		},
		// No whole-request ReadTimeout or WriteTimeout: they would cut
		// streams that move; a stalled body is cut by --body-timeout.
		ReadHeaderTimeout: api.DefaultHeaderTimeout, IdleTimeout: cfg.idleTimeout, ErrorLog: errLog}
	if d.clu != nil {
		// The cluster port (its listener taken in joinOrAlone): the other
		// nodes' calls, over mutual TLS, and nothing else (api: a call
		// there must be a node's, signed).
		csrv := &http.Server{Handler: h, ConnContext: func(ctx context.Context, _ net.Conn) context.Context { return api.OnClusterPort(ctx) },
			ReadHeaderTimeout: api.DefaultHeaderTimeout, IdleTimeout: cfg.idleTimeout, ErrorLog: errLog}
		d.servers = append(d.servers, served{csrv, d.cluLn})
		d.log.Info("serving the cluster port", "tcp", d.cluLn.Addr().String(), "tls", "mutual")
	}
	// A socket that answers is another server's (its data directory's
	// lock is its own): removing it would cut that server's clients off.
	if c, err := net.DialTimeout("unix", cfg.socket, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("another shard serve listens on %s: stop it, or give this one a --socket of its own", cfg.socket)
	}
	os.Remove(cfg.socket)
	ul, err := net.Listen("unix", cfg.socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.socket, err)
	}
	sockInfo, _ := os.Stat(cfg.socket)
	d.onClose("the socket", func(context.Context) error {
		// Removed only if it is still ours.
		if now, err := os.Stat(cfg.socket); err == nil && sockInfo != nil && os.SameFile(now, sockInfo) {
			os.Remove(cfg.socket)
		}
		return nil
	})
	d.servers = append(d.servers, served{main, ul})
	if err := os.Chmod(cfg.socket, 0o600); err != nil {
		ul.Close()
		return err
	}
	d.log.Info("serving", "socket", cfg.socket, "data_dir", cfg.dataDir)
	if cfg.listen != "" {
		tl, err := net.Listen("tcp", cfg.listen)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", cfg.listen, err)
		}
		d.servers = append(d.servers, served{main, api.LimitListener(tl, cfg.maxClientConns, d.log, nil)})
		d.log.Info("serving", "tcp", tl.Addr().String())
	}
	return d.listenMetrics(errLog)
}

// listenMetrics takes --metrics-listen's port, if given: GET /metrics
// without a key, for a scraper.
func (d *daemon) listenMetrics(errLog *log.Logger) error {
	cfg := d.cfg
	if cfg.metricsListen == "" {
		return nil
	}
	ml, err := net.Listen("tcp", cfg.metricsListen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.metricsListen, err)
	}
	loopback := false
	if ap, err := netip.ParseAddrPort(ml.Addr().String()); err == nil {
		loopback = ap.Addr().IsLoopback()
	}
	if !loopback {
		d.log.Warn("--metrics-listen is not a loopback address: anyone who reaches it reads the metrics without a key", "addr", ml.Addr().String())
	}
	msrv := &http.Server{Handler: metricsOnly(d.metrics, loopback), ReadHeaderTimeout: api.DefaultHeaderTimeout, IdleTimeout: cfg.idleTimeout, ErrorLog: errLog}
	d.servers = append(d.servers, served{msrv, ml})
	d.log.Info("serving metrics", "tcp", ml.Addr().String())
	return nil
}

// run serves until ctx ends or a server fails, then shuts down: the
// servers stop taking requests and end their streams, the background
// loops end, and close shuts the rest.
func (d *daemon) run(ctx context.Context) (err error) {
	defer func() {
		if cerr := d.close(); err == nil {
			err = cerr
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	svc, nets := d.svc, d.nets
	g.Go(func() error { svc.Watch(gctx); return nil })
	g.Go(func() error {
		nets.WatchConnections(gctx, time.Second, func(rs []network.Refusal) { svc.Access().ConnectionsRefused(gctx, d.cfg.conns, rs) })
		return nil
	})
	g.Go(func() error { svc.Sessions().SweepLedger(gctx); return nil })
	g.Go(func() error { svc.Saved().ReclaimSpace(gctx); return nil }) // a sweep at start too: what a crash left is removed
	if d.clu != nil {
		// The node's own sandboxes are its own again, whatever etcd held
		// while it was away; then it beats.
		d.clu.Start(func(ctx context.Context) error {
			ctx = project.Unscoped(ctx, "the cluster's reconcile: this node's sandboxes, environments and imports")
			mine, err := svc.List(ctx)
			if err != nil {
				return err
			}
			envs, err := svc.Saved().Environments(ctx)
			if err != nil {
				return err
			}
			if err := reconcileImports(ctx, d.clu, d.images, mine, d.log); err != nil {
				return err
			}
			return d.clu.Reconcile(ctx, mine, envs)
		})
		d.log.Info("joined the cluster", "node", d.clu.Name(), "advertise", d.clu.Address(), "etcd", d.cfg.cluster.etcd)
	}
	for _, s := range d.servers {
		g.Go(func() error {
			if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serving on %s: %w", s.ln.Addr(), err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done() // a signal, or a server that failed
		d.shutdown()
		return nil
	})
	return g.Wait()
}

// shutdown stops the servers: no new request, requests in flight given
// shutdownRequests, streams (exec, ledger follows) told to end, hijacked
// ones (WebSocket execs) waited for.
func (d *daemon) shutdown() {
	d.log.Info("shutting down; sandboxes keep running")
	d.stopping()
	var srvs []*http.Server
	for _, s := range d.servers {
		if !slices.Contains(srvs, s.srv) {
			srvs = append(srvs, s.srv)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownRequests)
	defer cancel()
	for _, srv := range srvs {
		if err := srv.Shutdown(ctx); err != nil {
			d.log.Warn("shutdown: requests still running at the deadline are cut", "err", err)
			srv.Close()
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), shutdownStreams)
	defer scancel()
	if err := d.api.WaitStreams(sctx); err != nil {
		d.log.Warn("shutdown", "err", err)
	}
}

// close shuts what newDaemon opened, in reverse order, each step within
// shutdownWork, and reports the goroutines left behind. It returns the
// first error.
func (d *daemon) close() error {
	var first error
	for i := len(d.closers) - 1; i >= 0; i-- {
		c := d.closers[i]
		ctx, cancel := context.WithTimeout(context.Background(), shutdownWork)
		if err := c.close(ctx); err != nil {
			d.log.Error("shutdown: "+c.what, "err", err)
			if first == nil {
				first = fmt.Errorf("%s: %w", c.what, err)
			}
		}
		cancel()
	}
	d.closers = nil
	reportLeftGoroutines(d.log)
	return first
}

// reportLeftGoroutines logs how many goroutines outlived the daemon (those
// of the process's signal handling and the caller's own aside), with their
// stacks at debug: a goroutine left is one that ran past its owner's close.
// The last ones out (a database connection's opener) get a moment to go.
func reportLeftGoroutines(log *slog.Logger) {
	var left []string
	for range 20 {
		left = leftGoroutines()
		if len(left) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Info("stopped", "goroutines_left", len(left))
	for _, g := range left {
		log.Warn("goroutine left", "stack", g)
	}
}

func leftGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var left []string
	for i, g := range strings.Split(string(buf), "\n\n") {
		switch {
		case i == 0: // this one
		case strings.Contains(g, "os/signal.loop"), strings.Contains(g, "os/signal.signal_recv"):
		case strings.Contains(g, "signal.NotifyContext"):
		default:
			left = append(left, g)
		}
	}
	return left
}
