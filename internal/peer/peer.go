// Package peer is how a node of a cluster calls another: over mutual TLS
// (cluster.NodeTLS), each call signed for the principal the calling node
// vouches for (its caller's, whose key it checked: the key never travels),
// through the public client.Client. Whatever a node answers comes back
// through one mapping (errorOf): its error as an errdefs error of its code
// and class, 503 node_unreachable when it gave no answer, and 502 upstream
// for an answer that is not its API's.
package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/errdefs"
)

// Signer signs this node's calls to the others and holds its TLS
// (cluster.Cluster is one).
type Signer interface {
	Sign(to, method, uri string, principal []byte) string
	TLS() *cluster.NodeTLS
}

// How long a call may take, by what it does.
const (
	CallTimeout    = 30 * time.Second // a JSON call: a list, a probe, a removal
	RestoreTimeout = 10 * time.Minute // a restore (a fork moved to the node)
	CopyTimeout    = time.Hour        // a copy of an environment or an import
)

// Client calls the other nodes of a cluster. It is safe for concurrent use.
type Client struct {
	signer Signer
	// The timeouts of CallTimeout, RestoreTimeout and CopyTimeout (tests
	// shorten them).
	callTimeout, restoreTimeout, copyTimeout time.Duration

	mu    sync.Mutex
	rts   map[string]*http.Transport // each node's pool; guarded by mu
	nodes map[string]*Node           // each node's client, by name; guarded by mu
}

// New returns a client of the nodes signer's cluster.
func New(signer Signer) *Client {
	return &Client{signer: signer, callTimeout: CallTimeout, restoreTimeout: RestoreTimeout, copyTimeout: CopyTimeout}
}

// Close lets go of the idle connections to every node.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rt := range c.rts {
		rt.CloseIdleConnections()
	}
}

// transport is the connection pool to node, over mutual TLS: its
// certificate must be the cluster's and name it (cluster.NodeTLS.Client).
// One pool a node: a connection checked for one node is never lent to a
// call meant for another that took its address.
func (c *Client) transport(node string) *http.Transport {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rt := c.rts[node]; rt != nil {
		return rt
	}
	if c.rts == nil {
		c.rts = map[string]*http.Transport{}
	}
	rt := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     c.signer.TLS().Client(node),
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	c.rts[node] = rt
	return rt
}

// Node is the client of one node.
type Node struct {
	c      *Client
	name   string
	addr   string
	target *url.URL
	signed http.RoundTripper // the node's pool, every call signed
	api    *client.Client    // over signed, its error answers checked
}

// Node returns the client of node n (up, as the caller found it).
func (c *Client) Node(n cluster.Node) (*Node, error) {
	c.mu.Lock()
	node := c.nodes[n.Name]
	c.mu.Unlock()
	if node != nil && node.addr == n.Address {
		return node, nil
	}
	node, err := c.newNode(n)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nodes == nil {
		c.nodes = map[string]*Node{}
	}
	c.nodes[n.Name] = node // a node that moved: its new address from now on
	return node, nil
}

func (c *Client) newNode(n cluster.Node) (*Node, error) {
	target, err := url.Parse(n.Address)
	if err != nil || (target.Scheme != "http" && target.Scheme != "https") || target.Host == "" {
		return nil, fmt.Errorf("node %s's address %q is not an http(s) URL", n.Name, n.Address)
	}
	signed := &signing{to: n.Name, signer: c.signer, next: c.transport(n.Name)}
	api, err := client.New(client.Options{Remote: n.Address, Transport: checked{signed}})
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	return &Node{c: c, name: n.Name, addr: n.Address, target: target, signed: signed, api: api}, nil
}

// Name is the node's name.
func (n *Node) Name() string { return n.name }

// signing sends each call as this node's for the caller its context
// carries (WithCaller): a call with none is not sent.
type signing struct {
	to     string
	signer Signer
	next   http.RoundTripper
}

func (t *signing) RoundTrip(r *http.Request) (*http.Response, error) {
	c, ok := callerOf(r.Context())
	if !ok {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, errdefs.New(errdefs.KindInternal, "", "a call to node %s vouches for no one: its context has no caller", t.to)
	}
	out := r.Clone(r.Context())
	sign(out, t.signer, t.to, c)
	return t.next.RoundTrip(out)
}

