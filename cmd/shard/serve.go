package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/api"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/metrics"
	"github.com/useshards/shard/internal/network"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/store"
	"github.com/useshards/shard/internal/units"
)

type serveOptions struct {
	socket, listen, dataDir, runDir    string
	metricsListen                      string
	imageRAM, maxImageSize, forkMemory string
	mirrors, insecure, allowed         []string
	pullTimeout                        time.Duration
	defaultProvider                    string
	subnet, bridge                     string
	storageSize, storageMax, reserve   string
	defaultDisk                        string
	runsc, runc, platform              string
	logLevel, logFormat                string
	stopTimeout                        time.Duration
	freezeTimeout                      time.Duration
	maxSandboxes                       int
	ahead                              int
	memoryOvercommit                   float64
	dnsUpstream                        []string
	idleTimeout, bodyTimeout           time.Duration
	maxClientConns                     int
	ledgerRetention                    time.Duration
	ledgerMinFree                      string
	maxMemory, maxCPU                  string
	maxPids                            int64
	mtu                                int
	allowPrivate                       []string
	maxConnections                     int
	cluster                            clusterOptions
}

func newServeCmd() *cobra.Command { return newServeCmdInto(&serveOptions{}) }

// newServeCmdInto is newServeCmd with its flags read into o (a test reads
// the defaults so).
func newServeCmdInto(o *serveOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the shard server (root): the REST API under /v0 on a Unix socket and, with --listen, on TCP",
		Long: `Run the shard server. It must run as root: it makes network namespaces,
mounts, cgroups, and runs runsc and runc.

Sandboxes keep running when the server stops or dies; on start it reconciles
its database with what the runtimes report and cleans up leftovers.

Who may do what: a request on the Unix socket (root only) is the
administrator; a request over TCP (--listen) needs an API key with the
scopes its endpoint declares (shard token create). Secrets are kept encrypted
under the data directory (secret.key, root only).

With --cluster-etcd it is a node of a cluster: several servers acting as one,
their shared state (nodes, where each sandbox lives, names, keys, sealed
secrets, environments) in etcd; any node answers any call, sending a call
about another node's sandbox on to it (see shard node ls). Nodes call each
other over mutual TLS on a cluster port of their own (--cluster-listen,
advertised as the https:// URL --advertise), with certificates made from
the cluster key. Whoever reaches etcd administers the cluster: run it with
client-certificate TLS and give each node its own (--etcd-ca, --etcd-cert,
--etcd-key; docs/cluster.md).`,
		Example: `  shard serve
  shard serve --listen 127.0.0.1:7070 --registry-mirror http://127.0.0.1:5000
  shard serve --listen 10.0.0.5:7070 --cluster-etcd https://10.0.0.9:2379 \
    --etcd-ca etcd-ca.crt --etcd-cert node-a.crt --etcd-key node-a.key \
    --node a --advertise https://10.0.0.5:7071 --cluster-key /etc/shard/cluster.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return serve(cmd.Context(), o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.socket, "socket", client.DefaultSocket, "Unix socket to listen on (root only)")
	f.StringVar(&o.listen, "listen", "", "also listen on this TCP address, e.g. 127.0.0.1:7070")
	f.StringVar(&o.metricsListen, "metrics-listen", "", "serve GET /metrics on this TCP address too, without a key (for a Prometheus scraper on loopback, e.g. 127.0.0.1:9470); on --listen it needs a key of every project with the scope metrics:read")
	f.StringVar(&o.dataDir, "data-dir", "/var/lib/shard", "where shard keeps its database, images and the sandboxes' files")
	f.StringVar(&o.runDir, "run-dir", "/run/shard", "runtime state (runsc/runc roots, network namespaces); not inside --data-dir, nor it inside this")
	f.StringArrayVar(&o.mirrors, "registry-mirror", nil, "registry mirror for docker.io images, tried first (repeatable), e.g. http://127.0.0.1:5000")
	f.StringArrayVar(&o.insecure, "insecure-registry", nil, "registry host:port to reach over plain HTTP or without TLS verification (repeatable); like --allowed-registry, it may be on a private or loopback address")
	f.StringArrayVar(&o.allowed, "allowed-registry", nil, "registry host[:port] pulls may name (repeatable): when given, the only ones besides the mirrors and insecure registries (default: any registry on public addresses); a listed registry may be on a private or loopback address, which pulls otherwise never connect to")
	f.DurationVar(&o.pullTimeout, "pull-timeout", image.DefaultPullTimeout, "the longest one image pull may take, download and unpack (connect and TLS handshake are bounded at 10s, a registry's answer at 30s)")
	f.StringVar(&o.defaultProvider, "default-provider", "gvisor", "provider for sandboxes that do not name one")
	f.StringVar(&o.subnet, "subnet", "10.88.0.0/16", "sandbox network; the bridge takes the first address")
	f.StringVar(&o.bridge, "bridge", "shard0", "name of the host bridge")
	f.StringSliceVar(&o.allowPrivate, "allow-private-egress", nil, "private ranges (CIDRs inside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10; comma-separated) sandboxes may reach, e.g. a LAN service; by default sandboxes reach no private address, and never this node's own addresses, the cluster's (etcd, the nodes) or link-local ones (169.254.0.0/16), whatever their policy")
	f.IntVar(&o.maxConnections, "max-connections", network.DefaultMaxConnections, fmt.Sprintf("the most connections one sandbox holds at once through the host (its outbound flows and TCP to the DNS proxy, each an entry in the host's conntrack table), at least %d, at most a sixteenth of the host's nf_conntrack_max (a larger one is lowered, and the log says so); past it a new connection is refused at once. Also bounded, not by flag: 256 new connections a second per sandbox, 1/64 of nf_conntrack_max a second for all, and every sandbox's new connections while the host's table is 3/4 full (docs/connections.md)", network.MinMaxConnections))
	f.IntVar(&o.mtu, "mtu", network.DefaultMTU, fmt.Sprintf("MTU of the bridge and the sandboxes' links (%d to %d): large, so streams between the host and a sandbox (exec, ports) move in few packets; traffic leaving the host keeps its path's MTU", network.MinMTU, network.MaxMTU))
	f.StringVar(&o.storageSize, "storage-size", "4GiB", "first size of the XFS image holding the sandboxes' files, allocated on the host when it is made; every sandbox's --disk is reserved from it, and the store grows online, by its own size (1GiB at most) or by what is missing, when a sandbox does not fit (see --storage-max, --reserve); it never shrinks")
	f.StringVar(&o.storageMax, "storage-max", "auto", "the most the sandbox store grows to (auto: as far as --reserve allows)")
	f.StringVar(&o.reserve, "reserve", "2GiB", "free space the server leaves on the data directory's filesystem for the rest of the host: the store's growth, image pulls and imports, and checkpoints' memory images stop short of it (507); shard df shows it")
	f.StringVar(&o.defaultDisk, "default-disk", "2GiB", "disk bound of a sandbox whose create gives none (reserved in full in the store)")
	f.StringVar(&o.runsc, "runsc", "", "path of runsc (default: on PATH)")
	f.StringVar(&o.runc, "runc", "", "path of runc (default: on PATH)")
	f.StringVar(&o.platform, "platform", "systrap", "gVisor platform: systrap or ptrace")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", "text", "text or json")
	f.DurationVar(&o.stopTimeout, "stop-timeout", 5*time.Second, "how long a stop waits for processes to end before killing them")
	f.IntVar(&o.maxSandboxes, "max-sandboxes", 0, "most sandboxes at once, forks included (0: no limit); 'shard project set' bounds each project")
	f.IntVar(&o.ahead, "ahead", 2, "sandboxes made ahead, per shape of the forks and restores asked for (provider, bounds): created before they are needed, so a fork or restore only restores into one (each holds ~25MiB idle; a --count N fork raises its shape's to N, at most 8); 0: none (each fork creates its sandbox)")
	f.Float64Var(&o.memoryOvercommit, "memory-overcommit", 1.0, "the memory bounds of running sandboxes and warm spares, summed, stay within this host's memory times this (a create, fork, restore, resume or start past it is 507 insufficient_memory); 0: not admitted")
	f.StringVar(&o.maxImageSize, "max-image-size", "16GiB", "the most one image may take, pulled or imported: what its layers decompress to, and their files (a sparse file at its full size), each summed over its layers; also the most an import may upload (413 beyond it). Pulls and imports also keep --reserve free (507)")
	f.StringVar(&o.forkMemory, "fork-memory", "handoff", "how a fork (or a restore) gets its memory on gvisor: handoff (it adopts a copy of the frozen memory file; for sandboxes holding up to an eighth of the host's memory, at most 4GiB, and with --image-ram-dir) or pages (loaded page by page from the checkpoint, the slower way of stock runsc)")
	f.StringVar(&o.imageRAM, "image-ram-dir", "auto", "directory on tmpfs where checkpoint memory images are written first and restored from until they are copied to disk (auto: /dev/shm/shard-<hash of --data-dir>; none: straight to disk)")
	f.StringArrayVar(&o.dnsUpstream, "dns-upstream", nil, "resolver (IP or IP:port) the sandboxes' DNS proxy asks (repeatable; default: the host's /etc/resolv.conf)")
	f.DurationVar(&o.freezeTimeout, "fork-freeze-timeout", sandbox.DefaultFreezeTimeout, "a fork that holds its source frozen longer fails, and the source thaws")
	f.DurationVar(&o.idleTimeout, "idle-timeout", api.DefaultIdleTimeout, "a keep-alive connection with no request this long is closed (a request's headers must come within 10s)")
	f.DurationVar(&o.bodyTimeout, "body-timeout", api.DefaultBodyTimeout, "a request body that sends nothing this long is cut (400), as is one slower than 1KiB/s on average past that (counting only the time spent waiting for the client); bodies and streams that move are never cut")
	f.IntVar(&o.maxClientConns, "max-client-conns", api.DefaultMaxClientConns, "most TCP connections one client address holds at once; more get a 429 (0: no limit; the Unix socket has none)")
	f.DurationVar(&o.ledgerRetention, "ledger-retention", 0, "remove a ledger session (its events) once its sandbox is removed, it has no checkpoints, and its last event is this old, e.g. 720h (0: keep every session; shard ledger rm removes one)")
	f.StringVar(&o.ledgerMinFree, "ledger-min-free", "256MiB", "free space the data directory's filesystem keeps for the database: below it, requests that add to the ledger (exec, create, fork, restore, resume, checkpoint, snapshot, start, grant, policy) are refused (507) before anything is written; stops, removals and the ends of running commands are still recorded (auto: --reserve; 0: no floor)")
	f.StringVar(&o.maxMemory, "max-memory", "host", "the most memory one sandbox may have, e.g. 8GiB (host: this host's physical memory; more is refused)")
	f.StringVar(&o.maxCPU, "max-cpu", "host", "the most cpu one sandbox may have, e.g. 2 or 500m (host: this host's cpus; more is refused)")
	f.Int64Var(&o.maxPids, "max-pids", sandbox.MaxPids, "the most processes one sandbox may have (at most 4194304, the kernel's limit)")
	o.cluster.flags(f)
	return cmd
}

// sandboxLimits reads --max-memory, --max-cpu and --max-pids: each at most
// what the host can honour.
func sandboxLimits(o *serveOptions, host sandbox.Limits) (sandbox.Limits, error) {
	var l sandbox.Limits
	if o.maxMemory != "host" {
		n, err := units.ParseSize(o.maxMemory)
		if err != nil || n < sandbox.MinMemory || n > host.MemoryBytes {
			return l, fmt.Errorf("--max-memory %q: give a size from %s to %s (%s), or host", o.maxMemory, units.FormatSize(sandbox.MinMemory), units.FormatSize(host.MemoryBytes), host.MemoryFrom)
		}
		l.MemoryBytes, l.MemoryFrom = n, "shard serve --max-memory"
	}
	if o.maxCPU != "host" {
		n, err := units.ParseCPU(o.maxCPU)
		if err != nil || n < sandbox.MinCPU || n > host.CPUMillis {
			return l, fmt.Errorf("--max-cpu %q: give cpus from %s to %s (this host's), or host", o.maxCPU, units.FormatCPU(sandbox.MinCPU), units.FormatCPU(host.CPUMillis))
		}
		l.CPUMillis, l.CPUFrom = n, "shard serve --max-cpu"
	}
	if o.maxPids < sandbox.MinPids || o.maxPids > sandbox.MaxPids {
		return l, fmt.Errorf("--max-pids %d: give a number from %d to %d", o.maxPids, sandbox.MinPids, sandbox.MaxPids)
	}
	l.Pids, l.PidsFrom = o.maxPids, "shard serve --max-pids"
	return l, nil
}

// storeFlags reads --storage-size, --storage-max and --reserve.
func storeFlags(o *serveOptions) (size, most, reserve int64, err error) {
	first := o.storageSize
	if first == "auto" { // what it meant before the store grew: now the first size
		first = "4GiB"
	}
	if size, err = units.ParseSize(first); err != nil || size < 256<<20 {
		return 0, 0, 0, fmt.Errorf("--storage-size %q: give a size of at least 256MiB", o.storageSize)
	}
	if o.storageMax != "auto" {
		if most, err = units.ParseSize(o.storageMax); err != nil || most < size {
			return 0, 0, 0, fmt.Errorf("--storage-max %q: give auto, or a size of at least --storage-size (%s)", o.storageMax, units.FormatSize(size))
		}
	}
	if reserve, err = units.ParseSize(o.reserve); err != nil {
		return 0, 0, 0, fmt.Errorf("--reserve: %w", err)
	}
	if reserve == 0 {
		reserve = -1 // hostdisk: keep nothing
	}
	return size, most, reserve, nil
}

// ledgerFloorFlag reads --ledger-min-free as sandbox.Config's LedgerMinFree:
// auto is 0 (the image store's reserve), 0 is no floor. A floor larger
// than the disk is taken: it refuses every request that adds to the ledger.
func ledgerFloorFlag(s string) (int64, error) {
	if s == "auto" {
		return 0, nil
	}
	n, err := units.ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("--ledger-min-free: %w, or auto", err)
	}
	if n == 0 {
		return -1, nil
	}
	return n, nil
}

// hostFacts is what config reads of the host, read once by readHostFacts
// (a test gives its own).
type hostFacts struct {
	limits       sandbox.Limits // sandbox.HostLimits
	conntrackMax int            // nf_conntrack_max; 0: unknown
	conntrackErr error
	// resolve says where a directory flag leads (resolveDir); nil: the
	// path as given, made absolute.
	resolve func(string) (string, error)
}

func readHostFacts() hostFacts {
	n, err := network.ReadConntrack(network.ConntrackMaxPath)
	return hostFacts{limits: sandbox.HostLimits(), conntrackMax: n, conntrackErr: err, resolve: resolveDir}
}

// config is what the daemon runs with: the flags read and checked against
// the host's facts, nothing opened yet.
type config struct {
	serveOptions // as given, for what needs no reading

	level        slog.Level
	subnet       netip.Prefix
	allowPrivate []netip.Prefix
	conns        network.ConnLimits
	notes        []string // warnings for the log, once it exists
	defaultDisk  int64
	maxImageSize int64
	storageSize  int64
	storageMax   int64 // 0: as far as reserve allows
	reserve      int64 // -1: keep nothing
	ledgerFloor  int64
	limits       sandbox.Limits
}

// config reads and checks the flags; it opens nothing and changes nothing
// (it reads only where the directories lead, through host.resolve), so
// every refusal comes before the daemon starts.
func (o *serveOptions) config(host hostFacts) (*config, error) {
	c := &config{serveOptions: *o}
	if err := c.level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	if o.logFormat != "text" && o.logFormat != "json" && o.logFormat != "" {
		return nil, fmt.Errorf("--log-format %q: want text or json", o.logFormat)
	}
	subnet, err := netip.ParsePrefix(o.subnet)
	if err != nil || !subnet.Addr().Is4() || subnet.Bits() > 28 {
		return nil, fmt.Errorf("--subnet %q: give an IPv4 network of /28 or bigger", o.subnet)
	}
	c.subnet = subnet
	for _, s := range o.allowPrivate {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("--allow-private-egress %q: give CIDRs, like 10.1.0.0/16", s)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("--allow-private-egress %s: the address has bits past the prefix length: give %s for the range, or %s/32 for one address", p, p.Masked(), p.Addr())
		}
		c.allowPrivate = append(c.allowPrivate, p)
	}
	if err := network.CheckAllowPrivate(c.allowPrivate); err != nil {
		return nil, err
	}
	if o.mtu < network.MinMTU || o.mtu > network.MaxMTU {
		return nil, fmt.Errorf("--mtu %d: give one from %d to %d", o.mtu, network.MinMTU, network.MaxMTU)
	}
	if host.conntrackErr != nil {
		c.notes = append(c.notes, "cannot read the host's conntrack table size: "+host.conntrackErr.Error())
	}
	conns, notes, err := network.PlanConnLimits(o.maxConnections, host.conntrackMax)
	if err != nil {
		return nil, err
	}
	c.conns, c.notes = conns, append(c.notes, notes...)
	c.defaultDisk, err = units.ParseSize(o.defaultDisk)
	if err != nil || c.defaultDisk < sandbox.MinDisk || c.defaultDisk > sandbox.MaxDisk {
		return nil, fmt.Errorf("--default-disk %q: give a size from %s to %s", o.defaultDisk, units.FormatSize(sandbox.MinDisk), units.FormatSize(sandbox.MaxDisk))
	}
	c.maxImageSize, err = units.ParseSize(o.maxImageSize)
	if err != nil || c.maxImageSize < 1<<20 {
		return nil, fmt.Errorf("--max-image-size %q: give a size of at least 1MiB", o.maxImageSize)
	}
	if c.storageSize, c.storageMax, c.reserve, err = storeFlags(o); err != nil {
		return nil, err
	}
	if err := o.checkBounds(); err != nil {
		return nil, err
	}
	if c.ledgerFloor, err = ledgerFloorFlag(o.ledgerMinFree); err != nil {
		return nil, err
	}
	if c.ledgerFloor == 0 { // auto
		c.ledgerFloor = max(c.reserve, -1)
	}
	if c.limits, err = sandboxLimits(o, host.limits); err != nil {
		return nil, err
	}
	// (check fills in --cluster-listen and --node from their defaults.)
	if err := c.cluster.check(o.listen); err != nil {
		return nil, err
	}
	if err := checkNames(o); err != nil {
		return nil, err
	}
	if err := checkDirs(o, host.resolve); err != nil {
		return nil, err
	}
	return c, nil
}

// checkDirs refuses directory flags that coincide or nest: the server
// keeps trees of its own under each (the data directory's run/ and
// checkpoints/, the run directory's netns/, runsc/ and runc/, the memory
// images in --image-ram-dir) and takes what it does not know there for a
// crash's leftovers, so one inside another loses its files (a --run-dir
// of DATA/run loses its network namespaces at start). resolve says where
// a path leads (resolveDir: through symbolic links, so a link to the data
// directory is not a way around the check); nil takes the paths as given,
// made absolute.
func checkDirs(o *serveOptions, resolve func(string) (string, error)) error {
	type dirFlag struct{ flag, given, path string }
	dirs := []dirFlag{{flag: "--data-dir", given: o.dataDir}, {flag: "--run-dir", given: o.runDir}}
	if o.imageRAM != "auto" && imageRAMDir(o.imageRAM, o.dataDir) != "" {
		dirs = append(dirs, dirFlag{flag: "--image-ram-dir", given: o.imageRAM})
	}
	for i := range dirs {
		d := &dirs[i]
		if d.given == "" {
			return fmt.Errorf("%s: give a directory", d.flag)
		}
		abs, err := filepath.Abs(d.given)
		if err != nil {
			return fmt.Errorf("%s %q: %w", d.flag, d.given, err)
		}
		d.given, d.path = abs, abs
		if resolve != nil {
			if d.path, err = resolve(abs); err != nil {
				return fmt.Errorf("%s %s: %w", d.flag, abs, err)
			}
		}
	}
	name := func(d dirFlag) string {
		if d.path != d.given {
			return fmt.Sprintf("%s %s (%s)", d.flag, d.given, d.path)
		}
		return d.flag + " " + d.path
	}
	nested := func(in, out dirFlag) error {
		return fmt.Errorf("%s is inside %s: give directories that do not nest (the server keeps files of its own in each)", name(in), name(out))
	}
	for i, a := range dirs {
		for _, b := range dirs[i+1:] {
			switch {
			case a.path == b.path:
				return fmt.Errorf("%s and %s are the same directory, %s: give each a directory of its own", a.flag, b.flag, a.path)
			case within(b.path, a.path):
				return nested(b, a)
			case within(a.path, b.path):
				return nested(a, b)
			}
		}
	}
	return nil
}

// resolveDir is where the absolute path p leads: its longest existing
// ancestor with every symbolic link resolved, the rest appended as given
// (the server makes those directories).
func resolveDir(p string) (string, error) {
	var rest []string
	for dir := p; ; dir = filepath.Dir(dir) {
		r, err := filepath.EvalSymlinks(dir)
		if err == nil {
			slices.Reverse(rest)
			return filepath.Join(append([]string{r}, rest...)...), nil
		}
		if !errors.Is(err, fs.ErrNotExist) || dir == filepath.Dir(dir) {
			return "", err
		}
		rest = append(rest, filepath.Base(dir))
	}
}

// within says whether the clean absolute path p is below dir.
func within(p, dir string) bool {
	return dir == "/" || strings.HasPrefix(p, dir+"/")
}

// providerNames are the providers --default-provider may name (those
// this host cannot run are refused at a create, with the reason).
var providerNames = []string{"gvisor", "runc", "firecracker", "vz", "sysbox"}

// checkNames checks the flags that name things: the bridge (a network
// interface, and the name of its nftables tables and lock), the default
// provider, gVisor's platform, and registries given as host[:port].
func checkNames(o *serveOptions) error {
	if o.bridge == "" || len(o.bridge) > 15 || strings.ContainsAny(o.bridge, "/: \t\n") {
		return fmt.Errorf("--bridge %q: give a network interface name of 1 to 15 characters, without /, : or spaces", o.bridge)
	}
	if !slices.Contains(providerNames, o.defaultProvider) {
		return fmt.Errorf("--default-provider %q: give one of %s", o.defaultProvider, strings.Join(providerNames, ", "))
	}
	if o.platform != "systrap" && o.platform != "ptrace" {
		return fmt.Errorf("--platform %q: give systrap or ptrace", o.platform)
	}
	for _, r := range []struct {
		flag  string
		hosts []string
	}{{"--allowed-registry", o.allowed}, {"--insecure-registry", o.insecure}} {
		for _, h := range r.hosts {
			if h == "" || strings.Contains(h, "://") || strings.ContainsAny(h, "/ ") {
				return fmt.Errorf("%s %q: give a registry as host or host:port, not a URL or a path", r.flag, h)
			}
		}
	}
	return nil
}

// checkBounds checks the flags that are numbers and durations with a
// range of their own.
func (o *serveOptions) checkBounds() error {
	switch {
	case o.maxSandboxes < 0:
		return fmt.Errorf("--max-sandboxes %d: give 0 (no limit) or more", o.maxSandboxes)
	case o.ahead < 0 || o.ahead > 8:
		return fmt.Errorf("--ahead %d: give 0 (none) to 8", o.ahead)
	case o.memoryOvercommit != 0 && !(o.memoryOvercommit >= 0.1 && o.memoryOvercommit <= 100):
		return fmt.Errorf("--memory-overcommit %g: give a ratio from 0.1 to 100, e.g. 1.5 (or 0: not admitted)", o.memoryOvercommit)
	case o.stopTimeout < 0:
		return fmt.Errorf("--stop-timeout %s: it must not be negative", o.stopTimeout)
	case o.pullTimeout <= 0:
		return fmt.Errorf("--pull-timeout %s: it must be positive", o.pullTimeout)
	case o.freezeTimeout <= 0:
		return fmt.Errorf("--fork-freeze-timeout %s: it must be positive", o.freezeTimeout)
	case o.idleTimeout <= 0 || o.bodyTimeout <= 0:
		return fmt.Errorf("--idle-timeout and --body-timeout must be positive")
	case o.ledgerRetention < 0:
		return fmt.Errorf("--ledger-retention %s: give 0 (keep) or a positive duration", o.ledgerRetention)
	case o.maxClientConns < 0:
		return fmt.Errorf("--max-client-conns %d: give 0 (no limit) or more", o.maxClientConns)
	case o.forkMemory != provider.MemoryHandoff && o.forkMemory != provider.MemoryPages:
		return fmt.Errorf("--fork-memory %q: want handoff or pages", o.forkMemory)
	}
	return nil
}

// logger is the daemon's log, as --log-level and --log-format say.
func (c *config) logger() *slog.Logger {
	hopts := &slog.HandlerOptions{Level: c.level}
	if c.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, hopts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, hopts))
}

// serve runs the daemon until ctx ends (a signal) or a listener fails.
func serve(ctx context.Context, o *serveOptions) error {
	if os.Geteuid() != 0 {
		return errors.New("shard serve must run as root (it makes namespaces, mounts and cgroups)")
	}
	cfg, err := o.config(readHostFacts())
	if err != nil {
		return err
	}
	d, err := newDaemon(ctx, cfg)
	if err != nil {
		return err
	}
	return d.run(ctx)
}

// imageRAMDir resolves --image-ram-dir: "none" is "", "auto" a directory of
// its own on /dev/shm (one per data directory, so servers side by side do
// not meet), anything else as given.
func imageRAMDir(flag, dataDir string) string {
	switch flag {
	case "none", "":
		return ""
	case "auto":
		if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
			return ""
		}
		abs, _ := filepath.Abs(dataDir)
		sum := sha256.Sum256([]byte(abs))
		return filepath.Join("/dev/shm", "shard-"+hex.EncodeToString(sum[:4]))
	}
	return flag
}

// metricsOnly is the handler of --metrics-listen: GET /metrics, nothing else.
// On loopback it answers only requests addressed to an IP address or
// localhost: a web page in a browser on this host could otherwise read the
// metrics through a name of its own that it rebinds to 127.0.0.1 (DNS
// rebinding), as such a request names the page's host.
func metricsOnly(m *metrics.Metrics, loopback bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	if !loopback {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !localHost(r.Host) {
			http.Error(w, "--metrics-listen answers requests to an IP address or localhost only", http.StatusMisdirectedRequest)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// localHost reports whether a request's Host is an IP address or
// localhost (with or without a port): what a scraper on this host uses,
// and never a name a web page chose.
func localHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return strings.EqualFold(host, "localhost")
}

// reconcileImports puts this node's own imports back into the cluster, and
// drops its copies of other nodes' imports that the cluster no longer
// records as they are (removed, or imported again, while this node was
// away), unless a sandbox here uses one. ctx sees every project (Unscoped).
func reconcileImports(ctx context.Context, clu *cluster.Cluster, images *image.Store, sandboxes []*store.Sandbox, log *slog.Logger) error {
	all, err := images.List(ctx)
	if err != nil {
		return err
	}
	used := map[string]bool{}
	for _, sb := range sandboxes {
		used[sb.ImageDigest] = true
	}
	var mine []cluster.ImagePlacement
	for _, img := range all {
		canon, ok := image.ImportName(img.Ref)
		switch {
		case img.Project == "" || !ok:
		case img.Origin == "":
			mine = append(mine, cluster.ImagePlacement{Project: img.Project, Ref: canon, Digest: img.Digest})
		default:
			pctx := project.With(ctx, img.Project)
			p, err := clu.Image(pctx, canon)
			if errdefs.Is(err, errdefs.KindNotFound) || err == nil && p.Digest != img.Digest {
				if used[img.Digest] {
					continue
				}
				if err := images.Remove(pctx, img.Ref, false); err != nil {
					log.Warn("cluster: cannot drop a copy of an image the cluster no longer records", "image", img.Ref, "project", img.Project, "err", err)
				} else {
					log.Info("cluster: dropped a copy of an image the cluster no longer records", "image", img.Ref, "project", img.Project, "from", img.Origin)
				}
			}
		}
	}
	return clu.ReconcileImports(ctx, mine)
}
