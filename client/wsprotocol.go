package client

import (
	"net/http"
	"strings"
)

// A browser cannot give a WebSocket upgrade headers, so the web console
// sends its API key as one of the subprotocols it offers, KeyProtocol
// followed by the key, beside ExecProtocol, which the server picks (as
// Kubernetes carries a bearer token): the key stays out of the URL, which
// a browser's console and a proxy's log print whole. ?access_token= is
// still read, for clients that can do neither.
const (
	ExecProtocol = "shard"
	KeyProtocol  = "shard.key."
)

// KeyFromProtocols returns the key an upgrade offers as a subprotocol.
func KeyFromProtocols(h http.Header) (string, bool) {
	for _, p := range protocols(h) {
		if k, ok := strings.CutPrefix(p, KeyProtocol); ok && k != "" {
			return k, true
		}
	}
	return "", false
}

// StripKeyProtocols removes the key from the subprotocols an upgrade
// offers, before it goes on to whoever must not see the key (a sandbox's
// server behind the ports proxy; the server behind shard ui, which gets
// the CLI's own key instead).
func StripKeyProtocols(h http.Header) {
	ps := protocols(h)
	if len(ps) == 0 {
		return
	}
	kept := ps[:0]
	for _, p := range ps {
		if !strings.HasPrefix(p, KeyProtocol) {
			kept = append(kept, p)
		}
	}
	h.Del("Sec-WebSocket-Protocol")
	if len(kept) > 0 {
		h.Set("Sec-WebSocket-Protocol", strings.Join(kept, ", "))
	}
}

// DropKey removes every form of shard key from a request that goes on to
// whoever must not see it: the Authorization header, a subprotocol
// offered, ?access_token=.
func DropKey(r *http.Request) {
	r.Header.Del("Authorization")
	StripKeyProtocols(r.Header)
	if q := r.URL.Query(); q.Has("access_token") {
		q.Del("access_token")
		r.URL.RawQuery = q.Encode()
	}
}

func protocols(h http.Header) []string {
	var out []string
	for _, v := range h.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}