// checked passes a node's answers on, but an error answer that is not
// JSON is not the node's API speaking (a proxy's page, a server that is
// not shard): it is notAPI, never read as the node's word.
type checked struct{ next http.RoundTripper }

func (t checked) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(r)
	if err != nil || resp.StatusCode < 400 || isJSON(resp.Header) {
		return resp, err
	}
	resp.Body.Close()
	return nil, &notAPI{status: resp.Status, ctype: resp.Header.Get("Content-Type")}
}

func isJSON(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mt == "application/json"
}

// notAPI is an answer of a node that is not its API's.
type notAPI struct{ status, ctype string }

func (e *notAPI) Error() string {
	return fmt.Sprintf("an answer %s of type %q, not the API's JSON", e.status, e.ctype)
}

// errorOf is the error of a call to the node that failed with err (from
// client.Client, or the proxy's transport), ctx the caller's: the one
// place a node's answer, or its silence, becomes this node's error.
func (n *Node) errorOf(ctx context.Context, err error) error {
	var (
		ce  *client.Error
		bad *notAPI
		ue  *url.Error
		ne  net.Error
	)
	switch {
	case err == nil:
		return nil
	case errors.Is(ctx.Err(), context.Canceled):
		// The caller left: a 499, not the node's failure.
		return fmt.Errorf("call node %s: %w", n.name, ctx.Err())
	case errors.As(err, &bad):
		return errdefs.Upstream(client.CodeUpstream, "node %s answered what is not its API's: %v", n.name, bad)
	case errors.As(err, &ce) && ce.Status == 0:
		return errdefs.Invalid("%s", ce.Message) // refused here, not sent
	case errors.As(err, &ce):
		kind, ok := errdefs.KindOfStatus(ce.Status)
		if !ok || !client.IsCode(ce.Code) {
			return errdefs.Upstream(client.CodeUpstream, "node %s answered what is not its API's: status %d, code %q", n.name, ce.Status, ce.Code)
		}
		return &errdefs.Error{Kind: kind, Code: ce.Code, Msg: ce.Message, Err: ce}
	case isClassified(err):
		return err // this node's own refusal (no caller)
	case errors.As(err, &ue):
		return n.unreachable(ue.Err)
	case errors.As(err, &ne), errors.Is(err, context.DeadlineExceeded):
		return n.unreachable(err) // cut or stalled in the answer's body
	}
	// An answer came, but not the API's: not JSON, or cut short.
	return errdefs.Upstream(client.CodeUpstream, "node %s answered what is not its API's: %v", n.name, err)
}

func isClassified(err error) bool {
	_, ok := errdefs.As(err)
	return ok
}

// unreachable is the error of a call the node did not answer (in time).
func (n *Node) unreachable(err error) error {
	return errdefs.New(errdefs.KindUnavailable, client.CodeNodeUnreachable, "node %s (%s) does not answer: %v", n.name, n.addr, err)
}

// within runs call with a context that ends after d, and maps its error.
func (n *Node) within(ctx context.Context, d time.Duration, call func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return n.errorOf(ctx, call(cctx))
}

// apiPath is uri, a request URI of the API (/v0/...), as client.Client
// takes it.
func apiPath(uri string) (string, error) {
	p, ok := strings.CutPrefix(uri, "/v0/")
	if !ok {
		return "", fmt.Errorf("%q is not a request URI of the API (/v0/...)", uri)
	}
	return "/" + p, nil
}

// Get decodes into v the node's answer to GET uri, a request URI of the
// API (/v0/...): its part of a list, or whether it has what uri names.
func (n *Node) Get(ctx context.Context, uri string, v any) error {
	path, err := apiPath(uri)
	if err != nil {
		return err
	}
	return n.within(ctx, n.c.callTimeout, func(ctx context.Context) error {
		return n.api.Call(ctx, http.MethodGet, path, nil, v)
	})
}

// Hooks say how a restore that is a fork moved from another node runs
// (query parameters only a node may send).
type Hooks struct {
	FromNode string        // the node the fork's source is on (its ledger's from_node)
	Timeout  time.Duration // each on-fork hook's (0: the default)
	Ignore   bool          // a failing hook is recorded, and the fork kept
}

