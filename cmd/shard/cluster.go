package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/network"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/store"
	"github.com/useshards/shard/internal/units"
)

// clusterOptions are serve's flags for joining a cluster.
type clusterOptions struct {
	etcd       []string
	node       string
	advertise  string
	listen     string // --cluster-listen
	keyFile    string
	prefix     string
	nodeMemory string
	ttl        time.Duration
	etcdCA     string
	etcdCert   string
	etcdKey    string
	replace    bool
}

func (o *clusterOptions) flags(f *pflag.FlagSet) {
	f.StringSliceVar(&o.etcd, "cluster-etcd", nil, "join a cluster whose shared state is in this etcd (client URLs, comma-separated); without it this server is a single host")
	f.StringVar(&o.node, "node", "", "this node's name in the cluster (default: the host name)")
	f.StringVar(&o.advertise, "advertise", "", "the https:// URL the other nodes reach this node's cluster port (--cluster-listen) at, e.g. https://10.0.0.5:7071 (needed with --cluster-etcd)")
	f.StringVar(&o.listen, "cluster-listen", "", "the TCP address of this node's cluster port, where the other nodes call it over mutual TLS with certificates made from the cluster key (default: the host and port of --advertise); callers use --listen")
	f.StringVar(&o.keyFile, "cluster-key", "", "file holding the cluster key every node shares (32 bytes, or 64 hex digits; root only): it seals secrets, signs node-to-node calls and makes the certificates of their mutual TLS, and is never written to etcd. Make one with: head -c 32 /dev/urandom > cluster.key")
	f.StringVar(&o.prefix, "cluster-prefix", "/shard/", "the etcd key prefix every node of this cluster uses")
	f.StringVar(&o.nodeMemory, "node-memory", "host", "the memory this node's sandboxes may be given in all, which placement counts down (host: this host's physical memory)")
	f.DurationVar(&o.ttl, "node-ttl", 10*time.Second, "a node that has not renewed its etcd lease this long is unreachable")
	f.BoolVar(&o.replace, "replace-node", false, "take --node's name over from another shard serve that had it and is down for good (another data directory): the cluster forgets that node's sandboxes")
	f.StringVar(&o.etcdCA, "etcd-ca", "", "CA certificate (PEM) that etcd's server certificate is checked against, for https:// --cluster-etcd URLs (default: the system's)")
	f.StringVar(&o.etcdCert, "etcd-cert", "", "client certificate (PEM) this node shows etcd (with --etcd-key), when etcd asks for one (--client-cert-auth)")
	f.StringVar(&o.etcdKey, "etcd-key", "", "the private key (PEM) of --etcd-cert")
}

