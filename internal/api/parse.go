package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/network"
	"github.com/useshards/shard/internal/sandbox"
	"github.com/useshards/shard/internal/secrets"
	"github.com/useshards/shard/internal/store"
	"github.com/useshards/shard/internal/units"
)

// Each handler that takes a body reads it with one of the parse functions
// below: decode, then every check that needs no state, so that a bad value
// is a 400 saying what is allowed before anything is done. The fuzz tests
// run exactly these.

// MaxExecTimeout is the longest timeout an exec may ask for.
const MaxExecTimeout = 30 * 24 * time.Hour

// limits are the bounds this server's sandboxes may have.
func (s *Server) limits() sandbox.Limits {
	if s.Sandboxes == nil {
		return sandbox.HostLimits()
	}
	return s.Sandboxes.Limits()
}

// optName checks a name that may be left out ("": the id becomes it).
func optName(what, name string) error {
	if name == "" {
		return nil
	}
	return names.Name(what, name)
}

// parseCreate reads POST /v0/sandboxes: the request, and for a create that
// is not from an environment, the service's request, checked against lim.
func parseCreate(r *http.Request, lim sandbox.Limits) (CreateRequest, sandbox.CreateRequest, error) {
	var req CreateRequest
	if err := decode(r, &req); err != nil {
		return req, sandbox.CreateRequest{}, err
	}
	if err := optName("sandbox", req.Name); err != nil {
		return req, sandbox.CreateRequest{}, err
	}
	if req.Environment != "" {
		if req.Image != "" || len(req.Memory) > 0 || req.MemoryMiB != 0 || len(req.CPU) > 0 || len(req.Disk) > 0 ||
			req.Pids != 0 || len(req.Env) > 0 || req.Provider != "" || req.FromSnapshot != "" {
			return req, sandbox.CreateRequest{}, errdefs.Invalid("a sandbox from environment %s starts from its checkpoint, with its image, bounds and environment: leave out image, memory, cpu, disk, pids, env, provider and from_snapshot", req.Environment)
		}
		return req, sandbox.CreateRequest{}, names.Name("environment", req.Environment)
	}
	cr, err := createFields(req.Memory, req.MemoryMiB, req.CPU, req.Disk, req.Env)
	if err != nil {
		return req, cr, err
	}
	if req.Pids < 0 {
		return req, cr, errdefs.Invalid("pids must be positive: from %d to %d", sandbox.MinPids, sandbox.MaxPids)
	}
	cr.Name, cr.Image, cr.Pids, cr.Provider, cr.FromSnapshot = req.Name, strings.TrimSpace(req.Image), req.Pids, req.Provider, req.FromSnapshot
	return req, cr, sandbox.CheckCreate(cr, lim)
}

// parseFork reads POST /v0/sandboxes/{id}/fork.
func parseFork(r *http.Request) (sandbox.ForkRequest, error) {
	var req ForkRequest
	if err := decode(r, &req); err != nil {
		return sandbox.ForkRequest{}, err
	}
	fr := sandbox.ForkRequest{Name: req.Name, Count: req.Count, Tag: req.Tag, KeepCheckpoint: req.KeepCheckpoint}
	fr.Hooks.InSource = req.HooksInSource
	switch req.HookErrors {
	case "", "fail":
	case "ignore":
		fr.Hooks.Ignore = true
	default:
		return fr, errdefs.Invalid("hook_errors %q: fail (the default: a failing hook refuses the fork) or ignore", req.HookErrors)
	}
	if req.HookTimeout != "" {
		d, err := time.ParseDuration(req.HookTimeout)
		if err != nil || d <= 0 || d > sandbox.MaxHookTimeout {
			return fr, errdefs.Invalid("hook_timeout %q: a duration from 1ms to %s, like 30s", req.HookTimeout, sandbox.MaxHookTimeout)
		}
		fr.Hooks.Timeout = d
	}
	if fr.Count == 0 {
		fr.Count = 1
	}
	if fr.Count < 1 || fr.Count > sandbox.MaxForkCount {
		return fr, errdefs.Invalid("count %d is out of range: from 1 to %d", req.Count, sandbox.MaxForkCount)
	}
	if fr.Name != "" {
		if err := names.Name("fork", fr.Name); err != nil {
			return fr, err
		}
		// With a count the forks are NAME-1 ... NAME-N: the longest must fit.
		if last := fmt.Sprintf("%s-%d", fr.Name, fr.Count); fr.Count > 1 {
			if err := names.Name("fork", last); err != nil {
				return fr, errdefs.Invalid("with count %d the forks are named %s-1 ... %s: %v", fr.Count, fr.Name, last, err)
			}
		}
	}
	return fr, names.Tag(fr.Tag)
}

