package peer

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/project"
)

// The headers of a call from another node.
const (
	SignatureHeader = "Shard-Node-Signature"
	PrincipalHeader = "Shard-Node-Principal"
)

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

// Caller is who a call to another node is made for: the principal of the
// request that makes it, whose key this node checked.
type Caller struct {
	Principal *auth.Principal
	Asked     string // the Shard-Project the caller sent ("" for none)
	RequestID string // the request's id, the same on every node it reaches
}

type callerKey struct{}

// WithCaller returns ctx for calls to other nodes made for c. A call
// whose context has no caller is not sent.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

func callerOf(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok && c.Principal != nil
}

// principal is what is vouched for c: Anonymous (a route anyone may call)
// for no one, no scope, no project.
func (c Caller) principal() []byte {
	v := vouched{Name: auth.Anonymous.Name, Project: project.Nowhere, Asked: c.Asked}
	switch p := c.Principal; {
	case p == auth.Anonymous:
	case p.Admin:
		v.Admin, v.Name, v.Project = true, auth.Socket.Name, ""
	default:
		v.TokenID, v.Name, v.Scopes, v.Project = p.TokenID, p.Name, p.Scopes, p.Project
	}
	raw, _ := json.Marshal(v) // a struct of strings
	return raw
}

// sign makes out a call of this node to node to for c: the caller's key
// and project header dropped, the principal vouched for and its signature
// set (over the method and the request URI sent).
func sign(out *http.Request, s Signer, to string, c Caller) {
	client.DropKey(out)
	out.Header.Del(client.ProjectHeader)
	raw := c.principal()
	out.Header.Set(PrincipalHeader, base64.RawURLEncoding.EncodeToString(raw))
	out.Header.Set(SignatureHeader, s.Sign(to, out.Method, out.URL.RequestURI(), raw))
	if c.RequestID != "" {
		out.Header.Set(client.RequestIDHeader, c.RequestID) // one id across the hops
	}
}

// Verifier checks the calls that come from other nodes: a signature made
// by Signer.Sign on a node of the cluster, and the node's TLS certificate
// (cluster.Cluster is one).
type Verifier interface {
	Verify(proof, method, uri string, principal []byte) (node string, err error)
	TLS() *cluster.NodeTLS
}

// Admitted is a call another node sent on, as Verify found it.
type Admitted struct {
	Node      string          // the node that sent it
	Principal *auth.Principal // who it vouches for
	Asked     string          // the Shard-Project its caller sent ("" for none)
}

// Verify admits r, a call signed by another node (it has SignatureHeader),
// which came over mutual TLS: the node its client certificate names must
// have signed it, and the principal it vouches for becomes the call's.
// The error says why it is refused, for the caller to read.
func Verify(r *http.Request, v Verifier) (*Admitted, error) {
	certNode, err := v.TLS().PeerNode(r.TLS)
	if err != nil {
		return nil, fmt.Errorf("its TLS client certificate: %w", err)
	}
	raw, err := base64.RawURLEncoding.DecodeString(r.Header.Get(PrincipalHeader))
	if err != nil {
		return nil, errors.New("its principal is not base64")
	}
	node, err := v.Verify(r.Header.Get(SignatureHeader), r.Method, r.URL.RequestURI(), raw)
	if err != nil {
		return nil, err
	}
	if node != certNode {
		return nil, fmt.Errorf("signed by node %s over node %s's TLS connection", node, certNode)
	}
	var vc vouched
	if err := json.Unmarshal(raw, &vc); err != nil {
		return nil, errors.New("its principal is not JSON")
	}
	// The socket's administrator and Anonymous are themselves here too: a
	// call vouched for no project ("-", as a node sends Anonymous, or
	// none) is Anonymous's on purpose, which acts in no project, never one
	// that sees every project.
	var p *auth.Principal
	switch {
	case vc.Admin:
		p = auth.Socket
	case vc.Project == "" || vc.Project == project.Nowhere:
		p = auth.Anonymous
	default:
		p = &auth.Principal{TokenID: vc.TokenID, Name: vc.Name, Scopes: vc.Scopes, Project: vc.Project}
	}
	return &Admitted{Node: node, Principal: p, Asked: vc.Asked}, nil
}
