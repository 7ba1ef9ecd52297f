package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/peer"
	"github.com/useshards/shard/internal/project"
)

// In a cluster any node answers any call: a call about a sandbox (or a
// checkpoint, a session...) another node holds is sent on to that node,
// which serves it as if it came from the caller. The node that took the
// call has checked the caller's key; the key itself never travels on: the
// next node gets the principal it vouches for, signed with the cluster key
// (internal/cluster.Sign). A call that arrived from a node is served
// here, never sent on again.

// Cluster is what the API needs of the cluster this node belongs to (nil
// on a single host).
type Cluster interface {
	Name() string
	Locate(ctx context.Context, idOrName string) (*cluster.Placement, error)
	Node(ctx context.Context, name string) (cluster.Node, error)
	Nodes(ctx context.Context) ([]cluster.Node, error)
	Place(ctx context.Context, want, provider string, memory int64) (cluster.Node, error)
	Placements(ctx context.Context, node string) ([]cluster.Placement, error)
	Free() int64 // the memory this node's sandboxes may still be given
	Environment(ctx context.Context, name string) (*cluster.EnvPlacement, error)
	Image(ctx context.Context, ref string) (*cluster.ImagePlacement, error) // an import, by its canonical name
	Sign(to, method, uri string, principal []byte) string
	Verify(proof, method, uri string, principal []byte) (string, error)
	TLS() *cluster.NodeTLS // the cluster's CA and this node's certificate
}

// placement says where a route's calls are served in a cluster. Every
// route declares one in routes(): the zero value is no placement, which
// Handler refuses, so a route added without thinking of the cluster does
// not quietly answer for one node.
type placement int

const (
	unplaced        placement = iota
	local                     // here (images, tokens, secrets: local, or in etcd for every node)
	sandboxNode               // on the node holding the sandbox {id}
	holderNode                // here, or on the first other node that has what {id} or {name} names
	everyNode                 // every node's answer, merged (a list)
	placedNode                // on the node placement chooses (create)
	bodySandboxNode           // on the node holding the sandbox the body names (snapshot, environment from a sandbox)
	importerNode              // an imported image's: on the node that imported it (clusterimages.go)
)

var placementNames = [...]string{"unplaced", "local", "sandboxNode", "holderNode", "everyNode", "placedNode", "bodySandboxNode", "importerNode"}

func (p placement) String() string { return placementNames[p] }

// where is a route's placement, with how a holderNode route finds the
// holder: probe answers here (not found: ask the others at probeURI).
type where struct {
	place    placement
	probe    func(*http.Request) (any, int, error)
	probeURI func(*http.Request) string
}

func at(p placement) where { return where{place: p} }

// heldAt is a holderNode placement: what probe finds, at prefix plus the
// path value param.
func heldAt(probe func(*http.Request) (any, int, error), prefix, param string) where {
	return where{place: holderNode, probe: probe, probeURI: func(r *http.Request) string { return prefix + url.PathEscape(r.PathValue(param)) }}
}

type peerKey struct{}

type clusterPortKey struct{}

// OnClusterPort marks a connection's context as the cluster port's (shard
// serve --cluster-listen, mutual TLS): the only way in for another node's
// calls, and for nothing else.
func OnClusterPort(ctx context.Context) context.Context {
	return context.WithValue(ctx, clusterPortKey{}, true)
}

// fromNode is the node that sent this call on ("" for a caller's own).
func fromNode(ctx context.Context) string { n, _ := ctx.Value(peerKey{}).(string); return n }

// peers admits a call another node sent on: its signature checked, the
// principal it vouches for becomes the call's (peer.Verify). A call
// without the headers is a caller's own; with a bad signature it is
// refused (401).
func (s *Server) peers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bad := func(why string) {
			s.writeError(w, r, errdefs.New(errdefs.KindUnauth, client.CodeBadNodeSignature, "a call from another node was refused: %s", why))
		}
		onClusterPort := r.Context().Value(clusterPortKey{}) != nil
		if r.Header.Get(peer.SignatureHeader) == "" {
			if onClusterPort {
				bad("the cluster port takes calls from the other nodes only (signed): callers use the API's --listen address")
				return
			}
			r.Header.Del(peer.PrincipalHeader)
			next.ServeHTTP(w, r)
			return
		}
		if s.Cluster == nil {
			bad("this server is not part of a cluster")
			return
		}
		// Never over plain HTTP: a node's call comes on the cluster port,
		// from a client certificate of this cluster's CA, and is signed by
		// the node that certificate names.
		if !onClusterPort {
			bad("calls between nodes are taken only on the cluster port (shard serve --cluster-listen), over mutual TLS")
			return
		}
		in, err := peer.Verify(r, s.Cluster)
		if err != nil {
			bad(err.Error())
			return
		}
		// Nothing further (a sandbox's server behind the ports proxy) sees
		// who the node vouched for.
		r.Header.Del(peer.SignatureHeader)
		r.Header.Del(peer.PrincipalHeader)
		r.Header.Del(ProjectHeader)
		if in.Asked != "" {
			r.Header.Set(ProjectHeader, in.Asked)
		}
		ctx := context.WithValue(auth.WithPrincipal(r.Context(), in.Principal), peerKey{}, in.Node)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// asCaller is r's context for calls to other nodes: each is made for r's