// etcdTLS is the TLS of https:// etcd URLs (nil for plain http://).
func (o *clusterOptions) etcdTLS() (*tls.Config, error) {
	secure := false
	for _, u := range o.etcd {
		secure = secure || strings.HasPrefix(u, "https://")
	}
	if !secure {
		if o.etcdCA != "" || o.etcdCert != "" || o.etcdKey != "" {
			return nil, fmt.Errorf("--etcd-ca, --etcd-cert and --etcd-key are for https:// --cluster-etcd URLs")
		}
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.etcdCA != "" {
		pem, err := os.ReadFile(o.etcdCA)
		if err != nil {
			return nil, fmt.Errorf("--etcd-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--etcd-ca %s holds no PEM certificate", o.etcdCA)
		}
	}
	if (o.etcdCert == "") != (o.etcdKey == "") {
		return nil, fmt.Errorf("give --etcd-cert and --etcd-key together")
	}
	if o.etcdCert != "" {
		cert, err := tls.LoadX509KeyPair(o.etcdCert, o.etcdKey)
		if err != nil {
			return nil, fmt.Errorf("--etcd-cert/--etcd-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func (o *clusterOptions) enabled() bool { return len(o.etcd) > 0 }

// check validates the flags before anything starts.
func (o *clusterOptions) check(listen string) error {
	if !o.enabled() {
		if o.node != "" || o.advertise != "" || o.keyFile != "" {
			return fmt.Errorf("--node, --advertise and --cluster-key are for a cluster: give --cluster-etcd too")
		}
		return nil
	}
	if listen == "" {
		return fmt.Errorf("--cluster-etcd: give --listen too (the other nodes call this one over TCP)")
	}
	if o.advertise == "" {
		return fmt.Errorf("--cluster-etcd: give --advertise, the https:// URL the other nodes reach this node's cluster port at")
	}
	u, err := url.Parse(o.advertise)
	if err != nil || u.Host == "" {
		return fmt.Errorf("--advertise %q: give the https:// URL the other nodes reach this node's cluster port at, like https://10.0.0.5:7071", o.advertise)
	}
	if u.Scheme != "https" {
		return fmt.Errorf("--advertise %q: nodes talk over mutual TLS: give an https:// URL (the cluster port, --cluster-listen), like https://%s", o.advertise, u.Host)
	}
	if o.listen == "" {
		o.listen = u.Host
	}
	if o.listen == listen {
		return fmt.Errorf("--cluster-listen %s is --listen's address: the cluster port is a port of its own", o.listen)
	}
	if o.keyFile == "" {
		return fmt.Errorf("--cluster-etcd: give --cluster-key, the file of the key every node shares (head -c 32 /dev/urandom > cluster.key)")
	}
	if o.ttl < 3*time.Second {
		return fmt.Errorf("--node-ttl %s: give 3s or more", o.ttl)
	}
	if o.node == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--node: %w", err)
		}
		o.node = strings.ToLower(strings.SplitN(h, ".", 2)[0])
	}
	return nil
}

// warnPlainEtcd warns of plain http:// etcd URLs that are not on loopback:
// whoever reaches such an etcd reads and writes the cluster's state
// (tokens among it), with no key.
func (o *clusterOptions) warnPlainEtcd(log *slog.Logger) {
	for _, raw := range o.etcd {
		u, err := url.Parse(raw)
		if err != nil || u.Scheme != "http" {
			continue
		}
		if a, err := netip.ParseAddr(u.Hostname()); err == nil && a.IsLoopback() || u.Hostname() == "localhost" {
			continue
		}
		log.Warn("etcd is reached over plain HTTP on a network address: anyone who reaches etcd administers the cluster (reads and writes its API keys); run etcd with client-certificate TLS (--client-cert-auth) and give https:// URLs with --etcd-ca, --etcd-cert and --etcd-key (docs/cluster.md)", "etcd", raw)
	}
}

// readClusterKey reads the key file: 32 raw bytes or 64 hex digits, and
// no one but its owner may read it (as ssh asks of a private key).
func readClusterKey(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--cluster-key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("--cluster-key %s is readable by others (mode %v): chmod 600 it", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--cluster-key: %w", err)
	}
	if t := bytes.TrimSpace(b); len(t) == 64 {
		if k, err := hex.DecodeString(string(t)); err == nil {
			return k, nil
		}
	}
	if len(b) != 32 {
		return nil, fmt.Errorf("--cluster-key %s holds %d bytes: give 32 bytes or 64 hex digits (head -c 32 /dev/urandom > %s)", path, len(b), path)
	}
	return b, nil
}

// joinCluster joins the cluster and tells db of every sandbox it makes or
// removes. svc is read later, by the heartbeat (it does not exist yet).
func joinCluster(ctx context.Context, o *clusterOptions, dataDir string, db *store.Store, svc **sandbox.Service, nets *network.Manager, onAddrs func([]netip.Addr), log *slog.Logger) (*cluster.Cluster, error) {
	key, err := readClusterKey(o.keyFile)
	if err != nil {
		return nil, err
	}
	instance, err := nodeInstance(dataDir)
	if err != nil {
		return nil, err
	}
	capacity := sandbox.HostLimits().MemoryBytes
	if o.nodeMemory != "host" {
		if capacity, err = units.ParseSize(o.nodeMemory); err != nil || capacity <= 0 {
			return nil, fmt.Errorf("--node-memory %q: give a size like 16GiB, or host", o.nodeMemory)
		}
	}
	tlsCfg, err := o.etcdTLS()
	if err != nil {
		return nil, err
	}
	c, err := cluster.Open(ctx, cluster.Config{Endpoints: o.etcd, TLS: tlsCfg, Prefix: o.prefix, Node: o.node, Instance: instance, Replace: o.replace, Advertise: o.advertise,
		Key: key, TTL: o.ttl, Log: log.With("component", "cluster"), Stats: func() cluster.Stats { return nodeStats(*svc, nets, capacity, log) }, OnAddrs: onAddrs})
	if err != nil {
		return nil, fmt.Errorf("join the cluster: %w", err)
	}
	db.SetRegistry(c)
	return c, nil
}

// nodeInstance is the id of this data directory in a cluster (made on the
// first join, kept in DATA/node-id): a restart is the same node; another
// server that claims the name is not.
func nodeInstance(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "node-id")
	if b, err := os.ReadFile(path); err == nil && len(bytes.TrimSpace(b)) == 32 {
		return string(bytes.TrimSpace(b)), nil
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	id := hex.EncodeToString(b)
	if err := os.WriteFile(path+".tmp", []byte(id+"\n"), 0o600); err != nil {
		return "", err
	}
	return id, os.Rename(path+".tmp", path)
}

// nodeStats is what this node publishes at each heartbeat.
func nodeStats(svc *sandbox.Service, nets *network.Manager, capacity int64, log *slog.Logger) cluster.Stats {
	st := cluster.Stats{MemoryTotal: capacity, CPUs: runtime.NumCPU(), Load: loadAverage(), Providers: []string{}}
	// Every address of this node, for the other nodes' egress boundary:
	// its API or services may listen on more than the address it
	// advertises.
	for _, a := range nets.HostAddrs() {
		st.Addrs = append(st.Addrs, a.String())
	}
	if svc == nil {
		return st
	}
	for _, c := range svc.Capabilities() {
		if c.Available {
			st.Providers = append(st.Providers, c.Name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n, given, err := svc.Admission().NodeUsage(project.Unscoped(ctx, "the node's status counts every project's sandboxes"))
	if err != nil {
		// Not known is not free: placement passes this node over until
		// its next beat.
		log.Warn("cluster: this node's figures", "err", err)
		return st
	}
	st.Sandboxes = n
	st.MemoryFree = max(0, min(capacity-given, sandbox.HostMemAvailable()))
	return st
}

func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return f
}
