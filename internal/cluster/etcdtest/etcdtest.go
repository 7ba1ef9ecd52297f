// Package etcdtest runs a real etcd (Debian's etcd-server) for tests: one
// member or several, each killable and restartable, on loopback ports of
// their own, with data in the test's temporary directory.
package etcdtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/internal/testenv"
)

// Cluster is a running etcd.
type Cluster struct {
	t       testing.TB
	dir     string
	members []*member
	tlsArgs []string // the members' TLS flags (StartTLS)
	netns   string   // the network namespace the members run in ("": the host's)
	host    string   // the address they listen on (default 127.0.0.1)
}

type member struct {
	name, client, peer string
	cmd                *exec.Cmd
	done               chan struct{}
}

// Start runs an etcd of n members and waits until it answers. Without the
// etcd binary the test is skipped, or fails in strict runs.
func Start(t testing.TB, n int) *Cluster { return start(t, n, false) }

// StartTLS runs a one-member etcd that serves https and asks clients for a
// certificate, and returns it with the TLS config of a client it accepts
// (and the paths of that client's CA, certificate and key files).
func StartTLS(t testing.TB) (*Cluster, *tls.Config, [3]string) {
	c := start(t, 1, true)
	return c, c.clientTLS(), [3]string{filepath.Join(c.dir, "ca.pem"), filepath.Join(c.dir, "client.pem"), filepath.Join(c.dir, "client-key.pem")}
}

// StartIn runs a one-member etcd inside the named network namespace (one
// the test made), listening on host (an address of that namespace, ports
// 2379 and 2380), serving https and asking clients for a certificate, as
// docs/cluster.md runs it. It returns it with the paths of a client's CA,
// certificate and key files.
func StartIn(t testing.TB, netns, host string) (*Cluster, [3]string) {
	c := startWith(t, 1, true, netns, host)
	return c, [3]string{filepath.Join(c.dir, "ca.pem"), filepath.Join(c.dir, "client.pem"), filepath.Join(c.dir, "client-key.pem")}
}

func start(t testing.TB, n int, secure bool) *Cluster { return startWith(t, n, secure, "", "") }

func startWith(t testing.TB, n int, secure bool, netns, host string) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		if testenv.Strict() {
			t.Fatalf("etcd is not installed (scripts/install-deps.sh installs Debian's etcd-server), and SHARD_INTEGRATION=1 says this run must have it")
		}
		t.Skip("etcd is not installed: scripts/install-deps.sh installs it")
	}
	c := &Cluster{t: t, dir: t.TempDir(), netns: netns, host: host}
	if c.host == "" {
		c.host = "127.0.0.1"
	}
	scheme := "http://"
	if secure {
		scheme = "https://"
		c.makeCerts()
		c.tlsArgs = []string{"--cert-file", filepath.Join(c.dir, "server.pem"), "--key-file", filepath.Join(c.dir, "server-key.pem"),
			"--client-cert-auth", "--trusted-ca-file", filepath.Join(c.dir, "ca.pem")}
	}
	var initial []string
	for i := range n {
		m := &member{name: fmt.Sprintf("m%d", i), client: scheme + freeAddr(t), peer: "http://" + freeAddr(t)}
		if netns != "" { // a namespace of its own: its ports are free
			m.client, m.peer = scheme+net.JoinHostPort(host, fmt.Sprint(2379+2*i)), "http://"+net.JoinHostPort(host, fmt.Sprint(2380+2*i))
		}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peer)
	}
	for i := range c.members {
		c.run(i, strings.Join(initial, ","))
	}
	t.Cleanup(c.stop)
	c.wait()
	return c
}

// Endpoints are the client URLs of every member.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.members {
		out = append(out, m.client)
	}
	return out
}

// Kill stops member i with SIGKILL.
func (c *Cluster) Kill(i int) {
	m := c.members[i]
	if m.cmd != nil && m.cmd.Process != nil {
		m.cmd.Process.Signal(syscall.SIGKILL)
		<-m.done
	}
}

// Restart starts member i again on its data (after Kill). It does not
// wait: members restarted one by one have no quorum until enough are
// back (Wait waits for one).
func (c *Cluster) Restart(i int) {
	var initial []string
	for _, m := range c.members {
		initial = append(initial, m.name+"="+m.peer)
	}
	c.run(i, strings.Join(initial, ","))
}

// Wait waits until a member answers healthy (it has a leader).
func (c *Cluster) Wait() { c.wait() }

func (c *Cluster) run(i int, initial string) {
	m := c.members[i]
	data := filepath.Join(c.dir, m.name)
	log, err := os.OpenFile(filepath.Join(c.dir, m.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	m.cmd = exec.Command("etcd", "--name", m.name, "--data-dir", data,
		"--listen-client-urls", m.client, "--advertise-client-urls", m.client,
		"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
		"--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token", filepath.Base(c.dir),
		"--heartbeat-interval", "50", "--election-timeout", "500")
	m.cmd.Args = append(m.cmd.Args, c.tlsArgs...)
	if c.netns != "" {
		m.cmd.Args = append([]string{"ip", "netns", "exec", c.netns}, m.cmd.Args...)
		m.cmd.Path = "/usr/sbin/ip"
		if p, err := exec.LookPath("ip"); err == nil {
			m.cmd.Path = p
		}
	}
	m.cmd.Stdout, m.cmd.Stderr = log, log
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		c.t.Fatalf("start etcd: %v", err)
	}
	m.done = make(chan struct{})
	go func() { m.cmd.Wait(); log.Close(); close(m.done) }()
}

// wait until some member's /health says true (a leader is elected).
func (c *Cluster) wait() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		for _, m := range c.members {
			args := []string{"--endpoints", m.client, "--command-timeout", "1s"}
			if c.tlsArgs != nil {
				args = append(args, "--cacert", filepath.Join(c.dir, "ca.pem"), "--cert", filepath.Join(c.dir, "client.pem"), "--key", filepath.Join(c.dir, "client-key.pem"))
			}
			out, err := exec.CommandContext(ctx, "etcdctl", append(args, "endpoint", "health")...).CombinedOutput()
			if err == nil && strings.Contains(string(out), "is healthy") {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	logs, _ := filepath.Glob(filepath.Join(c.dir, "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		c.t.Logf("%s:\n%s", l, tail(string(b), 2000))
	}
	c.t.Fatalf("etcd did not become healthy in 30s")
}

func (c *Cluster) stop() {
	for i := range c.members {
		c.Kill(i)
	}
}

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// makeCerts writes a CA, a server certificate for the members' host and a client
// certificate, all signed by the CA, into the cluster's directory.
func (c *Cluster) makeCerts() {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcdtest CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		c.t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	c.writePEM("ca.pem", "CERTIFICATE", caDER)
	issue := func(name string, serial int64, usage x509.ExtKeyUsage) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP(c.host)}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			c.t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(key)
		c.writePEM(name+".pem", "CERTIFICATE", der)
		c.writePEM(name+"-key.pem", "EC PRIVATE KEY", kb)
	}
	issue("server", 2, x509.ExtKeyUsageServerAuth)
	issue("client", 3, x509.ExtKeyUsageClientAuth)
}

func (c *Cluster) writePEM(name, typ string, der []byte) {
	if err := os.WriteFile(filepath.Join(c.dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		c.t.Fatal(err)
	}
}

func (c *Cluster) clientTLS() *tls.Config {
	cert, err := tls.LoadX509KeyPair(filepath.Join(c.dir, "client.pem"), filepath.Join(c.dir, "client-key.pem"))
	if err != nil {
		c.t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(c.dir, "ca.pem"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}