func (h Hooks) query() string {
	if h.FromNode == "" {
		return ""
	}
	q := url.Values{"from_node": {h.FromNode}, "hook_errors": {"fail"}, "hook_timeout": {h.Timeout.String()}}
	if h.Ignore {
		q.Set("hook_errors", "ignore")
	}
	return "?" + q.Encode()
}

// Restore starts a sandbox on the node from its checkpoint checkpointID;
// hooks, when they name a node, make it a fork moved from there.
func (n *Node) Restore(ctx context.Context, checkpointID string, req client.RestoreRequest, hooks Hooks) (*client.Sandbox, error) {
	var sb client.Sandbox
	err := n.within(ctx, n.c.restoreTimeout, func(ctx context.Context) error {
		return n.api.Call(ctx, http.MethodPost, "/checkpoints/"+url.PathEscape(checkpointID)+"/restore"+hooks.query(), req, &sb)
	})
	if err != nil {
		return nil, err
	}
	return &sb, nil
}

// RemoveCheckpoint removes the node's checkpoint id.
func (n *Node) RemoveCheckpoint(ctx context.Context, id string) error {
	return n.within(ctx, n.c.callTimeout, func(ctx context.Context) error { return n.api.RemoveCheckpoint(ctx, id) })
}

// RemoveSandbox removes the node's sandbox id, running or not.
func (n *Node) RemoveSandbox(ctx context.Context, id string) error {
	return n.within(ctx, n.c.callTimeout, func(ctx context.Context) error { return n.api.Remove(ctx, id, true) })
}

// RemoveEnvironment removes the node's environment name (its own, or its
// copy of another node's).
func (n *Node) RemoveEnvironment(ctx context.Context, name string) error {
	return n.within(ctx, n.c.callTimeout, func(ctx context.Context) error { return n.api.RemoveEnvironment(ctx, name) })
}

// RemoveImage removes the node's image ref (an import's copy).
func (n *Node) RemoveImage(ctx context.Context, ref string) error {
	return n.within(ctx, n.c.callTimeout, func(ctx context.Context) error { return n.api.RemoveImage(ctx, ref) })
}

// SendCheckpoint streams a checkpoint (what sandbox.Saved.ExportCheckpoint
// writes) to the node, which keeps it: POST /v0/cluster/checkpoints, with
// q for the receiver (environment=, image=). It takes as long as ctx lets
// it.
func (n *Node) SendCheckpoint(ctx context.Context, r io.Reader, q url.Values) error {
	path := "/cluster/checkpoints"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	resp, err := n.api.Do(ctx, http.MethodPost, path, r, "application/zstd")
	if err != nil {
		return n.errorOf(ctx, err)
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return n.errorOf(ctx, err)
}

// SendEnvironment asks the node, which built environment name, to send
// its checkpoint to node to (which keeps it as a copy).
func (n *Node) SendEnvironment(ctx context.Context, name, to string) error {
	return n.within(ctx, n.c.copyTimeout, func(ctx context.Context) error {
		return n.api.Call(ctx, http.MethodPost, "/cluster/environments/"+url.PathEscape(name)+"/send?to="+url.QueryEscape(to), nil, nil)
	})
}

// FetchImport asks the node for its import ref (a tar of an OCI image
// layout) and gives it to into as it comes; into's error is returned as
// it is.
func (n *Node) FetchImport(ctx context.Context, ref string, into func(io.Reader) error) error {
	var intoErr error
	err := n.within(ctx, n.c.copyTimeout, func(ctx context.Context) error {
		resp, err := n.api.Do(ctx, http.MethodGet, "/cluster/images/"+refPath(ref), nil, "")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/x-tar" {
			return &notAPI{status: resp.Status, ctype: resp.Header.Get("Content-Type")}
		}
		intoErr = into(resp.Body)
		return nil
	})
	if err != nil {
		return err
	}
	return intoErr
}

// refPath is an image reference as a path's tail, each segment escaped.
func refPath(ref string) string {
	parts := strings.Split(ref, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return strings.Join(parts, "/")
}
