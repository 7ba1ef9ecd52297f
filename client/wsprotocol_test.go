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
