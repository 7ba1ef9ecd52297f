package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/errdefs"
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

// The headers of a call from another node.
const (
	nodeSignatureHeader = "Shard-Node-Signature"
	nodePrincipalHeader = "Shard-Node-Principal"
)

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

// vouched is the principal a node sends on with a call: who the caller
// is (its key checked there) and the project it asked for.
type vouched struct {
	Admin   bool     `json:"admin,omitempty"`
	TokenID string   `json:"token_id,omitempty"`
	Name    string   `json:"name"`
	Scopes  []string `json:"scopes,omitempty"`
	Project string   `json:"project"`
	Asked   string   `json:"asked,omitempty"` // the Shard-Project the caller sent
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
// principal it vouches for becomes the call's. A call without the headers
// is a caller's own; with a bad signature it is refused (401).
func (s *Server) peers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proof := r.Header.Get(nodeSignatureHeader)
		bad := func(why string) {
			s.writeError(w, r, errdefs.New(errdefs.KindUnauth, client.CodeBadNodeSignature, "a call from another node was refused: %s", why))
		}
		onClusterPort := r.Context().Value(clusterPortKey{}) != nil
		if proof == "" {
			if onClusterPort {
				bad("the cluster port takes calls from the other nodes only (signed): callers use the API's --listen address")
				return
			}
			r.Header.Del(nodePrincipalHeader)
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
		certNode, err := s.Cluster.TLS().PeerNode(r.TLS)
		if err != nil {
			bad("its TLS client certificate: " + err.Error())
			return
		}
		raw, err := base64.RawURLEncoding.DecodeString(r.Header.Get(nodePrincipalHeader))
		if err != nil {
			bad("its principal is not base64")
			return
		}
		node, err := s.Cluster.Verify(proof, r.Method, r.URL.RequestURI(), raw)
		if err != nil {
			bad(err.Error())
			return
		}
		if node != certNode {
			bad(fmt.Sprintf("signed by node %s over node %s's TLS connection", node, certNode))
			return
		}
		var v vouched
		if err := json.Unmarshal(raw, &v); err != nil {
			bad("its principal is not JSON")
			return
		}
		// Nothing further (a sandbox's server behind the ports proxy) sees
		// who the node vouched for.
		r.Header.Del(nodeSignatureHeader)
		r.Header.Del(nodePrincipalHeader)
		// The socket's administrator and Anonymous are themselves here
		// too: a call vouched for no project ("-", as vouch sends
		// Anonymous, or none) is Anonymous's on purpose, which acts in
		// no project, never one that sees every project.
		var p *auth.Principal
		switch {
		case v.Admin:
			p = auth.Socket
		case v.Project == "" || v.Project == project.Nowhere:
			p = auth.Anonymous
		default:
			p = &auth.Principal{TokenID: v.TokenID, Name: v.Name, Scopes: v.Scopes, Project: v.Project}
		}
		r.Header.Del(ProjectHeader)
		if v.Asked != "" {
			r.Header.Set(ProjectHeader, v.Asked)
		}
		ctx := context.WithValue(auth.WithPrincipal(r.Context(), p), peerKey{}, node)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// vouch signs out (a call going on to node to) for in's principal, and
// drops the caller's key from it.
func (s *Server) vouch(out, in *http.Request, to string) {
	client.DropKey(out)
	// Anonymous (a route anyone may call) vouches for no one: no scope,
	// no project.
	v := vouched{Name: auth.Anonymous.Name, Project: project.Nowhere, Asked: requestedProject(in)}
	switch p := auth.From(in.Context()); {
	case p == auth.Anonymous:
	case p.Admin:
		v.Admin, v.Name, v.Project = true, auth.Socket.Name, ""
	default:
		v.TokenID, v.Name, v.Scopes, v.Project = p.TokenID, p.Name, p.Scopes, p.Project
	}
	raw, _ := json.Marshal(v)
	out.Header.Del(ProjectHeader)
	out.Header.Set(nodePrincipalHeader, base64.RawURLEncoding.EncodeToString(raw))
	out.Header.Set(nodeSignatureHeader, s.Cluster.Sign(to, out.Method, out.URL.RequestURI(), raw))
	if id := infoOf(in.Context()); id != nil {
		out.Header.Set(RequestIDHeader, id.id) // one id across the hops
	}
}

// transport is the connection pool to node, over mutual TLS: its
// certificate must be the cluster's and name it (cluster.NodeTLS.Client).
// One pool a node: a connection checked for one node is never lent to a
// call meant for another that took its address.
func (s *Server) transport(node string) http.RoundTripper {
	s.peerMu.Lock()
	defer s.peerMu.Unlock()
	if rt := s.peerRTs[node]; rt != nil {
		return rt
	}
	if s.peerRTs == nil {
		s.peerRTs = map[string]*http.Transport{}
	}
	rt := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     s.Cluster.TLS().Client(node),
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	s.peerRTs[node] = rt
	return rt
}

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

// proxy sends the call on to node and streams its answer back (exec
// streams, WebSocket upgrades and ledger follows included). body, when not
// nil, is the call's body already read.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, node string, body []byte) {
	n, err := s.upNode(r.Context(), node)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	target, err := url.Parse(n.Address)
	if err != nil {
		s.writeError(w, r, fmt.Errorf("node %s's address %q: %w", n.Name, n.Address, err))
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			if body != nil {
				pr.Out.Body = io.NopCloser(bytes.NewReader(body))
				pr.Out.ContentLength = int64(len(body))
			}
			s.vouch(pr.Out, pr.In, n.Name)
		},
		Transport:     s.transport(n.Name),
		FlushInterval: -1, // streams: every write goes out at once
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(RequestIDHeader) // ours is set already (the same id)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if cerr := r.Context().Err(); cerr != nil {
				s.writeError(w, r, cerr) // the caller left: a 499 in the access log
				return
			}
			s.writeError(w, r, errdefs.New(errdefs.KindUnavailable, client.CodeNodeUnreachable, "node %s (%s) does not answer: %v", n.Name, n.Address, err))
		},
	}
	rp.ServeHTTP(w, r)
}

