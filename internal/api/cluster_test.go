package api

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/cluster"
)

// fakeCluster accepts the proof "good" only (signatures themselves are
// tested in internal/cluster).
type fakeCluster struct{ Cluster }

func (fakeCluster) Name() string { return "b" }
func (fakeCluster) Verify(proof, _, _ string, _ []byte) (string, error) {
	if proof != "good" {
		return "", errors.New("bad")
	}
	return "a", nil
}
func (fakeCluster) Nodes(context.Context) ([]cluster.Node, error) { return nil, nil }

// A call another node vouched for is served as its principal, and the
// node headers stop at the door: nothing behind (a sandbox's server behind
// the ports proxy) sees who was vouched for.
func TestPeersStripNodeHeaders(t *testing.T) {
	s := &Server{Log: slog.New(slog.DiscardHandler), Cluster: fakeCluster{}}
	var seen http.Header
	var who *auth.Principal
	var from string
	h := s.peers(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, who, from = r.Header.Clone(), auth.From(r.Context()), fromNode(r.Context())
	}))
	principal := base64.RawURLEncoding.EncodeToString([]byte(`{"name":"ci","scopes":["sandbox:read"],"project":"p1","asked":"p1"}`))
	for _, tc := range []struct {
		proof  string
		status int
	}{{"good", 200}, {"forged", 401}} {
		seen, who, from = nil, nil, ""
		r := httptest.NewRequest("GET", "/v0/sandboxes/x/ports/80/", nil)
		r.Header.Set(nodeSignatureHeader, tc.proof)
		r.Header.Set(nodePrincipalHeader, principal)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.status {
			t.Fatalf("%s: status %d, want %d", tc.proof, w.Code, tc.status)
		}
		if tc.status != 200 {
			if seen != nil {
				t.Fatalf("%s: served", tc.proof)
			}
			continue
		}
		if seen.Get(nodeSignatureHeader) != "" || seen.Get(nodePrincipalHeader) != "" {
			t.Fatalf("the node headers went on: %v", seen)
		}
		if who == nil || who.Name != "ci" || who.Project != "p1" || who.Admin || from != "a" || seen.Get(ProjectHeader) != "p1" {
			t.Fatalf("served as %+v from %q (project %q)", who, from, seen.Get(ProjectHeader))
		}
	}
}
