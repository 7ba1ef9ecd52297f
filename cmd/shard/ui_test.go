package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestUIGate(t *testing.T) {
	const session = "shui_secret"
	passed := ""
	h := uiGate(session, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { passed = r.URL.Path }))
	tests := []struct {
		name, path, auth string
		upgrade          bool
		want             int
		through          bool
	}{
		{"console files need no key", "/ui/index.html", "", false, 200, true},
		{"root redirects", "/", "", false, 302, false},
		{"api without a key", "/v0/sandboxes", "", false, 401, false},
		{"api with another key", "/v0/sandboxes", "Bearer shk_other", false, 401, false},
		{"api with the session's key", "/v0/sandboxes", "Bearer " + session, false, 200, true},
		{"upgrade with the key in the query", "/v0/sandboxes/x/exec?access_token=" + session, "", true, 200, true},
		{"a plain request may not use the query", "/v0/sandboxes?access_token=" + session, "", false, 401, false},
		{"upgrade with a wrong query key", "/v0/sandboxes/x/exec?access_token=nope", "", true, 401, false},
		{"nothing else is forwarded", "/metrics", "Bearer " + session, false, 404, false},
		{"nor a path that only starts alike", "/v0x", "Bearer " + session, false, 404, false},
		// The server's mux would only redirect these, but the gate must
		// not rest on that: without the key, nothing but /ui/ goes through.
		{"no dot-dot out of /ui/", "/ui/../v0/tokens", "", false, 404, false},
		{"nor an escaped one", "/ui/%2e%2e/v0/tokens", "", false, 404, false},
		{"nor an escaped slash", "/ui/..%2fv0%2ftokens", "", false, 404, false},
		{"nor a dot-dot upgrade", "/ui/../v0/sandboxes/x/exec", "", true, 404, false},
		{"nor a doubled slash", "/ui//v0/tokens", "", false, 404, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			passed = ""
			r := httptest.NewRequest("GET", tt.path, nil)
			if tt.auth != "" {
				r.Header.Set("Authorization", tt.auth)
			}
			if tt.upgrade {
				r.Header.Set("Upgrade", "websocket")
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tt.want || (passed != "") != tt.through {
				t.Errorf("%s: %d (forwarded %v), want %d (forwarded %v)", tt.path, w.Code, passed != "", tt.want, tt.through)
			}
		})
	}
}

// A browser's WebSocket offers the key as a subprotocol; the gate takes it
// there too, and only for an upgrade.
func TestUIGateKeyProtocol(t *testing.T) {
	const session = "shui_secret"
	passed := false
	h := uiGate(session, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { passed = true }))
	for _, tt := range []struct {
		name, proto string
		upgrade     bool
		want        int
	}{
		{"the session's key", "shard, shard.key." + session, true, 200},
		{"another key", "shard, shard.key.shk_other", true, 401},
		{"no key offered", "shard", true, 401},
		{"not an upgrade", "shard, shard.key." + session, false, 401},
	} {
		passed = false
		r := httptest.NewRequest("GET", "/v0/sandboxes/x/exec", nil)
		r.Header.Set("Sec-WebSocket-Protocol", tt.proto)
		if tt.upgrade {
			r.Header.Set("Upgrade", "websocket")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tt.want || passed != (tt.want == 200) {
			t.Errorf("%s: %d (forwarded %v), want %d", tt.name, w.Code, passed, tt.want)
		}
	}
}