// call makes a JSON call to node for in's principal and decodes its answer
// (for lists merged from every node, and for finding what a node holds),
// within 30 seconds.
func (s *Server) call(ctx context.Context, in *http.Request, node cluster.Node, method, uri string, body []byte, v any) (int, error) {
	return s.callWithin(ctx, 30*time.Second, in, node, method, uri, body, v)
}

// callWithin is call for work that takes longer (a restore, a copy).
func (s *Server) callWithin(ctx context.Context, d time.Duration, in *http.Request, node cluster.Node, method, uri string, body []byte, v any) (int, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	out, err := http.NewRequestWithContext(ctx, method, node.Address+uri, rd)
	if err != nil {
		return 0, err
	}
	out.Header = in.Header.Clone()
	out.Header.Del("Content-Length")
	out.Header.Del("Accept-Encoding")
	s.vouch(out, in, node.Name)
	resp, err := s.transport(node.Name).RoundTrip(out)
	if err != nil {
		return 0, nodeUnreachable(ctx, node, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, nodeUnreachable(ctx, node, err)
	}
	if resp.StatusCode >= 400 {
		var e Error
		if json.Unmarshal(b, &e) == nil && e.Code != "" {
			return resp.StatusCode, errdefs.New(kindOfStatus(resp.StatusCode), e.Code, "%s", e.Message)
		}
		return resp.StatusCode, errdefs.Upstream("", "node %s answered %s", node.Name, resp.Status)
	}
	if v == nil {
		return resp.StatusCode, nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return resp.StatusCode, errdefs.Upstream("", "node %s answered what is not its API's: %v", node.Name, err)
	}
	return resp.StatusCode, nil
}

// nodeUnreachable is the error of a call to node that got no answer
// (err): the caller's leaving, a 499 (ctx is the call's), or the node's, a
// 503 node_unreachable.
func nodeUnreachable(ctx context.Context, node cluster.Node, err error) error {
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return fmt.Errorf("call node %s: %w", node.Name, ctx.Err())
	}
	return errdefs.New(errdefs.KindUnavailable, client.CodeNodeUnreachable, "node %s (%s) does not answer: %v", node.Name, node.Address, err)
}

// kindOfStatus is the error class of another node's answer (statusOf
// backwards), so its error is passed on as it was.
func kindOfStatus(status int) errdefs.Kind {
	for _, k := range []errdefs.Kind{errdefs.KindInvalid, errdefs.KindNotFound, errdefs.KindConflict,
		errdefs.KindForbidden, errdefs.KindUnauth, errdefs.KindFailed, errdefs.KindTooLarge, errdefs.KindNoSpace,
		errdefs.KindTooMany, errdefs.KindCanceled, errdefs.KindUpstream, errdefs.KindUnavailable, errdefs.KindTimeout} {
		if statusOf(k) == status {
			return k
		}
	}
	return errdefs.KindInternal
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
	others, _ := s.otherUpNodes(r.Context())
	for _, n := range others {
		var answer json.RawMessage
		if _, err := s.call(r.Context(), r, n, http.MethodGet, uri, nil, &answer); err == nil {
			return n.Name
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
	var wg sync.WaitGroup
	for i, n := range nodes {
		if n.Name == s.Cluster.Name() || n.State != cluster.NodeUp {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, answers[i].err = s.call(r.Context(), r, n, http.MethodGet, r.URL.RequestURI(), nil, &answers[i].lists)
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
		if _, err := s.Sandboxes.GetSnapshot(r.Context(), want.FromSnapshot); node == "" && errdefs.Is(err, errdefs.KindNotFound) {
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
