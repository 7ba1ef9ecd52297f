// Package api is shard's HTTP interface under /v0: JSON in, JSON out, errors
// as {"code","message"} with a status mapped from the error's class in one
// place (writeError). It knows HTTP and the sandbox service, never a runtime.
package api

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/closing"
	"github.com/useshards/shard/internal/crossnode"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/files"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/lineage"
	"github.com/useshards/shard/internal/metrics"
	"github.com/useshards/shard/internal/peer"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/secrets"
	"github.com/useshards/shard/internal/store"
	"github.com/useshards/shard/internal/ui"
)

//go:embed openapi.json
var openapiDoc []byte

// OpenAPI returns the OpenAPI document (for tests and `shard api`).
func OpenAPI() []byte { return openapiDoc }

// MaxBody bounds a JSON request body.
const MaxBody = 1 << 20

// Server holds the handlers' dependencies.
type Server struct {
	// Sandboxes is the lifecycle: create, start, stop, remove, fork, exec,
	// get and list.
	Sandboxes *sandbox.Service
	// The sandbox service's jobs (Sandboxes.Files(), .Saved(), ...), each
	// as the small interface its handler group uses, so that the group is
	// tested against a fake.
	Files        FileService
	Lineage      LineageService
	Checkpoints  CheckpointService
	Snapshots    SnapshotService
	Environments EnvironmentService
	Access       AccessService
	Usage        UsageService
	Sessions     SessionService
	// Ledger reads the ledger's sessions and events, and the projects'
	// counts and quotas (store.Store): the handlers that only read them
	// need no more of the store.
	Ledger   LedgerReader
	Images   *image.Store
	Tokens   *auth.Tokens
	Secrets  *secrets.Service
	Log      *slog.Logger
	Version  string
	Stopping <-chan struct{} // closed when the server shuts down: long streams end
	// BodyTimeout cuts a request body that stalls this long (0: never;
	// see bodyDeadline).
	BodyTimeout time.Duration
	// Metrics counts requests and serves GET /metrics (nil: neither).
	Metrics *metrics.Metrics
	// Cluster is the cluster this node belongs to (nil: a single host).
	Cluster Cluster

	peerOnce sync.Once
	peerc    *peer.Client // the other nodes' client (Cluster's); set by peerOnce, nil on a single host

	crossOnce sync.Once
	cross     *crossnode.Service // set by crossOnce

	authOnce  sync.Once
	authFails *authLimiter // failed API keys per client; set by authOnce

	streams closing.Group // hijacked streams, waited for by WaitStreams
}

// LedgerReader is what the ledger's and the projects' handlers read.
type LedgerReader interface {
	Sessions(ctx context.Context) ([]*store.Session, error)
	// FindSession finds a session by its name, or by its sandbox's name
	// or id: every route that takes a session takes either.
	FindSession(ctx context.Context, ref string) (*store.Session, error)
	Events(ctx context.Context, session string, after int64, limit int) ([]store.Event, error)
	// Changed is closed at the next event appended to any session.
	Changed() <-chan struct{}
	Projects(ctx context.Context) ([]*store.ProjectCounts, error)
	ProjectQuotas(ctx context.Context) (map[string]store.Quota, error)
}

// FileService is what the files handlers use of sandboxes' files
// (sandbox.Files).
type FileService interface {
	ReadFiles(ctx context.Context, idOrName, path string, o files.GetOptions) (*sandbox.FileStream, error)
	WriteFiles(ctx context.Context, idOrName, path string, body io.Reader, o sandbox.WriteOptions) (*sandbox.WriteResult, error)
	StatFile(ctx context.Context, idOrName, path string, follow bool) (*files.Info, error)
	ListFiles(ctx context.Context, idOrName, path string, limit int) (entries []files.Info, truncated bool, err error)
	RemoveFile(ctx context.Context, idOrName, path string, recursive bool) (*files.Info, error)
}

// LineageService is what the fork tree's and the diff's handlers use
// (sandbox.Files).
type LineageService interface {
	Tree(ctx context.Context, idOrName string, all bool) ([]*lineage.Node, error)
	Diff(ctx context.Context, idOrName string, o sandbox.DiffOptions) (*sandbox.DiffResult, error)
}

