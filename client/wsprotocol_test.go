package client

import (
	"net/http"
	"testing"
)

func TestKeyProtocols(t *testing.T) {
	tests := []struct {
		name     string
		values   []string
		key      string
		ok       bool
		stripped string
	}{
		{"none", nil, "", false, ""},
		{"exec only", []string{"shard"}, "", false, "shard"},
		{"key beside exec", []string{"shard, shard.key.shk_a_b"}, "shk_a_b", true, "shard"},
		{"key in its own header", []string{"shard", "shard.key.shk_a_b"}, "shk_a_b", true, "shard"},
		{"key alone", []string{"shard.key.shk_a_b"}, "shk_a_b", true, ""},
		{"an app's protocols stay", []string{"graphql-ws, shard.key.k, chat"}, "k", true, "graphql-ws, chat"},
		{"an empty key is none", []string{"shard.key."}, "", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tt.values {
				h.Add("Sec-WebSocket-Protocol", v)
			}
			key, ok := KeyFromProtocols(h)
			if key != tt.key || ok != tt.ok {
				t.Errorf("KeyFromProtocols = %q %v, want %q %v", key, ok, tt.key, tt.ok)
			}
			StripKeyProtocols(h)
			if got := h.Get("Sec-WebSocket-Protocol"); got != tt.stripped || len(h.Values("Sec-WebSocket-Protocol")) > 1 {
				t.Errorf("stripped: %q, want %q", h.Values("Sec-WebSocket-Protocol"), tt.stripped)
			}
		})
	}
}

func TestDropKey(t *testing.T) {
	r, _ := http.NewRequest("GET", "http://x/v0/sandboxes/a/exec?request=%7B%7D&access_token=shk_k&project=p", nil)
	r.Header.Set("Authorization", "Bearer shk_k")
	r.Header.Set("Sec-WebSocket-Protocol", "shard, shard.key.shk_k")
	DropKey(r)
	if r.Header.Get("Authorization") != "" || r.Header.Get("Sec-WebSocket-Protocol") != "shard" {
		t.Errorf("headers kept a key: %v", r.Header)
	}
	if q := r.URL.Query(); q.Has("access_token") || q.Get("request") != "{}" || q.Get("project") != "p" {
		t.Errorf("query %q: want the key gone and the rest kept", r.URL.RawQuery)
	}
}
