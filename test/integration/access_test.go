package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/api"
	"github.com/useshards/shard/internal/auth"
)

// tcpCall makes one request to the server's TCP listener with key ("" for
// none) and returns the status and the error code of the answer.
func tcpCall(t *testing.T, method, path, key string, body []byte) (int, client.Error) {
	t.Helper()
	status, e, _ := projCall(t, method, path, key, "", body)
	return status, e
}

func token(t *testing.T, name string, scopes ...string) string {
	t.Helper()
	tc, err := need(t).c.CreateToken(ctxT(t), client.TokenRequest{Name: name, Scopes: scopes})
	if err != nil {
		t.Fatalf("token %s %v: %v", name, scopes, err)
	}
	t.Cleanup(func() { need(t).c.RevokeToken(context.Background(), tc.ID) })
	return tc.Key
}

// concrete turns a route pattern into a request that touches nothing real
// (unknown ids and names, empty bodies): what matters is whether the
// server lets it through to its handler.
func concrete(pattern string) (method, path string) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = "GET", pattern
	}
	r := strings.NewReplacer("{id}", "zz-no-such", "{name}", "zz-no-such", "{ref...}", "zz-no-such:latest",
		"{secret}", "zz-no-such", "{port}", "8080", "{path...}", "x")
	return method, r.Replace(path)
}

// extraScope is the scope a route needs beyond its declared one, whatever
// it is asked about: a resume shows and reruns a session's argv, which is
// sandbox:read's.
var extraScope = map[string]string{"POST /v0/ledger/sessions/{name}/resume": auth.SandboxRead}

// everyProjectOnly are the routes only a key of every project may call,
// whatever its scopes: the metrics count every project's sandboxes, and a
// project's quota is set by the landlord, not by the tenant.
var everyProjectOnly = map[string]bool{"GET /metrics": true, "PUT /v0/projects/{name}/quota": true}

// TestScopeMatrix: every endpoint × every scope over TCP: no key or a bad
// key is 401; a token without the endpoint's declared scope is 403 naming
// it; one with it gets through (whatever the handler then says). And the
// Unix socket needs no key.
func TestScopeMatrix(t *testing.T) {
	scopes := append([]string(nil), auth.Known...)
	// The project axis: a key of the default project, of another, and of
	// every project answer alike (scopes do not depend on projects), but
	// for everyProjectOnly.
	keySets := []map[string]string{{}, {}, {}}
	for i, s := range scopes {
		keySets[0][s] = token(t, fmt.Sprintf("matrix-%d", i), s)
		keySets[1][s] = projectToken(t, fmt.Sprintf("matrix-p-%d", i), "matrix-p", s)
		keySets[2][s] = projectToken(t, fmt.Sprintf("matrix-all-%d", i), "*", s)
	}
	calls := 0
	revoked := token(t, "matrix-revoked", auth.All)
	if err := need(t).c.RevokeToken(ctxT(t), "matrix-revoked"); err != nil {
		t.Fatal(err)
	}
	routes := api.RouteScopes()
	if len(routes) < 45 {
		t.Fatalf("only %d routes", len(routes))
	}
	for _, rt := range routes {
		method, path := concrete(rt[0])
		var body []byte
		if method == "POST" || method == "PUT" {
			body = []byte("{}")
		}
		status, e := tcpCall(t, method, path, "", body)
		if rt[1] == auth.None {
			if status == 401 || status == 403 {
				t.Errorf("%s needs no key, got %d %s", rt[0], status, e.Code)
			}
			continue
		}
		if status != 401 || e.Code != "unauthenticated" {
			t.Errorf("%s without a key: %d %s, want 401 unauthenticated", rt[0], status, e.Code)
		}
		for _, bad := range []string{"shk_nonsense", revoked} {
			if status, e := tcpCall(t, method, path, bad, body); status != 401 || e.Code != "unauthenticated" {
				t.Errorf("%s with a bad or revoked key: %d %s, want 401", rt[0], status, e.Code)
			}
		}
		for ks, keys := range keySets {
			for _, s := range scopes {
				calls++
				status, e := tcpCall(t, method, path, keys[s], body)
				if everyProjectOnly[rt[0]] && ks != 2 && auth.Covers([]string{s}, rt[1]) {
					if status != 403 || e.Code != "wrong_project" {
						t.Errorf("%s with scope %s and a project's key: %d %s %q, want 403 wrong_project", rt[0], s, status, e.Code, e.Message)
					}
				} else if x := extraScope[rt[0]]; x != "" && auth.Covers([]string{s}, rt[1]) && !auth.Covers([]string{s}, x) {
					if status != 403 || e.Code != "missing_scope" || !strings.Contains(e.Message, x) {
						t.Errorf("%s with scope %s (needs %s and %s): %d %s %q, want 403 missing_scope naming %s", rt[0], s, rt[1], x, status, e.Code, e.Message, x)
					}
				} else if auth.Covers([]string{s}, rt[1]) {
					if status == 401 || status == 403 {
						t.Errorf("%s with scope %s (needs %s): %d %s %s", rt[0], s, rt[1], status, e.Code, e.Message)
					}
				} else if status != 403 || e.Code != "missing_scope" || !strings.Contains(e.Message, rt[1]) {
					t.Errorf("%s with scope %s (needs %s): %d %s %q, want 403 missing_scope naming it", rt[0], s, rt[1], status, e.Code, e.Message)
				}
			}
		}
	}
	t.Logf("scope matrix: %d routes × %d scopes × 3 projects: %d calls", len(routes), len(scopes), calls)
	// The socket is the administrator.
	if _, err := need(t).c.Tokens(ctxT(t)); err != nil {
		t.Fatalf("token ls on the socket: %v", err)
	}
}

