package cluster

import (
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// handshake runs a TLS handshake over loopback TCP between a server and a
// client config, and returns both sides' errors and the node the server
// saw.
func handshake(t *testing.T, srv *NodeTLS, cli *tls.Config) (serverErr, clientErr error, peer string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			serverErr = err
			return
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		s := tls.Server(c, srv.Server())
		defer s.Close()
		if serverErr = s.Handshake(); serverErr != nil {
			return
		}
		st := s.ConnectionState()
		if peer, serverErr = srv.PeerNode(&st); serverErr == nil {
			s.Write([]byte("x")) // a TLS 1.3 client learns of a refused certificate only when it reads
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, cli)
	if clientErr = tc.Handshake(); clientErr == nil {
		_, clientErr = io.ReadFull(tc, make([]byte, 1))
	}
	tc.Close()
	<-done
	return
}

func TestNodeTLS(t *testing.T) {
	key := []byte(strings.Repeat("k", 32))
	other := []byte(strings.Repeat("o", 32))
	mk := func(k []byte, node string) *NodeTLS {
		n, err := NewNodeTLS(k, node)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	a, b, x := mk(key, "a"), mk(key, "b"), mk(other, "b")

	// Two nodes of one key: each knows the other.
	if se, ce, peer := handshake(t, a, b.Client("a")); se != nil || ce != nil || peer != "b" {
		t.Fatalf("a and b: server %v, client %v, peer %q", se, ce, peer)
	}
	// A node of another key: neither end completes.
	if se, ce, _ := handshake(t, a, x.Client("a")); se == nil || ce == nil {
		t.Fatalf("a client of another key: server %v, client %v; want both refused", se, ce)
	}
	if se, ce, _ := handshake(t, x, a.Client("b")); ce == nil || !strings.Contains(ce.Error(), "not a certificate of this cluster") {
		t.Fatalf("a server of another key: server %v, client %v; want the client to refuse it", se, ce)
	}
	// No client certificate: refused.
	if se, _, _ := handshake(t, a, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}); se == nil {
		t.Fatal("a client without a certificate was taken")
	}
	// The server must be the node meant.
	if _, ce, _ := handshake(t, a, b.Client("c")); ce == nil || !strings.Contains(ce.Error(), "not c's") {
		t.Fatalf("a's certificate taken for c's: %v", ce)
	}
	// The CA is the same on every node and at every start: a node made
	// again (a restart) still knows the others.
	if se, ce, _ := handshake(t, mk(key, "a"), b.Client("a")); se != nil || ce != nil {
		t.Fatalf("after a restart: server %v, client %v", se, ce)
	}
	if _, err := NewNodeTLS([]byte("short"), "a"); err == nil {
		t.Fatal("a short key was taken")
	}
}
