package api

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/peer"
)

// fakeCluster accepts the proof "good" only, as node a's (signatures
// themselves are tested in internal/cluster); its TLS is the real thing.
type fakeCluster struct {
	Cluster
	tls *cluster.NodeTLS
}

func (fakeCluster) Name() string { return "b" }
func (fakeCluster) Verify(proof, _, _ string, _ []byte) (string, error) {
	if proof != "good" {
		return "", errors.New("bad")
	}
	return "a", nil
}
func (f fakeCluster) TLS() *cluster.NodeTLS                       { return f.tls }
func (fakeCluster) Nodes(context.Context) ([]cluster.Node, error) { return nil, nil }

// A call another node vouched for is served as its principal, and the
// node headers stop at the door: nothing behind (a sandbox's server behind
// the ports proxy) sees who was vouched for.
func TestPeersStripNodeHeaders(t *testing.T) {
	key := []byte(strings.Repeat("k", 32))
	nodeTLS := func(k []byte, node string) *cluster.NodeTLS {
		n, err := cluster.NewNodeTLS(k, node)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	s := &Server{Log: slog.New(slog.DiscardHandler), Cluster: fakeCluster{tls: nodeTLS(key, "b")}}
	var seen http.Header
	var who *auth.Principal
	var from string
	h := s.peers(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, who, from = r.Header.Clone(), auth.From(r.Context()), fromNode(r.Context())
	}))
	// b's cluster port (mutual TLS), and its API port (plain).
	port := httptest.NewUnstartedServer(h)
	port.TLS = s.Cluster.TLS().Server()
	port.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context { return OnClusterPort(ctx) }
	port.StartTLS()
	defer port.Close()
	api := httptest.NewServer(h)
	defer api.Close()
	viaTLS := func(from string) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: nodeTLS(key, from).Client("b")}}
	}
	principal := base64.RawURLEncoding.EncodeToString([]byte(`{"name":"ci","scopes":["sandbox:read"],"project":"p1","asked":"p1"}`))
	for _, tc := range []struct {
		name   string
		url    string
		c      *http.Client
		proof  string
		status int
	}{
		{"a's call on the cluster port", port.URL, viaTLS("a"), "good", 200},
		{"a forged signature", port.URL, viaTLS("a"), "forged", 401},
		{"signed by a over c's certificate", port.URL, viaTLS("c"), "good", 401},
		{"unsigned on the cluster port", port.URL, viaTLS("a"), "", 401},
		{"a node's call on the API port", api.URL, http.DefaultClient, "good", 401},
	} {
		seen, who, from = nil, nil, ""
		r, _ := http.NewRequest("GET", tc.url+"/v0/sandboxes/x/ports/80/", nil)
		if tc.proof != "" {
			r.Header.Set(peer.SignatureHeader, tc.proof)
		}
		r.Header.Set(peer.PrincipalHeader, principal)
		resp, err := tc.c.Do(r)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Fatalf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.status)
		}
		if tc.status != 200 {
			if seen != nil {
				t.Fatalf("%s: served", tc.name)
			}
			continue
		}
		if seen.Get(peer.SignatureHeader) != "" || seen.Get(peer.PrincipalHeader) != "" {
			t.Fatalf("the node headers went on: %v", seen)
		}
		if who == nil || who.Name != "ci" || who.Project != "p1" || who.Admin || from != "a" || seen.Get(ProjectHeader) != "p1" {
			t.Fatalf("served as %+v from %q (project %q)", who, from, seen.Get(ProjectHeader))
		}
	}
	// Who a node vouches for is served as itself: the socket's
	// administrator, or Anonymous for a call of no project ("-", as vouch
	// sends it, or none), never a principal of every project.
	for _, tc := range []struct {
		vouched string
		want    *auth.Principal
	}{
		{`{"name":"anonymous","project":"-"}`, auth.Anonymous},
		{`{"name":"old","scopes":["*"],"project":""}`, auth.Anonymous},
		{`{"admin":true,"name":"the local administrator","project":""}`, auth.Socket},
	} {
		who = nil
		r, _ := http.NewRequest("GET", port.URL+"/v0/version", nil)
		r.Header.Set(peer.SignatureHeader, "good")
		r.Header.Set(peer.PrincipalHeader, base64.RawURLEncoding.EncodeToString([]byte(tc.vouched)))
		resp, err := viaTLS("a").Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if who != tc.want {
			t.Errorf("vouched %s: served as %+v, want %+v", tc.vouched, who, tc.want)
		}
	}
	// A client certificate of another cluster key gets no handshake.
	if _, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: nodeTLS([]byte(strings.Repeat("x", 32)), "a").Client("b")}}).Get(port.URL + "/v0/version"); err == nil {
		t.Fatal("a certificate of another key was taken")
	}
}

// fakeNodeA is node a of a cluster whose other node b is up at bAddr, or
// down: its signature is the proof fakeCluster (b) accepts.
type fakeNodeA struct {
	Cluster
	tls   *cluster.NodeTLS
	bAddr string
	bDown bool
}

