package api

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/store"
)

// Tokens, secrets and grants, network policy, and ports.

func tokenView(t *store.Token) Token {
	return Token{ID: t.ID, Name: t.Name, Project: t.Project, Scopes: t.Scopes, CreatedAt: t.CreatedAt}
}

func (s *Server) createToken(r *http.Request) (any, int, error) {
	req, err := parseToken(r)
	if err != nil {
		return nil, 0, err
	}
	// A token makes tokens only as strong as itself: token:write is not a
	// way to a "*" key.
	if err := need(r, req.Scopes...); err != nil {
		return nil, 0, err
	}
	// ... and of no more projects than its own.
	proj, _ := project.From(r.Context())
	switch req.Project {
	case "", proj:
	case store.AllProjects:
		if !isAdmin(r.Context()) {
			p := auth.From(r.Context())
			return nil, 0, errdefs.New(errdefs.KindForbidden, client.CodeWrongProject, "token %s belongs to project %s: only a key of every project makes one", p.Name, p.Project)
		}
		proj = store.AllProjects
	default:
		if err := project.Check(req.Project); err != nil { // before it is echoed
			return nil, 0, err
		}
		if !isAdmin(r.Context()) {
			p := auth.From(r.Context())
			return nil, 0, errdefs.New(errdefs.KindForbidden, client.CodeWrongProject, "token %s belongs to project %s: it cannot make a key of project %s", p.Name, p.Project, req.Project)
		}
		proj = req.Project
	}
	// A token is made in the project it is for (names are unique there).
	ctx := project.Unscoped(r.Context(), "a token is made in the project it is for")
	rec, key, err := s.Tokens.Create(ctx, req.Name, req.Scopes, proj)
	if err != nil {
		return nil, 0, err
	}
	return TokenCreated{Token: tokenView(rec), Key: key}, http.StatusCreated, nil
}

// listProjects lists the projects that hold anything: every one for a key
// of every project, else the key's own.
func (s *Server) listProjects(r *http.Request) (any, int, error) {
	ctx := r.Context()
	if isAdmin(ctx) {
		ctx = project.Unscoped(ctx, "a key of every project lists every project")
	}
	out, err := s.projects(ctx, "")
	if err != nil {
		return nil, 0, err
	}
	return map[string]any{"projects": out}, 200, nil
}