// CheckpointService is what the checkpoints' handlers use (sandbox.Saved).
type CheckpointService interface {
	Checkpoint(ctx context.Context, idOrName, tag string) (*store.Checkpoint, error)
	Checkpoints(ctx context.Context, sandboxOrSession string) ([]*store.Checkpoint, error)
	GetCheckpoint(ctx context.Context, id string) (*store.Checkpoint, error)
	RemoveCheckpoint(ctx context.Context, id string) error
	Restore(ctx context.Context, ckID string, o sandbox.RestoreOptions) (*store.Sandbox, error)
	CheckpointSize(id string) int64
}

// SnapshotService is what the snapshots' handlers use (sandbox.Saved).
type SnapshotService interface {
	CreateSnapshot(ctx context.Context, idOrName, name string) (*store.Snapshot, error)
	Snapshots(ctx context.Context) ([]*store.Snapshot, error)
	GetSnapshot(ctx context.Context, idOrName string) (*store.Snapshot, error)
	RemoveSnapshot(ctx context.Context, idOrName string) (*store.Snapshot, error)
	SnapshotSize(id string) int64
}

// EnvironmentService is what the environments' handlers, and a create
// from an environment, use (sandbox.Saved).
type EnvironmentService interface {
	CreateEnvironment(ctx context.Context, req sandbox.EnvironmentRequest) (*store.Environment, bool, error)
	Environments(ctx context.Context) ([]*store.Environment, error)
	GetEnvironment(ctx context.Context, name string) (*store.Environment, error)
	RemoveEnvironment(ctx context.Context, name string) error
	CreateFromEnvironment(ctx context.Context, env, name string, allow sandbox.Allow) (*store.Sandbox, error)
}

// AccessService is what the grants' and the policy's handlers change
// (sandbox.Access); they read a sandbox's through Sandboxes.
type AccessService interface {
	Grant(ctx context.Context, idOrName string, req sandbox.GrantRequest) (*store.Sandbox, error)
	Ungrant(ctx context.Context, idOrName, secret string) (*store.Sandbox, error)
	SetPolicy(ctx context.Context, idOrName string, p *store.Policy) (*store.Sandbox, error)
}

// UsageService is what the projects' handlers read and set of what each
// project holds and may hold, and what the disk usage's reads
// (sandbox.Admission).
type UsageService interface {
	ProjectUses(ctx context.Context, ps []string) (map[string]sandbox.ProjectUse, error)
	SetQuota(ctx context.Context, p string, q store.Quota) error
	DiskUsage(ctx context.Context) (*sandbox.DiskUsage, error)
}

// SessionService is what the ledger's handlers do with a session
// (sandbox.Sessions); they read the ledger through Ledger.
type SessionService interface {
	Resume(ctx context.Context, session, name string, allow sandbox.Allow) (*sandbox.ResumeResult, error)
	RemoveSession(ctx context.Context, name string) error
}

// route is one endpoint: its pattern, the scope a token needs for it, and
// its handler (a JSON one, or a raw one for streams and upgrades).
type route struct {
	pattern string
	scope   string
	json    func(*http.Request) (any, int, error)
	raw     http.HandlerFunc
	where   where // where a cluster serves it (cluster.go): every route says
}