// parseCheckpoint reads POST /v0/sandboxes/{id}/checkpoints: the tag.
func parseCheckpoint(r *http.Request) (string, error) {
	var req CheckpointRequest
	if err := decode(r, &req); err != nil {
		return "", err
	}
	return req.Tag, names.Tag(req.Tag)
}

// parseNewName reads the bodies that name a new sandbox: restore, resume.
func parseNewName(r *http.Request) (string, error) {
	var req struct {
		Name string `json:"name,omitempty"`
	}
	if err := decode(r, &req); err != nil {
		return "", err
	}
	return req.Name, optName("sandbox", req.Name)
}

// parseSnapshot reads POST /v0/snapshots.
func parseSnapshot(r *http.Request) (SnapshotRequest, error) {
	var req SnapshotRequest
	if err := decode(r, &req); err != nil {
		return req, err
	}
	if req.Sandbox == "" {
		return req, errdefs.Invalid("a snapshot needs the sandbox to take it of (\"sandbox\": id or name)")
	}
	return req, optName("snapshot", req.Name)
}

// MaxFingerprint bounds an environment's fingerprint.
const MaxFingerprint = 128

// parseEnvironment reads POST /v0/environments.
func parseEnvironment(r *http.Request, lim sandbox.Limits) (sandbox.EnvironmentRequest, error) {
	var req EnvironmentRequest
	if err := decode(r, &req); err != nil {
		return sandbox.EnvironmentRequest{}, err
	}
	if req.Name == "" {
		return sandbox.EnvironmentRequest{}, errdefs.Invalid("an environment needs a name")
	}
	if err := names.Name("environment", req.Name); err != nil {
		return sandbox.EnvironmentRequest{}, err
	}
	cr, err := createFields(req.Memory, req.MemoryMiB, req.CPU, req.Disk, req.Env)
	if err != nil {
		return sandbox.EnvironmentRequest{}, err
	}
	cr.Image, cr.Provider = req.Image, req.Provider
	if req.Sandbox == "" && req.Image == "" {
		return sandbox.EnvironmentRequest{}, errdefs.Invalid("an environment needs an image (or a set-up sandbox: \"sandbox\")")
	}
	if req.Fingerprint != "" {
		if err := names.Token("fingerprint", req.Fingerprint, MaxFingerprint); err != nil {
			return sandbox.EnvironmentRequest{}, err
		}
	}
	for _, argv := range req.Setup {
		if err := checkArgv("setup command", argv); err != nil {
			return sandbox.EnvironmentRequest{}, err
		}
	}
	if req.Sandbox == "" {
		if err := sandbox.CheckCreate(cr, lim); err != nil {
			return sandbox.EnvironmentRequest{}, err
		}
	}
	return sandbox.EnvironmentRequest{Name: req.Name, Create: cr, Setup: req.Setup, Sandbox: req.Sandbox, Fingerprint: req.Fingerprint}, nil
}

// checkArgv refuses an empty command, arguments no process can have, and
// more of them than sandbox.CheckArgv takes.
func checkArgv(what string, argv []string) error { return sandbox.CheckArgv(what, argv) }

// parseExec reads POST /v0/sandboxes/{id}/exec: the sandbox service's
// request and all of stdin (nil: no stdin).
func parseExec(r *http.Request) (sandbox.ExecRequest, []byte, error) {
	var req ExecRequest
	if err := decode(r, &req); err != nil {
		return sandbox.ExecRequest{}, nil, err
	}
	er, err := execRequest(&req)
	if err != nil {
		return er, nil, err
	}
	if req.Stdin == nil {
		return er, nil, nil
	}
	stdin, err := base64.StdEncoding.DecodeString(*req.Stdin)
	if err != nil {
		return er, nil, errdefs.Invalid("stdin must be base64: %v", err)
	}
	er.Stdin = true
	return er, stdin, nil
}