// projects lists ctx's projects (every one when unscoped; only the one
// named when name is set), with their quotas and use. A project with a
// quota is listed though it holds nothing.
func (s *Server) projects(ctx context.Context, name string) ([]Project, error) {
	all, err := s.Ledger.Projects(ctx)
	if err != nil {
		return nil, err
	}
	byName := map[string]*Project{}
	var names []string
	add := func(n string) *Project {
		if p := byName[n]; p != nil {
			return p
		}
		if !project.Visible(ctx, n) || (name != "" && n != name) {
			return nil
		}
		byName[n] = &Project{Name: n}
		names = append(names, n)
		return byName[n]
	}
	for _, p := range all {
		if q := add(p.Name); q != nil {
			*q = Project{Name: p.Name, Sandboxes: p.Sandboxes, Sessions: p.Sessions, Checkpoints: p.Checkpoints,
				Snapshots: p.Snapshots, Environments: p.Environments, Secrets: p.Secrets, Tokens: p.Tokens}
		}
	}
	quotas, err := s.Ledger.ProjectQuotas(ctx)
	if err != nil {
		return nil, err
	}
	for n := range quotas {
		add(n)
	}
	if own, scoped := project.From(ctx); scoped {
		add(own) // a project's key sees its own, empty or not
	}
	if name != "" {
		add(name)
	}
	uses, err := s.Usage.ProjectUses(ctx, names)
	if err != nil {
		return nil, err
	}
	out := make([]Project, 0, len(names))
	for _, n := range names {
		p, u := byName[n], uses[n]
		q := u.Quota
		p.Quota = ProjectQuota{MaxSandboxes: q.Sandboxes, MaxMemoryBytes: q.MemoryBytes, MaxCPUMillis: q.CPUMillis,
			MaxDiskBytes: q.DiskBytes, MaxSavedBytes: q.SavedBytes, MaxLedgerBytes: q.LedgerBytes}
		p.Use = ProjectUse{Sandboxes: u.Sandboxes, MemoryBytes: u.Memory, CPUMillis: u.CPU, DiskBytes: u.Disk,
			SavedBytes: u.SavedBytes, LedgerBytes: u.LedgerBytes}
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Project) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// setProjectQuota sets a project's quota: an administrator's act, so only a
// key of every project (with the scope "*", which the route asks) or the
// socket may.
func (s *Server) setProjectQuota(r *http.Request) (any, int, error) {
	name := r.PathValue("name")
	if err := project.Check(name); err != nil {
		return nil, 0, err
	}
	if !isAdmin(r.Context()) {
		p := auth.From(r.Context())
		return nil, 0, errdefs.New(errdefs.KindForbidden, client.CodeWrongProject, "token %s belongs to project %s: only a key of every project sets quotas", p.Name, p.Project)
	}
	// The body is the whole quota: an empty one (or null) is refused, not
	// read as "no bounds", so a careless client does not wipe them all.
	b, err := readBody(r)
	if err != nil {
		return nil, 0, err
	}
	if t := bytes.TrimSpace(b); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil, 0, errdefs.Invalid("give the quota as a JSON object (its bounds; {} removes every bound)")
	}
	var q ProjectQuota
	if err := decodeJSON(b, &q); err != nil {
		return nil, 0, err
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"max_sandboxes", q.MaxSandboxes}, {"max_memory_bytes", q.MaxMemoryBytes}, {"max_cpu_millis", q.MaxCPUMillis},
		{"max_disk_bytes", q.MaxDiskBytes}, {"max_saved_bytes", q.MaxSavedBytes}, {"max_ledger_bytes", q.MaxLedgerBytes}} {
		if f.v < 0 {
			return nil, 0, errdefs.Invalid("%s is %d: give 0 (no bound) or more", f.name, f.v)
		}
	}
	err = s.Usage.SetQuota(r.Context(), name, store.Quota{Sandboxes: q.MaxSandboxes, MemoryBytes: q.MaxMemoryBytes, CPUMillis: q.MaxCPUMillis,
		DiskBytes: q.MaxDiskBytes, SavedBytes: q.MaxSavedBytes, LedgerBytes: q.MaxLedgerBytes})
	if err != nil {
		return nil, 0, err
	}
	ps, err := s.projects(project.Unscoped(r.Context(), "the quota's answer is the project it was set on (only an administrator sets one)"), name)
	if err != nil || len(ps) != 1 {
		return nil, 0, cmp.Or(err, fmt.Errorf("project %s not listed after its quota was set", name))
	}
	return ps[0], 200, nil
}

// tokenContext is where a request sees tokens: a key of every project sees
// them all, unless its request names a project; a project's key sees its
// project's.
func tokenContext(r *http.Request) context.Context {
	if isAdmin(r.Context()) && requestedProject(r) == "" {
		return project.Unscoped(r.Context(), "a key of every project lists every token")
	}
	return r.Context()
}

func (s *Server) listTokens(r *http.Request) (any, int, error) {
	all, err := s.Tokens.List(tokenContext(r))
	if err != nil {
		return nil, 0, err
	}
	out := make([]Token, 0, len(all))
	for _, t := range all {
		out = append(out, tokenView(t))
	}
	return map[string]any{"tokens": out}, 200, nil
}

func (s *Server) revokeToken(r *http.Request) (any, int, error) {
	rec, err := s.Tokens.Revoke(tokenContext(r), r.PathValue("id"))
	if err != nil {
		return nil, 0, err
	}
	return map[string]string{"revoked": rec.ID}, 200, nil
}

func secretView(sec *store.Secret) Secret {
	return Secret{Name: sec.Name, CreatedAt: sec.CreatedAt, UpdatedAt: sec.UpdatedAt}
}

func (s *Server) putSecret(r *http.Request) (any, int, error) {
	name, value, err := parseSecret(r)
	if err != nil {
		return nil, 0, err
	}
	sec, err := s.Secrets.Set(r.Context(), name, value)
	if err != nil {
		return nil, 0, err
	}
	return secretView(sec), 200, nil
}

func (s *Server) listSecrets(r *http.Request) (any, int, error) {
	all, err := s.Secrets.List(r.Context())
	if err != nil {
		return nil, 0, err
	}
	out := make([]Secret, 0, len(all))
	for _, sec := range all {
		out = append(out, secretView(sec))
	}
	return map[string]any{"secrets": out}, 200, nil
}

func (s *Server) removeSecret(r *http.Request) (any, int, error) {
	name := r.PathValue("name")
	if err := s.Secrets.Remove(r.Context(), name); err != nil {
		return nil, 0, err
	}
	return map[string]string{"removed": name}, 200, nil
}

