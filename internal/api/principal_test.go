package api

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/metrics"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

// TestNoPrincipalRefused: a handler reached with no principal at all (a
// route whose guard was forgotten) is Anonymous's: never the
// administrator, refused what needs a scope or every project.
func TestNoPrincipalRefused(t *testing.T) {
	s, _ := testServer(t)
	s.Metrics = metrics.New("")
	bare := func(method, target string) *http.Request { return httptest.NewRequest(method, target, nil) }
	if isAdmin(bare("GET", "/").Context()) {
		t.Error("isAdmin with no principal")
	}
	for _, tt := range []struct {
		name string
		err  error
		kind errdefs.Kind
	}{
		{"need", need(bare("GET", "/"), auth.SandboxRead), errdefs.KindUnauth},
		{"all_projects", func() error { _, err := everyProject(bare("GET", "/v0/sandboxes?all_projects=true")); return err }(), errdefs.KindForbidden},
		{"quota", func() error {
			r := bare("PUT", "/v0/projects/pa/quota")
			r.SetPathValue("name", "pa")
			_, _, err := s.setProjectQuota(r)
			return err
		}(), errdefs.KindForbidden},
	} {
		if errdefs.KindOf(tt.err) != tt.kind {
			t.Errorf("%s with no principal: %v, want %s", tt.name, tt.err, tt.kind)
		}
	}
	w := httptest.NewRecorder()
	s.metrics(w, bare("GET", "/metrics"))
	if w.Code != http.StatusForbidden {
		t.Errorf("metrics with no principal: %d %s, want 403", w.Code, w.Body)
	}
	v, _, _ := s.whoami(bare("GET", "/v0/whoami"))
	if who := v.(Whoami); who.AllProjects || who.Name != auth.Anonymous.Name {
		t.Errorf("whoami with no principal: %+v, want anonymous of no project", who)
	}
	if got := redact(bare("GET", "/"), Sandbox{Grants: []Grant{{Secret: "db"}}, Policy: &Policy{}}); len(got.Grants) != 0 || got.Policy != nil {
		t.Errorf("a sandbox shown with no principal keeps its grants or policy: %+v", got)
	}
}

// TestGuardPrincipals: every request leaves the guard with an explicit
// principal; Anonymous (a route anyone may call) with no project, every
// other with one; a key of no project is refused, never unscoped.
func TestGuardPrincipals(t *testing.T) {
	s, _ := testServer(t)
	type seen struct {
		p       *auth.Principal
		project string
		scoped  bool
	}
	for _, tt := range []struct {
		name   string
		p      *auth.Principal // nil: none, as over TCP without a key
		scope  string
		status int
		want   seen
	}{
		{"no key, open route", nil, auth.None, 200, seen{auth.Anonymous, project.Nowhere, true}},
		{"no key, scoped route", nil, auth.SandboxRead, 401, seen{}},
		{"vouched anonymous, open route", auth.Anonymous, auth.None, 200, seen{auth.Anonymous, project.Nowhere, true}},
		{"vouched anonymous, scoped route", auth.Anonymous, auth.AnyKey, 401, seen{}},
		{"socket", auth.Socket, auth.SandboxRead, 200, seen{auth.Socket, project.Default, true}},
		{"key of no project", &auth.Principal{Name: "old", Scopes: []string{auth.All}}, auth.SandboxRead, 403, seen{}},
		{"key of a project", &auth.Principal{Name: "ci", Project: "pa", Scopes: []string{auth.SandboxRead}}, auth.SandboxRead, 200, seen{nil, "pa", true}},
		{"key of every project", &auth.Principal{Name: "root", Project: store.AllProjects, Scopes: []string{auth.All}}, auth.SandboxRead, 200, seen{nil, project.Default, true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got seen
			h := s.guard(tt.scope, func(w http.ResponseWriter, r *http.Request) {
				got.p = auth.From(r.Context())
				got.project, got.scoped = project.From(r.Context())
			})
			r := httptest.NewRequest("GET", "/", nil)
			if tt.p != nil {
				r = r.WithContext(auth.WithPrincipal(r.Context(), tt.p))
			}
			w := httptest.NewRecorder()
			h(w, r)
			if w.Code != tt.status {
				t.Fatalf("status %d %s, want %d", w.Code, w.Body, tt.status)
			}
			if tt.want.p == nil && got.p != nil {
				tt.want.p = tt.p // a key is served as itself
			}
			if got != tt.want {
				t.Errorf("handler saw %+v (project %q, scoped %v), want %+v", got.p, got.project, got.scoped, tt.want)
			}
		})
	}
}