// principal (peer.WithCaller), with r's id.
func asCaller(r *http.Request) context.Context {
	c := peer.Caller{Principal: auth.From(r.Context()), Asked: requestedProject(r)}
	if info := infoOf(r.Context()); info != nil {
		c.RequestID = info.id
	}
	return peer.WithCaller(r.Context(), c)
}

// nodeClient is the client of the other nodes, made on first use (nil on
// a single host).
func (s *Server) nodeClient() *peer.Client {
	s.peerOnce.Do(func() {
		if s.Cluster != nil {
			s.peerc = peer.New(s.Cluster)
		}
	})
	return s.peerc
}

// peerOf is the client of node n.
func (s *Server) peerOf(n cluster.Node) (*peer.Node, error) { return s.nodeClient().Node(n) }

// upNode returns the named node if it is up.
func (s *Server) upNode(ctx context.Context, name string) (cluster.Node, error) {
	n, err := s.Cluster.Node(ctx, name)
	if err != nil {
		return n, err
	}
	if n.State != cluster.NodeUp {
		return n, cluster.NodeDown(n.Name)
	}
	return n, nil
}

// upPeer is the client of the named node if it is up.
func (s *Server) upPeer(ctx context.Context, name string) (*peer.Node, error) {
	n, err := s.upNode(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.peerOf(n)
}

// proxy sends the call on to node and streams its answer back (exec
// streams, WebSocket upgrades and ledger follows included). body, when not
// nil, is the call's body already read.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, node string, body []byte) {
	n, err := s.upPeer(r.Context(), node)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	n.Forward(w, r.WithContext(asCaller(r)), body, s.writeError)
}

// routed wraps a route's handler with where its calls are served.
func (s *Server) routed(rt route, h http.HandlerFunc) http.HandlerFunc {
	if rt.where.place == local {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if s.Cluster == nil || fromNode(r.Context()) != "" {
			h(w, r)
			return
		}
		switch rt.where.place {
		case sandboxNode:
			s.serveBySandbox(w, r, h)
		case holderNode:
			s.serveAnyNode(w, r, rt, h)
		case everyNode:
			s.serveEveryNode(w, r, rt)
		case placedNode:
			s.servePlaced(w, r, h)
		case bodySandboxNode:
			s.serveByBodySandbox(w, r, h)
		case importerNode:
			s.serveByImage(w, r, h)
		default:
			panic("route " + rt.pattern + " has placement " + rt.where.place.String())
		}
	}
}

// serveBySandbox serves a sandbox's call here when the sandbox is here,
// else on its node (503 node_unreachable when that node is down).
func (s *Server) serveBySandbox(w http.ResponseWriter, r *http.Request, h http.HandlerFunc) {
	s.serveOnNodeOf(w, r, h, r.PathValue("id"), nil)
}

// serveOnNodeOf serves the call here when sandbox id is here (or nowhere:
// h says so), else on its node; body is the call's, read already (nil: not).
func (s *Server) serveOnNodeOf(w http.ResponseWriter, r *http.Request, h http.HandlerFunc, id string, body []byte) {
	if _, err := s.Sandboxes.Get(r.Context(), id); !errdefs.Is(err, errdefs.KindNotFound) {
		h(w, r) // here (or an error of its own, which h gives)
		return
	}
	p, err := s.Cluster.Locate(r.Context(), id)
	switch {
	case errdefs.Is(err, errdefs.KindNotFound) || (err == nil && p.Node == s.Cluster.Name()):
		h(w, r) // here: h says it is not found
	case err != nil:
		s.writeError(w, r, err)
	default:
		s.proxy(w, r, p.Node, body)
	}
}

