package api

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/store"
	"github.com/useshards/shard/internal/units"
)

func view(sb *store.Sandbox) Sandbox {
	v := Sandbox{ID: sb.ID, Name: sb.Name, Project: sb.Project, Image: sb.Image, ImageDigest: sb.ImageDigest, Provider: sb.Provider,
		State: sb.State, MemoryBytes: sb.MemoryBytes, MemoryMiB: sb.MemoryBytes >> 20, CPU: float64(sb.CPUMillis) / 1000,
		DiskBytes: sb.DiskBytes, Pids: sb.Pids, Env: sb.Env, OOMKills: sb.OOMKills, Error: sb.Error,
		Session: sb.Session, ParentID: sb.ParentID, CreatedAt: sb.CreatedAt, StartedAt: sb.StartedAt, StoppedAt: sb.StoppedAt}
	if sb.State == sandbox.StateRunning {
		v.IP = sb.IP
	}
	if o := sb.Origin; o != nil {
		v.Origin = &Origin{Kind: o.Kind, Name: o.Name, ID: o.ID, Checkpoint: o.Checkpoint}
	}
	if v.Env == nil {
		v.Env = []string{}
	}
	v.Grants = make([]Grant, 0, len(sb.Grants))
	for _, g := range sb.Grants {
		v.Grants = append(v.Grants, Grant{Secret: g.Secret, Env: g.Env, File: g.File, At: g.At})
	}
	if sb.Policy != nil {
		v.Policy = &Policy{DenyAll: sb.Policy.DenyAll, Allow: sb.Policy.Allow, Deny: sb.Policy.Deny}
	}
	return v
}

// sandboxOut is a sandbox as an answer shows it to the caller: every answer
// that carries a sandbox goes through it.
func (s *Server) sandboxOut(r *http.Request, sb *store.Sandbox) Sandbox {
	v := redact(r, view(sb))
	if s.Cluster != nil {
		v.Node = s.Cluster.Name()
	}
	return v
}

// redact hides a sandbox's grants and policy from a token that may not read
// them (their own routes need secret:read and policy:read).
func redact(r *http.Request, v Sandbox) Sandbox {
	p := auth.From(r.Context())
	if !p.Can(auth.SecretRead) {
		v.Grants = []Grant{}
	}
	if !p.Can(auth.PolicyRead) {
		v.Policy = nil
	}
	return v
}

// sizeField reads a size: a string with a unit ("512MiB") or a number of
// bytes, exactly (units.ParseSize); 0 is left out.
func sizeField(name string, raw json.RawMessage) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var text string
	if isJSONNumber(raw) {
		text = strings.TrimSpace(string(raw))
		if strings.HasPrefix(text, "-") {
			return 0, errdefs.Invalid("%s must be positive", name)
		}
	} else if err := json.Unmarshal(raw, &text); err != nil {
		return 0, errdefs.Invalid("%s must be a size like \"512MiB\" or a number of bytes", name)
	}
	v, err := units.ParseSize(text)
	if err != nil {
		return 0, errdefs.Invalid("%s: %v", name, err)
	}
	if v == 0 {
		return 0, errdefs.Invalid("%s must be positive", name)
	}
	return v, nil
}

// cpuField reads a cpu amount: a number of cpus (1, 0.5) or a string
// ("500m", "0.5"), exactly, in whole millicpus (units.ParseCPU).
func cpuField(raw json.RawMessage) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var text string
	if isJSONNumber(raw) {
		text = strings.TrimSpace(string(raw))
	} else if err := json.Unmarshal(raw, &text); err != nil {
		return 0, errdefs.Invalid("cpu must be a number of cpus (1, 0.5) or a string like \"500m\"")
	}
	v, err := units.ParseCPU(text)
	if err != nil {
		return 0, errdefs.Invalid("cpu: %v", err)
	}
	return v, nil
}