// routes is every endpoint and the scope it declares. A request over TCP
// needs an API key whose scopes cover it; the Unix socket is the
// administrator. Some handlers ask for more (a fork of a sandbox with
// secret grants needs secret:* too). Each also says where a cluster serves
// it (its placement; TestRoutePlacement holds the whole table).
func (s *Server) routes() []route {
	j := func(p, scope string, w where, fn func(*http.Request) (any, int, error)) route {
		return route{pattern: p, scope: scope, where: w, json: fn}
	}
	r := func(p, scope string, w where, fn http.HandlerFunc) route {
		return route{pattern: p, scope: scope, where: w, raw: fn}
	}
	var (
		here        = at(local)
		sandboxes   = at(sandboxNode)
		every       = at(everyNode)
		checkpoints = heldAt(s.getCheckpoint, "/v0/checkpoints/", "id")
		snapshots   = heldAt(s.getSnapshot, "/v0/snapshots/", "id")
		sessions    = heldAt(s.getSession, "/v0/ledger/sessions/", "name")
	)
	rts := []route{
		r("GET /v0/openapi.json", auth.None, here, s.openapi),
		j("GET /v0/version", auth.None, here, s.version),
		j("GET /v0/capabilities", auth.SandboxRead, here, s.capabilities),
		j("GET /v0/whoami", auth.AnyKey, here, s.whoami),
		j("GET /v0/nodes", auth.SandboxRead, here, s.listNodes),
		r("GET /metrics", auth.MetricsRead, here, s.metrics),
		j("POST /v0/sandboxes", auth.SandboxWrite, at(placedNode), s.createSandbox),
		j("GET /v0/sandboxes", auth.SandboxRead, every, s.listSandboxes),
		j("GET /v0/sandboxes/{id}", auth.SandboxRead, sandboxes, s.getSandbox),
		j("DELETE /v0/sandboxes/{id}", auth.SandboxWrite, sandboxes, s.removeSandbox),
		j("POST /v0/sandboxes/{id}/stop", auth.SandboxWrite, sandboxes, s.stopSandbox),
		j("POST /v0/sandboxes/{id}/start", auth.SandboxWrite, sandboxes, s.startSandbox),
		j("POST /v0/sandboxes/{id}/fork", auth.SandboxWrite, sandboxes, s.forkSandbox),
		r("POST /v0/sandboxes/{id}/exec", auth.SandboxWrite, sandboxes, s.execStream),
		r("GET /v0/sandboxes/{id}/exec", auth.SandboxWrite, sandboxes, s.execWebSocket),
		r("GET /v0/sandboxes/{id}/files", auth.SandboxRead, sandboxes, s.readFiles),
		j("PUT /v0/sandboxes/{id}/files", auth.SandboxWrite, sandboxes, s.writeFiles),
		j("DELETE /v0/sandboxes/{id}/files", auth.SandboxWrite, sandboxes, s.removeFile),
		j("GET /v0/sandboxes/{id}/files/stat", auth.SandboxRead, sandboxes, s.statFile),
		j("GET /v0/sandboxes/{id}/files/list", auth.SandboxRead, sandboxes, s.listFiles),
		j("GET /v0/sandboxes/{id}/tree", auth.SandboxRead, sandboxes, s.tree),
		j("GET /v0/tree", auth.SandboxRead, here, s.tree),
		j("GET /v0/sandboxes/{id}/diff", auth.SandboxRead, sandboxes, s.diff),
		j("POST /v0/sandboxes/{id}/checkpoints", auth.SandboxWrite, sandboxes, s.createCheckpoint),
		j("GET /v0/sandboxes/{id}/checkpoints", auth.SandboxRead, sandboxes, s.sandboxCheckpoints),
		j("GET /v0/checkpoints", auth.SandboxRead, every, s.listCheckpoints),
		j("GET /v0/checkpoints/{id}", auth.SandboxRead, checkpoints, s.getCheckpoint),
		j("DELETE /v0/checkpoints/{id}", auth.SandboxWrite, checkpoints, s.removeCheckpoint),
		j("POST /v0/checkpoints/{id}/restore", auth.SandboxWrite, checkpoints, s.restoreCheckpoint),
		j("POST /v0/snapshots", auth.SandboxWrite, at(bodySandboxNode), s.createSnapshot),
		j("GET /v0/snapshots", auth.SandboxRead, every, s.listSnapshots),
		j("GET /v0/snapshots/{id}", auth.SandboxRead, snapshots, s.getSnapshot),
		j("DELETE /v0/snapshots/{id}", auth.SandboxWrite, snapshots, s.removeSnapshot),
		j("GET /v0/ledger/sessions", auth.SandboxRead, every, s.listSessions),
		j("GET /v0/ledger/sessions/{name}", auth.SandboxRead, sessions, s.getSession),
		r("GET /v0/ledger/sessions/{name}/events", auth.SandboxRead, sessions, s.sessionEvents),
		j("POST /v0/ledger/sessions/{name}/resume", auth.SandboxWrite, sessions, s.resumeSession),
		j("DELETE /v0/ledger/sessions/{name}", auth.SandboxWrite, sessions, s.removeSession),
		j("POST /v0/environments", auth.SandboxWrite, at(bodySandboxNode), s.createEnvironment),
		j("GET /v0/environments", auth.SandboxRead, every, s.listEnvironments),
		j("GET /v0/environments/{name}", auth.SandboxRead, heldAt(s.getEnvironment, "/v0/environments/", "name"), s.getEnvironment),
		j("DELETE /v0/environments/{name}", auth.SandboxWrite, here, s.removeEnvironment),
		j("GET /v0/system/df", auth.SandboxRead, here, s.diskUsage),
		j("GET /v0/images", auth.SandboxRead, here, s.listImages),
		r("POST /v0/images/pull", auth.SandboxWrite, here, s.pullImage),
		j("POST /v0/images/import", auth.SandboxWrite, here, s.importImage),
		j("GET /v0/images/{ref...}", auth.SandboxRead, at(importerNode), s.getImage),
		j("DELETE /v0/images/{ref...}", auth.SandboxWrite, at(importerNode), s.removeImage),
		j("GET /v0/projects", auth.SandboxRead, here, s.listProjects),
		j("PUT /v0/projects/{name}/quota", auth.All, here, s.setProjectQuota),
		j("POST /v0/tokens", auth.TokenWrite, here, s.createToken),
		j("GET /v0/tokens", auth.TokenRead, here, s.listTokens),
		j("DELETE /v0/tokens/{id}", auth.TokenWrite, here, s.revokeToken),
		j("PUT /v0/secrets/{name}", auth.SecretWrite, here, s.putSecret),
		j("GET /v0/secrets", auth.SecretRead, here, s.listSecrets),
		j("DELETE /v0/secrets/{name}", auth.SecretWrite, here, s.removeSecret),
		j("POST /v0/sandboxes/{id}/grants", auth.SecretWrite, sandboxes, s.grantSecret),
		j("GET /v0/sandboxes/{id}/grants", auth.SecretRead, sandboxes, s.listGrants),
		j("DELETE /v0/sandboxes/{id}/grants/{secret}", auth.SecretWrite, sandboxes, s.ungrantSecret),
		j("PUT /v0/sandboxes/{id}/policy", auth.PolicyWrite, sandboxes, s.setPolicy),
		j("GET /v0/sandboxes/{id}/policy", auth.PolicyRead, sandboxes, s.getPolicy),
		j("DELETE /v0/sandboxes/{id}/policy", auth.PolicyWrite, sandboxes, s.clearPolicy),
		r("/v0/sandboxes/{id}/ports/{port}/{path...}", auth.SandboxWrite, sandboxes, s.portProxy),
	}
	return rts
}

