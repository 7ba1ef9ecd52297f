package peer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/cluster"
	"github.com/useshards/shard/internal/errdefs"
)

var testKey = []byte(strings.Repeat("k", 32))

func nodeTLS(t *testing.T, node string) *cluster.NodeTLS {
	t.Helper()
	n, err := cluster.NewNodeTLS(testKey, node)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fakeSigner is node a: its signature is plain text, which fakeVerifier
// (node b) checks (signatures themselves are tested in internal/cluster);
// its TLS is the real thing.
type fakeSigner struct{ tls *cluster.NodeTLS }

func (f fakeSigner) Sign(to, method, uri string, principal []byte) string {
	return "a>" + to + " " + method + " " + uri + " " + string(principal)
}
func (f fakeSigner) TLS() *cluster.NodeTLS { return f.tls }

type fakeVerifier struct{ tls *cluster.NodeTLS }

func (f fakeVerifier) Verify(proof, method, uri string, principal []byte) (string, error) {
	if proof != "a>b "+method+" "+uri+" "+string(principal) {
		return "", errors.New("bad signature")
	}
	return "a", nil
}
func (f fakeVerifier) TLS() *cluster.NodeTLS { return f.tls }

// testNode is node a's client of node b, which h serves on its cluster
// port (mutual TLS).
func testNode(t *testing.T, h http.HandlerFunc) (*Client, *Node) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = nodeTLS(t, "b").Server()
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c := New(fakeSigner{tls: nodeTLS(t, "a")})
	t.Cleanup(c.Close)
	n, err := c.Node(cluster.Node{Name: "b", Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c, n
}

var ciKey = &auth.Principal{TokenID: "t1", Name: "ci", Scopes: []string{"sandbox:read"}, Project: "p1"}

func asCI() context.Context {
	return WithCaller(context.Background(), Caller{Principal: ciKey, Asked: "p1", RequestID: "req-1"})
}

// A node's answer comes back through one mapping: its error with its code
// and class, and anything that is not its API's answer as 502 upstream
// whose message does not repeat what came.
func TestErrorAnswers(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		ctype    string
		body     string
		wantKind errdefs.Kind
		wantCode string
		wantMsg  string
	}{
		{"not found", 404, "application/json", `{"code":"checkpoint_not_found","message":"no checkpoint x"}`, errdefs.KindNotFound, client.CodeCheckpointNotFound, "no checkpoint x"},
		{"in use", 409, "application/json; charset=utf-8", `{"code":"image_in_use","message":"used by s1"}`, errdefs.KindConflict, client.CodeImageInUse, "used by s1"},
		{"its own node down", 503, "application/json", `{"code":"node_unreachable","message":"node c is unreachable"}`, errdefs.KindUnavailable, client.CodeNodeUnreachable, "node c is unreachable"},
		{"canceled there", 499, "application/json", `{"code":"canceled","message":"gone"}`, errdefs.KindCanceled, client.CodeCanceled, "gone"},
		{"a proxy's page", 502, "text/html", `<html>Bad Gateway</html>`, errdefs.KindUpstream, client.CodeUpstream, "node b answered what is not its API's"},
		{"the mux's 404", 404, "text/plain; charset=utf-8", "404 page not found", errdefs.KindUpstream, client.CodeUpstream, "not the API's JSON"},
		{"JSON type, not JSON", 400, "application/json", `<html>`, errdefs.KindUpstream, client.CodeUpstream, "node b answered what is not its API's"},
		{"no code", 409, "application/json", `{"message":"x"}`, errdefs.KindUpstream, client.CodeUpstream, "not its API's"},
		{"a code the API has not", 409, "application/json", `{"code":"no_such_code","message":"x"}`, errdefs.KindUpstream, client.CodeUpstream, `code "no_such_code"`},
		{"a status no kind has", 418, "application/json", `{"code":"conflict","message":"x"}`, errdefs.KindUpstream, client.CodeUpstream, "status 418"},
		{"a list that is not JSON", 200, "application/json", `{"sandboxes": [`, errdefs.KindUpstream, client.CodeUpstream, "not its API's"},
		{"a page for a list", 200, "text/html", `<html>hello</html>`, errdefs.KindUpstream, client.CodeUpstream, "not its API's"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, n := testNode(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tt.ctype)
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			})
			var out map[string]any
			err := n.Get(asCI(), "/v0/sandboxes", &out)
			if errdefs.KindOf(err) != tt.wantKind || errdefs.CodeOf(err) != tt.wantCode {
				t.Fatalf("Get = %v (%s %s), want %s %s", err, errdefs.KindOf(err), errdefs.CodeOf(err), tt.wantKind, tt.wantCode)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) || strings.Contains(err.Error(), "<html>") {
				t.Errorf("message %q, want it to say %q and not repeat the answer", err, tt.wantMsg)
			}
			if _, ok := errdefs.As(err); !ok {
				t.Errorf("%v is not classified: it would be a 500 with its text hidden", err)
			}
		})
	}
}