// serveByBodySandbox serves a call whose body names a sandbox ("sandbox":
// a snapshot of it, an environment from it) on that sandbox's node.
func (s *Server) serveByBodySandbox(w http.ResponseWriter, r *http.Request, h http.HandlerFunc) {
	body, err := readBody(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var named struct {
		Sandbox string `json:"sandbox"`
		Name    string `json:"name"`
	}
	json.Unmarshal(body, &named) // a bad body is refused by the node that serves it
	r.Body = io.NopCloser(bytes.NewReader(body))
	if named.Sandbox == "" {
		// An environment is (re)built on the node that built it.
		if strings.HasSuffix(r.URL.Path, "/environments") && named.Name != "" {
			if p, err := s.Cluster.Environment(r.Context(), named.Name); err == nil && p.Node != s.Cluster.Name() {
				s.proxy(w, r, p.Node, body)
				return
			}
		}
		h(w, r)
		return
	}
	s.serveOnNodeOf(w, r, h, named.Sandbox, body)
}

// serveAnyNode serves the call here unless what it names is not here;
// then on the first other node that has it (a checkpoint, a snapshot, a
// ledger session lives on the node that made it). Whether a node has it
// is asked with the route's GET (probe here, probeURI there), so nothing
// is changed on a node that does not hold it.
func (s *Server) serveAnyNode(w http.ResponseWriter, r *http.Request, rt route, h http.HandlerFunc) {
	v, code, err := rt.where.probe(r)
	if !errdefs.Is(err, errdefs.KindNotFound) {
		if r.Method == http.MethodGet && rt.json != nil { // the probe was the call
			if err != nil {
				s.writeError(w, r, err)
				return
			}
			writeJSON(w, code, v)
			return
		}
		h(w, r)
		return
	}
	if node := s.holder(r, rt.where.probeURI(r)); node != "" {
		s.proxy(w, r, node, nil)
		return
	}
	s.writeError(w, r, err)
}

// holder is the first other up node that answers the GET uri (what a
// call names is there), or "" when none does.
func (s *Server) holder(r *http.Request, uri string) string {
	others, _ := s.otherUpPeers(r.Context())
	ctx := asCaller(r)
	for _, n := range others {
		var answer json.RawMessage
		if err := n.Get(ctx, uri, &answer); err == nil {
			return n.Name()
		}
	}
	return ""
}

// otherUpNodes are the nodes, this one aside, that are up (with etcd away:
// as this node last knew, and Nodes' error).
func (s *Server) otherUpNodes(ctx context.Context) ([]cluster.Node, error) {
	nodes, err := s.Cluster.Nodes(ctx)
	var out []cluster.Node
	for _, n := range nodes {
		if n.Name != s.Cluster.Name() && n.State == cluster.NodeUp {
			out = append(out, n)
		}
	}
	return out, err
}

// otherUpPeers are the clients of otherUpNodes (a node whose address is
// not a URL left out, logged).
func (s *Server) otherUpPeers(ctx context.Context) ([]*peer.Node, error) {
	nodes, err := s.otherUpNodes(ctx)
	out := make([]*peer.Node, 0, len(nodes))
	for _, n := range nodes {
		p, perr := s.peerOf(n)
		if perr != nil {
			s.cfgLog().Warn("cluster: a node is left out", "node", n.Name, "err", perr)
			continue
		}
		out = append(out, p)
	}
	return out, err
}

// serveEveryNode merges a list from every node that is up; a sandbox list
// also shows the sandboxes of unreachable nodes, as unreachable.
func (s *Server) serveEveryNode(w http.ResponseWriter, r *http.Request, rt route) {
	v, code, err := rt.json(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	mine, err := json.Marshal(v)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var merged map[string][]json.RawMessage
	if err := json.Unmarshal(mine, &merged); err != nil {
		s.writeError(w, r, fmt.Errorf("merge %s: %w", rt.pattern, err))
		return
	}
	nodes, err := s.Cluster.Nodes(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	type answer struct {
		lists map[string][]json.RawMessage
		err   error
	}
	answers := make([]answer, len(nodes))
	ctx := asCaller(r)
	var wg sync.WaitGroup
	for i, n := range nodes {
		if n.Name == s.Cluster.Name() || n.State != cluster.NodeUp {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := s.peerOf(n)
			if err == nil {
				err = p.Get(ctx, r.URL.RequestURI(), &answers[i].lists)
			}
			answers[i].err = err
		}()
	}
	wg.Wait()
	for i, n := range nodes {
		switch {
		case n.Name == s.Cluster.Name():
		case n.State != cluster.NodeUp || answers[i].err != nil:
			if answers[i].err != nil {
				s.cfgLog().Warn("cluster: a node's list is left out", "node", n.Name, "err", answers[i].err)
			}
			if rt.pattern == "GET /v0/sandboxes" {
				if err := s.addUnreachable(r, merged, n.Name); err != nil {
					s.writeError(w, r, err)
					return
				}
			}
		default:
			for k, list := range answers[i].lists {
				merged[k] = append(merged[k], list...)
			}
		}
	}
	writeJSON(w, code, merged)
}

// addUnreachable lists an unreachable node's sandboxes from their
// placements: what etcd knows of them, in state unreachable.
func (s *Server) addUnreachable(r *http.Request, merged map[string][]json.RawMessage, node string) error {
	ctx, err := everyProject(r)
	if err != nil {
		return err
	}
	ps, err := s.Cluster.Placements(ctx, node)
	if err != nil {
		return err
	}
	for _, p := range ps {
		b, _ := json.Marshal(Sandbox{ID: p.ID, Name: p.Name, Project: p.Project, Image: p.Image, Provider: p.Provider,
			State: StateUnreachable, MemoryMiB: p.MemoryMiB, MemoryBytes: p.MemoryMiB << 20, Session: p.Session, ParentID: p.ParentID,
			Node: p.Node, CreatedAt: p.CreatedAt, Env: []string{}, Grants: []Grant{}})
		merged["sandboxes"] = append(merged["sandboxes"], b)
	}
	return nil
}

func (s *Server) cfgLog() *slog.Logger { return s.Log.With("component", "cluster") }

// StateUnreachable is the state a sandbox shows while its node is.
const StateUnreachable = "unreachable"

// servePlaced serves a create on the node placement chooses: the one the
// call names, or the up node with the most free memory that has its
// provider.
func (s *Server) servePlaced(w http.ResponseWriter, r *http.Request, h http.HandlerFunc) {
	body, err := readBody(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// Read as the serving node reads it (a bad body is refused here, not
	// placed by a guess); the bounds it checks are that node's own.
	var want CreateRequest
	if err := decodeJSON(body, &want); err != nil {
		s.writeError(w, r, err)
		return
	}
	cr, err := createFields(want.Memory, want.MemoryMiB, want.CPU, want.Disk, want.Env)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	mem := cr.MemoryBytes
	r.Body = io.NopCloser(bytes.NewReader(body))
	if want.Environment != "" && want.Node == "" {
		// Placed as any create, with the environment's provider and
		// memory: the node chosen copies it on its first use there.
		if p, err := s.Cluster.Environment(r.Context(), want.Environment); err == nil {
			want.Provider, mem = p.Provider, p.MemoryBytes
		}
	} else if want.FromSnapshot != "" {
		// A snapshot is on the node of its sandbox: serve it there (or
		// on the node the call names).
		node := want.Node
		if _, err := s.Snapshots.GetSnapshot(r.Context(), want.FromSnapshot); node == "" && errdefs.Is(err, errdefs.KindNotFound) {
			node = s.holder(r, "/v0/snapshots/"+url.PathEscape(want.FromSnapshot))
		}
		if node == "" || node == s.Cluster.Name() {
			h(w, r)
			return
		}
		s.proxy(w, r, node, body)
		return
	}
	n, err := s.Cluster.Place(r.Context(), want.Node, want.Provider, mem)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if n.Name == s.Cluster.Name() {
		h(w, r)
		return
	}
	s.proxy(w, r, n.Name, body)
}

// listNodes answers GET /v0/nodes.
func (s *Server) listNodes(r *http.Request) (any, int, error) {
	if s.Cluster == nil {
		return nil, 0, errdefs.New(errdefs.KindUnsupported, client.CodeNotClustered, "this server is a single host, not part of a cluster (shard serve --cluster-etcd joins one)")
	}
	nodes, err := s.Cluster.Nodes(r.Context())
	if err != nil {
		return nil, 0, err
	}
	// A project's key counts its own project's sandboxes only.
	pctx := r.Context()
	if isAdmin(pctx) {
		pctx = project.Unscoped(pctx, "a key of every project counts every placement")
	}
	ps, err := s.Cluster.Placements(pctx, "")
	if err != nil {
		return nil, 0, err
	}
	count := map[string]int{}
	for _, p := range ps {
		count[p.Node]++
	}
	out := make([]client.Node, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, client.Node{Name: n.Name, Address: n.Address, State: n.State, Sandboxes: count[n.Name],
			Providers: slices.Clone(n.Providers), MemoryBytes: n.MemoryTotal, MemoryFree: n.MemoryFree, Load: n.Load, CPUs: n.CPUs,
			JoinedAt: n.JoinedAt, SeenAt: n.SeenAt, Self: n.Name == s.Cluster.Name()})
		if out[len(out)-1].Providers == nil {
			out[len(out)-1].Providers = []string{}
		}
	}
	return map[string]any{"nodes": out}, 200, nil
}