// checkPlacements panics on a route that says not where a cluster serves
// it: a programming error, caught by any test that makes the handler.
func (s *Server) checkPlacements(rts []route) {
	for _, rt := range rts {
		if rt.where.place == unplaced || rt.where.place == holderNode && (rt.where.probe == nil || rt.where.probeURI == nil) {
			panic("api: route " + rt.pattern + " says no placement")
		}
	}
}

// RouteScopes lists every endpoint's pattern and the scope it declares (for
// the docs and the scope tests).
func RouteScopes() [][2]string {
	var out [][2]string
	for _, rt := range (&Server{}).routes() {
		out = append(out, [2]string{rt.pattern, rt.scope})
	}
	return out
}

// Handler returns the HTTP handler for /v0.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	rts := s.routes()
	s.checkPlacements(rts)
	for _, rt := range rts {
		h := rt.raw
		if rt.json != nil {
			fn := rt.json
			h = func(w http.ResponseWriter, r *http.Request) {
				v, code, err := fn(r)
				if err != nil {
					s.writeError(w, r, err)
					return
				}
				writeJSON(w, code, v)
			}
		}
		mux.HandleFunc(rt.pattern, named(rt.pattern, s.guard(rt.scope, s.routed(rt, h))))
	}
	// A checkpoint another node sends (a fork moved across the cluster):
	// for nodes only, so not in routes (nor the OpenAPI document).
	mux.HandleFunc("POST /v0/cluster/checkpoints", named("POST /v0/cluster/checkpoints", s.guard(auth.SandboxWrite, s.importCheckpoint)))
	mux.HandleFunc("POST /v0/cluster/environments/{name}/send", named("POST /v0/cluster/environments/{name}/send", s.guard(auth.SandboxWrite, s.nodesOnly(s.sendEnvironment))))
	mux.HandleFunc("GET /v0/cluster/images/{ref...}", named("GET /v0/cluster/images/{ref...}", s.guard(auth.SandboxWrite, s.exportImage)))
	// The web console's files: no key (they hold nothing secret; what it
	// shows comes through /v0 with the user's key).
	mux.HandleFunc("GET /ui/", named("GET /ui/", ui.Handler().ServeHTTP))
	mux.HandleFunc("GET /ui", named("GET /ui/", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, ui.Prefix, http.StatusMovedPermanently)
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errdefs.NotFound(client.CodeNotFound, "no such endpoint: %s %s (see /v0/openapi.json)", r.Method, r.URL.Path))
	})
	return s.logged(bodyDeadline(s.BodyTimeout, s.peers(mux)))
}

