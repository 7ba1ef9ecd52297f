package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"

	"github.com/useshards/shard/client"
)

// RequestIDHeader carries a request's id on every answer (and may bring
// the caller's own): a user's failed call is found in the access log by it.
const RequestIDHeader = client.RequestIDHeader

// requestInfo is what the layers under logged learn about a request for
// its access line: the route it matched and the key that made it.
type requestInfo struct {
	id    string
	route string // the pattern matched; "unmatched" for a 404 of the mux
	key   string // the API key's name; "" for the socket's administrator
}

type requestInfoKey struct{}

// infoOf is the request's info that logged made (nil outside it).
func infoOf(ctx context.Context) *requestInfo {
	info, _ := ctx.Value(requestInfoKey{}).(*requestInfo)
	return info
}

// requestID is the caller's X-Request-Id when it is a plain token of at
// most 64 characters (a proxy's or an SDK's id, kept so both logs agree),
// else a new random one: the id lands in the log as is.
func requestID(r *http.Request) string {
	if v := r.Header.Get(RequestIDHeader); v != "" && len(v) <= 64 && plainToken(v) {
		return v
	}
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func plainToken(s string) bool {
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}

// named records the route pattern a request matched.
func named(pattern string, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if info := infoOf(r.Context()); info != nil {
			info.route = pattern
		}
		next(w, r)
	}
}

// knownMethod bounds the method a log line and a metric label carry: a
// caller may send any token as a method.
func knownMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "OTHER"
}