// TestForkScopes: a fork needs sandbox:write, plus secret:* when the source
// has grants and policy:* when it has a policy (seed 001).
func TestForkScopes(t *testing.T) {
	e := need(t)
	if _, err := e.c.SetSecret(ctxT(t), "fork-scope-secret", []byte("v")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.RemoveSecret(context.Background(), "fork-scope-secret") })
	src := create(t, client.CreateRequest{Image: busybox, Name: "fork-scopes"})
	write := token(t, "fs-write", auth.SandboxWrite)
	writeSecret := token(t, "fs-write-secret", auth.SandboxWrite, auth.SecretAll)
	all := token(t, "fs-all", auth.SandboxWrite, auth.SecretAll, auth.PolicyAll)
	fork := func(key string) (int, client.Error) {
		status, ce := tcpCall(t, "POST", "/v0/sandboxes/fork-scopes/fork", key, []byte("{}"))
		if status == 201 {
			t.Cleanup(func() {
				if sbs, err := e.c.List(context.Background()); err == nil {
					for _, sb := range sbs {
						if sb.ParentID == src.ID {
							e.c.Remove(context.Background(), sb.ID, true)
						}
					}
				}
			})
		}
		return status, ce
	}
	if status, ce := fork(write); status != 201 {
		t.Fatalf("fork of a plain sandbox with sandbox:write: %d %+v", status, ce)
	}
	if _, err := e.c.Grant(ctxT(t), src.ID, client.Grant{Secret: "fork-scope-secret", Env: "FS"}); err != nil {
		t.Fatal(err)
	}
	if status, ce := fork(write); status != 403 || !strings.Contains(ce.Message, "secret:*") {
		t.Fatalf("fork of a sandbox with grants, without secret:*: %d %+v", status, ce)
	}
	if status, ce := fork(writeSecret); status != 201 {
		t.Fatalf("with secret:*: %d %+v", status, ce)
	}
	if _, err := e.c.SetPolicy(ctxT(t), src.ID, client.Policy{Allow: []string{"198.18.0.0/15"}}); err != nil {
		t.Fatal(err)
	}
	if status, ce := fork(writeSecret); status != 403 || !strings.Contains(ce.Message, "policy:*") {
		t.Fatalf("fork of a sandbox with a policy, without policy:*: %d %+v", status, ce)
	}
	if status, ce := fork(all); status != 201 {
		t.Fatalf("with all three: %d %+v", status, ce)
	}
	// A restore of its checkpoint carries the same: the same rule.
	ck, err := e.c.Checkpoint(ctxT(t), src.ID, client.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if status, ce := tcpCall(t, "POST", "/v0/checkpoints/"+ck.ID+"/restore", writeSecret, []byte("{}")); status != 403 || !strings.Contains(ce.Message, "policy:*") {
		t.Fatalf("restore of a checkpoint with a policy, without policy:*: %d %+v", status, ce)
	}
	if status, ce := tcpCall(t, "POST", "/v0/checkpoints/"+ck.ID+"/restore", all, []byte(`{"name":"fs-restored"}`)); status != 201 {
		t.Fatalf("restore with all three: %d %+v", status, ce)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), "fs-restored", true) })
	// Every answer that carries a sandbox shows its grants and policy only
	// to a key that may read them: stop and start too, not only inspect.
	for _, verb := range []string{"stop", "start"} {
		status, ce, body := projCall(t, "POST", "/v0/sandboxes/fork-scopes/"+verb, write, "", nil)
		if status != 200 {
			t.Fatalf("%s with sandbox:write: %d %+v", verb, status, ce)
		}
		var sb client.Sandbox
		if err := json.Unmarshal([]byte(body), &sb); err != nil {
			t.Fatalf("%s: %v: %s", verb, err, body)
		}
		if len(sb.Grants) != 0 || sb.Policy != nil || strings.Contains(body, "fork-scope-secret") {
			t.Errorf("%s answered a sandbox:write key its grants and policy: %s", verb, body)
		}
	}
	// The ledger says no more than inspect: a sandbox:read key gets the
	// grant's and the policy's events without their data.
	reader := token(t, "fs-reader-only", auth.SandboxRead)
	status, ce, body := projCall(t, "GET", "/v0/ledger/sessions/fork-scopes/events", reader, "", nil)
	if status != 200 {
		t.Fatalf("events with sandbox:read: %d %+v", status, ce)
	}
	var page client.EventPage
	if err := json.Unmarshal([]byte(body), &page); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, ev := range page.Events {
		switch ev.Type {
		case "sandbox.secret_granted", "sandbox.policy_set":
			seen[ev.Type] = true
			if len(ev.Data) != 0 {
				t.Errorf("%s shows a sandbox:read key its data: %s", ev.Type, ev.Data)
			}
		}
	}
	if !seen["sandbox.secret_granted"] || !seen["sandbox.policy_set"] {
		t.Errorf("events %s: want the grant's and the policy's (without data)", body)
	}
	// A token makes tokens no stronger than itself.
	tw := token(t, "fs-token-writer", auth.TokenWrite, auth.SandboxRead)
	if status, ce := tcpCall(t, "POST", "/v0/tokens", tw, []byte(`{"name":"fs-escalate","scopes":["*"]}`)); status != 403 || ce.Code != "missing_scope" {
		t.Fatalf("token:write made a * token: %d %+v", status, ce)
	}
	if status, ce := tcpCall(t, "POST", "/v0/tokens", tw, []byte(`{"name":"fs-reader","scopes":["sandbox:read"]}`)); status != 201 {
		t.Fatalf("token:write + sandbox:read making a sandbox:read token: %d %+v", status, ce)
	}
	t.Cleanup(func() { e.c.RevokeToken(context.Background(), "fs-reader") })
}

