package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/api"
	"github.com/useshards/shard/internal/auth"
)

// projCall is tcpCall with the project header (proj "" sends none); it
// returns the answer's body too.
func projCall(t *testing.T, method, path, key, proj string, body []byte) (int, client.Error, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+need(t).tcp+path, bytes.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if proj != "" {
		req.Header.Set(client.ProjectHeader, proj)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if method == "GET" && strings.Contains(path, "/exec?") { // the WebSocket exec: an upgrade
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	var e client.Error
	json.Unmarshal(b, &e)
	return resp.StatusCode, e, string(b)
}

func projectToken(t *testing.T, name, proj string, scopes ...string) string {
	t.Helper()
	tc, err := need(t).c.CreateToken(ctxT(t), client.TokenRequest{Name: name, Scopes: scopes, Project: proj})
	if err != nil {
		t.Fatalf("token %s in %s: %v", name, proj, err)
	}
	if tc.Project != proj {
		t.Fatalf("token %s: project %q, want %q", name, tc.Project, proj)
	}
	t.Cleanup(func() { need(t).c.RevokeToken(context.Background(), tc.ID) })
	return tc.Key
}

// TestProjectMatrix: every endpoint × the project axis. Project pa holds a
// running sandbox with a secret granted and a policy, its ledger, a
// checkpoint, a stopped sandbox and its snapshot, an environment and a
// token. A key of project pb (with every scope) gets 404 for each of them,
// on every route that names one (by name and by id), and sees none of them
// in any list; the routes that make things from them (create from the
// snapshot or the environment, restore, resume, fork, a grant of pa's
// secret to pb's own sandbox) are 404 too, and nothing of pa changes. A
// key of pa reaches them all; a key of every project reaches them with
// Shard-Project: pa only; a pa key naming pb is 403 wrong_project.
func TestProjectMatrix(t *testing.T) {
	e := need(t)
	ctx := ctxT(t)
	pa, pb := projectClient(t, "pa"), projectClient(t, "pb")
	keyA := projectToken(t, "pm-a", "pa", auth.All)
	keyB := projectToken(t, "pm-b", "pb", auth.All)
	keyAll := projectToken(t, "pm-all", "*", auth.All)

	if _, err := pa.SetSecret(ctx, "pm-secret", []byte("pa-value")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pa.RemoveSecret(context.Background(), "pm-secret") })
	run, err := pa.Create(ctx, client.CreateRequest{Image: busybox, Name: "pm-run"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pa.Remove(context.Background(), run.ID, true) })
	if run.Project != "pa" {
		t.Fatalf("sandbox made in pa: project %q", run.Project)
	}
	if _, err := pa.Grant(ctx, run.ID, client.Grant{Secret: "pm-secret", Env: "PM"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pa.SetPolicy(ctx, run.ID, client.Policy{Allow: []string{"198.18.0.0/15"}}); err != nil {
		t.Fatal(err)
	}
	if res, err := pa.Exec(ctx, run.ID, client.ExecRequest{Argv: []string{"sh", "-c", "echo $PM"}}); err != nil || strings.TrimSpace(string(res.Stdout)) != "pa-value" {
		t.Fatalf("exec in pa: %v %v", res, err)
	}
	ck, err := pa.Checkpoint(ctx, run.ID, client.CheckpointRequest{Tag: "pm"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pa.RemoveCheckpoint(context.Background(), ck.ID) })
	stopped, err := pa.Create(ctx, client.CreateRequest{Image: busybox, Name: "pm-stopped"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pa.Remove(context.Background(), stopped.ID, true) })
	if _, err := pa.Stop(ctx, stopped.ID); err != nil {
		t.Fatal(err)
	}
	snap, err := pa.CreateSnapshot(ctx, client.SnapshotRequest{Sandbox: stopped.ID, Name: "pm-snap"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pa.RemoveSnapshot(context.Background(), snap.ID) })
	envr, err := pa.CreateEnvironment(ctx, client.EnvironmentRequest{Name: "pm-env", Image: busybox, Memory: jsonRaw("64MiB"), Setup: [][]string{{"true"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pa.RemoveEnvironment(context.Background(), envr.Name) })
	if _, err := pa.ImportImage(ctx, bytes.NewReader(dockerSave(t, []byte("pm"))), "localhost/pm-img:1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pa.RemoveImage(context.Background(), "localhost/pm-img:1") })
	// pb's own sandbox, to try pa's secret on.
	own, err := pb.Create(ctx, client.CreateRequest{Image: busybox, Name: "pm-own"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pb.Remove(context.Background(), own.ID, true) })
	toks, err := e.c.Tokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var tokA string
	for _, tk := range toks {
		if tk.Name == "pm-a" {
			tokA = tk.ID
		}
	}

	// Every route, with pa's objects in it (by name; the ones of
	// sandboxes again by id below). A route missing here fails the test:
	// a new route must say what it does across projects.
	type req struct{ path, body string }
	img := `"image":"` + busybox + `"`
	cases := map[string][]req{
		"POST /v0/sandboxes":                        {{"/v0/sandboxes", `{` + img + `,"from_snapshot":"pm-snap"}`}, {"/v0/sandboxes", `{"environment":"pm-env"}`}, {"/v0/sandboxes", `{"image":"localhost/pm-img:1"}`}},
		"GET /v0/sandboxes/{id}":                    {{"/v0/sandboxes/{id}", ""}},
		"DELETE /v0/sandboxes/{id}":                 {{"/v0/sandboxes/{id}?force=true", ""}},
		"POST /v0/sandboxes/{id}/stop":              {{"/v0/sandboxes/{id}/stop", "{}"}},
		"POST /v0/sandboxes/{id}/start":             {{"/v0/sandboxes/pm-stopped/start", "{}"}},
		"POST /v0/sandboxes/{id}/fork":              {{"/v0/sandboxes/{id}/fork", "{}"}},
		"POST /v0/sandboxes/{id}/exec":              {{"/v0/sandboxes/{id}/exec", `{"argv":["sh","-c","echo $PM"]}`}},
		"GET /v0/sandboxes/{id}/exec":               {{"/v0/sandboxes/{id}/exec?request=" + url.QueryEscape(`{"argv":["true"]}`), ""}},
		"POST /v0/sandboxes/{id}/checkpoints":       {{"/v0/sandboxes/{id}/checkpoints", "{}"}},
		"GET /v0/sandboxes/{id}/checkpoints":        {{"/v0/sandboxes/{id}/checkpoints", ""}},
		"GET /v0/checkpoints/{id}":                  {{"/v0/checkpoints/" + ck.ID, ""}},
		"DELETE /v0/checkpoints/{id}":               {{"/v0/checkpoints/" + ck.ID, ""}},
		"POST /v0/checkpoints/{id}/restore":         {{"/v0/checkpoints/" + ck.ID + "/restore", "{}"}},
		"POST /v0/snapshots":                        {{"/v0/snapshots", `{"sandbox":"pm-stopped","name":"pm-snap2"}`}},
		"GET /v0/snapshots/{id}":                    {{"/v0/snapshots/pm-snap", ""}, {"/v0/snapshots/" + snap.ID, ""}},
		"DELETE /v0/snapshots/{id}":                 {{"/v0/snapshots/pm-snap", ""}, {"/v0/snapshots/" + snap.ID, ""}},
		"GET /v0/ledger/sessions/{name}":            {{"/v0/ledger/sessions/" + run.Session, ""}},
		"GET /v0/ledger/sessions/{name}/events":     {{"/v0/ledger/sessions/" + run.Session + "/events", ""}},
		"DELETE /v0/ledger/sessions/{name}":         {{"/v0/ledger/sessions/" + run.Session, ""}},
		"POST /v0/ledger/sessions/{name}/resume":    {{"/v0/ledger/sessions/" + run.Session + "/resume", "{}"}},
		"POST /v0/environments":                     {{"/v0/environments", `{"name":"pm-env2","sandbox":"pm-run"}`}},
		"GET /v0/environments/{name}":               {{"/v0/environments/pm-env", ""}},
		"DELETE /v0/environments/{name}":            {{"/v0/environments/pm-env", ""}},
		"DELETE /v0/tokens/{id}":                    {{"/v0/tokens/" + tokA, ""}, {"/v0/tokens/pm-a", ""}},
		"DELETE /v0/secrets/{name}":                 {{"/v0/secrets/pm-secret", ""}},
		"POST /v0/sandboxes/{id}/grants":            {{"/v0/sandboxes/{id}/grants", `{"secret":"pm-secret"}`}, {"/v0/sandboxes/" + own.ID + "/grants", `{"secret":"pm-secret","env":"STOLEN"}`}},
		"GET /v0/sandboxes/{id}/grants":             {{"/v0/sandboxes/{id}/grants", ""}},
		"DELETE /v0/sandboxes/{id}/grants/{secret}": {{"/v0/sandboxes/{id}/grants/pm-secret", ""}},
		"PUT /v0/sandboxes/{id}/policy":             {{"/v0/sandboxes/{id}/policy", `{"deny_all":true}`}},
		"GET /v0/sandboxes/{id}/policy":             {{"/v0/sandboxes/{id}/policy", ""}},
		"DELETE /v0/sandboxes/{id}/policy":          {{"/v0/sandboxes/{id}/policy", ""}},
		"/v0/sandboxes/{id}/ports/{port}/{path...}": {{"/v0/sandboxes/{id}/ports/8080/x", ""}},
		"GET /v0/sandboxes/{id}/files":              {{"/v0/sandboxes/{id}/files?path=/etc/hostname", ""}},
		"PUT /v0/sandboxes/{id}/files":              {{"/v0/sandboxes/{id}/files?path=/tmp/pm-file", "x"}},
		"DELETE /v0/sandboxes/{id}/files":           {{"/v0/sandboxes/{id}/files?path=/tmp/pm-none", ""}},
		"GET /v0/sandboxes/{id}/files/stat":         {{"/v0/sandboxes/{id}/files/stat?path=/etc", ""}},
		"GET /v0/sandboxes/{id}/files/list":         {{"/v0/sandboxes/{id}/files/list?path=/etc", ""}},
		"GET /v0/sandboxes/{id}/tree":               {{"/v0/sandboxes/{id}/tree", ""}},
		"GET /v0/sandboxes/{id}/diff":               {{"/v0/sandboxes/{id}/diff", ""}},
		"GET /v0/tree":                              nil, // a list: checked below
		"GET /v0/sandboxes":                         nil, // lists: checked below
		"GET /v0/checkpoints":                       nil,
		"GET /v0/snapshots":                         nil,
		"GET /v0/ledger/sessions":                   nil,
		"GET /v0/environments":                      nil,
		"GET /v0/tokens":                            nil,
		"GET /v0/projects":                          nil,
		"PUT /v0/projects/{name}/quota":             nil, // a key of every project only: TestScopeMatrix
		"GET /v0/secrets":                           nil,
		"GET /v0/system/df":                         nil,
		"GET /v0/images":                            nil,
		"POST /v0/tokens":                           nil, // makes pb's own; checked below
		"PUT /v0/secrets/{name}":                    nil, // makes pb's own; checked below
		"GET /v0/openapi.json":                      nil, // not of a project
		"GET /v0/version":                           nil,
		"GET /v0/capabilities":                      nil,
		"GET /v0/whoami":                            nil, // the key itself; checked in TestMetricsAndRequestIDs
		"GET /v0/nodes":                             nil, // a single host: 409 not_clustered; in a cluster, counts per project (TestCluster)
		"GET /metrics":                              nil, // the server's, not of a project
		"POST /v0/images/pull":                      nil, // images: their own tests (images_test.go)
		"POST /v0/images/import":                    nil,
		"GET /v0/images/{ref...}":                   {{"/v0/images/localhost/pm-img:1", ""}},
		"DELETE /v0/images/{ref...}":                {{"/v0/images/localhost/pm-img:1", ""}},
	}
	calls := 0
	for _, rt := range api.RouteScopes() {
		reqs, ok := cases[rt[0]]
		if !ok {
			t.Errorf("route %s: no case in the project matrix: add what it does across projects", rt[0])
			continue
		}
		method, _, cut := strings.Cut(rt[0], " ")
		if !cut {
			method = "GET"
		}
		for _, rq := range reqs {
			paths := []string{rq.path}
			if strings.Contains(rq.path, "{id}") {
				paths = []string{strings.ReplaceAll(rq.path, "{id}", "pm-run"), strings.ReplaceAll(rq.path, "{id}", run.ID)}
			}
			for _, p := range paths {
				var body []byte
				if rq.body != "" {
					body = []byte(rq.body)
				}
				calls++
				status, ce, _ := projCall(t, method, p, keyB, "", body)
				if status != 404 || !strings.HasSuffix(ce.Code, "not_found") {
					t.Errorf("%s %s with pb's key: %d %s %q, want 404 *_not_found", method, p, status, ce.Code, ce.Message)
				}
				// (A key of every project manages every project's
				// tokens, wherever it acts.)
				if !strings.HasPrefix(p, "/v0/tokens/") {
					calls++
					if status, ce, _ := projCall(t, method, p, keyAll, "pb", body); status != 404 {
						t.Errorf("%s %s with a key of every project in pb: %d %s, want 404", method, p, status, ce.Code)
					}
				}
				calls++
				if status, ce, _ := projCall(t, method, p, keyA, "pb", body); status != 403 || ce.Code != "wrong_project" {
					t.Errorf("%s %s with pa's key naming pb: %d %s, want 403 wrong_project", method, p, status, ce.Code)
				}
				if method == "GET" && !strings.Contains(p, "/exec") && !strings.Contains(p, "/ports/") {
					calls += 2
					if status, ce, _ := projCall(t, method, p, keyA, "", nil); status != 200 {
						t.Errorf("%s %s with pa's key: %d %s %q, want 200", method, p, status, ce.Code, ce.Message)
					}
					if status, ce, _ := projCall(t, method, p, keyAll, "pa", nil); status != 200 {
						t.Errorf("%s %s with a key of every project in pa: %d %s, want 200", method, p, status, ce.Code)
					}
				}
			}
		}
	}

	// pb's lists show none of pa's; pa's show them.
	secretsOf := []string{run.ID, stopped.ID, ck.ID, snap.ID, "pm-snap", "pm-env", "pm-secret", "pm-stopped", "pm-img", tokA}
	for _, l := range []string{"/v0/sandboxes", "/v0/checkpoints", "/v0/snapshots", "/v0/ledger/sessions", "/v0/environments", "/v0/tokens", "/v0/secrets", "/v0/system/df", "/v0/projects", "/v0/images", "/v0/tree"} {
		calls += 2
		status, ce, body := projCall(t, "GET", l, keyB, "", nil)
		if status != 200 {
			t.Errorf("GET %s with pb's key: %d %s", l, status, ce.Code)
		}
		for _, s := range secretsOf {
			if strings.Contains(body, s) {
				t.Errorf("GET %s with pb's key shows pa's %s: %s", l, s, body)
			}
		}
		if _, _, body := projCall(t, "GET", l, keyA, "", nil); l != "/v0/system/df" && l != "/v0/tokens" && l != "/v0/projects" && !strings.Contains(body, "pm-") {
			t.Errorf("GET %s with pa's key shows nothing of pa's: %s", l, body)
		}
		if l == "/v0/projects" && (strings.Contains(body, `"pa"`) || !strings.Contains(body, `"pb"`)) {
			t.Errorf("GET /v0/projects with pb's key: %s, want pb's only", body)
		}
	}
	// Only a key of every project lists them all.
	if status, ce, _ := projCall(t, "GET", "/v0/sandboxes?all_projects=true", keyA, "", nil); status != 403 || ce.Code != "wrong_project" {
		t.Errorf("all_projects with pa's key: %d %s, want 403 wrong_project", status, ce.Code)
	}
	if _, _, body := projCall(t, "GET", "/v0/sandboxes?all_projects=true", keyAll, "", nil); !strings.Contains(body, run.ID) || !strings.Contains(body, own.ID) {
		t.Errorf("all_projects with a key of every project: missing pa's or pb's sandbox: %s", body)
	}
	// pb makes its own secret and token of pa's names; pa's are untouched.
	before, _ := pa.Secrets(ctx)
	if status, ce, _ := projCall(t, "PUT", "/v0/secrets/pm-secret", keyB, "", []byte(`{"value":"cGI="}`)); status != 200 {
		t.Errorf("pb's own pm-secret: %d %s", status, ce.Code)
	}
	t.Cleanup(func() { pb.RemoveSecret(context.Background(), "pm-secret") })
	after, _ := pa.Secrets(ctx)
	if len(before) != 1 || len(after) != 1 || !before[0].UpdatedAt.Equal(after[0].UpdatedAt) {
		t.Errorf("pa's secret changed when pb set its own: %+v → %+v", before, after)
	}
	if status, ce, _ := projCall(t, "POST", "/v0/tokens", keyB, "", []byte(`{"name":"pm-a","scopes":["sandbox:read"],"project":"pa"}`)); status != 403 || ce.Code != "wrong_project" {
		t.Errorf("pb's key making a key of pa: %d %s, want 403 wrong_project", status, ce.Code)
	}
	if status, ce, _ := projCall(t, "POST", "/v0/tokens", keyB, "", []byte(`{"name":"pm-x","scopes":["sandbox:read"],"project":"*"}`)); status != 403 || ce.Code != "wrong_project" {
		t.Errorf("pb's key making a key of every project: %d %s, want 403 wrong_project", status, ce.Code)
	}
	if res, err := pa.Exec(ctx, run.ID, client.ExecRequest{Argv: []string{"sh", "-c", "echo $PM"}}); err != nil || strings.TrimSpace(string(res.Stdout)) != "pa-value" {
		t.Errorf("pa's sandbox after pb's tries: %v %v", res, err)
	}
	// Nothing of pa's was removed, stopped or changed.
	for _, check := range []func() error{
		func() error { sb, err := pa.Get(ctx, run.ID); return stateIs(sb, err, "running") },
		func() error { sb, err := pa.Get(ctx, stopped.ID); return stateIs(sb, err, "stopped") },
		func() error { _, err := pa.GetCheckpoint(ctx, ck.ID); return err },
		func() error { _, err := pa.GetSnapshot(ctx, snap.ID); return err },
		func() error { _, err := pa.GetEnvironment(ctx, "pm-env"); return err },
		func() error { p, err := pa.GetPolicy(ctx, run.ID); return policyIs(p, err) },
	} {
		if err := check(); err != nil {
			t.Errorf("pa's object after pb's tries: %v", err)
		}
	}
	if sbs, _ := pb.List(ctx); len(sbs) != 1 {
		t.Errorf("pb has %d sandboxes after its tries, want its own 1 (nothing made from pa's)", len(sbs))
	}
	t.Logf("project matrix: %d calls over %d routes", calls, len(api.RouteScopes()))
}

func stateIs(sb *client.Sandbox, err error, want string) error {
	if err != nil {
		return err
	}
	if sb.State != want {
		return &client.Error{Code: "state", Message: sb.Name + " is " + sb.State + ", want " + want}
	}
	return nil
}

func policyIs(p *client.Policy, err error) error {
	if err != nil {
		return err
	}
	if p.DenyAll || len(p.Allow) != 1 {
		return &client.Error{Code: "policy", Message: "pa's policy changed"}
	}
	return nil
}
