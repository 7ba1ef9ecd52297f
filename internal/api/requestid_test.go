package api

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/metrics"
	"github.com/useshards/shard/internal/store"
)

// Every answer carries a request id, the access line carries the same, and
// a caller's own id is kept only when it is a plain token.
func TestRequestID(t *testing.T) {
	tests := []struct {
		name, sent string
		keep       bool
	}{
		{"none sent", "", false},
		{"plain kept", "trace-1.a:b_c", true},
		{"spaces refused", "a b", false},
		{"newline refused", "a\nlevel=ERROR msg=forged", false},
		{"too long refused", strings.Repeat("a", 65), false},
	}
	random := regexp.MustCompile(`^[0-9a-f]{16}$`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, logBuf := testServer(t)
			s.Metrics = metrics.New("")
			r := httptest.NewRequest(http.MethodGet, "/v0/nope", nil)
			if tt.sent != "" {
				r.Header[RequestIDHeader] = []string{tt.sent}
			}
			w := httptest.NewRecorder()
			s.Handler().ServeHTTP(w, r)
			id := w.Header().Get(RequestIDHeader)
			if tt.keep && id != tt.sent {
				t.Errorf("id %q, want the caller's %q", id, tt.sent)
			}
			if !tt.keep && !random.MatchString(id) {
				t.Errorf("id %q, want 16 random hex digits", id)
			}
			if !strings.Contains(logBuf.String(), "request_id="+id) || !strings.Contains(logBuf.String(), "route=unmatched") {
				t.Errorf("the access line lacks request_id=%s route=unmatched: %q", id, logBuf)
			}
		})
	}
}

// The metrics count requests by the pattern they matched, never by the raw
// path or an unknown method (both the caller's to choose).
func TestRequestMetricsLabels(t *testing.T) {
	s, _ := testServer(t)
	s.Metrics = metrics.New("")
	h := s.Handler()
	for _, r := range []*http.Request{
		httptest.NewRequest(http.MethodGet, "/v0/version", nil),
		httptest.NewRequest("BREW", "/v0/coffee-"+strings.Repeat("x", 40), nil),
	} {
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	w := httptest.NewRecorder()
	scrape := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	h.ServeHTTP(w, scrape.WithContext(auth.WithPrincipal(scrape.Context(), auth.Socket)))
	out := w.Body.String()
	for _, want := range []string{
		`shard_api_requests_total{code="200",method="GET",route="GET /v0/version"} 1`,
		`shard_api_requests_total{code="404",method="OTHER",route="unmatched"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(out, "coffee") || strings.Contains(out, "BREW") {
		t.Errorf("a caller's path or method became a label")
	}
}

// The console is served without a key at /ui/ (and /ui redirects there);
// its pages carry the CSP.
func TestConsoleRoute(t *testing.T) {
	s, _ := testServer(t)
	h := s.Handler()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/ui/", nil))
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") || !strings.Contains(w.Header().Get("Content-Security-Policy"), "default-src 'self'") {
		t.Errorf("GET /ui/: %d %q, CSP %q", w.Code, w.Header().Get("Content-Type"), w.Header().Get("Content-Security-Policy"))
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/ui", nil))
	if w.Code != http.StatusMovedPermanently || w.Header().Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d to %q, want a redirect to /ui/", w.Code, w.Header().Get("Location"))
	}
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/ui/", nil))
	if w.Code == 200 {
		t.Errorf("POST /ui/: 200, want a refusal")
	}
}

// An informational answer (1xx) before the final one is not the request's
// status: the access line and the metrics carry the final one. (The ports
// proxy forwards a sandbox server's 103 Early Hints, and a 100 followed by
// nothing is a 502.)
func TestAccessStatusSkipsInformational(t *testing.T) {
	s, logBuf := testServer(t)
	s.Metrics = metrics.New("")
	h := s.logged(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusContinue)
		w.WriteHeader(http.StatusBadGateway)
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v0/anything", nil))
	if !strings.Contains(logBuf.String(), "status=502") {
		t.Errorf("access line %q, want status=502", logBuf)
	}
	m := httptest.NewRecorder()
	s.Metrics.Handler().ServeHTTP(m, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(m.Body.String(), `shard_api_requests_total{code="502"`) || strings.Contains(m.Body.String(), `code="103"`) {
		t.Errorf("metrics count the 1xx, not the final 502:\n%s", grepLines(m.Body.String(), "shard_api_requests_total"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// The metrics are every project's: a project's key does not read them,
// even with "*"; a key of every project with metrics:read does.
func TestMetricsOnlyForEveryProject(t *testing.T) {
	s, _ := testServer(t)
	s.Metrics = metrics.New("")
	h := s.Handler()
	for _, tt := range []struct {
		p    *auth.Principal
		want int
	}{
		{&auth.Principal{Name: "team", Project: "team-a", Scopes: []string{auth.All}}, http.StatusForbidden},
		{&auth.Principal{Name: "prom-a", Project: "team-a", Scopes: []string{auth.MetricsRead}}, http.StatusForbidden},
		{&auth.Principal{Name: "prom", Project: store.AllProjects, Scopes: []string{auth.MetricsRead}}, http.StatusOK},
		{&auth.Principal{Name: "ci", Project: store.AllProjects, Scopes: []string{auth.SandboxRead}}, http.StatusForbidden},
		{auth.Socket, http.StatusOK},
	} {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), tt.p)))
		if w.Code != tt.want {
			t.Errorf("%s of project %q: %d %s, want %d", tt.p.Name, tt.p.Project, w.Code, w.Body, tt.want)
		}
		if tt.want == http.StatusForbidden && tt.p.Project != store.AllProjects && !strings.Contains(w.Body.String(), "wrong_project") {
			t.Errorf("%s: %s, want wrong_project", tt.p.Name, w.Body)
		}
	}
}

// A WebSocket upgrade may carry its key as a subprotocol (a browser cannot
// give it headers); a plain request may not.
func TestBearerFromProtocol(t *testing.T) {
	for _, tt := range []struct {
		name    string
		upgrade bool
		want    string
	}{
		{"upgrade", true, "shk_x_y"},
		{"plain request", false, ""},
	} {
		r := httptest.NewRequest("GET", "/v0/sandboxes/a/exec", nil)
		r.Header.Set("Sec-WebSocket-Protocol", "shard, shard.key.shk_x_y")
		if tt.upgrade {
			r.Header.Set("Upgrade", "websocket")
		}
		if got, _ := bearer(r); got != tt.want {
			t.Errorf("%s: bearer %q, want %q", tt.name, got, tt.want)
		}
	}
}