// TestSecrets: a granted secret is visible inside as env and as a file;
// ungrant removes it for new execs; a fork keeps its copy after an ungrant
// and a stop of the source; the value appears nowhere: not in inspect, the
// ledger, the server's log, or the database in the clear.
func TestSecrets(t *testing.T) {
	e := need(t)
	const value = "s3cr3t-v4lue-never-printed"
	if _, errOut, code := e.cli(t, value, "secret", "set", "TEST_TOKEN"); code != 0 {
		t.Fatalf("secret set: %s", errOut)
	}
	t.Cleanup(func() { e.c.RemoveSecret(context.Background(), "TEST_TOKEN") })
	if _, errOut, code := e.cli(t, "", "secret", "set", "TEST_TOKEN", value); code == 0 || !strings.Contains(errOut, "stdin") {
		t.Fatalf("a value on the command line was not refused: %s", errOut)
	}
	src := create(t, client.CreateRequest{Image: busybox, Name: "secrets-src"})
	if _, errOut, code := e.cli(t, "", "grant", "secrets-src", "TEST_TOKEN"); code != 0 {
		t.Fatalf("grant: %s", errOut)
	}
	// The same secret again replaces the grant: now a file.
	if _, err := e.c.Grant(ctxT(t), src.ID, client.Grant{Secret: "TEST_TOKEN", File: "/run/secrets/token"}); err != nil {
		t.Fatal(err)
	}
	if got := execOK(t, src.ID, "cat", "/run/secrets/token"); got != value {
		t.Fatalf("the granted file holds %q", got)
	}
	if got := execOK(t, src.ID, "sh", "-c", "echo ${TEST_TOKEN:-unset}"); got != "unset\n" {
		t.Fatalf("a file grant also set the env: %q", got)
	}
	if _, err := e.c.Grant(ctxT(t), src.ID, client.Grant{Secret: "TEST_TOKEN", Env: "API_TOKEN"}); err != nil {
		t.Fatal(err)
	}
	// The old file is gone, and /run/secrets with it if the grant made it.
	if got := execOK(t, src.ID, "sh", "-c", "echo $API_TOKEN; ls /run/secrets/ 2>/dev/null | wc -l"); got != value+"\n0\n" {
		t.Fatalf("env grant (and the old file gone): %q", got)
	}
	f, err := e.c.Fork(ctxT(t), src.ID, client.ForkRequest{Name: "secrets-fork"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })
	if len(f.Grants) != 1 || f.Grants[0].Env != "API_TOKEN" {
		t.Fatalf("the fork's grants: %+v", f.Grants)
	}
	if _, errOut, code := e.cli(t, "", "ungrant", "secrets-src", "TEST_TOKEN"); code != 0 {
		t.Fatalf("ungrant: %s", errOut)
	}
	if got := execOK(t, src.ID, "sh", "-c", "echo ${API_TOKEN:-unset}"); got != "unset\n" {
		t.Fatalf("after ungrant the source still gets it: %q", got)
	}
	e.c.Stop(ctxT(t), src.ID)
	if got := execOK(t, f.ID, "sh", "-c", "echo $API_TOKEN"); got != value+"\n" {
		t.Fatalf("the fork lost its grant after the source's ungrant and stop: %q", got)
	}
	// Nowhere in the clear.
	sb, _ := e.c.Get(ctxT(t), f.ID)
	b, _ := json.Marshal(sb)
	if bytes.Contains(b, []byte(value)) {
		t.Error("inspect shows the value")
	}
	for _, s := range []string{src.Session, f.Session} {
		for _, ev := range events(t, s) {
			if bytes.Contains(ev.Data, []byte(value)) {
				t.Errorf("the ledger has the value: %s %s", ev.Type, ev.Data)
			}
		}
	}
	logb, _ := os.ReadFile(e.serveLog)
	if bytes.Contains(logb, []byte(value)) {
		t.Error("the server's log has the value")
	}
	for _, n := range []string{"shard.db", "shard.db-wal"} {
		db, _ := os.ReadFile(filepath.Join(e.dataDir, n))
		if bytes.Contains(db, []byte(value)) {
			t.Errorf("%s has the value in the clear", n)
		}
	}
	list, err := e.c.Secrets(ctxT(t))
	if err != nil || len(list) == 0 {
		t.Fatalf("secret ls: %v %v", list, err)
	}
	_, err = e.c.Grant(ctxT(t), f.ID, client.Grant{Secret: "no-such-secret"})
	wantCode(t, "grant of an unknown secret", err, 404, "secret_not_found", "no-such-secret")
}