// guard finds who makes the request (the Unix socket's administrator, the
// holder of an API key, or on a route anyone may call auth.Anonymous) and
// lets it through only if its scopes cover scope: 401 without a valid
// key, 403 naming the missing scope. Every request leaves it with its
// principal, and every one but Anonymous's with its project.
func (s *Server) guard(scope string, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, known := auth.Lookup(r.Context())
		if !known && scope != auth.None {
			key, ok := bearer(r)
			if !ok {
				s.writeError(w, r, errdefs.New(errdefs.KindUnauth, client.CodeUnauthenticated, "this endpoint needs an API key: send Authorization: Bearer <key> (the SDKs and the CLI send SHARD_API_KEY)"))
				return
			}
			s.authOnce.Do(func() {
				if s.authFails == nil {
					s.authFails = newAuthLimiter(s.Log)
				}
			})
			from := clientAddr(r.RemoteAddr)
			var err error
			if p, err = s.Tokens.Authenticate(r.Context(), key); err != nil {
				// Only failures are limited: a valid key gets through
				// from an address others fail from (a NAT, a proxy).
				if errdefs.Is(err, errdefs.KindUnauth) {
					if d := s.authFails.wait(from); d > 0 {
						w.Header().Set("Retry-After", strconv.Itoa(retryAfter(d)))
						s.writeError(w, r, errdefs.New(errdefs.KindTooMany, client.CodeTooManyRequests, "too many failed API keys from %s: try again in %s", from, d.Round(time.Second)))
						return
					}
					s.authFails.failed(from)
				}
				s.writeError(w, r, err)
				return
			}
		}
		r = r.WithContext(auth.WithPrincipal(r.Context(), p))
		if info := infoOf(r.Context()); info != nil && !p.Admin && p != auth.Anonymous {
			info.key = p.Name
		}
		if err := p.Need(scope); err != nil {
			s.writeError(w, r, err)
			return
		}
		if p == auth.Anonymous {
			// It acts in no project: what it may call reads none, and
			// the store refuses a context without one.
			next(w, r)
			return
		}
		// Every other request acts in one project, and the store sees
		// only that project's objects (internal/project).
		proj, err := p.ProjectFor(requestedProject(r))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		next(w, r.WithContext(project.With(r.Context(), proj)))
	}
}

// bearer returns the request's API key: the Authorization header, or for a
// WebSocket upgrade (which browsers cannot give headers) a subprotocol
// offered (client.KeyProtocol), or ?access_token=.
func bearer(r *http.Request) (string, bool) {
	if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && v != "" {
		return strings.TrimSpace(v), true
	}
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		if v, ok := client.KeyFromProtocols(r.Header); ok {
			return v, true
		}
		if v := r.URL.Query().Get("access_token"); v != "" {
			return v, true
		}
	}
	return "", false
}