// execTimeout reads an exec's timeout: seconds (a number) or a duration
// ("30s"), from 1ms to MaxExecTimeout, in whole milliseconds.
func execTimeout(raw json.RawMessage) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	bad := func(what string) error {
		return errdefs.Invalid("timeout %s %s: give seconds (a number) or a duration like \"30s\", from 1ms to %s, in whole milliseconds", strings.ToValidUTF8(string(raw), "\uFFFD"), what, MaxExecTimeout)
	}
	var ms int64
	if isJSONNumber(raw) {
		// Seconds, read exactly, in milliseconds.
		t := strings.TrimSpace(string(raw))
		v, err := units.Scale(t, 1000)
		switch {
		case strings.HasPrefix(t, "-") || (err == nil && v == 0):
			return 0, bad("is not positive")
		case errors.Is(err, units.ErrNotWhole):
			return 0, bad("is finer than a millisecond")
		case err != nil:
			return 0, bad("is out of range")
		}
		ms = v
	} else {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0, bad("is neither a number nor a string")
		}
		d, err := time.ParseDuration(s)
		switch {
		case err != nil:
			return 0, bad("is not a duration")
		case d <= 0:
			return 0, bad("is not positive")
		case d%time.Millisecond != 0:
			return 0, bad("is finer than a millisecond")
		}
		ms = d.Milliseconds()
	}
	if ms < 1 || ms > MaxExecTimeout.Milliseconds() {
		return 0, bad("is out of range")
	}
	return ms, nil
}

// isJSONNumber reports a raw JSON value that is a number.
func isJSONNumber(raw json.RawMessage) bool {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return false
	}
	_, ok := v.(json.Number)
	return ok
}

// parseToken reads POST /v0/tokens.
func parseToken(r *http.Request) (TokenRequest, error) {
	var req TokenRequest
	if err := decode(r, &req); err != nil {
		return req, err
	}
	return req, auth.CheckRequest(req.Name, req.Scopes)
}

// parseSecret reads PUT /v0/secrets/{name}: the name and the value.
func parseSecret(r *http.Request) (string, []byte, error) {
	name := r.PathValue("name")
	if err := secrets.ValidName(name); err != nil {
		return name, nil, err
	}
	var req SecretRequest
	if err := decode(r, &req); err != nil {
		return name, nil, err
	}
	switch {
	case len(req.Value) == 0:
		return name, nil, errdefs.Invalid("secret %s: the value is empty: give it base64-encoded in \"value\"", name)
	case len(req.Value) > secrets.MaxValue:
		return name, nil, errdefs.Invalid("secret %s: the value is %d bytes, at most %d", name, len(req.Value), secrets.MaxValue)
	}
	return name, req.Value, nil
}

// parseGrant reads POST /v0/sandboxes/{id}/grants.
func parseGrant(r *http.Request) (sandbox.GrantRequest, error) {
	var req Grant
	if err := decode(r, &req); err != nil {
		return sandbox.GrantRequest{}, err
	}
	g := sandbox.GrantRequest{Secret: req.Secret, Env: req.Env, File: req.File}
	if !req.At.IsZero() {
		return g, errdefs.Invalid("at is set by the server")
	}
	if err := secrets.ValidName(g.Secret); err != nil {
		return g, err
	}
	switch {
	case g.Env != "" && g.File != "":
		return g, errdefs.Invalid("grant %s as an env variable or as a file, not both", g.Secret)
	case g.File != "":
		return g, names.FilePath("file", g.File)
	case g.Env != "":
		return g, names.EnvName(g.Env)
	}
	// Else the variable is named after the secret, which must then be a
	// variable name: the service checks that once it found the secret, so
	// an unknown one is a 404 whatever its name.
	return g, nil
}

// parsePolicy reads PUT /v0/sandboxes/{id}/policy, checked as the
// firewall will take it; nil is no policy.
func parsePolicy(r *http.Request) (*store.Policy, error) {
	var req Policy
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	np := &network.Policy{DenyAll: req.DenyAll, Allow: append([]string(nil), req.Allow...), Deny: append([]string(nil), req.Deny...)}
	if err := np.Validate(); err != nil {
		return nil, errdefs.Invalid("policy: %v", err)
	}
	return &store.Policy{DenyAll: req.DenyAll, Allow: req.Allow, Deny: req.Deny}, nil
}

// importName reads POST /v0/images/import's ?name=: "" or a valid image
// reference.
func importName(r *http.Request) (string, error) {
	n := r.URL.Query().Get("name")
	if n == "" {
		return "", nil
	}
	return n, names.ImageRef(n)
}

// fitsMiB is n MiB in bytes, if that fits an int64.
func fitsMiB(n int64) bool { return n <= math.MaxInt64>>20 }