// A body cut short (the connection closed before its Content-Length) is
// an answer that is not the API's, not a panic or a half-decoded list.
func TestTruncatedAnswer(t *testing.T) {
	_, n := testNode(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "100")
		io.WriteString(w, `{"sandboxes": [{"id":`)
	})
	var out map[string]any
	err := n.Get(asCI(), "/v0/sandboxes", &out)
	if errdefs.KindOf(err) != errdefs.KindUpstream || errdefs.CodeOf(err) != client.CodeUpstream {
		t.Fatalf("a truncated answer: %v (%s %s), want upstream", err, errdefs.KindOf(err), errdefs.CodeOf(err))
	}
}

// Every call is signed for the caller its context carries, with the
// caller's key and project header dropped and its request id kept; the
// receiving node's Verify admits it as that caller. A context with no
// caller sends nothing.
func TestSigned(t *testing.T) {
	t.Setenv("SHARD_API_KEY", "a-key-that-must-not-travel")
	t.Setenv("SHARD_PROJECT", "p9")
	var (
		got    *Admitted
		verr   error
		header http.Header
		calls  int
	)
	b := fakeVerifier{tls: nodeTLS(t, "b")}
	_, n := testNode(t, func(w http.ResponseWriter, r *http.Request) {
		calls++
		header = r.Header.Clone()
		got, verr = Verify(r, b)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	})
	tests := []struct {
		name   string
		caller Caller
		want   *auth.Principal
		asked  string
	}{
		{"a project's key", Caller{Principal: ciKey, Asked: "p1", RequestID: "req-1"}, ciKey, "p1"},
		{"the socket", Caller{Principal: auth.Socket, Asked: "p2"}, auth.Socket, "p2"},
		{"anonymous", Caller{Principal: auth.Anonymous}, auth.Anonymous, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := n.Get(WithCaller(context.Background(), tt.caller), "/v0/sandboxes?all_projects=true", nil); err != nil {
				t.Fatal(err)
			}
			if verr != nil {
				t.Fatalf("b refused the call: %v", verr)
			}
			if got.Node != "a" || got.Asked != tt.asked {
				t.Errorf("admitted from %q asking %q, want a asking %q", got.Node, got.Asked, tt.asked)
			}
			if p := got.Principal; p.Name != tt.want.Name || p.Project != tt.want.Project || p.Admin != tt.want.Admin || p.TokenID != tt.want.TokenID ||
				strings.Join(p.Scopes, ",") != strings.Join(tt.want.Scopes, ",") {
				t.Errorf("admitted as %+v, want %+v", p, tt.want)
			}
			if (tt.want == auth.Socket || tt.want == auth.Anonymous) && got.Principal != tt.want {
				t.Errorf("admitted as %+v, want the very %s", got.Principal, tt.want.Name)
			}
			if header.Get("Authorization") != "" || header.Get(client.ProjectHeader) != "" {
				t.Errorf("the key or the project header travelled: %v", header)
			}
			if header.Get(client.RequestIDHeader) != tt.caller.RequestID {
				t.Errorf("request id %q, want %q", header.Get(client.RequestIDHeader), tt.caller.RequestID)
			}
		})
	}
	before := calls
	err := n.RemoveCheckpoint(context.Background(), "x")
	if calls != before || errdefs.KindOf(err) != errdefs.KindInternal || !strings.Contains(err.Error(), "vouches for no one") {
		t.Errorf("a call with no caller: %v after %d calls, want refused here", err, calls-before)
	}
	// The same headers over no TLS connection are refused: a node's call
	// comes from its certificate.
	r, _ := http.NewRequest("GET", "https://b/v0/sandboxes", nil)
	r.Header = header
	if _, err := Verify(r, b); err == nil {
		t.Error("a call without a TLS connection was admitted")
	}
}