// envField reads variables: ["K=V"] or {"K": "V"}, each checked
// (names.EnvVar): a map's key is a name, never K=V itself.
func envField(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err == nil {
		return list, sandbox.CheckEnv(list)
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, errdefs.Invalid("env must be a list of \"KEY=VALUE\" or an object of strings")
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		if err := names.EnvName(k); err != nil {
			return nil, errdefs.Invalid("env: %v", err)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := names.EnvVar(k + "=" + m[k]); err != nil {
			return nil, err
		}
		list = append(list, k+"="+m[k])
	}
	return list, sandbox.CheckEnv(list)
}

// createFields parses the bounds and environment a create (or an
// environment's definition) gives.
func createFields(memory json.RawMessage, memoryMiB int64, cpuRaw, diskRaw, envRaw json.RawMessage) (sandbox.CreateRequest, error) {
	var cr sandbox.CreateRequest
	mem, err := sizeField("memory", memory)
	if err != nil {
		return cr, err
	}
	if memoryMiB < 0 {
		return cr, errdefs.Invalid("memory_mib must be positive")
	}
	if memoryMiB > 0 {
		if mem != 0 {
			return cr, errdefs.Invalid("give memory or memory_mib, not both")
		}
		if !fitsMiB(memoryMiB) {
			return cr, errdefs.Invalid("memory_mib %d is too large: no host has that much memory", memoryMiB)
		}
		mem = memoryMiB << 20
	}
	if cr.DiskBytes, err = sizeField("disk", diskRaw); err != nil {
		return cr, err
	}
	if cr.CPUMillis, err = cpuField(cpuRaw); err != nil {
		return cr, err
	}
	if cr.Env, err = envField(envRaw); err != nil {
		return cr, err
	}
	cr.MemoryBytes = mem
	return cr, nil
}

func (s *Server) createSandbox(r *http.Request) (any, int, error) {
	req, cr, err := parseCreate(r, s.limits())
	if err != nil {
		return nil, 0, err
	}
	if req.Node != "" {
		switch {
		case s.Cluster == nil:
			return nil, 0, errdefs.New(errdefs.KindUnsupported, client.CodeNotClustered, "node %s: this server is a single host, not part of a cluster: leave node out", strconv.QuoteToASCII(req.Node))
		case req.Node != s.Cluster.Name():
			// Placement sent it elsewhere; a call another node sent on
			// is made here only.
			return nil, 0, errdefs.Conflict(client.CodeWrongNode, "this is node %s, not %s", s.Cluster.Name(), req.Node)
		}
	}
	if req.Environment != "" {
		if s.Cluster != nil {
			if err := s.crossNode().EnsureEnvironment(asCaller(r), req.Environment); err != nil {
				return nil, 0, err
			}
		}
		sb, err := s.Environments.CreateFromEnvironment(r.Context(), req.Environment, req.Name, carried(r))
		if err != nil {
			return nil, 0, err
		}
		return s.sandboxOut(r, sb), http.StatusCreated, nil
	}
	if s.Cluster != nil && cr.FromSnapshot == "" && cr.Digest == "" {
		// An import of another node is copied here first.
		if err := s.crossNode().EnsureImport(asCaller(r), cr.Image); err != nil {
			return nil, 0, err
		}
	}
	sb, err := s.Sandboxes.Create(r.Context(), cr)
	if err != nil {
		return nil, 0, err
	}
	return s.sandboxOut(r, sb), http.StatusCreated, nil
}

func (s *Server) listSandboxes(r *http.Request) (any, int, error) {
	ctx, err := everyProject(r)
	if err != nil {
		return nil, 0, err
	}
	all, err := s.Sandboxes.List(ctx)
	if err != nil {
		return nil, 0, err
	}
	out := make([]Sandbox, 0, len(all))
	for _, sb := range all {
		out = append(out, s.sandboxOut(r, sb))
	}
	return map[string]any{"sandboxes": out}, 200, nil
}

func (s *Server) getSandbox(r *http.Request) (any, int, error) {
	sb, err := s.Sandboxes.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, 0, err
	}
	return s.sandboxOut(r, sb), 200, nil
}

func (s *Server) removeSandbox(r *http.Request) (any, int, error) {
	force, err := boolQuery(r, "force")
	if err != nil {
		return nil, 0, err
	}
	cks, err := boolQuery(r, "checkpoints")
	if err != nil {
		return nil, 0, err
	}
	res, err := s.Sandboxes.RemoveWith(r.Context(), r.PathValue("id"), sandbox.RemoveOptions{Force: force, Checkpoints: cks})
	if err != nil {
		return nil, 0, err
	}
	return SandboxRemoved{Removed: r.PathValue("id"), Checkpoints: res.Checkpoints, FreedBytes: res.FreedBytes}, 200, nil
}

func (s *Server) stopSandbox(r *http.Request) (any, int, error) {
	sb, err := s.Sandboxes.Stop(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, 0, err
	}
	return s.sandboxOut(r, sb), 200, nil
}

func (s *Server) startSandbox(r *http.Request) (any, int, error) {
	sb, err := s.Sandboxes.Start(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, 0, err
	}
	return s.sandboxOut(r, sb), 200, nil
}

func (s *Server) capabilities(r *http.Request) (any, int, error) {
	return map[string]any{"providers": s.Sandboxes.Capabilities()}, 200, nil
}

func boolQuery(r *http.Request, key string) (bool, error) {
	v := r.URL.Query().Get(key)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.Invalid("%s=%q: use true or false", key, v)
	}
	return b, nil
}

// forkSandbox answers 201 with the fork, or with {"sandboxes": [...]} when
// count > 1.
func (s *Server) forkSandbox(r *http.Request) (any, int, error) {
	req, err := parseFork(r)
	if err != nil {
		return nil, 0, err
	}
	// A fork carries the source's grants and policy: making one needs the
	// scopes to hold them (seed 001), checked under the source's lock.
	req.Allow = carried(r)
	if s.Cluster != nil {
		// A fork runs here, on its source's node, when the node has room.
		src, err := s.Sandboxes.Get(r.Context(), r.PathValue("id"))
		if err != nil {
			return nil, 0, err
		}
		if !s.roomHere(src.MemoryBytes * int64(req.Count)) {
			return s.forkElsewhere(r, src, req)
		}
	}
	forks, err := s.Sandboxes.Fork(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return nil, 0, err
	}
	if req.Count <= 1 {
		return s.sandboxOut(r, forks[0]), http.StatusCreated, nil
	}
	out := ForkResponse{Sandboxes: make([]Sandbox, 0, len(forks))}
	for _, f := range forks {
		out.Sandboxes = append(out.Sandboxes, s.sandboxOut(r, f))
	}
	return out, http.StatusCreated, nil
}