func (fakeNodeA) Name() string                         { return "a" }
func (fakeNodeA) Sign(_, _, _ string, _ []byte) string { return "good" }
func (f fakeNodeA) TLS() *cluster.NodeTLS              { return f.tls }
func (f fakeNodeA) Nodes(context.Context) ([]cluster.Node, error) {
	b, _ := f.Node(context.Background(), "b")
	return []cluster.Node{{Name: "a", State: cluster.NodeUp}, b}, nil
}
func (f fakeNodeA) Node(_ context.Context, name string) (cluster.Node, error) {
	if name != "b" {
		return cluster.Node{}, errdefs.NotFound(client.CodeNodeNotFound, "no node %s", name)
	}
	if f.bDown {
		return cluster.Node{Name: "b", Address: f.bAddr, State: cluster.NodeUnreachable}, nil
	}
	return cluster.Node{Name: "b", Address: f.bAddr, State: cluster.NodeUp}, nil
}

// A call node a sends on reaches node b as its caller's (principal,
// project asked, request id), through b's door (peers); b's answer comes
// back as it is, and a node that is down is 503 node_unreachable.
func TestSentOnToNode(t *testing.T) {
	key := []byte(strings.Repeat("k", 32))
	nodeTLS := func(node string) *cluster.NodeTLS {
		n, err := cluster.NewNodeTLS(key, node)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	b := &Server{Log: slog.New(slog.DiscardHandler), Cluster: fakeCluster{tls: nodeTLS("b")}}
	var seen []string
	port := httptest.NewUnstartedServer(b.peers(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := auth.From(r.Context())
		seen = append(seen, fmt.Sprintf("%s %s as %s of %s asking %q from %s, id %s", r.Method, r.URL.RequestURI(), p.Name, p.Project,
			r.Header.Get(ProjectHeader), fromNode(r.Context()), r.Header.Get(RequestIDHeader)))
		if r.URL.Path == "/v0/checkpoints/gone" {
			writeJSON(w, 404, Error{Code: client.CodeCheckpointNotFound, Message: "no checkpoint gone"})
			return
		}
		w.Header().Set(RequestIDHeader, "b's")
		writeJSON(w, 201, map[string]string{"id": "c1"})
	})))
	port.TLS = b.Cluster.TLS().Server()
	port.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context { return OnClusterPort(ctx) }
	port.StartTLS()
	defer port.Close()
	a := &Server{Log: slog.New(slog.DiscardHandler), Cluster: fakeNodeA{tls: nodeTLS("a"), bAddr: port.URL}}
	defer a.Close()

	ci := &auth.Principal{TokenID: "t1", Name: "ci", Scopes: []string{"sandbox:write"}, Project: "p1"}
	call := func(method, target, body string) *http.Request {
		r := httptest.NewRequest(method, target, strings.NewReader(body))
		r.Header.Set(ProjectHeader, "p1")
		r.Header.Set("Authorization", "Bearer the-caller's-key")
		ctx := context.WithValue(auth.WithPrincipal(r.Context(), ci), requestInfoKey{}, &requestInfo{id: "req-7"})
		return r.WithContext(ctx)
	}
	w := httptest.NewRecorder()
	a.proxy(w, call("POST", "/v0/sandboxes/s1/checkpoints?x=1", "ignored"), "b", []byte(`{"tag":"t"}`))
	if w.Code != 201 || !strings.Contains(w.Body.String(), `"c1"`) || w.Header().Get(RequestIDHeader) != "" {
		t.Errorf("sent on: %d %s (request id %q)", w.Code, w.Body.String(), w.Header().Get(RequestIDHeader))
	}
	if node := a.holder(call("GET", "/v0/checkpoints/c1", ""), "/v0/checkpoints/c1"); node != "b" {
		t.Errorf("holder of c1 = %q, want b", node)
	}
	if node := a.holder(call("GET", "/v0/checkpoints/gone", ""), "/v0/checkpoints/gone"); node != "" {
		t.Errorf("holder of a checkpoint nobody has = %q", node)
	}
	want := []string{
		`POST /v0/sandboxes/s1/checkpoints?x=1 as ci of p1 asking "p1" from a, id req-7`,
		`GET /v0/checkpoints/c1 as ci of p1 asking "p1" from a, id req-7`,
		`GET /v0/checkpoints/gone as ci of p1 asking "p1" from a, id req-7`,
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("b served\n%s\nwant\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}

	a = &Server{Log: slog.New(slog.DiscardHandler), Cluster: fakeNodeA{tls: nodeTLS("a"), bAddr: port.URL, bDown: true}}
	w = httptest.NewRecorder()
	a.proxy(w, call("GET", "/v0/sandboxes/s1", ""), "b", nil)
	if w.Code != 503 || !strings.Contains(w.Body.String(), client.CodeNodeUnreachable) || !strings.Contains(w.Body.String(), "node b") {
		t.Errorf("sent on to a node that is down: %d %s", w.Code, w.Body.String())
	}
}
