package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/store"
)

// fakeAccess is an AccessService over one sandbox's record: it keeps what
// it is given, or answers err.
type fakeAccess struct {
	sb    store.Sandbox
	calls []string
	err   error
}

func (f *fakeAccess) Grant(_ context.Context, id string, req sandbox.GrantRequest) (*store.Sandbox, error) {
	f.calls = append(f.calls, "grant "+id+" "+req.Secret)
	if f.err != nil {
		return nil, f.err
	}
	f.sb.Grants = append(f.sb.Grants, store.Grant{Secret: req.Secret, Env: req.Env, File: req.File})
	sb := f.sb
	return &sb, nil
}

func (f *fakeAccess) Ungrant(_ context.Context, id, secret string) (*store.Sandbox, error) {
	f.calls = append(f.calls, "ungrant "+id+" "+secret)
	f.sb.Grants = nil
	sb := f.sb
	return &sb, f.err
}

func (f *fakeAccess) SetPolicy(_ context.Context, id string, p *store.Policy) (*store.Sandbox, error) {
	f.calls = append(f.calls, "policy "+id)
	f.sb.Policy = p
	sb := f.sb
	return &sb, f.err
}

// The grants' and the policy's handlers run against a fake sandbox service:
// a grant request the API can tell is wrong never reaches it, a grant's
// answer hides the grants from a key that may not read secrets, and a
// policy set, cleared or refused comes back as the client expects.
func TestAccessHandlers(t *testing.T) {
	granter := &auth.Principal{Name: "deploy", Scopes: []string{auth.SecretWrite}, Project: "default"}
	do := func(t *testing.T, f *fakeAccess, p *auth.Principal, method, uri, body string) *httptest.ResponseRecorder {
		t.Helper()
		h := (&Server{Log: slog.New(slog.DiscardHandler), Access: f}).Handler()
		r := httptest.NewRequest(method, uri, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), p)))
		return w
	}

	f := &fakeAccess{sb: store.Sandbox{ID: "0123456789ab", Name: "web"}}
	w := do(t, f, auth.Socket, http.MethodPost, "/v0/sandboxes/web/grants", `{"secret":"db","env":"DB_URL"}`)
	var sb Sandbox
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &sb) != nil || len(sb.Grants) != 1 || sb.Grants[0].Env != "DB_URL" {
		t.Fatalf("grant: %d %s", w.Code, w.Body)
	}
	w = do(t, f, granter, http.MethodPost, "/v0/sandboxes/web/grants", `{"secret":"key","file":"/run/key"}`)
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &sb) != nil || len(sb.Grants) != 0 {
		t.Fatalf("a key without secret:read sees the grants in the answer: %d %s", w.Code, w.Body)
	}
	for _, body := range []string{
		`{"secret":"db","env":"DB_URL","file":"/run/db"}`, // both
		`{"secret":"db","file":"run/db"}`,                 // not absolute
		`{"secret":"db","at":"2026-01-02T15:04:05Z"}`,     // the server's to set
		`{"secret":"no such name!"}`,
	} {
		if w := do(t, f, auth.Socket, http.MethodPost, "/v0/sandboxes/web/grants", body); w.Code != 400 {
			t.Fatalf("grant %s: %d %s, want 400", body, w.Code, w.Body)
		}
	}
	f.err = errdefs.Conflict(client.CodePathExists, "/run/db in sandbox web: a file grant does not replace what it did not write")
	if w := do(t, f, auth.Socket, http.MethodPost, "/v0/sandboxes/web/grants", `{"secret":"db","file":"/run/db"}`); w.Code != 409 || !strings.Contains(w.Body.String(), client.CodePathExists) {
		t.Fatalf("a refused grant: %d %s", w.Code, w.Body)
	}
	f.err = nil
	if w := do(t, f, granter, http.MethodDelete, "/v0/sandboxes/web/grants/db", ""); w.Code != 200 {
		t.Fatalf("ungrant: %d %s", w.Code, w.Body)
	}

	var pol Policy
	w = do(t, f, auth.Socket, http.MethodPut, "/v0/sandboxes/web/policy", `{"deny_all":true,"allow":["10.0.0.0/8"]}`)
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &pol) != nil || !pol.DenyAll || !reflect.DeepEqual(pol.Allow, []string{"10.0.0.0/8"}) {
		t.Fatalf("set policy: %d %s", w.Code, w.Body)
	}
	if w = do(t, f, auth.Socket, http.MethodDelete, "/v0/sandboxes/web/policy", ""); w.Code != 200 || f.sb.Policy != nil {
		t.Fatalf("clear policy: %d %s, left %+v", w.Code, w.Body, f.sb.Policy)
	}
	if w = do(t, f, granter, http.MethodPut, "/v0/sandboxes/web/policy", `{"deny_all":true}`); w.Code != 403 {
		t.Fatalf("a policy set by a key without policy:write: %d %s", w.Code, w.Body)
	}
	want := []string{"grant web db", "grant web key", "grant web db", "ungrant web db", "policy web", "policy web"}
	if !reflect.DeepEqual(f.calls, want) {
		t.Fatalf("the service was asked %q, want %q", f.calls, want)
	}
}