// TestPorts: an HTTP server inside a sandbox, reached through the server's
// proxy (socket and TCP with a key), also in a fork; nothing listening is a
// clear 502.
func TestPorts(t *testing.T) {
	e := need(t)
	sb := create(t, client.CreateRequest{Image: busybox, Name: "ports"})
	execOK(t, sb.ID, "sh", "-c", "mkdir -p /www && echo hello-from-ports > /www/index.html && httpd -p 8080 -h /www")
	get := func(who, id string) string {
		t.Helper()
		srv := httpTestServer(t, e.c.PortProxy(id, 8080))
		var body string
		for range 50 {
			resp, err := http.Get(srv + "/index.html")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				body = string(b)
				if resp.StatusCode == 200 {
					break
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		return body
	}
	if got := get("sandbox", sb.ID); got != "hello-from-ports\n" {
		t.Fatalf("through the proxy: %q", got)
	}
	key := token(t, "ports", auth.SandboxWrite)
	status, _ := tcpCall(t, "GET", "/v0/sandboxes/ports/ports/8080/index.html", key, nil)
	if status != 200 {
		t.Fatalf("over TCP with a key: %d", status)
	}
	f, err := e.c.Fork(ctxT(t), sb.ID, client.ForkRequest{Name: "ports-fork"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), f.ID, true) })
	execOK(t, f.ID, "sh", "-c", "echo hello-from-fork > /www/index.html")
	if got := get("fork", f.ID); got != "hello-from-fork\n" {
		t.Fatalf("the fork's server (inherited, listening on): %q", got)
	}
	if got := get("sandbox", sb.ID); got != "hello-from-ports\n" {
		t.Fatalf("the source after the fork: %q", got)
	}
	status, ce := tcpCall(t, "GET", "/v0/sandboxes/ports/ports/9999/", key, nil)
	if status != 502 || ce.Code != "port_unreachable" {
		t.Fatalf("nothing on the port: %d %+v", status, ce)
	}
}

// httpTestServer serves h on a loopback port for the test's life.
func httpTestServer(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
