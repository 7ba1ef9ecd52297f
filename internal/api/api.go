// Package api is shard's HTTP interface under /v0: JSON in, JSON out, errors
// as {"code","message"} with a status mapped from the error's class in one
// place (writeError). It knows HTTP and the sandbox service, never a runtime.
package api

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/sandbox"
)

//go:embed openapi.json
var openapiDoc []byte

// OpenAPI returns the OpenAPI document (for tests and `shard api`).
func OpenAPI() []byte { return openapiDoc }

// MaxBody bounds a JSON request body.
const MaxBody = 1 << 20

// Server holds the handlers' dependencies.
type Server struct {
	Sandboxes *sandbox.Service
	Images    *image.Store
	Log       *slog.Logger
	Version   string
}

// Handler returns the HTTP handler for /v0.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	h := func(pattern string, fn func(*http.Request) (any, int, error)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			v, code, err := fn(r)
			if err != nil {
				s.writeError(w, r, err)
				return
			}
			writeJSON(w, code, v)
		})
	}
	mux.HandleFunc("GET /v0/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openapiDoc)
	})
	h("GET /v0/version", func(*http.Request) (any, int, error) {
		return map[string]string{"version": s.Version, "api": "v0"}, 200, nil
	})
	h("GET /v0/capabilities", s.capabilities)
	h("POST /v0/sandboxes", s.createSandbox)
	h("GET /v0/sandboxes", s.listSandboxes)
	h("GET /v0/sandboxes/{id}", s.getSandbox)
	h("DELETE /v0/sandboxes/{id}", s.removeSandbox)
	h("POST /v0/sandboxes/{id}/stop", s.stopSandbox)
	h("POST /v0/sandboxes/{id}/start", s.startSandbox)
	h("POST /v0/sandboxes/{id}/fork", s.forkSandbox)
	mux.HandleFunc("POST /v0/sandboxes/{id}/exec", s.execStream)
	mux.HandleFunc("GET /v0/sandboxes/{id}/exec", s.execWebSocket)
	h("POST /v0/sandboxes/{id}/checkpoints", s.createCheckpoint)
	h("GET /v0/sandboxes/{id}/checkpoints", s.sandboxCheckpoints)
	h("GET /v0/checkpoints", s.listCheckpoints)
	h("GET /v0/checkpoints/{id}", s.getCheckpoint)
	h("DELETE /v0/checkpoints/{id}", s.removeCheckpoint)
	h("POST /v0/checkpoints/{id}/restore", s.restoreCheckpoint)
	h("POST /v0/snapshots", s.createSnapshot)
	h("GET /v0/snapshots", s.listSnapshots)
	h("GET /v0/snapshots/{id}", s.getSnapshot)
	h("DELETE /v0/snapshots/{id}", s.removeSnapshot)
	h("GET /v0/ledger/sessions", s.listSessions)
	h("GET /v0/ledger/sessions/{name}", s.getSession)
	mux.HandleFunc("GET /v0/ledger/sessions/{name}/events", s.sessionEvents)
	h("POST /v0/ledger/sessions/{name}/resume", s.resumeSession)
	h("POST /v0/environments", s.createEnvironment)
	h("GET /v0/environments", s.listEnvironments)
	h("GET /v0/environments/{name}", s.getEnvironment)
	h("DELETE /v0/environments/{name}", s.removeEnvironment)
	h("GET /v0/system/df", s.diskUsage)
	h("GET /v0/images", s.listImages)
	mux.HandleFunc("POST /v0/images/pull", s.pullImage)
	h("POST /v0/images/import", s.importImage)
	h("GET /v0/images/{ref...}", s.getImage)
	h("DELETE /v0/images/{ref...}", s.removeImage)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errdefs.NotFound("not_found", "no such endpoint: %s %s (see /v0/openapi.json)", r.Method, r.URL.Path))
	})
	return s.logged(mux)
}

// logged logs each request and turns a handler panic into a 500, never a
// dropped connection.
func (s *Server) logged(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: 200}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.Log.Error("panic in handler", "method", r.Method, "path", r.URL.Path, "panic", p)
				if !sw.wrote {
					s.writeError(sw, r, fmt.Errorf("panic: %v", p))
				}
			}
			s.Log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", sw.code, "dur", time.Since(start))
		}()
		next.ServeHTTP(sw, r)
	})
}

type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (w *statusWriter) WriteHeader(c int) {
	if !w.wrote {
		w.code, w.wrote = c, true
	}
	w.ResponseWriter.WriteHeader(c)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController and websocket reach the real writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func statusOf(k errdefs.Kind) int {
	switch k {
	case errdefs.KindInvalid:
		return http.StatusBadRequest
	case errdefs.KindNotFound:
		return http.StatusNotFound
	case errdefs.KindConflict, errdefs.KindUnsupported:
		return http.StatusConflict
	case errdefs.KindUnavailable:
		return http.StatusBadGateway
	case errdefs.KindForbidden:
		return http.StatusForbidden
	case errdefs.KindUnauth:
		return http.StatusUnauthorized
	case errdefs.KindFailed:
		return http.StatusUnprocessableEntity
	case errdefs.KindTooLarge:
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusInternalServerError
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	kind := errdefs.KindOf(err)
	code := errdefs.CodeOf(err)
	msg := err.Error()
	status := statusOf(kind)
	if status >= 500 {
		s.Log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		if kind == errdefs.KindInternal {
			msg = "internal error: " + msg
		}
	}
	writeJSON(w, status, Error{Code: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if v == nil {
		v = struct{}{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// decode reads a JSON body strictly: bounded size, no unknown fields, one
// value. Every failure is the user's, so a 4xx.
func decode(r *http.Request, v any) error {
	body := http.MaxBytesReader(nil, r.Body, MaxBody)
	b, err := io.ReadAll(body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errdefs.New(errdefs.KindTooLarge, "body_too_large", "request body is larger than %d bytes", MaxBody)
		}
		return errdefs.Invalid("read request body: %v", err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		b = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return errdefs.Invalid("request body is not valid JSON: %v (at byte %d)", err, se.Offset)
		case errors.As(err, &te):
			return errdefs.Invalid("request body: field %q must be %s, not %s", te.Field, te.Type, te.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return errdefs.Invalid("request body: %s", strings.TrimPrefix(err.Error(), "json: "))
		}
		return errdefs.Invalid("request body is not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errdefs.Invalid("request body has more than one JSON value")
	}
	return nil
}