func (s *Server) grantSecret(r *http.Request) (any, int, error) {
	req, err := parseGrant(r)
	if err != nil {
		return nil, 0, err
	}
	sb, err := s.Access.Grant(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return nil, 0, err
	}
	return s.sandboxOut(r, sb), 200, nil
}

func (s *Server) listGrants(r *http.Request) (any, int, error) {
	sb, err := s.Sandboxes.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, 0, err
	}
	return map[string]any{"grants": view(sb).Grants}, 200, nil
}

func (s *Server) ungrantSecret(r *http.Request) (any, int, error) {
	sb, err := s.Access.Ungrant(r.Context(), r.PathValue("id"), r.PathValue("secret"))
	if err != nil {
		return nil, 0, err
	}
	return s.sandboxOut(r, sb), 200, nil
}

func (s *Server) setPolicy(r *http.Request) (any, int, error) {
	p, err := parsePolicy(r)
	if err != nil {
		return nil, 0, err
	}
	sb, err := s.Access.SetPolicy(r.Context(), r.PathValue("id"), p)
	if err != nil {
		return nil, 0, err
	}
	return policyOf(sb), 200, nil
}

func policyOf(sb *store.Sandbox) Policy {
	if sb.Policy == nil {
		return Policy{}
	}
	return Policy{DenyAll: sb.Policy.DenyAll, Allow: sb.Policy.Allow, Deny: sb.Policy.Deny}
}

func (s *Server) getPolicy(r *http.Request) (any, int, error) {
	sb, err := s.Sandboxes.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, 0, err
	}
	return policyOf(sb), 200, nil
}

func (s *Server) clearPolicy(r *http.Request) (any, int, error) {
	sb, err := s.Access.SetPolicy(r.Context(), r.PathValue("id"), nil)
	if err != nil {
		return nil, 0, err
	}
	return policyOf(sb), 200, nil
}

// portProxy reaches a server listening inside a sandbox: every method, and
// WebSocket upgrades, under /v0/sandboxes/{id}/ports/{port}/, forwarded to
// the sandbox's address with the prefix taken off.
func (s *Server) portProxy(w http.ResponseWriter, r *http.Request) {
	port, err := names.Port(r.PathValue("port"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.Sandboxes.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if sb.State != sandbox.StateRunning {
		s.writeError(w, r, errdefs.Conflict(client.CodeSandboxNotRunning, "sandbox %s is %s: ports are reached in a running sandbox", sb.Name, sb.State))
		return
	}
	target := &url.URL{Scheme: "http", Host: sb.IP + ":" + strconv.Itoa(port)}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = "/" + r.PathValue("path")
			pr.Out.URL.RawPath = ""
			// The shard key is not the app's: neither the header nor the
			// subprotocol or ?access_token= a WebSocket client may have used.
			client.DropKey(pr.Out)
			pr.Out.Header.Del(ProjectHeader)
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if cerr := r.Context().Err(); cerr != nil {
				s.writeError(w, r, cerr) // the caller left: not the port's failure
				return
			}
			s.writeError(w, r, errdefs.Upstream(client.CodePortUnreachable, "nothing answers on port %d in sandbox %s: %v", port, sb.Name, err))
		},
		FlushInterval: -1,
	}
	rp.ServeHTTP(w, r)
}

// carried is the one check of the scopes a new sandbox's inherited state
// needs, as a fork's (seed 001): secret:* to get grants, policy:* to get a
// policy. Fork, restore, resume and create from an environment hand it to
// the service, which asks it where what is carried is known for sure
// (under the source's lock, with the checkpoint held).
func carried(r *http.Request) sandbox.Allow {
	return func(grants, policy bool) error { return needFor(r, grants, policy) }
}

// needFor asks for secret:* if grants, and policy:* if policy, are carried.
func needFor(r *http.Request, grants, policy bool) error {
	if grants {
		if err := need(r, auth.SecretAll); err != nil {
			return err
		}
	}
	if policy {
		return need(r, auth.PolicyAll)
	}
	return nil
}

// whoami tells a key what it is: its name, project and scopes (the web
// console hides what the key cannot do). The socket is the administrator.
func (s *Server) whoami(r *http.Request) (any, int, error) {
	p := auth.From(r.Context())
	if p.Admin {
		return Whoami{Name: "admin", Project: store.AllProjects, Scopes: []string{auth.All}, AllProjects: true}, 200, nil
	}
	return Whoami{Name: p.Name, Project: p.Project, Scopes: p.Scopes, AllProjects: p.AllProjects()}, 200, nil
}