// ProjectHeader names the project a request acts in (the default project
// if absent); a key of one project may only name its own. A WebSocket
// upgrade from a browser, which cannot set headers, gives ?project=.
const ProjectHeader = "Shard-Project"

func requestedProject(r *http.Request) string {
	if v := r.Header.Get(ProjectHeader); v != "" {
		return v
	}
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return r.URL.Query().Get("project")
	}
	return ""
}

// everyProject returns the request's context unscoped when it asks for
// ?all_projects=true, which only a key of every project may; else its own.
func everyProject(r *http.Request) (context.Context, error) {
	if v := r.URL.Query().Get("all_projects"); v == "" || v == "false" {
		return r.Context(), nil
	} else if v != "true" {
		return nil, errdefs.Invalid("all_projects is %q: use true or false", v)
	}
	if !isAdmin(r.Context()) {
		p := auth.From(r.Context())
		return nil, errdefs.New(errdefs.KindForbidden, client.CodeWrongProject, "token %s belongs to project %s: only a key of every project lists them all", p.Name, p.Project)
	}
	return project.Unscoped(r.Context(), "all_projects=true of a key of every project"), nil
}

// isAdmin reports whether the request may act on every project (list all,
// see every token, remove a shared image, make keys of other projects): a
// key of every project, or the socket. A request with no principal is
// Anonymous's, and never the administrator's.
func isAdmin(ctx context.Context) bool { return auth.From(ctx).AllProjects() }

// need checks extra scopes a handler finds it needs (beyond its route's);
// a request with no principal (Anonymous) has none.
func need(r *http.Request, scopes ...string) error { return auth.From(r.Context()).Need(scopes...) }

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(openapiDoc)
}

func (s *Server) version(*http.Request) (any, int, error) {
	return map[string]string{"version": s.Version, "api": "v0"}, 200, nil
}

// metrics serves the Prometheus text format (see internal/metrics). The
// metrics are the whole server's (every project's sandboxes, execs and
// requests), so a project's key does not read them, whatever its scopes:
// only a key of every project, or the socket.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	if s.Metrics == nil {
		http.NotFound(w, r)
		return
	}
	if !isAdmin(r.Context()) {
		p := auth.From(r.Context())
		s.writeError(w, r, errdefs.New(errdefs.KindForbidden, client.CodeWrongProject,
			"token %s belongs to project %s: the metrics are every project's, so only a key of every project reads them (shard token create --scope metrics:read --all-projects)", p.Name, p.Project))
		return
	}
	s.Metrics.Handler().ServeHTTP(w, r)
}

// logged gives each request its id (X-Request-Id, on every answer), logs
// it as one access line carrying that id, counts it in the metrics, and
// turns a handler panic into a 500, never a dropped connection.
func (s *Server) logged(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		info := &requestInfo{id: requestID(r), route: "unmatched"}
		w.Header().Set(RequestIDHeader, info.id)
		r = r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info))
		sw := &statusWriter{ResponseWriter: w, code: 200}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.Log.Error("panic in handler", "request_id", info.id, "method", logValue(r.Method), "path", logValue(r.URL.Path), "panic", logValue(fmt.Sprint(p)))
				if !sw.wrote {
					s.writeError(sw, r, fmt.Errorf("panic: %v", p))
				}
			}
			d := time.Since(start)
			method := knownMethod(r.Method)
			s.Log.Info("request", "request_id", info.id, "method", method, "route", info.route, "path", logValue(r.URL.Path),
				"status", sw.code, "dur", d, "remote", logValue(r.RemoteAddr), "key", info.key)
			s.Metrics.Request(info.route, method, sw.code, d)
		}()
		next.ServeHTTP(sw, r)
	})
}

type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