// A node that does not answer, or not in time, is 503 node_unreachable
// naming it; a caller that left is its own 499.
func TestUnanswered(t *testing.T) {
	release := make(chan struct{})
	c, n := testNode(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	c.callTimeout = 50 * time.Millisecond
	start := time.Now()
	err := n.RemoveSandbox(asCI(), "s1")
	if errdefs.KindOf(err) != errdefs.KindUnavailable || errdefs.CodeOf(err) != client.CodeNodeUnreachable || !strings.Contains(err.Error(), "node b") {
		t.Errorf("a node that does not answer in time: %v (%s %s), want node_unreachable naming b", err, errdefs.KindOf(err), errdefs.CodeOf(err))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the call took %s past its 50ms", d)
	}

	c.callTimeout = time.Minute
	ctx, cancel := context.WithCancel(asCI())
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := n.RemoveSandbox(ctx, "s1"); errdefs.KindOf(err) != errdefs.KindCanceled {
		t.Errorf("a caller that left: %v (%s), want canceled", err, errdefs.KindOf(err))
	}

	down, err := c.Node(cluster.Node{Name: "c", Address: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := down.RemoveCheckpoint(asCI(), "x"); errdefs.CodeOf(err) != client.CodeNodeUnreachable || !strings.Contains(err.Error(), "node c") {
		t.Errorf("a node nobody listens for: %v, want node_unreachable naming c", err)
	}
	if _, err := c.Node(cluster.Node{Name: "d", Address: ""}); err == nil {
		t.Error("a node with no address got a client")
	}
}

// The typed calls send what the other node's routes take.
func TestTypedCalls(t *testing.T) {
	var seen []string
	_, n := testNode(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen = append(seen, fmt.Sprintf("%s %s %s %s", r.Method, r.URL.RequestURI(), r.Header.Get("Content-Type"), b))
		switch {
		case strings.HasPrefix(r.URL.Path, "/v0/cluster/images/"):
			w.Header().Set("Content-Type", "application/x-tar")
			io.WriteString(w, "tar bytes")
			return
		case r.URL.Path == "/v0/cluster/checkpoints":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":"c1"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"s2","name":"moved","node":"b"}`)
	})
	ctx := asCI()
	sb, err := n.Restore(ctx, "c1", client.RestoreRequest{Name: "moved"}, Hooks{FromNode: "a", Timeout: 30 * time.Second})
	if err != nil || sb.ID != "s2" || sb.Node != "b" {
		t.Fatalf("Restore = %+v, %v", sb, err)
	}
	if _, err := n.Restore(ctx, "c1", client.RestoreRequest{}, Hooks{FromNode: "a", Ignore: true}); err != nil {
		t.Fatal(err)
	}
	if err := n.SendCheckpoint(ctx, strings.NewReader("zstd"), map[string][]string{"image": {"localhost/p/x:1"}}); err != nil {
		t.Fatal(err)
	}
	var fetched bytes.Buffer
	if err := n.FetchImport(ctx, "localhost/p/x:1", func(r io.Reader) error { _, err := io.Copy(&fetched, r); return err }); err != nil || fetched.String() != "tar bytes" {
		t.Fatalf("FetchImport = %q, %v", fetched.String(), err)
	}
	for _, call := range []func() error{
		func() error { return n.RemoveCheckpoint(ctx, "c1") },
		func() error { return n.RemoveSandbox(ctx, "s2") },
		func() error { return n.RemoveEnvironment(ctx, "py env") },
		func() error { return n.RemoveImage(ctx, "localhost/p/x:1") },
		func() error { return n.SendEnvironment(ctx, "py", "c") },
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		`POST /v0/checkpoints/c1/restore?from_node=a&hook_errors=fail&hook_timeout=30s application/json {"name":"moved"}`,
		`POST /v0/checkpoints/c1/restore?from_node=a&hook_errors=ignore&hook_timeout=0s application/json {}`,
		`POST /v0/cluster/checkpoints?image=localhost%2Fp%2Fx%3A1 application/zstd zstd`,
		`GET /v0/cluster/images/localhost/p/x:1  `,
		`DELETE /v0/checkpoints/c1  `,
		`DELETE /v0/sandboxes/s2?force=true  `,
		`DELETE /v0/environments/py%20env  `,
		`DELETE /v0/images/localhost/p/x:1  `,
		`POST /v0/cluster/environments/py/send?to=c  `,
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("sent\n%s\nwant\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}

// An import's copy that comes as something else than a tar is refused
// before anything reads it.
func TestFetchImportNotATar(t *testing.T) {
	_, n := testNode(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<html>")
	})
	read := false
	err := n.FetchImport(asCI(), "localhost/p/x:1", func(io.Reader) error { read = true; return nil })
	if read || errdefs.CodeOf(err) != client.CodeUpstream {
		t.Errorf("FetchImport of a page: read %v, %v; want upstream, nothing read", read, err)
	}
}

// Forward passes the node's answer on as it is (a sandbox's own page
// behind the ports proxy too), signed like any call; a node that does not
// answer is failed as node_unreachable.
func TestForward(t *testing.T) {
	var signed string
	c, n := testNode(t, func(w http.ResponseWriter, r *http.Request) {
		signed = r.Header.Get(SignatureHeader)
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/html")
		w.Header().Set(client.RequestIDHeader, "b's own")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, "<html>%s %s</html>", r.URL.RequestURI(), b)
	})
	var failed error
	fail := func(w http.ResponseWriter, _ *http.Request, err error) {
		failed = err
		w.WriteHeader(errdefs.Status(errdefs.KindOf(err)))
	}
	r := httptest.NewRequestWithContext(asCI(), "POST", "/v0/sandboxes/s1/ports/80/x?y=1", strings.NewReader("ignored"))
	w := httptest.NewRecorder()
	n.Forward(w, r, []byte("read already"), fail)
	if failed != nil || w.Code != 404 || w.Body.String() != "<html>/v0/sandboxes/s1/ports/80/x?y=1 read already</html>" || w.Header().Get(client.RequestIDHeader) != "" {
		t.Errorf("forwarded: %d %q %v (request id %q), failed %v", w.Code, w.Body.String(), w.Header(), w.Header().Get(client.RequestIDHeader), failed)
	}
	if !strings.HasPrefix(signed, "a>b POST /v0/sandboxes/s1/ports/80/x?y=1 ") {
		t.Errorf("forwarded with signature %q", signed)
	}
	down, _ := c.Node(cluster.Node{Name: "c", Address: "https://127.0.0.1:1"})
	w = httptest.NewRecorder()
	down.Forward(w, httptest.NewRequestWithContext(asCI(), "GET", "/v0/sandboxes/s1", nil), nil, fail)
	if errdefs.CodeOf(failed) != client.CodeNodeUnreachable || w.Code != 503 {
		t.Errorf("forwarded to a node that does not answer: %d, %v", w.Code, failed)
	}
}

// The principal vouched for is the caller's as JSON (Anonymous's of no
// project), as every node of the cluster reads it.
func TestVouchedPrincipal(t *testing.T) {
	tests := []struct {
		caller Caller
		want   string
	}{
		{Caller{Principal: ciKey, Asked: "p1"}, `{"token_id":"t1","name":"ci","scopes":["sandbox:read"],"project":"p1","asked":"p1"}`},
		{Caller{Principal: auth.Socket}, `{"admin":true,"name":"the local administrator","project":""}`},
		{Caller{Principal: auth.Anonymous, Asked: "x"}, `{"name":"anonymous","project":"-","asked":"x"}`},
	}
	for _, tt := range tests {
		if got := string(tt.caller.principal()); got != tt.want {
			t.Errorf("vouched %s, want %s", got, tt.want)
		}
	}
}

// A node's client is made once, and again when the node moved.
func TestNodeCached(t *testing.T) {
	c := New(fakeSigner{tls: nodeTLS(t, "a")})
	first, _ := c.Node(cluster.Node{Name: "b", Address: "https://10.0.0.2:7071"})
	again, _ := c.Node(cluster.Node{Name: "b", Address: "https://10.0.0.2:7071"})
	moved, _ := c.Node(cluster.Node{Name: "b", Address: "https://10.0.0.3:7071"})
	if first != again || moved == first || moved.addr != "https://10.0.0.3:7071" {
		t.Errorf("clients %p %p %p (moved to %s), want the first twice, then a new one", first, again, moved, moved.addr)
	}
}