// WriteHeader records the answer's status: the first final one. An
// informational 1xx (a 100 Continue, a 103 Early Hints that the ports
// proxy forwards from a sandbox's server) is not the answer, and the
// status that follows it is; 101 Switching Protocols is final.
func (w *statusWriter) WriteHeader(c int) {
	if !w.wrote && (c >= 200 || c == http.StatusSwitchingProtocols) {
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

// statusClientClosed is a request's whose client went away (499).
const statusClientClosed = errdefs.StatusClientClosed

// statusOf is the HTTP status of each kind (errdefs' table, which a node
// also reads another node's error answers back with).
func statusOf(k errdefs.Kind) int { return errdefs.Status(k) }

// errorBodyGrace is how long an error answer's connection may still read
// the request's body for the answer to be read (see writeError).
const errorBodyGrace = 2 * time.Second

// writeError answers err: its status and {code, message} (errorBody),
// logged as failedAnswer does.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if r.ProtoMajor == 1 && r.ContentLength < 0 && r.Body != nil && r.Body != http.NoBody {
		// A body of no stated length may still be open: a framed exec's
		// stdin from a terminal, or the CLI's signal frames, end after the
		// answer. net/http would read such a body to its end before
		// answering, and the client waits for the answer first: the
		// answer closes the connection instead, sent at once. net/http
		// then reads a little of the rest, so that a client still
		// sending reads the answer before the close (a 413 to an upload
		// of no stated length): bounded in time, as the rest may never
		// come. (HTTP/2 answers a stream without reading its body; there
		// the header would close every stream of the connection.)
		w.Header().Set("Connection", "close")
		defer http.NewResponseController(w).SetReadDeadline(time.Now().Add(errorBodyGrace))
	}
	status, body := s.failedAnswer(w, r, err)
	writeJSON(w, status, body)
}

// failedAnswer is errorBody of err, logged: a failure of the server (5xx)
// at error, a request its client left at debug (nothing failed), the
// user's own errors not at all. Every error answer goes through it: a
// response's (writeError) and one inside a stream that has begun.
func (s *Server) failedAnswer(w http.ResponseWriter, r *http.Request, err error) (int, Error) {
	id := w.Header().Get(RequestIDHeader)
	status, body := errorBody(err, id)
	switch {
	case status == statusClientClosed:
		s.Log.Debug("request canceled", "request_id", id, "method", logValue(r.Method), "path", logValue(r.URL.Path), "err", logErr(err))
	case status >= 500:
		s.Log.Error("request failed", "request_id", id, "method", logValue(r.Method), "path", logValue(r.URL.Path), "err", logErr(err))
	}
	return status, body
}

// errorBody is the status and the {code, message} that answer err, for a
// request whose id is requestID. A classified error's message is written
// for the user (see errdefs) and is shown; the text of an unclassified one
// is not (it may name a host path, or say nothing to the user): its
// message says only what happened, with the request's id for the log.
func errorBody(err error, requestID string) (int, Error) {
	kind, code := errdefs.KindOf(err), errdefs.CodeOf(err)
	status := statusOf(kind)
	msg := err.Error()
	if e, ok := errdefs.As(err); !ok || e.Kind != kind {
		msg = unclassifiedMessage(kind, requestID)
	} else if kind == errdefs.KindInternal {
		msg = "internal error: " + msg
	}
	return status, Error{Code: code, Message: msg}
}

// unclassifiedMessage is the message of an error that has no message for
// the user: what its kind says, and where the rest is.
func unclassifiedMessage(kind errdefs.Kind, requestID string) string {
	inLog := "the server's log has the cause"
	if requestID != "" {
		inLog += " (request " + requestID + ")"
	}
	switch kind {
	case errdefs.KindCanceled:
		return "the request was canceled: its client went away"
	case errdefs.KindTimeout:
		return "the request ran out of time: " + inLog
	case errdefs.KindNoSpace:
		return "the server's disk is full: free space (remove sandboxes, snapshots or checkpoints) and try again"
	}
	return "internal error: " + inLog
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
	b, err := readBody(r)
	if err != nil {
		return err
	}
	return decodeJSON(b, v)
}

// readBody reads a request's body, bounded by MaxBody (413 past it).
func readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, MaxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errdefs.New(errdefs.KindTooLarge, client.CodeBodyTooLarge, "request body is larger than %d bytes", MaxBody)
		}
		return nil, errdefs.Invalid("read request body: %v", err)
	}
	return b, nil
}

// decodeJSON decodes b as decode does a body: no unknown fields, one value,
// empty as {}.
func decodeJSON(b []byte, v any) error {
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
